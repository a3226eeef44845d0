"""The XPU transport: funcoll's algorithms over the group's XCCL (oneCCL) c10d backend (:class:`XcclTransport`), and
its capabilities: :func:`derive`, a pure function of the stack over the fact tables :data:`XCCL_FACTS`
(ProcessGroupXCCL, per torch version) and :data:`XCCL2_FACTS` (xccl2) and the open upstream reports
:data:`OPEN_REPORTS`; docs/xpu.md explains each input, ``FUNCOLL_XPU_OVERRIDE`` and the groups funcoll drives.

Importing this module never imports or initialises the XPU runtime: nothing here touches ``torch.xpu`` until a
transport is created for an XPU tensor.
"""

from __future__ import annotations

import os
import pickle
import re
import socket
import warnings
from dataclasses import dataclass, field, replace
from importlib import metadata
from typing import Callable, Dict, Mapping, Optional, Tuple

import torch
import torch._C._distributed_c10d as C
import torch.distributed as dist

from funcoll.semantics import FLOAT8, FLOAT_DTYPES, MX, ReduceOp
from funcoll.transport import PRIMITIVES, Capabilities, active_profile_name
from funcoll.transport import profile as _named_profile
from funcoll.transport.c10d import C10dTransport
from funcoll.transport.facts import (
    Fact,
    Version,
    VersionedCapabilities,
    label,
    parse_version,
    row_key,
    table,
    version_text,
)
from funcoll.transport.registry import GroupContext, c10d_leg, register_device

__all__ = ["XCCL_FACTS", "XCCL2_FACTS", "OPEN_REPORTS", "Report", "open_reports", "backend_class", "fact_table",
           "Fact", "XcclCapabilities", "XcclTransport", "derive", "capabilities",
           "stack_versions", "build_version", "parse_override", "parse_topology", "measure_topology", "torch_row",
           "ENV_OVERRIDE", "ENV_ONECCL_VERSION", "ENV_ONECCL_BUILD_VERSION", "ENV_TOPOLOGY", "SCALE_UP", "SCALE_OUT",
           "TOPOLOGIES", "TORCH_ROWS", "KNOWN_UNTIL", "ALLOC_CONF_VARS", "expandable_segments",
           "warn_expandable_segments"]

ENV_OVERRIDE = "FUNCOLL_XPU_OVERRIDE"
ENV_ONECCL_VERSION = "FUNCOLL_ONECCL_VERSION"
ENV_ONECCL_BUILD_VERSION = "FUNCOLL_ONECCL_BUILD_VERSION"
ENV_TOPOLOGY = "FUNCOLL_XPU_TOPOLOGY"

# dtypes ProcessGroupXCCL moves and reduces: the ``xcclDatatypes`` map (intel/torch-xpu-ops src/xccl/xccl.h:96-111
# at ab84f925; ProcessGroupXCCL.cpp before), bool carried as ccl uint8. No float8: funcoll moves every float8 dtype
# as a uint8 view itself (the float8 fact).
_XCCL_DTYPES = frozenset({torch.uint8, torch.int8, torch.int32, torch.int64, torch.float16, torch.float32,
                          torch.float64, torch.bfloat16, torch.bool})

SCALE_UP, SCALE_OUT = "scale-up", "scale-out"
TOPOLOGIES = (SCALE_UP, SCALE_OUT)

# The torch versions the table has a row for: what ProcessGroupXCCL does in that release, read from intel/torch-xpu-ops
# release/2.x branch tips (assumed to be what torch 2.x pins); "2.15" is torch-xpu-ops main as of 2026-08-22 (no
# release/2.15 branch was readable: what 2.15 pins later is unknown).
TORCH_ROWS = ("2.9", "2.10", "2.11", "2.12", "2.13", "2.14", "2.15")
KNOWN_UNTIL = "intel/torch-xpu-ops main at ab84f925 (2026-08-22)"


def _version(v) -> Optional[Version]:
    return parse_version(v, "funcoll.xpu: cannot read a version", "2021.16.1")


def torch_row(torch_version) -> Optional[str]:
    """The row of :data:`TORCH_ROWS` for a torch version ('2.13.0+xpu' -> '2.13'), None when unknown."""
    tv = _version(torch_version)
    if tv is None or len(tv) < 2:
        return None
    v = min(max(tv[:2], (2, 9)), (2, 15))  # 2.8: the 2.9 row (the same PREMUL_SUM refusal); after 2.15: the 2.15 row
    return f"{v[0]}.{v[1]}"


_BOTH = TOPOLOGIES
_NEVER: Tuple[str, ...] = ()
_PREMUL_BUILD_2_11 = (2021, 17)  # ENABLE_XCCL_PREMUL_SUM_SUPPORT in torch 2.11 (release/2.11 xccl.h:29-33)


