"""docs/capabilities.md's table, derived from the code (``python -m funcoll.report``): each cell is what funcoll's
algorithms really do for that request on a real transport's capabilities (a dry run over a transport that only
copies), so the docs cannot drift from the code; and the fact tables of docs/xpu.md and docs/torchtpu.md."""

from __future__ import annotations

import itertools

import torch

from funcoll import algorithms, transport
from funcoll.semantics import OPS, ReduceOp, Reduction


def _done(self, *args):
    return transport.DONE


class DryRunTransport(transport.Transport):
    """Shape-correct primitives that move no data between ranks (used only to read which strategy runs)."""

    _all_reduce = _all_reduce_coalesced = _broadcast = _reduce = _gather = _scatter = _send = _recv = _barrier = _done

    list_forms = frozenset({"reduce_scatter", "all_gather"})  # a c10d backend's list forms (gloo, XCCL)
    _reduce_scatter_list = _all_gather_list = _done

    def __init__(self, caps, size=4):
        super().__init__(0, size, caps)

    def _all_gather(self, out, inp):
        out.view(self.size, -1).copy_(inp.reshape(1, -1))
        return transport.DONE

    def _reduce_scatter(self, out, inp, red):
        out.copy_(inp[: out.shape[0]])
        return transport.DONE

    def _all_to_all(self, out, inp, out_splits, in_splits):
        if out.numel() == inp.numel():
            out.copy_(inp)
        return transport.DONE


def _cell(caps, run) -> str:
    tp = DryRunTransport(caps)
    try:
        with algorithms.record() as log:
            run(tp).wait()
    except TypeError:
        return "refused (TypeError)"
    notes = [s for _, ns in log for s in ns]
    return "native" if notes == ["native"] else "; ".join(notes).replace("torch.", "")


def markdown_table(head, rows) -> str:
    """A Markdown table: the ``head`` cells, then one line of cells per row."""
    return "\n".join(["| " + " | ".join(head) + " |", "|" + "---|" * len(head)] +
                     ["| " + " | ".join(cells) + " |" for cells in rows]) + "\n"


def rows():
    n = 4
    f = lambda dt, k=8: torch.ones(k, dtype=dt)  # noqa: E731
    ar = lambda dt, op: (lambda tp: algorithms.all_reduce(tp, f(dt), op))  # noqa: E731
    rs = lambda dt, op: (lambda tp: algorithms.reduce_scatter_tensor(tp, f(dt, 2), f(dt), op))  # noqa: E731
    ag = lambda dt: (lambda tp: algorithms.all_gather_into_tensor(tp, f(dt, 4 * n), f(dt, 4)))  # noqa: E731
    ops = [("sum float32/bfloat16", torch.bfloat16, "sum"), ("avg float32", torch.float32, "avg"),
           ("avg bfloat16/float16", torch.bfloat16, "avg"), ("avg int32", torch.int32, "avg"),
           ("premul_sum float32", torch.float32, Reduction(ReduceOp.PREMUL_SUM, 0.5)),
           ("product int64", torch.int64, "product"), ("min/max float32", torch.float32, "max"),
           ("min/max int32", torch.int32, "max"), ("band/bor/bxor int32", torch.int32, "bxor"),
           ("bxor float32", torch.float32, "bxor")]
    named = {name for label, _, _ in ops for name in label.split()[0].split("/")}
    ops += [(f"{op} float32", torch.float32, str(op)) for op in OPS if str(op) not in named]  # every reduce op shown
    ops += [("sum bool (= any)", torch.bool, "sum"), ("sum int16", torch.int16, "sum"),
            ("sum uint32", torch.uint32, "sum"), ("max uint64", torch.uint64, "max"),
            ("sum complex64", torch.complex64, "sum"), ("max complex64", torch.complex64, "max"),
            ("sum float8_e4m3fn", torch.float8_e4m3fn, "sum")]
    yield from ((f"all_reduce {label}", ar(dtype, op)) for label, dtype, op in ops)
    yield "all_reduce_coalesced (3 float32)", lambda tp: algorithms.all_reduce_coalesced(
        tp, [f(torch.float32, 2), f(torch.float32, 3), f(torch.float32, 4)], "sum")
    yield "reduce_scatter avg float32", rs(torch.float32, "avg")
    yield "reduce_scatter premul_sum float32", rs(torch.float32, Reduction(ReduceOp.PREMUL_SUM, 0.5))
    yield "reduce_scatter bor int32", rs(torch.int32, "bor")
    yield "all_gather float32", ag(torch.float32)
    yield "all_gather uint16", ag(torch.uint16)
    yield "all_gather float8_e4m3fn", ag(torch.float8_e4m3fn)
    mx = lambda dt, k=8: torch.zeros(k, dtype=torch.uint8).view(dt)  # noqa: E731  (torch 2.9 fills no float4)
    yield "all_gather float4_e2m1fn_x2 (or float8_e8m0fnu: an MX tensor's halves)", lambda tp: (
        algorithms.all_gather_into_tensor(tp, mx(torch.float4_e2m1fn_x2, 4 * n), mx(torch.float4_e2m1fn_x2, 4)))
    yield "all_reduce sum float4_e2m1fn_x2", lambda tp: algorithms.all_reduce(tp, mx(torch.float4_e2m1fn_x2), "sum")
    sizes = [1, 2, 3, 2]  # rank r's output of a list reduce_scatter, input of a list all_gather
    yield "reduce_scatter list, uneven sizes", lambda tp: algorithms.reduce_scatter(
        tp, f(torch.float32, 1), [f(torch.float32, k) for k in sizes], "sum")
    yield "all_gather list, uneven sizes", lambda tp: algorithms.all_gather(
        tp, [f(torch.float32, k) for k in sizes], f(torch.float32, 1))
    yield "all_to_all_single even", lambda tp: algorithms.all_to_all_single(tp, f(torch.float32), f(torch.float32))
    yield "all_to_all_single uneven", lambda tp: algorithms.all_to_all_single(
        tp, f(torch.float32, 6), f(torch.float32, 6), [1, 0, 3, 2], [1, 2, 3, 0])
    yield "broadcast", lambda tp: algorithms.broadcast(tp, f(torch.float32), 1)
    yield "reduce", lambda tp: algorithms.reduce(tp, f(torch.float32), 1, "sum")
    yield "gather", lambda tp: algorithms.gather(tp, None, f(torch.float32), 1)
    yield "scatter", lambda tp: algorithms.scatter(tp, f(torch.float32), None, 1)
    yield "barrier", lambda tp: algorithms.barrier(tp)


