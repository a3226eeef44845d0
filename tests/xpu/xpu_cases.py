"""Rank-side cases for the XPU tests that run on CPU: every gap of the XCCL table, filled for real over gloo.

Three entry paths are exercised in one world (FUNCOLL_PROFILE=xccl):

* ``eager``:   ``torch.distributed.*`` on the funcoll process group (its CPU transport runs under the xccl profile);
* ``xpu_tp``:  funcoll's algorithms over :class:`funcoll.transport.xpu.XcclTransport` - the XPU transport class itself,
               with the capabilities derived by ``funcoll.transport.xpu.derive`` - driving a real ProcessGroupGloo
               wrapped in a spy that logs every native call the backend receives;
* ``xpu_key``: the ``_c10d_functional`` kernels funcoll registers on the **XPU dispatch key**, reached by
               redispatching to that key (CPU tensors, a c10d gloo group).

Each rank builds every rank's inputs from a seed (integer-valued floats: ``tests.reference.make(..., "grid")``);
references are computed locally and independently (tests/reference.py), never from another collective.
The small rank bodies sit next to their asserts: ``composite`` in test_xpu_profile.py, the hardware ones in
test_xpu_hardware.py.
"""

from __future__ import annotations

import dataclasses
from datetime import timedelta

import torch
import torch.distributed as dist
from torch._C import _distributed_c10d as C

import funcoll
from funcoll import algorithms
from funcoll.semantics import FLOAT8, ReduceOp, Reduction
from funcoll.transport import xpu
from tests import reference as ref


def inputs(n, dtype, shape, salt):
    """Every rank's input: integer-valued floats (sums over the ranks are exact), integers over their whole range."""
    return ref.all_inputs(n, dtype, shape, salt, "grid")


def make(dtype, shape, rank, salt):
    return ref.make(dtype, shape, rank, salt, "grid")


def check(got, want, n, op=""):
    """(equal?, what differs) of a result and its reference: ``op`` reduced over ``n`` ranks, or moved ("": exact)."""
    err = ref.close(got, want, n if op else 1, op or "sum", "grid")
    return err is None, err or ""


# -- the cases: (name, collective, dtype, op, note expected in funcoll.record()) ---------------------------
N_ELEM = 6
# PREMUL_SUM on all_reduce: from torch 2.12 ProcessGroupXCCL scales the tensor handed to it in place and sums, and the
# running torch's row hands it natively (the CPU transport does the same in-place scaling); before, funcoll scales
PREMUL_NATIVE = xpu.derive(torch.__version__, None).reduces("all_reduce", ReduceOp.PREMUL_SUM, torch.float32)
PREMUL_AR = "native" if PREMUL_NATIVE else "premul_sum=scale+sum"
ALL_REDUCE = [
    ("avg", torch.float32, "avg=sum+scale"),
    ("avg", torch.bfloat16, "avg=float32 reduce_scatter+scale+all_gather"),
    ("avg", torch.float16, "avg=float32 reduce_scatter+scale+all_gather"),
    ("avg", torch.int32, "avg=int64 sum+truncating divide"),
    ("avg", torch.int64, "avg=int64 sum+truncating divide"),
    ("avg", torch.complex64, "avg=sum+scale"),
    ("premul_sum", torch.float32, PREMUL_AR),
    ("premul_sum", torch.bfloat16, PREMUL_AR),
    ("band", torch.int32, "all_to_all+local band+all_gather"),
    ("bor", torch.int64, "all_to_all+local bor+all_gather"),
    ("bxor", torch.uint8, "all_to_all+local bxor+all_gather"),
    ("bxor", torch.bool, "bool bxor as uint8 count+compare"),
    ("band", torch.int16, "all_to_all+local band+all_gather"),
    ("bor", torch.uint64, "all_to_all+local bor+all_gather"),
    ("max", torch.int64, "all_to_all+local max+all_gather"),
    ("min", torch.int32, "all_to_all+local min+all_gather"),
    ("max", torch.int8, "all_to_all+local max+all_gather"),
    ("min", torch.uint8, "all_to_all+local min+all_gather"),
    ("max", torch.bool, "bool max as uint8 count+compare"),
    ("sum", torch.bool, "bool sum as uint8 count+compare"),
    ("sum", torch.int16, "widen torch.int16->torch.int32"),
    ("product", torch.int16, "widen torch.int16->torch.int32"),
    ("max", torch.int16, "widen torch.int16->torch.int32"),
    ("sum", torch.uint16, "torch.uint16 reduced as torch.int16"),
    ("min", torch.uint16, "sign bit flipped"),
    ("max", torch.uint32, "sign bit flipped"),
    ("sum", torch.uint32, "torch.uint32 reduced as torch.int32"),
    ("sum", torch.uint64, "torch.uint64 reduced as torch.int64"),
    ("max", torch.uint64, "sign bit flipped"),
    ("sum", torch.float32, "native"),
    ("max", torch.float32, "native"),
]
REDUCE_SCATTER = [
    ("avg", torch.float32, "avg=sum+scale"),
    ("bxor", torch.int32, "all_to_all+local bxor"),
    ("max", torch.int64, "all_to_all+local max"),
    ("sum", torch.uint16, "torch.uint16 reduced as torch.int16"),
    ("min", torch.uint32, "sign bit flipped"),
    ("premul_sum", torch.float32, "premul_sum=scale+sum"),
]
MOVED = [torch.int16, torch.uint16, torch.uint32, torch.uint64, torch.float8_e4m3fn, torch.float8_e5m2]


