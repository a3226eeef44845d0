"""The CPU reference transport: the primitives of a c10d gloo backend.

Its capabilities are the ``gloo`` profile, intersected with the profile named by ``FUNCOLL_PROFILE`` (so
the XCCL or XLA gap-filling paths run for real on any CPU machine). Where that profile has PREMUL_SUM natively (the
``xccl`` profile on torch 2.12+), the transport does what ProcessGroupXCCL does there: it scales the tensor it is
handed in place, then sums (gloo has no PREMUL_SUM): the misbehaviour a reduce_scatter's input would suffer is real.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Optional

import torch
import torch._C._distributed_c10d as C
import torch.distributed as dist

from funcoll.semantics import ReduceOp, Reduction
from funcoll.transport import Capabilities, Transport, _run_before_send, active_profile_name, profile

_C10D_OP = {
    ReduceOp.SUM: dist.ReduceOp.SUM, ReduceOp.AVG: dist.ReduceOp.AVG, ReduceOp.PRODUCT: dist.ReduceOp.PRODUCT,
    ReduceOp.MIN: dist.ReduceOp.MIN, ReduceOp.MAX: dist.ReduceOp.MAX, ReduceOp.BAND: dist.ReduceOp.BAND,
    ReduceOp.BOR: dist.ReduceOp.BOR, ReduceOp.BXOR: dist.ReduceOp.BXOR,
}


def c10d_op(red: Reduction):
    if red.op is ReduceOp.PREMUL_SUM:  # native only where a profile lists it (XCCL scale-up, when enabled)
        return dist._make_nccl_premul_sum(red.factor)  # type: ignore[arg-type]
    return _C10D_OP[red.op]


def _allreduce_options(red: Reduction) -> C.AllreduceOptions:
    o = C.AllreduceOptions()
    o.reduceOp = c10d_op(red)
    return o


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


class C10dTransport(Transport):
    """Primitives of a c10d backend object (ProcessGroupGloo, ProcessGroupXCCL, ...).

    ``premul_in_place`` (True on gloo, which has no PREMUL_SUM: only a profile lists it, the xccl profile on torch
    2.12+): a PREMUL_SUM is done as ProcessGroupXCCL 2.12+ does it, ``t.mul_(factor)`` on the tensor handed (a
    reduce_scatter's *input*), then SUM."""

    def __init__(self, backend, caps: Capabilities, device_type: str = "cpu"):
        super().__init__(backend.rank(), backend.size(), caps)
        self.backend = backend
        self.device_type = device_type
        self.premul_in_place = isinstance(backend, dist.ProcessGroupGloo)

    def _premul(self, t: torch.Tensor, red: Reduction) -> Reduction:
        """The reduction to hand the backend for ``red`` on ``t``: PREMUL_SUM's factor as the backend needs it (a
        scalar tensor on ``t``'s device, in its dtype: XCCL multiplies ``t`` by it), or, with ``premul_in_place``,
        ``t`` scaled in place and SUM."""
        f = red.factor
        assert f is not None  # semantics.parse_reduction refuses a PREMUL_SUM without one
        if isinstance(f, torch.Tensor):
            f = f.to(device=t.device, dtype=t.dtype).reshape(())
        if self.premul_in_place:
            t.mul_(f)
            return Reduction(ReduceOp.SUM)
        return Reduction(ReduceOp.PREMUL_SUM, f)

    def _all_reduce(self, t, red):
        if red.op is ReduceOp.PREMUL_SUM:
            red = self._premul(t, red)
        return self.backend.allreduce([t], _allreduce_options(red))

    def all_reduce_functional(self, t, red: Reduction):
        """The compiled kernels' native all_reduce: only called with a request the planner found native
        (``algorithms.native_all_reduce``), so the capability check is not repeated; the count and the backend's
        options are made once per (op, dtype) (the options are read by the backend when called, never kept)."""
        if type(self)._all_reduce is not C10dTransport._all_reduce or red.op is ReduceOp.PREMUL_SUM:
            return super().all_reduce_functional(t, red)  # a subclass's own primitive, or a factor per call
        tally, opts = self._all_reduce_form(red, t.dtype, _allreduce_options)
        out = t.clone(memory_format=torch.contiguous_format)
        _run_before_send()
        tally.n += 1
        return out, self.backend.allreduce([out], opts)

    def _all_gather(self, out, inp):
        return self.backend._allgather_base(out, inp, C.AllgatherOptions())

    def _reduce_scatter(self, out, inp, red):
        if red.op is ReduceOp.PREMUL_SUM:
            red = self._premul(inp, red)
        o = C.ReduceScatterOptions()
        o.reduceOp = c10d_op(red)
        return self.backend._reduce_scatter_base(out, inp, o)

    def _all_to_all(self, out, inp, out_splits, in_splits):
        return self.backend.alltoall_base(out, inp, out_splits or [], in_splits or [], C.AllToAllOptions())

    def _broadcast(self, t, src):
        o = C.BroadcastOptions()
        o.rootRank = src
        o.rootTensor = 0
        return self.backend.broadcast([t], o)

    def _reduce(self, t, dst, red):
        o = C.ReduceOptions()
        o.reduceOp = c10d_op(red)
        o.rootRank = dst
        o.rootTensor = 0
        return self.backend.reduce([t], o)

    def _gather(self, outs, inp, dst):
        o = C.GatherOptions()
        o.rootRank = dst
        return self.backend.gather([list(outs)] if outs is not None else [], [inp], o)

    def _scatter(self, out, inps, src):
        o = C.ScatterOptions()
        o.rootRank = src
        return self.backend.scatter([out], [list(inps)] if inps is not None else [], o)

    def _send(self, t, dst, tag):
        return self.backend.send([t], dst, tag)

    def _recv(self, t, src, tag):
        return self.backend.recv([t], src, tag)

    def _barrier(self):
        return self.backend.barrier(C.BarrierOptions())


def create(store, rank: int, size: int, timeout, profile_name: Optional[str] = None) -> C10dTransport:
    """A gloo backend of its own for one funcoll group (collective: every rank of the group calls it)."""
    backend = dist.ProcessGroupGloo(store, rank, size, timeout)
    return C10dTransport(backend, capabilities(profile_name), "cpu")
