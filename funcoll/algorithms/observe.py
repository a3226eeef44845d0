"""What funcoll did, where a user looks: ``torch.profiler`` ranges, only while a profiler runs (``funcoll::<op>``,
``funcoll::<op> <strategy>``, ``funcoll::native <primitive>``), and the ``funcoll`` torch log
(``TORCH_LOGS="+funcoll"``, the standard ``logging.getLogger("funcoll")``). docs/observability.md describes both."""

from __future__ import annotations

import contextlib
import functools
import inspect
import logging
import threading
from typing import Dict, List, Optional, Tuple

import torch
import torch.autograd.profiler as _prof

from funcoll.semantics import dtype_name, parse_reduction, ranks_text
from funcoll.transport import PRIMITIVES

__all__ = ["LOG", "Scope", "on_install", "on_uninstall", "group_label", "comm_name"]

LOG = logging.getLogger("funcoll")

# ``funcoll`` a torch log (``torch._logging.set_logs(modules=...)``) also when ``TORCH_LOGS``, parsed when torch is
# imported, did not name it (torch registers a name it gives there itself); a torch without the logging registry:
# plain Python logging still works
with contextlib.suppress(Exception):
    from torch._logging import _internal as _tl

    if not _tl.log_registry.is_log("funcoll"):
        _tl.register_log("funcoll", "funcoll")

_RF = torch._C._profiler._RecordFunctionFast
_lock = threading.Lock()
# ``torch.distributed.record_comm(name)`` (torch >= 2.15) names the collectives issued inside it: c10d's Work base
# class titles their profiler ranges with it; so do funcoll's collective range and its flight-recorder entries
_get_comm_name = getattr(getattr(torch._C, "_distributed_c10d", None), "_get_comm_profiling_name", None)


def comm_name() -> str:
    """The ``torch.distributed.record_comm`` name in force on this thread ("" when none, or on torch < 2.15)."""
    return _get_comm_name() if _get_comm_name is not None else ""


# -- describing a collective -------------------------------------------------------------------------------------------
@functools.lru_cache(maxsize=None)
def _params(fn) -> Tuple[str, ...]:
    return tuple(inspect.signature(fn).parameters)[1:]  # after the transport


def group_label(tp) -> str:
    """The name of the group a transport serves (``"?"`` when it cannot be told)."""
    return tp.group_name or "?"


def _tensors(vals) -> List[torch.Tensor]:
    """The tensors among ``vals`` and in the lists and tuples among them."""
    return [t for v in vals for t in (v if isinstance(v, (list, tuple)) else (v,)) if isinstance(t, torch.Tensor)]


def _shapes_dtypes(tensors) -> Dict[str, str]:
    return {"shapes": str([list(t.shape) for t in tensors]),
            "dtypes": ",".join(dict.fromkeys(dtype_name(t.dtype) for t in tensors))}


def _describe(op: str, fn, args, kwargs) -> Tuple[Dict[str, object], List[torch.Tensor], str]:
    """(profiler event args, tensors, the reduce op or "") of one collective call."""
    tp = args[0]
    items = list(zip(_params(fn), args[1:])) + list(kwargs.items())
    red = next((_op_text(val, op) for name, val in items if name == "op" and val is not None), "")
    extra = [f"op={red}" if name == "op" else f"{name}={val}" for name, val in items
             if val is not None and not (isinstance(val, (list, tuple)) and not val) and not _tensors([val])]
    tensors = _tensors(val for _, val in items)
    desc: Dict[str, object] = {"group": group_label(tp), "rank": int(tp.rank), "group_size": int(tp.size),
                               "transport": tp.caps.name, **_shapes_dtypes(tensors)}
    if tp.global_ranks:  # unknown for a transport lent by another backend's group
        desc["global_ranks"] = ranks_text(tp.global_ranks)
    if extra:
        desc["args"] = " ".join(extra)
    return desc, tensors, red


def _op_text(val, op: str) -> str:
    try:
        return str(parse_reduction(val, op))
    except Exception:
        return repr(val)