def splits(n, rank):
    """Uneven split sizes, with zeros: rank r sends (r + 2*j) % 3 rows to rank j (0 to itself when r == 0)."""
    send = [(rank + 2 * j) % 3 for j in range(n)]
    recv = [(j + 2 * rank) % 3 for j in range(n)]
    return send, recv


def rows_from(n, j, rank, dtype, salt, cols=3):
    """The rows rank j sends to ``rank`` in the uneven all_to_all (a slice of j's input)."""
    send_j, _ = splits(n, j)
    x = make(dtype, (sum(send_j), cols), j, salt)
    off = sum(send_j[:rank])
    return x[off:off + send_j[rank]]


# -- the three entry paths --------------------------------------------------------------------------------
# which arguments of a c10d backend method ProcessGroupXCCL NaN-checks (TORCH_XCCL_NAN_CHECK): the inputs of every
# collective (PGX:868-870), on the root only for broadcast and scatter (:1303, :1457), the tensor of a send (:1024)
SENT = {"allreduce": lambda a, rank: a[0], "allreduce_coalesced": lambda a, rank: a[0],
        "_reduce_scatter_base": lambda a, rank: [a[1]], "_allgather_base": lambda a, rank: [a[1]],
        "alltoall_base": lambda a, rank: [a[1]], "reduce": lambda a, rank: a[0], "gather": lambda a, rank: a[1],
        "send": lambda a, rank: a[0],
        "broadcast": lambda a, rank: a[0] if a[1].rootRank == rank else [],
        "scatter": lambda a, rank: [t for x in a[1] for t in x] if a[2].rootRank == rank else []}


def has_nan(t: torch.Tensor) -> bool:
    if t.is_complex():
        t = torch.view_as_real(t)
    return bool(t.is_floating_point() and t.dtype not in FLOAT8 and torch.isnan(t).any())


class Spy:
    """A transparent proxy around a real c10d backend that logs every native call it receives:
    (method, reduce op name or "", dtype name, uneven splits?), and, as XCCL's NaN check would, every call that sends
    a floating buffer holding a NaN (``nan``)."""

    def __init__(self, backend):
        self._b = backend
        self.log = []
        self.nan = []

    def __getattr__(self, name):
        fn = getattr(self._b, name)
        if not callable(fn) or name in ("rank", "size"):
            return fn

        def call(*args):
            tensors = [a for a in args if isinstance(a, torch.Tensor)]
            for a in args:
                if isinstance(a, list):
                    tensors += [t for t in a if isinstance(t, torch.Tensor)]
                    tensors += [t for x in a if isinstance(x, list) for t in x]
            op = ""
            for a in args:
                if hasattr(a, "reduceOp"):
                    op = a.reduceOp.op.name.lower()
            uneven = name == "alltoall_base" and bool(args[2] or args[3])
            self.log.append((name, op, str(tensors[0].dtype) if tensors else "", uneven,
                             sorted({t.device.type for t in tensors})))
            sent = SENT.get(name)
            if sent is not None and any(has_nan(t) for t in sent(args, self._b.rank())):
                self.nan.append((name, op, str(tensors[0].dtype) if tensors else ""))
            return fn(*args)

        return call


