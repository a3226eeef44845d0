"""The layers of DESIGN.md, enforced: entry points -> core -> transports -> semantics, read from the source.

Every ``import`` in funcoll/ (module-level and inside functions) is checked: a module imports only modules of its own
layer or of the layers below it, and never a tool (the CLI, the demo, the test helpers, the benchmarks). Module-level
imports between funcoll's modules have no cycle.
"""

import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1] / "funcoll"

LAYERS = {  # module -> layer (higher imports lower)
    "funcoll.semantics": 0, "funcoll.groups": 0,
    "funcoll.transport": 1, "funcoll.lowering": 1, "funcoll.lowering.gloo": 1, "funcoll.lowering.xla": 1,
    "funcoll.lowering.xpu": 1,
    "funcoll.planner": 2, "funcoll.algorithms": 2, "funcoll.observe": 2,
    "funcoll.process_group": 3, "funcoll.kernels": 3, "funcoll.work": 3, "funcoll.debug": 3,
    "funcoll.flight_recorder": 3, "funcoll.probe": 3, "funcoll.group_hooks": 3,
}
TOOLS = {"funcoll", "funcoll.__main__", "funcoll.testing", "funcoll.report", "funcoll.demo", "funcoll.demo_xla",
         "funcoll.launch"}
NAMES = ["semantics", "transports", "core", "entry points"]


def module_name(path: pathlib.Path) -> str:
    rel = path.relative_to(ROOT.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports(path: pathlib.Path):
    """(imported funcoll module, line, at module level) for every import of a funcoll module in ``path``."""
    me = module_name(path)
    package = me if path.name == "__init__.py" else me.rsplit(".", 1)[0]
    tree = ast.parse(path.read_text())
    top = {id(n) for n in tree.body}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - node.level + 1]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            # "from .x import y": module x (y may be a name in it); "from . import x": module x, not the package
            names = ([mod] if node.module else []) + [f"{mod}.{a.name}" for a in node.names]
        else:
            continue
        for name in names:
            while name and name not in LAYERS and name not in TOOLS:
                name = name.rpartition(".")[0]
            if name and name.startswith("funcoll") and name != me:
                yield name, node.lineno, id(node) in top


def all_modules():
    return {module_name(p): p for p in ROOT.rglob("*.py")}


def test_every_module_has_a_place():
    assert set(all_modules()) == set(LAYERS) | TOOLS, set(all_modules()) ^ (set(LAYERS) | TOOLS)


@pytest.mark.parametrize("module", sorted(LAYERS))
def test_imports_go_down_the_layers(module):
    path = all_modules()[module]
    bad = []
    for name, line, _ in imports(path):
        if name in TOOLS:
            bad.append(f"{module}:{line} imports the tool {name}")
        elif LAYERS[name] > LAYERS[module]:
            bad.append(f"{module}:{line} ({NAMES[LAYERS[module]]}) imports {name} ({NAMES[LAYERS[name]]})")
    assert bad == []


def test_no_import_cycles_at_module_level():
    graph = {m: {n for n, _, top in imports(p) if top and n in LAYERS} for m, p in all_modules().items()
             if m in LAYERS}
    seen, stack, cycles = set(), [], []

    def visit(m):
        if m in stack:
            cycles.append(stack[stack.index(m):] + [m])
            return
        if m in seen:
            return
        seen.add(m)
        stack.append(m)
        for n in sorted(graph.get(m, ())):
            visit(n)
        stack.pop()

    for m in sorted(graph):
        visit(m)
    assert cycles == []