# THE XCCL FACT TABLE: every XCCL capability funcoll relies on, with its source (derive() reads nothing else;
# docs/xpu.md renders it). Paths are intel/torch-xpu-ops src/xccl/... at main ab84f925 (2026-08-22) unless a release
# branch is named; PGX = ProcessGroupXCCL.cpp; dates are merge dates.
XCCL_FACTS = table(
    "torch", lambda fact: "the strategy is used",
    Fact("avg", "ReduceOp.AVG on floating dtypes (all_reduce)",
         native_since=(2022, 0), scale_out_since=(2022, 0), overridable=_BOTH,
         strategy="SUM, then divide on the device (fp16/bf16: float32 reduce_scatter, divide, all_gather)",
         source="funcoll's gate: oneCCL >= 2022.0 at run time, the release that adds AVG to scale-out AllReduce "
                "(uxlfoundation/oneCCL#195, maintainer 2026-03-16), and no open report covering the stack "
                "(OPEN_REPORTS): on scale-up ccl avg raises on the scheduler path (intel/torch-xpu-ops#2361, open, "
                "one node) and was divided twice on Arc B60 (#3020, open; 'fixed in oneAPI 2026.0' is a third-party "
                "comment only, verl-project/verl#7917), so scale-up takes the strategy unless the live group's probe "
                "verified AVG or the override says native",
         by_version=(("2.9", "ccl avg when torch was built against oneCCL >= 2021.15 (XCCL_HAS_AVG, xccl.h:40-44 in "
                             "release/2.12-2.13), else SUM + div_ (source builds only: every stock wheel since 2.9 "
                             "was built against >= 2021.15)"),
                     ("2.14", "always onecclAvg, no XCCL_HAS_AVG and no div_ fallback (xccl.h:88-94; #4145 'Drop "
                              "oneCCL v1', merged 2026-07-10); no topology check in torch")),
         build="torch <= 2.13: XCCL_HAS_AVG needs oneCCL >= 2021.15 at torch's build time (below it: SUM + div_, "
               "right for floats)",
         unknown="whether #3020 is fixed in a released oneCCL: no maintainer statement found; oneCCL unknown at run "
                 "time: the strategy"),
    Fact("avg_reduce_scatter", "ReduceOp.AVG on floating dtypes (reduce_scatter)",
         native_since=(2022, 0), scale_out_since=None, overridable=(SCALE_UP,),
         strategy="SUM, then divide on the device (fp16/bf16 summed in float32)",
         source="scale-up: as avg (onecclAvg passed to onecclReduceScatter on every path, xccl.cpp:79-95), and "
                "intel/torch-xpu-ops#2361 (open: FSDP2 on one node, which sends AVG on reduce_scatter) covers it: "
                "the strategy unless probed or overridden; scale-out: uxlfoundation/oneCCL#195 lists AVG gaps for "
                "Reduce and scale-out AllReduce only and says nothing about ReduceScatter",
         by_version=(("2.9", "as avg: ccl avg (or SUM + div_ in builds against oneCCL < 2021.15)"),
                     ("2.14", "always onecclAvg (#4145, 2026-07-10)")),
         build="as avg",
         unknown="scale-out ReduceScatter AVG: no source either way; funcoll uses the strategy there"),
    Fact("avg_reduce", "ReduceOp.AVG on reduce (to one rank)",
         strategy="all_reduce path (AVG as above), result kept on dst",
         source="AVG in Reduce is missing for scale-up and scale-out (uxlfoundation/oneCCL#195, MLSL-4062; closed, "
                "its closing comment covers scale-out AllReduce only); torch passes onecclAvg to onecclReduce "
                "unchecked (xccl.cpp:42-60, PGX:1544,1568); list-form reduce_scatter with unequal inputs becomes "
                "per-rank reduce in torch (PGX:1806-1818)",
         by_version=(("2.9", "AVG handed to ccl reduce unchecked"),),
         unknown="whether oneCCL 2022.x added AVG to Reduce: the strategy"),
    Fact("avg_int", "ReduceOp.AVG on integer dtypes",
         strategy="the exact sum (int64), divided with truncation toward zero: NCCL truncates too but sums in the "
                  "dtype (FuncSumPostDiv), so where an 8- to 32-bit sum wraps (int8 AVG of [100, 100]: NCCL -28) "
                  "funcoll gives the exact mean (100); int64 sums wrap in both",
         source="the integer semantics of onecclAvg are undocumented (an enum value only, oneCCL 2022.2 "
                "include/oneapi/ccl/v2/types.h:162); bool AVG is a TypeError (xccl.h:199-207)",
         by_version=(("2.9", "ccl avg with an integer datatype (builds against oneCCL < 2021.15: div_ on an integer "
                             "tensor, which fails)"),
                     ("2.14", "integer AVG reaches onecclAvg with no error (#4145)")),
         unknown="what onecclAvg does with integers: the strategy on every version"),
    Fact("premul_sum", "ReduceOp.PREMUL_SUM (_make_nccl_premul_sum) on all_reduce",
         # native and overridable per torch row: see overridable()
         strategy="multiply by the factor on the device, then SUM (the same bytes on the wire)",
         source="torch <= 2.10: ValueError 'Cannot use ReduceOp.PREMUL_SUM with XCCL' (release/2.10 PGX:161-186, "
                "intel/torch-xpu-ops#1571); 2.11: oneCCL PreMulSum (#1948, merged 2026-01-12) when built against "
                "oneCCL >= 2021.17, on every topology though scale-out oneCCL has none (uxlfoundation/oneCCL#196; "
                "multi-node crash pytorch/torchtitan#2332); reverted by #2913 (2026-03-02); 2.12+: ProcessGroupXCCL "
                "scales the tensor handed to it in place (applyPreMulSumIfNeeded: input.mul_, PGX:85-103, #2903 "
                "merged 2026-03-25) and sends SUM on every topology, also after the reland #3173 (2026-04-20)",
         by_version=(("2.9", "raises ValueError (no PREMUL_SUM)"),
                     ("2.11", "oneCCL PreMulSum on all_reduce, reduce_scatter and reduce, fp16/bf16/fp32/fp64, no "
                              "scale-out guard; ValueError 'PreMulSum requires oneCCL>=2021.17' in builds against "
                              "older oneCCL (release/2.11 xccl.h:29-33, :341-363)"),
                     ("2.12", "input.mul_(factor) on the tensor handed, then SUM, on every topology (#2903); reduce "
                              "raises ValueError"),
                     ("2.13", "all_reduce / reduce_scatter: input.mul_(factor), then SUM (oneCCL never sees "
                              "PREMUL_SUM, PGX:1338,1417,1784,1862,1903); reduce: onecclRedOpCreatePreMulSum when "
                              "built against oneCCL >= 2022.0 (#3173), else ValueError")),
         build="torch 2.11: oneCCL >= 2021.17 at build time; 2.13+ reduce: oneCCL >= 2022.0 at build time",
         unknown="torch 2.11 with an unknown build oneCCL: no override (it could raise); torch > 2.15: the 2.15 row"),
    Fact("premul_sum_reduce_scatter", "ReduceOp.PREMUL_SUM on reduce_scatter and reduce",
         # overridable on torch 2.11 scale-up: see overridable()
         strategy="multiply a copy of the input by the factor on the device, then SUM (the caller's input is never "
                  "scaled)",
         source="torch 2.12+: reduce_scatter scales its *input* in place (input.mul_ in applyPreMulSumIfNeeded, "
                "PGX:85-103, called at :1784,:1862,:1903 with the caller's tensor, which collective() passes "
                "through, PGX:770-880), so a native reduce_scatter_tensor with PREMUL_SUM would change the "
                "caller's input; reduce: no PreMulSum in oneCCL's Reduce (uxlfoundation/oneCCL#196, open; the "
                "upstream test comments it out, test_c10d_ops_xccl.py:307)",
         by_version=(("2.9", "raises ValueError"),
                     ("2.11", "oneCCL PreMulSum (input left as it is) when built against oneCCL >= 2021.17"),
                     ("2.12", "reduce_scatter: the caller's input scaled in place, then SUM; reduce: ValueError"),
                     ("2.13", "reduce_scatter: the caller's input scaled in place; reduce: oneCCL PreMulSum (build "
                              ">= 2022.0)")),
         build="as premul_sum",
         unknown="never native on reduce: funcoll's reduce goes through all_reduce"),
    Fact("bitwise", "ReduceOp.BAND / BOR / BXOR",
         strategy="all_to_all, reduce each block locally in rank order, all_gather (reduce_scatter: all_to_all + "
                  "local)",
         source="xcclOps maps only MIN/MAX/SUM/PRODUCT/AVG (xccl.h:88-94): ValueError 'Cannot use ReduceOp.BAND "
                "with XCCL' (:233-236, asserted by test_c10d_ops_xccl.py:222-226); oneCCL has no bitwise op "
                "either (onecclRedOp_t = Sum/Prod/Max/Min/Avg, oneCCL 2022.2 types.h:157-167)",
         by_version=(("2.9", "raises ValueError"),)),
    Fact("int_minmax", "ReduceOp.MIN / MAX on integer and bool dtypes", overridable=_BOTH,
         strategy="all_to_all, min/max of each block locally, all_gather (bool: a uint8 count and one compare; "
                  "reduce_scatter: all_to_all + local)",
         source="int64 MAX over [-1, 0] returned a wrong result on Arc B60 (intel/torch-xpu-ops#3059: closed, "
                "resolution and fixed version not found); torch maps MIN/MAX to onecclMin/Max for int8, uint8, "
                "int32, int64 and bool with no gate; verl routes its integer MAX through a CPU group (seed 002)",
         by_version=(("2.9", "handed to oneCCL"),),
         unknown="which oneCCL fixes #3059: the strategy until a fixed version is cited"),
    Fact("dtypes_16_unsigned", "int16, uint16, uint32, uint64",
         strategy="moved as raw bits of a same-width dtype; reduced as the signed dtype (sign bit flipped "
                  "for MIN/MAX) or widened int16 -> int32",
         source="xcclDatatypes has no kShort/kUInt16/kUInt32/kUInt64 (xccl.h:96-111): TypeError 'Input tensor "
                "data type is not supported for XCCL process group' (:184-189); oneCCL 2022.x has uint32/uint64 "
                "(types.h:131-147), so those two are a gap of torch's map only; int16/uint16 are absent in oneCCL "
                "too",
         by_version=(("2.9", "raises TypeError"),),
         unknown="torch may add uint32/uint64 to its map without notice; funcoll keeps the strategy"),
    Fact("float8", "float8 dtypes",
         strategy="moved as a uint8 view (no copy); reductions are a TypeError in funcoll's semantics",
         source="float8 e4m3fn/e5m2/e4m3fnuz/e5m2fnuz map to ccl uint8 for non-reducing ops (xccl.h:106-110); "
                "reductions raise 'Float8 dtypes are not currently supported for XCCL reductions' (:179-183); no "
                "float8_e8m0fnu (the mx fact)",
         by_version=(("2.9", "moved as uint8; reductions raise"),)),
    Fact("mx", "the two halves of an MX tensor: float8_e8m0fnu (scales) and float4_e2m1fn_x2 (packed fp4 pairs)",
         strategy="moved as their uint8 view from the first step, every local copy a uint8 one (torch 2.9 copies no "
                  "float4_e2m1fn_x2); reductions are a TypeError in funcoll's semantics",
         source="intel/torch-xpu-ops#5240 (merged 2026-09-18) maps both to onecclUint8 for non-reducing ops, as the "
                "fp8 types already are; before it neither is in xcclDatatypes (xccl.h:96-111 at ab84f925, release/2.14 "
                "at a4c530f0): TypeError 'Input tensor data type is not supported for XCCL process group' (:184-189); "
                "funcoll hands XCCL their uint8 view on every version: the bytes and the one call #5240 makes",
         by_version=(("2.9", "raises TypeError (not in xcclDatatypes)"),
                     ("2.15", "unknown: onecclUint8 for moves if torch's torch-xpu-ops pin includes #5240, else "
                              "TypeError")),
         unknown="which torch first pins a torch-xpu-ops with #5240: it merged on 2026-09-18, the last pin updates "
                 "found are of 2026-09-09 and 2026-09-14 (pytorch/pytorch#196387, #196932), torch 2.15's branch was "
                 "cut on 2026-10-05 (pytorch/pytorch#196028); funcoll needs no answer: its uint8 view is what #5240 "
                 "sends, on every version"),
    Fact("uneven_all_to_all", "all_to_all_single with split sizes", overridable=_BOTH,
         strategy="world 2: one pairwise round; above it one carried exchange: an even all_to_all of chunks headed "
                  "by every rank's split statistics, the rows above the chunk as one group of send/recv "
                  "(funcoll/algorithms/planner.py a2a_plan; one small agreement only on a row size's first call)",
         source="torch 2.9/2.10 call ccl::alltoallv (release/2.10 PGX:2295,2387); from 2.11 "
                "(https://github.com/intel/torch-xpu-ops/pull/2803, merged 2026-02-06) non-uniform splits are one "
                "group of send/recv per rank on the v1 and v2 paths (xccl.cpp:211-282): n-1 messages each way, no "
                "collective; onecclAllToAllV (https://github.com/intel/torch-xpu-ops/pull/5057, oneCCL 2022.2) is "
                "an open PR as of 2026-08-21, used only where torch was built against headers that declare it and "
                "only for contiguous displacements. https://github.com/intel/torch-xpu-ops/issues/3021 (open, Arc "
                "Pro B60, torch 2.9): the eager dist.all_to_all_single without split sizes corrupted data while "
                "the functional one (which passes split sizes: ccl::alltoallv on 2.9) was right",
         by_version=(("2.9", "ccl::alltoallv"),
                     ("2.11", "one grouped send/recv (uniform splits: native all_to_all)"),
                     ("2.15", "one grouped send/recv; onecclAllToAllV if the torch-xpu-ops pin includes #5057 and "
                              "the build's oneCCL headers declare it (XCCL_HAS_ALLTOALLV)")),
         build="#5057 would use onecclAllToAllV only when torch is built against oneCCL headers that declare it "
               "(XCCL_HAS_ALLTOALLV, oneCCL 2022.2) and only for contiguous displacements",
         unknown="whether torch 2.15 includes #5057 (native only by the override until a release is cited); "
                 "whether #3021's corruption of the even all_to_all, which the carried exchange uses, persists past "
                 "torch 2.9 on B60: no maintainer statement found"),
    Fact("all_reduce_coalesced", "one tuple all_reduce of several tensors",
         strategy="one flat buffer per dtype, one all_reduce each",
         source="allreduce_coalesced requires identical dtypes ('Tensors must have identical type', "
                "checkTensorOnSameDevice PGX:105-126); funcoll's tuple path does not group by dtype",
         by_version=(("2.9", "identical dtypes only"),)),
    # -- facts funcoll's strategies respect on every version (they switch no plan) ------------------------
    Fact("graph_capture", "XPU graph capture of XCCL collectives", info=True,
         strategy="every strategy runs on the device with no host synchronisation, so a captured graph can hold it, "
                  "but the carried uneven all_to_all above world 2, which reads 9 int64 per rank of the previous "
                  "exchange's headers on the host to plan the next: under funcoll.xla.static_split_bound it reads "
                  "nothing",
         source="#2992: capturing is allowed only with oneCCL >= 2022.0.0 found at run time (onecclGetVersion), "
                "else NotImplementedError 'Capturing XCCL collectives is only allowed with oneCCL >= 2022.0.0' "
                "(PGX:150-168, checked in collective() at :786, :937)",
         by_version=(("2.9", "not supported (no capture check before #2992)"),
                     ("2.13", "allowed with oneCCL >= 2022.0.0 at run time")),
         unknown="oneCCL unknown at run time: whether capture is allowed is unknown"),
    Fact("nan_check", "TORCH_XCCL_NAN_CHECK (or _set_enable_nan_check): a device assert on NaN in any buffer sent",
         info=True,
         strategy="no buffer funcoll sends holds undefined bytes: padding and scratch that are sent are written "
                  "first (zeros or results), only receive buffers are left uninitialised",
         source="PGX:396 (default off), checkForNan on every input of collective() (PGX:868-870), on the root only "
                "for broadcast and scatter (:1303, :1457, :1485), on send (:1024); NanCheck_XPU.cpp",
         by_version=(("2.9", "checks the inputs of every collective when enabled"),)),
    Fact("oneccl_api", "which oneCCL API ProcessGroupXCCL uses", info=True,
         strategy="nothing depends on it in funcoll; the oneCCL version is read with get_xccl_version()",
         source="2.11-2.13: the v1 C++ API by default, the v2 C API with USE_CCL_V2=1 (release/2.13 xccl.h:77-90); "
                "2.14+: the v1 API removed, USE_CCL_V2 gone (#4145, merged 2026-07-10)",
         by_version=(("2.9", "the oneCCL C++ API (v1)"),
                     ("2.11", "v1 by default, v2 (C API) with USE_CCL_V2=1"),
                     ("2.14", "the C API only"))),
    Fact("send_recv", "single send/recv", info=True,
         strategy="uneven all_to_all's pairwise rounds are single sends and receives, ordered so that no cycle "
                  "of ranks all send first",
         source="#3071 (merged 2026-04-08): a single send or recv is wrapped in onecclGroupStart/End",
         by_version=(("2.9", "plain send/recv"),
                     ("2.12", "each wrapped in a group call"))),
)

