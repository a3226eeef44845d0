"""torch >= 2.15's own fault-tolerance API on funcoll groups, at worlds 3 and 4.

- c10d's ``_reconfigure`` (pytorch/pytorch#186298; gloo's: #187381): the same script runs on gloo and on funcoll, and
  what every rank sees -- its handle's fields, the ranks and sizes after each reconfigure, the results of collectives
  over the new peers, the errors of a reused uuid, of a handle not in the list, of a collective before the first
  reconfigure -- is gloo's (the oracle), the backend's name aside.
- ``dist.shrink_group``: gloo refuses it (TypeError: "does not support shrinking operations"), NCCL serves it; on
  funcoll it keeps torch's contract (distributed_c10d.py, shrink_group's docstring): the excluded ranks do not call;
  shrinking the default group makes the new group the default and numbers the world anew, and the other groups of the
  old default group are destroyed; shrinking another group leaves the default one alone; ``SHRINK_ABORT`` ends what
  the old group had in flight; torch's own checks of the arguments run first.
"""

from __future__ import annotations

import time
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist

from funcoll.launch import run_world

needs_2_15 = pytest.mark.skipif(not hasattr(dist, "shrink_group"),
                                reason="c10d's _reconfigure and dist.shrink_group are torch >= 2.15")
WORLDS = (3, 4)


def _attempt(fn):
    try:
        return ("ok", fn())
    except Exception as e:  # noqa: BLE001 - compared across backends
        return (type(e).__name__, str(e))


def _seen(pg, stable):
    """What a rank sees of its group: (group rank, size, dist.get_rank, dist.get_world_size, a SUM of every rank's
    stable id + 1, the stable id broadcast from the new rank 0, the same SUM as a functional collective: on funcoll
    through funcoll's kernels, as compiled code on XPU and XLA runs it)."""
    import torch.distributed._functional_collectives as fc

    t = torch.tensor([float(stable + 1)])
    dist.all_reduce(t, group=pg)
    b = torch.tensor([float(stable)])
    dist.broadcast(b, group_src=0, group=pg)
    f = fc.wait_tensor(fc.all_reduce(torch.tensor([float(stable + 1)]), "sum", pg))
    return pg.rank(), pg.size(), dist.get_rank(), dist.get_world_size(), t.item(), b.item(), f.item()


def _fields(handle: str, backend: str):
    """A handle's fields with the backend's name taken out: (rank, uuid, global rank, store address)."""
    name, rank, uuid, stable, store = handle.split(":", 4)
    assert name == backend, handle
    return int(rank), int(uuid), int(stable), store




def _rank_reconfigure(rank, world, backend):
    import torch.distributed.distributed_c10d as c10d

    import funcoll

    if backend == "funcoll":
        funcoll.install("cpu")  # its kernels serve the functional collectives, as they do on XPU and XLA by default
    launcher_store = c10d._get_default_store()
    dist.destroy_process_group()
    store = dist.PrefixStore(f"rc-{backend}/", launcher_store)
    dist.init_process_group(backend, store=dist.PrefixStore("pg/", store), rank=rank, world_size=world,
                            timeout=timedelta(seconds=20), enable_reconfigure=True)
    pg = dist.group.WORLD
    out = {"supports": c10d._supports_reconfigure(pg)}
    out["before"] = _attempt(lambda: dist.all_reduce(torch.ones(1)))

    def exchange(epoch, members):
        store.set(f"h/{epoch}/{rank}", c10d._get_reconfigure_handle(pg))
        return [store.get(f"h/{epoch}/{r}").decode() for r in members]

    out["handle0"] = _fields(c10d._get_reconfigure_handle(pg), backend)
    tcp = launcher_store
    while isinstance(tcp, dist.PrefixStore):
        tcp = tcp.underlying_store
    out["store"] = f"{tcp.host}:{tcp.port}"
    handles = exchange(0, range(world))
    order = list(reversed(range(world)))  # a list assigns ranks by position: the new rank 0 is the last one
    c10d._reconfigure(1, [handles[r] for r in order], pg, timeout=timedelta(seconds=20)).wait()
    out["after1"] = _seen(pg, rank)
    out["handle1"] = _fields(c10d._get_reconfigure_handle(pg), backend)
    # a second reconfigure without the last stable id, its handles as a set: ranks in the handles' sorted order
    members = [r for r in range(world) if r != world - 1]
    if rank == world - 1:  # left out of the next group; alive until the others are done
        store.wait([f"done/{r}" for r in members], timedelta(seconds=120))
        return _leave(store, rank, world, out)
    handles = exchange(1, members)
    mine = c10d._get_reconfigure_handle(pg)
    c10d._reconfigure(2, set(handles), pg, timeout=timedelta(seconds=20)).wait()
    out["after2"] = _seen(pg, rank)
    out["set_rank"] = (pg.rank(), sorted(handles).index(mine))
    # refused before anything is sent: a reused uuid (by the rank that would claim it: the list's first), a list
    # without this rank
    handles = exchange(2, members)
    mine = c10d._get_reconfigure_handle(pg)
    if handles.index(mine) == 0:
        out["reused"] = _attempt(lambda: c10d._reconfigure(2, handles, pg, timeout=timedelta(seconds=3)).wait())
    out["stranger"] = _attempt(lambda: c10d._reconfigure(9, [h for h in handles if h != mine], pg,
                                                         timeout=timedelta(seconds=3)).wait())
    out["stranger_handle"] = mine
    out["after3"] = _seen(pg, rank)  # the refusals changed nothing
    store.set(f"done/{rank}", "1")
    return _leave(store, rank, world, out)


