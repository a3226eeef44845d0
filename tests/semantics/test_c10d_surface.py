"""ProcessGroupFuncoll serves the whole ProcessGroup surface that c10d of the running torch calls (2.9 to the newest).

The surface is read from the running torch, not listed by hand: every method of the C++ ``ProcessGroup`` is either
overridden by funcoll or named below as one that is not a collective (identity, hooks, boxing). A torch that adds a
collective method fails the first test until funcoll serves it. Then every public ``torch.distributed`` call is run
on 2 real ranks, compared with references computed locally from both ranks' inputs.
"""

from datetime import timedelta

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import ProcessGroup

import funcoll
from funcoll.launch import run_world

# Methods of the C++ ProcessGroup that are not collectives and whose C++ implementation serves a Python group.
NOT_COLLECTIVES = {
    "BackendType", "CUSTOM", "GLOO", "MPI", "NCCL", "UCC", "UNDEFINED", "XCCL",  # enum values
    "rank", "size", "name", "group_name", "group_desc", "_set_group_name", "_set_group_desc",  # identity
    "_id", "_backend_id", "bound_device_id", "boxed", "unbox", "_pybind11_conduit_v1_",
    "_register_backend", "_set_default_backend", "_get_backend_name",  # c10d registering backends of a C++ group
    "_has_hooks", "_register_on_completion_hook", "_enable_collectives_timing",  # hooks and timing
    "register_pre_hook", "register_post_hook", "register_abort_hook", "unregister_pre_hook",
    "unregister_post_hook", "unregister_abort_hook",
    "_get_sequence_number_for_group", "_set_sequence_number_for_group",
    "merge_remote_group",  # merging a remote group: not supported (c10d raises for Python groups)
    "new_window", "supports_window", "reconfigure", "get_reconfigure_handle", "supports_reconfigure",
    "use_pg_for_symm_mem_rendezvous",  # one-sided windows, fault-tolerant reconfiguration: unsupported
}


def test_every_collective_method_of_the_running_torch_is_served():
    base = {m for m in dir(ProcessGroup) if not m.startswith("__")}
    ours = {m for m in base if getattr(funcoll.ProcessGroupFuncoll, m) is not getattr(ProcessGroup, m)}
    missing = sorted(base - ours - NOT_COLLECTIVES)
    assert missing == [], f"torch {torch.__version__} ProcessGroup methods funcoll does not serve: {missing}"


# ------------------------------------------------------------------------------------------------------------
# every public torch.distributed call on 2 ranks
# ------------------------------------------------------------------------------------------------------------
def _inp(rank, n=4, dtype=torch.float32):
    return (torch.arange(n, dtype=torch.float64) + 10 * (rank + 1)).to(dtype)


