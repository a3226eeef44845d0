"""Pending results and strategy recording: what every algorithm returns (:class:`Pending`), how it is marked as the
implementation of one op (:func:`_entry`), and how the strategies it takes are reported (:func:`record`, the
profiler ranges and debug log of :mod:`funcoll.algorithms.observe`)."""

from __future__ import annotations

import contextlib
import functools
import threading
import time
from datetime import timedelta
from typing import Callable, List, Optional, Sequence

import torch
import torch.autograd.profiler as _profiler

from funcoll.algorithms.observe import LOG as _LOG
from funcoll.algorithms.observe import Scope
from funcoll.transport import Handle, wait_quietly


def _left(end: float, secs: float) -> timedelta:
    """What is left of a wait of ``secs`` seconds ending at ``end`` (past it: a TimeoutError)."""
    if time.monotonic() >= end:
        raise TimeoutError(f"funcoll: collective not complete after {secs:g}s")
    return timedelta(seconds=end - time.monotonic())


class Pending(Handle):
    """Native handles to wait on, then local finishing steps to run once, in order."""

    __slots__ = ("_handles", "_then", "_future", "_source")
    _future: Optional[torch.futures.Future]

    def __init__(self, handles: Sequence[Handle] = (), then: Optional[Callable[[], object]] = None):
        self._handles = [h for h in handles if h is not None]
        self._then = [then] if then is not None else []
        self._future = None
        self._source: Optional[int] = None  # the peer of a recv

    def and_then(self, fn: Callable[[], object]) -> "Pending":
        self._then.append(fn)
        return self

    def _run_thens(self) -> None:
        thens, self._then = self._then, []
        with torch.no_grad():  # finishing steps write into the caller's tensors, like the collective itself
            for fn in thens:
                fn()

    def wait(self, timeout: Optional[timedelta] = None) -> None:
        """Waits on the native handles (in all, at most ``timeout`` when given: a c10d Work raises past it), then
        runs the finishing steps."""
        secs = 0.0 if timeout is None else timeout.total_seconds()
        end = None if timeout is None else time.monotonic() + secs
        if self._future is not None:  # handed over to future(): its callback runs the finishing steps
            while end is not None and not self._future.done():
                _left(end, secs)
                time.sleep(0.001)
            self._future.wait()
            return
        while self._handles:
            wait_quietly(self._handles[0], None if end is None else _left(end, secs))
            self._handles.pop(0)
        self._run_thens()

    def future(self) -> torch.futures.Future:
        """A future completed (with None) once the native handles have completed and the finishing steps have run,
        without blocking: the steps run in the callback of the backend's own futures. Handles without a future
        (lazy or already complete) count as complete."""
        if self._future is None:
            futs = []
            for h in self._handles:
                if isinstance(h, Pending):
                    futs.append(h.future())
                elif hasattr(h, "get_future"):  # a backend Work (every one a transport returns has a future)
                    futs.append(h.get_future())
            self._handles = []
            if not futs:
                self._run_thens()
                self._future = torch.futures.Future()
                self._future.set_result(None)
            else:
                def finish(all_done):
                    for f in all_done.value():
                        f.value()  # re-raises a backend error
                    self._run_thens()

                self._future = torch.futures.collect_all(futs).then(finish)
        return self._future

    def is_completed(self) -> bool:
        if self._future is not None:
            return self._future.done()
        return not self._then and all(h.is_completed() for h in self._handles)

    def native_done(self) -> bool:
        """Whether every native handle has completed (successfully or not), without blocking and without running the
        finishing steps."""
        if self._future is not None:
            return self._future.done()
        return all(h.native_done() if isinstance(h, Pending) else h.is_completed() for h in self._handles)

    def source_rank(self) -> int:
        """The group rank a receive got its data from (c10d's ``Work._source_rank()``)."""
        if self._source is None:
            raise RuntimeError("funcoll: source_rank() is only defined for the Work of a recv")
        return self._source


_recorders: List[list] = []  # the log of every open record() block


class _Current(threading.local):
    """The collective running on this thread: the strategy notes of its algorithm (None outside one), and ``log``,
    where the entry pipeline collects ``(op, [strategies])`` of the one call it runs (None outside one)."""

    notes: Optional[list] = None
    log: Optional[list] = None


this_call = _Current()


@contextlib.contextmanager
def record():
    """Collects, for every collective started inside the block (by any thread), ``(op, [strategies])``.

    >>> with funcoll.algorithms.record() as calls: dist.all_reduce(t, op=dist.ReduceOp.AVG)
    >>> calls   # [("all_reduce", ["avg=sum+scale"])] under FUNCOLL_PROFILE=xccl
    """
    mine: list = []
    _recorders.append(mine)
    try:
        yield mine
    finally:  # removed by identity: another block's log may hold equal contents
        del _recorders[next(i for i, other in enumerate(_recorders) if other is mine)]


def _note(strategy: str) -> None:
    notes = this_call.notes
    if notes is not None:
        notes.append(strategy)


def _entry(fn):
    """Marks a public algorithm, named after the op it implements (the name ``record()`` reports): runs it without
    autograd and records its strategies; while a profiler records or the funcoll log is at DEBUG,
    :mod:`funcoll.algorithms.observe` opens its ranges and logs its strategy decision."""
    op = fn.__name__

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        observed = bool(_profiler._is_profiler_enabled) or _LOG.isEnabledFor(10)
        listened = _recorders or observed or this_call.log is not None
        if this_call.notes is not None or not listened:  # nested, or nobody listens
            with torch.no_grad():
                return fn(*args, **kwargs)
        scope = Scope(op, fn, args, kwargs) if observed else None
        this_call.notes = notes = scope if scope is not None else []
        try:
            with torch.no_grad():
                return fn(*(scope.args if scope is not None else args), **kwargs)
        finally:
            this_call.notes = None
            if scope is not None:
                scope.close(args)
            strategies = list(dict.fromkeys(notes)) or ["native"]  # each strategy once, in order
            for log in _recorders:
                log.append((op, strategies))
            if this_call.log is not None:
                this_call.log.append((op, strategies))

    return wrapper


def watched() -> bool:
    """Someone observes collectives: ``record()``, a strategy being noted on this thread, a profiler, the funcoll debug
    log. The fast path is off while they do: the full path reports to them."""
    return (bool(_recorders) or this_call.notes is not None or bool(_profiler._is_profiler_enabled)
            or _LOG.isEnabledFor(10))
