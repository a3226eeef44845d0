"""The CPU parts of ``./dev bench``: funcoll against the raw path in the same processes, alternating blocks.

* eager, world 1 and 2: per-call cost of ``dist.*`` (all_reduce, all_gather_into_tensor, reduce_scatter_tensor,
  all_to_all_single, broadcast, the list forms all_gather and reduce_scatter, barrier, and at world 2 a send/recv round
  trip) on a funcoll group vs c10d's stock path over the same gloo backend (:func:`stock_group`), 4 B to 1 MiB,
  blocking, with one "pooled" row per op (the median of all its per-block ratios and differences over the sizes); the
  async issue time of all_reduce (until ``async_op=True`` returns; the waits are not timed); at world 1, the floor of
  any Python process group (a method that only forwards ``allreduce`` to gloo, "forward only"). World 1 runs pinned to
  one CPU (rows marked "(1 CPU)"; ``FUNCOLL_BENCH_PIN=0`` to keep the machine's scheduling): see ``_pin_process``;
* funcoll's optional per-call machinery, all_reduce 4 B against the same raw gloo group: both sides under
  torch.profiler (funcoll's profiler ranges), inside ``funcoll.record()``, and at world 2 a group with the size guard
  on, one in debug mode (the cross-rank check) and one with the flight recorder off;
* compiled, world 1: one step of 10 small functional all_reduces, funcoll's CPU kernels vs upstream's;
* gap-filling, world 2, 16 MiB, under the xccl profile: BXOR / integer MAX / bool any, AVG bf16 and an uneven
  all_to_all (splits 10:1) vs the native op, with the peak extra memory each needs (from torch.profiler's memory
  events; the worst of 3 calls) and the bytes each rank sends.

Every case alternates a block of the raw side and a block of funcoll's; a ratio and a difference (µs per call) are
taken per block pair, and the median ratio is reported with the spread (25th-75th percentile) of those ratios, the
median difference with its own (the table's ``extra`` column: ``+Δ us [25%..75%]``).
"""

from __future__ import annotations

import json
import math
import os
import statistics
import sys
import tempfile
import time

import torch

BLOCK = 20  # calls per timed block


def progress(msg: str) -> None:
    print(f"[bench] {msg}", file=sys.stderr, flush=True)


def _block(fn, k) -> tuple:
    """``(wall, cpu)`` seconds per call of ``fn`` over ``k`` calls: the wall clock, and the CPU time of the calling
    thread (what the caller's own code costs, without the time it sleeps waiting for the peers and gloo's threads)."""
    c0, t0 = time.thread_time(), time.perf_counter()
    for _ in range(k):
        fn()
    t1, c1 = time.perf_counter(), time.thread_time()
    return (t1 - t0) / k, (c1 - c0) / k


def _quartiles(xs) -> list:
    return statistics.quantiles(xs, n=4) if len(xs) > 1 else [xs[0]] * 3


def median_ci(xs) -> tuple:
    """A 95% confidence interval of the median of ``xs`` (distribution-free: the order statistics n/2 -+ 0.98
    sqrt(n)); the whole range below 6 values."""
    s, n = sorted(xs), len(xs)
    if n < 6:
        return s[0], s[-1]
    half = 0.98 * math.sqrt(n)
    return s[max(0, math.floor(n / 2 - half) - 1)], s[min(n - 1, math.ceil(n / 2 + half) - 1)]


def _summary(tr, to, ratios, cpu=None) -> dict:
    """Per-call medians of each side, the median of the per-block ratios with its quartiles, and the median of the
    per-block differences (funcoll - raw, µs per call: ``delta_us``) with its quartiles; with ``cpu`` (per-block
    differences of the calling thread's CPU time per call, µs), their median ``cpu_delta_us``."""
    q = _quartiles(ratios)
    deltas = [(o - b) * 1e6 for o, b in zip(to, tr)]
    d = _quartiles(deltas)
    lo, hi = median_ci(ratios)
    out = {"raw_us": statistics.median(tr) * 1e6, "funcoll_us": statistics.median(to) * 1e6,
           "ratio": statistics.median(ratios), "q1": q[0], "q3": q[2], "ratios": ratios, "m_lo": lo, "m_hi": hi,
           "delta_us": statistics.median(deltas), "d1": d[0], "d3": d[2], "deltas": deltas}
    if cpu:
        out["cpu_delta_us"], out["cpu_deltas"] = statistics.median(cpu), cpu
    return out


