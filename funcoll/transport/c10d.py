"""The plumbing every c10d-backed transport shares (gloo, XCCL, TorchTPU): :class:`C10dTransport`, the primitives of a
c10d backend object, and the background waiter that gives a backend's short Works c10d's whole contract."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from typing import Optional, Sequence

import torch
import torch._C._distributed_c10d as C
import torch.distributed as dist

from funcoll.semantics import ReduceOp, Reduction
from funcoll.transport import P2P, Capabilities, Native, Transport, _run_before_send

_C10D_OP = {op: getattr(dist.ReduceOp, op.name) for op in ReduceOp if op is not ReduceOp.PREMUL_SUM}


def c10d_op(red: Reduction):
    if red.op is ReduceOp.PREMUL_SUM:  # native only where a profile lists it (XCCL scale-up, when enabled)
        return dist._make_nccl_premul_sum(red.factor)  # type: ignore[arg-type]
    return _C10D_OP[red.op]


def _options(cls, **fields):
    """A c10d options object of class ``cls`` with ``fields`` set."""
    o = cls()
    for name, value in fields.items():
        setattr(o, name, value)
    return o


# ---------------------------------------------------------------------------------------------------
# Works the backend leaves short of c10d's contract
# ---------------------------------------------------------------------------------------------------
# gloo's send/recv and reduce_scatter Works have no future ("Work::getFuture not implemented") and say
# is_completed() == False until someone calls wait() (reduce_scatter's, even after it). funcoll supplies both: such a
# Work is waited on by a background thread from the moment it is issued, which completes a future (the Work's
# result, or its error) and a flag.
#
# The threads are concurrent.futures' (a new one when none is idle: a job may block for long), NOT daemons, on
# purpose: a daemon thread blocked in a C++ wait with the GIL released, whose wait returns while the interpreter
# finalizes (a pending receive failing as the peer process exits, a send completing), re-takes the GIL in a destructor,
# where CPython 3.11 ends the thread with pthread_exit: the forced unwind through that noexcept destructor is
# std::terminate ("terminate called without an active exception", SIGABRT). The pool's own exit hook (threading's,
# before finalization) lets idle threads leave and busy ones finish their wait first -- a pending operation completes,
# fails as its peer exits, or fails at the group's timeout.


_WAITERS = ThreadPoolExecutor(1 << 16, "funcoll-waiter", initializer=torch.set_grad_enabled, initargs=(False,))


def in_background(job) -> None:
    """Runs ``job()`` on one of the waiter threads (autograd off there: see wait_quietly, a Work may write in wait()):
    a wait on a backend Work that must not block the caller (funcoll.entry.work.NativeWork, for a Work without a
    future of its own)."""
    try:
        _WAITERS.submit(job)
    except RuntimeError:  # the interpreter is exiting: the pool takes no more jobs, the job gets a thread of its own
        threading.Thread(target=lambda: (torch.set_grad_enabled(False), job()), name="funcoll-waiter").start()


# Futures with Python callbacks that a backend's own C++ threads will run (FuncollWork.get_future chains the finishing
# steps on the backend's futures): a callback run while the interpreter finalizes takes the GIL on a C++ thread and
# ends as above. At exit (threading's hook, as the pool's) the ones still pending get a bounded grace period to
# complete first.
_CALLBACKS: list = []
_CALLBACK_GRACE_S = 10.0


def track_callbacks(fut) -> None:
    """Remembers ``fut`` (whose completion runs Python callbacks on a backend thread) until it is done."""
    if len(_CALLBACKS) > 256:
        _CALLBACKS[:] = [f for f in _CALLBACKS if not f.done()]
    _CALLBACKS.append(fut)


def _drain_callbacks() -> None:
    import time

    end = time.monotonic() + _CALLBACK_GRACE_S
    while any(not f.done() for f in _CALLBACKS) and time.monotonic() < end:
        time.sleep(0.005)


threading._register_atexit(_drain_callbacks)  # type: ignore[attr-defined]


class WaitedWork(C.Work):
    """A backend Work with c10d's whole contract: ``wait([timeout])`` (past a timeout: "Operation timed out!", the
    operation stays pending, as c10d's), ``is_completed()`` True once the data is in place, ``get_future()`` completed
    with the Work's result or error, ``exception()``, ``result()``, ``_source_rank()``. The backend's Work is waited on
    by a background thread (:func:`in_background`) from construction on."""

    def __init__(self, work, result=None):
        super().__init__()
        self._work = work
        self._res = result
        self._event = threading.Event()
        self._error: Optional[BaseException] = None
        self._fut: torch.futures.Future = torch.futures.Future()
        in_background(self._wait_backend)

    def _wait_backend(self) -> None:
        try:
            self._work.wait()
        except BaseException as e:  # noqa: BLE001 - kept for wait(), exception() and the future
            self._error = e
        self._event.set()
        if self._error is not None:
            self._fut.set_exception(self._error)
        else:
            self._fut.set_result(self._res if self._res is not None else self._result_of_work())

    def _result_of_work(self):
        try:
            return self._work.result()
        except Exception:  # noqa: BLE001 - a Work without result(): nothing to hand over
            return []

    def wait(self, timeout=None) -> bool:
        limit = None if timeout is None or timeout <= timedelta(0) else timeout.total_seconds()
        if not self._event.wait(limit):
            raise RuntimeError("Operation timed out!")  # what c10d's Work.wait(timeout) raises
        if self._error is not None:
            raise self._error
        return True

    def is_completed(self) -> bool:
        return self._event.is_set()

    def is_success(self) -> bool:
        return self._event.is_set() and self._error is None

    def exception(self):
        return self._error

    def get_future(self) -> torch.futures.Future:
        return self._fut

    def result(self):
        self.wait()
        return self._res if self._res is not None else self._result_of_work()

    def _source_rank(self) -> int:
        self.wait()
        return self._work._source_rank()

    def source_rank(self) -> int:
        return self._source_rank()


def has_future(work) -> bool:
    """Whether a backend Work serves ``get_future()`` (asking is harmless: the Work stays usable)."""
    try:
        work.get_future()
    except (RuntimeError, AttributeError):  # c10d's "not implemented", or a handle with no futures at all
        return False
    return True


def waited(work, result=None):
    """``work`` itself when it serves c10d's contract, else a :class:`WaitedWork` of it."""
    return work if has_future(work) else WaitedWork(work, result)