COLUMNS = ("gloo", "xccl", "xccl-2022-probed", "xccl2", "xla", "torchtpu")
XCCL_COLUMNS_TORCH = "2.15"  # the xccl columns are torch 2.15's row (the newest): the page is the same on every torch
TORCHTPU_COLUMN_VERSION = "0.2.0"  # the torchtpu column: the newest row of funcoll.transport.tpu's table


def transport_capabilities(name: str):
    """The capabilities of a real transport, by column name (docs/capabilities.md says what each column is;
    ``xccl-2022-scale-up``: oneCCL >= 2022.0 on one node before the probe). Any other name is a capability profile."""
    from funcoll.transport import gloo, tpu, xpu

    if name == "gloo":
        return gloo.capabilities("gloo")
    if name == "xccl":
        return xpu.derive(XCCL_COLUMNS_TORCH, None, override="")
    if name in ("xccl-2022-scale-up", "xccl-2022-probed"):
        up = xpu.derive(XCCL_COLUMNS_TORCH, "2022.0", override="", topology="scale-up")
        return (up.unverified or up) if name == "xccl-2022-probed" else up
    if name == "xccl2":
        return xpu.derive(XCCL_COLUMNS_TORCH, None, override="", backend="xccl2")
    if name == "torchtpu":
        return tpu.derive(TORCHTPU_COLUMN_VERSION)
    return transport.profile(name)


def _xccl_cell(key: str, row: str) -> str:
    """funcoll's choice for one XCCL fact on torch ``row``, over the oneCCL versions and topologies that change it."""
    from funcoll.transport import xpu

    def label(oneccl, topology):
        return xpu.derive(row, oneccl, "", topology).sources[f"xccl.{key}"].split(":", 1)[0]

    old = {t: label(None, t) for t in xpu.TOPOLOGIES}
    new = {t: label("2022.0", t) for t in xpu.TOPOLOGIES}
    if len(set(old.values()) | set(new.values())) == 1:
        return old[xpu.SCALE_UP]
    if set(old.values()) == {"strategy"} and set(new.values()) == {"native"}:
        return "native from oneCCL 2022.0"
    for t in xpu.TOPOLOGIES:
        if set(old.values()) == {"strategy"} and new == {u: "native" if u == t else "strategy" for u in xpu.TOPOLOGIES}:
            return f"native from oneCCL 2022.0 ({t})"
    return "; ".join(f"{o or 'unknown'} {t}: {label(o, t)}" for o in (None, "2022.0") for t in xpu.TOPOLOGIES)


