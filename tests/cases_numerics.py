"""Rank-side cases for the multi-process numerics tests.

Every rank builds the inputs of *every* rank from a seed, so each result is compared with a reference
computed locally and independently: Python integers (wrapped to the dtype's width) for integer dtypes,
float64/complex128 for floating ones. Nothing is exchanged to build a reference.
"""

from __future__ import annotations

import functools
import math
import operator
import traceback
import zlib

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as fc

import funcoll

R = dist.ReduceOp
FLOATS = [torch.float32, torch.bfloat16, torch.float16, torch.float64]
INTS = [torch.int32, torch.int64, torch.int8, torch.uint8, torch.int16, torch.uint16, torch.uint32, torch.uint64]
DTYPES = FLOATS + INTS + [torch.bool, torch.complex64]
OPS = {"sum": R.SUM, "avg": R.AVG, "product": R.PRODUCT, "min": R.MIN, "max": R.MAX, "band": R.BAND,
       "bor": R.BOR, "bxor": R.BXOR, "premul_sum": None}
PREMUL = 0.5
BITS = {torch.int8: 8, torch.uint8: 8, torch.int16: 16, torch.uint16: 16, torch.int32: 32, torch.uint32: 32,
        torch.int64: 64, torch.uint64: 64}
UNSIGNED = {torch.uint8, torch.uint16, torch.uint32, torch.uint64}


def valid_ops(dtype):
    if dtype.is_complex:
        return ["sum", "avg"]
    if dtype == torch.bool:
        return ["sum", "product", "min", "max", "band", "bor", "bxor"]
    if dtype.is_floating_point:
        return ["sum", "avg", "product", "min", "max", "premul_sum"]
    ops = ["sum", "product", "min", "max", "band", "bor", "bxor"]
    return ops + (["avg"] if dtype != torch.uint64 else [])


def c10d_op(name):
    return dist._make_nccl_premul_sum(PREMUL) if name == "premul_sum" else OPS[name]


# -- inputs ------------------------------------------------------------------------------------------
def make(dtype, shape, rank, salt):
    g = torch.Generator().manual_seed(zlib.crc32(f"{salt}/{rank}/{dtype}".encode()))
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=g).bool()
    if dtype.is_complex:
        return torch.complex(torch.randn(shape, generator=g), torch.randn(shape, generator=g)).to(dtype)
    if dtype.is_floating_point:
        return (torch.randn(shape, generator=g) * 2).to(dtype)
    if dtype in (torch.float8_e4m3fn, torch.float8_e5m2):
        return torch.randn(shape, generator=g).to(dtype)
    bits = BITS[dtype]
    if "small" in salt:  # products stay in range for exactness checks of the narrow path
        return torch.randint(1, 4, shape, generator=g).to(dtype)
    if dtype == torch.uint64:
        return torch.randint(-2 ** 62, 2 ** 62, shape, generator=g).mul_(2).add_(1).view(torch.uint64)
    if dtype in UNSIGNED:
        return torch.randint(0, 2 ** bits, shape, generator=g).to(dtype)
    return torch.randint(-2 ** (bits - 1), 2 ** (bits - 1) - 1, shape, generator=g).to(dtype)


# -- references ---------------------------------------------------------------------------------------
def to_ints(t):
    if t.dtype == torch.uint64:
        return [x % 2 ** 64 for x in t.view(torch.int64).reshape(-1).tolist()]
    return t.to(torch.int64).reshape(-1).tolist()


def from_ints(vals, dtype, shape):
    bits = BITS[dtype]
    wrapped = []
    for v in vals:
        v %= 2 ** bits
        if dtype not in UNSIGNED and v >= 2 ** (bits - 1):
            v -= 2 ** bits
        wrapped.append(v)
    if dtype == torch.uint64:
        return torch.tensor([v - 2 ** 64 if v >= 2 ** 63 else v for v in wrapped],
                            dtype=torch.int64).view(torch.uint64).reshape(shape)
    return torch.tensor(wrapped, dtype=torch.int64).to(dtype).reshape(shape)