def _leave(store, rank, world, out):
    """The store lives in rank 0's process: rank 0 returns once every rank has used it for the last time."""
    store.add("left", 1)
    while rank == 0 and store.add("left", 0) < world:
        time.sleep(0.05)
    return out


@needs_2_15
@pytest.mark.parametrize("world", WORLDS)
def test_reconfigure_does_on_funcoll_what_it_does_on_gloo(world):
    gloo = run_world("tests.fault_tolerance.test_reconfigure_shrink:_rank_reconfigure", world, args=("gloo",),
                     timeout=180, coll_timeout=30)
    fc = run_world("tests.fault_tolerance.test_reconfigure_shrink:_rank_reconfigure", world, args=("funcoll",),
                   timeout=180, coll_timeout=30)
    for r in range(world):
        g, f = gloo[r], fc[r]
        assert f["supports"] is True and g["supports"] is True
        for key in ("after1", "after2", "after3", "set_rank"):
            assert f.get(key) == g.get(key), (r, key, g.get(key), f.get(key))
        for key in ("handle0", "handle1"):  # the last field: the address of the run's TCPStore, as gloo gives it
            assert f[key][:3] == g[key][:3] and (f[key][3], g[key][3]) == (f["store"], g["store"]), (r, key, g, f)
        # every collective before the first reconfigure is refused, as gloo refuses it
        assert (f["before"][0], g["before"][0]) == ("CollectiveError", "RuntimeError"), (f["before"], g["before"])
        assert f["before"][1].endswith(
            "has not been initialized. Call reconfigure() (torch.distributed.distributed_c10d._reconfigure) before "
            "issuing collectives when enable_reconfigure=True."), f["before"]
        assert g["before"][1].startswith("ProcessGroupGloo has not been initialized. Call reconfigure() before "
                                         "issuing collectives when enable_reconfigure=True."), g["before"]
        if r < world - 1:
            assert f["set_rank"][0] == f["set_rank"][1], f["set_rank"]  # a set: the sorted order
            # a list without this rank's own handle: refused, in gloo's words
            assert g["stranger"] == ("RuntimeError", g["stranger"][1]) and g["stranger"][1].startswith(
                "Local Gloo reconfigure handle is not part of the new communicator"), g["stranger"]
            assert f["stranger"][0] == "RuntimeError" and f["stranger"][1].startswith(
                f"funcoll: the local reconfigure handle {f['stranger_handle']!r} is not part of the new "
                "communicator"), f["stranger"]
    # the numbers themselves (gloo's, and so funcoll's): the reversed order makes the last stable id rank 0
    s = sum(range(1, world + 1))
    assert [fc[r]["after1"] for r in range(world)] == [
        (world - 1 - r, world, world - 1 - r, world, float(s), float(world - 1), float(s)) for r in range(world)]
    # the reused uuid: refused where it is claimed (the new rank 0), with gloo's words
    claimer = next(r for r in range(world - 1) if "reused" in fc[r])
    assert "reused" in gloo[claimer], gloo[claimer]
    assert fc[claimer]["reused"] == ("RuntimeError", "funcoll: reconfigure uuid 2 was already used; each "
                                                     "reconfigure() requires a unique uuid"), fc[claimer]["reused"]
    assert gloo[claimer]["reused"][1].startswith("Gloo reconfigure uuid 2 was already used; each reconfigure() "
                                                 "requires a unique uuid"), gloo[claimer]["reused"]


