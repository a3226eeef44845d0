"""The one numeric reference of funcoll's tests and of :mod:`funcoll.probe`: every rank's inputs from a seed
(:func:`make`), reductions computed independently of any collective (:func:`reduce`: integers with Python integers,
floats in float64/complex128, rounded once), the comparator (:func:`close`) and which reduce ops a dtype takes
(:func:`valid_ops`, read from ``funcoll.semantics``; the tests check it against tests/oracle.py).
"""

from __future__ import annotations

import zlib
from typing import Callable, Dict

import torch

from funcoll.semantics import FLOAT4, FLOAT8, OPS, UNSIGNED, ReduceOp, Reduction, check_reduction, op_named, wrap_int

PREMUL = 0.5  # the premul_sum factor every test uses
_SIGNED_OF_WIDTH = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
BITS = {dtype: 8 * dtype.itemsize for dtype in (*_SIGNED_OF_WIDTH.values(), *UNSIGNED)}


def valid_ops(dtype: torch.dtype) -> list:
    """The reduce op names ("sum", "avg", ...) ``funcoll.semantics.check_reduction`` accepts for ``dtype`` (it raises
    TypeError for the others), in ``funcoll.semantics.OPS`` order (``ReduceOp``'s)."""
    ops = []
    for op in OPS:
        try:
            check_reduction("reference", Reduction(op, PREMUL if op is ReduceOp.PREMUL_SUM else None), dtype)
        except TypeError:
            continue
        ops.append(str(op))
    return ops


def make(dtype: torch.dtype, shape, rank: int, salt, values: str = "random") -> torch.Tensor:
    """Rank ``rank``'s input, the same in every process for the same arguments. ``values``: "random" (floats N(0, 2²),
    complex N(0, 1) parts; integers over the dtype's whole range, 64-bit ones even on even ranks and odd on odd ones,
    element 0 = 0 or -1: MAX over [0, -1] tells signed from unsigned, intel/torch-xpu-ops#3059), "small" (integers
    1..3: products and averages over a few ranks stay exact and in range; floats as "random") or "grid"
    (integer-valued floats in [-8, 8], float8 [-16, 16], complex both parts: sums and products over a few ranks are
    exact, an average rounds once; integers as "random")."""
    if values not in ("random", "small", "grid"):
        raise ValueError(f"values={values!r}: use random, small or grid")
    g = torch.Generator().manual_seed(zlib.crc32(f"{salt}/{rank}/{dtype}".encode()))
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=g).bool()
    if values == "grid" and (dtype.is_floating_point or dtype.is_complex):
        lim = 16 if dtype in FLOAT8 else 8
        parts = [torch.randint(-lim, lim + 1, shape, generator=g).float() for _ in range(2 if dtype.is_complex else 1)]
        return (torch.complex(*parts) if dtype.is_complex else parts[0]).to(dtype)
    if dtype.is_complex:
        return torch.complex(torch.randn(shape, generator=g), torch.randn(shape, generator=g)).to(dtype)
    if dtype.is_floating_point:
        return (torch.randn(shape, generator=g) * 2).to(dtype)
    if values == "small":
        return torch.randint(1, 4, shape, generator=g).to(dtype)
    bits = BITS[dtype]
    if bits == 64:
        t = torch.randint(-2 ** 62, 2 ** 62, shape, generator=g, dtype=torch.int64) * 2 + rank % 2
        if t.numel():
            t.view(-1)[0] = -1 if rank % 2 else 0
        return t.view(dtype)
    lo = 0 if dtype in UNSIGNED else -2 ** (bits - 1)
    return torch.randint(lo, lo + 2 ** bits, shape, generator=g, dtype=torch.int64).to(dtype)


def _to_ints(t: torch.Tensor) -> list:
    if t.dtype == torch.uint64:
        return [x % 2 ** 64 for x in t.view(torch.int64).reshape(-1).tolist()]
    return t.to(torch.int64).reshape(-1).tolist()


def _from_ints(vals: list, dtype: torch.dtype, shape) -> torch.Tensor:
    """``vals`` wrapped to ``dtype``: built as the signed integers of the same bits, then viewed as ``dtype``."""
    signed = torch.tensor([wrap_int(v, BITS[dtype]) for v in vals], dtype=torch.int64)
    return signed.to(_SIGNED_OF_WIDTH[dtype.itemsize]).view(dtype).reshape(shape)


_BOOL_MEANING: Dict[str, Callable] = {"any": any, "all": all, "parity": lambda c: sum(c) % 2 == 1}  # by bool_count


