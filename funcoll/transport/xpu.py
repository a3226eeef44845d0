"""The XPU transport: funcoll's algorithms over the group's XCCL (oneCCL) c10d backend.

* Primitives: :class:`XcclTransport` is the CPU reference :class:`~funcoll.transport.gloo.C10dTransport` driving a
  ``ProcessGroupXCCL`` instead of a ``ProcessGroupGloo``; tensors are handed to it on the device and stay there.
* Capabilities: derived from the running stack, by :func:`derive`, a pure function of ``(torch version, oneCCL at
  run time, override, topology, oneCCL torch was built against)`` over the fact table :data:`XCCL_FACTS` (the only
  place XCCL facts live, each with its source, per torch version). ``FUNCOLL_PROFILE=<name>`` additionally intersects
  them with a named profile (``FUNCOLL_PROFILE=xccl``: the running torch's row for an unknown oneCCL on the scale-out
  path); ``FUNCOLL_XPU_OVERRIDE="avg=strategy,..."`` flips single facts for a stack known to be broken (or good).
* Groups: a funcoll group gets a ``ProcessGroupXCCL`` of its own, built from the group's store; a group made with
  another backend (``"xccl"``, ``"cpu:gloo,xpu:xccl"``) lends funcoll its XPU backend.

Importing this module never imports or initialises the XPU runtime: nothing here touches ``torch.xpu`` until a
transport is created for an XPU tensor.
"""

from __future__ import annotations

import os
import pickle
import re
from dataclasses import dataclass, replace
from importlib import metadata
from typing import Callable, Dict, Mapping, Optional, Tuple

import torch
import torch._C._distributed_c10d as C

from funcoll.semantics import FLOAT8, ReduceOp
from funcoll.transport import PRIMITIVES, Capabilities, Version, VersionedCapabilities, active_profile_name, in_force
from funcoll.transport import parse_version as _parse_version
from funcoll.transport import profile as _named_profile
from funcoll.transport.gloo import C10dTransport
from funcoll.transport.registry import GroupContext, c10d_leg, register_device

__all__ = ["XCCL_FACTS", "Fact", "XcclCapabilities", "XcclTransport", "derive", "capabilities",
           "stack_versions", "build_version", "parse_override", "parse_topology", "measure_topology", "torch_row",
           "ENV_OVERRIDE", "ENV_ONECCL_VERSION", "ENV_ONECCL_BUILD_VERSION", "ENV_TOPOLOGY", "SCALE_UP", "SCALE_OUT",
           "TOPOLOGIES", "TORCH_ROWS", "KNOWN_UNTIL"]

R = ReduceOp
ENV_OVERRIDE = "FUNCOLL_XPU_OVERRIDE"
ENV_ONECCL_VERSION = "FUNCOLL_ONECCL_VERSION"
ENV_ONECCL_BUILD_VERSION = "FUNCOLL_ONECCL_BUILD_VERSION"


# dtypes ProcessGroupXCCL moves and reduces: the ``xcclDatatypes`` map (intel/torch-xpu-ops src/xccl/xccl.h:96-111
# at ab84f925; ProcessGroupXCCL.cpp before). bool is carried as ccl uint8. float8 e4m3fn/e5m2/e4m3fnuz/e5m2fnuz are
# carried as ccl uint8 for non-reducing ops only; funcoll moves every float8 dtype as a uint8 view itself (the same
# bytes on the wire, and it also covers float8_e8m0fnu, which is not in the map), so no float8 dtype is listed here.
_XCCL_DTYPES = frozenset({torch.uint8, torch.int8, torch.int32, torch.int64, torch.float16, torch.float32,
                          torch.float64, torch.bfloat16, torch.bool})
_XCCL_INTS = frozenset({torch.uint8, torch.int8, torch.int32, torch.int64})
_FLOATS = frozenset({torch.float16, torch.bfloat16, torch.float32, torch.float64})


SCALE_UP, SCALE_OUT = "scale-up", "scale-out"
TOPOLOGIES = (SCALE_UP, SCALE_OUT)
ENV_TOPOLOGY = "FUNCOLL_XPU_TOPOLOGY"

# The torch versions the table has a row for. A row is what ProcessGroupXCCL does in that release, read from
# intel/torch-xpu-ops release/2.x branch tips (assumed to be what torch 2.x pins); "2.15" is torch-xpu-ops main as of
# 2026-08-22 (no release/2.15 branch was readable: what 2.15 pins later is unknown). torch 2.8 takes the 2.9 row (the
# same PREMUL_SUM refusal); a torch newer than 2.15 takes the 2.15 row.
TORCH_ROWS = ("2.9", "2.10", "2.11", "2.12", "2.13", "2.14", "2.15")
KNOWN_UNTIL = "intel/torch-xpu-ops main at ab84f925 (2026-08-22)"


