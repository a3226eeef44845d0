"""Local tensor steps the strategies share: contiguous staging, raw-bit views of dtypes a backend does not move (an MX
tensor's halves as uint8 from a move's first step: :func:`_mx_as_bytes`), the integers of exact masked sums, in-place
local reductions in rank order, integer division with truncation. Nothing here sends."""

from __future__ import annotations

import functools
import itertools
import math
from typing import Callable, Sequence

import torch

from funcoll.algorithms.observe import _tensors
from funcoll.algorithms.pending import Pending, _note
from funcoll.semantics import MX, OPS, ReduceOp

# dtypes with the same element size, tried in order to move raw bits: integers only (bits of other data seen as a
# float can be a NaN pattern, which a backend's NaN check rejects: XCCL's TORCH_XCCL_NAN_CHECK); else as bytes
_SAME_WIDTH = {1: (torch.uint8, torch.int8), 2: (torch.int16,), 4: (torch.int32,), 8: (torch.int64,)}


def _with_contig_out(t: torch.Tensor, run: Callable[[torch.Tensor], Pending]) -> Pending:
    """Runs ``run`` on a contiguous tensor and copies the result back into ``t`` when it was not."""
    if t.is_contiguous():
        return run(t)
    work = t.contiguous()
    return run(work).and_then(lambda: t.copy_(work))


def _with_contig_outs(ts: Sequence[torch.Tensor], run: Callable[[list], Pending]) -> Pending:
    """:func:`_with_contig_out` of a list of tensors (``contiguous()`` of a contiguous tensor is the tensor itself)."""
    work = [t.contiguous() for t in ts]
    staged = [(t, w) for t, w in zip(ts, work) if w is not t]
    p = run(work)
    return p.and_then(lambda: [t.copy_(w) for t, w in staged]) if staged else p


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
    for cand in _SAME_WIDTH.get(t.element_size(), ()):
        if caps.moves(cand):
            _note(f"{t.dtype} moved as {cand}")
            return t.view(cand)
    _note(f"{t.dtype} moved as bytes")  # every backend moves bytes
    # rows of bytes, one per element of dim 0 (also of 0 elements, also of a 1-D tensor): split sizes still count rows
    return t.view(t.shape[0], math.prod(t.shape[1:])).view(torch.uint8)


def _as_uint8(x):
    """``x`` (an argument: a tensor, a list or tuple of them, or anything else) with every tensor its uint8 view (one
    byte per element: any layout views)."""
    if isinstance(x, (list, tuple)):
        return type(x)(map(_as_uint8, x))
    return x.view(torch.uint8) if isinstance(x, torch.Tensor) else x


def _mx_as_bytes(fn):
    """A collective that moves data (no reduction) run on uint8 views when every tensor it is handed is of one MX
    dtype (``semantics.MX``: float8_e8m0fnu, float4_e2m1fn_x2): the same bytes on the wire, every local copy a uint8
    copy (torch 2.9 copies no float4_e2m1fn_x2: '"copy_kernel" not implemented'), the backend handed uint8, as
    ProcessGroupXCCL maps them from intel/torch-xpu-ops#5240 (onecclUint8). A call that mixes dtypes runs as it is,
    for the validation to refuse with the dtypes it was given."""

    @functools.wraps(fn)
    def wrapper(tp, *args, **kwargs):
        seen = {t.dtype for t in _tensors(args + tuple(kwargs.values()))}
        if len(seen) == 1 and next(iter(seen)) in MX:
            _note(f"{next(iter(seen))} moved as {torch.uint8}")
            args, kwargs = _as_uint8(args), {k: _as_uint8(v) for k, v in kwargs.items()}
        return fn(tp, *args, **kwargs)

    return wrapper


def _local_reduce(g: torch.Tensor, op: ReduceOp) -> torch.Tensor:
    """Reduces dim 0 of ``g`` (one row per rank, a buffer of funcoll's own) in rank order, in g's dtype, in place
    into ``g[0]``, which it returns: no temporaries, and the same order (so the same bits) on every rank."""
    rows, in_place = g.unbind(0), OPS[op].in_place
    acc = rows[0]
    for row in rows[1:]:
        in_place(acc, row)  # type: ignore[misc]  # the planner reduces locally only ops that have one
    return acc


def _padded_to(t: torch.Tensor, rows: int) -> torch.Tensor:
    """``t`` with rows of zeros appended up to ``rows`` rows (``t`` itself when it has them)."""
    have = t.shape[0]
    return t if have == rows else torch.cat([t, t.new_zeros((rows - have,) + tuple(t.shape[1:]))])


def _padded_flat(t: torch.Tensor, n: int) -> torch.Tensor:
    """``t`` flattened, as is when its size divides by ``n`` (a view: no copy), else copied and padded to it. Callers
    tell the two apart by size, never by ``data_ptr()``: a lazy XLA tensor and its padded copy report the same one."""
    flat = t.reshape(-1)
    return _padded_to(flat, flat.numel() + -flat.numel() % n)


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


