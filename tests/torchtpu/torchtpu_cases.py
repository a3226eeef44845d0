"""Rank-side cases for the TorchTPU tests that run on CPU: funcoll's ``tpu`` transport class over a stand-in for
TorchTPU's ProcessGroupTpu.

:class:`StandInTpu` is a Python backend object with ProcessGroupTpu's surface (``name() == "tpu_dist"``) that does
what ProcessGroupTpu 0.2.0 does, as read from its wheel (torch-tpu 0.2.0, https://pypi.org/project/torch-tpu/0.2.0/),
over a real ProcessGroupGloo: it raises ProcessGroupTpu's exact messages for what it refuses (reduce, PREMUL_SUM,
several tensors per all_reduce, coalesced calls, asymmetric uneven all_to_all buffers, barrier options, sequence
numbers, monitored_barrier, recv from any source, the coalescing manager), and reproduces what it gets wrong: AVG
summed in the tensor's own dtype then divided (integers overflow, bf16 is not widened), broadcast and scatter as zeros
plus a SUM (a -0.0 arrives as +0.0), gather as an all-gather to every rank, one store round trip per uneven
all_to_all. It logs every call it receives. ``sync=True`` answers every collective without a Work, as ProcessGroupTpu
does for calls that are not asynchronous.

(torch 2.15's pybind ``Backend`` has no Python constructor, so the stand-in is duck-typed: it has the methods the
transport calls, with c10d's signatures.)
"""

from __future__ import annotations

from datetime import timedelta

import torch
import torch.distributed as dist
from torch._C import _distributed_c10d as C

import funcoll
from funcoll import algorithms
from funcoll.transport.tpu import TpuTransport, derive
from tests import reference as ref
from tests.bit_patterns import differ, patterns

NAME = "tpu_dist"
# c10::toString(ScalarType), as ProcessGroupTpu's messages print a dtype
C10_NAME = {torch.float16: "Half", torch.bfloat16: "BFloat16", torch.float32: "Float", torch.float64: "Double",
            torch.complex64: "ComplexFloat", torch.complex128: "ComplexDouble"}
_BITWISE = {"BAND", "BOR", "BXOR"}
# the strategies funcoll takes for what ProcessGroupTpu lacks or gets wrong, whichever transport stands for it
TORCHTPU_STRATEGIES = ("avg=int64 sum+truncating divide", "avg=float32 reduce_scatter+scale+all_gather",
                       "premul_sum=scale+sum", "reduce=all_reduce", "broadcast=masked all_reduce",
                       "scatter=broadcast+slice")


def check_torchtpu_strategies(s) -> None:
    """Asserts that the strategy notes ``s`` of a run under the torch_tpu table hold every strategy of
    :data:`TORCHTPU_STRATEGIES` and pad uneven all_to_all (every rank the same shapes), never pairwise."""
    for needed in TORCHTPU_STRATEGIES:
        assert needed in s, (needed, s)
    assert any(x.startswith("uneven all_to_all=pad to") for x in s), s
    assert not any(x.startswith("uneven all_to_all=pairwise") for x in s), s


def _op_name(opts) -> str:
    return opts.reduceOp.op.name


