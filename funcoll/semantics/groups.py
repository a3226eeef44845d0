"""The group registry: group name -> global ranks, and the partition (the disjoint blocks created together: a
DeviceMesh dim, ``new_subgroups``, ``split_group``) a group belongs to, which XLA needs to emit the same
``replica_groups`` on every rank (docs/design.md, "Groups"). Group-local and global ranks are translated here only.
"""

from __future__ import annotations

import functools
import threading
import weakref
from dataclasses import dataclass
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

__all__ = ["GroupInfo", "register", "unregister", "lookup", "register_partition", "register_mesh",
           "regular_partition", "blocks_for", "to_global", "to_group", "new_subgroups",
           "split_group", "clear", "watch_partitions"]


@dataclass(frozen=True)
class GroupInfo:
    name: str
    ranks: Tuple[int, ...]  # global ranks, in group-rank order
    world_size: int

    @property
    def size(self) -> int:
        return len(self.ranks)


_lock = threading.Lock()
_groups: Dict[str, GroupInfo] = {}
# frozenset(block) -> the whole partition (tuple of blocks, each a tuple of global ranks)
_partitions: Dict[frozenset, Tuple[Tuple[int, ...], ...]] = {}
_version = [0]  # bumped whenever _partitions changes: blocks computed before are stale
_watchers: "weakref.WeakSet" = weakref.WeakSet()  # what watch_partitions() registered


def watch_partitions(watcher) -> None:
    """``watcher.partitions_changed()`` runs whenever a partition is registered or the registry is cleared, as long as
    ``watcher`` lives (an XLA transport's replica groups are read from the partitions)."""
    _watchers.add(watcher)


def _partitions_changed() -> None:
    for watcher in list(_watchers):
        watcher.partitions_changed()


def register(name: str, ranks: Sequence[int], world_size: int) -> GroupInfo:
    ranks = tuple(int(r) for r in ranks)
    if len(set(ranks)) != len(ranks):
        raise ValueError(f"funcoll: group {name!r} lists a rank twice: {list(ranks)}")
    if any(not 0 <= r < world_size for r in ranks):
        raise ValueError(f"funcoll: group {name!r} has ranks {list(ranks)} outside the world of {world_size}")
    info = GroupInfo(name, ranks, world_size)
    with _lock:
        _groups[name] = info
    return info


def unregister(name: str) -> None:
    with _lock:
        _groups.pop(name, None)


def clear() -> None:
    with _lock:
        _groups.clear()
        _partitions.clear()
        _version[0] += 1
    _partitions_changed()


def lookup(name: str) -> GroupInfo:
    """The group's info; a ValueError naming the fix when funcoll does not know it."""
    info = _groups.get(name) or _from_c10d(name)  # a group made by torch.distributed with another backend: c10d's
    if info is None:
        known = ", ".join(sorted(_groups)) or "none"
        raise ValueError(f"funcoll: no process group named {name!r} (known: {known}); create it with "
                         f"torch.distributed.new_group(...) or init_process_group(...) first")
    return info


def resolve(name: str):
    """c10d's process group named ``name`` (RuntimeError when c10d holds none by that name)."""
    from torch.distributed import distributed_c10d as c10d

    return c10d._resolve_process_group(name)  # type: ignore[arg-type]  # torch >= 2.10 types it GroupName


def _from_c10d(name: str) -> Optional[GroupInfo]:
    import torch.distributed as dist

    if not dist.is_initialized():
        return None
    try:
        pg = resolve(name)
    except Exception:
        return None
    return register(name, dist.get_process_group_ranks(pg), dist.get_world_size())


def register_partition(blocks: Iterable[Sequence[int]]) -> Tuple[Tuple[int, ...], ...]:
    """Declares that ``blocks`` (disjoint lists of global ranks) were created together, as one partition."""
    part = tuple(tuple(int(r) for r in b) for b in blocks)
    seen: set = set()
    for b in part:
        if seen & set(b):
            raise ValueError(f"funcoll: partition blocks overlap: {[list(b) for b in part]}")
        seen |= set(b)
    with _lock:
        for b in part:
            _partitions[frozenset(b)] = part
        _version[0] += 1
    _partitions_changed()
    return part


