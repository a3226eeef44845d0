"""The semantics layer (device-free, pure): reduce ops, dtype rules and shape rules, and the checks that reject an
invalid request on the calling rank before anything is sent, naming the op, the argument and the fix
(docs/design.md, "Layers")."""

from __future__ import annotations

import enum
import functools
import math
import operator
from dataclasses import dataclass
from typing import Callable, Dict, Optional, Sequence, Tuple, Union

import torch

__all__ = ["ReduceOp", "OpRow", "OPS", "op_named", "Reduction", "FLOAT8", "FLOAT4", "MX", "UNSIGNED", "INTEGER_DTYPES",
           "FLOAT_DTYPES", "parse_reduction", "check_reduction", "check_all_gather", "check_reduce_scatter",
           "check_all_to_all", "check_root", "check_layout", "check_same_tensor", "check_rank_list", "dtype_kind",
           "dtype_name", "ranks_text", "gathered_shape", "wrap_int"]


class ReduceOp(str, enum.Enum):
    SUM = "sum"
    AVG = "avg"
    PRODUCT = "product"
    MIN = "min"
    MAX = "max"
    BAND = "band"
    BOR = "bor"
    BXOR = "bxor"
    PREMUL_SUM = "premul_sum"

    def __str__(self) -> str:  # "sum", not "ReduceOp.SUM", in messages and snapshots
        return self.value


FLOAT8 = frozenset({torch.float8_e4m3fn, torch.float8_e5m2, torch.float8_e4m3fnuz, torch.float8_e5m2fnuz,
                    torch.float8_e8m0fnu})
FLOAT4 = frozenset({torch.float4_e2m1fn_x2})  # two fp4 values per byte
# the two halves of an MX tensor (torchao's MXTensor: packed fp4 pairs ``qdata`` and e8m0 ``scale``), one byte per
# element: collectives move them as their uint8 view, from the first step (torch 2.9 has no copy kernel for
# float4_e2m1fn_x2), and never reduce them
MX = FLOAT4 | {torch.float8_e8m0fnu}
UNSIGNED = frozenset({torch.uint8, torch.uint16, torch.uint32, torch.uint64})
INTEGER_DTYPES = frozenset({torch.int8, torch.int16, torch.int32, torch.int64}) | UNSIGNED
FLOAT_DTYPES = frozenset({torch.float16, torch.bfloat16, torch.float32, torch.float64})  # no float8/float4: see above


@dataclass(frozen=True)
class Reduction:
    """A reduce op plus, for premul_sum, its factor (a Python number or a one-element tensor)."""

    op: ReduceOp
    factor: Optional[Union[float, torch.Tensor]] = None

    def __str__(self) -> str:
        return str(self.op)

    def factor_like(self, like: torch.Tensor):
        """The factor to multiply ``like`` by: a tensor factor as a scalar on ``like``'s device, in its dtype."""
        f = self.factor
        return f.to(device=like.device, dtype=like.dtype).reshape(()) if isinstance(f, torch.Tensor) else f


def parse_reduction(op, opname: str, dtype: Optional[torch.dtype] = None) -> Reduction:
    """Accepts a string ("sum", "avg", ...), a funcoll ``ReduceOp`` or ``Reduction``, a ``torch.distributed.ReduceOp``
    (one made by ``torch.distributed._make_nccl_premul_sum(factor)`` too) or a ``ReduceOp.RedOpType``; given the
    request's ``dtype``, also refuses an op that makes no sense for it (:func:`check_reduction`)."""
    red: Optional[Reduction] = None
    if isinstance(op, Reduction):
        red = op
    elif isinstance(op, str):  # a funcoll ReduceOp is one too
        row = op_named(op)
        red = Reduction(row.op) if row is not None else None
    else:
        import torch.distributed as dist

        if isinstance(op, dist.ReduceOp.RedOpType):
            red = Reduction(ReduceOp(op.name.lower()))
        elif isinstance(op, dist.ReduceOp):
            kind, factor = op.__getstate__()  # type: ignore[attr-defined]  # (RedOpType, premul_sum's factor or None)
            red = Reduction(ReduceOp(kind.name.lower()), factor)
    if red is None:
        raise ValueError(f"funcoll.{opname}: unknown reduce op {op!r}; use one of "
                         f"{', '.join(map(str, OPS))}")
    if red.op is ReduceOp.PREMUL_SUM and red.factor is None:
        raise ValueError(f"funcoll.{opname}: reduce op premul_sum needs a factor; build it with "
                         "torch.distributed._make_nccl_premul_sum(factor)")
    if dtype is not None:
        check_reduction(opname, red, dtype)
    return red


def dtype_name(dtype: torch.dtype) -> str:
    """``"float32"`` for ``torch.float32``: a dtype as messages, traces and snapshots print it."""
    return str(dtype).replace("torch.", "")


