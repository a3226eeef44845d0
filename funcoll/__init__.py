"""funcoll: one collective path for PyTorch on TPU (torch_xla, TorchTPU) and Intel GPU (XPU), with a CPU reference.

``import funcoll`` imports the layers, registers the torch.distributed backend ``"funcoll"`` and overrides nothing.
``funcoll.install()`` puts funcoll's kernels on the ``_c10d_functional`` ops of the accelerators present. The tools
beside the layers (probe, report, replicas, launch, testing) are imported on first use (``funcoll.probe`` too).
"""

from __future__ import annotations

import importlib
import os
from typing import Optional

from funcoll import algorithms, transport
from funcoll.entry import flight_recorder
from funcoll.entry import group_state as debug  # the per-group switches: set_debug, set_guard, sequence_number
from funcoll.entry.c10d_patches import patch_monitored_barrier, register_backend
from funcoll.entry.errors import CollectiveError, CollectiveMismatchError, CollectiveTimeoutError
from funcoll.entry.kernels import install, installed, uninstall
from funcoll.entry.process_group import TRANSPORT_HOOKS, FuncollWork, Options, ProcessGroupFuncoll
from funcoll.semantics import groups
from funcoll.transport import PROFILES, Capabilities

__version__ = "0.1.0"

__all__ = ["install", "uninstall", "installed", "capabilities", "Options", "ProcessGroupFuncoll",
           "FuncollWork", "Capabilities", "PROFILES", "record", "groups", "probe",
           "CollectiveError", "CollectiveTimeoutError", "CollectiveMismatchError", "debug", "flight_recorder"]

_LAZY_SUBMODULES = ("probe", "report", "replicas", "launch", "testing")  # imported by __getattr__ on first use

record = algorithms.record

register_backend()
patch_monitored_barrier()  # torch 2.9: dist.monitored_barrier reaches funcoll groups (others: unchanged)


def __getattr__(name: str):
    """``funcoll.probe`` and the other tools of ``_LAZY_SUBMODULES``, imported on first use (PEP 562)."""
    if name in _LAZY_SUBMODULES:
        return importlib.import_module(f"funcoll.{name}")  # the import sets the attribute: called once per name
    raise AttributeError(f"module 'funcoll' has no attribute {name!r}")


def _probe_at_creation(group, device_type: str, transport_made) -> None:
    """``FUNCOLL_PROBE=1``, read as each group makes a transport: :func:`funcoll.probe.at_creation` probes it."""
    if os.environ.get("FUNCOLL_PROBE", "").strip().lower() in ("1", "true", "yes", "on"):
        from funcoll import probe

        probe.at_creation(group, device_type, transport_made)


TRANSPORT_HOOKS.append(_probe_at_creation)


def capabilities(device_type: str, profile: Optional[str] = None) -> Capabilities:
    """What funcoll's transport for ``device_type`` does natively (the rest funcoll fills); ``profile`` names a
    capability profile ("gloo", "xccl", "xla", "torchtpu") to read instead (for "cpu": intersected with gloo's)."""
    import sys

    from funcoll.transport.registry import _ensure_loaded

    module = "gloo" if device_type == "cpu" else device_type  # funcoll.transport.<module>, when it exists
    _ensure_loaded(module)
    mod = sys.modules.get(f"funcoll.transport.{module}")
    if mod is not None and hasattr(mod, "capabilities"):
        return mod.capabilities(profile)
    return transport.profile(profile or device_type)