def _eager(kind, t, op, out=None):
    if kind == "all_reduce":
        dist.all_reduce(t, op=ref.c10d_op(op))
        return t
    if kind == "reduce_scatter":
        dist.reduce_scatter_tensor(out, t, op=ref.c10d_op(op))
        return out
    raise ValueError(kind)


def _xpu_tp(tp, kind, t, op, out=None):
    o = op if op != "premul_sum" else ref.c10d_op(op)
    if kind == "all_reduce":
        algorithms.all_reduce(tp, t, o).wait()
        return t
    if kind == "reduce_scatter":
        algorithms.reduce_scatter_tensor(tp, out, t, o).wait()
        return out
    raise ValueError(kind)


XPU_KEY = torch._C.DispatchKeySet(torch._C.DispatchKey.XPU)


def _xpu_key(group_name, kind, t, op, n, out=None):
    """The ``_c10d_functional`` kernel registered on the XPU key, reached by redispatching to that key."""
    c = torch.ops._c10d_functional
    if kind == "all_reduce":
        r = c.all_reduce.default.redispatch(XPU_KEY, t, op, group_name)
    elif kind == "reduce_scatter":
        r = c.reduce_scatter_tensor.default.redispatch(XPU_KEY, t, op, n, group_name)
    else:
        raise ValueError(kind)
    return c.wait_tensor(r)


def spied_transport(rank, n, oneccl=None, torch_version=None, caps=None, prefix="xpu-spy"):
    """The XPU transport class over a spied real gloo backend, with the capabilities ``derive`` gives for
    ``torch_version`` (default: the running torch) and ``oneccl`` (or ``caps``), intersected with gloo's, and
    PREMUL_SUM done as ProcessGroupXCCL 2.12+ does it (the tensor handed scaled in place, then SUM) where the row has
    it. Returns (transport, spy)."""
    store = dist.distributed_c10d._get_default_store()
    gloo = dist.ProcessGroupGloo(dist.PrefixStore(f"{prefix}-{oneccl}-{torch_version}/", store), rank, n,
                                 timedelta(seconds=60))
    spy = Spy(gloo)
    derived = caps if caps is not None else xpu.derive(torch_version or torch.__version__, oneccl, "")
    caps = derived.restrict(funcoll.PROFILES["gloo"])
    if ReduceOp.PREMUL_SUM in derived.reduce_ops:  # gloo has none: the transport scales in place, as XCCL does
        caps = dataclasses.replace(caps, reduce_ops=caps.reduce_ops | {ReduceOp.PREMUL_SUM})
    tp = xpu.XcclTransport(spy, caps, device="cpu", device_type="cpu")
    tp.premul_in_place = True
    return tp, spy


def fill_empty_with_nan():
    """From now on in this process, torch.empty / empty_like / Tensor.new_empty return floating tensors full of NaN:
    what uninitialised memory may hold, made certain (XCCL's NaN check asserts on it)."""
    def nan_filled(fn):
        def wrapped(*args, **kwargs):
            t = fn(*args, **kwargs)
            if (t.is_floating_point() or t.is_complex()) and t.dtype not in FLOAT8:
                with torch.no_grad():
                    t.fill_(float("nan"))
            return t
        return wrapped

    torch.empty = nan_filled(torch.empty)
    torch.empty_like = nan_filled(torch.empty_like)
    torch.Tensor.new_empty = nan_filled(torch.Tensor.new_empty)


