"""The algorithms layer: every collective's full semantics, built from a transport's native primitives.

One function per collective. Each validates through :mod:`funcoll.semantics`, then asks the transport's
``Capabilities`` whether the request is native; if not, it composes a strategy. The strategies are written
once here and shared by every device:

* complex           -> reduced as its real view (sum/avg only)
* bool              -> reduced as uint8 (sum/max/bor = max, product/min/band = min, bxor = bxor)
* AVG               -> SUM then scale (fp16/bf16 summed in float32; integers summed in int64, then
                       divided with truncation, like NCCL)
* PREMUL_SUM        -> scale then SUM
* unsigned dtypes   -> reduced as the signed dtype of the same width (min/max with the sign bit flipped)
* narrow dtypes     -> widen, reduce, narrow (exact modulo the width for sums and products)
* other ops         -> gather, then reduce locally in rank order (bitwise ops, broken integer MIN/MAX)
* unmovable dtypes  -> moved as raw bits of a dtype the backend moves (fp8, uint16/32/64, complex)
* uneven all_to_all -> agree on the largest split, pad, even all_to_all, unpad
* coalesced         -> one flat buffer per dtype, one collective each (or one tuple op where native)
* broadcast         -> masked integer SUM of the raw bits where the backend has no broadcast
* reduce/gather/scatter -> all_reduce / all_gather / broadcast where the backend lacks them

All ranks are group-local. Every function returns a :class:`Pending`: waiting on it waits on the native
handles and then runs the local finishing steps (unpad, scale, narrow, copy back). Multi-step strategies
wait between their steps; the last step stays asynchronous where the transport is.
"""

from __future__ import annotations

import contextlib
import functools
import math
import threading
import time
from datetime import timedelta
from typing import Callable, Dict, List, Optional, Sequence

import torch
import torch.autograd.profiler as _profiler

from funcoll import semantics
from funcoll.algorithms import planner
from funcoll.algorithms.observe import LOG as _LOG
from funcoll.algorithms.observe import Scope
from funcoll.semantics import ReduceOp, Reduction
from funcoll.transport import Handle, Transport

__all__ = [  # one function per op, named as the op (dist.<op> / _c10d_functional.<op>)
    "Pending", "record", "all_reduce", "all_reduce_coalesced", "all_gather_into_tensor",
    "all_gather_into_tensor_coalesced", "reduce_scatter_tensor", "reduce_scatter_tensor_coalesced",
    "all_to_all_single", "all_gather", "reduce_scatter", "all_to_all", "broadcast", "reduce", "gather", "scatter",
    "send", "recv", "barrier",
]

R = ReduceOp


# ---------------------------------------------------------------------------------------------------
# Pending results and strategy recording
# ---------------------------------------------------------------------------------------------------
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
        deadline = None if timeout is None else time.monotonic() + timeout.total_seconds()
        if self._future is not None:  # handed over to future(): its callback runs the finishing steps
            while deadline is not None and not self._future.done():
                if time.monotonic() >= deadline:
                    assert timeout is not None
                    raise TimeoutError(f"funcoll: collective not complete after {timeout.total_seconds():g}s")
                time.sleep(0.001)
            self._future.wait()
            return
        while self._handles:
            h = self._handles[0]
            if deadline is None:
                h.wait()
            else:
                left = deadline - time.monotonic()
                if left <= 0:
                    assert timeout is not None
                    raise TimeoutError(f"funcoll: collective not complete after {timeout.total_seconds():g}s")
                h.wait(timedelta(seconds=left))
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
                elif hasattr(h, "get_future"):
                    try:
                        futs.append(h.get_future())
                    except RuntimeError:  # a backend Work without a future ("Work::getFuture not implemented")
                        from funcoll.transport.gloo import WaitedWork

                        futs.append(WaitedWork(h).get_future())
            self._handles = []
            if not futs:
                self._run_thens()
                done: torch.futures.Future = torch.futures.Future()
                done.set_result(None)
                self._future = done
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

    def source_rank(self) -> int:
        """The group rank a receive got its data from (c10d's ``Work._source_rank()``)."""
        if self._source is None:
            raise RuntimeError("funcoll: source_rank() is only defined for the Work of a recv")
        return self._source



_recorders: List[list] = []


class _Current(threading.local):
    """The strategy notes of the collective running on this thread (None outside one): two threads running
    collectives at once each note their own strategies."""

    notes: Optional[list] = None


_current = _Current()


@contextlib.contextmanager
def record():
    """Collects, for every collective started inside the block, ``(op, [strategies])``.

    >>> with funcoll.algorithms.record() as calls: dist.all_reduce(t, op=dist.ReduceOp.AVG)
    >>> calls   # [("all_reduce", ["avg=sum+scale"])] under FUNCOLL_PROFILE=xccl
    """
    log: list = []
    _recorders.append(log)
    try:
        yield log
    finally:
        _forget(log)


def _forget(log: list) -> None:
    """Removes ``log`` itself from the recorders (by identity: another recorder may hold equal contents)."""
    for i, other in enumerate(_recorders):
        if other is log:
            del _recorders[i]
            return


def _note(strategy: str) -> None:
    notes = _current.notes
    if notes is not None:
        notes.append(strategy)


def _observed() -> bool:
    """A profiler records or the funcoll log is at DEBUG: collectives open ranges and log their decisions."""
    return bool(_profiler._is_profiler_enabled) or _LOG.isEnabledFor(10)


def _entry(fn):
    """Marks a public algorithm, named after the op it implements (the name ``record()`` reports): runs it without
    autograd and records its strategies; while :func:`_observed`, :mod:`funcoll.algorithms.observe` opens its ranges
    and logs its strategy decision."""
    op = fn.__name__

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        observed = _observed()
        if _current.notes is not None or not (_recorders or observed):  # nested, or nobody listens
            with torch.no_grad():
                return fn(*args, **kwargs)
        _current.notes = notes = Scope(op, fn, args, kwargs) if observed else []
        try:
            with torch.no_grad():
                return fn(*(notes.args if observed else args), **kwargs)
        finally:
            _current.notes = None
            if observed:
                notes.close(args)
            notes = list(dict.fromkeys(notes)) or ["native"]  # each strategy once, in order
            for log in _recorders:
                log.append((op, notes))

    return wrapper


# ---------------------------------------------------------------------------------------------------
# the native fast path: one cached lookup per signature
# ---------------------------------------------------------------------------------------------------
_native_cache: dict = {}


def native_all_reduce(tp: Transport, op, dtype: torch.dtype) -> Optional[Reduction]:
    """The :class:`Reduction` to hand ``tp.all_reduce`` as it is, when reducing ``dtype`` with ``op`` is native under
    funcoll's semantics (the planner's plan is one native call); None when it is not, when the request is invalid
    (the full path raises the error), or while ``record()``, a profiler or the funcoll debug log observe (the full
    path reports to them). Validated once per (capabilities, op, dtype, group size), never skipped for a new one."""
    if watched():
        return None
    try:
        key = (tp.caps, op, dtype, tp.size)
        return _native_cache[key]
    except KeyError:
        pass
    except TypeError:  # an unhashable op (a premul_sum factor tensor): the full path
        return None
    try:
        red = semantics.parse_reduction(op, "all_reduce")
        semantics.check_reduction("all_reduce", red, dtype)
    except (ValueError, TypeError):
        return None  # not cached: the full path raises the error, every time
    native = planner.plan(tp.caps, "all_reduce", red.op, dtype, tp.size).native and red.op is not R.PREMUL_SUM
    _native_cache[key] = red if native else None
    return _native_cache[key]


