"""FuncollWork tells the truth (exception, is_success, futures, timeouts), the cross-rank comparison of the debug
mode, the flight recorder, monitored_barrier and sequence numbers.

The Work tests run in this process on a Pending of hand-driven handles (no backend: every state is reached on
purpose); the comparison is pure; the rest runs on real 2- and 3-rank worlds.
"""

from __future__ import annotations

import json
import time
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist

from funcoll import algorithms
from funcoll.entry import fingerprint, flight_recorder
from funcoll.entry.group_state import GroupState
from funcoll.entry.methods import METHODS
from funcoll.entry.work import CollectiveError, CollectiveTimeoutError, FuncollWork
from funcoll.launch import run_world


# ---------------------------------------------------------------------------------------------------
# FuncollWork, in process
# ---------------------------------------------------------------------------------------------------
class Handle:
    """A native handle completed by the test: ``finish()`` or ``finish(error)``."""

    def __init__(self):
        self.fut = torch.futures.Future()

    def finish(self, error=None):
        if error is None:
            self.fut.set_result(None)
        else:
            self.fut.set_exception(error)

    def is_completed(self):
        return self.fut.done()

    def get_future(self):
        return self.fut

    def wait(self, timeout=None):
        if timeout is not None:
            end = time.monotonic() + timeout.total_seconds()
            while not self.fut.done():
                if time.monotonic() > end:
                    raise RuntimeError("Operation timed out!")  # what c10d's Work.wait(timeout) raises
                time.sleep(0.01)
        assert self.fut.done(), "the test would block"
        self.fut.value()


def _state(trace):
    """A group's state in this process (a local store: no peers to look for), its trace ``trace``."""
    state = GroupState(dist.HashStore(), 0, 2, timedelta(seconds=5), "g", (0, 1))
    state.trace = trace
    return state


def _work(group_timeout=5.0):
    trace = flight_recorder.GroupTrace("g", (0, 1), 0, 2, maxlen=8)
    call = trace.number(trace.call("all_reduce", "allreduce", {"op": "all_reduce", "reduce_op": "sum",
                                                               "tensors": [["float32", [4]]]}))
    call.timeout = group_timeout
    h, steps = Handle(), []
    state = _state(trace)
    work = FuncollWork(algorithms.Pending([h], then=lambda: steps.append("scaled")), [torch.ones(4)])
    work._attach(call, state)
    return work, h, call, steps


LABEL = "all_reduce #0 on group 'g' (global ranks 0,1; this is rank 0 of 2)"


def test_success_is_seen_by_polling_without_wait():
    work, h, call, steps = _work()
    assert not work.is_completed() and not work.is_success() and work.exception() is None
    assert call.state == "issued" and steps == []
    h.finish()
    assert work.is_completed() and steps == ["scaled"]  # polling ran the finishing steps, once
    assert work.is_success() and work.exception() is None and call.state == "completed"
    assert work.wait() is True and steps == ["scaled"]


def test_failure_is_an_error_naming_the_collective_everywhere():
    work, h, call, steps = _work()
    cause = RuntimeError("[pair.cc:561] Connection closed by peer [127.0.0.1]:1234")
    h.finish(cause)
    assert work.is_completed() and not work.is_success()
    err = work.exception()
    assert type(err) is CollectiveError and isinstance(err, RuntimeError)
    assert str(err) == f"funcoll: {LABEL} failed: [pair.cc:561] Connection closed by peer [127.0.0.1]:1234"
    assert err.__cause__ is cause and steps == []  # the finishing steps never ran on garbage
    with pytest.raises(CollectiveError) as e:
        work.wait()
    assert e.value is err
    fut = work.get_future()
    with pytest.raises(CollectiveError) as e:
        fut.wait()
    assert e.value is err
    assert call.state == "failed" and call.error == f"RuntimeError: {cause}"


def test_future_completes_with_the_outputs_or_the_error():
    work, h, _, steps = _work()
    fut = work.get_future()
    chained = fut.then(lambda f: f.value()[0].sum().item())  # a DDP comm hook chains like this
    assert not fut.done()
    h.finish()
    assert chained.wait() == 4.0 and steps == ["scaled"] and work.is_success()

    work, h, _, _ = _work()
    fut = work.get_future()
    h.finish(RuntimeError("boom"))
    with pytest.raises(CollectiveError, match=r"^funcoll: all_reduce #0 on group 'g' .* failed: boom$"):
        fut.wait()
    assert not work.is_success() and isinstance(work.exception(), CollectiveError)


