"""funcoll under torchft (meta-pytorch/torchft >= 0.2): the process groups torchft's ``Manager`` reconfigures on every
quorum, with funcoll's collectives inside (docs/fault-tolerance.md).

- :class:`ProcessGroupFuncoll`: torchft's ``ProcessGroupWrapper``; each ``configure`` (the Manager calls it with a
  new store prefix per quorum) aborts the old group and makes a fresh funcoll group on that prefix.
- :class:`ProcessGroupBabyFuncoll`: torchft's ``ProcessGroupBaby``; the funcoll group runs in a subprocess, and
  ``abort``/``shutdown`` kill it, which ends a collective stuck in any library (XCCL's ``abort()`` does nothing:
  intel/torch-xpu-ops#5071; gloo has no backend abort: pytorch/gloo#388).

Both serve CPU and XPU tensors with funcoll's gap filling (AVG, PREMUL_SUM, bitwise ops, uneven all_to_all,
reduce_scatter, ...); a reduce op is passed on as it is, never mapped to another. ``xla`` and ``tpu`` tensors are
refused before anything is sent (their runtimes' worlds are fixed when the process starts); their replica dimension
goes over CPU tensors.
"""

from __future__ import annotations

import functools
from datetime import timedelta
from typing import List, Optional

import torch
import torch.distributed as dist
from torch.utils._pytree import tree_flatten
from torchft.process_group import ProcessGroupBaby, ProcessGroupWrapper

from funcoll.entry.methods import METHODS
from funcoll.entry.process_group import Options
from funcoll.entry.process_group import ProcessGroupFuncoll as _FuncollGroup

__all__ = ["ProcessGroupFuncoll", "ProcessGroupBabyFuncoll", "DEVICE_TYPES", "UNSERVED"]

# the device types a quorum's group serves (what torchft registers a group for, CUDA aside: funcoll has no CUDA
# transport)
DEVICE_TYPES = ("cpu", "xpu")

# device type -> why a torchft quorum cannot carry its tensors (docs/fault-tolerance.md has the sources)
UNSERVED = {
    "xla": "torch_xla's PJRT world is fixed when the process starts (torch_xla.runtime.world_size()), and a "
           "quorum's other members are other jobs, outside it",
    "tpu": "TorchTPU's ProcessGroupTpu spans the TPU slice the process started in (its first group must be the "
           "whole world, one TPU per process), and a quorum's other members are other slices",
}


# the collective methods of torchft's process groups: the c10d methods (funcoll's rows) its wrapper class defines, each
# by the name torchft gives it (broadcast_one calls broadcast; barrier's check finds no tensor)
_METHODS = tuple(name for name in METHODS if name in vars(ProcessGroupWrapper))


def _served(method: str, fn):
    """``fn`` (a collective method of torchft's), after a check on the calling rank: a tensor of a device type of
    :data:`UNSERVED` is a ValueError naming the fix, before anything is sent or moved to shared memory."""

    @functools.wraps(fn)
    def run(self, *args, **kwargs):
        leaves, _ = tree_flatten([args, kwargs])
        for device_type in dict.fromkeys(t.device.type for t in leaves if isinstance(t, torch.Tensor)):
            why = UNSERVED.get(device_type)
            if why is not None:
                raise ValueError(f"funcoll.torchft: {method} on {device_type} tensors cannot cross torchft replica "
                                 f"groups: {why}; send a CPU copy instead (t.cpu()); nothing was sent")
        return fn(self, *args, **kwargs)

    return run


def _group(store, rank: int, world_size: int, timeout: timedelta, name: str = "",
           global_ranks: Optional[List[int]] = None, options: Optional[Options] = None) -> _FuncollGroup:
    ranks = list(global_ranks or ())
    if len(ranks) != world_size or len(set(ranks)) != world_size or min(ranks, default=0) < 0:
        ranks = []  # torchft's ranks of the quorum, when they describe it (else the group's own)
    return _FuncollGroup(store, rank, world_size, timeout, group_name=name, global_ranks=ranks,
                         world_size=max(ranks, default=world_size - 1) + 1, options=options)


def _register_devices(pg, name: str) -> str:
    """torchft's ``ProcessGroup._register`` with the device types of :data:`DEVICE_TYPES` this machine has: ``cpu``,
    and ``xpu`` when present (torchft lists ``cuda`` first, which funcoll does not serve)."""
    group_name = f"{pg.getBackendName()}:{name}"
    devices = [d for d in DEVICE_TYPES if d == "cpu" or getattr(torch, d).is_available()]
    dist.Backend.register_backend(group_name, lambda *args: pg, devices=devices)
    return group_name


