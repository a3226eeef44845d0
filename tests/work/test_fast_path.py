"""The eager native fast path: a request the transport's backend serves natively goes to the backend's own
method after one cached lookup, and everything around it keeps working: results, sequence numbers and the flight
recorder, ``record()``, validation of every new signature, debug mode, coalescing, capability changes, the Work's
contract and failures naming the collective.

Whether the fast path ran is read from the code, not from timings: the full path goes through
``funcoll.algorithms.<op>`` (counted by a spy), the fast path does not, and both count the backend call in the
transport's ``calls`` (the suite's FUNCOLL_COUNT_CALLS=1; without it nothing is counted). Results are compared
with references computed here from every rank's input.
"""

from __future__ import annotations

import inspect
import time
from datetime import timedelta

import pytest
import torch
import torch._C._distributed_c10d as C
import torch.distributed as dist

from funcoll import algorithms
from funcoll.entry.methods import METHODS
from funcoll.launch import _spawn_world, run_world
from funcoll.transport import profile
from funcoll.transport.c10d import C10dTransport
from funcoll.transport.gloo import capabilities

R = dist.ReduceOp
FULL_PATH = ("all_reduce", "all_gather_into_tensor", "reduce_scatter_tensor", "all_to_all_single", "broadcast")


def _spy(names=FULL_PATH):
    """Counts the calls of the algorithms the full path runs (the process group calls them through the module)."""
    counts = {name: 0 for name in names}
    for name in names:
        orig = getattr(algorithms, name)

        def spy(*a, _orig=orig, _name=name, **k):
            counts[_name] += 1
            return _orig(*a, **k)

        setattr(algorithms, name, spy)
    return counts


def _inputs(rank: int, n: int, numel: int, dtype=torch.float32, salt: int = 0):
    """Every rank's input, the same on every rank (a reference needs all of them)."""
    return [(torch.arange(numel, dtype=torch.float64) * (r + 2) + salt - 3 * r).to(dtype) for r in range(n)]


# ---------------------------------------------------------------------------------------------------
# rank side
# ---------------------------------------------------------------------------------------------------
def _rank_results(rank, n):
    """Each native collective twice (the first call of a group and of a signature validate on the full path or in the
    lookup), blocking and async; results against references; which path ran; the flight recorder."""
    import funcoll
    from funcoll.entry.work import NativeWork

    g = dist.group.WORLD
    funcoll.debug.set_guard(g, False)  # at world 2 the size guard sends blocking CPU calls through the full path
    dist.all_reduce(torch.ones(1))  # the group's first collective: the full path creates its state
    tp = g.transport("cpu")
    counts = _spy()
    calls0 = sum(tp.calls.values())
    got = {}
    for attempt in range(2):
        for op, ref in ((R.SUM, lambda xs: sum(xs)), (R.MAX, lambda xs: torch.stack(xs).max(0).values),
                        (R.AVG, lambda xs: sum(xs) / n)):
            ins = _inputs(rank, n, 6, salt=attempt)
            t = ins[rank].clone()
            dist.all_reduce(t, op=op)
            got[f"all_reduce {op} {attempt}"] = torch.allclose(t, ref(ins))
        ins = _inputs(rank, n, 5, torch.int64, salt=7)
        t = ins[rank].clone()
        dist.all_reduce(t, op=R.MIN)
        got[f"all_reduce int64 min {attempt}"] = torch.equal(t, torch.stack(ins).min(0).values)

        ins = _inputs(rank, n, 4, salt=11)
        out = torch.empty(4 * n)
        dist.all_gather_into_tensor(out, ins[rank])
        got[f"all_gather {attempt}"] = torch.equal(out, torch.cat(ins))

        ins = _inputs(rank, n, 3 * n, salt=13)
        out = torch.empty(3)
        dist.reduce_scatter_tensor(out, ins[rank])
        got[f"reduce_scatter {attempt}"] = torch.allclose(out, sum(ins)[3 * rank:3 * rank + 3])

        ins = _inputs(rank, n, 2 * n, salt=17)
        out = torch.empty(2 * n)
        dist.all_to_all_single(out, ins[rank])
        got[f"all_to_all even {attempt}"] = torch.equal(out, torch.cat([x[2 * rank:2 * rank + 2] for x in ins]))

        send = [[1 + (i + j) % 3 for j in range(n)] for i in range(n)]  # send[i][j]: rows rank i sends to rank j
        inp = torch.arange(float(sum(send[rank]))) + 100 * rank
        out = torch.empty(sum(send[i][rank] for i in range(n)))
        dist.all_to_all_single(out, inp, [send[i][rank] for i in range(n)], send[rank])
        want = [torch.arange(float(sum(send[i])))[sum(send[i][:rank]):sum(send[i][:rank + 1])] + 100 * i
                for i in range(n)]
        got[f"all_to_all uneven {attempt}"] = torch.equal(out, torch.cat(want))

        src = n - 1
        ins = _inputs(rank, n, 5, salt=19)
        t = ins[rank].clone()
        dist.broadcast(t, src=src)
        got[f"broadcast {attempt}"] = torch.equal(t, ins[src])

        ins = _inputs(rank, n, 8, salt=23)
        t = ins[rank].clone()
        w = dist.all_reduce(t, async_op=True)
        before = funcoll.flight_recorder.entries()[-1].state
        w.wait()
        got[f"async all_reduce {attempt}"] = torch.allclose(t, sum(ins))
        got[f"async work {attempt}"] = (type(w) is NativeWork, before, funcoll.flight_recorder.entries()[-1].state,
                                        w.is_success(), w.exception() is None)
        fut = dist.broadcast(t, src=0, async_op=True).get_future()
        got[f"async future {attempt}"] = torch.equal(fut.wait()[0], t)
    entries = funcoll.flight_recorder.entries()[-22:]
    return {"got": got, "counts": counts, "calls": sum(tp.calls.values()) - calls0,
            "entries": [(c.seq, c.op, c.state, c.strategies) for c in entries],
            "describe": entries[0].describe(), "dump": funcoll.flight_recorder.dump()["entries"][-1]["fingerprint"]}


