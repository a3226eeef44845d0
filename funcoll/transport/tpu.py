"""The TorchTPU transport: funcoll's algorithms over TorchTPU's ``ProcessGroupTpu`` (backend ``tpu_dist``) for tensors
on its ``tpu`` device, on current torch (TorchTPU 0.2 needs torch 2.11-2.15; torch_xla stops at torch 2.9).
:func:`derive` reads :data:`TORCHTPU_FACTS` only; docs/torchtpu.md says how groups, profiles and tests use them.

Importing this module imports neither torch_tpu nor a TPU runtime: the version is read from the package metadata, and
nothing touches the ``tpu`` device until a transport is created for a ``tpu`` tensor.
"""

from __future__ import annotations

from dataclasses import replace
from importlib import metadata
from typing import Optional

import torch
import torch.distributed as dist

from funcoll.semantics import FLOAT8, FLOAT_DTYPES, INTEGER_DTYPES, MX, ReduceOp
from funcoll.transport import DONE, Capabilities, active_profile_name, static_split_bound
from funcoll.transport import profile as _named_profile
from funcoll.transport.c10d import C10dTransport
from funcoll.transport.facts import Fact, VersionedCapabilities, label, parse_version, row_key, table, version_text
from funcoll.transport.registry import GroupContext, c10d_leg, register_device

__all__ = ["TORCHTPU_FACTS", "Fact", "TpuTransport", "derive", "capabilities", "conservative_profile",
           "torch_tpu_version", "version_row", "static_split_bound", "VERSION_ROWS", "KNOWN_UNTIL", "BACKEND_NAME"]

BACKEND_NAME = "tpu_dist"  # ProcessGroupTpu::getBackendName()

# The torch_tpu versions the table has a row for; any other version (older, newer, or not found) is "unknown" (derive)
VERSION_ROWS = ("0.2",)
KNOWN_UNTIL = "torch_tpu 0.2.0 wheel, torch-2.15 glue (read 2026-11)"

# Evidence tags (the torch-tpu 0.2.0 wheel, https://pypi.org/project/torch-tpu/0.2.0/): W file:line = a Python file
# of the wheel (under torch_tpu/); SO = a literal in its csrc/common/glue_2_15_0/libpywrap_2_15_0_common.so
# (ProcessGroupTpu); vt[n] = slot n of ProcessGroupTpu's vtable (a c10d default there means "not overridden"); RUN =
# executed without a TPU; M = the public mirror github.com/jonathan1920/torch_tpu (csrc/distributed/
# process_group_tpu.{h,cc}; version unknown: corroboration only).
_TPU_REDUCE_DTYPES = INTEGER_DTYPES | FLOAT_DTYPES | {torch.bool}
_V02 = (0, 2)  # native_since: the torch_tpu row from which funcoll hands the request to ProcessGroupTpu

