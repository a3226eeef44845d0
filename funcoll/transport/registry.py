"""Transports per device type, and how a group finds the transport for a tensor's device.

A device type plugs in with :func:`register_device`: one factory for funcoll's own process groups (it gets a
:class:`GroupContext`), one for groups made with another backend (it gets the c10d ProcessGroup; used by the
dispatch-key kernels). Tensors of a device type with no funcoll transport are never touched.
"""

from __future__ import annotations

import importlib
import threading
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Callable, Dict, Optional, Tuple

import torch
import torch.distributed as dist
from torch.distributed.distributed_c10d import _world  # c10d's group registry

from funcoll.semantics.groups import lookup, resolve
from funcoll.transport import Transport, gloo

__all__ = ["GroupContext", "register_device", "device_types", "transport_for", "funcoll_factory", "c10d_leg"]


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
# (group name, device type) -> (process group, its transport; None for a funcoll group, which is asked each time: a
# reconfigure makes its transports anew). An entry holds for that very group (a destroyed and re-created world reuses
# names: its new group gets an entry of its own). The dispatch-key kernels find a group by name: one dict lookup.
_cache: Dict[Tuple[str, str], Tuple[Any, Optional[Transport]]] = {}
_lock = threading.Lock()


def register_device(device_type: str, *, funcoll: Callable[[GroupContext], Transport],
                    c10d: Callable[[Any, torch.device], Transport]) -> None:
    _funcoll_factories[device_type], _c10d_factories[device_type] = funcoll, c10d


def device_types():
    return tuple(sorted(set(_funcoll_factories) | set(_c10d_factories)))


def funcoll_factory(device_type: str) -> Callable[[GroupContext], Transport]:
    _ensure_loaded(device_type)
    try:
        return _funcoll_factories[device_type]
    except KeyError:
        raise ValueError(f"funcoll: no transport for device type {device_type!r} "
                         f"(have: {', '.join(device_types())})") from None


def _ensure_loaded(device_type: str) -> None:
    if device_type in _funcoll_factories or device_type in _c10d_factories:
        return
    module = f"{__name__.rpartition('.')[0]}.{device_type}"  # funcoll.transport.<device type>
    try:
        importlib.import_module(module)
    except ModuleNotFoundError as e:
        # no transport for this device type, or its library (torch_xla) is not installed: funcoll leaves its tensors
        # alone. Any other error (a torch_xla that is installed but broken) is raised, not read as "no transport".
        if e.name != module and (e.name or "").split(".")[0] != "torch_xla":
            raise


def transport_for(group, device) -> Transport:
    """The transport that serves ``group`` (a ProcessGroup or a group name) for tensors on ``device``."""
    device_type = device.type if type(device) is torch.device else torch.device(device).type
    if isinstance(group, str):  # the dispatch-key kernels' way, every collective
        hit = _cache.get((group, device_type))
        if hit is None or _world.pg_names.get(hit[0]) != group:
            try:
                pg = resolve(group)
            except RuntimeError:
                lookup(group)  # raises the ValueError naming the fix
                raise
            hit = _entry(pg, device)
    else:
        own = getattr(group, "funcoll_transport", None)  # a funcoll group (no import of the entry layer)
        if own is not None:
            return own(device_type)
        hit = _cache.get((group.group_name, device_type))
        if hit is None or hit[0] is not group:
            hit = _entry(group, device)
    return hit[0].funcoll_transport(device_type) if hit[1] is None else hit[1]


def _entry(pg, device) -> Tuple[Any, Optional[Transport]]:
    device = torch.device(device)
    key = (pg.group_name, device.type)
    if hasattr(pg, "funcoll_transport"):
        _cache[key] = (pg, None)
        return _cache[key]
    _ensure_loaded(device.type)
    factory = _c10d_factories.get(device.type)
    if factory is None:
        raise ValueError(f"funcoll: no transport for {device.type} tensors on group {key[0]!r}")
    with _lock:
        hit = _cache.get(key)
        if hit is None or hit[0] is not pg:
            hit = _cache[key] = (pg, factory(pg, device))
            if not hit[1].group_name:  # lent to the kernels: named after the group that lent it
                hit[1].group_name = key[0]
    return hit


def c10d_leg(pg, device_type: str, label: str, create: str, accepts: Callable[[Any], bool], drives: str,
             make: Callable[[Any], Transport]) -> Transport:
    """The transport for the ``device_type`` backend of a group made with another backend: that backend's own when it
    is a funcoll group itself, else ``make(backend)`` once ``accepts(backend)``. A group without such a backend, or
    with one funcoll does not drive, is a ValueError on the calling rank that names ``create`` (how to make a group that
    has one) or ``drives`` (what funcoll drives there)."""
    try:
        backend = pg._get_backend(torch.device(device_type))
    except RuntimeError:
        raise ValueError(f"funcoll: group {pg.group_name!r} has no {label} backend; create it with {create}") from None
    own = getattr(backend, "funcoll_transport", None)
    if own is not None:
        return own(device_type)
    if not accepts(backend):
        raise ValueError(f"funcoll: the {label} backend of group {pg.group_name!r} is {type(backend).__name__}; "
                         f"funcoll drives {drives}")
    return make(backend)


# -- the CPU reference transport ---------------------------------------------------------------------
def cpu_transport(ctx: GroupContext, profile: Optional[str] = None) -> Transport:
    """A funcoll group's CPU transport: a gloo backend of its own, under the store prefix ``funcoll-gloo/``
    (``profile``: run under that backend's capabilities, ``FUNCOLL_PROFILE``)."""
    return gloo.create(dist.PrefixStore("funcoll-gloo/", ctx.store), ctx.rank, ctx.size, ctx.timeout, profile)


def _cpu_c10d(pg, device) -> Transport:
    return c10d_leg(pg, "cpu", "CPU", "init_process_group('gloo') (or backend 'funcoll')",
                    lambda b: isinstance(b, dist.ProcessGroupGloo), "gloo on CPU",
                    lambda b: gloo.GlooTransport(b, gloo.capabilities(), "cpu"))


register_device("cpu", funcoll=cpu_transport, c10d=_cpu_c10d)