# OPEN REPORTS: a native request seen going wrong upstream, with no fixed oneCCL named by a maintainer. While one
# covers the stack, derive() takes the strategy for that fact even where its gate passes, unless the live group's
# probe (funcoll.probe.run) verified the request or FUNCOLL_XPU_OVERRIDE says native.
@dataclass(frozen=True)
class Report:
    """One open upstream report. ``gpus``: a regular expression over the device name (None: any GPU; an unknown name
    is covered); ``fixed_in``: the first oneCCL with the fix, once a maintainer names one (None: every version)."""

    ref: str
    facts: Tuple[str, ...]
    topologies: Tuple[str, ...]
    gpus: Optional[str]
    seen: str
    what: str
    fixed_in: Optional[Version] = None

    def covers(self, fact: str, topology: str, oneccl: Optional[Version], gpu: Optional[str]) -> bool:
        return (fact in self.facts and topology in self.topologies
                and (self.fixed_in is None or oneccl is None or oneccl < self.fixed_in)
                and (self.gpus is None or not gpu or re.search(self.gpus, gpu) is not None))


OPEN_REPORTS: Tuple[Report, ...] = (
    Report("intel/torch-xpu-ops#2361", ("avg", "avg_reduce_scatter"), (SCALE_UP,), None,
           seen="torch 2.10.0.dev20251112+xpu, 4x Data Center GPU Max 1550 on one node, FSDP2",
           what="oneCCL raises 'average operation is not supported for the scheduler path' (coll_param.cpp:455); the "
                "scheduler path is oneCCL's host-driven path, not a GPU's, and FSDP2 sends AVG on reduce_scatter and "
                "all_reduce"),
    Report("intel/torch-xpu-ops#3020", ("avg",), (SCALE_UP,), r"Arc.*\bB\d{2,3}\b",
           seen="Arc Pro B60 (Arc B-series), container intel/llm-scaler-omni:0.1.0-b6",
           what="all_reduce AVG divided twice at some small sizes; 'fixed in oneAPI 2026.0' is a third-party comment "
                "only (verl-project/verl#7917), no maintainer statement"),
)


