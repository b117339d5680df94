"""The rules every program of the toolkit keeps from its first line (chexpercept/entry_point.py,
chexpercept/stdio.py, chexpercept/progress.py): a signal the user ignored stays ignored, every stop
says one line (while starting, while the scores print), a program whose standard streams are closed
never writes into its own files (tests/test_standard_streams.py: streams that cannot be
written), a run called in-process leaves its caller's process as it found it,
and progress in a log is whole lines. Each member is a real program or a real run."""

from __future__ import annotations

import contextlib
import io
import os
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
from waiting import wait_until

from chexpercept import tcp_table
from chexpercept.eval.run import main
from chexpercept.eval.runner.interrupts import _alive, descendants
from chexpercept.progress import progress_bar
from chexpercept.results import iter_results

ROOT = Path(__file__).resolve().parents[1]
PROGRAMS = {
    "eval/run.py": [sys.executable, str(ROOT / "eval" / "run.py")],
    "chexpercept run": [sys.executable, "-m", "chexpercept.cli", "run"],
}


def run_argv(program: str, bundle: Path, out: Path, *extra: str) -> list[str]:
    return [
        *PROGRAMS[program],
        *("--data-dir", str(bundle), "--output-dir", str(out), "--run-name", "m", "--no-score"),
        *("--model", "baseline:random", "--batch-size", "2", *extra),
    ]


def launch(argv: list[str], *, delay: str = "0", preexec=None, **kwargs) -> subprocess.Popen:
    env = {**os.environ, "CHEXPERCEPT_TEST_STEP_DELAY": delay}
    return subprocess.Popen(argv, text=True, env=env, preexec_fn=preexec, **kwargs)


def signal_mask(pid: int, field: str) -> int:
    """``SigCgt`` (signals with a handler) or ``SigIgn`` of a process, from /proc."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1], 16)
    raise AssertionError(f"no {field} for {pid}")


def has(mask: int, signum: int) -> bool:
    return bool(mask >> (signum - 1) & 1)


def saved(out: Path) -> list:
    return list(iter_results(out / "m" / "oracle_implicit" / "results.jsonl"))


@pytest.mark.parametrize(
    ("program", "signum"), [("eval/run.py", signal.SIGHUP), ("chexpercept run", signal.SIGTERM)]
)
def test_a_signal_the_user_ignored_stays_ignored(fixture_bundle, tmp_path, program, signum):
    """``nohup`` (SIGHUP ignored) and ``trap '' TERM``: the run inherits the choice and finishes;
    it stopped at 129 and 143 before."""

    def ignore():
        signal.signal(signum, signal.SIG_IGN)

    argv = run_argv(program, fixture_bundle, tmp_path, "--no-progress")
    proc = launch(argv, delay="0.05", preexec=ignore, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    results = tmp_path / "m" / "oracle_implicit" / "results.jsonl"
    assert wait_until(lambda: results.exists() and results.read_bytes().count(b"\n") >= 2, timeout=120)
    assert has(signal_mask(proc.pid, "SigIgn"), signum)
    proc.send_signal(signum)
    _, err = proc.communicate(timeout=180)
    assert proc.returncode == 0, err[-3000:]
    assert len(saved(tmp_path)) == 21 and "stopped" not in err


@pytest.mark.parametrize(
    ("program", "signum"),
    [("eval/run.py", signal.SIGTERM), ("eval/run.py", signal.SIGHUP), ("chexpercept run", signal.SIGINT)],
)
def test_a_stop_while_a_program_starts_says_one_line(fixture_bundle, tmp_path, program, signum):
    """A stop signal as soon as the program has its handlers (its imports take seconds more) ends it
    with one line and 128 + the signal; SIGTERM and SIGHUP killed it without a word before, and a
    Ctrl-C while ``chexpercept run`` declared its options ended in a traceback."""
    proc = launch(run_argv(program, fixture_bundle, tmp_path), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    # Python itself takes SIGINT from its first line; SIGTERM's handler is the program's first step
    assert wait_until(
        lambda: has(signal_mask(proc.pid, "SigCgt"), signal.SIGTERM), timeout=60, interval=0.002
    )
    proc.send_signal(signum)
    _, err = proc.communicate(timeout=60)
    lines = [line for line in err.splitlines() if line.strip()]
    assert proc.returncode == 128 + signum, err[-3000:]
    assert len(lines) == 1 and "Traceback" not in err, err[-3000:]
    name = signal.Signals(signum).name
    assert lines[0].startswith("chexpercept run: stopped by " + name), lines
    assert "nothing was" in lines[0] and not saved_any(tmp_path), lines


@pytest.mark.parametrize("arrives", ["SIGINT", "SIGHUP"])
@pytest.mark.parametrize("step", ["catch", "restore"])
def test_a_stop_signal_between_two_handlers_reaches_the_new_one(step, arrives):
    """The stop signals' handlers change all at once (``catch_signals``, ``restore_signals``): a
    stop signal that comes just after SIGTERM's handler changed, before its own did, waits and
    reaches its new handler. A SIGHUP there, under load, killed a starting program without a word
    (exit -1, no line). Made certain here: the signal is sent right after SIGTERM's change."""
    script = textwrap.dedent(
        f"""
        import os, signal, sys
        from chexpercept.entry_point import catch_signals, restore_signals
        got = []
        def caught(signum, frame):
            got.append(("caught", signum))
        def restored(signum, frame):
            got.append(("restored", signum))
        real = signal.signal
        def changing(signum, disposition):
            old = real(signum, disposition)
            if signum == signal.SIGTERM and sending:
                os.kill(os.getpid(), signal.{arrives})
            return old
        signal.signal = changing
        sending = {step == "catch"}
        previous = catch_signals(caught)
        sending = {step == "restore"}
        restore_signals({{s: restored for s in previous}})
        print(got, flush=True)
        """
    )
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, (proc.returncode, proc.stderr[-2000:])
    new = "caught" if step == "catch" else "restored"
    assert proc.stdout.strip() == f"[('{new}', {int(getattr(signal, arrives))})]"


