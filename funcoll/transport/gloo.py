"""The CPU reference transport: a c10d gloo backend under the ``gloo`` profile intersected with the one
``FUNCOLL_PROFILE`` names, so the XCCL or XLA gap-filling paths run for real on any CPU machine. Under the xccl profile
it also does what ProcessGroupXCCL does where gloo differs: PREMUL_SUM scales the tensor it is handed in place, then
sums (torch 2.12+), and point-to-point runs as oneCCL runs it (:class:`StrictC10dTransport`)."""

from __future__ import annotations

import collections
import os
import time
from dataclasses import replace
from datetime import timedelta
from typing import Optional

import torch
import torch.distributed as dist

from funcoll.semantics import ReduceOp
from funcoll.transport import DONE, Capabilities, active_profile_name, profile
from funcoll.transport.c10d import C10dTransport


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


# gloo has no backend abort (pytorch/gloo#388): ProcessGroupGloo's abort() and shutdown() return while a collective in
# flight runs on in gloo's worker thread until the group's timeout. A receive nobody sends, waited on for 1 ms, makes
# gloo end them all: its wait's timeout closes every pair of the context (gloo/transport/tcp/unbound_buffer.cc,
# waitRecv: context_->signalException), so every operation in flight fails at once ("Application timeout caused pair
# closure"), in gloo's threads too, and the peers see their connections close. One receive per context a
# ProcessGroupGloo may hold (collectives take context tag % count; funcoll makes one device, so one context).
_ABORT_TAG = (1 << 30) + 0xAB0  # no funcoll or c10d message has such a tag
_ABORT_WAIT = timedelta(milliseconds=1)
_CONTEXTS = 4


class GlooTransport(C10dTransport):
    """The CPU reference transport (:func:`create`): a gloo backend of the group's own, which it can abort."""

    def abort(self) -> None:
        """Closes every connection of the backend: its operations in flight fail at once, and its peers' with them."""
        peers = [(self.rank + k) % self.size for k in range(1, self.size)]
        for i in range(_CONTEXTS if peers else 0):
            for peer in peers:  # a connection that already failed (a dead peer's) raises at once: the next one
                try:
                    self.backend.recv([torch.empty(1)], peer, _ABORT_TAG + i).wait(_ABORT_WAIT)
                except RuntimeError as e:
                    if "Timed out waiting" in str(e):  # the 1 ms ran out: every connection of the context closed
                        break
        super().abort()


class StrictC10dTransport(GlooTransport):
    """A gloo backend whose point-to-point operations run as oneCCL's do (docs/xpu.md, "Point-to-point", has the
    sources): a group is replayed in the order given, a receive blocking until its data has arrived (up to the group's
    timeout, past which gloo raises), a single receive too; and messages are paired as oneCCL pairs them, the k-th send
    from a rank to a peer with the peer's k-th receive from that rank, whatever their tags (ProcessGroupXCCL ignores
    tags). gloo pairs by tag, so each message goes under a tag of its own: its number among this rank's messages to
    (or from) that peer, issued in order on both sides. Not emulated: the isend that busy-polls until its peer posts
    the receive (a single send outside any group, ProcessGroupXCCL before 2.12)."""

    # the sequence tags start here: clear of the tags gloo's own monitored barrier takes from its collective counter
    _SEQ_TAG = 0x46500000

    def __init__(self, backend, caps: Capabilities, device_type: str = "cpu"):
        super().__init__(backend, caps, device_type)
        self._sent: collections.Counter = collections.Counter()  # peer -> messages sent to it
        self._received: collections.Counter = collections.Counter()  # peer -> receives posted from it

    def _seq(self, counts: collections.Counter, peer: int) -> int:
        k = counts[peer]
        counts[peer] = k + 1
        return self._SEQ_TAG + k

    def _send(self, t, dst, tag):
        return super()._send(t, dst, self._seq(self._sent, dst))

    # FUNCOLL_XCCL_LIFECYCLE=oneccl: abort() and teardown as ProcessGroupXCCL's are today (docs/fault-tolerance.md).
    # Its abort() and shutdown() are Backend's empty defaults (intel/torch-xpu-ops#5071, open): an in-flight collective
    # is not interrupted, it runs on (here: to gloo's timeout); and destroying a communicator whose peer is alive
    # blocks (vllm-project/vllm#57374): here, shutdown() returns once every rank of the group has called it, or at the
    # group's timeout.
    oneccl_lifecycle = False
    store = None  # the group's store (create): the teardown's count

    def abort(self) -> None:
        if not self.oneccl_lifecycle:
            super().abort()

    def shutdown(self) -> None:
        if self.oneccl_lifecycle and self.size > 1 and self.store is not None:
            self.store.add("funcoll-teardown", 1)
            end = time.monotonic() + self.backend.options._timeout.total_seconds()
            while self.store.add("funcoll-teardown", 0) < self.size and time.monotonic() < end:
                time.sleep(0.05)
        super().shutdown()

    def _recv(self, t, src, tag):  # a group (Transport._p2p_group: in the order given) waits here too
        # the group's timeout as it is now (dist.set_timeout changes it; gloo's own wait keeps the one it started with)
        self.backend.recv([t], src, self._seq(self._received, src)).wait(self.backend.options._timeout)
        return DONE


def create(store, rank: int, size: int, timeout, profile_name: Optional[str] = None) -> C10dTransport:
    """A gloo backend of its own for one funcoll group (collective: every rank of the group calls it)."""
    backend = dist.ProcessGroupGloo(store, rank, size, timeout)
    name = profile_name if profile_name is not None else active_profile_name()
    if name != "xccl":
        return GlooTransport(backend, capabilities(profile_name), "cpu")
    tp = StrictC10dTransport(backend, capabilities(profile_name), "cpu")
    tp.store = store
    tp.oneccl_lifecycle = os.environ.get("FUNCOLL_XCCL_LIFECYCLE", "").strip().lower() == "oneccl"
    return tp