def test_a_handed_out_backend_future_ends_its_record_when_discovered():
    """The fast path hands a backend Work's own future to the caller (DDP's Reducer reads only that): the record
    learns the outcome from it at the group's next fast-path call or when the recorder is read."""
    trace = flight_recorder.GroupTrace("g", (0, 1), 0, 2, maxlen=8)
    fp = {"op": "all_reduce", "reduce_op": "sum", "tensors": [["float32", [4]]]}
    ok, bad = torch.futures.Future(), torch.futures.Future()
    for fut in (ok, bad):
        trace.watch(trace.native_record("all_reduce", "allreduce", fp), fut)
    assert [(c.seq, c.state) for c in trace.entries()] == [(0, "issued"), (1, "issued")]
    ok.set_result([torch.ones(4)])
    assert [(c.seq, c.state) for c in trace.entries()] == [(0, "completed"), (1, "issued")]
    bad.set_exception(RuntimeError("[pair.cc:538] Read error: Connection reset by peer"))
    trace.native_record("all_reduce", "allreduce", fp)  # the next call discovers it
    calls = trace.entries()
    assert [(c.seq, c.state) for c in calls] == [(0, "completed"), (1, "failed"), (2, "issued")]
    assert calls[1].error == "RuntimeError: [pair.cc:538] Read error: Connection reset by peer"
    assert trace._watched == [] and calls[0].t_done >= calls[0].t_issued
    late = torch.futures.Future()  # a full-path call (AVG, a list all_to_all ...) discovers too
    trace.watch(trace.buffer[-1], late)  # the record of call #2
    late.set_result([])
    trace.call("all_reduce", "allreduce", fp)
    assert trace._watched == [] and trace.buffer[-1].t_done is not None


def test_a_record_is_promoted_while_another_thread_records():
    """A failed fast-path call turns its record into a Call in place while other threads keep recording (the fast
    path appends without the lock): no error, and the Call is where the record was."""
    import threading

    trace = flight_recorder.GroupTrace("g", (0, 1), 0, 2, maxlen=4096)
    fp = {"op": "all_reduce", "reduce_op": "sum", "tensors": [["float32", [4]]]}
    stop = threading.Event()

    def record():
        while not stop.is_set():
            trace.native_record("all_reduce", "allreduce", fp)

    other = threading.Thread(target=record)
    other.start()
    try:
        for _ in range(200):
            rec = trace.native_record("broadcast", "broadcast", fp)
            call = trace.promote(rec)
            assert rec not in trace.buffer and (call in trace.buffer or len(trace.buffer) == 4096)
    finally:
        stop.set()
        other.join()


def test_threads_recording_on_one_group_get_distinct_sequence_numbers():
    """The fast path numbers its calls without a lock: two threads on one group never get the same number (a
    thread switch between reading the counter and bumping it would hand one out twice), on either counter."""
    import sys
    import threading

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads as often as the interpreter can
    try:
        trace = flight_recorder.GroupTrace("g", (0, 1), 0, 2, maxlen=1)
        got: list = [[], [], []]

        def record(k):
            for _ in range(50_000):
                rec = trace.native_record("send" if k == 2 else "all_reduce", "m", {}, p2p=k == 2)
                got[k].append(rec.p2p_seq if k == 2 else rec.seq)

        threads = [threading.Thread(target=record, args=(k,)) for k in range(3)]
        for th in threads:
            th.start()
        for th in threads:
            th.join(timeout=120)
    finally:
        sys.setswitchinterval(interval)
    assert sorted(got[0] + got[1]) == list(range(100_000)) and trace.seq == 100_000
    assert got[2] == list(range(50_000)) and trace.p2p_seq == 50_000


def test_wait_timeout_names_the_collective_and_leaves_it_pending(tmp_path, monkeypatch):
    monkeypatch.setenv("FUNCOLL_TRACE_DIR", str(tmp_path))
    work, h, call, steps = _work()
    t0 = time.monotonic()
    with pytest.raises(CollectiveTimeoutError) as e:
        work.wait(timedelta(seconds=0.3))
    assert 0.25 < time.monotonic() - t0 < 60  # waited its 0.3 s, and returned (a loaded machine may be slow)
    msg = str(e.value)
    assert msg.startswith(f"funcoll: {LABEL} did not complete within the 0.3 s given to Work.wait(); it is still "
                          "pending"), msg
    dump = next(tmp_path.glob("funcoll_trace_g_rank0_*.json"))
    assert f"Flight recorder dumped to {dump}." in msg
    assert [(c["seq"], c["op"], c["state"]) for c in json.loads(dump.read_text())["entries"]] == \
        [(0, "all_reduce", "issued")]
    assert not work.is_completed() and work.exception() is None  # not a failure of the collective
    h.finish()
    assert work.wait() and steps == ["scaled"] and work.is_success()