def ranks_text(ranks: Sequence[int]) -> str:
    """Global ranks as messages print them: ``"0-7"`` for a run, else up to 16 of them (``"0,2,4"``)."""
    ranks = list(ranks)
    if len(ranks) > 2 and ranks == list(range(ranks[0], ranks[-1] + 1)):
        return f"{ranks[0]}-{ranks[-1]}"
    return ",".join(map(str, ranks[:16])) + (",..." if len(ranks) > 16 else "")


def dtype_kind(dtype: torch.dtype) -> str:
    """'bool', 'int', 'float', 'float8', 'float4' or 'complex'."""
    if dtype == torch.bool:
        return "bool"
    if dtype in FLOAT8:
        return "float8"
    if dtype in FLOAT4:
        return "float4"
    if dtype.is_complex:
        return "complex"
    if dtype.is_floating_point:
        return "float"
    return "int"


@dataclass(frozen=True)
class OpRow:
    """Every device-free fact of one reduce op (for the refusal check, the planner, the local reductions, the numeric
    reference and the report), keyed in :data:`OPS` by its op (a ``ReduceOp``; a test's own op: its name, a str)."""

    op: ReduceOp
    names: Tuple[str, ...]  # the names a string op may take: its own, then its aliases
    refuses: Tuple[Tuple[Union[str, torch.dtype], str], ...]  # (a dtype kind or a dtype, the refusal message)
    in_place: Optional[Callable] = None  # reduces tensor b into a in place: in_place(a, b); None: never reduced locally
    bool_op: Optional[ReduceOp] = None  # the logical op it is on bool (bor/band), where one is
    bool_uint8: Optional[ReduceOp] = None  # the op it is on bool viewed as uint8
    bool_count: Optional[str] = None  # what it is on bool as a count of the Trues: "any", "all" or "parity"
    exact: Optional[Callable] = None  # the reference over a column of Python ints (integer dtypes), exact
    wide: Optional[Callable] = None  # the float/complex reference: wide(float64/complex128 stack [n, ...], factor)


def wrap_int(value: int, bits: int) -> int:
    """``value`` as a signed integer of ``bits`` bits holds it (two's complement: its low ``bits`` bits)."""
    return (value + 2 ** (bits - 1)) % 2 ** bits - 2 ** (bits - 1)


def _int_avg(column) -> int:
    """AVG of integers, funcoll's rule: the int64 sum (exact for 8- to 32-bit dtypes; an int64 sum wraps) divided by the
    number of ranks, truncated toward zero (NCCL's rounding: FuncSumPostDiv::divide). Not NCCL's answer where a narrower
    sum wraps: NCCL sums in the tensor's dtype (int8 AVG of [100, 100] is -28 there, 100 here)."""
    total = wrap_int(sum(column), 64)
    return abs(total) // len(column) * (1 if total >= 0 else -1)


# the refusals rows share: (a dtype kind or a dtype, the message); every op refuses float8 and float4
_SMALL_FLOAT = ("{dtype} tensors cannot be reduced ({kind} is supported by non-reducing ops only); upcast to bfloat16 "
                "or float32 before reducing")
ALWAYS_REFUSED = (("float8", _SMALL_FLOAT), ("float4", _SMALL_FLOAT))
NO_COMPLEX = ALWAYS_REFUSED + (("complex", "reduce op {op} is not defined for complex tensors ({dtype}); only sum and "
                                           "avg are"),)
NO_BOOL = ("bool", "reduce op {op} is not defined for bool tensors; convert to a floating point dtype first")
_BITWISE = NO_COMPLEX + (("float", "reduce op {op} needs an integer or bool tensor, got {dtype}; use "
                                   "sum/avg/product/min/max, or view the tensor as an integer dtype"),)