def torch_row(torch_version) -> Optional[str]:
    """The row of :data:`TORCH_ROWS` for a torch version ('2.13.0+xpu' -> '2.13'), None when unknown."""
    tv = parse_version(torch_version)
    if tv is None or len(tv) < 2:
        return None
    v = min(max(tv[:2], (2, 9)), (2, 15))  # torch 2.8 takes the 2.9 row, a torch newer than 2.15 the 2.15 row
    return f"{v[0]}.{v[1]}"


def _row_key(row: str) -> Version:
    return parse_version(row)  # type: ignore[return-value]


@dataclass(frozen=True)
class Fact:
    """One fact about ProcessGroupXCCL / oneCCL.

    ``native_since``: the oneCCL version (found at run time) from which funcoll uses the native path by default on
    the scale-up path (one node, XeLink), None: never by default. ``scale_out_since``: the same on the scale-out path
    (several nodes, OFI); oneCCL's two paths have different reduce ops, so a multi-node job is never handed what only
    the scale-up path has. ``overridable``: the topologies on which ``FUNCOLL_XPU_OVERRIDE`` may flip it (none where
    the library raises: there is nothing native to switch to; ``premul_sum`` depends on the torch version, see
    :func:`overridable`). ``by_torch``: what ProcessGroupXCCL does, per torch row, as ``(first row, text)`` pairs,
    each text with its source (merge dates); a row without an entry has the previous entry's text. ``build``: what
    depends on the oneCCL torch was *built* against (not readable from the pip ``oneccl`` package). ``unknown``: what
    no source says, and the safe choice funcoll makes for it. ``info``: a fact funcoll reports and relies on but that
    switches no plan (a constraint its strategies respect on every version).
    """

    key: str
    what: str
    native_since: Optional[Version]
    scale_out_since: Optional[Version]
    overridable: Tuple[str, ...]
    strategy: str  # what funcoll does when the fact is not native
    source: str
    by_torch: Tuple[Tuple[str, str], ...] = ()
    build: str = ""
    unknown: str = ""
    info: bool = False

    def at(self, row: Optional[str]) -> str:
        """What ProcessGroupXCCL does on torch ``row`` (the ``by_torch`` entry in force there; "" if none)."""
        if row is None:
            return "unknown torch version: " + (self.unknown or "the strategy is used")
        return in_force(self.by_torch, row)


_BOTH = TOPOLOGIES
_NEVER: Tuple[str, ...] = ()
_PREMUL_NATIVE_AR = "2.12"  # from this row, ProcessGroupXCCL scales and sums PREMUL_SUM itself (all_reduce: native)
_PREMUL_ONECCL_ROW = "2.11"  # the only row in which oneCCL's own PreMulSum is used for all_reduce / reduce_scatter
_PREMUL_BUILD_2_11 = (2021, 17)  # ENABLE_XCCL_PREMUL_SUM_SUPPORT in torch 2.11 (release/2.11 xccl.h:29-33)
_GRAPH_CAPTURE_ROW, _GRAPH_CAPTURE_ONECCL = "2.13", (2022, 0)