# THE TORCHTPU FACT TABLE: every ProcessGroupTpu capability funcoll relies on, with its evidence (derive() reads
# nothing else; docs/torchtpu.md renders it).
TORCHTPU_FACTS = table(
    "torch_tpu", lambda fact: "not known" if fact.info else "not known; funcoll's strategy",
    Fact("avg_float", "ReduceOp.AVG on float32/float64 (all_reduce, reduce_scatter)", native_since=_V02,
         strategy="SUM, then divide on the device",
         source="BuildDistributedAllReduceShlo / ...ReduceScatterShlo: on op == AVG an all-reduce SUM then "
                "stablehlo.divide by a constant (SO makeConstant, Div); BuildReduceBody: \"'avg' reduction should be "
                "handled using 'sum'\"",
         by_version=(("0.2", "SUM, then divide by the group size in the tensor's dtype"),),
         unknown="the strategy (SUM + divide: the same result)"),
    Fact("avg_low_precision", "ReduceOp.AVG on float16/bfloat16",
         strategy="float32 reduce_scatter, divide and round once, all_gather in the tensor's dtype",
         source="the AVG branch of the builders has no convert: the sum stays in the tensor's dtype (inferred from "
                "the same code as avg_float; not run: no TPU)",
         by_version=(("0.2", "summed in fp16/bf16 (not widened), then divided"),),
         unknown="how XLA:TPU accumulates a bf16 all-reduce internally; funcoll sums in float32 on every version"),
    Fact("avg_int", "ReduceOp.AVG on integer and bool dtypes",
         strategy="the exact sum (int64), divided with truncation toward zero: where a sum in the dtype wraps "
                  "(int8 AVG of [100, 100]: -28 there and on NCCL) funcoll gives the exact mean (100)",
         source="the AVG branch sums in the tensor's own dtype (int8 overflows at 2 ranks) and divides with "
                "stablehlo.divide (truncating); inferred from the builders, not run",
         by_version=(("0.2", "summed in the dtype (overflows), then a truncating divide"),)),
    Fact("premul_sum", "ReduceOp.PREMUL_SUM (_make_nccl_premul_sum)",
         strategy="multiply by the factor on the device, then SUM (the caller's input is never scaled)",
         source="ValidateReductionOp: 'reduce option not supported: ' + op (utils.cc:76, M the same); SO "
                "\"BuildReduceBody: 'premul_sum' reduction is not supported\" (op_builder_utils.cc:1308); "
                "tpu::_reduce_scatter_dim: 'expected reduce_op to be one of sum, avg, ...' (RUN)",
         by_version=(("0.2", "refused: RuntimeError 'reduce option not supported'"),)),
    Fact("bitwise", "ReduceOp.BAND / BOR / BXOR on integer and bool dtypes", native_since=_V02,
         strategy="all_to_all, reduce each block locally in rank order, all_gather",
         source="BuildReduceBody: BAND->and, BOR->or, BXOR->xor; ValidateReductionOp's integer mask {Byte, Char, "
                "Short, Int, Long, Bool, UInt16, UInt32, UInt64}; floats refused with 'expected the tensors dtype "
                "to be integer on bitwise reduction ops' (utils.cc:79; funcoll refuses them with a TypeError first)",
         by_version=(("0.2", "native on integers and bool; refused on floats"),),
         unknown="the strategy"),
    Fact("broadcast", "broadcast (and the scatter built on it)",
         strategy="one SUM all_reduce of the integers of the root's bits, 0 elsewhere: the bytes arrive as they are",
         source="ProcessGroupTpu::broadcast zeroes the other ranks (at::zeros + copy_) and calls allreduce (vt[34]) "
                "with SUM; M: 'stablehlo.collective_broadcast is not implemented for TPUs'",
         by_version=(("0.2", "zeros + SUM all_reduce: a root -0.0 arrives as +0.0 (inferred, not run)"),)),
    Fact("scatter", "scatter",
         strategy="broadcast of the stacked inputs' bits (as above), keep this rank's slice",
         source="ProcessGroupTpu::scatter: the root concatenates its inputs, the others send zeros, then a SUM "
                "_reduce_scatter_base (vt[50]; cat, stack, zeros in the disassembly)",
         by_version=(("0.2", "zeros + SUM reduce_scatter: -0.0 lost like broadcast (inferred, not run)"),)),
    Fact("reduce", "reduce (to one rank)",
         strategy="the all_reduce plan, the result kept on dst",
         source="vt[37] = c10d::Backend::reduce: 'Backend tpu_dist does not support reduce' (Backend.hpp:408)",
         by_version=(("0.2", "refused"),)),
    Fact("gather", "gather", native_since=_V02,
         strategy="all_gather, the root keeps the rows",
         source="ProcessGroupTpu::gather calls allgather (vt[38]) on every rank; the root keeps the result (the "
                "same bytes as funcoll's strategy)",
         by_version=(("0.2", "an all_gather to every rank"),),
         unknown="the strategy (the same exchange)"),
    Fact("barrier", "barrier with default options", native_since=_V02,
         strategy="a SUM all_reduce of one element",
         source="ProcessGroupTpu::barrier: a SUM all-reduce of ones(1), then .item(); refuses 'timeout in barrier "
                "options is not supported', 'device_ids in barrier options is not supported, except "
                "device_ids=[0]', 'device in barrier options is not supported' (SO)",
         by_version=(("0.2", "all-reduce of ones(1) + a host read; options refused"),),
         unknown="the strategy (no host read)"),
    Fact("uneven_all_to_all", "all_to_all_single with split sizes",
         strategy="every split padded to one size (a bound promised with static_split_bound, else agreed with one "
                  "tiny all_gather), one even all_to_all, unpadded",
         source="AllToAllBaseUnevenSplits: a ragged all-to-all with one c10d store round trip per call "
                "('alltoall_offsets:' keys; 'c10d::Store is required for multi-rank uneven all-to-all'), refused "
                "unless every rank's buffers have the same size: 'asymmetric input buffer sizes across ranks are "
                "not supported on TPU ... use padding if necessary' (SO)",
         by_version=(("0.2", "ragged all-to-all, store sync per call, symmetric buffers only"),)),
    Fact("all_reduce_coalesced", "one all_reduce of several tensors (allreduce_coalesced, multi-tensor allreduce)",
         strategy="one flat buffer per dtype, one all_reduce each",
         source="vt[36]: 'Backend tpu_dist does not support allreduce_coalesced' (the functional "
                "all_reduce_coalesced reaches it through Functional.cpp); allreduce: 'does not yet support multiple "
                "tensors' (SO)",
         by_version=(("0.2", "refused"),)),
    Fact("coalescing", "the coalescing manager (startCoalescing/endCoalescing)",
         strategy="funcoll's own coalescing (the group's _start/_end_coalescing)",
         source="vt[29]/[30] are c10d defaults ('does not implement startCoalescing'); supportsCoalescing is false "
                "(vt[10])",
         by_version=(("0.2", "refused"),)),
    Fact("sequence_numbers", "sequence numbers and Work timeouts",
         strategy="FuncollWork: sequence numbers, wait(timeout), exception() (on funcoll groups)",
         source="vt[57]/[58] defaults: 'does not yet support sequence numbers.'; TpuWork::wait(timeout) ignores the "
                "timeout, abort() is empty, a Work exists only for async calls (M); the constructor takes no "
                "timeout",
         by_version=(("0.2", "refused; timeouts ignored"),)),
    # -- rules funcoll respects or reports on every version (they switch no plan) -----------------------------
    Fact("dtypes", "dtypes moved and reduced", native_since=_V02, info=True,
         strategy="all of funcoll's dtypes are handed as they are (no dtype view: not verified under TorchTPU), but "
                  "the halves of an MX tensor (float8_e8m0fnu, float4_e2m1fn_x2), as everywhere as their uint8 view "
                  "(a same-width bitcast, as TpuTransport.bits_as makes one)",
         source="internal::ToElementType (dtype.cc:214): bool, u8, i8, i16, i32, i64, u16, u32, u64, f16, bf16, "
                "f32, f64, c64, c128, float8 e5m2/e4m3fn/e5m2fnuz/e4m3fnuz/e8m0fnu, float4_e2m1fn_x2; 'TorchTPU does "
                "not yet support dtype' for complex32, quantized, bits and int1-7/uint1-7",
         by_version=(("0.2", "every dtype funcoll moves"),),
         unknown="whether the TPU runtime executes f64, complex, u64 or float8 collectives: no TPU to run them on"),
    Fact("same_ops_every_rank", "every rank dispatches the same op sequence", info=True,
         strategy="rank-dependent values reach the strategies as device data (masks), and uneven all_to_all is "
                  "padded to one shape (no per-pair message sizes)",
         source="kTorchTpuInternalDetectRepeatedOpsEnvVar / ResetRepeatedOpsHeuristicState (SO); the 0.2.0 "
                "broadcast runs dummy ops on the root to keep the heuristic in step (M)",
         by_version=(("0.2", "required (repeated-ops heuristic; compile handshake)"),)),
    Fact("sub_groups", "sub-groups", info=True,
         strategy="refused on the calling rank: funcoll cannot build a group ProcessGroupTpu cannot express",
         source="ProcessGroupTpu constructor: 'TPU slice size (..) must be divisible by process group size (..)', "
                "'expected exactly one TPU device per PyTorch process'; InitializeRankToDeviceMappings: 'the first "
                "initialized ProcessGroupTpu must be of size WORLD_SIZE'; GatherAllSubgroups: 'Overlapping subgroups "
                "are not supported in SPMD.' / 'Incomplete or overlapping subgroups are not supported in SPMD.'",
         by_version=(("0.2", "sizes dividing the slice; no overlapping or incomplete partitions"),),
         unknown="what exactly triggers the 'incomplete' error, in time order"),
    Fact("one_graph_per_collective", "each eager collective is its own graph execution", info=True,
         strategy="a strategy of k primitives costs k executions eagerly (unless under torch.tpu.distributed."
                  "spmd_safe); compiled, it stays inside its node's partition",
         source="W distributed/spmd_util.py:45-75; TORCH_TPU_INTERNAL_MATERIALIZE_COLLECTIVE_TENSORS defaults to "
                "True (W compile/split_compiler.py:756)",
         by_version=(("0.2", "one execution per eager collective"),)),
)


