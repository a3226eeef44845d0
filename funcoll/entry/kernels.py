"""The compiled-graph entry point: funcoll kernels for the ``_c10d_functional`` ops, per dispatch key (``install``,
``uninstall``). Each kernel resolves the group, allocates the functional output and calls :mod:`funcoll.algorithms`;
the Work is registered so that upstream ``wait_tensor`` waits on it.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import sys
import threading
import warnings
from typing import Dict, Iterable, List, Optional

import torch
from torch._C._distributed_c10d import _register_work
from torch.utils._pytree import tree_map_only

from funcoll import algorithms, semantics
from funcoll.algorithms.observe import on_install, on_uninstall
from funcoll.entry.work import FuncollWork
from funcoll.transport import wait_quietly
from funcoll.transport.registry import _ensure_loaded, transport_for

__all__ = ["install", "uninstall", "installed", "KERNELS", "DISPATCH_KEYS"]

DISPATCH_KEYS = {"cpu": "CPU", "xla": "XLA", "xpu": "XPU", "tpu": "PrivateUse1"}  # tpu: TorchTPU renames PrivateUse1

_libs: Dict[str, torch.library.Library] = {}
_lock = threading.Lock()


def _sized(opname: str, group_name: str, device, group_size: int):
    """The transport of the group for ``device``, once ``group_size`` is checked against it."""
    tp = transport_for(group_name, device)
    if group_size != tp.size:
        raise ValueError(f"funcoll.{opname}: group_size={group_size} but group {group_name!r} has "
                         f"{tp.size} ranks; pass the group's size")
    return tp


def _finish(pending: algorithms.Pending, outputs: List[torch.Tensor], tp) -> None:
    if not tp.caps.is_async or pending.is_completed():
        pending.wait()
        return
    work = FuncollWork(pending, outputs)
    for out in outputs:
        _register_work(out, work)


def _finish_native(handle, output: torch.Tensor, tp) -> None:
    """The native fast path: the backend's own Work is what wait_tensor waits on."""
    if not tp.caps.is_async or handle.is_completed():
        wait_quietly(handle)
    else:
        _register_work(output, handle)


def _filled_all_reduce(input, reduce_op, tp):
    """all_reduce once the lookup said "not native" (the same answer for the contiguous copy: no second lookup)."""
    out = input.clone(memory_format=torch.contiguous_format)
    _finish(algorithms.all_reduce(tp, out, reduce_op), [out], tp)
    return out


def _all_reduce(filled):
    """The all_reduce kernel: native, one backend call; else ``filled(input, reduce_op, tp)``."""
    def all_reduce(input, reduce_op, group_name):
        tp = transport_for(group_name, input.device)
        red = algorithms.native_all_reduce(tp, reduce_op, input.dtype) if input.numel() else None
        if red is not None:
            out, handle = tp.all_reduce_functional(input.contiguous(), red)
            _finish_native(handle, out, tp)
            return out
        return filled(input, reduce_op, tp)
    return all_reduce


all_reduce = _all_reduce(_filled_all_reduce)


def all_reduce_(input, reduce_op, group_name):
    tp = transport_for(group_name, input.device)
    red = algorithms.native_all_reduce(tp, reduce_op, input.dtype) if input.numel() and input.is_contiguous() else None
    if red is not None:
        _finish_native(tp.all_reduce(input, red), input, tp)
        return input
    _finish(algorithms.all_reduce(tp, input, reduce_op), [input], tp)
    return input


def all_reduce_coalesced(inputs, reduce_op, group_name):
    outs = [t.clone(memory_format=torch.contiguous_format) for t in inputs]
    return all_reduce_coalesced_(outs, reduce_op, group_name)


def all_reduce_coalesced_(inputs, reduce_op, group_name):
    if not inputs:
        return inputs
    tp = transport_for(group_name, inputs[0].device)
    _finish(algorithms.all_reduce_coalesced(tp, list(inputs), reduce_op), list(inputs), tp)
    return inputs


def all_gather_into_tensor(input, group_size, group_name):
    out = input.new_empty(semantics.gathered_shape(input, group_size))
    return all_gather_into_tensor_out(input, group_size, group_name, out=out)


def all_gather_into_tensor_out(input, group_size, group_name, *, out):
    tp = _sized("all_gather_into_tensor", group_name, input.device, group_size)
    _finish(algorithms.all_gather_into_tensor(tp, out, input), [out], tp)
    return out


def all_gather_into_tensor_coalesced(inputs, group_size, group_name):
    if not inputs:
        return []
    tp = _sized("all_gather_into_tensor_coalesced", group_name, inputs[0].device, group_size)
    outs = [t.new_empty(semantics.gathered_shape(t, group_size)) for t in inputs]
    _finish(algorithms.all_gather_into_tensor_coalesced(tp, outs, list(inputs)), outs, tp)
    return outs


