"""Groups of point-to-point operations: ``dist.batch_isend_irecv`` (c10d's coalescing manager around a funcoll
group's ``send``/``recv``) and torch.compile's ``batch_p2p_ops``, issued as one group in an order that cannot deadlock.

oneCCL replays a group in the order given, and a receive blocks that replay until the peer's matching send has been
reached, while a send is posted and the replay goes on (docs/xpu.md, "Point-to-point", has the sources; the xccl
profile's CPU transport, :class:`funcoll.transport.gloo.StrictC10dTransport`, runs groups that way). A batch listing
an ``irecv`` before its ``isend`` on every rank of a cycle therefore deadlocks on XCCL, as does torch 2.9's pipeline
warm-up (``_get_init_p2p_neighbors_ops`` lists its receive first). With every send issued before every receive, each
rank's sends are all posted before any of its receives blocks. The sends keep their order among themselves, and so
do the receives, so the k-th message between two ranks (XCCL ignores tags and matches in order; gloo matches per tag
in order) is the same message, and every result is the one the user's order gives on gloo.
"""

from __future__ import annotations

from typing import List, Optional, Sequence

import torch

from funcoll import semantics
from funcoll.algorithms.pending import Pending, _entry, _note
from funcoll.algorithms.tensors import _bits
from funcoll.transport import P2P, Handle, Transport

__all__ = ["P2P", "Batch", "p2p_op", "batch_isend_irecv", "deadlock_free"]

# True: a group is issued sends first (deadlock_free). Tests switch it off to show the user's order deadlocking on
# the xccl profile (tests/xpu/test_xpu_p2p.py); not an API.
_ORDERED = True


def deadlock_free(ops: Sequence[P2P]) -> List[P2P]:
    """``ops`` with every send before every receive, each kind in the order given (a stable partition)."""
    return [op for op in ops if op.send] + [op for op in ops if not op.send]


def p2p_op(tp: Transport, send: bool, tensor: torch.Tensor, peer: int, tag: int = 0) -> P2P:
    """One operation of a group, checked as ``send``/``recv`` check theirs (before anything is sent)."""
    kind, role = ("send", "dst") if send else ("recv", "src")
    semantics.check_root(kind, role, peer, tp.size)
    if peer == tp.rank:
        raise ValueError(f"funcoll.{kind}: {role}={peer} is the calling rank; {kind} to another rank")
    return P2P(send, tensor, peer, tag)


@_entry
def batch_isend_irecv(tp: Transport, ops: Sequence[P2P]) -> Pending:
    """Issues ``ops`` (made by :func:`p2p_op`: group-local peers) as one group of the transport, sends first; complete
    once every operation is, the received data in the caller's tensors."""
    copies = []  # (a receive's tensor, its contiguous stand-in)
    issued = []
    for op in ops:
        mine = op.tensor
        if mine.dtype in semantics.MX:  # as move.send and move.recv: its uint8 view
            _note(f"{mine.dtype} moved as {torch.uint8}")
            mine = mine.view(torch.uint8)
        t = mine.contiguous()
        if not op.send and t is not mine:
            copies.append((mine, t))
        issued.append(op._replace(tensor=_bits(t, tp.caps)))
    if not issued:
        return Pending()
    if _ORDERED:
        ordered = deadlock_free(issued)
        if any(a is not b for a, b in zip(ordered, issued)):
            _note("sends before receives")
        issued = ordered
    return Pending(tp.p2p_group(issued), (lambda: [t.copy_(w) for t, w in copies]) if copies else None)


class Batch(Handle):
    """The operations of one group, held from the group's start (c10d's ``_start_coalescing``) until its end, then
    issued together (:meth:`issue`). Each held operation's :class:`Pending` completes with the whole group."""

    def __init__(self):
        self.ops: List[P2P] = []
        self.tp: Optional[Transport] = None
        self._issued: Optional[Pending] = None

    def hold(self, tp: Transport, op: P2P) -> Pending:
        if self.tp is None:
            self.tp = tp
        elif tp is not self.tp:
            raise ValueError("funcoll: the point-to-point operations of one batch (batch_isend_irecv, a coalescing "
                             "manager) must all be on one device")
        self.ops.append(op)
        p = Pending([self])
        if not op.send:
            p._source = op.peer
        return p

    def issue(self) -> Pending:
        """Issues the held operations as one group (:func:`batch_isend_irecv`)."""
        assert self._issued is None and self.tp is not None
        self._issued = batch_isend_irecv(self.tp, self.ops)
        return self._issued

    def _group(self) -> Pending:
        if self._issued is None:
            raise RuntimeError("funcoll: a point-to-point operation of a batch was waited on before the batch was "
                               "issued (c10d's _end_coalescing issues it); wait on the batch's Work")
        return self._issued

    def wait(self, timeout=None) -> None:
        self._group().wait(timeout)

    def is_completed(self) -> bool:
        return self._issued is not None and self._issued.is_completed()

    def get_future(self):
        return self._group().future()
