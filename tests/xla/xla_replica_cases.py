"""Programs of virtual XLA worlds executed on N replicas of the XLA CPU runtime (funcoll.replicas), checked against
tests/reference.py. Each runs in a fresh interpreter (tests/fresh.py: each rank of a virtual world is the default
process group in turn):

``funcoll_world(WORLD)`` captures, as every rank of a world of WORLD ranks, two programs: one that every rank compiles
identically (every op, reduce op and dtype, sub-groups, a compiled training step; run as one module on WORLD
replicas) and one that depends on the rank (uneven all_to_all, lone groups only their members call; each rank's own
module, one process per rank), executes both and returns {"count", "failures", "same", "why"}.
``side_by_side(WORLD)`` runs a few calls through torch_xla's own kernels and through funcoll's, executed on the same
inputs, and returns {case: {"torch_xla": result, "funcoll": result, "want": ...}}.
``unsupported()`` returns the errors of modules the runner refuses or the CPU runtime cannot compile.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch_xla

import funcoll
from funcoll import replicas, xla
from tests import reference as ref

F = torch.ops._c10d_functional
R = dist.ReduceOp
SHAPES = [(3, 5), (8,)]  # 15 elements: divisible by no world size here; 8: by all of them
# worlds 4 and 8 run every reduce op on fewer dtypes (world 2 runs them all): their modules compile in half the time
DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.complex64, torch.int8, torch.uint8,
          torch.int16, torch.uint16, torch.int32, torch.uint32, torch.int64, torch.uint64, torch.bool]
DTYPES_LARGER = [torch.float32, torch.bfloat16, torch.uint8, torch.int16, torch.int32, torch.uint64, torch.bool]


def dev():
    return torch_xla.device()


def values_of(dtype, op) -> str:
    if dtype.is_floating_point or dtype.is_complex:
        return "grid"
    return "small" if op in ("product", "avg", "sum") and dtype != torch.bool else "random"


def a2a_splits(world, rank):
    """(output splits, input splits) of rank ``rank``: rank i sends (i + 2j) % 3 + 1 rows to rank j (1..3)."""
    sends = [[(i + 2 * j) % 3 + 1 for j in range(world)] for i in range(world)]
    return [sends[j][rank] for j in range(world)], sends[rank]


def mixed_splits(world, rank):
    """(output splits, input splits) of rank ``rank`` where rank 0 sends and receives 1 row per peer (its splits all
    equal) and every other rank sends 2 rows to each rank but 0 (its splits uneven)."""
    sends = [[1 if i == 0 or j == 0 else 2 for j in range(world)] for i in range(world)]
    return [sends[j][rank] for j in range(world)], sends[rank]


def group_calls(name: str, g, members: list, r: int) -> dict:
    """The same six calls on a sub-group ``g`` of ``members`` (global ranks), run by its members: all_reduce AVG and
    BXOR, all_gather, reduce_scatter, all_to_all (not on a group of one: an all-to-all of one replica never finishes
    on jaxlib's gloo collectives) and broadcast from the last member."""
    k, res = len(members), {}
    t = ref.make(torch.float32, (5,), r, f"{name} ar", "grid").to(dev())
    dist.all_reduce(t, op=R.AVG, group=g)
    res[f"{name} all_reduce avg"] = t
    t = ref.make(torch.int32, (6,), r, f"{name} bxor").to(dev())
    dist.all_reduce(t, op=R.BXOR, group=g)
    res[f"{name} all_reduce bxor"] = t
    o = torch.empty((k * 2,), device=dev())
    dist.all_gather_into_tensor(o, ref.make(torch.float32, (2,), r, f"{name} ag").to(dev()), group=g)
    res[f"{name} all_gather"] = o
    o = torch.empty((2,), device=dev())
    dist.reduce_scatter_tensor(o, ref.make(torch.float32, (k * 2,), r, f"{name} rs", "grid").to(dev()), group=g)
    res[f"{name} reduce_scatter"] = o
    if k > 1:
        o = torch.empty((k * 2,), device=dev())
        dist.all_to_all_single(o, ref.make(torch.float32, (k * 2,), r, f"{name} a2a").to(dev()), group=g)
        res[f"{name} all_to_all"] = o
    t = ref.make(torch.float32, (3,), r, f"{name} bc").to(dev())
    dist.broadcast(t, src=members[-1], group=g)
    res[f"{name} broadcast src=last"] = t
    return res


def group_expected(name: str, members: list, rank: int) -> dict:
    """What :func:`group_calls` gives ``rank``, from every member's inputs."""
    k, me, want = len(members), members.index(rank), {}
    want[f"{name} all_reduce avg"] = (
        ref.reduce("avg", [ref.make(torch.float32, (5,), q, f"{name} ar", "grid") for q in members]), "avg", "grid")
    want[f"{name} all_reduce bxor"] = (
        ref.reduce("bxor", [ref.make(torch.int32, (6,), q, f"{name} bxor") for q in members]), "bxor", "random")
    want[f"{name} all_gather"] = (torch.cat([ref.make(torch.float32, (2,), q, f"{name} ag") for q in members]),
                                  "movement", "random")
    full = ref.reduce("sum", [ref.make(torch.float32, (k * 2,), q, f"{name} rs", "grid") for q in members])
    want[f"{name} reduce_scatter"] = (full[me * 2:me * 2 + 2], "sum", "grid")
    if k > 1:
        a = [ref.make(torch.float32, (k * 2,), q, f"{name} a2a") for q in members]
        want[f"{name} all_to_all"] = (torch.cat([i[me * 2:me * 2 + 2] for i in a]), "movement", "random")
    want[f"{name} broadcast src=last"] = (ref.make(torch.float32, (3,), members[-1], f"{name} bc"), "movement",
                                          "random")
    return want


# ---------------------------------------------------------------------------------------------------
# the programs: each returns {case: XLA tensor}; expected() rebuilds {case: CPU tensor} from every rank's inputs
# ---------------------------------------------------------------------------------------------------
def uniform_program(n: int):
    """Every case whose program is the same on every rank; ``(fn, expected(rank) -> {case: (want, op, values)})``."""

    def all_reduce_cases(r):
        out = {}
        for dtype in DTYPES if n == 2 else DTYPES_LARGER:
            for op in ref.valid_ops(dtype):
                # world 2: both shapes everywhere; larger worlds: the size no world divides everywhere, the divisible
                # one where a strategy pads (bitwise via all_to_all, bool, narrow integers)
                shapes = SHAPES if n == 2 or dtype in (torch.int32, torch.uint8, torch.bool) else SHAPES[:1]
                for shape in shapes:
                    name = f"all_reduce {op} {str(dtype)[6:]} {list(shape)}"
                    out[name] = (dtype, shape, op, values_of(dtype, op))
        return out

    def fn():
        r = dist.get_rank()
        W = dist.group.WORLD
        res = {}
        for name, (dtype, shape, op, values) in all_reduce_cases(r).items():
            t = ref.make(dtype, shape, r, name, values).to(dev())
            dist.all_reduce(t, op=ref.c10d_op(op))
            res[name] = t
        # all_gather_into_tensor, reduce_scatter_tensor, even all_to_all, broadcast, reduce
        for dtype in (torch.float32, torch.int16, torch.bool, torch.uint64):
            name = f"all_gather {str(dtype)[6:]}"
            o = torch.empty((n * 2, 3), dtype=dtype, device=dev())
            dist.all_gather_into_tensor(o, ref.make(dtype, (2, 3), r, name).to(dev()))
            res[name] = o
        for dtype, op in ((torch.float32, "sum"), (torch.float32, "avg"), (torch.float32, "max"),
                          (torch.int32, "bxor"), (torch.int32, "avg"), (torch.bfloat16, "avg"),
                          (torch.uint8, "band"), (torch.bool, "bxor")):
            name = f"reduce_scatter {op} {str(dtype)[6:]}"
            o = torch.empty((3,), dtype=dtype, device=dev())
            dist.reduce_scatter_tensor(o, ref.make(dtype, (n * 3,), r, name, values_of(dtype, op)).to(dev()),
                                       op=ref.c10d_op(op))
            res[name] = o
        o = torch.empty((n * 2, 3), device=dev())
        dist.all_to_all_single(o, ref.make(torch.float32, (n * 2, 3), r, "a2a even").to(dev()))
        res["all_to_all even"] = o
        for src in (0, n - 1):
            t = ref.make(torch.int32, (5,), r, f"broadcast {src}").to(dev())
            dist.broadcast(t, src=src)
            res[f"broadcast src={src}"] = t
        t = ref.make(torch.float32, (5,), r, "functional broadcast").to(dev())
        res["functional broadcast src=1"] = F.wait_tensor(F.broadcast(t, 1, W.group_name))
        # coalesced and in-place forms
        ts = [ref.make(torch.float32, s, r, f"coalesced {i}", "grid").to(dev())
              for i, s in enumerate([(3,), (2, 2), (5,)])]
        dist.all_reduce_coalesced(ts)
        for i, t in enumerate(ts):
            res[f"all_reduce_coalesced {i}"] = t
        mixed = [ref.make(d, (3,), r, f"mixed {i}", "grid") for i, d in
                 enumerate((torch.float32, torch.int32, torch.float32))]
        got = F.all_reduce_coalesced([m.to(dev()) for m in mixed], "sum", W.group_name)
        for i, t in enumerate(got):
            res[f"functional all_reduce_coalesced mixed {i}"] = F.wait_tensor(t)
        ins = [ref.make(torch.float32, (2,), r, f"agc {i}").to(dev()) for i in range(2)]
        for i, t in enumerate(F.all_gather_into_tensor_coalesced(ins, n, W.group_name)):
            res[f"all_gather_into_tensor_coalesced {i}"] = F.wait_tensor(t)
        ins = [ref.make(torch.float32, (n * 2,), r, f"rsc {i}", "grid").to(dev()) for i in range(2)]
        for i, t in enumerate(F.reduce_scatter_tensor_coalesced(ins, "avg", n, W.group_name)):
            res[f"reduce_scatter_tensor_coalesced avg {i}"] = F.wait_tensor(t)
        t = ref.make(torch.int32, (7,), r, "all_reduce_ bxor").to(dev())
        F.wait_tensor(F.all_reduce_(t, "bxor", W.group_name))
        res["functional all_reduce_ bxor (in place)"] = t
        o = torch.empty((n * 3,), device=dev())
        F.all_gather_into_tensor_out(ref.make(torch.float32, (3,), r, "ag out").to(dev()), n, W.group_name, out=o)
        res["functional all_gather_into_tensor_out"] = F.wait_tensor(o)
        t = ref.make(torch.float32, (4,), r, "avg view").to(dev())
        dist.all_reduce(t[1:3], op=R.AVG)
        res["all_reduce avg on a view"] = t
        # sub-groups: a mesh whose dims are registered partitions, and the same blocks as a partition implied by
        # aligned ranks (new_subgroups, not registered)
        if n >= 4:
            from torch.distributed.device_mesh import init_device_mesh

            shape = (2, n // 2)
            mesh = init_device_mesh("cpu", shape, mesh_dim_names=("dp", "tp"))
            funcoll.groups.register_mesh(mesh)
            for d in ("dp", "tp"):
                g = mesh.get_group(d)
                res.update(group_calls(f"mesh {d}", g, dist.get_process_group_ranks(g), r))
            pairs, _ = dist.new_subgroups(group_size=2)
            t = ref.make(torch.float32, (5,), r, "pairs ar", "grid").to(dev())
            dist.all_reduce(t, group=pairs)
            res["new_subgroups(2) all_reduce"] = t
            o = torch.empty((4,), device=dev())
            dist.all_gather_into_tensor(o, ref.make(torch.float32, (2,), r, "pairs ag").to(dev()), group=pairs)
            res["new_subgroups(2) all_gather"] = o
        if n in TRAINING_WORLDS:
            res.update(training_step(n, r))
        return res

    def expected(rank):
        want = {}
        for name, (dtype, shape, op, values) in all_reduce_cases(rank).items():
            want[name] = (ref.reduce(op, [ref.make(dtype, shape, q, name, values) for q in range(n)]), op, values)
        for dtype in (torch.float32, torch.int16, torch.bool, torch.uint64):
            name = f"all_gather {str(dtype)[6:]}"
            want[name] = (torch.cat([ref.make(dtype, (2, 3), q, name) for q in range(n)]), "movement", "random")
        for dtype, op in ((torch.float32, "sum"), (torch.float32, "avg"), (torch.float32, "max"),
                          (torch.int32, "bxor"), (torch.int32, "avg"), (torch.bfloat16, "avg"),
                          (torch.uint8, "band"), (torch.bool, "bxor")):
            name = f"reduce_scatter {op} {str(dtype)[6:]}"
            full = ref.reduce(op, [ref.make(dtype, (n * 3,), q, name, values_of(dtype, op)) for q in range(n)])
            want[name] = (full[rank * 3:rank * 3 + 3], op, values_of(dtype, op))
        ins = [ref.make(torch.float32, (n * 2, 3), q, "a2a even") for q in range(n)]
        want["all_to_all even"] = (torch.cat([ins[q][rank * 2:rank * 2 + 2] for q in range(n)]), "movement", "random")
        for src in (0, n - 1):
            want[f"broadcast src={src}"] = (ref.make(torch.int32, (5,), src, f"broadcast {src}"), "movement", "random")
        want["functional broadcast src=1"] = (ref.make(torch.float32, (5,), 1, "functional broadcast"), "movement",
                                              "random")
        for i, s in enumerate([(3,), (2, 2), (5,)]):
            want[f"all_reduce_coalesced {i}"] = (
                ref.reduce("sum", [ref.make(torch.float32, s, q, f"coalesced {i}", "grid") for q in range(n)]), "sum",
                "grid")
        for i, d in enumerate((torch.float32, torch.int32, torch.float32)):
            want[f"functional all_reduce_coalesced mixed {i}"] = (
                ref.reduce("sum", [ref.make(d, (3,), q, f"mixed {i}", "grid") for q in range(n)]), "sum", "grid")
        for i in range(2):
            want[f"all_gather_into_tensor_coalesced {i}"] = (
                torch.cat([ref.make(torch.float32, (2,), q, f"agc {i}") for q in range(n)]), "movement", "random")
            full = ref.reduce("avg", [ref.make(torch.float32, (n * 2,), q, f"rsc {i}", "grid") for q in range(n)])
            want[f"reduce_scatter_tensor_coalesced avg {i}"] = (full[rank * 2:rank * 2 + 2], "avg", "grid")
        want["functional all_reduce_ bxor (in place)"] = (
            ref.reduce("bxor", [ref.make(torch.int32, (7,), q, "all_reduce_ bxor") for q in range(n)]), "bxor",
            "random")
        want["functional all_gather_into_tensor_out"] = (
            torch.cat([ref.make(torch.float32, (3,), q, "ag out") for q in range(n)]), "movement", "random")
        view = ref.make(torch.float32, (4,), rank, "avg view")
        view[1:3] = ref.reduce("avg", [ref.make(torch.float32, (4,), q, "avg view")[1:3] for q in range(n)])
        want["all_reduce avg on a view"] = (view, "avg", "random")
        if n >= 4:
            cols = n // 2
            blocks = {"dp": [[c, c + cols] for c in range(cols)], "tp": [list(range(0, cols)), list(range(cols, n))]}
            for d, bl in blocks.items():
                want.update(group_expected(f"mesh {d}", next(b for b in bl if rank in b), rank))
            pair = [rank - rank % 2, rank - rank % 2 + 1]
            want["new_subgroups(2) all_reduce"] = (
                ref.reduce("sum", [ref.make(torch.float32, (5,), q, "pairs ar", "grid") for q in pair]), "sum", "grid")
            want["new_subgroups(2) all_gather"] = (
                torch.cat([ref.make(torch.float32, (2,), q, "pairs ag") for q in pair]), "movement", "random")
        if n in TRAINING_WORLDS:
            want.update(training_reference(n, rank))
        return want

    return fn, expected


# ---------------------------------------------------------------------------------------------------
# a compiled training step: forward, backward, gradient all_reduce (avg), SGD; three steps
# ---------------------------------------------------------------------------------------------------
STEPS, LR = 3, 0.1
TRAINING_WORLDS = (2, 4)  # each rank compiles the step anew (~5 s a rank here): world 8 would double the suite's time


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))


