"""Integer AVG with an odd divisor, executed on XLA CPU replicas (funcoll.replicas, jaxlib): uint32 near 2**31 and
2**32, int32 and int64 near their extremes, at a world of 3, in the sub-groups of 3 of a world of 6
(``new_subgroups(3)``: replica groups {{0,1,2},{3,4,5}}) and over that whole world of 6 (divisor 2 * 3).

The reference is computed here from every rank's values with Python integers, independently of funcoll: NCCL's
integer AVG (ncclAvg -> FuncSumPostDiv: NVIDIA/nccl, src/device/reduce_kernel.h, ``FuncSumPostDiv::divide``, at
commit 0180f9abe2ccbee8666c44685d1bd4c3dfafaaab) sums in the tensor's dtype and divides the absolute value, i.e. the
quotient is truncated toward zero. funcoll sums integers in int64: int64 wraps exactly as NCCL's sum does, and a
32-bit sum never overflows there, so funcoll's 32-bit result is the exact mean truncated toward zero (where NCCL's
32-bit sum would wrap, funcoll promises more; the columns whose sum fits in 32 bits are the ones where both agree).

The replicas run in a fresh interpreter (``replica_run``, tests/fresh.py: each rank of a virtual world is the
default process group in turn), which returns every rank's results.
"""

from __future__ import annotations

import pytest

from tests import fresh
from tests.xla.replica_runs import XLA_CPU, skip_without_replicas

# per dtype, rank r's values are ROWS[dtype][r % 3] (the same three rows in each block of 3)
U32 = 2 ** 32
ROWS = {
    # columns: the sum fits in 32 bits (NCCL's answer too) x3; the sum is 2**32 exactly; the sum is 3 * 2**32 - 4
    "uint32": [[2 ** 31 + 7, 5, 2 ** 31 + 1, 2 ** 30 + 1, U32 - 1],
               [3, 2 ** 31, 1, 2 ** 31 - 1, U32 - 1],
               [1, 1, 2, 2 ** 30, U32 - 2]],
    # sums: 2**31 + 1 (above int32), -2**31 - 2, -4 (truncated toward zero: -1, not -2), 7
    "int32": [[2 ** 31 - 1, -2 ** 31, -1, 3],
              [1, -1, -1, 2],
              [1, -1, -2, 2]],
    # sums: 2**64 - 6 (wraps to -6 in int64, as NCCL's sum), -2**64 - 1 (wraps to -1), 3 * 2**62 + 3 (wraps to
    # -2**62 + 3), -3 * 2**40 - 2 (no wrap, a negative quotient truncated toward zero), 5
    "int64": [[2 ** 63 - 1, -2 ** 63, 2 ** 62 + 1, -2 ** 40, 1],
              [2 ** 63 - 1, -2 ** 63, 2 ** 62 + 3, -2 ** 40 - 1, 2],
              [-4, -1, 2 ** 62 - 1, -2 ** 40 - 1, 2]],
}
BITS = {"uint32": 32, "int32": 32, "int64": 64}
RS_BLOCK = 2  # elements per rank of the reduce_scatter_tensor case


def rs_row(rank: int) -> list:
    """Rank ``rank``'s reduce_scatter_tensor input at world 3: int64, 3 blocks of RS_BLOCK."""
    base = ROWS["int64"][rank % 3]
    return [base[(rank + j) % len(base)] for j in range(3 * RS_BLOCK)]


def trunc_div(s: int, n: int) -> int:
    q = abs(s) // n
    return -q if s < 0 else q


def wrap(v: int, bits: int) -> int:
    """``v`` as a two's complement signed integer of ``bits`` bits."""
    v &= (1 << bits) - 1
    return v - (1 << bits) if v >> (bits - 1) else v


def mean(columns: list, dtype: str) -> list:
    """Each column's AVG over the ranks: int64 summed with int64's wraparound (NCCL's int64 sum), 32-bit types summed
    exactly (funcoll's int64 sum of a few 32-bit values), quotient truncated toward zero."""
    out = []
    for col in columns:
        s = sum(col)
        out.append(trunc_div(wrap(s, 64) if dtype == "int64" else s, len(col)))
    return out


