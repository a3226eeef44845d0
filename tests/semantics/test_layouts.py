"""Every rank may hand a collective a different memory layout: the exchange the ranks run is decided only from what
they share (op, dtype, sizes), so each op completes with the right numbers when one rank's tensors are contiguous
and the others' are strided, transposed, offset views or channels-last -- inputs and outputs alike.

Each op runs twice per layout kind (the odd layout on rank 0, then on rank 1, contiguous on the other), on 2-rank
worlds of the native and xccl profiles; the numbers are checked against references built from every rank's input
(tests/reference.py). A plan chosen by one rank alone shows as a hang (the collective timeout fails the world).
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from funcoll.launch import run_world
from tests import reference as ref

KINDS = ["strided", "transposed", "offset", "channels_last"]


def lay(t: torch.Tensor, kind: str) -> torch.Tensor:
    """A new tensor with ``t``'s values and shape in memory layout ``kind`` (never sharing ``t``'s memory)."""
    if kind == "contiguous":
        return t.clone()
    if kind == "strided":  # every other element of a buffer twice as wide
        wide = t.shape[:-1] + (2 * t.shape[-1],) if t.dim() else (2,)
        buf = torch.zeros(wide, dtype=t.dtype)
        v = buf[..., ::2] if t.dim() else buf[0]
        v.copy_(t)
        return v
    if kind == "transposed" and t.dim() >= 2:
        return t.transpose(-1, -2).clone(memory_format=torch.contiguous_format).transpose(-1, -2)
    if kind == "channels_last" and t.dim() == 4:
        return t.clone(memory_format=torch.channels_last)
    # offset (and the fallback of the kinds a shape cannot take): a view 3 elements into a larger buffer
    buf = torch.zeros(t.numel() + 3, dtype=t.dtype)
    v = buf[3:].view(t.shape)
    v.copy_(t)
    return v


def _ops(rank, n, kind, odd):
    """Every op with rank ``odd``'s tensors in layout ``kind``; the others contiguous."""
    c = ref.Cases(rank, n)
    mine = kind if rank == odd else "contiguous"
    shape = (2 * n, 2, 3, 2) if kind == "channels_last" else (2 * n, 6)
    row = shape[1:]
    dt = torch.float32

    aop = [False]  # issue with async_op=True and wait on the Work

    def go(fn, *a, p2p=False, **k):
        if p2p:
            w = fn(*a, **k)
            if aop[0]:
                w.wait()
        elif aop[0]:
            fn(*a, async_op=True, **k).wait()
        else:
            fn(*a, **k)

    def ins(salt, shp=shape, dtype=dt, vals="grid"):
        return ref.all_inputs(n, dtype, shp, f"{salt}/{kind}/{odd}", vals)

    def out_like(shp, dtype=dt):
        return lay(torch.full(shp, -7, dtype=dtype), mine)

    def all_reduce():
        xs = ins("ar")
        t = lay(xs[rank], mine)
        go(dist.all_reduce, t, op=dist.ReduceOp.AVG)
        return ref.close(t, ref.reduce("avg", xs), n, "avg", "grid")

    def all_reduce_int_max():
        xs = ins("ari", dtype=torch.int16, vals="random")
        t = lay(xs[rank], mine)
        go(dist.all_reduce, t, op=dist.ReduceOp.MAX)
        return ref.close(t, ref.reduce("max", xs))

    def all_reduce_coalesced():
        a, b = ins("arc"), ins("arc2", shp=row)
        ts = [lay(a[rank], mine), lay(b[rank], mine)]
        go(dist.all_reduce_coalesced, ts)
        return ref.close(ts[0], ref.reduce("sum", a), n, "sum", "grid") or ref.close(
            ts[1], ref.reduce("sum", b), n, "sum", "grid")

    def all_gather_into_tensor():
        xs = ins("agt")
        out = out_like((n * shape[0],) + row)
        go(dist.all_gather_into_tensor, out, lay(xs[rank], mine))
        return ref.close(out, torch.cat(xs))

    def all_gather():
        xs = ins("ag")
        outs = [out_like(shape) for _ in range(n)]
        go(dist.all_gather, outs, lay(xs[rank], mine))
        return next((ref.close(o, x) for o, x in zip(outs, xs) if ref.close(o, x)), None)

    def reduce_scatter_tensor():
        xs = ins("rst")
        out = out_like((2,) + row)
        go(dist.reduce_scatter_tensor, out, lay(xs[rank], mine), op=dist.ReduceOp.SUM)
        return ref.close(out, ref.reduce("sum", xs)[2 * rank:2 * rank + 2], n, "sum", "grid")

    def reduce_scatter():
        xs = [ins(f"rs{j}") for j in range(n)]  # xs[j][r]: rank r's input for rank j
        out = out_like(shape)
        go(dist.reduce_scatter, out, [lay(xs[j][rank], mine) for j in range(n)], op=dist.ReduceOp.MAX)
        return ref.close(out, ref.reduce("max", xs[rank]))

    def all_to_all_single():
        xs = ins("a2a")
        out = out_like(shape)
        go(dist.all_to_all_single, out, lay(xs[rank], mine))
        k = shape[0] // n
        return ref.close(out, torch.cat([x[rank * k:(rank + 1) * k] for x in xs]))

    def all_to_all_single_uneven():
        # rank r sends r + j + 1 rows to rank j
        rows = [[r + j + 1 for j in range(n)] for r in range(n)]
        xs = [ref.make(dt, (sum(rows[r]),) + row, r, f"a2av/{kind}/{odd}", "grid") for r in range(n)]
        out = out_like((sum(rows[r][rank] for r in range(n)),) + row)
        go(dist.all_to_all_single, out, lay(xs[rank], mine), [rows[r][rank] for r in range(n)], rows[rank])
        want = [xs[r][sum(rows[r][:rank]):sum(rows[r][:rank + 1])] for r in range(n)]
        return ref.close(out, torch.cat(want))

    def all_to_all():
        xs = [ins(f"a2l{j}") for j in range(n)]  # xs[j][r]: what rank r sends to rank j
        outs = [out_like(shape) for _ in range(n)]
        go(dist.all_to_all, outs, [lay(xs[j][rank], mine) for j in range(n)])
        return next((ref.close(outs[r], xs[rank][r]) for r in range(n) if ref.close(outs[r], xs[rank][r])), None)

    def broadcast():
        xs = ins("bc")
        t = lay(xs[rank], mine)
        go(dist.broadcast, t, src=1)
        return ref.close(t, xs[1])

    def reduce():
        xs = ins("red")
        t = lay(xs[rank], mine)
        go(dist.reduce, t, dst=0, op=dist.ReduceOp.SUM)
        return ref.close(t, ref.reduce("sum", xs) if rank == 0 else xs[rank], n if rank == 0 else 1, "sum", "grid")

    def gather():
        xs = ins("ga")
        outs = [out_like(shape) for _ in range(n)] if rank == 0 else None
        go(dist.gather, lay(xs[rank], mine), outs, dst=0)
        if rank:
            return None
        return next((ref.close(o, x) for o, x in zip(outs, xs) if ref.close(o, x)), None)

    def scatter():
        xs = ins("sc")
        out = out_like(shape)
        go(dist.scatter, out, [lay(x, mine) for x in xs] if rank == 1 else None, src=1)
        return ref.close(out, xs[rank])

    def send_recv():
        xs = ins("p2p")
        if rank == 0:
            go(dist.isend if aop[0] else dist.send, lay(xs[0], mine), dst=1, p2p=True)
            return None
        t = out_like(shape)
        go(dist.irecv if aop[0] else dist.recv, t, src=0, p2p=True)
        return ref.close(t, xs[0])

    for fn in (all_reduce, all_reduce_int_max, all_reduce_coalesced, all_gather_into_tensor, all_gather,
               reduce_scatter_tensor, reduce_scatter, all_to_all_single, all_to_all_single_uneven, all_to_all,
               broadcast, reduce, gather, scatter, send_recv):
        for mode in ("blocking", "async"):
            aop[0] = mode == "async"
            c.check(f"{fn.__name__} ({mode}; rank {odd} {kind})", fn)
    return c.failures, c.count


