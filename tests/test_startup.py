"""Lazy registration: `import chexpercept` and the command line leave datasets and torch alone, and
load_dataset("chexpercept", ...) still resolves to our builder once datasets is imported."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from chexpercept.testing import write_fixture_bundle

HEAVY = ("datasets", "pyarrow", "pandas", "torch", "transformers", "vllm")


def _child(code: str, *args: str) -> dict:
    """Run code in a fresh interpreter; it prints one JSON line last."""
    proc = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


LOADED = f"print(json.dumps(sorted(m for m in {HEAVY!r} if m in sys.modules)))"


@pytest.mark.parametrize(
    "code",
    [
        "import chexpercept",
        "import chexpercept.metrics",
        "from chexpercept import Case, Path, read_bundle, LESIONS",
        "import contextlib, io\nfrom chexpercept.cli import main\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n    main(['--help'])",
    ],
)
def test_light_imports_leave_heavy_libraries_out(code: str) -> None:
    assert _child(f"import json, sys\n{code}\n{LOADED}") == []


@pytest.mark.parametrize(
    "command",
    [
        "run",
        "score",
        "report",
        "generate",
        "validate",
        "inspect",
        "estimate",
        "review",
        "download-model",
        "push-results",
        "benchmark-card",
        "leaderboard",
    ],
)
def test_command_help_imports_no_heavy_library(command: str) -> None:
    code = (
        "import contextlib, io, json, sys\nfrom chexpercept.cli import main\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        f"    try:\n        main([{command!r}, '--help'])\n    except SystemExit:\n        pass\n{LOADED}"
    )
    assert _child(code) == []


@pytest.mark.parametrize(
    "order",
    [
        "import chexpercept\nfrom datasets import load_dataset",  # registered when datasets loads
        "from datasets import load_dataset\nimport chexpercept",  # registered at once
        "import chexpercept\nimport datasets.load\nfrom datasets import load_dataset",
    ],
)
def test_load_dataset_works_after_import_chexpercept(tmp_path, order: str) -> None:
    bundle = write_fixture_bundle(tmp_path / "bundle", per_cell=1)
    code = (
        f"import json, sys\n{order}\n"
        "ds = load_dataset('chexpercept', data_dir=sys.argv[1], cache_dir=sys.argv[2])\n"
        "from chexpercept.registration import _HOOK\n"
        "print(json.dumps({'rows': ds['train'].num_rows, 'hook_left': _HOOK in sys.meta_path}))"
    )
    out = _child(code, str(bundle), str(tmp_path / "cache"))
    assert out == {"rows": 21, "hook_left": False}


def test_registration_never_breaks_import_datasets(monkeypatch) -> None:
    code = (
        "import json, sys, warnings\nimport chexpercept.registration as r\n"
        "def broken():\n    raise RuntimeError('incompatible datasets')\n"
        "r.register = broken\n"
        "with warnings.catch_warnings(record=True) as caught:\n"
        "    warnings.simplefilter('always')\n    import datasets\n"
        "print(json.dumps({'imported': 'datasets' in sys.modules, "
        "'warning': [str(w.message) for w in caught if 'chexpercept' in str(w.message)]}))"
    )
    out = _child(code)
    assert out["imported"] is True
    assert len(out["warning"]) == 1 and "incompatible datasets" in out["warning"][0]
