"""Multi-process numerics: every op x reduce op x dtype, against independent references, for the native
gloo transport and under the xccl, xla and torchtpu capability profiles (the gap-filling strategies run for real).

The rank bodies (``all_ops``, ``functional``, ``subgroups``) run on every rank of a real world
(``funcoll.launch.run_world``); each rank builds the inputs of *every* rank from a seed and compares its results
with references computed locally (tests/reference.py). The valid (op, dtype, reduce op) requests come from
tests/oracle.py (what NCCL, gloo and XCCL accept plus funcoll's promises), not from funcoll's table. One world per
(size, profile) runs every body that applies to it, one after the other (``bodies``), and returns their results
labelled by body; the tests below assert on them.

``all_ops`` runs twice per world: on the path users get by default (the eager fast path on: which strategies ran is
read from the flight recorder, which native calls were made from the transport's ``calls`` counter) and on the full
path (inside ``funcoll.record()``, which turns the fast path off). In both, the ranks hand every op different memory
layouts: one rank's tensors contiguous, the others' strided, transposed or offset views (``lay``), inputs and outputs
alike, the contiguous rank changing from case to case.
"""

from __future__ import annotations

import collections
import contextlib

import pytest
import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as fc

import funcoll
from funcoll.launch import run_world
from tests import profiles
from tests import reference as ref
from tests.semantics.test_layouts import lay
from tests.torchtpu.torchtpu_cases import check_torchtpu_strategies

R = dist.ReduceOp
FLOATS = [torch.float32, torch.bfloat16, torch.float16, torch.float64]
INTS = [torch.int32, torch.int64, torch.int8, torch.uint8, torch.int16, torch.uint16, torch.uint32, torch.uint64]
DTYPES = FLOATS + INTS + [torch.bool, torch.complex64]
MOVABLE = DTYPES + [torch.float8_e4m3fn, torch.float8_e5m2]
PROFILES = [None, "xccl", "xla", "torchtpu"]
ODD_LAYOUTS = ("strided", "transposed", "offset")  # tests/semantics/test_layouts.py's lay(); a 1-d shape: offset


class Layouts:
    """Which memory layout this rank gives the tensors of each case: case k's are contiguous on rank k % n and one of
    :data:`ODD_LAYOUTS` on every other rank (a different one per rank where there are several)."""

    def __init__(self, rank: int, n: int):
        self.rank, self.n, self.k = rank, n, 0

    def next(self) -> str:
        k, self.k = self.k, self.k + 1
        return "contiguous" if self.rank == k % self.n else ODD_LAYOUTS[(k + self.rank) % len(ODD_LAYOUTS)]


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.uint8)


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return torch.equal(_bits(a), _bits(b))