def _program_with_a_signal_at(
    where: str, signum: int, argv: list[str], *, full_after: int | None = None
) -> subprocess.CompletedProcess:
    """``eval/run.py argv`` as a program, sending itself ``signum`` at a chosen moment: ``"end"``
    (as the run lets its folders go, after every setting), ``"options"`` (between the options and
    the run's own handling: program_started), ``"exit"`` (after the command's status is known, while
    standard output is flushed), ``"exiting"`` (while the interpreter exits: an atexit function).
    ``full_after``: the disk is full after that many appends of results."""
    script = textwrap.dedent(
        f"""
        import os, signal, sys
        from chexpercept import entry_point
        entry_point.start_program("chexpercept run")
        from chexpercept.eval import run
        from chexpercept.eval.runner import execute
        def send():
            os.kill(os.getpid(), {int(signum)})
        where = {where!r}
        if {full_after!r} is not None:
            import errno
            from chexpercept.eval.runner.store import RunStore
            real_append, appends = RunStore.append, []
            def append(self, *args, **kwargs):
                appends.append(1)
                if len(appends) > {full_after!r}:
                    raise OSError(errno.ENOSPC, "No space left on device")
                return real_append(self, *args, **kwargs)
            RunStore.append = append
        if where == "end":
            real_let_go = execute._let_go
            def let_go(*args):
                send()
                return real_let_go(*args)
            execute._let_go = let_go
        elif where == "options":
            real_started = entry_point.program_started
            def started():
                real_started()
                send()
            run.program_started = started
        elif where == "exiting":
            import atexit, time
            atexit.register(lambda: (send(), time.sleep(1)))
        else:
            real_lost = entry_point._lost_output
            def lost(**kwargs):
                send()
                return real_lost(**kwargs)
            entry_point._lost_output = lost
        sys.exit(entry_point.run_program(lambda: run.main({argv!r})))
        """
    )
    return subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