@pytest.mark.parametrize("profile", [None, "xccl"])
def test_every_op_with_a_different_layout_on_each_rank(profile):
    for failures, count in run_world("tests.semantics.test_layouts:_rank", 2, profile, timeout=240, coll_timeout=30):
        assert failures == [], "\n".join(failures)
        assert count == len(KINDS) * 2 * 15 * 2


def _rank(rank, n):
    import funcoll

    failures, count = [], 0
    for kind in KINDS:
        for odd in (0, 1):
            with funcoll.record() as log:
                f, k = _ops(rank, n, kind, odd)
            # the same strategies on every rank: the plan did not read a rank's own layout
            failures += f + _strategies(rank, log)
            count += k
    return failures, count


def _strategies(rank, log):
    """Gathers every rank's strategy log and reports where they differ (through an object collective of the world)."""
    logs = [None] * dist.get_world_size()
    p2p = {"send": "send/recv", "recv": "send/recv"}  # the two sides of one exchange
    dist.all_gather_object(logs, [(p2p.get(op, op), notes) for op, notes in log if op != "barrier"])
    if any(other != logs[0] for other in logs):
        diff = next((i, [lg[i] for lg in logs]) for i in range(len(logs[0])) if any(lg[i] != logs[0][i] for lg in logs))
        return [f"[rank {rank}] the ranks ran different strategies: call {diff[0]}: {diff[1]}"]
    return []