# -- rank bodies: run on every rank by funcoll.launch.run_world; the tests below assert on what they return --
def all_ops(rank, n, path="default"):
    """Every op of docs/design.md section 5, every dtype, every reduce op that applies, with mixed layouts across the
    ranks (:class:`Layouts`). ``path``: "default" (the fast path on) or "full" (inside ``funcoll.record()``)."""
    c = ref.Cases(rank, n)
    others = range(n)
    layouts = Layouts(rank, n)
    check = c.check

    def case(name, fn):  # each case: its own layout on this rank, named in a failure
        mine = layouts.next()
        check(f"{name} [{mine} on rank {rank}]", lambda: fn(lambda t: lay(t, mine)))

    c.check = case
    tp = dist.group.WORLD.transport("cpu")
    before = collections.Counter(tp.calls)
    trace = funcoll.flight_recorder.trace_of(None)
    first_seq = trace.seq
    with (funcoll.record() if path == "full" else contextlib.nullcontext([])) as log:
        for dt in DTYPES:
            for op in ref.valid_ops(dt):
                vals = "small" if op in ("product", "avg") else "random"  # products and int averages in range

                for shape, tag in (((5,), "v"), ((2, 3), "m")):
                    def ar(L, dt=dt, op=op, vals=vals, shape=shape, tag=tag):
                        salt = f"ar/{op}/{tag}"
                        t = L(ref.make(dt, shape, rank, salt, vals))
                        dist.all_reduce(t, op=ref.c10d_op(op))
                        want = ref.reduce(op, ref.all_inputs(n, dt, shape, salt, vals))
                        return ref.close(t, want, n, op)

                    c.check(f"all_reduce {dt} {op} {shape}", ar)

                def rs(L, dt=dt, op=op, vals=vals):
                    salt = f"rs/{op}"
                    inp = L(ref.make(dt, (n * 3, 2), rank, salt, vals))
                    out = L(torch.empty((3, 2), dtype=dt))
                    dist.reduce_scatter_tensor(out, inp, op=ref.c10d_op(op))
                    want = ref.reduce(op, ref.all_inputs(n, dt, (n * 3, 2), salt, vals))
                    want = want[rank * 3:rank * 3 + 3]
                    return ref.close(out, want, n, op)

                c.check(f"reduce_scatter_tensor {dt} {op}", rs)

                def red(L, dt=dt, op=op, vals=vals):
                    salt = f"red/{op}"
                    t = L(ref.make(dt, (2, 3), rank, salt, vals))
                    orig = t.clone()
                    dist.reduce(t, dst=n - 1, op=ref.c10d_op(op))
                    if rank == n - 1:
                        want = ref.reduce(op, ref.all_inputs(n, dt, (2, 3), salt, vals))
                        return ref.close(t, want, n, op)
                    return None if same_bits(t, orig) else "non-dst changed"

                c.check(f"reduce {dt} {op}", red)

            def rsl(L, dt=dt):
                op = "sum" if dt != torch.bool else "bor"
                ins = [L(ref.make(dt, (3, 2), rank, f"rsl/{j}")) for j in range(n)]
                out = L(torch.empty((3, 2), dtype=dt))
                dist.reduce_scatter(out, ins, op=ref.c10d_op(op))
                return ref.close(out, ref.reduce(op, ref.all_inputs(n, dt, (3, 2), f"rsl/{rank}")), n, op)

            c.check(f"reduce_scatter(list) {dt}", rsl)

        for dt in MOVABLE:
            def ag(L, dt=dt):
                inp = L(ref.make(dt, (2, 3), rank, "ag"))
                out = L(torch.empty((2 * n, 3), dtype=dt))
                dist.all_gather_into_tensor(out, inp)
                want = torch.cat(ref.all_inputs(n, dt, (2, 3), "ag"))
                return None if same_bits(out, want) else "mismatch"

            c.check(f"all_gather_into_tensor {dt}", ag)

            def agl(L, dt=dt):
                inp = L(ref.make(dt, (3, 2), rank, "agl"))
                outs = [L(torch.empty((3, 2), dtype=dt)) for _ in others]
                dist.all_gather(outs, inp)
                ok = all(same_bits(o, ref.make(dt, (3, 2), r, "agl")) for r, o in enumerate(outs))
                return None if ok else "mismatch"

            c.check(f"all_gather(list) {dt}", agl)

            def bc(L, dt=dt):
                src = n - 1
                t = L(ref.make(dt, (2, 2), rank, "bc"))
                dist.broadcast(t, src=src)
                want = ref.make(dt, (2, 2), src, "bc")
                return None if same_bits(t, want) else "mismatch"

            c.check(f"broadcast src={n - 1} {dt}", bc)

            def a2a_even(L, dt=dt):
                inp = L(ref.make(dt, (2 * n, 2), rank, "a2ae"))
                out = L(torch.empty((2 * n, 2), dtype=dt))
                dist.all_to_all_single(out, inp)
                want = torch.cat([ref.make(dt, (2 * n, 2), r, "a2ae")[2 * rank:2 * rank + 2] for r in others])
                return None if same_bits(out, want) else "mismatch"

            c.check(f"all_to_all_single even {dt}", a2a_even)

            def a2a_uneven(L, dt=dt):
                # rank r sends splits[r][j] rows to rank j; zeros included
                splits = [[(r + j) % 3 for j in others] for r in others]
                ins = splits[rank]
                outs = [splits[j][rank] for j in others]
                inp = L(ref.make(dt, (sum(ins), 2), rank, "a2au"))
                out = L(torch.empty((sum(outs), 2), dtype=dt))
                dist.all_to_all_single(out, inp, outs, ins)
                parts = []
                for j in others:
                    src = ref.make(dt, (sum(splits[j]), 2), j, "a2au")
                    off = sum(splits[j][:rank])
                    parts.append(src[off:off + splits[j][rank]])
                want = torch.cat(parts)
                return None if same_bits(out, want) else "mismatch"

            c.check(f"all_to_all_single uneven {dt}", a2a_uneven)

        def a2a_list(L):
            ins = [L(ref.make(torch.float32, (j + 1, 2), rank, f"a2al/{j}")) for j in others]
            outs = [L(torch.empty(rank + 1, 2)) for _ in others]
            dist.all_to_all(outs, ins)
            ok = all(torch.equal(outs[j], ref.make(torch.float32, (rank + 1, 2), j, f"a2al/{rank}")) for j in others)
            return None if ok else "mismatch"

        c.check("all_to_all(list) uneven sizes", a2a_list)

        for dt in (torch.float32, torch.int64, torch.bool, torch.uint16):
            def gat(L, dt=dt):
                dst = 1 % n
                inp = L(ref.make(dt, (3, 2), rank, "gat"))
                outs = [L(torch.empty((3, 2), dtype=dt)) for _ in others] if rank == dst else None
                dist.gather(inp, outs, dst=dst)
                if rank != dst:
                    return None
                ok = all(same_bits(o, ref.make(dt, (3, 2), r, "gat")) for r, o in enumerate(outs))
                return None if ok else "mismatch"

            c.check(f"gather dst=1 {dt}", gat)

            def sca(L, dt=dt):
                src = 1 % n
                ins = [L(ref.make(dt, (3, 2), j, "sca")) for j in others] if rank == src else None
                out = L(torch.empty((3, 2), dtype=dt))
                dist.scatter(out, ins, src=src)
                return None if same_bits(out, ref.make(dt, (3, 2), rank, "sca")) else "mismatch"

            c.check(f"scatter src=1 {dt}", sca)

        def p2p(L):
            nxt, prv = (rank + 1) % n, (rank - 1) % n
            t = L(ref.make(torch.float32, (2, 2), rank, "p2p"))
            got = L(torch.empty(2, 2))
            if rank % 2 == 0:
                dist.send(t, nxt)
                dist.recv(got, prv)
            else:
                dist.recv(got, prv)
                dist.send(t, nxt)
            return None if torch.equal(got, ref.make(torch.float32, (2, 2), prv, "p2p")) else "mismatch"

        c.check("send/recv ring", p2p)
        c.check("barrier", lambda L: dist.barrier())

        # the functional collectives take contiguous inputs only (upstream's CPU kernels refuse others on the calling
        # rank: "Expected tensor.is_contiguous() to be true"): these cases ignore their layout
        def coalesced(L):
            ts = [ref.make(torch.float32, (3,), rank, "co/a"), ref.make(torch.int32, (2, 2), rank, "co/b"),
                  ref.make(torch.float32, (1,), rank, "co/c"), ref.make(torch.bfloat16, (2,), rank, "co/d")]
            outs = fc.all_reduce_coalesced(ts, "sum", dist.group.WORLD)
            errs = [ref.close(fc.wait_tensor(o), ref.reduce("sum", ref.all_inputs(n, t.dtype, t.shape, s)), n)
                    for o, t, s in zip(outs, ts, ["co/a", "co/b", "co/c", "co/d"])]
            return "; ".join(e for e in errs if e) or None

        c.check("all_reduce_coalesced sum mixed dtypes", coalesced)

        def coalesced_avg(L):
            ts = [ref.make(torch.float32, (3,), rank, "coa/a"), ref.make(torch.bfloat16, (2,), rank, "coa/b")]
            outs = fc.all_reduce_coalesced(ts, "avg", dist.group.WORLD)
            errs = [ref.close(fc.wait_tensor(o), ref.reduce("avg", ref.all_inputs(n, t.dtype, t.shape, s)), n)
                    for o, t, s in zip(outs, ts, ["coa/a", "coa/b"])]
            return "; ".join(e for e in errs if e) or None

        c.check("all_reduce_coalesced avg", coalesced_avg)

        def ag_coalesced(L):
            ins = [ref.make(torch.float32, (2,), rank, "agc/a"), ref.make(torch.int8, (1, 3), rank, "agc/b"),
                   ref.make(torch.float32, (3,), rank, "agc/c")]
            outs = fc.all_gather_into_tensor_coalesced(ins, dist.group.WORLD)
            errs = []
            for o, i, s in zip(outs, ins, ["agc/a", "agc/b", "agc/c"]):
                want = torch.cat(ref.all_inputs(n, i.dtype, i.shape, s))
                if not torch.equal(fc.wait_tensor(o), want):
                    errs.append(s)
            return ", ".join(errs) or None

        c.check("all_gather_into_tensor_coalesced", ag_coalesced)

        def rs_coalesced(L):
            ins = [ref.make(torch.float32, (n * 2,), rank, "rsc/a"), ref.make(torch.int64, (n, 2), rank, "rsc/b")]
            outs = fc.reduce_scatter_tensor_coalesced(ins, "sum", [0, 0], dist.group.WORLD)
            errs = []
            for o, i, s in zip(outs, ins, ["rsc/a", "rsc/b"]):
                full = ref.reduce("sum", ref.all_inputs(n, i.dtype, i.shape, s))
                k = i.shape[0] // n
                e = ref.close(fc.wait_tensor(o), full[rank * k:(rank + 1) * k], n)
                if e:
                    errs.append(f"{s}: {e}")
            return "; ".join(errs) or None

        c.check("reduce_scatter_tensor_coalesced", rs_coalesced)

        def noncontig(L):
            base = ref.make(torch.float32, (4, 6), rank, "nc")
            t = base.t()  # non-contiguous view
            dist.all_reduce(t, op=R.AVG)
            want = ref.reduce("avg", ref.all_inputs(n, torch.float32, (4, 6), "nc")).t()
            return ref.close(base.t(), want, n)

        c.check("all_reduce non-contiguous avg", noncontig)

        def zero_dim(L):
            t = L(ref.make(torch.float32, (), rank, "zd"))
            dist.all_reduce(t, op=R.MAX)
            return ref.close(t, ref.reduce("max", ref.all_inputs(n, torch.float32, (), "zd")), n, "max")

        c.check("all_reduce 0-dim max", zero_dim)

        def async_work(L):
            t = L(ref.make(torch.float32, (32, 32), rank, "async"))
            w = dist.all_reduce(t, op=R.AVG, async_op=True)
            w.wait()
            return ref.close(t, ref.reduce("avg", ref.all_inputs(n, torch.float32, (32, 32), "async")), n)

        c.check("all_reduce async_op avg", async_work)

    # the native calls this body made: (primitive, reduce op or "", dtype) -> count
    calls = {(p, o, str(d)): v - before[(p, o, d)] for (p, o, d), v in tp.calls.items() if v > before[(p, o, d)]}
    if path == "full":
        strategies = {s for _, notes in log for s in notes}
    else:  # the flight recorder: "native" for the fast path's calls, the strategies of the others
        calls_seen = [e for e in funcoll.flight_recorder.entries() if e.seq is not None and e.seq >= first_seq]
        if len(calls_seen) != trace.seq - first_seq:
            c.failures.append(f"[rank {rank}] the flight recorder kept {len(calls_seen)} of the "
                              f"{trace.seq - first_seq} calls (FUNCOLL_TRACE_BUFFER_SIZE)")
        strategies = {s for e in calls_seen for s in e.strategies}
    # the calls the fast path issued (recorded as NativeEntry, not Call)
    fast = sum(type(e) is funcoll.flight_recorder.NativeEntry and e.seq is not None and e.seq >= first_seq
               for e in list(trace.buffer))
    return {"failures": c.failures, "count": c.count, "calls": calls, "strategies": sorted(strategies),
            "caps": tp.caps.name, "fast": fast}