class StandInTpu:
    """ProcessGroupTpu 0.2.0's behaviour over a real gloo backend (see the module docstring)."""

    def __init__(self, store, rank: int, size: int, gloo, sync: bool = False):
        self._store, self._rank, self._size, self._gloo, self._sync = store, rank, size, gloo, sync
        self.log: list = []
        self._a2a_seq = 0

    # -- identity --------------------------------------------------------------------------------------
    def name(self) -> str:
        return NAME

    def rank(self) -> int:
        return self._rank

    def size(self) -> int:
        return self._size

    def _log(self, method, op="", t=None, uneven=False):
        self.log.append((method, op.lower(), str(t.dtype) if t is not None else "", uneven))

    def _work(self, w, opts=None):
        """ProcessGroupTpu returns a Work only for asynchronous calls (M: nullptr otherwise)."""
        if self._sync or (opts is not None and not getattr(opts, "asyncOp", True)):
            if w is not None:
                w.wait()
            return None
        return w

    # -- validation, with ProcessGroupTpu's messages ----------------------------------------------------
    def _validate_op(self, opts, t: torch.Tensor) -> str:
        op = _op_name(opts)
        if op == "PREMUL_SUM":
            raise RuntimeError("reduce option not supported: PREMUL_SUM")
        if op in _BITWISE and (t.dtype.is_floating_point or t.dtype.is_complex):
            raise RuntimeError(f"expected the tensors dtype to be integer on bitwise reduction ops (BAND, BOR, "
                               f"BXOR), got {C10_NAME.get(t.dtype, str(t.dtype))}")
        return op

    def _sum_then_divide(self, run, out: torch.Tensor, op: str, opts):
        """AVG as ProcessGroupTpu builds it: a SUM in the tensor's own dtype, then a divide (truncating for
        integers)."""
        if op != "AVG":
            return self._work(run(opts), opts)
        o = type(opts)()
        o.reduceOp = dist.ReduceOp.SUM
        run(o).wait()
        if out.dtype.is_floating_point or out.dtype.is_complex:
            out.div_(self._size)
        else:
            out.copy_(torch.div(out, self._size, rounding_mode="trunc"))
        return self._work(_Done(), opts)

    # -- collectives -----------------------------------------------------------------------------------
    def allreduce(self, tensors, opts=None):
        opts = opts or C.AllreduceOptions()
        if len(tensors) != 1:
            raise RuntimeError("does not yet support multiple tensors")
        t = tensors[0]
        op = self._validate_op(opts, t)
        self._log("allreduce", op, t)
        return self._sum_then_divide(lambda o: self._gloo.allreduce([t], o), t, op, opts)

    def _allgather_base(self, out, inp, opts=None):
        self._log("_allgather_base", "", inp)
        return self._work(self._gloo._allgather_base(out, inp, opts or C.AllgatherOptions()), opts)

    def _reduce_scatter_base(self, out, inp, opts=None):
        opts = opts or C.ReduceScatterOptions()
        op = self._validate_op(opts, inp)
        self._log("_reduce_scatter_base", op, inp)
        return self._sum_then_divide(lambda o: self._gloo._reduce_scatter_base(out, inp, o), out, op, opts)

    def alltoall_base(self, out, inp, out_splits, in_splits, opts=None):
        uneven = bool(out_splits or in_splits) and len(set(list(out_splits) + list(in_splits))) > 1
        self._log("alltoall_base", "", inp, uneven)
        if uneven:  # AllToAllBaseUnevenSplits: buffer sizes through the store, symmetric or refused
            self._a2a_seq += 1
            key = f"alltoall_offsets:{self._a2a_seq}:"
            self._store.set(f"{key}{self._rank}", f"{inp.numel()},{out.numel()}")
            sizes = [tuple(int(x) for x in self._store.get(f"{key}{r}").decode().split(","))
                     for r in range(self._size)]
            for r, (i, o) in enumerate(sizes):
                if i != inp.numel():
                    raise RuntimeError(
                        f"asymmetric input buffer sizes across ranks are not supported on TPU. Rank {self._rank} "
                        f"has input buffer size {inp.numel()}, but peer rank {r} has input buffer size {i}. All ranks "
                        f"must allocate symmetric input buffer capacities; use padding if necessary")
                if o != out.numel():
                    raise RuntimeError(
                        f"asymmetric output buffer sizes across ranks are not supported on TPU. Rank {self._rank} "
                        f"has output buffer size {out.numel()}, but peer rank {r} has output buffer size {o}. All "
                        f"ranks must allocate symmetric output buffer capacities; use padding if necessary")
        return self._work(self._gloo.alltoall_base(out, inp, out_splits, in_splits, opts or C.AllToAllOptions()),
                          opts)

    def broadcast(self, tensors, opts=None):
        """Non-root ranks zeroed, then a SUM all-reduce (a root -0.0 arrives as +0.0)."""
        opts = opts or C.BroadcastOptions()
        t = tensors[0]
        self._log("broadcast", "", t)
        if self._rank != opts.rootRank:
            t.zero_()
        o = C.AllreduceOptions()
        o.reduceOp = dist.ReduceOp.SUM
        return self._work(self._gloo.allreduce([t], o), opts)

    def gather(self, outs, inps, opts=None):
        """An all-gather to every rank; the root keeps the rows."""
        opts = opts or C.GatherOptions()
        inp = inps[0]
        self._log("gather", "", inp)
        g = inp.new_empty((self._size * inp.numel(),))
        self._gloo._allgather_base(g, inp.reshape(-1), C.AllgatherOptions()).wait()
        if self._rank == opts.rootRank:
            for o, row in zip(outs[0], g.view((self._size,) + tuple(inp.shape)).unbind(0)):
                o.copy_(row)
        return self._work(None, opts) if self._sync else _Done()

    def scatter(self, outs, inps, opts=None):
        """The root's inputs concatenated, zeros elsewhere, then a SUM reduce_scatter."""
        opts = opts or C.ScatterOptions()
        out = outs[0]
        self._log("scatter", "", out)
        full = (torch.stack(list(inps[0])) if self._rank == opts.rootRank
                else out.new_zeros((self._size,) + tuple(out.shape)))
        o = C.ReduceScatterOptions()
        o.reduceOp = dist.ReduceOp.SUM
        return self._work(self._gloo._reduce_scatter_base(out, full.reshape((-1,) + tuple(out.shape[1:]))
                                                          if out.dim() else full, o), opts)

    def barrier(self, opts=None):
        opts = opts or C.BarrierOptions()
        if opts.timeout != C.BarrierOptions().timeout:
            raise RuntimeError("timeout in barrier options is not supported")
        if opts.device_ids and list(opts.device_ids) != [0]:
            raise RuntimeError("device_ids in barrier options is not supported, except device_ids=[0] (the only "
                               "TPU device of this process)")
        self._log("barrier")
        one = torch.ones(1)
        o = C.AllreduceOptions()
        o.reduceOp = dist.ReduceOp.SUM
        self._gloo.allreduce([one], o).wait()
        one.item()  # ProcessGroupTpu reads the value back to the host
        return self._work(None, opts) if self._sync else _Done()

    def send(self, tensors, dst, tag):
        self._log("send", "", tensors[0])
        return self._gloo.send(tensors, dst, tag)

    def recv(self, tensors, src, tag):
        self._log("recv", "", tensors[0])
        return self._gloo.recv(tensors, src, tag)

    # -- refused: c10d::Backend's defaults (ProcessGroupTpu does not override them) ---------------------
    def reduce(self, tensors, opts=None):
        raise RuntimeError(f"Backend {NAME} does not support reduce")

    def allreduce_coalesced(self, tensors, opts=None):
        raise RuntimeError(f"Backend {NAME} does not support allreduce_coalesced")

    def allgather_coalesced(self, outs, inps, opts=None):
        raise RuntimeError(f"Backend {NAME} does not support allgather_coalesced")

    def recv_anysource(self, tensors, tag):
        raise RuntimeError(f"Backend {NAME} does not support recvAnysource")

    def monitored_barrier(self, opts=None, wait_all_ranks=False):
        raise RuntimeError(f"Backend {NAME} does not support monitoredBarrier, only GLOO supports monitored barrier.")

    def _get_sequence_number_for_group(self):
        raise RuntimeError(f"Backend {NAME} does not yet support sequence numbers.")

    def _set_sequence_number_for_group(self):
        raise RuntimeError(f"Backend {NAME} does not yet support sequence numbers.")

    def _start_coalescing(self, device):
        raise RuntimeError(f"Backend {NAME} does not implement startCoalescing")

    def _end_coalescing(self, device):
        raise RuntimeError(f"Backend {NAME} does not implement endCoalescing")


