"""Faults end in clear errors, never in hangs or aborts: real 2-process worlds, each with a hard deadline.

Rank bodies (``_rank_*``) sit next to their asserts; the parent spawns the world with the one harness
(:func:`funcoll.launch._spawn_world`), which tolerates ranks that die on purpose, kills what overruns the deadline, and
reports exit codes (a SIGABRT is -6).
Scenarios: a peer dies before / during a collective; ranks issue mismatched ops, shapes, dtypes, reduce ops, roots
or split sizes (with the debug mode's check, and without it through the size guard (funcoll/entry/checks.py): the same
clear error on every rank, no process abort, and the ranks stay in step; with the guard off: an error naming the
collective within the timeout where gloo does not abort); a rank skips a call; destroy and re-init; 1000 outstanding
async ops; two threads on two groups; malformed requests on one rank only. The guard's digest is also tested in
process.
"""

from __future__ import annotations

import os
import time

import pytest

from funcoll.launch import _spawn_world

COLL_TIMEOUT = 5.0  # the group timeout of every world here
SLACK = 10.0  # "no hang past timeout + 10 s"


def _world(fn: str, world: int = 2, env=None, deadline: float = 45.0, args=(), profile=None,
           coll_timeout: float = COLL_TIMEOUT):
    """``tests.faults.test_faults:<fn>`` on ``world`` ranks through the one harness
    (:func:`funcoll.launch._spawn_world`),
    the debug switches off and the size guard on (``FUNCOLL_GUARD=1``; by default it is off unless
    ``TORCH_DISTRIBUTED_DEBUG=DETAIL``) unless ``env`` sets them: ``(results, exit codes, hung)``."""
    env = {"FUNCOLL_DEBUG": None, "TORCH_DISTRIBUTED_DEBUG": None, "FUNCOLL_GUARD": "1", **(env or {})}
    return _spawn_world(f"tests.faults.test_faults:{fn}", world, profile, args, deadline=deadline,
                        coll_timeout=coll_timeout, env=env)


def _ok(res, r):
    results, codes, hung = res
    assert not hung, f"ranks {hung} still running past the deadline (exit codes {codes})"
    assert results[r] is not None, f"rank {r} died without a result (exit code {codes[r]})"
    assert results[r][0] == "ok", f"rank {r} failed:\n{results[r][1]}"
    return results[r][1]


def _attempt(fn):
    """Runs ``fn``; returns what happened, with the time it took."""
    t0 = time.monotonic()
    try:
        value = fn()
        return {"ok": True, "value": value, "secs": time.monotonic() - t0}
    except Exception as e:  # noqa: BLE001 - reported to the parent
        return {"ok": False, "type": type(e).__name__, "msg": str(e), "secs": time.monotonic() - t0,
                "mro": [c.__name__ for c in type(e).__mro__]}


def _still_in_step(rank, n):
    """A valid collective after the failure: nothing of the failed one was sent, so it pairs up correctly."""
    import torch
    import torch.distributed as dist

    t = torch.full((3,), float(rank + 1))
    dist.all_reduce(t)
    return t.tolist() == [float(sum(range(1, n + 1)))] * 3


def _group_label(n):
    import torch.distributed as dist

    return f"group {dist.group.WORLD.group_name!r} (global ranks {','.join(map(str, range(n)))}"


# Rank bodies that need no fault of their own run one after the other in one world (``_rank_shared``), in this
# order, each with its own deadline: (body, args, seconds). _rank_outstanding is first: it counts the world group's
# sequence numbers and flight recorder entries from zero; _rank_threads makes its own groups.
SHARED = [("_rank_outstanding", (1000,), 120), ("_rank_guard_scope", (), 40), ("_rank_threads", (), 90)]


def _rank_shared(rank, n):
    """Each body of SHARED in turn: ``{body: ("ok", result) or ("err", traceback)}``, as _spawn_world reports one."""
    import traceback

    out = {}
    for fn, args, _ in SHARED:
        try:
            out[fn] = ("ok", globals()[fn](rank, n, *args))
        except Exception:  # noqa: BLE001 - reported to the test of this body
            out[fn] = ("err", traceback.format_exc())
    return out


@pytest.fixture(scope="module")
def shared_world():
    """``shared_world(body)``: ``(results, exit codes, hung)`` of ``body`` as if it had had a world of its own."""
    res = []

    def get(fn):
        if not res:
            res.append(_world("_rank_shared", deadline=sum(d for _, _, d in SHARED)))
        results, codes, hung = res[0]
        return [r if r is None or r[0] != "ok" else r[1][fn] for r in results], codes, hung

    return get