def register_mesh(mesh) -> None:
    """Registers every dimension of a ``torch.distributed.DeviceMesh`` as a partition."""
    t = mesh.mesh
    for dim in range(t.dim()):
        register_partition(t.transpose(dim, -1).reshape(-1, t.size(dim)).tolist())


def regular_partition(ranks: Sequence[int], world_size: int) -> Optional[Tuple[Tuple[int, ...], ...]]:
    """The partition a "regular" block belongs to, as every rank of it can infer alone: ranks ``a, a+k, ...,
    a+(s-1)k`` (stride k >= 1, s >= 2 ranks) with ``s*k`` dividing the world and ``a mod s*k < k``, are one block of
    the partition of every chunk of ``s*k`` ranks into k strided blocks. That is exactly what the dims of a
    DeviceMesh (row-major, any rank count) and ``new_subgroups(group_size)`` create. None otherwise."""
    r = sorted(int(x) for x in ranks)
    s = len(r)
    if s < 2:
        return None
    k = r[1] - r[0]
    span = s * k
    if k < 1 or any(r[i + 1] - r[i] != k for i in range(s - 1)) or world_size % span or r[0] % span >= k:
        return None
    return tuple(tuple(base + off + j * k for j in range(s))
                 for base in range(0, world_size, span) for off in range(k))


def blocks_for(ranks: Sequence[int], world_size: int) -> List[List[int]]:
    """The replica groups every rank of the world must emit for a collective over the group of global ``ranks``: the
    registered or :func:`regular_partition` the group is a block of, else the group padded with singleton blocks,
    sorted by smallest rank. Cached: the cost of a call does not grow with the world."""
    return [list(b) for b in _blocks_for(tuple(int(r) for r in ranks), int(world_size), _version[0])]


@functools.lru_cache(maxsize=1024)
def _blocks_for(ranks: Tuple[int, ...], world_size: int, version: int) -> Tuple[Tuple[int, ...], ...]:
    part = _partitions.get(frozenset(ranks)) or regular_partition(ranks, world_size)
    blocks = list(part) if part is not None else [ranks]
    covered = {r for b in blocks for r in b}
    blocks += [(r,) for r in range(world_size) if r not in covered]
    return tuple(sorted(blocks, key=min))


def to_global(name: str, group_rank: int) -> int:
    info = lookup(name)
    if not 0 <= group_rank < info.size:
        raise ValueError(f"funcoll: group rank {group_rank} is outside group {name!r} of size {info.size}")
    return info.ranks[group_rank]


def to_group(name: str, global_rank: int) -> int:
    info = lookup(name)
    try:
        return info.ranks.index(global_rank)
    except ValueError:
        raise ValueError(f"funcoll: global rank {global_rank} is not in group {name!r} "
                         f"(ranks {list(info.ranks)})") from None


def new_subgroups(group_size: Optional[int] = None, **kwargs):
    """``torch.distributed.new_subgroups`` that also registers the partition."""
    import torch.distributed as dist

    world = dist.get_world_size()
    size = group_size or world
    if world % size:
        raise ValueError(f"funcoll.new_subgroups: the world size {world} is not divisible by group_size {size}")
    register_partition([list(range(i, i + size)) for i in range(0, world, size)])
    return dist.new_subgroups(group_size, **kwargs)


def split_group(parent_pg=None, split_ranks=None, **kwargs):
    """``torch.distributed.split_group`` that also registers the partition."""
    import torch.distributed as dist

    if split_ranks is not None:
        register_partition(split_ranks)
    return dist.split_group(parent_pg=parent_pg, split_ranks=split_ranks, **kwargs)