def _batch(rank, step):
    return ref.make(torch.float32, (3, 4), rank, f"x {step}"), ref.make(torch.float32, (3, 2), rank, f"y {step}")


def training_step(n, r):
    import torch._dynamo
    from torch.distributed import _functional_collectives as funcol

    torch._dynamo.reset()
    model = _model().to(dev())
    group = dist.group.WORLD

    def loss_of(x, y):
        return ((model(x) - y) ** 2).mean()

    loss_c = torch.compile(loss_of, backend="aot_eager", fullgraph=True)

    def average(grads):
        return [funcol.all_reduce(g, "avg", group) for g in grads]

    average_c = torch.compile(average, backend="aot_eager", fullgraph=True)
    for step in range(STEPS):
        x, y = (t.to(dev()) for t in _batch(r, step))
        model.zero_grad(set_to_none=True)
        loss_c(x, y).backward()
        grads = average_c([p.grad for p in model.parameters()])
        with torch.no_grad():
            for p, g in zip(model.parameters(), grads):
                p.sub_(LR * g)
    return {f"training weight {i}": p.detach() for i, p in enumerate(model.parameters())}


def training_reference(n, rank):
    """The same steps on the CPU: the gradient of each rank's loss, averaged over the ranks, applied once per step."""
    model = _model().double()
    for step in range(STEPS):
        grads = []
        for q in range(n):
            model.zero_grad(set_to_none=True)
            x, y = _batch(q, step)
            ((model(x.double()) - y.double()) ** 2).mean().backward()
            grads.append([p.grad.clone() for p in model.parameters()])
        with torch.no_grad():
            for i, p in enumerate(model.parameters()):
                p.sub_(LR * sum(g[i] for g in grads) / n)
    return {f"training weight {i}": (p.detach().float(), "training", "random")
            for i, p in enumerate(model.parameters())}