def all_ops_full(rank, n):
    """:func:`all_ops` on the full path (inside ``funcoll.record()``: the fast path off)."""
    return all_ops(rank, n, "full")


def functional(rank, n):
    """Upstream functional collectives on a funcoll group, eager and compiled (aot_eager, fullgraph)."""
    c = ref.Cases(rank, n)
    g = dist.group.WORLD

    def step(x, y):
        a = fc.all_reduce(x, "avg", g)
        b = fc.all_gather_tensor(y, 0, g)
        r = fc.reduce_scatter_tensor(b, "sum", 0, g)
        s = fc.all_to_all_single(y, [1] * n, [1] * n, g)
        return a * 2, b, r, s

    x = ref.make(torch.float32, (4,), rank, "fx")
    y = ref.make(torch.float32, (n, 2), rank, "fy")
    xs = ref.all_inputs(n, torch.float32, (4,), "fx")
    ys = ref.all_inputs(n, torch.float32, (n, 2), "fy")
    want_a = ref.reduce("avg", xs) * 2
    want_b = torch.cat(ys)
    want_r = torch.cat(ys) * n
    want_r = want_r[rank * n:(rank + 1) * n]
    want_s = torch.stack([yy[rank] for yy in ys])
    compiled = torch.compile(step, fullgraph=True, backend="aot_eager")
    for label, fn in (("eager", step), ("compiled", compiled), ("compiled again", compiled)):
        def run(fn=fn):
            a, b, r, s = [fc.wait_tensor(t) if isinstance(t, torch.Tensor) else t for t in fn(x, y)]
            errs = [ref.close(a, want_a, n), ref.close(b, want_b, n), ref.close(r, want_r, n), ref.close(s, want_s, n)]
            return "; ".join(e for e in errs if e) or None

        c.check(f"functional {label}", run)
    return {"failures": c.failures, "count": c.count}


