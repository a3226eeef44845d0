"""The Works every eager funcoll collective returns: :class:`FuncollWork` (the full path) and :class:`NativeWork` (the
fast path), over one base that keeps c10d's contract (docs/work.md) and names the collective in every error.
"""

from __future__ import annotations

import threading
import time
from datetime import timedelta
from typing import Any, Optional, Sequence, Tuple

import torch
from torch._C._distributed_c10d import Work

from funcoll import algorithms
from funcoll.entry import flight_recorder, peers
from funcoll.entry.errors import (
    CollectiveAbortedError,
    CollectiveError,
    CollectiveTimeoutError,
    backend_message,
    is_backend_timeout,
)
from funcoll.entry.flight_recorder import NativeEntry, recent
from funcoll.transport import wait_quietly
from funcoll.transport.c10d import BackendWait, is_wait_timeout, track_callbacks

_now = time.time
ERROR = torch._C._distributed_c10d.ErrorType  # c10d's Backend.get_error() values

__all__ = ["FuncollWork", "NativeWork", "failure", "ERROR"]


class _Work(Work):
    """c10d's contract, read from ``_exc`` (the collective's error) and ``is_completed()``."""

    _done = False
    _exc: Optional[BaseException] = None
    _state: Any = None  # the group's funcoll.entry.group_state.GroupState (None: a Work made outside a group)

    def _where(self) -> Tuple[Optional[flight_recorder.Call], Optional[flight_recorder.GroupTrace]]:
        """The call's flight-recorder entry and its group's recorder (None: a Work made outside a group)."""
        raise NotImplementedError

    def _failure(self, e: BaseException) -> BaseException:
        """Records ``e`` as this collective's permanent failure; returns the error to raise."""
        if self._exc is None:
            self._exc = failure(*self._where(), e, self._state)
        return self._exc

    def _wait_timeout(self, e: BaseException, limit: timedelta) -> BaseException:
        call, trace = self._where()  # the caller raises the error from e
        return CollectiveTimeoutError(
            f"funcoll: {call.label() if call is not None else 'collective'} did not complete within the "
            f"{limit.total_seconds():g} s given to Work.wait(); it is still pending (wait again, or check that every "
            "rank of the group issued it)." + recent(call, trace, dump=True))

    def is_success(self) -> bool:
        return self.is_completed() and self._exc is None

    def exception(self) -> Optional[BaseException]:
        self.is_completed()
        return self._exc

    def synchronize(self) -> None:
        self.wait()

    def source_rank(self) -> int:
        return self._source_rank()


class FuncollWork(_Work):
    """Waits on the transport's native handles, then runs the algorithm's finishing steps (complete at once on XLA)."""

    def __init__(self, pending: algorithms.Pending, result: Sequence[torch.Tensor] = ()):
        super().__init__()
        self._pending = pending
        self._result = list(result)
        self._call: Optional[flight_recorder.Call] = None  # set by the pipeline (_attach), with _state
        self._fut: Optional[torch.futures.Future] = None
        self._lock = threading.RLock()

    def _attach(self, call: flight_recorder.Call, state) -> None:
        self._call, self._state = call, state
        if self._done:
            call.completed()

    def _where(self):
        return self._call, None if self._state is None else self._state.trace

    def wait(self, timeout: timedelta = timedelta(0)) -> bool:
        """A non-zero ``timeout`` bounds the wait (past it: CollectiveTimeoutError, still pending); 0: the group's."""
        limit = timeout if timeout and timeout > timedelta(0) else None
        with self._lock:
            if self._exc is not None:
                raise self._exc
            if self._done:
                return True
            try:
                self._pending.wait(limit)
            except Exception as e:  # noqa: BLE001 - re-raised with the collective named
                raise (self._wait_timeout(e, limit) if limit is not None and is_wait_timeout(e)
                       else self._failure(e)) from e
            self._done = True
            if self._call is not None:
                self._call.completed()
        return True

    def is_completed(self) -> bool:
        if self._done or self._exc is not None:
            return True
        if not self._pending.native_done() or not self._lock.acquire(blocking=False):  # running, or being finished
            return False
        try:
            self.wait()  # the native handles are done: this only runs the finishing steps
        except Exception:  # noqa: BLE001 - recorded in self._exc
            pass
        finally:
            self._lock.release()
        return True

    def result(self):
        self.wait()
        return self._result

    def _source_rank(self) -> int:
        self.wait()
        return self._pending.source_rank()

    def get_future(self) -> torch.futures.Future:
        """Completed with the outputs after the finishing steps, or with the error; never blocks (DDP hooks)."""
        with self._lock:
            if self._fut is None:
                out: torch.futures.Future = torch.futures.Future()
                if self._exc is not None:
                    out.set_exception(self._exc)
                elif self._done:
                    out.set_result(self._result)
                else:
                    backend_fut = self._pending.future()
                    backend_fut.add_done_callback(lambda f: self._settle(f, out))
                    track_callbacks(backend_fut)
                self._fut = out
            return self._fut

    def _settle(self, f: torch.futures.Future, out: torch.futures.Future) -> None:
        """Completes ``out`` as the backend's future ``f`` has (a raise in then() would not keep the error's type)."""
        try:
            f.value()  # re-raises the backend's error
        except Exception as e:  # noqa: BLE001
            out.set_exception(self._failure(e))
            return
        self._done = True
        if self._call is not None:
            self._call.completed()
        out.set_result(self._result)