def test_a_second_waiter_sees_the_wait_that_ended_as_it_arrived(monkeypatch):
    """Two threads wait on one fast-path Work: the first waits on the backend's Work, the second for that wait. When
    the first wait ends while the second is arriving (it saw the Work running; its event does not exist yet), the
    second returns True at once: it does not wait for an event nobody will set (past its timeout, or forever)."""
    import threading

    from funcoll.entry.work import NativeWork

    trace = flight_recorder.GroupTrace("g", (0, 1), 0, 2, maxlen=8)
    rec = trace.native_record("all_reduce", "allreduce", {"op": "all_reduce", "reduce_op": "sum",
                                                          "tensors": [["float32", [4]]]})
    entered, release = threading.Event(), threading.Event()

    class Backend:  # a backend Work whose wait() returns once the test releases it
        def wait(self, timeout=None):
            entered.set()
            assert release.wait(30)

        def is_completed(self):
            return release.is_set()

    work = NativeWork(Backend(), rec, _state(trace), quiet=False)
    first = threading.Thread(target=work.wait)
    first.start()
    assert entered.wait(30)
    real_event, me = threading.Event, threading.get_ident()

    def event_made_as_the_first_wait_ends():  # the second waiter makes its event: the first wait ends meanwhile
        if threading.get_ident() == me and not release.is_set():
            release.set()
            first.join(30)
        return real_event()

    monkeypatch.setattr(threading, "Event", event_made_as_the_first_wait_ends)
    assert work.wait(timedelta(seconds=2)) and work.is_success()
    assert not first.is_alive() and trace.entries()[0].state == "completed"


def test_backend_timeout_is_a_timeout_error_with_the_group_timeout():
    work, h, call, _ = _work(group_timeout=5.0)
    h.finish(RuntimeError("[unbound_buffer.cc:78] Timed out waiting 5000ms for recv operation to complete"))
    with pytest.raises(CollectiveTimeoutError) as e:
        work.wait()
    assert str(e.value).startswith(f"funcoll: {LABEL} timed out (group timeout 5 s): [unbound_buffer.cc:78] Timed "
                                   "out waiting 5000ms"), str(e.value)
    assert isinstance(e.value, CollectiveError) and call.state == "failed"


# ---------------------------------------------------------------------------------------------------
# the comparison of the debug mode (pure)
# ---------------------------------------------------------------------------------------------------
def _ar(shape, dtype="float32", red="sum"):
    return {"op": "all_reduce", "reduce_op": red, "tensors": [[dtype, shape]], "device": "cpu"}


def test_compare_agrees_and_names_what_differs():
    assert fingerprint.compare([_ar([4]), _ar([4]), _ar([4])], 3, "g") is None
    msg = fingerprint.compare([_ar([4]), _ar([5]), _ar([4])], 3, "g", (0, 1, 2))
    assert msg.startswith("funcoll: detected mismatch between collectives on group 'g' (global ranks 0-2) at "
                          "sequence number 3: they differ in the shapes.\n"
                          "  ranks 0,2: all_reduce(reduce_op=sum, float32[4])\n"
                          "  rank 1: all_reduce(reduce_op=sum, float32[5])\n"), msg
    # sub-group ranks are named with their global ranks
    msg = fingerprint.compare([_ar([4]), _ar([4], "int64", "max")], 0, "sub", (2, 5))
    assert "they differ in the reduce op, the dtypes.\n  rank 0 (global 2): " in msg
    assert "\n  rank 1 (global 5): all_reduce(reduce_op=max, int64[4])\n" in msg
    bc = {"op": "broadcast", "root": 0, "tensors": [["float32", [4]]], "device": "cpu"}
    assert "they differ in the collective." in fingerprint.compare([_ar([4]), bc], 0, "g")


