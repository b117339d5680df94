"""On a shared server, nobody else can read what the toolkit writes (issue 27, class 2).

Every command's outputs are created owner-only whatever the umask, in a world-traversable folder as
on a shared server; another local account (made here with useradd; the tests run as root in CI)
then tries to read them. Members: a run's results.jsonl, run.json, failures and lock; the report
with embedded X-rays; the datasets cache; a generated bundle; `score --output`; an old run folder
that an earlier version left readable, tightened when it is resumed.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import tempfile
from pathlib import Path

import pytest

from chexpercept.cli import main as cli
from chexpercept.eval.run import main as run_main


@pytest.fixture(scope="module")
def other_account():
    """A second local account (useradd), removed afterwards."""
    if os.geteuid() != 0 or shutil.which("useradd") is None:
        pytest.skip("needs root and useradd to make a second local account")
    name = f"chxother{os.getpid() % 100000}"
    subprocess.run(["useradd", "--no-create-home", "--shell", "/bin/false", name], check=True)
    try:
        yield name
    finally:
        subprocess.run(["userdel", name], check=False)


@pytest.fixture
def shared(tmp_path_factory):
    """A world-traversable folder, as home and data folders often are on shared servers, and the
    usual umask 022."""
    folder = Path(tempfile.mkdtemp(prefix="chx-shared-", dir="/tmp"))
    folder.chmod(0o755)
    old = os.umask(0o022)
    try:
        yield folder
    finally:
        os.umask(old)
        shutil.rmtree(folder, ignore_errors=True)


def _readable_by(account: str, path: Path) -> bool:
    """Whether ``account`` can read ``path`` (cat as that user)."""
    done = subprocess.run(["cat", str(path)], user=account, capture_output=True, timeout=30)
    return done.returncode == 0


def _not_private(root: Path) -> list[str]:
    """Everything under ``root`` (itself included) that another account could read or enter."""
    bad = []
    for path in [root, *root.rglob("*")]:
        if path.is_symlink():
            continue
        if stat.S_IMODE(os.stat(path).st_mode) & 0o077:
            bad.append(f"{path.relative_to(root.parent)} {oct(stat.S_IMODE(os.stat(path).st_mode))}")
    return bad


def test_a_run_and_its_report_are_private(shared, other_account, fixture_bundle):
    runs = shared / "runs"
    assert (
        run_main(
            [
                "--data-dir",
                str(fixture_bundle),
                "--model",
                "baseline:random",
                "--output-dir",
                str(runs),
                "--no-score",
                "--no-progress",
            ]
        )
        == 0
    )
    run_dir = runs / "baseline-random" / "oracle_implicit"
    assert not _not_private(runs / "baseline-random")
    for name in ("results.jsonl", "run.json"):
        assert not _readable_by(other_account, run_dir / name), name
    report = shared / "report"
    assert (
        cli(
            [
                "report",
                str(runs),
                "--output-dir",
                str(report),
                "--embed-images",
                "--no-plots",
                "--bootstrap",
                "0",
            ]
        )
        == 0
    )
    assert not _not_private(report)
    images = sorted((report / "images").rglob("*.png"))
    assert images and not _readable_by(other_account, images[0])
    assert not _readable_by(other_account, report / "index.html")


def test_score_output_file_is_private(shared, fixture_bundle):
    runs = shared / "runs"
    assert (
        run_main(
            [
                "--data-dir",
                str(fixture_bundle),
                "--model",
                "baseline:prior",
                "--output-dir",
                str(runs),
                "--no-score",
                "--no-progress",
            ]
        )
        == 0
    )
    out = shared / "scores.json"
    assert cli(["score", str(runs / "baseline-prior"), "--output", str(out)]) == 0
    assert stat.S_IMODE(os.stat(out).st_mode) == 0o600


def test_score_output_into_a_folder_of_another_account_is_one_line(
    shared, other_account, fixture_bundle, capsys
):
    """Final red team: ``score --output`` into a folder another account owns is refused with one
    line naming the folder and its owner (chexpercept.errors.Refused), not a traceback."""
    import pwd

    runs = shared / "runs"
    args = ["--data-dir", str(fixture_bundle), "--model", "baseline:prior", "--limit", "1"]
    assert run_main([*args, "--output-dir", str(runs), "--no-score", "--no-progress"]) == 0
    theirs = shared / "theirs"
    theirs.mkdir(mode=0o700)
    uid = pwd.getpwnam(other_account).pw_uid
    os.chown(theirs, uid, uid)
    capsys.readouterr()
    assert cli(["score", str(runs / "baseline-prior"), "--output", str(theirs / "scores.json")]) == 2
    err = capsys.readouterr().err
    last = err.splitlines()[-1]  # after score's notes on the settings
    assert last.startswith("chexpercept score: ") and "Traceback" not in err, err
    assert str(theirs) in last and other_account in last
    assert not (theirs / "scores.json").exists()


def test_an_old_readable_run_folder_is_tightened_on_resume(shared, fixture_bundle):
    runs = shared / "runs"
    args = [
        "--data-dir",
        str(fixture_bundle),
        "--model",
        "baseline:constant:1",
        "--output-dir",
        str(runs),
        "--no-score",
        "--no-progress",
        "--limit",
        "3",
    ]
    assert run_main(args) == 0
    run_dir = runs / "baseline-constant-1" / "oracle_implicit"
    run_dir.chmod(0o755)  # as an earlier version left it under umask 022
    (run_dir / "results.jsonl").chmod(0o644)
    assert run_main([*args[:-1], "5"]) == 0
    assert stat.S_IMODE(os.stat(run_dir).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(run_dir / "results.jsonl").st_mode) == 0o600


def test_datasets_cache_is_private(shared, other_account, fixture_bundle):
    from datasets import load_dataset

    cache = shared / "hf-datasets"
    ds = load_dataset("chexpercept", data_dir=str(fixture_bundle), cache_dir=str(cache))["train"]
    assert len(ds) > 0
    arrows = sorted(cache.rglob("*.arrow"))
    assert arrows and not _readable_by(other_account, arrows[0])
    # red team, stop 48: datasets' lock in the cache root was 0644, and another account holding a
    # flock on it made every load_dataset of the release wait for ever, a cached one too
    locks = sorted(cache.glob("*.lock"))
    assert locks and all(stat.S_IMODE(p.stat().st_mode) == 0o600 for p in locks), locks
    assert not _readable_by(other_account, locks[0])
    # round 2 (helper-54): a cache root others may write into let them swap the lock between its
    # check and datasets' open: the root is closed to their writes before the lock is made
    from datasets import load_dataset_builder

    loose = shared / "loose-cache"
    loose.mkdir(mode=0o777)
    loose.chmod(0o777)
    load_dataset_builder("chexpercept", data_dir=str(fixture_bundle), cache_dir=str(loose))
    assert stat.S_IMODE(loose.stat().st_mode) & 0o022 == 0
    assert all(stat.S_IMODE(p.stat().st_mode) == 0o600 for p in loose.glob("*.lock"))
    locks[0].chmod(0o644)  # as an earlier version left it
    load_dataset("chexpercept", data_dir=str(fixture_bundle), cache_dir=str(cache))
    assert stat.S_IMODE(locks[0].stat().st_mode) == 0o600


def test_no_other_account_can_swap_a_folder_on_the_datasets_cache_s_way(
    shared, other_account, fixture_bundle
):
    """Under umask 000 datasets made the cache root 0777 without the sticky bit: another account
    renamed the builder's private folder away mid-build and put its own in its place, and the Arrow
    rows were written into it (red team, stop 43). A way folder of this account's is closed to other
    accounts' writes; one of another account's that every account may write into is refused."""
    import pwd

    from datasets import load_dataset

    from chexpercept.fileio import PrivacyError

    cache = shared / "open-cache"
    cache.mkdir()
    cache.chmod(0o777)
    load_dataset("chexpercept", data_dir=str(fixture_bundle), cache_dir=str(cache))
    assert cache.stat().st_mode & 0o022 == 0  # ours: closed to other accounts' writes
    group = shared / "group-cache"  # ours, group-writable (a lab's 2775 cache): closed too
    group.mkdir()
    group.chmod(0o2775)
    load_dataset("chexpercept", data_dir=str(fixture_bundle), cache_dir=str(group))
    assert group.stat().st_mode & 0o022 == 0
    # another account's folder on the way, whatever its mode (round 2: 2775 and 0755 were taken;
    # its owner may move any folder in it)
    uid = pwd.getpwnam(other_account).pw_uid
    for mode in (0o777, 0o2775, 0o755):
        theirs = shared / f"theirs-{mode:o}"
        (theirs / "cache").mkdir(parents=True)
        theirs.chmod(mode)
        os.chown(theirs, uid, -1)
        with pytest.raises(PrivacyError) as e:
            load_dataset("chexpercept", data_dir=str(fixture_bundle), cache_dir=str(theirs / "cache"))
        assert str(theirs) in str(e.value) and other_account in str(e.value), mode
        assert not list(theirs.rglob("*.arrow"))


def test_generated_bundle_is_private(shared):
    out = shared / "bundle"
    assert (
        cli(
            [
                "synth",
                "--output-dir",
                str(out),
                "--per-cell",
                "1",
                "--lesions",
                "atelectasis",
                "--no-progress",
            ]
        )
        == 0
    )
    assert not _not_private(out)


def test_a_folder_owned_by_another_account_is_refused_whatever_its_mode(
    shared, other_account, fixture_bundle, capsys
):
    """Red team #6: a datasets cache folder or a run folder that belongs to another account is refused
    even when it is private (mode 0700, so the old check passed): its owner reads what is written
    there. The message names the folder, its owner and what to set instead."""
    import pwd

    from datasets import load_dataset

    from chexpercept.fileio import PrivacyError

    uid = pwd.getpwnam(other_account).pw_uid
    cache = shared / "hf-datasets"
    theirs = cache / "chexpercept"
    theirs.mkdir(parents=True, mode=0o700)
    os.chown(theirs, uid, uid)
    with pytest.raises(PrivacyError) as e:
        load_dataset("chexpercept", data_dir=str(fixture_bundle), cache_dir=str(cache))
    message = str(e.value)
    assert str(theirs) in message and other_account in message and "HF_DATASETS_CACHE" in message
    assert not list(theirs.rglob("*.arrow"))
    runs = shared / "runs"
    (runs / "baseline-prior").mkdir(parents=True, mode=0o700)
    os.chown(runs / "baseline-prior", uid, uid)
    args = ["--data-dir", str(fixture_bundle), "--model", "baseline:prior", "--limit", "1"]
    assert run_main([*args, "--output-dir", str(runs), "--no-score", "--no-progress"]) != 0
    err = capsys.readouterr().err
    assert "baseline-prior" in err and other_account in err, err
    assert not list((runs / "baseline-prior").rglob("results.jsonl"))


def test_a_run_folder_of_ours_inside_a_project_folder_of_another_account_is_fine(
    shared, other_account, fixture_bundle
):
    """A group's project folder belongs to its lead: a run folder made there is this account's and
    private, so the run goes ahead (the check is on the folders the toolkit writes into, not above)."""
    import pwd

    uid = pwd.getpwnam(other_account).pw_uid
    project = shared / "project"
    project.mkdir(mode=0o777)
    os.chown(project, uid, uid)
    os.chmod(project, 0o1777)  # others may make folders there, as in a sticky shared folder
    args = ["--data-dir", str(fixture_bundle), "--model", "baseline:prior", "--limit", "1"]
    assert run_main([*args, "--output-dir", str(project / "runs"), "--no-score", "--no-progress"]) == 0
    made = project / "runs" / "baseline-prior"
    assert made.stat().st_uid == os.geteuid() and not made.stat().st_mode & 0o077


def test_a_run_folder_swapped_by_another_account_gets_nothing(shared, other_account, fixture_bundle):
    """Red team #4: between two writes of a run, another account (the runs folder being writable by it)
    puts its own folder, or a link to one, where the run folder was, or its own file where ours was.
    Every writer (append_durable, the atomic writer, open_private) refuses before writing a byte."""
    import pwd

    from chexpercept import fileio

    uid = pwd.getpwnam(other_account).pw_uid
    runs = shared / "runs"
    args = ["--data-dir", str(fixture_bundle), "--model", "baseline:prior", "--oracle", "none"]
    assert run_main([*args, "--limit", "1", "--output-dir", str(runs), "--no-score", "--no-progress"]) == 0
    ours = runs / "baseline-prior" / "oracle_none"
    theirs = shared / "theirs"
    theirs.mkdir(mode=0o777)
    (theirs / "results.jsonl").write_text("")
    os.chown(theirs, uid, uid)
    os.chown(theirs / "results.jsonl", uid, uid)
    line = b'{"key_id": "edema_s50000001_positive_0"}\n'
    # 1. their folder, through a link where the run folder was
    ours.rename(shared / "moved")
    ours.symlink_to(theirs, target_is_directory=True)
    for write in (
        lambda: fileio.append_durable(ours / "results.jsonl", line),
        lambda: fileio.append_durable(ours / "failures.jsonl", line),
        lambda: fileio.write_json_atomic(ours / "run.json", {"key_id": "x"}),
        lambda: os.close(fileio.open_private(ours / "lock")),
    ):
        with pytest.raises(fileio.PrivacyError, match=other_account):
            write()
    assert (theirs / "results.jsonl").read_text() == "" and sorted(os.listdir(theirs)) == ["results.jsonl"]
    # 2. their own file where ours was, in our folder
    ours.unlink()
    (shared / "moved").rename(ours)
    os.chown(ours / "results.jsonl", uid, uid)
    with pytest.raises(fileio.PrivacyError, match="is not a file of this account"):
        fileio.append_durable(ours / "results.jsonl", line)
    # 3. a link in place of a file
    (ours / "results.jsonl").unlink()
    (ours / "results.jsonl").symlink_to(theirs / "results.jsonl")
    with pytest.raises(fileio.PrivacyError, match="is a link"):
        fileio.append_durable(ours / "results.jsonl", line)
    assert (theirs / "results.jsonl").read_text() == ""


def test_an_output_file_never_goes_through_another_accounts_link_or_into_its_pipe(
    other_account, shared, fixture_bundle, tmp_path, capsys
):
    """``score --output /tmp/shared/scores.json``: another account's FIFO there received the scores,
    and its link planted there replaced a file of this account's with them (the link was followed
    without asking whose it was). Both are refused before any work; the planted link's target is
    untouched (red team, stop 43)."""
    import pwd

    uid = pwd.getpwnam(other_account).pw_uid
    shared.chmod(0o1777)
    runs = tmp_path / "runs"
    assert run_main(["--data-dir", str(fixture_bundle), "--model", "baseline:random", "--limit", "2",
                     "--output-dir", str(runs), "--no-progress", "--no-score"]) == 0  # fmt: skip
    fifo = shared / "scores.json"
    os.mkfifo(fifo, 0o622)
    os.chown(fifo, uid, -1)
    mine = tmp_path / "important.txt"
    mine.write_text("mine")
    link = shared / "planted.json"
    link.symlink_to(mine)
    os.lchown(link, uid, -1)
    deeper = shared / "dir-link"
    deeper.symlink_to(tmp_path)
    os.lchown(deeper, uid, -1)
    capsys.readouterr()
    for target, said in ((fifo, "is a pipe, device or socket of another account"),
                         (link, "is a link of another account"),
                         (deeper / "important.txt", "is a link of another account"),
                         # link/.. is the folder above the link's target, as the kernel reads it
                         # (round 2: the path was normalised first and the link never asked about)
                         (f"{deeper}/../important.txt", "is a link of another account")):  # fmt: skip
        with pytest.raises(SystemExit) as stopped:
            cli(["score", str(runs), "--output", str(target)])
        err = capsys.readouterr().err
        assert stopped.value.code == 2 and said in err and other_account in err, err
    assert mine.read_text() == "mine"
    # a pipe put there between the check and the write (round 2): what was opened is checked
    from chexpercept.fileio import PrivacyError, write_atomic

    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)  # its owner listening: the open does not wait
    try:
        with pytest.raises(PrivacyError, match="is a pipe, device or socket of"):
            write_atomic(fifo, "scores")
        assert os.read(reader, 100) == b""
    finally:
        os.close(reader)
    own = shared / "own-link.json"  # this account's own link is followed, as before
    own.symlink_to(tmp_path / "scores.json")
    assert cli(["score", str(runs), "--output", str(own)]) == 0
    assert (tmp_path / "scores.json").is_file() and own.is_symlink()
