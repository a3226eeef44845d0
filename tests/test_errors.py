"""Every invalid request raises the documented error on every rank, before anything is sent, without hanging."""

import pytest

from tests.world import run_world


@pytest.mark.parametrize("world,profile", [(2, None), (3, "xccl")])
def test_invalid_requests_raise_on_every_rank(world, profile):
    results = run_world("tests.cases_errors:invalid_requests", world, profile, timeout=150, coll_timeout=30)
    failures = [f for r in results for f in r["failures"]]
    assert not failures, "\n".join(failures)
    assert [r["count"] for r in results] == [21] * world


def test_work_wait_timeout_is_honoured():
    r = run_world("tests.cases_errors:wait_timeout", 2, None, timeout=60, coll_timeout=30)[0]
    assert r["error"] in ("RuntimeError", "TimeoutError"), r
    assert 0.9 < r["waited"] < 3.0, r  # the 1 s asked for, not the 30 s group timeout nor rank 1's 4 s


def test_get_future_does_not_block_and_runs_the_finishing_steps_once():
    r0, r1 = run_world("tests.cases_errors:future_does_not_block", 2, "xccl", timeout=60, coll_timeout=30)
    want = (1.0 + 2.0) / 2
    for r in (r0, r1):
        assert r["tensor"] == [want] * 4, r  # SUM then scale, scaled exactly once
        assert r["value"] == [want * 10] * 4, r
    assert r0["returned_after"] < 0.5 < r0["done_after"], r0  # rank 0's future waited for rank 1, its call did not
