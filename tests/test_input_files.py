"""Issue 27 item 3: every read of a bundle, source, run or review file is a regular file within the
size limit of its kind (chexpercept.input_files). A FIFO, a character device or an oversized file where
a file is expected is refused with an error naming the file (and the limit), never waited on or read
without end.

Commands that could hang or fill memory on a FIFO or ``/dev/zero`` run in a child process with a time
and address-space limit, so a regression fails the test instead of hanging the suite.
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from chexpercept.eval.run import main as run_main
from chexpercept.testing import write_fixture_bundle

CHILD_TIMEOUT = int(os.environ.get("CHEXPERCEPT_TEST_CHILD_TIMEOUT", "180"))  # a guard, not a speed check
CHILD_MEMORY = 3 << 30


def child(*args: str, code: str | None = None) -> subprocess.CompletedProcess:
    """``chexpercept ARGS`` (or the Python ``code``) in a child with a time and memory limit."""

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (CHILD_MEMORY, CHILD_MEMORY))

    command = code or "import sys; from chexpercept.cli import main; sys.exit(main(sys.argv[1:]))"
    try:
        return subprocess.run(
            [sys.executable, "-c", command, *args],
            capture_output=True,
            text=True,
            timeout=CHILD_TIMEOUT,
            preexec_fn=limit,
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"{args[:1]} did not finish: it waits on a FIFO or reads a device without end")


def as_fifo(path: Path) -> Path:
    path.unlink()
    os.mkfifo(path)
    return path


def as_zero_device(path: Path) -> Path:
    """``path`` replaced by a character device reading zeros without end (as /dev/zero)."""
    path.unlink()
    try:
        os.mknod(path, stat.S_IFCHR | 0o644, os.makedev(1, 5))
    except PermissionError:
        pytest.skip("making a device node needs root (CI runs the tests as root)")
    return path


def as_sparse(path: Path, size: int) -> Path:
    """``path`` as a file of ``size`` bytes that takes no disk space (its head kept)."""
    head = path.read_bytes()[:64]
    with open(path, "wb") as f:
        f.write(head)
        f.truncate(size)
    return path


REPLACE = {
    "fifo": (as_fifo, "is a FIFO (named pipe), not a regular file"),
    "device": (as_zero_device, "is a character device, not a regular file"),
}


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    """A bundle and a baseline run of it."""
    root = tmp_path_factory.mktemp("inputs")
    bundle = write_fixture_bundle(root / "bundle", per_cell=1, seed=5)
    args = ["--data-dir", str(bundle), "--model", "baseline:oracle", "--oracle", "none"]
    assert run_main([*args, "--output-dir", str(root / "runs"), "--no-progress", "--no-score"]) == 0
    return root


@pytest.fixture
def work(pristine, tmp_path):
    shutil.copytree(pristine, tmp_path / "w", symlinks=True)
    return tmp_path / "w"


def an_image(bundle: Path) -> Path:
    key = next(iter(json.loads((bundle / "chexpercept.json").read_text())))
    return bundle / "chexpercept" / key / "detection_qa" / "xray.png"


@pytest.mark.parametrize("kind", sorted(REPLACE))
def test_report_embed_images_refuses_a_fifo_or_device_image(work, kind):
    """The issue's shape: an image of the bundle replaced after a run; the report blocked forever
    (FIFO) or read without end (device)."""
    make, said = REPLACE[kind]
    image = make(an_image(work / "bundle"))
    out = work / "report"
    p = child(
        *("report", str(work / "runs"), "--data-dir", str(work / "bundle"), "--output-dir", str(out)),
        *("--embed-images", "--bootstrap", "0", "--no-plots"),
    )
    assert p.returncode == 2, p.stderr[-2000:]
    # refused, never blocked: by the run's record of its images (the bundle's changed since the
    # run, stop 44), or, for a run that records none, by the image itself
    assert "the run was made on other images" in p.stderr or (str(image) in p.stderr and said in p.stderr), (
        p.stderr[-2000:]
    )
    assert not list((out / "images").rglob("xray.png")) or all(
        q.is_file() and not q.is_symlink() for q in (out / "images").rglob("*.png")
    )


@pytest.mark.parametrize("kind", sorted(REPLACE))
@pytest.mark.parametrize("command", ["validate", "inspect", "run"])
def test_validate_inspect_and_run_name_a_fifo_or_device_image(work, kind, command):
    make, said = REPLACE[kind]
    image = make(an_image(work / "bundle"))
    bundle = str(work / "bundle")
    args = {
        "validate": ("validate", bundle),
        "inspect": ("inspect", bundle),
        "run": ("run", "--data-dir", bundle, "--model", "baseline:random", "--output-dir", str(work / "r2")),
    }[command]
    p = child(*args, "--no-progress") if command == "run" else child(*args)
    assert p.returncode in (1, 2), p.stderr[-2000:]
    rel = image.relative_to(work / "bundle").as_posix()
    assert rel in p.stderr and said in p.stderr, p.stderr[-2000:]


def test_load_dataset_names_a_fifo_image(work):
    image = as_fifo(an_image(work / "bundle"))
    code = (
        "import sys, datasets, chexpercept\n"
        "try:\n"
        "    datasets.load_dataset('chexpercept', data_dir=sys.argv[1], cache_dir=sys.argv[2])\n"
        "except Exception as e:\n"
        "    print(f'{type(e).__name__}: {e}', file=sys.stderr); sys.exit(3)\n"
    )
    p = child(str(work / "bundle"), str(work / "cache"), code=code)
    assert p.returncode == 3, p.stderr[-2000:]
    assert "BundleValidationError" in p.stderr and image.relative_to(work / "bundle").as_posix() in p.stderr
    assert "is a FIFO (named pipe), not a regular file" in p.stderr


@pytest.mark.parametrize(
    ("name", "extra"),
    [("chexpercept.json", ()), ("SHA256SUMS.txt", ("--checksums",))],
)
def test_validate_names_a_fifo_in_place_of_the_bundle_files(work, name, extra):
    bundle = work / "bundle"
    from chexpercept.bundle import write_sha256sums

    write_sha256sums(bundle)
    as_fifo(bundle / name)
    p = child("validate", str(bundle), *extra)
    assert p.returncode == 1, p.stderr[-2000:]
    assert f"{name}: " in p.stderr and "is a FIFO (named pipe), not a regular file" in p.stderr


@pytest.mark.parametrize("name", ["results.jsonl", "run.json", "failures.jsonl"])
def test_score_and_report_name_a_fifo_in_the_run_folder(work, name):
    path = work / "runs" / "baseline-oracle" / "oracle_none" / name
    if not path.exists():
        path.write_text("")
    as_fifo(path)
    for args in (
        ("score", str(work / "runs"), "--data-dir", str(work / "bundle")),
        ("report", str(work / "runs"), "--data-dir", str(work / "bundle"), "--output-dir", str(work / "rep")),
    ):
        p = child(*args, *(("--bootstrap", "0", "--no-plots") if args[0] == "report" else ()))
        assert p.returncode == 2, p.stderr[-2000:]
        assert str(path) in p.stderr and "is a FIFO (named pipe), not a regular file" in p.stderr, p.stderr


def test_an_image_over_the_size_limit_is_named_with_the_limit(work, capsys):
    from chexpercept.cli import main as cli

    image = as_sparse(an_image(work / "bundle"), (256 << 20) + 1)
    assert cli(["validate", str(work / "bundle")]) == 1
    err = capsys.readouterr().err
    rel = image.relative_to(work / "bundle").as_posix()
    line = next(line for line in err.splitlines() if rel in line)
    assert "over the limit of 256 MiB for a image or mask (chexpercept.input_files.IMAGE)" in line


def test_a_bundle_json_over_the_size_limit_is_refused_unread(work):
    as_sparse(work / "bundle" / "chexpercept.json", (4 << 30) + 1)
    p = child("validate", str(work / "bundle"))
    assert p.returncode == 1, p.stderr[-2000:]
    assert "chexpercept.json: is 4.0 GiB, over the limit of 4 GiB" in p.stderr and "BUNDLE_JSON" in p.stderr


def test_a_file_that_grows_while_it_is_read_is_refused(tmp_path):
    from chexpercept.input_files import InputFileError, Limit, open_input

    path = tmp_path / "f.json"
    path.write_bytes(b"x" * 100)
    small = Limit("TEST", "test file", 150)
    with open_input(path, small) as f:
        with open(path, "ab") as grow:
            grow.write(b"y" * 100)
        with pytest.raises(InputFileError, match="grew past the limit of 150 bytes"):
            f.read()


# ------------------------------------------------------------------------------------ generation
@pytest.fixture(scope="module")
def pristine_sources(tmp_path_factory):
    from chexpercept.builder.synth_sources import synthesize_sources

    return synthesize_sources(
        tmp_path_factory.mktemp("src_inputs") / "src", per_cell=1, lesions=("effusion",), progress=False
    )


@pytest.fixture
def sources(pristine_sources, tmp_path):
    copy = tmp_path / "src"
    shutil.copytree(pristine_sources, copy, symlinks=True)
    return copy


def _generate_args(src: Path, out: Path, *extra: str) -> tuple[str, ...]:
    return (
        *("generate", "--mimic-cxr-jpg", str(src / "mimic-cxr-jpg"), "--mimic-ils", str(src / "mimic-ils")),
        *("--anatomy", str(src / "anatomy"), "--lesions", "effusion", "--per-cell", "1"),
        *("--output-dir", str(out), "--no-progress", "--num-proc", "1", *extra),
    )


@pytest.mark.parametrize("which", ["cxr", "lesion mask", "lung mask"])
def test_generate_fails_the_case_whose_source_file_is_a_fifo(sources, tmp_path, which):
    """A case's source file replaced by a FIFO: that case fails, named; the run finishes."""
    pick = {
        "cxr": lambda: sorted((sources / "mimic-cxr-jpg" / "files").rglob("*.jpg")),
        "lesion mask": lambda: sorted((sources / "mimic-ils" / "lesion_mask").rglob("*.png")),
        "lung mask": lambda: sorted((sources / "anatomy").rglob("right_lung.png")),
    }[which]
    for path in pick():
        as_fifo(path)
    p = child(*_generate_args(sources, tmp_path / "out"))
    text = p.stdout + p.stderr
    assert "is a FIFO (named pipe), not a regular file" in text, text[-3000:]


