"""The CPU parts of ``./dev bench``: funcoll against the raw path in the same processes, alternating blocks.

* eager, world 1 and 2: per-call cost of ``dist.*`` on a funcoll group vs a plain gloo group (``new_group(backend=
  "gloo")``), 4 B to 1 MiB, blocking; the async issue time (until ``async_op=True`` returns);
* compiled, world 1: one step of 10 small functional all_reduces, funcoll's CPU kernels vs upstream's;
* gap-filling, world 2, 16 MiB, under the xccl profile: BXOR / integer MAX / bool any, AVG bf16 and an uneven
  all_to_all (splits 10:1) vs the native op, with the peak extra memory each needs (from torch.profiler's memory
  events) and the bytes each rank sends.

Every case alternates a block of the raw side and a block of funcoll's; a ratio is taken per block pair, and the
median ratio is reported with the spread (25th-75th percentile) of those ratios.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import tempfile
import time

import torch

BLOCK = 20  # calls per timed block


def progress(msg: str) -> None:
    print(f"[bench] {msg}", file=sys.stderr, flush=True)


def _block(fn, k) -> float:
    t0 = time.perf_counter()
    for _ in range(k):
        fn()
    return (time.perf_counter() - t0) / k


def paired(raw, ours, blocks: int, k: int = BLOCK) -> dict:
    """Alternating blocks of ``k`` calls; per-call medians and the median (and quartiles) of the per-block ratios."""
    raw()
    ours()  # warm up: connections, caches, buffers
    tr, to, ratios = [], [], []
    for i in range(blocks):
        if i % 2:  # alternate which side goes first
            b = _block(raw, k)
            o = _block(ours, k)
        else:
            o = _block(ours, k)
            b = _block(raw, k)
        tr.append(b)
        to.append(o)
        ratios.append(o / b)
    q = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else [ratios[0]] * 3
    return {"raw_us": statistics.median(tr) * 1e6, "funcoll_us": statistics.median(to) * 1e6,
            "ratio": statistics.median(ratios), "q1": q[0], "q3": q[2]}


SIZES = [4, 64, 1 << 10, 16 << 10, 256 << 10, 1 << 20]


def _label(nbytes: int) -> str:
    return f"{nbytes >> 20} MiB" if nbytes >= 1 << 20 else f"{nbytes >> 10} KiB" if nbytes >= 1 << 10 else f"{nbytes} B"


def eager(rank: int, n: int, blocks: int) -> list:
    import torch.distributed as dist

    torch.set_num_threads(1)
    raw = dist.new_group(backend="gloo")
    ours = dist.group.WORLD
    rows = []

    def ar(group, numel):
        t = torch.ones(numel)
        return lambda: dist.all_reduce(t, group=group)

    for nbytes in SIZES:
        if rank == 0:
            progress(f"world {n}: all_reduce {_label(nbytes)}")
        r = paired(ar(raw, max(1, nbytes // 4)), ar(ours, max(1, nbytes // 4)), blocks)
        rows.append({"case": f"all_reduce {_label(nbytes)}", "bytes": nbytes, "world": n, **r})

    numel = 256  # 1 KiB of f32 per rank
    inp, big = torch.ones(numel), torch.ones(numel * n)

    def ag(group):
        out = torch.empty(numel * n)
        return lambda: dist.all_gather_into_tensor(out, inp, group=group)

    def rs(group):
        out = torch.empty(numel)
        return lambda: dist.reduce_scatter_tensor(out, big, group=group)

    def a2a(group):
        out = torch.empty(numel * n)
        return lambda: dist.all_to_all_single(out, big, group=group)

    def bc(group):
        t = torch.ones(numel)
        return lambda: dist.broadcast(t, src=0, group=group)

    def issue(group):
        t = torch.ones(1)
        works = []

        def fn():
            works.append(dist.all_reduce(t, group=group, async_op=True))
            if len(works) >= BLOCK:  # keep the queue short: waiting is not timed in this block
                for w in works:
                    w.wait()
                works.clear()
        return fn

    for name, make in (("all_gather_into_tensor 1 KiB", ag), ("reduce_scatter_tensor 1 KiB", rs),
                       ("all_to_all_single 1 KiB", a2a), ("broadcast 1 KiB", bc), ("async issue 4 B", issue)):
        if rank == 0:
            progress(f"world {n}: {name}")
        rows.append({"case": name, "bytes": 1024, "world": n, **paired(make(raw), make(ours), blocks)})
    dist.barrier()
    return rows


def compiled(rank: int, n: int, blocks: int) -> list:
    """One compiled step of 10 small all_reduces (aot_eager), with funcoll's CPU kernels vs upstream's."""
    import torch.distributed as dist
    import torch.distributed._functional_collectives as fc

    import funcoll

    torch.set_num_threads(1)
    g = dist.group.WORLD

    def step(x):
        for _ in range(10):
            x = fc.wait_tensor(fc.all_reduce(x, "sum", g)) * 0.5
        return x

    f = torch.compile(step, backend="aot_eager", fullgraph=True)
    x = torch.ones(64)

    # toggling the kernels is a registry update: time the step alone by toggling outside the timed calls
    funcoll.install(["cpu"])
    f(x)
    funcoll.uninstall(["cpu"])
    f(x)
    tu, to, ratios = [], [], []
    for _ in range(blocks):
        funcoll.uninstall(["cpu"])
        b = _block(lambda: f(x), BLOCK)
        funcoll.install(["cpu"])
        o = _block(lambda: f(x), BLOCK)
        tu.append(b)
        to.append(o)
        ratios.append(o / b)
    funcoll.uninstall(["cpu"])
    q = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else [ratios[0]] * 3
    return [{"case": "compiled step, 10 all_reduce 256 B", "bytes": 256, "world": n,
             "raw_us": statistics.median(tu) * 1e6, "funcoll_us": statistics.median(to) * 1e6,
             "ratio": statistics.median(ratios), "q1": q[0], "q3": q[2]}]


def _peak_extra(fn) -> int:
    """Peak bytes allocated while ``fn`` runs, above what was allocated when it started (torch.profiler's CPU
    memory events)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    path = tempfile.mktemp(suffix=".json")
    prof.export_chrome_trace(path)
    try:
        events = json.load(open(path))["traceEvents"]
    finally:
        os.unlink(path)
    totals = [e["args"]["Total Allocated"] for e in events if e.get("name") == "[memory]"
              and "Total Allocated" in e.get("args", {})]
    if not totals:
        return 0
    # the first event's total minus its own allocation is what was live before
    first = next(e for e in events if e.get("name") == "[memory]" and "Total Allocated" in e.get("args", {}))
    base = first["args"]["Total Allocated"] - first["args"].get("Bytes", 0)
    return max(totals) - base