# ---------------------------------------------------------------------------------------------------
# a peer dies
# ---------------------------------------------------------------------------------------------------
def _rank_peer_dies_before(rank, n):
    import torch
    import torch.distributed as dist

    if rank == 1:
        os._exit(7)
    time.sleep(1.0)  # rank 1 is gone
    label = _group_label(n)
    r = _attempt(lambda: dist.all_reduce(torch.ones(4)))
    r["label"] = label
    r["destroy"] = _attempt(dist.destroy_process_group)
    return r


def test_peer_dies_before_a_collective():
    res = _world("_rank_peer_dies_before")
    r = _ok(res, 0)
    assert res[1][1] == 7, res[1]
    assert not r["ok"] and r["type"] == "CollectiveError", r
    assert "DistBackendError" in r["mro"] and "RuntimeError" in r["mro"]
    assert r["msg"].startswith(f"funcoll: all_reduce #0 on {r['label']}; this is rank 0 of 2) failed: "), r["msg"]
    assert r["secs"] < COLL_TIMEOUT + SLACK, r
    assert r["destroy"]["ok"], r["destroy"]  # the process stays usable


def _rank_peer_killed_during(rank, n):
    import signal

    import torch
    import torch.distributed as dist

    from funcoll import flight_recorder

    t = torch.ones(1 << 22)  # 16 MB: the peer dies while it is being exchanged
    w = dist.all_reduce(t, async_op=True)
    if rank == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    label = _group_label(n)
    fut = w.get_future()
    f = _attempt(fut.wait)  # the future first, as DDP's Reducer reads a bucket's Work
    recorded = flight_recorder.entries()[-1]  # read after the future failed: the failure is discovered
    r = _attempt(w.wait)
    r.update(label=label, completed=w.is_completed(), success=w.is_success(),
             exception=type(w.exception()).__name__, same_exception=str(w.exception()) == r.get("msg"),
             recorded=(recorded.op, recorded.seq, recorded.state))
    r["future"] = {"ok": f["ok"], "type": f.get("type"), "same": f.get("msg") == r.get("msg"),
                   "msg": f.get("msg", "")}
    r["destroy"] = _attempt(dist.destroy_process_group)
    return r


@pytest.mark.parametrize("mode", ["default", "debug"])
def test_peer_killed_during_a_collective(mode):
    # by default an async all_reduce takes the fast path: its future is gloo's own (as a c10d Work's, no Python
    # callback on gloo's thread), failing with gloo's error; the debug mode's full path hands out funcoll's, naming it
    res = _world("_rank_peer_killed_during", env={"FUNCOLL_DEBUG": "1"} if mode == "debug" else None)
    r = _ok(res, 0)
    assert res[1][1] == -9, res[1]
    assert not r["ok"] and r["type"] == "CollectiveError", r
    assert r["msg"].startswith(f"funcoll: all_reduce #0 on {r['label']}; this is rank 0 of 2) failed: "), r["msg"]
    assert r["secs"] < COLL_TIMEOUT + SLACK
    # the Work tells the truth, and so do its future (DDP comm hooks chain on it) and the flight recorder
    assert r["completed"] and not r["success"] and r["exception"] == "CollectiveError" and r["same_exception"], r
    assert r["recorded"] == ("all_reduce", 0, "failed"), r["recorded"]
    f = r["future"]
    if mode == "debug":
        assert (f["ok"], f["type"], f["same"]) == (False, "CollectiveError", True), f
    else:  # the backend's own error: the one the Work's error names as its cause
        assert (f["ok"], f["type"]) == (False, "RuntimeError") and f["msg"], f
        assert "failed: " + f["msg"].strip() in r["msg"], (r["msg"], f["msg"])
    assert r["destroy"]["ok"], r["destroy"]