def _rank_more(rank, n):
    """The list forms of all_gather and reduce_scatter, gather, scatter, barrier, send and recv, blocking and async, and
    an async all_reduce read through its future alone (as DDP reads it),
    twice each: results
    against references and against a raw gloo group of the same ranks; which path ran; the flight recorder; and how
    many background waiters the Works started (only for a future or a poll that needs one)."""
    import funcoll
    import funcoll.transport.c10d as c10d
    from funcoll.entry.work import NativeWork

    g = dist.group.WORLD
    gloo = dist.new_group(backend="gloo")
    funcoll.debug.set_guard(g, False)
    dist.all_reduce(torch.ones(1))
    tp = g.transport("cpu")
    first = len(funcoll.flight_recorder.entries())
    counts = _spy(("all_gather", "reduce_scatter", "gather", "scatter", "barrier", "send", "recv"))
    jobs = []
    orig_bg = c10d.in_background
    c10d.in_background = lambda job: (jobs.append(job), orig_bg(job))[1]
    calls0 = dict(tp.calls)
    got, waiters = {}, {}
    peer = (rank + 1) % n
    for attempt in range(2):
        ins = _inputs(rank, n, 4, salt=29 + attempt)
        outs, raw = [torch.empty(4) for _ in range(n)], [torch.empty(4) for _ in range(n)]
        dist.all_gather(outs, ins[rank])
        dist.all_gather(raw, ins[rank], group=gloo)
        got[f"all_gather {attempt}"] = all(torch.equal(o, x) and torch.equal(o, r) for o, x, r in zip(outs, ins, raw))

        xs = [[torch.arange(3.0) * (r + 1) + 10 * j + attempt for j in range(n)] for r in range(n)]
        out, raw_out = torch.empty(3), torch.empty(3)
        dist.reduce_scatter(out, xs[rank], op=R.MAX if attempt else R.SUM)
        dist.reduce_scatter(raw_out, xs[rank], op=R.MAX if attempt else R.SUM, group=gloo)
        want = torch.stack([xs[r][rank] for r in range(n)])
        want = want.max(0).values if attempt else want.sum(0)
        got[f"reduce_scatter {attempt}"] = torch.equal(out, want) and torch.equal(out, raw_out)

        root = (attempt + 1) % n  # gather to, and scatter from, rank 1 then rank 0 (rank 0 twice at n=1)
        outs = [torch.full((4,), -1.0) for _ in range(n)] if rank == root else None
        raw = [torch.full((4,), -1.0) for _ in range(n)] if rank == root else None
        dist.gather(ins[rank], outs, dst=root)
        dist.gather(ins[rank], raw, dst=root, group=gloo)
        got[f"gather {attempt}"] = (outs is None and raw is None) or all(
            torch.equal(o, x) and torch.equal(o, r) for o, x, r in zip(outs, ins, raw))
        parts = [torch.arange(3.0) * (j + 1) + 7 * root + attempt for j in range(n)]  # the root's list
        out, raw_out = torch.full((3,), -1.0), torch.full((3,), -1.0)
        dist.scatter(out, parts if rank == root else None, src=root)
        dist.scatter(raw_out, parts if rank == root else None, src=root, group=gloo)
        got[f"scatter {attempt}"] = torch.equal(out, parts[rank]) and torch.equal(out, raw_out)
        outs = [torch.full((4,), -1.0) for _ in range(n)] if rank == root else None
        w = dist.gather(ins[rank], outs, dst=root, async_op=True)
        value = w.get_future().wait()  # gloo's gather Work has a future: the root's outputs, [] elsewhere
        got[f"async gather {attempt}"] = (type(w) is NativeWork, w.wait(), w.is_success(),
                                          (outs is None and value == []) or (
                                              all(v is o for v, o in zip(value, outs)) and len(value) == n
                                              and all(torch.equal(o, x) for o, x in zip(outs, ins))))
        out = torch.full((3,), -1.0)
        w = dist.scatter(out, parts if rank == root else None, src=root, async_op=True)
        got[f"async scatter {attempt}"] = (type(w) is NativeWork, w.wait(), w.is_completed(),
                                           torch.equal(out, parts[rank]))

        dist.barrier()
        w = dist.barrier(async_op=True)
        got[f"async barrier {attempt}"] = (type(w) is NativeWork, w.wait(), w.is_completed(), w.is_success())

        outs = [torch.empty(4) for _ in range(n)]
        w = dist.all_gather(outs, ins[rank], async_op=True)
        got[f"async all_gather {attempt}"] = (type(w) is NativeWork, w.wait(),
                                              all(torch.equal(o, x) for o, x in zip(outs, ins)))
        out = torch.empty(3)
        w = dist.reduce_scatter(out, xs[rank], async_op=True)
        before = len(jobs)
        fut = w.get_future()  # gloo's reduce_scatter Work has no future: a background waiter supplies it
        value = fut.wait()
        got[f"async reduce_scatter future {attempt}"] = (type(w) is NativeWork, value[0] is out,
                                                         torch.equal(out, sum(xs[r][rank] for r in range(n))),
                                                         w.wait(), w.wait(), w.is_success())
        waiters[f"reduce_scatter get_future {attempt}"] = len(jobs) - before
        t = ins[rank].clone()
        w = dist.all_reduce(t, async_op=True)
        before = len(jobs)
        fut = w.get_future()  # as DDP's Reducer: only the future; gloo's all_reduce Work has one of its own, handed out
        value = fut.wait()
        got[f"async all_reduce future {attempt}"] = (type(w) is NativeWork, type(fut) is torch._C.Future,
                                                     w.get_future() is fut, value[0].data_ptr() == t.data_ptr(),
                                                     torch.equal(t, sum(ins)), w.is_completed(), w.is_success(),
                                                     funcoll.flight_recorder.entries()[-1].state == "completed")
        waiters[f"all_reduce get_future {attempt}"] = len(jobs) - before

        if n > 1:
            src = (rank - 1) % n
            t, into, raw_into = torch.arange(5.0) + 100 * rank + attempt, torch.empty(5), torch.empty(5)
            for group, dest in ((g, into), (gloo, raw_into)):  # blocking: even ranks send first
                if rank % 2 == 0:
                    dist.send(t, peer, group=group)
                    dist.recv(dest, src, group=group)
                else:
                    dist.recv(dest, src, group=group)
                    dist.send(t, peer, group=group)
            want = torch.arange(5.0) + 100 * src + attempt
            got[f"send/recv {attempt}"] = torch.equal(into, want) and torch.equal(raw_into, want)
            # async, waited on: no background waiter
            before = len(jobs)
            into = torch.empty(5)
            ws = [dist.isend(t, peer), dist.irecv(into, src)]
            got[f"isend/irecv waited {attempt}"] = (all(type(w) is NativeWork for w in ws),
                                                    all(w.wait() and w.wait() for w in ws), torch.equal(into, want),
                                                    ws[1]._source_rank())
            waiters[f"isend/irecv waited {attempt}"] = len(jobs) - before
            # async, by polling alone: gloo's send/recv Works never say completed until waited on; funcoll's do
            before = len(jobs)
            into = torch.empty(5)
            ws = [dist.isend(t, peer), dist.irecv(into, src)]
            deadline = time.monotonic() + 20
            while not all(w.is_completed() for w in ws) and time.monotonic() < deadline:
                time.sleep(0.002)
            got[f"isend/irecv polled {attempt}"] = (all(w.is_completed() and w.is_success() for w in ws),
                                                    torch.equal(into, want), all(w.exception() is None for w in ws))
            waiters[f"isend/irecv polled {attempt}"] = len(jobs) - before
            dist.barrier()
    c10d.in_background = orig_bg
    calls = {k: v - calls0.get(k, 0) for k, v in tp.calls.items() if v != calls0.get(k, 0)}
    entries = funcoll.flight_recorder.entries()
    return {"got": got, "counts": counts, "waiters": waiters, "calls": calls, "rank": rank, "first": first,
            "entries": [(c.op, c.seq, c.p2p_seq, c.state, c.strategies) for c in entries[first:]]}


