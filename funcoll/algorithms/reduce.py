"""The reducing collectives: all_reduce (and its coalesced form), reduce_scatter (tensor, coalesced and list forms)
and reduce, each run as the planner's plan (:mod:`funcoll.algorithms.planner` lists the strategies). The even
all_gather and all_to_all the plans build on live here too (:func:`_ag`, :func:`_a2a_even`). ``native_*_call`` answer
the eager fast path's question "is this request's plan one native call?" (:mod:`funcoll.entry.fast_path`): the call
``(primitive, reduce op, dtype)``, or None; an invalid request raises the full path's error."""

from __future__ import annotations

import functools
import math
from typing import Callable, Optional, Sequence, Tuple

import torch

from funcoll import semantics
from funcoll.algorithms import planner
from funcoll.algorithms.pending import Pending, _entry, _note, watched
from funcoll.algorithms.tensors import (
    _coalesced,
    _flat,
    _local_reduce,
    _moved,
    _padded_flat,
    _padded_to,
    _summable,
    _trunc_div,
    _unflatten,
    _with_contig_out,
    _with_contig_outs,
    _write_bits,
)
from funcoll.semantics import ReduceOp, Reduction
from funcoll.transport import Transport


# -- is the plan native? (the fast paths) ------------------------------------------------------------------------------
def _native_reduction(caps, size: int, op, dtype: torch.dtype) -> Optional[Reduction]:
    """The validated :class:`Reduction` when all_reduce of ``dtype`` with ``op`` is one native call under funcoll's
    semantics (the planner's plan), else None; raises as the algorithm does for an invalid request."""
    red = semantics.parse_reduction(op, "all_reduce", dtype)
    native = red.op is not ReduceOp.PREMUL_SUM and planner.plan(caps, "all_reduce", red.op, dtype, size).native
    return red if native else None


_cached_native_reduction = functools.lru_cache(maxsize=None)(_native_reduction)


def native_all_reduce(tp: Transport, op, dtype: torch.dtype) -> Optional[Reduction]:
    """The :class:`Reduction` to hand ``tp.all_reduce`` as it is, when reducing ``dtype`` with ``op`` is native under
    funcoll's semantics (the planner's plan is one native call); None when it is not, when the request is invalid
    (the full path raises the error), or while ``record()``, a profiler or the funcoll debug log observe (the full
    path reports to them). Validated once per (capabilities, op, dtype, group size), never skipped for a new one."""
    if watched():
        return None
    try:
        return _cached_native_reduction(tp.caps, tp.size, op, dtype)
    except (ValueError, TypeError):
        # an invalid request (an error is not cached: the full path raises it, every time), or an unhashable op (a
        # premul_sum factor tensor): the full path
        return None


def native_all_reduce_call(tp: Transport, op, t: torch.Tensor) -> Optional[tuple]:
    """``ProcessGroup.allreduce([t], opts)`` (``op = opts.reduceOp``)."""
    red = _native_reduction(tp.caps, tp.size, op, t.dtype)
    if red is None or t.numel() == 0 or not tp.caps.moves(t.dtype):
        return None
    return ("all_reduce", str(red.op), t.dtype)


def native_reduce_scatter_call(tp: Transport, op, out: torch.Tensor, inp: torch.Tensor) -> Optional[tuple]:
    """``ProcessGroup._reduce_scatter_base(out, inp, opts)`` (input in the concatenated shape)."""
    red = semantics.parse_reduction(op, "reduce_scatter_tensor", inp.dtype)
    semantics.check_reduce_scatter("reduce_scatter_tensor", out, inp, tp.size)
    if (out.numel() == 0 or out.dim() == 0 or tuple(inp.shape) != (tp.size * out.shape[0],) + tuple(out.shape[1:])
            or not _plan_native(tp, "reduce_scatter", red, inp.dtype)):
        return None
    return ("reduce_scatter", str(red.op), inp.dtype)


