"""The XPU transport: funcoll's algorithms over the group's XCCL (oneCCL) c10d backend.

* Primitives: :class:`XcclTransport` is the CPU reference :class:`~funcoll.transport.gloo.C10dTransport` driving a
  ``ProcessGroupXCCL`` instead of a ``ProcessGroupGloo``; tensors are handed to it on the device and stay there.
* Capabilities: derived from the running stack, by :func:`derive`, a pure function of
  ``(torch version, oneCCL version, override)`` over the fact table :data:`XCCL_FACTS` (the only place XCCL facts
  live, each with its source). ``FUNCOLL_PROFILE=<name>`` additionally intersects them with a named profile
  (``FUNCOLL_PROFILE=xccl``: the most conservative XCCL table); ``FUNCOLL_XPU_OVERRIDE="avg=strategy,..."``
  flips single facts for a stack known to be broken (or known to be good).
* Groups: a funcoll group gets a ``ProcessGroupXCCL`` of its own, built from the group's store; a group made with
  another backend (``"xccl"``, ``"cpu:gloo,xpu:xccl"``) lends funcoll its XPU backend.

Importing this module never imports or initialises the XPU runtime: nothing here touches ``torch.xpu`` until a
transport is created for an XPU tensor.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field, fields, replace
from typing import Dict, Mapping, Optional, Tuple

import torch

from funcoll.semantics import FLOAT8, ReduceOp
from funcoll.transport import PRIMITIVES, Capabilities, active_profile_name
from funcoll.transport import profile as _named_profile
from funcoll.transport.gloo import C10dTransport
from funcoll.transport.registry import GroupContext, register_device

__all__ = ["XCCL_FACTS", "Fact", "XcclCapabilities", "XcclTransport", "derive", "capabilities",
           "stack_versions", "parse_override", "parse_topology", "measure_topology", "ENV_OVERRIDE",
           "ENV_ONECCL_VERSION", "ENV_TOPOLOGY", "SCALE_UP", "SCALE_OUT", "TOPOLOGIES"]

R = ReduceOp
ENV_OVERRIDE = "FUNCOLL_XPU_OVERRIDE"
ENV_ONECCL_VERSION = "FUNCOLL_ONECCL_VERSION"

Version = Tuple[int, ...]

# dtypes ProcessGroupXCCL moves and reduces: the ``xcclDatatypes`` map of ProcessGroupXCCL.cpp
# (intel/torch-xpu-ops src/xccl/ProcessGroupXCCL.cpp; torch <= 2.7: torch/csrc/distributed/c10d/ProcessGroupXCCL.cpp).
# bool is carried as ccl uint8. float8 e4m3fn/e5m2/e4m3fnuz/e5m2fnuz are carried as ccl uint8 for non-reducing
# ops only; funcoll moves every float8 dtype as a uint8 view itself (the same bytes on the wire, and it also
# covers float8_e8m0fnu, which is not in the map), so no float8 dtype is listed natively here.
_XCCL_DTYPES = frozenset({torch.uint8, torch.int8, torch.int32, torch.int64, torch.float16, torch.float32,
                          torch.float64, torch.bfloat16, torch.bool})
_XCCL_INTS = frozenset({torch.uint8, torch.int8, torch.int32, torch.int64})
_FLOATS = frozenset({torch.float16, torch.bfloat16, torch.float32, torch.float64})


SCALE_UP, SCALE_OUT = "scale-up", "scale-out"
TOPOLOGIES = (SCALE_UP, SCALE_OUT)
ENV_TOPOLOGY = "FUNCOLL_XPU_TOPOLOGY"


@dataclass(frozen=True)
class Fact:
    """One fact about ProcessGroupXCCL / oneCCL.

    ``native_since``: the oneCCL version from which funcoll uses the native path by default on the scale-up path
    (one node, XeLink), None: never by default. ``scale_out_since``: the same on the scale-out path (several nodes,
    OFI); oneCCL's two paths have different reduce ops, so a multi-node job is never handed what only the scale-up
    path has. ``overridable``: the topologies on which ``FUNCOLL_XPU_OVERRIDE`` may flip it (none where the library
    raises: there is nothing native to switch to).
    """

    key: str
    what: str
    native_since: Optional[Version]
    scale_out_since: Optional[Version]
    overridable: Tuple[str, ...]
    strategy: str  # what funcoll does when the fact is not native
    source: str

    def since(self, topology: str) -> Optional[Version]:
        return self.native_since if topology == SCALE_UP else self.scale_out_since


_BOTH = TOPOLOGIES
_NEVER: Tuple[str, ...] = ()


# ======================================================================================================
# THE XCCL FACT TABLE. Every XCCL capability funcoll relies on is here, with its source; derive() reads
# nothing else. docs/xpu.md renders the same table.
# ======================================================================================================
XCCL_FACTS: Dict[str, Fact] = {f.key: f for f in (
    Fact("avg",
         "ReduceOp.AVG on floating dtypes (all_reduce)",
         native_since=(2022, 0), scale_out_since=(2022, 0), overridable=_BOTH,
         strategy="SUM, then divide on the device (fp16/bf16: float32 reduce_scatter, divide, all_gather)",
         source="ProcessGroupXCCL.cpp: oneCCL < 2021.15 has no ccl avg (XCCL_HAS_AVG unset) and the backend "
                "itself does SUM + div_; >= 2021.15 calls ccl avg, which raises on the scheduler path "
                "(intel/torch-xpu-ops#2361) and divided twice for small messages on Arc B60 "
                "(intel/torch-xpu-ops#3020, fixed in the oneAPI 2026.0 bundle); AVG in scale-out (OFI) "
                "AllReduce lands in oneCCL 2022.0 (uxlfoundation/oneCCL#195)"),
    Fact("avg_reduce_scatter",
         "ReduceOp.AVG on floating dtypes (reduce_scatter)",
         native_since=(2022, 0), scale_out_since=None, overridable=(SCALE_UP,),
         strategy="SUM, then divide on the device (fp16/bf16 summed in float32)",
         source="scale-up: as avg (ccl avg from oneCCL 2021.15, trusted from 2022.0); scale-out: oneCCL 2022.0 adds "
                "AVG to scale-out AllReduce only (uxlfoundation/oneCCL#195), nothing says ReduceScatter"),
    Fact("avg_reduce",
         "ReduceOp.AVG on reduce (to one rank)",
         native_since=None, scale_out_since=None, overridable=_NEVER,
         strategy="all_reduce path (AVG as above), result kept on dst",
         source="AVG in Reduce is missing for scale-up and scale-out (uxlfoundation/oneCCL#195, MLSL-4062)"),
    Fact("avg_int",
         "ReduceOp.AVG on integer dtypes",
         native_since=None, scale_out_since=None, overridable=_NEVER,
         strategy="int64 SUM, then truncating divide (NCCL semantics)",
         source="ProcessGroupXCCL.cpp: without ccl avg the backend's in-place div_ fails on integer tensors; "
                "the integer semantics of ccl avg are undocumented"),
    Fact("premul_sum",
         "ReduceOp.PREMUL_SUM (_make_nccl_premul_sum) on all_reduce / reduce_scatter",
         native_since=None, scale_out_since=None, overridable=(SCALE_UP,),
         strategy="multiply by the factor on the device, then SUM (the same bytes on the wire)",
         source="'Cannot use ReduceOp.PREMUL_SUM with XCCL' (intel/torch-xpu-ops#1571) up to torch 2.10; "
                "support for allreduce/reduce_scatter on the scale-up (XeLink) path only, with oneCCL >= 2021.17, "
                "landed in #1948 (2025-08), was reverted in #2913 (2026-02) and relanded in #3173 (2026-03); on "
                "scale-out oneCCL has no PreMulSum (uxlfoundation/oneCCL#196) and ProcessGroupXCCL itself falls "
                "back to scale+SUM (#2903); reduce has no PREMUL_SUM on either path (#3173 review, oneCCL#196). "
                "funcoll scales itself by default (one multiply, the same bytes on the wire); premul_sum=native "
                "may be set on a scale-up group only, and never reaches reduce"),
    Fact("bitwise",
         "ReduceOp.BAND / BOR / BXOR",
         native_since=None, scale_out_since=None, overridable=_NEVER,
         strategy="all_to_all, reduce each block locally in rank order, all_gather (reduce_scatter: all_to_all + "
                  "local)",
         source="ProcessGroupXCCL.cpp xcclOps maps only MIN/MAX/SUM/PRODUCT(/AVG): "
                "'Cannot use ReduceOp.BAND with XCCL'"),
    Fact("int_minmax",
         "ReduceOp.MIN / MAX on integer and bool dtypes",
         native_since=None, scale_out_since=None, overridable=_BOTH,
         strategy="all_to_all, min/max of each block locally, all_gather (bool: a uint8 count and one compare; "
                  "reduce_scatter: all_to_all + local)",
         source="int64 MAX over [-1, 0] returned a wrong result on Arc B60 (intel/torch-xpu-ops#3059); "
                "verl routes its integer MAX through a CPU group (seed 002); no fixed version published"),
    Fact("dtypes_16_unsigned",
         "int16, uint16, uint32, uint64",
         native_since=None, scale_out_since=None, overridable=_NEVER,
         strategy="moved as raw bits of a same-width dtype; reduced as the signed dtype (sign bit flipped "
                  "for MIN/MAX) or widened int16 -> int32",
         source="ProcessGroupXCCL.cpp xcclDatatypes has no kShort/kUInt16/kUInt32/kUInt64: "
                "'Input tensor data type is not supported for XCCL process group'"),
    Fact("float8",
         "float8 dtypes",
         native_since=None, scale_out_since=None, overridable=_NEVER,
         strategy="moved as a uint8 view (no copy); reductions are a TypeError in funcoll's semantics",
         source="ProcessGroupXCCL.cpp maps float8 e4m3fn/e5m2/e4m3fnuz/e5m2fnuz to ccl uint8 for "
                "non-reducing ops, raises for reductions, and has no float8_e8m0fnu"),
    Fact("uneven_all_to_all",
         "all_to_all_single with split sizes",
         native_since=None, scale_out_since=None, overridable=_BOTH,
         strategy="n-1 rounds of pairwise send/recv, each message exactly its split (no agreement, no padding)",
         source="uneven all_to_all_single has returned wrong results on some GPUs (DESIGN.md section 1); "
                "ProcessGroupXCCL uses ccl::alltoallv, and the oneCCL v2 path emulates it with grouped "
                "send/recv until onecclAllToAllV (oneCCL 2022.2, intel/torch-xpu-ops#5057)"),
    Fact("all_reduce_coalesced",
         "one tuple all_reduce of several tensors",
         native_since=None, scale_out_since=None, overridable=_NEVER,
         strategy="one flat buffer per dtype, one all_reduce each",
         source="ProcessGroupXCCL::allreduce_coalesced requires identical dtypes ('Tensors must have "
                "identical type'); funcoll's tuple path does not group by dtype"),
)}

# The torch version names the table and says whether the backend exists at all; no capability in the table depends
# on it today: the only torch-side change found (native PREMUL_SUM, torch-xpu-ops #3173) is not used natively.
XCCL_BACKEND_SINCE = (2, 8)  # stock torch wheels ship ProcessGroupXCCL from 2.8 (DESIGN.md section 1);
#                              source builds with USE_XCCL=1 from 2.7 (huggingface/accelerate#3401)


# ------------------------------------------------------------------------------------------------------
# capabilities
# ------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class XcclCapabilities(Capabilities):
    """Capabilities plus (primitive, reduce op) pairs refused on one primitive only (AVG on reduce)."""

    refused_on: frozenset = frozenset()
    versions: Mapping[str, str] = field(default_factory=dict, compare=False)

    def reduces(self, primitive: str, op: ReduceOp, dtype: torch.dtype) -> bool:
        return super().reduces(primitive, op, dtype) and (primitive, op) not in self.refused_on

    def restrict(self, other: Capabilities) -> "XcclCapabilities":
        base = Capabilities.restrict(self, other)
        kw = {f.name: getattr(base, f.name) for f in fields(Capabilities)}
        return XcclCapabilities(**kw, refused_on=self.refused_on | getattr(other, "refused_on", frozenset()),
                                versions=self.versions)


def parse_version(v) -> Optional[Version]:
    """'2.9.0+xpu' -> (2, 9, 0); '2021.16.1' -> (2021, 16, 1); a tuple stays; None/'' -> None."""
    if v is None or (isinstance(v, str) and not v.strip()):
        return None
    if isinstance(v, tuple):
        return tuple(int(x) for x in v)
    m = re.match(r"\s*(\d+(?:\.\d+)*)", str(v))
    if not m:
        raise ValueError(f"funcoll.xpu: cannot read a version from {v!r}; write it as e.g. 2021.16.1")
    return tuple(int(x) for x in m.group(1).split("."))


def parse_topology(topology) -> str:
    """"scale-up" (one node, XeLink) or "scale-out" (several nodes, OFI); None or "" means unknown, taken as
    scale-out (a multi-node job must never be handed what only the scale-up path has)."""
    if topology is None or (isinstance(topology, str) and not topology.strip()):
        return SCALE_OUT
    t = str(topology).strip().lower().replace("_", "-")
    if t not in TOPOLOGIES:
        raise ValueError(f"funcoll.xpu: unknown topology {topology!r}; use scale-up (one node) or scale-out "
                         f"(several nodes)")
    return t


def parse_override(override, topology: str = SCALE_OUT) -> Dict[str, bool]:
    """``"avg=strategy, int_minmax=native"`` -> {"avg": False, "int_minmax": True}. Unknown facts, and facts that
    cannot be flipped on ``topology``, are a ValueError naming the valid ones."""
    if not override:
        return {}
    if isinstance(override, Mapping):
        items = [(k, v) for k, v in override.items()]
    else:
        items = []
        for part in str(override).split(","):
            part = part.strip()
            if not part:
                continue
            key, sep, val = part.partition("=")
            if not sep:
                raise ValueError(f"funcoll.xpu: override entry {part!r} must be <fact>=native or "
                                 f"<fact>=strategy")
            items.append((key.strip(), val.strip()))
    out = {}
    allowed = sorted(k for k, f in XCCL_FACTS.items() if topology in f.overridable)
    for key, val in items:
        fact = XCCL_FACTS.get(key)
        if fact is None or topology not in fact.overridable:
            if fact is None:
                why = "is not a fact"
            elif fact.overridable:
                where = ", ".join(fact.overridable)
                why = f"cannot be overridden on the {topology} path (the library has it on {where} only)"
            else:
                why = "cannot be overridden (the library has no native path)"
            raise ValueError(f"funcoll.xpu: override {key!r} {why}; overridable facts on {topology}: "
                             f"{', '.join(allowed)}")
        if isinstance(val, bool):
            out[key] = val
        elif str(val).lower() in ("native", "on", "1", "true"):
            out[key] = True
        elif str(val).lower() in ("strategy", "off", "0", "false", "broken"):
            out[key] = False
        else:
            raise ValueError(f"funcoll.xpu: override {key}={val!r}: use {key}=native or {key}=strategy")
    return out


def derive(torch_version, oneccl_version, override=None, topology=None) -> XcclCapabilities:
    """The XCCL capabilities of a stack: a pure function of (torch version, oneCCL version, override, topology).

    ``oneccl_version`` None means unknown: every version-gated fact takes its conservative (strategy) side.
    ``topology`` None means unknown: the scale-out row (what every path has).
    """
    tv, ov = parse_version(torch_version), parse_version(oneccl_version)
    topo = parse_topology(topology)
    flips = parse_override(override, topo)

    def native(key: str) -> bool:
        if key in flips:
            return flips[key]
        since = XCCL_FACTS[key].since(topo)
        return since is not None and ov is not None and ov >= since

    reduce_ops = {R.SUM, R.PRODUCT, R.MIN, R.MAX}
    refused = {(op, d) for op in (R.AVG,) for d in _XCCL_INTS | {torch.bool}}  # avg_int
    refused_on = {("reduce", R.AVG)}  # avg_reduce
    if native("avg") or native("avg_reduce_scatter"):
        reduce_ops.add(R.AVG)
        if not native("avg"):
            refused_on.add(("all_reduce", R.AVG))
        if not native("avg_reduce_scatter"):
            refused_on.add(("reduce_scatter", R.AVG))
    if native("premul_sum"):  # scale-up only; fp16/bf16/fp32 (unpackPreMulSumV2 in #3173); never on reduce
        reduce_ops.add(R.PREMUL_SUM)
        refused |= {(R.PREMUL_SUM, d) for d in _XCCL_DTYPES - {torch.float16, torch.bfloat16, torch.float32}}
        refused_on.add(("reduce", R.PREMUL_SUM))
    if not native("int_minmax"):
        refused |= {(op, d) for op in (R.MIN, R.MAX) for d in _XCCL_INTS | {torch.bool}}
    primitives = set(PRIMITIVES) - {"all_reduce_coalesced"}
    used = {k: ("native" if native(k) else "strategy") for k in XCCL_FACTS}
    tstr = ".".join(map(str, tv[:2])) if tv else "?"
    ostr = ".".join(map(str, ov)) if ov else "unknown"
    return XcclCapabilities(
        name=f"xccl[torch {tstr}, oneCCL {ostr}, {topo}]",
        primitives=frozenset(primitives),
        reduce_ops=frozenset(reduce_ops),
        dtypes=_XCCL_DTYPES,
        reduce_dtypes=_XCCL_DTYPES,
        refused_pairs=frozenset(refused),
        uneven_all_to_all=native("uneven_all_to_all"),
        is_async=True,
        refused_on=frozenset(refused_on),
        sources={f"xccl.{k}": f"{used[k]}: {f.source}" for k, f in XCCL_FACTS.items()},
        versions={"torch": tstr, "oneccl": ostr, "topology": topo},
    )


def conservative_profile() -> Capabilities:
    """``PROFILES["xccl"]`` (what ``FUNCOLL_PROFILE=xccl`` imposes on another transport): the row :func:`derive` gives
    for an unknown oneCCL on the scale-out path, as plain :class:`Capabilities`, plus float8 moved as bytes."""
    d = derive(None, None, "", None)
    kw = {f.name: getattr(d, f.name) for f in fields(Capabilities)}
    kw.update(name="xccl", dtypes=d.dtypes | FLOAT8,
              sources={**d.sources, "xccl.fp8": "fp8 reductions raise (DESIGN.md section 1); fp8 is moved as bytes"})
    return Capabilities(**kw)


# ------------------------------------------------------------------------------------------------------
# reading the running stack (guarded; never touches the XPU runtime)
# ------------------------------------------------------------------------------------------------------
def _oneccl_from_metadata() -> Optional[str]:
    """The pip ``oneccl`` package torch's XPU wheels depend on (torch 2.9: oneccl==2021.16.1)."""
    try:
        from importlib import metadata

        return metadata.version("oneccl")
    except Exception:
        return None


