"""The split-size agreement of an uneven ``all_to_all_single`` (no ``funcoll.xla.static_split_bound``) executed on XLA
CPU replicas: funcoll.replicas runs each agreement's all_gather on the replicas (funcoll's all_gather over the
agreement's group) and builds every rank's program with what its own all_gather returned.

Runs in a fresh interpreter (``agreement_run``: each rank of a virtual world is the default process group in
turn).
"""

from __future__ import annotations

import json

import pytest

from tests import fresh
from tests.xla.replica_runs import XLA_CPU, skip_without_replicas

WORLD = 3


def splits(rank: int) -> tuple:
    """(output splits, input splits) of ``rank``: rank i sends i + j + 1 rows to rank j (1 to 5: uneven everywhere)."""
    return [rank + j + 1 for j in range(WORLD)], [j + rank + 1 for j in range(WORLD)]


def agreement_run() -> dict:
    import torch
    import torch.distributed as dist

    from funcoll import replicas
    from tests.xla.xla_replica_cases import dev

    seen: dict = {"executed": 0}
    execute, run_agreements = replicas.execute, replicas._run_agreements

    def counted(*args, **kwargs):
        seen["executed"] += 1
        return execute(*args, **kwargs)

    def recorded(told, world_size):
        rows = run_agreements(told, world_size)
        seen["agreements"] = [[me, list(ranks), i, told[(me, ranks, i)], rows[(me, ranks, i)]]
                              for (me, ranks, i) in sorted(told)]
        return rows

    def fn():
        r = dist.get_rank()
        outs, ins = splits(r)
        o = torch.empty((sum(outs),), dtype=torch.int32, device=dev())
        x = torch.arange(sum(ins), dtype=torch.int32) + 1000 * r
        dist.all_to_all_single(o, x.to(dev()), outs, ins)
        return o

    replicas.execute, replicas._run_agreements = counted, recorded
    try:
        programs = replicas.capture(fn, WORLD)
    finally:
        replicas.execute, replicas._run_agreements = execute, run_agreements
    got = replicas.execute(programs)
    return {"executed during capture": seen["executed"], "agreements": seen.get("agreements"),
            "all_to_all": [t.tolist() for t in got]}


_cache: dict = {}


def results() -> dict:
    if not _cache:
        skip_without_replicas()
        _cache.update(fresh.run("tests.xla.test_xla_agreement:agreement_run", env=XLA_CPU))
    return _cache


pytestmark = pytest.mark.xla


def test_the_agreement_is_each_ranks_all_gather_run_on_the_replicas():
    res = results()
    assert res["executed during capture"] == 1  # the agreements' all_gathers: one run on the replicas
    sent = {me: values for me, _, _, values, _ in res["agreements"]}
    assert sorted(sent) == list(range(WORLD))
    assert len({json.dumps(v) for v in sent.values()}) == WORLD  # every rank sends its own values
    for me, ranks, i, _, rows in res["agreements"]:
        assert (ranks, i) == (list(range(WORLD)), 0)
        # what this rank's all_gather returned: every member's values, in group order
        assert rows == [sent[q] for q in ranks], me


def test_the_uneven_all_to_all_built_on_that_answer_moves_every_row():
    res = results()
    for r, got in enumerate(res["all_to_all"]):
        want = []
        for q in range(WORLD):
            sends = splits(q)[1]
            start = sum(sends[:r])
            want += [1000 * q + k for k in range(start, start + sends[r])]
        assert got == want, r