def reduce_scatter_tensor(input, reduce_op, group_size, group_name):
    tp = _sized("reduce_scatter_tensor", group_name, input.device, group_size)
    out = input.new_empty(semantics.check_reduce_scatter("reduce_scatter_tensor", None, input, group_size))
    _finish(algorithms.reduce_scatter_tensor(tp, out, input, reduce_op), [out], tp)
    return out


def reduce_scatter_tensor_coalesced(inputs, reduce_op, group_size, group_name):
    if not inputs:
        return []
    tp = _sized("reduce_scatter_tensor_coalesced", group_name, inputs[0].device, group_size)
    outs = [t.new_empty(semantics.check_reduce_scatter("reduce_scatter_tensor_coalesced", None, t, group_size))
            for t in inputs]
    _finish(algorithms.reduce_scatter_tensor_coalesced(tp, outs, list(inputs), reduce_op), outs, tp)
    return outs


def all_to_all_single(input, output_split_sizes, input_split_sizes, group_name):
    tp = transport_for(group_name, input.device)
    out_splits = [int(s) for s in output_split_sizes]
    rows = sum(out_splits) if out_splits else input.shape[0]
    out = input.new_empty((rows,) + tuple(input.shape[1:]))
    _finish(algorithms.all_to_all_single(tp, out, input, out_splits, [int(s) for s in input_split_sizes]), [out], tp)
    return out


def broadcast(input, src, group_name):
    # an MX tensor's half is copied as its bytes: torch 2.9 has no copy kernel for float4_e2m1fn_x2
    # (never a same-dtype view of the clone: on torch_xla's functional tensors the broadcast would then write a view
    # the returned tensor does not see, and the graph would lose its collective)
    if input.dtype in semantics.MX:
        out = input.view(torch.uint8).clone(memory_format=torch.contiguous_format).view(input.dtype)
    else:
        out = input.clone(memory_format=torch.contiguous_format)
    return broadcast_(out, src, group_name)


def broadcast_(input, src, group_name):
    tp = transport_for(group_name, input.device)
    _finish(algorithms.broadcast(tp, input, src), [input], tp)
    return input


KERNELS = {fn.__name__: fn for fn in (  # op -> kernel, one flat table (the same on every dispatch key, except _EXTRA)
    all_reduce, all_reduce_, all_reduce_coalesced, all_reduce_coalesced_, all_gather_into_tensor,
    all_gather_into_tensor_out, all_gather_into_tensor_coalesced, reduce_scatter_tensor,
    reduce_scatter_tensor_coalesced, all_to_all_single, broadcast, broadcast_)}


# c10d gives the in-place/out variants (alias annotations) no Functionalize kernel: on functional tensors (torch_xla
# 2.9) calling them raises (docs/xla.md). These kernels are the functional op plus a copy_ into the argument it mutates.
# (torch names them as every ATen op: a trailing "_" writes in place, "_out" into ``out``)
_MUTATED = tuple(name for name in KERNELS if name.endswith(("_", "_out")))


def _mutated(name: str, args, kwargs):
    """The argument (a tensor or a list) the in-place/out variant ``name`` writes into: ``out``, or its first."""
    return kwargs["out"] if name.endswith("_out") else args[0]


def _copy_into(dst, src):
    for d, s in zip(dst, src) if isinstance(dst, (list, tuple)) else [(dst, src)]:
        d.copy_(s)
    return dst


def _functionalize(name: str):
    functional = getattr(torch.ops._c10d_functional, name.removesuffix("_out").rstrip("_"))

    def kernel(*args, **kwargs):
        result = functional(*args, **{k: v for k, v in kwargs.items() if k != "out"})
        return _copy_into(_mutated(name, args, kwargs), result)
    return kernel


FUNCTIONALIZE = {name: _functionalize(name) for name in _MUTATED}


# The XLA key's kernels run *below* functionalization (torch_xla 2.9), where ``t.view(torch.uint8)`` returns a tensor
# torch_xla cannot read and a write into a slice is lost; funcoll's strategies use both. Each XLA kernel therefore
# wraps its tensors as functional tensors again and runs the generic kernel with functionalization on, then unwraps.
def _to_functional(x):
    """``x`` (tensors, lists of them) with every tensor a functional wrapper."""
    return tree_map_only(torch.Tensor, lambda t: t if torch._is_functional_tensor(t) else
                         torch._to_functional_tensor(t), x)


def _unwrap(t: torch.Tensor) -> torch.Tensor:
    if not torch._is_functional_tensor(t):
        return t
    torch._sync(t)
    return torch._from_functional_tensor(t)


def _from_functional(x):
    return tree_map_only(torch.Tensor, _unwrap, x)


@contextlib.contextmanager
def _functionalization():
    # Functionalize leaves the TLS exclude set, so the wrapped tensors dispatch through it again. It is not
    # added to the include set: torch_xla's C++ creates CPU tensors internally (the ordering token), and
    # those must not come out as functional wrappers (that segfaults).
    include = torch._C._dispatch_tls_local_include_set()
    exclude = torch._C._dispatch_tls_local_exclude_set()
    with torch._C._ForceDispatchKeyGuard(include, exclude.remove(torch._C.DispatchKey.Functionalize)):
        yield


