"""No import cycles in any package (module- and function-level imports; ``if TYPE_CHECKING:`` blocks
are left out, they never run) and one meaning per name in builder/."""

import ast
from pathlib import Path as FsPath

import pytest

ROOT = FsPath(__file__).resolve().parents[1]
BUILDER = ROOT / "builder"
#: folder -> the name it is installed as
PACKAGES = {
    "chexpercept": "chexpercept",
    "builder": "chexpercept.builder",
    "metrics": "chexpercept.metrics",
    "eval": "chexpercept.eval",
}


def _modules(folder: FsPath = BUILDER) -> dict[str, FsPath]:
    out = {}
    for f in sorted(folder.rglob("*.py")):
        parts = list(f.relative_to(folder).with_suffix("").parts)
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = f
    return out


def _imports(tree: ast.AST):
    """Every ImportFrom node that can run (not inside ``if TYPE_CHECKING:``)."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            yield from (n for child in node.orelse for n in _imports_in(child))
            continue
        yield from _imports_in(node)


def _imports_in(node: ast.AST):
    if isinstance(node, ast.ImportFrom):
        yield node
    yield from _imports(node)


def _graph(folder: FsPath = BUILDER, installed: str = "chexpercept.builder") -> dict[str, set[str]]:
    """Module -> the package's modules it imports, by name relative to the folder ("" is the package)."""
    modules = _modules(folder)
    graph: dict[str, set[str]] = {}
    for name, f in modules.items():
        package = name if f.name == "__init__.py" else name.rpartition(".")[0]
        deps: set[str] = set()
        for node in _imports(ast.parse(f.read_text(encoding="utf-8"))):
            if node.level:
                base = [p for p in package.split(".") if p]
                base = base[: len(base) - (node.level - 1)]
                target = ".".join([*base, *([node.module] if node.module else [])])
            elif node.module == installed or (node.module or "").startswith(installed + "."):
                target = node.module.removeprefix(installed).lstrip(".")
            else:
                continue
            deps.add(target)
            deps.update(f"{target}.{a.name}".lstrip(".") for a in node.names)
        for d in list(deps):  # importing a submodule runs its parent packages first
            parts = d.split(".")
            deps.update(".".join(parts[:i]) for i in range(1, len(parts)))
        graph[name] = {
            d for d in deps if d in modules and d not in {"", name} and not name.startswith(f"{d}.")
        }
    return graph


@pytest.mark.parametrize("folder", sorted(PACKAGES))
def test_no_import_cycles(folder):
    graph = _graph(ROOT / folder, PACKAGES[folder])
    assert len(graph) > 5
    if folder == "builder":
        assert "deformers" in graph and "deformers.sam3" in graph
    done: set[str] = set()

    def visit(module: str, trail: list[str]) -> None:
        if module in trail:
            raise AssertionError("import cycle: " + " -> ".join([*trail[trail.index(module) :], module]))
        if module in done:
            return
        for dep in sorted(graph[module]):
            visit(dep, [*trail, module])
        done.add(module)

    for module in sorted(graph):
        visit(module, [])


def test_builder_path_means_the_route():
    """In builder/, pathlib's Path is always imported as FsPath; a bare Path is chexpercept.vocab.Path."""
    for f in _modules().values():
        for node in ast.walk(ast.parse(f.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module == "pathlib":
                for alias in node.names:
                    assert alias.name != "Path" or alias.asname == "FsPath", f"{f.name}: {ast.unparse(node)}"


def test_every_folder_of_the_packages_is_listed_for_the_wheel():
    """A folder holding files but missing from pyproject's ``packages`` is left out of a wheel (or
    shipped with setuptools' "Package would be ignored" warning): every one must be listed."""
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+

    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["setuptools"]
    listed = set(config["packages"])
    found = set()
    for folder, installed in PACKAGES.items():
        for d in [ROOT / folder, *(p for p in (ROOT / folder).rglob("*") if p.is_dir())]:
            if (
                d.name == "__pycache__"
                or "__pycache__" in d.parts
                or not any(f.is_file() for f in d.iterdir())
            ):
                continue
            found.add(".".join([installed, *d.relative_to(ROOT / folder).parts]))
    assert found - listed == set(), "add these to [tool.setuptools] packages in pyproject.toml"
