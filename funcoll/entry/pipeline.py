"""Every eager collective's pipeline, in order: the decorator :func:`collective` wraps each collective method of
:class:`~funcoll.entry.process_group.ProcessGroupFuncoll` in the class body, as c10d wraps its own collectives in
its logger decorators. Per call:

1. **the native fast path?** When nobody observes (no debug mode, no NaN check, not coalescing, not inside another
   collective method, no ``record()``, profiler or funcoll debug log) and the method's adapter finds the request
   served by the transport's backend as it is (one cached lookup per signature in :mod:`funcoll.algorithms`; a new
   signature is validated in full, an invalid one never cached), the call is counted, numbered and recorded (a
   :class:`~funcoll.entry.flight_recorder.NativeEntry`; the signature's fingerprint made once) and the backend's own
   method is called with the caller's arguments. A blocking call is waited on here (a failure raises naming the
   collective) and returns None, as a backend that has synchronized already does (c10d's blocking functions wait only
   on a Work they get); an async one gets a :class:`~funcoll.entry.work.NativeWork`. Blocking CPU calls of a group
   whose size guard is on take the full path, which runs the guard.
2. **fingerprint and record**: the call's fingerprint (:mod:`funcoll.entry.fingerprint`) and its flight-recorder
   :class:`~funcoll.entry.flight_recorder.Call`;
3. **layout and NaN**: a sparse tensor is refused for every op; with ``TORCH_DIST_NAN_CHECK=1`` a floating input
   holding a NaN is refused; nothing is sent, no sequence number used;
4. **number and check before send**: right before the first primitive sends (the transport's ``before_send`` hook,
   the one call from the transport layer up into the entry layer), the call gets the group's next sequence number
   (point-to-point ops their own counter) and the debug mode's store check or the size guard runs
   (:mod:`funcoll.entry.checks`);
5. **the body**: the method itself (:mod:`funcoll.algorithms`); an error the backend raises while issuing is
   re-raised naming the collective (:class:`~funcoll.entry.errors.CollectiveError`); funcoll's own validation errors
   (ValueError, TypeError) pass unchanged;
6. **the Work**: the Call is handed to the returned :class:`~funcoll.entry.work.FuncollWork`, which completes or
   fails it.
"""

from __future__ import annotations

import contextlib
import functools
import threading
import time
from typing import Callable, Optional

import torch

from funcoll import algorithms
from funcoll.entry.checks import size_guard, store_check
from funcoll.entry.errors import CollectiveError
from funcoll.entry.fingerprint import METHODS, check_nan, fingerprint, flat
from funcoll.entry.flight_recorder import INVALID
from funcoll.entry.work import FuncollWork, NativeWork, failure
from funcoll.semantics import check_layout
from funcoll.transport import before_send, wait_quietly

__all__ = ["collective", "FAST"]

_now = time.time
_NO_LOG = contextlib.nullcontext()
_watched = algorithms.watched


class _Depth(threading.local):
    depth = 0  # > 0 inside a collective method: a method delegating to another is recorded once, as the outer one


_tls = _Depth()


def _description(nat, pg, method: str, args) -> dict:
    """A native signature's fingerprint, made at its first call and kept in its :class:`Native` (``note``): the same
    for every call of it."""
    fp = nat.note = fingerprint(pg, method, args, {})
    return fp