def _functionalized(name: str, fn):
    def kernel(*args, **kwargs):
        fargs, fkwargs = _to_functional((args, kwargs))
        with _functionalization():
            res = fn(*fargs, **fkwargs)
        if name not in _MUTATED:
            return _from_functional(res)
        return _copy_into(_mutated(name, args, kwargs), _from_functional(_mutated(name, fargs, fkwargs)))

    kernel.__name__ = kernel.__qualname__ = f"xla_{name}"  # funcoll's kernel on the XLA key, functionalization on
    return kernel


def _wait_tensor(tensor):
    """``wait_tensor`` on XLA: funcoll's XLA collectives are lazy ops that register no Work; waiting is the identity."""
    return tensor


_EXTRA: Dict[str, Dict[tuple, object]] = {"xla": {  # device type -> {(op, dispatch key): kernel} only it needs
    **{(name, "XLA"): _functionalized(name, fn) for name, fn in KERNELS.items()},
    # native: below functionalization, as torch_xla's own kernel; functionalized for everything funcoll fills
    ("all_reduce", "XLA"): _all_reduce(_functionalized("all_reduce", _filled_all_reduce)),
    ("wait_tensor", "XLA"): _wait_tensor,
    **{(name, "Functionalize"): fn for name, fn in FUNCTIONALIZE.items()},
}}


def _present(device_type: str) -> bool:
    if device_type == "xla":
        # torch_xla merely installed (e.g. its CUDA/CPU wheels) is no reason to import it on a CPU-only run
        if "torch_xla" in sys.modules:
            return True
        if importlib.util.find_spec("torch_xla") is None:
            return False
        return bool(os.environ.get("PJRT_DEVICE")) or importlib.util.find_spec("libtpu") is not None
    if device_type == "xpu":
        return torch.xpu.is_available()
    if device_type == "tpu":  # TorchTPU registered its device (it renames PrivateUse1 only when a TPU is found)
        return torch._C._get_privateuse1_backend_name() == "tpu"
    return False


def install(device_types: Optional[Iterable[str]] = None) -> List[str]:
    """Registers funcoll's kernels on the dispatch keys of ``device_types`` ("xla", "xpu", "cpu").
    None means every accelerator present ("cpu" only when asked): XLA when torch_xla is imported, ``PJRT_DEVICE``
    is set or libtpu is installed; XPU when ``torch.xpu.is_available()``. Idempotent. Returns the types installed."""
    if device_types is None:
        device_types = [d for d in ("xla", "xpu", "tpu") if _present(d)]
    wanted = [device_types] if isinstance(device_types, str) else list(device_types)
    with _lock:
        for dt in wanted:
            if dt not in DISPATCH_KEYS:
                raise ValueError(f"funcoll.install: unknown device type {dt!r}; use one of {', '.join(DISPATCH_KEYS)}")
            if dt == "tpu" and not _present(dt):  # PrivateUse1 has one owner: install only when TorchTPU owns it
                raise ValueError(f"funcoll.install: the PrivateUse1 key is named "
                                 f"{torch._C._get_privateuse1_backend_name()!r}, not 'tpu': TorchTPU has not "
                                 f"registered its device (import torch_tpu on a TPU host)")
            if dt not in _libs:
                _ensure_loaded(dt)
                lib = torch.library.Library("_c10d_functional", "IMPL")
                key = DISPATCH_KEYS[dt]
                # Kernels other libraries registered from Python (torch_xla registers broadcast on XLA in
                # torch_xla/_internal/c10d_registration.py): torch.library refuses to override them unless
                # allowed, and would forget their registration when this library goes; keep it theirs.
                owned = {k for k in torch.library._impls if k.startswith("_c10d_functional/")}
                kernels = {**{(name, key): fn for name, fn in KERNELS.items()}, **_EXTRA.get(dt, {})}
                try:
                    with warnings.catch_warnings():
                        # overriding torch_xla's kernels is the point of install(); uninstall() restores them
                        warnings.filterwarnings("ignore", message="(?s).*Overriding a previously registered kernel")
                        for (name, k), fn in kernels.items():
                            lib.impl(name, fn, k, allow_override=True)
                            lib._op_impls.difference_update(owned)
                except BaseException:
                    lib._destroy()  # no half-installed kernels
                    raise
                _libs[dt] = lib
                on_install(dt, key, len(kernels))  # TORCH_LOGS=funcoll
    return wanted


def uninstall(device_types: Optional[Iterable[str]] = None) -> None:
    """Removes funcoll's kernels (all, or those of ``device_types``); the previous kernels serve again."""
    with _lock:
        for dt in list(_libs) if device_types is None else list(device_types):
            lib = _libs.pop(dt, None)
            if lib is not None:
                lib._destroy()
                on_uninstall(dt)  # TORCH_LOGS=funcoll


def installed() -> List[str]:
    return sorted(_libs)