def test_compare_cross_checks_per_peer_arguments():
    def a2a(ins, outs):
        return {"op": "all_to_all_single", "tensors": [["float32", [2]]], "outputs": [[2]], "device": "cpu",
                "input_split_sizes": ins, "output_split_sizes": outs}

    # rank r's output split from q must be rank q's input split to r: legitimately different per rank
    assert fingerprint.compare([a2a([1, 3], [1, 2]), a2a([2, 2], [3, 2])], 0, "g") is None
    msg = fingerprint.compare([a2a([1, 3], [1, 1]), a2a([2, 2], [3, 2])], 0, "g")
    assert "the split sizes do not match: rank 1 sends 2 rows to rank 0 (input_split_sizes=[2, 2]) but rank 0 " \
           "expects 1 from rank 1 (output_split_sizes=[1, 1])" in msg

    def gather(shape, root_outputs=None):
        fp = {"op": "gather", "root": 0, "tensors": [["float32", shape]], "device": "cpu"}
        if root_outputs is not None:
            fp["root_outputs"] = root_outputs
        return fp

    assert fingerprint.compare([gather([2], [[2], [2]]), gather([2])], 0, "g") is None
    msg = fingerprint.compare([gather([2], [[2], [3]]), gather([2])], 0, "g")
    assert "the root (rank 0) would receive a tensor of shape [3] from rank 1, whose tensor has shape [2]" in msg


def test_compare_gives_the_same_message_whichever_rank_computes_it():
    fps = [_ar([4]), _ar([5])]
    assert fingerprint.compare(list(fps), 1, "g") == fingerprint.compare([dict(f) for f in fps], 1, "g")


def test_fingerprints_of_process_group_methods():
    import torch.distributed as dist

    class PG:  # what a fingerprint reads of the group
        def size(self):
            return 2

        def rank(self):
            return 0

    o = dist.AllreduceOptions()
    o.reduceOp = dist.ReduceOp.AVG
    assert fingerprint.fingerprint(PG(), METHODS["allreduce"], ([torch.ones(2, 3)], o), {}) == \
        {"op": "all_reduce", "reduce_op": "avg", "tensors": [["float32", [2, 3]]], "device": "cpu"}
    fp = fingerprint.fingerprint(PG(), METHODS["alltoall_base"], (torch.empty(4, 2), torch.ones(4, 2), [], [1, 3]), {})
    assert fp["input_split_sizes"] == [1, 3] and fp["output_split_sizes"] == [2, 2]
    assert flight_recorder.describe(fp).startswith("all_to_all_single(float32[2], outputs=[[2]]")
    assert fingerprint.fingerprint(PG(), METHODS["allreduce"], (None,), {}) == {"op": "all_reduce", "malformed": True}
    # a list all_to_all: one dtype, a shape per peer
    outs, ins = [torch.empty(2), torch.empty(3)], [torch.ones(1), torch.ones(4)]
    fp = fingerprint.fingerprint(PG(), METHODS["alltoall"], (outs, ins), {})
    assert flight_recorder.describe(fp) == "all_to_all(float32, per_peer_in=[[1], [4]], per_peer_out=[[2], [3]])"


def test_every_collective_method_runs_the_pipeline():
    """Each c10d method, called on a group of one rank, is numbered and recorded under its op (the pipeline ran), and
    a method delegating to another is recorded once, as itself."""
    from datetime import timedelta

    import torch._C._distributed_c10d as C
    import torch.distributed as dist

    from funcoll.entry.process_group import ProcessGroupFuncoll

    pg = ProcessGroupFuncoll(dist.HashStore(), 0, 1, timedelta(seconds=30), options=None)
    t, out = torch.ones(4), torch.empty(4)
    calls = [
        ("allreduce", lambda: pg.allreduce([t], C.AllreduceOptions())),
        ("allreduce_coalesced", lambda: pg.allreduce_coalesced([t], C.AllreduceCoalescedOptions())),
        ("broadcast", lambda: pg.broadcast([t], C.BroadcastOptions())),
        ("_allgather_base", lambda: pg._allgather_base(out, t, C.AllgatherOptions())),
        ("all_gather_single", lambda: pg.all_gather_single(out, t, C.AllgatherOptions())),
        ("allgather", lambda: pg.allgather([[out]], [t], C.AllgatherOptions())),
        ("_reduce_scatter_base", lambda: pg._reduce_scatter_base(out, t, C.ReduceScatterOptions())),
        ("alltoall_base", lambda: pg.alltoall_base(out, t, [], [], C.AllToAllOptions())),
        ("all_to_all_single", lambda: pg.all_to_all_single(out, t, [], [], C.AllToAllOptions())),
        ("barrier", lambda: pg.barrier(C.BarrierOptions())),
    ]
    for _, issue in calls:
        issue().wait()
    got = [(c.method, c.op, c.seq, c.state) for c in flight_recorder.trace_of(pg).entries()]
    assert got == [(m, METHODS[m].op, i, "completed") for i, (m, _) in enumerate(calls)]