def paired(raw, ours, blocks: int, k: int = BLOCK, timed=_block) -> dict:
    """Alternating blocks of ``k`` calls; per-call medians and the median (and quartiles) of the per-block ratios."""
    raw()
    ours()  # warm up: connections, caches, buffers
    tr, to, ratios, cpu = [], [], [], []
    for i in range(blocks):
        if i % 2:  # alternate which side goes first
            b = timed(raw, k)
            o = timed(ours, k)
        else:
            o = timed(ours, k)
            b = timed(raw, k)
        if isinstance(b, tuple):  # (wall, cpu)
            cpu.append((o[1] - b[1]) * 1e6)
            b, o = b[0], o[0]
        tr.append(b)
        to.append(o)
        ratios.append(o / b)
    return _summary(tr, to, ratios, cpu)


def pooled(case: str, rows: list, n: int) -> dict:
    """One row over several sizes: the median (and quartiles) of all their per-block ratios."""
    ratios = [x for r in rows for x in r["ratios"]]
    deltas = [x for r in rows for x in r["deltas"]]
    cpu = [x for r in rows for x in r.get("cpu_deltas", ())]
    q, d = _quartiles(ratios), _quartiles(deltas)
    out = {"case": case, "bytes": 0, "world": n, "raw_us": statistics.median(r["raw_us"] for r in rows),
           "funcoll_us": statistics.median(r["funcoll_us"] for r in rows), "ratio": statistics.median(ratios),
           "q1": q[0], "q3": q[2], "delta_us": statistics.median(deltas), "d1": d[0], "d3": d[2]}
    if cpu:
        out["cpu_delta_us"] = statistics.median(cpu)
    return out


SIZES = [4, 64, 1 << 10, 16 << 10, 256 << 10, 1 << 20]
OTHER_SIZES = [4, 1 << 10, 64 << 10, 1 << 20]  # all_gather, reduce_scatter, all_to_all, broadcast (bytes per rank)


def _label(nbytes: int) -> str:
    return f"{nbytes >> 20} MiB" if nbytes >= 1 << 20 else f"{nbytes >> 10} KiB" if nbytes >= 1 << 10 else f"{nbytes} B"


def _issue_block(fn, k) -> tuple:
    """``fn()`` issues one async collective and returns its Work: the time until the calls return, per call; the
    waits come after, untimed."""
    works = []
    c0, t0 = time.thread_time(), time.perf_counter()
    for _ in range(k):
        works.append(fn())
    dt, dc = time.perf_counter() - t0, time.thread_time() - c0
    for w in works:
        w.wait()
    return dt / k, dc / k


def _pin_process(cpu: int):
    """Pins every thread of this process (the caller's and the gloo backends' workers) to one CPU; returns the previous
    affinity of each, to restore. On world 1 the blocking call of each side is a hand-off between this thread and a
    gloo worker thread: on 2 shared vCPUs, whether the worker wakes on the other vCPU (tens of µs, varying per backend
    instance and over time) decides the ratio more than the software does. On one CPU both sides pay the same
    hand-off, and the ratio is the software's. ``FUNCOLL_BENCH_PIN=0`` keeps the machine's scheduling."""
    old = {}
    if os.environ.get("FUNCOLL_BENCH_PIN", "1") == "0" or not hasattr(os, "sched_setaffinity"):
        return old
    for tid in os.listdir("/proc/self/task"):
        try:
            old[int(tid)] = os.sched_getaffinity(int(tid))
            os.sched_setaffinity(int(tid), {cpu})
        except OSError:
            pass
    return old


def _unpin(old) -> None:
    for tid, cpus in old.items():
        try:
            os.sched_setaffinity(tid, cpus)
        except OSError:
            pass


def eager(rank: int, n: int, blocks: int) -> list:
    if n != 1:
        return _eager(rank, n, blocks)
    old = _pin_process(0)
    try:
        return _eager(rank, n, blocks, pinned=bool(old))
    finally:
        _unpin(old)


def _forward_only(group):
    """The ``allreduce`` of a Python ProcessGroup that only forwards to the group's gloo backend and waits: what any
    Python process group pays at least (it skips c10d's dispatcher, so it can cost less than the stock path). The
    bench's "forward only" row, measured against the same raw gloo group as funcoll's rows."""
    backend = group.transport("cpu").backend

    def allreduce(tensors, opts):
        work = backend.allreduce(tensors, opts)
        work.wait()
        return work

    return allreduce


