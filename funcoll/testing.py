"""Helpers for users' snapshot tests of compiled collectives (public; each helper: docs/testing-compiled.md): plain,
normalised text or values, stable across runs, processes, ranks and machines, for expecttest's ``assertExpectedInline``.
"""

from __future__ import annotations

import contextlib
import operator
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterable, Iterator, List, Mapping, Optional, Sequence, Tuple, Union

import torch
from torch.utils import _pytree as pytree

from funcoll.replicas import ReplicaRuntimeError
from funcoll.replicas import capture as capture_replicas
from funcoll.replicas import execute as execute_replicas
from funcoll.replicas import run as run_replicas
from funcoll.semantics import dtype_name

__all__ = ["xla_collectives", "xla_compiled_collectives", "group_label", "normalize_text", "render_graph",
           "Collective", "collectives", "CapturedGraph", "Captured", "capture_graphs", "trace_fake",
           "CompileCounts", "compile_counts", "count_compiles", "hlo_lines",
           "COLLECTIVE_OPCODES", "run_replicas", "capture_replicas", "execute_replicas", "ReplicaRuntimeError"]

COLLECTIVE_OPCODES = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute",
                      "collective-broadcast", "send", "recv", "all-reduce-start", "all-gather-start",
                      "collective-permute-start")
_KEEP_ATTRS = ("replica_groups", "dimensions", "source_target_pairs", "to_apply", "slice", "padding", "direction")
_LAYOUT = re.compile(r"(\])\{[0-9,]*(?::[^}]*)?\}")
_INDEX_COMMENT = re.compile(r"/\*index=\d+\*/")
_ADDRESS = re.compile(r"0x[0-9a-fA-F]+")
_PATH = re.compile(r"[\w.@+~:-]*(?:[\\/][\w.@+~-]+)*[\\/]([\w.@+~-]+\.(?:py|pyc|so|cpp|h|hpp))\b")
_COMPILE_ID = re.compile(r"^\[?\d+/\d+\]?:\s*")
_COLLECTIVE_NAMESPACES = ("_c10d_functional", "_c10d_functional_autograd")


def xla_collectives(tensors: Union[torch.Tensor, Sequence[torch.Tensor]],
                    keep: Optional[Iterable[str]] = None) -> str:
    """The collectives of the pending XLA computation producing ``tensors`` (lazy XLA tensors), one :func:`hlo_lines`
    line each; ``keep``: the HLO opcodes to show (default: the collectives). Nothing is executed. Needs torch_xla."""
    import torch_xla

    hlo = torch_xla._XLAC._get_xla_tensors_hlo([tensors] if isinstance(tensors, torch.Tensor) else list(tensors))
    return "\n".join(hlo_lines(hlo, COLLECTIVE_OPCODES if keep is None else keep))


def _group_ranks(name: str) -> Optional[Tuple[bool, Tuple[int, ...]]]:
    """(is the default group, global ranks) of the group called ``name``, or None when nobody knows it."""
    import torch.distributed as dist

    from funcoll.semantics import groups

    try:
        pg = groups.resolve(name) if dist.is_available() and dist.is_initialized() else None
    except Exception:  # noqa: BLE001 - not a c10d group; funcoll's registry may know it
        pg = None
    if pg is not None:
        return pg is dist.group.WORLD, tuple(dist.get_process_group_ranks(pg))
    try:
        return False, groups.lookup(name).ranks
    except ValueError:
        return None


def group_label(name: str, names: Optional[Mapping[str, str]] = None) -> str:
    """A stable label for the process group called ``name``: ``<world>``, else ``<group r0,r1,...>`` (its global
    ranks, in group-rank order); ``names`` overrides labels by name; a name no one knows is returned unchanged."""
    if names and name in names:
        return names[name]
    found = _group_ranks(name)
    if found is None:
        return name
    is_world, ranks = found
    return "<world>" if is_world else "<group " + ",".join(map(str, ranks)) + ">"


def normalize_text(text: str) -> str:
    """Removes what differs between runs and machines from free text (graph-break and recompile reasons,
    generated code): memory addresses become ``0x?``, file paths their base name."""
    return _PATH.sub(r"\1", _ADDRESS.sub("0x?", text))


def _value_of(node: torch.fx.Node):
    return next((node.meta[key] for key in ("val", "example_value") if key in node.meta), None)


