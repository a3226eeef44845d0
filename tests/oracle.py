"""Which (collective, dtype, reduce op) requests are valid: pinned here, once, from what the real backends accept
(NCCL, gloo, XCCL, as torch's process groups serve them) plus what funcoll promises beyond them, minus what funcoll
deliberately refuses although a backend serves it -- every row written out with its source or its reason, nothing
computed by funcoll's code. ``funcoll.reference.valid_ops`` must equal :data:`VALID` exactly
(tests/semantics/test_valid_requests.py), and every matrix-driven test iterates :func:`valid_ops` (re-exported by
tests/reference.py), so a request funcoll starts refusing fails the suite.

Sources (read for this table; line numbers at the commit named):

- **NCCL core**: NVIDIA/nccl 5067397c2676d5aed50042fc39e5c8ee96eb0027, ``src/nccl.h.in`` lines 363-394
  (``ncclRedOp_t``: sum prod max min avg; ``ncclDataType_t``: int8 uint8 int32 uint32 int64 uint64 half float double
  bfloat16 float8e4m3 float8e5m2) and ``src/device/generate.py`` lines 14-15 (every reduction kernel is generated for
  every type) and 118 (integer ``ncclAvg`` is SumPostDiv, a truncating divide). NCCL has no bitwise reduction.
- **ProcessGroupNCCL** (what a torch user reaches), pytorch/pytorch v2.9.0 (0fabc3ba44823f257e70ce397d989c8de5e362c1)
  and v2.15.0 (d0f2af8b66b20da4baa50644c0cd3f887a2eae2e):
  ``torch/csrc/distributed/c10d/NCCLUtils.hpp`` ``ncclDataType`` (v2.9.0 lines 208-231, v2.15.0 lines 195-218): int8,
  uint8, int32, int64, half, float, double, bfloat16, bool (as uint8), float8 -- no int16, uint16, uint32, uint64 or
  complex; ``NCCL_SUPPORTS_FP8`` for NCCL >= 2.24 (v2.9.0 lines 77-79, v2.15.0 lines 26-28; the wheels ship NCCL 2.27
  and 2.30), under which float8_e4m3fn/e5m2 map to NCCL's float8 types and reduce.
  ``torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp``: ``getNcclReduceOp`` (bool SUM -> MAX, bool AVG a TypeError,
  PREMUL_SUM only for half, float, bfloat16, double, BAND/BOR/BXOR "Cannot use ReduceOp.BAND with NCCL"),
  ``isUnsupportedFloat8`` (refuses the fnuz and e8m0fnu variants, and e4m3fn/e5m2 only without NCCL_SUPPORTS_FP8),
  ``complexViewAsRealAllowed`` (SUM, AVG, PREMUL_SUM) used by ``ProcessGroupNCCL::reduce``; those message strings are
  in both wheels' ``libtorch_cuda.so``.
- **torch's Python layer** (every backend): ``torch/distributed/distributed_c10d.py`` ``supports_complex`` (v2.9.0
  line 222, v2.15.0 line 544: MAX MIN PRODUCT BAND BOR BXOR refused on complex) and ``all_reduce`` (v2.9.0 lines
  2915-2918, v2.15.0 lines 4154-4157), which hands the backend ``view_as_real`` of a complex tensor.
- **ProcessGroupGloo**, pytorch/pytorch v2.9.0 ``torch/csrc/distributed/c10d/ProcessGroupGlooDetail.hpp`` and v2.15.0
  ``torch/csrc/distributed/c10d/gloo/ProcessGroupGlooDetail.hpp`` (shipped in the wheels): ``GENERATE_ALL_TYPES``
  (v2.9.0 lines 53-82, v2.15.0 54-83: float, double, half, bfloat16, int8, uint8, bool, int32, int64, else "Invalid
  scalar type"); ``toFunction`` for floating types (lines 120-150 / 121-151: BAND/BOR/BXOR "Cannot use ReduceOp.BAND
  with non-integral dtype", PREMUL_SUM "Cannot use ReduceOp.PREMUL_SUM with Gloo") and for integral types (lines
  185-212 / 186-213: every op but PREMUL_SUM); AVG is SUM then ``tensors[0] /= size`` (lines 311-314 / 312-315), which
  an integer or bool tensor cannot hold (a RuntimeError). Complex goes as ``view_as_real`` for SUM and AVG.
  tests/semantics/test_valid_requests.py checks :data:`GLOO` against the installed gloo in both environments.
- **ProcessGroupXCCL**, intel/torch-xpu-ops ab84f925a234f33ee70a29af59c03aefdeff68c3 (main, 2026-08-22; torch 2.14+)
  ``src/xccl/xccl.h``: ``xcclOps`` lines 88-94 (MIN MAX SUM PRODUCT AVG; nothing bitwise: "Cannot use ReduceOp.BAND
  with XCCL", lines 233-236), ``xcclDatatypes`` lines 96-111 (uint8, int8, int32, int64, half, float, double,
  bfloat16, bool as uint8, float8 as uint8 "for non-reduction op"), ``getXcclDataType`` lines 179-183 ("Float8 dtypes
  are not currently supported for XCCL reductions"), ``getXcclReduceOp`` lines 193-238 (bool SUM -> MAX, bool AVG a
  TypeError, PREMUL_SUM for half, float, bfloat16, double); ``src/xccl/ProcessGroupXCCL.cpp``
  ``applyPreMulSumIfNeeded`` lines 85-103 (all_reduce and reduce_scatter: the input scaled, then SUM) and
  ``complexViewAsRealAllowed`` lines 129-140 (SUM, AVG; used by allreduce and reduce, lines 1347-1357, 1502-1512).
  torch 2.9's XCCL (branch release/2.9, 789f59d8261b521282a26025c4a7a201621b4683, ``src/xccl/ProcessGroupXCCL.cpp``
  lines 20-45, 155-180) has the same dtypes and ops without PREMUL_SUM.
"""

