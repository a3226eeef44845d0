"""Exit stress: many 2-rank launches that create, use and destroy funcoll groups, then exit -- cleanly, with async
Works still pending, or without destroying the group -- and a count of the launches that ended abnormally (a non-zero
exit code, a signal, or "terminate called" on stderr, as a C++ std::thread destroyed while joinable prints).

    ./dev python -m tests.work.exit_stress --launches 200            # the long run (FUNCOLL_ENVS picks the torch)
    ./dev python -m tests.work.exit_stress --launches 6 --cycles 3   # what tests/work/test_work_contract runs

Each launch is two fresh interpreters (subprocesses, so the exit is a real interpreter exit); the modes rotate.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from datetime import timedelta

MODES = ("clean", "pending", "no-destroy", "pending-no-destroy", "subgroups")


def _use(rank: int, n: int, group=None, pending: bool = False) -> list:
    """A little of everything a training job does on a group (bf16 all_gather/reduce_scatter as FSDP2 does,
    all_reduce, p2p, a barrier); with ``pending``, async Works left unwaited."""
    import torch
    import torch.distributed as dist

    works = []
    x = torch.arange(8, dtype=torch.bfloat16) + rank
    out = torch.empty(8 * n, dtype=torch.bfloat16)
    dist.all_gather_into_tensor(out, x, group=group)
    shard = torch.empty(8 // n * 1, dtype=torch.bfloat16)
    works.append(dist.reduce_scatter_tensor(shard, x, group=group, async_op=True))
    works.append(dist.all_reduce(torch.ones(4), group=group, async_op=True))
    peer = dist.get_global_rank(group, (dist.get_group_rank(group, rank) + 1) % n) if group else (rank + 1) % n
    src = dist.get_global_rank(group, (dist.get_group_rank(group, rank) - 1) % n) if group else (rank - 1) % n
    works += [dist.isend(torch.ones(3), peer, group=group), dist.irecv(torch.empty(3), src, group=group)]
    if dist.get_backend(group) == "funcoll":
        works[-1].get_future()  # a future on a recv: raw gloo has none, funcoll supplies it (a background waiter)
    if not pending:
        for w in works:
            w.wait()
        dist.barrier(group=group)
        return []
    return works


def _rank(rank: int, port: int, mode: str, cycles: int) -> None:
    import torch.distributed as dist

    import funcoll  # noqa: F401

    keep = []
    for cycle in range(cycles):
        last = cycle == cycles - 1
        dist.init_process_group("funcoll", rank=rank, world_size=2, init_method=f"tcp://127.0.0.1:{port + cycle}",
                                timeout=timedelta(seconds=60))
        group = None
        if mode == "subgroups":
            group = dist.new_group([0, 1])
            _use(rank, 2, dist.new_group([0, 1], backend="gloo"))
        keep += _use(rank, 2, group, pending=last and mode.startswith("pending"))
        if last and mode.endswith("no-destroy"):
            return  # exit with the group alive
        if last and mode == "pending":
            time.sleep(0.05)  # the pending Works complete meanwhile or not: destroy must not care
        dist.destroy_process_group()


def _launch(i: int, mode: str, cycles: int, timeout: float) -> tuple:
    from funcoll.launch import _free_port

    port = _free_port()
    while True:  # a run of free ports, one per cycle
        if all(_free(port + k) for k in range(cycles)):
            break
        port = _free_port()
    env = dict(os.environ, FUNCOLL_PROFILE=os.environ.get("FUNCOLL_PROFILE", ""))
    procs = [subprocess.Popen([sys.executable, "-m", "tests.work.exit_stress", "--rank", str(r), "--port", str(port),
                               "--mode", mode, "--cycles", str(cycles)], stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, env=env, text=True) for r in range(2)]
    codes, errs = [], []
    for p in procs:
        try:
            _, err = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            _, err = p.communicate()
            err = f"(hung: killed after {timeout} s)\n{err}"
        codes.append(p.returncode)
        errs.append(err)
    bad = [r for r in range(2) if codes[r] != 0 or "terminate called" in errs[r]]
    return i, mode, codes, [errs[r][-2000:] for r in bad]


def _free(port: int) -> bool:
    import socket

    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def stress(launches: int, cycles: int, timeout: float = 120, quiet: bool = False, modes=MODES) -> list:
    """Runs ``launches`` launches (``modes`` rotating); returns the abnormal ones as (index, mode, exit codes,
    stderr)."""
    bad = []
    for i in range(launches):
        res = _launch(i, modes[i % len(modes)], cycles, timeout)
        if res[3]:
            bad.append(res)
        if not quiet:
            print(f"launch {i} {res[1]}: exit codes {res[2]}{' ABNORMAL' if res[3] else ''}", flush=True)
    return bad


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--launches", type=int, default=200)
    ap.add_argument("--cycles", type=int, default=3, help="create/use/destroy cycles per launch")
    ap.add_argument("--modes", default=",".join(MODES), help="modes to rotate, of " + ", ".join(MODES))
    ap.add_argument("--rank", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--port", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--mode", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.rank is not None:
        _rank(a.rank, a.port, a.mode, a.cycles)
        return 0
    t0 = time.monotonic()
    bad = stress(a.launches, a.cycles, modes=a.modes.split(","))
    print(f"{a.launches} launches x 2 ranks x {a.cycles} cycles in {time.monotonic() - t0:.0f} s: "
          f"{len(bad)} abnormal")
    for i, mode, codes, errs in bad:
        print(f"--- launch {i} ({mode}): exit codes {codes}")
        for e in errs:
            print(e)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
