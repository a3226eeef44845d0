"""The plumbing every c10d-backed transport shares (gloo, XCCL, TorchTPU): :class:`C10dTransport`, the primitives of a
c10d backend object, and the background waiter that gives a backend's short Works c10d's whole contract."""

from __future__ import annotations

import contextlib
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from typing import Optional, Sequence

import torch
import torch._C._distributed_c10d as C
import torch.distributed as dist

from funcoll.semantics import ReduceOp, Reduction
from funcoll.transport import DONE, P2P, Capabilities, Native, Transport, _run_before_send, wait_quietly

_C10D_OP = {op: getattr(dist.ReduceOp, op.name) for op in ReduceOp if op is not ReduceOp.PREMUL_SUM}


def c10d_op(red: Reduction):
    if red.op is ReduceOp.PREMUL_SUM:  # native only where a profile lists it (XCCL scale-up, when enabled)
        return dist._make_nccl_premul_sum(red.factor)  # type: ignore[arg-type]
    return _C10D_OP[red.op]


def _options(cls, **fields):
    options = cls()
    for name, value in fields.items():
        setattr(options, name, value)
    return options


# ---------------------------------------------------------------------------------------------------
# Works the backend leaves short of c10d's contract
# ---------------------------------------------------------------------------------------------------
# gloo's send/recv and reduce_scatter Works have no future ("Work::getFuture not implemented") and say
# is_completed() == False until someone calls wait() (reduce_scatter's, even after it). BackendWait supplies both.
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
    """Runs ``job()`` on one of the waiter threads (autograd off there: see wait_quietly, a Work may write in
    wait())."""
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
    end = time.monotonic() + _CALLBACK_GRACE_S
    while any(not f.done() for f in _CALLBACKS) and time.monotonic() < end:
        time.sleep(0.005)


threading._register_atexit(_drain_callbacks)  # type: ignore[attr-defined]


def is_wait_timeout(e: BaseException) -> bool:
    """The caller's ``wait(timeout)`` ran out (funcoll's own TimeoutError, or c10d's "Operation timed out!"), as
    opposed to the backend giving up on the collective."""
    return isinstance(e, TimeoutError) or "Operation timed out!" in str(e)


_WAIT_LOCK = threading.Lock()  # BackendWait's short critical sections (who waits on the backend's Work)


