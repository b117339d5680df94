"""builder/ has no import cycles (module- and function-level imports) and one meaning per name."""

import ast
from pathlib import Path as FsPath

BUILDER = FsPath(__file__).resolve().parents[1] / "builder"


def _modules() -> dict[str, FsPath]:
    out = {}
    for f in sorted(BUILDER.rglob("*.py")):
        parts = list(f.relative_to(BUILDER).with_suffix("").parts)
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = f
    return out


def _graph() -> dict[str, set[str]]:
    """Module -> the builder modules it imports, by name relative to builder/ ("" is the package)."""
    modules = _modules()
    graph: dict[str, set[str]] = {}
    for name, f in modules.items():
        package = name if f.name == "__init__.py" else name.rpartition(".")[0]
        deps: set[str] = set()
        for node in ast.walk(ast.parse(f.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.ImportFrom):
                continue
            if node.level:
                base = [p for p in package.split(".") if p]
                base = base[: len(base) - (node.level - 1)]
                target = ".".join([*base, *([node.module] if node.module else [])])
            elif (node.module or "").startswith("chexpercept.builder"):
                target = node.module.removeprefix("chexpercept.builder").lstrip(".")
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


def test_builder_has_no_import_cycles():
    graph = _graph()
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