def open_reports(fact: str, topology: str, oneccl: Optional[Version], gpu: Optional[str]) -> Tuple[Report, ...]:
    """The :data:`OPEN_REPORTS` that cover ``fact`` on that stack."""
    return tuple(r for r in OPEN_REPORTS if r.covers(fact, topology, oneccl, gpu))


# THE BACKEND CLASS. The facts above are ProcessGroupXCCL's (torch-xpu-ops); ``xccl2`` (pytorch/pytorch#194761, open
# RFC, 2026-08-25: torchcomms' XCCL backend in c10d on oneCCL's v2 C API; funcoll expects class ProcessGroupXCCL2; see
# docs/xpu.md) has XCCL2_FACTS, read from XCCL2_SOURCE: TCX = TorchCommXCCL.cpp, TCXU = TorchCommXCCLUtils.cpp. Any
# other class takes the conservative row.
XCCL_CLASS, XCCL2_CLASS = "ProcessGroupXCCL", "ProcessGroupXCCL2"
BACKEND_LABELS = {XCCL_CLASS: "xccl", XCCL2_CLASS: "xccl2"}
XCCL2_SOURCE = "meta-pytorch/torchcomms comms/torchcomms/xccl at 59426ba4 (2026-08-21)"


def _xccl2(key: str, does: str, overridable: Tuple[str, ...] = _NEVER, *, source: str, always: bool = False,
           what: Optional[str] = None) -> Fact:
    """xccl2's fact ``key``: the request (unless ``what``) and funcoll's strategy are ProcessGroupXCCL's; ``does``: what
    xccl2 does, on every torch."""
    fact = XCCL_FACTS[key]
    return Fact(key, what or fact.what, fact.strategy, source, (("2.9", does),), overridable=overridable, always=always)