def _trunc_div(s, n):
    q = abs(s) // n
    return q if s >= 0 else -q


def reference(op, xs):
    """Reduces the list of rank tensors ``xs`` with ``op``, independently of torch's collectives."""
    dtype, shape, n = xs[0].dtype, xs[0].shape, len(xs)
    if dtype == torch.bool:
        cols = list(zip(*[x.reshape(-1).tolist() for x in xs]))
        f = {"sum": any, "max": any, "bor": any, "product": all, "min": all, "band": all,
             "bxor": lambda c: sum(c) % 2 == 1}[op]
        return torch.tensor([f(c) for c in cols], dtype=torch.bool).reshape(shape)
    if dtype in BITS:
        cols = list(zip(*[to_ints(x) for x in xs]))
        f = {"sum": sum, "product": lambda c: functools.reduce(operator.mul, c, 1), "min": min, "max": max,
             "band": lambda c: functools.reduce(operator.and_, c), "bor": lambda c: functools.reduce(operator.or_, c),
             "bxor": lambda c: functools.reduce(operator.xor, c), "avg": lambda c: _trunc_div(sum(c), n)}[op]
        signed = []
        for c in cols:
            if dtype in UNSIGNED or op in ("band", "bor", "bxor"):
                signed.append(f(c))
            else:
                signed.append(f(c))
        return from_ints(signed, dtype, shape)
    wide = torch.complex128 if dtype.is_complex else torch.float64
    st = torch.stack([x.to(wide) for x in xs])
    if op == "sum":
        r = st.sum(0)
    elif op == "avg":
        r = st.sum(0) / n
    elif op == "premul_sum":
        r = (st * PREMUL).sum(0)
    elif op == "product":
        r = st.prod(0)
    elif op == "min":
        r = st.amin(0)
    else:
        r = st.amax(0)
    return r.to(dtype)


def close(got, want, n=1, op="sum"):
    if got.dtype != want.dtype or got.shape != want.shape:
        return f"dtype/shape {got.dtype}{tuple(got.shape)} != {want.dtype}{tuple(want.shape)}"
    if not got.dtype.is_floating_point and not got.dtype.is_complex:
        if got.dtype == torch.uint64:
            got, want = got.view(torch.int64), want.view(torch.int64)
        return None if torch.equal(got, want) else f"got {got.tolist()} want {want.tolist()}"
    tol = {torch.float32: 1e-5, torch.float64: 1e-12, torch.bfloat16: 2e-2, torch.float16: 2e-3,
           torch.complex64: 1e-5}.get(got.dtype, 1e-5)
    if op in ("min", "max"):
        tol = 0.0
    g, w = got.to(torch.complex128 if got.is_complex() else torch.float64), \
        want.to(torch.complex128 if want.is_complex() else torch.float64)
    atol = tol * n * 4
    if torch.allclose(g, w, rtol=tol * n, atol=atol):
        return None
    return f"got {got.tolist()} want {want.tolist()}"


# -- the matrix --------------------------------------------------------------------------------------
class Cases:
    def __init__(self, rank, n):
        self.rank, self.n, self.failures, self.count = rank, n, [], 0

    def check(self, name, fn):
        self.count += 1
        try:
            err = fn()
        except Exception as e:  # noqa: BLE001 - reported by name
            err = f"{type(e).__name__}: {e}\n{traceback.format_exc(limit=6)}"
        if err:
            self.failures.append(f"[rank {self.rank}] {name}: {err}")