def subgroups(rank, n):
    """Sub-groups of a 3-rank world, group-local roots, and an invalid root."""
    assert n == 3
    c = ref.Cases(rank, n)
    g02 = dist.new_group([0, 2])
    g1 = dist.new_group([1])
    g21 = dist.new_group([2, 1])  # torch sorts the ranks: group rank 0 is global 1
    if rank in (0, 2):
        def sub_ar():
            t = ref.make(torch.int32, (3,), rank, "sg")
            dist.all_reduce(t, op=R.BXOR, group=g02)
            return ref.close(t, ref.reduce("bxor", [ref.make(torch.int32, (3,), r, "sg") for r in (0, 2)]))

        c.check("all_reduce bxor on [0,2]", sub_ar)

        def sub_bc():
            t = ref.make(torch.float32, (3,), rank, "sgb")
            dist.broadcast(t, src=2, group=g02)  # global 2 = group rank 1
            return None if torch.equal(t, ref.make(torch.float32, (3,), 2, "sgb")) else "mismatch"

        c.check("broadcast src=global 2 on [0,2]", sub_bc)

        def sub_reduce():
            t = ref.make(torch.float32, (3,), rank, "sgr")
            dist.reduce(t, dst=2, op=R.AVG, group=g02)
            if rank != 2:
                return None
            return ref.close(t, ref.reduce("avg", [ref.make(torch.float32, (3,), r, "sgr") for r in (0, 2)]), 2)

        c.check("reduce avg dst=global 2 on [0,2]", sub_reduce)

        def sub_a2a():
            ins = [1, 2] if rank == 0 else [0, 3]
            outs = [1, 0] if rank == 0 else [2, 3]
            inp = ref.make(torch.float32, (sum(ins),), rank, "sga")
            out = torch.empty(sum(outs))
            dist.all_to_all_single(out, inp, outs, ins, group=g02)
            a0, a2 = ref.make(torch.float32, (3,), 0, "sga"), ref.make(torch.float32, (3,), 2, "sga")
            want = a0[:1] if rank == 0 else torch.cat([a0[1:3], a2])
            return None if torch.equal(out, want) else f"got {out.tolist()} want {want.tolist()}"

        c.check("uneven all_to_all_single on [0,2] with a zero split", sub_a2a)

        def bad_root():
            t = torch.zeros(2)
            try:
                dist.broadcast(t, src=1, group=g02)  # global 1 is not in [0,2]
            except ValueError as e:
                return None if "not part of group" in str(e) or "not in group" in str(e) else f"message: {e}"
            return "no error"

        c.check("broadcast from a rank outside the group raises", bad_root)
    if rank == 1:
        def lone():
            t = ref.make(torch.float32, (3,), rank, "lone")
            want = t.clone()
            dist.all_reduce(t, op=R.SUM, group=g1)
            return None if torch.equal(t, want) else "mismatch"

        c.check("all_reduce on a 1-rank group", lone)
    if rank in (1, 2):
        def order():
            t = ref.make(torch.float32, (2,), rank, "ord")
            dist.broadcast(t, src=2, group=g21)  # group rank 1
            ok = torch.equal(t, ref.make(torch.float32, (2,), 2, "ord"))
            name = g21.group_name
            ranks_ok = (funcoll.groups.to_group(name, 2) == dist.get_group_rank(g21, 2) == 1
                        and funcoll.groups.to_global(name, 0) == 1 and funcoll.groups.lookup(name).ranks == (1, 2))
            return None if ok and ranks_ok else f"ok={ok} ranks_ok={ranks_ok}"

        c.check("group [2,1]: group-local rank order", order)
    dist.barrier()
    return {"failures": c.failures, "count": c.count}


