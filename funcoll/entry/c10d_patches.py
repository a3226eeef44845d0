"""What funcoll changes in torch.distributed, in one place (each function says what and on which torch), for funcoll
groups only: every other group keeps torch's behaviour.
"""

from __future__ import annotations

import functools
import warnings
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as fc
import torch.distributed.distributed_c10d as c10d
from torch._C._distributed_c10d import _register_work

from funcoll.entry.process_group import BACKEND_NAME, Options, ProcessGroupFuncoll
from funcoll.semantics import groups

__all__ = ["register_backend", "patch_monitored_barrier"]


def _create(dist_backend_opts, backend_options=None) -> ProcessGroupFuncoll:
    o = dist_backend_opts
    # c10d names no ranks for a group that is a world of its own: the default group, and a group made by
    # _new_process_group_helper(..., global_ranks_in_group=[], ...) beside an existing default group (the weight-update
    # groups of sglang and OpenRLHF, whose ranks are not the default group's)
    world = dist.get_world_size() if dist.is_initialized() and o.global_ranks_in_group else o.group_size
    opts = backend_options if isinstance(backend_options, Options) else None
    return ProcessGroupFuncoll(o.store, o.group_rank, o.group_size, o.timeout, group_name=o.group_id,
                               global_ranks=tuple(o.global_ranks_in_group), world_size=world, options=opts,
                               enable_reconfigure=bool(getattr(o, "enable_reconfigure", False)))


def _funcoll_traceable_broadcast(tensor, src=None, group=None, async_op=False, group_src=None):
    """What torch.compile traces for ``dist.broadcast``: on a funcoll group, the functional broadcast copied into
    ``tensor``; on any other group, upstream's own."""
    group = group or dist.group.WORLD
    if not isinstance(group, ProcessGroupFuncoll):
        return _eager_broadcast(tensor, src, group, async_op, group_src)
    if group_src is None:
        group_src = groups.to_group(group.group_name, src)
    return tensor.copy_(fc.broadcast(tensor, group_src, group))


# the undecorated dist.broadcast: calling dist.broadcast itself from the rewrite would be rewritten again
_eager_broadcast = getattr(dist.broadcast, "__wrapped__", dist.broadcast)


def _register_traceable_broadcast() -> None:
    """torch 2.9's Dynamo rewrites eager all_reduce/all_gather/reduce_scatter/all_to_all calls into functional
    collectives but not ``dist.broadcast``, which then cannot be traced (fullgraph fails). Adds the rewrite,
    for funcoll groups only. Dynamo looks the replacement up by its __name__ in ``_functional_collectives``."""
    remaps = getattr(fc, "traceable_collective_remaps", None)
    if remaps is None or (dist.broadcast in remaps and remaps[dist.broadcast] is not _funcoll_traceable_broadcast):
        return  # a torch whose Dynamo traces broadcast itself
    fc._funcoll_traceable_broadcast = _funcoll_traceable_broadcast  # type: ignore[attr-defined]
    remaps[dist.broadcast] = _funcoll_traceable_broadcast


def _batch_p2p_ops(op_list, peer_list, tag_list, tensors, group_name):
    """torch >= 2.15 compiles ``dist.batch_isend_irecv`` into ``_c10d_functional.batch_p2p_ops``, whose kernel needs
    the group's C++ backend ("No backend type associated with device type cpu" on a Python group). On a funcoll group
    the batch is the group's own coalesced send/recv, each Work registered for ``wait_tensor``."""
    group = groups.resolve(group_name)
    if not isinstance(group, ProcessGroupFuncoll):
        assert _BATCH_P2P is not None  # registered only where the op exists
        return _BATCH_P2P.redispatch(_COMPOSITE, op_list, peer_list, tag_list, tensors, group_name)
    if not len(op_list) == len(peer_list) == len(tag_list) == len(tensors):
        raise ValueError(f"funcoll: batch_p2p_ops got {len(op_list)} ops, {len(peer_list)} peers, {len(tag_list)} "
                         f"tags and {len(tensors)} tensors; one of each per operation")
    bad = [op for op in op_list if op not in ("isend", "irecv")]
    if bad:
        raise ValueError(f"funcoll: batch_p2p_ops: unknown operation {bad[0]!r} (isend or irecv)")
    outs: list = []
    if not tensors:
        return outs
    device = tensors[0].device
    group._start_coalescing(device)  # one group, as eager batch_isend_irecv (funcoll.algorithms.batch_isend_irecv)
    try:
        for op, peer, tag, t in zip(op_list, peer_list, tag_list, tensors):
            if op == "isend":
                work, out = group.send([t], int(peer), int(tag)), t.new_empty(0)
            else:
                work, out = group.recv([t], int(peer), int(tag)), t
            _register_work(out, work)
            outs.append(out)
    finally:
        group._end_coalescing(device)
    return outs


_BATCH_P2P = getattr(getattr(torch.ops._c10d_functional, "batch_p2p_ops", None), "default", None)
_COMPOSITE = torch._C.DispatchKeySet(torch._C.DispatchKey.CompositeExplicitAutograd)
_LIBS: list = []


