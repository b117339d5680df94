"""How a run meets the real machine: signals, a full disk, a read-only folder, records of another run,
a duplicate case, an engine's limits. Each run is a real ``eval/run.py`` process where the fault is
the process's (signals, disks); the vLLM engine's own faults are in tests/test_vllm_engine.py."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from fake_openai import FakeServer
from thread_signals import can_pick_a_thread, other_threads, send_to_thread
from waiting import wait_until

from chexpercept.bundle import read_bundle
from chexpercept.errors import BundleValidationError
from chexpercept.eval.run import main
from chexpercept.results import iter_results

ROOT = Path(__file__).resolve().parents[1]
RUN = [sys.executable, str(ROOT / "eval" / "run.py")]


def answers(folder: Path) -> dict[str, list[tuple[str, str]]]:
    return {r.key_id: [(t.task, t.response) for t in r.turns] for r in iter_results(folder / "results.jsonl")}


def start(bundle: Path, out: Path, *extra: str, env: dict | None = None) -> subprocess.Popen:
    argv = [*RUN, "--data-dir", str(bundle), "--output-dir", str(out), "--run-name", "m", "--no-progress"]
    return subprocess.Popen(
        [*argv, "--no-score", *extra],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **(env or {})},
    )


def wait_for_lines(path: Path, n: int, proc: subprocess.Popen, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists() and path.read_bytes().count(b"\n") >= n:
            return
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.05)
    raise AssertionError(f"{path} never had {n} lines")


def gone(pid: int) -> bool:
    """No such process, or a zombie (dead, not yet reaped by its new parent)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except (OSError, IndexError):
        return True


# ----------------------------------------------------------------------------------- 2. signals
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP])
def test_a_stop_signal_saves_what_is_finished_and_a_rerun_completes_it(fixture_bundle, tmp_path, signum):
    slow = {"CHEXPERCEPT_TEST_STEP_DELAY": "0.2"}
    proc = start(fixture_bundle, tmp_path, "--model", "baseline:random", "--batch-size", "2", env=slow)
    folder = tmp_path / "m" / "oracle_implicit"
    wait_for_lines(folder / "results.jsonl", 2, proc)
    sent = time.monotonic()
    proc.send_signal(signum)
    _, err = proc.communicate(timeout=30)
    assert time.monotonic() - sent < 5
    assert proc.returncode == 128 + signum
    assert "Traceback" not in err
    name = signal.Signals(signum).name
    (line,) = [x for x in err.splitlines() if x.startswith("chexpercept run:")]
    assert f"stopped by {name}." in line and "selected cases are saved in" in line and "resume" in line
    saved = answers(folder)
    assert 2 <= len(saved) < 21 and f"{len(saved)} of 21 selected cases are saved" in line
    assert not (folder / "run.lock").exists()
    # the rerun finishes exactly the rest: the same results as a run never interrupted
    assert main([*start_args(fixture_bundle, tmp_path), "--model", "baseline:random"]) == 0
    assert main([*start_args(fixture_bundle, tmp_path / "whole"), "--model", "baseline:random"]) == 0
    assert answers(folder) == answers(tmp_path / "whole" / "m" / "oracle_implicit")


def test_a_signal_while_cases_are_appended_counts_them_in_the_end_line(
    fixture_bundle, tmp_path, monkeypatch, capsys
):
    """A stop signal that arrives while finished cases are being written waits until they are on disk
    and counted: the end line's "N finished in this session" is what the file holds (the count was
    skipped before, and under accelerate a process whose only cases were those said nothing)."""
    from chexpercept.eval.runner import store

    real = store.append_durable

    def append_then_signal(path, payload):
        os.kill(os.getpid(), signal.SIGTERM)  # handled at once, deferred to the end of the append
        real(path, payload)

    monkeypatch.setattr(store, "append_durable", append_then_signal)
    args = start_args(fixture_bundle, tmp_path)
    assert main([*args, "--model", "baseline:random", "--batch-size", "3"]) == 128 + signal.SIGTERM
    (line,) = [x for x in capsys.readouterr().err.splitlines() if x.startswith("chexpercept run:")]
    saved = answers(tmp_path / "m" / "oracle_implicit")
    assert len(saved) == 3 and "stopped by SIGTERM. 3 of 21 selected cases are saved" in line
    assert "(3 finished in this session)" in line, line