class _Done:
    def wait(self, timeout=None):
        return True

    def is_completed(self):
        return True

    def get_future(self):
        f = torch.futures.Future()
        f.set_result([])
        return f


def make_transport(rank, n, sync=False, prefix="standin"):
    """(TpuTransport over a StandInTpu over a real gloo backend, the stand-in). The capabilities are the torch_tpu 0.2
    row intersected with gloo's (what gloo cannot carry -- int16, unsigned, float8 -- takes funcoll's strategies)."""
    store = dist.PrefixStore(f"{prefix}-{sync}/", dist.distributed_c10d._get_default_store())
    gloo = dist.ProcessGroupGloo(dist.PrefixStore("gloo/", store), rank, n, timedelta(seconds=60))
    st = StandInTpu(dist.PrefixStore("tpu/", store), rank, n, gloo, sync=sync)
    caps = derive("0.2.0").restrict(funcoll.PROFILES["gloo"])
    return TpuTransport(st, caps, device="cpu", device_type="cpu"), st


FLOATS = [torch.float32, torch.bfloat16, torch.float16, torch.float64]
INTS = [torch.int32, torch.int64, torch.int8, torch.uint8, torch.int16, torch.uint16, torch.uint32, torch.uint64]
DTYPES = FLOATS + INTS + [torch.bool, torch.complex64]
MOVABLE = DTYPES + [torch.float8_e4m3fn, torch.float8_e5m2]


