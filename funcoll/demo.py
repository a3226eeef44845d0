"""funcoll's demo (``./dev demo``): a 2-rank CPU world over gloo runs a few collectives and one training step of
a tiny model whose gradients are averaged through funcoll, eager and compiled, once natively and once under
``FUNCOLL_PROFILE=xccl`` (where XCCL's gaps are filled by funcoll's strategies). It prints which strategy each
call used and whether the results agree; then, when torch_xla is installed, the XLA part (world 1 on the CPU
PJRT device, and the HLO a virtual 4-rank job would compile).
"""

from __future__ import annotations

import sys
import time

import torch

WORLD = 2


def _calls(rank, n):
    import torch.distributed as dist

    R = dist.ReduceOp
    out = {}

    def t(vals, dtype=torch.float32):
        return torch.tensor(vals, dtype=dtype)

    x = t([1.0 + rank, 2.0, -3.0 * rank])
    dist.all_reduce(x, op=R.AVG)
    out["all_reduce avg f32"] = x
    x = t([5 + rank, 12, 7 * rank], torch.int32)
    dist.all_reduce(x, op=R.BXOR)
    out["all_reduce bxor i32"] = x
    x = t([-5 + rank, 12, 7 * rank], torch.int32)
    dist.all_reduce(x, op=R.MAX)
    out["all_reduce max i32"] = x
    x = t([0.5 * rank, 1.0, 2.0])
    dist.all_reduce(x, op=dist._make_nccl_premul_sum(0.25))
    out["all_reduce premul_sum"] = x
    x = t([1, 2, 3, 4], torch.int16) * (rank + 1)
    dist.all_reduce(x)
    out["all_reduce sum i16"] = x
    inp = torch.arange(4, dtype=torch.bfloat16) + rank
    o = torch.empty(2, dtype=torch.bfloat16)
    dist.reduce_scatter_tensor(o, inp, op=R.AVG)
    out["reduce_scatter avg bf16"] = o
    ins = [1, 2] if rank == 0 else [3, 0]
    outs = [1, 3] if rank == 0 else [2, 0]
    inp = torch.arange(float(sum(ins))) + 10 * rank
    o = torch.empty(sum(outs))
    dist.all_to_all_single(o, inp, outs, ins)
    out["all_to_all uneven"] = o
    x = t([float(rank)] * 3)
    dist.broadcast(x, src=1)
    out["broadcast src=1"] = x
    return out


def _train(rank, n, compiled):
    import torch.distributed as dist
    import torch.distributed._functional_collectives as fc

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
    g = torch.Generator().manual_seed(100 + rank)
    data, target = torch.randn(16, 4, generator=g), torch.randn(16, 1, generator=g)
    loss = torch.nn.functional.mse_loss(model(data), target)
    loss.backward()
    grads = [p.grad for p in model.parameters()]
    if compiled:
        def avg(gs):
            return [fc.all_reduce(x, "avg", dist.group.WORLD) for x in gs]

        avg = torch.compile(avg, fullgraph=True, backend="aot_eager")
        new = [fc.wait_tensor(x) for x in avg(grads)]
        for p, x in zip(model.parameters(), new):
            p.grad.copy_(x)
    else:
        for x in grads:
            dist.all_reduce(x, op=dist.ReduceOp.AVG)
    with torch.no_grad():
        for p in model.parameters():
            p -= 0.1 * p.grad
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def rank_main(rank, n):
    """Runs on every rank of the demo world; returns (results, strategies) from this rank."""
    import funcoll

    results, strategies = {}, {}
    with funcoll.record() as log:
        results.update(_calls(rank, n))
    for name, (_, notes) in zip(list(results), log):  # one top-level collective per call
        strategies[name] = "; ".join(notes)
    for compiled in (False, True):
        name = f"train step ({'compiled' if compiled else 'eager'})"
        with funcoll.record() as log:
            results[name] = _train(rank, n, compiled)
        strategies[name] = "; ".join(sorted({s for _, notes in log for s in notes}))
    return results, strategies


def _cell(v: torch.Tensor) -> str:
    if v.numel() > 4:
        return f"[{v.numel()} params, sum {float(v.double().sum()):.6f}]"
    return str(v.tolist())


def main(argv=None) -> int:
    from funcoll.launch import run_world

    t0 = time.monotonic()
    print(f"funcoll demo: {WORLD} CPU ranks over gloo, torch {torch.__version__}\n")
    runs = {}
    for profile in (None, "xccl"):
        per_rank = run_world("funcoll.demo:rank_main", WORLD, profile, timeout=240)
        runs[profile] = per_rank
    native, xccl = runs[None][0], runs["xccl"][0]
    names = list(native[0])
    w = max(len(n) for n in names)
    print(f"{'call':<{w}}  {'result (rank 0)':<34} {'agree':<6} strategy native gloo | strategy FUNCOLL_PROFILE=xccl")
    print("-" * (w + 110))
    all_agree = True
    for name in names:
        a = native[0][name]
        agree = True
        for r in range(WORLD):  # the same rank's result, native vs xccl profile
            x, y = runs[None][r][0][name], runs["xccl"][r][0][name]
            agree &= torch.equal(x, y) if not x.is_floating_point() else torch.allclose(
                x.double(), y.double(), rtol=1e-6, atol=1e-6)
        all_agree &= agree
        print(f"{name:<{w}}  {_cell(a):<34} {'yes' if agree else 'NO':<6} {native[1][name]} | {xccl[1][name]}")
    eager_vs_compiled = torch.equal(native[0]["train step (eager)"], native[0]["train step (compiled)"])
    print(f"\neager == compiled training step (bit-identical): {eager_vs_compiled}")
    print(f"native == xccl profile on every call: {all_agree}   ({time.monotonic() - t0:.1f}s)")
    ok = all_agree and eager_vs_compiled
    try:
        import torch_xla  # noqa: F401
    except ImportError:
        print("\n(torch_xla is not installed: skipping the XLA part)")
        return 0 if ok else 1
    try:
        from funcoll import demo_xla
    except ImportError:
        print("\n(funcoll.demo_xla is not available: skipping the XLA part)")
        return 0 if ok else 1
    print("\n== XLA (PJRT_DEVICE=CPU) ==")
    rc = demo_xla.main()
    return 0 if ok and not rc else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