def _rank_observers(rank, n):
    """record(), debug mode, coalescing and a changed capability table each take the full path; the fast path is back
    once they are gone."""
    import funcoll

    g = dist.group.WORLD
    funcoll.debug.set_guard(g, False)
    t = torch.ones(4)
    dist.all_reduce(t)
    dist.all_reduce(t)
    counts = _spy()
    out = {}
    dist.all_reduce(t)
    out["plain"] = counts["all_reduce"]
    with funcoll.record() as log:
        dist.all_reduce(t, op=R.AVG)
    out["record"] = (counts["all_reduce"], log)
    funcoll.debug.set_debug(g, True)
    dist.all_reduce(t)
    funcoll.debug.set_debug(g, False)
    out["debug"] = counts["all_reduce"]
    g._start_coalescing(torch.device("cpu"))  # what c10d's coalescing manager does around the calls it issues
    g.allreduce([t], C.AllreduceOptions())
    g._end_coalescing(torch.device("cpu")).wait()
    out["coalescing"] = counts["all_reduce"]
    dist.all_reduce(t)
    out["after"] = counts["all_reduce"]
    # a capability table without AVG (as funcoll.probe installs after a demotion): the cached answer is dropped
    tp = g.transport("cpu")
    caps = tp.caps
    tp.caps = caps.restrict(profile("xccl"))
    x = torch.arange(4.0) * (rank + 1)
    with funcoll.record() as log:
        dist.all_reduce(x, op=R.AVG)
    y = torch.arange(4.0) * (rank + 1)
    dist.all_reduce(y, op=R.AVG)  # not native any more: the full path (its strategy), right result
    out["demoted"] = (counts["all_reduce"], log, torch.allclose(y, torch.arange(4.0) * (n + 1) / 2))
    tp.caps = caps
    # the size guard on (the default at world 2): a blocking CPU call takes the full path, where the guard checks it
    # before sending; an async one (not guarded) keeps the fast path
    funcoll.debug.set_guard(g, True)
    before, seq = counts["all_reduce"], funcoll.flight_recorder.trace_of(g).seq
    z = torch.full((4,), float(rank + 1))
    dist.all_reduce(z)
    blocking = counts["all_reduce"] - before
    dist.all_reduce(z, async_op=True).wait()
    out["guard on"] = (blocking, counts["all_reduce"] - before, funcoll.flight_recorder.trace_of(g).seq - seq,
                       z.tolist())
    return out


