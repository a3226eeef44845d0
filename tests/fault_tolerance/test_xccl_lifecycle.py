"""The XPU profile tells the truth about recovery: under ``FUNCOLL_PROFILE=xccl``, ``FUNCOLL_XCCL_LIFECYCLE=oneccl``
makes the CPU transport's abort and teardown what ProcessGroupXCCL's are today -- ``abort()`` interrupts nothing
(ProcessGroupXCCL overrides neither ``abort()`` nor ``shutdown()``: intel/torch-xpu-ops#5071, open), and destroying
a group blocks while a peer of it has not torn it down too (vllm-project/vllm#57374) -- so the routes that need them
show what they do on XPU: the in-flight collective runs on to the group's timeout, ``shrink_group`` waits for the old
group's teardown. Without the switch the same calls end at once (tests/fault_tolerance/test_abort.py). The route that
still works on XPU, the Baby group (a subprocess killed), is tested with funcoll.torchft's classes.
"""

from __future__ import annotations

import threading
import time
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist

from funcoll.launch import _spawn_world

GROUP_TIMEOUT = 4.0
ONECCL = {"FUNCOLL_XCCL_LIFECYCLE": "oneccl"}
needs_2_15 = pytest.mark.skipif(not hasattr(dist, "shrink_group"), reason="dist.shrink_group is torch >= 2.15")


def _rank_abort_and_teardown(rank, world):
    """Rank 0 aborts a group 0.5 s into a collective rank 1 never joins; then rank 0 destroys a second group 0.5 s
    before rank 1 does (rank 1 alive all along): how long each took."""
    import torch.distributed.distributed_c10d as c10d

    out = {}
    g = dist.new_group(backend="funcoll", timeout=timedelta(seconds=GROUP_TIMEOUT))
    if rank == 0:
        t0 = time.monotonic()
        threading.Timer(0.5, g.abort).start()
        try:
            dist.all_reduce(torch.ones(4), group=g)
            out["abort"] = ("returned", time.monotonic() - t0)
        except Exception as e:  # noqa: BLE001
            out["abort"] = (type(e).__name__, time.monotonic() - t0, str(e))
    dist.barrier()
    h = dist.new_group(backend="funcoll", timeout=timedelta(seconds=GROUP_TIMEOUT))
    dist.all_reduce(torch.ones(1), group=h)
    dist.barrier()
    if rank == 1:
        time.sleep(1.5)
    t0 = time.monotonic()
    c10d.destroy_process_group(h)
    out["teardown"] = time.monotonic() - t0
    return out


@pytest.mark.parametrize("lifecycle", ["oneccl", "funcoll"])
def test_under_oneccl_abort_interrupts_nothing_and_teardown_waits_for_the_peer(lifecycle):
    env = ONECCL if lifecycle == "oneccl" else {"FUNCOLL_XCCL_LIFECYCLE": None}
    results, codes, hung = _spawn_world("tests.fault_tolerance.test_xccl_lifecycle:_rank_abort_and_teardown", 2,
                                        "xccl", deadline=120, coll_timeout=30, env=env)
    assert not hung and codes == [0, 0], (codes, results)
    r0, r1 = results[0][1], results[1][1]
    kind, secs = r0["abort"][:2]
    if lifecycle == "oneccl":
        # the collective ran on to gloo's timeout, as XCCL's would run on: the abort changed nothing
        assert kind == "CollectiveAbortedError" and secs > GROUP_TIMEOUT - 0.5, r0["abort"]
        assert "Timed out waiting 4000ms" in r0["abort"][2], r0["abort"]
        # rank 0's teardown returned once rank 1, 1.5 s later, tore the group down too
        assert 1.0 < r0["teardown"] < GROUP_TIMEOUT, r0["teardown"]
    else:
        assert kind == "CollectiveAbortedError" and secs < 1.5, r0["abort"]
        assert r0["teardown"] < 0.5, r0["teardown"]
    assert r1["teardown"] < 0.5, r1["teardown"]