def gaps(rank, n, oneccl=None, nan_fill=False):
    """Runs every case through the three paths; returns results for the parent to assert on. ``nan_fill``: every
    torch.empty-made floating buffer holds NaN (:func:`fill_empty_with_nan`), and one deliberate send of such a
    buffer shows the spy catches it."""
    if nan_fill:
        fill_empty_with_nan()
    results, notes = {}, {}
    tp, spy = spied_transport(rank, n, oneccl)
    caps = tp.caps
    c10d_group = dist.new_group(backend="gloo")
    funcoll.install(["xpu"])

    def record(key, fn):
        with funcoll.record() as log:
            out, want = fn()
        results[key] = check(out, want, n, key[1])
        notes[key] = [s for _, ss in log for s in ss]

    paths = {"eager": lambda kind, t, op, out=None: _eager(kind, t, op, out),
             "xpu_tp": lambda kind, t, op, out=None: _xpu_tp(tp, kind, t, op, out),
             "xpu_key": lambda kind, t, op, out=None: _xpu_key(c10d_group.group_name, kind, t, op, n, out)}
    for salt, (op, dtype, _) in enumerate(ALL_REDUCE):
        for path, run in paths.items():
            if path == "xpu_key" and op == "premul_sum":
                continue  # _c10d_functional reduce_op strings carry no factor
            ins = inputs(n, dtype, (N_ELEM,), salt)
            record(("all_reduce", op, str(dtype), path),
                   lambda run=run, ins=ins, op=op: (run("all_reduce", ins[rank].clone(), op), ref.reduce(op, ins)))
    for salt, (op, dtype, _) in enumerate(REDUCE_SCATTER, start=100):
        for path, run in paths.items():
            if path == "xpu_key" and op == "premul_sum":
                continue
            ins = inputs(n, dtype, (2 * n, 2), salt)
            full = ref.reduce(op, ins)
            out = torch.empty((2, 2), dtype=dtype)
            record(("reduce_scatter", op, str(dtype), path),
                   lambda run=run, ins=ins, op=op, out=out, full=full:
                   (run("reduce_scatter", ins[rank].clone(), op, out), full[2 * rank:2 * rank + 2]))

    # moves: all_gather, broadcast and uneven/even all_to_all of dtypes XCCL cannot carry natively
    for salt, dtype in enumerate(MOVED, start=200):
        ins = inputs(n, dtype, (2, 3), salt)
        ref_ag = torch.cat(ins)
        for path in ("eager", "xpu_tp", "xpu_key"):
            out = torch.empty((2 * n, 3), dtype=dtype)
            if path == "eager":
                def fn(out=out, ins=ins):
                    return (dist.all_gather_into_tensor(out, ins[rank]), out)[1]
            elif path == "xpu_tp":
                def fn(out=out, ins=ins):
                    return (algorithms.all_gather_into_tensor(tp, out, ins[rank]).wait(), out)[1]
            else:
                def fn(out=out, ins=ins):
                    c = torch.ops._c10d_functional
                    return c.wait_tensor(c.all_gather_into_tensor.default.redispatch(
                        XPU_KEY, ins[rank], n, c10d_group.group_name))
            record(("all_gather", "", str(dtype), path), lambda fn=fn, ref_ag=ref_ag: (fn(), ref_ag))
            src = n - 1
            t = ins[rank].clone()
            if path == "eager":
                def fn(t=t, src=src):
                    return (dist.broadcast(t, src=src), t)[1]
            elif path == "xpu_tp":
                def fn(t=t, src=src):
                    return (algorithms.broadcast(tp, t, src).wait(), t)[1]
            else:
                def fn(t=t, src=src):
                    c = torch.ops._c10d_functional
                    return c.wait_tensor(c.broadcast.default.redispatch(XPU_KEY, t, src, c10d_group.group_name))
            record(("broadcast", "", str(dtype), path), lambda fn=fn, ins=ins, src=src: (fn(), ins[src]))
    for salt, dtype in enumerate([torch.float32, torch.int16, torch.float8_e5m2, torch.uint64], start=300):
        send, recv = splits(n, rank)
        x = make(dtype, (sum(send), 3), rank, salt)
        want = torch.cat([rows_from(n, j, rank, dtype, salt) for j in range(n)])
        for path in ("eager", "xpu_tp", "xpu_key"):
            out = torch.empty((sum(recv), 3), dtype=dtype)
            if path == "eager":
                def fn(out=out, x=x, recv=recv, send=send):
                    return (dist.all_to_all_single(out, x, recv, send), out)[1]
            elif path == "xpu_tp":
                def fn(out=out, x=x, recv=recv, send=send):
                    return (algorithms.all_to_all_single(tp, out, x, recv, send).wait(), out)[1]
            else:
                def fn(out=out, x=x, recv=recv, send=send):
                    c = torch.ops._c10d_functional
                    return c.wait_tensor(c.all_to_all_single.default.redispatch(
                        XPU_KEY, x, recv, send, c10d_group.group_name))
            record(("all_to_all_uneven", "", str(dtype), path), lambda fn=fn, want=want: (fn(), want))
        # even all_to_all of float8 (moved as uint8)
        if dtype in FLOAT8:
            xe = make(dtype, (2 * n, 2), rank, salt + 50)
            ref_e = torch.cat([make(dtype, (2 * n, 2), j, salt + 50)[2 * rank:2 * rank + 2] for j in range(n)])
            oute = torch.empty_like(xe)
            record(("all_to_all_even", "", str(dtype), "xpu_tp"),
                   lambda oute=oute, xe=xe, ref_e=ref_e:
                   (algorithms.all_to_all_single(tp, oute, xe).wait(), (oute, ref_e))[1])
    # reduce (AVG to one rank) and a coalesced all_reduce with two dtypes
    ins = inputs(n, torch.float32, (N_ELEM,), 400)
    for path in ("eager", "xpu_tp"):
        t = ins[rank].clone()
        if path == "eager":
            def fn(t=t):
                return dist.reduce(t, dst=0, op=dist.ReduceOp.AVG)
        else:
            def fn(t=t):
                return algorithms.reduce(tp, t, 0, "avg").wait()
        record(("reduce", "avg", "torch.float32", path),
               lambda fn=fn, t=t: (fn(), (t, ref.reduce("avg", ins) if rank == 0 else ins[rank]))[1])
    ins16 = inputs(n, torch.bfloat16, (5,), 401)
    for path in ("eager", "xpu_tp"):
        ts = [ins[rank].clone(), ins[rank].clone() * 2, ins16[rank].clone()]
        if path == "eager":
            o = C.AllreduceCoalescedOptions()
            o.reduceOp = dist.ReduceOp.AVG

            def fn(ts=ts, o=o):
                return dist.group.WORLD.allreduce_coalesced(ts, o).wait()  # mixed dtypes: the c10d method
        else:
            def fn(ts=ts):
                return algorithms.all_reduce_coalesced(tp, ts, "avg").wait()
        refs = [ref.reduce("avg", ins), ref.reduce("avg", [i * 2 for i in ins]), ref.reduce("avg", ins16)]
        record(("all_reduce_coalesced", "avg", "float32+bfloat16", path),
               lambda fn=fn, ts=ts, refs=refs:
               (fn(), (torch.cat([t.float() for t in ts]), torch.cat([r.float() for r in refs])))[1])
    nan_control = None
    if nan_fill:  # the control: a buffer nobody wrote, sent as it is, is caught
        before = len(spy.nan)
        tp.all_reduce(torch.empty(4), Reduction(ReduceOp.SUM)).wait()
        nan_control = spy.nan[before:]
        del spy.nan[before:]
    dist.barrier()
    funcoll.uninstall()
    pg_calls = {k: v for k, v in dist.group.WORLD.transport("cpu").calls.items()}
    return {"results": results, "notes": notes, "spy": spy.log, "tp_calls": dict(tp.calls), "nan": spy.nan,
            "nan_control": nan_control,
            "pg_calls": {(p, o, str(d)): v for (p, o, d), v in pg_calls.items()},
            "caps_name": caps.name, "native_avg": caps.reduces("all_reduce", ReduceOp.AVG, torch.float32)}