# ---------------------------------------------------------------------------------------------------
# mismatched collectives
# ---------------------------------------------------------------------------------------------------
def _issue(kind, rank):
    """Rank 0 and rank 1 disagree on one thing."""
    import torch
    import torch.distributed as dist

    R = dist.ReduceOp
    if kind == "op":
        t = torch.ones(4)
        return dist.all_reduce(t) if rank == 0 else dist.broadcast(t, 0)
    if kind == "shape":
        return dist.all_reduce(torch.ones(4 if rank == 0 else 5))
    if kind == "dtype":  # the same width: gloo would add the bits silently
        return dist.all_reduce(torch.ones(4, dtype=torch.float32 if rank == 0 else torch.int32))
    if kind == "dtype_width":  # 16 vs 32 bytes: gloo aborts the process
        return dist.all_reduce(torch.ones(4, dtype=torch.float32 if rank == 0 else torch.float64))
    if kind == "reduce_op":
        return dist.all_reduce(torch.ones(4), op=R.SUM if rank == 0 else R.MAX)
    if kind == "root":
        return dist.broadcast(torch.ones(4), src=rank)
    if kind == "splits":
        out, inp = torch.empty(4), torch.ones(4)
        splits = [1, 3] if rank == 0 else [2, 2]
        return dist.all_to_all_single(out, inp, splits, splits)
    if kind == "even_splits":  # all_to_all_single without split sizes: 4 rows vs 6 rows, 2 vs 3 per peer
        return dist.all_to_all_single(torch.empty(4 + 2 * rank), torch.ones(4 + 2 * rank))
    if kind == "splits_passed":  # rank 1 passes split sizes, rank 0 none: the uneven exchange against the even one
        out, inp = torch.empty(4), torch.ones(4)
        return dist.all_to_all_single(out, inp, [2, 2], [2, 2]) if rank else dist.all_to_all_single(out, inp)
    if kind == "gather_list":  # all_gather of a list: rank 1's tensors are larger
        outs = [torch.empty(2 + rank) for _ in range(2)]
        return dist.all_gather(outs, torch.ones(2 + rank))
    if kind == "reduce_scatter_list":  # rank 0 thinks rank 1 gets 2 elements, rank 1 that it gets 3
        sizes = [1, 2 + rank]
        return dist.reduce_scatter(torch.empty(sizes[rank]), [torch.ones(s) for s in sizes])
    if kind == "gather_tensor":
        return dist.all_gather_into_tensor(torch.empty(2 * (2 + rank)), torch.ones(2 + rank))
    if kind == "reduce_scatter":
        return dist.reduce_scatter_tensor(torch.empty(2 + rank), torch.ones(2 * (2 + rank)))
    if kind == "broadcast_shape":  # gloo itself survives this one: rank 1's fifth element is never written
        return dist.broadcast(torch.ones(4 + rank), src=0)
    if kind == "gather":  # rooted gather: rank 1 sends 3 elements where the root expects 2
        return dist.gather(torch.ones(2 + rank), [torch.empty(2) for _ in range(2)] if rank == 0 else None, dst=0)
    raise AssertionError(kind)


def _rank_mismatches(rank, n):
    """Every kind in turn, in one world: after each mismatch the ranks are still in step."""
    out = {}
    for kind in MISMATCHES:
        r = _attempt(lambda kind=kind: _issue(kind, rank))
        r["label"] = _group_label(n)
        r["in_step"] = _still_in_step(rank, n)
        out[kind] = r
    return out


# kind -> (the reason in the message, lines of the message). Every kind gloo aborts on without a check is here
# (shape, dtype_width, splits, even_splits, gather_list, gather_tensor, reduce_scatter, gather: exit -6 on a plain
# gloo group and on a funcoll group without the guard; docs/conformance.md), and the kinds gloo survives or times
# out on (op, root: timeout; dtype, reduce_op, broadcast_shape: silently wrong numbers).
MISMATCHES = {
    "op": ("they differ in the collective", ["rank 0: all_reduce(reduce_op=sum, float32[4])",
                                             "rank 1: broadcast(root=0, float32[4])"]),
    "shape": ("they differ in the shapes", ["rank 0: all_reduce(reduce_op=sum, float32[4])",
                                            "rank 1: all_reduce(reduce_op=sum, float32[5])"]),
    "dtype": ("they differ in the dtypes", ["rank 0: all_reduce(reduce_op=sum, float32[4])",
                                            "rank 1: all_reduce(reduce_op=sum, int32[4])"]),
    "dtype_width": ("they differ in the dtypes", ["rank 0: all_reduce(reduce_op=sum, float32[4])",
                                                  "rank 1: all_reduce(reduce_op=sum, float64[4])"]),
    "reduce_op": ("they differ in the reduce op", ["rank 1: all_reduce(reduce_op=max, float32[4])"]),
    "root": ("they differ in the root", ["rank 0: broadcast(root=0, float32[4])",
                                         "rank 1: broadcast(root=1, float32[4])"]),
    "splits": ("the split sizes do not match: rank 1 sends 2 rows to rank 0 (input_split_sizes=[2, 2]) but rank 0 "
               "expects 3 from rank 1 (output_split_sizes=[1, 3])", []),
    "even_splits": ("the split sizes do not match: rank 1 sends 3 rows to rank 0 (input_split_sizes=[3, 3]) but "
                    "rank 0 expects 2 from rank 1 (output_split_sizes=[2, 2])", []),
    "splits_passed": ("they differ in whether split sizes are passed",
                      ["rank 0: all_to_all_single(float32[], outputs=[[]], split_sizes=none, input_split_sizes=[2, 2], "
                       "output_split_sizes=[2, 2])",
                       "rank 1: all_to_all_single(float32[], outputs=[[]], input_split_sizes=[2, 2], "
                       "output_split_sizes=[2, 2])"]),
    "gather_list": ("the sizes do not match: rank 1 expects 3 elements from rank 0 (output[0] of shape [3]) but rank "
                    "0's input has 2 (shape [2])",
                    ["rank 0: all_gather(float32, input_shape=[2], output_shapes=[[2], [2]])",
                     "rank 1: all_gather(float32, input_shape=[3], output_shapes=[[3], [3]])"]),
    "gather_tensor": ("they differ in the shapes, the output shapes",
                      ["rank 0: all_gather_into_tensor(float32[2], outputs=[[4]])",
                       "rank 1: all_gather_into_tensor(float32[3], outputs=[[6]])"]),
    "reduce_scatter": ("they differ in the shapes, the output shapes",
                       ["rank 0: reduce_scatter_tensor(reduce_op=sum, float32[4], outputs=[[2]])",
                        "rank 1: reduce_scatter_tensor(reduce_op=sum, float32[6], outputs=[[3]])"]),
    "broadcast_shape": ("they differ in the shapes", ["rank 0: broadcast(root=0, float32[4])",
                                                      "rank 1: broadcast(root=0, float32[5])"]),
    "gather": ("they differ in the shapes", ["rank 0: gather(root=0, float32[2], root_outputs=[[2], [2]])",
                                             "rank 1: gather(root=0, float32[3])"]),
    "reduce_scatter_list": (
        "the sizes do not match: rank 0 reduces 2 elements into rank 1 (input[1] of shape [2]) but rank 1's output "
        "has 3 (shape [3])",
        ["rank 0: reduce_scatter(reduce_op=sum, float32, output_shape=[1], input_shapes=[[1], [2]])",
         "rank 1: reduce_scatter(reduce_op=sum, float32, output_shape=[3], input_shapes=[[1], [3]])"]),
}