_R, _fold = ReduceOp, functools.partial(functools.partial, functools.reduce)  # _fold(f)(column): f folded over it
_ANY, _ALL = (_R.BOR, _R.MAX, "any"), (_R.BAND, _R.MIN, "all")  # (bool_op, bool_uint8, bool_count) of or / and
OPS: Dict[ReduceOp, OpRow] = {row.op: row for row in (  # in ReduceOp order; fields in OpRow's order
    OpRow(_R.SUM, ("sum",), ALWAYS_REFUSED, torch.Tensor.add_, *_ANY, sum, lambda w, f: w.sum(0)),
    OpRow(_R.AVG, ("avg", "mean"), ALWAYS_REFUSED + (NO_BOOL, (torch.uint64, "reduce op avg on torch.uint64 cannot "
                                                     "be computed exactly; use sum and divide")),
          exact=_int_avg, wide=lambda w, f: w.sum(0) / len(w)),
    OpRow(_R.PRODUCT, ("product", "mul", "prod"), NO_COMPLEX, torch.Tensor.mul_, *_ALL, math.prod,
          lambda w, f: w.prod(0)),
    OpRow(_R.MIN, ("min",), NO_COMPLEX, lambda a, b: torch.minimum(a, b, out=a), *_ALL, min, lambda w, f: w.amin(0)),
    OpRow(_R.MAX, ("max",), NO_COMPLEX, lambda a, b: torch.maximum(a, b, out=a), *_ANY, max, lambda w, f: w.amax(0)),
    OpRow(_R.BAND, ("band", "and"), _BITWISE, torch.Tensor.bitwise_and_, *_ALL, _fold(operator.and_)),
    OpRow(_R.BOR, ("bor", "or"), _BITWISE, torch.Tensor.bitwise_or_, *_ANY, _fold(operator.or_)),
    OpRow(_R.BXOR, ("bxor", "xor"), _BITWISE, torch.Tensor.bitwise_xor_, None, _R.BXOR, "parity", _fold(operator.xor)),
    OpRow(_R.PREMUL_SUM, ("premul_sum",), NO_COMPLEX + (NO_BOOL, ("int", "reduce op premul_sum needs a floating point "
                                                        "tensor, got {dtype}; multiply and use sum instead")),
          wide=lambda w, f: (w * f).sum(0)),
)}


def op_named(name: str) -> Optional[OpRow]:
    """The row of the op a string names (its own name or an alias, any case); None for no op."""
    name = name.lower()
    for row in OPS.values():  # a loop, not a generator: every compiled reduce op is parsed here
        if name in row.names:
            return row
    return None


def check_reduction(opname: str, red: Reduction, dtype: torch.dtype) -> None:
    """A reduce op that makes no sense for the dtype is a TypeError, raised before anything is sent."""
    kind, op = dtype_kind(dtype), red.op
    for what, why in OPS[op].refuses:
        if what == kind or what == dtype:
            raise TypeError(f"funcoll.{opname}: " + why.format(op=op, dtype=dtype, kind=kind))
    if op is ReduceOp.PREMUL_SUM and isinstance(red.factor, torch.Tensor) and red.factor.numel() != 1:
        raise ValueError(f"funcoll.{opname}: premul_sum factor must be a scalar or a one-element tensor, "
                         f"got shape {tuple(red.factor.shape)}")


def check_layout(opname: str, tensors: Sequence[torch.Tensor]) -> None:
    """Collectives move dense (strided) tensors: a sparse or other layout is a TypeError, raised before anything is
    sent. (gloo has a sparse all-reduce; NCCL, XCCL and XLA have none, and funcoll keeps one semantics.)"""
    for t in tensors:
        if t.layout != torch.strided:
            raise TypeError(f"funcoll.{opname}: {t.layout} tensors are not supported, only dense ones; convert with "
                            f".to_dense() (or all-reduce the indices and values of a sparse tensor yourself)")


def check_same_tensor(opname: str, arg: str, t: torch.Tensor, ref: torch.Tensor, shape: Sequence[int]) -> None:
    """An output tensor must have the expected shape and the input's dtype and device."""
    if tuple(t.shape) != tuple(shape):
        raise ValueError(f"funcoll.{opname}: {arg} has shape {tuple(t.shape)}, expected {tuple(shape)}; "
                         f"allocate it with that shape")
    if t.dtype != ref.dtype:
        raise TypeError(f"funcoll.{opname}: {arg} has dtype {t.dtype}, expected {ref.dtype} (the input's dtype)")
    if t.device != ref.device:
        raise ValueError(f"funcoll.{opname}: {arg} is on {t.device}, expected {ref.device} (the input's device)")


def check_rank_list(opname: str, role: str, tensors: Sequence[torch.Tensor], own: torch.Tensor, group_size: int,
                    rank: int) -> list:
    """The tensor list of ``dist.all_gather`` (``role="output"``: ``tensors[r]`` receives rank r's input) or of
    ``dist.reduce_scatter`` (``"input"``: ``tensors[r]`` is reduced into rank r's output): one tensor per rank, each of
    ``own``'s dtype and device, of any size (in elements, as NCCL's, XCCL's and gloo's list forms read them) except
    this rank's own, which holds as many elements as ``own``. Returns the number of elements per rank."""
    if len(tensors) != group_size:
        raise ValueError(f"funcoll.{opname}: expected {group_size} {role} tensors, got {len(tensors)} (one per rank "
                         f"of the group)")
    for i, t in enumerate(tensors):
        check_same_tensor(opname, f"{role}[{i}]", t, own, t.shape)  # dtype and device
    mine = tensors[rank].numel()
    if mine != own.numel():
        other = "input" if role == "output" else "output"
        raise ValueError(f"funcoll.{opname}: {role}[{rank}] (this rank's own) has {mine} elements but the {other} has "
                         f"{own.numel()}; {role}[r] must have rank r's {other} size (its number of elements)")
    return [t.numel() for t in tensors]


