"""Each install runs what it promises, and a command that needs an extra says which, in one line.

A core install (``pip install -e .``) is simulated in a subprocess of this environment: every package
that only the extras bring is made unimportable first (``sys.modules[name] = None``: ``import`` raises
``ModuleNotFoundError`` and ``importlib.util.find_spec`` says "not installed", as in a real core
install; datasets' optional torch support sees no torch). A real core install (Python 3.11 and 3.12,
``pip install -e .``) was also run by hand for this class; see docs/install.md.

Rule (chexpercept/extras.py): a package this install lacks ends any command (``chexpercept X`` and
``eval/run.py``) with one line naming the package and the extra that brings it, read from this
package's metadata; a module no extra declares keeps its traceback (a bug).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from chexpercept.extras import install_hint, needs

sys.path.insert(0, str(Path(__file__).parent))
from fake_openai import FakeServer

ROOT = Path(__file__).resolve().parents[1]
#: what only the extras bring (pyproject.toml: hf, vllm, report, api, inspect, sam3, sam3-meta)
EXTRAS_ONLY = (
    "torch", "torchvision", "transformers", "accelerate", "evaluate", "matplotlib", "vllm", "tiktoken",
    "inspect_ai", "openai", "sam3", "triton",
)  # fmt: skip
PROGRAM = """
import runpy, sys
for name in {blocked!r}:
    sys.modules[name] = None
argv = sys.argv[1:]
if argv[0] == "eval/run.py":
    sys.argv = argv
    runpy.run_path({run!r}, run_name="__main__")
else:
    sys.argv = ["chexpercept", *argv]
    from chexpercept.cli import main
    sys.exit(main())
