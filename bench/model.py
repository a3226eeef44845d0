"""The cost model of every strategy whose cost has the world in it, from the planner, nothing executed
(``python -m bench.model``; ``./dev bench scale`` prints it and writes it into docs/performance.md): per strategy and
profile at worlds 8 to 1024, the collectives one call issues, the rounds that run one after the other, the bytes the
world moves against the exact exchange (every byte sent once, where it must go) and the host syncs. The uneven
all_to_all rows run the planner's own choice (:func:`funcoll.algorithms.planner.a2a_plan`) on split matrices of a
MoE-like layer: each split 8 to 16 rows of 256 B ("2x": largest/smallest 2), one hot destination taking 4 times the
mean ("hot x4"), and one rank sending everything ("one sender")."""

from __future__ import annotations

import sys

from funcoll.algorithms import planner

WORLDS = (8, 16, 64, 256, 1024)
ROW = 256  # bytes per row


def matrix(kind: str, n: int) -> list:
    if kind == "2x":
        return [[8 + (3 * i + 5 * j) % 9 for j in range(n)] for i in range(n)]
    if kind == "hot x4":  # destination 0 gets 4x the mean from everyone
        return [[48 if j == 0 else 12 for j in range(n)] for i in range(n)]
    return [[64 if i == 0 else 0 for j in range(n)] for i in range(n)]  # one sender


def _exact(sp) -> int:
    n = len(sp)
    return sum(sp[i][j] for i in range(n) for j in range(n) if i != j) * ROW


def a2a_rows(n: int, kind: str) -> list:
    """(strategy, profile, collectives, rounds, bytes / exact, host syncs) of one uneven all_to_all."""
    sp = matrix(kind, n)
    exact = _exact(sp)
    stats = tuple(planner.split_stats(row) for row in sp)
    p = planner.a2a_plan(n, stats, ROW)
    big = max(max(r) for r in sp)
    out = [("alltoallv (native)", "native", 1, 1, 1.0, 0)]
    if p.kind == planner.PAIRWISE:
        out.append(("pairwise rounds (planned)", "xccl", 2 * (n - 1), n - 1, 1.0, 0))
    else:
        c = p.chunk
        over = sum(max(0, sp[i][j] - c) for i in range(n) for j in range(n) if i != j) * ROW
        sent = n * (n - 1) * (planner.A2A_HEADER + c * ROW) + over
        group = over > 0
        out.append((f"carried, chunk {c} (planned)", "xccl", 1 + group, 1 + group, sent / exact, 1))
        out.append(("carried, first call (+agreement)", "xccl", 2 + group, 2 + group,
                    (sent + 8 * planner.A2A_STATS * n * (n - 1)) / exact, 2))
    out.append(("pairwise rounds (before)", "xccl", 2 * (n - 1), n - 1, 1.0, 0))
    padded = n * (n - 1) * big * ROW
    out.append(("pad to agreed largest", "xla/torchtpu", 2, 2, (padded + 16 * n * (n - 1)) / exact, 1))
    out.append(("pad to static_split_bound", "xla/torchtpu", 1, 1, padded / exact, 0))
    return out