def collective(method: str) -> Callable:
    """Decorates the ProcessGroupFuncoll method ``method`` (a name of :data:`funcoll.entry.fingerprint.METHODS`) with
    the pipeline. ``FAST[method]``, where there is one, is the method's native fast path: ``fast(pg, args)`` -> a
    :class:`funcoll.algorithms.Native` when the request (positional arguments, options last) is one native backend
    call, else None."""
    spec = METHODS[method]
    fast: Optional[Callable] = FAST.get(method)
    op, p2p = spec.op, spec.p2p
    opts_kw = method == "barrier"  # c10d calls group.barrier(opts=opts)
    outputs = _OUTPUTS.get(method)
    quiet = method in _WRITES_IN_WAIT  # the backend's Work writes the outputs in wait(): waited on with autograd off

    def decorate(fn: Callable) -> Callable:
        @functools.wraps(fn)
        def run(self, *args, **kwargs):
            st = self._state
            # 1. the native fast path
            fargs: Optional[tuple] = args
            if kwargs:
                fargs = args + (kwargs["opts"],) if opts_kw and not args and kwargs.keys() == {"opts"} else None
            if (fast is not None and fargs is not None and not st.debug and not st.nan_check
                    and self._coalesced is None and not _tls.depth and not _watched()):
                try:
                    nat = fast(self, fargs)
                except Exception:  # noqa: BLE001 - a request the adapter cannot read: the full path names the problem
                    nat = None
                # point-to-point calls are always asynchronous: c10d waits on the Work (dist.send, dist.recv)
                blocking = nat is not None and not p2p and not fargs[-1].asyncOp
                if nat is not None and not (blocking and nat.cpu and st.guard):
                    nat.tally.n += 1
                    rec = st.trace.native_record(op, method,
                                                 nat.note or _description(nat, self, method, fargs), p2p)
                    if not blocking:
                        try:
                            work = nat.issue(*fargs)
                        except Exception as e:  # noqa: BLE001 - the backend failed while issuing
                            call = st.trace.promote(rec)
                            call.failed(e)
                            raise CollectiveError(f"funcoll: {call.label()} failed: {str(e).strip()}") from e
                        return NativeWork(work, rec, st, fargs, outputs, quiet)
                    try:
                        work = nat.issue(*fargs)
                        if quiet:
                            wait_quietly(work)
                        else:
                            work.wait()
                    except Exception as e:  # noqa: BLE001 - re-raised naming the collective
                        call = st.trace.promote(rec)
                        call.timeout = st.timeout_s
                        raise failure(call, st.trace, e) from e
                    rec.t_done = _now()
                    # finished here: c10d's blocking dist.* functions take None as "the backend has synced" (no
                    # second wait, no Work to build; a wait on gloo's reduce_scatter Work would copy its slice again)
                    return None
            if _tls.depth:  # a method delegating to another: the outer call is the one recorded
                return fn(self, *args, **kwargs)
            # 2. fingerprint and record
            call = st.trace.call(op, method, fingerprint(self, method, args, kwargs))
            # 3. layout and NaN: refused before anything is sent, without a sequence number
            try:
                check_layout(op, flat(list(args) + list(kwargs.values())))
            except TypeError as e:  # a sparse tensor (semantics.check_layout)
                call.failed(e, INVALID)
                st.trace.keep(call)
                raise
            if st.nan_check and check_nan(method, args):
                nan = RuntimeError(f"NaN found in input tensor. (funcoll: {op} on group {st.trace.group!r}, "
                                   f"rank {st.rank} of {st.size}; TORCH_DIST_NAN_CHECK=1; nothing was sent)")
                call.failed(nan, INVALID)
                st.trace.keep(call)
                raise nan
            call.timeout = st.timeout_s
            numbered = []

            # 4. number and check, right before the first primitive sends: everything has been validated
            def start():
                st.trace.number(call, p2p)
                numbered.append(True)
                if not p2p:
                    if st.debug:
                        store_check(st, call)
                    elif st.guard and not (args and getattr(args[-1], "asyncOp", False) is True):
                        size_guard(st, call)  # blocking CPU collectives, 2+ ranks: sizes agree, or a clear error

            # 5. the body
            _tls.depth = 1
            before_send(start)
            try:
                # the strategies of this thread's call, for its flight-recorder entry
                with algorithms.record(threading.get_ident()) if st.trace.enabled else _NO_LOG as log:
                    work = fn(self, *args, **kwargs)
                if not numbered:  # nothing to send on this rank (empty tensors, a lazy transport): counted all the same
                    start()
            except (ValueError, TypeError, NotImplementedError) as e:
                if numbered:
                    call.failed(e)
                else:  # funcoll's validation: nothing was sent, no sequence number was used
                    call.failed(e, INVALID)
                    st.trace.keep(call)
                raise
            except CollectiveError as e:
                call.failed(e)
                raise
            except Exception as e:  # noqa: BLE001 - the backend failed while issuing
                call.failed(e)
                if not numbered:
                    st.trace.keep(call)
                raise CollectiveError(f"funcoll: {call.label()} failed: {str(e).strip()}") from e
            finally:
                before_send(None)
                _tls.depth = 0
            # 6. the Work
            if log:
                call.strategies = list(dict.fromkeys([s for _, notes in log for s in notes]))
            if isinstance(work, FuncollWork):
                work._attach(call, st.trace)
            else:
                call.completed()
            return work

        return run

    return decorate