from __future__ import annotations

import itertools
from typing import FrozenSet, Iterable, Tuple

import torch

# the reduce op names (c10d's ReduceOp members, lower case), in c10d's and funcoll's order
OPS = ("sum", "avg", "product", "min", "max", "band", "bor", "bxor", "premul_sum")
# the reducing collectives: all_reduce (and its coalesced form), reduce, reduce_scatter (the tensor, list and coalesced
# forms)
COLLECTIVES = ("all_reduce", "reduce", "reduce_scatter")

FLOATS = (torch.float32, torch.float64, torch.float16, torch.bfloat16)
COMPLEX = (torch.complex64, torch.complex128)
INTS_EVERY_BACKEND = (torch.int8, torch.uint8, torch.int32, torch.int64)  # in NCCL's, gloo's and XCCL's maps
INTS_NO_BACKEND = (torch.int16, torch.uint16, torch.uint32, torch.uint64)  # in none of them
FLOAT8_OCP = (torch.float8_e4m3fn, torch.float8_e5m2)
FLOAT8_OTHER = (torch.float8_e4m3fnuz, torch.float8_e5m2fnuz, torch.float8_e8m0fnu)
# packed fp4 pairs (an MX tensor's data): no backend reduces them (NCCL's ncclDataType_t has no fp4 type; gloo's
# GENERATE_ALL_TYPES and XCCL's xcclDatatypes have none either; intel/torch-xpu-ops#5240 maps it to uint8 "for
# non-reduction ops")
FLOAT4 = (torch.float4_e2m1fn_x2,)
# every dtype the table decides for
DTYPES = FLOATS + COMPLEX + INTS_EVERY_BACKEND + INTS_NO_BACKEND + (torch.bool,) + FLOAT8_OCP + FLOAT8_OTHER + FLOAT4

Row = Tuple[str, torch.dtype, str]  # (collective, dtype, reduce op)

ARITH = ("sum", "avg", "product", "min", "max")
BITWISE = ("band", "bor", "bxor")


def rows(dtypes: Iterable[torch.dtype], ops: Iterable[str], collectives: Iterable[str] = COLLECTIVES) -> FrozenSet[Row]:
    """Every (collective, dtype, op) of the three lists."""
    return frozenset(itertools.product(tuple(collectives), tuple(dtypes), tuple(ops)))