@pytest.mark.parametrize("which", ["mimic-ils json", "review sheet"])
def test_generate_refuses_a_fifo_in_place_of_a_source_table(sources, tmp_path, which):
    from chexpercept.builder.sources import ILS_JSON

    if which == "mimic-ils json":
        path, extra = as_fifo(sources / "mimic-ils" / ILS_JSON), ()
    else:
        path = tmp_path / "sheet.csv"
        os.mkfifo(path)
        extra = ("--review", str(path))
    p = child(*_generate_args(sources, tmp_path / "out", *extra))
    assert p.returncode == 2, p.stderr[-2000:]
    assert str(path) in p.stderr and "is a FIFO (named pipe), not a regular file" in p.stderr, p.stderr


# ------------------------------------------------------------------------------------ review data
REVIEW_READS = """
import sys
from pathlib import Path
from chexpercept.builder.review.access import Access
from chexpercept.builder.review.manifest import load_manifest
from chexpercept.builder.review.store import read_decisions
for name, read in (
    ("decisions", lambda: read_decisions(Path(sys.argv[1]) / "decisions" / "ann1.jsonl")),
    ("access", lambda: Access.load_or_create(sys.argv[1], ["ann1"])),
    ("manifest", lambda: load_manifest(sys.argv[1])),
):
    try:
        read()
    except Exception as e:
        print(f"{name}: {type(e).__name__}: {e}")
"""


