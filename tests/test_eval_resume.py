"""Result store: resume, crash safety (kill -9), torn lines, the run lock, settings checks, selection."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from chexpercept.bundle import read_bundle
from chexpercept.eval.run import main
from chexpercept.eval.runner.selection import select_cases, shard
from chexpercept.eval.runner.store import (
    RunLock,
    RunLockedError,
    StoreError,
    append_results,
    read_records,
    repair_tail,
)
from chexpercept.results import CaseResult, iter_results

RUN_SCRIPT = Path(__file__).resolve().parents[1] / "eval" / "run.py"


def folder_of(out: Path, model: str = "baseline:random", oracle: str = "implicit") -> Path:
    return out / model.replace(":", "-") / f"oracle_{oracle}"


def run_cli(bundle, out, *extra, model="baseline:random") -> int:
    return main(
        ["--data-dir", str(bundle), "--model", model, "--output-dir", str(out), "--no-progress", *extra]
    )


def start_script(bundle, out, *extra, model="baseline:random", env_extra=None) -> subprocess.Popen:
    env = dict(os.environ, **(env_extra or {}))
    cmd = [sys.executable, str(RUN_SCRIPT), "--data-dir", str(bundle), "--model", model]
    cmd += ["--output-dir", str(out), "--no-progress", *extra]
    return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def kill_after_lines(proc: subprocess.Popen, results: Path, lines: int, timeout: float = 120) -> int:
    """SIGKILL the run once results.jsonl holds at least ``lines`` lines; returns the count seen."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            _, err = proc.communicate()
            raise AssertionError(f"run ended before it could be killed (rc {proc.returncode}): {err[-2000:]}")
        if results.exists():
            n = results.read_bytes().count(b"\n")
            if n >= lines:
                proc.send_signal(signal.SIGKILL)
                proc.wait()
                return n
        time.sleep(0.02)
    proc.kill()
    raise AssertionError("run produced too few results before the timeout")


def test_kill_9_then_rerun_equals_an_uninterrupted_run(fixture_bundle, tmp_path):
    assert run_cli(fixture_bundle, tmp_path / "clean", "--batch-size", "2") == 0
    clean = folder_of(tmp_path / "clean") / "results.jsonl"

    crashed = tmp_path / "crashed"
    results = folder_of(crashed) / "results.jsonl"
    proc = start_script(
        fixture_bundle, crashed, "--batch-size", "2", env_extra={"CHEXPERCEPT_TEST_STEP_DELAY": "0.1"}
    )
    kill_after_lines(proc, results, 3)
    partial = read_records(results)
    assert 3 <= len(partial) < 21
    assert (folder_of(crashed) / "run.lock").exists()  # the dead run's lock is left behind
    assert json.loads((folder_of(crashed) / "run.json").read_text())["finished"] is None

    assert run_cli(fixture_bundle, crashed, "--batch-size", "2") == 0  # stale lock taken over, resumed
    assert results.read_bytes() == clean.read_bytes()
    assert not (folder_of(crashed) / "run.lock").exists()
    info = json.loads((folder_of(crashed) / "run.json").read_text())
    assert (
        info["finished"] and len(info["resumed"]) == 1 and info["last_session"]["cases"] == 21 - len(partial)
    )


def test_rerun_skips_finished_cases_and_extends_a_smaller_selection(fixture_bundle, tmp_path):
    assert run_cli(fixture_bundle, tmp_path, "--limit", "5") == 0
    results = folder_of(tmp_path) / "results.jsonl"
    first = read_records(results)
    assert len(first) == 5
    assert run_cli(fixture_bundle, tmp_path) == 0
    after = read_records(results)
    assert len(after) == 21 and all(after[k] == v for k, v in first.items())
    info = json.loads((folder_of(tmp_path) / "run.json").read_text())
    assert info["last_session"]["cases"] == 16
    # the file is in bundle order, one line per case
    keys = [r.key_id for r in iter_results(results)]
    assert keys == [c.key_id for c in read_bundle(fixture_bundle).cases]