def _version(v):
    return parse_version(v, "funcoll.tpu: cannot read a torch_tpu version", "0.2.0")


def version_row(torch_tpu_version) -> Optional[str]:
    """The row of :data:`VERSION_ROWS` for a torch_tpu version ('0.2.0' -> '0.2'); None when the table has none."""
    v = _version(torch_tpu_version)
    row = f"{v[0]}.{v[1]}" if v is not None and len(v) >= 2 else None
    return row if row in VERSION_ROWS else None


def derive(torch_tpu_version) -> VersionedCapabilities:
    """ProcessGroupTpu's capabilities in one torch_tpu version. An unknown version (None, or one without a row) hands
    TorchTPU only the baseline primitives; every switchable fact takes funcoll's strategy."""
    row = version_row(torch_tpu_version)

    def native(key: str) -> bool:
        fact = TORCHTPU_FACTS[key]
        return (not fact.info and row is not None and fact.native_since is not None
                and row_key(row) >= fact.native_since)

    primitives = {"all_reduce", "all_gather", "reduce_scatter", "all_to_all", "send_recv"}
    primitives |= {k for k in ("broadcast", "scatter", "reduce", "gather", "barrier", "all_reduce_coalesced")
                   if native(k)}
    reduce_ops = {ReduceOp.SUM, ReduceOp.PRODUCT, ReduceOp.MIN, ReduceOp.MAX}
    refused = set()
    if native("avg_float"):
        reduce_ops.add(ReduceOp.AVG)
        # avg_int and avg_low_precision: never native
        refused |= {(ReduceOp.AVG, d) for d in _TPU_REDUCE_DTYPES - {torch.float32, torch.float64}}
    if native("bitwise"):
        reduce_ops |= {ReduceOp.BAND, ReduceOp.BOR, ReduceOp.BXOR}
        refused |= {(op, d) for op in (ReduceOp.BAND, ReduceOp.BOR, ReduceOp.BXOR) for d in FLOAT_DTYPES}
    vstr = version_text(_version(torch_tpu_version))
    return VersionedCapabilities(
        name=f"torchtpu[{vstr}]", versions={"torch_tpu": vstr, "row": row or "unknown"},
        sources={f"torchtpu.{k}": label(f, native(k)) for k, f in TORCHTPU_FACTS.items()},
        primitives=frozenset(primitives), reduce_ops=frozenset(reduce_ops), refused_pairs=frozenset(refused),
        # every dtype funcoll knows (internal::ToElementType, dtype.cc:214), the halves of an MX tensor as their uint8
        # view (funcoll moves them so on every transport; f8e8m0fnu and float4 collectives are not run on a TPU here)
        dtypes=(_TPU_REDUCE_DTYPES | FLOAT8) - MX,
        reduce_dtypes=_TPU_REDUCE_DTYPES, uneven_all_to_all=native("uneven_all_to_all"), is_async=True,
        p2p_any_shape=False)  # same_ops_every_rank: no per-pair message sizes


