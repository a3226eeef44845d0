"""funcoll's demo (``./dev demo``, ``python -m funcoll demo``): a 2-rank CPU world over gloo runs a few collectives and
a training step, eager and compiled, natively and under ``FUNCOLL_PROFILE=xccl``, and prints each call's strategy and
whether the results agree. With torch_xla (``--xla`` alone): a world of one rank executed on the CPU PJRT device, eager
vs compiled (``openxla``), then the HLO rank 1 of a virtual 4-rank job would compile.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import sys
import time

import torch

WORLD = 2


def _calls(rank):
    import torch.distributed as dist
    from torch.distributed import ReduceOp

    out = {}
    for name, vals, dtype, op in (
            ("all_reduce avg f32", [1.0 + rank, 2.0, -3.0 * rank], torch.float32, ReduceOp.AVG),
            ("all_reduce bxor i32", [5 + rank, 12, 7 * rank], torch.int32, ReduceOp.BXOR),
            ("all_reduce max i32", [-5 + rank, 12, 7 * rank], torch.int32, ReduceOp.MAX),
            ("all_reduce premul_sum", [0.5 * rank, 1.0, 2.0], torch.float32, dist._make_nccl_premul_sum(0.25)),
            ("all_reduce sum i16", [v * (rank + 1) for v in (1, 2, 3, 4)], torch.int16, ReduceOp.SUM)):
        out[name] = torch.tensor(vals, dtype=dtype)
        dist.all_reduce(out[name], op=op)
    inp = torch.arange(4, dtype=torch.bfloat16) + rank
    scattered = torch.empty(2, dtype=torch.bfloat16)
    dist.reduce_scatter_tensor(scattered, inp, op=ReduceOp.AVG)
    out["reduce_scatter avg bf16"] = scattered
    ins = [1, 2] if rank == 0 else [3, 0]
    outs = [1, 3] if rank == 0 else [2, 0]
    inp = torch.arange(float(sum(ins))) + 10 * rank
    received = torch.empty(sum(outs))
    dist.all_to_all_single(received, inp, outs, ins)
    out["all_to_all uneven"] = received
    x = torch.tensor([float(rank)] * 3)
    dist.broadcast(x, src=1)
    out["broadcast src=1"] = x
    return out


def _train(rank, compiled):
    import torch.distributed as dist
    import torch.distributed._functional_collectives as fc

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
    g = torch.Generator().manual_seed(100 + rank)
    data, target = torch.randn(16, 4, generator=g), torch.randn(16, 1, generator=g)
    loss = torch.nn.functional.mse_loss(model(data), target)
    loss.backward()
    params = list(model.parameters())
    grads = [p.grad for p in params if p.grad is not None]
    assert len(grads) == len(params)
    world = dist.group.WORLD
    assert world is not None
    if compiled:
        avg = torch.compile(lambda gs: [fc.all_reduce(x, "avg", world) for x in gs], fullgraph=True,
                            backend="aot_eager")
        for grad, x in zip(grads, avg(grads)):
            grad.copy_(fc.wait_tensor(x))
    else:
        for x in grads:
            dist.all_reduce(x, op=dist.ReduceOp.AVG)
    with torch.no_grad():
        for p, grad in zip(params, grads):
            p.sub_(0.1 * grad)
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def rank_main(rank, n):
    """Runs on every rank of the demo world; returns (results, strategies) from this rank."""
    import funcoll

    with funcoll.record() as log:
        results = _calls(rank)
    strategies = {name: "; ".join(notes) for name, (_, notes) in zip(list(results), log)}  # one collective per call
    for compiled in (False, True):
        name = f"train step ({'compiled' if compiled else 'eager'})"
        with funcoll.record() as log:
            results[name] = _train(rank, compiled)
        strategies[name] = "; ".join(sorted({s for _, notes in log for s in notes}))
    return results, strategies


def _cell(v: torch.Tensor) -> str:
    return f"[{v.numel()} params, sum {float(v.double().sum()):.6f}]" if v.numel() > 4 else str(v.tolist())


def main(argv=None) -> int:
    from funcoll.launch import run_world

    if list(argv or []) == ["--xla"]:
        return xla_main()
    t0 = time.monotonic()
    print(f"funcoll demo: {WORLD} CPU ranks over gloo, torch {torch.__version__}\n")
    runs = {profile: run_world("funcoll.demo:rank_main", WORLD, profile, timeout=240) for profile in (None, "xccl")}
    native, xccl = runs[None][0], runs["xccl"][0]
    names = list(native[0])
    width = max(len(n) for n in names)
    print(f"{'call':<{width}}  {'result (rank 0)':<34} {'agree':<6} strategy native gloo | "
          f"strategy FUNCOLL_PROFILE=xccl")
    print("-" * (width + 110))
    all_agree = True
    for name in names:  # every rank's result, native vs xccl profile
        pairs = [(runs[None][r][0][name], runs["xccl"][r][0][name]) for r in range(WORLD)]
        agree = all(torch.allclose(x.double(), y.double(), rtol=1e-6, atol=1e-6) if x.is_floating_point()
                    else torch.equal(x, y) for x, y in pairs)
        all_agree &= agree
        print(f"{name:<{width}}  {_cell(native[0][name]):<34} {'yes' if agree else 'NO':<6} {native[1][name]} | "
              f"{xccl[1][name]}")
    eager_vs_compiled = torch.equal(native[0]["train step (eager)"], native[0]["train step (compiled)"])
    print(f"\neager == compiled training step (bit-identical): {eager_vs_compiled}")
    print(f"native == xccl profile on every call: {all_agree}   ({time.monotonic() - t0:.1f}s)")
    ok = all_agree and eager_vs_compiled
    try:
        import torch_xla  # noqa: F401
    except ImportError:
        print("\n(torch_xla is not installed: skipping the XLA part)")
        return 0 if ok else 1
    print("\n== XLA (PJRT_DEVICE=CPU) ==")
    rc = xla_main()
    return 0 if ok and not rc else 1


def _xla_world1() -> bool:
    import torch.distributed as dist
    import torch_xla
    from torch.distributed import ReduceOp

    import funcoll
    from funcoll import xla

    F = torch.ops._c10d_functional
    dev = torch_xla.device()
    dist.init_process_group("funcoll", store=dist.HashStore(), rank=0, world_size=1)  # this process has none yet
    group = dist.group.WORLD
    assert isinstance(group, dist.ProcessGroup)
    name = group.group_name
    funcoll.install(["xla"])
    x0 = torch.tensor([1.5, -2.0, 3.25, 0.5])
    i0 = torch.tensor([5, 12, 7, 3], dtype=torch.int32)

    def eager(x, i):
        def ar(t, op=ReduceOp.SUM):
            dist.all_reduce(t, op=op, group=group)
            return t

        received, broadcast = torch.empty_like(x), x.clone()
        with xla.static_split_bound(4):
            dist.all_to_all_single(received, x, [4], [4], group=group)
        dist.broadcast(broadcast, src=0, group=group)
        return {"all_reduce avg": ar(x.clone(), ReduceOp.AVG),
                "all_reduce premul_sum(0.5)": ar(x.clone(), dist._make_nccl_premul_sum(0.5)),
                "all_reduce bxor int32": ar(i.clone(), ReduceOp.BXOR), "all_to_all_single splits [4]": received,
                "broadcast": broadcast,
                "all_reduce_ (in place)": ar(x.clone())}

    def functional(x, i):
        wait = F.wait_tensor
        t = x.clone()
        wait(F.all_reduce_(t, "sum", name))
        return {"all_reduce avg": wait(F.all_reduce(x, "avg", name)),
                "all_reduce premul_sum(0.5)": wait(F.all_reduce(x * 0.5, "sum", name)),
                "all_reduce bxor int32": wait(F.all_reduce(i, "bxor", name)),
                "all_to_all_single splits [4]": wait(F.all_to_all_single(x, [4], [4], name)),
                "broadcast": wait(F.broadcast(x, 0, name)), "all_reduce_ (in place)": t}

    eager_out = {k: v.cpu() for k, v in eager(x0.to(dev), i0.to(dev)).items()}
    compiled_fn = torch.compile(functional, backend="openxla", fullgraph=True)
    with xla.static_split_bound(4):
        compiled_out = {k: v.cpu() for k, v in compiled_fn(x0.to(dev), i0.to(dev)).items()}
    agree = {k: torch.equal(eager_out[k], compiled_out[k]) for k in eager_out}
    width = max(len(k) for k in eager_out)
    print(f"  {'call (world 1, executed)':<{width}}  {'eager dist.*':<28} compiled (openxla) agrees")
    for k in eager_out:
        print(f"  {k:<{width}}  {str(eager_out[k].tolist()):<28} {'yes' if agree[k] else 'NO'}")
    dist.destroy_process_group()
    return all(agree.values())


def virtual_hlo() -> dict:
    """Rank 1 of a virtual 4-rank funcoll world (HashStore, nothing executed): {call: HLO lines}. Run in a fresh
    process (:func:`xla_main` spawns one): this one may have a process group already."""
    import torch.distributed as dist
    import torch_xla
    from torch.distributed.device_mesh import init_device_mesh

    import funcoll
    from funcoll import testing, xla

    dist.init_process_group("funcoll", store=dist.HashStore(), rank=1, world_size=4)
    funcoll.install(["xla"])
    dev = torch_xla.device()
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    funcoll.groups.register_mesh(mesh)
    lone = dist.new_group([1, 2, 3])
    out = {}

    def show(name, fn, keep=None):
        xla.reset_token()
        out[name] = testing.xla_collectives(fn(), keep)
        xla.reset_token()

    def ar(group=None, op=dist.ReduceOp.SUM):
        t = torch.ones(4, device=dev)
        dist.all_reduce(t, op=op, group=group)
        return t

    def a2a():
        received = torch.empty(5, device=dev)
        with xla.static_split_bound(2):
            dist.all_to_all_single(received, torch.arange(6.0).to(dev), [1, 2, 1, 1], [2, 1, 2, 1])
        return received

    show("all_reduce, world", ar)
    show("all_reduce, mesh dim dp", lambda: ar(mesh.get_group("dp")))
    show("all_reduce, mesh dim tp", lambda: ar(mesh.get_group("tp")))
    show("all_reduce, lone group [1,2,3]", lambda: ar(lone))
    show("all_reduce AVG", lambda: ar(op=dist.ReduceOp.AVG), testing.COLLECTIVE_OPCODES + ("divide",))
    show("all_to_all_single uneven (bound 2)", a2a)
    dist.destroy_process_group()
    return out


def xla_main() -> int:
    """The XLA part: world 1 executed, eager vs compiled; the HLO of a virtual 4-rank job."""
    t0 = time.monotonic()
    os.environ.setdefault("PJRT_DEVICE", "CPU")
    ok = _xla_world1()
    print(f"  eager == compiled on every call: {ok}")
    with mp.get_context("spawn").Pool(1) as pool:  # leaving the block terminates the process
        hlo = pool.apply_async(virtual_hlo).get(timeout=180)
    print("\n  the HLO rank 1 of a virtual 4-rank job would compile (mesh 2x2 registered; nothing executed):")
    for name, text in hlo.items():
        print(f"  - {name}:")
        for line in text.splitlines():
            print(f"      {line if len(line) <= 140 else line[:137] + '...'}")
    print(f"  ({time.monotonic() - t0:.1f}s)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
