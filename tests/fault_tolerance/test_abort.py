"""``pg.abort()`` on a funcoll group ends its in-flight collectives at once, on every path: a blocking call on the
fast path, an async Work and the backend future the fast path hands out as its future, the full path's Work (a
strategy's) and funcoll's future, a receive. On CPU that is gloo's own operations ending: funcoll closes the group's
gloo connections (a receive nobody sends, timed out after 1 ms: gloo's timeout closes every pair of the context), so
the operations in gloo's worker threads fail too. Beside it, what gloo alone does: on a gloo group, abort() returns
and the wait goes on until the group's timeout (gloo has no backend abort: pytorch/gloo#388).

A real 2-rank world: rank 1 joins each group and never issues the collective rank 0 waits on; another thread of rank
0 aborts the group ABORT_AFTER seconds into the wait.
"""

from __future__ import annotations

import re
import threading
import time
from datetime import timedelta

import pytest

from funcoll.launch import _spawn_world

ABORT_AFTER = 0.5  # seconds into the wait
GROUP_TIMEOUT = 6.0  # the timeout of each group the waits run on: far past an abort's
AT_ONCE = 0.5  # "at once": the wait ends within this of the abort

# what rank 0 waits on, each on a group of its own (_wait_on); "async_future" is gloo's own future, which the fast
# path hands out as its async Work's (DDP's Reducer reads only that: no Python callback on gloo's thread)
CASES = ["blocking", "async_work", "full_path_work", "full_path_future", "recv"]


def _wait_on(case, group):
    import torch
    import torch.distributed as dist

    t = torch.ones(4)
    if case == "blocking":  # the fast path's blocking call: the caller's own thread waits on gloo's Work
        return lambda: dist.all_reduce(t, group=group)
    if case in ("async_work", "async_future"):  # the fast path's async Work (NativeWork)
        w = dist.all_reduce(t, group=group, async_op=True)
        return w.wait if case == "async_work" else w.get_future().wait
    if case in ("full_path_work", "full_path_future"):  # a strategy: the list all_gather pads (gloo takes one size)
        outs = [torch.empty(2), torch.empty(3)]
        w = dist.all_gather(outs, torch.ones(2), group=group, async_op=True)
        return w.wait if case == "full_path_work" else w.get_future().wait
    if case == "recv":
        w = dist.irecv(t, src=1, group=group)
        return w.wait
    raise AssertionError(case)


def _timed(fn, group, abort_after: float):
    """``fn()`` while another thread aborts ``group`` ``abort_after`` seconds in: (error type, message, seconds the
    wait went on after the abort)."""
    aborted = []

    def abort():
        time.sleep(abort_after)
        aborted.append(time.monotonic())
        group.abort()

    th = threading.Thread(target=abort)
    th.start()
    try:
        fn()
        out = ("returned", "")
    except Exception as e:  # noqa: BLE001 - reported
        out = (type(e).__name__, str(e))
    end = time.monotonic()
    th.join()
    return (*out, end - aborted[0] if aborted else -1.0)


def _rank_abort(rank, world):
    import torch.distributed as dist

    out = {}
    for case in CASES + ["async_future", "gloo"]:
        backend = "gloo" if case == "gloo" else "funcoll"
        g = dist.new_group(backend=backend, timeout=timedelta(seconds=GROUP_TIMEOUT))
        if rank == 0:
            fn = _wait_on("blocking", g) if case == "gloo" else _wait_on(case, g)
            out[case] = _timed(fn, g, ABORT_AFTER)
            if case != "gloo":  # after the abort, the group refuses at once, naming why
                t0 = time.monotonic()
                try:
                    dist.all_reduce(__import__("torch").ones(1), group=g)
                    out[case + ":after"] = ("returned", "", 0.0)
                except Exception as e:  # noqa: BLE001
                    out[case + ":after"] = (type(e).__name__, str(e), time.monotonic() - t0)
        dist.barrier()  # rank 1 never issued rank 0's collective on g: the next group, in step
    return out


@pytest.fixture(scope="module")
def waits():
    results, codes, hung = _spawn_world("tests.fault_tolerance.test_abort:_rank_abort", 2, deadline=150,
                                        coll_timeout=60)
    assert not hung and results[0] is not None and results[0][0] == "ok", (results, codes)
    assert codes == [0, 0], codes  # neither process aborted nor crashed on the way out
    return results[0][1]


@pytest.mark.parametrize("case", CASES)
def test_abort_ends_the_wait_at_once(waits, case):
    kind, msg, after = waits[case]
    assert kind == "CollectiveAbortedError", (kind, msg)
    assert after < AT_ONCE, f"{case}: the wait went on {after:.2f} s after pg.abort()"
    op = "recv p2p" if case == "recv" else "all_gather" if case.startswith("full_path") else "all_reduce"
    m = re.fullmatch(rf"funcoll: {op} #0 on group '(\d+)' \(global ranks 0,1; this is rank 0 of 2\) was aborted: "
                     r"pg.abort\(\) was called on group '(\d+)' on this rank \((.*)\)", msg)
    assert m and m.group(1) == m.group(2), msg
    assert m.group(3) == "Application timeout caused pair closure", msg  # gloo's operation ended with it


def test_the_fast_paths_backend_future_ends_at_once_with_gloos_error(waits):
    kind, msg, after = waits["async_future"]
    assert (kind, msg) == ("RuntimeError", "Application timeout caused pair closure") and after < AT_ONCE, waits


@pytest.mark.parametrize("case", CASES)
def test_an_aborted_group_refuses_what_comes_next(waits, case):
    kind, msg, secs = waits[case + ":after"]
    assert kind == "CollectiveError" and secs < 1.0, (kind, msg, secs)
    assert " was aborted (pg.abort() was called on group " in msg, msg
    assert msg.endswith("collectives need a new group (docs/fault-tolerance.md: shrink_group, _reconfigure, a new "
                        "torchft quorum)"), msg


def test_on_gloo_the_wait_goes_on_until_the_timeout(waits):
    kind, msg, after = waits["gloo"]
    # gloo's own timeout error, GROUP_TIMEOUT after the call began (ABORT_AFTER of it before the abort)
    assert kind in ("RuntimeError", "DistBackendError") and "Timed out waiting 6000ms for recv" in msg, (kind, msg)
    assert after > GROUP_TIMEOUT - ABORT_AFTER - 0.5, after
