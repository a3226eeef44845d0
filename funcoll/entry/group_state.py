"""The state of one funcoll group, built once in ``ProcessGroupFuncoll.__init__`` and passed explicitly: its name,
store and timeout, its flight recorder trace (and so its global ranks and sequence numbers), the switches, the size
guard's backend. The switches (the debug mode, the size guard, the NaN check) are per group, read when
the group is created (docs/conformance.md); the functions below are public as ``funcoll.debug``.
"""

from __future__ import annotations

import os
from datetime import timedelta
from typing import Any, Optional, Sequence

import torch._C._distributed_c10d as C
import torch.distributed as dist
from torch.testing._internal.distributed.fake_pg import FakeStore

from funcoll.entry import peers
from funcoll.entry.flight_recorder import GroupTrace

__all__ = ["GroupState", "set_debug", "debug_enabled", "set_guard", "guard_enabled", "sequence_number",
           "guard_from_env", "is_local_store", "unwrap_store"]

_TRUE = ("1", "true", "yes", "on", "detail")
_FALSE = ("0", "false", "no", "off")


def _switch(var: str) -> bool:
    """``var``: 1/true/yes/on turns it on, 0/false/no/off off; unset, torch's convention for cross-rank checks: on
    under ``TORCH_DISTRIBUTED_DEBUG=DETAIL``, off otherwise (a user's job pays for no check by default)."""
    v = os.environ.get(var, "").strip().lower()
    if v in _TRUE:
        return True
    if v in _FALSE:
        return False
    return dist.get_debug_level() == dist.DebugLevel.DETAIL


def guard_from_env() -> bool:
    return _switch("FUNCOLL_GUARD")


_LOCAL_STORES = (dist.HashStore, FakeStore)
_SUCCESS = C.ErrorType.SUCCESS  # c10d's Backend::getError


def unwrap_store(store):
    while isinstance(store, dist.PrefixStore):
        store = store.underlying_store
    return store


def is_local_store(store) -> bool:
    """A store that cannot rendezvous other processes (HashStore, FakeStore): a virtual world in one process."""
    return isinstance(unwrap_store(store), _LOCAL_STORES)


class GroupState:
    def __init__(self, store, rank: int, size: int, timeout: timedelta, name: str, global_ranks: Sequence[int],
                 guard: Optional[bool] = None):
        self.base_store = store  # the group's store; ``store``: its prefix of the last reconfigure
        self.set_timeout(timeout)
        self.local_store = is_local_store(store)
        self.name = name  # the group's name ("" until c10d names it); its trace has its global ranks
        self.trace = GroupTrace(name or "(unnamed)", global_ranks, rank, size)
        self.guard_default = guard_from_env() if guard is None else bool(guard)
        self.nan_check = os.environ.get("TORCH_DIST_NAN_CHECK", "0") == "1"
        self.reconfigure(store, rank, size, global_ranks)

    def reconfigure(self, store, rank: int, size: int, global_ranks: Sequence[int]) -> None:
        """The group's membership (at creation, and after a reconfigure): its store prefix, rank, size and global
        ranks; every collective is numbered from 0 again (as gloo's); the fast path's answers, the abort and the last
        error are forgotten."""
        self.store, self.rank, self.size = store, rank, size
        trace = self.trace
        trace.global_ranks, trace.rank, trace.size = tuple(global_ranks), rank, size
        trace.seq = trace.p2p_seq = 0
        self._checkable = size > 1 and not self.local_store
        self.debug = self._checkable and _switch("FUNCOLL_DEBUG")
        self.guard = self._checkable and self.guard_default
        self.native: dict = {}  # the eager fast path's answer per request signature (funcoll.entry.fast_path)
        self.guard_transport: Any = None  # the size guard's: the group's CPU transport (its gathered()), once made
        self.aborted: Optional[str] = None  # why the group was aborted (pg.abort(), a shrink, a reconfigure)
        self.error = _SUCCESS  # c10d's ErrorType of the last failed collective (Backend.get_error)
        self.__dict__.pop("_lost", None)  # the last look at the peers (entry/peers)
        if self._checkable:
            peers.register(self)  # where this rank runs, read by a peer whose collective fails (entry/peers)

    def set_timeout(self, timeout: timedelta) -> None:
        self.timeout, self.timeout_s = timeout, timeout.total_seconds()  # timeout_s: read by every call

    def rename(self, name: str) -> None:
        self.name, self.trace.group = name, name or "(unnamed)"


def _of(group) -> GroupState:
    st = getattr(group, "_state", None)
    if not isinstance(st, GroupState):
        raise ValueError(f"funcoll: {group!r} is not a funcoll process group")
    return st


def set_debug(group, enabled: bool = True) -> None:
    """Turns the debug mode's cross-rank check on or off for one group (every rank of the group must do the same,
    between the same two collectives)."""
    st = _of(group)
    st.debug = bool(enabled) and st._checkable


def debug_enabled(group) -> bool:
    return _of(group).debug


def set_guard(group, enabled: bool = True) -> None:
    """Turns the size guard on or off for one group. Every rank of the group must do the same, between the same two
    collectives (a rank that guards and one that does not would pair a digest exchange with a collective)."""
    st = _of(group)
    st.guard = bool(enabled) and st._checkable


def guard_enabled(group) -> bool:
    return _of(group).guard


def sequence_number(group) -> int:
    """The sequence number the group's next collective will get (the count of collectives so far)."""
    return _of(group).trace.seq
