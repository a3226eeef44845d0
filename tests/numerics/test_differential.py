"""The short run of the randomized differential test (tests/numerics/differential.py): seeded random collective programs
on a funcoll group and a raw gloo group of the same world, on the native, xccl and xla profiles at worlds 2 and 3
(sub-groups at 3; the xla profile on torch_xla's torch only, tests/profiles.py), one seed of each, whose first cases
are every kind once (compiled and functional collectives, uneven list collectives, mixed-evenness all_to_all_single
splits, moves of random bit patterns among them), and six uneven all_to_all cases on the xccl profile at world 4 (the
carried exchange, each planned from the one before). Every case's funcoll result equals the value rebuilt from the
seed, and so does gloo's unless gloo's behaviour is a named, reproduced entry of ``differential.GLOO_KNOWN``; invalid
requests raise on every rank and the ranks stay in step; nothing hangs (the watchdog). The entries' reproducers run
on raw gloo here, and the oracle is shown to fail a case when the entry that covers it is taken away. The long run is
one command per environment: ``./dev python -m tests.numerics.differential --seeds 0-14 --world 2,3,4 --profile
native,xccl,xla`` (see the module)."""

from __future__ import annotations

import pytest
import torch

from funcoll.launch import _spawn_world
from tests import profiles
from tests.numerics import differential
from tests.numerics.differential import _case

PROFILES = [None, "xccl", "xla"]
WORLDS = [2, 3]
# one seed per (profile, world)
SEEDS = {(p, w): [10 * i + w] for i, p in enumerate(PROFILES) for w in WORLDS}

# cases that once failed, written out (profile, world, cases run in order): an all_to_all of 0-row int16 tensors
# moved as bytes (the byte view of a 1-D tensor changed its row count); a point-to-point batch on a sub-group
# followed by a world collective; PREMUL_SUM reduce and async reduce_scatter, each followed by another case; async
# reduce_scatter and isend/irecv polled on a sub-group, each followed by a world collective; list reduce_scatter with
# a different layout on each of 3 ranks (the contiguous rank took the native fast path, the others the full path: a
# rank aborted in gloo with "Received data size doesn't match expected size"); a gather of 0-row tensors moved as
# bits (the root wrote an empty row of bytes back through a view its offset could not take)
FOUND = [
    (None, 2, [_case(2, 10, "all_to_all", torch.int16, "product", (0, 3), ["strided", "transposed"], root=1,
                     rng=0.85)]),
    ("xccl", 3, [_case(100, 37, "batch_isend_irecv", torch.bool, "max", (0, 3), ["contiguous", "transposed", "strided"],
                       wait="future", sub=0, rng=0.89),
                 _case(100, 38, "all_reduce", torch.uint32, "bxor", (), ["strided", "transposed", "contiguous"],
                       async_=True, wait="timeout", root=2, rng=0.98)]),
    (None, 2, [_case(26, 12, "reduce", torch.float64, "premul_sum", (0, 3), ["transposed", "transposed"],
                     wait="timeout", root=1, rng=0.27),
               _case(26, 13, "all_to_all", torch.int64, "sum", (1, 3), ["contiguous", "offset"], wait="future",
                     root=1, rng=0.13)]),
    (None, 3, [_case(305, 27, "reduce_scatter", torch.float64, "premul_sum", (1, 3), ["offset", "transposed",
                                                                                       "transposed"],
                     async_=True, wait="future", root=2, rng=0.77),
               _case(305, 28, "all_gather", torch.uint32, "avg", (1, 3), ["strided"] * 3, wait="future", root=1,
                     sub=0, rng=0.82)]),
    ("xccl", 3, [_case(116, 5, "reduce_scatter", torch.float32, "max", (2, 3), ["offset", "offset", "transposed"],
                       async_=True, wait="poll", sub=0, rng=0.90),
                 _case(116, 9, "async_batch", torch.uint8, "bor", (1, 3), ["contiguous", "strided", "transposed"],
                       wait="poll", rng=0.004),
                 _case(116, 10, "send_recv", torch.int64, "max", (0, 3), ["transposed", "offset", "contiguous"],
                       async_=True, wait="poll", root=1, sub=0, rng=0.59),
                 _case(116, 12, "broadcast", torch.bool, "product", (1, 3), ["strided", "contiguous", "contiguous"],
                       async_=True, rng=0.01)]),
    (None, 3, [_case(401, 38, "reduce_scatter", torch.bfloat16, "max", (2, 3), ["strided", "offset", "transposed"],
                     wait="timeout", rng=0.24)]),
    ("xla", 2, [_case(200, 13, "gather", torch.bfloat16, "max", (0, 3), ["transposed", "transposed"], async_=True,
                      wait="future", root=0, rng=0.72)]),
    (None, 2, [_case(101, 37, "gather", torch.uint16, "avg", (0, 3), ["transposed", "strided"], async_=True,
                     wait="timeout", root=1, rng=0.96)]),
]

