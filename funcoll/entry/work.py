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
from funcoll.transport.gloo import track_callbacks, waited

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


class NativeWork(FuncollWork):
    """The Work of a collective the eager fast path issued as one native call of the transport's backend: the
    backend's own Work, with :class:`FuncollWork`'s contract kept (errors and timeouts naming the collective, its group,
    ranks and sequence number; ``exception()``, ``is_success()``, futures; the flight-recorder state). Nothing runs
    after the backend's Work: there are no finishing steps. Blocking calls do not get one: the entry waits on the
    backend's Work itself and returns it (:mod:`funcoll.entry.pipeline`)."""

    _done = False
    _exc: Optional[CollectiveError] = None
    _fut: Optional[torch.futures.Future] = None
    _c: Optional[flight_recorder.Call] = None
    _future_lock = threading.Lock()

    def __init__(self, handle, rec: NativeEntry, state):  # noqa: D107 - FuncollWork's __init__ is not run
        Work.__init__(self)
        self._h = waited(handle)  # a backend Work without a future (gloo's reduce_scatter) gets one
        self._rec = rec  # the call's flight-recorder record (GroupTrace.native_record): a Call only when it fails
        self._st = state  # the group's funcoll.entry.group_state.GroupState

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
        h = self._h
        if not h.is_completed():  # c10d's result() needs a wait() first, also once the future has completed
            wait_quietly(h)
        return h.result()

    @property
    def _pending(self):  # type: ignore[override]  # the handle, for code that waits on a FuncollWork's pending part
        return algorithms.Pending([self._h])

    def _failure(self, e: BaseException) -> CollectiveError:
        call = self._call
        if call is not None and call.timeout is None:
            call.timeout = self._st.timeout_s
        return super()._failure(e)

    def wait(self, timeout: timedelta = timedelta(0)) -> bool:
        if self._exc is not None:
            raise self._exc
        if self._done:
            return True
        limit = timeout if timeout and timeout > timedelta(0) else None
        try:
            wait_quietly(self._h, limit)
        except Exception as e:  # noqa: BLE001 - re-raised with the collective named
            raise _named(self, e, limit) from e
        self._done = True
        self._completed()
        return True

    def is_completed(self) -> bool:
        if self._done or self._exc is not None:
            return True
        if not self._h.is_completed():
            return False
        try:
            self.wait()  # completed: returns at once, or records the error
        except Exception:  # noqa: BLE001 - recorded in self._exc
            pass
        return True

    def get_future(self) -> torch.futures.Future:
        with self._future_lock:
            if self._fut is not None:
                return self._fut
            out: torch.futures.Future = torch.futures.Future()
            self._fut = out
        if self._done or self._exc is not None:
            if self._exc is not None:
                out.set_exception(self._exc)
            else:
                out.set_result(self._result)
            return out

        def finish(f):  # on the backend's thread; the error keeps its type
            try:
                value = f.value()  # re-raises the backend's error
            except Exception as e:  # noqa: BLE001
                out.set_exception(self._failure(e))
                return
            self._done = True
            self._completed()
            out.set_result(value)

        backend_fut = self._h.get_future()
        backend_fut.add_done_callback(finish)
        track_callbacks(backend_fut)
        return out


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