def conservative_profile(torch_tpu_version="0.2.0") -> Capabilities:
    """``PROFILES["torchtpu"]`` (what ``FUNCOLL_PROFILE=torchtpu`` imposes on another transport): the newest row of the
    table, as plain :class:`Capabilities`, the same on every machine, whether torch_tpu is installed or not."""
    return derive(torch_tpu_version).plain(name="torchtpu")


def torch_tpu_version() -> Optional[str]:
    """The installed torch_tpu's version, read from its package metadata (never imported), or None."""
    try:
        return metadata.version("torch-tpu")
    except Exception:
        return None


def capabilities(profile: Optional[str] = None, *, version=None) -> VersionedCapabilities:
    """What funcoll's ``tpu`` transport does natively with the installed torch_tpu (or torch_tpu ``version``); the rest
    funcoll fills. ``profile`` (default ``FUNCOLL_PROFILE``) names a capability profile to intersect with."""
    v = torch_tpu_version() if version is None else version
    src = "given" if version is not None else "package metadata of torch-tpu" if v else "not installed: unknown version"
    caps = derive(v)
    name = profile if profile is not None else active_profile_name()
    if name and name != "torchtpu":
        caps = caps.restrict(_named_profile(name))
    return replace(caps, sources={**caps.sources, "torchtpu.version": f"torch_tpu {caps.versions['torch_tpu']} "
                                                                      f"({src})"})