def _coalesced(outs: Sequence[torch.Tensor], inps: Sequence[torch.Tensor], one: Callable[..., Pending],
               many: Callable[..., Pending]) -> Pending:
    """A coalesced op: per dtype and device (in order, empty inputs left out), ``one(out, inp)`` of a lone pair, else
    ``many(outs, inps)`` through one flat buffer."""
    groups: dict = {}
    for o, i in zip(outs, inps):
        if i.numel():
            groups.setdefault((i.dtype, i.device), []).append((o, i))
    pendings = []
    for (dtype, _), pairs in groups.items():
        if len(pairs) == 1:
            pendings.append(one(*pairs[0]))
        else:
            _note(f"flat buffer of {len(pairs)} {dtype} tensors")
            pendings.append(many(*zip(*pairs)))  # the group's outputs, its inputs
    return Pending(pendings)


# the integer of each element size that carries another dtype's bits through a masked SUM
_BITS_OF_SIZE = {size: ints[0] for size, ints in _SAME_WIDTH.items()}


def _summable(tp, t: torch.Tensor) -> torch.Tensor:
    """Contiguous ``t``'s bits, read (:meth:`~funcoll.transport.Transport.bits_as`) as integers whose SUM with zeros
    gives them back unchanged: a float sum would quiet signalling NaNs, canonicalise NaN payloads (fp16/bf16 are
    summed in float32 on CPU) and may turn -0.0 into +0.0, an integer sum with zeros changes no bit. Integers the
    transport sums natively and bool (or-ed) as they are; every other dtype (floats, float8, complex as its real view,
    integers the transport does not sum) as the integer of its element size when the transport sums that natively,
    else as bytes where a view is free (the same bytes: gloo sums no int16), else as the integer of its size (the
    planner's exact integer SUM). For reading: on XLA the result is a new lazy tensor, not a view."""
    if t.dtype == torch.bool:
        return t
    if t.dtype.is_complex:
        t = torch.view_as_real(_flat(t))
    caps = tp.caps
    if not t.dtype.is_floating_point and caps.reduces("all_reduce", ReduceOp.SUM, t.dtype):
        return t  # float8 is floating point too
    same = _BITS_OF_SIZE[t.element_size()]
    if same == t.dtype:
        return t
    as_bytes = (tp.dtype_views and caps.reduces("all_reduce", ReduceOp.SUM, torch.uint8)
                and not caps.reduces("all_reduce", ReduceOp.SUM, same))
    return tp.bits_as(_flat(t), torch.uint8 if as_bytes else same)  # never a 0-dim bitcast (TorchTPU refuses one)


def _moved(tp, out: torch.Tensor, inp: torch.Tensor, send: Callable[[torch.Tensor, torch.Tensor], Pending]) -> Pending:
    """``send(out, inp)`` of contiguous ``out`` and ``inp`` (an all_gather or an even all_to_all: ``out`` holds whole
    multiples of ``inp``'s rows), as dtypes the backend moves (:func:`_bits`: views). Where floats move as integers
    (:attr:`~funcoll.transport.Transport.floats_as_integers`: XLA, where a dtype view is a CPU fallback) a floating
    or complex ``inp`` is read as the integers of its bits, and ``out`` received into them, written back bit for bit."""
    if not (tp.floats_as_integers and (inp.dtype.is_floating_point or inp.is_complex())):
        return send(_bits(out, tp.caps), _bits(inp, tp.caps))
    bits = _summable(tp, inp)  # dim 0 kept (a complex tensor's real view: one more dimension)
    got = bits.new_empty((bits.shape[0] * out.numel() // inp.numel(),) + tuple(bits.shape[1:]))
    return send(got, bits).and_then(lambda: _write_bits(tp, out, got))


def _write_bits(tp, dest: torch.Tensor, bits: torch.Tensor) -> None:
    """Writes ``bits`` (:func:`_summable` of a tensor of ``dest``'s dtype and size, in any shape) into ``dest`` (any
    layout), bit for bit."""
    if dest.numel() == 0:  # nothing to write (an empty row of bytes may sit at an offset no wider dtype can view)
        return
    target = torch.view_as_real(dest) if dest.is_complex() else dest
    if bits.dtype != target.dtype:
        bits = tp.bits_as(bits.reshape(-1), target.dtype)
    target.copy_(bits.reshape(target.shape))


def _unflatten(flat: torch.Tensor, ts: Sequence[torch.Tensor]) -> None:
    """Copies consecutive pieces of ``flat`` along its last dim into ``ts``, each reshaped to its tensor's shape: a
    flat buffer of several tensors, or its ``[n, -1]`` view (piece j is then every rank's part of ``ts[j]``)."""
    rows = flat.shape[0] if flat.dim() == 2 else 1
    for t, piece in zip(ts, flat.split([t.numel() // rows for t in ts], dim=-1)):
        t.copy_(piece.reshape(t.shape))


def _offsets(splits):
    return list(itertools.accumulate(splits, initial=0))[:-1]