def start_args(bundle: Path, out: Path) -> list[str]:
    return [
        "--data-dir",
        str(bundle),
        "--output-dir",
        str(out),
        "--run-name",
        "m",
        "--no-progress",
        "--no-score",
    ]


@pytest.mark.parametrize("taken_by", ["the process", "another thread"])
def test_a_signal_stops_an_api_run_without_waiting_for_replies_in_flight(fixture_bundle, tmp_path, taken_by):
    """The main process waits for replies while they are in flight. SIGTERM given to a thread other
    than the main thread (the kernel's choice, or the main thread's just before it began to wait)
    was taken when the next reply came, 30 s later (flaky, stop 45; chexpercept/signal_watch.py)."""
    if taken_by == "another thread" and not can_pick_a_thread():
        pytest.skip("needs Linux's tgkill on x86_64 or aarch64")
    with FakeServer(delay=30) as server:  # every reply takes half a minute
        proc = start(
            fixture_bundle,
            tmp_path,
            *("--model", "local-vlm", "--backend", "openai", "--base-url", server.url),
        )
        deadline = time.monotonic() + 60
        while not server.requests and time.monotonic() < deadline:
            time.sleep(0.05)
        assert server.requests, "no request reached the server"
        time.sleep(0.5)  # the main thread now waits for the replies
        sent = time.monotonic()
        if taken_by == "the process":
            proc.send_signal(signal.SIGTERM)
        else:
            threads = other_threads(proc.pid, signal.SIGTERM)
            assert threads, "every other thread of the run blocks SIGTERM"
            send_to_thread(proc.pid, threads[0], signal.SIGTERM)
        try:
            _, err = proc.communicate(timeout=30)
        finally:
            proc.kill()  # a failure leaves no run behind
    assert time.monotonic() - sent < 5 and proc.returncode == 128 + signal.SIGTERM
    assert "stopped by SIGTERM. 0 of 21 selected cases are saved" in err and "Traceback" not in err


def test_a_signal_stops_a_transformers_run(fixture_bundle, tiny_model, tmp_path):
    proc = start(
        fixture_bundle,
        tmp_path,
        *("--model", str(tiny_model), "--backend", "transformers", "--max-tokens", "4", "--batch-size", "2"),
    )
    folder = tmp_path / "m" / "oracle_implicit"
    wait_for_lines(folder / "results.jsonl", 1, proc, timeout=300)
    sent = time.monotonic()
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert time.monotonic() - sent < 10 and proc.returncode == 128 + signal.SIGINT
    assert "stopped by SIGINT" in err and "Traceback" not in err
    assert not (folder / "run.lock").exists()


STUCK = textwrap.dedent(
    """
    import subprocess, sys, time
    from chexpercept.entry_point import start_program
    start_program("chexpercept run")  # a program: a caller's process is never ended from inside
    from chexpercept.eval.runner.interrupts import RunInterrupted, stop_on_signals
    with stop_on_signals(grace=float(sys.argv[1])):
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
        try:  # the signal may come as soon as the pid is out
            print(child.pid, flush=True)
            time.sleep(300)
        except RunInterrupted:
            time.sleep(300)  # a shutdown that never ends (an engine that does not answer)
    """
)