_FORWARDED = ("allreduce", "_allgather_base", "all_gather_single", "_reduce_scatter_base", "reduce_scatter_single",
              "alltoall_base", "all_to_all_single", "broadcast", "allgather", "reduce_scatter", "gather", "scatter",
              "barrier", "send", "recv")


def _forwarding(group) -> dict:
    """Methods of a Python ProcessGroup that only hand the call to the group's gloo backend: the floor of any Python
    process group per op (c10d waits on the Work it gets, as on the stock path)."""
    backend = group.transport("cpu").backend
    out = {}
    for name in _FORWARDED:
        method = getattr(backend, name, None)
        if method is not None:
            out[name] = (lambda m: lambda *a, **k: m(*a, **k))(method)
    return out


def _with_methods(group, methods: dict, fn):
    """``fn``, to be timed (:func:`_block_with`) with ``methods`` set on this ``group`` instance only."""

    def run():
        return fn()

    run.methods = (group, methods)  # type: ignore[attr-defined]
    return run


def _block_with(fn, k) -> tuple:
    """:func:`_block`, with the methods of :func:`_with_methods` set around the whole block, not timed."""
    group, methods = getattr(fn, "methods", (None, {}))
    if group is not None:
        group.__dict__.update(methods)
    try:
        return _block(fn, k)
    finally:
        for name in methods:
            group.__dict__.pop(name, None)


def stock_group(ours):
    """A stock c10d ProcessGroup over the very gloo backend funcoll's group ``ours`` uses, registered with c10d like
    any group of the world's ranks: the raw side of the per-op rows. Two gloo backends of the same ranks can differ by
    far more than funcoll's cost (their TCP pairs wake up differently: a one-way stream of 4 B sends measured 0.2 ms
    per send on one and 1.5 ms on the other, in the same processes), so the rows compare c10d's own path and
    funcoll's over the same pairs. None where this torch's ProcessGroup cannot be built so (the bench then uses
    ``new_group(backend="gloo")``)."""
    import torch.distributed as dist
    from torch.distributed import distributed_c10d as c10d

    backend = ours.transport("cpu").backend
    try:
        pg = c10d.ProcessGroup(c10d.PrefixStore("funcoll-bench-stock", c10d._get_default_store()), backend.rank(),
                               backend.size())
        pg._register_backend(torch.device("cpu"), c10d.ProcessGroup.BackendType.GLOO, backend)
        pg._set_default_backend(c10d.ProcessGroup.BackendType.GLOO)
        pg._set_group_name("funcoll-bench-stock")  # resolvable by name, as DeviceMesh.from_group needs
        c10d._register_process_group("funcoll-bench-stock", pg)
        world = c10d._world
        world.pg_group_ranks[pg] = {dist.get_global_rank(ours, r): r for r in range(backend.size())}
        world.pg_map[pg] = ("gloo", None)
        world.pg_names[pg] = "funcoll-bench-stock"
        world.pg_backend_config[pg] = "cpu:gloo"
        dist.barrier(group=pg)
    except (AttributeError, TypeError, RuntimeError, ValueError) as e:
        progress(f"no stock group over funcoll's gloo backend ({e}): the raw side is a gloo group of its own")
        return None
    return pg


def forget_stock(pg) -> None:
    """c10d forgets a group made by :func:`stock_group` (nothing else, e.g. the profiler's group listing, meets it);
    any other group is left alone."""
    from torch.distributed import distributed_c10d as c10d

    if c10d._world.pg_names.get(pg) == "funcoll-bench-stock":
        c10d._unregister_process_group("funcoll-bench-stock")
        for table in (c10d._world.pg_group_ranks, c10d._world.pg_map, c10d._world.pg_names,
                      c10d._world.pg_backend_config):
            table.pop(pg, None)


