"""Operating-system errors name their real cause, whichever command meets them (chexpercept.os_errors):
no inodes left is not "no space" (df -i, not df -h), a quota is not a full disk, a folder of another
user is named with its owner, too many open files says whose limit, a name too long says which.
Where the machine can make the fault for real (a tmpfs, a second account, a long name) the test
makes it; the others are raised where the runner writes its results."""

from __future__ import annotations

import ctypes
import errno
import json
import os
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from chexpercept.cli import main as cli
from chexpercept.eval.run import main

ROOT = Path(__file__).resolve().parents[1]
RUN = [sys.executable, str(ROOT / "eval" / "run.py")]
CLI = [sys.executable, "-m", "chexpercept.cli"]


def last_line(stderr: str, prog: str) -> str:
    lines = [x for x in stderr.replace("\r", "\n").splitlines() if x.startswith(f"{prog}:")]
    assert lines and "Traceback" not in stderr, stderr
    return lines[-1]


@pytest.fixture
def tmpfs(tmp_path):
    """``mount(options)``: a fresh tmpfs with these options (root only; skipped elsewhere)."""
    mounted: list[Path] = []

    def mount(options: str) -> Path:
        if os.geteuid() != 0 or shutil.which("mount") is None:
            pytest.skip("needs root to mount a small tmpfs")
        disk = tmp_path / f"disk{len(mounted)}"
        disk.mkdir()
        done = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(disk)], capture_output=True
        )
        if done.returncode:
            pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}")
        mounted.append(disk)
        return disk

    yield mount
    for disk in mounted:
        subprocess.run(["umount", "-l", str(disk)], check=False)


@pytest.fixture
def other_user():
    """A second local account (created here, removed after), and how to run a command as a user
    who cannot override file permissions: root with CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH and
    CAP_FOWNER dropped (the interpreter lives under /root, which the second account cannot enter)."""
    if os.geteuid() != 0 or shutil.which("useradd") is None:
        pytest.skip("needs root and useradd to create a second account")
    name = f"chx{uuid.uuid4().hex[:8]}"
    made = subprocess.run(
        ["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", name], capture_output=True
    )
    if made.returncode:
        pytest.skip(f"cannot create a second account: {made.stderr.decode().strip()}")
    import pwd

    try:
        yield pwd.getpwnam(name)
    finally:
        subprocess.run(["userdel", name], check=False, capture_output=True)


def no_permission_override() -> None:
    """preexec_fn: drop the capabilities that let root ignore file permissions (PR_CAPBSET_DROP)."""
    libc = ctypes.CDLL(None, use_errno=True)
    for capability in (1, 2, 3):  # CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH, CAP_FOWNER
        if libc.prctl(24, capability, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_CAPBSET_DROP)")


def run_cli(argv: list[str], **kwargs) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    return subprocess.run(argv, capture_output=True, text=True, timeout=300, env=env, **kwargs)


def run_args(bundle: Path, out: Path, *extra: str) -> list[str]:
    return [
        *("--data-dir", str(bundle), "--output-dir", str(out)),
        *("--model", "baseline:random", "--no-progress", "--no-score", *extra),
    ]


# ----------------------------------------------------------------------------- inodes, not space
def test_a_run_out_of_inodes_says_inodes_and_df_i_not_df_h(fixture_bundle, tmpfs):
    disk = tmpfs("size=4m,nr_inodes=3")  # plenty of space, room for two folders only
    done = run_cli([*RUN, *run_args(fixture_bundle, disk)])
    line = last_line(done.stderr, "chexpercept run")
    assert done.returncode == 2
    assert "no free inodes left" in line and f"df -i {disk}" in line and "df -h" not in line, line


@pytest.mark.parametrize("command", ["synth", "report", "score"])
def test_every_command_out_of_inodes_says_so_in_one_line(command, fixture_bundle, tmpfs, tmp_path):
    """generate (synth), report and score meet the same error through the command line's one
    handler: one line naming inodes, never a traceback."""
    disk = tmpfs("size=16m,nr_inodes=4")
    if command == "synth":
        argv = ["synth", "--output-dir", str(disk / "bundle"), "--per-cell", "1", "--no-progress"]
    else:
        assert main(run_args(fixture_bundle, tmp_path / "runs", "--limit", "2")) == 0
        run = tmp_path / "runs" / "baseline-random"
        (disk / "a" / "b" / "c").mkdir(parents=True)  # every inode taken
        argv = (
            ["report", str(tmp_path / "runs"), "--output-dir", str(disk / "report"), "--bootstrap", "0"]
            if command == "report"
            else ["score", str(run), "--output", str(disk / "scores.json")]
        )
    done = run_cli([*CLI, *argv])
    line = last_line(done.stderr, f"chexpercept {command}")
    assert done.returncode == 2 and "no free inodes left" in line and "df -i" in line, done.stderr