def gaps(rank: int, n: int, blocks: int) -> list:
    """16 MiB per rank, the xccl profile's strategies vs the native op on the same gloo transport."""
    import torch.distributed as dist

    import funcoll

    torch.set_num_threads(1)
    R = dist.ReduceOp
    native = dist.group.WORLD
    xccl = dist.new_group(backend="funcoll", pg_options=funcoll.Options(profile="xccl"))
    numel = 4 << 20  # 16 MiB of 4-byte elements
    rows = []

    def ar(group, dtype, op, k=numel):
        t = torch.ones(k, dtype=dtype) if dtype != torch.bool else torch.ones(k, dtype=torch.bool)
        return lambda: dist.all_reduce(t, op=op, group=group)

    cases = [
        ("BXOR 16 MiB i32", ar(native, torch.int32, R.BXOR), ar(xccl, torch.int32, R.BXOR), 4 * numel),
        ("MAX 16 MiB i32", ar(native, torch.int32, R.MAX), ar(xccl, torch.int32, R.MAX), 4 * numel),
        ("any (MAX) 16 MiB bool", ar(native, torch.bool, R.MAX, 16 << 20), ar(xccl, torch.bool, R.MAX, 16 << 20),
         16 << 20),
        ("AVG 16 MiB bf16", ar(native, torch.bfloat16, R.AVG, 8 << 20), ar(xccl, torch.bfloat16, R.AVG, 8 << 20),
         16 << 20),
    ]
    # uneven all_to_all, 10:1: rank 0 keeps 1 part and sends 10 to rank 1, rank 1 keeps 1 and sends 1 to rank 0
    part = (16 << 20) // 4 // 11
    S = [[part, 10 * part], [part, part]]  # S[i][j]: rows rank i sends to rank j
    ins = S[rank]
    outs = [S[i][rank] for i in range(n)]
    inp = torch.ones(sum(ins))
    out = torch.empty(sum(outs))

    def a2a(group):
        return lambda: dist.all_to_all_single(out, inp, outs, ins, group=group)

    cases.append(("uneven all_to_all 16 MiB, 10:1", a2a(native), a2a(xccl), 4 * 11 * part))
    for name, raw, ours, nbytes in cases:
        if rank == 0:
            progress(f"world {n}: {name}")
        r = paired(raw, ours, blocks, k=1)
        dist.barrier()
        peak = _peak_extra(ours)
        dist.barrier()
        rows.append({"case": name, "bytes": nbytes, "world": n, **r, "peak_extra": peak / nbytes})
    # bytes the world sends for the uneven all_to_all: ideal (alltoallv: every off-diagonal split once) vs the
    # strategy (padding: every rank sends n-1 chunks of the largest split, plus the agreement of 2 int64 per rank)
    with funcoll.record() as log:
        a2a(xccl)()
    strategy = log[-1][1][-1]
    ideal = 4 * sum(S[i][j] for i in range(n) for j in range(n) if i != j)
    if strategy.startswith("uneven all_to_all=pad to"):
        chunk = max(max(row) for row in S)
        sent = 4 * n * (n - 1) * chunk + 8 * 2 * n * (n - 1)
    else:
        sent = ideal
    rows[-1]["bytes_sent_ratio"] = sent / ideal
    rows[-1]["strategy"] = strategy
    return rows


def rank_main(rank: int, n: int, blocks: int, parts=("eager", "compiled", "gaps")) -> list:
    out = []
    if "eager" in parts:
        out += eager(rank, n, blocks)
    if "compiled" in parts and n == 1:
        out += compiled(rank, n, blocks)
    if "gaps" in parts and n == 2:
        out += gaps(rank, n, max(3, blocks // 4))
    return out
