"""Lazy registration: `import chexpercept` and the command line leave datasets and torch alone, and
load_dataset("chexpercept", ...) still resolves to our builder once datasets is imported."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

from chexpercept.testing import write_fixture_bundle

ROOT = Path(__file__).resolve().parents[1]
HEAVY = ("datasets", "pyarrow", "pandas", "torch", "transformers", "vllm")


def _child(code: str, *args: str, env: dict[str, str] | None = None) -> dict:
    """Run code in a fresh interpreter; it prints one JSON line last."""
    proc = subprocess.run(
        [sys.executable, "-c", code, *args], capture_output=True, text=True, check=False, env=env
    )
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
        "print(json.dumps({'rows': ds['train'].num_rows, 'waits_for_datasets': 'datasets' in _HOOK.waiting}))"
    )
    out = _child(code, str(bundle), str(tmp_path / "cache"))
    assert out == {"rows": 21, "waits_for_datasets": False}


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


def test_registration_never_breaks_import_evaluate_and_names_the_fix() -> None:
    pytest.importorskip("evaluate")
    code = (
        "import json, sys, warnings\nimport chexpercept.registration as r\n"
        "def broken():\n    raise RuntimeError('incompatible evaluate')\n"
        "r.register_metric = broken\n"
        "with warnings.catch_warnings(record=True) as caught:\n"
        "    warnings.simplefilter('always')\n    import evaluate\n"
        "print(json.dumps([str(w.message) for w in caught if 'chexpercept' in str(w.message)]))"
    )
    (message,) = _child(code)
    assert "incompatible evaluate" in message and "chexpercept install-metric" in message


# ------------------------------------------------------------------ the start-up hook (.pth)
def _site_packages() -> Path:
    import chexpercept_dataset  # noqa: F401  (any module of ours: the venv's site-packages holds the hook)

    return Path(sysconfig.get_paths()["purelib"])


def test_a_fresh_interpreter_loads_the_dataset_and_the_metric_with_nothing_imported(tmp_path) -> None:
    """The mission's usage line as a new user types it: nothing imported first, an empty HF_HOME
    (so no `chexpercept install-metric` was ever run)."""
    pytest.importorskip("evaluate")
    bundle = write_fixture_bundle(tmp_path / "bundle", per_cell=1)
    env = {**os.environ, "HF_HOME": str(tmp_path / "hf")}
    env.pop("HF_MODULES_CACHE", None)
    code = (
        "import json, sys\n"
        "started = sorted(m for m in ('chexpercept', 'datasets', 'evaluate') if m in sys.modules)\n"
        "from datasets import load_dataset\n"
        "ds = load_dataset('chexpercept', data_dir=sys.argv[1])\n"
        "import evaluate\n"
        "metric = evaluate.load('chexpercept_metric')\n"
        "print(json.dumps({'started': started, 'rows': ds['train'].num_rows, 'metric': type(metric).__name__}))"
    )
    out = _child(code, str(bundle), env=env)
    assert out == {"started": [], "rows": 21, "metric": "ChexperceptMetric"}
    assert not (
        tmp_path / "hf" / "modules" / "evaluate_modules" / "metrics" / "evaluate-metric--chexpercept_metric"
    ).exists()


def test_the_hook_imports_nothing_at_start_up_and_can_be_turned_off() -> None:
    code = (
        "import json, sys\n"
        "print(json.dumps({'hooks': [type(f).__name__ for f in sys.meta_path if getattr(f, 'chexpercept_hook', 0)],"
        " 'loaded': sorted(m for m in sys.modules if m.startswith(('chexpercept', 'datasets', 'evaluate')))}))"
    )
    assert _child(code) == {"hooks": ["ChexperceptStartupHook"], "loaded": []}
    off = {**os.environ, "CHEXPERCEPT_NO_STARTUP_HOOK": "1"}
    assert _child(code, env=off) == {"hooks": [], "loaded": []}


def test_the_installed_hook_is_this_checkout_s_startup_py() -> None:
    """The .pth holds a copy of chexpercept/startup.py made at install time."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("chexpercept_setup", ROOT / "setup.py")
    assert spec is not None and spec.loader is not None
    setup_py = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(setup_py)  # not as __main__: defines pth_line, builds nothing
    expected = setup_py.pth_line((ROOT / "chexpercept" / "startup.py").read_text(encoding="utf-8"))
    installed = _site_packages() / "chexpercept-startup.pth"
    assert installed.is_file(), f"{installed} is missing: reinstall with pip install -e ."
    assert installed.read_text(encoding="utf-8") == expected, (
        "stale start-up hook: reinstall with pip install -e ."
    )


@pytest.mark.slow
def test_the_wheel_carries_the_hook(tmp_path) -> None:
    """A regular (non-editable) wheel puts the .pth at the top of site-packages (built from a copy of
    the sources, so that the build leaves nothing in the checkout)."""
    import shutil

    skip = shutil.ignore_patterns(
        ".git", ".venv*", ".cache", "build", "*.egg-info", "demo", "runs", "__pycache__"
    )
    source = tmp_path / "src"
    shutil.copytree(ROOT, source, ignore=skip)
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(tmp_path), str(source)],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    (wheel,) = tmp_path.glob("chexpercept-*.whl")
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        assert "chexpercept-startup.pth" in names
        line = z.read("chexpercept-startup.pth").decode()
    assert line.startswith("import os, sys; os.environ.get('CHEXPERCEPT_NO_STARTUP_HOOK') or exec(")
    assert "class ChexperceptStartupHook" in line and line.count("\n") == 1