def bodies(rank, n, names):
    """The rank bodies ``names`` one after the other in this world: ``{name: its result}`` (``all_ops`` and
    ``all_ops_full`` count the native calls they make themselves)."""
    return {name: globals()[name](rank, n) for name in names}


# which bodies run in the world of (size, profile); the deadline is the sum of theirs
_ALL = ("all_ops", "all_ops_full")
BODIES = {(2, None): _ALL + ("functional",), (2, "xccl"): _ALL + ("functional",), (2, "xla"): _ALL,
          (3, None): _ALL + ("subgroups",), (3, "xccl"): _ALL + ("subgroups",), (3, "xla"): _ALL,
          (2, "torchtpu"): _ALL + ("functional",), (3, "torchtpu"): _ALL}
DEADLINE = {"all_ops": 400, "all_ops_full": 400, "functional": 300, "subgroups": 200}
# the flight recorder keeps every call of all_ops (its strategies are read there on the default path)
ENV = {"FUNCOLL_TRACE_BUFFER_SIZE": "100000"}
PATHS = {"default": "all_ops", "full": "all_ops_full"}


# -- the tests -----------------------------------------------------------------------------------------
def _report(results):
    failures = [f for r in results for f in r["failures"]]
    assert not failures, f"{len(failures)} failing cases:\n" + "\n".join(failures[:30])