def _rank_validation(rank, n):
    """Bad requests raise the full path's errors, also for a signature the cache knows, and use no sequence number."""
    import funcoll

    g = dist.group.WORLD
    dist.all_reduce(torch.ones(3))
    t = torch.ones(3)
    dist.all_reduce(t)  # cached: float32[3] sum
    errs = {}

    def err(fn):
        try:
            fn()
        except Exception as e:  # noqa: BLE001
            return type(e).__name__, str(e)
        return None

    seq0 = funcoll.flight_recorder.trace_of(g).seq
    errs["bxor float"] = err(lambda: dist.all_reduce(torch.ones(3), op=R.BXOR))
    errs["bxor float again"] = err(lambda: dist.all_reduce(torch.ones(3), op=R.BXOR))
    errs["sparse"] = err(lambda: dist.all_reduce(torch.ones(3).to_sparse()))
    errs["gather dtype"] = err(lambda: g._allgather_base(torch.empty(3 * n, dtype=torch.int64), torch.ones(3),
                                                         C.AllgatherOptions()))
    errs["gather shape"] = err(lambda: dist.all_gather_into_tensor(torch.empty(3 * n + 1), torch.ones(3)))
    errs["rs shape"] = err(lambda: dist.reduce_scatter_tensor(torch.empty(2), torch.ones(3 * n)))
    bo = C.BroadcastOptions()
    bo.rootRank = n + 3
    errs["bcast src"] = err(lambda: g.broadcast([torch.ones(3)], bo))
    errs["gather list"] = err(lambda: dist.gather(torch.ones(3), [torch.empty(3)] * (n + 1), dst=0))
    errs["gather list again"] = err(lambda: dist.gather(torch.ones(3), [torch.empty(3)] * (n + 1), dst=0))
    errs["scatter list"] = err(lambda: dist.scatter(torch.empty(3), [torch.ones(2)] * n, src=0))
    seq1 = funcoll.flight_recorder.trace_of(g).seq
    states = [c.state for c in funcoll.flight_recorder.entries()[-10:]]
    # non-contiguous: the full path (a contiguous copy), right result
    base = torch.arange(12.0).view(3, 4) * (rank + 1)
    nc = base.t()
    dist.all_reduce(nc)
    ok = torch.equal(base, torch.arange(12.0).view(3, 4) * sum(range(1, n + 1)))
    return {"errs": errs, "seq": (seq0, seq1), "states": states, "noncontig": ok}


