"""chexpercept/fileio.py: every file private from creation, replaced whole, appended durably; and no
other module of the package writes a file itself."""

from __future__ import annotations

import ast
import os
import stat
from pathlib import Path

import pytest

from chexpercept import fileio

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("chexpercept", "builder", "metrics", "eval")

#: calls that create files or folders, by their attribute or function name
#: (tempfile's mkstemp, mkdtemp and TemporaryDirectory create 0600 files and 0700 folders: allowed)
_WRITERS = {"write_text", "write_bytes", "mkdir", "makedirs", "savefig", "touch", "NamedTemporaryFile"}
#: shutil's copies keep the source's mode
_SHUTIL_WRITERS = {"copy", "copy2", "copyfile", "copytree", "move"}
#: (file, call) pairs that may stay, and why
_ALLOWED = {
    ("chexpercept/fileio.py", "*"): "the one module that writes",
    ("chexpercept/testing.py", "*"): "phantom test data for the test suite, never credentialed",
    ("builder/reference_layout.py", "TemporaryDirectory"): "a scratch folder inside the private output",
    (
        "builder/reference_layout.py",
        "copytree",
    ): "copies phantom files that fileio wrote (0600) into a private folder",
    ("metrics/report/plots.py", "savefig"): "matplotlib writes into an atomic_file object",
    ("chexpercept/stdio.py", "open"): "a stream on the process's own descriptor 1 or 2, never a file by name",
}


def _calls(path: Path) -> list[tuple[int, str, ast.Call]]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            f = node.func
            name = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""
            owner = f.value.id if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) else ""
            if name in _SHUTIL_WRITERS and owner != "shutil":
                continue  # an array's or a dict's copy
            out.append((node.lineno, name, node))
    return out


def _opens_for_writing(call: ast.Call) -> bool:
    """``open(x, "w"/"a"/"x"...)`` or ``os.open(x, ... O_CREAT ...)``."""
    f = call.func
    if (isinstance(f, ast.Name) and f.id == "open") or (isinstance(f, ast.Attribute) and f.attr == "open"):
        mode = (
            call.args[1]
            if len(call.args) > 1
            else next((k.value for k in call.keywords if k.arg == "mode"), None)
        )
        if isinstance(mode, ast.Constant) and isinstance(mode.value, str):
            return any(c in mode.value for c in "wax+")
        flags = ast.unparse(call.args[1]) if len(call.args) > 1 else ""
        return "O_CREAT" in flags or "O_WRONLY" in flags
    return False


def test_no_module_writes_files_itself():
    """Every write goes through chexpercept/fileio.py (private modes, atomic replace, durable append):
    a new writer elsewhere fails here with its file and line."""
    found = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            if (rel, "*") in _ALLOWED:
                continue
            for line, name, call in _calls(path):
                if (rel, name) in _ALLOWED:
                    continue
                if name in _WRITERS or name in _SHUTIL_WRITERS or _opens_for_writing(call):
                    found.append(f"{rel}:{line}: {name}")
    assert not found, "write through chexpercept.fileio instead:\n" + "\n".join(found)


@pytest.fixture
def lax_umask():
    old = os.umask(0)
    try:
        yield
    finally:
        os.umask(old)


def _mode(p: Path) -> int:
    return stat.S_IMODE(os.stat(p).st_mode)


def test_everything_is_private_whatever_the_umask(tmp_path, lax_umask):
    d = fileio.private_dir(tmp_path / "a" / "b")
    assert _mode(tmp_path / "a") == 0o700 and _mode(d) == 0o700
    fileio.write_atomic(d / "x.json", "{}")
    fileio.write_json_atomic(d / "y.json", {"k": 1})
    fileio.append_durable(d / "z.jsonl", b"{}\n")
    fileio.write_new(d / "n" / "w.png", b"\x89PNG")
    with fileio.atomic_file(d / "s.csv", "w", encoding="utf-8") as f:
        f.write("a,b\n")
    from chexpercept.input_files import JSON_FILE

    fileio.copy_file(d / "x.json", d / "c.json", limit=JSON_FILE)
    fd = fileio.open_private(d / "lock")
    os.close(fd)
    for name in ("x.json", "y.json", "z.jsonl", "n/w.png", "s.csv", "c.json", "lock"):
        assert _mode(d / name) == 0o600, name
    assert _mode(d / "n") == 0o700


