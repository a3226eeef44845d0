"""Run a function on every rank of a small real world on this machine (separate processes, ``funcoll``
backend over gloo). Used by the demo and the tests; handy for users' own multi-rank tests.

Every rendezvous and collective has a timeout, and the parent kills the world when it overruns, so a test
never hangs. ``target`` is "module:function" (importable with the parent's sys.path); it is called as
``fn(rank, world_size, *args)`` after ``init_process_group`` and its return value (picklable) comes back.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import pickle
import queue
import socket
import sys
import time
import traceback
from datetime import timedelta
from typing import Optional, Sequence


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _child(rank, world, port, target, args, profile, backend, q, coll_timeout, path):
    os.environ.pop("FUNCOLL_PROFILE", None)
    if profile:
        os.environ["FUNCOLL_PROFILE"] = profile
    import sys

    sys.path[:] = list(path)
    try:
        import importlib

        import torch
        import torch.distributed as dist

        import funcoll  # noqa: F401  (registers the backend)

        torch.set_num_threads(1)
        dist.init_process_group(backend, rank=rank, world_size=world,
                                init_method=f"tcp://127.0.0.1:{port}",
                                timeout=timedelta(seconds=coll_timeout))
        mod, fn = target.split(":")
        res = getattr(importlib.import_module(mod), fn)(rank, world, *args)
        q.put((rank, "ok", pickle.dumps(res)))  # plain pickle: tensors travel by value
    except BaseException:  # noqa: BLE001 - reported to the parent
        q.put((rank, "err", traceback.format_exc()))
    finally:
        try:
            import torch.distributed as dist

            if dist.is_initialized():
                dist.destroy_process_group()
        except Exception:
            pass


def run_world(target: str, world_size: int = 2, profile: Optional[str] = None, args: Sequence = (),
              timeout: float = 180, backend: str = "funcoll", coll_timeout: float = 60) -> list:
    """Returns the per-rank results; raises AssertionError with the first rank's traceback on failure,
    TimeoutError when the world does not finish in ``timeout`` seconds."""
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_child, args=(r, world_size, port, target, tuple(args), profile, backend, q,
                                              coll_timeout, list(sys.path)), daemon=True)
             for r in range(world_size)]
    for p in procs:
        p.start()
    results: dict = {}
    deadline = time.monotonic() + timeout
    try:
        while len(results) < world_size:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"{target} on {world_size} ranks did not finish in {timeout}s "
                                   f"(ranks done: {sorted(results)})")
            try:
                rank, status, res = q.get(timeout=min(left, 1.0))
            except queue.Empty:
                dead = [i for i, p in enumerate(procs) if not p.is_alive() and i not in results]
                if dead and all(not p.is_alive() for p in procs) and q.empty():
                    raise AssertionError(f"ranks {dead} of {target} died without a result "
                                         f"(exit codes {[p.exitcode for p in procs]})") from None
                continue
            results[rank] = (status, pickle.loads(res) if status == "ok" else res)
    finally:
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
                p.join(timeout=5)
    errors = [(r, res) for r, (s, res) in sorted(results.items()) if s != "ok"]
    if errors:
        r, tb = errors[0]
        raise AssertionError(f"rank {r} of {target} (world {world_size}, profile {profile}) failed:\n{tb}")
    return [results[r][1] for r in range(world_size)]