def test_torn_last_line_is_repaired_before_appending(fixture_bundle, tmp_path):
    assert run_cli(fixture_bundle, tmp_path, "--limit", "4") == 0
    results = folder_of(tmp_path) / "results.jsonl"
    complete = results.read_bytes()
    with open(results, "ab") as f:
        f.write(complete.splitlines()[0][:57])  # a crash in the middle of a write
    assert len(read_records(results)) == 4  # readers ignore the torn tail
    assert run_cli(fixture_bundle, tmp_path) == 0
    assert len(read_records(results)) == 21
    assert results.read_bytes().startswith(complete)


def test_a_resume_removes_the_temporary_files_of_writes_a_kill_cut_short(fixture_bundle, tmp_path):
    """kill -9 between a write's temporary file and its rename left ``.run.json.<random>.tmp`` in the
    run folder for good (red team, stop 43). A session that takes the folder (its lock held: no other
    write is under way) removes those of the run's own files, and nothing else."""
    assert run_cli(fixture_bundle, tmp_path, "--limit", "2") == 0
    folder = folder_of(tmp_path)
    stale = [folder / ".run.json.k1ll3d9x.tmp", folder / ".results.jsonl.abcd1234.tmp"]
    kept = [folder / "notes.tmp", folder / ".mine.json.abcd1234.tmp"]
    for path in [*stale, *kept]:
        path.write_text("{")
    assert run_cli(fixture_bundle, tmp_path, "--limit", "3") == 0
    assert not any(p.exists() for p in stale) and all(p.exists() for p in kept)


def test_a_line_for_a_case_the_bundle_does_not_have_stops_the_resume(fixture_bundle, tmp_path, capsys):
    """A line with the run's own identity but a case the bundle does not hold (written by hand or by
    another tool): the resume kept it, signed it off in n_results, and score counted it as a case
    (red team, stop 43)."""
    assert run_cli(fixture_bundle, tmp_path, "--limit", "2") == 0
    results = folder_of(tmp_path) / "results.jsonl"
    first = json.loads(results.read_text().splitlines()[0])
    with open(results, "a") as f:
        f.write(json.dumps({**first, "key_id": "nonexistent_s1_positive_0"}) + "\n")
    before = results.read_bytes()
    capsys.readouterr()
    assert run_cli(fixture_bundle, tmp_path, "--limit", "3") == 2
    err = capsys.readouterr().err
    assert "case nonexistent_s1_positive_0 is not a case of the bundle" in err, err
    assert results.read_bytes() == before


def test_repair_tail_keeps_complete_lines(tmp_path):
    path = tmp_path / "r.jsonl"
    path.write_bytes(b'{"key_id":"a"}\n{"key_id":"b"}\n{"key_')
    assert repair_tail(path) == len(b'{"key_')
    assert path.read_bytes() == b'{"key_id":"a"}\n{"key_id":"b"}\n'
    assert repair_tail(path) == 0
    path.write_bytes(b"no newline at all")
    assert repair_tail(path) == len(b"no newline at all") and path.read_bytes() == b""


def test_resume_never_cuts_a_file_through_a_link(fixture_bundle, tmp_path, capsys):
    """Rule: every file the run opens for writing or repair goes through fileio (O_NOFOLLOW, a
    regular file of this account). A results file replaced by a link to a file outside the run
    folder that ends without a newline is refused on resume, and that file is left whole."""
    out = tmp_path / "runs"
    assert run_cli(fixture_bundle, out) == 0
    results = folder_of(out) / "results.jsonl"
    victim = tmp_path / "victim.txt"
    victim.write_bytes(results.read_bytes() + b"no newline at the end")
    before = victim.read_bytes()
    results.unlink()
    results.symlink_to(victim)
    assert run_cli(fixture_bundle, out) != 0
    assert victim.read_bytes() == before
    assert "link" in capsys.readouterr().err


