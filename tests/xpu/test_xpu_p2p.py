"""Point-to-point on the xccl profile, run as oneCCL runs it (funcoll.transport.gloo.StrictC10dTransport): a group is
replayed in the order given, a receive blocks until its send has arrived, and the k-th message from a rank to a peer
meets the peer's k-th receive from it, whatever the tags (ProcessGroupXCCL ignores them; gloo pairs by tag).

* A batch that lists its ``irecv`` before its ``isend`` on every rank of a ring (2, 3 and 4 ranks) deadlocks when the
  batch reaches the backend in the user's order (funcoll's ordering switched off by a test-only module flag): every
  rank is still blocked in its first receive when the group's timeout fires. With funcoll's ordering (sends first) the
  same batch completes with the ring's data, each of a rank's two messages to its peer paired as listed: reversing
  the sends within ``deadlock_free`` would swap them on XCCL, and does on this profile.
* Tags do not pair messages there: a receive tagged 7 gets the first message sent, tagged 8 (gloo would give it the
  second); ``deadlock_free`` keeps the order of the sends and of the receives.
* torch's pipeline schedules (every one the running torch has, of GPipe, 1F1B, Interleaved1F1B, LoopedBFS,
  InterleavedZeroBubble, ZBVZeroBubble, DualPipeV, that plain gloo runs: not torch 2.9's V-shaped ones, which send
  from a rank to itself) give the losses and gradients of plain gloo groups of the same ranks bit for bit on that
  profile: 2 ranks, and 4 ranks as a 2x2 mesh (two pipelines side by side, their gradients summed across the data
  parallel dimension).
* torch 2.9's pipeline warm-up (``_get_init_p2p_neighbors_ops``) sends an int64 scalar into a float32 buffer of one
  element, which makes gloo abort the receiving process; the schedules here run with it patched, the same on both
  sides (the send made float32). Under ``TORCH_DISTRIBUTED_DEBUG=DETAIL`` a send whose size differs from its receive
  is a clear error on both ranks instead.
"""

from __future__ import annotations

import time

import pytest
import torch
import torch.distributed as dist

from funcoll.launch import run_world

RING_TIMEOUT = 3  # seconds: the group's timeout, which ends a deadlocked ring


def _ring_once(rank, n, ordered):
    """Each rank receives two messages from the previous rank and sends two to the next (tags 7 and 8), the receives
    listed first."""
    from funcoll.algorithms import p2p

    p2p._ORDERED = ordered
    x = torch.arange(5, dtype=torch.float32) + 10 * rank
    got, second = torch.full((5,), -1.0), torch.full((5,), -1.0)
    prv, nxt = (rank - 1) % n, (rank + 1) % n
    ops = [dist.P2POp(dist.irecv, got, prv, tag=7), dist.P2POp(dist.irecv, second, prv, tag=8),
           dist.P2POp(dist.isend, x, nxt, tag=7), dist.P2POp(dist.isend, x + 100, nxt, tag=8)]
    t0 = time.monotonic()
    try:
        for w in dist.batch_isend_irecv(ops):
            w.wait()
    except RuntimeError as e:
        return {"error": f"{type(e).__name__}: {e}", "s": time.monotonic() - t0}
    return {"got": got, "second": second, "s": time.monotonic() - t0}