"""


def core(
    *argv: str, blocked: tuple[str, ...] = EXTRAS_ONLY, timeout: float = 300
) -> subprocess.CompletedProcess:
    """``chexpercept ARGV`` (or ``eval/run.py ARGV``) as a core install runs it."""
    code = PROGRAM.format(blocked=blocked, run=str(ROOT / "eval" / "run.py"))
    return subprocess.run(
        [sys.executable, "-c", code, *argv], capture_output=True, text=True, timeout=timeout, cwd=ROOT
    )


def one_line_naming(proc: subprocess.CompletedProcess, command: str, package: str, extra: str) -> None:
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-2000:])
    assert "Traceback" not in proc.stderr, proc.stderr[-2000:]
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert lines[-1].startswith(f"{command}: "), lines
    assert (
        f"this needs {package}, which this install does not have: pip install 'chexpercept[{extra}]'"
        in lines[-1]
    )


def test_the_hint_names_the_lightest_extra_and_none_for_what_no_extra_brings():
    assert "pip install 'chexpercept[hf]'" in needs("torch") and "also in [sam3], [sam3-meta]" in needs(
        "torch"
    )
    assert "pip install 'chexpercept[report]'" in needs("evaluate")
    assert "pip install 'chexpercept[report]'" in needs("matplotlib")
    assert "pip install 'chexpercept[vllm]'" in needs("vllm")
    assert "pip install 'chexpercept[api]'" in needs("tiktoken")
    assert "pip install 'chexpercept[inspect]'" in needs("inspect_ai")
    assert "scripts/setup_lmms_eval.sh" in needs("lmms_eval")
    # a core dependency missing: a broken or stale install (pyproject.toml gained it since): reinstall
    assert "a dependency of every install of chexpercept, which is missing here" in needs("numpy")
    assert "a dependency of every install" in needs("aiohttp")
    # packages of the extra that needs an environment of its own: its script
    assert "bash scripts/setup_sam3_meta.sh" in needs("sam3")
    # a name in another spelling than the package's is a typo, not a missing extra
    assert install_hint(ModuleNotFoundError("x", name="Torch")) is None
    assert needs("no_such_module") is None and needs("") is None
    # an error names the hint only when the package is really absent: a part missing from an installed
    # package (a broken build) keeps its traceback
    assert install_hint(ModuleNotFoundError("x", name="torch._C")) is None  # torch is installed here
    assert install_hint(ModuleNotFoundError("x", name="evaluate")) is None
    if not _installed("sam3"):  # Meta's sam3 lives in .venv-sam3 only
        assert "chexpercept[sam3-meta]" in install_hint(ModuleNotFoundError("x", name="sam3.model_builder"))


def _installed(name: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(name) is not None


def test_a_core_install_runs_an_api_model_and_a_baseline_and_scores(fixture_bundle, tmp_path):
    """The first member of the class: the openai backend's HTTP client (aiohttp) came only with the
    inspect extra; a core install failed on the first request."""
    with FakeServer() as server:
        proc = core(
            "eval/run.py", "--data-dir", str(fixture_bundle), "--model", "gpt-5.4", "--base-url", server.url,
            "--output-dir", str(tmp_path), "--no-progress", "--limit", "3", "--oracle", "implicit",
        )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert server.requests and "Table 2" in proc.stdout
    info = json.loads((tmp_path / "gpt-5.4" / "oracle_implicit" / "run.json").read_text())
    assert info["finished"] and info["n_results"] == 3
    proc = core(
        "run", "--data-dir", str(fixture_bundle), "--model", "baseline:random", "--output-dir", str(tmp_path)
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    proc = core("score", str(tmp_path / "baseline-random"))
    assert proc.returncode == 0 and "e2e/stage1/RR" in proc.stdout, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr and "Warning" not in proc.stderr, proc.stderr[-3000:]


def test_a_command_that_needs_an_extra_says_which_in_one_line(tmp_path):
    """Members found by a new user with a core install: make-tiny-model ended in a traceback (torch);
    install-metric said evaluate.load now works (evaluate missing); estimate for a local model named
    transformers but not the extra."""
    proc = core("make-tiny-model", "--output-dir", str(tmp_path / "tiny"))
    one_line_naming(proc, "chexpercept make-tiny-model", "torch", "hf")
    assert not (tmp_path / "tiny").exists() or not any((tmp_path / "tiny").iterdir())
    proc = core("install-metric", "--modules-cache", str(tmp_path / "modules"))
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "now works" not in proc.stdout and "pip install 'chexpercept[report]'" in proc.stdout, proc.stdout


def test_a_missing_core_dependency_says_reinstall_and_an_unknown_module_keeps_its_traceback(tmp_path):
    """A core package missing is a broken or stale install: one line saying to install again. A module
    that no install of ours brings is a bug: the traceback stays, nothing is disguised."""
    proc = core("synth", "--output-dir", str(tmp_path / "bundle"), "--per-cell", "1", blocked=("numpy",))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert (
        proc.stderr.strip().splitlines()[-1].startswith("chexpercept synth: this needs numpy, a dependency")
    )
    from chexpercept.extras import say_missing

    with pytest.raises(ModuleNotFoundError):
        say_missing(
            "chexpercept synth",
            ModuleNotFoundError("No module named 'no_such_module'", name="no_such_module"),
        )
    with pytest.raises(ModuleNotFoundError):
        say_missing("chexpercept synth", ModuleNotFoundError("No module named 'Torch'", name="Torch"))


@pytest.mark.parametrize("blocked", [("transformers",), EXTRAS_ONLY])
def test_estimate_for_a_local_model_names_the_extra(fixture_bundle, tiny_model, blocked):
    argv = ("estimate", "--data-dir", str(fixture_bundle), "--model", str(tiny_model), "--backend", "vllm")
    proc = core(*argv, blocked=blocked)
    assert proc.returncode != 0 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert "pip install 'chexpercept[hf]'" in proc.stderr, proc.stderr[-2000:]


def test_estimate_says_how_to_count_exactly_and_asks_for_transformers_before_the_hub(fixture_bundle):
    """Red team: an API model's estimate without tiktoken was approximate without saying how to count
    exactly; a Hub model's estimate on a core install asked to download its processor first, and
    only then said transformers was missing."""
    proc = core(
        "estimate",
        "--data-dir",
        str(fixture_bundle),
        "--model",
        "gpt-5.4",
        "--per-cell",
        "1",
        blocked=(*EXTRAS_ONLY, "tiktoken"),
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert (
        "approx. 4 characters per token; exact counts with tiktoken: pip install 'chexpercept[api]'"
        in proc.stdout
    )
    proc = core("estimate", "--data-dir", str(fixture_bundle), "--model", "medgemma-1.5-4b")
    assert proc.returncode == 2 and "download-model" not in proc.stderr, proc.stderr[-2000:]
    assert "pip install 'chexpercept[hf]'" in proc.stderr, proc.stderr[-2000:]


def test_synth_refuses_an_unknown_lesion_before_drawing_anything(tmp_path):
    """Red team: `synth --lesions nodule` drew 35 phantom source files before naming the lesion."""
    from chexpercept.cli import main

    assert (
        main(["synth", "--output-dir", str(tmp_path / "out"), "--per-cell", "1", "--lesions", "nodule"]) == 2
    )
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").rglob("*"))
