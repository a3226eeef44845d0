"""``FuncollWork``: the Work every eager funcoll collective returns, and the errors it raises
(:mod:`funcoll.entry.errors`).

A Work waits on the transport's native handles, then runs the algorithm's finishing steps once. It tells the
truth about failure, as c10d's own Works do:

* ``wait()`` raises :class:`CollectiveError` (a ``torch.distributed.DistBackendError``, so a ``RuntimeError``)
  when the collective failed -- a peer died, the backend timed out -- naming the op, the group, its ranks and the
  sequence number, with the backend's own message kept (``__cause__``);
* ``wait(timeout)`` raises :class:`CollectiveTimeoutError` past ``timeout``; the collective stays pending (a later
  ``wait`` may still complete it), as with c10d's ``Work.wait(timeout)``;
* ``is_completed()`` never blocks; it becomes True when the native handles are done (also when they failed), and
  then runs the finishing steps;
* ``is_success()`` is True only for a completed collective without error; ``exception()`` is that error or None;
* ``get_future()`` completes with the outputs, or with the error (DDP comm hooks see the failure).

On a timeout the group's flight recorder is dumped (:mod:`funcoll.flight_recorder`) and its last entries are
quoted in the message.
"""

from __future__ import annotations

import threading
import time
from datetime import timedelta
from typing import Optional, Sequence

import torch
from torch._C._distributed_c10d import Work

from funcoll import algorithms
from funcoll.entry import flight_recorder
from funcoll.entry.errors import (
    CollectiveError,
    CollectiveTimeoutError,
    backend_message,
    is_backend_timeout,
    is_wait_timeout,
)
from funcoll.entry.flight_recorder import NativeEntry, recent
from funcoll.transport import wait_quietly
from funcoll.transport.c10d import in_background, track_callbacks

_now = time.time

__all__ = ["FuncollWork", "NativeWork", "failure"]


def _pending_native_done(p) -> bool:
    """Whether every native handle of a :class:`funcoll.algorithms.Pending` has completed (successfully or not),
    without blocking and without running its finishing steps."""
    fut = getattr(p, "_future", None)
    if fut is not None:
        return fut.done()
    for h in getattr(p, "_handles", ()):
        if hasattr(h, "_handles"):
            if not _pending_native_done(h):
                return False
        elif not h.is_completed():
            return False
    return True


def _named(work, e: BaseException, limit) -> CollectiveError:
    """The error a Work's ``wait`` raises for the backend's ``e``: a timeout of the caller's ``limit`` as such, else
    the collective's failure; both name the collective (FuncollWork and NativeWork alike)."""
    return work._wait_timeout(e, limit) if limit is not None and is_wait_timeout(e) else work._failure(e)