def _rank_failure(rank, n):
    """Rank 1 leaves after two collectives; rank 0's next blocking all_reduce (a cached native signature) fails,
    naming the collective and its sequence number."""
    import os
    import time

    t = torch.ones(4)
    dist.all_reduce(t)
    dist.all_reduce(t)
    if rank == 1:
        time.sleep(0.5)
        os._exit(0)
    time.sleep(1.5)
    try:
        dist.all_reduce(t)
    except Exception as e:  # noqa: BLE001
        import funcoll

        return {"type": type(e).__name__, "msg": str(e), "state": funcoll.flight_recorder.entries()[-1].state}
    return {"type": None}


def _rank_failure_p2p(rank, n):
    """Rank 0 posts an irecv (a fast-path NativeWork) and asks for its future; rank 1 leaves without sending: the
    future, wait() and exception() all carry the error naming the receive."""
    import os

    import funcoll

    t = torch.ones(4)
    if rank == 0:
        dist.send(t, 1)
    else:
        dist.recv(t, 0)
    dist.barrier()
    if rank == 1:
        time.sleep(1.0)
        os._exit(0)
    w = dist.irecv(t, 1)
    fut = w.get_future()
    out = {"type": type(w).__name__}
    try:
        fut.wait()
        out["future"] = None
    except Exception as e:  # noqa: BLE001
        out["future"] = str(e)
    try:
        w.wait()
        out["wait"] = None
    except Exception as e:  # noqa: BLE001
        out["wait"] = (type(e).__name__, str(e))
    out["exception"] = type(w.exception()).__name__
    out["done"] = (w.is_completed(), w.is_success())
    out["state"] = funcoll.flight_recorder.entries()[-1].state
    return out


def _rank_changing_splits(rank, n):
    """Uneven all_to_all_single with new split sizes at every call (a MoE layer's), the shapes fixed: each against
    gloo's own, which path ran, the signatures the group caches, each record's splits; then bad splits on that very
    signature."""
    import funcoll

    g = dist.group.WORLD
    funcoll.debug.set_guard(g, False)
    gloo = dist.new_group(backend="gloo")
    dist.all_reduce(torch.ones(1))
    counts = _spy()
    same, splits = [], []
    for k in range(7):
        ins = [k, 6 - k] if rank == 0 else [6 - k, k]  # rank 0 receives k + (6 - k) rows, rank 1 (6 - k) + k
        x = torch.arange(6.0) + 10 * rank + 100 * k
        got, want = torch.empty(6), torch.empty(6)
        dist.all_to_all_single(got, x, ins, ins)
        dist.all_to_all_single(want, x, ins, ins, group=gloo)
        same.append(torch.equal(got, want))
        fp = funcoll.flight_recorder.entries()[-1].fingerprint
        splits.append(fp["input_split_sizes"] == ins and fp["output_split_sizes"] == ins)
    keys, ran = [k for k in g._state.native if k[0] == "all_to_all_single"], dict(counts)
    try:
        dist.all_to_all_single(torch.empty(6), torch.ones(6), [7, -1], [3, 3])
        bad = "no error"
    except ValueError as e:
        bad = str(e)
    return {"same": same, "splits": splits, "counts": ran, "keys": len(keys), "bad": bad}


