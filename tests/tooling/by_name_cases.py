"""What a process does that names funcoll only by its backend string, run in fresh interpreters by
tests/tooling/test_found_by_name.py. This file imports nothing of the checkout (torch and the standard library only):
its runs see funcoll either installed from its wheel, never imported beforehand (torch >= 2.14 finds it through the
``torch.distributed.backends`` entry point), or, where torch does not read that group, through ``import funcoll``
first (``found == "import"``).

Each case returns what the test asserts: whether funcoll was imported before the call that names it, the class and
backend of the group made, where funcoll was imported from and the numbers a collective returned.
"""

import datetime
import importlib.util
import json
import os
import sys

TIMEOUT = datetime.timedelta(seconds=60)  # every rendezvous and collective of these runs


def _found(found: str) -> dict:
    """Before anything names funcoll: ``import funcoll`` first where ``found == "import"``; what the process holds."""
    if found == "import":
        import funcoll  # noqa: F401
    import torch.distributed as dist

    return {"imported_before": "funcoll" in sys.modules, "registered_before": "FUNCOLL" in dist.Backend._plugins}


def _after(group=None) -> dict:
    """After the call: where funcoll came from, and the group's class and backend."""
    import torch.distributed as dist

    out = {"imported_after": "funcoll" in sys.modules, "registered_after": "FUNCOLL" in dist.Backend._plugins}
    if "funcoll" in sys.modules:
        from importlib import metadata

        out["funcoll_file"] = sys.modules["funcoll"].__file__
        try:
            out["dist_info"] = str(metadata.distribution("funcoll")._path)  # type: ignore[attr-defined]
        except metadata.PackageNotFoundError:
            out["dist_info"] = None
    if group is not None:
        out["group_class"] = f"{type(group).__module__}.{type(group).__qualname__}"
        out["backend"] = str(dist.get_backend(group))
    return out


def where() -> dict:
    """The run's import path and working directory, and whether funcoll is importable (not importing it)."""
    spec = importlib.util.find_spec("funcoll")
    return {"sys_path": sys.path, "cwd": os.getcwd(), "funcoll": spec.origin if spec else None}


def init(found: str) -> dict:
    """``dist.init_process_group("funcoll")`` (a world of one) and a BXOR all_reduce of int16 on it."""
    import torch
    import torch.distributed as dist

    out = _found(found)
    dist.init_process_group("funcoll", store=dist.HashStore(), rank=0, world_size=1, timeout=TIMEOUT)
    t = torch.tensor([5, 12, 7], dtype=torch.int16)
    dist.all_reduce(t, op=dist.ReduceOp.BXOR)  # gloo moves no int16: funcoll's own path
    out.update(_after(dist.group.WORLD), result=t.tolist())
    dist.destroy_process_group()
    return out


def parse(found: str) -> dict:
    """The device:backend string init_process_group parses: ``"cpu:gloo,xpu:funcoll"``."""
    import torch.distributed as dist
    from torch.distributed.distributed_c10d import BackendConfig

    out = _found(found)
    out["map"] = BackendConfig(dist.Backend("cpu:gloo,xpu:funcoll")).get_device_backend_map()
    out.update(_after())
    return out


def available(found: str) -> dict:
    """``dist.is_backend_available("funcoll")``."""
    import torch.distributed as dist

    out = _found(found)
    out["available"] = dist.is_backend_available("funcoll")
    out.update(_after())
    return out


def new_group(found: str) -> dict:
    """A gloo default group, then ``dist.new_group(backend="funcoll")``."""
    import torch.distributed as dist

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1, timeout=TIMEOUT)
    out = _found(found)
    g = dist.new_group(backend="funcoll")
    out.update(_after(g), world_backend=str(dist.get_backend()))
    dist.destroy_process_group()
    return out