def test_a_fifo_run_lock_is_refused_at_once_naming_the_cause(fixture_bundle, tmp_path, capsys):
    """Rule: every open of a lock or an input is non-blocking and type-checked (input_files), and
    the message names the real cause. A FIFO put in place of run.lock never hangs score (it used to
    wait for a writer forever), and run refuses it as not a regular file, not as another's file."""
    import threading

    from chexpercept.input_files import InputFileError
    from chexpercept.metrics import score_path

    out = tmp_path / "runs"
    assert run_cli(fixture_bundle, out) == 0
    lock = folder_of(out) / "run.lock"
    lock.unlink(missing_ok=True)
    os.mkfifo(lock)
    outcome: list[BaseException | None] = []

    def score() -> None:
        try:
            score_path(folder_of(out), bundle=fixture_bundle)
            outcome.append(None)
        except BaseException as e:  # handed to the test thread
            outcome.append(e)

    worker = threading.Thread(target=score, daemon=True)
    worker.start()
    worker.join(timeout=60)
    if worker.is_alive():  # unblock the stuck open so the thread can end
        fd = os.open(lock, os.O_WRONLY | os.O_NONBLOCK)
        os.close(fd)
        pytest.fail("score blocked on a FIFO run.lock")
    assert isinstance(outcome[0], InputFileError) and "FIFO" in str(outcome[0])
    assert run_cli(fixture_bundle, out) != 0
    err = capsys.readouterr().err
    assert "not a regular file" in err and "belongs to" not in err


def test_duplicate_case_in_results_is_an_error(tmp_path):
    path = tmp_path / "results.jsonl"
    record = CaseResult(key_id="effusion_x", lesion="effusion", path="LF", oracle="none", turns=[])
    append_results(path, [record])
    append_results(path, [record])
    with pytest.raises(StoreError, match="appears twice"):
        read_records(path)


def test_second_run_on_a_live_folder_is_refused(fixture_bundle, tmp_path, capsys):
    folder = folder_of(tmp_path)
    with RunLock(folder):  # this live process holds the folder
        assert run_cli(fixture_bundle, tmp_path) == 2
        err = capsys.readouterr().err
        assert "another run is writing to" in err and f"pid {os.getpid()}" in err
        with pytest.raises(RunLockedError):
            RunLock(folder).acquire()
    assert not (folder / "run.lock").exists()
    assert run_cli(fixture_bundle, tmp_path) == 0


def test_a_lock_left_by_a_dead_process_is_free(tmp_path):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    lock = RunLock(tmp_path)
    lock.path.write_text(json.dumps({"pid": dead.pid, "host": os.uname().nodename, "since": "then"}))
    lock.acquire()  # no process holds its flock: nothing to judge, nothing to take over
    assert json.loads(lock.path.read_text())["pid"] == os.getpid()
    lock.release()
    assert not lock.path.exists()


def _contend(folder, barrier, rounds, wins):
    """One of several processes: every round, all try to take the lock at once."""
    for _ in range(rounds):
        barrier.wait()
        lock = RunLock(folder)
        try:
            lock.acquire()
            won = True
        except RunLockedError:
            won = False
        wins.put(won)
        barrier.wait()  # every process has tried
        lock.release()
        barrier.wait()  # released before the next round's dead lock file is written