# ---------------------------------------------------------------------------------------------------
# the fast path's adapters, per method: the request as c10d passes it (positional arguments, options last), checked
# for what a signature does not hold (one dense contiguous tensor of a plain class per argument, options of the
# method's own type), then one cached lookup in funcoll.algorithms (is this request one native backend call?)
# ---------------------------------------------------------------------------------------------------
_STRIDED = torch.strided
_PLAIN = (torch.Tensor, torch.nn.Parameter)
_C = torch._C._distributed_c10d


def _dense(t) -> bool:
    return t.__class__ in _PLAIN and t.layout is _STRIDED and t.is_contiguous()


def _tp_of(pg, t):
    return pg._transports.get("cpu" if t.is_cpu else t.device.type)


def _fast_allreduce(pg, args, _opts=_C.AllreduceOptions, _lookup=algorithms.native_all_reduce_request):
    if len(args) == 2:
        tensors, opts = args
        if type(opts) is _opts and type(tensors) is list and len(tensors) == 1:
            t = tensors[0]
            if t.__class__ in _PLAIN and t.layout is _STRIDED and t.is_contiguous():
                tp = pg._transports.get("cpu" if t.is_cpu else t.device.type)
                if tp is not None:
                    return _lookup(tp, opts.reduceOp, t)
    return None


def _fast_base(opts_type, lookup, reduces: bool):
    """The adapter of ``_allgather_base`` (``reduces`` False) or ``_reduce_scatter_base`` (``reduces``: the options'
    reduce op is passed on): ``(out, inp, opts)``, one dense tensor each. The adapters FSDP2 and ZeRO engines call most,
    written out like :func:`_fast_allreduce` (inside a training step, between two collectives, each Python call of
    an adapter runs from cold caches and costs several us)."""

    def adapter(pg, args):
        if len(args) == 3 and type(args[2]) is opts_type:
            out, inp = args[0], args[1]
            if (out.__class__ in _PLAIN and inp.__class__ in _PLAIN and out.layout is _STRIDED
                    and inp.layout is _STRIDED and out.is_contiguous() and inp.is_contiguous()):
                tp = pg._transports.get("cpu" if inp.is_cpu else inp.device.type)
                if tp is not None:
                    return lookup(tp, args[2].reduceOp, out, inp) if reduces else lookup(tp, out, inp)
        return None

    return adapter


_fast_allgather_base = _fast_base(_C.AllgatherOptions, algorithms.native_all_gather_request, False)
_fast_reduce_scatter_base = _fast_base(_C.ReduceScatterOptions, algorithms.native_reduce_scatter_request, True)


def _fast_alltoall_base(pg, args):
    if len(args) != 5 or type(args[4]) is not _C.AllToAllOptions:
        return None
    out, inp, osz, isz = args[0], args[1], args[2], args[3]
    if inp.__class__ not in _PLAIN or out.__class__ not in _PLAIN or type(osz) is not list or type(isz) is not list:
        return None
    tp = _tp_of(pg, inp)
    if tp is None:
        return None
    nat = algorithms.native_all_to_all_request(tp, out, inp, osz, isz)
    return nat if nat is not None and _dense(out) and _dense(inp) else None


def _fast_broadcast(pg, args):
    if len(args) != 2:
        return None
    tensors, opts = args
    if type(opts) is not _C.BroadcastOptions or type(tensors) is not list or len(tensors) != 1:
        return None
    t = tensors[0]
    if t.__class__ not in _PLAIN:
        return None
    tp = _tp_of(pg, t)
    if tp is None:
        return None
    nat = algorithms.native_broadcast_request(tp, t, opts.rootRank, opts.rootTensor)
    return nat if nat is not None and t.layout is _STRIDED and t.is_contiguous() else None


def _same_device(ts, like) -> bool:
    """Every tensor of ``ts`` dense, of a plain class, on ``like``'s device."""
    if like.is_cpu:
        for t in ts:
            if t.__class__ not in _PLAIN or t.layout is not _STRIDED or not t.is_contiguous() or not t.is_cpu:
                return False
        return True
    dev = like.device
    return all(_dense(t) and t.device == dev for t in ts)


def _one_and_list(args, opts_type, list_first: bool):
    """``(tensor, tensors)`` of a list-form request c10d passes as ``([[...]], [x], opts)`` (``list_first``: the
    list all_gather) or ``([x], [[...]], opts)`` (the list reduce_scatter): one dense tensor and a list of dense ones
    of plain classes on its device; else None."""
    if len(args) != 3 or type(args[2]) is not opts_type:
        return None
    a, b = args[0], args[1]
    if type(a) is not list or type(b) is not list or len(a) != 1 or len(b) != 1:
        return None
    many, one = (a[0], b[0]) if list_first else (b[0], a[0])
    if type(many) is not list or not many or one.__class__ not in _PLAIN or not _dense(one):
        return None
    return (one, many) if _same_device(many, one) else None