XCCL2_FACTS = table(
    "torch", lambda fact: "the strategy is used",
    _xccl2("avg", "SUM, then tensor.div_(group size)", _BOTH, always=True,
           source="all_reduce turns AVG into SUM and divides the result in place by the group size (TCX:860-907, "
                  "'AVG issue: uxlfoundation/oneCCL#195'): onecclAvg is never called, so the open AVG reports "
                  "(oneCCL's avg) do not apply; the sum is in the tensor's dtype"),
    _xccl2("avg_reduce_scatter", "SUM, then output.div_(group size)", _BOTH, always=True,
           source="reduce_scatter, reduce_scatter_single and reduce_scatter_v: SUM, then output.div_(group size) "
                  "(TCX:1234-1279, 1327-1396, 1438-1478)"),
    _xccl2("avg_reduce", "SUM, then div_ on the root", _BOTH, always=True,
           source="reduce: SUM, then the root divides by the group size (TCX:943-988)"),
    _xccl2("avg_int", "SUM in the tensor's dtype, then div_(rounding_mode='trunc')",
           source="integer AVG is SUM in the tensor's own dtype, then a truncating div_ (TCX:892-907): "
                  "int8/uint8/int32 sums overflow where funcoll sums in int64"),
    _xccl2("premul_sum", "tensor.mul_(factor), then SUM", _BOTH, always=True,
           what="ReduceOp.PREMUL_SUM on all_reduce",
           source="all_reduce multiplies the tensor it is handed (its output) by the factor, then SUM "
                  "(applyPreMulFactor, TCX:81-84, 860-872, 'PREMUL_SUM issue: uxlfoundation/oneCCL#196'): oneCCL's "
                  "PreMulSum (RedOpRAII, TCXU:64-103) is never reached from a collective; an integer tensor raises "
                  "in mul_"),
    _xccl2("premul_sum_reduce_scatter", "input.clone().mul_(factor), then SUM", _BOTH, always=True,
           source="reduce_scatter, reduce_scatter_single, reduce_scatter_v and reduce scale a clone of the input, "
                  "then SUM (getMaybeScaledInputsAndNewOp, TCX:86-113): the caller's input is left as it is"),
    _xccl2("bitwise", "raises std::runtime_error",
           source="getXcclReduceOp raises 'Unsupported BAND reduce operation' (and BOR, BXOR) (TCXU:136-165)"),
    _xccl2("int_minmax", "handed to oneCCL", _BOTH,
           source="onecclMin/onecclMax for every dtype (TCXU:145-148): the oneCCL of intel/torch-xpu-ops#3059"),
    _xccl2("dtypes_16_unsigned", "raises std::runtime_error",
           source="getXcclDataTypeInternal maps float32/64, float16, bfloat16, int32/64, int8, uint8 and bool (as "
                  "uint8) only, else 'Unsupported tensor data type for XCCL' (TCXU:14-37)"),
    _xccl2("float8", "raises std::runtime_error, also on moves",
           source="no float8 dtype in the map, for moves too (TCXU:14-37): funcoll moves float8 as uint8 itself"),
    _xccl2("mx", "raises std::runtime_error, also on moves",
           source="neither float8_e8m0fnu nor float4_e2m1fn_x2 is in the map (TCXU:14-37): funcoll moves both as "
                  "uint8 itself"),
    _xccl2("uneven_all_to_all", "one group of send/recv", _BOTH,
           source="all_to_all_v_single: one onecclGroupStart/End of send/recv, the own block copied "
                  "(TCX:1548-1711), the grouped path of ProcessGroupXCCL 2.11+ (intel/torch-xpu-ops#3021 open)"),
    _xccl2("all_reduce_coalesced", "unknown",
           source="TorchCommXCCL has no coalesced all_reduce; what the c10d port does is unknown"),
    Fact("send_recv", "batch_isend_irecv", info=True,
         strategy="nothing switches on it",
         source="batch_op_issue issues every send before any receive in one group (TCX:680-790, #2885)",
         by_version=(("2.9", "sends first within a group"),)),
)

def backend_class(backend=None) -> str:
    """The class name of the XPU backend that will run the calls: ``backend`` may be None (ProcessGroupXCCL: what a
    funcoll group creates), a label (``"xccl"``, ``"xccl2"``), a class name, a class or a backend object."""
    if backend is None:
        return XCCL_CLASS
    if isinstance(backend, str):
        by_label = {label: cls for cls, label in BACKEND_LABELS.items()}
        return by_label.get(backend.strip().lower(), backend.strip())
    return (backend if isinstance(backend, type) else type(backend)).__name__


def fact_table(backend=None) -> Dict[str, Fact]:
    """XCCL2_FACTS for xccl2, else XCCL_FACTS (any class but ProcessGroupXCCL reads them as the conservative row)."""
    return XCCL2_FACTS if backend_class(backend) == XCCL2_CLASS else XCCL_FACTS


def overridable(key: str, row: Optional[str], build: Optional[Version], backend=None) -> Tuple[str, ...]:
    """The topologies on which ``FUNCOLL_XPU_OVERRIDE`` may flip fact ``key`` on torch ``row`` built against oneCCL
    ``build`` (None: unknown), for ``backend`` (default ProcessGroupXCCL); :func:`_override_rule` says why not."""
    return _override_rule(key, row, build, SCALE_OUT, backend_class(backend))[0]


def _override_rule(key: str, row: Optional[str], build: Optional[Version], topology: str,
                   cls: str = XCCL_CLASS) -> Tuple[tuple, str]:
    """(:func:`overridable`, why the fact cannot be flipped on ``topology`` where it cannot)."""
    if cls not in BACKEND_LABELS:
        return _NEVER, f"cannot be overridden on {cls} (an XPU backend funcoll has no facts for: the conservative row)"
    fact = fact_table(cls)[key]
    if cls == XCCL_CLASS and key in ("premul_sum", "premul_sum_reduce_scatter") and row is not None:
        if row_key(row) < (2, 11):
            return _NEVER, f"cannot be overridden on torch {row} (ProcessGroupXCCL raises on PREMUL_SUM)"
        if row == "2.11":  # the only row in which oneCCL's own PreMulSum is used for all_reduce / reduce_scatter
            if build is None or build < _PREMUL_BUILD_2_11:
                built = ".".join(map(str, build)) if build else "an unknown oneCCL"
                return _NEVER, (f"cannot be overridden on torch 2.11 built against {built} (PreMulSum needs oneCCL >= "
                                f"2021.17 at torch's build time; set {ENV_ONECCL_BUILD_VERSION})")
            return (SCALE_UP,), "cannot be overridden on the scale-out path (oneCCL has PreMulSum on scale-up only)"
        if key == "premul_sum":
            return _BOTH, ""
        return _NEVER, f"cannot be overridden on torch {row} (ProcessGroupXCCL would scale the caller's input in place)"
    if fact.info:
        return _NEVER, "is not a switch (funcoll's strategies respect it on every version)"
    if fact.overridable:
        return fact.overridable, (f"cannot be overridden on the {topology} path (the library has it on "
                                  f"{', '.join(fact.overridable)} only)")
    return _NEVER, "cannot be overridden (the library has no native path)"


# -- capabilities ------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class XcclCapabilities(VersionedCapabilities):
    """:func:`derive`'s capabilities, plus ``unverified``: the same with the facts only an open report keeps off the
    native path made native (None when there are none), whose extra requests :func:`funcoll.probe.run` verifies."""

    unverified: Optional[Capabilities] = field(default=None, compare=False)


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


_OVERRIDE_WORDS = {**dict.fromkeys(("native", "on", "1", "true"), True),
                   **dict.fromkeys(("strategy", "off", "0", "false", "broken"), False)}


