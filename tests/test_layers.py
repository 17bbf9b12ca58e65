"""The package layers stay honest: cli -> pipeline -> {passes, report} -> measure -> runtimes -> onnx -> core.

Every `import` of an optkit module (at the top of a file or inside a function) is parsed. A module may import
its own package, and any package of a lower layer; never a higher one. Sub-packages of passes (convert,
quantize, ...) may import each other only without a cycle.
"""
from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "optkit"

LAYERS = {
    "core": 0,
    "onnx": 1,
    "runtimes": 2,
    "measure": 3,
    "passes": 4,
    "report": 4,
    "pipeline": 5,
    "cli": 6,
}
ROOT_MODULES = {"__init__", "__main__"}  # the public shims may import anything


def _modules():
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        yield ".".join(p for p in parts if p != "__init__") if parts[-1] == "__init__" else ".".join(parts), path


def _imports(name: str, path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), str(path))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("optkit"))
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                module = ".".join([*base, node.module] if node.module else base)
            else:
                module = node.module or ""
            if module.startswith("optkit"):
                found.add(module)
                found.update(f"{module}.{a.name}" for a in node.names)  # `from optkit.passes import quantize`
    return found


def _package(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in LAYERS else None


GRAPH = {name: _imports(name, path) for name, path in _modules()}


def test_every_module_sits_in_a_layer():
    loose = [m for m in GRAPH if m != "optkit" and m.split(".")[1] not in LAYERS | dict.fromkeys(ROOT_MODULES)]
    assert loose == [], f"modules outside the layered packages: {loose}"


@pytest.mark.parametrize("module", sorted(m for m in GRAPH if _package(m)))
def test_no_upward_import(module):
    mine = _package(module)
    upward = sorted({i for i in GRAPH[module] if i in GRAPH and _package(i) and _package(i) != mine
                     and LAYERS[_package(i)] >= LAYERS[mine]})
    assert upward == [], f"{module} ({mine}, layer {LAYERS[mine]}) imports upward: {upward}"


def _unit(module: str) -> str | None:
    """The unit a cycle is checked between: a package, or a sub-package of passes."""
    parts = module.split(".")
    if len(parts) < 2 or parts[1] not in LAYERS:
        return None
    if parts[1] == "passes" and len(parts) > 2:
        return ".".join(parts[:3])
    return ".".join(parts[:2])


def test_no_cycle_between_packages():
    edges = defaultdict(set)
    for module, imports in GRAPH.items():
        src = _unit(module)
        for target in imports:
            dst = _unit(target)
            if src and dst and dst != src and dst != "optkit.passes" and target in GRAPH:
                edges[src].add(dst)
    seen, stack, cycles = set(), [], []

    def visit(node):
        if node in stack:
            cycles.append(stack[stack.index(node):] + [node])
            return
        if node in seen:
            return
        seen.add(node)
        stack.append(node)
        for nxt in sorted(edges[node]):
            visit(nxt)
        stack.pop()

    for node in sorted(edges):
        visit(node)
    assert cycles == [], f"import cycles between packages: {cycles}"
