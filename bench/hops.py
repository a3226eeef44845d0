"""Counts funcoll function calls (``sys.setprofile`` call events whose code is under funcoll/) made by one call
after warm-up, as docs/design.md section 3 gives them: ``python -m bench.hops eager`` (``dist.all_reduce(t, op=AVG)``
under FUNCOLL_PROFILE=xccl, 2 CPU ranks, size guard off and on) and ``PJRT_DEVICE=CPU python -m bench.hops xla``
(the compiled ``_c10d_functional.all_reduce(x, "avg")`` on XLA, world 1). ``-v`` lists the calls. On Python 3.11 a
comprehension and each resumption of a generator are call events too."""

import collections
import os
import sys

ROOT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "funcoll") + os.sep


def count(fn) -> list:
    """``(file under funcoll/, function name, the caller's file under funcoll/ or None)`` of every funcoll call
    ``fn()`` makes."""
    calls = []

    def prof(frame, event, arg):
        if event == "call" and frame.f_code.co_filename.startswith(ROOT):
            up = frame.f_back.f_code.co_filename if frame.f_back is not None else ""
            calls.append((frame.f_code.co_filename[len(ROOT):], frame.f_code.co_name,
                          up[len(ROOT):] if up.startswith(ROOT) else None))

    sys.setprofile(prof)
    try:
        fn()
    finally:
        sys.setprofile(None)
    return calls


def eager(rank: int, world: int) -> dict:
    import torch
    import torch.distributed as dist

    import funcoll

    out = {}
    t = torch.ones(4)

    def one():
        dist.all_reduce(t, op=dist.ReduceOp.AVG)

    for guard in (False, True):
        funcoll.debug.set_guard(dist.group.WORLD, guard)
        for _ in range(3):
            one()
        out[guard] = count(one)
    return out


def xla() -> list:
    import torch
    import torch.distributed as dist
    import torch_xla.core.xla_model as xm

    import funcoll

    dist.init_process_group("funcoll", rank=0, world_size=1, store=dist.HashStore())
    funcoll.install(["xla"])
    g = dist.group.WORLD.group_name
    x = torch.ones(4, device=xm.xla_device())

    def one():
        torch.ops._c10d_functional.wait_tensor(torch.ops._c10d_functional.all_reduce(x, "avg", g))

    for _ in range(3):
        one()
    return count(one)


def _show(what: str, calls: list, verbose: bool) -> None:
    names = collections.Counter(n for _, n, _ in calls)
    print(f"{what}: {len(calls)} calls in {len({f for f, _, _ in calls})} files; transport_for "
          f"{names['transport_for']}, native_all_reduce {names['native_all_reduce']}")
    if verbose:
        print("  " + "\n  ".join(f"{f}:{n} (from {c})" for f, n, c in calls))


def main(argv: list) -> None:
    verbose = "-v" in argv
    if "xla" in argv:
        _show("compiled XLA avg", xla(), verbose)
        return
    from funcoll.launch import run_world

    res = run_world("bench.hops:eager", 2, profile="xccl", env={"FUNCOLL_GUARD": "0"})[0]
    for guard in (False, True):
        _show(f"eager AVG under xccl, guard {'on' if guard else 'off'}", res[guard], verbose)


if __name__ == "__main__":
    main(sys.argv[1:])