def _through_xccl_transport(rank, n):
    """The same batch through the XPU transport class (funcoll.transport.xpu.XcclTransport) over a backend that
    coalesces as ProcessGroupXCCL does (``supports_coalescing``, ``_start_coalescing``/``_end_coalescing`` around the
    group) and records what it is handed, carried by a real gloo backend: ``(calls in order, data received)``."""
    from funcoll import algorithms
    from funcoll.transport import profile
    from funcoll.transport.xpu import XcclTransport

    gloo = dist.new_group(backend="gloo")._get_backend(torch.device("cpu"))
    calls: list = []
    works: list = []

    class Coalescing:
        supports_coalescing = True
        rank, size = gloo.rank, gloo.size

        def _start_coalescing(self, device):
            calls.append("start")

        def send(self, tensors, dst, tag):
            calls.append(("send", dst))
            works.append(gloo.send(tensors, dst, tag))

        def recv(self, tensors, src, tag):
            calls.append(("recv", src))
            works.append(gloo.recv(tensors, src, tag))

        def _end_coalescing(self, device):  # one Work for the group, as ProcessGroupXCCL's
            calls.append("end")
            return Group()

    class Group:
        def wait(self, timeout=None):
            while works:  # each of gloo's Works waited on once
                works.pop(0).wait()
            return True

    tp = XcclTransport(Coalescing(), profile("xccl"), "cpu", device_type="cpu")
    got = torch.full((5,), -1.0)
    x = torch.arange(5, dtype=torch.float32) + 10 * rank
    algorithms.batch_isend_irecv(tp, [algorithms.p2p_op(tp, False, got, (rank - 1) % n),
                                      algorithms.p2p_op(tp, True, x, (rank + 1) % n)]).wait()
    return calls, got


def ring(rank, n, orders, xccl_transport=False):
    """The ring once per entry of ``orders`` (funcoll's ordering on or off), in that order, with the group's timeout
    RING_TIMEOUT (the world starts with a longer one: ranks of a loaded machine start seconds apart); first, with
    ``xccl_transport``, through the XPU transport class (:func:`_through_xccl_transport`)."""
    from datetime import timedelta

    spied = _through_xccl_transport(rank, n) if xccl_transport else None
    dist.barrier()
    dist.group.WORLD.set_timeout(timedelta(seconds=RING_TIMEOUT))
    return spied, [_ring_once(rank, n, ordered) for ordered in orders]


def _ring_data(res, r, n):
    want = torch.arange(5, dtype=torch.float32) + 10 * ((r - 1) % n)
    return ("got" in res and torch.equal(res["got"], want)
            and ("second" not in res or torch.equal(res["second"], want + 100)))  # each message paired as listed


@pytest.mark.parametrize("n", [2, 3, 4])
def test_irecv_first_ring_deadlocks_in_the_given_order_and_completes_sends_first(n):
    # funcoll's order first (it completes), then the user's (it deadlocks, and leaves the group unusable)
    got = run_world("tests.xpu.test_xpu_p2p:ring", n, "xccl", args=([True, False], n == 3), timeout=60)
    res = [rings for _, rings in got]
    assert [_ring_data(ordered, r, n) for r, (ordered, _) in enumerate(res)] == [True] * n, res
    if n == 3:  # the XPU transport hands the backend one coalesced group, its send before its receive
        for r, (calls, data) in enumerate(spied for spied, _ in got):
            assert calls == ["start", ("send", (r + 1) % n), ("recv", (r - 1) % n), "end"], (r, calls)
            assert _ring_data({"got": data}, r, n), (r, data)
    timed_out = []
    for r, (_, given) in enumerate(res):
        # every rank blocked in its first receive of the batch (p2p #4: #0-#3 were the first batch's): until the
        # group's timeout, or until a peer that timed out first gave up and closed its connections
        assert "error" in given and "recv p2p #4" in given["error"], (r, given)
        if "CollectiveTimeoutError" in given["error"]:
            assert "timed out" in given["error"] and given["s"] >= RING_TIMEOUT * 0.9, (r, given)
            timed_out.append(r)
        else:
            assert "Connection closed by peer" in given["error"] or "Connection reset" in given["error"], (r, given)
    assert timed_out, res


def test_irecv_first_ring_completes_on_gloo_in_the_given_order():
    """Without the xccl profile the backend is gloo, whose receives never block a batch: any order completes."""
    res = run_world("tests.xpu.test_xpu_p2p:ring", 3, None, args=([False],), timeout=60)
    assert [_ring_data(got, r, 3) for r, (_, (got,)) in enumerate(res)] == [True] * 3, res