def parse_override(override, topology: str = SCALE_OUT, torch_version=None,
                   oneccl_build=None, backend=None) -> Dict[str, bool]:
    """``"avg=strategy, int_minmax=native"`` -> {"avg": False, "int_minmax": True}; a fact that is unknown or cannot
    be flipped on ``topology`` (for this torch, build oneCCL and backend) is a ValueError naming the valid ones."""
    if not override:
        return {}
    if isinstance(override, Mapping):
        items = list(override.items())
    else:
        parts = [p.strip() for p in str(override).split(",") if p.strip()]
        for part in parts:
            if "=" not in part:
                raise ValueError(f"funcoll.xpu: override entry {part!r} must be <fact>=native or <fact>=strategy")
        items = [(k.strip(), v.strip()) for k, v in (p.split("=", 1) for p in parts)]
    row, build, cls = torch_row(torch_version), _version(oneccl_build), backend_class(backend)
    facts = fact_table(cls)
    out = {}
    allowed = sorted(k for k in facts if topology in _override_rule(k, row, build, topology, cls)[0])
    for key, val in items:
        topologies, why = _override_rule(key, row, build, topology, cls) if key in facts else ((), "is not a fact")
        if topology not in topologies:
            raise ValueError(f"funcoll.xpu: override {key!r} {why}; overridable facts on {topology}: "
                             f"{', '.join(allowed) or 'none'}")
        flip = val if isinstance(val, bool) else _OVERRIDE_WORDS.get(str(val).lower())
        if flip is None:
            raise ValueError(f"funcoll.xpu: override {key}={val!r}: use {key}=native or {key}=strategy")
        out[key] = flip
    return out


def _build(native: Callable[[str], bool], name: str, sources: Dict[str, str], versions: Dict[str, str],
           premul_on_reduce: bool = False, unverified: Optional[Capabilities] = None,
           lists: bool = False) -> XcclCapabilities:
    """The capabilities whose facts ``native(key)`` says are native. ``premul_on_reduce`` (xccl2): PREMUL_SUM on reduce
    follows ``premul_sum_reduce_scatter``, else never (oneCCL's Reduce has no PreMulSum). ``lists``: the list forms
    serve a size per rank (ProcessGroupXCCL::allgather / ::reduce_scatter: one _broadcast_oop / _reduce_oop per rank
    when the sizes differ; intel/torch-xpu-ops src/xccl/ProcessGroupXCCL.cpp, release/2.9 to 2.14 and main ab84f925)."""
    reduce_ops = {ReduceOp.SUM, ReduceOp.PRODUCT, ReduceOp.MIN, ReduceOp.MAX}
    ints = _XCCL_DTYPES - FLOAT_DTYPES  # integers and bool
    refused = {(ReduceOp.AVG, d) for d in ints}  # avg_int
    refused_on = set()
    # AVG and PREMUL_SUM: native per primitive, each by its own facts
    for op, on_ar, on_rs, on_reduce in (
            (ReduceOp.AVG, native("avg"), native("avg_reduce_scatter"), native("avg_reduce")),
            (ReduceOp.PREMUL_SUM, native("premul_sum"), native("premul_sum_reduce_scatter"),
             native("premul_sum_reduce_scatter") and premul_on_reduce)):
        if on_ar or on_rs or on_reduce:
            reduce_ops.add(op)
            refused_on |= {(p, op) for p, ok in (("all_reduce", on_ar), ("reduce_scatter", on_rs),
                                                 ("reduce", on_reduce)) if not ok}
            if op is ReduceOp.PREMUL_SUM:  # fp16/bf16/fp32/fp64 (unpackPreMulSum; mul_ on the tensor from 2.12)
                refused |= {(ReduceOp.PREMUL_SUM, d) for d in ints}
        elif op is ReduceOp.AVG:
            refused_on.add(("reduce", ReduceOp.AVG))
    if not native("int_minmax"):
        refused |= {(op, d) for op in (ReduceOp.MIN, ReduceOp.MAX) for d in ints}
    return XcclCapabilities(
        name=name, sources=sources, versions=versions, unverified=unverified,
        primitives=frozenset(set(PRIMITIVES) - {"all_reduce_coalesced"}), reduce_ops=frozenset(reduce_ops),
        dtypes=_XCCL_DTYPES, reduce_dtypes=_XCCL_DTYPES,
        refused_pairs=frozenset(refused), refused_on=frozenset(refused_on),
        uneven_all_to_all=native("uneven_all_to_all"), uneven_all_gather=lists, uneven_reduce_scatter=lists)


def derive(torch_version, oneccl_version, override=None, topology=None, oneccl_build=None, backend=None,
           gpu: Optional[str] = None) -> XcclCapabilities:
    """The XCCL capabilities of a stack, a pure function of its inputs (docs/xpu.md, "Capability table"). None means
    unknown and takes the safe side: no fact gated on it native, scale-out, no override that needs the build oneCCL,
    every GPU-specific open report; a backend class (:func:`backend_class`) with no facts gets the conservative row."""
    row, ov, build = torch_row(torch_version), _version(oneccl_version), _version(oneccl_build)
    topo, cls = parse_topology(topology), backend_class(backend)
    flips = parse_override(override, topo, torch_version, oneccl_build, cls)
    facts = fact_table(cls)
    gpu = gpu.strip() if gpu and gpu.strip() else None

    def gate(key: str) -> bool:
        """The fact's own rule (torch row, oneCCL version, topology), before reports and overrides."""
        fact = facts[key]
        if fact.info or cls not in BACKEND_LABELS:
            return False
        if fact.always:
            return True
        if cls == XCCL_CLASS and key == "premul_sum":  # the torch row decides: ProcessGroupXCCL's own scale + SUM
            return row is not None and row_key(row) >= (2, 12)
        since = fact.native_since if topo == SCALE_UP else fact.scale_out_since
        return since is not None and ov is not None and ov >= since

    reports = {k: open_reports(k, topo, ov, gpu) for k in facts if cls == XCCL_CLASS and gate(k) and k not in flips}
    reports = {k: r for k, r in reports.items() if r}

    def native(key: str) -> bool:
        return flips[key] if key in flips else gate(key) and key not in reports

    def why(key: str) -> str:
        """What keeps fact ``key`` on its strategy beyond the table: an unknown backend class, open reports."""
        if cls not in BACKEND_LABELS:
            return f"{cls} is an XPU backend funcoll has no facts for (the conservative row)"
        if key not in reports:
            return ""
        many = len(reports[key]) > 1
        return (f"open report{'s' if many else ''} {', '.join(r.ref for r in reports[key])} "
                f"cover{'' if many else 's'} this stack ({topo}, oneCCL {version_text(ov)}, GPU {gpu or 'unknown'}): "
                f"native once funcoll.probe verifies it on the live group, or with {ENV_OVERRIDE}={key}=native")

    capture = ("unknown (not read for this backend)" if cls != XCCL_CLASS else
               "unknown (torch version unknown)" if row is None else
               "not supported before torch 2.13" if row_key(row) < (2, 13) else
               "unknown (oneCCL unknown at run time)" if ov is None else
               "allowed" if ov >= (2022, 0) else "refused (NotImplementedError): oneCCL < 2022.0")
    tstr = row or "?"
    name = f"{BACKEND_LABELS.get(cls, f'xpu:{cls}')}[torch {tstr}, oneCCL {version_text(ov)}, {topo}]"
    sources = {f"xccl.{k}": label(f, native(k), why(k)) for k, f in facts.items()}
    versions = {"torch": tstr, "oneccl": version_text(ov), "oneccl_build": version_text(build), "topology": topo,
                "graph_capture": capture, "backend": cls, "gpu": gpu or "unknown"}
    xccl2, lists = cls == XCCL2_CLASS, cls == XCCL_CLASS
    unverified = (_build(lambda k: native(k) or k in reports, name + "+unverified", sources, versions, xccl2,
                         lists=lists) if reports else None)
    return _build(native, name, sources, versions, xccl2, unverified, lists)