def _patch_batch_isend_irecv() -> None:
    """torch 2.9's ``dist.batch_isend_irecv`` coalesces only a group whose class is ProcessGroup itself: a funcoll
    group got its sends and receives one at a time: a batch on a funcoll group goes through c10d's coalescing manager,
    as torch >= 2.10 sends it."""
    orig = c10d.batch_isend_irecv
    if getattr(orig, "__funcoll_patch__", False) or "type" not in orig.__code__.co_names:
        return

    @functools.wraps(orig)
    def batch_isend_irecv(p2p_op_list):
        c10d._check_p2p_op_list(p2p_op_list)
        group = p2p_op_list[0].group or c10d._get_default_group()
        if not isinstance(group, ProcessGroupFuncoll):
            return orig(p2p_op_list)
        with c10d._coalescing_manager(group, p2p_op_list[0].tensor.device, async_ops=True) as cm:
            for op in p2p_op_list:
                peer = {"group_dst" if op.op == c10d.isend else "group_src": op.group_peer}
                op.op(op.tensor, group=op.group, tag=op.tag, **peer)
        return cm.works

    _replace("batch_isend_irecv", orig, batch_isend_irecv)


def _register_compiled_batch_p2p() -> None:
    """Serves ``_c10d_functional.batch_p2p_ops`` (torch >= 2.15) on funcoll groups (CPU and XPU tensors)."""
    if _BATCH_P2P is None or _LIBS:
        return
    lib = torch.library.Library("_c10d_functional", "IMPL")
    for key in ("CPU", "XPU"):
        lib.impl("batch_p2p_ops", _batch_p2p_ops, key)
    _LIBS.append(lib)


def _patch_shrink() -> None:
    """torch >= 2.15's ``dist.shrink_group`` wraps what the group's backend's ``shrink()`` returns in a new C++
    ProcessGroup registered as an NCCL, XCCL or gloo backend (``_create_shrunk_process_group``); a funcoll group's
    ``shrink()`` returns the shrunk funcoll group itself, which gets the name and description torch gives a shrunk
    group. The rest of torch's shrink_group (validation, destroying the old group and, for the default group, every
    other group, registering the new one) runs unchanged."""
    orig = getattr(c10d, "_create_shrunk_process_group", None)
    if orig is None or getattr(orig, "__funcoll_patch__", False):
        return

    @functools.wraps(orig)
    def _create_shrunk_process_group(new_backend, remaining_ranks, metadata, is_default_group):
        if not isinstance(new_backend, ProcessGroupFuncoll):
            return orig(new_backend, remaining_ranks, metadata, is_default_group)
        new_backend._set_group_name(metadata["new_group_name"])
        new_backend._set_group_desc("default:shrunken" if is_default_group
                                    else f"{metadata['original_group_name']}:shrunk")
        if metadata.get("bound_device_id") is not None:
            new_backend.bound_device_id = metadata["bound_device_id"]
        return new_backend

    _replace("_create_shrunk_process_group", orig, _create_shrunk_process_group)


def register_backend() -> None:
    """Registers the backend "funcoll": run by ``import funcoll``, and torch >= 2.14's registrar of funcoll's
    ``torch.distributed.backends`` entry point (pyproject.toml), called once a backend string names funcoll."""
    if "FUNCOLL" in dist.Backend._plugins:
        return
    dist.Backend.register_backend(BACKEND_NAME, _create, extended_api=True, devices=["cpu", "xla", "xpu"])
    # torch >= 2.15 attaches its C++ flight-recorder hook to every new group whose backend does not record itself, and
    # the hook cannot read a Python group's name (group creation failed with "ProcessGroup name not set"): funcoll
    # records every collective itself (entry/flight_recorder), as gloo and xccl do
    getattr(c10d, "_FR_SELF_RECORDING_BACKENDS", set[str]()).add(BACKEND_NAME)
    _register_traceable_broadcast()
    _patch_batch_isend_irecv()
    _register_compiled_batch_p2p()
    _patch_shrink()


def patch_monitored_barrier() -> bool:
    """torch 2.9's ``dist.monitored_barrier`` refuses every group whose backend is not named "gloo" before reaching
    it. Where it does, funcoll groups get the same argument handling and then their own monitored barrier. Returns
    whether it patched."""
    orig = c10d.monitored_barrier
    if getattr(orig, "__funcoll_patch__", False):
        return True
    consts = " ".join(c for c in orig.__code__.co_consts if isinstance(c, str))
    if "only implemented for GLOO backend" not in consts:
        return False

    @functools.wraps(orig)
    def monitored_barrier_(group=None, timeout=None, wait_all_ranks=False):
        pg = group if group is not None else (c10d._get_default_group() if c10d.is_initialized() else None)
        if not isinstance(pg, ProcessGroupFuncoll) or c10d._rank_not_in_group(group):
            return orig(group, timeout, wait_all_ranks)
        if timeout is None:
            timeout = c10d._get_default_timeout(c10d.get_backend(group))
        elif isinstance(timeout, float):
            warnings.warn("Please specify timeout arg as a timedelta. "
                          f"Converting current value of {timeout} assuming it represents seconds", stacklevel=2)
            timeout = timedelta(seconds=timeout)
        c10d._check_valid_timeout(timeout)
        return pg.monitored_barrier(timeout, wait_all_ranks=wait_all_ranks)

    _replace("monitored_barrier", orig, monitored_barrier_)
    return True


def _replace(name: str, orig, patched) -> None:
    """``patched`` in place of c10d's ``name`` (and torch.distributed's, where it is the same function)."""
    patched.__funcoll_patch__ = True
    setattr(c10d, name, patched)
    if getattr(dist, name, None) is orig:
        setattr(dist, name, patched)
