"""What our code imports is what pyproject.toml declares.

Class (found when a core install ran the openai backend: every request failed on ``import aiohttp``,
which only the inspect extra had brought in, through s3fs): a third-party import that no install
declares. Rules, each a test:

1. every third-party package imported anywhere in chexpercept/, eval/, builder/, metrics/ and
   chexpercept_dataset.py is declared in pyproject.toml (the core dependencies or an extra), or is a
   declared requirement of a package that is (``PROVIDED_BY``), or is installed by a script of ours
   (``BY_SCRIPT``; chexpercept/extras.py holds that table and the import names that differ);
2. each install imports only what it declares: the core (``pip install -e .``: a run with the openai
   or a baseline backend, scored) only core dependencies, and an extra (``[vllm]``, ``[hf]``,
   ``[report]``) the core's and its own (with what they require), on every path our import graph can
   take from the entries of ``INSTALLS``, except imports inside a ``try`` that goes on without them
   and the imports of features that need more (``FEATURE_IMPORTS``, each with its reason; an entry
   that no longer occurs fails too).
"""

from __future__ import annotations

import ast
import functools
import importlib.metadata
import sys
from pathlib import Path as FsPath

import tomllib
from packaging.requirements import Requirement
from test_import_graph import PACKAGES  # folder -> the name it is installed as

from chexpercept.extras import BY_SCRIPT, distribution_of, normalized

ROOT = FsPath(__file__).resolve().parents[1]
OURS = {"chexpercept", "chexpercept_dataset", "__future__"}

#: a declared distribution -> what it requires that we import too (checked against its metadata where
#: installed: vllm in its own environment, the rest here)
PROVIDED_BY = {
    "vllm": {"psutil", "torch", "transformers"},  # eval/backends/vllm/placement.py
    "inspect-ai": {"httpx", "anyio", "platformdirs"},  # eval/harnesses/inspect_ai/rules.py, hooks.py
    "transformers": {"safetensors", "tokenizers"},  # eval/tiny_model.py (make-tiny-model, hf extra)
    "datasets": {"pyyaml", "packaging"},  # a core dependency's own requirements (chexpercept/extras.py)
}
#: an install (the core, or the core with an extra) -> where it goes: the run program with the backends
#: it serves, scoring, reports
INSTALLS = {
    "": (
        "chexpercept.cli",
        "chexpercept.eval.run",
        "chexpercept.eval.backends.openai.backend",
        "chexpercept.eval.backends.baselines",
        "chexpercept.metrics.model_scores",
    ),
    "vllm": (
        "chexpercept.eval.run",
        "chexpercept.eval.backends.vllm.backend",
        "chexpercept.metrics.report.command",
    ),
    "hf": (
        "chexpercept.eval.run",
        "chexpercept.eval.backends.transformers.backend",
        "chexpercept.eval.cmd_make_tiny_model",
    ),
    "report": ("chexpercept.metrics.report.command", "chexpercept.metrics.cmd_score"),
}
#: (our module, distribution) -> why a core install does without it there
FEATURE_IMPORTS = {
    (
        "chexpercept.eval.runner.distributed",
        "accelerate",
    ): "only under `accelerate launch` with more than one process",
    (
        "chexpercept.eval.runner.distributed",
        "torch",
    ): "only under `accelerate launch` with more than one process (accelerate requires torch)",
    ("chexpercept.eval.estimate.local_tokens", "transformers"): "estimate for a local model (its processor)",
    ("chexpercept.registration", "evaluate"): "evaluate.load's registration, when evaluate is installed",
    (
        "chexpercept.eval.tiny_model",
        "torch",
    ): "make-tiny-model ([hf]; says so in one line: chexpercept.extras)",
    ("chexpercept.eval.tiny_model", "transformers"): "make-tiny-model ([hf])",
    ("chexpercept.eval.tiny_model", "safetensors"): "make-tiny-model ([hf], through transformers)",
    ("chexpercept.eval.tiny_model", "tokenizers"): "make-tiny-model ([hf], through transformers)",
    ("chexpercept.metrics.report.plots", "matplotlib"): "report's figures ([report]; --no-plots without)",
    ("chexpercept.builder.deformers.sam3", "torch"): "generate --deformer sam3 ([sam3]; its own message)",
    ("chexpercept.builder.deformers.sam3", "transformers"): "generate --deformer sam3 ([sam3])",
    ("chexpercept.builder.deformers.sam3_meta", "sam3"): "generate --sam3-impl meta (its own environment)",
    ("chexpercept.builder.deformers.sam3_meta", "torch"): "generate --sam3-impl meta (its own environment)",
}


