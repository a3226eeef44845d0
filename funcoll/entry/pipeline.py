"""Every eager collective's pipeline, as a decorator (:func:`collective`) on each collective method of
:class:`~funcoll.entry.process_group.ProcessGroupFuncoll`: its steps are numbered as docs/design.md ("The eager
pipeline") lists them.
"""

from __future__ import annotations

import functools
import threading
from typing import Callable, Optional

from funcoll import algorithms
from funcoll.entry.checks import size_guard, store_check
from funcoll.entry.errors import CollectiveError
from funcoll.entry.fast_path import FULL, Full, issuing_error
from funcoll.entry.fingerprint import check_nan, fingerprint, flat
from funcoll.entry.flight_recorder import INVALID
from funcoll.entry.methods import METHODS
from funcoll.entry.work import FuncollWork
from funcoll.semantics import check_layout
from funcoll.transport import before_send

__all__ = ["collective"]

_watched = algorithms.watched
_this_call = algorithms.this_call  # this thread's collective: the strategies its algorithms take are logged there
_VALIDATION = (ValueError, TypeError, NotImplementedError)  # funcoll's own refusals of a request


class _Depth(threading.local):
    depth = 0  # > 0 inside a collective method: a method delegating to another is recorded once, as the outer one


_tls = _Depth()


def collective(fn: Callable, method: Optional[str] = None) -> Callable:
    """``fn`` (the body of a c10d method) run in its pipeline: its row of :data:`funcoll.entry.methods.METHODS` is the
    one of ``method``, by default the function's own name."""
    row = METHODS[method or fn.__name__]
    fast, p2p = row.fast, row.p2p

    @functools.wraps(fn)
    def run(self, *args, **kwargs):
        st = self._state
        # 1. the native fast path, when nobody observes: issued, and returned (else its description of the call)
        full = FULL
        if (fast is not None and not st.debug and not st.nan_check and self._coalesced is None and not _tls.depth
                and not _watched() and type(full := fast(self, st, row, args, kwargs)) is not Full):
            return full
        if _tls.depth:  # a method delegating to another: the outer call is the one recorded
            return fn(self, *args, **kwargs)
        call = _recorded(self, st, row, args, kwargs, full.description)  # 2. describe, record; 3. layout, NaN
        numbered = []

        def start():  # 4. number and check, right before the first primitive sends: everything is validated
            st.trace.number(call, p2p)
            numbered.append(True)
            if not p2p:
                if st.debug:
                    store_check(st, call)
                elif st.guard and not (args and getattr(args[-1], "asyncOp", False) is True):
                    size_guard(st, call)  # blocking CPU collectives, 2+ ranks: sizes agree, or a clear error

        _tls.depth = 1  # 5. the body
        before_send(start)
        log = _this_call.log = [] if st.trace.enabled else None  # its strategies, for its flight-recorder entry
        try:
            try:
                work = fn(self, *args, **kwargs)
            finally:
                _this_call.log = None
            if not numbered:  # nothing to send on this rank (empty tensors, a lazy transport): counted all the same
                start()
        except Exception as e:
            err = _failed(st, call, e, bool(numbered))
            if err is e:
                raise
            raise err from e
        finally:
            before_send(None)
            _tls.depth = 0
        return _handed(st, call, work, log)  # 6. the Work

    return run


def _recorded(pg, st, row, args, kwargs, description):
    """Steps 2 and 3: the call's flight-recorder Call, kept unnumbered when its layout or a NaN refuses it.
    ``description``: the fast path's (it read every tensor dense and strided), else None."""
    call = st.trace.call(row.op, row.method, description or fingerprint(pg, row, args, kwargs))
    try:
        if description is None:
            check_layout(row.op, flat(list(args) + list(kwargs.values())))
    except TypeError as e:  # a sparse tensor (semantics.check_layout)
        refused: Exception = e
    else:
        if not (st.nan_check and check_nan(row, args)):
            call.timeout = st.timeout_s
            return call
        refused = RuntimeError(f"NaN found in input tensor. (funcoll: {row.op} on group {st.trace.group!r}, "
                               f"rank {st.rank} of {st.size}; TORCH_DIST_NAN_CHECK=1; nothing was sent)")
    call.failed(refused, INVALID)
    st.trace.keep(call)
    raise refused


def _failed(st, call, e: Exception, numbered: bool) -> Exception:
    """The error to raise for the body's ``e``: a backend's error while issuing is named, funcoll's own unchanged."""
    if isinstance(e, _VALIDATION) and not numbered:  # nothing was sent, no sequence number was used
        call.failed(e, INVALID)
        st.trace.keep(call)
        return e
    if isinstance(e, _VALIDATION + (CollectiveError,)):
        call.failed(e)
        return e
    err = issuing_error(call, e, st)
    if not numbered:
        st.trace.keep(call)
    return err


def _handed(st, call, work, log):
    """Step 6: the Call, with its body's strategies, handed to the method's Work (or completed)."""
    if log:
        call.strategies = list(dict.fromkeys([s for _, notes in log for s in notes]))
    if isinstance(work, FuncollWork):
        work._attach(call, st)
    else:
        call.completed()
    return work
