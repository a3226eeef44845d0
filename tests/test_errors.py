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
