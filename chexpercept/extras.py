"""Which install brings a package: the one answer every command gives to ``No module named X``.

The core install (``pip install -e .``) loads, validates, generates phantom data, scores and runs API
models and baselines; the extras add the rest (pyproject.toml: ``[hf]`` torch and transformers,
``[vllm]``, ``[report]`` matplotlib and evaluate, ``[api]`` tiktoken, ``[sam3]``, ``[sam3-meta]``,
``[inspect]``). A command that reaches a package its install lacks ends with one line naming the
package and the extras that bring it (read from this package's own metadata, so it cannot drift from
pyproject.toml), not a traceback: ``chexpercept.cli`` and ``chexpercept.entry_point.run_program``
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


@functools.cache
def _extras() -> dict[str, tuple[str, ...]]:
    """distribution -> the extras of this package that bring it, in ``EXTRA_ORDER``; empty when this
    package is not installed."""
    from packaging.requirements import Requirement

    try:
        metadata = importlib.metadata.metadata("chexpercept")
    except importlib.metadata.PackageNotFoundError:
        return {}
    extras = [e for e in metadata.get_all("Provides-Extra") or [] if e not in NOT_FEATURES]
    found: dict[str, list[str]] = {}
    for line in metadata.get_all("Requires-Dist") or []:
        requirement = Requirement(line)
        if requirement.marker is None:
            continue  # a core dependency
        for extra in extras:
            if requirement.marker.evaluate({"extra": extra}):
                found.setdefault(normalized(requirement.name), []).append(extra)

    def rank(extra: str) -> tuple[int, str]:
        return (EXTRA_ORDER.index(extra) if extra in EXTRA_ORDER else len(EXTRA_ORDER), extra)

    return {dist: tuple(sorted(names, key=rank)) for dist, names in found.items()}


def install_hint(error: ModuleNotFoundError) -> str | None:
    """One line for a module that is missing because this install lacks an extra: the package, and
    how to install it; None when no extra and no script of ours brings it, or when the package is
    there and only a part of it is missing (``torch._C``: a broken build, not a missing extra): keep
    the traceback."""
    import importlib.util

    top = (error.name or "").split(".")[0]
    try:
        present = bool(top) and importlib.util.find_spec(top) is not None
    except (ImportError, ValueError):  # a parent that fails to import, a module without a spec
        present = True
    return None if present else needs(top)


def needs(import_name: str) -> str | None:
    """``this needs PKG, which this install does not have: pip install 'chexpercept[EXTRA]' ...`` for a
    top-level import name, or None when no extra of ours and no script brings it."""
    if not import_name:
        return None
    dist = distribution_of(import_name)
    if dist in BY_SCRIPT:
        return f"this needs {dist}, which lives in an environment of its own: {BY_SCRIPT[dist]}"
    extras = _extras().get(dist)
    if not extras:
        return None
    also = f" (also in {', '.join(f'[{e}]' for e in extras[1:])})" if len(extras) > 1 else ""
    return (
        f"this needs {dist}, which this install does not have: pip install 'chexpercept[{extras[0]}]' "
        f"(in a clone: pip install -e '.[{extras[0]}]'){also}"
    )