# ---------------------------------------------------------------------------------------------------
# tests
# ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("n,counting", [(1, True), (2, True), (2, False)])
def test_native_requests_take_the_fast_path_with_right_results_and_records(n, counting):
    """``counting`` False: the transports as users run them (no FUNCOLL_COUNT_CALLS): the same results and records,
    and nothing counted."""
    env = {"FUNCOLL_COUNT_CALLS": "1" if counting else None}
    for r in run_world("tests.work.test_fast_path:_rank_results", n, None, timeout=180, coll_timeout=30, env=env):
        assert all(v is True or (isinstance(v, tuple) and v[0] is True) for v in r["got"].values()), r["got"]
        for attempt in (0, 1):
            assert r["got"][f"async work {attempt}"] == (True, "issued", "completed", True, True), r["got"]
        # 2 x (3 float all_reduce + int all_reduce + all_gather + reduce_scatter + 2 all_to_all + broadcast + async
        # all_reduce + async broadcast): every one a native backend call, none through the full path's algorithms
        assert r["counts"] == {name: 0 for name in FULL_PATH}, r["counts"]
        assert r["calls"] == (22 if counting else 0)
        seqs = [e[0] for e in r["entries"]]
        assert seqs == list(range(seqs[0], seqs[0] + 22)) and seqs[0] == 1  # #0 was the group's first collective
        assert all(e[2] == "completed" and e[3] == ["native"] for e in r["entries"]), r["entries"]
        assert [e[1] for e in r["entries"][:6]] == ["all_reduce"] * 4 + ["all_gather_into_tensor",
                                                                         "reduce_scatter_tensor"]
        assert r["describe"] == "all_reduce(reduce_op=sum, float32[6])"
        assert r["dump"] == {"op": "broadcast", "root": 0, "tensors": [["float32", [8]]], "device": "cpu"}


@pytest.mark.parametrize("profile", [None, "xccl"])
def test_uneven_all_to_all_with_new_splits_every_call_stays_one_signature(profile):
    """Natively (gloo's alltoallv) every call is one native call; under the xccl profile (no alltoallv) every call
    takes the full path, and its record still holds its own splits, not the ones the signature was first seen with."""
    full = {name: 7 if profile and name == "all_to_all_single" else 0 for name in FULL_PATH}
    for r in run_world("tests.work.test_fast_path:_rank_changing_splits", 2, profile, timeout=120, coll_timeout=30):
        assert r["same"] == [True] * 7 and r["splits"] == [True] * 7, r
        assert r["counts"] == full and r["keys"] == 1, r
        assert r["bad"] == "funcoll.all_to_all_single: output_split_sizes [7, -1] has a negative entry", r


@pytest.mark.parametrize("n", [1, 2])
def test_list_forms_gather_scatter_barrier_and_point_to_point_take_the_fast_path(n):
    for r in run_world("tests.work.test_fast_path:_rank_more", n, None, timeout=180, coll_timeout=30):
        got = r["got"]
        for attempt in (0, 1):
            if n > 1:  # the last: the source rank irecv's Work reports
                assert got.pop(f"isend/irecv waited {attempt}") == (True, True, True, (r["rank"] - 1) % n), got
        assert all(v is True or (isinstance(v, tuple) and all(x is True for x in v)) for v in got.values()), got
        # none through the full path's algorithms; every one a native backend call, counted
        assert r["counts"] == {name: 0 for name in ("all_gather", "reduce_scatter", "gather", "scatter", "barrier",
                                                    "send", "recv")}
        f32 = torch.float32
        want = {("all_gather", "", f32): 4, ("reduce_scatter", "sum", f32): 3, ("reduce_scatter", "max", f32): 1,
                ("gather", "", f32): 4, ("scatter", "", f32): 4, ("barrier", "", None): 4 + 2 * (n > 1),
                ("all_reduce", "sum", f32): 2}
        if n > 1:
            want[("send_recv", "", f32)] = 2 * (2 + 2 + 2)  # blocking, async waited, async polled: one send, one recv
        assert r["calls"] == want, r["calls"]
        # a background waiter only where a Work's missing parts were asked for: a future, a poll of a running Work
        w = r["waiters"]
        assert w["reduce_scatter get_future 0"] == w["reduce_scatter get_future 1"] == 1, w
        assert w["all_reduce get_future 0"] == w["all_reduce get_future 1"] == 0, w  # gloo's own future
        if n > 1:
            assert w["isend/irecv waited 0"] == w["isend/irecv waited 1"] == 0, w
            assert 0 < w["isend/irecv polled 0"] <= 2 and 0 < w["isend/irecv polled 1"] <= 2, w
        # the flight recorder: collectives numbered in order, point-to-point ops on their own counter, all native
        coll = [e for e in r["entries"] if e[2] is None]
        p2p = [e for e in r["entries"] if e[2] is not None]
        assert [e[1] for e in coll] == list(range(coll[0][1], coll[0][1] + len(coll))), coll
        # per attempt: 2 all_gather, 2 reduce_scatter, 2 gather, 2 scatter, 2 barrier (+1 at n=2), 1 all_reduce
        assert len(coll) == 2 * (11 + (n > 1))
        assert all(e[3] == "completed" and e[4] == ["native"] for e in r["entries"]), r["entries"]
        assert {e[0] for e in coll} == {"all_gather", "reduce_scatter", "gather", "scatter", "barrier", "all_reduce"}
        if n > 1:
            assert [e[2] for e in p2p] == list(range(12)) and {e[0] for e in p2p} == {"send", "recv"}, p2p