# ======================================================================================================
# THE XCCL FACT TABLE. Every XCCL capability funcoll relies on is here, with its source; derive() reads
# nothing else. docs/xpu.md renders the same table. Paths are intel/torch-xpu-ops src/xccl/... at main ab84f925
# (2026-08-22) unless a release branch is named; PGX = ProcessGroupXCCL.cpp; dates are merge dates.
# ======================================================================================================
XCCL_FACTS: Dict[str, Fact] = {f.key: f for f in (
    Fact("avg",
         "ReduceOp.AVG on floating dtypes (all_reduce)",
         native_since=(2022, 0), scale_out_since=(2022, 0), overridable=_BOTH,
         strategy="SUM, then divide on the device (fp16/bf16: float32 reduce_scatter, divide, all_gather)",
         source="funcoll's gate: oneCCL >= 2022.0 at run time, the release that adds AVG to scale-out AllReduce "
                "(uxlfoundation/oneCCL#195, maintainer 2026-03-16); ccl avg raises on the scheduler path, seen on "
                "one node (intel/torch-xpu-ops#2361, open) and divided twice on Arc B60 (#3020, open; 'fixed in "
                "oneAPI 2026.0' is a third-party comment only, verl-project/verl#7917)",
         by_torch=(("2.9", "ccl avg when torch was built against oneCCL >= 2021.15 (XCCL_HAS_AVG, xccl.h:40-44 in "
                           "release/2.12-2.13), else SUM + div_ (source builds only: every stock wheel since 2.9 "
                           "was built against >= 2021.15)"),
                   ("2.14", "always onecclAvg, no XCCL_HAS_AVG and no div_ fallback (xccl.h:88-94; #4145 'Drop "
                            "oneCCL v1', merged 2026-07-10); no topology check in torch")),
         build="torch <= 2.13: XCCL_HAS_AVG needs oneCCL >= 2021.15 at torch's build time (below it: SUM + div_, "
               "right for floats)",
         unknown="whether #3020 is fixed in a released oneCCL: no maintainer statement found; oneCCL unknown at run "
                 "time: the strategy"),
    Fact("avg_reduce_scatter",
         "ReduceOp.AVG on floating dtypes (reduce_scatter)",
         native_since=(2022, 0), scale_out_since=None, overridable=(SCALE_UP,),
         strategy="SUM, then divide on the device (fp16/bf16 summed in float32)",
         source="scale-up: as avg (onecclAvg passed to onecclReduceScatter on every path, xccl.cpp:79-95); "
                "scale-out: uxlfoundation/oneCCL#195 lists AVG gaps for Reduce and scale-out AllReduce only and "
                "says nothing about ReduceScatter",
         by_torch=(("2.9", "as avg: ccl avg (or SUM + div_ in builds against oneCCL < 2021.15)"),
                   ("2.14", "always onecclAvg (#4145, 2026-07-10)")),
         build="as avg",
         unknown="scale-out ReduceScatter AVG: no source either way; funcoll uses the strategy there"),
    Fact("avg_reduce",
         "ReduceOp.AVG on reduce (to one rank)",
         native_since=None, scale_out_since=None, overridable=_NEVER,
         strategy="all_reduce path (AVG as above), result kept on dst",
         source="AVG in Reduce is missing for scale-up and scale-out (uxlfoundation/oneCCL#195, MLSL-4062; closed, "
                "its closing comment covers scale-out AllReduce only); torch passes onecclAvg to onecclReduce "
                "unchecked (xccl.cpp:42-60, PGX:1544,1568); list-form reduce_scatter with unequal inputs becomes "
                "per-rank reduce in torch (PGX:1806-1818)",
         by_torch=(("2.9", "AVG handed to ccl reduce unchecked"),),
         unknown="whether oneCCL 2022.x added AVG to Reduce: the strategy"),
    Fact("avg_int",
         "ReduceOp.AVG on integer dtypes",
         native_since=None, scale_out_since=None, overridable=_NEVER,
         strategy="int64 SUM, then truncating divide (NCCL semantics)",
         source="the integer semantics of onecclAvg are undocumented (an enum value only, oneCCL 2022.2 "
                "include/oneapi/ccl/v2/types.h:162); bool AVG is a TypeError (xccl.h:199-207)",
         by_torch=(("2.9", "ccl avg with an integer datatype (builds against oneCCL < 2021.15: div_ on an integer "
                           "tensor, which fails)"),
                   ("2.14", "integer AVG reaches onecclAvg with no error (#4145)")),
         unknown="what onecclAvg does with integers: the strategy on every version"),
    Fact("premul_sum",
         "ReduceOp.PREMUL_SUM (_make_nccl_premul_sum) on all_reduce",
         native_since=None, scale_out_since=None, overridable=_NEVER,  # per torch row: see overridable()
         strategy="multiply by the factor on the device, then SUM (the same bytes on the wire)",
         source="torch <= 2.10: ValueError 'Cannot use ReduceOp.PREMUL_SUM with XCCL' (release/2.10 PGX:161-186, "
                "intel/torch-xpu-ops#1571); 2.11: oneCCL PreMulSum (#1948, merged 2026-01-12) when built against "
                "oneCCL >= 2021.17, on every topology though scale-out oneCCL has none (uxlfoundation/oneCCL#196; "
                "multi-node crash pytorch/torchtitan#2332); reverted by #2913 (2026-03-02); 2.12+: ProcessGroupXCCL "
                "scales the tensor handed to it in place (applyPreMulSumIfNeeded: input.mul_, PGX:85-103, #2903 "
                "merged 2026-03-25) and sends SUM on every topology, also after the reland #3173 (2026-04-20)",
         by_torch=(("2.9", "raises ValueError (no PREMUL_SUM)"),
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
    Fact("premul_sum_reduce_scatter",
         "ReduceOp.PREMUL_SUM on reduce_scatter and reduce",
         native_since=None, scale_out_since=None, overridable=_NEVER,  # torch 2.11 scale-up: see overridable()
         strategy="multiply a copy of the input by the factor on the device, then SUM (the caller's input is never "
                  "scaled)",
         source="torch 2.12+: reduce_scatter scales its *input* in place (input.mul_ in applyPreMulSumIfNeeded, "
                "PGX:85-103, called at :1784,:1862,:1903 with the caller's tensor, which collective() passes "
                "through, PGX:770-880), so a native reduce_scatter_tensor with PREMUL_SUM would change the "
                "caller's input; reduce: no PreMulSum in oneCCL's Reduce (uxlfoundation/oneCCL#196, open; the "
                "upstream test comments it out, test_c10d_ops_xccl.py:307)",
         by_torch=(("2.9", "raises ValueError"),
                   ("2.11", "oneCCL PreMulSum (input left as it is) when built against oneCCL >= 2021.17"),
                   ("2.12", "reduce_scatter: the caller's input scaled in place, then SUM; reduce: ValueError"),
                   ("2.13", "reduce_scatter: the caller's input scaled in place; reduce: oneCCL PreMulSum (build "
                            ">= 2022.0)")),
         build="as premul_sum",
         unknown="never native on reduce: funcoll's reduce goes through all_reduce"),
    Fact("bitwise",
         "ReduceOp.BAND / BOR / BXOR",
         native_since=None, scale_out_since=None, overridable=_NEVER,
         strategy="all_to_all, reduce each block locally in rank order, all_gather (reduce_scatter: all_to_all + "
                  "local)",
         source="xcclOps maps only MIN/MAX/SUM/PRODUCT/AVG (xccl.h:88-94): ValueError 'Cannot use ReduceOp.BAND "
                "with XCCL' (:233-236, asserted by test_c10d_ops_xccl.py:222-226); oneCCL has no bitwise op "
                "either (onecclRedOp_t = Sum/Prod/Max/Min/Avg, oneCCL 2022.2 types.h:157-167)",
         by_torch=(("2.9", "raises ValueError"),)),
    Fact("int_minmax",
         "ReduceOp.MIN / MAX on integer and bool dtypes",
         native_since=None, scale_out_since=None, overridable=_BOTH,
         strategy="all_to_all, min/max of each block locally, all_gather (bool: a uint8 count and one compare; "
                  "reduce_scatter: all_to_all + local)",
         source="int64 MAX over [-1, 0] returned a wrong result on Arc B60 (intel/torch-xpu-ops#3059: closed, "
                "resolution and fixed version not found); torch maps MIN/MAX to onecclMin/Max for int8, uint8, "
                "int32, int64 and bool with no gate; verl routes its integer MAX through a CPU group (seed 002)",
         by_torch=(("2.9", "handed to oneCCL"),),
         unknown="which oneCCL fixes #3059: the strategy until a fixed version is cited"),
    Fact("dtypes_16_unsigned",
         "int16, uint16, uint32, uint64",
         native_since=None, scale_out_since=None, overridable=_NEVER,
         strategy="moved as raw bits of a same-width dtype; reduced as the signed dtype (sign bit flipped "
                  "for MIN/MAX) or widened int16 -> int32",
         source="xcclDatatypes has no kShort/kUInt16/kUInt32/kUInt64 (xccl.h:96-111): TypeError 'Input tensor "
                "data type is not supported for XCCL process group' (:184-189); oneCCL 2022.x has uint32/uint64 "
                "(types.h:131-147), so those two are a gap of torch's map only; int16/uint16 are absent in oneCCL "
                "too",
         by_torch=(("2.9", "raises TypeError"),),
         unknown="torch may add uint32/uint64 to its map without notice; funcoll keeps the strategy"),
    Fact("float8",
         "float8 dtypes",
         native_since=None, scale_out_since=None, overridable=_NEVER,
         strategy="moved as a uint8 view (no copy); reductions are a TypeError in funcoll's semantics",
         source="float8 e4m3fn/e5m2/e4m3fnuz/e5m2fnuz map to ccl uint8 for non-reducing ops (xccl.h:106-110); "
                "reductions raise 'Float8 dtypes are not currently supported for XCCL reductions' (:179-183); no "
                "float8_e8m0fnu",
         by_torch=(("2.9", "moved as uint8; reductions raise"),)),
    Fact("uneven_all_to_all",
         "all_to_all_single with split sizes",
         native_since=None, scale_out_since=None, overridable=_BOTH,
         strategy="n-1 rounds of pairwise send/recv, each message exactly its split (no agreement, no padding)",
         source="uneven all_to_all_single has returned wrong results on some GPUs (docs/design.md section 1; "
                "intel/torch-xpu-ops#3021 on B60, torch 2.9, open); torch 2.9/2.10 call ccl::alltoallv (release/2.10 "
                "PGX:2295,2387); from 2.11 (#2803, merged 2026-02-06) non-uniform splits are one group of send/recv "
                "on the v1 and v2 paths (xccl.cpp:211-282); onecclAllToAllV (#5057) is an open PR as of 2026-08-20",
         by_torch=(("2.9", "ccl::alltoallv"),
                   ("2.11", "one grouped send/recv (uniform splits: native all_to_all)")),
         build="#5057 would use onecclAllToAllV only when torch is built against oneCCL headers that declare it "
               "(XCCL_HAS_ALLTOALLV, oneCCL 2022.2) and only for contiguous displacements",
         unknown="whether torch 2.15 includes #5057"),
    Fact("all_reduce_coalesced",
         "one tuple all_reduce of several tensors",
         native_since=None, scale_out_since=None, overridable=_NEVER,
         strategy="one flat buffer per dtype, one all_reduce each",
         source="allreduce_coalesced requires identical dtypes ('Tensors must have identical type', "
                "checkTensorOnSameDevice PGX:105-126); funcoll's tuple path does not group by dtype",
         by_torch=(("2.9", "identical dtypes only"),)),
    # -- facts funcoll's strategies respect on every version (they switch no plan) ------------------------
    Fact("graph_capture",
         "XPU graph capture of XCCL collectives",
         native_since=None, scale_out_since=None, overridable=_NEVER, info=True,
         strategy="every strategy runs on the device with no host synchronisation, so a captured graph can hold it",
         source="#2992: capturing is allowed only with oneCCL >= 2022.0.0 found at run time (onecclGetVersion), "
                "else NotImplementedError 'Capturing XCCL collectives is only allowed with oneCCL >= 2022.0.0' "
                "(PGX:150-168, checked in collective() at :786, :937)",
         by_torch=(("2.9", "not supported (no capture check before #2992)"),
                   ("2.13", "allowed with oneCCL >= 2022.0.0 at run time")),
         unknown="oneCCL unknown at run time: whether capture is allowed is unknown"),
    Fact("nan_check",
         "TORCH_XCCL_NAN_CHECK (or _set_enable_nan_check): a device assert on NaN in any buffer sent",
         native_since=None, scale_out_since=None, overridable=_NEVER, info=True,
         strategy="no buffer funcoll sends holds undefined bytes: padding and scratch that are sent are written "
                  "first (zeros or results), only receive buffers are left uninitialised",
         source="PGX:396 (default off), checkForNan on every input of collective() (PGX:868-870), on the root only "
                "for broadcast and scatter (:1303, :1457, :1485), on send (:1024); NanCheck_XPU.cpp",
         by_torch=(("2.9", "checks the inputs of every collective when enabled"),)),
    Fact("oneccl_api",
         "which oneCCL API ProcessGroupXCCL uses",
         native_since=None, scale_out_since=None, overridable=_NEVER, info=True,
         strategy="nothing depends on it in funcoll; the oneCCL version is read with get_xccl_version()",
         source="2.11-2.13: the v1 C++ API by default, the v2 C API with USE_CCL_V2=1 (release/2.13 xccl.h:77-90); "
                "2.14+: the v1 API removed, USE_CCL_V2 gone (#4145, merged 2026-07-10)",
         by_torch=(("2.9", "the oneCCL C++ API (v1)"),
                   ("2.11", "v1 by default, v2 (C API) with USE_CCL_V2=1"),
                   ("2.14", "the C API only"))),
    Fact("send_recv",
         "single send/recv",
         native_since=None, scale_out_since=None, overridable=_NEVER, info=True,
         strategy="uneven all_to_all's pairwise rounds are single sends and receives, ordered so that no cycle "
                  "of ranks all send first",
         source="#3071 (merged 2026-04-08): a single send or recv is wrapped in onecclGroupStart/End",
         by_torch=(("2.9", "plain send/recv"),
                   ("2.12", "each wrapped in a group call"))),
)}

# stock torch wheels ship ProcessGroupXCCL from 2.8 (docs/design.md section 1); source builds with USE_XCCL=1 from 2.7
# (huggingface/accelerate#3401)
XCCL_BACKEND_SINCE = (2, 8)

# The oneCCL each stock XPU wheel pins (its Requires-Dist; funcoll reads the installed wheel's own metadata, this table
# is for the docs and the report): pytorch .github/scripts/generate_binary_build_matrix.py for 2.9/2.10; 2.11-2.13
# from third-party environment dumps and torch-xpu-ops CI (.github/scripts/build.sh); 2.14 from vLLM's XPU docs
# (the oneAPI 2026.1.1 set); 2.15: no source.
WHEEL_ONECCL = {"2.9": "2021.16.1", "2.10": "2021.17.1", "2.11": "2021.17.2", "2.12": "2021.17.2",
                "2.13": "2022.0.0", "2.14": "2022.1.2", "2.15": None}


def overridable(key: str, row: Optional[str], build: Optional[Version]) -> Tuple[str, ...]:
    """The topologies on which ``FUNCOLL_XPU_OVERRIDE`` may flip fact ``key`` on torch ``row`` built against oneCCL
    ``build`` (None: unknown). PREMUL_SUM depends on the torch version: nothing to switch to up to 2.10 (it raises);
    on 2.11 oneCCL's own PreMulSum exists on scale-up only and only in builds against oneCCL >= 2021.17; from 2.12 the
    all_reduce may be flipped on every topology (ProcessGroupXCCL scales and sums itself). PREMUL_SUM on
    reduce_scatter may be flipped on torch 2.11 scale-up only: from 2.12 it would scale the caller's input."""
    return _override_rule(key, row, build, SCALE_OUT)[0]


def _override_rule(key: str, row: Optional[str], build: Optional[Version], topology: str) -> Tuple[tuple, str]:
    """(:func:`overridable`, why the fact cannot be flipped on ``topology`` where it cannot)."""
    fact = XCCL_FACTS[key]
    if key in ("premul_sum", "premul_sum_reduce_scatter") and row is not None:
        if _row_key(row) < _row_key(_PREMUL_ONECCL_ROW):
            return _NEVER, f"cannot be overridden on torch {row} (ProcessGroupXCCL raises on PREMUL_SUM)"
        if row == _PREMUL_ONECCL_ROW:
            if build is None or build < _PREMUL_BUILD_2_11:
                b = ".".join(map(str, build)) if build else "an unknown oneCCL"
                return _NEVER, (f"cannot be overridden on torch 2.11 built against {b} (PreMulSum needs oneCCL >= "
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


# ------------------------------------------------------------------------------------------------------
# capabilities
# ------------------------------------------------------------------------------------------------------
XcclCapabilities = VersionedCapabilities  # the name this module's users know


def parse_version(v) -> Optional[Version]:
    """'2.9.0+xpu' -> (2, 9, 0); '2021.16.1' -> (2021, 16, 1); a tuple stays; None/'' -> None."""
    return _parse_version(v, "funcoll.xpu: cannot read a version", "2021.16.1")


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
                   oneccl_build=None) -> Dict[str, bool]:
    """``"avg=strategy, int_minmax=native"`` -> {"avg": False, "int_minmax": True}. Unknown facts, and facts that
    cannot be flipped on ``topology`` for this torch version and build oneCCL, are a ValueError naming the valid
    ones."""
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
    row, build = torch_row(torch_version), parse_version(oneccl_build)
    out = {}
    allowed = sorted(k for k in XCCL_FACTS if topology in _override_rule(k, row, build, topology)[0])
    for key, val in items:
        topologies, why = _override_rule(key, row, build, topology) if key in XCCL_FACTS else ((), "is not a fact")
        if topology not in topologies:
            raise ValueError(f"funcoll.xpu: override {key!r} {why}; overridable facts on {topology}: "
                             f"{', '.join(allowed)}")
        flip = val if isinstance(val, bool) else _OVERRIDE_WORDS.get(str(val).lower())
        if flip is None:
            raise ValueError(f"funcoll.xpu: override {key}={val!r}: use {key}=native or {key}=strategy")
        out[key] = flip
    return out


def _vstr(v: Optional[Version]) -> str:
    return ".".join(map(str, v)) if v else "unknown"


def derive(torch_version, oneccl_version, override=None, topology=None, oneccl_build=None) -> XcclCapabilities:
    """The XCCL capabilities of a stack: a pure function of (torch version, oneCCL found at run time, override,
    topology, oneCCL torch was built against).

    ``oneccl_version`` None means unknown: every fact gated on it takes its strategy. ``topology`` None means
    unknown: the scale-out row (what every path has). ``oneccl_build`` None means unknown: no override that needs a
    build-time oneCCL is allowed. ``torch_version`` None means unknown: no torch-gated fact is native.
    """
    row, ov, build = torch_row(torch_version), parse_version(oneccl_version), parse_version(oneccl_build)
    topo = parse_topology(topology)
    flips = parse_override(override, topo, torch_version, oneccl_build)

    def native(key: str) -> bool:
        if key in flips:
            return flips[key]
        fact = XCCL_FACTS[key]
        if fact.info:
            return False
        if key == "premul_sum":  # the torch row decides: ProcessGroupXCCL's own scale + SUM from 2.12
            return row is not None and _row_key(row) >= _row_key(_PREMUL_NATIVE_AR)
        since = fact.native_since if topo == SCALE_UP else fact.scale_out_since
        return since is not None and ov is not None and ov >= since

    reduce_ops = {R.SUM, R.PRODUCT, R.MIN, R.MAX}
    refused = {(op, d) for op in (R.AVG,) for d in _XCCL_INTS | {torch.bool}}  # avg_int
    refused_on = {("reduce", R.AVG)}  # avg_reduce
    # AVG and PREMUL_SUM: native per primitive, each by its own facts, never on reduce
    for op, on_ar, on_rs in ((R.AVG, native("avg"), native("avg_reduce_scatter")),
                             (R.PREMUL_SUM, native("premul_sum"), native("premul_sum_reduce_scatter"))):
        if on_ar or on_rs:
            reduce_ops.add(op)
            refused_on |= {(p, op) for p, ok in (("all_reduce", on_ar), ("reduce_scatter", on_rs), ("reduce", False))
                           if not ok}
            if op is R.PREMUL_SUM:  # fp16/bf16/fp32/fp64 (unpackPreMulSum; mul_ on the tensor from 2.12)
                refused |= {(R.PREMUL_SUM, d) for d in _XCCL_DTYPES - _FLOATS}
    if not native("int_minmax"):
        refused |= {(op, d) for op in (R.MIN, R.MAX) for d in _XCCL_INTS | {torch.bool}}
    primitives = set(PRIMITIVES) - {"all_reduce_coalesced"}

    if row is not None and _row_key(row) >= _row_key(_GRAPH_CAPTURE_ROW):
        capture = ("unknown (oneCCL unknown at run time)" if ov is None else
                   "allowed" if ov >= _GRAPH_CAPTURE_ONECCL else "refused (NotImplementedError): oneCCL < 2022.0")
    else:
        capture = "not supported before torch 2.13" if row is not None else "unknown (torch version unknown)"
    tstr = row or "?"
    return XcclCapabilities(
        name=f"xccl[torch {tstr}, oneCCL {_vstr(ov)}, {topo}]",
        primitives=frozenset(primitives),
        reduce_ops=frozenset(reduce_ops),
        dtypes=_XCCL_DTYPES,
        reduce_dtypes=_XCCL_DTYPES,
        refused_pairs=frozenset(refused),
        uneven_all_to_all=native("uneven_all_to_all"),
        # the list all_gather and reduce_scatter serve a size per rank (ProcessGroupXCCL::allgather: one _broadcast_oop
        # per rank, ::reduce_scatter: one _reduce_oop per destination, when the sizes differ; intel/torch-xpu-ops
        # src/xccl/ProcessGroupXCCL.cpp, release/2.9 to 2.14 and main ab84f925)
        uneven_all_gather=True,
        uneven_reduce_scatter=True,
        refused_on=frozenset(refused_on),
        sources={f"xccl.{k}": f"{'info' if f.info else 'native' if native(k) else 'strategy'}: {f.source}"
                 for k, f in XCCL_FACTS.items()},
        versions={"torch": tstr, "oneccl": _vstr(ov), "oneccl_build": _vstr(build), "topology": topo,
                  "graph_capture": capture},
    )


def conservative_profile(torch_version=None) -> Capabilities:
    """``PROFILES["xccl"]`` (what ``FUNCOLL_PROFILE=xccl`` imposes on another transport): the row :func:`derive` gives
    for the running torch (or ``torch_version``) with an unknown oneCCL on the scale-out path, as plain
    :class:`Capabilities`, plus float8 moved as bytes. On torch 2.12+ that row has PREMUL_SUM native on all_reduce
    (ProcessGroupXCCL scales the tensor handed to it in place, then sums), which the CPU transport reproduces."""
    d = derive(torch.__version__ if torch_version is None else torch_version, None, "", None)
    return d.plain(name="xccl", dtypes=d.dtypes | FLOAT8,
                   sources={**d.sources,
                            "xccl.fp8": "fp8 reductions raise (docs/design.md section 1); fp8 is moved as bytes"})


# ------------------------------------------------------------------------------------------------------
# reading the running stack (guarded; never touches the XPU runtime)
# ------------------------------------------------------------------------------------------------------
def _version_of(read: Callable[[], object]) -> Optional[str]:
    """``read()`` when it gives a version (text that starts with a digit), else None (also when it raises: not an XPU
    build of torch, no such package, no recorder)."""
    try:
        v = read()
    except Exception:
        return None
    return v if isinstance(v, str) and v[:1].isdigit() else None


def _oneccl_from_torch() -> Optional[str]:
    """``torch._C._distributed_c10d.get_xccl_version()``: onecclGetVersion of the oneCCL library loaded (xccl.h:71-84),
    in XPU builds of torch (the upstream tests compare the flight recorder's version with it)."""
    return _version_of(lambda: C.get_xccl_version())  # type: ignore[attr-defined]


def _oneccl_from_metadata() -> Optional[str]:
    """The pip ``oneccl`` package torch's XPU wheels depend on (torch 2.9: oneccl==2021.16.1)."""
    return _version_of(lambda: metadata.version("oneccl"))


def _oneccl_from_flight_recorder() -> Optional[str]:
    """ProcessGroupXCCL records the oneCCL version (getXcclVersion) in its flight recorder when created; the dump
    carries an empty version when the recorder is off."""
    return _version_of(lambda: pickle.loads(C._dump_xccl_trace()).get("comm_lib_version"))  # type: ignore[attr-defined]


def _oneccl_pinned_by_torch() -> Optional[str]:
    """The ``oneccl==X`` pin in the installed torch wheel's Requires-Dist (stock XPU wheels have one): the oneCCL the
    wheel was built and released against."""
    pin = re.compile(r"\s*oneccl\s*==\s*([0-9.]+)")
    return _version_of(lambda: next((m.group(1) for m in map(pin.match, metadata.requires("torch") or ()) if m), None))


def stack_versions(backend_created: bool = False) -> Tuple[str, Optional[str], str]:
    """(torch version, oneCCL version found at run time or None, where it came from)."""
    env = os.environ.get(ENV_ONECCL_VERSION, "").strip()
    if env:
        return torch.__version__, env, ENV_ONECCL_VERSION
    sources = [(_oneccl_from_torch, "torch._C._distributed_c10d.get_xccl_version()"),
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
                 topology=None, oneccl_build=None, _backend_created: bool = False) -> XcclCapabilities:
    """What funcoll's XPU transport does natively on this stack (the rest funcoll fills).

    Versions default to the running stack; ``override`` defaults to ``FUNCOLL_XPU_OVERRIDE``; ``topology`` to
    ``FUNCOLL_XPU_TOPOLOGY`` (a funcoll group measures it: all ranks on one host is scale-up), unknown meaning
    scale-out; ``profile`` (default ``FUNCOLL_PROFILE``) names a capability profile to intersect with, e.g. ``"xccl"``.
    """
    src = "given"
    if torch_version is None or oneccl_version is None:
        tv, ov, found = stack_versions(_backend_created)
        torch_version = tv if torch_version is None else torch_version
        if oneccl_version is None:
            oneccl_version, src = ov, found
    oneccl_build, build_src = build_version() if oneccl_build is None else (oneccl_build, "given")
    override = os.environ.get(ENV_OVERRIDE, "") if override is None else override
    topo_src = "given"
    if topology is None:
        topology = os.environ.get(ENV_TOPOLOGY, "").strip() or None
        topo_src = ENV_TOPOLOGY if topology else "unknown: scale-out assumed (every path has it)"
    caps = derive(torch_version, oneccl_version, override, topology, oneccl_build)
    name = profile if profile is not None else active_profile_name()
    if name:
        caps = caps.restrict(_named_profile(name))
    return replace(caps, sources={**caps.sources,
                                  "xccl.version": f"oneCCL {caps.versions['oneccl']} ({src})",
                                  "xccl.build": f"oneCCL {caps.versions['oneccl_build']} at build time ({build_src})",
                                  "xccl.topology": f"{caps.versions['topology']} ({topo_src})",
                                  "xccl.capture": f"graph capture: {caps.versions['graph_capture']}"})


def measure_topology(store, rank: int, size: int, timeout=None) -> str:
    """scale-up when every rank of the group runs on this host, else scale-out: each rank publishes its host name in
    the group's store and reads the others' (a collective over the store, bounded by the store's timeout)."""
    import socket

    host = socket.gethostname()
    store.set(f"funcoll-topology/{rank}", host)
    keys = [f"funcoll-topology/{r}" for r in range(size)]
    store.wait(keys, *([timeout] if timeout is not None else []))
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


def _funcoll_xpu(ctx: GroupContext) -> XcclTransport:
    """A ProcessGroupXCCL of its own for one funcoll group (every rank of the group creates it)."""
    from torch.distributed import PrefixStore

    topology = os.environ.get(ENV_TOPOLOGY, "").strip() or measure_topology(
        PrefixStore("funcoll-xccl-topology/", ctx.store), ctx.rank, ctx.size, ctx.timeout)
    cls, store = _xccl_class(), PrefixStore("funcoll-xccl/", ctx.store)
    try:
        opts = cls.Options()
    except Exception:  # very old bindings: no Options
        backend = cls(store, ctx.rank, ctx.size)
    else:
        for attr, val in (("global_ranks_in_group", list(ctx.global_ranks)), ("group_name", f"funcoll-{ctx.name}"),
                          ("_timeout", ctx.timeout)):
            try:
                setattr(opts, attr, val)
            except Exception:
                pass
        backend = cls(store, ctx.rank, ctx.size, opts)
    return XcclTransport(backend, capabilities(topology=topology, _backend_created=True), None)


def _c10d_xpu(pg, device):
    """The XPU backend of a group made with another backend ("xccl", "cpu:gloo,xpu:xccl")."""
    return c10d_leg(pg, "xpu", "XPU", "init_process_group('xccl') or 'cpu:gloo,xpu:xccl' (or backend 'funcoll')",
                    lambda b: isinstance(b, _xccl_class()), "ProcessGroupXCCL on XPU",
                    lambda b: XcclTransport(b, capabilities(_backend_created=True), device))


register_device("xpu", funcoll=_funcoll_xpu, c10d=_c10d_xpu)