def test_review_decisions_access_and_manifest_that_are_fifos_are_refused(tmp_path):
    from chexpercept.builder.review.access import ACCESS_FILE
    from chexpercept.builder.review.manifest import MANIFEST

    (tmp_path / "decisions").mkdir()
    os.mkfifo(tmp_path / "decisions" / "ann1.jsonl")
    os.mkfifo(tmp_path / ACCESS_FILE, 0o600)
    os.mkfifo(tmp_path / MANIFEST)
    p = child(str(tmp_path), code=REVIEW_READS)
    lines = p.stdout.splitlines()
    for name in ("decisions", "access", "manifest"):
        line = next((x for x in lines if x.startswith(f"{name}: ")), "")
        assert "is a FIFO (named pipe), not a regular file" in line, (name, p.stdout, p.stderr[-1000:])


def test_a_line_reader_streams_and_bounds_each_line(tmp_path):
    """Red team #8: results.jsonl and failures.jsonl are streamed a line at a time (iter_lines, which
    results.complete_lines uses), each line bounded (MAX_LINE), a torn last line left out; a line over
    the bound is refused, naming the file and the line, without reading it whole."""
    from chexpercept import input_files

    path = tmp_path / "failures.jsonl"
    path.write_bytes(b'{"a": 1}\n\n{"b": 2}\n{"torn')
    assert list(input_files.iter_lines(path, input_files.RESULTS)) == [
        (1, '{"a": 1}'),
        (2, ""),
        (3, '{"b": 2}'),
    ]
    path.write_bytes(b'{"a": 1}\n' + b'{"x": "' + b"y" * 1000 + b'"}\n')
    with pytest.raises(
        input_files.InputFileError, match=r"failures.jsonl.* line longer than 64 bytes \(line 2\)"
    ):
        list(input_files.iter_lines(path, input_files.RESULTS, max_line=64))
    path.write_bytes(b'{"a": 1}\n\xff\xfe\n')
    with pytest.raises(input_files.InputFileError, match=r"not UTF-8 text \(line 2"):
        list(input_files.iter_lines(path, input_files.RESULTS))