def test_observers_debug_coalescing_and_capability_changes_take_the_full_path():
    for r in run_world("tests.work.test_fast_path:_rank_observers", 2, None, timeout=180, coll_timeout=30):
        assert r["plain"] == 0  # native: not through algorithms.all_reduce
        assert r["record"] == (1, [("all_reduce", ["native"])])
        assert r["debug"] == 2
        assert r["coalescing"] == 3
        assert r["after"] == 3  # the fast path again
        count, log, ok = r["demoted"]
        assert count == 5 and log == [("all_reduce", ["avg=sum+scale"])] and ok
        assert r["guard on"] == (1, 1, 2, [6.0] * 4)  # (1 + 2) summed, then summed again: 2 x 3


def test_every_new_signature_is_validated_and_bad_requests_raise_the_full_paths_errors():
    (r,) = run_world("tests.work.test_fast_path:_rank_validation", 1, None, timeout=120)
    e = r["errs"]
    assert e["bxor float"] == e["bxor float again"]
    assert e["bxor float"][0] == "TypeError" and "needs an integer or bool tensor" in e["bxor float"][1]
    assert e["sparse"][0] == "TypeError" and "tensors are not supported, only dense ones" in e["sparse"][1]
    assert e["gather dtype"][0] == "TypeError" and "expected torch.float32" in e["gather dtype"][1]
    assert e["gather shape"][0] == "ValueError" and "output has shape" in e["gather shape"][1]
    assert e["rs shape"][0] == "ValueError" and "output has shape (2,), expected (3,)" in e["rs shape"][1]
    assert e["bcast src"][0] == "ValueError" and "src=4 is outside the group" in e["bcast src"][1]
    assert e["gather list"] == e["gather list again"]
    assert e["gather list"] == ("ValueError", "funcoll.gather: the destination rank needs a list of 1 output tensors, "
                                              "got 2")
    assert e["scatter list"][0] == "ValueError" and "input[0] has shape (2,), expected (3,)" in e["scatter list"][1]
    assert r["seq"][0] == r["seq"][1]  # nothing was sent: no sequence number used
    assert r["states"] == ["invalid"] * 10
    assert r["noncontig"]


def test_a_failed_native_call_names_the_collective():
    results, _, hung = _spawn_world("tests.work.test_fast_path:_rank_failure", 2, None, deadline=120, coll_timeout=10)
    assert not hung and results[0] is not None and results[0][0] == "ok", results
    r = results[0][1]
    assert r["type"] == "CollectiveError", r
    assert r["msg"].startswith("funcoll: all_reduce #2 on group '0' (global ranks 0,1; this is rank 0 of 2) "), r
    assert r["state"] == "failed"


def test_a_failed_fast_path_receive_fails_its_future_wait_and_exception():
    results, _, hung = _spawn_world("tests.work.test_fast_path:_rank_failure_p2p", 2, None, deadline=120,
                                    coll_timeout=10)
    assert not hung and results[0] is not None and results[0][0] == "ok", results
    r = results[0][1]
    assert r["type"] == "NativeWork", r
    label = "funcoll: recv p2p #1 on group '0' (global ranks 0,1; this is rank 0 of 2) "
    assert r["wait"][0] == "CollectiveError" and r["wait"][1].startswith(label), r
    assert r["future"] is not None and label in r["future"], r
    assert r["exception"] == "CollectiveError" and r["done"] == (True, False) and r["state"] == "failed", r


# ---------------------------------------------------------------------------------------------------
# the lookups, in process (a world of one gloo backend on a HashStore)
# ---------------------------------------------------------------------------------------------------
@pytest.fixture
def tp():
    backend = dist.ProcessGroupGloo(dist.HashStore(), 0, 1, timedelta(seconds=30))
    return C10dTransport(backend, capabilities(None), "cpu")


def _blocking(op=R.SUM):
    opts = C.AllreduceOptions()
    opts.reduceOp, opts.asyncOp = op, False
    return opts