def _oneccl_from_flight_recorder() -> Optional[str]:
    """ProcessGroupXCCL records the oneCCL version (getXcclVersion) in its flight recorder when created."""
    try:
        import pickle

        from torch._C import _distributed_c10d as C

        dump = getattr(C, "_dump_xccl_trace", None)
        if dump is None:
            return None
        v = pickle.loads(dump()).get("comm_lib_version")
        return v if v and v[0].isdigit() else None
    except Exception:
        return None


def stack_versions(backend_created: bool = False) -> Tuple[str, Optional[str], str]:
    """(torch version, oneCCL version or None, where the oneCCL version came from)."""
    env = os.environ.get(ENV_ONECCL_VERSION, "").strip()
    if env:
        return torch.__version__, env, ENV_ONECCL_VERSION
    v = _oneccl_from_metadata()
    if v:
        return torch.__version__, v, "pip metadata of package 'oneccl'"
    if backend_created:
        v = _oneccl_from_flight_recorder()
        if v:
            return torch.__version__, v, "ProcessGroupXCCL flight recorder"
    return torch.__version__, None, "unknown (conservative: every version-gated fact uses its strategy)"


def capabilities(profile: Optional[str] = None, *, torch_version=None, oneccl_version=None, override=None,
                 topology=None, _backend_created: bool = False) -> XcclCapabilities:
    """What funcoll's XPU transport does natively on this stack (the rest funcoll fills).

    Versions default to the running stack; ``override`` defaults to ``FUNCOLL_XPU_OVERRIDE``; ``topology`` to
    ``FUNCOLL_XPU_TOPOLOGY`` (a funcoll group measures it: all ranks on one host is scale-up), unknown meaning
    scale-out; ``profile`` (default ``FUNCOLL_PROFILE``) names a capability profile to intersect with, e.g. ``"xccl"``
    for the most conservative XCCL table.
    """
    src = "given"
    if torch_version is None or oneccl_version is None:
        tv, ov, src = stack_versions(_backend_created)
        torch_version = torch_version if torch_version is not None else tv
        if oneccl_version is None:
            oneccl_version = ov
        else:
            src = "given"
    if override is None:
        override = os.environ.get(ENV_OVERRIDE, "")
    topo_src = "given"
    if topology is None:
        topology = os.environ.get(ENV_TOPOLOGY, "").strip() or None
        topo_src = ENV_TOPOLOGY if topology else "unknown: scale-out assumed (every path has it)"
    caps = derive(torch_version, oneccl_version, override, topology)
    name = profile if profile is not None else active_profile_name()
    if name:
        caps = caps.restrict(_named_profile(name))
    return replace(caps, sources={**caps.sources,
                                  "xccl.version": f"oneCCL {caps.versions['oneccl']} ({src})",
                                  "xccl.topology": f"{caps.versions['topology']} ({topo_src})"})


