"""Uneven all_to_all_single on the profiles without a native alltoallv, against raw gloo's alltoallv on the same
inputs in the same world: under the xccl profile at worlds 2 (pairwise), 3 and 4 (the carried exchange: the first call
of a row size agrees on the split statistics, the later ones plan from the statistics the previous exchange carried,
with no agreement), with mixed-evenness splits, zero splits, one rank sending everything, splits that change from call
to call (rows above the chunk), several dtypes and row shapes (rows of no bytes too; rows of 16 KiB, whose chunk stays
below the largest split with the rows above it as messages, where small rows pad to the largest), two calls in flight
before either is waited, and a promised ``static_split_bound`` (no agreement). One world per size runs every case."""

from __future__ import annotations

import random

import pytest
import torch

from funcoll.launch import run_world

WORLDS = [2, 3, 4]


def _patterns(n: int) -> list:
    """``(name, sp)``: ``sp[i][j]`` the rows rank i sends rank j, every rank computing the same."""
    rng = random.Random(f"a2a/{n}")
    out = [("mixed evenness", [[2] * n if i == 0 else [rng.randrange(4) for _ in range(n)] for i in range(n)]),
           ("zero splits", [[0 if (i + j) % 2 else 3 for j in range(n)] for i in range(n)]),
           ("one rank sends everything", [[40 if i == n - 1 else 0 for j in range(n)] for i in range(n)]),
           ("nothing anywhere", [[0] * n for _ in range(n)]),
           ("balanced", [[5] * n for _ in range(n)])]
    for k in range(4):  # splits that drift from call to call: the carried statistics are the previous call's
        out.append((f"drift {k}", [[rng.randrange(1, 12 + 6 * k) for _ in range(n)] for _ in range(n)]))
    return out


def _inp(dtype, rows, rest, rank, salt):
    g = torch.Generator().manual_seed(hash((rank, salt)) % (1 << 31))
    x = torch.randint(-1000, 1000, (rows,) + rest, generator=g)
    return x.bool() if dtype == torch.bool else x.to(dtype)


def rank_main(rank: int, n: int, *_) -> dict:
    import torch.distributed as dist

    import funcoll
    from funcoll.transport import static_split_bound

    ours, raw = dist.group.WORLD, dist.new_group(backend="gloo")
    failures, notes = [], []
    for dtype, rest in ((torch.float32, ()), (torch.bfloat16, (3,)), (torch.int64, (2, 2)), (torch.bool, (5,)),
                        (torch.float32, (0,)),  # rows of no bytes: nothing moves, the splits still count
                        (torch.float32, (4096,))):  # rows of 16 KiB: padding to the largest split would cost more
        # than the rows above the chunk as messages (the plan's 1.3x byte bound binds; small rows pad instead)
        for name, sp in _patterns(n):
            ins, outs = sp[rank], [sp[i][rank] for i in range(n)]
            x = _inp(dtype, sum(ins), rest, rank, name)
            got, want = x.new_empty((sum(outs),) + rest), x.new_empty((sum(outs),) + rest)
            with funcoll.record() as log:
                dist.all_to_all_single(got, x, outs, ins, group=ours)
            dist.all_to_all_single(want, x, outs, ins, group=raw)
            notes.append((str(dtype), name, [s for _, strategies in log for s in strategies]))
            if not torch.equal(got, want):
                failures.append(f"{dtype} {name}: {got.tolist()} != {want.tolist()}")
    # two calls in flight, waited in reverse order: the second plans from the first's statistics
    pats = _patterns(n)
    xs, works, wants = [], [], []
    for name, sp in pats[-2:]:
        ins, outs = sp[rank], [sp[i][rank] for i in range(n)]
        x = _inp(torch.float32, sum(ins), (7,), rank, name)
        got, want = x.new_empty((sum(outs), 7)), x.new_empty((sum(outs), 7))
        works.append(dist.all_to_all_single(got, x, outs, ins, group=ours, async_op=True))
        dist.all_to_all_single(want, x, outs, ins, group=raw)
        xs.append(got)
        wants.append(want)
    for w in reversed(works):
        w.wait()
    failures += [f"async {i}" for i, (g, w) in enumerate(zip(xs, wants)) if not torch.equal(g, w)]
    # the same splits twice: the second call plans from their own statistics
    for rest, label in (((), "steady, rows of 4 B"), ((4096,), "steady, rows of 16 KiB")):
        name, sp = pats[-1]
        ins, outs = sp[rank], [sp[i][rank] for i in range(n)]
        for _ in range(2):
            x = _inp(torch.float32, sum(ins), rest, rank, label)
            got, want = x.new_empty((sum(outs),) + rest), x.new_empty((sum(outs),) + rest)
            with funcoll.record() as log:
                dist.all_to_all_single(got, x, outs, ins, group=ours)
            dist.all_to_all_single(want, x, outs, ins, group=raw)
            if not torch.equal(got, want):
                failures.append(label)
        notes.append(("torch.float32", label, [s for _, strategies in log for s in strategies]))
    # a promised bound: no agreement, even on the first call of a row size
    name, sp = pats[0]
    ins, outs = sp[rank], [sp[i][rank] for i in range(n)]
    x = _inp(torch.float64, sum(ins), (11,), rank, "bound")
    got, want = x.new_empty((sum(outs), 11)), x.new_empty((sum(outs), 11))
    with funcoll.record() as log, static_split_bound(max(max(r) for r in sp)):
        dist.all_to_all_single(got, x, outs, ins, group=ours)
    dist.all_to_all_single(want, x, outs, ins, group=raw)
    notes.append(("bound", name, [s for _, strategies in log for s in strategies]))
    if not torch.equal(got, want):
        failures.append("static bound")
    return {"failures": failures, "notes": notes}