def test_a_signature_is_planned_once_per_group_and_the_answer_is_the_planners(monkeypatch):
    from funcoll.entry import fast_path
    from funcoll.entry.process_group import ProcessGroupFuncoll
    from funcoll.entry.work import FuncollWork

    pg = ProcessGroupFuncoll(dist.HashStore(), 0, 1, timedelta(seconds=30), options=None)
    tp = pg.transport("cpu")
    planned = []
    orig = fast_path._plan
    monkeypatch.setattr(fast_path, "_plan", lambda *a: (planned.append(a[5]), orig(*a))[1])
    t = torch.ones(4)
    # blocking and native: issued, waited on and returned as None (the backend has synchronized)
    assert pg.allreduce([t], _blocking()) is None and pg.allreduce([torch.zeros(4)], _blocking()) is None
    assert len(planned) == 1 and tp.calls[("all_reduce", "sum", torch.float32)] == 2
    [(first, description)] = pg._state.native.values()
    assert inspect.unwrap(first.issue) == tp.backend.allreduce and description["op"] == "all_reduce"
    # a new signature (shape, dtype, op) is planned again
    pg.allreduce([torch.ones(5)], _blocking())
    assert len(planned) == 2
    # not native, the full path: bool SUM is an OR in funcoll's semantics; PREMUL_SUM; empty tensors
    for x, op in ((torch.ones(4, dtype=torch.bool), R.SUM), (t, dist._make_nccl_premul_sum(2.0)),
                  (torch.ones(0), R.SUM)):
        assert type(pg.allreduce([x], _blocking(op))) is FuncollWork
    # invalid: never cached, planned every time; the full path raises its error
    n = len(planned)
    for _ in range(2):
        with pytest.raises(TypeError, match="^funcoll.all_reduce: reduce op bxor needs an integer or bool tensor"):
            pg.allreduce([t], _blocking(R.BXOR))
    assert len(planned) == n + 2
    # a changed capability table drops the cached answers
    tp.caps = tp.caps.restrict(profile("xccl"))
    assert type(pg.allreduce([t], _blocking(R.AVG))) is FuncollWork
    assert pg.allreduce([t], _blocking()) is None and len(planned) == n + 4
    assert next(nat for nat, _ in pg._state.native.values() if nat is not None) is not first


def _issue(tp, call, method):
    """The backend method a native call's answer hands c10d ``method``'s fast path (the suite's count around it
    unwrapped)."""
    return inspect.unwrap(tp.native_method(*call, METHODS[method].backend_method).issue)


def test_other_lookups(tp):
    x = torch.ones(4)
    gather = algorithms.native_all_gather_call(tp, torch.empty(4), x)
    # torch 2.15's name and torch 2.9's alike hand the backend the older method, which every torch's backends keep
    # (torch 2.9's ProcessGroupGloo has no all_gather_single)
    assert _issue(tp, gather, "all_gather_single") == _issue(tp, gather, "_allgather_base") == \
        tp.backend._allgather_base
    assert algorithms.native_all_gather_call(tp, torch.empty(1, 4), x) is None  # stacked form: the full path
    assert _issue(tp, algorithms.native_reduce_scatter_call(tp, R.MAX, torch.empty(4), x), "_reduce_scatter_base") == \
        tp.backend._reduce_scatter_base
    even = algorithms.native_all_to_all_call(tp, torch.empty(4), x, (), ())
    assert _issue(tp, even, "alltoall_base") == _issue(tp, even, "all_to_all_single") == tp.backend.alltoall_base
    assert algorithms.native_all_to_all_call(tp, torch.empty(4), x, (4,), (4,)) is not None
    assert _issue(tp, algorithms.native_broadcast_call(tp, x, 0, 0), "broadcast") == tp.backend.broadcast
    with pytest.raises(ValueError, match="^funcoll.broadcast: src=1 is outside the group"):  # the full path's error
        algorithms.native_broadcast_call(tp, x, 1, 0)
    assert algorithms.native_broadcast_call(tp, torch.ones(4, dtype=torch.int16), 0, 0) is None  # gloo: no int16

    class Spy(C10dTransport):  # a transport whose primitive differs is called through the transport
        def _all_reduce(self, t, red):
            return super()._all_reduce(t, red)

    spy = Spy(tp.backend, tp.caps, "cpu")
    assert spy.native_method(*algorithms.native_all_reduce_call(spy, R.SUM, x), "allreduce") is None


@pytest.mark.parametrize("name", ["xccl", "xla", "torchtpu"])
def test_split_sizes_passed_never_take_the_even_native_exchange(tp, name):
    """Without a native uneven all_to_all, split sizes passed go to the full path's uneven exchange whatever their
    values (equal ones too: a peer's may not be); no split sizes, the backend's even all_to_all."""
    tp.caps = tp.caps.restrict(profile(name))
    x = torch.ones(4)
    assert algorithms.native_all_to_all_call(tp, torch.empty(4), x, (4,), (4,)) is None
    assert _issue(tp, algorithms.native_all_to_all_call(tp, torch.empty(4), x, (), ()), "alltoall_base") == \
        tp.backend.alltoall_base