def test_exactly_one_process_takes_a_dead_runs_lock(tmp_path, monkeypatch):
    import multiprocessing

    monkeypatch.setattr(RunLock, "PROBE_GRACE", 0.0)  # losers refused at once (300 rounds)

    ctx = multiprocessing.get_context("fork")
    rounds, n = 300, 4
    barrier, wins = ctx.Barrier(n + 1), ctx.Queue()
    workers = [ctx.Process(target=_contend, args=(tmp_path, barrier, rounds, wins)) for _ in range(n)]
    for w in workers:
        w.start()
    winners = []
    try:
        for _ in range(rounds):
            # a run died holding the folder: its lock file is still there
            (tmp_path / "run.lock").write_text(json.dumps({"pid": 999999, "host": os.uname().nodename}))
            barrier.wait()
            barrier.wait()
            winners.append(sum(wins.get(timeout=30) for _ in range(n)))
            barrier.wait()
    finally:
        for w in workers:
            w.join(timeout=30)
    assert winners == [1] * rounds


def test_resume_with_other_settings_is_refused(fixture_bundle, tmp_path, capsys):
    assert run_cli(fixture_bundle, tmp_path, "--limit", "2") == 0
    assert run_cli(fixture_bundle, tmp_path, "--seed", "5") == 2
    err = capsys.readouterr().err
    assert "seed: 0 -> 5" in err and "--run-name" in err
    assert run_cli(fixture_bundle, tmp_path, "--parse-mode", "strict", "--run-name", "strict-run") == 0
    assert (tmp_path / "strict-run" / "oracle_implicit" / "results.jsonl").exists()


def test_selection_per_cell_limit_lesions_paths(fixture_bundle, tmp_path):
    cases = read_bundle(fixture_bundle).cases
    assert len(select_cases(cases, per_cell=1)) == 21
    assert select_cases(cases, limit=4) == cases[:4]
    shards = [shard(cases, i, 3) for i in range(3)]
    assert sorted(c.key_id for s in shards for c in s) == sorted(c.key_id for c in cases)
    assert run_cli(fixture_bundle, tmp_path, "--lesions", "cardiomegaly", "effusion", "--paths", "RR,LF") == 0
    records = read_records(folder_of(tmp_path) / "results.jsonl")
    assert {(r["lesion"], r["path"]) for r in records.values()} == {
        ("cardiomegaly", "RR"),
        ("cardiomegaly", "LF"),
        ("effusion", "RR"),
        ("effusion", "LF"),
    }
    with pytest.raises(ValueError, match="per-cell"):
        select_cases(cases, per_cell=0)


def test_per_cell_is_stratified_and_independent_of_file_order(tmp_path):
    from chexpercept.testing import write_fixture_bundle

    cases = read_bundle(write_fixture_bundle(tmp_path / "b", per_cell=4, seed=0, image_size=8)).cases
    chosen = select_cases(cases, per_cell=2)
    cells = {}
    for c in chosen:
        cells[(c.lesion, c.path)] = cells.get((c.lesion, c.path), 0) + 1
    assert len(cells) == 21 and set(cells.values()) == {2}
    assert {c.key_id for c in select_cases(list(reversed(cases)), per_cell=2)} == {c.key_id for c in chosen}
    # not simply the first N of each cell in file order (the reference's --per_path_limit)
    first = {}
    for c in cases:
        first.setdefault((c.lesion, c.path), []).append(c.key_id)
    assert {c.key_id for c in chosen} != {k for v in first.values() for k in v[:2]}


def test_bad_arguments_give_clear_errors(fixture_bundle, tmp_path, capsys):
    assert main(["--model", "baseline:random"]) == 2
    assert "--data-dir" in capsys.readouterr().err
    assert run_cli(fixture_bundle, tmp_path, model="not-a-model") == 2
    assert "not in the model registry" in capsys.readouterr().err
    assert run_cli(tmp_path / "missing", tmp_path) == 2
    assert "missing: no such folder" in capsys.readouterr().err
    with pytest.raises(SystemExit) as bad:  # a number outside its domain: argparse, before any work
        run_cli(fixture_bundle, tmp_path, "--lesions", "pneumonia", "--paths", "RR", "--limit", "0")
    assert (
        bad.value.code == 2 and "argument --limit: must be a whole number from 1" in capsys.readouterr().err
    )