def all_ops(rank, n):
    """Every op of DESIGN.md section 4, every dtype, every reduce op that applies."""
    c = Cases(rank, n)
    others = range(n)
    with funcoll.record() as log:
        for dt in DTYPES:
            for op in valid_ops(dt):
                for shape, tag in (((5,), "v"), ((2, 3), "m")):
                    def ar(dt=dt, op=op, shape=shape, tag=tag):
                        salt = f"ar/{op}/{tag}" + ("/small" if op in ("product", "avg") else "")
                        t = make(dt, shape, rank, salt)
                        dist.all_reduce(t, op=c10d_op(op))
                        return close(t, reference(op, [make(dt, shape, r, salt) for r in others]), n, op)

                    c.check(f"all_reduce {dt} {op} {shape}", ar)

                def rs(dt=dt, op=op):
                    salt = f"rs/{op}" + ("/small" if op in ("product", "avg") else "")
                    inp = make(dt, (n * 3, 2), rank, salt)
                    out = torch.empty((3, 2), dtype=dt)
                    dist.reduce_scatter_tensor(out, inp, op=c10d_op(op))
                    want = reference(op, [make(dt, (n * 3, 2), r, salt) for r in others])[rank * 3:rank * 3 + 3]
                    return close(out, want, n, op)

                c.check(f"reduce_scatter_tensor {dt} {op}", rs)

                def red(dt=dt, op=op):
                    salt = f"red/{op}" + ("/small" if op in ("product", "avg") else "")
                    t = make(dt, (4,), rank, salt)
                    orig = t.clone()
                    dist.reduce(t, dst=n - 1, op=c10d_op(op))
                    if rank == n - 1:
                        return close(t, reference(op, [make(dt, (4,), r, salt) for r in others]), n, op)
                    return None if torch.equal(t.view(torch.uint8), orig.view(torch.uint8)) else "non-dst changed"

                c.check(f"reduce {dt} {op}", red)

            def rsl(dt=dt):
                op = "sum" if dt != torch.bool else "bor"
                ins = [make(dt, (3,), rank, f"rsl/{j}") for j in range(n)]
                out = torch.empty(3, dtype=dt)
                dist.reduce_scatter(out, ins, op=c10d_op(op))
                return close(out, reference(op, [make(dt, (3,), r, f"rsl/{rank}") for r in others]), n, op)

            c.check(f"reduce_scatter(list) {dt}", rsl)

        movable = DTYPES + [torch.float8_e4m3fn, torch.float8_e5m2]
        for dt in movable:
            def ag(dt=dt):
                inp = make(dt, (2, 3), rank, "ag")
                out = torch.empty((2 * n, 3), dtype=dt)
                dist.all_gather_into_tensor(out, inp)
                want = torch.cat([make(dt, (2, 3), r, "ag") for r in others])
                return None if torch.equal(out.view(torch.uint8), want.view(torch.uint8)) else "mismatch"

            c.check(f"all_gather_into_tensor {dt}", ag)

            def agl(dt=dt):
                inp = make(dt, (3,), rank, "agl")
                outs = [torch.empty(3, dtype=dt) for _ in others]
                dist.all_gather(outs, inp)
                ok = all(torch.equal(o.view(torch.uint8), make(dt, (3,), r, "agl").view(torch.uint8))
                         for r, o in enumerate(outs))
                return None if ok else "mismatch"

            c.check(f"all_gather(list) {dt}", agl)

            def bc(dt=dt):
                src = n - 1
                t = make(dt, (4,), rank, "bc")
                dist.broadcast(t, src=src)
                want = make(dt, (4,), src, "bc")
                return None if torch.equal(t.view(torch.uint8), want.view(torch.uint8)) else "mismatch"

            c.check(f"broadcast src={n - 1} {dt}", bc)

            def a2a_even(dt=dt):
                inp = make(dt, (2 * n, 2), rank, "a2ae")
                out = torch.empty_like(inp)
                dist.all_to_all_single(out, inp)
                want = torch.cat([make(dt, (2 * n, 2), r, "a2ae")[2 * rank:2 * rank + 2] for r in others])
                return None if torch.equal(out.view(torch.uint8), want.view(torch.uint8)) else "mismatch"

            c.check(f"all_to_all_single even {dt}", a2a_even)

            def a2a_uneven(dt=dt):
                # rank r sends splits[r][j] rows to rank j; zeros included
                splits = [[(r + j) % 3 for j in others] for r in others]
                ins = splits[rank]
                outs = [splits[j][rank] for j in others]
                inp = make(dt, (sum(ins), 2), rank, "a2au")
                out = torch.empty((sum(outs), 2), dtype=dt)
                dist.all_to_all_single(out, inp, outs, ins)
                parts = []
                for j in others:
                    src = make(dt, (sum(splits[j]), 2), j, "a2au")
                    off = sum(splits[j][:rank])
                    parts.append(src[off:off + splits[j][rank]])
                want = torch.cat(parts)
                return None if torch.equal(out.view(torch.uint8), want.view(torch.uint8)) else "mismatch"

            c.check(f"all_to_all_single uneven {dt}", a2a_uneven)

        def a2a_list():
            ins = [make(torch.float32, (j + 1,), rank, f"a2al/{j}") for j in others]
            outs = [torch.empty(rank + 1) for _ in others]
            dist.all_to_all(outs, ins)
            ok = all(torch.equal(outs[j], make(torch.float32, (rank + 1,), j, f"a2al/{rank}")) for j in others)
            return None if ok else "mismatch"

        c.check("all_to_all(list) uneven sizes", a2a_list)

        for dt in (torch.float32, torch.int64, torch.bool, torch.uint16):
            def gat(dt=dt):
                dst = 1 % n
                inp = make(dt, (3,), rank, "gat")
                outs = [torch.empty(3, dtype=dt) for _ in others] if rank == dst else None
                dist.gather(inp, outs, dst=dst)
                if rank != dst:
                    return None
                ok = all(torch.equal(o.view(torch.uint8), make(dt, (3,), r, "gat").view(torch.uint8))
                         for r, o in enumerate(outs))
                return None if ok else "mismatch"

            c.check(f"gather dst=1 {dt}", gat)

            def sca(dt=dt):
                src = 1 % n
                ins = [make(dt, (3,), j, "sca") for j in others] if rank == src else None
                out = torch.empty(3, dtype=dt)
                dist.scatter(out, ins, src=src)
                return None if torch.equal(out.view(torch.uint8), make(dt, (3,), rank, "sca").view(torch.uint8)) \
                    else "mismatch"

            c.check(f"scatter src=1 {dt}", sca)

        def p2p():
            nxt, prv = (rank + 1) % n, (rank - 1) % n
            t = make(torch.float32, (4,), rank, "p2p")
            got = torch.empty(4)
            if rank % 2 == 0:
                dist.send(t, nxt)
                dist.recv(got, prv)
            else:
                dist.recv(got, prv)
                dist.send(t, nxt)
            return None if torch.equal(got, make(torch.float32, (4,), prv, "p2p")) else "mismatch"

        c.check("send/recv ring", p2p)
        c.check("barrier", lambda: dist.barrier())

        def coalesced():
            ts = [make(torch.float32, (3,), rank, "co/a"), make(torch.int32, (2, 2), rank, "co/b"),
                  make(torch.float32, (1,), rank, "co/c"), make(torch.bfloat16, (2,), rank, "co/d")]
            outs = fc.all_reduce_coalesced(ts, "sum", dist.group.WORLD)
            errs = [close(fc.wait_tensor(o), reference("sum", [make(t.dtype, t.shape, r, s) for r in others]), n)
                    for o, t, s in zip(outs, ts, ["co/a", "co/b", "co/c", "co/d"])]
            return "; ".join(e for e in errs if e) or None

        c.check("all_reduce_coalesced sum mixed dtypes", coalesced)

        def coalesced_avg():
            ts = [make(torch.float32, (3,), rank, "coa/a"), make(torch.bfloat16, (2,), rank, "coa/b")]
            outs = fc.all_reduce_coalesced(ts, "avg", dist.group.WORLD)
            errs = [close(fc.wait_tensor(o), reference("avg", [make(t.dtype, t.shape, r, s) for r in others]), n)
                    for o, t, s in zip(outs, ts, ["coa/a", "coa/b"])]
            return "; ".join(e for e in errs if e) or None

        c.check("all_reduce_coalesced avg", coalesced_avg)

        def ag_coalesced():
            ins = [make(torch.float32, (2,), rank, "agc/a"), make(torch.int8, (1, 3), rank, "agc/b"),
                   make(torch.float32, (3,), rank, "agc/c")]
            outs = fc.all_gather_into_tensor_coalesced(ins, dist.group.WORLD)
            errs = []
            for o, i, s in zip(outs, ins, ["agc/a", "agc/b", "agc/c"]):
                want = torch.cat([make(i.dtype, i.shape, r, s) for r in others])
                if not torch.equal(fc.wait_tensor(o), want):
                    errs.append(s)
            return ", ".join(errs) or None

        c.check("all_gather_into_tensor_coalesced", ag_coalesced)

        def rs_coalesced():
            ins = [make(torch.float32, (n * 2,), rank, "rsc/a"), make(torch.int64, (n, 2), rank, "rsc/b")]
            outs = fc.reduce_scatter_tensor_coalesced(ins, "sum", [0, 0], dist.group.WORLD)
            errs = []
            for o, i, s in zip(outs, ins, ["rsc/a", "rsc/b"]):
                full = reference("sum", [make(i.dtype, i.shape, r, s) for r in others])
                k = i.shape[0] // n
                e = close(fc.wait_tensor(o), full[rank * k:(rank + 1) * k], n)
                if e:
                    errs.append(f"{s}: {e}")
            return "; ".join(errs) or None

        c.check("reduce_scatter_tensor_coalesced", rs_coalesced)

        def noncontig():
            base = make(torch.float32, (4, 6), rank, "nc")
            t = base.t()  # non-contiguous view
            dist.all_reduce(t, op=R.AVG)
            want = reference("avg", [make(torch.float32, (4, 6), r, "nc") for r in others]).t()
            return close(base.t(), want, n)

        c.check("all_reduce non-contiguous avg", noncontig)

        def zero_dim():
            t = make(torch.float32, (), rank, "zd")
            dist.all_reduce(t, op=R.MAX)
            return close(t, reference("max", [make(torch.float32, (), r, "zd") for r in others]), n, "max")

        c.check("all_reduce 0-dim max", zero_dim)

        def async_work():
            t = make(torch.float32, (1024,), rank, "async")
            w = dist.all_reduce(t, op=R.AVG, async_op=True)
            w.wait()
            return close(t, reference("avg", [make(torch.float32, (1024,), r, "async") for r in others]), n)

        c.check("all_reduce async_op avg", async_work)

    tp = dist.group.WORLD.transport("cpu")
    calls = {f"{p}|{o}|{d}": v for (p, o, d), v in tp.calls.items()}
    strategies = sorted({s for _, notes in log for s in notes})
    return {"failures": c.failures, "count": c.count, "calls": calls, "strategies": strategies,
            "caps": tp.caps.name}