# ---------------------------------------------------------------------------------------------------------------
# torch's pipeline schedules
# ---------------------------------------------------------------------------------------------------------------
SCHEDULES = ["ScheduleGPipe", "Schedule1F1B", "ScheduleInterleaved1F1B", "ScheduleLoopedBFS",
             "ScheduleInterleavedZeroBubble", "ScheduleZBVZeroBubble", "ScheduleDualPipeV"]
V_SHAPED = {"ScheduleZBVZeroBubble", "ScheduleDualPipeV"}  # rank r holds stages r and 2*pp-1-r
SINGLE = {"ScheduleGPipe", "Schedule1F1B"}  # one stage per rank
MICROBATCHES, WIDTH = 4, 8


def _same_dtype_warm_up():
    """torch 2.9's warm-up sends ``torch.tensor(stage_index)`` (int64, 8 bytes) into ``torch.zeros(1)`` (float32, 4
    bytes): patched to send a float32 of one element, as the receive expects. A V-shaped schedule's two middle stages
    are on one rank, whose warm-up then sends to itself, which gloo refuses ("Pair is not connected"): those
    operations are left out."""
    from torch.distributed.pipelining import stage as stage_mod

    base = stage_mod._PipelineStageBase
    if not hasattr(base, "_get_init_p2p_neighbors_ops"):
        return
    orig = base._get_init_p2p_neighbors_ops

    def warm_up(self):
        me = dist.get_rank(self.group)
        return [dist.P2POp(op.op, op.tensor.float().reshape(1), group_peer=op.group_peer, group=op.group)
                if op.op is dist.isend else op for op in orig(self) if op.group_peer != me]

    base._get_init_p2p_neighbors_ops = warm_up


def schedules_to_compare():
    """The schedules of SCHEDULES the running torch has and gloo runs: torch 2.9's V-shaped schedules pass their two
    middle stages' data by a send from the rank to itself, which gloo refuses ("Pair is not connected")."""
    from torch.distributed import pipelining
    from torch.distributed.pipelining import stage as stage_mod

    self_sends = hasattr(stage_mod._PipelineStageBase, "_get_init_p2p_neighbors_ops")  # torch 2.9's pipelining
    return [s for s in SCHEDULES if hasattr(pipelining, s) and not (self_sends and s in V_SHAPED)]


def _pipeline_groups(n, backend):
    """(pipeline group, data-parallel group or None) of this rank, made with ``backend`` (None: the world's)."""
    if n == 4:  # a 2x2 mesh: pipelines {0,1} and {2,3}, data parallel {0,2} and {1,3}
        pp_group, _ = dist.new_subgroups_by_enumeration([[0, 1], [2, 3]], backend=backend)
        dp_group, _ = dist.new_subgroups_by_enumeration([[0, 2], [1, 3]], backend=backend)
        return pp_group, dp_group
    return (dist.new_group(list(range(n)), backend=backend) if backend else dist.group.WORLD), None