@pytest.mark.parametrize("where", ["end", "options", "exit", "exiting"])
def test_a_stop_outside_the_runs_own_handling_is_one_true_line(fixture_bundle, tmp_path, where, signum):
    """A stop signal the run's own lines do not cover: just after every setting ended (it said "before
    any case ran; nothing was written" over a complete run), between the options and the run's
    handling, while the output is flushed at the end (a traceback, exit status 1). Each is now one
    line that says where, and 128 + the signal; a complete run stays complete (a rerun has nothing
    left to do)."""
    argv = run_argv("eval/run.py", fixture_bundle, tmp_path, "--no-progress")[2:]
    proc = _program_with_a_signal_at(where, signum, argv)
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 128 + signum, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr and "Exception ignored" not in proc.stderr, proc.stderr[-3000:]
    name = signal.Signals(signum).name
    stop_lines = [line for line in lines if f"stopped by {name}" in line]
    assert len(stop_lines) == 1, lines
    said = {
        "end": "after every setting had ended; the results are saved in",
        "options": "before its work began",
        "exit": "after the command had ended (status 0)",
        "exiting": "while exiting; the command had ended",
    }[where]
    assert said in stop_lines[0] and "nothing was written" not in stop_lines[0], lines
    if where == "options":
        assert not saved_any(tmp_path)
    else:
        assert len(saved(tmp_path)) == 21
        again = subprocess.run(
            run_argv("eval/run.py", fixture_bundle, tmp_path, "--no-progress"), capture_output=True, text=True
        )
        assert again.returncode == 0, again.stderr[-2000:]
        assert len(saved(tmp_path)) == 21


def test_a_stop_after_a_run_failed_or_was_refused_keeps_its_error(fixture_bundle, tmp_path):
    """A stop while a run that failed lets its folders go (a full disk after 2 appends) said "after
    every setting had ended; the results are saved", 143; one while a refused run (a folder of
    other settings) let go replaced the refusal by "what it saved is in ...". The run's own error
    and status now stay (2), and the stop is said as such."""
    argv = run_argv("eval/run.py", fixture_bundle, tmp_path, "--no-progress")[2:]
    failed = _program_with_a_signal_at("end", signal.SIGTERM, argv, full_after=2)
    assert failed.returncode == 2, failed.stderr[-3000:]
    assert "after every setting had ended" not in failed.stderr and "Traceback" not in failed.stderr
    assert (
        "rerun the same command to resume" in failed.stderr
        and "stopped by SIGTERM while closing" in failed.stderr
    )
    done = subprocess.run(
        run_argv("eval/run.py", fixture_bundle, tmp_path, "--no-progress"), capture_output=True
    )
    assert done.returncode == 0 and len(saved(tmp_path)) == 21
    refused = _program_with_a_signal_at("end", signal.SIGTERM, [*argv, "--seed", "1"])
    assert refused.returncode == 2, refused.stderr[-3000:]
    assert "other settings" in refused.stderr and "seed" in refused.stderr, refused.stderr[-3000:]
    assert "stopped by" not in refused.stderr and "Traceback" not in refused.stderr, refused.stderr[-3000:]


def test_a_stop_between_two_drawn_images_drops_the_jobs_not_started(tmp_path):
    """``synth-sources --num-proc 2`` stopped between two results (the signal taken in the loop, not
    while it waits for one): the pool's queue was left, and the stop waited for every image of the
    job (all 168 files written). The jobs not started are now dropped: the stop comes after the few
    in the workers' hands."""
    out = tmp_path / "sources"
    script = textwrap.dedent(
        f"""
        import os, signal, sys
        from chexpercept import entry_point
        entry_point.start_program("chexpercept synth-sources")
        from chexpercept import cli
        from chexpercept.builder import synth_sources
        real_bar = synth_sources.progress_bar
        def progress_bar(*args, **kwargs):
            bar, done = real_bar(*args, **kwargs), []
            real_update = bar.update
            def update(*a):
                done.append(1)
                if len(done) == 3:
                    os.kill(os.getpid(), signal.SIGINT)
                return real_update(*a)
            bar.update = update
            return bar
        synth_sources.progress_bar = progress_bar
        argv = ["synth-sources", "--output-dir", {str(out)!r}, "--per-cell", "5", "--num-proc", "2", "--no-progress"]
        sys.exit(entry_point.run_program(lambda: cli._command(argv)))
        """
    )
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 128 + signal.SIGINT, proc.stderr[-3000:]
    drawn = len(list(out.rglob("*.jpg")))
    assert 3 <= drawn <= 40, (drawn, proc.stderr[-2000:])  # the whole job writes 168 files


def test_a_last_line_is_written_while_a_thread_starts(tmp_path):
    """A stop signal's line while the main thread starts a thread (it holds threading's start lock):
    the line was written by a thread of its own, which waited for that lock, and was lost. It is
    now written by the handler itself, once stderr takes it."""
    script = textwrap.dedent(
        """
        import threading
        from chexpercept.stdio import write_now
        with threading._active_limbo_lock:
            write_now("the last line")
        """
    )
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0 and proc.stderr == "the last line\n", proc.stderr


