"""Local tensor steps the strategies share: contiguous staging, raw-bit views of dtypes a backend does not move,
the identity and masks of exact sums, in-place local reductions in rank order, integer division with truncation.
Nothing here sends."""

from __future__ import annotations

import itertools
import math
from typing import Callable, Dict, Sequence

import torch

from funcoll import semantics
from funcoll.algorithms import planner
from funcoll.algorithms.pending import Pending, _note
from funcoll.semantics import ReduceOp

R = ReduceOp

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
    _note(f"{t.dtype} moved as bytes")  # every backend moves bytes
    # rows of bytes, one per element of dim 0 (also of 0 elements, also of a 1-D tensor): split sizes still count rows
    return t.view(t.shape[0], math.prod(t.shape[1:])).view(torch.uint8)


_IN_PLACE: Dict[ReduceOp, Callable[..., object]] = {
    R.SUM: torch.Tensor.add_, R.PRODUCT: torch.Tensor.mul_, R.BAND: torch.Tensor.bitwise_and_,
    R.BOR: torch.Tensor.bitwise_or_, R.BXOR: torch.Tensor.bitwise_xor_,
    R.MIN: lambda a, b: torch.minimum(a, b, out=a), R.MAX: lambda a, b: torch.maximum(a, b, out=a)}


def _local_reduce(g: torch.Tensor, op: ReduceOp) -> torch.Tensor:
    """Reduces dim 0 of ``g`` (one row per rank, a buffer of funcoll's own) in rank order, in g's dtype, in place
    into ``g[0]``, which it returns: no temporaries, and the same order (so the same bits) on every rank."""
    rows = g.unbind(0)
    acc = rows[0]
    for row in rows[1:]:
        _IN_PLACE[op](acc, row)
    return acc


def _count_to_bool_(kind: str, count: torch.Tensor, n: int) -> None:
    """A count of every rank's Trues back to the bool result of any / all / parity, in place, on a uint8 count that is
    the bool tensor's own bytes (0/1 afterwards)."""
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
    return False if dtype == torch.bool else -0.0 if dtype.is_floating_point else 0



def _unflatten(flat: torch.Tensor, ts: Sequence[torch.Tensor]) -> None:
    """Copies consecutive pieces of ``flat`` along its last dim into ``ts``, each reshaped to its tensor's shape: a
    flat buffer of several tensors, or its ``[n, -1]`` view (piece j is then every rank's part of ``ts[j]``)."""
    rows = flat.shape[0] if flat.dim() == 2 else 1
    for t, piece in zip(ts, flat.split([t.numel() // rows for t in ts], dim=-1)):
        t.copy_(piece.reshape(t.shape))


def _offsets(splits):
    return list(itertools.accumulate(splits, initial=0))[:-1]