def conservative_profile(torch_version=None) -> Capabilities:
    """``PROFILES["xccl"]`` (what ``FUNCOLL_PROFILE=xccl`` imposes on another transport): :func:`derive`'s row for the
    running torch (or ``torch_version``) with an unknown oneCCL on the scale-out path, plus the float8 dtypes XCCL moves
    as bytes (not float8_e8m0fnu: the mx fact)."""
    d = derive(torch.__version__ if torch_version is None else torch_version, None, "", None)
    return d.plain(name="xccl", dtypes=d.dtypes | (FLOAT8 - MX),
                   sources={**d.sources,
                            "xccl.fp8": "fp8 reductions raise (docs/design.md section 1); fp8 is moved as bytes"})


# -- reading the running stack (guarded; never touches the XPU runtime) ------------------------------------------------
def _version_of(read: Callable[[], object]) -> Optional[str]:
    """``read()`` when it gives a version (text that starts with a digit), else None (also when it raises)."""
    try:
        v = read()
    except Exception:
        return None
    return v if isinstance(v, str) and v[:1].isdigit() else None


def _oneccl_from_torch() -> Optional[str]:
    """onecclGetVersion of the oneCCL library loaded (xccl.h:71-84), in XPU builds of torch."""
    return _version_of(lambda: C.get_xccl_version())  # type: ignore[attr-defined]


def _oneccl_from_metadata() -> Optional[str]:
    """The pip ``oneccl`` package torch's XPU wheels depend on (torch 2.9: oneccl==2021.16.1)."""
    return _version_of(lambda: metadata.version("oneccl"))


def _oneccl_from_flight_recorder() -> Optional[str]:
    """The oneCCL version ProcessGroupXCCL records in its flight recorder when created (empty when it is off)."""
    return _version_of(lambda: pickle.loads(C._dump_xccl_trace()).get("comm_lib_version"))  # type: ignore[attr-defined]


def _oneccl_pinned_by_torch() -> Optional[str]:
    """The ``oneccl==X`` pin in the installed torch wheel's Requires-Dist (stock XPU wheels have one)."""
    pin = re.compile(r"\s*oneccl\s*==\s*([0-9.]+)")
    return _version_of(lambda: next((m.group(1) for m in map(pin.match, metadata.requires("torch") or ()) if m), None))


def stack_versions(backend_created: bool = False) -> Tuple[str, Optional[str], str]:
    """(torch version, oneCCL version found at run time or None, where it came from)."""
    sources = [(lambda: os.environ.get(ENV_ONECCL_VERSION, "").strip(), ENV_ONECCL_VERSION),
               (_oneccl_from_torch, "torch._C._distributed_c10d.get_xccl_version()"),
               (_oneccl_from_metadata, "pip metadata of package 'oneccl'")]
    if backend_created:
        sources.append((_oneccl_from_flight_recorder, "ProcessGroupXCCL flight recorder"))
    for read, where in sources:
        v = read()
        if v:
            return torch.__version__, v, where
    return torch.__version__, None, "unknown (conservative: every version-gated fact uses its strategy)"


def build_version() -> Tuple[Optional[str], str]:
    """(the oneCCL torch was built against, or None, where it came from): ``FUNCOLL_ONECCL_BUILD_VERSION``, else the
    torch wheel's own ``oneccl==`` requirement, else unknown."""
    env = os.environ.get(ENV_ONECCL_BUILD_VERSION, "").strip()
    if env:
        return env, ENV_ONECCL_BUILD_VERSION
    v = _oneccl_pinned_by_torch()
    if v:
        return v, "the torch wheel's Requires-Dist pin"
    return None, "unknown (no override that needs it is allowed)"


def capabilities(profile: Optional[str] = None, *, torch_version=None, oneccl_version=None, override=None,
                 topology=None, oneccl_build=None, backend=None, gpu: Optional[str] = None,
                 _backend_created: bool = False) -> XcclCapabilities:
    """:func:`derive` of the running stack, each input unless given read as docs/xpu.md says ("Reading the stack");
    ``profile`` (default ``FUNCOLL_PROFILE``) names a capability profile to intersect with."""
    torch_version = torch.__version__ if torch_version is None else torch_version
    oneccl_version, src = stack_versions(_backend_created)[1:] if oneccl_version is None else (oneccl_version, "given")
    oneccl_build, build_src = build_version() if oneccl_build is None else (oneccl_build, "given")
    override = os.environ.get(ENV_OVERRIDE, "") if override is None else override
    topo_src = "given"
    if topology is None:
        topology = os.environ.get(ENV_TOPOLOGY, "").strip() or None
        topo_src = ENV_TOPOLOGY if topology else "unknown: scale-out assumed (every path has it)"
    caps = derive(torch_version, oneccl_version, override, topology, oneccl_build, backend, gpu)
    name = profile if profile is not None else active_profile_name()
    if name:
        restricted = _named_profile(name)
        caps = replace(caps.restrict(restricted),
                       unverified=caps.unverified.restrict(restricted) if caps.unverified is not None else None)
    given = "default" if backend is None else "the backend that runs the calls"
    return replace(caps, sources={**caps.sources,
                                  "xccl.version": f"oneCCL {caps.versions['oneccl']} ({src})",
                                  "xccl.build": f"oneCCL {caps.versions['oneccl_build']} at build time ({build_src})",
                                  "xccl.topology": f"{caps.versions['topology']} ({topo_src})",
                                  "xccl.capture": f"graph capture: {caps.versions['graph_capture']}",
                                  "xccl.backend": f"{caps.versions['backend']} ({given})",
                                  "xccl.gpu": f"GPU {caps.versions['gpu']}"})


def measure_topology(store, rank: int, size: int, timeout=None) -> str:
    """scale-up when every rank of the group runs on this host, else scale-out: each rank publishes its host name in
    the group's store and reads the others' (a collective over the store, bounded by the store's timeout)."""
    host = socket.gethostname()
    store.set(f"funcoll-topology/{rank}", host)
    keys = [f"funcoll-topology/{r}" for r in range(size)]
    store.wait(keys, *([timeout] if timeout is not None else []))
    hosts = {store.get(k).decode() for k in keys}
    return SCALE_UP if hosts == {host} else SCALE_OUT