# The eager entry's fast path: a request the transport's c10d backend serves as it is, under funcoll's semantics, is
# handed to the backend's own method with the caller's arguments. Each lookup below validates a new signature once,
# fully (the same semantics checks as the algorithm; an invalid request is not cached, so the full path raises its
# error every time) and caches the answer per transport; its key is everything the validation and the plan read
# (reduce op, dtypes, shapes, devices, root, split sizes). The caller still checks per call what the key does not
# hold (dense, contiguous tensors).
class Native:
    """A request signature the transport's backend serves natively and unchanged: ``issue`` is the backend's own
    method of the same name as the eager ProcessGroup method (called with the caller's arguments); ``tally.n += 1``
    counts a call in the transport's :attr:`~funcoll.transport.Transport.calls` (a ``Transport.tally``); ``cpu``: the
    request's tensors are CPU tensors. ``note`` is the entry point's own per-signature data (its flight-recorder
    description), filled once by the entry point."""

    __slots__ = ("tp", "caps", "cls", "issue", "tally", "cpu", "note")

    def __init__(self, tp: Transport, issue: Callable, calls_key: tuple):
        self.tp, self.caps, self.cls, self.issue, self.note = tp, tp.caps, type(tp), issue, None
        self.tally = tp.tally(calls_key)
        self.cpu = tp.device_type == "cpu"


_NATIVE_CACHE_MAX = 4096  # signatures per transport; the cache starts over past it
_MISSING = object()

try:
    from torch.distributed import ReduceOp as _C10D_REDUCE_OP
except ImportError:  # pragma: no cover - torch without distributed
    _C10D_REDUCE_OP = None  # type: ignore[assignment,misc]


def watched() -> bool:
    """Someone observes collectives: ``record()``, a strategy being noted on this thread, a profiler, the funcoll debug
    log. The fast path is off while they do: the full path reports to them."""
    # _observed() inlined: this is read before every eager collective
    return (bool(_recorders) or _current.notes is not None or bool(_profiler._is_profiler_enabled)
            or _LOG.isEnabledFor(10))


def _op_key(op):
    """A hashable key of a reduce op. A c10d ``ReduceOp`` (a new object per read of ``opts.reduceOp``, with a slow
    __eq__) hashes as its RedOpType: keyed by that number. PREMUL_SUM's factor is not in it; no PREMUL_SUM is native
    here."""
    return hash(op) if type(op) is _C10D_REDUCE_OP else ("op", op)


def _cached(tp: Transport, key: tuple):
    """The cached answer for ``key`` on ``tp``, or _MISSING (also when the transport's capabilities or class changed
    since: funcoll.probe demoted a request)."""
    cache = tp.__dict__.get("_funcoll_native")
    if cache is None:
        return _MISSING
    got = cache.get(key, _MISSING)
    if got is None or got is _MISSING or (got.caps is tp.caps and got.cls is type(tp)):
        return got
    cache.clear()
    return _MISSING


def _resolve(tp: Transport, key: tuple, build: Callable, *args) -> Optional[Native]:
    """Validates a new signature (``build(tp, *args)``) and caches the answer; an invalid request is not cached (the
    full path raises its error, every time)."""
    try:
        got = build(tp, *args)
    except (ValueError, TypeError):
        return None
    cache = tp.__dict__.setdefault("_funcoll_native", {})
    if len(cache) >= _NATIVE_CACHE_MAX:
        cache.clear()
    cache[key] = got
    return got


def _native(tp: Transport, primitive: str, name: str, calls_key: tuple) -> Optional[Native]:
    """A :class:`Native` calling the backend's own method ``name``, when ``tp`` is a c10d transport whose primitive
    is the stock one (a subclass that changes the primitive is called through the transport: the full path)."""
    from funcoll.transport.gloo import C10dTransport

    backend = getattr(tp, "backend", None)
    if backend is None or not isinstance(tp, C10dTransport):
        return None
    if getattr(type(tp), "_" + primitive) is not getattr(C10dTransport, "_" + primitive):
        return None
    issue = getattr(backend, name, None)
    return Native(tp, issue, calls_key) if issue is not None else None


def _build_all_reduce(tp: Transport, op, t: torch.Tensor) -> Optional[Native]:
    red = semantics.parse_reduction(op, "all_reduce")
    semantics.check_reduction("all_reduce", red, t.dtype)
    caps = tp.caps
    if (t.numel() == 0 or red.op is R.PREMUL_SUM or not caps.moves(t.dtype)
            or not planner.plan(caps, "all_reduce", red.op, t.dtype, tp.size).native):
        return None
    return _native(tp, "all_reduce", "allreduce", ("all_reduce", str(red.op), t.dtype))


def native_all_reduce_request(tp: Transport, op, t: torch.Tensor) -> Optional[Native]:
    """``ProcessGroup.allreduce([t], opts)`` with ``op = opts.reduceOp``, when it is one native call of the backend's
    ``allreduce`` with the same arguments; else None. The key: reduce op, dtype, shape, device."""
    # _cached and _op_key inlined: this is the hot path of every eager all_reduce
    key = ("all_reduce", hash(op) if type(op) is _C10D_REDUCE_OP else ("op", op), t.dtype, t.shape,
           None if t.is_cpu else t.device)
    cache = tp.__dict__.get("_funcoll_native")
    if cache is not None:
        got = cache.get(key, _MISSING)
        if got is None or (got is not _MISSING and got.caps is tp.caps and got.cls is type(tp)):
            return got
    got = _cached(tp, key)  # clears a stale cache
    return got if got is not _MISSING else _resolve(tp, key, _build_all_reduce, op, t)


def _build_all_gather(tp: Transport, out: torch.Tensor, inp: torch.Tensor) -> Optional[Native]:
    shape = semantics.check_all_gather("all_gather_into_tensor", out, inp, tp.size)
    caps = tp.caps
    if (out.numel() == 0 or inp.dim() == 0 or tuple(out.shape) != tuple(shape) or not caps.has("all_gather")
            or not caps.moves(inp.dtype)):
        return None
    return _native(tp, "all_gather", "_allgather_base", ("all_gather", "", inp.dtype))


def native_all_gather_request(tp: Transport, out: torch.Tensor, inp: torch.Tensor) -> Optional[Native]:
    """``ProcessGroup._allgather_base(out, inp, opts)`` as one native call of the backend's ``_allgather_base``
    (output in the concatenated shape)."""
    key = ("all_gather", out.dtype, out.shape, None if out.is_cpu else out.device, inp.dtype, inp.shape,
           None if inp.is_cpu else inp.device)
    got = _cached(tp, key)
    return got if got is not _MISSING else _resolve(tp, key, _build_all_gather, out, inp)


def _build_reduce_scatter(tp: Transport, op, out: torch.Tensor, inp: torch.Tensor) -> Optional[Native]:
    red = semantics.parse_reduction(op, "reduce_scatter_tensor")
    semantics.check_reduction("reduce_scatter_tensor", red, inp.dtype)
    semantics.check_reduce_scatter("reduce_scatter_tensor", out, inp, tp.size)
    caps = tp.caps
    if (out.numel() == 0 or red.op is R.PREMUL_SUM or out.dim() == 0
            or tuple(inp.shape) != (tp.size * out.shape[0],) + tuple(out.shape[1:])
            or not caps.moves(inp.dtype)
            or not planner.plan(caps, "reduce_scatter", red.op, inp.dtype, tp.size).native):
        return None
    return _native(tp, "reduce_scatter", "_reduce_scatter_base", ("reduce_scatter", str(red.op), inp.dtype))