def _one_step(name, rank, pp_group, dp_group):
    """One step of schedule ``name`` on a pipeline of 2 ranks: the last stage's losses, this rank's gradients (summed
    across data parallel)."""
    from torch.distributed import pipelining

    pp = 2
    cls = getattr(pipelining, name)
    pp_rank, dp_rank = rank % pp, rank // pp
    per_rank = 1 if name in SINGLE else 2
    stages = pp * per_rank
    mine = [pp_rank, 2 * pp - 1 - pp_rank] if name in V_SHAPED else [pp_rank + k * pp for k in range(per_rank)]
    torch.manual_seed(0)
    layers = [torch.nn.Sequential(torch.nn.Linear(WIDTH, WIDTH), torch.nn.Tanh()) for _ in range(stages)]
    x = torch.randn(2 * MICROBATCHES, WIDTH) + dp_rank
    y = torch.randn(2 * MICROBATCHES, WIDTH)
    built = [pipelining.PipelineStage(layers[i], i, stages, torch.device("cpu"), group=pp_group) for i in mine]
    sched = cls(built[0] if per_rank == 1 else built, n_microbatches=MICROBATCHES, loss_fn=torch.nn.MSELoss())
    losses: list = []
    last = stages - 1 in mine
    kw = {"target": y, "losses": losses} if last else {}
    if 0 in mine:
        sched.step(x, **kw)
    else:
        sched.step(**kw)
    grads = torch.cat([p.grad.reshape(-1) for i in mine for p in layers[i].parameters()])
    if dp_group is not None:
        dist.all_reduce(grads, group=dp_group)
    return {"losses": [t.detach() for t in losses], "grads": grads}


def pipelines(rank, n, names):
    """Each schedule of ``names``, one step, on groups of the funcoll world (the xccl profile) and on plain gloo groups
    of the same ranks: ``{name: (funcoll's result, gloo's)}``. 2 ranks: one pipeline; 4: two, side by side."""
    _same_dtype_warm_up()
    ours, theirs = _pipeline_groups(n, None), _pipeline_groups(n, "gloo")
    return {name: (_one_step(name, rank, *ours), _one_step(name, rank, *theirs)) for name in names}


@pytest.mark.parametrize("n", [2, 4], ids=["2ranks", "2x2mesh"])
def test_pipeline_schedules_give_gloos_numbers_on_the_xccl_profile(n):
    ran = schedules_to_compare()
    assert len(ran) >= 5, ran  # torch 2.9: five of them; 2.15: all seven
    res = run_world("tests.xpu.test_xpu_p2p:pipelines", n, "xccl", args=(ran,), timeout=170, coll_timeout=30)
    for r in range(n):
        assert list(res[r]) == ran, (r, list(res[r]))
        for name in ran:
            g, w = res[r][name]
            assert len(g["losses"]) == len(w["losses"]), (r, name)
            assert all(torch.equal(a, b) for a, b in zip(g["losses"], w["losses"])), (r, name, g, w)
            assert torch.equal(g["grads"], w["grads"]) and g["grads"].abs().sum() > 0, (r, name)
    for name in ran:  # the stage that computes the loss is on one rank of each pipeline
        assert sum(len(res[r][name][0]["losses"]) == MICROBATCHES for r in range(n)) == n // 2, name


# ---------------------------------------------------------------------------------------------------------------
# a send and a receive of different sizes, in debug mode
# ---------------------------------------------------------------------------------------------------------------
def mismatched(rank, n):
    """What torch 2.9's pipeline warm-up does between two stages: rank 0 sends ``torch.tensor(0)`` (int64, 8 bytes),
    rank 1 receives into ``torch.zeros(1)`` (float32, 4 bytes); once as single operations, once in a batch (another
    tag: the first message is never received)."""
    out = {}
    for how, tag in (("single", 0), ("batch", 1)):
        t = torch.tensor(0) if rank == 0 else torch.zeros(1)
        op = dist.isend if rank == 0 else dist.irecv
        try:
            if how == "single":
                op(t, 1 - rank, tag=tag).wait()
            else:
                for w in dist.batch_isend_irecv([dist.P2POp(op, t, 1 - rank, tag=tag)]):
                    w.wait()
            out[how] = "no error"
        except RuntimeError as e:
            out[how] = f"{type(e).__name__}: {e}"
    if rank == 1:  # rank 0's two messages were never received: taken now, as sent, so that rank 0 exits at once
        backend = dist.group.WORLD.transport("cpu").backend
        for tag in (0, 1):
            backend.recv([torch.empty((), dtype=torch.int64)], 0, tag).wait()
    return out