def _show_value(v) -> str:
    if isinstance(v, torch.Tensor):
        return f"{dtype_name(v.dtype)}{list(v.shape)}@{v.device.type}"
    if isinstance(v, (list, tuple)):
        return "(" + ", ".join(_show_value(x) for x in v) + ")"
    return normalize_text(repr(v))


def _overload(target) -> Optional[torch._ops.OpOverload]:
    """The op overload a node calls (a packet: its default), or None for anything else."""
    if isinstance(target, torch._ops.OpOverloadPacket):
        return target.default
    return target if isinstance(target, torch._ops.OpOverload) else None


def _target_name(target) -> str:
    if isinstance(target, (torch._ops.OpOverload, torch._ops.OpOverloadPacket)):
        name = str(target).replace("_c10d_functional_autograd.", "c10d_autograd.").replace("_c10d_functional.", "c10d.")
        return name.removesuffix(".default")
    if isinstance(target, str):
        return target
    module = getattr(target, "__module__", None) or ""
    name = getattr(target, "__qualname__", None) or getattr(target, "__name__", None) or repr(target)
    if name.startswith("_VariableFunctionsClass."):  # torch.arange and the other torch.* builtins
        module, name = "torch", name.split(".", 1)[1]
    if module in ("_operator", "operator", "builtins") or getattr(operator, name, None) is target:
        return name
    return normalize_text(f"{module}.{name}" if module else name)


def render_graph(gm: Union[torch.fx.GraphModule, torch.fx.Graph], names: Optional[Mapping[str, str]] = None) -> str:
    """An FX graph as text, one node per line: ``name = target(args) -> dtype[shape]@device``; placeholders as
    ``name: dtype[shape]@device``, then ``return ...``. ``c10d.`` stands for ``_c10d_functional.``, ``.default`` is
    omitted, every ``group_name`` is shown as :func:`group_label` (``names`` overrides labels)."""
    graph = gm.graph if isinstance(gm, torch.fx.GraphModule) else gm

    def arg(a, group=False):
        if isinstance(a, torch.fx.Node):
            return a.name
        if isinstance(a, (list, tuple)):
            return "[" + ", ".join(arg(x) for x in a) + "]"
        if isinstance(a, str) and group:
            return group_label(a, names)
        if isinstance(a, torch.device):
            return a.type
        if isinstance(a, torch.dtype):
            return dtype_name(a)
        return normalize_text(repr(a))

    lines = []
    for n in graph.nodes:
        v = _value_of(n)
        shown = f" -> {_show_value(v)}" if v is not None else ""
        if n.op == "placeholder":
            lines.append(f"{n.name}: {_show_value(v)}" if v is not None else n.name)
        elif n.op == "output":
            lines.append(f"return {arg(n.args[0])}")
        elif n.op == "get_attr":
            lines.append(f"{n.name} = get_attr {n.target}{shown}")
        else:
            op = _overload(n.target) if n.op == "call_function" else None
            groups = {i for i, a in enumerate(op._schema.arguments) if a.name == "group_name"} if op else set()
            args = [arg(a, i in groups) for i, a in enumerate(n.args)]
            args += [f"{k}={arg(v, k == 'group_name')}" for k, v in n.kwargs.items() if k != "pin_memory"]
            if n.op == "call_method":
                target, args = (f"{args[0]}.{n.target}" if args else str(n.target)), args[1:]
            else:
                target = _target_name(n.target)
            lines.append(f"{n.name} = {target}({', '.join(args)}){shown}")
    return "\n".join(lines)


@dataclass(frozen=True)
class Collective:
    """One collective of a graph (the fields: docs/testing-compiled.md); ``group`` is the group name when no one knows
    its ranks, ``autograd`` marks ``_c10d_functional_autograd`` ops."""

    op: str
    reduce_op: Optional[str]
    group: Union[Tuple[int, ...], str]
    inputs: Tuple[Tuple[torch.dtype, Tuple[int, ...]], ...]
    outputs: Tuple[Tuple[torch.dtype, Tuple[int, ...]], ...]
    args: Tuple[Tuple[str, Any], ...] = ()
    autograd: bool = False

    def __str__(self) -> str:
        def ts(specs):
            return ", ".join(f"{dtype_name(d)}{list(s)}" for d, s in specs)

        group = "[" + ",".join(map(str, self.group)) + "]" if isinstance(self.group, tuple) else self.group
        head = ("autograd." if self.autograd else "") + self.op
        extra = "".join(f" {k}={v}" for k, v in self.args)
        red = f" {self.reduce_op}" if self.reduce_op is not None else ""
        return f"{head}{red} group={group}{extra}: {ts(self.inputs)} -> {ts(self.outputs)}"


