"""The Works every eager funcoll collective returns: :class:`FuncollWork` (the full path: native handles, then the
algorithm's finishing steps) and :class:`NativeWork` (the fast path: one backend Work), over one base that keeps c10d's
contract (docs/work.md) and names the collective in every error (:mod:`funcoll.entry.errors`): the op, the group, its
ranks and the sequence number, the backend's own error as ``__cause__``; a timeout quotes the group's last entries of
the flight recorder and dumps it.
"""

from __future__ import annotations

import threading
import time
from datetime import timedelta
from typing import Optional, Sequence, Tuple

import torch
from torch._C._distributed_c10d import Work

from funcoll import algorithms
from funcoll.entry import flight_recorder
from funcoll.entry.errors import CollectiveError, CollectiveTimeoutError, backend_message, is_backend_timeout
from funcoll.entry.flight_recorder import NativeEntry, recent
from funcoll.transport import wait_quietly
from funcoll.transport.c10d import BackendWait, is_wait_timeout, track_callbacks

_now = time.time

__all__ = ["FuncollWork", "NativeWork", "failure"]


class _Work(Work):
    """What both of funcoll's Works share: c10d's contract read from ``_exc`` (the collective's error, once it failed)
    and ``is_completed()``, and the errors that name the collective (:meth:`_where` it is recorded)."""

    _done = False
    _exc: Optional[BaseException] = None

    def _where(self) -> Tuple[Optional[flight_recorder.Call], Optional[flight_recorder.GroupTrace]]:
        """The call's flight-recorder entry and its group's recorder (None: a Work made outside a group)."""
        raise NotImplementedError

    def _failure(self, e: BaseException) -> BaseException:
        """Records ``e`` as this collective's permanent failure; returns the error to raise."""
        if self._exc is None:
            self._exc = failure(*self._where(), e)
        return self._exc

    def _wait_timeout(self, e: BaseException, limit: timedelta) -> BaseException:
        call, trace = self._where()
        err = CollectiveTimeoutError(
            f"funcoll: {call.label() if call is not None else 'collective'} did not complete within the "
            f"{limit.total_seconds():g} s given to Work.wait(); it is still pending (wait again, or check that every "
            "rank of the group issued it)." + recent(call, trace, dump=True))
        err.__cause__ = e
        return err

    def is_success(self) -> bool:
        """True when the collective has completed without error (False while it is still running)."""
        return self.is_completed() and self._exc is None

    def exception(self) -> Optional[BaseException]:
        """The error the collective failed with (None while running or after success)."""
        self.is_completed()
        return self._exc

    def synchronize(self) -> None:
        self.wait()

    def source_rank(self) -> int:
        return self._source_rank()


class FuncollWork(_Work):
    """A Work whose ``wait()`` waits on the transport's native handles, then runs the algorithm's finishing
    steps. Asynchronous where the transport is (gloo, XCCL); complete at once on XLA."""

    def __init__(self, pending: algorithms.Pending, result: Sequence[torch.Tensor] = (),
                 call: Optional[flight_recorder.Call] = None, trace: Optional[flight_recorder.GroupTrace] = None):
        super().__init__()
        self._pending = pending
        self._result = list(result)
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

    def _where(self):
        return self._call, self._trace

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
                raise (self._wait_timeout(e, limit) if limit is not None and is_wait_timeout(e)
                       else self._failure(e)) from e
            self._done = True
            if self._call is not None:
                self._call.completed()
        return True

    def is_completed(self) -> bool:
        """True once the collective has finished, successfully or not (never blocks)."""
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
        """The group rank a receive from any source (``dist.recv`` without ``src``) got its data from."""
        self.wait()
        return self._pending.source_rank()

    def get_future(self) -> torch.futures.Future:
        """A future completed with the outputs once the collective and its finishing steps are done, or with the
        collective's error; never blocks where the transport is asynchronous (DDP comm hooks chain on it)."""
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
        """Completes ``out`` as the backend's future ``f`` has (on the backend's thread; the error keeps its type: a
        raise in then() would not)."""
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
    """The Work of a collective the eager fast path issued as one native call of the transport's backend: the
    backend's own Work, waited on as :class:`funcoll.transport.c10d.BackendWait` describes (exactly one thread waits
    on it; a background waiter only when a future or a poll needs one), with :class:`FuncollWork`'s contract kept
    (errors and timeouts naming the collective, its group, ranks and sequence number; ``exception()``,
    ``is_success()``, futures; the flight-recorder state). Nothing runs after the backend's Work: there are no
    finishing steps. Blocking calls do not get one: the entry waits on the backend's Work itself and returns None."""

    _c: Optional[flight_recorder.Call] = None

    def __init__(self, handle, rec: NativeEntry, state, args=(), outputs=None, quiet: bool = True):  # noqa: D107
        Work.__init__(self)
        if quiet:
            self._quiet = True
        self._h = handle
        self._rec = rec  # the call's flight-recorder record (GroupTrace.native_record): a Call only when it fails
        self._st = state  # the group's funcoll.entry.group_state.GroupState
        self._args = args  # the call's arguments, and how to read its outputs from them (a Work without result())
        self._outputs = outputs

    def _where(self):
        """The call's :class:`Call` is made from its record (in its place in the flight recorder) when first needed:
        to name the collective in an error."""
        if self._c is None:
            self._c = self._st.trace.promote(self._rec)
        return self._c, self._st.trace

    def _failure(self, e: BaseException) -> BaseException:
        call = self._where()[0]
        if call is not None and call.timeout is None:
            call.timeout = self._st.timeout_s
        return super()._failure(e)

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
        """The call's flight-recorder record learns the outcome from the future handed out (``get_future()``) at the
        group's next call or when the recorder is read."""
        if not self._done:
            self._st.trace.watch(self._rec, fut)


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