def every_call(rank, world):
    n = world
    ins = [_inp(r) for r in range(n)]
    me = ins[rank].clone()
    got, want = {}, {}

    t = me.clone()
    dist.all_reduce(t)
    got["all_reduce"], want["all_reduce"] = t, sum(ins)

    out = torch.empty(4 * n)
    dist.all_gather_into_tensor(out, me)
    got["all_gather_into_tensor"], want["all_gather_into_tensor"] = out, torch.cat(ins)
    if hasattr(dist, "all_gather_single"):
        out = torch.empty(n, 4)  # the stacked form
        dist.all_gather_single(out, me)
        got["all_gather_single"], want["all_gather_single"] = out, torch.stack(ins)

    big = [torch.arange(2 * n, dtype=torch.float32) * (r + 1) for r in range(n)]
    out = torch.empty(2)
    dist.reduce_scatter_tensor(out, big[rank])
    got["reduce_scatter_tensor"], want["reduce_scatter_tensor"] = out, sum(big)[2 * rank:2 * rank + 2]
    if hasattr(dist, "reduce_scatter_single"):
        out = torch.empty(2)
        dist.reduce_scatter_single(out, big[rank], op=dist.ReduceOp.MAX)
        got["reduce_scatter_single"] = out
        want["reduce_scatter_single"] = torch.stack(big).amax(0)[2 * rank:2 * rank + 2]

    # uneven all_to_all_single: rank r sends r+1+j rows to rank j
    send = [torch.full((r + 1 + j,), float(10 * r + j)) for r in range(n) for j in range(n)]
    mine = torch.cat([send[rank * n + j] for j in range(n)])
    out = torch.empty(sum(r + 1 + rank for r in range(n)))
    dist.all_to_all_single(out, mine, [r + 1 + rank for r in range(n)], [rank + 1 + j for j in range(n)])
    got["all_to_all_single"], want["all_to_all_single"] = out, torch.cat([send[r * n + rank] for r in range(n)])

    lst = [torch.empty(4) for _ in range(n)]
    dist.all_gather(lst, me)
    got["all_gather"], want["all_gather"] = torch.stack(lst), torch.stack(ins)

    out = torch.empty(4)
    dist.reduce_scatter(out, [me * (j + 1) for j in range(n)], op=dist.ReduceOp.SUM)
    got["reduce_scatter"], want["reduce_scatter"] = out, sum(ins) * (rank + 1)

    outs = [torch.empty(1) for _ in range(n)]
    dist.all_to_all(outs, [torch.tensor([float(10 * rank + j)]) for j in range(n)])
    got["all_to_all"], want["all_to_all"] = torch.cat(outs), torch.tensor([float(10 * r + rank) for r in range(n)])

    t = me.clone()
    dist.broadcast(t, src=1)
    got["broadcast"], want["broadcast"] = t, ins[1]

    t = me.clone()
    dist.reduce(t, dst=0, op=dist.ReduceOp.PRODUCT)
    got["reduce"], want["reduce"] = t, (torch.stack(ins).prod(0) if rank == 0 else ins[rank])

    lst = [torch.empty(4) for _ in range(n)] if rank == 1 else None
    dist.gather(me, lst, dst=1)
    if rank == 1:
        got["gather"], want["gather"] = torch.stack(lst), torch.stack(ins)
    if hasattr(dist, "gather_single"):
        g = torch.empty(4 * n) if rank == 0 else None
        dist.gather_single(me, g, dst=0)
        if rank == 0:
            got["gather_single"], want["gather_single"] = g, torch.cat(ins)

    out = torch.empty(4)
    dist.scatter(out, [ins[j] * 2 for j in range(n)] if rank == 0 else None, src=0)
    got["scatter"], want["scatter"] = out, ins[rank] * 2

    objs = [None] * n
    dist.all_gather_object(objs, {"rank": rank})
    assert objs == [{"rank": r} for r in range(n)]
    objs = [f"from {rank}"]
    dist.broadcast_object_list(objs, src=1)
    assert objs == ["from 1"]

    # point to point: send/recv, isend/irecv, batch_isend_irecv (ring)
    nxt, prv = (rank + 1) % n, (rank - 1) % n
    r = torch.empty(4)
    reqs = dist.batch_isend_irecv([dist.P2POp(dist.isend, me, nxt), dist.P2POp(dist.irecv, r, prv)])
    for q in reqs:
        q.wait()
    got["batch_isend_irecv"], want["batch_isend_irecv"] = r, ins[prv]
    if rank == 0:
        dist.send(me, 1)
    elif rank == 1:
        r = torch.empty(4)
        dist.recv(r, 0)
        got["send/recv"], want["send/recv"] = r, ins[0]

    # coalescing: c10d's fast path (one allreduce_coalesced / *_single_coalesced call) and the device form
    from torch.distributed.distributed_c10d import _coalescing_manager

    a, b = me.clone(), me.clone() * 2
    with _coalescing_manager(async_ops=True) as cm:
        dist.all_reduce(a)
        dist.all_reduce(b)
    cm.wait()
    got["coalesced all_reduce"], want["coalesced all_reduce"] = torch.cat([a, b]), torch.cat([sum(ins), sum(ins) * 2])
    o1, o2 = torch.empty(4 * n), torch.empty(4 * n)
    with _coalescing_manager():
        dist.all_gather_into_tensor(o1, me)
        dist.all_gather_into_tensor(o2, me + 1)
    got["coalesced all_gather"] = torch.cat([o1, o2])
    want["coalesced all_gather"] = torch.cat([torch.cat(ins), torch.cat(ins) + 1])
    o1, o2 = torch.empty(2), torch.empty(2)
    with _coalescing_manager():
        dist.reduce_scatter_tensor(o1, big[rank])
        dist.reduce_scatter_tensor(o2, big[rank] * 3)
    got["coalesced reduce_scatter"] = torch.cat([o1, o2])
    want["coalesced reduce_scatter"] = torch.cat([sum(big)[2 * rank:2 * rank + 2], 3 * sum(big)[2 * rank:2 * rank + 2]])
    c, d = me.clone(), me.clone()
    with _coalescing_manager(device=torch.device("cpu"), async_ops=True) as cm:
        dist.all_reduce(c, op=dist.ReduceOp.MAX)
        dist.broadcast(d, src=0)
    cm.wait()
    got["coalescing on a device"] = torch.cat([c, d])
    want["coalescing on a device"] = torch.cat([torch.stack(ins).amax(0), ins[0]])

    # timeouts
    if hasattr(dist, "set_timeout"):  # torch >= 2.10
        dist.set_timeout(timedelta(seconds=42))
    else:
        dist.group.WORLD.set_timeout(timedelta(seconds=42))
    assert dist.group.WORLD.timeout == timedelta(seconds=42)
    dist.barrier()

    # sub-groups: new_group, new_subgroups, split_group (where c10d has it without CUDA)
    g = dist.new_group([0, 1])
    t = me.clone()
    dist.all_reduce(t, group=g)
    got["new_group"], want["new_group"] = t, sum(ins)
    assert isinstance(g, funcoll.ProcessGroupFuncoll) and dist.get_process_group_ranks(g) == [0, 1]
    # split_group: c10d (torch >= 2.10) calls the parent's split_group() only when an accelerator is bound (on
    # CPU-only machines it refuses before), so the group's method is called as c10d would call it
    world_pg = dist.group.WORLD
    s = world_pg.split_group([rank], timeout=timedelta(seconds=60), group_name=f"solo{rank}")
    assert isinstance(s, funcoll.ProcessGroupFuncoll) and (s.rank(), s.size(), s.group_name) == (0, 1, f"solo{rank}")
    assert funcoll.groups.lookup(f"solo{rank}").ranks == (rank,)
    t = me.clone()
    s.allreduce([t]).wait()
    got["split_group"], want["split_group"] = t, ins[rank]
    s2 = world_pg.split_group([1, 0], group_name="both")
    out = torch.empty(4 * n)
    s2._allgather_base(out, me).wait()
    got["split_group of 2"], want["split_group of 2"] = out, torch.cat([ins[1], ins[0]])
    assert world_pg.split_group([1 - rank], group_name="other") is None or n > 2

    bad = {k: (got[k].tolist(), want[k].tolist()) for k in want if not torch.equal(got[k], want[k].to(got[k].dtype))}
    return {"checked": sorted(want), "bad": bad}