def functional(rank, n):
    """Upstream functional collectives on a funcoll group, eager and compiled (aot_eager, fullgraph)."""
    c = Cases(rank, n)
    g = dist.group.WORLD
    others = range(n)

    def step(x, y):
        a = fc.all_reduce(x, "avg", g)
        b = fc.all_gather_tensor(y, 0, g)
        r = fc.reduce_scatter_tensor(b, "sum", 0, g)
        s = fc.all_to_all_single(y, [1] * n, [1] * n, g)
        return a * 2, b, r, s

    x = make(torch.float32, (4,), rank, "fx")
    y = make(torch.float32, (n, 2), rank, "fy")
    xs = [make(torch.float32, (4,), r, "fx") for r in others]
    ys = [make(torch.float32, (n, 2), r, "fy") for r in others]
    want_a = reference("avg", xs) * 2
    want_b = torch.cat(ys)
    want_r = torch.cat(ys) * n
    want_r = want_r[rank * n:(rank + 1) * n]
    want_s = torch.stack([yy[rank] for yy in ys])
    compiled = torch.compile(step, fullgraph=True, backend="aot_eager")
    for label, fn in (("eager", step), ("compiled", compiled), ("compiled again", compiled)):
        def run(fn=fn):
            a, b, r, s = [fc.wait_tensor(t) if isinstance(t, torch.Tensor) else t for t in fn(x, y)]
            errs = [close(a, want_a, n), close(b, want_b, n), close(r, want_r, n), close(s, want_s, n)]
            return "; ".join(e for e in errs if e) or None

        c.check(f"functional {label}", run)
    return {"failures": c.failures, "count": c.count}


