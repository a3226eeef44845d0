"""``./dev bench scale``: how each call's cost grows with the world, executed on CPU at worlds 2, 4, 8 (and 16 with
``--16``): each call on a funcoll group of each profile (native, xccl) against c10d's stock path over the same gloo
backend (:func:`bench.overhead.stock_group`), in the same world, blocks alternated (bench.overhead.paired), the median
of the per-block ratios with its quartiles. The calls are 4 KiB-class: uneven all_to_all_single (rows of 256 B, 8 to
16 rows per split, the same splits every call: the steady state of a MoE layer; and two patterns alternating call by
call, so each call is planned from the other's statistics), even all_to_all_single, all_reduce SUM and AVG,
broadcast, all_gather_into_tensor, and the uneven list all_gather and reduce_scatter (1 to 2 KiB per rank); on the
xccl profile also the carried exchange alone (its algorithm's body on the transport, nothing around it). Then the
cost model (bench/model.py) at worlds 8 to 1024; docs/performance.md gets both below its scale marker.

    ./dev bench scale [blocks] [--16] [--no-docs]
"""

from __future__ import annotations

import os
import sys

import torch

from bench.overhead import forget_stock, paired, progress, stock_group
from funcoll.algorithms.planner import PAIRWISE_WORLD

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BLOCKS = 12
ROW = 64  # float32 per row: 256 B


def splits(n: int, salt: int = 0) -> list:
    """``sp[i][j]``: rows rank i sends rank j, 8 to 16 (max/min 2, max/mean at most 1.33)."""
    return [[8 + (3 * i + 5 * j + salt) % 9 for j in range(n)] for i in range(n)]


def _calls(n: int, rank: int) -> list:
    import torch.distributed as dist

    R = dist.ReduceOp

    def a2a_uneven(group, pats):
        bufs = []
        for sp in pats:
            ins, outs = sp[rank], [sp[i][rank] for i in range(n)]
            bufs.append((torch.ones(sum(ins), ROW), torch.empty(sum(outs), ROW), outs, ins))
        state = [0]

        def call():
            inp, out, outs, ins = bufs[state[0] % len(bufs)]
            state[0] += 1
            dist.all_to_all_single(out, inp, outs, ins, group=group)

        return call

    def a2a_even(group):
        inp, out = torch.ones(n * 16, ROW), torch.empty(n * 16, ROW)
        return lambda: dist.all_to_all_single(out, inp, group=group)

    def ar(group, op):
        t = torch.ones(1024)
        return lambda: dist.all_reduce(t, op=op, group=group)

    def bc(group):
        t = torch.ones(1024)
        return lambda: dist.broadcast(t, src=0, group=group)

    def ag(group):
        inp, out = torch.ones(1024), torch.empty(1024 * n)
        return lambda: dist.all_gather_into_tensor(out, inp, group=group)

    sizes = [256 + 256 * (q % 2) for q in range(n)]  # 1 KiB and 2 KiB per rank, alternating

    def agl(group):
        inp, outs = torch.ones(sizes[rank]), [torch.empty(s) for s in sizes]
        return lambda: dist.all_gather(outs, inp, group=group)

    def agl_raw(group):  # gloo's list all_gather takes one size: what a gloo user writes, padded to the largest
        big = max(sizes)
        inp, out = torch.ones(big), torch.empty(big * n)
        return lambda: dist.all_gather_into_tensor(out, inp, group=group)

    def rsl(group):
        ins, out = [torch.ones(s) for s in sizes], torch.empty(sizes[rank])
        return lambda: dist.reduce_scatter(out, ins, group=group)

    calls = [("uneven all_to_all_single", lambda g: a2a_uneven(g, [splits(n)])),
             ("uneven all_to_all_single, splits alternating", lambda g: a2a_uneven(g, [splits(n), splits(n, 4)])),
             ("even all_to_all_single", a2a_even), ("all_reduce", lambda g: ar(g, R.SUM)),
             ("all_reduce AVG", lambda g: ar(g, R.AVG)), ("broadcast", bc), ("all_gather_into_tensor", ag),
             ("uneven list reduce_scatter", rsl)]
    # (name, the raw side, funcoll's side)
    return [(name, make, make) for name, make in calls] + [("uneven list all_gather (raw: padded)", agl_raw, agl)]


