"""Transports per device type, and how a group finds the transport for a tensor's device.

A device type plugs in with :func:`register_device`: one factory for funcoll's own process groups (it gets a
:class:`GroupContext`), one for groups made with another backend (it gets the c10d ProcessGroup; used by the
dispatch-key kernels). Tensors of a device type with no funcoll transport are never touched.
"""

from __future__ import annotations

import functools
import threading
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Callable, Dict, Optional, Tuple

import torch

from funcoll.semantics.groups import resolve
from funcoll.transport import Transport

__all__ = ["GroupContext", "register_device", "device_types", "transport_for", "funcoll_factory"]


@dataclass
class GroupContext:
    """What a transport factory knows of a funcoll group."""

    name: str
    store: Any  # a c10d Store private to this group
    rank: int  # group-local
    size: int
    timeout: timedelta
    global_ranks: Tuple[int, ...]
    world_size: int


_funcoll_factories: Dict[str, Callable[[GroupContext], Transport]] = {}
_c10d_factories: Dict[str, Callable[[object, torch.device], Transport]] = {}
_c10d_cache: Dict[Tuple[str, str], Transport] = {}
_lock = threading.Lock()


def register_device(device_type: str, *, funcoll: Optional[Callable] = None,
                    c10d: Optional[Callable] = None) -> None:
    if funcoll is not None:
        _funcoll_factories[device_type] = funcoll
    if c10d is not None:
        _c10d_factories[device_type] = c10d


def device_types():
    return tuple(sorted(set(_funcoll_factories) | set(_c10d_factories)))


def funcoll_factory(device_type: str) -> Callable[[GroupContext], Transport]:
    _ensure_loaded(device_type)
    try:
        return _funcoll_factories[device_type]
    except KeyError:
        raise ValueError(
            f"funcoll: no transport for device type {device_type!r} (have: {', '.join(device_types())})"
        ) from None


def _ensure_loaded(device_type: str) -> None:
    if device_type in _funcoll_factories or device_type in _c10d_factories:
        return
    import importlib

    module = f"{__name__.rpartition('.')[0]}.{device_type}"  # funcoll.transport.<device type>
    try:
        importlib.import_module(module)
    except ModuleNotFoundError as e:
        # no transport for this device type, or its library (torch_xla) is not installed: funcoll leaves its tensors
        # alone. Any other error (a torch_xla that is installed but broken) is raised, not read as "no transport".
        if e.name != module and (e.name or "").split(".")[0] != "torch_xla":
            raise


# (group name, device type) -> (process group, transport): the dispatch-key kernels look a group up by name for every
# collective; an entry holds while c10d still knows that group by that name (a destroyed and re-created world reuses
# names), which costs one dict lookup
_by_name: Dict[Tuple[str, str], Tuple[Any, Transport]] = {}


@functools.lru_cache(maxsize=None)
def _c10d_world():
    """c10d's group registry (imported once: the kernels ask for it on every collective)."""
    from torch.distributed.distributed_c10d import _world

    return _world


def transport_for(group, device) -> Transport:
    """The transport that serves ``group`` (a ProcessGroup or a group name) for tensors on ``device``."""
    if type(group) is str:
        key = (group, device.type if type(device) is torch.device else torch.device(device).type)
        hit = _by_name.get(key)
        if hit is not None and _c10d_world().pg_names.get(hit[0]) == group:
            return hit[1]
        tp = _transport_for(group, device)
        try:
            _by_name[key] = (resolve(group), tp)
        except RuntimeError:  # a group c10d does not hold (a virtual one): not cached
            pass
        return tp
    return _transport_for(group, device)


def _transport_for(group, device) -> Transport:
    if isinstance(group, str):
        try:
            pg = resolve(group)
        except RuntimeError:
            from funcoll.semantics.groups import lookup

            lookup(group)  # raises the ValueError naming the fix
            raise
    else:
        pg = group
    device = torch.device(device)
    own = getattr(pg, "funcoll_transport", None)  # a funcoll group: its own transports (no import of the entry layer)
    if own is not None:
        return own(device.type)
    name = pg.group_name
    key = (name, device.type)
    tp = _c10d_cache.get(key)
    if tp is None:
        _ensure_loaded(device.type)
        factory = _c10d_factories.get(device.type)
        if factory is None:
            raise ValueError(f"funcoll: no transport for {device.type} tensors on group {name!r}")
        with _lock:
            tp = _c10d_cache.get(key)
            if tp is None:
                tp = _c10d_cache[key] = factory(pg, device)
    return tp


def forget(group_name: str) -> None:
    """Drops cached transports of a destroyed group."""
    with _lock:
        for key in [k for k in _c10d_cache if k[0] == group_name]:
            del _c10d_cache[key]
        for key in [k for k in _by_name if k[0] == group_name]:
            del _by_name[key]


# -- the CPU reference transport ---------------------------------------------------------------------
def _cpu_funcoll(ctx: GroupContext) -> Transport:
    from torch.distributed import PrefixStore

    from funcoll.transport import gloo

    return gloo.create(PrefixStore("funcoll-gloo/", ctx.store), ctx.rank, ctx.size, ctx.timeout)


def _cpu_c10d(pg, device) -> Transport:
    import torch.distributed as dist

    from funcoll.transport import gloo

    backend = pg._get_backend(torch.device("cpu"))
    if not isinstance(backend, dist.ProcessGroupGloo):
        raise ValueError(f"funcoll: the CPU backend of group {pg.group_name!r} is {type(backend).__name__}, "
                         "funcoll drives gloo on CPU")
    return gloo.C10dTransport(backend, gloo.capabilities(), "cpu")


register_device("cpu", funcoll=_cpu_funcoll, c10d=_cpu_c10d)