# -- what each backend accepts (see the module docstring for the lines) ----------------------------------------
NCCL = (rows(FLOATS, ARITH + ("premul_sum",))
        | rows(INTS_EVERY_BACKEND, ARITH)  # integer AVG: NCCL's SumPostDiv
        | rows((torch.bool,), ("sum", "product", "min", "max"))  # as uint8; SUM as MAX; AVG refused
        | rows(COMPLEX, ("sum", "avg"), ("all_reduce", "reduce"))
        | rows(COMPLEX, ("premul_sum",), ("all_reduce", "reduce"))  # view_as_real, a real factor
        | rows(FLOAT8_OCP, ARITH))  # NCCL >= 2.24 (NCCL_SUPPORTS_FP8); PREMUL_SUM refused for float8

GLOO = (rows(FLOATS, ARITH)
        | rows(COMPLEX, ("sum", "avg"))
        | rows(INTS_EVERY_BACKEND + (torch.bool,), ("sum", "product", "min", "max") + BITWISE))

XCCL = (rows(FLOATS, ARITH + ("premul_sum",))  # PREMUL_SUM: torch 2.11+ (2.9 and 2.10 raise ValueError)
        | rows(INTS_EVERY_BACKEND, ARITH)  # integer AVG handed to oneCCL's avg
        | rows((torch.bool,), ("sum", "product", "min", "max"))
        | rows(COMPLEX, ("sum", "avg"), ("all_reduce", "reduce")))

BACKENDS = NCCL | GLOO | XCCL

# -- what funcoll promises beyond the backends: (rows, reason) ---------------------------------------------------
PROMISES = (
    (rows((torch.int16, torch.uint16, torch.uint32), ARITH + BITWISE),
     "no backend's dtype map has int16, uint16 or uint32; funcoll widens them to int32 and reduces as signed (MIN/MAX "
     "of unsigned with the sign bit flipped): README 'int16; uint16/32/64' row, docs/design.md section 5"),
    (rows((torch.uint64,), ("sum", "product", "min", "max") + BITWISE),
     "uint64 is reduced as int64 of the same bits (the README row as above); its AVG is refused (below)"),
)

# -- what funcoll refuses although a backend serves it: (rows, reason) -------------------------------------------
NARROWER = (
    (rows(FLOAT8_OCP, ARITH),
     "float8 is for non-reducing ops only (docs/design.md section 5; README 'float8' row): gloo, XCCL and XLA have no "
     "float8 reduction, and only NCCL >= 2.24 on ProcessGroupNCCL reduces e4m3fn/e5m2"),
    (rows(COMPLEX, ("premul_sum",), ("all_reduce", "reduce")),
     "complex takes sum and avg only (docs/design.md section 5); ProcessGroupNCCL scales view_as_real by a real "
     "factor, no other backend does"),
)

VALID: FrozenSet[Row] = frozenset(
    (BACKENDS | frozenset().union(*(r for r, _ in PROMISES))) - frozenset().union(*(r for r, _ in NARROWER)))


def valid_ops(dtype: torch.dtype, collective: str = "all_reduce") -> list:
    """The reduce op names :data:`VALID` allows for ``dtype`` on ``collective`` ("all_reduce", "reduce",
    "reduce_scatter"), in :data:`OPS` order; a dtype the table does not decide for is a KeyError."""
    if dtype not in DTYPES:
        raise KeyError(f"tests/oracle.py decides nothing for {dtype}")
    if collective not in COLLECTIVES:
        raise KeyError(f"tests/oracle.py: no collective {collective!r}; one of {COLLECTIVES}")
    return [op for op in OPS if (collective, dtype, op) in VALID]


def refused(collective: str = "all_reduce") -> list:
    """Every (dtype, op) :data:`VALID` does not allow on ``collective``, in :data:`DTYPES` x :data:`OPS` order."""
    return [(dt, op) for dt in DTYPES for op in OPS if (collective, dt, op) not in VALID]
