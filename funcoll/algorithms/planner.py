"""The reduction planner: ``plan(caps, primitive, op, dtype, size)`` -> :class:`Plan`, for ``primitive`` in all_reduce,
reduce_scatter and reduce; a pure function of its arguments, so cached (the algorithms look a plan up per call). A plan
is the list of steps the algorithms run, in order: views and casts that bring the request to something the transport
reduces natively (or to a local reduction when nothing native fits), each with the strategy name that
``funcoll.record()`` reports. This docstring lists every strategy funcoll fills a gap with, once, for every device.

Reductions (planned here):

* complex             -> its real view (sum/avg only)
* bool                -> the logical op (or/and) where the transport has it for bool, else a uint8 view with the
                         matching op, else a count of the Trues (a narrow integer SUM) and one compare
* AVG                 -> SUM then divide (fp16/bf16 summed in float32: as a float32 reduce_scatter and an all_gather
                         in the tensor's dtype where the transport has both, 1.5x the bytes of a native all_reduce
                         instead of 2x; integers summed exactly in int64, then divided with truncation toward
                         zero: NCCL's rounding, not NCCL's sum, which wraps in an 8- to 32-bit dtype)
* PREMUL_SUM          -> scale then SUM
* unsigned 16/32/64   -> the signed dtype of the same width (MIN/MAX with the sign bit flipped)
* narrow dtypes       -> widen (int8/uint8/int16 -> int32 or int64, fp16/bf16 -> float32), reduce, narrow
* other ops           -> all_reduce: all_to_all, reduce this rank's block locally in rank order, all_gather
                         (2(n-1)/n of the tensor sent, as a ring all_reduce; gather + local reduce where the transport
                         has no all_to_all); reduce_scatter: all_to_all, reduce locally (bitwise ops, integer MIN/MAX
                         where the transport's are wrong)
* reduce (to one rank)-> the all_reduce plan, where the transport has no native reduce for the request

Moves (filled without a plan, in :mod:`funcoll.algorithms.move`):

* unmovable dtypes    -> moved as raw bits of a dtype the backend moves (fp8, uint16/32/64, complex as its real view)
* MX halves           -> float8_e8m0fnu and float4_e2m1fn_x2 moved as their uint8 view from the first step (free; every
                         local copy a uint8 one: torch 2.9 copies no float4), on every transport
* uneven all_to_all   -> where the transport sends messages of any size (XCCL): at world 2 one pairwise round; above
                         it the carried exchange (a2a_plan, below): one even all_to_all of byte chunks, each headed by
                         its sender's split statistics, the rows above the chunk as one group of send/recv, the chunk
                         chosen from the statistics the previous exchange of that row size carried (no agreement; one
                         tiny all_gather of them on the first call, none under a promised static_split_bound; a
                         latency-bound exchange's chunk holds every split: one collective, no message); else
                         (XLA, TorchTPU: one program on every rank) every split padded to a bound every rank promised
                         or to the largest split (agreed on with a tiny all_gather), one even all_to_all, unpad
* coalesced           -> one tuple op where native, else one flat buffer per dtype, one collective each
* list reduce_scatter / all_gather (a size per rank, as NCCL serves them)
                      -> the backend's own list form where it serves the request (gloo's list reduce_scatter: one
                         all_reduce per destination; XCCL's: one reduce / broadcast per rank when sizes differ); else
                         even sizes: the concatenation's even collective; uneven: every block padded to the largest,
                         one even collective, unpad, or, where padding would more than double the bytes,
                         reduce_scatter as one all_reduce (2(n-1)/n of it sent, as a ring) with this rank's block
                         kept, all_gather as one broadcast per rank; every size is in every rank's list: no agreement,
                         no host sync
* broadcast           -> where there is none, a masked SUM all_reduce of the integers of the tensor's bits (the root's,
                         0 elsewhere; on XLA a bitcast-convert, no sync): every bit pattern arrives as it is (NaN
                         payloads, signalling NaNs, -0.0, subnormals), where a float sum would quiet and canonicalise
                         NaNs; on XLA floats moved by all_gather / all_to_all go as those integers too (its CPU
                         compiler turns a float all-gather into a float all-reduce)
* all_gather          -> where there is none, a masked all_reduce of n rows of those integers (n times the bytes);
                         all_to_all -> all_gather + select (in the integers)
* gather / scatter    -> all_gather / broadcast of the stacked inputs' integers + this rank's row (selected by
                         device data); barrier -> an all_reduce of one element
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Optional, Tuple

import torch

from funcoll.semantics import OPS, ReduceOp

__all__ = ["Step", "Plan", "plan", "REDUCING", "A2aPlan", "a2a_plan", "a2a_estimate", "split_stats"]

REDUCING = ("all_reduce", "reduce_scatter", "reduce")
SIGNED_OF = {torch.uint16: torch.int16, torch.uint32: torch.int32, torch.uint64: torch.int64}
SIGN_BIT = {torch.int16: -(1 << 15), torch.int32: -(1 << 31), torch.int64: -(1 << 63)}
WIDER = {torch.int8: (torch.int32, torch.int64), torch.uint8: (torch.int32, torch.int64),
         torch.int16: (torch.int32, torch.int64), torch.int32: (torch.int64,),
         torch.float16: (torch.float32,), torch.bfloat16: (torch.float32,)}
LOW_PRECISION = (torch.float16, torch.bfloat16)

# Step kinds. Transforms (the request changes, the algorithm runs the rest of the plan on it):
REAL_VIEW = "real_view"  # complex -> view_as_real
BOOL_OP = "bool_op"  # bool stays bool, the op becomes its logical twin (or/and)
BOOL_UINT8 = "bool_uint8"  # bool viewed as uint8, the op mapped
AVG_FLOAT32 = "avg_float32"  # fp16/bf16 AVG: float32 SUM, then divide and narrow
AVG_FLOAT = "avg_float"  # AVG: SUM, then divide
AVG_INT = "avg_int"  # integer AVG: int64 SUM, then truncating divide and narrow
PREMUL = "premul"  # PREMUL_SUM: multiply by the factor, then SUM
SIGNED_FLIP = "signed_flip"  # unsigned MIN/MAX: the signed view with the sign bit flipped before and after
SIGNED = "signed"  # unsigned: the signed view (sums, products and bitwise ops are the same bits)
WIDEN = "widen"  # a wider dtype the transport reduces, then narrowed back
VIA_ALL_REDUCE = "via_all_reduce"  # reduce (to one rank) as an all_reduce, the result kept on the root
BOOL_ANY = "bool_any"  # bool or-like ops: count the Trues with a narrow integer SUM, then "count > 0"
BOOL_ALL = "bool_all"  # bool and-like ops: the same count, then "count == group size"
BOOL_PARITY = "bool_parity"  # bool xor: the same count, then "count is odd"
# Terminals (the last step):
NATIVE = "native"  # the transport's own primitive
GATHER_LOCAL = "gather_local"  # all_reduce: all_gather, reduce locally in rank order
A2A_LOCAL = "a2a_local"  # reduce_scatter: all_to_all, reduce the received blocks locally
RS_AG_LOCAL = "rs_ag_local"  # all_reduce: all_to_all, reduce this rank's block locally, all_gather the blocks
AVG_RS_AG = "avg_rs_ag"  # fp16/bf16 AVG all_reduce: float32 reduce_scatter, divide and round once, all_gather
ALL_REDUCE_SLICE = "all_reduce_slice"  # reduce_scatter: all_reduce the whole input, keep this rank's block
UNREDUCIBLE = "unreducible"  # no dtype the transport reduces can carry the request (a funcoll bug)

_COUNT_STEP = {"any": BOOL_ANY, "all": BOOL_ALL, "parity": BOOL_PARITY}  # by an op row's bool_count
# a table, not torch.empty(..).real: planning makes no tensor
_REAL_OF = {torch.complex32: torch.float16, torch.complex64: torch.float32, torch.complex128: torch.float64}


@dataclass(frozen=True)
class Step:
    kind: str
    op: ReduceOp  # the reduce op after this step
    dtype: torch.dtype  # the dtype after this step
    note: str = ""  # the strategy recorded by funcoll.record() ("" for none)


@dataclass(frozen=True)
class Plan:
    primitive: str
    steps: Tuple[Step, ...]

    @property
    def native(self) -> bool:
        """The request goes to the transport as it is: one native call, nothing before or after."""
        return len(self.steps) == 1 and self.steps[0].kind == NATIVE

    @property
    def notes(self) -> Tuple[str, ...]:
        return tuple(s.note for s in self.steps if s.note)

    def describe(self) -> str:
        return "+".join(self.notes) or NATIVE


def _wider(dtype, caps, primitive, op) -> Optional[torch.dtype]:
    wider = WIDER.get(dtype, ())  # the narrowest that reduces the op, else the narrowest the transport reduces at all
    return (next((w for w in wider if caps.reduces(primitive, op, w)), None)
            or next((w for w in wider if w in caps.reduce_dtypes), None))


def _count_dtype(caps, primitive, size, parity: bool) -> Optional[torch.dtype]:
    """The narrowest integer that counts up to ``size`` Trues exactly and the transport sums (parity needs no more
    than uint8 at any size: 256 is even)."""
    return next((c for c in (torch.uint8, torch.int32, torch.int64)
                 if (size < 256 or c != torch.uint8 or parity) and caps.reduces(primitive, ReduceOp.SUM, c)), None)


@functools.lru_cache(maxsize=4096)
def plan(caps, primitive: str, op: ReduceOp, dtype: torch.dtype, size: int = 2) -> Plan:
    """The plan for a request that passed :func:`funcoll.semantics.check_reduction`, in a group of ``size`` ranks."""
    if primitive == "reduce":
        if caps.reduces("reduce", op, dtype) and not dtype.is_complex and dtype != torch.bool:
            return Plan("reduce", (Step(NATIVE, op, dtype),))
        inner = plan(caps, "all_reduce", op, dtype, size)
        return Plan("reduce", (Step(VIA_ALL_REDUCE, op, dtype, "reduce=all_reduce"),) + inner.steps)
    if primitive not in ("all_reduce", "reduce_scatter"):
        raise ValueError(f"funcoll.algorithms.planner: {primitive!r} is not a reducing primitive; "
                         f"use one of {REDUCING}")
    steps = []
    # canonical forms: complex as its real view, bool as a logical op or a uint8 view
    if dtype.is_complex:
        dtype = _REAL_OF[dtype]
        steps.append(Step(REAL_VIEW, op, dtype, "complex reduced as its real view"))
    elif dtype == torch.bool:
        row = OPS[op]  # bool as its logical op (no dtype view: on XLA a view is a CPU fallback with a graph sync)
        logical = row.bool_op
        if logical is not None and caps.reduces(primitive, logical, torch.bool):
            steps.append(Step(BOOL_OP, logical, dtype, f"bool {op} as {logical}" if logical is not op else ""))
            op = logical
        elif row.bool_uint8 is not None and caps.reduces(primitive, row.bool_uint8, torch.uint8):
            op, dtype = row.bool_uint8, torch.uint8
            steps.append(Step(BOOL_UINT8, op, dtype, f"bool reduced as uint8 {op}"))
        elif row.bool_count and (count := _count_dtype(caps, primitive, size, row.bool_count == "parity")):
            # a narrow count of the Trues (uint8 below 256 ranks: exact) and one compare, instead of a gather
            steps.append(Step(_COUNT_STEP[row.bool_count], ReduceOp.SUM, count,
                              f"bool {op} as {str(count)[6:]} count+compare"))
            op, dtype = ReduceOp.SUM, count
        elif logical is not None and logical is not op:
            # neither is native (e.g. bxor on XLA): stay bool, the local reduction does the logical op
            op = logical
            steps.append(Step(BOOL_OP, op, dtype))
    while True:
        if caps.reduces(primitive, op, dtype):
            steps.append(Step(NATIVE, op, dtype))
            break
        if op is ReduceOp.AVG:
            if not dtype.is_floating_point:
                op, dtype = ReduceOp.SUM, torch.int64
                steps.append(Step(AVG_INT, op, dtype, "avg=int64 sum+truncating divide"))
            elif dtype not in LOW_PRECISION:
                op = ReduceOp.SUM
                steps.append(Step(AVG_FLOAT, op, dtype, "avg=sum+scale"))
            elif (primitive == "all_reduce" and size > 1 and caps.reduces("reduce_scatter", ReduceOp.SUM, torch.float32)
                  and caps.has("all_gather") and caps.moves(dtype)):
                steps.append(Step(AVG_RS_AG, ReduceOp.SUM, torch.float32,
                                  "avg=float32 reduce_scatter+scale+all_gather"))
                break
            else:
                op, dtype = ReduceOp.SUM, torch.float32
                steps.append(Step(AVG_FLOAT32, op, dtype, "avg=sum+scale in float32"))
            continue
        if op is ReduceOp.PREMUL_SUM:
            op = ReduceOp.SUM
            steps.append(Step(PREMUL, op, dtype, "premul_sum=scale+sum"))
            continue
        if dtype not in caps.reduce_dtypes:
            if dtype in SIGNED_OF:
                sdt = SIGNED_OF[dtype]
                if op in (ReduceOp.MIN, ReduceOp.MAX):
                    steps.append(Step(SIGNED_FLIP, op, sdt, f"{dtype} {op} as {sdt} with the sign bit flipped"))
                else:
                    steps.append(Step(SIGNED, op, sdt, f"{dtype} reduced as {sdt}"))
                dtype = sdt
                continue
            wide = _wider(dtype, caps, primitive, op)
            if wide is not None:
                steps.append(Step(WIDEN, op, wide, f"widen {dtype}->{wide}"))
                dtype = wide
                continue
            steps.append(Step(UNREDUCIBLE, op, dtype))
            break
        # the dtype is reduced natively, but not with this op
        if primitive == "all_reduce":
            if OPS[op].in_place and caps.has("all_to_all") and caps.has("all_gather") and caps.moves(dtype):
                steps.append(Step(RS_AG_LOCAL, op, dtype, f"all_to_all+local {op}+all_gather"))
            else:
                steps.append(Step(GATHER_LOCAL, op, dtype, f"gather+local {op}"))
        elif caps.has("all_to_all") and OPS[op].in_place:
            steps.append(Step(A2A_LOCAL, op, dtype, f"all_to_all+local {op}"))
        else:  # no all_to_all either (XLA, replica groups of mixed sizes)
            steps.append(Step(ALL_REDUCE_SLICE, op, dtype, "all_reduce+slice"))
        break
    return Plan(primitive, tuple(steps))


# -- uneven all_to_all without a native alltoallv ----------------------------------------------------------------------
# Planned here, run in funcoll.algorithms.move (_carried_a2a). Every rank reports the same few numbers of its split
# sizes (split_stats); the plan is a function of every rank's numbers (what all ranks hold alike: from the previous
# exchange's chunk headers, or from one small agreement when there is none), of the world and of the row size, never of
# this rank's own splits. The model's constants are orders of magnitude of a GPU fabric (microseconds, bytes per
# microsecond), not measurements: they only rank the candidates against each other.
A2A_QUANTILES = 8  # a rank's sorted split sizes at 8 evenly spaced positions (its smallest and largest among them)
A2A_STATS = A2A_QUANTILES + 1  # + the rank's total rows
A2A_HEADER = 8 * A2A_STATS  # bytes heading each chunk of the carried exchange (int64 statistics)
COLLECTIVE_US = 20.0  # one collective's latency, plus COLLECTIVE_PEER_US per peer it posts messages to
COLLECTIVE_PEER_US = 2.0
P2P_ROUND_US = 20.0  # one round of pairwise send/recv (one message each way, waited before the next round)
GROUP_US = 20.0  # one group of point-to-point messages, plus MESSAGE_US per message of the busiest rank
MESSAGE_US = 2.0
BYTES_PER_US = 10_000.0  # 10 GB/s per rank
BYTES_SLACK = 1.3  # the carried exchange moves at most this many times the exact bytes (+ its headers), ...
# ... unless its bytes above the exact exchange are at most this many per rank: what the model's bandwidth moves in
# one message group's latency, so padding that small costs less than the messages it saves (and its memory is small)
PAD_FREE_BYTES = GROUP_US * BYTES_PER_US
_CANDIDATES = 32  # chunk sizes tried: 0, and up to this many of the reported split sizes


def split_stats(splits) -> Tuple[int, ...]:
    """The numbers a rank reports of its split sizes (input_split_sizes, one per destination): the sorted sizes at
    A2A_QUANTILES evenly spaced positions, then their total."""
    s = sorted(int(x) for x in splits)
    n = len(s)
    q = A2A_QUANTILES
    return tuple(s[(i * (n - 1)) // (q - 1)] for i in range(q)) + (sum(s),)


@dataclass(frozen=True)
class A2aPlan:
    """How an uneven all_to_all runs: ``kind`` PAIRWISE (n-1 rounds of one send and one receive) or CARRIED (one even
    all_to_all of ``chunk``-row chunks, each headed by its sender's split statistics, the rows above ``chunk`` as one
    group of send/recv; chunk 0: the headers' all_to_all and every row as messages)."""

    kind: str
    chunk: int = 0

    def note(self) -> str:
        if self.kind == PAIRWISE:
            return "uneven all_to_all=pairwise send/recv"
        if self.chunk == 0:
            return "uneven all_to_all=split statistics all_to_all+one group of send/recv"
        return (f"uneven all_to_all=carried: chunks of {self.chunk} rows headed by split statistics+even "
                "all_to_all+rows above as one group of send/recv")


PAIRWISE, CARRIED = "pairwise", "carried"


def _pairwise_world() -> int:
    """The largest world where n-1 pairwise rounds cost less than the carried exchange's floor (its one collective),
    whatever the splits: the only worlds where the plan needs no statistics."""
    n = 1
    while n * P2P_ROUND_US <= COLLECTIVE_US + COLLECTIVE_PEER_US * n:  # the world n + 1: n rounds, n peers
        n += 1
    return n


PAIRWISE_WORLD = _pairwise_world()


def a2a_estimate(chunk: int, stats: Tuple[Tuple[int, ...], ...], row_bytes: int) -> dict:
    """The carried exchange with ``chunk`` rows per chunk, estimated from every rank's statistics: ``time_us`` (the
    busiest rank), ``bytes`` (the world's, headers included), ``exact`` (the world's rows, every split once),
    ``messages`` (the busiest rank's sends above the chunk)."""
    n = len(stats)
    w = n / A2A_QUANTILES  # the splits each reported size stands for
    per_chunk = A2A_HEADER + chunk * row_bytes
    over = [w * sum(max(0, p - chunk) for p in st[:A2A_QUANTILES]) * row_bytes for st in stats]
    msgs = [w * sum(1 for p in st[:A2A_QUANTILES] if p > chunk) for st in stats]
    t = COLLECTIVE_US + COLLECTIVE_PEER_US * (n - 1) + (n - 1) * per_chunk / BYTES_PER_US
    busiest = max(m * MESSAGE_US + b / BYTES_PER_US for m, b in zip(msgs, over))
    if max(msgs) > 0:
        t += GROUP_US + busiest
    return {"time_us": t, "bytes": n * n * per_chunk + sum(over), "exact": sum(st[-1] for st in stats) * row_bytes,
            "messages": max(msgs)}


@functools.lru_cache(maxsize=1024)
def a2a_plan(n: int, stats: Optional[Tuple[Tuple[int, ...], ...]], row_bytes: int,
             bound: Optional[int] = None) -> A2aPlan:
    """The plan of an uneven all_to_all in a group of ``n`` ranks with no native alltoallv but point-to-point messages
    of any size: pairwise at worlds up to PAIRWISE_WORLD; else the carried exchange, its chunk the fastest by the
    model among those that move at most BYTES_SLACK times the exact bytes (plus headers; chunk 0 always does) or at
    most PAD_FREE_BYTES per rank more than the exact bytes (a latency-bound exchange: padding beats a message group).
    ``stats``: every rank's split_stats (None: none known; ``bound``, a promised largest split, is then the chunk)."""
    if n <= PAIRWISE_WORLD:
        return A2aPlan(PAIRWISE)
    if stats is None:
        return A2aPlan(CARRIED, int(bound or 0))
    sizes = sorted({p for st in stats for p in st[:A2A_QUANTILES] if p > 0})
    if bound is not None:
        sizes = [s for s in sizes if s <= bound]
    step = max(1, len(sizes) // _CANDIDATES)
    candidates = [0] + sizes[::step] + sizes[-1:]
    best, best_t = 0, None
    for c in candidates:
        e = a2a_estimate(c, stats, row_bytes)
        padded = e["bytes"] - n * n * A2A_HEADER
        if c and padded > BYTES_SLACK * e["exact"] and padded - e["exact"] > PAD_FREE_BYTES * n:
            continue
        if best_t is None or e["time_us"] < best_t:
            best, best_t = c, e["time_us"]
    return A2aPlan(CARRIED, best)