# ---------------------------------------------------------------------------------------------------
# programs that depend on the rank
# ---------------------------------------------------------------------------------------------------
def rank_program(n: int):
    # the world but rank 0: a lone group, padded with the singleton {0} (world 2: none; a group of one replica crashes
    # jaxlib's gloo collectives)
    lone_ranks = list(range(1, n)) if n > 2 else None

    def fn():
        r = dist.get_rank()
        res = {}
        outs, ins = a2a_splits(n, r)
        for bound in (3, 5):  # 3: the largest split (what the agreement finds); 5: a looser promise
            o = torch.empty((sum(outs), 2), device=dev())
            with xla.static_split_bound(bound):
                dist.all_to_all_single(o, ref.make(torch.float32, (sum(ins), 2), r, "a2a uneven").to(dev()), outs, ins)
            res[f"all_to_all uneven, static bound {bound}"] = o
        o = torch.empty((sum(outs), 2), device=dev())
        # no bound: the ranks agree on the largest split (funcoll.replicas runs the agreement's all_gather first)
        dist.all_to_all_single(o, ref.make(torch.float32, (sum(ins), 2), r, "a2a uneven").to(dev()), outs, ins)
        res["all_to_all uneven, agreed bound"] = o
        mouts, mins = mixed_splits(n, r)  # splits all equal on rank 0 only: every rank takes the uneven plan
        o = torch.empty((sum(mouts), 2), device=dev())
        dist.all_to_all_single(o, ref.make(torch.float32, (sum(mins), 2), r, "a2a mixed").to(dev()), mouts, mins)
        res["all_to_all, splits even on rank 0 only"] = o
        o = torch.empty((sum(outs),), dtype=torch.int32, device=dev())
        with xla.static_split_bound(3):
            o = F.wait_tensor(F.all_to_all_single(ref.make(torch.int32, (sum(ins),), r, "a2a uneven f").to(dev()),
                                                  outs, ins, dist.group.WORLD.group_name))
        res["functional all_to_all uneven, static bound 3"] = o
        t = ref.make(torch.float32, (5,), r, "reduce", "grid").to(dev())
        dist.reduce(t, dst=n - 1)  # the result is kept on dst only: dst's program returns it, the others their input
        res["reduce dst=last"] = t
        lone = dist.new_group(lone_ranks) if lone_ranks else None
        pair = dist.new_group([1, 2]) if n >= 4 else None
        for name, g, members in (("lone", lone, lone_ranks), ("pair [1, 2]", pair, [1, 2])):
            if g is not None and members is not None and r in members:
                res.update(group_calls(name, g, members, r))
        return res

    def expected(rank):
        want = {}
        ins = [ref.make(torch.float32, (sum(a2a_splits(n, q)[1]), 2), q, "a2a uneven") for q in range(n)]
        insf = [ref.make(torch.int32, (sum(a2a_splits(n, q)[1]),), q, "a2a uneven f") for q in range(n)]

        def a2a(inputs, splits=a2a_splits):
            pieces = []
            for q in range(n):
                sends = splits(n, q)[1]
                off = sum(sends[:rank])
                pieces.append(inputs[q][off:off + sends[rank]])
            return torch.cat(pieces)

        for bound in (3, 5):
            want[f"all_to_all uneven, static bound {bound}"] = (a2a(ins), "movement", "random")
        want["all_to_all uneven, agreed bound"] = (a2a(ins), "movement", "random")
        mixed = [ref.make(torch.float32, (sum(mixed_splits(n, q)[1]), 2), q, "a2a mixed") for q in range(n)]
        want["all_to_all, splits even on rank 0 only"] = (a2a(mixed, mixed_splits), "movement", "random")
        want["functional all_to_all uneven, static bound 3"] = (a2a(insf), "movement", "random")
        red = ref.reduce("sum", [ref.make(torch.float32, (5,), q, "reduce", "grid") for q in range(n)])
        want["reduce dst=last"] = (red if rank == n - 1 else ref.make(torch.float32, (5,), rank, "reduce", "grid"),
                                   "sum", "grid")
        for name, members in (("lone", lone_ranks), ("pair [1, 2]", [1, 2] if n >= 4 else None)):  # type: ignore
            if members is not None and rank in members:
                want.update(group_expected(name, members, rank))
        return want

    return fn, expected


