"""funcoll benchmarks (``./dev bench [blocks]``): funcoll against the raw path in the same run, alternating blocks.

Runs bench/overhead.py on a 1-rank and a 2-rank CPU world (eager per-call cost 4 B - 1 MiB, async issue, funcoll's
optional per-call machinery: profiler, record(), size guard, debug check, flight recorder off; a compiled step, the
gap-filling strategies at 16 MiB with their peak memory and bytes sent), bench/training.py (whole training
steps: DDP, FSDP2, tensor + sequence parallel, a ZeRO-like loop, funcoll vs gloo, losses compared), then, where
torch_xla is
installed, bench/xla.py (the cost of building one functional all_reduce on virtual worlds of 4, 64 and 256 ranks,
and the compiled-step table). Prints one table and writes docs/performance.md with a plot (docs/performance.png) of
per-call cost against message size. Progress goes to stderr.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BLOCKS = 15


def _progress(msg: str) -> None:
    print(f"[bench] {msg}", file=sys.stderr, flush=True)


def run(blocks: int = BLOCKS, write_docs: bool = True) -> list:
    from funcoll.launch import run_world

    rows = []
    _LOAD[:] = [os.getloadavg()[0]]
    for n in (1, 2):
        _progress(f"CPU world of {n} rank(s)")
        rows += run_world("bench.overhead:rank_main", n, None, args=(blocks,), timeout=900)[0]
        _LOAD.append(os.getloadavg()[0])
    from bench import training

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
    print(table(rows))
    if write_docs:
        write(rows, xla)
    return rows


# the 1-minute load average before and after each world's per-call rows (the box is shared: the rows' noise follows it)
_LOAD: list = []


def table(rows) -> str:
    w = max(len(r["case"]) for r in rows)
    load = f"; load average {min(_LOAD):.1f}-{max(_LOAD):.1f}" if _LOAD else ""
    out = [f"funcoll bench: torch {torch.__version__}; ratio = funcoll / raw, median of per-block ratios [25%-75%]"
           + load,
           f"{'case':<{w}}  {'world':>5} {'raw':>10} {'funcoll':>10} {'ratio':>6} {'spread':>13} {'extra':>16}"]
    for r in rows:
        extra = ""
        if "peak_extra" in r:
            extra = f"peak +{r['peak_extra']:.2f}x"
        if "bytes_sent_ratio" in r:
            extra += f" sent {r['bytes_sent_ratio']:.2f}x"
        if "losses_equal" in r:
            extra = "losses equal" if r["losses_equal"] else "LOSSES DIFFER"
            if "cpu_delta_us" in r:  # the calling thread's own CPU time per step, funcoll - raw
                extra = f"cpu {r['cpu_delta_us']:+.0f}us, {extra}"
            if "m_lo" in r:  # where the median ratio itself lies (95%)
                extra = f"median in {r['m_lo']:.2f}-{r['m_hi']:.2f}, {extra}"
        elif "d1" in r and not extra:  # the median per-call difference (µs), its quartiles
            extra = f"{r['delta_us']:+.1f}us [{r['d1']:+.0f}..{r['d3']:+.0f}]"
            if "cpu_delta_us" in r:  # the calling thread's own CPU time per call, funcoll - raw
                extra += f" cpu {r['cpu_delta_us']:+.1f}us"
        out.append(f"{r['case']:<{w}}  {r['world']:>5} {r['raw_us']:>8.1f}us {r['funcoll_us']:>8.1f}us "
                   f"{r['ratio']:>6.2f} {r['q1']:>6.2f}-{r['q3']:<6.2f} {extra:>16}")
    return "\n".join(out)


def write(rows, xla: bool) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2))
    for n, style in ((1, "-"), (2, "--")):
        pts = [r for r in rows if r["world"] == n and r["case"].startswith("all_reduce ")]
        xs = [r["bytes"] for r in pts]
        ax.plot(xs, [r["raw_us"] for r in pts], style, marker="o", color="tab:gray", label=f"raw gloo, world {n}")
        ax.plot(xs, [r["funcoll_us"] for r in pts], style, marker="s", color="tab:blue", label=f"funcoll, world {n}")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("message size per rank (bytes)")
    ax.set_ylabel("per-call cost of dist.all_reduce (µs)")
    ax.set_title(f"funcoll vs raw gloo, CPU, torch {torch.__version__}")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(os.path.join(ROOT, "docs", "performance.png"), dpi=110)
    plt.close(fig)
    train = [r for r in rows if r["case"].startswith("train step: ")]
    if train:  # one bar per training row: the median ratio, its quartiles as the error bar
        fig, ax = plt.subplots(figsize=(7, 0.45 * len(train) + 1.2))
        ys = list(range(len(train)))[::-1]
        med = [r["ratio"] for r in train]
        err = [[m - r["q1"] for m, r in zip(med, train)], [r["q3"] - m for m, r in zip(med, train)]]
        ax.barh(ys, med, xerr=err, color="tab:blue", alpha=0.7, capsize=3)
        ax.axvline(1.0, color="tab:gray", linestyle="--")
        ax.set_yticks(ys, [r["case"][len("train step: "):] for r in train])
        ax.set_xlabel("time per step, funcoll / gloo (median of paired blocks, quartiles)")
        ax.set_title(f"training steps on 2 CPU ranks, torch {torch.__version__}")
        fig.tight_layout()
        fig.savefig(os.path.join(ROOT, "docs", "performance-training.png"), dpi=110)
        plt.close(fig)
    page = os.path.join(ROOT, "docs", "performance.md")
    head = open(page).read().split("<!-- bench -->")[0] if os.path.exists(page) else "# Performance\n\n"
    body = ("<!-- bench -->\n\nThe last `./dev bench` run (2 shared cores: read the ratios, not the microseconds"
            f"{'' if xla else '; torch_xla absent, no XLA rows'}):\n\n```\n{table(rows)}\n```\n\n"
            "![per-call cost of dist.all_reduce against message size](performance.png)\n"
            "\n![training steps, funcoll / gloo](performance-training.png)\n")
    with open(page, "w") as f:
        f.write(head + body)


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    write_docs = "--no-docs" not in argv
    argv = [a for a in argv if a != "--no-docs"]
    run(int(argv[0]) if argv else BLOCKS, write_docs)
    if importlib.util.find_spec("torch_xla") is not None and write_docs:
        sys.stdout.flush()
        return subprocess.run([sys.executable, "-m", "bench.xla", "10"], timeout=900, cwd=ROOT).returncode
    return 0


if __name__ == "__main__":
    sys.exit(main())