DEBUG_SUFFIX = "(cross-rank check of FUNCOLL_DEBUG / TORCH_DISTRIBUTED_DEBUG=DETAIL)"
GUARD_SUFFIX = "(funcoll's size guard on CPU groups; FUNCOLL_GUARD=0 turns it off)"
CHECKS = {"FUNCOLL_DEBUG": {"FUNCOLL_DEBUG": "1"}, "TORCH_DISTRIBUTED_DEBUG": {"TORCH_DISTRIBUTED_DEBUG": "DETAIL"},
          "guard": {}}  # "guard": no debug mode; the size guard on (FUNCOLL_GUARD=1, as _world sets it)


@pytest.fixture(scope="module")
def mismatch_worlds():
    """One 2-rank world per way of checking, every kind of MISMATCHES in turn: ``(rank 0's, rank 1's)`` results."""
    cache = {}

    def get(check):
        if check not in cache:
            res = _world("_rank_mismatches", env=CHECKS[check], deadline=60)
            results, codes, hung = res
            assert not hung and codes == [0, 0], f"a rank hung or died (exit codes {codes}; -6 is an abort): {res}"
            cache[check] = (_ok(res, 0), _ok(res, 1))
        return cache[check]

    return get


@pytest.mark.parametrize("check", list(CHECKS))
@pytest.mark.parametrize("kind", list(MISMATCHES))
def test_mismatch_is_the_same_clear_error_on_every_rank(mismatch_worlds, kind, check):
    """With the debug mode (either switch) and without it (the size guard): no process abort, the same
    CollectiveMismatchError on every rank naming the collective and what differs, found by the check before anything
    is sent (not by a timeout), and the ranks still in step."""
    r0, r1 = (w[kind] for w in mismatch_worlds(check))
    why, lines = MISMATCHES[kind]
    seq = list(MISMATCHES).index(kind) * 2  # each kind: the mismatched call, then one valid all_reduce
    for r in (r0, r1):
        assert not r["ok"] and r["type"] == "CollectiveMismatchError", r
        assert r["msg"].startswith(f"funcoll: detected mismatch between collectives on {r['label']}) at "
                                   f"sequence number {seq}: {why}"), r["msg"]
        for line in lines:
            assert f"\n  {line}" in r["msg"], (line, r["msg"])
        assert r["msg"].endswith((GUARD_SUFFIX if check == "guard" else DEBUG_SUFFIX) + "."), r["msg"]
        assert r["secs"] < COLL_TIMEOUT / 2, r  # found by the check, not by a timeout
        assert r["in_step"], "the ranks are out of step after the mismatch: something was sent"
    assert r0["msg"] == r1["msg"]  # the same error on every rank


@pytest.mark.parametrize("kind", list(MISMATCHES))
def test_the_guard_says_what_the_debug_mode_says(mismatch_worlds, kind):
    """The guard's slow path reuses the debug mode's comparison: the same text but for the closing parenthesis."""
    debug, guard = mismatch_worlds("FUNCOLL_DEBUG")[0][kind], mismatch_worlds("guard")[0][kind]
    assert guard["msg"] == debug["msg"].replace(DEBUG_SUFFIX, GUARD_SUFFIX)


