"""Every rank may hand a collective a different memory layout, and split sizes that happen to be equal on one rank
only: the exchange the ranks run is decided only from what they share (op, dtype, sizes, whether split sizes are
passed), so each op completes with the right numbers when one rank's tensors are contiguous and the others' are
strided, transposed, offset views or channels-last -- inputs and outputs alike -- and when every rank's layout
differs.

Each op runs blocking and async per layout round: the odd layout on each rank in turn (contiguous on the others),
then rounds where every rank has a layout of its own, at worlds 2 and 3, on the native, xccl and xla profiles. It
runs on the path users get by default (the eager fast path on: a contiguous request the backend serves goes
straight to it, a strided one takes the full path), then again on the full path (under ``funcoll.record()``, which
turns the fast path off). The numbers are checked against references built from every rank's input
(tests/reference.py). Which exchange each rank ran is read without turning the fast path off: the backend methods the
group's transport called (both paths call the backend through it) and the strategies in the flight recorder; they
must be the same on every rank, call by call. A plan chosen by one rank alone shows there, or as a hang (the
collective timeout fails the world).

all_to_all_single with split sizes that are uneven across the group but all equal on one rank (the even exchange
would be right for that rank alone) runs in every round, and as an async batch on a sub-group at world 3; that case
runs on the torchtpu profile too.
"""

from __future__ import annotations

import contextlib
import functools

import pytest
import torch
import torch.distributed as dist

from funcoll.launch import run_world
from tests import reference as ref

KINDS = ["strided", "transposed", "offset", "channels_last"]
LAYOUTS = ["contiguous"] + KINDS
LIST_OPS = ("all_gather", "reduce_scatter")  # the list forms: a world of their own (a rank may abort on a mismatch)
N_OPS = 17 + hasattr(dist, "gather_single")


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


def rounds(n: int, full: bool = False) -> list:
    """(name, every rank's layout): each odd kind on each rank in turn, then two rounds where every rank's layout
    differs (together they hold every kind); ``full``: those two alone (the full path's run)."""
    out = [] if full else [(f"rank {odd} {kind}", [kind if r == odd else "contiguous" for r in range(n)])
                           for kind in KINDS for odd in range(n)]
    out += [(f"mixed {s}", [LAYOUTS[(r + s) % len(LAYOUTS)] for r in range(n)]) for s in (1, 3)]
    return out


def mixed_evenness(n: int) -> list:
    """``rows[i][j]``: the rows rank i sends rank j, uneven across the group but all equal on rank 0 (at 3 ranks on
    ranks 0 and 1): rank 0 sends and receives one row per peer; the last rank sends itself more."""
    rows = [[1] * n for _ in range(n)]
    rows[n - 1][n - 1] = n
    return rows


def _a2a_mixed(rank, n, rows, mine, row, salt, go):
    """all_to_all_single with ``rows`` (see :func:`mixed_evenness`), this rank's tensors in layout ``mine``, issued
    with ``go(fn, *args)``: ``(what go returned, the check)``."""
    dt = torch.float32
    xs = [ref.make(dt, (sum(rows[r]),) + row, r, salt, "grid") for r in range(n)]
    out = lay(torch.full((sum(rows[r][rank] for r in range(n)),) + row, -7.0), mine)
    work = go(dist.all_to_all_single, out, lay(xs[rank], mine), [rows[r][rank] for r in range(n)], rows[rank])
    want = torch.cat([xs[r][sum(rows[r][:rank]):sum(rows[r][:rank + 1])] for r in range(n)])
    return work, lambda: ref.close(out, want)