def test_a_second_signal_ends_the_program_though_its_stderr_is_not_read(fixture_bundle, tmp_path):
    """stderr a pipe that nobody reads any more (full): the end line's write blocked, and neither a
    second signal nor the watchdog ended the program (its line blocked too). Each line now waits
    for stderr up to a second: the program ends at the second signal, 128 + it."""
    read, write = os.pipe()
    os.set_blocking(write, True)
    while True:  # fill the pipe: every later write to it blocks
        try:
            os.set_blocking(write, False)
            os.write(write, b"x" * 65536)
        except BlockingIOError:
            break
    os.set_blocking(write, True)
    argv = run_argv("eval/run.py", fixture_bundle, tmp_path, "--no-progress")
    proc = launch(argv, delay="0.3", stdout=subprocess.DEVNULL, stderr=write)
    try:
        results = tmp_path / "m" / "oracle_implicit" / "results.jsonl"
        assert wait_until(lambda: results.exists() and results.read_bytes().count(b"\n") >= 2, timeout=120)
        proc.send_signal(signal.SIGTERM)
        time.sleep(0.5)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 128 + signal.SIGTERM
    finally:
        proc.kill()
        os.close(read)
        os.close(write)


def test_ctrl_c_to_the_group_while_synth_starts_its_workers_is_one_line(tmp_path):
    """A terminal's Ctrl-C reaches the whole process group: ``synth --num-proc 2``'s workers, as
    they started, each printed a KeyboardInterrupt traceback (45 to 65 lines in all, and the pool's
    "InvalidStateError" from a thread). The builder's pools start their workers with Ctrl-C held for
    the main process (``shielded_children``), which stops the pool in order: one line, 130."""
    argv = [sys.executable, "-m", "chexpercept.cli", "synth", "--output-dir", str(tmp_path / "b")]
    argv += ["--per-cell", "2", "--num-proc", "2", "--no-progress"]
    proc = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        assert wait_until(lambda: len(descendants(proc.pid)) >= 2, timeout=120, interval=0.01)
        time.sleep(0.3)  # the workers are importing
        os.killpg(proc.pid, signal.SIGINT)
        _, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    lines = [line for line in err.splitlines() if line.strip()]
    assert proc.returncode == 128 + signal.SIGINT, err[-3000:]
    assert "Traceback" not in err and "KeyboardInterrupt" not in err and "InvalidStateError" not in err, err[
        -3000:
    ]
    assert len(lines) == 1 and "stopped by SIGINT" in lines[0], lines


def saved_any(out: Path) -> bool:
    return (out / "m" / "oracle_implicit" / "results.jsonl").exists() and bool(saved(out))


def test_a_program_with_its_standard_streams_closed_never_writes_into_its_files(fixture_bundle, tmp_path):
    """``eval/run.py ... >&- 2>&-`` and two Ctrl-Cs: the results file took descriptor 2, and the
    "SIGINT again" line went into it (a rerun then refused the folder). Descriptors 0-2 are now held
    on /dev/null where they are closed, so every saved line is a case and the rerun completes."""

    def close_streams():
        os.close(1)
        os.close(2)

    argv = run_argv("eval/run.py", fixture_bundle, tmp_path, "--no-progress")
    proc = launch(argv, delay="0.3", preexec=close_streams)
    results = tmp_path / "m" / "oracle_implicit" / "results.jsonl"
    assert wait_until(lambda: results.exists() and results.read_bytes().count(b"\n") >= 2, timeout=120)
    assert Path(f"/proc/{proc.pid}/fd/2").resolve() == Path(os.devnull)
    proc.send_signal(signal.SIGINT)
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=60) == 128 + signal.SIGINT
    assert all(line.startswith(b"{") for line in results.read_bytes().splitlines())
    assert main(run_argv("eval/run.py", fixture_bundle, tmp_path, "--no-progress")[2:]) == 0
    assert len(saved(tmp_path)) == 21