def _specs(v) -> Tuple[Tuple[torch.dtype, Tuple[int, ...]], ...]:
    if isinstance(v, torch.Tensor):
        return ((v.dtype, tuple(int(s) if not isinstance(s, torch.SymInt) else s for s in v.shape)),)
    if isinstance(v, (list, tuple)):
        return tuple(s for x in v for s in _specs(x))
    return ()


def collectives(gm: Union[torch.fx.GraphModule, torch.fx.Graph]) -> List[Collective]:
    """The collectives of an FX graph, in graph order (not ``wait_tensor``, nor torch 2.15's ``wait_tensors``); shapes
    come from the nodes' metadata."""
    graph = gm.graph if isinstance(gm, torch.fx.GraphModule) else gm
    out = []
    for n in graph.nodes:
        op = _overload(n.target) if n.op == "call_function" else None
        if op is None or op.namespace not in _COLLECTIVE_NAMESPACES:
            continue
        name = _target_name(n.target).split(".", 1)[1].split(".")[0]
        if name in ("wait_tensor", "wait_tensors"):
            continue
        named = {a.name: v for a, v in zip(op._schema.arguments, n.args)} | dict(n.kwargs)  # by schema name
        inputs, rest = [], []
        for k, v in named.items():
            if k == "out":
                continue
            nodes = v if isinstance(v, (list, tuple)) else [v]
            if nodes and all(isinstance(x, torch.fx.Node) for x in nodes):
                inputs += [s for x in nodes for s in _specs(_value_of(x))]
            elif k not in ("reduce_op", "group_name", "tag"):
                rest.append((k, list(v) if isinstance(v, tuple) else v))
        name_of_group = named.get("group_name")
        found = _group_ranks(name_of_group) if isinstance(name_of_group, str) else None
        out.append(Collective(
            op=name, reduce_op=named.get("reduce_op"),
            group=found[1] if found is not None else str(name_of_group),
            inputs=tuple(inputs), outputs=_specs(_value_of(n)), args=tuple(rest),
            autograd=op.namespace == "_c10d_functional_autograd"))
    return out


@dataclass
class CapturedGraph:
    """One graph: ``gm`` as the compiler received it, ``text`` (:func:`render_graph`) and ``collectives``
    taken at that moment (inductor rewrites its graphs in place afterwards)."""

    gm: torch.fx.GraphModule
    text: str
    collectives: List[Collective]

    def __str__(self) -> str:
        return self.text


def _snapshot(gm) -> CapturedGraph:
    return CapturedGraph(gm, render_graph(gm), collectives(gm))


@dataclass
class Captured:
    """What :func:`capture_graphs` saw: the call's ``result``; ``dynamo``: torch-level graphs, one per frame compiled;
    ``forward``, ``backward``: the aten-level graphs the backend compiled, one per Dynamo graph."""

    result: Any = None
    dynamo: List[CapturedGraph] = field(default_factory=list)
    forward: List[CapturedGraph] = field(default_factory=list)
    backward: List[CapturedGraph] = field(default_factory=list)

    def text(self, which: str = "forward") -> str:
        """The rendered graphs of one kind (``"dynamo"``, ``"forward"``, ``"backward"``), blank-line separated."""
        return "\n\n".join(g.text for g in getattr(self, which))

    def collectives(self, which: str = "forward") -> List[Collective]:
        return [c for g in getattr(self, which) for c in g.collectives]


def _capturing_backend(backend: str, captured: Captured):
    from functorch.compile import make_boxed_func

    def dynamo_backend(gm, example_inputs):
        captured.dynamo.append(_snapshot(gm))
        if backend == "aot_eager":
            from torch._dynamo.backends.debugging import aot_eager

            def keeping(graphs):
                return lambda g, ex: graphs.append(_snapshot(g)) or make_boxed_func(g)

            return aot_eager(gm, example_inputs, fw_compiler=keeping(captured.forward),
                             bw_compiler=keeping(captured.backward))
        if backend == "inductor":
            from torch._inductor.compile_fx import compile_fx, compile_fx_inner

            def inner(g, ex, **kwargs):
                (captured.backward if kwargs.get("is_backward") else captured.forward).append(_snapshot(g))
                return compile_fx_inner(g, ex, **kwargs)

            return compile_fx(gm, example_inputs, inner_compile=inner)
        if backend == "eager":
            return gm
        raise ValueError(f"funcoll.testing: backend must be 'aot_eager', 'inductor' or 'eager', got {backend!r}")

    return dynamo_backend