class FuncollWork(Work):
    """A Work whose ``wait()`` waits on the transport's native handles, then runs the algorithm's finishing
    steps. Asynchronous where the transport is (gloo, XCCL); complete at once on XLA."""

    def __init__(self, pending, result: Sequence[torch.Tensor] = (), call: Optional[flight_recorder.Call] = None,
                 trace: Optional[flight_recorder.GroupTrace] = None):
        super().__init__()
        self._pending = pending
        self._result = list(result)
        self._done = False
        self._exc: Optional[CollectiveError] = None
        self._call = call
        self._trace = trace
        self._fut: Optional[torch.futures.Future] = None
        self._lock = threading.RLock()

    def _attach(self, call: flight_recorder.Call, trace: flight_recorder.GroupTrace) -> "FuncollWork":
        """Called by the pipeline (:mod:`funcoll.entry.pipeline`) with the call's flight-recorder entry."""
        self._call, self._trace = call, trace
        if self._done:
            call.completed()
        return self

    # -- errors -----------------------------------------------------------------------------------------
    def _label(self) -> str:
        return self._call.label() if self._call is not None else "collective"

    def _failure(self, e: BaseException) -> CollectiveError:
        """Records ``e`` as this collective's permanent failure; returns the error to raise."""
        if self._exc is None:
            self._exc = failure(self._call, self._trace, e)
        return self._exc

    def _wait_timeout(self, e: BaseException, limit: timedelta) -> CollectiveTimeoutError:
        err = CollectiveTimeoutError(
            f"funcoll: {self._label()} did not complete within the {limit.total_seconds():g} s given to "
            "Work.wait(); it is still pending (wait again, or check that every rank of the group issued it)."
            + recent(self._call, self._trace, dump=True))
        err.__cause__ = e
        return err

    # -- the Work API ---------------------------------------------------------------------------------
    def wait(self, timeout: timedelta = timedelta(0)) -> bool:
        """Waits for the collective and its finishing steps. A non-zero ``timeout`` bounds the wait
        (:class:`CollectiveTimeoutError` past it, the collective stays pending); zero means the group's timeout,
        past which the backend fails the collective (:class:`CollectiveError`)."""
        limit = timeout if timeout and timeout > timedelta(0) else None
        with self._lock:
            if self._exc is not None:
                raise self._exc
            if self._done:
                return True
            try:
                self._pending.wait(limit)
            except Exception as e:  # noqa: BLE001 - re-raised with the collective named
                raise _named(self, e, limit) from e
            self._done = True
            if self._call is not None:
                self._call.completed()
        return True

    def is_completed(self) -> bool:
        """True once the collective has finished, successfully or not (never blocks)."""
        if self._done or self._exc is not None:
            return True
        if not _pending_native_done(self._pending):
            return False
        if not self._lock.acquire(blocking=False):  # another thread is finishing it
            return False
        try:
            if not (self._done or self._exc is not None):
                try:
                    self.wait()  # the native handles are done: this only runs the finishing steps
                except Exception:  # noqa: BLE001 - recorded in self._exc
                    pass
        finally:
            self._lock.release()
        return True

    def is_success(self) -> bool:
        """True when the collective has completed without error (False while it is still running)."""
        return self.is_completed() and self._exc is None

    def exception(self) -> Optional[BaseException]:
        """The error the collective failed with (None while running or after success)."""
        self.is_completed()
        return self._exc

    def result(self):
        self.wait()
        return self._result

    def synchronize(self) -> None:
        self.wait()

    def _source_rank(self) -> int:
        """The group rank a receive from any source (``dist.recv`` without ``src``) got its data from."""
        self.wait()
        return self._pending.source_rank()

    def source_rank(self) -> int:
        return self._source_rank()

    def get_future(self) -> torch.futures.Future:
        """A future completed with the outputs once the collective and its finishing steps are done, or with the
        collective's error; never blocks where the transport is asynchronous (DDP comm hooks chain on it)."""
        with self._lock:
            if self._fut is not None:
                return self._fut
            if self._done or self._exc is not None:
                fut: torch.futures.Future = torch.futures.Future()
                if self._exc is not None:
                    fut.set_exception(self._exc)
                else:
                    fut.set_result(self._result)
                self._fut = fut
                return fut
            result = self._result
            out: torch.futures.Future = torch.futures.Future()

            def finish(f):  # on the backend's thread; the error keeps its type (a raise in then() would not)
                try:
                    f.value()  # re-raises the backend's error
                except Exception as e:  # noqa: BLE001
                    out.set_exception(self._failure(e))
                    return
                self._done = True
                if self._call is not None:
                    self._call.completed()
                out.set_result(result)

            backend_fut = self._pending.future()
            backend_fut.add_done_callback(finish)
            track_callbacks(backend_fut)
            self._fut = out
            return self._fut


def _plain_wait(h, timeout=None) -> None:
    h.wait() if timeout is None else h.wait(timeout)


_NATIVE_LOCK = threading.Lock()  # NativeWork's short critical sections (who waits on the backend's Work)