def _bits_equal(a, b):
    return a.shape == b.shape and torch.equal(a.reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8))


def _moved_values(dt, rank, salt):
    """What a broadcast or scatter moves: bit patterns for floating and complex dtypes (every NaN payload, signalling
    NaNs, -0.0, subnormals: tests/bit_patterns.py), values over the whole range for the others."""
    if dt.is_floating_point or dt.is_complex:
        return patterns(dt, rank, salt, 64)
    return ref.make(dt, (4,), rank, salt)


def every_case(rank, n, sync=False):
    """Every op x reduce op x dtype, and every move, through funcoll's algorithms over the TpuTransport class driving
    the stand-in; results against tests/reference.py."""
    tp, st = make_transport(rank, n, sync)
    c = ref.Cases(rank, n)
    others = range(n)
    dtypes = DTYPES if not sync else [torch.float32, torch.int8, torch.bfloat16]
    with funcoll.record() as log:
        for dt in dtypes:
            for op in ref.valid_ops(dt):
                o = ref.c10d_op(op) if op == "premul_sum" else op
                vals = "small" if op in ("product", "avg") else "random"

                def ar(dt=dt, op=op, o=o, vals=vals):
                    t = ref.make(dt, (5,), rank, f"ar/{op}", vals)
                    algorithms.all_reduce(tp, t, o).wait()
                    return ref.close(t, ref.reduce(op, ref.all_inputs(n, dt, (5,), f"ar/{op}", vals)), n, op)

                c.check(f"all_reduce {dt} {op}", ar)

                def rs(dt=dt, op=op, o=o, vals=vals):
                    inp = ref.make(dt, (n * 2, 2), rank, f"rs/{op}", vals)
                    out = torch.empty((2, 2), dtype=dt)
                    algorithms.reduce_scatter_tensor(tp, out, inp, o).wait()
                    want = ref.reduce(op, ref.all_inputs(n, dt, (n * 2, 2), f"rs/{op}", vals))[rank * 2:rank * 2 + 2]
                    return ref.close(out, want, n, op)

                c.check(f"reduce_scatter {dt} {op}", rs)

                def red(dt=dt, op=op, o=o, vals=vals):
                    t = ref.make(dt, (4,), rank, f"red/{op}", vals)
                    orig = t.clone()
                    algorithms.reduce(tp, t, n - 1, o).wait()
                    if rank == n - 1:
                        return ref.close(t, ref.reduce(op, ref.all_inputs(n, dt, (4,), f"red/{op}", vals)), n, op)
                    return None if _bits_equal(t, orig) else "non-dst changed"

                c.check(f"reduce {dt} {op}", red)
        for dt in (MOVABLE if not sync else [torch.float32, torch.uint16]):
            def ag(dt=dt):
                out = torch.empty((2 * n, 3), dtype=dt)
                algorithms.all_gather_into_tensor(tp, out, ref.make(dt, (2, 3), rank, "ag")).wait()
                return None if _bits_equal(out, torch.cat(ref.all_inputs(n, dt, (2, 3), "ag"))) else "mismatch"

            c.check(f"all_gather {dt}", ag)

            def bc(dt=dt):
                src = n - 1
                t = _moved_values(dt, rank, "bc")
                algorithms.broadcast(tp, t, src).wait()
                return differ(t, _moved_values(dt, src, "bc"))

            c.check(f"broadcast (bit patterns) {dt}", bc)

            def a2a_even(dt=dt):
                inp = ref.make(dt, (2 * n, 2), rank, "a2ae")
                out = torch.empty_like(inp)
                algorithms.all_to_all_single(tp, out, inp).wait()
                want = torch.cat([ref.make(dt, (2 * n, 2), r, "a2ae")[2 * rank:2 * rank + 2] for r in others])
                return None if _bits_equal(out, want) else "mismatch"

            c.check(f"all_to_all_single even {dt}", a2a_even)

            def a2a_uneven(dt=dt):
                splits = [[(r + 2 * j) % 3 for j in others] for r in others]  # zeros included, asymmetric buffers
                ins, outs = splits[rank], [splits[j][rank] for j in others]
                inp = ref.make(dt, (sum(ins), 2), rank, "a2au")
                out = torch.empty((sum(outs), 2), dtype=dt)
                algorithms.all_to_all_single(tp, out, inp, outs, ins).wait()
                parts = []
                for j in others:
                    src = ref.make(dt, (sum(splits[j]), 2), j, "a2au")
                    off = sum(splits[j][:rank])
                    parts.append(src[off:off + splits[j][rank]])
                return None if _bits_equal(out, torch.cat(parts)) else "mismatch"

            c.check(f"all_to_all_single uneven {dt}", a2a_uneven)

            def gat(dt=dt):
                dst = 1 % n
                outs = [torch.empty(3, dtype=dt) for _ in others] if rank == dst else None
                algorithms.gather(tp, outs, ref.make(dt, (3,), rank, "gat"), dst).wait()
                if rank != dst:
                    return None
                return None if all(_bits_equal(o, ref.make(dt, (3,), r, "gat")) for r, o in enumerate(outs)) \
                    else "mismatch"

            c.check(f"gather {dt}", gat)

            def sca(dt=dt):
                src = 1 % n
                ins = [_moved_values(dt, j, "sca") for j in others] if rank == src else None
                out = torch.empty_like(_moved_values(dt, rank, "sca"))
                algorithms.scatter(tp, out, ins, src).wait()
                return differ(out, _moved_values(dt, rank, "sca"))

            c.check(f"scatter (bit patterns) {dt}", sca)

        def coalesced():
            ts = [ref.make(torch.float32, (3,), rank, "co/a"), ref.make(torch.int32, (2, 2), rank, "co/b"),
                  ref.make(torch.bfloat16, (2,), rank, "co/c")]
            algorithms.all_reduce_coalesced(tp, ts, "avg").wait()
            errs = [ref.close(t, ref.reduce("avg", ref.all_inputs(n, t.dtype, t.shape, s)), n, "avg")
                    for t, s in zip(ts, ["co/a", "co/b", "co/c"])]
            return "; ".join(e for e in errs if e) or None

        c.check("all_reduce_coalesced avg float32+int32+bfloat16", coalesced)

        def p2p():
            nxt, prv = (rank + 1) % n, (rank - 1) % n
            got = torch.empty(4)
            t = ref.make(torch.float32, (4,), rank, "p2p")
            if rank % 2 == 0:
                algorithms.send(tp, t, nxt).wait()
                algorithms.recv(tp, got, prv).wait()
            else:
                algorithms.recv(tp, got, prv).wait()
                algorithms.send(tp, t, nxt).wait()
            return None if torch.equal(got, ref.make(torch.float32, (4,), prv, "p2p")) else "mismatch"

        c.check("send/recv ring", p2p)

        def a2a_bound():
            """Under a promised bound no split size is agreed on (nothing read back): padded to the bound."""
            from funcoll.transport.tpu import static_split_bound

            ins = [(rank + j) % 3 for j in others]
            outs = [(j + rank) % 3 for j in others]
            inp = ref.make(torch.float32, (sum(ins), 2), rank, "a2ab")
            out = torch.empty((sum(outs), 2))
            with static_split_bound(2):
                algorithms.all_to_all_single(tp, out, inp, outs, ins).wait()
            parts = []
            for j in others:
                src = ref.make(torch.float32, (sum((j + k) % 3 for k in others), 2), j, "a2ab")
                off = sum((j + k) % 3 for k in range(rank))
                parts.append(src[off:off + (j + rank) % 3])
            return None if torch.equal(out, torch.cat(parts)) else "mismatch"

        c.check("all_to_all_single under static_split_bound(2)", a2a_bound)
        c.check("barrier", lambda: (algorithms.barrier(tp).wait(), None)[1])

    strategies = sorted({s for _, notes in log for s in notes})
    return {"failures": c.failures, "count": c.count, "log": st.log, "tp_calls": sum(tp.calls.values()),
            "strategies": strategies}


