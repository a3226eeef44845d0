"""The process group's observability hooks (entry layer): group creation and transport choice go to the funcoll log
(``TORCH_LOGS="+funcoll"``), and ``FUNCOLL_PROBE=1`` verifies a new transport's native requests (funcoll.probe)."""

from __future__ import annotations

import logging
import os
import weakref

from funcoll.algorithms.observe import LOG, _ranks

__all__ = ["on_group", "on_transport"]


def on_group(pg, store, lazy: bool) -> None:
    """``ProcessGroupFuncoll.__init__``: a funcoll group was created."""
    if LOG.isEnabledFor(logging.INFO):
        kind = type(store).__name__
        from funcoll.entry.process_group import _unwrap_store

        LOG.info("group %s created: rank %d of %d, global ranks %s, world size %d, store %s, CPU transport %s",
                 pg.group_name or "(unnamed)", pg.rank(), pg.size(), _ranks(pg._global_ranks), pg._world_size,
                 type(_unwrap_store(store)).__name__ if kind == "PrefixStore" else kind,
                 "at the first CPU collective" if lazy else "now")


def on_transport(pg, device_type: str, tp):
    """``ProcessGroupFuncoll.transport``: a transport was created for one device type of a funcoll group. Tags it
    with the group's name, logs the choice and, with ``FUNCOLL_PROBE=1``, verifies its native requests
    (:func:`funcoll.probe.probe_transport`). Returns the transport."""
    tp._funcoll_pg = weakref.ref(pg)
    if LOG.isEnabledFor(logging.INFO):
        if device_type == "cpu" and pg.options.profile is not None:
            why = f"profile {pg.options.profile!r} from funcoll.Options"
        elif os.environ.get("FUNCOLL_PROFILE", "").strip():
            why = f"FUNCOLL_PROFILE={os.environ['FUNCOLL_PROFILE'].strip()}"
        else:
            why = "the running stack"
        LOG.info("group %s rank %d/%d: %s transport %s, capabilities %s (%s)", pg.group_name or "(unnamed)",
                 pg.rank(), pg.size(), device_type, type(tp).__name__, tp.caps.name, why)
    if os.environ.get("FUNCOLL_PROBE", "").strip().lower() in ("1", "true", "yes", "on"):
        from funcoll.entry import probe

        probe.at_creation(pg, device_type, tp)
    return tp
