"""The layers of DESIGN.md, enforced: entry points -> core -> transports -> semantics, read from the source.

Every ``import`` in funcoll/ (module-level and inside functions) is checked: a module imports only modules of its own
layer or of the layers below it, and never a tool (the CLI, the demo, the test helpers, the benchmarks). Module-level
imports between funcoll's modules have no cycle.
"""

import ast
import functools
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1] / "funcoll"

FOLDERS = ["semantics", "transport", "algorithms", "entry"]  # funcoll/<folder>/: one folder per layer, lowest first
NAMES = ["semantics", "transports", "core (algorithms)", "entry points"]
# public modules and tools, beside the layer folders: they may import any layer, no layer imports them
TOOLS = {"funcoll", "funcoll.__main__", "funcoll.testing", "funcoll.report", "funcoll.demo",
         "funcoll.replicas", "funcoll._replica_worker",
         "funcoll.launch", "funcoll.xla"}


def layer_of(module: str):
    parts = module.split(".")
    return FOLDERS.index(parts[1]) if len(parts) > 1 and parts[1] in FOLDERS else None


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
            # "from p import m" imports the module p.m when there is one, else a name of the module p
            known = all_modules()
            names = [f"{mod}.{a.name}" if f"{mod}.{a.name}" in known else mod for a in node.names]
        else:
            continue
        for name in names:
            while name and name not in LAYERS and name not in TOOLS:
                name = name.rpartition(".")[0]
            if name and name.startswith("funcoll") and name != me:
                yield name, node.lineno, id(node) in top


@functools.lru_cache(maxsize=None)
def all_modules():
    return {module_name(p): p for p in ROOT.rglob("*.py")}


LAYERS = {m: layer_of(m) for m in all_modules() if layer_of(m) is not None}  # module -> layer (higher imports lower)


def test_every_module_has_a_place():
    """Every module is in one layer's folder, or is one of the known public modules and tools at the top."""
    assert set(all_modules()) - set(LAYERS) == TOOLS
    assert {layer_of(m) for m in LAYERS} == set(range(len(FOLDERS)))
    assert sorted(p.name for p in ROOT.iterdir() if p.is_dir() and p.name != "__pycache__") == sorted(FOLDERS)


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