def _ops(rank, n, layouts, tag, which, traced, g):
    """Every op (``which``: the list forms, or the others) on group ``g`` (every rank of the world), each rank's
    tensors in its layout of ``layouts``."""
    mine = layouts[rank]
    shape = (2 * n, 2, 3, 2) if "channels_last" in layouts else (2 * n, 6)
    row = shape[1:]
    dt = torch.float32

    aop = [False]  # issue with async_op=True and wait on the Work

    def go(fn, *a, **k):
        if aop[0]:
            fn(*a, async_op=True, group=g, **k).wait()
        else:
            fn(*a, group=g, **k)

    def ins(salt, shp=shape, dtype=dt, vals="grid"):
        return ref.all_inputs(n, dtype, shp, f"{salt}/{tag}", vals)

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

    def all_to_all_single_even_splits():  # every rank passes equal split sizes
        xs = ins("a2ae")
        out = out_like(shape)
        k = shape[0] // n
        go(dist.all_to_all_single, out, lay(xs[rank], mine), [k] * n, [k] * n)
        return ref.close(out, torch.cat([x[rank * k:(rank + 1) * k] for x in xs]))

    def all_to_all_single_uneven():
        # rank r sends r + j + 1 rows to rank j
        rows = [[r + j + 1 for j in range(n)] for r in range(n)]
        xs = [ref.make(dt, (sum(rows[r]),) + row, r, f"a2av/{tag}", "grid") for r in range(n)]
        out = out_like((sum(rows[r][rank] for r in range(n)),) + row)
        go(dist.all_to_all_single, out, lay(xs[rank], mine), [rows[r][rank] for r in range(n)], rows[rank])
        want = [xs[r][sum(rows[r][:rank]):sum(rows[r][:rank + 1])] for r in range(n)]
        return ref.close(out, torch.cat(want))

    def all_to_all_single_mixed_evenness():
        return _a2a_mixed(rank, n, mixed_evenness(n), mine, row, f"a2am/{tag}", go)[1]()

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

    def gather_single():  # torch >= 2.10: the root's one output tensor
        xs = ins("gs")
        out = out_like((n * shape[0],) + row) if rank == 0 else None
        go(dist.gather_single, lay(xs[rank], mine), out, dst=0)
        return ref.close(out, torch.cat(xs)) if rank == 0 else None

    def scatter():
        xs = ins("sc")
        out = out_like(shape)
        go(dist.scatter, out, [lay(x, mine) for x in xs] if rank == 1 else None, src=1)
        return ref.close(out, xs[rank])

    def send_recv():  # a ring: to the next rank, from the previous one
        xs = ins("p2p")
        t = out_like(shape)
        nxt, prev = (rank + 1) % n, (rank - 1) % n
        if aop[0]:
            ws = [dist.isend(lay(xs[rank], mine), dst=nxt, group=g), dist.irecv(t, src=prev, group=g)]
            for w in ws:
                w.wait()
        elif rank == 0:
            dist.send(lay(xs[rank], mine), dst=nxt, group=g)
            dist.recv(t, src=prev, group=g)
        else:
            dist.recv(t, src=prev, group=g)
            dist.send(lay(xs[rank], mine), dst=nxt, group=g)
        return ref.close(t, xs[prev])

    ops = (all_reduce, all_reduce_int_max, all_reduce_coalesced, all_gather_into_tensor, all_gather,
           reduce_scatter_tensor, reduce_scatter, all_to_all_single, all_to_all_single_even_splits,
           all_to_all_single_uneven, all_to_all_single_mixed_evenness, all_to_all, broadcast, reduce, gather, scatter,
           send_recv) + ((gather_single,) if hasattr(dist, "gather_single") else ())
    assert len(ops) == N_OPS
    for fn in ops:
        if (fn.__name__ in LIST_OPS) != (which == "lists"):
            continue
        for mode in ("blocking", "async"):
            aop[0] = mode == "async"
            traced(f"{fn.__name__} ({mode}; {tag})", fn)


# ---------------------------------------------------------------------------------------------------
# which exchange a rank ran, read without turning the fast path off
# ---------------------------------------------------------------------------------------------------
_COLLECTIVES = frozenset({"allreduce", "allreduce_coalesced", "_allgather_base", "allgather", "_reduce_scatter_base",
                          "reduce_scatter", "alltoall_base", "alltoall", "broadcast", "reduce", "gather", "scatter",
                          "send", "recv", "barrier"})


class _Methods:
    """Stands in for a group's backend in its CPU transport and logs the backend methods called: the fast path's
    native call and the full path's primitives both go through it. Send and receive are one exchange's two sides;
    ``alltoall_base`` is logged with whether it got split sizes (the even and the uneven exchange)."""

    def __init__(self, backend, log: list):
        self._backend, self._log = backend, log

    def __getattr__(self, name):
        attr = getattr(self._backend, name)
        if name not in _COLLECTIVES:
            return attr

        def call(*a, **k):
            if name == "alltoall_base":
                self._log.append(f"alltoall_base({'split sizes' if a[2] or a[3] else 'even'})")
            else:
                self._log.append("send/recv" if name in ("send", "recv") else name)
            return attr(*a, **k)

        return call