def native_reduce_scatter_request(tp: Transport, op, out: torch.Tensor, inp: torch.Tensor) -> Optional[Native]:
    """``ProcessGroup._reduce_scatter_base(out, inp, opts)`` as one native call of the backend's own (input in the
    concatenated shape)."""
    key = ("reduce_scatter", _op_key(op), out.dtype, out.shape, None if out.is_cpu else out.device, inp.dtype,
           inp.shape, None if inp.is_cpu else inp.device)
    got = _cached(tp, key)
    return got if got is not _MISSING else _resolve(tp, key, _build_reduce_scatter, op, out, inp)


def _build_all_to_all(tp: Transport, out: torch.Tensor, inp: torch.Tensor, osz: tuple, isz: tuple):
    outs, ins = semantics.check_all_to_all("all_to_all_single", out, inp, list(osz), list(isz), tp.size)
    caps = tp.caps
    if not caps.has("all_to_all") or not caps.moves(inp.dtype):
        return None
    if (osz or isz) and not (caps.uneven_all_to_all and list(osz) == outs and list(isz) == ins):
        return None
    return _native(tp, "all_to_all", "alltoall_base", ("all_to_all", "", inp.dtype))


def native_all_to_all_request(tp: Transport, out: torch.Tensor, inp: torch.Tensor, output_split_sizes: list,
                              input_split_sizes: list) -> Optional[Native]:
    """``ProcessGroup.alltoall_base(out, inp, output_split_sizes, input_split_sizes, opts)`` (lists; empty: even
    splits) as one native call of the backend's ``alltoall_base``."""
    osz, isz = tuple(output_split_sizes), tuple(input_split_sizes)
    key = ("all_to_all", out.dtype, out.shape, None if out.is_cpu else out.device, inp.dtype, inp.shape,
           None if inp.is_cpu else inp.device, osz, isz)
    got = _cached(tp, key)
    return got if got is not _MISSING else _resolve(tp, key, _build_all_to_all, out, inp, osz, isz)


def _build_broadcast(tp: Transport, t: torch.Tensor, src, root_tensor) -> Optional[Native]:
    semantics.check_root("broadcast", "src", src, tp.size)
    caps = tp.caps
    if root_tensor != 0 or t.numel() == 0 or not caps.has("broadcast") or not caps.moves(t.dtype):
        return None
    return _native(tp, "broadcast", "broadcast", ("broadcast", "", t.dtype))


def native_broadcast_request(tp: Transport, t: torch.Tensor, src, root_tensor) -> Optional[Native]:
    """``ProcessGroup.broadcast([t], opts)`` (group-local ``src = opts.rootRank``) as one native call of the backend's
    ``broadcast``."""
    key = ("broadcast", src, root_tensor, t.dtype, t.shape, None if t.is_cpu else t.device)
    got = _cached(tp, key)
    return got if got is not _MISSING else _resolve(tp, key, _build_broadcast, t, src, root_tensor)


# ---------------------------------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------------------------------
# dtypes with the same element size, tried in order to move raw bits: integers only (bits of other data seen as a
# float can be a NaN pattern, which a backend's NaN check rejects: XCCL's TORCH_XCCL_NAN_CHECK); else as bytes
_SAME_WIDTH = {1: (torch.uint8, torch.int8), 2: (torch.int16,), 4: (torch.int32,), 8: (torch.int64,)}


def _contig_in(t: torch.Tensor) -> torch.Tensor:
    return t if t.is_contiguous() else t.contiguous()


def _with_contig_out(t: torch.Tensor, run: Callable[[torch.Tensor], Pending]) -> Pending:
    """Runs ``run`` on a contiguous tensor and copies the result back into ``t`` when it was not."""
    if t.is_contiguous():
        return run(t)
    work = t.contiguous()
    return run(work).and_then(lambda: t.copy_(work))


def _flat(t: torch.Tensor) -> torch.Tensor:
    """A contiguous tensor with at least one dimension, sharing storage."""
    return t.reshape(1) if t.dim() == 0 else t


def _bits(t: torch.Tensor, caps) -> torch.Tensor:
    """A view of contiguous ``t`` as a dtype the backend moves natively, dim 0 unchanged."""
    if caps.moves(t.dtype):
        return t
    t = _flat(t)
    if t.dtype.is_complex:
        _note(f"{t.dtype} moved as its real view")
        return _bits(torch.view_as_real(t), caps)
    size = t.element_size()
    for cand in _SAME_WIDTH.get(size, ()):
        if caps.moves(cand):
            _note(f"{t.dtype} moved as {cand}")
            return t.view(cand)
    if not caps.moves(torch.uint8):  # pragma: no cover - every backend moves bytes
        raise NotImplementedError(f"funcoll: the {caps.name} transport moves no dtype that can carry {t.dtype}")
    _note(f"{t.dtype} moved as bytes")
    # rows of bytes, one per element of dim 0 (also of 0 elements, also of a 1-D tensor): split sizes still count rows
    return t.view(t.shape[0], math.prod(t.shape[1:])).view(torch.uint8)


_IN_PLACE: Dict[ReduceOp, Callable[..., object]] = {
    R.SUM: torch.Tensor.add_, R.PRODUCT: torch.Tensor.mul_, R.BAND: torch.Tensor.bitwise_and_,
    R.BOR: torch.Tensor.bitwise_or_, R.BXOR: torch.Tensor.bitwise_xor_}


def _local_reduce(g: torch.Tensor, op: ReduceOp) -> torch.Tensor:
    """Reduces dim 0 of ``g`` (one row per rank, a buffer of funcoll's own) in rank order, in g's dtype, in place
    into ``g[0]``, which it returns: no temporaries, and the same order (so the same bits) on every rank."""
    rows = g.unbind(0)
    acc = rows[0]
    for row in rows[1:]:
        if op is R.MIN:
            torch.minimum(acc, row, out=acc)
        elif op is R.MAX:
            torch.maximum(acc, row, out=acc)
        else:
            _IN_PLACE[op](acc, row)
    return acc


def _count_to_bool(kind: str, count: torch.Tensor, n: int) -> torch.Tensor:
    """A count of the Trues of every rank, back to the bool result of any / all / parity."""
    if kind == planner.BOOL_ANY:
        return count != 0
    if kind == planner.BOOL_ALL:
        return count == n
    return count.bitwise_and(1) != 0


def _count_to_bool_(kind: str, count: torch.Tensor, n: int) -> None:
    """:func:`_count_to_bool` in place, on a uint8 count that is the bool tensor's own bytes (0/1 afterwards)."""
    if kind == planner.BOOL_ANY:
        count.clamp_(max=1)
    elif kind == planner.BOOL_ALL:
        count.eq_(n)
    else:
        count.bitwise_and_(1)


def _padded_flat(t: torch.Tensor, n: int) -> torch.Tensor:
    """``t`` flattened, as is when its size divides by ``n`` (a view: no copy), else copied and padded to it. Callers
    tell the two apart by size, never by ``data_ptr()``: a lazy XLA tensor and its padded copy report the same one."""
    flat = t.reshape(-1)
    pad = -flat.numel() % n
    return flat if not pad else torch.cat([flat, flat.new_zeros(pad)])


