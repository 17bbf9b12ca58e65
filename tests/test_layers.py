"""The package layers stay honest: cli -> pipeline -> package -> capacity -> split -> {passes, report} -> measure ->
runtimes -> onnx -> contracts -> core.

Every `import` of an optkit module (at the top of a file or inside a function) is parsed, and so are the
strings that import one by name: arguments of `import_module` / `__import__` / `find_spec`, "module:Name"
references (a registry's "optkit.runtimes.onnx:OnnxSession") and lists of module names (what a loader walks). A module imported by name is an import too. A module may import its own package, and any package of a lower
layer; never a higher one. Sub-packages of passes (convert,
quantize, ...) may import each other only without a cycle.
"""
from __future__ import annotations

import ast
import re
from collections import defaultdict
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "optkit"

LAYERS = {
    "core": 0,
    "contracts": 0.5,  # the files one command writes for another: one typed model each (best.json, CAPACITY.json...)
    "onnx": 1,
    "runtimes": 2,
    "measure": 3,
    "passes": 4,
    "report": 4,
    "split": 4.2,     # CPU/GPU parts of a model; reads trt check's table (passes), the package writes its parts
    "capacity": 4.3,  # replicas and autoscaling from measured figures (read through contracts) and a traffic history
    "package": 4.5,   # a server's repository from a model, its report and its tuned settings; recipes run it
    "pipeline": 5,
    "cli": 6,
}
ROOT_MODULES = {"__init__", "__main__"}  # the public shims may import anything


def _modules():
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        yield ".".join(p for p in parts if p != "__init__") if parts[-1] == "__init__" else ".".join(parts), path


MODULE_STRING = re.compile(r"^optkit(\.\w+)+(:\w+)?$")
IMPORTERS = {"import_module", "__import__", "find_spec"}


def _imports(name: str, path: Path) -> set[str]:
    return _imports_of(ast.parse(path.read_text(), str(path)), name, path.name == "__init__.py")


def _imports_of(tree: ast.AST, name: str, is_package: bool) -> set[str]:
    package = name if is_package else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", None)) in IMPORTERS:
            found.update(a.value for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str)
                         and MODULE_STRING.match(a.value))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and ":" in node.value \
                and MODULE_STRING.match(node.value):
            found.add(node.value.partition(":")[0])
        elif isinstance(node, (ast.Tuple, ast.List)) and node.elts and all(
                isinstance(e, ast.Constant) and isinstance(e.value, str) and MODULE_STRING.match(e.value)
                for e in node.elts):
            found.update(e.value for e in node.elts)
        elif isinstance(node, ast.Import):
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


def test_a_module_imported_by_name_is_an_import():
    """The check reads import_module strings: core naming a pass module by string is an upward import."""
    tree = ast.parse('import importlib\n'
                     'def load():\n    importlib.import_module("optkit.passes.quantize")\n'
                     'RUNTIMES = {"onnx": "optkit.runtimes.onnx:OnnxSession"}\n'
                     'BUILTIN = ("optkit.passes.simplify", "optkit.passes.tune")\n'
                     'def load_all():\n    for m in BUILTIN:\n        importlib.import_module(m)\n'
                     'SUITE = "optkit.pipeline.gates"  # a name, not an import\n')
    found = _imports_of(tree, "optkit.core.example", False)
    upward = sorted(i for i in found if i in GRAPH and LAYERS[_package(i)] > LAYERS["core"])
    assert upward == ["optkit.passes.quantize", "optkit.passes.simplify", "optkit.passes.tune",
                      "optkit.runtimes.onnx"]


# Modules below cli/ import optkit's own modules at the top (frameworks stay lazy, inside functions). A file
# that must import one inside a function (a cycle no layer move breaks) is named here with why.
LOCAL_IMPORTS_ALLOWED: set[str] = set()


def _local_imports(tree: ast.AST) -> list[tuple[int, str]]:
    found = []
    for fn in ast.walk(tree):
        if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for node in ast.walk(fn):
            if isinstance(node, ast.ImportFrom) and (node.level or (node.module or "").startswith("optkit")):
                found.append((node.lineno, f"from {'.' * node.level}{node.module or ''} import ..."))
            elif isinstance(node, ast.Import) and any(a.name.split(".")[0] == "optkit" for a in node.names):
                found.append((node.lineno, "import " + ", ".join(a.name for a in node.names)))
    return sorted(set(found))


def test_optkit_imports_sit_at_the_top():
    """Below cli/, a module's optkit imports are at its top, where a reader (and the layer check) sees them."""
    local = {}
    for _, path in _modules():
        rel = path.relative_to(PACKAGE.parent).as_posix()
        if rel.startswith("optkit/cli/") or rel in ("optkit/__init__.py", "optkit/__main__.py") \
                or rel in LOCAL_IMPORTS_ALLOWED:
            continue
        found = _local_imports(ast.parse(path.read_text(), rel))
        if found:
            local[rel] = found
    assert local == {}, f"optkit imports inside functions (move them to the module's top): {local}"


def test_the_allow_list_names_files_that_still_need_it():
    stale = sorted(rel for rel in LOCAL_IMPORTS_ALLOWED
                   if not (PACKAGE.parent / rel).is_file() or not _local_imports(ast.parse((PACKAGE.parent / rel)
                                                                                          .read_text())))
    assert stale == [], f"files in LOCAL_IMPORTS_ALLOWED with no local optkit import left: {stale}"
