"""The cost of funcoll's per-collective hook (sequence numbers, flight recorder) and of the debug mode's cross-rank
check: ``measure_cost()``, µs per ``dist.all_reduce`` on a small CPU funcoll world, alternating blocks."""

from __future__ import annotations

from typing import Dict

import torch

from bench.overhead import _block
from funcoll.entry.debug import set_debug, state_of


def _us_per_call(fn, block: int) -> float:
    """µs per call of ``fn`` over a block of ``block`` calls, every rank starting it together (a barrier first)."""
    import torch.distributed as dist

    dist.barrier()
    return _block(fn, block) * 1e6


# ---------------------------------------------------------------------------------------------------
def _rank_cost(rank, n, reps, block, numel):
    """On every rank of a funcoll world: ``dist.all_reduce`` of ``numel`` float32 in alternating blocks of
    ``block`` calls without the hook (the method as written), with it and the flight recorder off, on (the
    default), and with the debug check; median µs per call.
    Every rank switches at the same point of its program, as :func:`set_debug` requires."""
    import statistics

    import torch.distributed as dist

    pg = dist.group.WORLD
    st = state_of(pg)
    t = torch.ones(numel)
    cls = type(pg)
    hooked = cls.__dict__["allreduce"]
    modes = {"without the hook": (None, False, False), "recorder off": (hooked, False, False),
             "recorder on (default)": (hooked, True, False), "debug check": (hooked, True, True)}
    times: Dict[str, list] = {m: [] for m in modes}
    for _ in range(20):
        dist.all_reduce(t)
    try:
        for _ in range(reps):
            for mode, (method, rec, dbg) in modes.items():
                cls.allreduce = method or hooked.__wrapped__
                st.trace.enabled = rec
                set_debug(pg, dbg)
                times[mode].append(_us_per_call(lambda: dist.all_reduce(t), block))
    finally:
        cls.allreduce = hooked
        st.trace.enabled = True
        set_debug(pg, False)
    return {m: statistics.median(v) for m, v in times.items()}


def measure_cost(reps: int = 9, block: int = 50, numel: int = 4, world: int = 2) -> Dict[str, float]:
    """µs per ``dist.all_reduce`` of ``numel`` float32 on a ``world``-rank CPU funcoll world (its own processes):
    without the hook / with it and the flight recorder off / on / with the debug mode's cross-rank check. Medians
    over alternating blocks."""
    from funcoll.launch import run_world

    return run_world("bench.debug_cost:_rank_cost", world, None, args=(reps, block, numel), timeout=900)[0]


# ---------------------------------------------------------------------------------------------------
# the size guard (funcoll/entry/guard.py): guard off vs on, alternating blocks, with the spread
# ---------------------------------------------------------------------------------------------------
def _rank_guard_cost(rank, n, reps, block, numel):
    """On every rank: ``dist.all_reduce`` of ``numel`` float32 in alternating blocks of ``block`` calls with the
    size guard off, on (the default) and, for reference, the debug check (which replaces the guard). Returns the
    per-block µs per call of each mode, and per rep the guard's cost over the block without it just before."""
    import torch.distributed as dist

    from funcoll.entry.guard import set_guard

    pg = dist.group.WORLD
    t = torch.ones(numel)
    modes = {"guard off": (False, False), "size guard": (True, False), "debug check": (True, True)}
    times: Dict[str, list] = {m: [] for m in modes}
    floor = "one gloo all_gather of the digest alone"  # what the guard adds at least: its exchange, no all_reduce
    times[floor] = []
    backend = pg.transport("cpu").backend
    inp, out = torch.zeros(3, dtype=torch.int64), torch.zeros(3 * n, dtype=torch.int64)
    for _ in range(20):
        dist.all_reduce(t)
    try:
        for _ in range(reps):
            for mode, (guard, dbg) in modes.items():
                set_guard(pg, guard)
                set_debug(pg, dbg)
                times[mode].append(_us_per_call(lambda: dist.all_reduce(t), block))
            times[floor].append(_us_per_call(lambda: backend._allgather_base(out, inp).wait(), block))
    finally:
        set_guard(pg, True)
        set_debug(pg, False)
    times["size guard - guard off"] = [g - o for g, o in zip(times["size guard"], times["guard off"])]
    return times


def _spread(v) -> Dict[str, float]:
    import statistics

    q = statistics.quantiles(v, n=4) if len(v) > 1 else [v[0]] * 3
    return {"median": statistics.median(v), "q1": q[0], "q3": q[2], "min": min(v), "max": max(v)}


def measure_guard_cost(reps: int = 15, block: int = 100, numel: int = 4, world: int = 2) -> Dict[str, Dict[str, float]]:
    """µs per ``dist.all_reduce`` of ``numel`` float32 on a ``world``-rank CPU funcoll world: size guard off / on
    (the default) / the debug check, the guard's paired cost (each "size guard" block minus the "guard off" block
    before it), and the floor: one gloo all_gather of a digest alone. Per mode: median, quartiles, min and max over
    the ``reps`` blocks (rank 0's clock)."""
    from funcoll.launch import run_world

    times = run_world("bench.debug_cost:_rank_guard_cost", world, None, args=(reps, block, numel), timeout=900)[0]
    return {mode: _spread(v) for mode, v in times.items()}