def _watch(c, g, seen: list):
    """``traced(name, fn)`` for group ``g``: runs one check of ``c`` and appends to ``seen`` what this rank's exchange
    was, ``(name, backend methods, strategies)``: the backend methods called (a set: how many sends a pairwise
    exchange makes depends on the rank's own splits; a carried uneven all_to_all sends messages only for the splits
    above its chunk, so point-to-point is left out of an all_to_all's set) and each new flight-recorder entry's
    strategies (a native call is "native" on either path)."""
    from funcoll.entry.flight_recorder import NativeEntry, trace_of

    tp = g.transport("cpu")
    log: list = []
    tp.backend = _Methods(tp.backend, log)
    g._state.native.clear()  # a cached native call holds the backend's own method: looked up again, through the spy
    trace = trace_of(g)

    def traced(name, fn):
        seq, p2p, first = trace.seq, trace.p2p_seq, len(log)
        c.check(name, fn)
        new = [e for e in list(trace.buffer)[-8:]  # the entries this check made (a few at most), oldest first
               if (e.seq is not None and e.seq >= seq) or (e.p2p_seq is not None and e.p2p_seq >= p2p)]
        called = set(log[first:]) - ({"send/recv"} if name.startswith("all_to_all") else set())
        seen.append((name, sorted(called),
                     [["native"] if type(e) is NativeEntry else list(e.strategies) or ["native"] for e in new]))

    return traced


def _group(profile):
    """A group of the whole world whose CPU transport has the capabilities of ``profile`` (None: gloo's own)."""
    import funcoll

    return dist.new_group(backend="funcoll", pg_options=funcoll.Options(profile=profile))


def _subgroup_batch(rank, c, profile, seen):
    """On the sub-group of global ranks 0 and 2 of a 3-rank world: an async batch (all_to_all_single with
    mixed-evenness split sizes, an all_reduce, an all_to_all_single without split sizes and one with equal ones),
    waited in reverse order."""
    import funcoll

    g = dist.new_group([0, 2], backend="funcoll", pg_options=funcoll.Options(profile=profile))
    if rank not in (0, 2):
        return
    me, m = dist.get_rank(g), 2
    traced = _watch(c, g, seen)

    def batch():
        works, checks = [], []

        def go(fn, *a, **k):
            works.append(fn(*a, async_op=True, group=g, **k))

        checks.append(_a2a_mixed(me, m, mixed_evenness(m), "contiguous" if me else "strided", (3,), "sub a2am", go)[1])
        xs = ref.all_inputs(m, torch.float32, (4,), "sub ar", "grid")
        t = xs[me].clone()
        go(dist.all_reduce, t)
        checks.append(lambda: ref.close(t, ref.reduce("sum", xs), m, "sum", "grid"))
        for k, splits in (("even", None), ("equal splits", [2, 2])):
            ys = ref.all_inputs(m, torch.float32, (4, 3), f"sub a2a {k}", "grid")
            o = torch.empty(4, 3)
            go(dist.all_to_all_single, o, ys[me], splits, splits)
            checks.append(lambda o=o, ys=ys: ref.close(o, torch.cat([y[2 * me:2 * me + 2] for y in ys])))
        for w in reversed(works):
            w.wait()
        return next((f for f in (ch() for ch in checks) if f), None)

    traced(f"async batch on the sub-group [0, 2] ({profile or 'native'})", batch)


PROFILES = (None, "xccl", "xla")


