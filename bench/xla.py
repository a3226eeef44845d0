"""XLA part of ``./dev bench``: the same compiled step through torch_xla 2.9's own ``_c10d_functional`` kernels and
through funcoll's, on the CPU PJRT device (one replica), alternating. Reports compile time (first call, median of
fresh compiles), steady-state step time (median), and the op counts of the HLO each produces: what funcoll's
lowering costs where torch_xla has the op natively (SUM, all-gather), and what the filled ops cost (AVG, BXOR).

Run alone: ``./dev python -m bench.xla``. One replica only (multi-device CPU collectives are not supported), so
these are lowering and compile costs, not TPU interconnect numbers.
"""

from __future__ import annotations

import statistics
import sys
import time

import torch


def _hlo_ops(tensors) -> dict:
    import re

    import torch_xla

    from funcoll import testing

    hlo = torch_xla._XLAC._get_xla_tensors_hlo(list(tensors))
    entry = hlo[hlo.index("\nENTRY"):].split("\n}")[0]
    ops = [line for line in entry.splitlines()[1:] if re.match(r"\s*(?:ROOT )?%[\w.\-]+ = ", line)]
    coll = testing.hlo_lines(hlo, ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute"))
    return {"instructions": len(ops), "collectives": len(coll)}


def _run(fn, args, reps):
    import torch_xla

    def once():
        out = fn(*args)
        torch_xla.sync()
        torch_xla._XLAC._xla_wait_device_ops([])
        return out

    torch._dynamo.reset()
    t0 = time.perf_counter()
    once()  # trace + XLA compile
    first = time.perf_counter() - t0
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        once()
        times.append(time.perf_counter() - t0)
    return first, statistics.median(times)


def main(reps: int = 20) -> list:
    import torch.distributed as dist
    import torch.distributed._functional_collectives as fc
    import torch_xla

    import funcoll

    if not dist.is_initialized():
        dist.init_process_group("funcoll", store=dist.HashStore(), rank=0, world_size=1)
    g = dist.group.WORLD
    dev = torch_xla.device()
    x = torch.randn(1 << 18, device=dev)
    i = torch.arange(1 << 16, dtype=torch.int32, device=dev)

    def step_sum(x):
        return fc.wait_tensor(fc.all_reduce(x * 2, "sum", g)) + 1

    def step_gather(x):
        return fc.wait_tensor(fc.all_gather_tensor(x * 2, 0, g)) + 1

    def step_avg(x):
        return fc.wait_tensor(fc.all_reduce(x * 2, "avg", g)) + 1

    def step_bxor(i):
        return fc.wait_tensor(fc.all_reduce(i ^ 3, "bxor", g)) + 1

    cases = [("all_reduce sum 1 MiB f32", step_sum, (x,), True),
             ("all_gather 1 MiB f32", step_gather, (x,), True),
             ("all_reduce avg 1 MiB f32", step_avg, (x,), False),
             ("all_reduce bxor 256 KiB i32", step_bxor, (i,), False)]
    rows = []
    for name, fn, args, native in cases:
        res = {}
        order = (("torch_xla", False), ("funcoll", True)) if native else (("funcoll", True),)
        for _ in range(3):  # alternate, keep the median of fresh compiles
            for who, inst in order:
                funcoll.install(["xla"]) if inst else funcoll.uninstall(["xla"])
                cf = torch.compile(fn, backend="openxla", fullgraph=True)
                first, step = _run(cf, args, reps)
                res.setdefault(who, []).append((first, step))
        counts = {}
        for who, inst in order:
            funcoll.install(["xla"]) if inst else funcoll.uninstall(["xla"])
            # the lazy (eager-mode) HLO of the same step: what each kernel builds
            counts[who] = _hlo_ops([fn(*args)])
            torch_xla.sync()
        summary = {who: (statistics.median(v[0] for v in vals), statistics.median(v[1] for v in vals), counts[who])
                   for who, vals in res.items()}
        rows.append((name, summary))
    funcoll.uninstall(["xla"])
    return rows


def report(rows) -> None:
    print("XLA (CPU PJRT, 1 replica): the same torch.compile(openxla) step, torch_xla's kernels vs funcoll's")
    print(f"{'case':<28} {'kernels':<10} {'compile ms':>10} {'step us':>9} {'HLO instr':>9} {'collectives':>11}"
          f" {'step ratio':>10}")
    for name, summary in rows:
        base = summary.get("torch_xla")
        for who, (first, step, counts) in summary.items():
            ratio = f"{step / base[1]:.2f}" if base and who == "funcoll" else ("1.00" if who == "torch_xla" else "-")
            print(f"{name:<28} {who:<10} {first * 1e3:>10.0f} {step * 1e6:>9.0f} {counts['instructions']:>9}"
                  f" {counts['collectives']:>11} {ratio:>10}")
        if base is None:
            print(f"{'':<28} {'torch_xla':<10} {'raises (not lowered)':>30}")


def build_cost(world: int, blocks: int = 10) -> dict:
    """Building one functional all_reduce (nothing runs) on rank 0 of a virtual funcoll world of ``world`` ranks:
    funcoll's XLA kernel vs torch_xla's own, alternating blocks of 50 builds, each side with its kernels installed.
    torch_xla's kernel ignores the group (always the whole world); funcoll's spells the replica groups out."""
    import torch.distributed as dist
    import torch_xla

    import funcoll
    from bench.overhead import _block
    from funcoll import xla

    dist.init_process_group("funcoll", store=dist.HashStore(), rank=0, world_size=world)
    name = dist.group.WORLD.group_name
    x = torch.ones(256, device=torch_xla.device())
    op = torch.ops._c10d_functional.all_reduce

    def build():
        xla.reset_token()  # no chaining: every build is the same size
        op(x, "sum", name)

    tr, to, ratios = [], [], []
    for _ in range(blocks):
        funcoll.uninstall(["xla"])
        b = _block(build, 50)[0]
        funcoll.install(["xla"])
        o = _block(build, 50)[0]
        tr.append(b)
        to.append(o)
        ratios.append(o / b)
    funcoll.uninstall(["xla"])
    q = statistics.quantiles(ratios, n=4)
    return {"case": f"XLA build all_reduce, world {world}", "bytes": 1024, "world": world,
            "raw_us": statistics.median(tr) * 1e6, "funcoll_us": statistics.median(to) * 1e6,
            "ratio": statistics.median(ratios), "q1": q[0], "q3": q[2]}


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "build":
        import json

        print("BUILD " + json.dumps(build_cost(int(sys.argv[2]), int(sys.argv[3]) if len(sys.argv) > 3 else 10)))
    else:
        report(main(int(sys.argv[1]) if len(sys.argv) > 1 else 20))
