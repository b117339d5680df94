"""The backends table (chexpercept.eval.backends): every backend listed, imported only when asked
for, and each one's options in ``chexpercept run --help``."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import io
import subprocess
import sys
from pathlib import Path

import pytest

from chexpercept.cli import main as cli
from chexpercept.eval import backends
from chexpercept.eval.backends import BACKENDS, backend_class

HEAVY = ("torch", "vllm", "transformers", "httpx", "accelerate")


def test_the_table_lists_every_backend_module_or_folder():
    assert tuple(BACKENDS) == ("vllm", "transformers", "openai", "baseline")
    folder = Path(backends.__file__).parent
    shared = ("__init__", "options", "replies", "occupancy", "prefetch")  # helpers every backend may use
    here = {p.stem for p in folder.iterdir() if p.suffix == ".py" and p.stem not in shared}
    here |= {p.name for p in folder.iterdir() if (p / "__init__.py").exists()}
    listed = {target.split(":")[0].split(".")[3] for target in BACKENDS.values()}
    assert here == listed
    for name in BACKENDS:
        cls = backend_class(name)
        assert cls.name == name
        assert callable(cls.add_options) and callable(cls.from_plan)
        assert dataclasses.is_dataclass(cls.Options)
    with pytest.raises(ValueError, match="unknown backend"):
        backend_class("nope")


def test_the_table_and_runs_options_import_no_heavy_library():
    code = (
        "import argparse, sys\n"
        "import chexpercept.eval.backends\n"
        f"assert not [m for m in {HEAVY!r} if m in sys.modules], 'package'\n"
        "from chexpercept.eval.run import configure\n"
        "configure(argparse.ArgumentParser())\n"
        f"print(sorted(m for m in {HEAVY!r} if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip().splitlines()[-1] == "[]"


def test_each_backends_options_are_in_run_help():
    help_text = io.StringIO()
    with contextlib.redirect_stdout(help_text), pytest.raises(SystemExit):
        cli(["run", "--help"])
    text = help_text.getvalue()
    for name in BACKENDS:
        parser = argparse.ArgumentParser()
        backend_class(name).add_options(parser.add_argument_group(f"{name} backend"))
        options = [s for a in parser._actions for s in a.option_strings if s not in ("-h", "--help")]
        if options:
            assert f"{name} backend:" in text, name
        for option in options:
            assert option in text, (name, option)