def test_several_oracle_settings_in_one_command_equal_separate_runs(fixture_bundle, tmp_path, capsys):
    together = tmp_path / "together"
    assert run_cli(fixture_bundle, together, "--oracle", "none", "implicit", "explicit", "--limit", "6") == 0
    out = capsys.readouterr().out
    assert (
        out.count("cases of baseline-random (oracle") == 3
        and out.count("all numbers: chexpercept score") == 1
    )
    for oracle in ("none", "implicit", "explicit"):
        alone = tmp_path / f"alone-{oracle}"
        assert run_cli(fixture_bundle, alone, "--oracle", oracle, "--limit", "6", "--no-score") == 0
        mine, theirs = folder_of(together, oracle=oracle), folder_of(alone, oracle=oracle)
        assert records_of(mine) == records_of(theirs)
        info = json.loads((mine / "run.json").read_text())
        assert info["oracle"] == oracle and info["settings"]["oracle"] == oracle and info["finished"]
    # a rerun of the same command resumes each setting (all done: nothing asked again)
    assert run_cli(fixture_bundle, together, "--oracle", "none", "implicit", "explicit", "--limit", "6") == 0


def records_of(folder: Path) -> list[dict]:
    """results.jsonl's records without the timings (usage) that differ from run to run."""
    out = []
    for line in (folder / "results.jsonl").read_text().splitlines():
        record = json.loads(line)
        record["turns"] = [{k: v for k, v in t.items() if k != "usage"} for t in record["turns"]]
        out.append(record)
    return out


HOLD_LOCK = """
import sys
from chexpercept.eval.runner.store import RunLock
with RunLock(sys.argv[1]):
    print("held", flush=True)
    sys.stdin.read()
"""


def test_score_of_a_folder_being_written_says_it_is_partial(fixture_bundle, tmp_path, capsys):
    """What is read while another run still writes it is said to be partial where it is shown; a
    run's own scores at its end are not (its own lock is not another writer)."""
    from chexpercept.metrics import score_path

    assert run_cli(fixture_bundle, tmp_path, "--limit", "3") == 0
    out, err = capsys.readouterr()
    assert "Table 2: stage-level accuracy" in out, out
    assert "partial" not in out + err, err  # the run's own lock, held while it printed its scores
    folder = folder_of(tmp_path)
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD_LOCK, str(folder)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline() == "held\n"  # as a live run holds it
        notes = score_path(folder).notes
    finally:
        holder.communicate("")
    assert any(
        "a run is writing this folder now (3 of 3 selected cases so far): these numbers are partial" in n
        for n in notes
    )
    assert not any("partial" in n for n in score_path(folder).notes)
    with RunLock(folder):  # this process's own lock: not another writer
        assert not any("partial" in n for n in score_path(folder).notes)


def test_a_readers_probe_never_refuses_a_run(tmp_path):
    """A reader (score, report) probes the lock with a shared lock for an instant; a run that tries
    its lock at that instant waits it out, and is not refused with a message blaming a dead pid."""
    import fcntl
    import threading

    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    lock = RunLock(tmp_path)
    lock.path.write_text(json.dumps({"pid": dead.pid, "host": os.uname().nodename, "since": "then"}))
    fd = os.open(lock.path, os.O_RDONLY)
    fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)  # the probe, at the moment the run starts
    threading.Timer(0.2, os.close, (fd,)).start()
    lock.acquire()
    assert json.loads(lock.path.read_text())["pid"] == os.getpid()
    lock.release()


