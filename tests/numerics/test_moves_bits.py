"""broadcast and scatter move bytes, on the path users get by default (no ``funcoll.record()``), on the native gloo
transport and under the xccl, xla and torchtpu capability profiles, at 2 and 3 CPU ranks.

NCCL, gloo and MPI copy a broadcast's and a scatter's bytes and leave the root's buffer as it is: gloo's broadcast
sends and receives the buffer along a binomial tree, the root only sends (pytorch/gloo ``gloo/broadcast.cc`` at
e00553106500ced82758029324acf69f03079a4e; its scatter sends each rank its slice, ``gloo/scatter.cc``); ncclBroadcast
enqueues ncclFuncBroadcast, which "copies count values from root to all other devices" (NVIDIA/nccl
``src/collectives.cc`` at f9c3dc251e0fd3144341b4f43336c53dd913c110, ``nccl.h``). Where funcoll fills them (the xla
and torchtpu profiles: no native broadcast or scatter), every rank must end with the root's bits all the same: every
NaN payload, signalling NaNs, -0.0, subnormals, inf (tests/bit_patterns.py), in float16, bfloat16, float32, float64,
the float8s and complex64; the root's own tensor keeps its bits. The expected bits are the root's input, built on
every rank from the seed: no funcoll code computes them.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

import funcoll
from funcoll.launch import run_world
from tests import profiles
from tests.bit_patterns import differ, patterns

DTYPES = [torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.float8_e4m3fn, torch.float8_e5m2,
          torch.complex64]
PROFILES = [None, "xccl", "xla", "torchtpu"]


def moves(rank, n):
    """Every rank's broadcasts and scatters of every dtype's bit patterns; what differs from the root's bits."""
    failures, count = [], 0
    first = len(funcoll.flight_recorder.entries())
    group = dist.group.WORLD

    def check(name, got, want):
        nonlocal count
        count += 1
        err = differ(got, want)
        if err:
            failures.append(f"[rank {rank}] {name}: {err}")

    for dt in DTYPES:
        for src in (0, n - 1):
            t = patterns(dt, rank, f"bc {src}")
            dist.broadcast(t, src=src)
            check(f"broadcast {dt} src={src}", t, patterns(dt, src, f"bc {src}"))
        # a strided tensor on odd ranks, contiguous on even ones: the plan reads no rank's layout
        t = patterns(dt, rank, "bc strided").view(4, -1)
        if rank % 2:
            t = t.t().contiguous().t()
        dist.broadcast(t, src=1)
        check(f"broadcast {dt} src=1, strided on odd ranks", t, patterns(dt, 1, "bc strided").view(4, -1))
        f = torch.ops._c10d_functional
        got = f.wait_tensor(f.broadcast(patterns(dt, rank, "fbc"), n - 1, group.group_name))
        check(f"functional broadcast {dt}", got, patterns(dt, n - 1, "fbc"))
        src = n - 1
        ins = [patterns(dt, j, f"sc {src}", 32).view(2, -1) for j in range(n)] if rank == src else None
        out = torch.empty((2, patterns(dt, 0, f"sc {src}", 32).numel() // 2), dtype=dt)
        dist.scatter(out, ins, src=src)
        check(f"scatter {dt} src={src}", out, patterns(dt, rank, f"sc {src}", 32).view(2, -1))
        if ins is not None:
            for j, i in enumerate(ins):
                check(f"scatter {dt}: the root's input {j} afterwards", i,
                      patterns(dt, j, f"sc {src}", 32).view(2, -1))
    entries = funcoll.flight_recorder.entries()[first:]
    strategies = sorted({s for c in entries for s in c.strategies})
    tp = group.transport("cpu")
    calls = sorted({(p, op, str(d)) for (p, op, d) in tp.calls})
    return {"failures": failures, "count": count, "strategies": strategies, "calls": calls}


@pytest.fixture(scope="module")
def results():
    cache = {}

    def get(world, profile):
        if (world, profile) not in cache:
            cache[(world, profile)] = run_world("tests.numerics.test_moves_bits:moves", world, profile, timeout=120)
        return cache[(world, profile)]

    return get


@pytest.mark.parametrize("world", [2, 3])
@pytest.mark.parametrize("profile", profiles.params(PROFILES, ["gloo", "xccl", "xla", "torchtpu"]))
def test_broadcast_and_scatter_deliver_the_roots_bits(results, world, profile):
    got = results(world, profile)
    failures = [f for r in got for f in r["failures"]]
    assert not failures, f"{len(failures)} failing cases:\n" + "\n".join(failures[:20])
    assert got[0]["count"] == len(DTYPES) * 5
    assert got[-1]["count"] == len(DTYPES) * (5 + world)  # the root of the scatter checks its inputs too
    filled = profile in ("xla", "torchtpu")
    for r in got:
        assert ("broadcast=masked all_reduce" in r["strategies"]) is filled, r["strategies"]
        if filled:
            assert "scatter=broadcast+slice" in r["strategies"], r["strategies"]
            # the masked sum runs on integers: no floating all_reduce, no broadcast or scatter reached the backend
            reduced = {d for p, op, d in r["calls"] if p == "all_reduce"}
            assert reduced and reduced <= {"torch.uint8", "torch.int8", "torch.int16", "torch.int32", "torch.int64"}, \
                r["calls"]
            assert not {p for p, _, _ in r["calls"]} & {"broadcast", "scatter"}, r["calls"]
