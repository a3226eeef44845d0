"""The transport layer: the primitives one device/backend really has, and a ``Capabilities`` value that says
which of them are native.

A transport never fills a gap: when the algorithms ask it for something its capabilities do not list, that
is a bug in funcoll. Under ``FUNCOLL_COUNT_CALLS=1`` (the test suite's switch, docs/testing.md) a transport checks
every primitive against its capabilities, raising :class:`NativeRefused` instead of sending anything, and counts the
native calls it makes in :attr:`Transport.calls`; without it a primitive goes to the backend with neither.

Capability facts live in one table per device, each with its source: gloo's and XLA's here (``PROFILES``), XCCL's
in :mod:`funcoll.transport.xpu` (``PROFILES["xccl"]`` is derived from it), TorchTPU's in :mod:`funcoll.transport.tpu`
(``PROFILES["torchtpu"]``). ``FUNCOLL_PROFILE=<name>`` intersects the running transport's own capabilities with a
named profile, so that, e.g., the XCCL gap-filling paths run for real over gloo on any CPU machine.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import importlib
import os
import threading
from dataclasses import dataclass, field, fields, replace
from typing import Any, Callable, Dict, Iterable, Mapping, NamedTuple, Optional, Sequence, Tuple, TypeVar

import torch

from funcoll.semantics import FLOAT4, FLOAT8, FLOAT_DTYPES, INTEGER_DTYPES, ReduceOp, Reduction

__all__ = ["Capabilities", "Handle", "wait_quietly", "Done", "Transport", "NativeRefused", "Native", "PROFILES",
           "profile", "active_profile_name", "P2P"]

# Primitive names a transport may offer natively.
PRIMITIVES = ("all_reduce", "all_reduce_coalesced", "all_gather", "reduce_scatter", "all_to_all",
              "broadcast", "reduce", "gather", "scatter", "send_recv", "barrier")
REDUCING = ("all_reduce", "all_reduce_coalesced", "reduce_scatter", "reduce")

ALL_DTYPES = INTEGER_DTYPES | FLOAT_DTYPES | {torch.bool} | FLOAT8 | FLOAT4


class NativeRefused(RuntimeError):
    """Raised by a transport asked for something its capabilities do not list (a funcoll bug)."""


_Caps = TypeVar("_Caps", bound="Capabilities")


@dataclass(frozen=True)
class Capabilities:
    """What one backend does natively."""

    name: str
    primitives: frozenset  # native primitives (names from PRIMITIVES)
    reduce_ops: frozenset  # reduce ops any reducing primitive accepts natively
    dtypes: frozenset  # dtypes the backend moves at all (non-reducing ops)
    reduce_dtypes: frozenset  # dtypes the backend reduces
    # (reduce op, dtype) pairs that are refused even though the op and the dtype are native:
    # e.g. integer MIN/MAX on XCCL, AVG on integers on gloo.
    refused_pairs: frozenset = frozenset()
    uneven_all_to_all: bool = True
    is_async: bool = True
    # point-to-point messages of sizes that differ per pair (False on XLA: every rank must build the same program)
    p2p_any_shape: bool = True
    sources: Mapping[str, str] = field(default_factory=dict, compare=False)
    # (primitive, reduce op) pairs refused on that primitive only (XCCL: AVG on reduce; PREMUL_SUM on reduce_scatter,
    # whose input ProcessGroupXCCL would scale in place)
    refused_on: frozenset = frozenset()
    # the backend's list forms serve a size per rank: all_gather's outputs (ProcessGroupXCCL, ProcessGroupNCCL: one
    # broadcast per rank) and reduce_scatter's per-destination inputs (gloo: one all_reduce per destination; XCCL, NCCL:
    # one reduce per destination); False: funcoll fills them (funcoll.algorithms.move.all_gather, reduce.reduce_scatter)
    uneven_all_gather: bool = False
    uneven_reduce_scatter: bool = False

    def has(self, primitive: str) -> bool:
        return primitive in self.primitives

    def moves(self, dtype: torch.dtype) -> bool:
        return dtype in self.dtypes

    def reduces(self, primitive: str, op: ReduceOp, dtype: torch.dtype) -> bool:
        return (primitive in self.primitives and op in self.reduce_ops and dtype in self.reduce_dtypes
                and (op, dtype) not in self.refused_pairs and (primitive, op) not in self.refused_on)

    def restrict(self: _Caps, other: "Capabilities") -> _Caps:
        """What both can do natively (a transport run under another backend's profile): the sets of what is native
        intersect, the ``refused`` sets unite, a flag holds where it holds for both; the rest is ``self``'s (its
        ``is_async``, a fact table's versions)."""
        both: Dict[str, Any] = {}
        for f in fields(Capabilities):
            mine, theirs = getattr(self, f.name), getattr(other, f.name)
            if isinstance(mine, frozenset):
                both[f.name] = mine | theirs if f.name.startswith("refused") else mine & theirs
            elif isinstance(mine, bool) and f.name != "is_async":
                both[f.name] = mine and theirs
        return replace(self, name=f"{self.name}[{other.name}]" if other.name != self.name else self.name,
                       sources={**self.sources, **other.sources}, **both)


def _pairs(ops: Iterable[ReduceOp], dtypes: Iterable[torch.dtype]) -> frozenset:
    return frozenset((o, d) for o in ops for d in dtypes)


_GLOO_DTYPES = frozenset({torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.int8,
                          torch.uint8, torch.int32, torch.int64, torch.bool})

# The capability table of gloo and XLA. Each fact has a source: "probe" means measured on torch 2.9.0 (funcoll.probe
# re-checks them on the running torch); docs/design.md section 1 collects the XLA facts. XCCL's facts live in one table,
# funcoll.transport.xpu.XCCL_FACTS; its profile here is derived from them (see _Profiles).
_STATIC_PROFILES: Dict[str, Capabilities] = {
    "gloo": Capabilities(
        name="gloo",
        primitives=frozenset({"all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast",
                              "reduce", "gather", "scatter", "send_recv", "barrier"}),
        reduce_ops=frozenset({ReduceOp.SUM, ReduceOp.AVG, ReduceOp.PRODUCT, ReduceOp.MIN, ReduceOp.MAX, ReduceOp.BAND,
                              ReduceOp.BOR, ReduceOp.BXOR}),
        dtypes=_GLOO_DTYPES,
        reduce_dtypes=_GLOO_DTYPES,
        refused_pairs=(_pairs([ReduceOp.AVG], INTEGER_DTYPES | {torch.bool})
                       | _pairs([ReduceOp.BAND, ReduceOp.BOR, ReduceOp.BXOR], FLOAT_DTYPES)),
        uneven_reduce_scatter=True,
        sources={
            "gloo.uneven_lists": "ProcessGroupGloo::reduce_scatter (the list form) is one all_reduce per destination "
                                 "of that destination's input, so per-destination sizes are served (it checks only "
                                 "this rank's own input against its output, dtype and sizes: TORCH_CHECK_EQ, an abort "
                                 "on 2.9.0, a RuntimeError on 2.15.0); ProcessGroupGloo::allgather asserts one size "
                                 "for every output ('invalid tensor size'); pytorch/pytorch torch/csrc/distributed/"
                                 "c10d/ProcessGroupGloo.cpp (v2.9.0 = 0fabc3ba, v2.15.0 = d0f2af8b), measured on both",
            "gloo.dtypes": "probe: int16/uint16/uint32/uint64/float8 raise 'Invalid scalar type' (torch 2.9.0)",
            "gloo.avg": "probe: AVG works for floating dtypes, raises for integers (torch 2.9.0)",
            "gloo.premul_sum": "gloo has no PREMUL_SUM (ProcessGroupGloo.cpp, torch 2.9.0)",
            "gloo.coalesced": "ProcessGroupGloo exposes allreduce_coalesced only; no "
                              "allgather_into_tensor_coalesced / reduce_scatter_tensor_coalesced (probe)",
        },
    ),
    "xla": Capabilities(
        name="xla",
        primitives=frozenset({"all_reduce", "all_reduce_coalesced", "all_gather", "reduce_scatter",
                              "all_to_all", "send_recv"}),
        reduce_ops=frozenset({ReduceOp.SUM, ReduceOp.PRODUCT, ReduceOp.MIN, ReduceOp.MAX, ReduceOp.BAND, ReduceOp.BOR}),
        dtypes=INTEGER_DTYPES | FLOAT_DTYPES | {torch.bool},  # every dtype but float8 and float4
        reduce_dtypes=INTEGER_DTYPES | FLOAT_DTYPES | {torch.bool},
        refused_pairs=_pairs([ReduceOp.BAND, ReduceOp.BOR], FLOAT_DTYPES | INTEGER_DTYPES),
        uneven_all_to_all=False,
        is_async=False,
        p2p_any_shape=False,
        sources={
            "xla.p2p": "a collective-permute has one operand shape on every rank: uneven all_to_all cannot be sent "
                       "as per-pair messages of different sizes",
            "xla.bitwise": "XLA recognises and/or as all-reduce reductions only for PRED (collective_ops_utils "
                           "MatchReductionComputation): torch_xla builds an integer and/or all-reduce, but running "
                           "it fails with 'Unsupported reduction computation' (measured on the CPU PJRT runtime, "
                           "torch_xla 2.9), and the failed op stays chained to every later collective by the token",
            "xla.unsigned": "XLA all-reduce / reduce-scatter reduce u16/u32/u64 natively (sum, mul, min, max "
                            "measured on the CPU PJRT runtime, torch_xla 2.9); reducing them as the signed dtype "
                            "would need a dtype view, which torch_xla 2.9 runs as a CPU fallback "
                            "(aten::view_copy.dtype) with a device-to-host sync",
            "xla.reduce_ops": "cross_replica_reduces.cpp accepts sum/mul/and/or/min/max only (torch_xla 2.9)",
            "xla.a2a": "all_to_all_single split sizes must be equal (torch_xla 2.9, seed 003)",
            "xla.broadcast": "no broadcast lowering for _c10d_functional (torch_xla 2.9)",
            "xla.reduce_gather_scatter": "ProcessGroupXla runs a full collective plus a graph sync (docs/design.md)",
        },
    ),
}


class _Profiles(Mapping):
    """name -> Capabilities; a row that names a module (``"xccl"``, ``"torchtpu"``) is derived on first use from that
    module's fact table (its ``conservative_profile()``; importing it touches no device runtime)."""

    def __init__(self, rows: Dict[str, object]):
        self._rows = rows

    def __getitem__(self, name: str) -> Capabilities:
        row = self._rows[name]
        if isinstance(row, str):
            row = self._rows[name] = importlib.import_module(row).conservative_profile()
        return row  # type: ignore[return-value]

    def __iter__(self):
        return iter(sorted(self._rows))

    def __len__(self) -> int:
        return len(self._rows)


PROFILES: Mapping[str, Capabilities] = _Profiles({**_STATIC_PROFILES, "xccl": "funcoll.transport.xpu",
                                                  "torchtpu": "funcoll.transport.tpu"})


def profile(name: str) -> Capabilities:
    try:
        return PROFILES[name]
    except KeyError:
        known = ", ".join(sorted(PROFILES))
        raise ValueError(f"funcoll: unknown capability profile {name!r}; use one of {known}") from None


def active_profile_name() -> Optional[str]:
    """The profile named by ``FUNCOLL_PROFILE`` (None when unset or empty)."""
    name = os.environ.get("FUNCOLL_PROFILE", "").strip().lower()
    if not name or name in ("native", "none"):
        return None
    profile(name)  # validates
    return name


# An uneven all_to_all without a sync (XLA, TorchTPU): a split bound every rank promises, per thread.
_bound = threading.local()


@contextlib.contextmanager
def static_split_bound(bound: int):
    """Inside the block, an uneven ``all_to_all_single`` on XLA or TorchTPU pads every split to ``bound`` rows instead
    of agreeing on the largest split first (a tiny all-gather read back to the host: a device-to-host sync that bakes
    the other ranks' splits of the first call into a compiled graph; under TorchTPU's compile no rank may read a value
    back). Public as ``funcoll.xla.static_split_bound`` and ``funcoll.transport.tpu.static_split_bound``.

    ``bound`` is a promise made by *every* rank: no split, sent or received, on any rank, exceeds it. Each rank
    checks its own splits and raises ValueError if one does, but it cannot check the others' (a rank whose
    split exceeds the bound raises while its peers enter the collective). The all-to-all then moves
    ``group_size * bound`` rows per rank.

    On a virtual world (more funcoll ranks than XLA replicas, built to read HLO) split sizes need this bound:
    the agreement would have to run a collective, which a virtual world cannot (except under
    :func:`funcoll.replicas.capture`, which answers it from every rank's splits).
    """
    if not isinstance(bound, int) or isinstance(bound, bool) or bound < 1:
        raise ValueError(f"funcoll.static_split_bound: bound must be a positive int, got {bound!r}")
    prev = getattr(_bound, "value", None)
    _bound.value = bound
    try:
        yield bound
    finally:
        _bound.value = prev


# The eager entry's hook before the first byte of a collective is sent (funcoll.debug: the call gets its sequence
# number there and, in debug mode, the cross-rank fingerprint check runs), per thread, consumed once. Everything
# the algorithms validate has been validated by then, so a rejected request neither sends nor counts.
_before_send = threading.local()
_grad_enabled = torch.is_grad_enabled
_set_grad_enabled = torch._C._set_grad_enabled


def before_send(fn: Optional[Callable[[], None]]) -> None:
    """Sets (or clears, with None) this thread's hook to run once before the next primitive sends anything."""
    _before_send.fn = fn


def _run_before_send() -> None:
    fn = getattr(_before_send, "fn", None)
    if fn is not None:
        _before_send.fn = None
        fn()


class P2P(NamedTuple):
    """One operation of a group of point-to-point operations (:meth:`Transport.p2p_group`): a send of ``tensor`` to
    group rank ``peer`` (``send`` True) or a receive into it from ``peer``, with the user's ``tag``."""

    send: bool
    tensor: torch.Tensor
    peer: int
    tag: int = 0


class Handle:
    """What a primitive returns: something to wait on. A backend's Work returned as one also serves ``get_future()``
    (a c10d transport wraps one without a future of its own: :func:`funcoll.transport.c10d.waited`)."""

    def wait(self, timeout=None) -> None:  # pragma: no cover - interface
        """Blocks until done; ``timeout`` (a timedelta), when given, bounds the wait."""
        raise NotImplementedError

    def is_completed(self) -> bool:
        return True


def wait_quietly(h, timeout=None) -> None:
    """``h.wait()`` (``h.wait(timeout)`` when given) with autograd off on this thread: a backend may write its
    outputs inside ``wait()`` (gloo's reduce_scatter copies its slice then), and autograd must not record that write
    on an output that already has a history (it would cut the output from its backward)."""
    if not _grad_enabled():
        h.wait() if timeout is None else h.wait(timeout)
        return
    _set_grad_enabled(False)
    try:
        h.wait() if timeout is None else h.wait(timeout)
    finally:
        _set_grad_enabled(True)


class Done(Handle):
    """A primitive that has already completed (or is lazy, as on XLA)."""

    def wait(self, timeout=None) -> None:
        return None


DONE = Done()


def _counted(issue: Callable, calls: collections.Counter, key: tuple) -> Callable:
    """``issue``, each call counted under ``key`` in ``calls`` (under FUNCOLL_COUNT_CALLS=1)."""
    @functools.wraps(issue)  # __wrapped__: the backend's own method
    def counted(*args):
        calls[key] += 1
        return issue(*args)
    return counted


class Native:
    """A request the transport's backend serves natively and unchanged (the eager fast path): ``issue`` is the
    backend's own method of the same name as the eager ProcessGroup method (called with the caller's arguments;
    counted in :attr:`Transport.calls` under ``calls_key`` when the transport counts); ``cpu``: the request's tensors
    are CPU tensors; ``caps`` and ``cls``: the capabilities and transport class it was made under (an answer under
    others is stale)."""

    __slots__ = ("caps", "cls", "issue", "cpu")

    def __init__(self, tp: "Transport", issue: Callable, calls_key: tuple):
        self.caps, self.cls = tp.caps, type(tp)
        self.issue = _counted(issue, tp.calls, calls_key) if tp.counting else issue
        self.cpu = tp.device_type == "cpu"


class Transport:
    """The primitives of one backend for one group (ranks are group-local): each is asked only for what its
    capabilities list, a subclass implements its ``_`` method; reducing ones work in place or into a given output."""

    device_type: str = "cpu"
    # the group this transport serves, as its log lines and profiler events name it: set by the funcoll group that
    # made it (and again when that group is named later), or by the registry for one lent by another backend's group
    group_name: str = ""
    global_ranks: Tuple[int, ...] = ()

    def __init__(self, rank: int, size: int, caps: Capabilities):
        self.rank = rank
        self.size = size
        self.table = self.caps = caps  # the table it was made with, and what this group reads of it (the same here)
        # (primitive, reduce op or "", dtype) -> the native calls made, under FUNCOLL_COUNT_CALLS=1 (else empty):
        # tests read it to prove which path ran (docs/testing.md); read when the transport is made
        self.counting = os.environ.get("FUNCOLL_COUNT_CALLS") == "1"
        self.calls: collections.Counter = collections.Counter()
        self._ar_forms: Dict[tuple, object] = {}  # (op, dtype) -> the backend's form of the op

    def _all_reduce_form(self, red: Reduction, dtype: torch.dtype, form: Callable[[Reduction], object]):
        """``form(red)``, made once per (op, dtype) for an ``all_reduce_functional`` override (the backend's own form
        of the op: c10d options, XLA's op name), and the native call counted when the transport counts."""
        if self.counting:
            self.calls[("all_reduce", str(red.op), dtype)] += 1
        key = (red.op, dtype)
        got = self._ar_forms.get(key)
        if got is None:
            got = self._ar_forms[key] = form(red)
        return got

    def use_table(self, table: Capabilities) -> None:
        """Replaces the capabilities table (the probe's verified one); a transport whose group narrows the table
        (XLA's, by its replica groups) narrows the new one."""
        self.table = self.caps = table

    def abort(self) -> None:
        """Ends the transport's in-flight primitives at once (each fails), for good: the group is aborted. A transport
        with nothing in flight outside the caller's thread (XLA's lazy ops) has nothing to do."""

    def shutdown(self) -> None:
        """Releases the backend (``destroy_process_group``); nothing is in flight."""

    # -- the eager fast path: the backend's own callable for a request -------------------------------------
    def native_method(self, primitive: str, op: str, dtype: Optional[torch.dtype], method: str) -> Optional[Native]:
        """A :class:`Native` calling the backend's own ``method`` (the eager ProcessGroup method's name) for a native
        ``primitive`` request, counted under ``(primitive, op, dtype)``; None where the transport has no backend
        method to hand it to (the default)."""
        return None

    # -- before a primitive sends, shared by every transport ----------------------------------------------
    def _native(self, primitive: str, dtype: Optional[torch.dtype], op: Optional[ReduceOp] = None,
                uneven: bool = False) -> None:
        """Runs this thread's before-send hook (:func:`before_send`); when the transport counts, first checks the
        request against the capabilities, and after the hook counts it."""
        if self.counting:
            self._check(primitive, dtype, op, uneven)
        fn = getattr(_before_send, "fn", None)  # _run_before_send, written out: every primitive runs it
        if fn is not None:
            _before_send.fn = None
            fn()
        if self.counting:
            self.calls[(primitive, str(op) if op is not None else "", dtype)] += 1

    def _check(self, primitive: str, dtype: Optional[torch.dtype], op: Optional[ReduceOp], uneven: bool) -> None:
        caps = self.caps
        ok = primitive in caps.primitives and (dtype is None or dtype in caps.dtypes)
        if ok and op is not None:
            ok = caps.reduces(primitive, op, dtype)  # type: ignore[arg-type]  # a reducing primitive has a dtype
        if ok and uneven:
            ok = caps.uneven_all_to_all
        if not ok:
            what = f"{primitive}({op}, {dtype})" if op is not None else f"{primitive}({dtype})"
            raise NativeRefused(f"funcoll internal error: {caps.name} transport was asked for native "
                                f"{what}{' with uneven splits' if uneven else ''}, which it does not have")

    # -- the primitives --------------------------------------------------------------------------
    def all_reduce(self, t: torch.Tensor, red: Reduction) -> Handle:
        self._native("all_reduce", t.dtype, red.op)
        return self._all_reduce(t, red)

    def all_reduce_functional(self, t: torch.Tensor, red: Reduction):
        """``(result, handle)``: the all-reduce of contiguous ``t`` into a new tensor (``t`` is left as it is). A
        transport whose native op is functional (XLA) overrides it to skip the copy."""
        out = t.clone(memory_format=torch.contiguous_format)
        return out, self.all_reduce(out, red)

    def all_reduce_coalesced(self, ts: Sequence[torch.Tensor], red: Reduction) -> Handle:
        for t in ts:
            self._native("all_reduce_coalesced", t.dtype, red.op)
        return self._all_reduce_coalesced(ts, red)

    def all_gather(self, out: torch.Tensor, inp: torch.Tensor) -> Handle:
        self._native("all_gather", inp.dtype)
        return self._all_gather(out, inp)

    def reduce_scatter(self, out: torch.Tensor, inp: torch.Tensor, red: Reduction) -> Handle:
        self._native("reduce_scatter", inp.dtype, red.op)
        return self._reduce_scatter(out, inp, red)

    def all_to_all(self, out: torch.Tensor, inp: torch.Tensor, out_splits: Optional[list],
                   in_splits: Optional[list]) -> Handle:
        self._native("all_to_all", inp.dtype, uneven=out_splits is not None)
        return self._all_to_all(out, inp, out_splits, in_splits)

    def broadcast(self, t: torch.Tensor, src: int) -> Handle:
        self._native("broadcast", t.dtype)
        return self._broadcast(t, src)

    def reduce(self, t: torch.Tensor, dst: int, red: Reduction) -> Handle:
        self._native("reduce", t.dtype, red.op)
        return self._reduce(t, dst, red)

    def gather(self, outs: Optional[list], inp: torch.Tensor, dst: int) -> Handle:
        self._native("gather", inp.dtype)
        return self._gather(outs, inp, dst)

    def scatter(self, out: torch.Tensor, inps: Optional[list], src: int) -> Handle:
        self._native("scatter", out.dtype)
        return self._scatter(out, inps, src)

    def send(self, t: torch.Tensor, dst: int, tag: int = 0) -> Handle:
        self._native("send_recv", t.dtype)
        return self._send(t, dst, tag)

    def recv(self, t: torch.Tensor, src: int, tag: int = 0) -> Handle:
        self._native("send_recv", t.dtype)
        return self._recv(t, src, tag)

    def p2p_group(self, ops: Sequence["P2P"]) -> list:
        """One group of point-to-point operations, issued in the order given as the backend issues a group (here one
        operation after the other; XCCL: one oneCCL group); the handles to wait on."""
        for op in ops:
            self._native("send_recv", op.tensor.dtype)
        return self._p2p_group(ops)

    def _p2p_group(self, ops: Sequence["P2P"]) -> list:
        return [self._send(op.tensor, op.peer, op.tag) if op.send else self._recv(op.tensor, op.peer, op.tag)
                for op in ops]

    # -- rank-dependent values as data, and promises the algorithms may use -------------------------------
    # A lazy transport (XLA) must compile the same program on every rank: rank-dependent values reach the
    # algorithms as tensors (parameters of the computation), never as Python constants. Eager transports make them
    # on the tensor's device.
    virtual = False  # True: a world built in one process to read what it would compile; it cannot run collectives
    # a view of a tensor as another dtype of the same width is free (False on XLA: torch_xla 2.9 runs view.dtype as a
    # CPU fallback with a sync); strategies that could work in such a view then convert instead
    dtype_views = True
    # floating tensors are moved (all_gather, all_to_all) as the integers of their bits (XLA: XlaTransport says why)
    floats_as_integers = False
    # the largest widened temporary (bytes) a gap-filling strategy makes at once: a larger request is filled in pieces
    # of this size, each its own collectives (the same bytes in all), so its extra memory stays bounded. None: in one
    # piece (XLA: one collective per request in the graph; the compiler plans the memory)
    staging_bytes: Optional[int] = 8 << 20

    def gathered(self, values: torch.Tensor) -> torch.Tensor:
        """Every rank's ``values`` (a flat tensor of the same size everywhere) in rank order, gathered by the
        transport's own all_gather outside its hooks and counts: funcoll's size guard exchanges its digests over the
        CPU transport with it, before the collective it checks sends anything."""
        out = values.new_empty((self.size * values.numel(),))
        self._all_gather(out, values).wait()
        return out

    def bits_as(self, t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """``t``'s bits read as ``dtype`` (contiguous ``t``; an element size that divides or is a multiple of t's, as
        ``Tensor.view(dtype)`` allows), never converted and never read back to the host. Here a view; a lazy
        transport may return a new tensor of its graph (XLA: a bitcast-convert): writes into it need not reach ``t``."""
        return t.view(dtype)

    def agreed(self, values: Sequence[int]) -> Optional[torch.Tensor]:
        """What every rank's ``values`` gather to (an int64 CPU tensor [size, len(values)]) when the transport knows it
        without running a collective (a virtual XLA world whose ranks funcoll.replicas runs), else None."""
        return None

    def _like(self, t: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
        """``t`` made where ``like`` is (its device; XLA: also a functional tensor when ``like`` is one)."""
        return t.to(like.device)

    def rank_mask(self, like: torch.Tensor) -> torch.Tensor:
        """A bool vector of the group's size, True at this rank only, on ``like``'s device."""
        return self._like(torch.tensor([r == self.rank for r in range(self.size)]), like)

    def rank_is(self, root: int, like: torch.Tensor) -> torch.Tensor:
        """A bool scalar, True on group rank ``root`` only, on ``like``'s device."""
        return torch.tensor(self.rank == root).to(like.device)

    def rank_index(self, like: torch.Tensor) -> torch.Tensor:
        """``[rank]`` (int64), on ``like``'s device: selects this rank's block without a rank constant."""
        return self._like(torch.tensor([self.rank]), like)

    def split_bound(self) -> Optional[int]:
        """A bound on every split size of an uneven all_to_all that every rank has promised (this thread's innermost
        ``static_split_bound``; on every transport), or None: the ranks agree on their splits first."""
        return getattr(_bound, "value", None)

    def retain(self, t: torch.Tensor) -> None:
        """Keeps a result nobody reads (a non-root rank's share of reduce/gather) alive until the collective has run: a
        lazy transport (XLA) must, or this rank never runs the collective its peers wait for."""

    # the list forms of reduce_scatter and all_gather the backend has (c10d's ``reduce_scatter`` and ``allgather``
    # with tensor lists), by primitive; what ``reduce_scatter_list`` / ``all_gather_list`` may be asked for
    list_forms: frozenset = frozenset()

    def reduce_scatter_list(self, out: torch.Tensor, ins: Sequence[torch.Tensor], red: Reduction) -> Handle:
        """The backend's list reduce_scatter: ``ins[r]`` of every rank reduced into rank r's ``out`` (contiguous;
        ``out`` in ``ins[rank]``'s shape); sizes per destination may differ where the capabilities say so."""
        self._list_form("reduce_scatter", ins, self.caps.uneven_reduce_scatter)
        self._native("reduce_scatter", out.dtype, red.op)
        return self._reduce_scatter_list(out, ins, red)

    def all_gather_list(self, outs: Sequence[torch.Tensor], inp: torch.Tensor) -> Handle:
        """The backend's list all_gather: every rank's ``inp`` lands in ``outs[rank]`` (contiguous; ``outs[rank]`` in
        ``inp``'s shape); sizes per rank may differ where the capabilities say so."""
        self._list_form("all_gather", outs, self.caps.uneven_all_gather)
        self._native("all_gather", inp.dtype)
        return self._all_gather_list(outs, inp)

    def _list_form(self, primitive: str, ts: Sequence[torch.Tensor], uneven_ok: bool) -> None:
        if primitive not in self.list_forms or not (uneven_ok or len({t.numel() for t in ts}) <= 1):
            raise NativeRefused(f"funcoll internal error: {self.caps.name} transport was asked for its list "
                                f"{primitive} with sizes {[t.numel() for t in ts]}, which it does not have")

    def barrier(self) -> Handle:
        self._native("barrier", None)
        return self._barrier()

    # -- implemented by each transport, and called only for what its capabilities list ---------------------
    _all_reduce: Callable[..., Handle]
    _all_reduce_coalesced: Callable[..., Handle]
    _all_gather: Callable[..., Handle]
    _reduce_scatter: Callable[..., Handle]
    _all_to_all: Callable[..., Handle]
    _broadcast: Callable[..., Handle]
    _reduce: Callable[..., Handle]
    _gather: Callable[..., Handle]
    _scatter: Callable[..., Handle]
    _send: Callable[..., Handle]
    _recv: Callable[..., Handle]
    _barrier: Callable[..., Handle]
    _reduce_scatter_list: Callable[..., Handle]
    _all_gather_list: Callable[..., Handle]