def test_score_says_when_it_read_fewer_results_than_the_run_recorded(fixture_bundle, tmp_path):
    """Rule: what score reads is checked against what the run recorded (run.json's n_results); a
    torn last line of a finished run was dropped silently (20 cases scored, 21 recorded)."""
    from chexpercept.metrics import score_path

    assert run_cli(fixture_bundle, tmp_path, "--limit", "3") == 0
    folder = folder_of(tmp_path)
    results = folder / "results.jsonl"
    assert not [n for n in score_path(folder).notes if "results.jsonl" in n]
    data = results.read_bytes()
    results.write_bytes(data[:-40])  # the last line torn (as a disk that filled up, a copy cut short)
    report = score_path(folder)
    assert report.counts["cases"] == 2
    notes = "\n".join(report.notes)
    assert f"{results}: its last line is torn ({len(data.splitlines()[-1]) + 1 - 40} bytes" in notes, notes
    assert "records 3 results but 2 complete lines were read: 1 of them are missing" in notes, notes
    assert "rerun the same command" in notes
    assert report.partial and "1 of them are missing" in report.partial[0] + report.partial[-1]
    # every writer of numbers says they are partial (metrics/partial.py): a heading line in markdown,
    # a column in CSV; score --table --output and the report's tables, leaderboard and CSVs
    from chexpercept.cli import main as cli_main
    from chexpercept.metrics.report.build import write_report

    for name, fmt in (("t.md", "markdown"), ("t.csv", "csv")):
        argv = ["score", str(folder), "--table", "2", "--format", fmt, "--output", str(tmp_path / name)]
        assert cli_main(argv) == 0
    assert "**Partial numbers**" in (tmp_path / "t.md").read_text()
    header, row = (tmp_path / "t.csv").read_text().splitlines()
    assert header.endswith(",partial") and "1 of them are missing" in row
    out = write_report(tmp_path, tmp_path / "report", n_resamples=0, plots=False).out
    for md in ("tables.md", "tables/table3.md", "leaderboard.md"):
        assert "**Partial numbers**" in (out / md).read_text(), md
    csvs = [
        "leaderboard.csv",
        "tables/table2.csv",
        *[str(p.relative_to(out)) for p in out.rglob("*summary*.csv")],
    ]
    assert len(csvs) >= 4, csvs
    for name in csvs:
        lines = (out / name).read_text().splitlines()
        assert lines[0].endswith(",partial") and all("missing" in line for line in lines[1:]), name
    from chexpercept.metrics.comparisons import compare, render_comparison

    paired = compare(report, report)
    assert "**Partial numbers**" in render_comparison(paired)
    header, *rows = render_comparison(paired, "csv").splitlines()
    assert header.endswith(",partial") and all("missing" in row for row in rows)
    # and partial numbers are not published (what is on the Hub stays there)
    from chexpercept.metrics.hub.push_results import stage
    from chexpercept.metrics.partial import PartialNumbers

    with pytest.raises(PartialNumbers, match="these numbers are partial .*nothing was published"):
        stage(tmp_path / "baseline-random", tmp_path / "staging", bootstrap=0, bundle=fixture_bundle)


def test_a_resume_with_another_selection_says_the_folder_mixes_them(fixture_bundle, tmp_path, capsys):
    """New user: a rerun with other --lesions into the same folder kept both selections' cases and
    scored them together without a word. It still keeps them (nothing is lost), and says so; a
    larger selection that holds every finished case says nothing."""
    from chexpercept.eval.run import main

    base = ["--data-dir", str(fixture_bundle), "--model", "baseline:random", "--output-dir", str(tmp_path)]
    base += ["--no-progress", "--no-score", "--oracle", "none"]
    assert main([*base, "--lesions", "effusion", "--limit", "2"]) == 0
    capsys.readouterr()
    assert main([*base, "--lesions", "effusion", "--limit", "4"]) == 0  # more of the same: silent
    assert "outside this command's selection" not in capsys.readouterr().err
    results = tmp_path / "baseline-random" / "oracle_none" / "results.jsonl"
    n = len(list(iter_results(results)))
    assert main([*base, "--lesions", "edema", "--limit", "2"]) == 0
    err = capsys.readouterr().err
    assert f"note: {n} of the {n} finished case(s)" in err and "--run-name" in err, err
    assert len(list(iter_results(results))) == n + 2
