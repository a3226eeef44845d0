"""The XLA transport: funcoll's primitives as torch_xla lazy collectives (``torch_xla._XLAC``) with the replica
groups of funcoll's group registry. Ranks and world size come from the process group, never from the runtime, so a
world of any size can be built in one process to read the HLO its ranks would compile.

The rules every primitive follows (each found by a test on torch_xla 2.9; docs/xla.md has the facts behind them):
results are computed with the functional ``_XLAC`` ops and written back with ``copy_`` (the in-place ones bypass
functionalization: a collective on a view would leave its base unchanged); no dtype views (a CPU fallback that syncs:
:meth:`XlaTransport.bits_as` is an HLO ``bitcast-convert``); the ``view_as_real`` of a complex tensor is reshaped
first (:func:`_operand`); nothing syncs the graph; the HLO is the same on every rank (rank-dependent values are device
data, never Python constants or 0-dim tensors), which :mod:`funcoll.replicas` checks.
"""

from __future__ import annotations

import re
import threading
from dataclasses import replace
from typing import List, Optional, Sequence, Union

import torch
import torch.distributed as dist
import torch_xla  # noqa: F401  (ImportError here means: no XLA transport; funcoll leaves XLA tensors alone)
import torch_xla.core.xla_model as xm  # both imported by torch_xla itself
import torch_xla.runtime as xr

from funcoll.semantics import ReduceOp, Reduction, groups
from funcoll.transport import DONE, Capabilities, Transport, active_profile_name, profile, static_split_bound
from funcoll.transport.registry import register_device

__all__ = ["XlaTransport", "capabilities", "normalize_device", "device_index", "reset_token", "static_split_bound"]

_X = torch_xla._XLAC

# funcoll reduce op -> the reduce type string of torch_xla's cross-replica ops (cross_replica_reduces.cpp
# GetReduceType: sum, mul, and, or, min, max).
_XLA_OP = {ReduceOp.SUM: "sum", ReduceOp.PRODUCT: "mul", ReduceOp.BAND: "and", ReduceOp.BOR: "or",
           ReduceOp.MIN: "min", ReduceOp.MAX: "max"}


def capabilities(profile_name: Optional[str] = None) -> Capabilities:
    """The ``xla`` profile (torch_xla 2.9's lazy collectives), intersected with ``profile_name``'s (or
    ``FUNCOLL_PROFILE``'s); :meth:`XlaTransport.partitions_changed` narrows it per group."""
    name = profile_name if profile_name is not None else active_profile_name()
    return profile("xla").restrict(profile(name)) if name and name != "xla" else profile("xla")


def device_index(device: Union[None, int, str, torch.device]) -> int:
    """The index, among this process's addressable XLA devices, named by ``device``: None (the default device), an
    int, a digit string, ``"xla"``, ``"xla:N"`` or a ``torch.device``. LOCAL_RANK is not one: under PJRT each process
    addresses its own devices, usually only ``xla:0``."""
    if device is None:
        return torch_xla.device().index or 0
    if isinstance(device, bool) or not isinstance(device, (int, str, torch.device)):
        given = repr(device) if isinstance(device, bool) else type(device).__name__
        raise TypeError(f"funcoll.xla: device must be an int, a string or a torch.device, got {given}")
    text = str(device).strip()
    if isinstance(device, int) or text.isdigit():
        idx = int(text)
    else:
        try:
            dev = torch.device(text)
        except RuntimeError:
            raise ValueError(f"funcoll.xla: cannot read a device from {device!r}; pass an int, "
                             f"'xla:N' or a torch.device") from None
        if dev.type != "xla":
            raise ValueError(f"funcoll.xla: {device!r} is not an XLA device; pass 'xla', 'xla:N' or an "
                             f"index of one of this process's XLA devices")
        if dev.index is None:
            return torch_xla.device().index or 0
        idx = dev.index
    count = len(torch_xla.devices())
    if not 0 <= idx < count:
        raise ValueError(
            f"funcoll.xla: xla:{idx} is not addressable in this process (it has {count} XLA device"
            f"{'s' if count != 1 else ''}: xla:0..xla:{count - 1}); a rank or LOCAL_RANK is not an XLA "
            f"device index, use torch_xla.device() (or index 0) in each process")
    return idx


def normalize_device(device: Union[None, int, str, torch.device] = None) -> torch.device:
    """``torch.device("xla", i)`` for ``device`` (see :func:`device_index`), validated against the devices
    this process can address."""
    return torch.device("xla", device_index(device))