def _rank_guard_off(rank, n):
    """FUNCOLL_GUARD=0: nothing is checked across ranks (as with gloo without DETAIL). A same-width dtype mismatch goes
    through silently; all_reduce vs broadcast ends in an error naming the collective within the timeout."""
    import torch.distributed as dist

    import funcoll

    out = {"enabled": funcoll.debug.guard_enabled(dist.group.WORLD)}
    out["dtype"] = _attempt(lambda: _issue("dtype", rank))
    out["op"] = _attempt(lambda: _issue("op", rank))
    out["label"] = _group_label(n)
    return out


def test_with_the_guard_off_a_mismatch_names_the_collective_within_the_timeout():
    res = _world("_rank_guard_off", env={"FUNCOLL_GUARD": "0"}, deadline=40)
    results, codes, hung = res
    assert not hung and codes == [0, 0], res
    for rank in (0, 1):
        r = _ok(res, rank)
        assert r["enabled"] is False
        assert r["dtype"]["ok"], r["dtype"]  # not checked: gloo adds the bits
        e = r["op"]
        assert not e["ok"] and e["type"] in ("CollectiveError", "CollectiveTimeoutError"), e
        op = "all_reduce" if rank == 0 else "broadcast"
        assert e["msg"].startswith(f"funcoll: {op} #1 on {r['label']}; this is rank {rank} of 2) "), e["msg"]
        assert e["secs"] < COLL_TIMEOUT + SLACK, e


def _rank_guard_scope(rank, n):
    """Counts the guard's digest exchanges (all_gathers on the CPU transport's gloo backend) per kind of call."""
    import torch
    import torch.distributed as dist

    import funcoll

    pg = dist.group.WORLD
    t = torch.ones(4)
    dist.all_reduce(t)
    st = pg._state
    real, count = st.guard_transport, []

    class Counting:
        def gathered(self, values):
            count.append(values.numel())
            return real.gathered(values)

    st.guard_transport = Counting()
    out = {}
    try:
        def counted(fn):
            del count[:]
            fn()
            return list(count)

        out["all_reduce"] = counted(lambda: dist.all_reduce(t))
        out["barrier"] = counted(dist.barrier)
        out["async all_reduce"] = counted(lambda: dist.all_reduce(t, async_op=True).wait())
        out["send/recv"] = counted(lambda: dist.send(t, 1) if rank == 0 else dist.recv(t, 0))
        funcoll.debug.set_guard(pg, False)
        out["guard off"] = counted(lambda: dist.all_reduce(t))
        funcoll.debug.set_guard(pg, True)
        out["guard on again"] = counted(lambda: dist.all_reduce(t))
    finally:
        st.guard_transport = real
    return out


def test_the_guard_runs_once_per_blocking_collective_and_never_for_async_or_send_recv(shared_world):
    res = shared_world("_rank_guard_scope")
    for rank in (0, 1):
        assert _ok(res, rank) == {"all_reduce": [3], "barrier": [3], "async all_reduce": [], "send/recv": [],
                                  "guard off": [], "guard on again": [3]}


# ---------------------------------------------------------------------------------------------------
# the guard's digest, in process (funcoll/entry/fingerprint.py)
# ---------------------------------------------------------------------------------------------------
def _a2a_fp(ins, outs):
    return {"op": "all_to_all_single", "tensors": [["float32", [3]]], "outputs": [[3]], "device": "cpu",
            "input_split_sizes": ins, "output_split_sizes": outs}


def _table(fps, seqs=None):
    from funcoll.entry.fingerprint import digest

    n = len(fps)
    return [v for r, fp in enumerate(fps) for v in digest(fp, (seqs or [0] * n)[r], r, n)]


def test_digest_is_stable_across_processes():
    """blake2b, not Python's salted hash(): a fixed fingerprint has a fixed digest."""
    from funcoll.entry.fingerprint import digest

    fp = {"op": "all_reduce", "reduce_op": "sum", "tensors": [["float32", [4]]], "device": "cpu"}
    assert digest(fp, 7, 0, 2) == [7, -7807266555229035505, 0]


def test_digest_checks_split_sizes_against_each_other():
    from funcoll.entry.fingerprint import agree

    # 3 ranks, uneven: rank r sends ins[r][q] rows to q, which expects outs[q][r]
    ins = [[1, 2, 3], [4, 5, 6], [7, 8, 9]]
    outs = [[ins[q][r] for q in range(3)] for r in range(3)]
    assert agree(_table([_a2a_fp(ins[r], outs[r]) for r in range(3)]), 3)
    bad = [list(o) for o in outs]
    bad[2][0] += 1  # rank 2 expects one row more from rank 0 than rank 0 sends
    assert not agree(_table([_a2a_fp(ins[r], bad[r]) for r in range(3)]), 3)
    swapped = [list(o) for o in outs]
    swapped[1] = swapped[1][::-1]  # the same numbers, attributed to the wrong peers
    assert not agree(_table([_a2a_fp(ins[r], swapped[r]) for r in range(3)]), 3)


