"""Integer AVG where the sum overflows the dtype, at int8 and int32, on every profile (native gloo, xccl, xla,
torchtpu), at 2 and 3 ranks, through eager all_reduce, reduce_scatter_tensor and reduce and the functional all_reduce.

funcoll's rule: the exact sum (int64), divided with truncation toward zero. NCCL truncates the same way but sums in the
tensor's own dtype: ``ncclAvg`` on an integer type is ``FuncSumPostDiv<T>``, whose reduce is ``FuncSum<T>`` (a sum in
T) and whose post-op ``divide`` divides the absolute value and restores the sign (NVIDIA/nccl
``src/device/reduce_kernel.h`` at 0180f9abe2ccbee8666c44685d1bd4c3dfafaaab). So where a sum wraps in the dtype the two
differ, and funcoll deliberately gives the exact mean: int8 AVG of [100, 100] is 100 here and -28 on NCCL. Both
answers are computed here with Python integers from every rank's values; every case below is one where they differ,
and the test asserts funcoll's and that it is not NCCL's.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol

from funcoll.launch import run_world
from tests import profiles

PROFILES = [None, "xccl", "xla", "torchtpu"]
BITS = {"int8": 8, "int32": 32}
# per dtype, rank r's values are ROWS[dtype][r]; every column's sum overflows the dtype at 2 and at 3 ranks
ROWS = {
    "int8": [[100, -100, 127, -128, 90], [100, -100, 127, -128, 90], [27, -29, 1, -1, 90]],
    "int32": [[2 ** 31 - 1, -2 ** 31, 2 ** 30 + 1, -2 ** 30 - 7, 2 ** 31 - 5],
              [2 ** 31 - 1, -1, 2 ** 30 + 3, -2 ** 30 - 1, 2 ** 31 - 7],
              [5, -2 ** 31, 2 ** 30, -2 ** 30, 3]],
}


def trunc_div(s: int, n: int) -> int:
    """``s / n`` rounded toward zero (Python's ``//`` floors)."""
    q = abs(s) // n
    return -q if s < 0 else q


def wrap(v: int, bits: int) -> int:
    """``v`` as a two's complement integer of ``bits`` bits (what a sum in the dtype holds)."""
    v &= (1 << bits) - 1
    return v - (1 << bits) if v >> (bits - 1) else v


def exact(dtype: str, n: int) -> list:
    """funcoll's answer: the exact sum of the first ``n`` ranks' values, divided with truncation."""
    return [trunc_div(sum(col), n) for col in zip(*ROWS[dtype][:n])]


def nccl(dtype: str, n: int) -> list:
    """NCCL's (FuncSumPostDiv): the sum in the dtype (wrapped), divided with truncation."""
    return [trunc_div(wrap(sum(col), BITS[dtype]), n) for col in zip(*ROWS[dtype][:n])]


def averages(rank, n):
    """Every entry's AVG of both dtypes: {(dtype, entry): values}."""
    group = dist.group.WORLD
    out = {}
    for name in BITS:
        dt = getattr(torch, name)
        x = torch.tensor(ROWS[name][rank], dtype=dt)
        t = x.clone()
        dist.all_reduce(t, op=dist.ReduceOp.AVG)
        out[(name, "all_reduce")] = t.tolist()
        full = torch.stack([x] * n)  # every rank's block is its row: rank r's output is the AVG of the rows
        o = torch.empty_like(x)
        dist.reduce_scatter_tensor(o, full.reshape(-1), op=dist.ReduceOp.AVG)
        out[(name, "reduce_scatter_tensor")] = o.tolist()
        t = x.clone()
        dist.reduce(t, dst=n - 1, op=dist.ReduceOp.AVG)
        if rank == n - 1:
            out[(name, "reduce")] = t.tolist()
        y = funcol.wait_tensor(funcol.all_reduce(x, "avg", group))
        out[(name, "functional all_reduce")] = y.tolist()
        out[(name, "input after")] = x.tolist()
    return out


@pytest.mark.parametrize("world", [2, 3])
@pytest.mark.parametrize("profile", profiles.params(PROFILES, ["gloo", "xccl", "xla", "torchtpu"]))
def test_integer_avg_is_the_exact_mean_where_nccls_sum_in_the_dtype_wraps(world, profile):
    res = run_world("tests.numerics.test_int_avg_overflow:averages", world, profile, timeout=120)
    for name in BITS:
        want, theirs = exact(name, world), nccl(name, world)
        # every column is a case where the sum in the dtype wraps: NCCL's answer differs from the exact mean
        assert all(a != b for a, b in zip(want, theirs)), (name, want, theirs)
        for rank, got in enumerate(res):
            entries = ["all_reduce", "reduce_scatter_tensor", "functional all_reduce"] + (
                ["reduce"] if rank == world - 1 else [])
            for entry in entries:
                assert got[(name, entry)] == want, (profile, rank, name, entry, got[(name, entry)], want, theirs)
            assert got[(name, "input after")] == ROWS[name][rank], (profile, rank, name)


def test_the_cases_are_ncclsums_wrapping():
    """The worked example of docs/xpu.md: int8 AVG of [100, 100] is 100 on funcoll, -28 on NCCL."""
    assert exact("int8", 2)[0] == 100 and nccl("int8", 2)[0] == -28
    assert exact("int32", 2)[0] == 2 ** 31 - 1 and nccl("int32", 2)[0] == -1