def _declared() -> tuple[set[str], dict[str, set[str]]]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    core = {normalized(Requirement(r).name) for r in project["dependencies"]}
    extras = {
        k: {normalized(Requirement(r).name) for r in v} for k, v in project["optional-dependencies"].items()
    }
    return core, extras


@functools.cache
def _installed() -> dict[str, list[str]]:
    return importlib.metadata.packages_distributions()


@functools.cache
def _distribution(import_name: str) -> str:
    """What this environment says the import comes from, else chexpercept.extras' table (the engines'
    own packages are not installed here)."""
    found = _installed().get(import_name)
    return normalized(found[0]) if found else distribution_of(import_name)


def _modules() -> dict[str, FsPath]:
    out = {"chexpercept_dataset": ROOT / "chexpercept_dataset.py"}
    for folder, installed in PACKAGES.items():
        for f in sorted((ROOT / folder).rglob("*.py")):
            parts = list(f.relative_to(ROOT / folder).with_suffix("").parts)
            out[".".join([installed, *(parts[:-1] if parts[-1] == "__init__" else parts)])] = f
    return out


def _goes_on_without(handler: ast.ExceptHandler) -> bool:
    names = {ast.unparse(handler.type)} if handler.type is not None else {"BaseException"}
    if isinstance(handler.type, ast.Tuple):
        names = {ast.unparse(e) for e in handler.type.elts}
    catches = bool(names & {"ImportError", "ModuleNotFoundError", "Exception", "BaseException"})
    # a handler that raises again (a clearer error, SystemExit) does not go on without the package
    return catches and not any(isinstance(n, ast.Raise) for n in ast.walk(handler))