def _plan_native(tp: Transport, primitive: str, red: Reduction, dtype: torch.dtype) -> bool:
    """Whether ``primitive`` of ``dtype`` is one native call: a dtype the transport moves, the planner's plan native,
    and not premul_sum (a native call names its op, not its factor)."""
    return (red.op is not ReduceOp.PREMUL_SUM and tp.caps.moves(dtype)
            and planner.plan(tp.caps, primitive, red.op, dtype, tp.size).native)


def _rs_list_native(tp: Transport, red: Reduction, dtype: torch.dtype, sizes: Sequence[int]) -> bool:
    """Whether ``dist.reduce_scatter`` (the list form) goes to the backend's own list reduce_scatter: a function of what
    every rank shares (the transport, the reduce op, the dtype, every destination's size), so that every rank of a
    call issues the same exchange, whatever its tensors' layouts and whether the fast path took it."""
    if "reduce_scatter" not in tp.list_forms or not _plan_native(tp, "reduce_scatter", red, dtype):
        return False
    # uneven: XCCL and NCCL send one reduce per destination (the reduce plan must be native too); gloo one all_reduce
    return len(set(sizes)) == 1 or (tp.caps.uneven_reduce_scatter and _plan_native(tp, "reduce", red, dtype))


def native_reduce_scatter_list_call(tp: Transport, op, out: torch.Tensor, ins: tuple) -> Optional[tuple]:
    """``ProcessGroup.reduce_scatter([out], [ins], opts)`` (``dist.reduce_scatter``; ``ins``: each input's (dtype,
    shape)) as the backend's list form, which wants rank r's input in rank r's output shape."""
    red = semantics.parse_reduction(op, "reduce_scatter", out.dtype)
    sizes = [math.prod(s) for _, s in ins]
    if (len(ins) != tp.size or any(d != out.dtype for d, _ in ins) or ins[tp.rank][1] != out.shape
            or not any(sizes) or not _rs_list_native(tp, red, out.dtype, sizes)):
        return None
    return ("reduce_scatter", str(red.op), out.dtype)


# -- all_reduce --------------------------------------------------------------------------------------------------------
def _ar(tp: Transport, t: torch.Tensor, red: Reduction) -> Pending:
    """In-place all_reduce of contiguous ``t`` (already validated): the planner's plan for the request, run."""
    return _run(tp, t, t, red, planner.plan(tp.caps, "all_reduce", red.op, t.dtype, tp.size).steps)


# a step that reduces in another dtype (AVG in float32 or int64, WIDEN, a count of every rank's Trues): its result
# ``w`` of ``n`` ranks, back in the request's dtype (the count: the bool result of any / all / parity)
_NARROW: dict[str, Callable[[torch.Tensor, int], torch.Tensor]] = {
    planner.AVG_FLOAT32: lambda w, n: w.div_(n), planner.AVG_INT: _trunc_div, planner.WIDEN: lambda w, n: w,
    planner.BOOL_ANY: lambda w, n: w != 0, planner.BOOL_ALL: lambda w, n: w == n,
    planner.BOOL_PARITY: lambda w, n: w.bitwise_and(1) != 0}
# the same for a uint8 count that is the bool tensor's own bytes: in place, 0/1 afterwards
_COUNT_TO_BOOL_: dict[str, Callable[[torch.Tensor, int], object]] = {
    planner.BOOL_ANY: lambda c, n: c.clamp_(max=1), planner.BOOL_ALL: lambda c, n: c.eq_(n),
    planner.BOOL_PARITY: lambda c, n: c.bitwise_and_(1)}