def test_detail_debug_makes_a_size_mismatch_a_clear_error_on_both_ranks():
    """(without the check, gloo aborts rank 1 when the 8 bytes arrive)"""
    res = run_world("tests.xpu.test_xpu_p2p:mismatched", 2, None, coll_timeout=20, timeout=90,
                    env={"TORCH_DISTRIBUTED_DEBUG": "DETAIL"})
    for how in ("single", "batch"):
        msgs = [res[r][how] for r in range(2)]
        for m in msgs:
            assert m.startswith("CollectiveMismatchError: funcoll: point-to-point message"), (how, msgs)
            assert "rank 0 sends int64[] (8 bytes), rank 1 receives into float32[1] (4 bytes)" in m, (how, msgs)
        assert msgs[0] == msgs[1], (how, msgs)  # the same words on both ranks


# ---------------------------------------------------------------------------------------------------------------
# messages paired as oneCCL pairs them: per peer, in issue order, blind to tags
# ---------------------------------------------------------------------------------------------------------------
def test_deadlock_free_keeps_the_order_of_the_sends_and_of_the_receives():
    """Sends first, each kind in the order given: the k-th message to a peer stays the k-th (XCCL pairs by order)."""
    from funcoll.algorithms.p2p import deadlock_free
    from funcoll.transport import P2P

    t = torch.zeros(1)
    ops = [P2P(False, t, 1, 7), P2P(True, t, 1, 7), P2P(False, t, 2, 8), P2P(True, t, 1, 8), P2P(True, t, 2, 9),
           P2P(False, t, 1, 9)]
    assert deadlock_free(ops) == [ops[1], ops[3], ops[4], ops[0], ops[2], ops[5]]


def tag_blind(rank, n):
    """Rank 0 sends rank 1 two messages, tags 8 then 7, in one batch; rank 1 receives two from rank 0, tags 7 then 8,
    in one batch; then the same as single isend/irecv calls. What rank 1's receives hold."""
    a, b = torch.full((3,), 1.0), torch.full((3,), 2.0)  # the first and the second message sent
    out = {}
    for how in ("batch", "single"):
        if rank == 0:
            if how == "batch":
                for w in dist.batch_isend_irecv([dist.P2POp(dist.isend, a, 1, tag=8),
                                                 dist.P2POp(dist.isend, b, 1, tag=7)]):
                    w.wait()
            else:
                works = [dist.isend(a, 1, tag=8), dist.isend(b, 1, tag=7)]
                for w in works:
                    w.wait()
        else:
            tag7, tag8 = torch.zeros(3), torch.zeros(3)
            if how == "batch":
                for w in dist.batch_isend_irecv([dist.P2POp(dist.irecv, tag7, 0, tag=7),
                                                 dist.P2POp(dist.irecv, tag8, 0, tag=8)]):
                    w.wait()
            else:
                works = [dist.irecv(tag7, 0, tag=7), dist.irecv(tag8, 0, tag=8)]
                for w in works:
                    w.wait()
            out[how] = (tag7.tolist(), tag8.tolist())
    return out


@pytest.mark.parametrize("profile", [None, "xccl"], ids=["gloo", "xccl"])
def test_the_xccl_profile_pairs_messages_per_peer_in_order_whatever_their_tags(profile):
    """ProcessGroupXCCL takes the tag as an unused argument: the k-th send to a peer meets the peer's k-th receive
    from it. gloo pairs by tag. So rank 1's receive tagged 7 gets the first message (sent tagged 8) on XCCL, and the
    second (tagged 7) on gloo; the xccl profile's CPU transport gives XCCL's pairing, in a batch and in single calls."""
    res = run_world("tests.xpu.test_xpu_p2p:tag_blind", 2, profile, timeout=60)
    first, second = [1.0] * 3, [2.0] * 3
    want = (first, second) if profile == "xccl" else (second, first)  # (receive tagged 7, receive tagged 8)
    assert res[1] == {"batch": want, "single": want}, res[1]