# -- the profiler view of a transport ----------------------------------------------------------------------------------
_PRIMITIVES = frozenset(PRIMITIVES) - {"send_recv"} | {"send", "recv"}  # the transport's methods that send


class _Traced:
    """A transport seen through the profiler: each native primitive call is a ``funcoll::native <name>`` range.
    Everything else is the transport's own (attribute reads go through; the algorithms write none)."""

    __slots__ = ("_tp",)

    def __init__(self, tp):
        self._tp = tp

    def __getattr__(self, name):
        attr = getattr(self._tp, name)
        if name not in _PRIMITIVES:
            return attr
        tp = self._tp

        def call(*args, **kwargs):
            tensors = _tensors(args)
            info = {"transport": tp.caps.name, **_shapes_dtypes(tensors)}
            red = next((a for a in args if type(a).__name__ == "Reduction"), None)
            if red is not None:
                info["op"] = str(red)
            with _RF(f"funcoll::native {name}", tuple(tensors[:16]), info):
                return attr(*args, **kwargs)

        return call

    def __repr__(self) -> str:
        return repr(self._tp)


# -- one collective: its strategy notes, its ranges, its log line ------------------------------------------------------
_decided: set = set()  # (signature, strategies) already logged


class Scope(list):
    """The strategy notes of one collective (``pending.this_call``). While a profiler runs it opens the
    collective's range at creation and a nested range for each strategy noted; ``close`` ends them and logs the
    decision once per signature when the funcoll log is at DEBUG. ``args`` are the arguments to call the
    algorithm with (the transport wrapped so that its native calls are ranges too)."""

    __slots__ = ("op", "args", "_ranges", "_fn", "_kwargs")

    def __init__(self, op: str, fn, args, kwargs):
        super().__init__()
        self.op, self._fn, self.args, self._kwargs = op, fn, args, kwargs
        self._ranges: Optional[List] = None
        if _prof._is_profiler_enabled and args:
            desc, tensors, _ = _describe(op, fn, args, kwargs)
            name = comm_name()
            if name:  # dist.record_comm: the range is titled with the user's name, as c10d titles its Works
                desc["collective"] = f"funcoll::{op}"
            rf = _RF(name or f"funcoll::{op}", tuple(tensors[:16]), desc)
            rf.__enter__()
            self._ranges = [rf]
            self.args = (_Traced(args[0]),) + tuple(args[1:])

    def append(self, strategy: str) -> None:
        list.append(self, strategy)
        if self._ranges is not None:
            rf = _RF(f"funcoll::{self.op} {strategy}", (), {})
            rf.__enter__()
            self._ranges.append(rf)

    def close(self, args) -> None:
        ranges, self._ranges = self._ranges, None
        for rf in reversed(ranges or ()):
            rf.__exit__(None, None, None)
        if LOG.isEnabledFor(logging.DEBUG) and args:
            try:
                self._log(args)
            except Exception:  # pragma: no cover - a log line never fails a collective
                LOG.debug("funcoll: could not describe a %s call", self.op, exc_info=True)

    def _log(self, args) -> None:
        tp = args[0]
        _, tensors, red = _describe(self.op, self._fn, args, self._kwargs)
        dtypes = tuple(dict.fromkeys(dtype_name(t.dtype) for t in tensors))
        notes = tuple(dict.fromkeys(self)) or ("native",)
        sig = (self.op, group_label(tp), tp.caps.name, dtypes, red)
        with _lock:
            if (sig, notes) in _decided:
                return
            _decided.add((sig, notes))
        what = ", ".join(([red] if red else []) + list(dtypes))
        LOG.debug("%s(%s) on group %s [%s]: %s", self.op, what, sig[1], sig[2], "; ".join(notes))


# -- hooks of the dispatch-key kernels (the process group's are in funcoll.entry.process_group) ------------------------
def on_install(device_type: str, key: str, n_kernels: int) -> None:
    LOG.info("install: %d funcoll kernels for _c10d_functional on dispatch key %s (%s)", n_kernels, key, device_type)


def on_uninstall(device_type: str) -> None:
    LOG.info("uninstall: funcoll kernels removed from %s; the previous kernels serve again", device_type)