class C10dTransport(Transport):
    """Primitives of a c10d backend object (ProcessGroupGloo, ProcessGroupXCCL, ...).

    ``premul_in_place`` (True on gloo, which has no PREMUL_SUM: only a profile lists it, the xccl profile on torch
    2.12+): a PREMUL_SUM is done as ProcessGroupXCCL 2.12+ does it, ``t.mul_(factor)`` on the tensor handed (a
    reduce_scatter's *input*), then SUM."""

    def __init__(self, backend, caps: Capabilities, device_type: str = "cpu"):
        super().__init__(backend.rank(), backend.size(), caps)
        self.backend = backend
        self.device_type = device_type
        self.premul_in_place = isinstance(backend, dist.ProcessGroupGloo)
        # the backend's list forms, where this class keeps the stock primitive (the fast path hands the same requests
        # to the same methods: native_method)
        self.list_forms = frozenset(p for p in ("reduce_scatter", "all_gather")
                                    if getattr(type(self), "_" + p) is getattr(C10dTransport, "_" + p))

    def _premul(self, t: torch.Tensor, red: Reduction) -> Reduction:
        """The reduction to hand the backend for ``red`` on ``t``: PREMUL_SUM's factor as the backend needs it (a
        scalar tensor on ``t``'s device, in its dtype: XCCL multiplies ``t`` by it), or, with ``premul_in_place``,
        ``t`` scaled in place and SUM."""
        f = red.factor_like(t)
        assert f is not None  # semantics.parse_reduction refuses a PREMUL_SUM without one
        if self.premul_in_place:
            t.mul_(f)
            return Reduction(ReduceOp.SUM)
        return Reduction(ReduceOp.PREMUL_SUM, f)

    def _all_reduce(self, t, red):
        if red.op is ReduceOp.PREMUL_SUM:
            red = self._premul(t, red)
        return self.backend.allreduce([t], _options(C.AllreduceOptions, reduceOp=c10d_op(red)))

    def all_reduce_functional(self, t, red: Reduction):
        """The compiled kernels' native all_reduce: only called with a request the planner found native
        (``algorithms.native_all_reduce``), so the capability check is not repeated; the count and the backend's
        options are made once per (op, dtype) (the options are read by the backend when called, never kept)."""
        if type(self)._all_reduce is not C10dTransport._all_reduce or red.op is ReduceOp.PREMUL_SUM:
            return super().all_reduce_functional(t, red)  # a subclass's own primitive, or a factor per call
        tally, opts = self._all_reduce_form(red, t.dtype, lambda r: _options(C.AllreduceOptions, reduceOp=c10d_op(r)))
        out = t.clone(memory_format=torch.contiguous_format)
        _run_before_send()
        tally.n += 1
        return out, self.backend.allreduce([out], opts)

    # the backend's own method of each primitive the eager fast path hands requests to (ProcessGroup method names)
    # (a list form names its own method: native_method's ``method``); send_recv is two methods, send and recv
    _METHODS = {"all_reduce": "allreduce", "all_gather": "_allgather_base", "reduce_scatter": "_reduce_scatter_base",
                "all_to_all": "alltoall_base", "broadcast": "broadcast", "barrier": "barrier"}

    def native_method(self, primitive: str, op: str, dtype: Optional[torch.dtype],
                      method: Optional[str] = None) -> Optional[Native]:
        """The backend's own method for ``primitive`` (or ``method``, its list form or send/recv), when this
        transport's primitive is the stock one (a subclass that changes it is called through the transport: the full
        path)."""
        stock = ("_send", "_recv") if primitive == "send_recv" else ("_" + primitive,)
        if any(getattr(type(self), name) is not getattr(C10dTransport, name) for name in stock):
            return None
        issue = getattr(self.backend, method or self._METHODS[primitive], None)
        return Native(self, issue, (primitive, op, dtype)) if issue is not None else None

    def _all_gather(self, out, inp):
        return self.backend._allgather_base(out, inp, C.AllgatherOptions())

    def _reduce_scatter(self, out, inp, red):
        if red.op is ReduceOp.PREMUL_SUM:
            red = self._premul(inp, red)
        o = _options(C.ReduceScatterOptions, reduceOp=c10d_op(red))
        return waited(self.backend._reduce_scatter_base(out, inp, o), [out])

    def _reduce_scatter_list(self, out, ins, red):
        o = _options(C.ReduceScatterOptions, reduceOp=c10d_op(red))
        return waited(self.backend.reduce_scatter([out], [list(ins)], o), [out])

    def _all_gather_list(self, outs, inp):
        return self.backend.allgather([list(outs)], [inp], C.AllgatherOptions())

    def _all_to_all(self, out, inp, out_splits, in_splits):
        return self.backend.alltoall_base(out, inp, out_splits or [], in_splits or [], C.AllToAllOptions())

    def _broadcast(self, t, src):
        return self.backend.broadcast([t], _options(C.BroadcastOptions, rootRank=src, rootTensor=0))

    def _reduce(self, t, dst, red):
        return self.backend.reduce([t], _options(C.ReduceOptions, reduceOp=c10d_op(red), rootRank=dst, rootTensor=0))

    def _gather(self, outs, inp, dst):
        o = _options(C.GatherOptions, rootRank=dst)
        return self.backend.gather([list(outs)] if outs is not None else [], [inp], o)

    def _scatter(self, out, inps, src):
        o = _options(C.ScatterOptions, rootRank=src)
        return self.backend.scatter([out], [list(inps)] if inps is not None else [], o)

    def _send(self, t, dst, tag):
        return waited(self.backend.send([t], dst, tag), [t])

    def _p2p_group(self, ops: Sequence[P2P]) -> list:
        """A backend that coalesces (ProcessGroupXCCL) gets the group between its ``_start_coalescing`` and
        ``_end_coalescing`` (oneCCL's groupStart/groupEnd: one group, replayed in the order given); gloo, which has no
        groups, each operation as it comes."""
        backend = self.backend
        if not getattr(backend, "supports_coalescing", False):
            return super()._p2p_group(ops)
        device = ops[0].tensor.device
        backend._start_coalescing(device)
        try:
            for op in ops:
                (backend.send if op.send else backend.recv)([op.tensor], op.peer, op.tag)
        finally:
            work = backend._end_coalescing(device)
        return [work] if work is not None else []

    def _recv(self, t, src, tag):
        return waited(self.backend.recv([t], src, tag), [t])

    def _barrier(self):
        return self.backend.barrier(C.BarrierOptions())
