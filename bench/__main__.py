"""funcoll benchmarks (``./dev bench``): funcoll vs the raw path in the same run, alternating, medians.

A 2-rank CPU world. Per case it times the raw path (a plain gloo group, or funcoll's native path where the
raw backend cannot do the request at all) and funcoll's path, interleaved, and prints the median of each and
their ratio. Cases: eager latency for small messages, bandwidth for large ones, the cost of each gap-filling
strategy against the native op (strategies forced with a group whose profile is xccl). Then, where torch_xla is
installed, bench/xla.py: compile time, step time and HLO op counts of the same compiled step through torch_xla's
kernels and through funcoll's.
"""

from __future__ import annotations

import statistics
import sys
import time

import torch

REPS = 30


def _time(fn, reps):
    out = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return out


def rank_main(rank, n, reps=REPS):
    import torch.distributed as dist

    import funcoll

    torch.set_num_threads(1)
    R = dist.ReduceOp
    raw = dist.new_group(backend="gloo")
    fc_native = dist.group.WORLD  # funcoll over gloo, native profile
    fc_xccl = dist.new_group(backend="funcoll", pg_options=funcoll.Options(profile="xccl"))

    def ar(group, size, dtype=torch.float32, op=R.SUM):
        t = torch.ones(size, dtype=dtype)
        return lambda: dist.all_reduce(t, op=op, group=group)

    def a2a(group, uneven):
        inp = torch.ones(1 << 16)
        if uneven:
            ins = [1 << 14, 3 << 14] if rank == 0 else [3 << 14, 1 << 14]
            outs = [1 << 14, 3 << 14] if rank == 0 else [3 << 14, 1 << 14]
        else:
            ins = outs = [1 << 15, 1 << 15]
        out = torch.empty(sum(outs))
        return lambda: dist.all_to_all_single(out, inp, outs, ins, group=group)

    cases = [
        ("all_reduce 1 KiB f32 latency", ar(raw, 256), ar(fc_native, 256), 4 * 256),
        ("all_reduce 16 MiB f32 bandwidth", ar(raw, 1 << 22), ar(fc_native, 1 << 22), 4 << 22),
        ("AVG 4 MiB f32: native vs avg=sum+scale", ar(fc_native, 1 << 20, op=R.AVG),
         ar(fc_xccl, 1 << 20, op=R.AVG), 4 << 20),
        ("AVG 4 MiB bf16: native vs sum+scale in f32", ar(fc_native, 1 << 21, torch.bfloat16, R.AVG),
         ar(fc_xccl, 1 << 21, torch.bfloat16, R.AVG), 4 << 20),
        ("BXOR 1 MiB i32: native vs gather+local", ar(fc_native, 1 << 18, torch.int32, R.BXOR),
         ar(fc_xccl, 1 << 18, torch.int32, R.BXOR), 1 << 20),
        ("MAX 1 MiB i32: native vs gather+local", ar(fc_native, 1 << 18, torch.int32, R.MAX),
         ar(fc_xccl, 1 << 18, torch.int32, R.MAX), 1 << 20),
        ("SUM 1 MiB: i32 native vs i16 widened", ar(fc_native, 1 << 18, torch.int32),
         ar(fc_native, 1 << 19, torch.int16), 1 << 20),
        ("all_to_all 256 KiB: uneven native vs padded", a2a(fc_native, True), a2a(fc_xccl, True), 1 << 18),
    ]
    rows = []
    for name, base, ours, nbytes in cases:
        base()
        ours()  # warm up (gloo connections, strategy buffers)
        tb, to = [], []
        for _ in range(reps):  # alternate so both see the same machine state
            tb += _time(base, 1)
            to += _time(ours, 1)
        dist.barrier()
        rows.append((name, statistics.median(tb), statistics.median(to), nbytes))
    return rows


def main(argv=None) -> int:
    from funcoll.launch import run_world

    reps = int(argv[0]) if argv else REPS
    rows = run_world("bench.__main__:rank_main", 2, None, args=(reps,), timeout=600)[0]
    print(f"funcoll bench: 2 CPU ranks over gloo, torch {torch.__version__}, median of {reps} alternating reps\n")
    w = max(len(r[0]) for r in rows)
    print(f"{'case':<{w}}  {'raw/native':>12} {'funcoll':>12} {'ratio':>7} {'funcoll GB/s':>13}")
    for name, tb, to, nbytes in rows:
        print(f"{name:<{w}}  {tb * 1e6:>10.0f}us {to * 1e6:>10.0f}us {to / tb:>7.2f} {nbytes / to / 1e9:>13.3f}")
    import importlib.util
    import subprocess

    if importlib.util.find_spec("torch_xla") is None:
        print("\n(torch_xla is not installed: no XLA part)")
        return 0
    print()
    sys.stdout.flush()  # the XLA part runs in a process of its own (it builds a funcoll world of one rank)
    return subprocess.run([sys.executable, "-m", "bench.xla", str(min(reps, 20))], timeout=600).returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