def _factor(red: Reduction, like: torch.Tensor):
    f = red.factor
    if isinstance(f, torch.Tensor):
        return f.to(device=like.device, dtype=like.dtype).reshape(())
    return f


def _trunc_div(w: torch.Tensor, n: int) -> torch.Tensor:
    """``w / n`` rounded toward zero, exactly, for an int64 tensor and a positive int, with integer ops only
    (torch_xla 2.9 divides integers in float32: wrong above 2**24). The remainder (fmod, exact) makes ``w - r`` a
    multiple of n; dividing a multiple exactly is a shift by n's power of two and a multiplication by the inverse
    of its odd part modulo 2**64 (int64 arithmetic wraps)."""
    q = w - torch.fmod(w, n)
    k = (n & -n).bit_length() - 1
    if k:
        q = q >> k
    m = n >> k
    if m > 1:
        inv = pow(m, -1, 1 << 64)
        q = q * (inv - (1 << 64) if inv >= 1 << 63 else inv)
    return q


# ---------------------------------------------------------------------------------------------------
# all_reduce
# ---------------------------------------------------------------------------------------------------
def _ar(tp: Transport, t: torch.Tensor, red: Reduction) -> Pending:
    """In-place all_reduce of contiguous ``t`` (already validated): the planner's plan for the request, run."""
    return _run_ar(tp, t, red, planner.plan(tp.caps, "all_reduce", red.op, t.dtype, tp.size).steps)