def torchtitan(found: str, rank: int, world: int, port: int, cpu_backend: bool) -> dict:
    """torchtitan's ``init_distributed`` on an XPU host (torchtitan/distributed/utils.py, ``_get_distributed_backend``:
    the device's entry of ``Backend.default_device_backend_map``, as ``"xpu:<it>,cpu:gloo"`` when the CPU backend is
    enabled), with that entry set to funcoll beforehand; env:// as torchrun sets it. Then an AVG all_reduce."""
    import torch
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world))
    out = _found(found)
    torch.distributed.Backend.default_device_backend_map["xpu"] = "funcoll"  # the one line a user adds
    device_type = "xpu"
    backend = "nccl"  # torchtitan's own steps, from here on
    if device_type in torch.distributed.Backend.default_device_backend_map:
        backend = torch.distributed.Backend.default_device_backend_map.get(device_type)
    if cpu_backend:
        backend = f"{device_type}:{backend},cpu:gloo"
    torch.distributed.init_process_group(backend=backend, timeout=TIMEOUT)
    t = torch.tensor([1.0, 2.0, 3.0]) * (rank + 1)
    dist.all_reduce(t, op=dist.ReduceOp.AVG)
    out.update(_after(dist.group.WORLD), backend_string=backend, result=t.tolist())
    dist.destroy_process_group()
    return out


def sglang(found: str, rank: int, port: int) -> dict:
    """sglang's weight-update group: each process has a default group of its own (sglang asserts one), then joins a
    2-rank group as ``init_custom_process_group`` (sglang python/sglang/srt/utils/common.py) makes it, with the backend
    the ``/init_weights_update_group`` request names: ``Backend(backend)``, a TCP rendezvous, a PrefixStore named after
    the group, ``_new_process_group_helper(world_size, rank, [], backend, store, group_name=..., backend_options=None,
    timeout=..., device_id=None)`` and ``_world.pg_group_ranks[pg] = {i: i}``. Rank 0 (the trainer) broadcasts the
    weights; rank 1 (the engine, ``update_weights_from_distributed``) receives each with an async broadcast and waits
    for all of them, then one flattened bucket with a blocking broadcast."""
    import torch
    import torch.distributed as dist
    from torch.distributed.distributed_c10d import (
        Backend,
        PrefixStore,
        _new_process_group_helper,
        _world,
        rendezvous,
    )

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1, timeout=TIMEOUT)
    out = _found(found)
    backend = Backend("funcoll")
    store, rank, world_size = next(rendezvous(f"tcp://127.0.0.1:{port}", rank, 2, timeout=TIMEOUT))
    store.set_timeout(TIMEOUT)
    store = PrefixStore("weights", store)
    pg, _ = _new_process_group_helper(world_size, rank, [], backend, store, group_name="weights",
                                      backend_options=None, timeout=TIMEOUT, device_id=None)
    _world.pg_group_ranks[pg] = {i: i for i in range(world_size)}
    g = torch.Generator().manual_seed(7)
    sent = {"w": torch.randn(3, 4, generator=g), "b": torch.randn(5, generator=g).to(torch.bfloat16),
            "flat": torch.randn(6, generator=g)}
    got = {k: (v.clone() if rank == 0 else torch.empty_like(v)) for k, v in sent.items()}
    handles = [dist.broadcast(got[k], src=0, group=pg, async_op=True) for k in ("w", "b")]
    for h in handles:
        h.wait()
    dist.broadcast(got["flat"], src=0, group=pg)
    out.update(_after(pg), world_backend=str(dist.get_backend()),
               equal={k: torch.equal(got[k], sent[k]) for k in sent})
    dist.destroy_process_group(pg)
    dist.destroy_process_group()
    return out


def _torchrun(out_dir: str) -> None:
    """One rank under ``python -m torch.distributed.run``: ``init_process_group("funcoll")`` from torchrun's
    environment, never importing funcoll; a BXOR all_reduce of int16 and an AVG of float32; the rank's answers
    written to ``out_dir/rank<r>.json``."""
    import torch
    import torch.distributed as dist

    out = _found("entry point")
    dist.init_process_group("funcoll", timeout=TIMEOUT)
    r = dist.get_rank()
    x = torch.tensor([5, 12, 7], dtype=torch.int16) * (r + 1)
    dist.all_reduce(x, op=dist.ReduceOp.BXOR)
    y = torch.tensor([1.0, 2.0, 3.0]) * (r + 1)
    dist.all_reduce(y, op=dist.ReduceOp.AVG)
    out.update(_after(dist.group.WORLD), rank=r, world=dist.get_world_size(), bxor=x.tolist(), avg=y.tolist())
    dist.destroy_process_group()
    with open(os.path.join(out_dir, f"rank{r}.json"), "w") as f:
        json.dump(out, f)


if __name__ == "__main__":  # the script torchrun starts on every rank
    _torchrun(sys.argv[1])