def _rank_shrink(rank, world):
    import torch.distributed.distributed_c10d as c10d

    from funcoll import ProcessGroupFuncoll

    out = {}
    sub = dist.new_group([0, 1])  # a group of the default group: destroyed when the default group is shrunk
    part = dist.new_group(list(range(world - 1)))  # shrunk below while the default group stays
    out["validation"] = [_attempt(lambda: dist.shrink_group([])),
                         _attempt(lambda: dist.shrink_group([rank])),
                         _attempt(lambda: dist.shrink_group([world]))]
    dist.barrier()
    # shrinking a group that is not the default one: its member 1 is excluded, the default group stays
    if rank in range(world - 1) and rank != 1:
        small = dist.shrink_group([1], group=part)
        t = torch.tensor([float(rank)])
        dist.all_reduce(t, group=small)
        out["part"] = (type(small).__name__, small.size(), small.rank(), t.item(),
                       dist.get_world_size(), c10d.get_process_group_ranks(small))
    dist.barrier()
    # the default group, with a collective in flight that the excluded rank never joins: SHRINK_ABORT ends it
    victim = world - 1
    if rank == victim:
        time.sleep(5)  # alive, but excluded: it does not call
        return out
    pending = dist.all_reduce(torch.ones(4), async_op=True)
    t0 = time.monotonic()
    new = dist.shrink_group([victim], shrink_flags=c10d.SHRINK_ABORT)
    out["pending"] = (_attempt(pending.wait)[0], time.monotonic() - t0)
    out["aborted_type"] = type(pending.exception()).__name__
    out["default"] = (new is dist.group.WORLD, isinstance(new, ProcessGroupFuncoll), dist.get_rank(),
                      dist.get_world_size(), c10d.get_process_group_ranks(new), new.group_desc)
    t = torch.tensor([float(rank + 1)])
    dist.all_reduce(t)
    out["sum"] = t.item()
    out["sub"] = _attempt(lambda: dist.all_reduce(torch.ones(1), group=sub)) if rank in (0, 1) else None
    out["new_group"] = c10d.get_process_group_ranks(dist.new_group([0, world - 2]))
    return out


@needs_2_15
@pytest.mark.parametrize("world", WORLDS)
def test_shrink_group_keeps_torchs_contract(world):
    res = run_world("tests.fault_tolerance.test_reconfigure_shrink:_rank_shrink", world, timeout=180, coll_timeout=20)
    victim = world - 1
    for r in range(world):
        v = res[r]["validation"]
        assert v[0] == ("ValueError", "ranks_to_exclude cannot be empty. To shrink a group, you must specify at least "
                                      "one rank to exclude. Example: [failed_rank_id]"), v[0]
        assert v[1][0] == "RuntimeError" and v[1][1].startswith(
            f"Current rank {r} is in the exclusion list and should not call shrink_group()."), v[1]
        assert v[2][0] == "ValueError" and v[2][1].startswith(f"Rank {world} at index 0 is out of bounds"), v[2]
    for r in range(world - 1):
        if r != 1:
            # the shrunk group of ranks 0..world-2 without rank 1: its ranks in order, the default group unchanged
            members = [m for m in range(world - 1) if m != 1]
            assert res[r]["part"] == ("ProcessGroupFuncoll", len(members), members.index(r), float(sum(members)),
                                      world, members), res[r]["part"]
    for r in range(world):
        if r == victim:
            continue
        out = res[r]
        kind, secs = out["pending"]
        assert kind == "CollectiveAbortedError" and out["aborted_type"] == "CollectiveAbortedError", out
        assert secs < 10.0, secs  # ended by the abort, not by the 20 s group timeout
        # the new default group: the world numbered anew over the survivors
        assert out["default"] == (True, True, r, world - 1, list(range(world - 1)), "default:shrunken"), out
        assert out["sum"] == float(sum(range(1, world))), out
        if r in (0, 1):
            kind, msg = out["sub"]
            assert kind == "ValueError" and msg.endswith(
                "is not initialized in the world group map. Please initialize the group first."), out["sub"]
        assert out["new_group"] == [0, world - 2], out