def other_rows(n: int) -> list:
    """(strategy, profile, collectives, rounds, bytes / exact, host syncs): list all_gather and reduce_scatter whose
    sizes alternate 1x and 2x per rank, gather/scatter fills, the checks per call, group creation."""
    sizes = [1 + q % 2 for q in range(n)]
    total, big = sum(sizes), max(sizes)
    # every rank receives every other rank's block once
    ag_exact = (n - 1) * total
    rows = [
        ("uneven list all_gather: pad to largest+all_gather", "funcoll fill", 1, 1, n * (n - 1) * big / ag_exact, 0),
        ("uneven list all_gather: broadcast per rank (padding > 2x)", "funcoll fill", n, n, 1.0, 0),
        ("uneven list all_gather: backend list form", "xccl (ProcessGroupXCCL)", n, n, 1.0, 0),
        # reduce_scatter: a ring reduce_scatter sends (n-1)/n of the input per rank; an all_reduce twice that
        ("uneven list reduce_scatter: pad to largest+reduce_scatter", "funcoll fill", 1, 1, n * big / total, 0),
        ("uneven list reduce_scatter: all_reduce+keep block (padding > 2x)", "funcoll fill", 1, 1, 2.0, 0),
        ("uneven list reduce_scatter: backend list form", "native gloo / xccl", n, n, 1.0, 0),
        ("gather: all_gather", "xla/torchtpu", 1, 1, float(n), 0),
        ("scatter: broadcast of the stacked inputs", "xla/torchtpu (bytes)", 1, 1, float(n), 0),
        ("scatter / broadcast: masked all_reduce", "xla/torchtpu", 1, 1, 2.0 * n, 0),
        ("size guard (per call): all_gather of a digest", "any", 1, 1, None, 0),
        ("debug check (per call): store set, wait, multi_get, delete", "any", 0, 4, None, 0),
    ]
    return rows


def table() -> list:
    out = []
    for kind in ("2x", "hot x4", "one sender"):
        for n in WORLDS:
            for row in a2a_rows(n, kind):
                out.append((f"uneven all_to_all ({kind})", n) + row)
    for n in WORLDS:
        for row in other_rows(n):
            out.append(("", n) + row)
    return out


def markdown() -> str:
    """The model as markdown: one row per call and strategy, one column per world, each cell ``collectives /
    sequential rounds / bytes over exact / host syncs`` (a carried exchange's chunk in rows after it)."""
    cells: dict = {}
    for call, n, strategy, profile, colls, rounds, ratio, syncs in table():
        chunk = ""
        if ", chunk " in strategy:
            strategy, chunk = strategy.replace(" (planned)", "").split(", chunk ")
            strategy += " (planned)"
            chunk = f" (chunk {chunk})"
        key = (call or strategy.split(":")[0], strategy.split(": ", 1)[-1] if not call else strategy, profile)
        shown = "-" if ratio is None else f"{ratio:.2f}"
        cells.setdefault(key, {})[n] = f"{colls} / {rounds} / {shown} / {syncs}{chunk}"
    lines = ["Cost model (bench/model.py: the planner's choices, nothing executed; rows of 256 B). Each cell: "
             "collectives / sequential rounds / bytes the world moves over the exact exchange (headers and "
             "agreements included) / host syncs, per call.", "",
             "| call | strategy | profile | " + " | ".join(f"world {n}" for n in WORLDS) + " |",
             "|---|---|---|" + "---|" * len(WORLDS)]
    for (call, strategy, profile), per in cells.items():
        lines.append(f"| {call} | {strategy} | {profile} | " + " | ".join(per.get(n, "") for n in WORLDS) + " |")
    return "\n".join(lines)


def plot(path: str) -> bool:
    """Sequential rounds and bytes / exact of the uneven all_to_all strategies against the world (2x splits); False
    where matplotlib is missing (no plot, no dependency)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    series: dict = {}
    for n in WORLDS:
        for strategy, profile, _, rounds, ratio, _ in a2a_rows(n, "2x"):
            name = f"{strategy.split(', chunk')[0].replace(' (planned)', '')} [{profile}]"
            series.setdefault(name, []).append((n, rounds, ratio))
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4))
    for name, pts in series.items():
        a.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=name)
        b.plot([p[0] for p in pts], [p[2] for p in pts], marker="o", label=name)
    for ax, what in ((a, "sequential rounds"), (b, "bytes / exact")):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("world")
        ax.set_ylabel(what)
    a.set_yscale("log")
    b.legend(fontsize=7)
    fig.suptitle("uneven all_to_all, splits 8-16 rows of 256 B (bench/model.py)")
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    return True


if __name__ == "__main__":
    print(markdown())
    sys.exit(0)