class NativeWork(_Work, BackendWait):
    """The backend's own Work of an async call the eager fast path issued, waited on as :class:`BackendWait` describes,
    with the contract above (docs/work.md, "The fast path's Works")."""

    _c: Optional[flight_recorder.Call] = None

    def __init__(self, handle, rec: NativeEntry, state, args=(), outputs=None, quiet: bool = True):  # noqa: D107
        Work.__init__(self)
        self._quiet = quiet
        self._h = handle
        self._rec = rec  # the call's flight-recorder record (GroupTrace.native_record): a Call only when it fails
        self._state = state
        self._args = args  # the call's arguments, and how to read its outputs from them (a Work without result())
        self._outputs = outputs

    def _where(self):
        """The call's :class:`Call`, made from its record when an error first needs to name it."""
        if self._c is None:
            self._c = self._state.trace.promote(self._rec)
            self._c.timeout = self._state.timeout_s
        return self._c, self._state.trace

    def _completed(self) -> None:
        if self._c is None:
            self._rec.t_done = _now()
        else:
            self._c.completed()

    def _value(self):
        if self._outputs is not None:
            return self._outputs(self._args)
        h = self._h
        if not h.is_completed():  # c10d's result() needs a wait() first, also once the future has completed
            wait_quietly(h)  # a Work with a future: waiting on it again is harmless
        return h.result()

    def _watch(self, fut: torch.futures.Future) -> None:
        """The record learns the outcome from the future handed out (:meth:`GroupTrace.watch`)."""
        if not self._done:
            self._state.trace.watch(self._rec, fut)


def failure(call: Optional[flight_recorder.Call], trace: Optional[flight_recorder.GroupTrace],
            e: BaseException, state=None) -> CollectiveError:
    """The error for a collective that failed with the backend's error ``e``, naming it and, for a group of several
    processes, the peers whose process has exited (:func:`funcoll.entry.peers.lost`; a timeout quotes and dumps the
    flight recorder); records the failure in ``call``."""
    label = call.label() if call is not None else "collective"
    if isinstance(e, CollectiveError):
        err = e
    elif state is not None and state.aborted is not None:  # the backend's error is the abort's
        err = CollectiveAbortedError(f"funcoll: {label} was aborted: {state.aborted} ({backend_message(e)})")
        err.__cause__ = e
    else:
        timeout = is_backend_timeout(e)
        cls = CollectiveTimeoutError if timeout else CollectiveError
        what = "timed out" if timeout else "failed"
        group_t = getattr(call, "timeout", None)
        tt = f" (group timeout {group_t:g} s)" if timeout and group_t else ""
        gone, exited = peers.lost(state, e) if state is not None else ("", [])
        err = cls(f"funcoll: {label} {what}{tt}: {backend_message(e)}{gone}" + recent(call, trace, dump=timeout))
        err.__cause__ = e
        if state is not None:  # Backend.get_error
            state.error = ERROR.REMOTE_ERROR if exited else ERROR.TIMEOUT if timeout else ERROR.COMM_ERROR
    if call is not None:
        call.failed(e)
    return err
