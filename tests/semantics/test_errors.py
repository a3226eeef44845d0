"""Every invalid request raises the documented error on every rank, before anything is sent, without hanging.

The rank bodies run on every rank of a real world (``funcoll.launch.run_world``): each invalid request must raise
the documented error on the calling rank before anything is sent; afterwards a valid collective proves no rank hangs
or is out of step. The tests below assert on what they return.
"""

import pytest
import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as fc

import funcoll
from funcoll import algorithms
from funcoll.launch import run_world
from funcoll.transport.registry import transport_for

R = dist.ReduceOp


def expect(exc, text, fn):
    try:
        fn()
    except exc as e:
        return None if text in str(e) else f"{type(e).__name__} message {str(e)!r} lacks {text!r}"
    except Exception as e:  # noqa: BLE001
        return f"raised {type(e).__name__}: {e} instead of {exc.__name__}"
    return f"no {exc.__name__} raised"


def invalid_requests(rank, n):
    g = dist.group.WORLD
    tp = transport_for(g, "cpu")
    f, i = torch.ones(4), torch.ones(4, dtype=torch.int32)
    cases = {
        "unknown reduce op": (ValueError, "funcoll.all_reduce: unknown reduce op 'median'; use one of sum, avg, "
                              "product, min, max, band, bor, bxor, premul_sum",
                              lambda: algorithms.all_reduce(tp, f.clone(), "median")),
        "bitwise on float": (TypeError, "funcoll.all_reduce: reduce op bxor needs an integer or bool tensor, got "
                             "torch.float32", lambda: dist.all_reduce(f.clone(), op=R.BXOR)),
        "max on complex": (TypeError, "funcoll.all_reduce: reduce op max is not defined for complex tensors",
                           lambda: algorithms.all_reduce(tp, torch.ones(2, dtype=torch.complex64), "max")),
        "avg on bool": (TypeError, "funcoll.all_reduce: reduce op avg is not defined for bool tensors",
                        lambda: dist.all_reduce(torch.ones(2, dtype=torch.bool), op=R.AVG)),
        "premul_sum on int": (TypeError, "funcoll.all_reduce: reduce op premul_sum needs a floating point tensor",
                              lambda: dist.all_reduce(i.clone(), op=dist._make_nccl_premul_sum(2.0))),
        "reduce float8": (TypeError, "cannot be reduced (float8 is supported by non-reducing ops only)",
                          lambda: dist.all_reduce(torch.ones(2).to(torch.float8_e4m3fn))),
        "reduce_scatter dim 0": (ValueError, f"funcoll.reduce_scatter_tensor: input dim 0 (5) must be divisible by "
                                 f"the group size ({n})",
                                 lambda: dist.reduce_scatter_tensor(torch.empty(2), torch.ones(5))),
        "a2a split count": (ValueError, f"funcoll.all_to_all_single: input_split_sizes has {n + 1} entries, "
                            f"expected one per rank of the group ({n})",
                            lambda: dist.all_to_all_single(torch.empty(n + 1), torch.ones(n + 1), [1] * (n + 1),
                                                           [1] * (n + 1))),
        "a2a split sum": (ValueError, f"funcoll.all_to_all_single: input_split_sizes {[2] * n} sum to {2 * n}, but "
                          f"input dim 0 is {2 * n + 1}",
                          lambda: dist.all_to_all_single(torch.empty(2 * n), torch.ones(2 * n + 1), [2] * n, [2] * n)),
        "a2a negative split": (ValueError, "has a negative entry",
                               lambda: algorithms.all_to_all_single(tp, torch.empty(n), torch.ones(n), [1] * n,
                                                    [2, -1] + [1] * (n - 2))),
        "gather output shape": (ValueError, f"funcoll.all_gather_into_tensor: output has shape (3,), expected "
                                f"({4 * n},)", lambda: dist.all_gather_into_tensor(torch.empty(3), f)),
        "gather output dtype": (TypeError, "funcoll.all_gather_into_tensor: output has dtype torch.int32, expected "
                                "torch.float32", lambda: dist.all_gather_into_tensor(
                                    torch.empty(4 * n, dtype=torch.int32), f)),
        "gather output device": (ValueError, "funcoll.all_gather_into_tensor: output is on meta, expected cpu",
                                 lambda: algorithms.all_gather_into_tensor(tp, torch.empty(4 * n, device="meta"), f)),
        "src outside group": (ValueError, f"funcoll.broadcast: src=7 is outside the group (group-local ranks are "
                              f"0..{n - 1})", lambda: algorithms.broadcast(tp, f.clone(), 7)),
        "functional src outside group": (ValueError, "funcoll.broadcast: src=7 is outside the group",
                                         lambda: fc.wait_tensor(torch.ops._c10d_functional.broadcast(
                                             f, 7, g.group_name))),
        "reduce dst outside group": (ValueError, "funcoll.reduce: dst=-1 is outside the group",
                                     lambda: algorithms.reduce(tp, f.clone(), -1)),
        "group does not exist": (ValueError, "funcoll: no process group named 'no-such-group'",
                                 lambda: transport_for("no-such-group", "cpu")),
        "premul factor shape": (ValueError, "funcoll.all_reduce: premul_sum factor must be a scalar or a "
                                "one-element tensor, got shape (2,)",
                                lambda: algorithms.all_reduce(tp, f.clone(), funcoll.semantics.Reduction(
                                    funcoll.semantics.ReduceOp.PREMUL_SUM, torch.ones(2)))),
    }
    failures = []
    for name, (exc, text, fn) in cases.items():
        err = expect(exc, text, fn)
        if err:
            failures.append(f"[rank {rank}] {name}: {err}")
    # with funcoll's kernels on the CPU key, the functional ops validate the same way
    funcoll.install(["cpu"])
    try:
        for name, (exc, text, fn) in {
            "functional unknown reduce op": (ValueError, "funcoll.all_reduce: unknown reduce op 'median'",
                                             lambda: fc.wait_tensor(torch.ops._c10d_functional.all_reduce(
                                                 f, "median", g.group_name))),
            "functional group size": (ValueError, f"funcoll.all_gather_into_tensor: group_size={n + 1} but group "
                                      f"{g.group_name!r} has {n} ranks",
                                      lambda: torch.ops._c10d_functional.all_gather_into_tensor(f, n + 1,
                                                                                                g.group_name)),
            "functional max on complex": (TypeError, "funcoll.all_reduce: reduce op max is not defined for "
                                          "complex tensors", lambda: torch.ops._c10d_functional.all_reduce(
                                              torch.ones(2, dtype=torch.complex64), "max", g.group_name)),
            "functional unknown group": (ValueError, "funcoll: no process group named 'nope'",
                                         lambda: torch.ops._c10d_functional.all_reduce(f, "sum", "nope")),
        }.items():
            err = expect(exc, text, fn)
            if err:
                failures.append(f"[rank {rank}] {name}: {err}")
    finally:
        funcoll.uninstall()
    # nothing was sent by the failed calls: the next collective pairs up correctly on every rank
    t = torch.full((3,), float(rank + 1))
    dist.all_reduce(t)
    if not torch.equal(t, torch.full((3,), float(sum(range(1, n + 1))))):
        failures.append(f"[rank {rank}] ranks out of step after the errors: {t.tolist()}")
    return {"failures": failures, "count": len(cases) + 3}