# the oracle fails a case when the entry of GLOO_KNOWN that covers it is taken away: (case, what the failure says)
_REDUCE = "gloo's reduce leaves partial results in the tensors of the ranks other than dst"
_DTYPE = "gloo moves no int16, uint16, uint32, uint64 or float8, and gathers no complex"
UNCOVERED = [
    (_case(900, 0, "reduce", torch.float32, "sum", (2, 3), ["contiguous", "contiguous"], ignore=[_REDUCE]),
     "gloo differs from the reference, and no known gloo defect covers the case"),
    (_case(900, 1, "broadcast", torch.int16, "sum", (2, 3), ["contiguous", "contiguous"], ignore=[_DTYPE]),
     "gloo raised RuntimeError: Invalid scalar type (no known gloo refusal matches)"),
]

# the carried uneven all_to_all at world 4 under the xccl profile (worlds 2 and 3 draw it in their seeds): mixed
# evenness, uneven splits with zero splits, the list form, bit patterns, async with a timeout, in a row (each call
# plans from the statistics the one before carried)
_L4 = ["contiguous", "strided", "transposed", "offset"]
CARRIED = [_case(700, i, kind, dtype, "sum", (2, 3), _L4, async_=i % 2 == 1, wait="timeout" if i % 2 else "wait",
                 rng=rng, bits=bits)
           for i, (kind, dtype, rng, bits) in enumerate([
               ("all_to_all_single_mixed", torch.float32, 0.3, False),
               ("all_to_all_single", torch.bfloat16, 0.05, False),
               ("all_to_all_single", torch.int64, 0.45, False),
               ("all_to_all", torch.uint8, 0.2, False),
               ("all_to_all_single", torch.float8_e4m3fn, 0.1, True),
               ("all_to_all_single_mixed", torch.bool, 0.7, False)])]

# one world per (profile, world size) runs every job of that pair, one after the other (a world's start is much of
# a short job's time): the found cases first (each list of cases in order), then the seed
JOBS: dict = {}
for _p, _w, _cases in FOUND:
    JOBS.setdefault((_p, _w), []).append(_cases)
JOBS.setdefault((None, 2), []).append([c for c, _ in UNCOVERED])
JOBS.setdefault(("xccl", 4), []).append(CARRIED)
for (_p, _w), _s in SEEDS.items():
    JOBS.setdefault((_p, _w), []).append((_s, None, True))


@pytest.fixture(scope="module")
def world():
    """``world(profile, n, job)``: this job's per-rank results ``(results, exit codes, hung)`` from the one run of
    every job of (profile, n) (``differential.run_jobs``)."""
    done: dict = {}

    def get(profile, n, job):
        key = (profile, n)
        if key not in done:
            jobs = JOBS[key]
            deadline = sum(400 if isinstance(j, tuple) else 200 for j in jobs)  # each job's own deadline
            done[key] = differential.run_jobs(jobs, profile, n, deadline=deadline)
        results, codes, hung = done[key]
        i = JOBS[key].index(job)
        return [None if r is None else (r[0], r[1][i] if r[0] == "ok" else r[1]) for r in results], codes, hung

    return get