def test_digest_checks_rooted_lists_and_element_counts():
    from funcoll.entry.fingerprint import agree

    def gather(r, shape, root_outputs=None):
        fp = {"op": "gather", "root": 0, "tensors": [["float32", shape]], "device": "cpu"}
        if r == 0:
            fp["root_outputs"] = root_outputs
        return fp

    assert agree(_table([gather(0, [2], [[2], [2]]), gather(1, [2])]), 2)
    assert not agree(_table([gather(0, [2], [[2], [3]]), gather(1, [2])]), 2)
    assert not agree(_table([gather(0, [2], [[2]]), gather(1, [2])]), 2)

    def gs(r, numel):
        fp = {"op": "gather_single", "root": 1, "tensors": [["float32", [2, 3]]], "device": "cpu"}
        if r == 1:
            fp["root_output_numel"] = numel
        return fp

    assert agree(_table([gs(0, None), gs(1, 12)]), 2)
    assert not agree(_table([gs(0, None), gs(1, 13)]), 2)


def test_digest_differs_in_every_common_field_and_the_sequence_number():
    from funcoll.entry.fingerprint import agree

    fp = {"op": "all_reduce", "reduce_op": "sum", "tensors": [["float32", [4]]], "device": "cpu"}
    assert agree(_table([fp, dict(fp)]), 2)
    assert not agree(_table([fp, dict(fp)], seqs=[3, 4]), 2)
    for key, value in [("op", "broadcast"), ("reduce_op", "max"), ("tensors", [["float32", [5]]]),
                       ("tensors", [["int32", [4]]]), ("device", "xla")]:
        assert not agree(_table([fp, {**fp, key: value}]), 2), key


def test_the_guard_stays_out_of_world_1_virtual_worlds_and_other_devices(monkeypatch):
    """No exchange where it does not apply: one rank, a local store, a tensor that is not on the CPU (the guard
    turned on, FUNCOLL_GUARD=1)."""
    from datetime import timedelta

    import torch.distributed as dist

    from funcoll.entry import flight_recorder
    from funcoll.entry.checks import size_guard
    from funcoll.entry.group_state import GroupState

    monkeypatch.setenv("FUNCOLL_GUARD", "1")

    class Transport:
        def gathered(self, values):
            raise AssertionError("the guard exchanged a digest")

    class RealStore(dist.Store):  # not a local store: a store other processes could reach
        pass

    def call(device):
        fp = {"op": "all_reduce", "reduce_op": "sum", "tensors": [["float32", [4]]], "device": device}
        return flight_recorder.Call("g", (0, 1), 0, 2, "all_reduce", "allreduce", fp, seq=0)

    for size, local, device in [(1, False, "cpu"), (2, True, "cpu"), (2, False, "xla"), (2, False, "xpu")]:
        store = dist.HashStore() if local else RealStore()
        st = GroupState(store, 0, size, timedelta(seconds=5), "g", tuple(range(size)))
        st.guard_transport = Transport()
        size_guard(st, call(device))  # returns without exchanging
        assert st.guard == (size > 1 and not local)


# ---------------------------------------------------------------------------------------------------
# a rank skips a call
# ---------------------------------------------------------------------------------------------------
def _rank_skip(rank, n):
    import torch
    import torch.distributed as dist

    label = _group_label(n)
    if rank == 1:  # skips the all_reduce, stays alive past rank 0's timeout
        time.sleep(COLL_TIMEOUT + 3)
        return {"label": label}
    r = _attempt(lambda: dist.all_reduce(torch.ones(4)))
    r["label"] = label
    return r


@pytest.mark.parametrize("debug", [False, True], ids=["default", "debug"])
def test_a_rank_skipping_a_call(debug, tmp_path):
    env = {"FUNCOLL_DEBUG": "1" if debug else "0", "FUNCOLL_TRACE_DIR": str(tmp_path)}
    res = _world("_rank_skip", env=env)
    r = _ok(res, 0)
    _ok(res, 1)
    assert not r["ok"] and r["type"] == "CollectiveTimeoutError", r
    head = f"funcoll: all_reduce #0 on {r['label']}; this is rank 0 of 2)"
    if debug:  # the check names the rank that did not arrive
        assert r["msg"].startswith(f"{head}: rank 1 did not reach this collective within 5 s"), r["msg"]
    else:  # the size guard's digest exchange times out, with the collective named
        assert r["msg"].startswith(f"{head} timed out (group timeout 5 s): "), r["msg"]
        assert "while the ranks exchanged this collective's size digest before sending it: a rank did not reach " \
            "it" in r["msg"], r["msg"]
    assert COLL_TIMEOUT - 0.5 < r["secs"] < COLL_TIMEOUT + SLACK, r
    dumps = list(tmp_path.glob("funcoll_trace_*_rank0_*.json"))  # the flight recorder, dumped on the timeout
    assert len(dumps) == 1 and f"Flight recorder dumped to {dumps[0]}" in r["msg"], (dumps, r["msg"])
    import json

    d = json.loads(dumps[0].read_text())
    assert [(e["seq"], e["op"], e["state"]) for e in d["entries"]] == [(0, "all_reduce", "issued")], d


