"""The numerics tests' reference: :mod:`funcoll.reference` (inputs, the reference reduction, the comparator; the probe
uses the same), the valid requests as tests/oracle.py pins them (:func:`valid_ops`: what NCCL, gloo and XCCL accept
plus what funcoll promises, never funcoll's own refusal table), plus what only the tests need: every rank's inputs
(:func:`all_inputs`), the c10d op of a name and :class:`Cases`, which collects failures on a rank.
"""

from __future__ import annotations

import traceback

import torch.distributed as dist

from funcoll.reference import BITS, PREMUL, TOL, close, make, reduce, tolerance
from tests.oracle import valid_ops

__all__ = ["BITS", "PREMUL", "TOL", "all_inputs", "close", "make", "reduce", "tolerance", "valid_ops", "c10d_op",
           "Cases"]


def all_inputs(n: int, dtype, shape, salt, values: str = "random") -> list:
    """Every rank's input (``[make(..., r, ...) for r in range(n)]``)."""
    return [make(dtype, shape, r, salt, values) for r in range(n)]


def c10d_op(name: str):
    """The ``torch.distributed.ReduceOp`` for a name; premul_sum carries :data:`PREMUL`."""
    return dist._make_nccl_premul_sum(PREMUL) if name == "premul_sum" else getattr(dist.ReduceOp, name.upper())


# -- collecting failures on a rank --------------------------------------------------------------------------
class Cases:
    """Runs named checks on a rank; a check returns None (pass) or what failed. The parent asserts on
    ``failures`` (with the rank and the check's name) and ``count``."""

    def __init__(self, rank: int, n: int):
        self.rank, self.n, self.failures, self.count = rank, n, [], 0

    def check(self, name: str, fn) -> None:
        self.count += 1
        try:
            err = fn()
        except Exception as e:  # noqa: BLE001 - reported by name
            err = f"{type(e).__name__}: {e}\n{traceback.format_exc(limit=6)}"
        if err:
            self.failures.append(f"[rank {self.rank}] {name}: {err}")