def controls(rank, n):
    """funcoll's answers to what ProcessGroupTpu gets wrong (integer AVG summed in the dtype, broadcast as zeros +
    SUM), through the transport; and the transport's refusal of what the table does not hand over, before the
    stand-in sees it."""
    tp, st = make_transport(rank, n, prefix="controls")
    out = {}

    def err(fn):
        try:
            fn()
        except Exception as e:  # noqa: BLE001 - the message is the result
            return f"{type(e).__name__}: {e}"
        return None

    y = torch.full((2,), 100, dtype=torch.int8)
    algorithms.all_reduce(tp, y, "avg").wait()
    out["funcoll int8 avg of 100s"] = y.tolist()
    z = torch.tensor([-0.0, 1.0]) if rank == 0 else torch.tensor([5.0, 5.0])
    algorithms.broadcast(tp, z, 0).wait()
    out["funcoll broadcast of -0.0"] = [str(v) for v in z.tolist()]
    # the transport refuses natively what the table does not list, before the stand-in sees anything
    before = len(st.log)
    from funcoll.semantics import ReduceOp, Reduction

    out["transport reduce"] = err(lambda: tp.reduce(torch.ones(2), 0, Reduction(ReduceOp.SUM)))
    out["transport premul"] = err(lambda: tp.all_reduce(torch.ones(2), Reduction(ReduceOp.PREMUL_SUM, 0.5)))
    out["transport int avg"] = err(lambda: tp.all_reduce(torch.ones(2, dtype=torch.int32), Reduction(ReduceOp.AVG)))
    out["transport uneven"] = err(lambda: tp.all_to_all(torch.empty(3), torch.empty(3), [1, 2], [2, 1]))
    out["stand-in calls after refusals"] = len(st.log) - before
    dist.barrier()
    return out


