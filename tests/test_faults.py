"""Faults end in clear errors, never in hangs or aborts: real 2-process worlds, each with a hard deadline.

Rank bodies (``_rank_*``) sit next to their asserts; the parent spawns the world with the one harness
(:func:`funcoll.launch.spawn_world`), which tolerates ranks that die on purpose, kills what overruns the deadline, and
reports exit codes (a SIGABRT is -6).
Scenarios: a peer dies before / during a collective; ranks issue mismatched ops, shapes, dtypes, reduce ops, roots
or split sizes (with the debug mode: the same clear error on every rank, and the ranks stay in step; without it:
an error naming the collective within the timeout where gloo does not abort); a rank skips a call; destroy and
re-init; 1000 outstanding async ops; two threads on two groups; malformed requests on one rank only.
"""

from __future__ import annotations

import os
import time

import pytest

from funcoll.launch import spawn_world

COLL_TIMEOUT = 5.0  # the group timeout of every world here
SLACK = 10.0  # "no hang past timeout + 10 s"


def _world(fn: str, world: int = 2, env=None, deadline: float = 45.0, args=(), profile=None,
           coll_timeout: float = COLL_TIMEOUT):
    """``tests.test_faults:<fn>`` on ``world`` ranks through the one harness (:func:`funcoll.launch.spawn_world`),
    the debug switches off unless ``env`` sets them: ``(results, exit codes, hung)``."""
    env = {"FUNCOLL_DEBUG": None, "TORCH_DISTRIBUTED_DEBUG": None, **(env or {})}
    return spawn_world(f"tests.test_faults:{fn}", world, profile, args, deadline=deadline,
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

    t = torch.ones(1 << 22)  # 16 MB: the peer dies while it is being exchanged
    w = dist.all_reduce(t, async_op=True)
    if rank == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    label = _group_label(n)
    fut = w.get_future()
    r = _attempt(w.wait)
    r.update(label=label, completed=w.is_completed(), success=w.is_success(),
             exception=type(w.exception()).__name__, same_exception=str(w.exception()) == r.get("msg"))
    f = _attempt(fut.wait)
    r["future"] = {"ok": f["ok"], "type": f.get("type"), "same": f.get("msg") == r.get("msg")}
    r["destroy"] = _attempt(dist.destroy_process_group)
    return r


def test_peer_killed_during_a_collective():
    res = _world("_rank_peer_killed_during")
    r = _ok(res, 0)
    assert res[1][1] == -9, res[1]
    assert not r["ok"] and r["type"] == "CollectiveError", r
    assert r["msg"].startswith(f"funcoll: all_reduce #0 on {r['label']}; this is rank 0 of 2) failed: "), r["msg"]
    assert r["secs"] < COLL_TIMEOUT + SLACK
    # the Work tells the truth, and so does its future (DDP comm hooks chain on it)
    assert r["completed"] and not r["success"] and r["exception"] == "CollectiveError" and r["same_exception"], r
    assert r["future"] == {"ok": False, "type": "CollectiveError", "same": True}, r["future"]
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
    if kind == "reduce_op":
        return dist.all_reduce(torch.ones(4), op=R.SUM if rank == 0 else R.MAX)
    if kind == "root":
        return dist.broadcast(torch.ones(4), src=rank)
    if kind == "splits":
        out, inp = torch.empty(4), torch.ones(4)
        splits = [1, 3] if rank == 0 else [2, 2]
        return dist.all_to_all_single(out, inp, splits, splits)
    if kind == "gather_list":  # all_gather of a list: rank 1's tensors are larger
        outs = [torch.empty(2 + rank) for _ in range(2)]
        return dist.all_gather(outs, torch.ones(2 + rank))
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


MISMATCHES = {
    "op": ("they differ in the collective", ["rank 0: all_reduce(reduce_op=sum, float32[4])",
                                             "rank 1: broadcast(root=0, float32[4])"]),
    "shape": ("they differ in the shapes", ["rank 0: all_reduce(reduce_op=sum, float32[4])",
                                            "rank 1: all_reduce(reduce_op=sum, float32[5])"]),
    "dtype": ("they differ in the dtypes", ["rank 0: all_reduce(reduce_op=sum, float32[4])",
                                            "rank 1: all_reduce(reduce_op=sum, int32[4])"]),
    "reduce_op": ("they differ in the reduce op", ["rank 1: all_reduce(reduce_op=max, float32[4])"]),
    "root": ("they differ in the root", ["rank 0: broadcast(root=0, float32[4])",
                                         "rank 1: broadcast(root=1, float32[4])"]),
    "splits": ("the split sizes do not match: rank 1 sends 2 rows to rank 0 (input_split_sizes=[2, 2]) but rank 0 "
               "expects 3 from rank 1 (output_split_sizes=[1, 3])", []),
    "gather_list": ("they differ in the shapes, the output shapes",
                    ["rank 0: all_gather(float32[2], outputs=[[[2], [2]]])",
                     "rank 1: all_gather(float32[3], outputs=[[[3], [3]]])"]),
}


@pytest.fixture(scope="module")
def debug_worlds():
    cache = {}

    def get(switch):
        if switch not in cache:
            env = {"FUNCOLL_DEBUG": "1"} if switch == "FUNCOLL_DEBUG" else {"TORCH_DISTRIBUTED_DEBUG": "DETAIL"}
            res = _world("_rank_mismatches", env=env, deadline=90)
            cache[switch] = (_ok(res, 0), _ok(res, 1))
        return cache[switch]

    return get


@pytest.mark.parametrize("switch", ["FUNCOLL_DEBUG", "TORCH_DISTRIBUTED_DEBUG"])
@pytest.mark.parametrize("kind", list(MISMATCHES))
def test_mismatch_in_debug_mode_is_the_same_clear_error_on_every_rank(debug_worlds, kind, switch):
    r0, r1 = (w[kind] for w in debug_worlds(switch))
    why, lines = MISMATCHES[kind]
    seq = list(MISMATCHES).index(kind) * 2  # each kind: the mismatched call, then one valid all_reduce
    for r in (r0, r1):
        assert not r["ok"] and r["type"] == "CollectiveMismatchError", r
        assert r["msg"].startswith(f"funcoll: detected mismatch between collectives on {r['label']}) at "
                                   f"sequence number {seq}: {why}"), r["msg"]
        for line in lines:
            assert f"\n  {line}" in r["msg"], (line, r["msg"])
        assert r["secs"] < COLL_TIMEOUT, r  # found by the check, not by a timeout
        assert r["in_step"], "the ranks are out of step after the mismatch: something was sent"
    assert r0["msg"] == r1["msg"]  # the same error on every rank


# Without the debug mode nothing is checked across ranks (as with gloo and NCCL without DETAIL): a mismatch that
# gloo survives ends in an error naming the collective within the timeout. (Mismatched sizes make gloo abort the
# process, as raw gloo does: docs/conformance.md; the debug mode prevents it.)
@pytest.mark.parametrize("kind", ["op", "root"])
def test_mismatch_without_debug_mode_names_the_collective_within_the_timeout(kind):
    res = _world("_rank_mismatch_nodebug", args=(kind,))
    results, codes, hung = res
    assert not hung and codes == [0, 0], res
    for rank in (0, 1):
        r = _ok(res, rank)
        assert not r["ok"] and r["type"] in ("CollectiveError", "CollectiveTimeoutError"), r
        op = "all_reduce" if kind == "op" and rank == 0 else "broadcast"
        assert r["msg"].startswith(f"funcoll: {op} #0 on {r['label']}; this is rank {rank} of 2) "), r["msg"]
        assert r["secs"] < COLL_TIMEOUT + SLACK, r


def _rank_mismatch_nodebug(rank, n, kind):
    r = _attempt(lambda: _issue(kind, rank))
    r["label"] = _group_label(n)
    return r


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
    else:  # the backend's timeout, with the collective named
        assert r["msg"].startswith(f"{head} timed out (group timeout 5 s): "), r["msg"]
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
        t = torch.full((4,), float(rank + 1 + i))
        dist.all_reduce(t)
        pg = dist.group.WORLD
        out.append((t.tolist(), funcoll.debug.sequence_number(pg), type(pg).__name__))
        dist.destroy_process_group()
        dist.init_process_group("funcoll", init_method=f"file://{path}.{i}", rank=rank, world_size=n)
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


def test_1000_outstanding_async_ops():
    res = _world("_rank_outstanding", args=(1000,), deadline=120)
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


def test_two_threads_on_two_groups():
    res = _world("_rank_threads", deadline=90)
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