def test_own_folder_is_tightened_and_a_foreign_one_refused(tmp_path, lax_umask):
    old = tmp_path / "old-run"
    old.mkdir(mode=0o755)
    fileio.private_dir(old, own=True)
    assert _mode(old) == 0o700
    other = tmp_path / "theirs"
    other.mkdir(mode=0o755)
    os.chown(other, 65534, 65534) if os.geteuid() == 0 else pytest.skip("needs root to chown")
    with pytest.raises(fileio.PrivacyError, match="belongs to .*uid 65534"):
        fileio.private_dir(other, own=True)


def test_atomic_file_leaves_the_old_file_when_the_writer_fails(tmp_path):
    target = tmp_path / "t.txt"
    fileio.write_atomic(target, "old\n")
    with pytest.raises(RuntimeError), fileio.atomic_file(target, "w") as f:
        f.write("half")
        raise RuntimeError("killed")
    assert target.read_text() == "old\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.txt"]  # no temporary left


def test_replaced_dir_swaps_whole_or_not_at_all(tmp_path):
    out = tmp_path / "report"
    with fileio.replaced_dir(out, marker=".mine") as stage:
        fileio.write_atomic(stage / "index.html", "v1")
    assert (out / "index.html").read_text() == "v1" and (out / ".mine").is_file()
    with pytest.raises(RuntimeError), fileio.replaced_dir(out, marker=".mine") as stage:
        fileio.write_atomic(stage / "tables.md", "new table")
        raise RuntimeError("stopped midway")
    assert sorted(p.name for p in out.iterdir()) == [".mine", "index.html"]  # the old one, whole
    with fileio.replaced_dir(out, marker=".mine") as stage:
        fileio.write_atomic(stage / "index.html", "v2")
    assert (out / "index.html").read_text() == "v2"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report"]  # nothing left aside


def test_replaced_dir_refuses_a_folder_it_did_not_write(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    (home / "thesis.tex").write_text("precious")
    with (
        pytest.raises(fileio.NotOursError, match="not empty and was not written"),
        fileio.replaced_dir(home, marker=".chexpercept-report"),
    ):
        pytest.fail("must refuse before any work")
    assert (home / "thesis.tex").read_text() == "precious"


def test_replaced_dir_cleans_leftovers_of_a_killed_process(tmp_path):
    out = tmp_path / "r"
    (tmp_path / ".r.new-abc").mkdir()
    (tmp_path / ".r.new-abc" / "half.csv").write_text("x")
    with fileio.replaced_dir(out, marker=".m") as stage:
        fileio.write_atomic(stage / "a", "1")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r"]


def test_append_durable_lines_of_two_writers_never_interleave(tmp_path):
    import multiprocessing as mp

    target = tmp_path / "results.jsonl"
    procs = [mp.get_context("fork").Process(target=_append_many, args=(target, i)) for i in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(30)
    lines = target.read_bytes().split(b"\n")[:-1]
    assert len(lines) == 400 and all(line in (b"a" * 5000, b"b" * 5000) for line in lines)


def _append_many(target: Path, i: int) -> None:
    for _ in range(200):
        fileio.append_durable(target, (b"ab"[i : i + 1] * 5000) + b"\n")


def test_report_killed_midway_leaves_the_previous_report_whole(tmp_path, fixture_bundle):
    """`chexpercept report` killed (SIGKILL) while it writes a new report: the folder still holds the
    previous report, whole, and the next report replaces it whole."""
    import signal
    import subprocess
    import sys
    import time

    from chexpercept.eval.run import main as run_main

    runs = tmp_path / "runs"
    for model in ("baseline:random", "baseline:prior"):
        assert (
            run_main(
                [
                    "--data-dir",
                    str(fixture_bundle),
                    "--model",
                    model,
                    "--output-dir",
                    str(runs),
                    "--no-score",
                    "--no-progress",
                ]
            )
            == 0
        )
    out = tmp_path / "report"
    command = [sys.executable, "-m", "chexpercept.cli", "report", str(runs), "--output-dir", str(out)]
    subprocess.run([*command, "--no-plots", "--bootstrap", "0"], check=True, capture_output=True)
    before = {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()}
    proc = subprocess.Popen(
        [*command, "--bootstrap", "200"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        if any(tmp_path.glob(".report.new-*/tables/table2.md")):
            break
        time.sleep(0.01)
    assert proc.poll() is None, "the report finished before it could be stopped midway"
    proc.send_signal(signal.SIGKILL)
    proc.wait(30)
    after = {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()}
    assert after == before
    subprocess.run([*command, "--no-plots", "--bootstrap", "0"], check=True, capture_output=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report", "runs"]