# ---------------------------------------------------------------------------------------------------
# real worlds: flight recorder contents, sequence numbers, monitored_barrier
# ---------------------------------------------------------------------------------------------------
def _rank_trace(rank, n):
    import torch.distributed as dist

    import funcoll

    R = dist.ReduceOp
    dist.all_reduce(torch.ones(4), op=R.AVG)
    dist.broadcast(torch.ones(2, 3), src=1)
    dist.reduce_scatter_tensor(torch.empty(2), torch.ones(2 * n))
    out_splits = [1, 1] if rank == 0 else [2, 2]  # uneven: every rank sends 1 row to rank 0 and 2 to rank 1
    dist.all_to_all_single(torch.empty(sum(out_splits)), torch.ones(3), out_splits, [1, 2])
    dist.send(torch.ones(1), 1 - rank) if rank == 0 else dist.recv(torch.ones(1), 0)
    try:
        dist.all_reduce(torch.ones(2), op=R.BXOR)  # rejected before anything is sent: no sequence number
    except TypeError:
        pass
    w = dist.all_reduce(torch.ones(4), async_op=True)
    pending_state = funcoll.flight_recorder.entries()[-1].state
    w.wait()
    entries = funcoll.flight_recorder.entries()
    return {"rows": [(c.number(), c.op, c.state, c.strategies, c.describe()) for c in entries],
            "pending_state": pending_state, "format": funcoll.flight_recorder.format(),
            "dump": json.dumps(funcoll.flight_recorder.dump()), "seq": funcoll.debug.sequence_number(dist.group.WORLD)}


@pytest.mark.parametrize("profile", [None, "xccl"], ids=["native", "xccl"])
def test_flight_recorder_records_every_collective(profile):
    r0, r1 = run_world("tests.work.test_work:_rank_trace", 2, profile, timeout=120, coll_timeout=30)
    avg = ["avg=sum+scale"] if profile == "xccl" else ["native"]
    rows = r0["rows"]
    assert [row[:3] for row in rows] == [
        ("#0", "all_reduce", "completed"), ("#1", "broadcast", "completed"),
        ("#2", "reduce_scatter_tensor", "completed"), ("#3", "all_to_all_single", "completed"),
        ("p2p #0", "send", "completed"), ("-", "all_reduce", "invalid"), ("#4", "all_reduce", "completed")]
    assert rows[0][3] == avg and rows[0][4] == "all_reduce(reduce_op=avg, float32[4])"
    assert rows[1][4] == "broadcast(root=1, float32[2, 3])"
    assert rows[3][4] == "all_to_all_single(float32[], outputs=[[]], input_split_sizes=[1, 2], " \
                         "output_split_sizes=[1, 1])"
    assert rows[5][3] == [] and r1["rows"][4][:3] == ("p2p #0", "recv", "completed")
    assert r0["pending_state"] == "issued" and r0["seq"] == r1["seq"] == 5
    assert r0["format"].splitlines()[0] == ("funcoll flight recorder: group '0' (global ranks 0,1), rank 0 of 2, "
                                            "next sequence number 5")
    assert json.loads(r0["dump"])["entries"][0]["fingerprint"]["tensors"] == [["float32", [4]]]


def _rank_monitored(rank, n, wait_all):
    from datetime import timedelta

    import torch.distributed as dist

    dist.monitored_barrier(timeout=timedelta(seconds=5))  # everyone arrives: passes
    if rank != 0:
        time.sleep(4)  # ranks 1.. never arrive at the second one
        return None
    t0 = time.monotonic()
    try:
        dist.monitored_barrier(timeout=timedelta(seconds=2), wait_all_ranks=wait_all)
        return {"ok": True}
    except RuntimeError as e:
        return {"type": type(e).__name__, "msg": str(e), "secs": time.monotonic() - t0}


@pytest.mark.parametrize("wait_all", [False, True])
def test_monitored_barrier_names_the_missing_ranks(wait_all):
    r = run_world("tests.work.test_work:_rank_monitored", 3, None, args=(wait_all,), timeout=120, coll_timeout=30)[0]
    missing = "Ranks 1, 2 failed to pass monitoredBarrier in 2000 ms" if wait_all else \
        "Rank 1 failed to pass monitoredBarrier in 2000 ms"
    assert r["type"] == "CollectiveError", r
    assert r["msg"].startswith("funcoll: monitored_barrier on group '0' (global ranks 0-2): ") and missing in r["msg"]
    assert 1.9 < r["secs"] < 4.0, r