def _rank(rank, n, which="ops"):
    """Every op on one group per profile of :data:`PROFILES` (the default path, then the full path), and the sub-group
    batch at world 3: ``(failures, count, the exchanges per group, the sub-groups' exchanges)``."""
    import funcoll

    c = ref.Cases(rank, n)
    seen: dict = {}
    sub: list = []
    for profile in PROFILES:
        g = _group(profile)
        traced = _watch(c, g, seen.setdefault(str(profile), []))
        for full in (False, True):  # the default path (the fast path on), then the full path
            for name, layouts in rounds(n, full):
                tag = f"{profile or 'native'}, {name}{', full path' if full else ''}"
                with funcoll.record() if full else contextlib.nullcontext():
                    _ops(rank, n, layouts, tag, which, traced, g)
        if n == 3 and which == "ops":
            _subgroup_batch(rank, c, profile, sub)
    return c.failures, c.count, seen, sub


def _same_exchange(per_rank: list, members) -> list:
    """Where the ranks ``members`` ran different exchanges for the same call: ``[call: rank -> exchange]``."""
    first = per_rank[members[0]]
    assert all(len(per_rank[r]) == len(first) for r in members), [len(per_rank[r]) for r in members]
    out = []
    for i, (name, _, _) in enumerate(first):
        got = {r: per_rank[r][i][1:] for r in members}
        assert all(per_rank[r][i][0] == name for r in members), name
        if any(v != got[members[0]] for v in got.values()):
            out.append(f"{name}: the ranks ran different exchanges {got}")
    return out


def _check(results, n, which):
    per_round = 2 * (len(LIST_OPS) if which == "lists" else N_OPS - len(LIST_OPS))  # ops x (blocking, async)
    for rank, (failures, count, _, _) in enumerate(results):
        assert failures == [], "\n".join(failures)
        sub = n == 3 and which == "ops" and rank != 1
        assert count == len(PROFILES) * ((len(rounds(n)) + len(rounds(n, True))) * per_round + sub)
    for profile in PROFILES:
        assert _same_exchange([r[2][str(profile)] for r in results], list(range(n))) == []
    if n == 3 and which == "ops":
        assert _same_exchange([r[3] for r in results], [0, 2]) == []


@pytest.mark.parametrize("n", [2, 3])
def test_every_op_with_a_different_layout_on_each_rank(n):
    _check(run_world("tests.semantics.test_layouts:_rank", n, timeout=300, coll_timeout=30), n, "ops")


@pytest.mark.parametrize("n", [2, 3])
def test_list_collectives_with_a_different_layout_on_each_rank(n):
    """The list all_gather and reduce_scatter: a rank whose exchange differs from its peers' may be aborted by gloo
    ("Received data size doesn't match expected size"), so they run in a world of their own."""
    _check(run_world("tests.semantics.test_layouts:_rank", n, args=("lists",), timeout=300, coll_timeout=30), n,
           "lists")


def _rank_mixed_evenness(rank, n):
    """The mixed-evenness all_to_all_single alone on the world (blocking and async, this rank's tensors contiguous,
    then strided), and the sub-group batch at world 3."""
    c = ref.Cases(rank, n)
    seen: list = []
    sub: list = []
    g = dist.group.WORLD
    traced = _watch(c, g, seen)

    def one(mine, aop):
        def go(fn, *a, **k):
            w = fn(*a, async_op=aop, **k)
            if aop:
                w.wait()

        return _a2a_mixed(rank, n, mixed_evenness(n), mine, (2,), f"me {mine} {aop}", go)[1]()

    for mine in ("contiguous", "strided"):
        for aop in (False, True):
            traced(f"mixed evenness ({mine}, async={aop})", functools.partial(one, mine, aop))
    if n == 3:
        _subgroup_batch(rank, c, "torchtpu", sub)
    return c.failures, c.count, seen, sub


@pytest.mark.parametrize("n", [2, 3])
def test_split_sizes_equal_on_one_rank_only_on_torchtpu(n):
    """The torchtpu profile (no uneven all_to_all, no per-pair message sizes: the padded exchange after the split
    sizes' agreement): the mixed-evenness all_to_all_single completes with the right rows on every rank."""
    results = run_world("tests.semantics.test_layouts:_rank_mixed_evenness", n, "torchtpu", timeout=120,
                        coll_timeout=30)
    for rank, (failures, count, _, _) in enumerate(results):
        assert failures == [], "\n".join(failures)
        assert count == 4 + (n == 3 and rank != 1)
    assert _same_exchange([r[2] for r in results], list(range(n))) == []
    if n == 3:
        assert _same_exchange([r[3] for r in results], [0, 2]) == []