def test_a_signal_while_the_scores_print_says_the_run_is_complete(
    fixture_bundle, tmp_path, monkeypatch, capsys
):
    """Every case saved, then SIGTERM while Table 2 prints: the run said "before any case ran;
    nothing was written" before."""
    from chexpercept.metrics import api

    def scores_then_signal(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGTERM)

    monkeypatch.setattr(api, "print_model_scores", scores_then_signal)
    argv = run_argv("eval/run.py", fixture_bundle, tmp_path, "--no-progress")[2:]
    argv.remove("--no-score")
    assert main(argv) == 128 + signal.SIGTERM
    (line,) = [x for x in capsys.readouterr().err.splitlines() if x.startswith("chexpercept run:")]
    assert "stopped by SIGTERM while printing the scores; every selected case is saved" in line, line
    assert len(saved(tmp_path)) == 21


def test_a_run_called_in_process_gives_its_caller_its_handlers_back(fixture_bundle, tmp_path, monkeypatch):
    """A caller's own handlers for SIGINT, SIGTERM and SIGHUP are in place after a run stopped by a
    signal (SIGINT was left as Python's default before)."""
    from chexpercept.eval.runner import store

    real = store.append_durable

    def append_then_signal(path, payload):
        if not sent:
            sent.append(os.kill(os.getpid(), signal.SIGTERM))
        real(path, payload)

    sent: list[None] = []

    def mine(signum, frame):
        raise AssertionError("not expected")

    monkeypatch.setattr(store, "append_durable", append_then_signal)
    stops = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    before = {s: signal.signal(s, mine) for s in stops}
    try:
        assert main(run_argv("eval/run.py", fixture_bundle, tmp_path, "--no-progress")[2:]) == 143
        assert {s: signal.getsignal(s) for s in stops} == dict.fromkeys(stops, mine)
    finally:
        for s, old in before.items():
            signal.signal(s, old)


def test_a_run_called_from_another_thread_returns_its_status(fixture_bundle, tmp_path):
    """Signals are the main thread's: a run from a worker thread runs without them and returns 0 (it
    raised "signal only works in main thread" after the run before)."""
    status: list[object] = []

    def call():
        try:
            status.append(main(run_argv("eval/run.py", fixture_bundle, tmp_path, "--no-progress")[2:]))
        except BaseException as e:
            status.append(e)

    worker = threading.Thread(target=call)
    worker.start()
    worker.join(timeout=300)
    assert status == [0] and len(saved(tmp_path)) == 21


