"""Programs whose XLA HLO the tests snapshot, each run in a fresh interpreter (tests/fresh.py: a process has one
default process group).

``funcoll_worlds(["WORLD:RANK", ...])`` builds, one after the other, virtual funcoll worlds of WORLD ranks in this
process (HashStore), runs every case as rank RANK and returns {"WORLD:RANK": {case: normalised collective HLO}}.
``side_by_side(WORLD, RANK)`` runs the same few programs through torch_xla's own kernels, then through funcoll's
(``funcoll.install(["xla"])``), then torch_xla's again (``funcoll.uninstall()``), and returns {case: {"torch_xla":
..., "funcoll": ..., "after_uninstall": ...}}; a raised error is shown as ``raises Type: message``.
``process_group_xla()`` runs, on a 1-replica world, torch_xla's ProcessGroupXla eager methods next to funcoll's and
returns how many graph executions each call caused, and what raises.
Nothing here executes a collective of a virtual world: the HLO is read, never run.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch_xla  # noqa: F401

import funcoll
from funcoll import testing, xla
from funcoll.replicas import _step_tensors  # what step closures keep alive, e.g. a send's collective-permute
from funcoll.testing import xla_collectives

R = dist.ReduceOp
F = torch.ops._c10d_functional
WITH_SCALE = testing.COLLECTIVE_OPCODES + ("multiply", "divide")


def dev():
    return torch_xla.device()


def vec(n=4, dtype=torch.float32):
    return torch.arange(n, dtype=torch.float32).to(dtype).to(dev())


def a2a_splits(world, rank):
    """The rows rank i sends to rank j in the uneven all_to_all case: 1..3, so the bound is 3."""
    sends = [[(i + 2 * j) % 3 + 1 for j in range(world)] for i in range(world)]
    return [sends[j][rank] for j in range(world)], sends[rank]  # (output splits, input splits)


def _first_line(e: BaseException) -> str:
    import re

    line = re.sub(r" at 0x[0-9a-f]+", "", (str(e).strip().splitlines() or [""])[0])
    if len(line) > 200 and not line.startswith("funcoll"):  # the first sentence of another library's long message
        return line.split(". ")[0] + " ..."
    return line


def _hlo(fn, keep=None):
    xla.reset_token()
    _step_tensors()
    try:
        out = fn()
    except Exception as e:  # noqa: BLE001 - the error is the case's result
        xla.reset_token()
        _step_tensors()
        return f"raises {type(e).__name__}: {_first_line(e)}"
    out = ([out] if isinstance(out, torch.Tensor) else list(out)) + _step_tensors()
    text = xla_collectives(out, keep)
    xla.reset_token()
    return text or "(no collective)"


# ---------------------------------------------------------------------------------------------------
# funcoll in a virtual world
# ---------------------------------------------------------------------------------------------------
def funcoll_worlds(specs) -> dict:
    """``["4:1", "8:1"]`` -> {"4:1": cases of rank 1 of a virtual world of 4, ...}, one world after the other."""
    out = {}
    for spec in specs:
        world, rank = (int(x) for x in spec.split(":"))
        out[spec] = funcoll_cases(world, rank)
        dist.destroy_process_group()
        funcoll.groups.clear()
    return out


def funcoll_cases(world: int, rank: int) -> dict:
    dist.init_process_group("funcoll", store=dist.HashStore(), rank=rank, world_size=world)
    funcoll.install(["xla"])
    W = dist.group.WORLD
    out = {}

    def case(name, fn, keep=None):
        out[name] = _hlo(fn, keep)

    def ar(group=None, op=R.SUM, dtype=torch.float32):
        def run():
            t = vec(dtype=dtype)
            dist.all_reduce(t, op=op, group=group)
            return t
        return run

    case("world all_reduce sum", ar())
    case("world all_reduce avg", ar(op=R.AVG), WITH_SCALE)
    case("world all_reduce premul_sum 0.5", ar(op=dist._make_nccl_premul_sum(0.5)), WITH_SCALE)
    case("world all_reduce bxor int32", ar(op=R.BXOR, dtype=torch.int32))
    case("world all_reduce band int32", ar(op=R.BAND, dtype=torch.int32))
    case("world all_reduce max uint32", ar(op=R.MAX, dtype=torch.uint32))

    def coalesced():
        ts = [vec(3), vec(4).view(2, 2), vec(5)]
        dist.all_reduce_coalesced(ts)
        return ts
    case("world all_reduce_coalesced 3 f32", coalesced)

    def coalesced_mixed():  # dist.all_reduce_coalesced refuses mixed dtypes (c10d's own check); the op takes them
        return [F.wait_tensor(t) for t in F.all_reduce_coalesced([vec(3), vec(2, torch.int32), vec(5)], "sum",
                                                                 W.group_name)]
    case("functional all_reduce_coalesced f32+int32+f32", coalesced_mixed)

    def broadcast():
        t = vec()
        dist.broadcast(t, src=world - 1)
        return t
    case(f"world broadcast src={world - 1}", broadcast)

    def a2a():
        outs, ins = a2a_splits(world, rank)
        inp, o = vec(sum(ins)), torch.empty(sum(outs), device=dev())
        with xla.static_split_bound(3):
            dist.all_to_all_single(o, inp, outs, ins)
        return o
    case("world all_to_all uneven (static bound 3)", a2a)
    if world == 4:
        case("world all_to_all uneven (static bound 3), pad/slice", a2a,
             testing.COLLECTIVE_OPCODES + ("concatenate", "slice"))

    def a2a_no_bound():
        outs, ins = a2a_splits(world, rank)
        inp, o = vec(sum(ins)), torch.empty(sum(outs), device=dev())
        dist.all_to_all_single(o, inp, outs, ins)
        return o
    case("world all_to_all uneven, no bound", a2a_no_bound)

    def reduce(dst):
        def run():
            t = vec()
            dist.reduce(t, dst=dst)
            return t
        return run
    case("world reduce dst=this rank", reduce(rank))
    case("world reduce dst=other rank", reduce((rank + 1) % world))

    def gather(dst):
        def run():
            t = vec()
            outs = [torch.empty(4, device=dev()) for _ in range(world)] if rank == dst else None
            dist.gather(t, outs, dst=dst)
            return outs if rank == dst else t
        return run
    case("world gather dst=this rank", gather(rank))
    case("world gather dst=other rank", gather((rank + 1) % world))

    def scatter():
        o = torch.empty(4, device=dev())
        dist.scatter(o, [vec() + i for i in range(world)] if rank == 0 else None, src=0)
        return o
    case("world scatter src=0", scatter)

    def functional_avg():
        return F.wait_tensor(F.all_reduce(vec(), "avg", W.group_name))
    case("functional all_reduce avg", functional_avg, WITH_SCALE)

    def functional_a2a():
        outs, ins = a2a_splits(world, rank)
        with xla.static_split_bound(3):
            return F.wait_tensor(F.all_to_all_single(vec(sum(ins)), outs, ins, W.group_name))
    case("functional all_to_all uneven (static bound 3)", functional_a2a)

    def functional_broadcast():
        return F.wait_tensor(F.broadcast(vec(), world - 1, W.group_name))
    case(f"functional broadcast src={world - 1}", functional_broadcast)

    # a new group of every rank (c10d sorts a new group's ranks): the whole world, as the default group emits it
    everyone = dist.new_group(list(range(world)))
    case("new group of every rank all_reduce", ar(everyone))

    def everyone_gather():
        o = torch.empty(4 * world, device=dev())
        dist.all_gather_into_tensor(o, vec(), group=everyone)
        return o
    case("new group of every rank all_gather", everyone_gather)

    # the lone sub-group: the world's ranks 1..world-1 but one (world 2: rank 1 alone)
    lone_ranks = list(range(1, world)) if world > 2 else [1]
    lone = dist.new_group(lone_ranks)
    if rank in lone_ranks:
        case(f"lone group {lone_ranks} all_reduce", ar(lone))

        def lone_gather():
            o = torch.empty(4 * len(lone_ranks), device=dev())
            dist.all_gather_into_tensor(o, vec(), group=lone)
            return o
        case(f"lone group {lone_ranks} all_gather", lone_gather)
    if world >= 4:
        pair = dist.new_group([1, 2])
        if rank in (1, 2):
            case("lone group [1, 2] all_reduce", ar(pair))

            def pair_gather():
                o = torch.empty(8, device=dev())
                dist.all_gather_into_tensor(o, vec(), group=pair)
                return o
            case("lone group [1, 2] all_gather", pair_gather)
            case("lone group [1, 2] send 1->2 / recv", lambda: _send_recv(pair, rank))

    # a mesh: (2, 2) on 4 ranks, (2, 4) on 8; every dim registered as a partition
    shape = {4: (2, 2), 8: (2, 4)}.get(world)
    if shape is not None:
        from torch.distributed.device_mesh import init_device_mesh

        mesh = init_device_mesh("cpu", shape, mesh_dim_names=("dp", "tp"))
        plain = {d: _hlo(ar(mesh.get_group(d))) for d in ("dp", "tp")}
        funcoll.groups.register_mesh(mesh)
        for d in ("dp", "tp"):
            g = mesh.get_group(d)
            case(f"mesh {shape} {d} all_reduce", ar(g))
            out[f"mesh {shape} {d} all_reduce, partition not registered"] = plain[d]

        def mesh_rs():
            g = mesh.get_group("tp")
            n = g.size()
            o = torch.empty(2, device=dev())
            dist.reduce_scatter_tensor(o, vec(2 * n), group=g)
            return o
        case(f"mesh {shape} tp reduce_scatter", mesh_rs)

        def mesh_rs_avg_functional():
            g = mesh.get_group("dp")
            return F.wait_tensor(F.reduce_scatter_tensor(vec(2 * g.size()), "avg", g.size(), g.group_name))
        case(f"mesh {shape} dp functional reduce_scatter avg", mesh_rs_avg_functional, WITH_SCALE)
    return out


def _send_recv(group, rank):
    t = vec()
    if rank == 1:
        dist.send(t, dst=2, group=group)  # the collective-permute is kept until the step (see _step_tensors)
        return []
    dist.recv(t, src=1, group=group)
    return t


# ---------------------------------------------------------------------------------------------------
# torch_xla's kernels vs funcoll's, same programs
# ---------------------------------------------------------------------------------------------------
def side_by_side(world: int, rank: int) -> dict:
    dist.init_process_group("funcoll", store=dist.HashStore(), rank=rank, world_size=world)
    pair = dist.new_group([0, 1])
    W = dist.group.WORLD
    programs = {
        "all_reduce sum on group [0, 1]": lambda: F.all_reduce(vec(), "sum", pair.group_name),
        "all_reduce avg": lambda: F.all_reduce(vec(), "avg", W.group_name),
        "all_reduce bxor int32": lambda: F.all_reduce(vec(dtype=torch.int32), "bxor", W.group_name),
        "all_gather_into_tensor on group [0, 1]": lambda: F.all_gather_into_tensor(vec(), 2, pair.group_name),
        "all_to_all_single uneven": lambda: _a2a_functional(world, rank, W.group_name),
        "broadcast src=1 on group [0, 1]": lambda: F.broadcast(vec(), 1, pair.group_name),
        "all_reduce_ (in place)": lambda: F.all_reduce_(vec(), "sum", W.group_name),
    }
    # (ops torch_xla has no XLA kernel for, e.g. all_reduce_coalesced, fall to the upstream kernel, which calls the
    # group's eager backend: here funcoll's own process group, so they are no torch_xla-vs-funcoll comparison)
    keep = {"all_reduce avg": WITH_SCALE, "broadcast src=1 on group [0, 1]": WITH_SCALE}
    out = {name: {} for name in programs}
    for phase in ("torch_xla", "funcoll", "after_uninstall"):
        if phase == "funcoll":
            funcoll.install(["xla"])
        elif phase == "after_uninstall":
            funcoll.uninstall()
        for name, fn in programs.items():
            out[name][phase] = _hlo(fn, keep.get(name))
    dist.destroy_process_group()
    return out


def _a2a_functional(world, rank, group_name):
    outs, ins = a2a_splits(world, rank)
    with xla.static_split_bound(3):  # funcoll's kernel needs it on a virtual world; torch_xla's ignores it
        return F.all_to_all_single(vec(sum(ins)), outs, ins, group_name)


# ---------------------------------------------------------------------------------------------------
# ProcessGroupXla vs ProcessGroupFuncoll, executed on one replica
# ---------------------------------------------------------------------------------------------------
def process_group_xla() -> dict:
    import torch_xla.debug.metrics as met
    import torch_xla.distributed.xla_backend  # noqa: F401  (registers the "xla" backend)

    dist.init_process_group("xla", init_method="xla://")
    pg_xla = dist.group.WORLD
    pg_funcoll = dist.new_group([0], backend="funcoll")

    import torch_xla.core.xla_model as xm

    def count():  # executions finish (and are counted) asynchronously: wait for them first
        xm.wait_device_ops()
        return (met.metric_data("ExecuteTime") or (0,))[0]

    def executions(fn):
        torch_xla.sync()
        before = count()
        try:
            fn()
        except Exception as e:  # noqa: BLE001
            return f"raises {type(e).__name__}: {_first_line(e)}"
        return f"{count() - before} graph execution(s) before any result is read"

    calls = {
        "all_reduce AVG": lambda g: dist.all_reduce(vec(), op=R.AVG, group=g),
        "all_reduce PREMUL_SUM": lambda g: dist.all_reduce(vec(), op=dist._make_nccl_premul_sum(0.5), group=g),
        "all_reduce BXOR": lambda g: dist.all_reduce(vec(dtype=torch.int32), op=R.BXOR, group=g),
        "all_to_all_single with split sizes": lambda g: dist.all_to_all_single(
            torch.empty(4, device=dev()), vec(), [4], [4], group=g),
        "all_to_all_single with split sizes, static_split_bound(4)": lambda g: _bounded(lambda: dist.all_to_all_single(
            torch.empty(4, device=dev()), vec(), [4], [4], group=g)),
        "all_reduce_coalesced": lambda g: dist.all_reduce_coalesced([vec(), vec(3)], group=g),
        "reduce": lambda g: dist.reduce(vec(), dst=0, group=g),
        "gather": lambda g: dist.gather(vec(), [torch.empty(4, device=dev())], dst=0, group=g),
    }
    out = {}
    for name, call in calls.items():
        out[name] = {"ProcessGroupXla": executions(lambda call=call: call(pg_xla)),
                     "funcoll": executions(lambda call=call: call(pg_funcoll))}
    dist.destroy_process_group()
    return out


def _bounded(fn):
    with xla.static_split_bound(4):
        return fn()
