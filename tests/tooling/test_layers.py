"""The layers of docs/design.md, enforced: read from the source, every ``import`` of a funcoll module, at module level
and inside functions.

:data:`ALLOWED` is the one table of who may import whom: a *unit* is a layer folder (every module in it) or, in the
transport and entry layers, one file (``funcoll.transport`` itself is the device-free interface, all the algorithms
may use). A unit imports exactly the units its row names (a row may name only rows above it, so the table itself is an
order with no cycle), and never a tool: the modules beside the layer folders (the package itself, the CLI, the probe,
the test and demo helpers), which may import any layer. Across every funcoll module there is no import cycle,
counting imports inside functions. docs/design.md shows the table as :func:`render` writes it.

The one call from a lower layer up into a higher one is not an import: the entry's pipeline hands the transport a
callback (``funcoll.transport.before_send``) that the transport runs before its first primitive sends.
"""

import ast
import functools
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2] / "funcoll"

FOLDERS = ["semantics", "transport", "algorithms", "entry"]  # funcoll/<folder>/: one folder per layer, lowest first

# unit -> the units it imports (lowest first; a row names only rows above it)
ALLOWED = {
    "semantics": (),
    "transport": ("semantics",),
    "transport/facts": ("transport",),
    "transport/c10d": ("semantics", "transport"),
    "transport/gloo": ("semantics", "transport", "transport/c10d"),
    "transport/registry": ("semantics", "transport", "transport/gloo"),
    "transport/xla": ("semantics", "transport", "transport/registry"),
    "transport/xpu": ("semantics", "transport", "transport/facts", "transport/c10d", "transport/registry"),
    "transport/tpu": ("semantics", "transport", "transport/facts", "transport/c10d", "transport/registry"),
    "algorithms": ("semantics", "transport"),
    "entry/errors": (),
    "entry/peers": (),
    "entry/fingerprint": ("semantics",),
    "entry/flight_recorder": ("semantics", "algorithms", "entry/fingerprint"),
    "entry/group_state": ("entry/peers", "entry/flight_recorder"),
    "entry/checks": ("transport", "entry/errors", "entry/flight_recorder", "entry/fingerprint", "entry/group_state"),
    "entry/work": ("transport", "transport/c10d", "algorithms", "entry/errors", "entry/peers", "entry/flight_recorder"),
    "entry/fast_path": ("transport", "algorithms", "entry/errors", "entry/peers", "entry/fingerprint", "entry/work"),
    "entry/methods": ("algorithms", "entry/fingerprint", "entry/fast_path"),
    "entry/pipeline": ("semantics", "transport", "algorithms", "entry/errors", "entry/flight_recorder",
                       "entry/fingerprint", "entry/checks", "entry/work", "entry/fast_path", "entry/methods"),
    "entry/process_group": ("semantics", "transport", "transport/c10d", "transport/registry", "algorithms",
                            "entry/errors", "entry/flight_recorder", "entry/group_state", "entry/checks",
                            "entry/methods", "entry/pipeline", "entry/work"),
    "entry/c10d_patches": ("semantics", "entry/process_group"),
    "entry/kernels": ("semantics", "transport", "transport/registry", "algorithms", "entry/work"),
}
JOBS = {
    "semantics": "the op catalogue, reduce ops, dtype and shape rules, group names (pure)",
    "transport": "the interface: Transport, its primitives and Handles, Capabilities, the gloo and XLA profiles",
    "transport/facts": "the fact machinery of the XCCL and TorchTPU tables",
    "transport/c10d": "a c10d backend's primitives (gloo, XCCL, TorchTPU), Works given c10d's whole contract",
    "transport/gloo": "the CPU reference: gloo's capabilities, the xccl profile's point-to-point",
    "transport/registry": "transports per device type; a group's transport for a tensor's device",
    "transport/xla": "torch_xla's lazy collectives with replica groups",
    "transport/xpu": "XCCL and its fact table",
    "transport/tpu": "TorchTPU and its fact table",
    "algorithms": "one function per collective over a transport's primitives; every gap-filling strategy, once",
    "entry/errors": "the errors a collective raises; reading a backend's message",
    "entry/peers": "which peers of a group have exited, read when one of its collectives fails",
    "entry/fingerprint": "one row per op, each c10d method's description: fingerprint, its text, compare, digest",
    "entry/flight_recorder": "per-group traces of calls, their text and dumps",
    "entry/group_state": ("one group's state (trace, switches, the fast path's answers, its abort switch), built once "
                          "per group"),
    "entry/checks": ("the debug mode's store check and point-to-point size check, the size guard, before the first "
                     "byte is sent"),
    "entry/work": "FuncollWork and NativeWork: wait, futures, errors naming the call",
    "entry/fast_path": "the eager fast path: per c10d method, its request as one native backend call, issued",
    "entry/methods": ("one row per c10d method: its op, description, sent argument, fast path and fast-path Work's "
                      "outputs"),
    "entry/pipeline": "each eager call's pipeline, in order, as a decorator: the fast path, then the full path's steps",
    "entry/process_group": "ProcessGroupFuncoll: the c10d surface, its transports, monitored_barrier",
    "entry/c10d_patches": "backend registration, the broadcast rewrite, the monitored_barrier patch",
    "entry/kernels": "the _c10d_functional kernels per dispatch key",
}