def _alike(f: Callable[[torch.Tensor], torch.Tensor], out: torch.Tensor,
           inp: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """``f`` of a request's output and input (an all_reduce's one tensor, converted once)."""
    o = f(out)
    return o, (o if inp is out else f(inp))


def _run(tp: Transport, out: torch.Tensor, inp: torch.Tensor, red: Reduction, steps) -> Pending:
    """Runs the plan ``steps``: an all_reduce of ``out`` in place (``inp is out``) or a reduce_scatter of ``inp`` into
    ``out`` (contiguous, validated). A transform step changes the request (its tensors, its op) and runs the rest of
    the plan on it, then its finishing step; a terminal step sends. Each step kind's code is its row of ``_STEPS``."""
    step = steps[0]
    if step.note:
        _note(step.note)
    return _STEPS[step.kind](tp, out, inp, red if step.op is red.op else Reduction(step.op), step, red, steps[1:])


# Each step kind, run: (transport, out, inp, the reduction after the step, the step, the reduction before it, the rest
# of the plan) -> Pending. ``inp is out``: an all_reduce in place, else a reduce_scatter.
def _native_step(tp, out, inp, r, step, red, rest) -> Pending:
    return Pending([tp.all_reduce(out, r) if inp is out else tp.reduce_scatter(out, inp, r)])


def _same_step(tp, out, inp, r, step, red, rest) -> Pending:  # the op changed, the tensors did not (bool's or/and)
    return _run(tp, out, inp, r, rest)


def _view_step(tp, out, inp, r, step, red, rest) -> Pending:  # the same bytes as another dtype (bool, unsigned)
    return _run(tp, *_alike(lambda x: x.view(step.dtype), out, inp), r, rest)


def _real_view_step(tp, out, inp, r, step, red, rest) -> Pending:
    return _run(tp, *_alike(lambda x: torch.view_as_real(_flat(x)), out, inp), r, rest)


def _avg_step(tp, out, inp, r, step, red, rest) -> Pending:  # SUM, then divide
    return _run(tp, out, inp, r, rest).and_then(lambda: out.div_(tp.size))


def _premul_step(tp, out, inp, r, step, red, rest) -> Pending:
    f = red.factor_like(out)  # a reduce_scatter's input is the caller's: scaled as a copy
    return _run(tp, out, out.mul_(f) if inp is out else inp * f, r, rest)


def _signed_flip_step(tp, out, inp, r, step, red, rest) -> Pending:
    wo, bit = out.view(step.dtype), planner.SIGN_BIT[step.dtype]
    wi = wo.bitwise_xor_(bit) if inp is out else inp.view(step.dtype) ^ bit
    return _run(tp, wo, wi, r, rest).and_then(lambda: wo.bitwise_xor_(bit))


def _narrow_step(tp, out, inp, r, step, red, rest) -> Pending:
    """A step that reduces in another dtype: its result back in the request's dtype (``_NARROW``)."""
    n = tp.size
    if step.kind in _COUNT_TO_BOOL_ and inp is out and step.dtype == torch.uint8 and out.is_contiguous() \
            and tp.dtype_views:
        # bools are 0/1 bytes: count in the tensor itself, then turn the count back into 0/1 in place (no temporary:
        # docs/performance.md's "any (MAX) 16 MiB bool" row)
        w = out.view(torch.uint8)
        return _run(tp, w, w, r, rest).and_then(lambda: _COUNT_TO_BOOL_[step.kind](w, n))
    wo, wi = _alike(lambda x: x.to(step.dtype), out, inp)
    return _run(tp, wo, wi, r, rest).and_then(lambda: out.copy_(_NARROW[step.kind](wo, n)))


def _rs_ag_local_step(tp, out, inp, r, step, red, rest) -> Pending:
    # this rank's block of every rank, reduced in rank order, the blocks gathered straight into the result
    n, flat = tp.size, _padded_flat(out, tp.size)
    recv = torch.empty_like(flat)
    _a2a_even(tp, recv, flat).wait()
    return _unpad(out, flat, _ag(tp, flat, _local_reduce(recv.view(n, -1), step.op)))


def _avg_rs_ag_step(tp, out, inp, r, step, red, rest) -> Pending:
    # float32 reduce_scatter (the sum rounds once, as a float32 all_reduce would), each rank divides and rounds its
    # block to out's dtype, all_gather in out's dtype; in pieces of tp.staging_bytes of float32, each gathered back
    # into itself: the float32 copy and the transport's own temporaries stay bounded
    n, flat = tp.size, _padded_flat(out, tp.size)
    piece = flat.numel() if tp.staging_bytes is None else max(n, tp.staging_bytes // 4 // n * n)
    for lo in range(0, flat.numel(), piece):
        part = flat[lo:lo + piece]
        wide = part.float()
        block = wide.new_empty((part.numel() // n,))
        _rs(tp, block, wide, Reduction(ReduceOp.SUM)).wait()
        del wide
        p = _ag(tp, part, block.div_(n).to(out.dtype))
        if lo + piece < flat.numel():
            p.wait()
    return _unpad(out, flat, p)


def _unpad(out: torch.Tensor, flat: torch.Tensor, p: Pending) -> Pending:
    if flat.numel() == out.numel():  # no padding: flat is a view of out, the all_gather wrote into out itself
        return p
    return p.and_then(lambda: out.view(-1).copy_(flat[:out.numel()]))


def _gather_local_step(tp, out, inp, r, step, red, rest) -> Pending:
    flat = out.reshape(-1)
    g = flat.new_empty((tp.size * flat.numel(),))
    return _ag(tp, g, flat).and_then(lambda: flat.copy_(_local_reduce(g.view(tp.size, -1), step.op)))


def _a2a_local_step(tp, out, inp, r, step, red, rest) -> Pending:
    buf = torch.empty_like(inp)
    return _a2a_even(tp, buf, inp).and_then(
        lambda: out.reshape(-1).copy_(_local_reduce(buf.view(tp.size, -1), step.op)))


def _all_reduce_slice_step(tp, out, inp, r, step, red, rest) -> Pending:
    # XLA, replica groups of mixed sizes: no reduce_scatter, no all_to_all
    w = inp.clone()
    return _ar(tp, w, r).and_then(lambda: out.copy_(
        w.view((tp.size,) + tuple(out.shape)).index_select(0, tp.rank_index(w)).view(out.shape)))


def _unreducible_step(tp, out, inp, r, step, red, rest) -> Pending:
    raise NotImplementedError(f"funcoll.{'all_reduce' if inp is out else 'reduce_scatter_tensor'}: the "
                              f"{tp.caps.name} transport cannot reduce {inp.dtype}")


_STEPS: dict[str, Callable[..., Pending]] = {
    planner.NATIVE: _native_step,
    planner.REAL_VIEW: _real_view_step,
    planner.BOOL_OP: _same_step,
    planner.BOOL_UINT8: _view_step,
    planner.SIGNED: _view_step,
    planner.AVG_FLOAT: _avg_step,
    planner.PREMUL: _premul_step,
    planner.SIGNED_FLIP: _signed_flip_step,
    **{kind: _narrow_step for kind in _NARROW},
    planner.RS_AG_LOCAL: _rs_ag_local_step,
    planner.AVG_RS_AG: _avg_rs_ag_step,
    planner.GATHER_LOCAL: _gather_local_step,
    planner.A2A_LOCAL: _a2a_local_step,
    planner.ALL_REDUCE_SLICE: _all_reduce_slice_step,
    planner.UNREDUCIBLE: _unreducible_step,
}


@_entry
def all_reduce(tp: Transport, tensor: torch.Tensor, op="sum") -> Pending:
    """In-place all_reduce of ``tensor`` over the transport's group."""
    red = semantics.parse_reduction(op, "all_reduce", tensor.dtype)
    if tensor.numel() == 0:
        return Pending()  # nothing to send: complete at once
    return _with_contig_out(tensor, lambda t: _ar(tp, t, red))


@_entry
def all_reduce_coalesced(tp: Transport, tensors: Sequence[torch.Tensor], op="sum") -> Pending:
    """In-place all_reduce of several tensors: one tuple op where native, else one flat buffer per dtype."""
    red = semantics.parse_reduction(op, "all_reduce_coalesced")
    for t in tensors:
        semantics.check_reduction("all_reduce_coalesced", red, t.dtype)
    tensors = [t for t in tensors if t.numel()]
    if not tensors:
        return Pending()  # nothing to send: complete at once
    # the plan reads only what every rank shares (op, dtypes); a tensor's layout changes only local copies
    if all(tp.caps.reduces("all_reduce_coalesced", red.op, t.dtype) for t in tensors):
        _note(f"one tuple all_reduce of {len(tensors)} tensors")
        return _with_contig_outs(tensors, lambda work: Pending([tp.all_reduce_coalesced(work, red)]))

    def many(_, ts) -> Pending:
        flat = torch.cat([t.reshape(-1) for t in ts])
        return _ar(tp, flat, red).and_then(functools.partial(_unflatten, flat, ts))

    return _coalesced(tensors, tensors, lambda t, _: _with_contig_out(t, lambda w: _ar(tp, w, red)), many)


# -- the even all_gather and all_to_all the plans build on (all_gather's own fill is a masked all_reduce) --------------
def _masked_sum(tp: Transport, bits: torch.Tensor, keep: torch.Tensor,
                write: Callable[[torch.Tensor], object]) -> Pending:
    """``bits`` (:func:`_summable` of what one rank contributes) where ``keep`` (device data: the same program on every
    rank), 0 elsewhere, summed as integers in one all_reduce, every bit pattern unchanged; ``write(sum)`` then gets the
    flat sum (selected in the integers where needed: XLA's CPU runtime selects bfloat16 through float32)."""
    masked = torch.where(keep, bits, False if bits.dtype == torch.bool else 0).reshape(-1)  # bool stays bool
    return _ar(tp, masked, Reduction(ReduceOp.SUM)).and_then(lambda: write(masked))


def _ag(tp: Transport, out: torch.Tensor, inp: torch.Tensor) -> Pending:
    """All-gather of contiguous ``inp`` into contiguous ``out`` (dim-0 concatenation)."""
    caps = tp.caps
    if caps.has("all_gather"):
        return _moved(tp, out, inp, lambda o, i: Pending([tp.all_gather(o, i)]))
    # no all_gather for this group (XLA, replica groups of mixed sizes: its all-gather needs one size)
    _note("all_gather=masked all_reduce")
    flat = _summable(tp, _flat(inp)).reshape(1, -1)
    rows = flat.expand(tp.size, flat.shape[1])
    return _masked_sum(tp, rows, tp.rank_mask(flat).unsqueeze(1), lambda got: _write_bits(tp, out, got))


def _a2a_even(tp: Transport, out: torch.Tensor, inp: torch.Tensor) -> Pending:
    caps, n = tp.caps, tp.size
    if caps.has("all_to_all"):
        return _moved(tp, out, inp, lambda o, i: Pending([tp.all_to_all(o, i, None, None)]))
    # no all_to_all for this group (XLA, replica groups of mixed sizes): gather everything, keep this rank's column,
    # selected in the integers of the tensor's bits (an index_select of bfloat16 on XLA's CPU runtime changes NaNs)
    _note("all_to_all=all_gather+select")
    rows = inp.shape[0] // n
    bits = _summable(tp, inp).reshape(inp.shape[0], -1)  # dim 0 kept
    g = bits.new_empty((n * bits.shape[0], bits.shape[1]))
    return _ag(tp, g, bits).and_then(lambda: _write_bits(
        tp, out, g.view(n, n, rows, -1).index_select(1, tp.rank_index(g))))


# -- reduce_scatter ----------------------------------------------------------------------------------------------------
def _rs(tp: Transport, out: torch.Tensor, inp: torch.Tensor, red: Reduction) -> Pending:
    """Reduce-scatter of contiguous ``inp`` into contiguous ``out`` (already validated): the planner's plan, run."""
    return _run(tp, out, inp, red, planner.plan(tp.caps, "reduce_scatter", red.op, inp.dtype, tp.size).steps)


@_entry
def reduce_scatter_tensor(tp: Transport, out: torch.Tensor, inp: torch.Tensor, op="sum") -> Pending:
    red = semantics.parse_reduction(op, "reduce_scatter_tensor", inp.dtype)
    semantics.check_reduce_scatter("reduce_scatter_tensor", out, inp, tp.size)
    if out.numel() == 0:
        return Pending()  # nothing to send: complete at once
    inp = inp.contiguous().reshape((-1,) + tuple(out.shape[1:]))  # the stacked input form as its concatenation
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

    def many(os_, ins) -> Pending:
        flat = torch.cat([i.reshape(n, -1) for i in ins], dim=1).reshape(-1)
        res = flat.new_empty((flat.numel() // n,))
        return _rs(tp, res, flat, red).and_then(functools.partial(_unflatten, res, os_))

    return _coalesced(outs, inps, lambda o, i: _with_contig_out(o, lambda w: _rs(tp, w, i.contiguous(), red)), many)


# -- reduce, and reduce_scatter's list form ----------------------------------------------------------------------------
@_entry
def reduce(tp: Transport, tensor: torch.Tensor, dst: int, op="sum") -> Pending:
    """The result lands in ``tensor`` on ``dst``; other ranks' tensors are left unchanged."""
    red = semantics.parse_reduction(op, "reduce", tensor.dtype)
    semantics.check_root("reduce", "dst", dst, tp.size)
    if tensor.numel() == 0:
        return Pending()  # nothing to send: complete at once
    steps = planner.plan(tp.caps, "reduce", red.op, tensor.dtype, tp.size).steps
    native = steps[0].kind == planner.NATIVE
    if not native:
        _note(steps[0].note)  # reduce=all_reduce: the all_reduce plan, the result kept on dst

    def run(t: torch.Tensor) -> Pending:
        return Pending([tp.reduce(t, dst, red)]) if native else _run(tp, t, t, red, steps[1:])

    if tp.rank == dst:
        return _with_contig_out(tensor, run)
    work = tensor.clone(memory_format=torch.contiguous_format)  # the backend may write into it: never the caller's
    p = run(work)
    tp.retain(work)  # nobody reads it here, but the collective must run on this rank too
    return p


@_entry
def reduce_scatter(tp: Transport, out: torch.Tensor, inps: Sequence[torch.Tensor], op="sum") -> Pending:
    """``dist.reduce_scatter``: ``inps[r]`` of every rank is reduced into ``out`` on rank r; ``inps[r]`` has rank r's
    output size, which may differ per destination (as NCCL, XCCL and gloo serve the list form)."""
    red = semantics.parse_reduction(op, "reduce_scatter", out.dtype)
    sizes = semantics.check_rank_list("reduce_scatter", "input", inps, out, tp.size, tp.rank)
    if not any(sizes):
        return Pending()  # nothing to send on any rank (every rank sees every size): complete at once
    shape = inps[tp.rank].shape
    if _rs_list_native(tp, red, out.dtype, sizes):
        # the backend's own list form, with contiguous copies where the caller's tensors are not: the exchange the
        # fast path issues for the same call on another rank
        ins = [t.contiguous() for t in inps]
        return _with_contig_out(out, lambda o: Pending([tp.reduce_scatter_list(o.view(shape), ins, red)]))
    if len(set(sizes)) == 1:
        flat = torch.cat([t.reshape(-1) for t in inps])
        return _with_contig_out(out, lambda o: _rs(tp, o.view(-1), flat, red))
    return _with_contig_out(out, lambda o: _rs_uneven(tp, o.view(-1), inps, sizes, red))


def _rs_uneven(tp: Transport, out: torch.Tensor, inps: Sequence[torch.Tensor], sizes: Sequence[int],
               red: Reduction) -> Pending:
    """Uneven list reduce_scatter where the backend's list form does not serve it (the planner's docstring lists both
    ways); every size is in every rank's list: no agreement, no host sync (XLA)."""
    n, big, total = tp.size, max(sizes), sum(sizes)
    lo = sum(sizes[:tp.rank])
    if n * big > 2 * total:
        _note("uneven reduce_scatter=all_reduce+slice")
        flat = torch.cat([t.reshape(-1) for t in inps])
        return _ar(tp, flat, red).and_then(lambda: out.copy_(flat[lo:lo + out.numel()]))
    _note(f"uneven reduce_scatter=pad to {big}+reduce_scatter+unpad")
    padded = torch.cat([_padded_to(t.reshape(-1), big) for t in inps])
    block = padded.new_empty((big,))
    return _rs(tp, block, padded, red).and_then(lambda: out.copy_(block[:out.numel()]))