class TpuTransport(C10dTransport):
    """``C10dTransport`` over a ProcessGroupTpu, with control tensors on the group's ``tpu`` device, a call answered
    without a Work complete, and a barrier with no option (ProcessGroupTpu refuses any)."""

    dtype_views = False  # a view as another dtype is not verified under TorchTPU's deferred eager mode: convert
    # bits_as (the masked sum of broadcast and scatter) stays a view: TorchTPU 0.2.0 has no PrivateUse1 kernel for
    # view.dtype (torch's composite one makes the view) and lowers a dtype view of its tensors as a view primitive,
    # RealToRealBitcast, to stablehlo.bitcast_convert (libpywrap_2_15_0_common.so: ViewPrimitiveShlo(RealToRealBitcast)
    # and the messages "the RealToRealBitcast conversion input cannot be a scalar", "... to be from a type whose
    # bitwidth divides the target type's bitwidth"); read from the wheel, not run (no TPU)
    staging_bytes = None  # one collective per request: each is a graph execution of its own, the compiler plans memory

    def __init__(self, backend, caps: Capabilities, device=None, device_type: str = "tpu"):
        super().__init__(backend, caps, device_type)
        # one TPU device per process (ProcessGroupTpu)
        self.control_device = torch.device(device) if device is not None else torch.device(device_type, 0)
        self.premul_in_place = False  # PREMUL_SUM never reaches ProcessGroupTpu (the table has none)


def _completed(primitive):
    """C10dTransport's ``primitive``, done when ProcessGroupTpu answers without a Work (it ran a synchronous call)."""
    def run(self, *args):
        work = primitive(self, *args)
        return DONE if work is None else work
    return run


# every primitive is C10dTransport's (whose barrier hands default options: ProcessGroupTpu refuses any)
for _name in ("_all_reduce", "_all_gather", "_reduce_scatter", "_all_to_all", "_broadcast", "_reduce", "_gather",
              "_scatter", "_send", "_recv", "_barrier"):
    setattr(TpuTransport, _name, _completed(getattr(C10dTransport, _name)))


def _is_tpu_backend(backend) -> bool:
    try:
        return backend.name() == BACKEND_NAME
    except Exception:
        return False


def check_group_size(name: str, size: int, world_size: int) -> None:
    """ProcessGroupTpu's rule that funcoll cannot fill (the replica groups are ProcessGroupTpu's): a group's size
    divides the TPU slice size (the world: one TPU per process). Refused on the calling rank before anything is sent."""
    if size < 1 or world_size % size:
        raise ValueError(f"funcoll: group {name!r} has {size} ranks, which does not divide the TPU slice size "
                         f"({world_size}, one TPU per process); TorchTPU's ProcessGroupTpu requires 'TPU slice size "
                         f"to be divisible by process group size', and funcoll cannot fill that on tpu: use groups "
                         f"whose size divides {world_size}")


def _funcoll_tpu(ctx: GroupContext) -> TpuTransport:
    """A ProcessGroupTpu of its own for one funcoll group, made with TorchTPU's creator (every rank calls it); a group
    TorchTPU made is preferred (docs/torchtpu.md: sub-groups go through the root store's keys)."""
    check_group_size(ctx.name, ctx.size, ctx.world_size)
    try:
        from torch_tpu._internal.distributed import tpu_distributed  # type: ignore[import-not-found]
    except ImportError:
        raise RuntimeError(f"funcoll: tpu tensors need TorchTPU's ProcessGroupTpu (torch_tpu "
                           f"{torch_tpu_version() or 'is not installed'}); pip install torch-tpu, or create the "
                           f"group with 'cpu:funcoll,tpu:tpu_dist'") from None
    backend = tpu_distributed.create_process_group(dist.PrefixStore("funcoll-tpu/", ctx.store), ctx.rank, ctx.size,
                                                   ctx.timeout)
    return TpuTransport(backend, capabilities())


def _c10d_tpu(pg, device):
    """The tpu backend of a group TorchTPU made ("tpu", "cpu:gloo,tpu:tpu_dist", "cpu:funcoll,tpu:tpu_dist")."""
    return c10d_leg(pg, "tpu", "tpu", "init_process_group('cpu:gloo,tpu:tpu_dist') (or 'tpu')", _is_tpu_backend,
                    f"TorchTPU's ProcessGroupTpu ({BACKEND_NAME!r}) on tpu",
                    lambda b: TpuTransport(b, capabilities(), device))


register_device("tpu", funcoll=_funcoll_tpu, c10d=_c10d_tpu)
