"""The cost of funcoll's profiler/log hook (``python -m funcoll bench --hook-cost``): a 4-byte ``dist.all_reduce`` on a
funcoll world of one rank with and without the hook, and with a profiler recording; medians of alternating blocks."""

from __future__ import annotations

from typing import Dict

import torch

from funcoll.algorithms.observe import LOG, Scope  # noqa: F401  (the hook under measurement)


def _rank_cost(rank, n, reps, block):
    """Runs on a funcoll world of one rank: ``dist.all_reduce`` of 4 bytes with the hooked entry (no profiler),
    with the entry as it was before the hook (``record()`` only), and with a profiler recording; then the algorithm
    alone (``algorithms.all_reduce`` over a transport that sends nothing) with and without the hook. Alternating
    blocks of ``block`` calls; the median per-call time of each."""
    import functools
    import statistics
    import time

    import torch.distributed as dist

    from funcoll import algorithms

    hooked = algorithms.all_reduce
    inner = hooked.__wrapped__

    @functools.wraps(inner)
    def before(*args, **kwargs):  # algorithms._entry as it was without funcoll.algorithms.observe
        if not algorithms._recorders or algorithms._current.notes is not None:
            with torch.no_grad():
                return inner(*args, **kwargs)
        algorithms._current.notes = notes = []
        try:
            with torch.no_grad():
                return inner(*args, **kwargs)
        finally:
            algorithms._current.notes = None
            notes = list(dict.fromkeys(notes)) or ["native"]
            for log in algorithms._recorders:
                log.append(("all_reduce", notes))

    t = torch.ones(1, dtype=torch.float32)
    times: Dict[str, list] = {"without hook": [], "with hook, no profiler": [], "with hook, profiler on": []}

    from funcoll.report import DryRunTransport
    from funcoll.transport import profile

    dry = DryRunTransport(profile("gloo"), size=1)
    times.update({"algorithm only, without hook": [], "algorithm only, with hook": []})

    def run():
        t0 = time.perf_counter()
        for _ in range(block):
            dist.all_reduce(t)
        return (time.perf_counter() - t0) / block

    def run_dry(fn):
        t0 = time.perf_counter()
        for _ in range(block):
            fn(dry, t, "sum")
        return (time.perf_counter() - t0) / block

    try:
        for _ in range(20):
            dist.all_reduce(t)  # warm up
        for _ in range(reps):
            algorithms.all_reduce = before
            times["without hook"].append(run())
            algorithms.all_reduce = hooked
            times["with hook, no profiler"].append(run())
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]):
                times["with hook, profiler on"].append(run())
            times["algorithm only, without hook"].append(run_dry(before))
            times["algorithm only, with hook"].append(run_dry(hooked))
    finally:
        algorithms.all_reduce = hooked
    return {k: statistics.median(v) * 1e6 for k, v in times.items()}


def measure_hook_cost(reps: int = 30, block: int = 200) -> Dict[str, float]:
    """µs per ``dist.all_reduce`` of 4 bytes on a funcoll group of one rank (its own process): without the hook,
    with it and no profiler, with it while a profiler records. Medians over alternating blocks."""
    from funcoll.launch import run_world

    return run_world("bench.hook_cost:_rank_cost", 1, None, args=(reps, block), timeout=600)[0]