# ---------------------------------------------------------------------------------------------------
# destroy and re-init; many outstanding ops; threads
# ---------------------------------------------------------------------------------------------------
def _rank_reinit(rank, n, path):
    import torch
    import torch.distributed as dist

    import funcoll

    out = []
    for i in range(3):
        if i:  # a new default group; each is used before it is destroyed: a rank that exits right after creating a
            # group can close its connections while a peer is still connecting to it (gloo: "Connection closed by peer")
            dist.init_process_group("funcoll", init_method=f"file://{path}.{i}", rank=rank, world_size=n)
        t = torch.full((4,), float(rank + 1 + i))
        dist.all_reduce(t)
        pg = dist.group.WORLD
        out.append((t.tolist(), funcoll.debug.sequence_number(pg), type(pg).__name__))
        dist.destroy_process_group()
    return out


def test_destroy_and_reinit(tmp_path):
    res = _world("_rank_reinit", args=(str(tmp_path / "store"),))
    for rank in (0, 1):
        out = _ok(res, rank)
        assert out == [([3.0 + 2 * i] * 4, 1, "ProcessGroupFuncoll") for i in range(3)], out


def _rank_outstanding(rank, n, count):
    import torch
    import torch.distributed as dist

    import funcoll

    ts = [torch.full((2,), float(i * (rank + 1))) for i in range(count)]
    works = [dist.all_reduce(t, async_op=True) for t in ts]
    for w in works:
        w.wait()
    ok = all(t.tolist() == [float(i * 3)] * 2 for i, t in enumerate(ts))
    trace = funcoll.flight_recorder.entries()
    return {"ok": ok, "seq": funcoll.debug.sequence_number(dist.group.WORLD),
            "all_completed": all(w.is_completed() and w.is_success() for w in works),
            "recorded": len(trace), "last": (trace[-1].seq, trace[-1].state)}


def test_1000_outstanding_async_ops(shared_world):
    res = shared_world("_rank_outstanding")
    for rank in (0, 1):
        r = _ok(res, rank)
        assert r == {"ok": True, "seq": 1000, "all_completed": True, "recorded": 256, "last": (999, "completed")}, r


def _rank_threads(rank, n):
    import threading

    import torch
    import torch.distributed as dist

    groups = [dist.new_group([0, 1]), dist.new_group([0, 1])]
    errors, results = [], {}

    def loop(k):
        try:
            g = groups[k]
            total = 0.0
            for i in range(50):
                t = torch.full((3,), float((rank + 1) * (k + 1) * (i + 1)))
                dist.all_reduce(t, group=g)
                total += t[0].item()
            results[k] = total
        except Exception as e:  # noqa: BLE001
            errors.append(f"{k}: {e}")

    threads = [threading.Thread(target=loop, args=(k,)) for k in range(2)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=60)
    import funcoll

    return {"errors": errors, "results": results, "alive": [th.is_alive() for th in threads],
            "seqs": [funcoll.debug.sequence_number(g) for g in groups]}


def test_two_threads_on_two_groups(shared_world):
    res = shared_world("_rank_threads")
    want = {k: float(3 * (k + 1) * sum(range(1, 51))) for k in range(2)}
    for rank in (0, 1):
        r = _ok(res, rank)
        assert r == {"errors": [], "results": want, "alive": [False, False], "seqs": [50, 50]}, r