def xccl_fact_table() -> str:
    """docs/xpu.md's table: per XCCL fact and torch version, what funcoll does by default (derive(), no override),
    and where FUNCOLL_XPU_OVERRIDE may flip it."""
    from funcoll.transport import xpu

    rows, lines = xpu.TORCH_ROWS, []
    for key, fact in xpu.XCCL_FACTS.items():
        over = {r: xpu.overridable(key, r, (2022, 0)) for r in rows}
        runs = [(topo, list(g)) for topo, g in itertools.groupby(rows, over.__getitem__)]  # consecutive rows alike
        if len(runs) == 1:
            ov = ", ".join(runs[0][0]) or "no"
        else:
            parts = []
            for topo, (first, last) in ((t, (rs[0], rs[-1])) for t, rs in runs if t):
                when = first if first == last else f"{first}+" if last == rows[-1] else f"{first}-{last}"
                extra = " (built against oneCCL >= 2021.17)" if first == "2.11" else ""
                parts.append(f"{when}: {', '.join(topo)}{extra}")
            ov = "; ".join(parts)
        reports = "; ".join(f"{r.ref} ({', '.join(r.topologies)}"
                            f"{'' if r.gpus is None else ', ' + r.seen.split(' (')[0]})"
                            for r in xpu.OPEN_REPORTS if key in r.facts) or "-"
        lines.append([f"`{key}`", fact.what, *(_xccl_cell(key, r) for r in rows), ov, reports, fact.strategy])
    return markdown_table(["fact", "request", *(f"torch {r}" for r in rows), "override",
                           "open reports (strategy there unless probed)", "funcoll's strategy"], lines)


def xccl_fact_details() -> str:
    """docs/xpu.md's list: per XCCL fact, what ProcessGroupXCCL does from which torch version, what depends on the
    oneCCL torch was built against, what is unknown, and the sources."""
    from funcoll.transport import xpu
    from funcoll.transport.facts import version_text

    out = []
    for key, fact in xpu.XCCL_FACTS.items():
        out.append(f"- **`{key}`** ({fact.what}):")
        for (first, what), nxt in zip(fact.by_version, [f for f, _ in fact.by_version[1:]] + [None]):
            last = xpu.TORCH_ROWS[xpu.TORCH_ROWS.index(nxt) - 1] if nxt else None  # the row before the next entry
            when = f"torch {first}+" if last is None else f"torch {first}" if last == first else f"torch {first}-{last}"
            out.append(f"  - {when}: {what}")
        out += [f"  - {label}: {text}" for label, text in
                (("built against", fact.build), ("unknown", fact.unknown), ("sources", fact.source)) if text]
        out += [f"  - open report {r.ref} ({', '.join(r.topologies)}, "
                f"{'any GPU' if r.gpus is None else 'GPU names matching `' + r.gpus + '`'}, "
                f"{'no fixed oneCCL known' if r.fixed_in is None else 'fixed in oneCCL ' + version_text(r.fixed_in)}"
                f"): {r.what}; seen on {r.seen}" for r in xpu.OPEN_REPORTS if key in r.facts]
    return "\n".join(out) + "\n"


def xccl2_fact_table() -> str:
    """docs/xpu.md's xccl2 table: per fact, funcoll's default for the xccl2 backend class (every torch, oneCCL and
    topology alike), where FUNCOLL_XPU_OVERRIDE may flip it, what xccl2 does, and the source."""
    from funcoll.transport import xpu

    caps = transport_capabilities("xccl2")
    return markdown_table(
        ["fact", "request", "funcoll (xccl2)", "override", "xccl2 does", "funcoll's strategy", "source"],
        [[f"`{key}`", fact.what, caps.sources[f"xccl.{key}"].split(":", 1)[0],
          ", ".join(xpu.overridable(key, XCCL_COLUMNS_TORCH, None, "xccl2")) or "no", fact.at(XCCL_COLUMNS_TORCH),
          fact.strategy, fact.source] for key, fact in xpu.XCCL2_FACTS.items()])


def torchtpu_fact_table() -> str:
    """docs/torchtpu.md's table: per TorchTPU fact, what funcoll does with each torch_tpu row (and an unknown version),
    what ProcessGroupTpu does, funcoll's strategy and the evidence."""
    from funcoll.transport import tpu

    def choice(version, key):
        return tpu.derive(version).sources[f"torchtpu.{key}"].split(":", 1)[0]

    return markdown_table(
        ["fact", "request", *(f"torch_tpu {r}" for r in tpu.VERSION_ROWS), "unknown version", "ProcessGroupTpu",
         "funcoll's strategy", "evidence"],
        [[f"`{key}`", fact.what, *(choice(f"{r}.0", key) for r in tpu.VERSION_ROWS), choice(None, key),
          "; ".join(f"{first}+: {what}" for first, what in fact.by_version), fact.strategy, fact.source]
         for key, fact in tpu.TORCHTPU_FACTS.items()])


def capability_table(profiles=COLUMNS) -> str:
    caps = [transport_capabilities(p) for p in profiles]
    return markdown_table(["request", *profiles], [[name, *(_cell(c, run) for c in caps)] for name, run in rows()])


if __name__ == "__main__":
    import sys

    if "--xccl-facts" in sys.argv[1:]:
        print(xccl_fact_table() + "\n" + xccl_fact_details() + "\n" + xccl2_fact_table(), end="")
    elif "--torchtpu-facts" in sys.argv[1:]:
        print(torchtpu_fact_table(), end="")
    else:
        print(capability_table(), end="")