def _rank_shrink_after_a_loss(rank, world):
    """Rank 2 dies before a collective; the survivors shrink the default group and run one: how long that took."""
    import os
    import signal

    import torch.distributed.distributed_c10d as c10d

    if rank == 2:
        os.kill(os.getpid(), signal.SIGKILL)
    try:
        dist.all_reduce(torch.ones(2))
    except Exception as e:  # noqa: BLE001
        failed = type(e).__name__
    # the survivors learn of the loss together, as a job's control plane tells them (without it, under the oneCCL
    # lifecycle the survivor whose collective ran on to the timeout would reach the new group's connect one timeout
    # after the other, whose connect waits one timeout)
    store = c10d._get_default_store()
    store.add("survivors", 1)
    while int(store.add("survivors", 0)) < 2:
        time.sleep(0.01)
    t0 = time.monotonic()
    dist.shrink_group([2], shrink_flags=c10d.SHRINK_ABORT)
    t = torch.ones(2) * (rank + 1)
    dist.all_reduce(t)
    return {"failed": failed, "recovered": time.monotonic() - t0, "sum": t.tolist()}


@needs_2_15
@pytest.mark.parametrize("lifecycle", ["oneccl", "funcoll"])
def test_under_oneccl_shrink_group_waits_out_the_old_groups_teardown(lifecycle):
    env = ONECCL if lifecycle == "oneccl" else {"FUNCOLL_XCCL_LIFECYCLE": None}
    results, codes, hung = _spawn_world("tests.fault_tolerance.test_xccl_lifecycle:_rank_shrink_after_a_loss", 3,
                                        "xccl", deadline=120, coll_timeout=GROUP_TIMEOUT, env=env)
    assert not hung and codes[:2] == [0, 0] and codes[2] == -9, (codes, results)
    for r in (0, 1):
        assert results[r][0] == "ok", results[r]
        out = results[r][1]
        assert out["failed"] in ("CollectiveError", "CollectiveTimeoutError") and out["sum"] == [3.0, 3.0], out
        if lifecycle == "oneccl":  # the dead rank never tears the old group down: its teardown waits the timeout
            assert out["recovered"] > GROUP_TIMEOUT - 0.5, out
        else:
            assert out["recovered"] < 2.0, out


def stuck_then_aborted(cls_name: str) -> dict:
    """Two replica groups of one funcoll.torchft class (``cls_name``) in this process, on one store: the first
    all_reduces, the second never does; the first is aborted 1 s into its wait. How the wait ended, and when (run in a
    fresh interpreter whose environment names the xccl profile and the oneCCL lifecycle, as the Baby group's
    subprocesses then do too)."""
    import concurrent.futures

    import funcoll.torchft as ft
    from tests.fault_tolerance.torchft_cases import PatientBaby  # the Baby group, its subprocess given time to start

    store = dist.TCPStore("localhost", 0, is_master=True, wait_for_workers=False)
    cls = PatientBaby if cls_name == "ProcessGroupBabyFuncoll" else getattr(ft, cls_name)
    pgs = [cls(timeout=timedelta(seconds=GROUP_TIMEOUT)) for _ in range(2)]
    with concurrent.futures.ThreadPoolExecutor(2) as pool:  # a quorum of two: both configure at once
        list(pool.map(lambda r: pgs[r].configure(f"localhost:{store.port}/q", f"replica_{r}", r, 2), range(2)))
    t0 = time.monotonic()
    threading.Timer(1.0, pgs[0].abort).start()
    try:
        pgs[0].allreduce([torch.ones(2)], dist.AllreduceOptions()).wait()
        out = {"ended": "returned"}
    except Exception as e:  # noqa: BLE001
        out = {"ended": type(e).__name__, "msg": str(e)[:300]}
    out["after_abort"] = time.monotonic() - t0 - 1.0
    for pg in pgs:
        pg.shutdown()
    return out


@pytest.mark.parametrize("cls", ["ProcessGroupBabyFuncoll", "ProcessGroupFuncoll"])
def test_under_oneccl_the_baby_group_is_the_route_an_abort_ends(cls):
    pytest.importorskip("torchft", reason="needs torchft >= 0.2 (funcoll's test extra)")
    from tests import fresh

    out = fresh.run("tests.fault_tolerance.test_xccl_lifecycle:stuck_then_aborted", cls, timeout=180,
                    env={"FUNCOLL_PROFILE": "xccl", **ONECCL})
    if cls == "ProcessGroupBabyFuncoll":  # the subprocess holding the stuck collective is killed: the wait ends now
        assert out["ended"] in ("OSError", "EOFError", "BrokenPipeError", "ConnectionResetError") and \
            out["after_abort"] < 1.0, out
    else:  # in the process: the abort interrupts nothing, the collective ends at the group's timeout
        assert out["ended"] in ("CollectiveAbortedError", "CollectiveTimeoutError") and \
            out["after_abort"] > GROUP_TIMEOUT - 1.5, out
