"""Gap-filling in pieces (``Transport.staging_bytes``): the fp16/bf16 AVG all_reduce (float32 reduce_scatter, divide and
round once, all_gather in the tensor's dtype) on a large tensor runs one piece of ``staging_bytes`` of float32 at a
time, so its float32 copy and the transport's temporaries stay bounded. The result must be the same as in one piece:
every element the float32 sum of the ranks' values, divided by n and rounded once. The reference is computed here, in
float64 from every rank's input, then rounded once to the tensor's dtype.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from funcoll.launch import run_world

CASES = [  # (dtype, numel, staging bytes): pieces of staging // 4 // n * n elements
    (torch.bfloat16, 1000, 256),  # 2 ranks: pieces of 64 elements, the last one shorter (1000 = 15 * 64 + 40)
    (torch.float16, 1001, 256),  # not a multiple of the group size: padded first, then in pieces
    (torch.bfloat16, 48, 1 << 20),  # smaller than one piece: one reduce_scatter
    (torch.bfloat16, 10, 4),  # a piece smaller than the group: one row per rank
]


def _input(rank: int, numel: int, dtype) -> torch.Tensor:
    # values whose sum is not exact in bf16/fp16: rounding the sum twice would show
    return ((torch.arange(numel, dtype=torch.float64) * 0.37 + rank * 1.013 + 0.1) % 7.0 + 1.0 / (rank + 3)).to(dtype)


def _rank(rank, n):
    import funcoll

    g = dist.group.WORLD
    tp = g.transport("cpu")
    out = []
    for dtype, numel, staging in CASES:
        tp.staging_bytes = staging
        t = _input(rank, numel, dtype)
        before = tp.calls[("reduce_scatter", "sum", torch.float32)]
        with funcoll.record() as log:
            dist.all_reduce(t, op=dist.ReduceOp.AVG)
        out.append({"got": t.float().tolist(), "pieces": tp.calls[("reduce_scatter", "sum", torch.float32)] - before,
                    "strategies": [s for _, notes in log for s in notes]})
    return out


@pytest.mark.parametrize("n", [2, 3])
def test_avg_in_pieces_is_the_average_rounded_once(n):
    results = run_world("tests.numerics.test_staging:_rank", n, "xccl", timeout=180, coll_timeout=30)
    for i, (dtype, numel, staging) in enumerate(CASES):
        ref = (sum(_input(r, numel, dtype).double() for r in range(n)) / n).to(dtype).float().tolist()
        padded = numel + (-numel % n)
        piece = max(n, staging // 4 // n * n)
        for rank, res in enumerate(results):
            r = res[i]
            assert "avg=float32 reduce_scatter+scale+all_gather" in r["strategies"], r["strategies"]
            assert r["got"] == ref, (dtype, numel, staging, rank)
            assert r["pieces"] == -(-padded // piece), (dtype, numel, staging, rank, r["pieces"])