def _eager(rank: int, n: int, blocks: int, pinned: bool = False) -> list:
    """Per-call cost of each native collective, funcoll group vs plain gloo group, 4 B to 1 MiB per rank (blocking),
    then one row per op pooling its sizes (what issue 11's target reads: the median of the paired ratios), and the
    async issue time of all_reduce (``async_op=True`` until it returns)."""
    import torch.distributed as dist

    torch.set_num_threads(1)
    raw = dist.new_group(backend="gloo")
    ours = dist.group.WORLD
    stock = stock_group(ours) or raw  # the per-op rows: c10d's path over funcoll's own gloo backend
    if pinned:  # the new group's worker threads too
        _pin_process(0)
    rows: list = []

    def ar(group, numel):
        t = torch.ones(numel)
        return lambda: dist.all_reduce(t, group=group)

    def ag(group, numel):
        inp, out = torch.ones(numel), torch.empty(numel * n)
        return lambda: dist.all_gather_into_tensor(out, inp, group=group)

    def rs(group, numel):
        big, out = torch.ones(numel * n), torch.empty(numel)
        return lambda: dist.reduce_scatter_tensor(out, big, group=group)

    def a2a(group, numel):
        inp, out = torch.ones(numel * n), torch.empty(numel * n)
        return lambda: dist.all_to_all_single(out, inp, group=group)

    def bc(group, numel):
        t = torch.ones(numel)
        return lambda: dist.broadcast(t, src=0, group=group)

    def agl(group, numel):  # dist.all_gather: the list form
        inp, outs = torch.ones(numel), [torch.empty(numel) for _ in range(n)]
        return lambda: dist.all_gather(outs, inp, group=group)

    def rsl(group, numel):  # dist.reduce_scatter: the list form
        ins, out = [torch.ones(numel) for _ in range(n)], torch.empty(numel)
        return lambda: dist.reduce_scatter(out, ins, group=group)

    def gat(group, numel):  # dist.gather to rank 0
        inp = torch.ones(numel)
        outs = [torch.empty(numel) for _ in range(n)] if dist.get_rank(group) == 0 else None
        return lambda: dist.gather(inp, outs, group_dst=0, group=group)

    def sca(group, numel):  # dist.scatter from rank 0
        out = torch.empty(numel)
        ins = [torch.ones(numel) for _ in range(n)] if dist.get_rank(group) == 0 else None
        return lambda: dist.scatter(out, ins, group_src=0, group=group)

    def bar(group, numel):
        return lambda: dist.barrier(group=group)

    def p2p(group, numel):  # one round trip: rank 0 sends then receives, rank 1 receives then sends
        t = torch.ones(numel)
        peer = dist.get_global_rank(group, 1 - dist.get_rank(group))

        def ping():
            dist.send(t, peer, group=group)
            dist.recv(t, peer, group=group)

        def pong():
            dist.recv(t, peer, group=group)
            dist.send(t, peer, group=group)

        return ping if dist.get_rank(group) == 0 else pong

    ops = [("all_reduce", ar, SIZES), ("all_gather_into_tensor", ag, OTHER_SIZES),
           ("reduce_scatter_tensor", rs, OTHER_SIZES), ("all_to_all_single", a2a, OTHER_SIZES),
           ("broadcast", bc, OTHER_SIZES), ("all_gather", agl, OTHER_SIZES), ("reduce_scatter", rsl, OTHER_SIZES),
           ("gather", gat, OTHER_SIZES), ("scatter", sca, OTHER_SIZES), ("barrier", bar, [0])]
    if n == 2:
        ops.append(("send/recv round trip", p2p, OTHER_SIZES))
    for name, make, sizes in ops:
        mine = []
        for nbytes in sizes:
            if rank == 0:
                progress(f"world {n}: {name} {_label(nbytes)}")
            numel = max(1, nbytes // 4)
            r = paired(make(stock, numel), make(ours, numel), blocks)
            label = f" {_label(nbytes)}" if nbytes else ""
            mine.append({"case": f"{name}{label}{' (1 CPU)' if pinned else ''}", "bytes": nbytes, "world": n, **r})
        rows += mine
        if len(mine) > 1:
            rows.append(pooled(f"pooled {name} {_label(sizes[0])}-{_label(sizes[-1])}"
                               f"{' (1 CPU)' if pinned else ''}", mine, n))
        if n > 1:  # the floor of any Python process group for this op: methods that only forward to gloo
            numel = max(1, sizes[0] // 4)
            fwd = _forwarding(ours)
            r = paired(make(stock, numel), _with_methods(ours, fwd, make(ours, numel)), blocks, timed=_block_with)
            rows.append({"case": f"{name}{f' {_label(sizes[0])}' if sizes[0] else ''}, forward only",
                         "bytes": sizes[0], "world": n, **r})

    if n == 1:  # the floor of any Python ProcessGroup, for reading the all_reduce rows
        if rank == 0:
            progress("world 1: all_reduce, forward only")
        floor = []
        ours.allreduce = _forward_only(ours)  # this instance only; removed right after
        try:
            for nbytes in (SIZES[0], SIZES[-1]):
                floor.append(paired(ar(raw, max(1, nbytes // 4)), ar(ours, max(1, nbytes // 4)), blocks))
        finally:
            del ours.allreduce
        rows.append(pooled(f"all_reduce {_label(SIZES[0])}-{_label(SIZES[-1])}, forward only"
                           f"{' (1 CPU)' if pinned else ''}", floor, n))

    def issue(group):
        t = torch.ones(1)
        return lambda: dist.all_reduce(t, group=group, async_op=True)

    if rank == 0:
        progress(f"world {n}: async issue")
    r = paired(issue(stock), issue(ours), blocks, timed=_issue_block)
    forget_stock(stock)
    rows.append({"case": f"async issue all_reduce 4 B{' (1 CPU)' if pinned else ''}", "bytes": 4, "world": n, **r})
    rows += modes(rank, n, blocks, raw, " (1 CPU)" if pinned else "")
    dist.barrier()
    for r in rows:
        for key in ("ratios", "deltas", "cpu_deltas"):
            r.pop(key, None)
    return rows


def _group(**env):
    """A new funcoll group made while the environment holds ``env`` (what a group reads when it is made and at its
    first collective); the environment is restored after."""
    import torch.distributed as dist

    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        g = dist.new_group(backend="funcoll")
        dist.barrier(group=g)
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    return g


def modes(rank: int, n: int, blocks: int, raw, suffix: str = "") -> list:
    """all_reduce 4 B with funcoll's optional per-call machinery on, against the raw gloo group ``raw``: a profiler
    recording (on both sides: what funcoll's ranges add), ``funcoll.record()`` (funcoll's strategy notes: the full
    path), and at world 2 the size guard, the debug mode's cross-rank check and the flight recorder off (each its
    own group, made with ``FUNCOLL_GUARD=1`` / ``FUNCOLL_DEBUG=1`` / ``FUNCOLL_TRACE_BUFFER_SIZE=0``)."""
    import torch.distributed as dist

    import funcoll

    t = torch.ones(1)

    def ar(group):
        return lambda: dist.all_reduce(t, group=group)

    rows = []

    def row(name, r):
        for key in ("ratios", "deltas", "cpu_deltas"):
            r.pop(key, None)
        rows.append({"case": f"all_reduce 4 B, {name}{suffix}", "bytes": 4, "world": n, **r})

    if rank == 0:
        progress(f"world {n}: all_reduce 4 B, profiler on / record()")
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]):
        row("profiler on", paired(ar(raw), ar(dist.group.WORLD), blocks))
    with funcoll.record():
        row("record()", paired(ar(raw), ar(dist.group.WORLD), blocks))
    if n > 1:
        for name, env in (("size guard", {"FUNCOLL_GUARD": "1"}), ("debug check", {"FUNCOLL_DEBUG": "1"}),
                          ("flight recorder off", {"FUNCOLL_TRACE_BUFFER_SIZE": "0"})):
            if rank == 0:
                progress(f"world {n}: all_reduce 4 B, {name}")
            row(name, paired(ar(raw), ar(_group(**env)), blocks))
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
        b = _block(lambda: f(x), BLOCK)[0]
        funcoll.install(["cpu"])
        o = _block(lambda: f(x), BLOCK)[0]
        tu.append(b)
        to.append(o)
        ratios.append(o / b)
    funcoll.uninstall(["cpu"])
    r = _summary(tu, to, ratios)
    for key in ("ratios", "deltas", "cpu_deltas"):
        r.pop(key, None)
    return [{"case": "compiled step, 10 all_reduce 256 B", "bytes": 256, "world": n, **r}]


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
        peaks = []
        for _ in range(3):  # the worst of 3 calls: when a backend frees its staging buffers varies from call to call
            dist.barrier()
            peaks.append(_peak_extra(ours))
        dist.barrier()
        peak = max(peaks)
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
        out += gaps(rank, n, blocks)
    for r in out:
        for key in ("ratios", "deltas", "cpu_deltas"):
            r.pop(key, None)
    return out