def wait_timeout(rank, n):
    """``Work.wait(timeout)`` bounds the wait: rank 0 waits on an all_reduce that rank 1 joins only later."""
    import time
    from datetime import timedelta

    t = torch.ones(4)
    if rank == 0:
        w = dist.all_reduce(t, op=R.AVG, async_op=True)
        t0 = time.monotonic()
        err = msg = None
        try:
            w.wait(timeout=timedelta(seconds=1))
        except RuntimeError as e:  # funcoll.CollectiveTimeoutError (a DistBackendError) naming the collective
            err = type(e).__name__
            msg = str(e)
        return {"error": err, "message": msg, "waited": time.monotonic() - t0}
    time.sleep(4)
    return None


def future_does_not_block(rank, n):
    """``Work.get_future()`` returns at once and completes after the finishing steps (AVG = SUM then scale under
    FUNCOLL_PROFILE=xccl); DDP-style ``then`` callbacks chain on it. Rank 1 joins the collective 1 s late."""
    import time

    t = torch.full((4,), float(rank + 1))
    if rank == 1:
        time.sleep(1.0)
    t0 = time.monotonic()
    w = dist.all_reduce(t, op=R.AVG, async_op=True)
    fut = w.get_future().then(lambda f: f.value()[0] * 10)
    returned = time.monotonic() - t0
    got = fut.wait()
    w.wait()  # after the future: harmless, nothing runs twice
    return {"returned_after": returned, "done_after": time.monotonic() - t0, "value": got.tolist(),
            "tensor": t.tolist()}


# -- the tests --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("world,profile", [(2, None), (3, "xccl")])
def test_invalid_requests_raise_on_every_rank(world, profile):
    results = run_world("tests.semantics.test_errors:invalid_requests", world, profile, timeout=150, coll_timeout=30)
    failures = [f for r in results for f in r["failures"]]
    assert not failures, "\n".join(failures)
    assert [r["count"] for r in results] == [21] * world


def test_work_wait_timeout_is_honoured():
    r = run_world("tests.semantics.test_errors:wait_timeout", 2, None, timeout=60, coll_timeout=30)[0]
    assert r["error"] == "CollectiveTimeoutError", r
    assert r["message"].startswith("funcoll: all_reduce #0 on group '0' (global ranks 0,1; this is rank 0 of 2) did "
                                   "not complete within the 1 s given to Work.wait(); it is still pending"), r
    assert 0.9 < r["waited"] < 3.0, r  # the 1 s asked for, not the 30 s group timeout nor rank 1's 4 s


def test_get_future_does_not_block_and_runs_the_finishing_steps_once():
    r0, r1 = run_world("tests.semantics.test_errors:future_does_not_block", 2, "xccl", timeout=60, coll_timeout=30)
    want = (1.0 + 2.0) / 2
    for r in (r0, r1):
        assert r["tensor"] == [want] * 4, r  # SUM then scale, scaled exactly once
        assert r["value"] == [want * 10] * 4, r
    assert r0["returned_after"] < 0.5 < r0["done_after"], r0  # rank 0's future waited for rank 1, its call did not
