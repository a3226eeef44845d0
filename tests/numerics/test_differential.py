"""The short run of the randomized differential test (tests/numerics/differential.py): seeded random collective programs
on a funcoll group and a raw gloo group of the same 2-rank world, per profile. Every case's funcoll result matches the
value rebuilt from the seed, and gloo's wherever gloo serves the case; invalid requests raise on every rank and the
ranks stay in step; nothing hangs (the watchdog). The long run is one command:
``./dev python -m tests.numerics.differential --seeds 0-999`` (see the module)."""

from __future__ import annotations

import pytest

from tests.numerics import differential

# (profile, seeds, compiled)
RUNS = [(None, [0, 1], True), ("xccl", [3], False), ("xla", [5], False)]
# cases the long run once failed (profile, seed, cases, world): an all_to_all of 0-row int16 tensors moved as bytes
# (the byte view of a 1-D tensor changed its row count); a point-to-point batch on a sub-group of 3 ranks followed by
# a world collective; PREMUL_SUM reduce and async reduce_scatter (gloo refuses them on some ranks only), each
# followed by another case; async reduce_scatter and isend/irecv polled on a sub-group (raw gloo's never complete by
# polling), each followed by a world collective
FOUND = [(None, 2, [10], 2), ("xccl", 100, [37, 38], 3), (None, 26, [12, 13], 2), (None, 305, [27, 28], 4),
         ("xccl", 116, [5, 9, 10, 12], 3)]


# one world per (profile, world size) runs every job of that pair, one after the other (a world's start is most of
# a short job's time): the found cases first (each list of cases still runs in order, right after the one before
# it), then the short run
JOBS = {}
for _p, _s, _c, _w in FOUND:
    JOBS.setdefault((_p, _w), []).append(([_s], _c, True))
for _p, _s, _c in RUNS:
    JOBS.setdefault((_p, 2), []).append((_s, None, _c))


@pytest.fixture(scope="module")
def world():
    """``world(profile, n, job)``: this job's per-rank results ``(results, exit codes, hung)`` from the one run of
    every job of (profile, n) (``differential.run_jobs``)."""
    done: dict = {}

    def get(profile, n, job):
        key = (profile, n)
        if key not in done:
            jobs = JOBS[key]
            deadline = sum(400 if case is None else 300 for _, case, _ in jobs)  # each job's own deadline
            done[key] = differential.run_jobs(jobs, profile, n, deadline=deadline)
        results, codes, hung = done[key]
        i = JOBS[key].index(job)
        return [None if r is None else (r[0], r[1][i] if r[0] == "ok" else r[1]) for r in results], codes, hung

    return get


@pytest.mark.parametrize("profile,seeds,compiled", RUNS, ids=["native", "xccl", "xla"])
def test_random_programs_agree_with_the_seed_and_with_gloo(world, profile, seeds, compiled):
    results, codes, hung = world(profile, 2, (seeds, None, compiled))
    assert not hung, f"ranks {hung} hung (the watchdog prints the case): exit codes {codes}"
    for r, res in enumerate(results):
        assert res is not None, f"rank {r} died without a result (exit code {codes[r]}; a hang prints its repro)"
        assert res[0] == "ok", res[1]
        assert res[1]["failures"] == [], "\n".join(res[1]["failures"])
        counts = res[1]["counts"]
        assert counts["cases"] == len(seeds) * differential.CASES_PER_SEED, counts
        assert counts["invalid"] > 0 and counts.get("agreed with gloo", 0) > counts["cases"] // 4, counts


@pytest.mark.parametrize("profile,seed,cases,world_size", FOUND,
                         ids=[f"{p or 'native'}-{s}-{c[-1]}" for p, s, c, _ in FOUND])
def test_cases_the_long_run_found_pass(world, profile, seed, cases, world_size):
    results, codes, hung = world(profile, world_size, ([seed], cases, True))
    assert not hung, f"ranks {hung} hung: exit codes {codes}"
    for res in results:
        assert res is not None and res[0] == "ok", res
        assert res[1]["failures"] == [], "\n".join(res[1]["failures"])
        assert res[1]["counts"]["cases"] == len(cases)