class BackendWait(C.Work):
    """A backend Work (``_h``, set by the subclass) with what c10d's contract needs of it: ``wait([timeout])``,
    ``is_completed()`` without a wait, ``get_future()``, ``result()``, ``_source_rank()``. Exactly one thread waits on
    the backend's Work (gloo's send/recv Works must not be waited on twice at once): the caller of ``wait()``, when
    nobody else does; anyone else waits for that wait. A Work without a future and without a completion flag of its
    own gets a background waiter (:func:`in_background`) only at the first ``get_future()``, at the first
    ``is_completed()`` poll that finds it running, or when a ``wait(timeout)`` runs out while others wait for it. The
    hooks raise and return as c10d's Works do; funcoll.entry.work.NativeWork's name the collective."""

    _h: C.Work
    _done = False
    _exc: Optional[BaseException] = None
    _waiting = False  # a thread waits on the backend's Work (the caller in wait(), or a background waiter)
    _wait_done: Optional[threading.Event] = None  # set when that wait has returned: made by whoever waits for it
    _fut: Optional[torch.futures.Future] = None  # funcoll's future, for a backend Work without one
    _bfut: Optional[torch.futures.Future] = None  # the backend Work's own future, handed out as this Work's
    _nofut: Optional[bool] = None  # the backend's Work has no future (asked once, when it matters)
    _quiet = False  # the backend's Work writes the outputs in wait(): a caller's thread waits with autograd off

    # -- the hooks --------------------------------------------------------------------------------------
    def _failure(self, e: BaseException) -> BaseException:  # records the permanent failure; the error to raise
        if self._exc is None:
            self._exc = e
        return self._exc

    def _wait_timeout(self, e: BaseException, limit: timedelta) -> BaseException:
        return RuntimeError("Operation timed out!")  # what c10d's Work.wait(timeout) raises

    def _completed(self) -> None:  # the backend's Work has completed without error
        pass

    def _value(self):  # what result() and the future hand over
        return self._h.result()

    def _watch(self, fut: torch.futures.Future) -> None:  # the backend Work's own future is handed out
        pass

    # -- who waits on the backend's Work ----------------------------------------------------------------
    def _claim(self) -> Optional[bool]:
        """True: this thread is now the one to wait on the backend's Work; False: another thread does (``_wait_done``
        is set when its wait returns); None: the Work has already finished."""
        with _WAIT_LOCK:
            if self._done or self._exc is not None:
                return None
            if not self._waiting:
                self._waiting = True
                return True
            if self._wait_done is None:
                self._wait_done = threading.Event()
            return False

    def _wait_backend(self) -> None:
        """Waits on the backend's Work (this thread has claimed it), records the outcome and wakes whoever waits."""
        try:
            wait_quietly(self._h) if self._quiet else self._h.wait()
        except BaseException as e:  # noqa: BLE001 - recorded; wait(), exception() and the future report it
            self._failure(e)
        else:
            self._done = True
            self._completed()
        self._wake()

    def _wake(self) -> None:
        """Wakes the threads waiting for the wait, and completes the future, if one was asked for."""
        with _WAIT_LOCK:
            wait_done, fut = self._wait_done, self._fut
        if wait_done is not None:
            wait_done.set()
        if fut is None or fut.done():
            return
        try:
            value = None if self._exc is not None else self._value()
        except Exception:  # noqa: BLE001 - a backend Work without result() (no outputs known): nothing to hand over
            value = []
        with contextlib.suppress(RuntimeError):  # settled meanwhile by another thread: get_future() and the waiter
            if self._exc is not None:
                fut.set_exception(self._exc)
            else:
                fut.set_result(value)

    def _in_background(self) -> None:
        """A background waiter waits on the backend's Work, unless a thread does already."""
        if self._claim():
            in_background(self._wait_backend)

    def _backend_future(self) -> Optional[torch.futures.Future]:
        """The backend Work's own future; None where it has none (c10d's "not implemented": asked once)."""
        try:
            fut, self._nofut = (None, True) if self._nofut else (self._h.get_future(), False)
        except (RuntimeError, AttributeError):  # not implemented, or a handle without futures
            fut, self._nofut = None, True
        return fut

    # -- the Work API ---------------------------------------------------------------------------------
    def wait(self, timeout: timedelta = timedelta(0)) -> bool:
        if self._exc is not None:
            raise self._exc
        if self._done:
            return True
        limit = timeout if timeout and timeout > timedelta(0) else None
        with _WAIT_LOCK:  # _claim, inlined: every send and recv c10d waits on comes here
            if self._done or self._exc is not None:
                mine = None
            elif not self._waiting:
                self._waiting = mine = True
            else:
                mine = False
                if self._wait_done is None:
                    self._wait_done = threading.Event()
        if mine:
            work = self._h
            try:
                if self._quiet:
                    wait_quietly(work, limit)
                elif limit is None:
                    work.wait()
                else:
                    work.wait(limit)
            except Exception as e:  # noqa: BLE001 - re-raised through the hooks
                if limit is not None and is_wait_timeout(e):
                    with _WAIT_LOCK:  # still pending: the wait is handed to a background waiter if someone waits
                        hand_over = self._wait_done is not None or self._fut is not None
                        self._waiting = hand_over
                    if hand_over:
                        in_background(self._wait_backend)
                    raise self._wait_timeout(e, limit) from e
                err = self._failure(e)  # named after e (or e itself), its __cause__ kept
                self._wake()
                if err is e:
                    raise
                raise err from e
            self._done = True
            self._completed()
            if self._wait_done is not None or self._fut is not None:
                self._wake()
            return True
        if mine is False:  # another thread waits on the backend's Work: wait for its wait
            wait_done = self._wait_done
            assert wait_done is not None
            # (_done is read again: the waiting thread may have finished before this one made ``wait_done``)
            if not (self._done or wait_done.wait(None if limit is None else limit.total_seconds())):
                err = TimeoutError("Operation timed out!")
                raise self._wait_timeout(err, limit or timedelta(0)) from err
        if self._exc is not None:
            raise self._exc
        return True

    def is_completed(self) -> bool:
        if self._done or self._exc is not None:
            return True
        own_future = self._bfut  # gloo completes a Work's future just before the Work itself
        # the data is in place: finish (a short wait)
        if self._h.is_completed() or (own_future is not None and own_future.done()):
            if self._claim():
                self._wait_backend()
            return self._done or self._exc is not None
        if self._nofut or (self._nofut is None and self._backend_future() is None):  # never completed until waited on
            self._in_background()
        return False

    def get_future(self) -> torch.futures.Future:
        """The backend Work's own future where it has one, as a c10d Work's (no Python callback runs on the backend's
        thread; it completes, or fails with the backend's own error, when the backend's Work does); else one of
        funcoll's, completed by whoever waits on the backend's Work (a background waiter, if nobody does)."""
        own_future = self._bfut
        if own_future is not None:
            return own_future
        if self._exc is None:
            own_future = self._backend_future()  # one call: DDP asks every bucket's Work for its future
            if own_future is not None:
                self._bfut = own_future
                self._watch(own_future)
                return own_future
        with _WAIT_LOCK:
            if self._fut is not None:
                return self._fut
            out: torch.futures.Future = torch.futures.Future()
            self._fut = out
            finished = self._done or self._exc is not None
        if finished:
            self._wake()
        else:
            self._in_background()  # whoever waits on the backend's Work completes the future (_wake)
        return out

    def result(self):
        self.wait()
        return self._value()

    def _source_rank(self) -> int:
        self.wait()
        return self._h._source_rank()


class WaitedWork(BackendWait):
    """A backend Work whose own future funcoll does not use (it has none: :func:`waited`; or a send's or receive's,
    whose future c10d's Works may lack: not asked), waited on by whoever waits, or by a background waiter from the
    first ``get_future()`` or ``is_completed()`` poll on: its future completes with ``result`` (the Work's own
    ``result()`` when None)."""

    _nofut = True

    def __init__(self, work, result=None):
        super().__init__()
        self._h = work
        self._res = result

    def _value(self):
        return self._res if self._res is not None else super()._value()