class NativeWork(FuncollWork):
    """The Work of a collective the eager fast path issued as one native call of the transport's backend: the
    backend's own Work, with :class:`FuncollWork`'s contract kept (errors and timeouts naming the collective, its group,
    ranks and sequence number; ``exception()``, ``is_success()``, futures; the flight-recorder state). Nothing runs
    after the backend's Work: there are no finishing steps. Blocking calls do not get one: the entry waits on the
    backend's Work itself and returns it (:mod:`funcoll.entry.pipeline`).

    Exactly one thread ever waits on the backend's Work (gloo's send/recv Works must not be waited on twice at once):
    the caller of ``wait()``, directly, when nobody else does; anyone else waits for that wait to return. What the
    backend's Work lacks is supplied only when asked for: a Work without a future and without a completion flag of its
    own (gloo's send, recv and reduce_scatter) gets a background waiter (:func:`funcoll.transport.c10d.in_background`)
    at the first ``get_future()``, or at the first ``is_completed()`` poll that finds it still running; a Work that
    is only waited on pays no thread."""

    _done = False
    _exc: Optional[CollectiveError] = None
    _fut: Optional[torch.futures.Future] = None  # funcoll's future, for a backend Work without one
    _bfut: Optional[torch.futures.Future] = None  # the backend Work's own future, handed out as this Work's
    _c: Optional[flight_recorder.Call] = None
    _role = False  # a thread waits on the backend's Work (the caller in wait(), or a background waiter)
    _ev: Optional[threading.Event] = None  # set when that wait has returned: made by whoever waits for it
    _nofut: Optional[bool] = None  # the backend's Work has no future (asked once, when it matters)
    _wait_h = staticmethod(_plain_wait)  # how a caller's thread waits on the backend's Work (``quiet``: wait_quietly)

    def __init__(self, handle, rec: NativeEntry, state, args=(), outputs=None, quiet: bool = True):  # noqa: D107
        Work.__init__(self)  # (FuncollWork's __init__ is not run)
        if quiet:  # the backend's Work writes the outputs in wait(): waited on with autograd off (wait_quietly)
            self._wait_h = wait_quietly
        self._h = handle
        self._rec = rec  # the call's flight-recorder record (GroupTrace.native_record): a Call only when it fails
        self._st = state  # the group's funcoll.entry.group_state.GroupState
        self._args = args  # the call's arguments, and how to read its outputs from them (a Work without result())
        self._outputs = outputs

    @property
    def _call(self) -> flight_recorder.Call:  # type: ignore[override]
        """The call's :class:`Call`, made from its record (in its place in the flight recorder) when first needed: to
        name the collective in an error."""
        if self._c is None:
            self._c = self._st.trace.promote(self._rec)
        return self._c

    def _completed(self) -> None:
        if self._c is None:
            self._rec.t_done = _now()
        else:
            self._c.completed()

    @property
    def _trace(self):  # type: ignore[override]
        return self._st.trace

    @property
    def _result(self):  # type: ignore[override]
        self.wait()
        if self._outputs is not None:
            return self._outputs(self._args)
        h = self._h
        if not h.is_completed():  # c10d's result() needs a wait() first, also once the future has completed
            wait_quietly(h)  # a Work with a future: waiting on it again is harmless
        return h.result()

    @property
    def _pending(self):  # type: ignore[override]  # for code that waits on a FuncollWork's pending part
        return algorithms.Pending([self])  # type: ignore[list-item]  # a Work is waited on as a Handle

    def _failure(self, e: BaseException) -> CollectiveError:
        call = self._call
        if call is not None and call.timeout is None:
            call.timeout = self._st.timeout_s
        return super()._failure(e)

    # -- who waits on the backend's Work --------------------------------------------------------------
    def _claim(self) -> Optional[bool]:
        """True: this thread is now the one to wait on the backend's Work; False: another thread does (``_ev`` is set
        when its wait returns); None: the collective has already finished."""
        with _NATIVE_LOCK:
            if self._done or self._exc is not None:
                return None
            if not self._role:
                self._role = True
                return True
            if self._ev is None:
                self._ev = threading.Event()
            return False

    def _finish(self, e: Optional[BaseException]) -> None:
        """The wait on the backend's Work returned (``e``: its error): records the outcome, wakes whoever waits for it
        and completes the future, if one was asked for."""
        if e is None:
            self._done = True
            self._completed()
        else:
            self._failure(e)
        with _NATIVE_LOCK:
            ev, fut = self._ev, self._fut
        if ev is not None:
            ev.set()
        if fut is not None:
            self._settle(fut)

    def _settle(self, fut: torch.futures.Future) -> None:
        if fut.done():
            return
        if self._exc is not None:
            value = None
        else:
            try:
                value = self._result
            except RuntimeError:  # a backend Work without result() (and no outputs known): nothing to hand over
                value = []
        try:
            if self._exc is not None:
                fut.set_exception(self._exc)
            else:
                fut.set_result(value)
        except RuntimeError:  # settled meanwhile by another thread: get_future() and the waiting thread both may
            pass

    def _release(self) -> None:
        """A ``wait(timeout)`` ran out: the collective stays pending. If someone waits for it (a future, another
        thread's wait), a background waiter takes over the wait."""
        with _NATIVE_LOCK:
            hand_over = self._ev is not None or self._fut is not None
            if not hand_over:
                self._role = False
        if hand_over:
            in_background(self._wait_backend)

    def _wait_backend(self) -> None:  # a background waiter's job (autograd is off on its thread)
        try:
            self._h.wait()
        except BaseException as e:  # noqa: BLE001 - recorded; wait(), exception() and the future report it
            self._finish(e)
            return
        self._finish(None)

    def _no_future(self) -> bool:
        return self._nofut if self._nofut is not None else self._backend_future() is None

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
        with _NATIVE_LOCK:  # _claim, inlined (the path of every send and recv c10d waits on)
            if self._done or self._exc is not None:
                mine = None
            elif not self._role:
                self._role = mine = True
            else:
                mine = False
                if self._ev is None:
                    self._ev = threading.Event()
        if mine:
            try:
                self._wait_h(self._h, limit)
            except Exception as e:  # noqa: BLE001 - re-raised with the collective named
                if limit is not None and is_wait_timeout(e):
                    self._release()
                    raise self._wait_timeout(e, limit) from e
                self._finish(e)
                raise self._failure(e) from e
            self._done = True
            if self._c is None:  # _finish(None), inlined
                self._rec.t_done = _now()
            else:
                self._c.completed()
            if self._ev is not None or self._fut is not None:
                with _NATIVE_LOCK:
                    ev, fut = self._ev, self._fut
                if ev is not None:
                    ev.set()
                if fut is not None:
                    self._settle(fut)
            return True
        if mine is False:  # another thread waits on the backend's Work: wait for its wait
            ev = self._ev
            assert ev is not None
            if not ev.wait(None if limit is None else limit.total_seconds()):
                err = TimeoutError("Operation timed out!")
                raise self._wait_timeout(err, limit or timedelta(0)) from err
        if self._exc is not None:
            raise self._exc
        return True

    def is_completed(self) -> bool:
        if self._done or self._exc is not None:
            return True
        bf = self._bfut  # gloo completes a Work's future just before the Work itself
        if self._h.is_completed() or (bf is not None and bf.done()):  # the data is in place: finish (a short wait)
            if self._claim():
                try:
                    self._wait_h(self._h)
                except Exception as e:  # noqa: BLE001 - recorded in self._exc
                    self._finish(e)
                    return True
                self._finish(None)
            return self._done or self._exc is not None
        if self._no_future() and self._claim():  # a Work that never says completed until waited on
            in_background(self._wait_backend)
        return False

    def get_future(self) -> torch.futures.Future:
        """The backend Work's own future where it has one (gloo's all_reduce, broadcast, all_gather, all_to_all, gather,
        scatter, barrier: what DDP's Reducer asks each bucket's Work for), as a c10d Work's: no Python callback runs
        on the backend's thread, and it completes, or fails with the backend's own error, when the backend's Work
        does (``wait()`` names the collective; the full path's futures do too). The call's flight-recorder record
        learns the outcome from that future at the group's next call or when the recorder is read. A Work
        without a future (gloo's send, recv, reduce_scatter) gets one of funcoll's, completed by a background
        waiter."""
        bf = self._bfut
        if bf is not None:
            return bf
        if self._exc is None:
            bf = self._backend_future()  # one call: DDP asks every bucket's Work for its future
            if bf is not None:
                self._bfut = bf
                if not self._done:
                    self._st.trace.watch(self._rec, bf)
                return bf
        with _NATIVE_LOCK:
            if self._fut is not None:
                return self._fut
            out: torch.futures.Future = torch.futures.Future()
            self._fut = out
            finished = self._done or self._exc is not None
        if finished:
            self._settle(out)
        elif self._claim():  # whoever waits on the backend's Work completes the future (_finish)
            in_background(self._wait_backend)
        return out

    def _source_rank(self) -> int:
        self.wait()
        return self._h._source_rank()


def failure(call: Optional[flight_recorder.Call], trace: Optional[flight_recorder.GroupTrace],
            e: BaseException) -> CollectiveError:
    """The error to raise for a collective that failed with the backend's error ``e`` (naming the op, the group, its
    ranks and the sequence number; a timeout quotes and dumps the flight recorder); records the failure in ``call``.
    What :meth:`FuncollWork.wait` raises, and the eager fast path for a blocking call it waited on itself."""
    if isinstance(e, CollectiveError):
        err = e
    else:
        timeout = is_backend_timeout(e)
        cls = CollectiveTimeoutError if timeout else CollectiveError
        what = "timed out" if timeout else "failed"
        group_t = getattr(call, "timeout", None) if call is not None else None
        tt = f" (group timeout {group_t:g} s)" if timeout and group_t else ""
        label = call.label() if call is not None else "collective"
        err = cls(f"funcoll: {label} {what}{tt}: {backend_message(e)}" + recent(call, trace, dump=timeout))
        err.__cause__ = e
    if call is not None:
        call.failed(e)
    return err