@pytest.fixture(scope="module")
def worlds():
    """``worlds(size, profile, body)``: every rank's result of ``body`` in the one world of (size, profile)."""
    cache: dict = {}

    def get(world, profile, body):
        key = (world, profile)
        if key not in cache:
            names = BODIES[key]
            try:
                cache[key] = run_world("tests.numerics.test_numerics:bodies", world, profile, args=(names,),
                                       timeout=sum(DEADLINE[b] for b in names), env=ENV)
            except (AssertionError, TimeoutError) as e:  # a world that failed fails every test reading it, once
                cache[key] = e
        if isinstance(cache[key], Exception):
            raise cache[key]
        return [r[body] for r in cache[key]]

    return get


@pytest.fixture(scope="module")
def matrix(worlds):
    """``matrix(size, profile, path="default")``: every rank's result of :func:`all_ops` on ``path``."""
    return lambda world, profile, path="default": worlds(world, profile, PATHS[path])


@pytest.mark.parametrize("path", list(PATHS))
@pytest.mark.parametrize("world", [2, 3])
@pytest.mark.parametrize("profile", profiles.params(PROFILES, ["gloo", "xccl", "xla", "torchtpu"]))
def test_every_op_dtype_reduce_op(matrix, world, profile, path):
    results = matrix(world, profile, path)
    assert results[0]["count"] > 300
    # the default path took the fast path where it applies, the full path never
    assert all(r["fast"] > 50 if path == "default" else r["fast"] == 0 for r in results), [r["fast"] for r in results]
    assert results[0]["caps"] == ("gloo" if profile is None else f"gloo[{profile}]")
    _report(results)


_XCCL_PREMUL_NATIVE = funcoll.PROFILES["xccl"].reduces("all_reduce", funcoll.semantics.ReduceOp.PREMUL_SUM,
                                                         torch.float32)


@pytest.mark.parametrize("path", list(PATHS))
@pytest.mark.parametrize("world", [2, 3])
def test_xccl_profile_never_calls_what_xccl_lacks(matrix, world, path):
    results = matrix(world, "xccl", path)
    for r in results:
        calls = r["calls"]
        for key in calls:
            prim, op, dtype = key
            # torch 2.12+: ProcessGroupXCCL does PREMUL_SUM itself on all_reduce (the profile follows that row)
            premul_ok = op == "premul_sum" and prim == "all_reduce" and _XCCL_PREMUL_NATIVE
            assert op not in ("avg", "premul_sum", "band", "bor", "bxor") or premul_ok, key
            assert dtype not in ("torch.int16", "torch.uint16", "torch.uint32", "torch.uint64"), key
            if op in ("min", "max"):
                assert dtype.startswith("torch.float") or dtype == "torch.bfloat16", key
        # the strategies that fill those gaps did run
        s = r["strategies"]
        for needed in ("avg=sum+scale", "avg=float32 reduce_scatter+scale+all_gather", "avg=sum+scale in float32",
                       "premul_sum=scale+sum", "all_to_all+local bxor+all_gather", "all_to_all+local max+all_gather",
                       "widen torch.int16->torch.int32", "torch.uint64 reduced as torch.int64",
                       "torch.uint32 max as torch.int32 with the sign bit flipped", "all_to_all+local band",
                       "bool sum as uint8 count+compare", "bool bxor as uint8 count+compare"):
            assert needed in s, (needed, s)
        # uneven all_to_all: pairwise rounds at world 2, the carried exchange above it
        if world == 2:
            assert "uneven all_to_all=pairwise send/recv" in s, s
        else:
            assert any(x.startswith("uneven all_to_all=carried") for x in s), s
        assert not any(x.startswith("gather+local") or x.startswith("uneven all_to_all=pad") for x in s), s
        assert "torch.float8_e4m3fn moved as torch.uint8" in s