def reduce(op, inputs, factor=PREMUL) -> torch.Tensor:
    """Reduces every rank's input (``inputs[r]`` is rank r's) with ``op`` elementwise, independently of torch's
    collectives. ``op``: a name ("sum", "AVG", ...) or a ``torch.distributed.ReduceOp`` member; ``factor``: the
    premul_sum factor. The result has the inputs' dtype and shape (on the CPU)."""
    row = op_named(op if isinstance(op, str) else op.name)  # its reference functions (None: the op refuses the dtype)
    if row is None:
        raise ValueError(f"funcoll.reference.reduce: unknown reduce op {op!r}")
    xs = [x.detach().cpu() for x in inputs]
    dtype, shape = xs[0].dtype, xs[0].shape
    if dtype == torch.bool:
        cols = zip(*[x.reshape(-1).tolist() for x in xs])
        return torch.tensor([_BOOL_MEANING[str(row.bool_count)](c) for c in cols], dtype=torch.bool).reshape(shape)
    if dtype in BITS:
        cols = zip(*[_to_ints(x) for x in xs])
        return _from_ints([row.exact(c) for c in cols], dtype, shape)  # type: ignore[misc]
    wide = torch.stack([x.to(torch.complex128 if dtype.is_complex else torch.float64) for x in xs])
    return row.wide(wide, factor).to(dtype)  # type: ignore[misc]


# A floating result over n > 1 ranks passes when |got - want| <= atol + rtol * |want| (elementwise), with
#   rtol = the stricter of torch.testing.assert_close's default for the dtype and TOL[dtype] * n;
#   atol, "grid" inputs: the stricter of torch.testing's default and 4 * TOL[dtype] * n (every partial sum or
#         product is exact in the dtype: only the last rounding, or a strategy's float32 step, can differ);
#   atol, "random" inputs: 4 * TOL[dtype] * n (each of the n - 1 roundings of a partial result can cost an ulp of
#         the partial's magnitude, which cancellation can leave far above the result's).
# One rank rounds nothing, and neither do MIN/MAX: exact. Integers, bool, float8 and float4: bit for bit.
TOL = {torch.float32: 1e-5, torch.complex64: 1e-5, torch.float16: 2e-3, torch.bfloat16: 2e-2,
       torch.float64: 1e-12, torch.complex128: 1e-12}
# torch.testing.assert_close's (rtol, atol) per dtype
_DEFAULT = {torch.float16: (1e-3, 1e-5), torch.bfloat16: (1.6e-2, 1e-5), torch.float32: (1.3e-6, 1e-5),
            torch.float64: (1e-7, 1e-7), torch.complex64: (1.3e-6, 1e-5), torch.complex128: (1e-7, 1e-7)}


def tolerance(dtype: torch.dtype, n: int = 1, op: str = "sum", values: str = "random") -> tuple:
    """(rtol, atol) :func:`close` allows a ``dtype`` result of ``op`` over ``n`` ranks whose inputs :func:`make`
    made with ``values``."""
    if n <= 1 or op in ("min", "max") or dtype not in _DEFAULT:
        return 0.0, 0.0
    rtol, atol = _DEFAULT[dtype]
    tol = TOL[dtype] * n
    return min(rtol, tol), (min(atol, 4 * tol) if values == "grid" else 4 * tol)


def close(got: torch.Tensor, want: torch.Tensor, n: int = 1, op: str = "sum",
          values: str = "random") -> str | None:
    """None if ``got`` matches the reference ``want`` of ``op`` over ``n`` ranks (inputs made with ``values``),
    else what differs. The same dtype and shape; floating values within :func:`tolerance`, compared in
    float64/complex128 (a zero tolerance: equal values); integers, bool, float8 and float4: equal bits."""
    got, want = got.detach().cpu(), want.detach().cpu()
    if got.dtype != want.dtype or got.shape != want.shape:
        return f"dtype/shape {got.dtype}{tuple(got.shape)} != {want.dtype}{tuple(want.shape)}"
    if got.dtype in BITS or got.dtype in FLOAT8 or got.dtype in FLOAT4:  # as the signed integers of the same width
        got, want = got.view(_SIGNED_OF_WIDTH[got.dtype.itemsize]), want.view(_SIGNED_OF_WIDTH[got.dtype.itemsize])
    if not (got.dtype.is_floating_point or got.dtype.is_complex):
        bad = got != want
    else:
        rtol, atol = tolerance(got.dtype, n, op, values)
        wide = torch.complex128 if got.is_complex() else torch.float64
        got, want = got.to(wide), want.to(wide)
        bad = ~torch.isclose(got, want, rtol=rtol, atol=atol)
    if not bad.any():
        return None
    if got.numel() <= 16:
        return f"got {got.tolist()} want {want.tolist()}"
    j = int(bad.reshape(-1).nonzero()[0])
    return (f"element {j}: got {got.reshape(-1)[j].item()}, expected {want.reshape(-1)[j].item()} "
            f"({int(bad.sum())} of {got.numel()} elements differ)")