def _tensors(x) -> List[torch.Tensor]:
    return [t for t in pytree.tree_leaves(x) if isinstance(t, torch.Tensor)]


def capture_graphs(fn: Callable, *args, backend: str = "aot_eager", backward: bool = False,
                   fullgraph: bool = True, dynamic: Optional[bool] = False, reset: bool = True,
                   **kwargs) -> Captured:
    """Calls ``torch.compile(fn, backend=..., fullgraph=..., dynamic=...)(*args, **kwargs)`` once and returns the
    graphs it produced (docs/testing-compiled.md); ``backend="eager"``: the Dynamo graphs only."""
    import torch._dynamo

    if reset:
        torch._dynamo.reset()
    captured = Captured()
    compiled = torch.compile(fn, backend=_capturing_backend(backend, captured), fullgraph=fullgraph, dynamic=dynamic)
    with torch._functorch.config.patch(enable_autograd_cache=False):  # a cache hit would compile nothing
        captured.result = compiled(*args, **kwargs)
        if backward:
            outs = [t for t in _tensors(captured.result) if t.requires_grad]
            if not outs:
                raise ValueError("funcoll.testing.capture_graphs: backward=True but no output requires grad")
            torch.autograd.backward(outs, [torch.ones_like(t) for t in outs])
    return captured


def trace_fake(fn: Callable, *args, functional: bool = False) -> torch.fx.GraphModule:
    """The ``make_fx`` graph of ``fn`` on fake tensors (docs/testing-compiled.md); ``functional=True`` functionalizes
    first (in-place collectives become functional ones plus copies, as AOTAutograd sees them)."""
    from torch.fx.experimental.proxy_tensor import make_fx

    f = torch.func.functionalize(fn, remove="mutations_and_views") if functional else fn
    return make_fx(f, tracing_mode="fake")(*args)


@dataclass
class CompileCounts:
    """What torch.compile did (filled when the :func:`compile_counts` block exits): a break is counted each time its
    frame is traced; ``break_reasons``: the first line of each; ``recompile_reasons``: the failed guards."""

    graphs: int = 0
    graph_breaks: int = 0
    break_reasons: List[str] = field(default_factory=list)
    recompiles: int = 0
    recompile_reasons: List[str] = field(default_factory=list)


def _reason(text: str) -> str:
    """One reason on one line: normalised, without the compile id ("0/1: ") and the alignment spaces."""
    return " ".join(_COMPILE_ID.sub("", normalize_text(text.strip())).split())


def _guard_lines(reason: str) -> List[str]:
    """The failed guards of one recompile reason, one per line; the "User stack trace:" block that newer Dynamo
    (torch >= 2.10) appends after them is left out, so the reasons read the same on every torch."""
    head = re.split(r"^\s*User stack trace:", reason, maxsplit=1, flags=re.M)[0]
    return [line for line in head.splitlines() if line.strip()]


@contextlib.contextmanager
def compile_counts() -> Iterator[CompileCounts]:
    """``with compile_counts() as c: ...`` counts what torch.compile does inside the block (every compiled
    function, any backend); ``c`` is filled on exit. Read from Dynamo's counters and compilation metrics."""
    from torch._dynamo.utils import counters, get_compilation_metrics

    breaks_before = dict(counters["graph_break"])
    graphs_before = counters["stats"]["unique_graphs"]
    seen = {id(m) for m in get_compilation_metrics()}
    counts = CompileCounts()
    try:
        yield counts
    finally:
        counts.graphs = counters["stats"]["unique_graphs"] - graphs_before
        for msg, count in counters["graph_break"].items():
            new = count - breaks_before.get(msg, 0)
            if new > 0:
                counts.graph_breaks += new
                counts.break_reasons.append(_reason(msg.strip().splitlines()[0]))
        recompiled = [m for m in get_compilation_metrics() if id(m) not in seen and m.recompile_reason]
        counts.recompiles = len(recompiled)
        counts.recompile_reasons = [_reason(r) for m in recompiled for r in _guard_lines(m.recompile_reason or "")]


def count_compiles(fn: Callable, *calls, backend: Union[str, Callable] = "eager",
                   dynamic: Optional[bool] = None, reset: bool = True) -> CompileCounts:
    """Compiles ``fn`` (not fullgraph: breaks are counted, not raised) and calls it once per element of ``calls``
    (a tuple of positional arguments, or the single argument). ``reset`` clears Dynamo's caches first."""
    import torch._dynamo

    if reset:
        torch._dynamo.reset()
    compiled = torch.compile(fn, backend=backend, dynamic=dynamic)
    with compile_counts() as counts:
        for call in calls:
            compiled(*call) if isinstance(call, tuple) else compiled(call)
    return counts