def test_a_model_folder_fingerprint_reads_only_bounded_regular_files(tmp_path):
    """Red team #9: folder_fingerprint hashes a model folder's files whole but streamed, in chunks
    (chexpercept/file_digest.py, through chexpercept.input_files): a FIFO put in the folder is never
    opened (it would block) and is no file of the model; digests are cached by stat, so a changed
    file is read again."""
    from chexpercept.eval.runner.identity import folder_fingerprint
    from chexpercept.file_digest import DigestCache

    model = tmp_path / "model"
    model.mkdir()
    (model / "model.safetensors").write_bytes(b"w" * 4096)
    (model / "tokenizer.json").write_text("{}")
    cache = DigestCache(tmp_path / "digests")
    first = folder_fingerprint(model, cache)
    assert first.startswith("sha256:") and folder_fingerprint(model, cache) == first
    os.mkfifo(model / "tokenizer.model")
    assert folder_fingerprint(model, cache) == first  # returned: the FIFO was neither opened nor counted
    (model / "tokenizer.json").write_text('{"a": 1}')
    assert folder_fingerprint(model, cache) != first  # a changed file is read again (its stat moved)


def test_no_module_opens_a_file_itself():
    """Every read of a file from disk goes through chexpercept/input_files.py (a regular file within a
    limit, never a FIFO or a device) and every write through chexpercept/fileio.py: a new ``open()``,
    ``.read_bytes()`` or ``.read_text()`` elsewhere fails here with its file and line, unless it is
    one of these, each for its reason."""
    import ast

    root = Path(__file__).resolve().parents[1]
    allowed = {
        "chexpercept/input_files.py": "the one bounded reader",
        "chexpercept/fileio.py": "the one writer",
        "chexpercept/tcp_table.py": "reads /proc/net/tcp (the kernel's table)",
        "eval/runner/interrupts.py": "reads /proc/<pid>/stat",
        "eval/runner/distributed.py": "reads /proc/<ppid>/cmdline and environ",
        "eval/runner/store.py": "reads /proc/<pid>/stat; truncates its own torn tail in place",
        "builder/review/store.py": "truncates its own torn tail in place",
        "metrics/evaluate_support.py": "reads the metric module's source from this package",
        "metrics/report/page.py": "reads the report's assets from this package",
        "builder/review/server.py": "reads the review app's static files from this package",
        "builder/reference_layout.py": "reads the phantom table it just wrote",
        "eval/tiny_model.py": "edits the processor file it just saved",
        "chexpercept/stdio.py": "a stream on the process's own descriptor 1 or 2, never a file by name",
    }
    found = []
    for package in ("chexpercept", "builder", "metrics", "eval"):
        for path in sorted((root / package).rglob("*.py")):
            rel = path.relative_to(root).as_posix()
            if rel in allowed:
                continue
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                f = getattr(node, "func", None)
                if (isinstance(f, ast.Name) and f.id == "open") or (
                    isinstance(f, ast.Attribute) and f.attr in ("read_bytes", "read_text")
                ):
                    found.append(f"{rel}:{node.lineno}")
    assert not found, "read through chexpercept.input_files (write through fileio) instead:\n" + "\n".join(
        found
    )