def _bopts(root):
    o = C.BroadcastOptions()
    o.rootRank = root
    o.rootTensor = 0
    return o


def standin_world(rank, n):
    """Everything of tests/torchtpu/test_torchtpu_standin.py in one world (a world costs seconds to start): the cases
    over an asynchronous stand-in, a few over one that answers without a Work, and the controls."""
    return {"cases": every_case(rank, n), "sync": every_case(rank, n, sync=True), "controls": controls(rank, n)}


# ------------------------------------------------------------------------------------------------------
# with torch_tpu loaded (a fresh interpreter: TorchTPU renames PrivateUse1 process-wide, and a real tpu tensor
# aborts a process without a TPU). Only fake tpu tensors and CPU tensors are made here.
# ------------------------------------------------------------------------------------------------------
def torch_tpu_main() -> dict:
    """Loads torch_tpu by hand (its device init runs without a TPU), then: FX graphs of every ``_c10d_functional``
    op on fake ``tpu`` tensors with and without funcoll's kernels (on a fake 4-rank group), the graph a CUDA user
    gets, and funcoll's PrivateUse1 kernels reached by redispatch with CPU tensors on a 1-rank gloo group."""
    import torch_tpu  # noqa: F401
    from torch_tpu import _loader

    _loader._init_device("tpu")
    from torch.testing._internal.distributed.fake_pg import FakeStore

    from funcoll.testing import render_graph
    from funcoll.transport.registry import transport_for
    from tests.xpu import test_xpu_graphs as graphs

    out: dict = {"privateuse1": torch._C._get_privateuse1_backend_name(),
                 "backends": sorted(b for b in dist.Backend.backend_list if "tpu" in b)}
    dist.init_process_group("cpu:fake,tpu:fake", store=FakeStore(), rank=1, world_size=graphs.WORLD_SIZE)

    def trace(device_type, functional):
        saved = graphs.SUB[:]
        try:
            return graphs.trace(device_type, functional)
        finally:
            graphs.SUB[:] = saved or graphs.SUB

    out["before"] = {f: render_graph(trace("tpu", f)) for f in (False, True)}
    out["installed"] = funcoll.install(["tpu"])
    out["with_funcoll"] = {f: render_graph(trace("tpu", f)) for f in (False, True)}
    out["code_with_funcoll"] = trace("tpu", True).code
    out["cuda"] = {f: render_graph(trace("cuda", f)) for f in (False, True)}
    out["cuda_code"] = trace("cuda", True).code
    try:
        transport_for(dist.group.WORLD, torch.device("tpu"))
        out["fake_backend"] = None
    except ValueError as e:
        out["fake_backend"] = str(e)
    dist.destroy_process_group()

    # funcoll's kernels on the PrivateUse1 key, reached by redispatching CPU tensors to it (a 1-rank gloo group)
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    key = torch._C.DispatchKeySet(torch._C.DispatchKey.PrivateUse1)
    c = torch.ops._c10d_functional
    name = dist.group.WORLD.group_name
    ran = {}
    x = torch.tensor([3, -7, 100], dtype=torch.int8)
    with funcoll.record() as log:
        ran["all_reduce avg int8"] = c.wait_tensor(c.all_reduce.default.redispatch(key, x, "avg", name)).tolist()
        ran["all_reduce bxor int32"] = c.wait_tensor(c.all_reduce.default.redispatch(
            key, torch.tensor([5, 6], dtype=torch.int32), "bxor", name)).tolist()
        ran["broadcast -0.0"] = [str(v) for v in c.wait_tensor(c.broadcast.default.redispatch(
            key, torch.tensor([-0.0, 2.5]), 0, name)).tolist()]
        ran["all_gather float32"] = c.wait_tensor(c.all_gather_into_tensor.default.redispatch(
            key, torch.tensor([1.5, 2.0]), 1, name)).tolist()
        ran["reduce_scatter avg bfloat16"] = c.wait_tensor(c.reduce_scatter_tensor.default.redispatch(
            key, torch.tensor([1.0, 3.0], dtype=torch.bfloat16), "avg", 1, name)).float().tolist()
        ran["all_to_all_single splits"] = c.wait_tensor(c.all_to_all_single.default.redispatch(
            key, torch.tensor([4.0, 5.0]), [2], [2], name)).tolist()
    out["redispatch"] = ran
    out["redispatch_log"] = [[op, list(notes)] for op, notes in log]
    funcoll.uninstall(["tpu"])
    with funcoll.record() as log2:
        c.wait_tensor(c.all_reduce.default.redispatch(key, x.clone(), "sum", name))
    out["after_uninstall_log"] = log2
    dist.destroy_process_group()
    return out