@pytest.fixture(scope="module")
def worlds():
    done: dict = {}

    def get(n):
        if n not in done:
            done[n] = run_world("tests.numerics.test_uneven_a2a:rank_main", n, "xccl", timeout=240,
                                coll_timeout=60)
        return done[n]

    return get


@pytest.mark.parametrize("n", WORLDS)
def test_uneven_all_to_all_equals_gloo_under_the_xccl_profile(worlds, n):
    for res in worlds(n):
        assert res["failures"] == [], res["failures"]


@pytest.mark.parametrize("n", WORLDS)
def test_the_plan_agrees_once_per_row_size_then_carries(worlds, n):
    for res in worlds(n):
        for dtype, name, notes in res["notes"]:
            uneven = [s for s in notes if s.startswith("uneven all_to_all=")]
            if n == 2:
                assert uneven == ["uneven all_to_all=pairwise send/recv"], (dtype, name, notes)
                continue
            agreed = "uneven all_to_all=agree on split statistics" in uneven
            # the first call of each row size agrees (the patterns' first case); a promised bound never does
            assert agreed == (name == "mixed evenness" and dtype != "bound"), (dtype, name, notes)
            assert any(s.startswith("uneven all_to_all=carried") or "split statistics all_to_all" in s
                       for s in uneven), (dtype, name, notes)
            assert not any("pairwise" in s for s in uneven), (dtype, name, notes)



@pytest.mark.parametrize("n", [3, 4])
def test_small_rows_pad_and_wide_rows_carry_the_rows_above_the_chunk(worlds, n):
    """The same splits a second time, planned from their own statistics: rows of 4 B pad to the largest split (one
    collective, no message: latency-bound); rows of 16 KiB keep the bytes within 1.3x with a chunk below the largest
    split, the rows above it as messages."""
    import re

    big = max(map(max, dict(_patterns(n))["drift 3"]))
    for res in worlds(n):
        chunks = {}
        for _, name, notes in res["notes"]:
            if name.startswith("steady"):
                (m,) = [re.match(r"uneven all_to_all=carried: chunks of (\d+) rows", s) for s in notes
                        if s.startswith("uneven all_to_all=carried")]
                chunks[name] = int(m.group(1))
        assert chunks["steady, rows of 4 B"] >= big and 0 < chunks["steady, rows of 16 KiB"] < big, (chunks, big)