def test_a_stuck_shutdown_is_cut_short_and_a_second_signal_ends_it_at_once(tmp_path):
    for grace, second in ((1.0, False), (60.0, True)):
        proc = subprocess.Popen(
            [sys.executable, "-c", STUCK, str(grace)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        child = int(proc.stdout.readline())
        sent = time.monotonic()
        proc.send_signal(signal.SIGINT)
        while second and proc.poll() is None and time.monotonic() - sent < 10:
            time.sleep(0.5)  # Ctrl-C again (two signals before the first is handled count as one)
            proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=30)
        assert time.monotonic() - sent < 5 and proc.returncode == 128 + signal.SIGINT
        assert ("SIGINT again" if second else "did not shut down within 1 s") in err
        assert "stopping 1 process(es) it started" in err
        time.sleep(0.2)
        assert (
            not Path(f"/proc/{child}").exists() or "Z" in Path(f"/proc/{child}/stat").read_text().split()[2]
        )


def test_a_run_called_in_process_and_stopped_by_a_signal_leaves_its_caller_alive():
    """The grace period ends with the shutdown: a caller (a notebook, a test) that ran a run in-process
    and saw it stop by a signal lives on after ``grace`` (the watchdog killed it before)."""
    code = textwrap.dedent(
        """
        import os, signal, time
        from chexpercept.eval.runner.interrupts import RunInterrupted, stop_on_signals
        with stop_on_signals(grace=0.3):
            try:
                os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(5)
            except RunInterrupted:
                pass
        time.sleep(1.0)
        print("alive")
        """
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and proc.stdout == "alive\n", proc.stderr[-2000:]


SHIELDED = textwrap.dedent(
    """
    import multiprocessing, signal, subprocess, sys, time
    from chexpercept.eval.runner.interrupts import RunInterrupted, shielded_children, stop_on_signals

    def took(signum, _frame):
        sys.exit(f"engine process took {signal.Signals(signum).name}")

    def engine():  # a child as vLLM starts them: it stops on SIGINT or SIGTERM, its own way
        signal.signal(signal.SIGINT, took)
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
        time.sleep(300)

    if __name__ == "__main__":
        with stop_on_signals() as children:
            try:
                with shielded_children():
                    started = [multiprocessing.get_context(m).Process(target=engine) for m in ("fork", "spawn")]
                    for p in started:
                        p.start()
                    popen = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
                    time.sleep(2)  # the spawned interpreter is up
                    print(*(p.pid for p in started), popen.pid, flush=True)
                    while True:
                        time.sleep(0.1)  # still inside the block: an engine starting up
            except RunInterrupted as e:
                alive = [p.is_alive() for p in started] + [popen.poll() is None]
                print("children alive after the signal:", alive, flush=True)
                print("stopped", len(children.stop()), flush=True)
                sys.exit(e.exit_status)
    """
)


def test_ctrl_c_to_the_process_group_reaches_the_main_process_only(tmp_path):
    """A terminal's Ctrl-C goes to the whole process group, an engine's processes included; those a
    backend starts inside shielded_children (fork, spawn, a plain subprocess) do not take it, so the
    main process alone stops them in order; it takes the signal even inside the block."""
    script = tmp_path / "shielded.py"
    script.write_text(SHIELDED)
    proc = subprocess.Popen(
        [sys.executable, str(script)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    pids = [int(p) for p in proc.stdout.readline().split()]
    assert len(pids) == 3, proc.communicate()
    sent = time.monotonic()
    os.killpg(proc.pid, signal.SIGINT)
    out, err = proc.communicate(timeout=30)
    assert time.monotonic() - sent < 10 and proc.returncode == 128 + signal.SIGINT, err
    assert "children alive after the signal: [True, True, True]" in out
    stopped = int(out.split("stopped ")[1].split()[0])  # multiprocessing's resource tracker is left
    assert stopped == 3 and "took SIGINT" not in err and "KeyboardInterrupt" not in err, err
    assert wait_until(lambda: all(gone(pid) for pid in pids))


ORPHAN = textwrap.dedent(
    """
    import multiprocessing, threading, time
    from chexpercept.eval.runner.interrupts import shielded_children

    def engine():
        time.sleep(300)

    if __name__ == "__main__":
        fork = multiprocessing.get_context("fork")
        with shielded_children():
            inside = fork.Process(target=engine)
            inside.start()
            spawned = multiprocessing.get_context("spawn").Process(target=engine)  # vLLM's CPU build
            spawned.start()
            # forked by a thread that then ends: not tied to it (Linux sends the parent-death signal
            # when the forking thread ends; the pause lets the child set it first)
            by_thread = fork.Process(target=engine)
            starter = threading.Thread(target=lambda: (by_thread.start(), time.sleep(0.5)))
            starter.start()
            starter.join()
        outside = fork.Process(target=engine)  # after the block: left as it is
        outside.start()
        time.sleep(0.5)
        print(inside.pid, spawned.pid, by_thread.pid, outside.pid, by_thread.is_alive(), flush=True)
        time.sleep(300)
    """
)


def test_an_engine_process_dies_with_a_killed_main_process(tmp_path):
    """kill -9 of the main process alone (the out-of-memory killer's way): a process forked or spawned
    inside shielded_children (vLLM's engine core: forked by default, spawned by its CPU build) is
    killed with it instead of holding its memory; one forked after the block is not touched."""
    script = tmp_path / "orphan.py"
    script.write_text(ORPHAN)
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    *pids, by_thread_alive = proc.stdout.readline().split()
    inside, spawned, by_thread, outside = (int(p) for p in pids)
    assert by_thread_alive == "True"  # its thread ended, the main process did not
    assert "CHEXPERCEPT_DIE_WITH_PARENT" not in Path(f"/proc/{outside}/environ").read_text()
    proc.kill()
    proc.wait()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and not (gone(inside) and gone(spawned)):
        time.sleep(0.05)
    try:
        assert gone(inside), "the forked engine process outlived the main process"
        assert gone(spawned), "the spawned engine process outlived the main process"
        assert not gone(outside)
    finally:
        for pid in (by_thread, outside):
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)


# ------------------------------------------------------------------------- 3. operating system
@pytest.fixture
def small_disk(tmp_path):
    """A 40 KiB tmpfs (root only: the tests that need it say so and are skipped elsewhere)."""
    disk = tmp_path / "disk"
    disk.mkdir()
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("needs root to mount a small tmpfs")
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=40k", "tmpfs", str(disk)], capture_output=True
    )
    if mounted.returncode:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.decode().strip()}")
    yield disk
    subprocess.run(["umount", "-l", str(disk)], check=False)


def remount(disk: Path, options: str) -> None:
    subprocess.run(["mount", "-o", f"remount,{options}", str(disk)], check=True)


def run_cli(bundle: Path, out: Path, *extra: str) -> subprocess.CompletedProcess:
    argv = [
        *RUN,
        "--data-dir",
        str(bundle),
        "--output-dir",
        str(out),
        "--model",
        "baseline:random",
        "--no-progress",
    ]
    return subprocess.run([*argv, *extra], capture_output=True, text=True, timeout=300)


def test_a_full_disk_ends_the_run_in_one_line_and_a_rerun_after_freeing_space_completes(
    fixture_bundle, small_disk, tmp_path
):
    full = run_cli(fixture_bundle, small_disk, "--no-score")
    assert full.returncode == 2 and "Traceback" not in full.stderr
    (line,) = [x for x in full.stderr.splitlines() if x.startswith("chexpercept run:")]
    assert "no space left on the device of" in line and "free space there" in line and "resume" in line
    folder = small_disk / "baseline-random" / "oracle_implicit"
    saved = len(answers(folder))
    assert 0 < saved < 21 and f"{saved} of 21 selected cases are saved" in line
    remount(small_disk, "size=4m")
    again = run_cli(fixture_bundle, small_disk, "--no-score")
    assert again.returncode == 0, again.stderr
    assert run_cli(fixture_bundle, tmp_path / "whole", "--no-score").returncode == 0
    assert answers(folder) == answers(tmp_path / "whole" / "baseline-random" / "oracle_implicit")


def test_a_finished_run_on_a_read_only_disk_is_checked_and_scored_without_writing(fixture_bundle, small_disk):
    remount(small_disk, "size=4m")
    assert run_cli(fixture_bundle, small_disk, "--limit", "3", "--no-score").returncode == 0
    remount(small_disk, "ro")
    folder = small_disk / "baseline-random" / "oracle_implicit"
    before = {p.name: p.read_bytes() for p in folder.iterdir()}
    again = run_cli(fixture_bundle, small_disk, "--limit", "3")
    assert again.returncode == 0 and "checked read-only: nothing was written" in again.stdout
    assert "End-to-End" in again.stdout or "E2E" in again.stdout or "Stage" in again.stdout
    score = subprocess.run(
        [sys.executable, "-m", "chexpercept.cli", "score", str(folder)], capture_output=True, text=True
    )
    assert score.returncode == 0, score.stderr
    # more cases than were run: one line saying what cannot be done, nothing written
    more = run_cli(fixture_bundle, small_disk, "--limit", "5")
    assert more.returncode == 2 and "Traceback" not in more.stderr
    assert "cannot write to" in more.stderr and "Read-only file system" in more.stderr
    assert "2 of the 5 selected cases are not done" in more.stderr
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == before


# ------------------------------------------------------------------- 4. records tied to their run
def test_a_record_of_another_run_is_refused_by_resume_score_and_report(fixture_bundle, tmp_path, capsys):
    base = ["--data-dir", str(fixture_bundle), "--output-dir", str(tmp_path), "--no-progress", "--no-score"]
    assert main([*base, "--model", "baseline:oracle", "--limit", "3"]) == 0
    assert main([*base, "--model", "baseline:random"]) == 0
    mine = tmp_path / "baseline-oracle" / "oracle_implicit" / "results.jsonl"
    other = (tmp_path / "baseline-random" / "oracle_implicit" / "results.jsonl").read_text().splitlines()
    line = next(x for x in other if json.loads(x)["key_id"] not in mine.read_text())
    with open(mine, "a") as f:
        f.write(line + "\n")  # a line appended from another model's run
    capsys.readouterr()
    assert main([*base, "--model", "baseline:oracle", "--limit", "5"]) == 2
    err = capsys.readouterr().err
    assert "made by another run" in err and "line 4" in err and "baseline:random" in err
    from chexpercept.metrics import score_path

    with pytest.raises(ValueError, match="made by another run.*line 4"):
        score_path(mine.parent)
    from chexpercept.metrics.report.build import write_report

    with pytest.raises(ValueError, match="made by another run"):
        write_report(tmp_path, tmp_path / "report", n_resamples=0, plots=False)
    # each record names its run
    record = json.loads(mine.read_text().splitlines()[0])
    assert record["run"]["model"] == "baseline:oracle" and len(record["run"]["fingerprint"]) == 16


def test_a_duplicate_key_id_is_refused_by_every_reader_naming_both_entries(fresh_bundle, tmp_path, capsys):
    index = fresh_bundle / "chexpercept.json"
    text = index.read_text()
    data = json.loads(text)
    first = next(iter(data))
    # the same key_id twice (json.loads would keep only the last)
    body = text.rstrip().rstrip("}")
    index.write_text(body + ", " + json.dumps(first) + ": " + json.dumps(data[first]) + "}")
    with pytest.raises(BundleValidationError, match=f"{first}.*appears twice: entries 1 and 22"):
        read_bundle(fresh_bundle)
    from chexpercept.cli import main as cli

    assert cli(["validate", str(fresh_bundle)]) != 0
    out = capsys.readouterr()
    assert "appears twice" in out.out + out.err
    assert (
        main(["--data-dir", str(fresh_bundle), "--model", "baseline:random", "--output-dir", str(tmp_path)])
        == 2
    )
    assert "appears twice" in capsys.readouterr().err
    from datasets import load_dataset

    import chexpercept  # noqa: F401  (registers the builder)

    with pytest.raises(Exception, match="appears twice"):
        load_dataset("chexpercept", data_dir=str(fresh_bundle), cache_dir=str(tmp_path / "cache"))


def test_an_object_appended_to_chexpercept_json_is_refused_by_every_reader(fresh_bundle, tmp_path, capsys):
    """A second object appended after chexpercept.json's own (a concatenation, a bad merge): validate
    said OK and run, load_dataset and the scorer read the first object's cases alone, dropping the
    appended one without a word (red team, stop 43)."""
    index = fresh_bundle / "chexpercept.json"
    text = index.read_text()
    data = json.loads(text)
    first = next(iter(data))
    index.write_text(text + json.dumps({first.replace("_0", "_9"): data[first]}))
    said = "more after the top-level object ends"
    with pytest.raises(BundleValidationError, match=said):
        read_bundle(fresh_bundle)
    from chexpercept.cli import main as cli

    assert cli(["validate", str(fresh_bundle)]) != 0
    out = capsys.readouterr()
    assert said in out.out + out.err
    assert (
        main(["--data-dir", str(fresh_bundle), "--model", "baseline:random", "--output-dir", str(tmp_path)])
        == 2
    )
    assert said in capsys.readouterr().err
    from datasets import load_dataset

    import chexpercept  # noqa: F401  (registers the builder)

    with pytest.raises(Exception, match=said):
        load_dataset("chexpercept", data_dir=str(fresh_bundle), cache_dir=str(tmp_path / "cache"))


# ------------------------------------------------------------------------ 1. the engine's limits
def test_conversations_that_cannot_fit_are_named_before_the_model_loads(
    fixture_bundle, tiny_model, tmp_path, capsys
):
    small = tmp_path / "tiny-short"
    shutil.copytree(tiny_model, small)
    config = json.loads((small / "config.json").read_text())
    config["text_config"]["max_position_embeddings"] = 700  # the longest routes' late turns do not fit
    (small / "config.json").write_text(json.dumps(config))
    argv = ["--data-dir", str(fixture_bundle), "--model", str(small), "--backend", "transformers"]
    argv += [
        "--max-tokens",
        "8",
        "--output-dir",
        str(tmp_path / "runs"),
        "--no-progress",
        "--lesions",
        "effusion",
    ]
    started = time.monotonic()
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert time.monotonic() - started < 30
    assert "preflight: 3 case(s) checked against a context of 700 tokens (config.json" in err
    assert "cannot run at all" in err and "(RR) needs up to" in err and "even with short answers" in err
    assert "leave these cases out" in err and "--on-error record" in err
    assert "nothing was started" in err
    assert not (tmp_path / "runs" / "tiny-short" / "oracle_implicit" / "results.jsonl").exists()


def test_an_image_limit_below_a_route_is_named_before_any_engine_starts(fixture_bundle, tmp_path, capsys):
    """--engine-args limit_mm_per_prompt below what a route shows: refused before the engine starts,
    naming the case and the limit, even where no processor is at hand to count tokens with (here vLLM
    is not even installed: the check needs neither)."""
    argv = ["--data-dir", str(fixture_bundle), "--model", "medgemma-1.5-4b", "--backend", "vllm"]
    argv += ["--engine-args", '{"limit_mm_per_prompt": {"image": 2}}', "--output-dir", str(tmp_path)]
    assert main([*argv, "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "at most 2 image(s) per prompt (limit_mm_per_prompt in --engine-args)" in err
    assert "prompt tokens NOT checked" in err
    assert "cannot run at all" in err and "(RR) sends" in err and "images at turn" in err
    assert "allow 5 images per prompt" in err or "images per prompt (--engine-args" in err
    assert "nothing was started" in err and "needs vLLM" not in err


@pytest.mark.parametrize(
    ("engine_args", "said"),
    [
        ('{"limit_mm_per_prompt": {"image": {"count": 2}}}', "at most 2 image(s) per prompt"),
        ('{"limit_mm_per_prompt": {"image": {"count": 2, "width": 512}}}', "at most 2 image(s) per prompt"),
        ('{"language_model_only": true}', "at most 0 image(s) per prompt (language_model_only"),
        (
            '{"limit_mm_per_prompt": {"image": "two"}}',
            "limit_mm_per_prompt.image in --engine-args must be a count",
        ),
        ('{"limit_mm_per_prompt": [2]}', "limit_mm_per_prompt in --engine-args must be an object"),
        ('{"max_model_len": true}', "max_model_len in --engine-args must be a positive integer or -1"),
        ('{"max_model_len": "4k"}', "max_model_len in --engine-args must be a positive integer or -1"),
    ],
)
def test_every_form_of_the_engines_limits_is_read_as_vllm_reads_it(
    fixture_bundle, tmp_path, capsys, engine_args, said
):
    """vLLM 0.32 takes limit_mm_per_prompt as {"image": n} or {"image": {"count": n, ...}} and
    language_model_only as no images: the preflight reads each form as the engine will (a form it
    cannot read is refused naming the field), before any engine starts."""
    argv = ["--data-dir", str(fixture_bundle), "--model", "medgemma-1.5-4b", "--backend", "vllm"]
    argv += ["--engine-args", engine_args, "--output-dir", str(tmp_path), "--no-progress"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert said in err, err
    assert "Traceback" not in err and not list(tmp_path.rglob("results.jsonl"))


@pytest.mark.parametrize(
    "engine_args",
    [
        '{"max_model_len": -1}',
        '{"limit_mm_per_prompt": {"video": 0}}',
        '{"limit_mm_per_prompt": {"image": {"width": 64}}}',
    ],
)
def test_limits_the_engine_fits_or_leaves_open_refuse_nothing(fixture_bundle, tmp_path, capsys, engine_args):
    """max_model_len -1 (vLLM fits it to memory, not a context of -1 tokens) and a limits object
    without an image count (vLLM's 999) leave every case to the engine: the run gets past the
    preflight (here to vLLM's absence)."""
    argv = ["--data-dir", str(fixture_bundle), "--model", "medgemma-1.5-4b", "--backend", "vllm"]
    argv += ["--engine-args", engine_args, "--output-dir", str(tmp_path), "--no-progress"]
    main(argv)
    err = capsys.readouterr().err
    assert "cannot run at all" not in err and "must be" not in err, err
    assert "at most 999 image(s) per prompt" in err or "max_model_len" in engine_args, err