def _run_ar(tp: Transport, t: torch.Tensor, red: Reduction, steps) -> Pending:
    step, rest, n = steps[0], steps[1:], tp.size
    if step.note:
        _note(step.note)
    kind = step.kind
    if kind == planner.NATIVE:
        return Pending([tp.all_reduce(t, red if step.op is red.op else Reduction(step.op))])
    if kind == planner.REAL_VIEW:
        return _run_ar(tp, torch.view_as_real(_flat(t)), red, rest)
    if kind == planner.BOOL_OP:
        return _run_ar(tp, t, Reduction(step.op), rest)
    if kind == planner.BOOL_UINT8:
        return _run_ar(tp, t.view(torch.uint8), Reduction(step.op), rest)
    if kind == planner.AVG_FLOAT32:
        w = t.float()
        return _run_ar(tp, w, Reduction(R.SUM), rest).and_then(lambda: t.copy_(w.div_(n)))
    if kind == planner.AVG_FLOAT:
        return _run_ar(tp, t, Reduction(R.SUM), rest).and_then(lambda: t.div_(n))
    if kind == planner.AVG_INT:
        w = t.to(torch.int64)
        return _run_ar(tp, w, Reduction(R.SUM), rest).and_then(lambda: t.copy_(_trunc_div(w, n)))
    if kind == planner.PREMUL:
        t.mul_(_factor(red, t))
        return _run_ar(tp, t, Reduction(R.SUM), rest)
    if kind == planner.SIGNED_FLIP:
        w, bit = t.view(step.dtype), planner.SIGN_BIT[step.dtype]
        w.bitwise_xor_(bit)
        return _run_ar(tp, w, red, rest).and_then(lambda: w.bitwise_xor_(bit))
    if kind == planner.SIGNED:
        return _run_ar(tp, t.view(step.dtype), red, rest)
    if kind == planner.WIDEN:
        w = t.to(step.dtype)
        return _run_ar(tp, w, red, rest).and_then(lambda: t.copy_(w))
    if kind in (planner.BOOL_ANY, planner.BOOL_ALL, planner.BOOL_PARITY):
        if step.dtype == torch.uint8 and t.is_contiguous() and tp.dtype_views:
            # bools are 0/1 bytes: count in the tensor itself, then turn the count back into 0/1 in place
            w = t.view(torch.uint8)
            return _run_ar(tp, w, Reduction(R.SUM), rest).and_then(lambda: _count_to_bool_(kind, w, n))
        w = t.to(step.dtype)
        return _run_ar(tp, w, Reduction(R.SUM), rest).and_then(lambda: t.copy_(_count_to_bool(kind, w, n)))
    if kind == planner.RS_AG_LOCAL:
        # all_to_all (this rank receives every rank's copy of its block), reduce the block locally in rank order,
        # all_gather the blocks straight into the result: 2(n-1)/n of the tensor sent, one extra buffer
        flat = _padded_flat(t, n)
        recv = torch.empty_like(flat)
        _a2a_even(tp, recv, flat).wait()
        block = _local_reduce(recv.view(n, -1), step.op)
        p = _ag(tp, flat, block)
        if flat.numel() == t.numel():  # no padding: flat is a view of t, the all_gather wrote into t itself
            return p
        return p.and_then(lambda: t.view(-1).copy_(flat[:t.numel()]))
    if kind == planner.AVG_RS_AG:
        # float32 reduce_scatter (the sum rounds once, as a float32 all_reduce would), each rank divides and rounds
        # its block to t's dtype, all_gather in t's dtype: 1.5x the bytes of a native all_reduce instead of 2x. In
        # pieces of tp.staging_bytes of float32 (each piece's blocks gathered back into the piece, in place): the
        # float32 copy and the transport's own temporaries stay bounded, not twice the tensor and more
        flat = _padded_flat(t, n)
        piece = flat.numel() if tp.staging_bytes is None else max(n, tp.staging_bytes // 4 // n * n)
        for lo in range(0, flat.numel(), piece):
            part = flat[lo:lo + piece]
            wide = part.float()
            block = wide.new_empty((part.numel() // n,))
            _rs(tp, block, wide, Reduction(R.SUM)).wait()
            del wide
            p = _ag(tp, part, block.div_(n).to(t.dtype))
            if lo + piece < flat.numel():
                p.wait()
        if flat.numel() == t.numel():  # no padding (a view of t), as above
            return p
        return p.and_then(lambda: t.view(-1).copy_(flat[:t.numel()]))
    if kind == planner.GATHER_LOCAL:
        flat = t.reshape(-1)
        g = flat.new_empty((n * flat.numel(),))
        return _ag(tp, g, flat).and_then(lambda: flat.copy_(_local_reduce(g.view(n, -1), step.op)))
    raise NotImplementedError(f"funcoll.all_reduce: the {tp.caps.name} transport cannot reduce {t.dtype}")


@_entry
def all_reduce(tp: Transport, tensor: torch.Tensor, op="sum") -> Pending:
    """In-place all_reduce of ``tensor`` over the transport's group."""
    red = semantics.parse_reduction(op, "all_reduce")
    semantics.check_reduction("all_reduce", red, tensor.dtype)
    if tensor.numel() == 0:
        return Pending()  # nothing to send: complete at once
    return _with_contig_out(tensor, lambda t: _ar(tp, t, red))


def _by_dtype(tensors: Sequence[torch.Tensor]):
    groups: dict = {}
    for i, t in enumerate(tensors):
        groups.setdefault((t.dtype, t.device), []).append(i)
    return groups.values()


def _by_dtype_pairs(outs: Sequence[torch.Tensor], inps: Sequence[torch.Tensor]):
    """(outputs, inputs) of each dtype and device, in order, leaving out empty inputs."""
    for idx in _by_dtype(inps):
        keep = [i for i in idx if inps[i].numel()]
        if keep:
            yield [outs[i] for i in keep], [inps[i] for i in keep]


@_entry
def all_reduce_coalesced(tp: Transport, tensors: Sequence[torch.Tensor], op="sum") -> Pending:
    """In-place all_reduce of several tensors: one tuple op where native, else one flat buffer per dtype."""
    red = semantics.parse_reduction(op, "all_reduce_coalesced")
    for t in tensors:
        semantics.check_reduction("all_reduce_coalesced", red, t.dtype)
    tensors = [t for t in tensors if t.numel()]
    if not tensors:
        return Pending()  # nothing to send: complete at once
    caps = tp.caps
    # the plan reads only what every rank shares (op, dtypes); a tensor's layout changes only local copies
    if all(caps.reduces("all_reduce_coalesced", red.op, t.dtype) for t in tensors):
        _note(f"one tuple all_reduce of {len(tensors)} tensors")
        work = [_contig_in(t) for t in tensors]
        p = Pending([tp.all_reduce_coalesced(work, red)])
        staged = [(t, w) for t, w in zip(tensors, work) if w is not t]
        return p.and_then(lambda: [t.copy_(w) for t, w in staged]) if staged else p
    pendings = []
    for idx in _by_dtype(tensors):
        ts = [tensors[i] for i in idx]
        if len(ts) == 1:
            pendings.append(_with_contig_out(ts[0], lambda t: _ar(tp, t, red)))
            continue
        _note(f"flat buffer of {len(ts)} {ts[0].dtype} tensors")
        flat = torch.cat([t.reshape(-1) for t in ts])

        def unflatten(ts=ts, flat=flat):
            off = 0
            for t in ts:
                t.copy_(flat[off:off + t.numel()].view(t.shape))
                off += t.numel()

        pendings.append(_ar(tp, flat, red).and_then(unflatten))
    return Pending(pendings)


# ---------------------------------------------------------------------------------------------------
# all_gather
# ---------------------------------------------------------------------------------------------------
def _summable(t: torch.Tensor, caps) -> torch.Tensor:
    """A view of contiguous ``t`` whose exact sum with the additive identity gives ``t`` back bit for bit: complex as
    its real view, float8 as uint8 (no sum of float8 exists), uint16/32/64 that the transport does not sum as the
    signed dtype (the same bits; also where torch has no CPU kernels for them); everything else as it is (no dtype
    view where none is needed: on XLA a view is a CPU fallback)."""
    if t.dtype.is_complex:
        return torch.view_as_real(_flat(t))
    if t.dtype in semantics.FLOAT8:
        return t.view(torch.uint8)
    if t.dtype in planner.SIGNED_OF and not caps.reduces("all_reduce", R.SUM, t.dtype):
        return t.view(planner.SIGNED_OF[t.dtype])
    return t


def _identity(dtype: torch.dtype):
    """The value that, summed with any x (or-ed, for bool), gives x back bit for bit: -0.0 for floats (+0.0 would
    turn -0.0 into +0.0), 0 for integers, False for bool."""
    if dtype == torch.bool:
        return False
    return -0.0 if dtype.is_floating_point else 0


def _masked_sum(tp: Transport, t: torch.Tensor, keep: torch.Tensor, then: Callable[[torch.Tensor], object],
                flat: bool = False) -> Pending:
    """``t`` where ``keep`` (device data, so every rank runs the same program), the identity elsewhere, summed over
    the group in ``t``'s own dtype (or-ed for bool): exact, no dtype view; ``then(sum)`` runs on the result (flattened
    first when ``flat``)."""
    masked = torch.where(keep, t, _identity(t.dtype))
    if flat:
        masked = masked.reshape(-1)
    return _ar(tp, masked, Reduction(R.SUM)).and_then(lambda: then(masked))


def _ag(tp: Transport, out: torch.Tensor, inp: torch.Tensor) -> Pending:
    """All-gather of contiguous ``inp`` into contiguous ``out`` (dim-0 concatenation)."""
    caps = tp.caps
    if caps.has("all_gather"):
        return Pending([tp.all_gather(_bits(out, caps), _bits(inp, caps))])
    # e.g. XLA for a group whose replica groups have mixed sizes (XLA's all-gather needs one size): every rank
    # contributes its row, the identity in the others, to one all-reduce of n rows (n times the bytes)
    _note("all_gather=masked all_reduce")
    flat = _summable(_flat(inp), caps).reshape(1, -1)
    dest = _summable(out, caps).reshape(-1)
    rows = flat.expand(tp.size, flat.shape[1])
    return _masked_sum(tp, rows, tp.rank_mask(flat).unsqueeze(1), dest.copy_, flat=True)


@_entry
def all_gather_into_tensor(tp: Transport, out: torch.Tensor, inp: torch.Tensor) -> Pending:
    shape = semantics.check_all_gather("all_gather_into_tensor", out, inp, tp.size)
    if out.numel() == 0:
        return Pending()  # nothing to send: complete at once
    inp = _flat(_contig_in(inp))
    return _with_contig_out(out, lambda o: _ag(tp, o.view(shape), inp))


@_entry
def all_gather_into_tensor_coalesced(tp: Transport, outs: Sequence[torch.Tensor],
                                     inps: Sequence[torch.Tensor]) -> Pending:
    """One flat buffer per dtype, one all_gather each."""
    if len(outs) != len(inps):
        raise ValueError(f"funcoll.all_gather_into_tensor_coalesced: {len(outs)} outputs for {len(inps)} inputs")
    for o, i in zip(outs, inps):
        semantics.check_all_gather("all_gather_into_tensor_coalesced", o, i, tp.size)
    n = tp.size
    pendings = []
    for os_, ins in _by_dtype_pairs(outs, inps):
        if len(ins) == 1:
            src = _flat(_contig_in(ins[0]))
            pendings.append(_with_contig_out(os_[0], lambda o, i=src: _ag(tp, o, i)))  # type: ignore[misc]
            continue
        _note(f"flat buffer of {len(ins)} {ins[0].dtype} tensors")
        flat = torch.cat([i.reshape(-1) for i in ins])
        g = flat.new_empty((n * flat.numel(),))

        def unflatten(ins=ins, os_=os_, g=g):
            rows, off = g.view(n, -1), 0
            for i, o in zip(ins, os_):
                o.copy_(rows[:, off:off + i.numel()].reshape(o.shape))
                off += i.numel()

        pendings.append(_ag(tp, g, flat).and_then(unflatten))
    return Pending(pendings)


# ---------------------------------------------------------------------------------------------------
# reduce_scatter
# ---------------------------------------------------------------------------------------------------
def _rs(tp: Transport, out: torch.Tensor, inp: torch.Tensor, red: Reduction) -> Pending:
    """Reduce-scatter of contiguous ``inp`` into contiguous ``out`` (already validated): the planner's plan, run."""
    return _run_rs(tp, out, inp, red, planner.plan(tp.caps, "reduce_scatter", red.op, inp.dtype, tp.size).steps)


def _run_rs(tp: Transport, out: torch.Tensor, inp: torch.Tensor, red: Reduction, steps) -> Pending:
    step, rest, n = steps[0], steps[1:], tp.size
    if step.note:
        _note(step.note)
    kind = step.kind
    if kind == planner.NATIVE:
        return Pending([tp.reduce_scatter(out, inp, red if step.op is red.op else Reduction(step.op))])
    if kind == planner.REAL_VIEW:
        return _run_rs(tp, torch.view_as_real(_flat(out)), torch.view_as_real(_flat(inp)), red, rest)
    if kind == planner.BOOL_OP:
        return _run_rs(tp, out, inp, Reduction(step.op), rest)
    if kind == planner.BOOL_UINT8:
        return _run_rs(tp, out.view(torch.uint8), inp.view(torch.uint8), Reduction(step.op), rest)
    if kind == planner.AVG_FLOAT32:
        wo = out.float()
        return _run_rs(tp, wo, inp.float(), Reduction(R.SUM), rest).and_then(lambda: out.copy_(wo.div_(n)))
    if kind == planner.AVG_FLOAT:
        return _run_rs(tp, out, inp, Reduction(R.SUM), rest).and_then(lambda: out.div_(n))
    if kind == planner.AVG_INT:
        wo = out.to(torch.int64)
        return _run_rs(tp, wo, inp.to(torch.int64), Reduction(R.SUM), rest).and_then(
            lambda: out.copy_(_trunc_div(wo, n)))
    if kind == planner.PREMUL:
        return _run_rs(tp, out, inp * _factor(red, inp), Reduction(R.SUM), rest)
    if kind == planner.SIGNED_FLIP:
        wo, bit = out.view(step.dtype), planner.SIGN_BIT[step.dtype]
        return _run_rs(tp, wo, inp.view(step.dtype) ^ bit, red, rest).and_then(lambda: wo.bitwise_xor_(bit))
    if kind == planner.SIGNED:
        return _run_rs(tp, out.view(step.dtype), inp.view(step.dtype), red, rest)
    if kind == planner.WIDEN:
        wo = out.to(step.dtype)
        return _run_rs(tp, wo, inp.to(step.dtype), red, rest).and_then(lambda: out.copy_(wo))
    if kind in (planner.BOOL_ANY, planner.BOOL_ALL, planner.BOOL_PARITY):
        wo = out.to(step.dtype)
        return _run_rs(tp, wo, inp.to(step.dtype), Reduction(R.SUM), rest).and_then(
            lambda: out.copy_(_count_to_bool(kind, wo, n)))
    if kind == planner.A2A_LOCAL:
        buf = torch.empty_like(inp)
        return _a2a_even(tp, buf, inp).and_then(
            lambda: out.reshape(-1).copy_(_local_reduce(buf.view(n, -1), step.op)))
    if kind == planner.ALL_REDUCE_SLICE:  # XLA, replica groups of mixed sizes: no reduce_scatter, no all_to_all
        w = inp.clone()
        return _ar(tp, w, Reduction(step.op, red.factor)).and_then(lambda: out.copy_(
            w.view((n,) + tuple(out.shape)).index_select(0, tp.rank_index(w)).view(out.shape)))
    raise NotImplementedError(f"funcoll.reduce_scatter_tensor: the {tp.caps.name} transport cannot reduce "
                              f"{inp.dtype}")


@_entry
def reduce_scatter_tensor(tp: Transport, out: torch.Tensor, inp: torch.Tensor, op="sum") -> Pending:
    red = semantics.parse_reduction(op, "reduce_scatter_tensor")
    semantics.check_reduction("reduce_scatter_tensor", red, inp.dtype)
    semantics.check_reduce_scatter("reduce_scatter_tensor", out, inp, tp.size)
    if out.numel() == 0:
        return Pending()  # nothing to send: complete at once
    inp = _contig_in(inp).reshape((-1,) + tuple(out.shape[1:]))  # the stacked input form as its concatenation
    return _with_contig_out(out, lambda o: _rs(tp, o, inp, red))


@_entry
def reduce_scatter_tensor_coalesced(tp: Transport, outs: Sequence[torch.Tensor], inps: Sequence[torch.Tensor],
                             op="sum") -> Pending:
    """One flat buffer per dtype (each input's n chunks interleaved rank-major), one reduce_scatter each."""
    red = semantics.parse_reduction(op, "reduce_scatter_tensor_coalesced")
    if len(outs) != len(inps):
        raise ValueError(f"funcoll.reduce_scatter_tensor_coalesced: {len(outs)} outputs for {len(inps)} inputs")
    for o, i in zip(outs, inps):
        semantics.check_reduction("reduce_scatter_tensor_coalesced", red, i.dtype)
        semantics.check_reduce_scatter("reduce_scatter_tensor_coalesced", o, i, tp.size)
    n = tp.size
    pendings = []
    for os_, ins in _by_dtype_pairs(outs, inps):
        if len(ins) == 1:
            src = _contig_in(ins[0])
            pendings.append(_with_contig_out(os_[0], lambda o, i=src: _rs(tp, o, i, red)))  # type: ignore[misc]
            continue
        _note(f"flat buffer of {len(ins)} {ins[0].dtype} tensors")
        flat = torch.cat([i.reshape(n, -1) for i in ins], dim=1).reshape(-1)
        res = flat.new_empty((flat.numel() // n,))

        def unflatten(os_=os_, res=res):
            off = 0
            for o in os_:
                o.copy_(res[off:off + o.numel()].view(o.shape))
                off += o.numel()

        pendings.append(_rs(tp, res, flat, red).and_then(unflatten))
    return Pending(pendings)


# ---------------------------------------------------------------------------------------------------
# all_to_all
# ---------------------------------------------------------------------------------------------------
def _a2a_even(tp: Transport, out: torch.Tensor, inp: torch.Tensor) -> Pending:
    caps, n = tp.caps, tp.size
    if caps.has("all_to_all"):
        return Pending([tp.all_to_all(_bits(out, caps), _bits(inp, caps), None, None)])
    # no all_to_all for this group (XLA, replica groups of mixed sizes): gather everything, keep this rank's column
    _note("all_to_all=all_gather+select")
    rows = inp.shape[0] // n
    g = inp.new_empty((n * inp.shape[0],) + tuple(inp.shape[1:]))
    return _ag(tp, g, inp).and_then(lambda: out.copy_(
        g.view((n, n, rows) + tuple(inp.shape[1:])).index_select(1, tp.rank_index(g)).reshape(out.shape)))


def _agree(tp: Transport, values: Sequence[int]) -> torch.Tensor:
    """Gathers a few int64 values from every rank: returns an [n, len(values)] tensor (CPU)."""
    mine = torch.tensor(list(values), dtype=torch.int64)
    dev = getattr(tp, "control_device", None)
    if dev is not None:
        mine = mine.to(dev)
    g = mine.new_empty((tp.size * mine.numel(),))
    _ag(tp, g, mine).wait()
    return g.view(tp.size, -1).cpu()


def _offsets(splits):
    offs, o = [], 0
    for s in splits:
        offs.append(o)
        o += s
    return offs


def _a2a(tp: Transport, out: torch.Tensor, inp: torch.Tensor, out_splits, in_splits, given: bool) -> Pending:
    caps = tp.caps
    if not given:
        return _a2a_even(tp, out, inp)
    if caps.uneven_all_to_all:
        return Pending([tp.all_to_all(_bits(out, caps), _bits(inp, caps), out_splits, in_splits)])
    # Split sizes were given and the backend has no uneven all_to_all: every rank takes this path (a rank cannot
    # know locally that the others are even) and pads every split to one size: a bound every rank promised, else
    # the largest split, agreed on with a tiny all_gather.
    if caps.has("send_recv") and caps.p2p_any_shape and tp.split_bound() is None:
        _note("uneven all_to_all=pairwise send/recv")
        return _pairwise_a2a(tp, out, inp, out_splits, in_splits)
    local = out_splits + in_splits
    bound = tp.split_bound()
    if bound is not None:
        if max(local) > bound:
            raise ValueError(f"funcoll.all_to_all_single: a split size ({max(local)}) exceeds the static split "
                             f"bound {bound} promised by funcoll.xla.static_split_bound; raise the bound")
        _note(f"uneven all_to_all=pad to static bound {bound}+even all_to_all+unpad")
        return _padded_a2a(tp, out, inp, out_splits, in_splits, bound)
    agreed = tp.agreed([max(local), -min(local)]) if tp.virtual else None  # funcoll.replicas knows every rank's
    if tp.virtual and agreed is None:
        world = getattr(tp, "world_size", "?")
        raise ValueError(
            f"funcoll.all_to_all_single: split sizes on a virtual XLA world ({world} ranks in a "
            f"process whose XLA runtime has fewer replicas) need a static bound: wrap the call in "
            f"funcoll.xla.static_split_bound(bound). Without one, the ranks agree on the largest "
            f"split with a collective that must run, and a virtual world cannot run collectives")
    if agreed is None:
        agreed = _agree(tp, [max(local), -min(local)])
    chunk, smallest = int(agreed[:, 0].max()), -int(agreed[:, 1].max())
    if chunk == smallest:
        _note("splits even on every rank: even all_to_all")
        return _a2a_even(tp, out, inp)
    _note(f"uneven all_to_all=pad to {chunk}+even all_to_all+unpad")
    return _padded_a2a(tp, out, inp, out_splits, in_splits, chunk)


_A2A_TAG = 0x46430000  # funcoll's own point-to-point tag, apart from users' send/recv tags


def _sends_first(rank: int, k: int, n: int) -> bool:
    """In round ``k`` of a pairwise exchange (send to rank+k, receive from rank-k), whether this rank sends before it
    receives: alternating along each cycle of x -> x+k, so that no cycle of ranks all send first and wait on each
    other (a transport whose large sends wait for the matching receive cannot deadlock)."""
    g = math.gcd(n, k)
    cycle = n // g
    pos = ((rank - rank % g) // g * pow(k // g, -1, cycle)) % cycle if cycle > 1 else 0
    return pos % 2 == 0


def _pairwise_a2a(tp: Transport, out, inp, out_splits, in_splits) -> Pending:
    """Uneven all_to_all as n-1 rounds of one send and one receive per rank, each message exactly its split: the
    bytes of a native alltoallv, no agreement, no padding."""
    n, r, caps = tp.size, tp.rank, tp.caps
    if out_splits[r] != in_splits[r]:
        raise ValueError(f"funcoll.all_to_all_single: this rank sends itself {in_splits[r]} rows "
                         f"(input_split_sizes[{r}]) but expects {out_splits[r]} (output_split_sizes[{r}])")
    ioff, ooff = _offsets(in_splits), _offsets(out_splits)
    if in_splits[r]:
        out[ooff[r]:ooff[r] + out_splits[r]].copy_(inp[ioff[r]:ioff[r] + in_splits[r]])
    handles = []
    for k in range(1, n):
        dst, src = (r + k) % n, (r - k) % n

        def send(dst=dst):
            if in_splits[dst]:
                handles.append(tp.send(_bits(inp[ioff[dst]:ioff[dst] + in_splits[dst]], caps), dst, _A2A_TAG))

        def recv(src=src):
            if out_splits[src]:
                handles.append(tp.recv(_bits(out[ooff[src]:ooff[src] + out_splits[src]], caps), src, _A2A_TAG))

        first, second = (send, recv) if _sends_first(r, k, n) else (recv, send)
        first()
        second()
    return Pending(handles)


def _padded_a2a(tp: Transport, out, inp, out_splits, in_splits, chunk: int) -> Pending:
    """Every split padded to ``chunk`` rows, one even all_to_all, the padding cut off (pieces joined with cat: no
    writes into slices, which a lazy transport would have to replay)."""
    rest = tuple(inp.shape[1:])
    pieces = []
    for off, s in zip(_offsets(in_splits), in_splits):
        piece = inp[off:off + s]
        if s < chunk:
            piece = torch.cat([piece, piece.new_zeros((chunk - s,) + rest)])
        pieces.append(piece)
    padded = torch.cat(pieces)
    recv = padded.new_empty(padded.shape)

    def unpad():
        outs = [recv[j * chunk:j * chunk + s] for j, s in enumerate(out_splits) if s]
        if outs:
            out.copy_(torch.cat(outs) if len(outs) > 1 else outs[0])

    return _a2a_even(tp, recv, padded).and_then(unpad)


@_entry
def all_to_all_single(tp: Transport, out: torch.Tensor, inp: torch.Tensor, output_split_sizes=None,
               input_split_sizes=None) -> Pending:
    given = bool(output_split_sizes) or bool(input_split_sizes)
    out_splits, in_splits = semantics.check_all_to_all("all_to_all_single", out, inp, output_split_sizes,
                                               input_split_sizes, tp.size)
    if given and not tp.caps.uneven_all_to_all and len(set(out_splits + in_splits)) == 1:
        # split sizes that are all equal are the even exchange, whether a rank passes them or not: a rank passing
        # [k, k] and one passing none take the same plan (the plan must not read what only one rank chose)
        given = False
    inp = _contig_in(inp)
    return _with_contig_out(out, lambda o: _a2a(tp, o, inp, out_splits, in_splits, given))


# ---------------------------------------------------------------------------------------------------
# broadcast, reduce, gather, scatter
# ---------------------------------------------------------------------------------------------------
def _bc(tp: Transport, t: torch.Tensor, src: int) -> Pending:
    caps = tp.caps
    if caps.has("broadcast"):
        return Pending([tp.broadcast(_bits(t, caps), src)])
    # No native broadcast (XLA): one all-reduce of the tensor kept on src, the identity on every other rank; exact
    # for every value, in the tensor's own dtype, and the same program on every rank (the mask is device data)
    _note("broadcast=masked all_reduce")
    b = _summable(t, caps)
    return _masked_sum(tp, b, tp.rank_is(src, b), b.copy_)


@_entry
def broadcast(tp: Transport, tensor: torch.Tensor, src: int) -> Pending:
    semantics.check_root("broadcast", "src", src, tp.size)
    if tensor.numel() == 0:
        return Pending()  # nothing to send: complete at once
    return _with_contig_out(tensor, lambda t: _bc(tp, t, src))


@_entry
def reduce(tp: Transport, tensor: torch.Tensor, dst: int, op="sum") -> Pending:
    """The result lands in ``tensor`` on ``dst``; other ranks' tensors are left unchanged."""
    red = semantics.parse_reduction(op, "reduce")
    semantics.check_reduction("reduce", red, tensor.dtype)
    semantics.check_root("reduce", "dst", dst, tp.size)
    if tensor.numel() == 0:
        return Pending()  # nothing to send: complete at once
    steps = planner.plan(tp.caps, "reduce", red.op, tensor.dtype, tp.size).steps
    if steps[0].kind == planner.NATIVE:
        if tp.rank == dst:
            return _with_contig_out(tensor, lambda t: Pending([tp.reduce(t, dst, red)]))
        return Pending([tp.reduce(tensor.contiguous().clone() if not tensor.is_contiguous() else tensor.clone(),
                                  dst, red)])
    _note(steps[0].note)  # reduce=all_reduce: the all_reduce plan, the result kept on dst
    if tp.rank == dst:
        return _with_contig_out(tensor, lambda t: _run_ar(tp, t, red, steps[1:]))
    work = tensor.clone(memory_format=torch.contiguous_format)
    p = _run_ar(tp, work, red, steps[1:])
    tp.retain(work)  # nobody reads it here, but the collective must run on this rank too
    return p


@_entry
def gather(tp: Transport, outs: Optional[Sequence[torch.Tensor]], inp: torch.Tensor, dst: int) -> Pending:
    semantics.check_root("gather", "dst", dst, tp.size)
    if tp.rank == dst:
        semantics.check_root_list("gather", "output", outs, inp, tp.size)
    inp = _contig_in(inp)
    caps = tp.caps
    outs = list(outs) if tp.rank == dst and outs is not None else []
    # the plan reads only what every rank shares (the backend, the dtype): the root's output layout changes only
    # the root's own copies (a plan only the root could evaluate would run different exchanges on the ranks)
    if caps.has("gather") and caps.moves(inp.dtype):
        if tp.rank != dst:
            return Pending([tp.gather(None, inp, dst)])
        work = [_contig_in(o) if o.is_contiguous() else o.new_empty(o.shape) for o in outs]
        p = Pending([tp.gather(work, inp, dst)])
        staged = [(o, w) for o, w in zip(outs, work) if w is not o]
        return p.and_then(lambda: [o.copy_(w) for o, w in staged]) if staged else p
    _note("gather=all_gather")
    flat = _flat(inp)
    g = flat.new_empty((tp.size * flat.shape[0],) + tuple(flat.shape[1:]))

    def place():
        if tp.rank == dst:
            for o, row in zip(outs, g.view((tp.size,) + tuple(flat.shape)).unbind(0)):
                o.copy_(row.view(o.shape))

    p = _ag(tp, g, flat)
    if tp.rank != dst:
        tp.retain(g)  # nobody reads it here, but the collective must run on this rank too
    return p.and_then(place)


@_entry
def scatter(tp: Transport, out: torch.Tensor, inps: Optional[Sequence[torch.Tensor]], src: int) -> Pending:
    semantics.check_root("scatter", "src", src, tp.size)
    if tp.rank == src:
        semantics.check_root_list("scatter", "input", inps, out, tp.size)
    caps = tp.caps
    if caps.has("scatter") and caps.moves(out.dtype):
        ins = [_contig_in(t) for t in inps] if tp.rank == src and inps is not None else None
        return _with_contig_out(out, lambda o: Pending([tp.scatter(o, ins, src)]))
    _note("scatter=broadcast+slice")
    buf = out.new_empty((tp.size,) + tuple(out.shape))
    if tp.rank == src and inps is not None:
        torch.stack(list(inps), out=buf)
    return _bc(tp, buf, src).and_then(lambda: out.copy_(buf[tp.rank]))


# ---------------------------------------------------------------------------------------------------
# point-to-point and barrier
# ---------------------------------------------------------------------------------------------------
@_entry
def send(tp: Transport, tensor: torch.Tensor, dst: int, tag: int = 0) -> Pending:
    semantics.check_root("send", "dst", dst, tp.size)
    if dst == tp.rank:
        raise ValueError(f"funcoll.send: dst={dst} is the calling rank; send to another rank")
    return Pending([tp.send(_bits(_contig_in(tensor), tp.caps), dst, tag)])


@_entry
def recv(tp: Transport, tensor: torch.Tensor, src: int, tag: int = 0) -> Pending:
    semantics.check_root("recv", "src", src, tp.size)
    if src == tp.rank:
        raise ValueError(f"funcoll.recv: src={src} is the calling rank; receive from another rank")
    p = _with_contig_out(tensor, lambda t: Pending([tp.recv(_bits(t, tp.caps), src, tag)]))
    p._source = src
    return p


@_entry
def barrier(tp: Transport) -> Pending:
    if tp.caps.has("barrier"):
        return Pending([tp.barrier()])
    _note("barrier=all_reduce of one element")
    dev = getattr(tp, "control_device", None) or "cpu"
    one = torch.zeros(1, dtype=torch.int32, device=dev)
    p = _ar(tp, one, Reduction(R.SUM))
    tp.retain(one)
    return p


# ---------------------------------------------------------------------------------------------------
# list forms of the eager API (allgather, reduce_scatter, alltoall with tensor lists)
# ---------------------------------------------------------------------------------------------------
@_entry
def all_gather(tp: Transport, outs: Sequence[torch.Tensor], inp: torch.Tensor) -> Pending:
    """``dist.all_gather``: every rank's ``inp`` lands in ``outs[rank]``."""
    if len(outs) != tp.size:
        raise ValueError(f"funcoll.all_gather: expected {tp.size} output tensors, got {len(outs)}")
    for i, o in enumerate(outs):
        semantics.check_same_tensor("all_gather", f"output[{i}]", o, inp, inp.shape)
    flat = _flat(_contig_in(inp)).reshape(-1)
    g = flat.new_empty((tp.size * flat.numel(),))

    def place():
        for o, row in zip(outs, g.view(tp.size, -1).unbind(0)):
            o.copy_(row.view(o.shape))

    return _ag(tp, g, flat).and_then(place)


@_entry
def reduce_scatter(tp: Transport, out: torch.Tensor, inps: Sequence[torch.Tensor], op="sum") -> Pending:
    """``dist.reduce_scatter``: ``inps[r]`` of every rank is reduced into ``out`` on rank r."""
    red = semantics.parse_reduction(op, "reduce_scatter")
    semantics.check_reduction("reduce_scatter", red, out.dtype)
    if len(inps) != tp.size:
        raise ValueError(f"funcoll.reduce_scatter: expected {tp.size} input tensors, got {len(inps)}")
    for i, t in enumerate(inps):
        semantics.check_same_tensor("reduce_scatter", f"input[{i}]", t, out, out.shape)
    if out.numel() == 0:
        return Pending()  # nothing to send: complete at once
    flat = torch.cat([t.reshape(-1) for t in inps])
    return _with_contig_out(out, lambda o: _rs(tp, o.view(-1), flat, red))


@_entry
def all_to_all(tp: Transport, outs: Sequence[torch.Tensor], inps: Sequence[torch.Tensor]) -> Pending:
    """``dist.all_to_all``: ``inps[j]`` goes to rank j and lands in its ``outs[rank]``; sizes may differ."""
    n = tp.size
    if len(outs) != n or len(inps) != n:
        raise ValueError(f"funcoll.all_to_all: expected {n} output and {n} input tensors, "
                         f"got {len(outs)} and {len(inps)}")
    dtype = inps[0].dtype
    for t in list(inps) + list(outs):
        if t.dtype != dtype:
            raise TypeError(f"funcoll.all_to_all: all tensors must have dtype {dtype}, found {t.dtype}")
    flat_in = torch.cat([t.reshape(-1) for t in inps])
    out_splits = [o.numel() for o in outs]
    flat_out = flat_in.new_empty((sum(out_splits),))
    in_splits = [t.numel() for t in inps]

    def place():
        for o, off, s in zip(outs, _offsets(out_splits), out_splits):
            o.copy_(flat_out[off:off + s].view(o.shape))

    return _a2a(tp, flat_out, flat_in, out_splits, in_splits, True).and_then(place)
