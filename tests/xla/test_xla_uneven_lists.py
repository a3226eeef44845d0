"""The list forms ``dist.reduce_scatter(out, inputs)`` and ``dist.all_gather(outs, inp)`` on XLA with a size per rank
(as NCCL serves them), executed on 2, 4 and 8 replicas of the XLA CPU runtime (funcoll.replicas, jaxlib), every
number checked against a reference computed here with plain torch from every rank's input.

XLA has no list form: every size is in every rank's list, so funcoll pads every block to the largest, runs one even
collective and cuts the padding off (or, where padding would more than double the bytes, reduce_scatter runs one
all-reduce of the concatenation and keeps this rank's block), with no agreement and no host sync: building the calls
executes nothing and falls back to the CPU for nothing (``torch_xla.debug.metrics``). Even sizes stay the even
path. Each rank's output has its own size, so each rank's own module runs in a process of its own (the collectives
match). ``world_main(N)`` runs in a fresh interpreter (tests/fresh.py) and returns every rank's results.
"""

from __future__ import annotations

import re

import pytest

from tests import fresh
from tests.xla.replica_runs import XLA_CPU, mismatches, skip_without_replicas

WORLDS = (2, 4, 8)


def shapes_of(n: int) -> dict:
    """Per case, the output shape of each rank of a reduce_scatter (the input shape of each rank of an all_gather)."""
    return {"even": [(2, 3)] * n, "uneven": [(r % 3 + 1, 2) for r in range(n)],
            "skewed": [(1, 2)] * (n - 1) + [(2 * n, 2)]}


def _cases():
    import torch

    return [("sum", torch.float32)]  # one reduce op: each collective is one more program to compile per replica


def program(n: int, notes: list):
    import torch
    import torch.distributed as dist
    import torch_xla
    import torch_xla.debug.metrics as met

    import funcoll
    from tests.semantics.test_uneven_lists import _value

    def fn():
        r = dist.get_rank()
        dev = torch_xla.device()
        inputs = {}
        for case, shapes in shapes_of(n).items():
            for op, dtype in _cases():
                inputs[f"reduce_scatter {case} {op}"] = [_value(shapes[d], dtype, r, d, 0).to(dev) for d in range(n)]
            inputs[f"all_gather {case}"] = _value(shapes[r], torch.float32, r, 0, 0).to(dev)
        met.clear_all()
        res, strategies = {}, {}
        for case, shapes in shapes_of(n).items():
            for op, dtype in _cases():
                name = f"reduce_scatter {case} {op}"
                o = torch.empty(shapes[r], dtype=dtype, device=dev)
                dist.reduce_scatter(o, inputs[name], op=getattr(dist.ReduceOp, op.upper()))
                res[name] = o
                strategies[name] = funcoll.flight_recorder.entries()[-1].strategies
            name = f"all_gather {case}"
            outs = [torch.empty(shapes[q], device=dev) for q in range(n)]
            dist.all_gather(outs, inputs[name])
            res[name] = torch.cat([x.reshape(-1) for x in outs])
            strategies[name] = funcoll.flight_recorder.entries()[-1].strategies
        notes.append({"fallbacks": met.executed_fallback_ops(),
                      "executions": met.counter_value("ExecuteComputation") or 0,
                      "aten counters": [c for c in met.counter_names() if c.startswith("aten::")],
                      "strategies": strategies})
        return res

    def expected(rank):
        want = {}
        for case, shapes in shapes_of(n).items():
            for op, dtype in _cases():
                xs = torch.stack([_value(shapes[rank], dtype, q, rank, 0) for q in range(n)])
                want[f"reduce_scatter {case} {op}"] = (xs.sum(0) if op == "sum" else xs.max(0).values).reshape(-1)
            want[f"all_gather {case}"] = torch.cat([_value(shapes[q], torch.float32, q, 0, 0).reshape(-1)
                                                    for q in range(n)])
        return {k: v.tolist() for k, v in want.items()}

    return fn, expected


def _collectives(text: str) -> list:
    """Every all-reduce, all-gather and reduce-scatter of an HLO module: ``(opcode, element count of its result)``."""
    out = []
    for m in re.finditer(r"= \w+\[([\d,]*)\][^=]*? (all-reduce|all-gather|reduce-scatter)\(", text):
        count = 1
        for d in filter(None, m.group(1).split(",")):
            count *= int(d)
        out.append((m.group(2), count))
    return sorted(out)


def world_main(n: int) -> dict:
    from funcoll import replicas

    notes: list = []
    fn, expected = program(n, notes)
    world = replicas.capture(fn, n)
    got = replicas.execute(world)
    failures = mismatches(n, got, expected, lambda g, w: f"got {g}, want {w}")
    return {"failures": failures, "count": sum(len(expected(r)) for r in range(n)), "same": world.same,
            "collectives": [_collectives(p.text) for p in world.ranks], "notes": notes}


# ---------------------------------------------------------------------------------------------------
# the tests
# ---------------------------------------------------------------------------------------------------
pytestmark = pytest.mark.xla
_cache: dict = {}


def results() -> dict:
    if not _cache:
        skip_without_replicas()
        runs = {n: ("tests.xla.test_xla_uneven_lists:world_main", n) for n in WORLDS}
        _cache.update(fresh.run_all(runs, env=XLA_CPU))
    return _cache


@pytest.mark.parametrize("n", WORLDS)
def test_uneven_lists_executed_on_replicas_match_the_reference(n):
    got = results()[n]
    assert got["failures"] == [], "\n".join(got["failures"][:20])
    assert got["count"] == n * 3 * 2  # per rank: 3 cases x (a reduce_scatter and an all_gather)


@pytest.mark.parametrize("n", WORLDS)
def test_the_plan_reads_the_sizes_every_rank_sees_and_syncs_nothing(n):
    notes = results()[n]["notes"]
    assert len(notes) == n
    for note in notes:
        assert (note["fallbacks"], note["executions"], note["aten counters"]) == ([], 0, []), note
        assert note["strategies"] == notes[0]["strategies"]  # the same plan on every rank
    strategies = notes[0]["strategies"]
    for name, taken in strategies.items():
        op, case = name.split()[:2]
        sizes = [a * b for a, b in shapes_of(n)[case]]
        if case == "even":
            assert taken == ["native"], (name, taken)
        elif op == "reduce_scatter" and n * max(sizes) > 2 * sum(sizes):
            assert taken == ["uneven reduce_scatter=all_reduce+slice"], (name, taken)
        else:
            assert taken == [f"uneven {op}=pad to {max(sizes)}+{op}+unpad"], (name, taken)
    # the collectives: the same on every rank (each rank's module differs only in its own slice)
    collectives = results()[n]["collectives"]
    assert all(c == collectives[0] for c in collectives)