def _ok(results, codes, hung) -> list:
    assert not hung, f"ranks {hung} hung (the watchdog prints the case): exit codes {codes}"
    for r, res in enumerate(results):
        assert res is not None, f"rank {r} died without a result (exit code {codes[r]}; a hang prints its repro)"
        assert res[0] == "ok", res[1]
    return [res[1] for res in results]


@pytest.mark.parametrize("profile,n", [pytest.param(p, w, id=f"{p or 'native'}-{w}", marks=profiles.mark(p))
                                       for p, w in SEEDS])
def test_random_programs_agree_with_the_seed_and_with_gloo(world, profile, n):
    seeds = SEEDS[(profile, n)]
    for res in _ok(*world(profile, n, (seeds, None, True))):
        assert res["failures"] == [], "\n".join(res["failures"])
        counts, kinds = res["counts"], res["kinds"]
        assert counts["cases"] == len(seeds) * differential.CASES_PER_SEED, counts
        assert set(kinds) == set(differential.KINDS), f"kinds never drawn: {set(differential.KINDS) - set(kinds)}"
        assert counts["invalid"] > 0 and counts["mixed layouts"] > counts["cases"] // 4, counts
        if n >= 3:
            assert counts["sub-group"] > 0, counts
        agreed = sum(k.get("gloo agreed", 0) for k in kinds.values())
        assert agreed > counts["cases"] // 4, kinds
        # the moves of bit patterns ran on funcoll and raw gloo alike (gloo moves float8 with send/recv only)
        assert all(kinds[f"{m}_bits"]["cases"] for m in differential.MOVES_BITS), kinds


@pytest.mark.parametrize("profile,n,cases", FOUND,
                         ids=[f"{p or 'native'}-{w}-{c[-1]['seed']}-{c[-1]['i']}" for p, w, c in FOUND])
def test_cases_the_long_run_found_pass(world, profile, n, cases):
    for res in _ok(*world(profile, n, cases)):
        assert res["failures"] == [], "\n".join(res["failures"])
        assert res["counts"]["cases"] == len(cases)


def test_a_gloo_difference_no_entry_covers_fails_the_case(world):
    """Without the entry that covers it, gloo's partial result on reduce's other rank and gloo's refusal of int16
    fail their cases (on the ranks where gloo shows them), funcoll's result being right."""
    per_rank = _ok(*world(None, 2, [c for c, _ in UNCOVERED]))
    for case, says in UNCOVERED:
        failed = [f for res in per_rank for f in res["failures"] if f"--case {case['i']} " in f]
        assert failed and all(says in f and "funcoll:" not in f for f in failed), (says, failed)
    # the reduce's partial result shows on the rank other than dst (dst is rank 0), the refusal on both ranks
    assert len([f for res in per_rank for f in res["failures"] if "--case 0 " in f]) == 1


def test_known_gloo_behaviour_shows_on_raw_gloo():
    """Every entry of GLOO_KNOWN that applies to the running torch shows on raw gloo in its reproducer: a refusal
    raises its error on both ranks, a wrong result (or why a case is not asked) shows on some rank."""
    results, codes, hung = _spawn_world("tests.numerics.differential:gloo_repros", 2, None, deadline=120,
                                        backend="gloo", coll_timeout=30)
    per_rank = [dict(res) for res in _ok(results, codes, hung)]
    expected = [k for k in differential.GLOO_KNOWN if k.current()]
    assert expected and all(list(got) == [k.name for k in expected] for got in per_rank), per_rank
    for k in expected:
        shown = [got[k.name] for got in per_rank]
        if k.error is not None:
            assert shown == ["raised", "raised"], (k.name, shown)
        else:
            assert True in shown and all(isinstance(s, bool) for s in shown), (k.name, shown)


def test_the_carried_all_to_all_at_world_4_agrees_with_the_seed_and_with_gloo(world):
    for res in _ok(*world("xccl", 4, CARRIED)):
        assert res["failures"] == [], "\n".join(res["failures"])
        assert res["counts"]["cases"] == len(CARRIED)