# funcoll.replicas sets ``serve(group's global ranks, this global rank, values) -> every member's values`` while it
# builds a virtual world's programs: XlaTransport.agreed then answers as the replicas' all_gather did, without a sync
_agreements = threading.local()


def _uniform(blocks: List[List[int]], size: int, world_size: int) -> Optional[List[List[int]]]:
    """Replica groups of one size (all-gather, reduce-scatter and all-to-all need it): the blocks when they
    are uniform, else the group's blocks plus the remaining ranks cut into blocks of ``size`` in order (ranks
    outside the group never run this collective, so how they are grouped does not matter), else None."""
    if all(len(b) == size for b in blocks):
        return blocks
    big = [b for b in blocks if len(b) > 1]
    covered = {r for b in big for r in b}
    rest = [r for r in range(world_size) if r not in covered]
    if any(len(b) != size for b in big) or len(rest) % size:
        return None
    out = big + [rest[i:i + size] for i in range(0, len(rest), size)]
    return sorted(out, key=min)


class XlaTransport(Transport):
    """Primitives of one group on one XLA device, as lazy collectives (``is_async=False``: building the op is
    all there is to do; the graph runs at the next ``torch_xla.sync()`` or when a result is read)."""

    device_type = "xla"
    dtype_views = False  # view.dtype is a CPU fallback with a sync on torch_xla 2.9 (the module's rules)
    # openxla/xla xla/service/cpu/cpu_compiler.cc (at 001918b7024cf5f020051a9d25d2dd57a5896aaa) runs
    # AllGatherDecomposer (an all-gather becomes dynamic-update-slices and an all-reduce), AllReducePromotion (bf16 to
    # f32) and BFloat16Normalization (bf16 ops in f32): on the CPU runtime a float all-gather loses -0.0, subnormals
    # and NaN payloads; as integers (a free bitcast-convert) every backend moves the bits
    floats_as_integers = True
    staging_bytes = None  # one collective per request: XLA's compiler plans the temporaries
    # pin_layout=True, as torch_xla's own _c10d_functional kernels do (cross_replica_reduces.cpp): ranks may compile
    # slightly different programs around a collective, and a pinned layout keeps them agreeing.
    pin_layout = True

    def __init__(self, group_name: str, rank: int, size: int, global_ranks: Sequence[int], world_size: int,
                 device=None):
        super().__init__(rank, size, capabilities())
        self.group_name = group_name
        self.global_ranks = tuple(int(r) for r in global_ranks) or tuple(range(size))
        self.world_size = int(world_size)
        if len(self.global_ranks) != size:
            raise ValueError(f"funcoll.xla: group {group_name!r} has size {size} but lists ranks "
                             f"{list(self.global_ranks)}")
        _check_runtime(self.global_ranks[rank], self.world_size)
        self.control_device = normalize_device(device)
        self.virtual = self.world_size > xr.world_size()  # more funcoll ranks than the runtime has replicas
        self.partitions_changed()
        groups.watch_partitions(self)  # a partition registered later (the group's siblings) changes the above

    def __repr__(self) -> str:
        return (f"XlaTransport(group={self.group_name!r}, rank={self.rank}, size={self.size}, "
                f"ranks={list(self.global_ranks)}, world={self.world_size}, device={self.control_device})")

    # -- replica groups, and the capabilities they allow ----------------------------------------------
    def partitions_changed(self) -> None:
        """Sets :attr:`replica_groups`, ``_uniform_groups`` (the same when all of one size, else None) and
        :attr:`caps` from the registered partitions: at creation and whenever a partition is registered. XLA's
        all-gather, reduce-scatter and all-to-all need replica groups of one size: a group that has none (a lone
        sub-group padded with singletons) has capabilities without them.

        ``replica_groups``: the replica groups of a collective over this group, as every rank of the world emits them
        (:func:`funcoll.groups.blocks_for`), this group's block in group-rank order; ``[]`` (``replica_groups={}``) for
        the whole world in rank order, as torch_xla's kernels emit it."""
        replica: List[List[int]] = []
        if self.global_ranks != tuple(range(self.world_size)):
            # this group's block in group-rank order: all-gather concatenates in the order the block lists ranks
            mine = set(self.global_ranks)
            replica = [list(self.global_ranks) if set(b) == mine else list(b)
                       for b in groups.blocks_for(self.global_ranks, self.world_size)]
        self.replica_groups, self._uniform_groups = replica, _uniform(replica, self.size, self.world_size)
        self.caps = self.table if self._uniform_groups is not None else replace(
            self.table, primitives=self.table.primitives - {"all_gather", "reduce_scatter", "all_to_all"})

    def use_table(self, table: Capabilities) -> None:
        self.table = table
        self.partitions_changed()

    # -- helpers -------------------------------------------------------------------------------------
    def _token(self):
        return _X._get_all_reduce_token(str(self.control_device))

    def _chained(self, result_and_token):
        """The result of a collective that returned (result, token), its token the one the next collective follows."""
        result, token = result_and_token
        _X._set_all_reduce_token(str(self.control_device), token)
        return result

    def _like(self, t: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
        t = t.to(like.device)
        if torch._is_functional_tensor(like) and not torch._is_functional_tensor(t):
            t = torch._to_functional_tensor(t)
        return t

    def rank_is(self, root: int, like: torch.Tensor) -> torch.Tensor:
        # moved as one element, then made 0-dim: torch_xla shares one parameter between 0-dim tensors of equal value,
        # so two masks that agree on one rank (both False) and not on another would give the ranks different modules
        return self._like(torch.tensor([self.rank == root]), like).reshape(())

    def bits_as(self, t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """A lazy HLO ``bitcast-convert`` of ``t`` to ``dtype`` (a new tensor; writes into it do not reach ``t``)."""
        if t.dtype == dtype:
            return t
        t = _operand(t)
        kind = _X._xla_op_tensor_shape(t, "")["type"]  # the device's element type (f64 is f32 on a TPU)
        if _width(kind) != dtype.itemsize * 8:
            return t.view(dtype)  # a bitcast of another width: torch_xla's CPU fallback (a sync)
        return _bitcast(_XLA_TYPE[dtype])(t)

    def agreed(self, values) -> Optional[torch.Tensor]:
        serve = getattr(_agreements, "serve", None)
        if not self.virtual or serve is None:
            return None
        rows = serve(self.global_ranks, self.global_ranks[self.rank], [int(v) for v in values])
        return torch.tensor(rows, dtype=torch.int64)

    def _reduce_all(self, t: torch.Tensor, op: str) -> torch.Tensor:
        return _X._xla_all_reduce(op, _operand(t), 1.0, self.replica_groups, self.pin_layout)

    # -- the primitives ------------------------------------------------------------------------------
    def _all_reduce(self, t, red: Reduction):
        t.copy_(self._reduce_all(t, _XLA_OP[red.op]))
        return DONE

    def all_reduce_functional(self, t, red: Reduction):
        """The all-reduce as a new lazy tensor, as torch_xla's own kernel builds it (no clone, no copy back)."""
        # only called with a request the planner found native (algorithms.native_all_reduce): no second check
        op = self._all_reduce_form(red, t.dtype, lambda r: _XLA_OP[r.op])
        return self._reduce_all(t, op), DONE

    def _all_reduce_coalesced(self, ts, red: Reduction):
        # one tuple all-reduce per dtype (torch_xla's BuildAllReduce groups operands by element type). Fresh
        # clones are reduced in place (they are no views), then copied back through copy_.
        work = [_operand(t).clone() for t in ts]
        _X._xla_all_reduce_inplace(_XLA_OP[red.op], work, 1.0, self.replica_groups, self.pin_layout)
        for t, w in zip(ts, work):
            t.copy_(w)
        return DONE

    def _all_gather(self, out, inp):
        inp = _operand(inp.reshape((1,) if inp.dim() == 0 else tuple(inp.shape)))
        res = _X._xla_all_gather(inp, 0, self.size, self._uniform_groups, self.pin_layout, None, None)
        out.copy_(res.view(out.shape))
        return DONE

    def _reduce_scatter(self, out, inp, red: Reduction):
        res = self._chained(_X._xla_reduce_scatter(_XLA_OP[red.op], _operand(inp), self._token(), 1.0, 0, self.size,
                                                   self._uniform_groups, self.pin_layout, None, None))
        out.copy_(res.view(out.shape))
        return DONE

    def _all_to_all(self, out, inp, out_splits, in_splits):
        res = self._chained(_X._xla_all_to_all(_operand(inp), self._token(), 0, 0, self.size, self._uniform_groups,
                                               self.pin_layout))
        out.copy_(res.view(out.shape))
        return DONE

    def _permute(self, t: torch.Tensor, pairs: List[List[int]]) -> torch.Tensor:
        return self._chained(_X._xla_collective_permute(t, self._token(), pairs))

    def retain(self, t: torch.Tensor) -> None:
        """Keeps ``t`` alive until the next ``torch_xla.sync()`` / ``xm.mark_step()``, which then runs it."""
        xm.add_step_closure(lambda _t: None, args=(t,))

    def _send(self, t, dst, tag):
        # The receiver runs the same collective-permute (same pair). The result (zeros here) is kept alive until
        # the next step, so the op is part of this rank's next graph without a sync of its own.
        self.retain(self._permute(t, [[self.global_ranks[self.rank], self.global_ranks[dst]]]))
        return DONE

    def _recv(self, t, src, tag):
        t.copy_(self._permute(t, [[self.global_ranks[src], self.global_ranks[self.rank]]]))
        return DONE

    # No _broadcast/_reduce/_gather/_scatter/_barrier: the xla profile lists none of them, and
    # the algorithms build them from all_reduce / all_gather, without a graph sync.


def _operand(t: torch.Tensor) -> torch.Tensor:
    """``t``, or, when it is the ``view_as_real`` of a complex tensor, the same values with a layout of their own (see
    the module's rules)."""
    base = t._base
    if base is not None and base.is_complex() and not t.is_complex():
        return t.reshape(-1).reshape(t.shape)
    return t


# torch dtype -> XLA element type (the type strings of torch_xla.core.xla_builder; float8 as XLA names them)
_XLA_TYPE = {torch.bool: "pred", torch.uint8: "u8", torch.int8: "s8", torch.int16: "s16", torch.uint16: "u16",
             torch.int32: "s32", torch.uint32: "u32", torch.int64: "s64", torch.uint64: "u64", torch.float16: "f16",
             torch.bfloat16: "bf16", torch.float32: "f32", torch.float64: "f64", torch.float8_e4m3fn: "f8e4m3fn",
             torch.float8_e5m2: "f8e5m2"}
_bitcasts: dict = {}


def _width(kind: str) -> int:
    """The bits of an XLA element type named as ``_xla_op_tensor_shape`` names it (``f32``, ``bf16``, ``f8e4m3fn``)."""
    return 8 if kind == "pred" else int(re.match(r"[a-z]+(\d+)", kind).group(1))  # type: ignore[union-attr]


def _bitcast(kind: str):
    """torch_xla's registered op ``funcoll_bits_<kind>``: its operand's bits as XLA type ``kind``
    (``xla_op_registry.Op``: compiled once per operand shape, called from the graph)."""
    op = _bitcasts.get(kind)
    if op is None:
        import torch_xla.core.xla_op_registry as xor

        op = _bitcasts[kind] = xor.register(f"funcoll_bits_{kind}", lambda x: x.bitcast(kind))
    return op


def _check_runtime(rank_global: int, world_size: int) -> None:
    """In a real job (the funcoll world has the runtime's size) funcoll's global rank must be the XLA replica
    id of this process, or the replica groups would name the wrong chips. A larger funcoll world in one
    process is a virtual one, built to read HLO; then nothing is checked."""
    if xr.is_spmd():
        raise RuntimeError("funcoll.xla: collectives with replica groups do not apply under SPMD "
                           "(torch_xla.runtime.use_spmd()); use a CPU group, or no SPMD")
    if world_size == xr.world_size() and rank_global != xr.global_ordinal():
        raise ValueError(f"funcoll.xla: this process is rank {rank_global} of the funcoll world but XLA replica "
                         f"{xr.global_ordinal()}; initialise the process group with rank=xr.global_ordinal() "
                         f"(or the xla:// init method)")


def _c10d_factory(pg, device) -> XlaTransport:
    world = dist.get_world_size() if dist.is_initialized() else pg.size()
    return XlaTransport(pg.group_name, pg.rank(), pg.size(), dist.get_process_group_ranks(pg), world, device=device)


register_device("xla", funcoll=lambda ctx: XlaTransport(ctx.name, ctx.rank, ctx.size, ctx.global_ranks, ctx.world_size),
                c10d=_c10d_factory)


def reset_token(device=None) -> None:
    """Starts a fresh ordering token for ``device``: the next collective's HLO no longer includes the earlier
    collectives it would otherwise be chained to (torch_xla threads one pseudo token through all of them
    until the next step). Nothing is executed."""
    _X._set_all_reduce_token(str(normalize_device(device)), None)
