"""Helpers for users' snapshot tests of compiled collectives (public; see docs/testing-compiled.md).

Everything here returns plain, normalised text, stable across runs and machines, meant for expecttest's
``assertExpectedInline``.
"""

from __future__ import annotations

from typing import Iterable, Optional, Sequence, Union

import torch

__all__ = ["xla_collectives"]


def xla_collectives(tensors: Union[torch.Tensor, Sequence[torch.Tensor]],
                    keep: Optional[Iterable[str]] = None) -> str:
    """The collectives of the pending XLA computation producing ``tensors`` (lazy XLA tensors), one normalised
    line each (``opcode(operand shapes) -> result shape  replica_groups=... to_apply=...``), joined by newlines.
    Names, ids, layouts and metadata are removed. ``keep`` lists the HLO opcodes to show (default: the
    collectives; add e.g. ``"multiply"`` to see AVG's scale). Nothing is executed, so the replica groups of a
    virtual world larger than this machine are fine. Needs torch_xla."""
    from .lowering import xla as X

    lines = X.collective_hlo_lines(tensors, X.COLLECTIVE_OPCODES if keep is None else keep)
    return "\n".join(lines)