def measure_topology(store, rank: int, size: int, timeout=None) -> str:
    """scale-up when every rank of the group runs on this host, else scale-out: each rank publishes its host name in
    the group's store and reads the others' (a collective over the store, bounded by the store's timeout)."""
    import socket

    host = socket.gethostname()
    store.set(f"funcoll-topology/{rank}", host)
    keys = [f"funcoll-topology/{r}" for r in range(size)]
    if timeout is not None:
        store.wait(keys, timeout)
    else:
        store.wait(keys)
    hosts = {store.get(k).decode() for k in keys}
    return SCALE_UP if hosts == {host} else SCALE_OUT


# ------------------------------------------------------------------------------------------------------
# the transport
# ------------------------------------------------------------------------------------------------------
class XcclTransport(C10dTransport):
    """The primitives of a c10d XCCL backend for XPU tensors. Everything is reused from ``C10dTransport``;
    this class only says where small control tensors live (``control_device``: the group's XPU device, so
    that e.g. the split-size agreement of uneven all_to_all never stages payload through the host) and binds
    the barrier to that device."""

    def __init__(self, backend, caps: Capabilities, device=None, device_type: str = "xpu"):
        super().__init__(backend, caps, device_type)
        self._device = torch.device(device) if device is not None else None

    @property
    def control_device(self) -> torch.device:
        d = self._device
        if d is None or (d.type == "xpu" and d.index is None):
            d = self._device = torch.device("xpu", torch.xpu.current_device())
        return d

    def _barrier(self):
        from torch._C import _distributed_c10d as C

        o = C.BarrierOptions()
        d = self.control_device
        if d.type == "xpu":
            o.device_ids = [d.index]
        return self.backend.barrier(o)