class ProcessGroupFuncoll(ProcessGroupWrapper):
    """torchft's reconfigurable process group over a funcoll group: every ``configure`` aborts the old group and
    creates a new :class:`funcoll.ProcessGroupFuncoll` on the quorum's store prefix (it rendezvouses before
    ``configure`` returns, as torchft requires). ``timeout`` bounds the rendezvous and every collective;
    :meth:`set_timeout` also applies to the live group. ``options``: :class:`funcoll.Options` for every quorum's
    group (a capability profile, the size guard)."""

    _pg: Optional[dist.ProcessGroup]  # torchft's: the live group (None before the first quorum and after shutdown)

    def __init__(self, timeout: timedelta = timedelta(seconds=60), options: Optional[Options] = None) -> None:
        super().__init__(timeout=timeout)
        self._options = options
        self._store_addr = ""

    def configure(self, store_addr: str, replica_id: str, rank: int, world_size: int,
                  quorum_id: Optional[int] = None, group_rank: Optional[int] = None,
                  group_world_size: Optional[int] = None, global_ranks: Optional[list[int]] = None) -> None:
        self._store_addr = store_addr
        super().configure(store_addr, replica_id, rank, world_size, quorum_id, group_rank, group_world_size,
                          global_ranks)

    def _name(self) -> str:
        """The funcoll group's name, as torchft's gloo class names its backends (``torchft_quorum_<id>_rank_<group
        rank>``); without a quorum id, the store prefix the group was made on."""
        if self._quorum_id is not None:
            return f"torchft_quorum_{self._quorum_id}_rank_{self._group_rank or 0}"
        return "torchft:" + self._store_addr.partition("/")[2]

    def _create_pg(self, store, rank: int, world_size: int) -> _FuncollGroup:
        return _group(store, rank, world_size, self._timeout, self._name(), self._global_ranks, self._options)

    def getBackendName(self) -> str:
        return "torchft-funcoll"

    _register = _register_devices

    def set_timeout(self, timeout: timedelta) -> None:
        super().set_timeout(timeout)
        if self._pg is not None:
            self._pg.set_timeout(timeout)

    def shutdown(self) -> None:
        """The group's backends shut down (their peers see the connection close at once), then dropped."""
        pg, self._pg = self._pg, None
        if pg is not None:
            pg.shutdown()


class ProcessGroupBabyFuncoll(ProcessGroupBaby):
    """torchft's subprocess group with a funcoll group in the child. Tensors move through shared memory (XPU
    tensors through IPC handles, as torchft's Baby groups do); every wait is bounded by ``timeout`` in this process
    (``TimeoutError``), and :meth:`abort` and :meth:`shutdown` kill the child, whatever its collective is doing.
    The child's group has c10d's default timeout (:data:`CHILD_TIMEOUT`): this process's waits are the bound."""

    CHILD_TIMEOUT: timedelta = dist.default_pg_timeout

    @classmethod
    def _create_pg(cls, store, rank: int, world_size: int) -> _FuncollGroup:
        return _group(store, rank, world_size, cls.CHILD_TIMEOUT)

    def getBackendName(self) -> str:
        return "torchft-baby-funcoll"

    _register = _register_devices

    def shutdown(self) -> None:
        """torchft's shutdown, with the child killed before the thread that reads its futures is joined: a wait on
        the child ends at once, and so does that thread's poll (its pipe's other end is gone). torchft's own order
        joins the thread first, which wakes when the child exits on its own: a child stuck in a collective never
        does, so the join waits for the poll's 10 s tick (docs/performance.md) and fails with "future thread did not
        exit" when the tick comes late."""
        for pipe in (self._pipe, self._future_pipe):
            if pipe is not None:
                pipe.close()
        if self._p is not None:
            self._p.kill()
        super().shutdown()  # closes and kills again (no-ops), joins the thread

    def abort(self) -> None:
        """The child is killed (torchft's Baby groups have no abort of their own: the base class does nothing)."""
        self.shutdown()


for _cls in (ProcessGroupFuncoll, ProcessGroupBabyFuncoll):
    for _m in _METHODS:
        setattr(_cls, _m, _served(_m, getattr(_cls, _m)))
del _cls, _m