def check(n, got_by_rank, expected) -> tuple:
    failures, count = [], 0
    for rank, got in enumerate(got_by_rank):
        want = expected(rank)
        if set(got) != set(want):
            failures.append(f"[rank {rank}] cases {sorted(set(got) ^ set(want))} missing on one side")
        for name in sorted(set(got) & set(want)):
            count += 1
            w, op, values = want[name]
            if op == "training":
                err = None if torch.allclose(got[name], w, rtol=1e-4, atol=1e-5) else \
                    f"got {got[name].tolist()} want {w.tolist()}"
            else:
                err = ref.close(got[name], w, n, "min" if op == "movement" else op, values)
            if err:
                failures.append(f"[world {n} rank {rank}] {name}: {err}")
    return count, failures


def funcoll_world(n: int) -> dict:
    import time

    times = {}
    t0 = time.monotonic()
    fn_u, exp_u = uniform_program(n)
    fn_r, exp_r = rank_program(n)
    uniform = replicas.capture(fn_u, n)
    ranked = replicas.capture(fn_r, n)
    times["capture"] = time.monotonic() - t0
    got_u = replicas.execute(uniform)
    times["execute one module"] = time.monotonic() - t0 - times["capture"]
    got_r = replicas.execute(ranked)
    times["execute per-rank modules"] = time.monotonic() - t0 - sum(times.values())
    count_u, fail_u = check(n, got_u, exp_u)
    count_r, fail_r = check(n, got_r, exp_r)
    return {"count": count_u + count_r, "failures": fail_u + fail_r, "same": [uniform.same, ranked.same],
            "why": [uniform.why, ranked.why], "seconds": {k: round(v, 1) for k, v in times.items()}}


