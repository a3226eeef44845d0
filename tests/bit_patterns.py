"""Inputs for checking that a collective moves bytes: tensors of floating dtypes holding arbitrary bit patterns, built
from integers (never through float arithmetic, which can quiet a NaN), and a bit-for-bit comparison.

For float8 and float4_e2m1fn_x2 (one byte each) a tensor holds every bit pattern of the width, in an order that
depends on the rank and the salt; so do float16 and bfloat16 tensors unless a length is asked for. Otherwise (and for
float32, float64, complex64 as float32 pairs) it holds the IEEE 754 specials of both signs (zeros, the smallest and
largest subnormals, the largest finite, inf, signalling NaNs with the smallest and the largest payload, the canonical
quiet NaN and a quiet NaN with a payload), then random patterns: half of them NaNs with random payloads, half
uniformly random bits. NCCL, gloo and MPI broadcast and scatter copy these bytes as they are; a sum in the float dtype
would not (x86 quiets a signalling NaN, c10's float16/bfloat16 arithmetic goes through float32 and canonicalises NaN
payloads).
"""

from __future__ import annotations

import zlib

import torch

# the integer dtype of each element size, used to build and to compare the bits
INT_OF_SIZE = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
# (exponent bits, mantissa bits) of the formats whose specials are listed
_FORMAT = {torch.float16: (5, 10), torch.bfloat16: (8, 7), torch.float32: (8, 23), torch.float64: (11, 52)}


def _specials(dtype: torch.dtype) -> list:
    """The specials of ``dtype``'s IEEE binary format, as unsigned integers of its width."""
    e, m = _FORMAT[dtype]
    sign, exp = 1 << (e + m), ((1 << e) - 1) << m
    quiet = 1 << (m - 1)
    positive = [0, 1, (1 << m) - 1, exp - 1, exp, exp | 1, exp | (quiet - 1), exp | quiet, exp | quiet | 0x2b]
    return positive + [sign | p for p in positive]


def patterns(dtype: torch.dtype, rank: int, salt, numel=None) -> torch.Tensor:
    """A 1-D tensor of ``dtype`` holding bit patterns (see the module docstring), the same in every process for the
    same arguments; ``numel``: its length (at least 18; default 256 for 4- and 8-byte dtypes, every pattern for
    narrower ones; float8 has every pattern always)."""
    g = torch.Generator().manual_seed(zlib.crc32(f"bits/{salt}/{rank}/{dtype}".encode()))
    if dtype.is_complex:
        real = torch.float32 if dtype == torch.complex64 else torch.float64
        return torch.view_as_complex(patterns(real, rank, salt, 2 * (numel or 256)).view(-1, 2))
    size = dtype.itemsize
    width = 8 * size
    ints = INT_OF_SIZE[size]
    if size == 1 or (size == 2 and numel is None):
        every = torch.randperm(1 << width, generator=g)  # every pattern once
        if size == 2:
            every = every - (every >= 1 << 15).long() * (1 << 16)  # as int16
        return every.to(ints).view(dtype)
    specials = torch.tensor([s - (1 << width) if s >> (width - 1) else s for s in _specials(dtype)])
    count = (numel or 256) - len(specials)
    e, m = _FORMAT[dtype]
    top = 1 << 62 if width == 64 else 1 << (width - 1)
    rand = torch.randint(-top, top, (count,), generator=g, dtype=torch.int64)
    if width == 64:
        rand = rand * 2 + torch.randint(0, 2, rand.shape, generator=g)  # every bit random, the top two as well
    nans = rand[:count // 2]
    nans |= ((1 << e) - 1) << m  # exponent all ones (the sign and the mantissa random): a NaN, rarely inf
    return torch.cat([specials, rand]).to(ints).view(dtype)


def bits(t: torch.Tensor) -> torch.Tensor:
    """``t``'s bits as integers of its element size (complex: of its parts), on the host (a one-byte dtype read as
    uint8 first, in any layout: torch 2.9 copies no float4_e2m1fn_x2)."""
    t = t.detach().cpu()
    if t.element_size() == 1:
        t = t.view(torch.uint8)
    t = t.contiguous()
    if t.is_complex():
        t = torch.view_as_real(t)
    return t.view(INT_OF_SIZE[t.element_size()])


def differ(got: torch.Tensor, want: torch.Tensor):
    """None when ``got`` holds ``want``'s bits (same dtype and shape), else the first element that differs, in hex."""
    if got.dtype != want.dtype or got.shape != want.shape:
        return f"got {got.dtype} {tuple(got.shape)}, want {want.dtype} {tuple(want.shape)}"
    a, b = bits(got).reshape(-1), bits(want).reshape(-1)
    bad = (a != b).nonzero()
    if not bad.numel():
        return None
    i = int(bad[0])
    mask = (1 << (8 * a.element_size())) - 1
    return (f"{bad.numel()} of {a.numel()} elements differ, first at {i}: got {int(a[i]) & mask:#x}, want "
            f"{int(b[i]) & mask:#x}")
