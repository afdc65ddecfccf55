"""The package's import graph, function-local imports included (read from the source): no module-level import
cycle, and the subpackages in layers, each importing only from layers below it."""

import ast
from collections import defaultdict
from pathlib import Path

import liger_registry

ROOT = Path(liger_registry.__file__).parent

# lowest first; a subpackage (or top-level module) may import only from earlier layers and from itself
LAYERS = (
    ("constants", "attr_path"),
    ("limits",),
    ("kernels", "schemas"),
    ("forwards", "modules"),
    ("registry",),
    ("testing", "console", "environment", "usage", "integrations", "alignment", "compat"),
    ("distill",),
    ("lint",),
    ("scaffold",),
    ("demo",),
    ("cli",),
)


def _name(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph() -> dict[str, set[str]]:
    paths = {_name(p): p for p in ROOT.rglob("*.py")}
    graph: dict[str, set[str]] = {m: set() for m in paths}
    for mod, path in paths.items():
        package = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*anchor, base] if base else anchor)
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in paths else base for a in node.names]
            else:
                continue
            for target in targets:
                while target and target not in paths:
                    target = target.rpartition(".")[0]
                if target and target != mod:
                    graph[mod].add(target)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def _part(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def test_no_import_cycle():
    assert cycles(import_graph()) == []


def test_cycle_finder_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_subpackages_import_only_from_layers_below():
    layer_of = {name: i for i, names in enumerate(LAYERS) for name in names}
    graph = import_graph()
    unplaced = sorted({_part(m) for m in graph if _part(m) and _part(m) not in layer_of})
    assert not unplaced, f"place these in LAYERS: {unplaced}"
    upward = defaultdict(set)
    for mod, targets in graph.items():
        for target in targets:
            here, there = _part(mod), _part(target)
            if here and there and here != there and layer_of[there] >= layer_of[here]:
                upward[f"{here} -> {there}"].add(f"{mod} imports {target}")
    assert not upward, dict(upward)
