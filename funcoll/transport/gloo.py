"""The CPU reference transport: the primitives of a c10d gloo backend.

Its capabilities are the ``gloo`` profile, intersected with the profile named by ``FUNCOLL_PROFILE`` (so
the XCCL or XLA gap-filling paths run for real on any CPU machine). Where that profile has PREMUL_SUM natively (the
``xccl`` profile on torch 2.12+), the transport does what ProcessGroupXCCL does there: it scales the tensor it is
handed in place, then sums (gloo has no PREMUL_SUM): the misbehaviour a reduce_scatter's input would suffer is real.
Under the xccl profile its point-to-point calls also run as oneCCL runs them (:class:`StrictC10dTransport`): a group
replayed in the order given, each receive blocking until its data arrives.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Optional, Sequence

import torch.distributed as dist

from funcoll.semantics import ReduceOp
from funcoll.transport import DONE, P2P, Capabilities, active_profile_name, profile
from funcoll.transport.c10d import C10dTransport, waited


def capabilities(profile_name: Optional[str] = None) -> Capabilities:
    caps = profile("gloo")
    name = profile_name if profile_name is not None else active_profile_name()
    if name and name != "gloo":
        other = profile(name)
        caps = caps.restrict(other)
        if ReduceOp.PREMUL_SUM in other.reduce_ops:  # emulated as XCCL 2.12+ does it (C10dTransport.premul_in_place)
            caps = replace(caps, reduce_ops=caps.reduce_ops | {ReduceOp.PREMUL_SUM},
                           sources={**caps.sources, "gloo.premul_sum": "emulated as ProcessGroupXCCL 2.12+ does it: "
                                    "the tensor handed is scaled in place (mul_), then summed"})
    return caps


# ---------------------------------------------------------------------------------------------------
# Point-to-point as oneCCL runs it: what the xccl profile adds to gloo
# ---------------------------------------------------------------------------------------------------
# gloo never blocks a caller that issues a send or a receive, so on gloo every order of a batch of point-to-point
# operations "works". oneCCL does not (sources read 2026-11):
# * a group (onecclGroupStart ... onecclGroupEnd; ProcessGroupXCCL opens one in startCoalescing and closes it in
#   endCoalescing, so one batch_isend_irecv is one group) is stored and replayed at its end in the order it was given,
#   one operation after the other (oneCCL src/coll/group/group.cpp, group_impl::end; uxlfoundation/oneCCL b382bf7);
# * in that replay a receive blocks the host in its IPC handle exchange until the peer's matching send has been
#   reached, while a send is posted and the replay goes on: a batch that lists an irecv before its isend on every rank
#   deadlocks inside onecclGroupEnd (meta-pytorch/torchcomms#2885, which fixed its XCCL backend by issuing sends first);
# * a single send or receive is a group of one since torch 2.12 (ProcessGroupXCCL::pointToPoint wraps it in an
#   OnecclGroupGuard: intel/torch-xpu-ops#3071, f09e211c9): its receive blocks the same way.
# Not emulated: the isend that busy-polls until its peer posts the receive, reported for a single send issued outside
# any group (sgl-project/sglang#23645: ProcessGroupXCCL before 2.12). funcoll issues no single send of its own in an
# order that needs it (its pairwise all_to_all rounds alternate along each cycle), and cannot reorder a user's separate
# isend calls; docs/xpu.md says so.
class StrictC10dTransport(C10dTransport):
    """A gloo backend whose point-to-point operations run as oneCCL runs them (above): a receive blocks until its data
    has arrived (up to the group's timeout, past which gloo raises), a group is replayed in the order given."""

    def _recv(self, t, src, tag):
        self._received(t, src, tag)
        return DONE

    def _received(self, t, src, tag) -> None:
        # the group's timeout as it is now (dist.set_timeout changes it; gloo's own wait keeps the one it started with)
        self.backend.recv([t], src, tag).wait(self.backend.options._timeout)

    def _p2p_group(self, ops: Sequence[P2P]) -> list:
        handles = []
        for op in ops:  # oneCCL's replay: in the order given, each receive complete before the next operation
            if op.send:
                handles.append(waited(self.backend.send([op.tensor], op.peer, op.tag), [op.tensor]))
            else:
                self._received(op.tensor, op.peer, op.tag)
        return handles


def create(store, rank: int, size: int, timeout, profile_name: Optional[str] = None) -> C10dTransport:
    """A gloo backend of its own for one funcoll group (collective: every rank of the group calls it); under the xccl
    profile its point-to-point operations run as oneCCL runs them (:class:`StrictC10dTransport`)."""
    backend = dist.ProcessGroupGloo(store, rank, size, timeout)
    name = profile_name if profile_name is not None else active_profile_name()
    cls = StrictC10dTransport if name == "xccl" else C10dTransport
    return cls(backend, capabilities(profile_name), "cpu")
