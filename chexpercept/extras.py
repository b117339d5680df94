"""Which install brings a package: the one answer every command gives to ``No module named X``.

The core install (``pip install -e .``) loads, validates, generates phantom data, scores and runs API
models and baselines; the extras add the rest (pyproject.toml: ``[hf]`` torch and transformers,
``[vllm]``, ``[report]`` matplotlib and evaluate, ``[api]`` tiktoken, ``[sam3]``, ``[sam3-meta]``,
``[inspect]``). A command that reaches a package its install lacks ends with one line naming the
package and the extras that bring it (read from the checkout's pyproject.toml, else the installed
metadata, so it cannot drift from what the code needs), not a traceback: ``chexpercept.cli`` and ``chexpercept.entry_point.run_program``
call :func:`install_hint`. A module that no extra declares is a bug, and keeps its traceback.
tests/test_declared_dependencies.py holds the tables below to the code's imports.
"""

from __future__ import annotations

import functools
import importlib.metadata
import re

#: import name -> distribution, where they differ beyond case and ``-``/``_``
IMPORT_NAMES = {"PIL": "pillow", "skimage": "scikit-image", "yaml": "pyyaml"}
#: distribution -> the script of ours that installs it (its pins clash with ours: its own environment)
BY_SCRIPT = {"lmms-eval": "bash scripts/setup_lmms_eval.sh"}
#: extras that are not an install a user chooses for a feature
NOT_FEATURES = ("test",)
#: which extra a hint names first when several bring a package: the lightest that serves (evaluate:
#: ``[report]``, not ``[vllm]``; torch: ``[hf]``); an extra not listed comes after these
EXTRA_ORDER = ("report", "api", "hf", "inspect", "vllm", "sam3", "sam3-meta")


def normalized(name: str) -> str:
    """A distribution name as PEP 503 compares them (``Inspect_AI`` -> ``inspect-ai``)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def distribution_of(import_name: str) -> str:
    """The distribution (normalized) that a top-level import name comes from."""
    return normalized(IMPORT_NAMES.get(import_name, import_name))


#: extras that need an environment of their own (their pins clash with the others'), by their script
EXTRA_SCRIPTS = {"sam3-meta": "bash scripts/setup_sam3_meta.sh"}


@functools.cache
def _requirements() -> tuple[frozenset[str], dict[str, tuple[str, ...]]]:
    """(the core dependencies, distribution -> the extras that bring it in ``EXTRA_ORDER``), from the
    checkout's pyproject.toml when this package runs from one (an editable install whose metadata may
    predate a ``git pull``), else from the installed metadata; empty when neither is there."""
    from packaging.requirements import Requirement

    core: set[str] = set()
    found: dict[str, list[str]] = {}
    project = _checkout_project()
    if project is not None:
        core = {normalized(Requirement(r).name) for r in project.get("dependencies", [])}
        for extra, lines in (project.get("optional-dependencies") or {}).items():
            if extra not in NOT_FEATURES:
                for line in lines:
                    found.setdefault(normalized(Requirement(line).name), []).append(extra)
    else:
        try:
            metadata = importlib.metadata.metadata("chexpercept")
        except importlib.metadata.PackageNotFoundError:
            return frozenset(), {}
        extras = [e for e in metadata.get_all("Provides-Extra") or [] if e not in NOT_FEATURES]
        for line in metadata.get_all("Requires-Dist") or []:
            requirement = Requirement(line)
            if requirement.marker is None:
                core.add(normalized(requirement.name))
                continue
            for extra in extras:
                if requirement.marker.evaluate({"extra": extra}):
                    found.setdefault(normalized(requirement.name), []).append(extra)

    def rank(extra: str) -> tuple[int, str]:
        return (EXTRA_ORDER.index(extra) if extra in EXTRA_ORDER else len(EXTRA_ORDER), extra)

    return frozenset(core), {dist: tuple(sorted(set(names), key=rank)) for dist, names in found.items()}


def _checkout_project() -> dict | None:
    """pyproject.toml's [project] table when this package is imported from a checkout of its own."""
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "pyproject.toml"
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10: the installed metadata
        return None
    from .input_files import TEXT_FILE, read_input_text

    try:
        project = tomllib.loads(read_input_text(path, TEXT_FILE, what="pyproject.toml")).get("project") or {}
    except (OSError, ValueError):  # none there (an installed wheel), unreadable, not TOML
        return None
    return project if project.get("name") == "chexpercept" else None


def install_hint(error: ModuleNotFoundError) -> str | None:
    """One line for a module that is missing because this install lacks it: the package, and how to
    install it (an extra, a script, or a reinstall for a core dependency). None, keeping the
    traceback, when the name is not the package's own spelling (``import Torch``: a typo), when the
    package is there and only a part of it is missing (``torch._C``: a broken build), or when no
    install of ours brings it (a bug)."""
    import importlib.util

    top = (error.name or "").split(".")[0]
    if not top or (top not in IMPORT_NAMES and top != top.lower()):
        return None
    try:
        present = importlib.util.find_spec(top) is not None
    except (ImportError, ValueError):  # a parent that fails to import, a module without a spec
        present = True
    return None if present else needs(top)


def say_missing(command: str, error: ModuleNotFoundError) -> int:
    """``COMMAND: this needs PKG, ...`` on stderr and exit status 2, for every program (``chexpercept
    X`` and ``eval/run.py``); ``error`` raised again when no install of ours brings the module (a
    bug keeps its traceback)."""
    import sys

    hint = install_hint(error)
    if hint is None:
        raise error
    print(f"{command}: {hint}", file=sys.stderr)
    return 2


def install_command(import_name: str) -> str | None:
    """``pip install 'chexpercept[EXTRA]'`` for the lightest extra that brings a package, else None."""
    names = _requirements()[1].get(distribution_of(import_name))
    return f"pip install 'chexpercept[{names[0]}]'" if names else None


def needs(import_name: str) -> str | None:
    """``this needs PKG, which this install does not have: pip install 'chexpercept[EXTRA]' ...`` for a
    top-level import name (the extra, a script, or a reinstall for a core dependency), or None when
    no install of ours brings it."""
    if not import_name:
        return None
    dist = distribution_of(import_name)
    if dist in BY_SCRIPT:
        return f"this needs {dist}, which lives in an environment of its own: {BY_SCRIPT[dist]}"
    core, extras = _requirements()
    if dist in core:
        return (
            f"this needs {dist}, a dependency of every install of chexpercept, which is missing here: "
            "install the package again (in a clone: pip install -e ., adding the extras you use, e.g. "
            "'.[hf]'; pyproject.toml may have gained it since the last install)"
        )
    names = extras.get(dist)
    if not names:
        return None
    first = names[0]
    if first in EXTRA_SCRIPTS:
        return (
            f"this needs {dist}, which lives in an environment of its own: {EXTRA_SCRIPTS[first]} "
            f"(pip install 'chexpercept[{first}]' there)"
        )
    also = f" (also in {', '.join(f'[{e}]' for e in names[1:])})" if len(names) > 1 else ""
    return (
        f"this needs {dist}, which this install does not have: {install_command(import_name)} "
        f"(in a clone: pip install -e '.[{first}]'){also}"
    )