# ------------------------------------------------------------------ a folder of another user
def test_a_folder_of_another_user_is_named_with_its_owner(fixture_bundle, other_user, tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chown(shared, other_user.pw_uid, other_user.pw_gid)
    shared.chmod(0o755)
    done = run_cli([*RUN, *run_args(fixture_bundle, shared / "runs")], preexec_fn=no_permission_override)
    line = last_line(done.stderr, "chexpercept run")
    assert done.returncode == 2
    assert f"owner {other_user.pw_name}" in line and "belongs to another user" in line, line
    assert "another --output-dir" in line


def test_score_of_a_run_another_user_keeps_private_names_the_owner(fixture_bundle, other_user, tmp_path):
    assert main(run_args(fixture_bundle, tmp_path / "runs", "--limit", "2")) == 0
    folder = tmp_path / "runs" / "baseline-random" / "oracle_implicit"
    results = folder / "results.jsonl"
    os.chown(results, other_user.pw_uid, other_user.pw_gid)
    results.chmod(0o600)
    done = run_cli([*CLI, "score", str(folder)], preexec_fn=no_permission_override)
    line = last_line(done.stderr, "chexpercept score")
    assert done.returncode == 2 and "Permission denied" in line and f"owner {other_user.pw_name}" in line


# ---------------------------------------------------------------------- names and paths
def test_a_name_too_long_names_its_length_and_the_option(fixture_bundle, tmp_path, capsys):
    # a --run-name that long is refused before the system sees it (tests/test_bad_day_inputs.py)
    assert main(run_args(fixture_bundle, tmp_path / ("m" * 300))) == 2
    line = last_line(capsys.readouterr().err, "chexpercept run")
    assert "name is too long" in line and "has 300 bytes" in line and "--output-dir" in line, line


def test_an_output_folder_below_a_file_names_the_file(fixture_bundle, tmp_path, capsys):
    (tmp_path / "notes.txt").write_text("a file, not a folder")
    assert main(run_args(fixture_bundle, tmp_path / "notes.txt" / "runs")) == 2
    line = last_line(capsys.readouterr().err, "chexpercept run")
    assert f"{tmp_path / 'notes.txt'} is a file, not a folder" in line, line


def test_an_image_that_is_a_folder_is_not_called_undecodable(fresh_bundle, capsys):
    entries = json.loads((fresh_bundle / "chexpercept.json").read_text())
    image = next(fresh_bundle.glob("chexpercept/*/detection_qa/*.png"))
    image.unlink()
    image.mkdir()
    assert entries and cli(["validate", str(fresh_bundle)]) != 0
    out = capsys.readouterr()
    text = out.out + out.err
    assert "is a folder, not a regular file" in text and "does not decode" not in text, text


# ------------------------------------------------ errors this machine cannot make on demand
@pytest.mark.parametrize(
    "code,expected",
    [
        (getattr(errno, "EDQUOT", 122), ["disk quota is used up", "quota -s"]),
        (errno.EMFILE, ["this process has too many files open", "ulimit -n"]),
        (errno.ENFILE, ["the whole system has too many files open", "fs.file-max"]),
        (errno.EIO, ["the device failed to read or write", "dmesg"]),
        (getattr(errno, "ESTALE", 116), ["network file system lost track", "another machine"]),
        (errno.ELOOP, ["symbolic links", "loop"]),
    ],
)
def test_each_cause_is_named_when_writing_results(
    fixture_bundle, tmp_path, capsys, monkeypatch, code, expected
):
    """The error raised where the runner appends a case, as the system raises it, after the first
    case was saved; the run's last line names the cause and its remedy, and a rerun resumes."""
    from chexpercept.eval.runner.store import RunStore

    results = tmp_path / "m" / "oracle_implicit" / "results.jsonl"
    append = RunStore.append

    def fail(self, *args, **kwargs):
        if results.is_file() and results.read_bytes():
            raise OSError(code, os.strerror(code), str(results))
        return append(self, *args, **kwargs)

    monkeypatch.setattr(RunStore, "append", fail)
    assert main(run_args(fixture_bundle, tmp_path, "--run-name", "m")) == 2
    line = last_line(capsys.readouterr().err, "chexpercept run")
    assert all(part in line for part in expected), line
    assert "rerun the same command to resume" in line
    if code == getattr(errno, "EDQUOT", 122):
        assert "no space left" not in line and "df -h" not in line


# ------------------------------- every error a write, lock, fsync or rename can raise, by its cause
#: errno's list for write(2), open(2) with O_CREAT, flock(2), fsync(2), rename(2), mkdir(2) and
#: unlink(2), with a word of the cause each message must name (not "OSError on ...: fix the cause")
WRITE_ERRORS = {
    "EFBIG": "is too large",
    "ENOLCK": "cannot lock files",
    "EXDEV": "another file system",
    "EBUSY": "in use",
    "ENOTEMPTY": "not empty",
    "EEXIST": "already exists",
    "EOPNOTSUPP": "does not support",
    "EINVAL": "refused the operation",
    "EMLINK": "as many entries",
    "ETIMEDOUT": "stopped answering",
    "ENOTCONN": "stopped answering",
    "EHOSTDOWN": "stopped answering",
    "EHOSTUNREACH": "stopped answering",
    "EREMOTEIO": "stopped answering",
    "EUCLEAN": "damaged",
    "EKEYEXPIRED": "Kerberos",
    "ENOMEM": "out of memory",
    "EINTR": "interrupted by a signal",
    "ETXTBSY": "running now",
    "ENOSPC": "no space",
    "EDQUOT": "quota",
    "EROFS": "read-only",
    "EACCES": "no permission",
    "EPERM": "no permission",
    "EMFILE": "too many files open",
    "ENFILE": "too many files open",
    "ENAMETOOLONG": "too long",
    "ENOTDIR": "not a folder",
    "EISDIR": "is a folder",
    "ENOENT": "no such",
    "EIO": "device failed",
    "ESTALE": "lost track",
    "ELOOP": "loop",
}


@pytest.mark.parametrize("name", sorted(n for n in WRITE_ERRORS if hasattr(errno, n)))
def test_every_error_of_a_write_lock_fsync_or_rename_names_its_cause(name, tmp_path):
    """Rule (chexpercept/os_errors.py): every errno a file write, lock, fsync or rename can raise is
    read by its cause; none falls through to "OSError on ...: fix the cause" (EFBIG and ENOLCK did)."""
    from chexpercept.os_errors import explain_os_error

    code = getattr(errno, name)
    text = explain_os_error(OSError(code, os.strerror(code), str(tmp_path / "results.jsonl")), tmp_path)
    line = text.line("chexpercept run")
    assert not line.startswith("chexpercept run: error: OSError on") and "fix the cause" not in line, line
    assert WRITE_ERRORS[name].lower() in line.lower() and "results.jsonl" in line, line


def test_a_file_size_limit_names_ulimit_f(fixture_bundle, tmp_path):
    """``(ulimit -f 24; chexpercept run ...)`` ended with "OSError on ...: File too large. fix the
    cause"; it names the limit and ulimit -f (made for real: RLIMIT_FSIZE in the child)."""
    import resource

    def limit():
        resource.setrlimit(resource.RLIMIT_FSIZE, (4096, resource.RLIM_INFINITY))

    argv = [*RUN, *run_args(fixture_bundle, tmp_path)]
    proc = subprocess.run(argv, capture_output=True, text=True, preexec_fn=limit, timeout=300)
    line = last_line(proc.stderr, "chexpercept run")
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "the largest file this process may write: 4.0 KiB" in line and "ulimit -f" in line, line


def test_an_output_on_a_read_only_disk_names_the_target_and_the_commands_option(
    fixture_bundle, tmpfs, tmp_path
):
    """Rule: the message names the target the user asked for (never the file or folder written aside
    of it, ``.s.json.x1y2.tmp``, ``.rep.new-...``) and the option of the command that was run (score
    has --output, not --output-dir)."""
    assert main(run_args(fixture_bundle, tmp_path / "runs", "--limit", "2")) == 0
    disk = tmpfs("ro,size=1m")
    target = disk / "s.json"
    score = run_cli([*CLI, "score", str(tmp_path / "runs" / "baseline-random"), "--output", str(target)])
    line = last_line(score.stderr, "chexpercept score")
    assert score.returncode == 2 and f"cannot write to {target}: its file system is mounted read-only" in line
    assert "another --output)" in line and ".tmp" not in line and "--output-dir" not in line, line
    report = run_cli(
        [*CLI, "report", str(tmp_path / "runs"), "--output-dir", str(disk / "rep"), "--no-plots"]
    )
    line = last_line(report.stderr, "chexpercept report")
    assert report.returncode == 2 and f"{disk / 'rep'}" in line and ".rep." not in line, line
    assert "another --output-dir)" in line, line