def waited(work, result=None):
    """``work`` itself when it serves ``get_future()`` (asking is harmless: the Work stays usable), else a
    :class:`WaitedWork` of it; DONE for no Work (ProcessGroupTpu answers a synchronous call without one)."""
    if work is None:
        return DONE
    try:
        work.get_future()
    except (RuntimeError, AttributeError):  # c10d's "not implemented", or a handle with no futures at all
        return WaitedWork(work, result)
    return work


class C10dTransport(Transport):
    """Primitives of a c10d backend object (ProcessGroupGloo, ProcessGroupXCCL, ProcessGroupTpu). ``premul_in_place``
    (gloo, which has no PREMUL_SUM: only a profile lists it): a PREMUL_SUM is done as ProcessGroupXCCL 2.12+ does it
    (:meth:`_premul`)."""

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
        ``t`` scaled in place (a reduce_scatter's *input*) and SUM."""
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
        """The compiled kernels' native all_reduce: only called with a request the planner found native, so the
        capability check is not repeated (the backend reads the options made once per (op, dtype), never keeps them)."""
        if type(self)._all_reduce is not C10dTransport._all_reduce or red.op is ReduceOp.PREMUL_SUM:
            return super().all_reduce_functional(t, red)  # a subclass's own primitive, or a factor per call
        opts = self._all_reduce_form(red, t.dtype, lambda r: _options(C.AllreduceOptions, reduceOp=c10d_op(r)))
        out = t.clone(memory_format=torch.contiguous_format)
        _run_before_send()
        return out, self.backend.allreduce([out], opts)

    def native_method(self, primitive: str, op: str, dtype: Optional[torch.dtype], method: str) -> Optional[Native]:
        """The backend's own ``method``, when this transport's ``primitive`` is the stock one (a subclass that changes
        it is called through the transport: the full path); send_recv is two methods, send and recv."""
        stock = ("_send", "_recv") if primitive == "send_recv" else ("_" + primitive,)
        if any(getattr(type(self), name) is not getattr(C10dTransport, name) for name in stock):
            return None
        issue = getattr(self.backend, method, None)
        return Native(self, issue, (primitive, op, dtype)) if issue is not None else None

    def _all_gather(self, out, inp):
        return self.backend._allgather_base(out, inp, C.AllgatherOptions())

    def _reduce_scatter(self, out, inp, red):
        if red.op is ReduceOp.PREMUL_SUM:
            red = self._premul(inp, red)
        options = _options(C.ReduceScatterOptions, reduceOp=c10d_op(red))
        return waited(self.backend._reduce_scatter_base(out, inp, options), [out])

    def _reduce_scatter_list(self, out, ins, red):
        options = _options(C.ReduceScatterOptions, reduceOp=c10d_op(red))
        return waited(self.backend.reduce_scatter([out], [list(ins)], options), [out])

    def _all_gather_list(self, outs, inp):
        return self.backend.allgather([list(outs)], [inp], C.AllgatherOptions())

    def _all_to_all(self, out, inp, out_splits, in_splits):
        return self.backend.alltoall_base(out, inp, out_splits or [], in_splits or [], C.AllToAllOptions())

    def _broadcast(self, t, src):
        return self.backend.broadcast([t], _options(C.BroadcastOptions, rootRank=src, rootTensor=0))

    def _reduce(self, t, dst, red):
        return self.backend.reduce([t], _options(C.ReduceOptions, reduceOp=c10d_op(red), rootRank=dst, rootTensor=0))

    def _gather(self, outs, inp, dst):
        options = _options(C.GatherOptions, rootRank=dst)
        return self.backend.gather([list(outs)] if outs is not None else [], [inp], options)

    def _scatter(self, out, inps, src):
        options = _options(C.ScatterOptions, rootRank=src)
        return self.backend.scatter([out], [list(inps)] if inps is not None else [], options)

    def _send(self, t, dst, tag):  # (not asked for a future: gloo's raises, and an exception costs more than the send)
        return WaitedWork(self.backend.send([t], dst, tag), [t])

    def _recv(self, t, src, tag):
        return WaitedWork(self.backend.recv([t], src, tag), [t])

    def _p2p_group(self, ops: Sequence[P2P]) -> list:
        """A backend that coalesces (ProcessGroupXCCL) gets the group between its ``_start_coalescing`` and
        ``_end_coalescing`` (one oneCCL group); gloo, which does not, each operation as it comes."""
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

    def _barrier(self):
        return self.backend.barrier(C.BarrierOptions())

    def abort(self) -> None:
        """The backend's own ``abort()`` (ProcessGroupXCCL's does not interrupt an in-flight collective:
        intel/torch-xpu-ops#5071; ProcessGroupTpu's is empty: docs/fault-tolerance.md)."""
        getattr(self.backend, "abort", lambda: None)()

    def shutdown(self) -> None:
        getattr(self.backend, "shutdown", lambda: None)()