def test_every_public_call_on_two_ranks():
    res = run_world("tests.semantics.test_c10d_surface:every_call", 2, timeout=240, coll_timeout=60)
    for r in res:
        assert r["bad"] == {}, r["bad"]
    expected = {"all_reduce", "all_gather_into_tensor", "reduce_scatter_tensor", "all_to_all_single", "all_gather",
                "reduce_scatter", "all_to_all", "broadcast", "reduce", "scatter", "batch_isend_irecv",
                "coalesced all_reduce", "coalesced all_gather", "coalesced reduce_scatter", "coalescing on a device",
                "new_group"}
    if hasattr(dist, "all_gather_single"):
        expected |= {"all_gather_single", "reduce_scatter_single"}
    expected |= {"split_group", "split_group of 2"}
    assert expected <= set(res[0]["checked"]), expected - set(res[0]["checked"])
    assert {"gather", "send/recv"} <= set(res[1]["checked"])


def test_broadcast_rewrite_only_where_dynamo_lacks_one(monkeypatch):
    """The Dynamo rewrite of dist.broadcast is added only when the running torch's remap table has no entry for it:
    a torch whose Dynamo traces broadcast itself keeps its own."""
    import torch.distributed._functional_collectives as fc

    from funcoll.entry import c10d_patches

    remaps = fc.traceable_collective_remaps
    # 2.9 .. 2.14: Dynamo has none of its own
    assert remaps.get(dist.broadcast) is c10d_patches._funcoll_traceable_broadcast
    upstream = object()
    monkeypatch.setitem(remaps, dist.broadcast, upstream)
    c10d_patches._register_traceable_broadcast()
    assert remaps[dist.broadcast] is upstream
    # every other eager collective the running Dynamo rewrites is left to it
    others = {f.__name__ for f in remaps if f is not dist.broadcast}
    assert {"all_reduce", "all_gather_into_tensor", "reduce_scatter_tensor", "all_to_all_single"} <= others