# -- what funcoll cannot fix, and warns about --------------------------------------------------------------------------
# The variables torch's allocator configuration reads, in its order of precedence (the first one set wins): torch 2.9
# reads PYTORCH_ALLOC_CONF, then PYTORCH_CUDA_ALLOC_CONF, then PYTORCH_HIP_ALLOC_CONF (c10/core/AllocatorConfig.cpp,
# AcceleratorAllocatorConfig::instance; the names in 2.9.0's libc10.so); torch 2.15 reads PYTORCH_CUDA_ALLOC_CONF,
# PYTORCH_HIP_ALLOC_CONF, then PYTORCH_ALLOC_CONF (measured with torch._C._accelerator_getAllocatorSettings). XPU's
# caching allocator takes c10's shared configuration (c10/xpu/XPUCachingAllocator.h includes c10/core/
# AllocatorConfig.h) and has expandable segments from torch 2.10 (pytorch/pytorch#166292); neither torch reads a
# PYTORCH_XPU_ALLOC_CONF.
ALLOC_CONF_VARS = ("PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_HIP_ALLOC_CONF")
_EXPANDABLE = re.compile(r"expandable_segments\s*:\s*(True|False)")
_warned_expandable = False


def expandable_segments() -> Optional[Tuple[str, str]]:
    """``(where, settings)`` when the XPU caching allocator runs with expandable segments: the allocator settings
    torch itself read (``torch._C._accelerator_getAllocatorSettings()``, torch >= 2.10; the last
    ``expandable_segments`` entry counts, as torch parses them) and the variable they came from (or "set at run time"
    for ``torch._C._accelerator_setAllocatorSettings``); None when they are off, and on a torch without the call
    (2.9, whose XPU allocator has no expandable segments). Reads the environment only through torch."""
    try:
        settings = torch._C._accelerator_getAllocatorSettings()  # type: ignore[attr-defined]
    except Exception:  # also torch 2.9, which has no such call
        return None
    found = _EXPANDABLE.findall(settings or "")
    if not found or found[-1] != "True":
        return None
    where = " and ".join(v for v in ALLOC_CONF_VARS if os.environ.get(v) == settings) or "set at run time"
    return where, settings


def warn_expandable_segments() -> bool:
    """Warns once per process when :func:`expandable_segments` is on (each XPU transport asks when it is made); whether
    it warned now."""
    global _warned_expandable
    on = None if _warned_expandable else expandable_segments()
    if on is None:
        return False
    _warned_expandable = True
    where, settings = on
    how = (f"torch._C._accelerator_setAllocatorSettings({settings!r})" if where == "set at run time" else
           f"{where}={settings}")
    warnings.warn(
        f"funcoll: the XPU caching allocator runs with expandable segments ({how}); on Intel GPUs they "
        f"have ended large XCCL all_reduces in UR_RESULT_ERROR_DEVICE_LOST and hung FSDP2 (intel/torch-xpu-ops#4427, "
        f"open: Arc Pro B70 with the DLE 2026.1 runtime, not seen with DLE 2025.3). funcoll cannot fill this; if you "
        f"see either, run without expandable_segments (docs/xpu.md, \"What funcoll cannot fix\")",
        RuntimeWarning, stacklevel=3)
    return True


# -- the transport -----------------------------------------------------------------------------------------------------
class XcclTransport(C10dTransport):
    """C10dTransport over a c10d XCCL backend, with small control tensors (e.g. uneven all_to_all's split sizes) on
    the group's XPU device, never staged through the host, and the barrier bound to that device. The first one made in
    a process warns when the XPU allocator runs with expandable segments (:func:`warn_expandable_segments`)."""

    def __init__(self, backend, caps: Capabilities, device=None, device_type: str = "xpu"):
        super().__init__(backend, caps, device_type)
        self._device = torch.device(device) if device is not None else None
        warn_expandable_segments()

    @property
    def control_device(self) -> torch.device:
        device = self._device
        if device is None or (device.type == "xpu" and device.index is None):
            device = self._device = torch.device("xpu", torch.xpu.current_device())
        return device

    def _barrier(self):
        options = C.BarrierOptions()
        device = self.control_device
        if device.type == "xpu":
            options.device_ids = [device.index]
        return self.backend.barrier(options)


def _xccl_class():
    # stock torch wheels ship ProcessGroupXCCL from 2.8 (docs/design.md section 1); source builds with USE_XCCL=1 from
    # 2.7 (huggingface/accelerate#3401)
    cls = getattr(dist, "ProcessGroupXCCL", None)
    available = getattr(dist, "is_xccl_available", lambda: False)
    if cls is None or not available():
        raise RuntimeError(
            f"funcoll: XPU tensors need torch's XCCL backend (torch.distributed.is_xccl_available() is False "
            f"in torch {torch.__version__}); use an XPU build of torch >= 2.8 (pip install torch --index-url "
            f"https://download.pytorch.org/whl/xpu)")
    return cls


def _funcoll_xpu(ctx: GroupContext) -> XcclTransport:
    """A ProcessGroupXCCL of its own for one funcoll group (every rank of the group creates it)."""
    topology = os.environ.get(ENV_TOPOLOGY, "").strip() or measure_topology(
        dist.PrefixStore("funcoll-xccl-topology/", ctx.store), ctx.rank, ctx.size, ctx.timeout)
    cls, store = _xccl_class(), dist.PrefixStore("funcoll-xccl/", ctx.store)
    opts = cls.Options()  # as torch makes an xccl group's backend (distributed_c10d.py, 2.9: 2043-2049; 2.15: 928-937)
    opts.global_ranks_in_group = list(ctx.global_ranks)
    opts.group_name = f"funcoll-{ctx.name}"
    opts._timeout = ctx.timeout
    backend = cls(store, ctx.rank, ctx.size, opts)
    return XcclTransport(backend, capabilities(topology=topology, backend=backend, gpu=_gpu_name(None),
                                               _backend_created=True), None)


def _gpu_name(device) -> Optional[str]:
    """The XPU's name (``torch.xpu.get_device_name``), None when it cannot be read."""
    try:
        name = torch.xpu.get_device_name(device)
    except Exception:
        return None
    return name if isinstance(name, str) and name.strip() else None


def _wrapped(backend):
    """The backend that runs the calls: under ``TORCH_DISTRIBUTED_DEBUG=DETAIL`` c10d wraps a group's backend in a
    ``_ProcessGroupWrapper`` (its checks, then the wrapped backend's collective): the wrapped one."""
    while type(backend).__name__ == "_ProcessGroupWrapper" and getattr(backend, "wrapped_pg", None) is not None:
        backend = backend.wrapped_pg
    return backend


def _c10d_xpu(pg, device):
    """The XPU backend of a group made with another backend ("xccl", "xccl2", "cpu:gloo,xpu:xccl"), driven as it is;
    its class (a debug-mode wrapper's wrapped one) picks the fact table."""
    return c10d_leg(pg, "xpu", "XPU", "init_process_group('xccl') or 'cpu:gloo,xpu:xccl' (or backend 'funcoll')",
                    lambda b: isinstance(b, C.Backend), "a c10d Backend on XPU",
                    lambda b: XcclTransport(b, capabilities(backend=_wrapped(b), gpu=_gpu_name(device),
                                                            _backend_created=True), device))


register_device("xpu", funcoll=_funcoll_xpu, c10d=_c10d_xpu)