def subgroups(rank, n):
    """Sub-groups of a 3-rank world, group-local roots, and an invalid root."""
    assert n == 3
    c = Cases(rank, n)
    g02 = dist.new_group([0, 2])
    g1 = dist.new_group([1])
    g21 = dist.new_group([2, 1])  # torch sorts the ranks: group rank 0 is global 1
    if rank in (0, 2):
        def sub_ar():
            t = make(torch.int32, (3,), rank, "sg")
            dist.all_reduce(t, op=R.BXOR, group=g02)
            return close(t, reference("bxor", [make(torch.int32, (3,), r, "sg") for r in (0, 2)]))

        c.check("all_reduce bxor on [0,2]", sub_ar)

        def sub_bc():
            t = make(torch.float32, (3,), rank, "sgb")
            dist.broadcast(t, src=2, group=g02)  # global 2 = group rank 1
            return None if torch.equal(t, make(torch.float32, (3,), 2, "sgb")) else "mismatch"

        c.check("broadcast src=global 2 on [0,2]", sub_bc)

        def sub_reduce():
            t = make(torch.float32, (3,), rank, "sgr")
            dist.reduce(t, dst=2, op=R.AVG, group=g02)
            if rank != 2:
                return None
            return close(t, reference("avg", [make(torch.float32, (3,), r, "sgr") for r in (0, 2)]), 2)

        c.check("reduce avg dst=global 2 on [0,2]", sub_reduce)

        def sub_a2a():
            ins = [1, 2] if rank == 0 else [0, 3]
            outs = [1, 0] if rank == 0 else [2, 3]
            inp = make(torch.float32, (sum(ins),), rank, "sga")
            out = torch.empty(sum(outs))
            dist.all_to_all_single(out, inp, outs, ins, group=g02)
            a0, a2 = make(torch.float32, (3,), 0, "sga"), make(torch.float32, (3,), 2, "sga")
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
            t = make(torch.float32, (3,), rank, "lone")
            want = t.clone()
            dist.all_reduce(t, op=R.SUM, group=g1)
            return None if torch.equal(t, want) else "mismatch"

        c.check("all_reduce on a 1-rank group", lone)
    if rank in (1, 2):
        def order():
            t = make(torch.float32, (2,), rank, "ord")
            dist.broadcast(t, src=2, group=g21)  # group rank 1
            ok = torch.equal(t, make(torch.float32, (2,), 2, "ord"))
            name = g21.group_name
            ranks_ok = (funcoll.groups.to_group(name, 2) == dist.get_group_rank(g21, 2) == 1
                        and funcoll.groups.to_global(name, 0) == 1 and funcoll.groups.lookup(name).ranks == (1, 2))
            return None if ok and ranks_ok else f"ok={ok} ranks_ok={ranks_ok}"

        c.check("group [2,1]: group-local rank order", order)
    dist.barrier()
    return {"failures": c.failures, "count": c.count}