def xla_compiled_collectives(fn: Callable, *args, keep: Optional[Iterable[str]] = None,
                             backward: bool = False, **kwargs) -> str:
    """:func:`xla_collectives` of ``fn`` compiled (aot_eager, fullgraph) and called on ``args`` (lazy XLA tensors):
    of its outputs, its mutated inputs and, with ``backward=True``, the gradients. Built, never executed; a fresh
    ordering token before and after. Needs torch_xla and ``funcoll.install(["xla"])``."""
    from funcoll import xla

    xla_args = [t for t in _tensors(list(args) + list(kwargs.values())) if t.device.type == "xla"]
    if not xla_args:
        raise ValueError("funcoll.testing.xla_compiled_collectives: no XLA tensor among the arguments")
    xla.reset_token(xla_args[0].device)
    captured = capture_graphs(fn, *args, backward=backward, **kwargs)
    params = list(fn.parameters()) if isinstance(fn, torch.nn.Module) else []
    grads = [t.grad for t in (xla_args if backward else []) + params if t.grad is not None]
    tensors = _tensors(captured.result) + xla_args + params + grads
    text = xla_collectives([t for t in tensors if t.device.type == "xla"], keep)
    # the token holds these collectives now: the next one would chain to them and run them at its sync
    xla.reset_token(xla_args[0].device)
    return text


def _split_top(text: str, sep: str = ",", most: int = -1) -> List[str]:
    """``text`` split at each ``sep`` outside brackets (at the first ``most`` ones when given), parts stripped."""
    out: List[str] = []
    depth = start = 0
    for i, ch in enumerate(text):
        depth += (ch in "([{") - (ch in ")]}")
        if ch == sep and depth == 0 and len(out) != most:
            out.append(text[start:i].strip())
            start = i + 1
    return out + [text[start:].strip()] if text[start:].strip() else out


def _parse_instruction(line: str):
    """``%name = SHAPE opcode(OPERANDS), attrs`` -> (name, shape, opcode, operands, [attrs]) or None."""
    assignment = re.match(r"\s*(?:ROOT )?%([\w.\-]+) = (.*)$", line)
    parts = _split_top(assignment.group(2), " ", 1) if assignment else []
    call, *attrs = _split_top(parts[1]) if len(parts) == 2 else [""]
    op = re.match(r"([a-z][\w\-]*)\((.*)\)$", call, re.S)
    return (assignment.group(1), parts[0], op.group(1), op.group(2), attrs) if assignment and op else None


def _norm_shape(shape: str) -> str:
    return _INDEX_COMMENT.sub("", _LAYOUT.sub(r"\1", shape)).replace(" ", "")


def hlo_lines(hlo: str, keep: Iterable[str] = COLLECTIVE_OPCODES) -> List[str]:
    """The instructions of the ENTRY computation of ``hlo`` whose opcode is in ``keep``, one normalised line each:
    ``opcode(operand shapes) -> result shape  attr=...``, ``to_apply`` shown as the reduction's opcode (add, ...)."""
    keep = tuple(keep)
    roots: Dict[str, str] = {}  # computation -> the opcode of its ROOT (%AddComputation.4 -> add)
    found, computation, in_entry = [], None, False
    for line in hlo.splitlines():
        head = re.match(r"(ENTRY )?%([\w.\-]+) \(.*\{\s*$", line)
        if head:
            computation, in_entry = head.group(2), bool(head.group(1))
            continue
        ins = _parse_instruction(line)
        if ins is not None and line.strip().startswith("ROOT"):
            roots[computation or ""] = ins[2]
        if ins is not None and in_entry and ins[2] in keep:
            found.append(ins)
    out = []
    for _, shape, opcode, operands, attrs in found:
        ops = [_norm_shape(o.rsplit(" ", 1)[0] if "%" in o else o) for o in _split_top(operands)]
        kept = [f"{k}={roots.get(v.lstrip('%'), v) if k == 'to_apply' else v}"
                for k, _, v in (a.partition("=") for a in attrs) if k in _KEEP_ATTRS]
        out.append(f"{opcode}({', '.join(ops)}) -> {_norm_shape(shape)}" + ("  " + " ".join(kept) if kept else ""))
    return out