# ---------------------------------------------------------------------------------------------------
# malformed requests: raised on the calling rank only, nothing sent
# ---------------------------------------------------------------------------------------------------
def _malformed(n):
    import torch
    import torch.distributed as dist

    R = dist.ReduceOp
    f = torch.ones(4)
    return {
        "bitwise op on float": (TypeError, "funcoll.all_reduce: reduce op bxor needs an integer or bool tensor",
                                lambda: dist.all_reduce(f.clone(), op=R.BXOR)),
        "avg on bool": (TypeError, "funcoll.all_reduce: reduce op avg is not defined for bool tensors",
                        lambda: dist.all_reduce(torch.ones(2, dtype=torch.bool), op=R.AVG)),
        "premul_sum on int": (TypeError, "funcoll.all_reduce: reduce op premul_sum needs a floating point tensor",
                              lambda: dist.all_reduce(torch.ones(2, dtype=torch.int32),
                                                      op=dist._make_nccl_premul_sum(2.0))),
        "avg on uint64": (TypeError, "funcoll.all_reduce: reduce op avg on torch.uint64 cannot be computed exactly",
                          lambda: dist.all_reduce(torch.ones(2, dtype=torch.uint64), op=R.AVG)),
        "reduce float8": (TypeError, "cannot be reduced (float8 is supported by non-reducing ops only)",
                          lambda: dist.all_reduce(torch.ones(2).to(torch.float8_e4m3fn))),
        "reduce_scatter indivisible": (ValueError, f"input dim 0 (5) must be divisible by the group size ({n})",
                                       lambda: dist.reduce_scatter_tensor(torch.empty(2), torch.ones(5))),
        "all_gather output shape": (ValueError, f"output has shape (3,), expected ({4 * n},)",
                                    lambda: dist.all_gather_into_tensor(torch.empty(3), f)),
        "all_gather output dtype": (TypeError, "output has dtype torch.int32, expected torch.float32",
                                    lambda: dist.all_gather_into_tensor(torch.empty(4 * n, dtype=torch.int32), f)),
        "a2a split count": (ValueError, f"input_split_sizes has {n + 1} entries, expected one per rank",
                            lambda: dist.all_to_all_single(torch.empty(n + 1), torch.ones(n + 1), [1] * (n + 1),
                                                           [1] * (n + 1))),
        "a2a split sum": (ValueError, f"sum to {2 * n}, but input dim 0 is {2 * n + 1}",
                          lambda: dist.all_to_all_single(torch.empty(2 * n), torch.ones(2 * n + 1), [2] * n,
                                                         [2] * n)),
        "a2a trailing dims": (ValueError, "must agree after dim 0",
                              lambda: dist.all_to_all_single(torch.empty(n, 3), torch.ones(n, 2))),
        "all_gather list length": (ValueError, f"funcoll.all_gather: expected {n} output tensors, got {n + 1}",
                                   lambda: dist.all_gather([torch.empty(4) for _ in range(n + 1)], f)),
        "reduce_scatter list length": (ValueError, f"funcoll.reduce_scatter: expected {n} input tensors",
                                       lambda: dist.reduce_scatter(torch.empty(4), [f] * (n + 1))),
        "recv from any source": (NotImplementedError, "receiving from any source is not supported",
                                 lambda: dist.recv(torch.empty(2))),
    }


def _rank_malformed(rank, n, debug):
    import torch.distributed as dist

    import funcoll

    failures, count = [], 0
    if rank == 0:  # only rank 0 issues them; rank 1 goes straight to the next valid collective
        for name, (exc, text, fn) in _malformed(n).items():
            count += 1
            r = _attempt(fn)
            if r["ok"] or r["type"] != exc.__name__ or text not in r["msg"]:
                failures.append(f"{name}: expected {exc.__name__} with {text!r}, got {r}")
    seq = funcoll.debug.sequence_number(dist.group.WORLD)
    invalid = [c.state for c in funcoll.flight_recorder.entries()]
    return {"failures": failures, "count": count, "seq_before": seq, "in_step": _still_in_step(rank, n),
            "invalid": invalid}


@pytest.mark.parametrize("debug", [False, True], ids=["default", "debug"])
def test_malformed_requests_raise_on_the_calling_rank_only(debug):
    res = _world("_rank_malformed", env={"FUNCOLL_DEBUG": "1" if debug else "0"}, args=(debug,))
    r0, r1 = _ok(res, 0), _ok(res, 1)
    assert r0["count"] >= 12 and not r0["failures"], "\n".join(r0["failures"])
    # nothing was sent and no sequence number used: rank 1, which issued none of them, is in step
    assert r0["seq_before"] == r1["seq_before"] == 0 and r0["in_step"] and r1["in_step"]
    assert r0["invalid"] == ["invalid"] * r0["count"]  # the flight recorder keeps them, unnumbered


@pytest.mark.parametrize("env, on", [
    ({}, False),  # a user's job pays no extra collective by default
    ({"TORCH_DISTRIBUTED_DEBUG": "DETAIL"}, True),  # torch's convention for cross-rank checks
    ({"TORCH_DISTRIBUTED_DEBUG": "DETAIL", "FUNCOLL_GUARD": "0"}, False),
    ({"TORCH_DISTRIBUTED_DEBUG": "INFO"}, False),
    ({"FUNCOLL_GUARD": "1"}, True),
])
def test_the_guard_is_on_under_detail_or_when_asked(monkeypatch, env, on):
    import torch.distributed as dist

    import funcoll

    for var in ("TORCH_DISTRIBUTED_DEBUG", "FUNCOLL_GUARD"):
        monkeypatch.delenv(var, raising=False)
    for var, value in env.items():
        monkeypatch.setenv(var, value)
    try:
        dist.set_debug_level_from_env()
        assert funcoll.debug.guard_from_env() is on
    finally:
        monkeypatch.undo()
        dist.set_debug_level_from_env()