def render() -> str:
    """The table as docs/design.md shows it."""
    rows = ["| unit (funcoll/...) | its job | imports (besides torch) |", "|---|---|---|"]
    for unit, imports in ALLOWED.items():
        rows.append(f"| `{unit}` | {JOBS[unit]} | {', '.join(f'`{u}`' for u in imports) or '-'} |")
    return "\n".join(rows)


def module_name(path: pathlib.Path) -> str:
    rel = path.relative_to(ROOT.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


@functools.lru_cache(maxsize=None)
def all_modules():
    return {module_name(p): p for p in ROOT.rglob("*.py")}


def unit_of(module: str):
    """The unit of a layer module (``algorithms``, ``transport``, ``transport/gloo``, ``entry/work``), None for a
    tool."""
    parts = module.split(".")
    if len(parts) < 2 or parts[1] not in FOLDERS:
        return None
    return f"{parts[1]}/{parts[2]}" if parts[1] in ("transport", "entry") and len(parts) > 2 else parts[1]


def imports(path: pathlib.Path):
    """(imported funcoll module, line, at module level) for every import of a funcoll module in ``path``."""
    me = module_name(path)
    package = me if path.name == "__init__.py" else me.rsplit(".", 1)[0]
    tree = ast.parse(path.read_text())
    top = {id(n) for n in tree.body}
    known = all_modules()
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
            names = [f"{mod}.{a.name}" if f"{mod}.{a.name}" in known else mod for a in node.names]
        else:
            continue
        for name in names:
            while name and name not in known:
                name = name.rpartition(".")[0]
            if name and name != me:
                yield name, node.lineno, id(node) in top


def test_every_module_has_a_place():
    """Every module is a tool beside the layer folders or belongs to one row of the table; every row has modules."""
    units = {unit_of(m) for m in all_modules()} - {None}
    assert units == set(ALLOWED)
    assert sorted(p.name for p in ROOT.iterdir() if p.is_dir() and p.name != "__pycache__") == sorted(FOLDERS)
    tools = [m for m in all_modules() if unit_of(m) is None]
    assert all(m.count(".") <= 1 for m in tools), tools


def test_the_table_is_an_order():
    """A row names only rows above it: the units form no cycle, whatever the modules do."""
    seen: set = set()
    for unit, imports in ALLOWED.items():
        assert set(imports) <= seen, (unit, set(imports) - seen)
        seen.add(unit)
    assert set(JOBS) == set(ALLOWED)


@pytest.mark.parametrize("unit", list(ALLOWED))
def test_each_unit_imports_what_its_row_says(unit):
    """Module level and inside functions: a unit imports exactly the units of its row (no upward import, no tool),
    and the row names nothing it does not import (the table stays true)."""
    bad, used = [], set()
    for module, path in all_modules().items():
        if unit_of(module) != unit:
            continue
        for name, line, _ in imports(path):
            other = unit_of(name)
            if other is None:
                bad.append(f"{module}:{line} imports the tool {name}")
            elif other != unit:
                used.add(other)
                if other not in ALLOWED[unit]:
                    bad.append(f"{module}:{line} imports {name} ({other}), not in its row")
    assert bad == []
    assert used == set(ALLOWED[unit])


def test_no_import_cycles():
    """No cycle among funcoll's modules (layers and tools), counting imports made inside functions."""
    graph = {m: {n for n, _, _ in imports(p)} for m, p in all_modules().items()}
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


def test_the_design_doc_shows_the_table():
    text = (ROOT.parent / "docs" / "design.md").read_text()
    assert render() in text, "docs/design.md: paste tests.tooling.test_layers.render() in place of its import table"


def _file_unit(path: str):
    """The unit of a file under funcoll/ (``entry/pipeline.py`` -> ``entry/pipeline``), None for a tool."""
    return unit_of("funcoll." + path[:-len(".py")].replace("/", ".").removesuffix(".__init__"))


EAGER_HOPS, XLA_HOPS = 50, 44  # the most funcoll calls an eager AVG all_reduce and a compiled XLA one may make


def test_an_eager_call_goes_down_and_up_once():
    """At run time too, calls follow the table: every funcoll function an eager ``dist.all_reduce(t, op=AVG)`` under
    FUNCOLL_PROFILE=xccl calls (2 CPU ranks, size guard off and on; ``bench.hops`` counts docs/design.md's hops the
    same way) is in its caller's unit or in a unit the caller's row names, but two, each running a function it was
    handed: the pipeline's decorator running the method it wraps (``ProcessGroupFuncoll.allreduce``, as c10d's logger
    decorators run theirs), and the one upward call, the transport running the pipeline's ``before_send`` callback
    (``pipeline.start``). Inside the transport layer a transport's methods call each other across the files that
    define them (the interface's primitive runs its subclass's ``_`` method)."""
    from funcoll.launch import run_world

    # (as users run it: without the suite's primitive counter, FUNCOLL_COUNT_CALLS)
    res = run_world("bench.hops:eager", 2, profile="xccl", env={"FUNCOLL_GUARD": "0", "FUNCOLL_COUNT_CALLS": None},
                    timeout=180)[0]
    for guard, calls in res.items():
        up = []
        for path, name, caller in calls:
            me, them = _file_unit(path), caller and _file_unit(caller)
            one_transport = me and them and me.split("/")[0] == them.split("/")[0] == "transport"
            if them is not None and me is not None and me != them and me not in ALLOWED[them] and not one_transport:
                up.append((caller, path, name))
        assert up == [("entry/pipeline.py", "entry/process_group.py", "allreduce"),
                      ("transport/__init__.py", "entry/pipeline.py", "start")], (guard, up)
        assert (("entry/checks.py", "size_guard") in {(p, n) for p, n, _ in calls}) == guard  # only when it is on
    # the eager path's budget (docs/performance.md gives today's count): a new call on it shows here
    assert len(res[False]) <= EAGER_HOPS, len(res[False])


def test_a_compiled_xla_call_stays_within_its_hops():
    """The compiled ``_c10d_functional.all_reduce(x, "avg")`` on XLA (world 1, the CPU PJRT device) makes at most
    XLA_HOPS funcoll calls (``bench.hops xla``; docs/performance.md gives today's count)."""
    pytest.importorskip("torch_xla", reason="needs torch_xla (the XLA transport)")
    from tests import fresh

    calls = fresh.run("bench.hops:xla", env={"PJRT_DEVICE": "CPU", "FUNCOLL_COUNT_CALLS": None}, timeout=300)
    assert 0 < len(calls) <= XLA_HOPS, len(calls)