def _xccl_class():
    import torch.distributed as dist

    cls = getattr(dist, "ProcessGroupXCCL", None)
    available = getattr(dist, "is_xccl_available", lambda: False)
    if cls is None or not available():
        raise RuntimeError(
            f"funcoll: XPU tensors need torch's XCCL backend (torch.distributed.is_xccl_available() is False "
            f"in torch {torch.__version__}); use an XPU build of torch >= "
            f"{'.'.join(map(str, XCCL_BACKEND_SINCE))} (pip install torch --index-url "
            f"https://download.pytorch.org/whl/xpu)")
    return cls


def _new_xccl_backend(store, rank: int, size: int, timeout, group_name: str, global_ranks):
    cls = _xccl_class()
    try:
        opts = cls.Options()
    except Exception:  # very old bindings: no Options
        return cls(store, rank, size)
    for attr, val in (("global_ranks_in_group", list(global_ranks)), ("group_name", group_name),
                      ("_timeout", timeout)):
        try:
            setattr(opts, attr, val)
        except Exception:
            pass
    return cls(store, rank, size, opts)


def _funcoll_xpu(ctx: GroupContext) -> XcclTransport:
    """A ProcessGroupXCCL of its own for one funcoll group (every rank of the group creates it)."""
    from torch.distributed import PrefixStore

    topology = os.environ.get(ENV_TOPOLOGY, "").strip() or measure_topology(
        PrefixStore("funcoll-xccl-topology/", ctx.store), ctx.rank, ctx.size, ctx.timeout)
    backend = _new_xccl_backend(PrefixStore("funcoll-xccl/", ctx.store), ctx.rank, ctx.size, ctx.timeout,
                                f"funcoll-{ctx.name}", ctx.global_ranks)
    return XcclTransport(backend, capabilities(topology=topology, _backend_created=True), None)


def _c10d_xpu(pg, device) -> XcclTransport:
    """The XPU backend of a group made with another backend ("xccl", "cpu:gloo,xpu:xccl")."""
    try:
        backend = pg._get_backend(torch.device("xpu"))
    except RuntimeError:
        raise ValueError(f"funcoll: group {pg.group_name!r} has no XPU backend; create it with "
                         f"init_process_group('xccl') or 'cpu:gloo,xpu:xccl' (or backend 'funcoll')") from None
    own = getattr(backend, "funcoll_transport", None)  # the XPU leg is a funcoll group itself
    if own is not None:
        return own("xpu")
    cls = _xccl_class()
    if not isinstance(backend, cls):
        raise ValueError(f"funcoll: the XPU backend of group {pg.group_name!r} is {type(backend).__name__}; "
                         "funcoll drives ProcessGroupXCCL on XPU")
    return XcclTransport(backend, capabilities(_backend_created=True), device)


register_device("xpu", funcoll=_funcoll_xpu, c10d=_c10d_xpu)