def test_progress_in_a_log_is_whole_lines(fixture_bundle, tmp_path):
    """A bar redraws its line with \\r and leaves it open: in a log another process's line was glued
    to it. Into a pipe, a run's progress is lines of their own (the last one at 21/21)."""
    log = io.StringIO()
    bar = progress_bar(total=3, desc="cases", unit="case", file=log)
    for _ in range(3):
        bar.update()
    bar.close()
    assert "\r" not in log.getvalue() and log.getvalue().endswith("\n")
    assert "3/3" in log.getvalue().splitlines()[-1]
    proc = launch(
        run_argv("eval/run.py", fixture_bundle, tmp_path), stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    _, err = proc.communicate(timeout=180)
    assert proc.returncode == 0 and "\r" not in err, err[-2000:]
    assert any(line.startswith("cases: 100%") and "21/21" in line for line in err.splitlines()), err


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("moment", ["while torch loads", "while waiting for the other process"])
def test_a_stop_while_a_process_waits_for_its_peers_says_one_line(fixture_bundle, tmp_path, moment):
    """Process 0 of a 2-process run whose other process never comes: SIGTERM while the run imports
    torch gave a traceback, and while it waited for its peer (a C call, up to 7 days) it was not
    taken at all. Now one line each time and 143, at once."""
    port = free_port()
    env = {"WORLD_SIZE": "2", "RANK": "0", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "2"}
    env |= {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "CHEXPERCEPT_COORDINATION_TIMEOUT": "300"}
    argv = run_argv("eval/run.py", fixture_bundle, tmp_path, "--no-progress")
    proc = subprocess.Popen(
        argv, text=True, env={**os.environ, **env}, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    if moment == "while torch loads":
        ready = lambda: has(signal_mask(proc.pid, "SigCgt"), signal.SIGTERM) and "torch" in maps(proc.pid)  # noqa: E731
    else:
        ready = lambda: any(s.state == tcp_table.LISTEN for s in tcp_table.sockets(port=port))  # noqa: E731
    assert wait_until(ready, timeout=120, interval=0.01), proc.communicate(timeout=5)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=30)
    lines = [line for line in err.splitlines() if line.startswith("chexpercept run:")]  # accelerate warns
    assert proc.returncode == 143 and len(lines) == 1 and "Traceback" not in err, err[-3000:]
    assert "stopped by SIGTERM" in lines[0], lines
    assert "nothing was written" in lines[0], lines


def maps(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/maps").read_text()
    except OSError:
        return ""


def test_a_second_signal_ends_a_command_whose_shutdown_hangs(tmp_path):
    """``chexpercept synth --num-proc 2`` and SIGTERM twice: the second interrupted the pool's
    shutdown and the command then waited for its workers forever. A second stop signal now ends a
    program at once with the processes it started."""
    argv = [
        *PROGRAMS["chexpercept run"][:-1],
        "synth",
        "--output-dir",
        str(tmp_path / "b"),
        "--per-cell",
        "3",
    ]
    proc = launch([*argv, "--num-proc", "2"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    workers = lambda: [p for p in descendants(proc.pid) if "spawn_main" in _command_line(p)]  # noqa: E731
    assert wait_until(lambda: len(workers()) == 2, timeout=120, interval=0.02)
    started = descendants(proc.pid)
    # the shutdown hangs for sure: both pool workers are stopped, so they never end (with running
    # workers, a pool that ended within the 0.3 s before the second signal, on a loaded CI machine,
    # ended the command by the first signal: two lines, the test failed)
    stopped = workers()
    for pid in stopped:
        _signal_if_alive(pid, signal.SIGSTOP)
    try:
        proc.send_signal(signal.SIGTERM)
        time.sleep(0.3)
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
    finally:
        for pid in stopped:  # a worker the command failed to end goes on (and the test fails below)
            _signal_if_alive(pid, signal.SIGCONT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 143, err[-3000:]
    lines = [x for x in err.splitlines() if x.startswith("chexpercept synth:")]
    assert len(lines) == 1, err[-3000:]
    (line,) = lines
    assert "Traceback" not in err and "SIGTERM again" in line and line.endswith("exiting now"), err[-3000:]
    assert wait_until(lambda: not [p for p in started if _alive(p)], timeout=30), started


def _command_line(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_text().replace("\0", " ")
    except OSError:
        return ""


def _signal_if_alive(pid: int, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signum)


def test_a_second_signal_never_ends_an_in_process_caller():
    """A notebook's interrupt pressed twice: the run's second-signal path ended the caller's process
    (os._exit). In a caller's process it now kills what the run started and unwinds the run; a case
    being appended still ends whole."""
    code = textwrap.dedent(
        """
        import os, signal, time
        from chexpercept.eval.runner.interrupts import RunInterrupted, deferred, stop_on_signals
        with stop_on_signals(grace=0.3):
            try:
                with deferred():
                    os.kill(os.getpid(), signal.SIGINT)
                    os.kill(os.getpid(), signal.SIGINT)
                    time.sleep(0.2)
                    print("append ended")
            except RunInterrupted:
                pass
        time.sleep(1.0)
        print("alive")
        """
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and proc.stdout == "append ended\nalive\n", proc.stderr[-2000:]
    assert "SIGINT again" in proc.stderr and "ending the run" in proc.stderr, proc.stderr


def test_the_hugging_face_bars_are_off_in_a_log(tmp_path):
    """``chexpercept make-tiny-model 2> log`` logged transformers' "Writing model shards" bar with
    ``\\r``; in a program whose stderr is a log, the Hugging Face libraries' bars are off."""
    argv = [*PROGRAMS["chexpercept run"][:-1], "make-tiny-model", "--output-dir", str(tmp_path / "m")]
    env = {k: v for k, v in os.environ.items() if k != "HF_HUB_DISABLE_PROGRESS_BARS"}
    proc = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0 and "\r" not in proc.stderr, proc.stderr[-2000:]


def test_python_m_chexpercept_is_the_chexpercept_command(fixture_bundle):
    """``python -m chexpercept`` failed (no ``__main__``), where Python users try it first (new
    user, stop 45): it is the same program as the ``chexpercept`` command."""
    as_module = subprocess.run(
        [sys.executable, "-m", "chexpercept", "inspect", str(fixture_bundle)], capture_output=True, text=True
    )
    assert as_module.returncode == 0, as_module.stderr
    assert "every image a question needs exists" in as_module.stdout
    wrong = subprocess.run([sys.executable, "-m", "chexpercept", "inspekt"], capture_output=True, text=True)
    assert wrong.returncode == 2 and "inspect" in wrong.stderr