def _imports(module: str, path: FsPath) -> list[tuple[str, bool]]:
    """(absolute name imported, whether a ``try`` around it goes on without it) for every import of
    ``module``, at any depth (a function's imports run when it is called)."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    out: list[tuple[str, bool]] = []

    def visit(node: ast.AST, optional: bool) -> None:
        if isinstance(node, ast.Try):
            guarded = optional or any(_goes_on_without(h) for h in node.handlers)
            for child in node.body:
                visit(child, guarded)
            for child in [*node.handlers, *node.orelse, *node.finalbody]:
                visit(child, optional)
            return
        if isinstance(node, ast.If) and ast.unparse(node.test) in ("TYPE_CHECKING", "typing.TYPE_CHECKING"):
            for child in node.orelse:
                visit(child, optional)
            return
        if isinstance(node, ast.Import):
            out.extend((a.name, optional) for a in node.names)
        elif (  # importlib.import_module("name") and __import__("name") with a literal name
            isinstance(node, ast.Call)
            and ast.unparse(node.func) in ("importlib.import_module", "import_module", "__import__")
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
            and not node.args[0].value.startswith(".")
        ):
            out.append((node.args[0].value, optional))
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                target = ".".join([*base, *([node.module] if node.module else [])])
            else:
                target = node.module or ""
            out.append((target, optional))
            out.extend((f"{target}.{a.name}", optional) for a in node.names)
        for child in ast.iter_child_nodes(node):
            visit(child, optional)

    visit(ast.parse(path.read_text(encoding="utf-8")), False)
    return out


def _third_party(name: str) -> str | None:
    top = name.split(".")[0]
    if not top or top in sys.stdlib_module_names or top in OURS:
        return None
    return top


def test_every_imported_package_is_declared():
    core, extras = _declared()
    anywhere = core.union(*extras.values())
    missing = {}
    for module, path in _modules().items():
        for name, _ in _imports(module, path):
            top = _third_party(name)
            if top is None:
                continue
            dist = _distribution(top)
            if dist in anywhere or dist in BY_SCRIPT:
                continue
            if any(dist in provides and provider in anywhere for provider, provides in PROVIDED_BY.items()):
                continue
            missing.setdefault(dist, set()).add(module)
    assert not missing, f"imported but declared nowhere in pyproject.toml: {missing}"


def test_the_tables_name_what_is_true():
    core, extras = _declared()
    anywhere = core.union(*extras.values())
    for provider, provides in PROVIDED_BY.items():
        assert provider in anywhere, provider
        try:
            requires = importlib.metadata.requires(provider) or []
        except importlib.metadata.PackageNotFoundError:
            continue  # not in this environment (vllm: its own)
        assert provides <= {normalized(Requirement(r).name) for r in requires if "extra ==" not in r}, (
            provider
        )
    for dist, script in BY_SCRIPT.items():
        assert dist in (ROOT / script.removeprefix("bash ")).read_text(), (dist, script)


def _outside(entries: tuple[str, ...], allowed: set[str]) -> set[tuple[str, str]]:
    """(our module, distribution) of every import reachable from ``entries`` through our import graph
    (any depth) that is not in ``allowed`` and not inside a ``try`` that goes on without it."""
    modules = _modules()
    seen: set[str] = set()
    todo = list(entries)
    outside: set[tuple[str, str]] = set()
    while todo:
        module = todo.pop()
        if module in seen:
            continue
        seen.add(module)
        for name, optional in _imports(module, modules[module]):
            parts = name.split(".")
            todo.extend(m for m in (".".join(parts[:i]) for i in range(1, len(parts) + 1)) if m in modules)
            top = _third_party(name)
            if top is not None and not optional and _distribution(top) not in allowed:
                outside.add((module, _distribution(top)))
    assert all(entry in seen for entry in entries)
    return outside


def _entries(extra: str) -> tuple[str, ...]:
    """``INSTALLS[extra]``; for the core, also every command of ``chexpercept`` (each is loaded by
    its module's name from a table, which no import statement shows) and every name the packages
    export lazily (``chexpercept._EXPORTS``, ``chexpercept.metrics._EXPORTS``)."""
    if extra:
        return INSTALLS[extra]
    import chexpercept
    import chexpercept.metrics
    from chexpercept.cli import all_commands

    commands = [module for module, _ in all_commands().values()]
    exported = [f"chexpercept.{m}" for m in chexpercept._EXPORTS.values()]
    exported += [f"chexpercept.metrics.{m}" for m in chexpercept.metrics._EXPORTS.values()]
    return (*INSTALLS[""], *commands, *exported)


def test_each_install_imports_only_what_it_declares():
    """A core install runs the openai and baseline backends and scores; each extra adds its backend or
    command and nothing it does not bring."""
    core, extras = _declared()
    everywhere: set[tuple[str, str]] = set()
    for extra in INSTALLS:
        entries = _entries(extra)
        allowed = set(core)
        for name in [extra] if extra else []:
            allowed |= extras[name]
        allowed |= {d for provider, provides in PROVIDED_BY.items() if provider in allowed for d in provides}
        outside = _outside(entries, allowed)
        everywhere |= outside
        unexplained = sorted(outside - set(FEATURE_IMPORTS))
        assert not unexplained, (
            f"pip install -e .{f'[{extra}]' if extra else ''} reaches imports of packages it does not install: "
            f"{unexplained}; declare the package there, or import it where a try goes on without it, or name "
            "the feature in FEATURE_IMPORTS"
        )
    stale = sorted(set(FEATURE_IMPORTS) - everywhere)
    assert not stale, f"FEATURE_IMPORTS entries that no longer occur: {stale}"
    # the class's first member: the openai backend's HTTP client
    assert "aiohttp" in core and "pybase64" in core