# ---------------------------------------------------------------------------------------------------
# torch_xla's own kernels vs funcoll's, executed on the same inputs
# ---------------------------------------------------------------------------------------------------
def side_by_side(n: int) -> dict:
    """Functional collectives on the ``tp`` dim of a (2, n/2) mesh (every rank calls its own block's group) and on the
    world, through torch_xla's kernels (``install=False``) and through funcoll's, each executed on n replicas."""

    def programs():
        from torch.distributed.device_mesh import init_device_mesh

        mesh = init_device_mesh("cpu", (2, n // 2), mesh_dim_names=("dp", "tp"))
        g, W = mesh.get_group("tp").group_name, dist.group.WORLD.group_name
        k = n // 2
        r = dist.get_rank()
        x = ref.make(torch.float32, (k * 2,), r, "side", "grid")
        return {
            "all_reduce sum, world": lambda: F.wait_tensor(F.all_reduce(x.to(dev()), "sum", W)),
            "all_reduce sum, tp group": lambda: F.wait_tensor(F.all_reduce(x.to(dev()), "sum", g)),
            "all_gather_into_tensor, tp group": lambda: F.wait_tensor(F.all_gather_into_tensor(x.to(dev()), k, g)),
            "reduce_scatter_tensor sum, tp group": lambda: F.wait_tensor(
                F.reduce_scatter_tensor(x.to(dev()), "sum", k, g)),
            "all_to_all_single, tp group": lambda: F.wait_tensor(
                F.all_to_all_single(x.to(dev()), [2] * k, [2] * k, g)),
            "all_reduce avg, world": lambda: F.wait_tensor(F.all_reduce(x.to(dev()), "avg", W)),
        }

    xs = [ref.make(torch.float32, (n,), q, "side", "grid") for q in range(n)]
    k = n // 2
    blocks = [list(range(0, k)), list(range(k, n))]

    def want(name, rank):
        mine = next(b for b in blocks if rank in b)
        group = list(range(n)) if "world" in name else mine
        me = group.index(rank)
        if name.startswith("all_reduce sum"):
            return ref.reduce("sum", [xs[q] for q in group])
        if name.startswith("all_reduce avg"):
            return ref.reduce("avg", [xs[q] for q in group])
        if name.startswith("all_gather"):
            return torch.cat([xs[q] for q in group])
        if name.startswith("reduce_scatter"):
            return ref.reduce("sum", [xs[q] for q in group])[me * 2:me * 2 + 2]
        return torch.cat([xs[q][me * 2:me * 2 + 2] for q in group])

    out: dict = {}
    for kernels, install in (("torch_xla", False), ("funcoll", True)):
        for name in ("all_reduce sum, world", "all_reduce sum, tp group", "all_gather_into_tensor, tp group",
                     "reduce_scatter_tensor sum, tp group", "all_to_all_single, tp group", "all_reduce avg, world"):
            row = out.setdefault(name, {})
            try:
                world = replicas.capture(lambda name=name: programs()[name](), n, install=install)
                got = replicas.execute(world)
            except Exception as e:  # noqa: BLE001 - the error is the result
                row[kernels] = f"raises {type(e).__name__}: {str(e).splitlines()[0][:160]}"
                continue
            row[kernels] = [t.tolist() for t in got]
            row["right " + kernels] = all(ref.close(t, want(name, q), n, "sum", "grid") is None
                                          for q, t in enumerate(got))
            row["want"] = [want(name, q).tolist() for q in range(n)]
    return out


def unsupported() -> dict:
    """What the runner says of a module with an instruction the XLA CPU runtime has no implementation for."""

    def fn():
        t = torch.ones(4).to(dev())
        dist.all_reduce(t)
        (out,) = torch_xla._XLAC._xla_tpu_custom_call([t], "{}", [[4]], [torch.float32])
        return out

    out = {}
    try:
        replicas.run(fn, 2)
        out["tpu custom call"] = "no error"
    except replicas.ReplicaRuntimeError as e:
        out["tpu custom call"] = str(e)

    def openxla():
        from torch.distributed import _functional_collectives as funcol

        x = torch.ones(3).to(dev())
        return torch.compile(lambda x: funcol.all_reduce(x * 2, "sum", dist.group.WORLD), backend="openxla")(x)

    try:
        replicas.capture(openxla, 2)
        out["openxla"] = "no error"
    except ValueError as e:
        out["openxla"] = str(e)
    return out
