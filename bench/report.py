"""The bench's table and docs/performance.md: ``table`` prints every row (``python -m bench``, ``python -m
bench.training``); ``write`` rewrites the page below its ``<!-- bench -->`` marker with the summary table (each op's
pooled row stands for its per-size rows, which only the printed table shows) and the two plots."""

from __future__ import annotations

import os
import re

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_SIZE = r"\d+ (?:B|KiB|MiB)"
_PIN = r"(?P<pin> \(1 CPU\))?$"  # world 1 runs pinned to one CPU


def table(rows, load=()) -> str:
    """Every row; ``load``: the 1-minute load averages taken during the run (the box is shared: the noise follows
    them)."""
    w = max(len(r["case"]) for r in rows)
    load = f"; load average {min(load):.1f}-{max(load):.1f}" if load else ""
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


def summary(rows) -> list:
    """The rows without the per-size rows of an op that has a pooled row (``pooled all_reduce 4 B-1 MiB`` stands for
    ``all_reduce 4 B`` ... ``all_reduce 1 MiB`` of its world)."""
    pooled = {(r["world"], m["name"], m["pin"]) for r in rows
              if (m := re.match(rf"pooled (?P<name>.+) {_SIZE}-{_SIZE}{_PIN}", r["case"]))}
    return [r for r in rows if not ((m := re.match(rf"(?P<name>.+) {_SIZE}{_PIN}", r["case"]))
                                    and (r["world"], m["name"], m["pin"]) in pooled)]


def write(rows, xla: bool, load=()) -> None:
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
            f"{'' if xla else '; torch_xla absent, no XLA rows'}):\n\n```\n{table(summary(rows), load)}\n```\n\n"
            "![per-call cost of dist.all_reduce against message size](performance.png)\n"
            "\n![training steps, funcoll / gloo](performance-training.png)\n")
    with open(page, "w") as f:
        f.write(head + body)
