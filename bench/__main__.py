"""funcoll benchmarks (``./dev bench [blocks]``): funcoll against the raw path in the same run, alternating blocks.

Runs bench/overhead.py on a 1-rank and a 2-rank CPU world (eager per-call cost 4 B - 1 MiB, async issue, funcoll's
optional per-call machinery: profiler, record(), size guard, debug check, flight recorder off; a compiled step, the
gap-filling strategies at 16 MiB with their peak memory and bytes sent), bench/training.py (whole training
steps: DDP, FSDP2, tensor + sequence parallel, a ZeRO-like loop, funcoll vs gloo, losses compared), then, where
torch_xla is installed, bench/xla.py (the cost of building one functional all_reduce on virtual worlds of 4, 64 and
256 ranks, and the compiled-step table). Prints one table and writes docs/performance.md (bench/report.py).
Progress goes to stderr. ``./dev bench scale`` runs bench/scale.py instead: each call's cost from world 2 to 8 (16)
and the cost model of bench/model.py from 8 to 1024 ranks.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

from bench import report, training

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BLOCKS = 15


def _progress(msg: str) -> None:
    print(f"[bench] {msg}", file=sys.stderr, flush=True)


def run(blocks: int = BLOCKS, write_docs: bool = True) -> list:
    from funcoll.launch import run_world

    rows = []
    load = [os.getloadavg()[0]]  # the 1-minute load average before and after each world's per-call rows
    for n in (1, 2):
        _progress(f"CPU world of {n} rank(s)")
        rows += run_world("bench.overhead:rank_main", n, None, args=(blocks,), timeout=900)[0]
        load.append(os.getloadavg()[0])
    rows += training.run(2 * blocks)  # a step's ratio varies more than a call's: twice as many blocks
    xla = importlib.util.find_spec("torch_xla") is not None
    if xla:
        for world in (4, 64, 256):
            _progress(f"XLA: building an all_reduce on a virtual world of {world}")
            p = subprocess.run([sys.executable, "-m", "bench.xla", "build", str(world), str(max(3, blocks // 2))],
                               capture_output=True, text=True, timeout=600, cwd=ROOT)
            line = next((ln for ln in p.stdout.splitlines() if ln.startswith("BUILD ")), None)
            if line is None:
                raise RuntimeError(f"bench.xla build {world} failed:\n{p.stdout[-2000:]}{p.stderr[-2000:]}")
            rows.append(json.loads(line[len("BUILD "):]))
    print(report.table(rows, load))
    if write_docs:
        report.write(rows, xla, load)
    return rows


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["scale"]:  # ./dev bench scale: how each call's cost grows with the world (bench/scale.py)
        from bench import scale

        return scale.main(argv[1:])
    write_docs = "--no-docs" not in argv
    argv = [a for a in argv if a != "--no-docs"]
    run(int(argv[0]) if argv else BLOCKS, write_docs)
    if importlib.util.find_spec("torch_xla") is not None and write_docs:
        sys.stdout.flush()
        return subprocess.run([sys.executable, "-m", "bench.xla", "10"], timeout=900, cwd=ROOT).returncode
    return 0


if __name__ == "__main__":
    sys.exit(main())