def _fast_allgather(pg, args):
    req = _one_and_list(args, _C.AllgatherOptions, list_first=True)
    tp = _tp_of(pg, req[0]) if req is not None else None
    return algorithms.native_all_gather_list_request(tp, req[1], req[0]) if tp is not None else None  # type: ignore


def _fast_reduce_scatter(pg, args):
    req = _one_and_list(args, _C.ReduceScatterOptions, list_first=False)
    tp = _tp_of(pg, req[0]) if req is not None else None
    if tp is None:
        return None
    return algorithms.native_reduce_scatter_list_request(tp, args[2].reduceOp, req[0], req[1])  # type: ignore


def _p2p(lookup):
    def adapter(pg, args):
        if len(args) != 3:
            return None
        tensors, peer, tag = args
        if type(tensors) is not list or len(tensors) != 1 or type(peer) is not int or type(tag) is not int:
            return None
        t = tensors[0]
        if t.__class__ not in _PLAIN or not _dense(t):
            return None
        tp = _tp_of(pg, t)
        return lookup(tp, t, peer, tag) if tp is not None else None

    return adapter


def _rooted(opts_type, lookup, one_first: bool):
    """The adapter of gather (``([outs] on the root, else [], [inp], GatherOptions)``; ``one_first`` False) or scatter
    (``([out], [inps] on the root, else [], ScatterOptions)``): this rank's one tensor, and the root's list, which
    another rank may pass too (the full path, which ignores it)."""

    def adapter(pg, args):
        if len(args) != 3 or type(args[2]) is not opts_type or type(args[0]) is not list or type(args[1]) is not list:
            return None
        ones, roots = (args[0], args[1]) if one_first else (args[1], args[0])
        if len(ones) != 1 or len(roots) > 1:
            return None
        one = ones[0]
        if one.__class__ not in _PLAIN or not _dense(one):
            return None
        tp = _tp_of(pg, one)
        if tp is None:
            return None
        root, many = args[2].rootRank, None
        if roots:
            many = roots[0]
            if tp.rank != root or type(many) is not list or not _same_device(many, one):
                return None
        return lookup(tp, one, many, root)

    return adapter


def _fast_barrier(pg, args):
    if len(args) != 1 or type(args[0]) is not _C.BarrierOptions:
        return None
    tp = pg._transports.get("cpu")  # the full path's barrier runs on the CPU transport
    return algorithms.native_barrier_request(tp) if tp is not None else None


FAST = {"allreduce": _fast_allreduce, "broadcast": _fast_broadcast,
        "_allgather_base": _fast_allgather_base, "all_gather_single": _fast_allgather_base,
        "_reduce_scatter_base": _fast_reduce_scatter_base, "reduce_scatter_single": _fast_reduce_scatter_base,
        "alltoall_base": _fast_alltoall_base, "all_to_all_single": _fast_alltoall_base,
        "allgather": _fast_allgather, "reduce_scatter": _fast_reduce_scatter,
        "send": _p2p(algorithms.native_send_request), "recv": _p2p(algorithms.native_recv_request),
        "gather": _rooted(_C.GatherOptions, algorithms.native_gather_request, False),
        "scatter": _rooted(_C.ScatterOptions, algorithms.native_scatter_request, True), "barrier": _fast_barrier}


def _first_list(args):
    return args[0]


def _first_tensor(args):
    return [args[0]]


# the methods whose gloo Work writes its outputs inside wait() on the waiting thread (reduce_scatter copies its slice
# then): waited on with autograd off (funcoll.transport.wait_quietly); the other Works write on gloo's own threads
_WRITES_IN_WAIT = frozenset({"reduce_scatter", "_reduce_scatter_base", "reduce_scatter_single"})

# the outputs a Work's future completes with, for a method whose backend Work has no future and no result() (gloo's
# send, recv and reduce_scatter): as c10d's Works complete theirs
_OUTPUTS = {"send": _first_list, "recv": _first_list, "reduce_scatter": _first_list,
            "_reduce_scatter_base": _first_tensor, "reduce_scatter_single": _first_tensor}