def rank_main(rank: int, n: int, blocks: int) -> list:
    import torch.distributed as dist

    import funcoll

    torch.set_num_threads(1)
    groups = {"native": dist.group.WORLD,
              "xccl": dist.new_group(backend="funcoll", pg_options=funcoll.Options(profile="xccl"))}
    rows = []
    for profile, ours in groups.items():
        stock = stock_group(ours) or dist.new_group(backend="gloo")
        for name, make_raw, make in _calls(n, rank):
            if rank == 0:
                progress(f"scale: world {n}, {profile}: {name}")
            with funcoll.record() as log:
                make(ours)()
            strategies = sorted({s for _, ss in log for s in ss}) or ["native"]
            rows.append({"case": name, "world": n, "profile": profile, "strategy": "; ".join(strategies),
                         **_summary(paired(make_raw(stock), make(ours), blocks))})
        if profile == "xccl" and n > PAIRWISE_WORLD:  # the carried exchange without funcoll's entry and planning
            raw = _calls(n, rank)[0][1](stock)  # the first call's raw side: the same splits
            rows.append({"case": ALONE, "world": n, "profile": profile, "strategy": "carried exchange alone",
                         **_summary(paired(raw, carried_alone(ours, n, rank), blocks))})
        forget_stock(stock)
        dist.barrier()
    return rows


ALONE = "uneven all_to_all_single: the carried exchange alone"


def _summary(r: dict) -> dict:
    """A paired result without its per-block lists (the table reads the medians and quartiles)."""
    return {k: v for k, v in r.items() if k not in ("ratios", "deltas", "cpu_deltas")}


def carried_alone(group, n: int, rank: int):
    """The xccl profile's uneven all_to_all of the first row as ``funcoll.algorithms.move._carried_a2a`` runs it on the
    group's transport (the chunk the planner picks from every rank's statistics, known here), waited: no c10d entry,
    pipeline, validation or planning."""
    from funcoll.algorithms import move, planner

    tp = group.transport("cpu")
    sp = splits(n)
    ins, outs = sp[rank], [sp[i][rank] for i in range(n)]
    inp, out = torch.ones(sum(ins), ROW), torch.empty(sum(outs), ROW)
    row_bytes = ROW * inp.element_size()
    chunk = planner.a2a_plan(n, tuple(planner.split_stats(s) for s in sp), row_bytes).chunk
    mine = planner.split_stats(ins)
    return lambda: move._carried_a2a(tp, out, inp, outs, ins, chunk, mine, row_bytes)[0].wait()


def run(blocks: int = BLOCKS, worlds=(2, 4, 8)) -> list:
    from funcoll.launch import run_world

    rows = []
    for n in worlds:
        progress(f"scale: CPU world of {n}")
        rows += run_world("bench.scale:rank_main", n, None, args=(blocks,), timeout=1800, coll_timeout=300)[0]
    return rows


def table(rows) -> str:
    worlds = sorted({r["world"] for r in rows})
    cases = list(dict.fromkeys((r["case"], r["profile"]) for r in rows))
    by = {(r["case"], r["profile"], r["world"]): r for r in rows}
    head = "| call | profile | " + " | ".join(f"world {w}" for w in worlds) + " |"
    out = [head, "|" + "---|" * (2 + len(worlds))]
    for case, profile in cases:
        cells = []
        for w in worlds:
            r = by.get((case, profile, w))
            cells.append(f"{r['ratio']:.2f} [{r['q1']:.2f}-{r['q3']:.2f}]" if r else "")
        out.append(f"| {case} | {profile} | " + " | ".join(cells) + " |")
    return "\n".join(out)


def strategies(rows) -> str:
    seen = {}
    for r in rows:
        if r["profile"] == "xccl" and r["strategy"] != "native":
            seen.setdefault((r["case"], r["strategy"]), []).append(r["world"])
    return "\n".join(f"- {case}, world {', '.join(map(str, ws))}: `{s}`" for (case, s), ws in seen.items())


MARK, END = "<!-- scale -->", "<!-- /scale -->"


def write(text: str) -> None:
    path = os.path.join(ROOT, "docs", "performance.md")
    page = open(path).read()
    if MARK in page:
        page = page[:page.index(MARK)] + MARK + "\n" + text + "\n" + END + page[page.index(END) + len(END):]
    else:  # above the bench marker, below which ./dev bench rewrites the page
        cut = page.index("<!-- bench -->") if "<!-- bench -->" in page else len(page)
        page = page[:cut] + MARK + "\n" + text + "\n" + END + "\n\n" + page[cut:]
    with open(path, "w") as f:
        f.write(page)


def main(argv) -> int:
    from bench import model

    write_docs = "--no-docs" not in argv
    worlds = (2, 4, 8, 16) if "--16" in argv else (2, 4, 8)
    nums = [a for a in argv if not a.startswith("--")]
    load0 = os.getloadavg()[0]
    rows = run(int(nums[0]) if nums else BLOCKS, worlds)
    load = f"load average {load0:.1f} before, {os.getloadavg()[0]:.1f} after"
    text = (f"Executed (torch {torch.__version__}, {os.cpu_count()} CPUs, {load}): funcoll / stock c10d over the same "
            f"gloo backend, median of the per-block ratios [25%-75%].\n\n" + table(rows)
            + "\n\nThe xccl profile's strategies:\n\n" + strategies(rows) + "\n\n" + model.markdown())
    print(text)
    if write_docs:
        write(text)
        model.plot(os.path.join(ROOT, "docs", "performance-scale.png"))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