@pytest.mark.parametrize("path", list(PATHS))
@pytest.mark.parametrize("world", [2, 3])
def test_native_gloo_uses_native_avg_and_bitwise(matrix, world, path):
    results = matrix(world, None, path)
    calls = results[0]["calls"]
    assert calls.get(("all_reduce", "avg", "torch.float32"), 0) > 0
    assert calls.get(("all_reduce", "bxor", "torch.int32"), 0) > 0
    # every all_to_all reached gloo as one native all_to_all, uneven splits included (gloo has them): one call per
    # even and one per uneven all_to_all_single of each dtype (a dtype gloo does not carry goes as one of the same
    # width) and one for the all_to_all list
    a2a = {key: count for key, count in calls.items() if key[0] == "all_to_all"}
    assert a2a.get(("all_to_all", "", "torch.float32"), 0) > 0, a2a
    assert sum(a2a.values()) == 2 * len(MOVABLE) + 1, a2a
    assert not any(s.startswith("uneven all_to_all=pad") for s in results[0]["strategies"])
    assert "avg=sum+scale" not in results[0]["strategies"]


@pytest.mark.parametrize("path", list(PATHS))
@pytest.mark.parametrize("world", [2, 3])
def test_torchtpu_profile_never_calls_what_processgrouptpu_lacks(matrix, world, path):
    """Under FUNCOLL_PROFILE=torchtpu no request ProcessGroupTpu refuses or gets wrong reaches the backend: no
    PREMUL_SUM, no AVG on integers or fp16/bf16 (summed in the dtype), no reduce, no coalesced all_reduce, no uneven
    all_to_all (a store round trip per call), no broadcast or scatter (zeros + SUM: -0.0 lost)."""
    profiles.require("torchtpu")
    for r in matrix(world, "torchtpu", path):
        for prim, op, dtype in r["calls"]:
            assert op != "premul_sum", (prim, op, dtype)
            assert not (op == "avg" and dtype not in ("torch.float32", "torch.float64")), (prim, op, dtype)
            assert prim not in ("reduce", "all_reduce_coalesced", "broadcast", "scatter"), (prim, op, dtype)
        check_torchtpu_strategies(r["strategies"])
        assert any(x.startswith("flat buffer of") for x in r["strategies"]), r["strategies"]
        # what ProcessGroupTpu has natively went to it
        assert r["calls"].get(("all_reduce", "avg", "torch.float32"), 0) > 0
        assert r["calls"].get(("all_reduce", "bxor", "torch.int32"), 0) > 0


@pytest.mark.parametrize("path", list(PATHS))
def test_xla_profile_fills_broadcast_and_bxor(matrix, path):
    profiles.require("xla")
    s = matrix(2, "xla", path)[0]["strategies"]
    assert "broadcast=masked all_reduce" in s, s
    assert "all_to_all+local bxor+all_gather" in s and "gather=all_gather" in s and "scatter=broadcast+slice" in s
    assert any(x.startswith("uneven all_to_all=pad to") for x in s), s  # XLA: no per-pair sizes
    assert "reduce=all_reduce" in s and "barrier=all_reduce of one element" in s


@pytest.mark.parametrize("profile", [None, "xccl", "torchtpu"], ids=["gloo", "xccl", "torchtpu"])
def test_functional_collectives_eager_and_compiled(worlds, profile):
    _report(worlds(2, profile, "functional"))


@pytest.mark.parametrize("profile", [None, "xccl"], ids=["gloo", "xccl"])
def test_subgroups_of_three(worlds, profile):
    _report(worlds(3, profile, "subgroups"))