# ---------------------------------------------------------------------------------------------------
# the fresh interpreter: every rank's program, executed on the replicas
# ---------------------------------------------------------------------------------------------------
def _tensor(dtype: str, values: list):
    import torch

    if dtype == "uint32":  # torch builds no uint32 tensor from Python ints above 2**31 - 1 directly
        return torch.tensor(values, dtype=torch.int64).to(torch.uint32)
    return torch.tensor(values, dtype=getattr(torch, dtype))


def _world(n: int) -> dict:
    import torch
    import torch.distributed as dist

    from funcoll import replicas
    from tests.xla.xla_replica_cases import dev

    F = torch.ops._c10d_functional

    def fn():
        r = dist.get_rank()
        res = {}
        groups = {"world": None}
        if n == 6:
            groups["block of 3"] = dist.new_subgroups(group_size=3)[0]
        for gname, g in groups.items():
            for dtype in ROWS:
                t = _tensor(dtype, ROWS[dtype][r % 3]).to(dev())
                dist.all_reduce(t, op=dist.ReduceOp.AVG, group=g)
                res[f"all_reduce {dtype} {gname}"] = t
        if n == 3:
            o = torch.empty((RS_BLOCK,), dtype=torch.int64, device=dev())
            dist.reduce_scatter_tensor(o, _tensor("int64", rs_row(r)).to(dev()), op=dist.ReduceOp.AVG)
            res["reduce_scatter_tensor int64 world"] = o
            t = _tensor("uint32", ROWS["uint32"][r]).to(dev())
            res["functional all_reduce uint32 world"] = F.wait_tensor(
                F.all_reduce(t, "avg", dist.group.WORLD.group_name))
        return res

    got = replicas.run(fn, n)
    return {name: [[int(v) for v in rank_res[name].to(torch.int64).tolist()] for rank_res in got]
            for name in got[0]}


def replica_run() -> dict:
    return {str(n): _world(n) for n in (3, 6)}


# ---------------------------------------------------------------------------------------------------
# the test
# ---------------------------------------------------------------------------------------------------
def expected(n: int) -> dict:
    """{case: every rank's result}, from every rank's values."""
    want: dict = {}
    blocks = {"world": [list(range(n))] * n}
    if n == 6:
        blocks["block of 3"] = [[0, 1, 2]] * 3 + [[3, 4, 5]] * 3
    for gname, of_rank in blocks.items():
        for dtype in ROWS:
            want[f"all_reduce {dtype} {gname}"] = [
                mean([list(col) for col in zip(*(ROWS[dtype][q % 3] for q in of_rank[r]))], dtype) for r in range(n)]
    if n == 3:
        full = mean([list(col) for col in zip(*(rs_row(q) for q in range(3)))], "int64")
        want["reduce_scatter_tensor int64 world"] = [full[r * RS_BLOCK:(r + 1) * RS_BLOCK] for r in range(3)]
        want["functional all_reduce uint32 world"] = want["all_reduce uint32 world"]
    return want


def test_the_reference_is_truncation_toward_zero():
    # the reference's own rule on hand-made sums: floor division would give -2 and -3 here
    assert mean([[-1, -1, -2]], "int32") == [-1]
    assert mean([[-3, -2, -2]], "int64") == [-2]
    # int64 wraps as NCCL's sum does; 32-bit sums do not
    assert mean([[2 ** 63 - 1, 2 ** 63 - 1, -4]], "int64") == [-2]
    assert mean([[U32 - 1, U32 - 1, U32 - 2]], "uint32") == [U32 - 2]


_cache: dict = {}


def results() -> dict:
    if not _cache:
        _cache.update(fresh.run("tests.xla.test_xla_int_avg:replica_run", env=XLA_CPU))
    return _cache


@pytest.mark.xla
@pytest.mark.parametrize("n", (3, 6))
def test_odd_divisor_integer_avg_executed_on_replicas(n):
    skip_without_replicas()
    got, want = results()[str(n)], expected(n)
    assert sorted(got) == sorted(want)
    for name in want:
        for r in range(n):
            # uint32 results come back as their unsigned values (moved through int64 on the CPU)
            assert got[name][r] == want[name][r], (name, r, got[name][r], want[name][r])