def gathered_shape(inp: torch.Tensor, group_size: int) -> tuple:
    """all_gather's output shape: the inputs concatenated along dim 0 (a 0-dim input counts as one row)."""
    return (group_size * (inp.shape[0] if inp.dim() else 1),) + tuple(inp.shape[1:])


def check_all_gather(opname: str, out: torch.Tensor, inp: torch.Tensor, group_size: int) -> tuple:
    """The output is :func:`gathered_shape` or, as upstream accepts too, the stack ``[group_size, *shape]`` (the same
    memory when contiguous). Returns the concatenated shape."""
    shape = gathered_shape(inp, group_size)
    stacked = (group_size,) + tuple(inp.shape)
    check_same_tensor(opname, "output", out, inp, stacked if tuple(out.shape) == stacked else shape)
    return shape


def check_reduce_scatter(opname: str, out: Optional[torch.Tensor], inp: torch.Tensor, group_size: int) -> tuple:
    if inp.dim() == 0 or inp.shape[0] % group_size:
        raise ValueError(f"funcoll.{opname}: input dim 0 ({inp.shape[0] if inp.dim() else 'a 0-dim tensor'}) must be "
                         f"divisible by the group size ({group_size}); pad the input to a multiple of {group_size}")
    shape = (inp.shape[0] // group_size,) + tuple(inp.shape[1:])
    if out is not None:
        if out.dim() and tuple(inp.shape) == (group_size,) + tuple(out.shape):
            shape = tuple(out.shape)  # the input as a stack [group_size, *output.shape], as upstream accepts too
        check_same_tensor(opname, "output", out, inp, shape)
    return shape


def _check_splits(opname: str, arg: str, splits, dim0: int, group_size: int, what: str) -> list:
    if splits is None or len(splits) == 0:
        if dim0 % group_size:
            raise ValueError(f"funcoll.{opname}: {what} dim 0 ({dim0}) is not divisible by the group size "
                             f"({group_size}) and no {arg} were given; pass {arg} explicitly")
        return [dim0 // group_size] * group_size
    splits = [int(s) for s in splits]
    if len(splits) != group_size:
        raise ValueError(f"funcoll.{opname}: {arg} has {len(splits)} entries, expected one per rank of the group "
                         f"({group_size})")
    if any(s < 0 for s in splits):
        raise ValueError(f"funcoll.{opname}: {arg} {splits} has a negative entry")
    if sum(splits) != dim0:
        raise ValueError(f"funcoll.{opname}: {arg} {splits} sum to {sum(splits)}, but {what} dim 0 is {dim0}; "
                         f"the splits must sum to dim 0")
    return splits


def check_all_to_all(opname: str, out: torch.Tensor, inp: torch.Tensor, output_split_sizes,
                     input_split_sizes, group_size: int) -> tuple:
    """Returns (output_splits, input_splits) as lists of ints."""
    if inp.dim() == 0:
        raise ValueError(f"funcoll.{opname}: input must have at least one dimension")
    ins = _check_splits(opname, "input_split_sizes", input_split_sizes, inp.shape[0], group_size, "input")
    outs = _check_splits(opname, "output_split_sizes", output_split_sizes, out.shape[0], group_size, "output")
    if tuple(out.shape[1:]) != tuple(inp.shape[1:]):
        raise ValueError(f"funcoll.{opname}: output shape {tuple(out.shape)} and input shape {tuple(inp.shape)} "
                         f"must agree after dim 0")
    check_same_tensor(opname, "output", out, inp, out.shape)  # the dtype and device (the shape was checked above)
    return outs, ins


def check_root(opname: str, arg: str, root: int, group_size: int) -> None:
    if not isinstance(root, int) or isinstance(root, bool) or not 0 <= root < group_size:
        raise ValueError(f"funcoll.{opname}: {arg}={root!r} is outside the group (group-local ranks are "
                         f"0..{group_size - 1}); pass a rank of the group")


def check_root_list(opname: str, role: str, tensors, like, group_size: int) -> None:
    """The root of gather (``role="output"``) / scatter (``"input"``) passes one tensor per rank, each like ``like``."""
    side = "destination" if role == "output" else "source"
    if tensors is None or len(tensors) != group_size:
        raise ValueError(f"funcoll.{opname}: the {side} rank needs a list of {group_size} {role} tensors, "
                         f"got {None if tensors is None else len(tensors)}")
    for i, t in enumerate(tensors):
        check_same_tensor(opname, f"{role}[{i}]", t, like, like.shape)
