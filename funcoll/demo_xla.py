"""The XLA part of funcoll's demo: torch_xla on the CPU PJRT device.

1. A funcoll world of one rank, executed: a few collectives torch_xla 2.9 refuses or gets wrong (AVG, PREMUL_SUM,
   BXOR, uneven all_to_all, broadcast, in-place), run eagerly (``dist.*``) and as ``_c10d_functional`` ops
   compiled with ``torch.compile(backend="openxla", fullgraph=True)``; the two must agree.
2. The HLO a virtual 4-rank job would compile (rank 1; built in a subprocess, which has no process group yet):
   replica groups of the world, of a 2x2 mesh's dims and of a lone sub-group, AVG, uneven all_to_all.

``python -m funcoll.demo_xla`` runs it alone; ``./dev demo`` runs it after the CPU part.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import torch


def _world1() -> bool:
    import torch.distributed as dist
    import torch_xla

    import funcoll
    from funcoll import xla

    F = torch.ops._c10d_functional
    R = dist.ReduceOp
    dev = torch_xla.device()
    own = not dist.is_initialized()
    if own:
        dist.init_process_group("funcoll", store=dist.HashStore(), rank=0, world_size=1)
    group = dist.new_group([0], backend="funcoll") if not own else dist.group.WORLD
    assert isinstance(group, dist.ProcessGroup)
    name = group.group_name
    funcoll.install(["xla"])
    x0 = torch.tensor([1.5, -2.0, 3.25, 0.5])
    i0 = torch.tensor([5, 12, 7, 3], dtype=torch.int32)

    def eager(x, i):
        out = {}
        t = x.clone()
        dist.all_reduce(t, op=R.AVG, group=group)
        out["all_reduce avg"] = t
        t = x.clone()
        dist.all_reduce(t, op=dist._make_nccl_premul_sum(0.5), group=group)
        out["all_reduce premul_sum(0.5)"] = t
        t = i.clone()
        dist.all_reduce(t, op=R.BXOR, group=group)
        out["all_reduce bxor int32"] = t
        o = torch.empty_like(x)
        with xla.static_split_bound(4):
            dist.all_to_all_single(o, x, [4], [4], group=group)
        out["all_to_all_single splits [4]"] = o
        t = x.clone()
        dist.broadcast(t, src=0, group=group)
        out["broadcast"] = t
        t = x.clone()
        dist.all_reduce(t, group=group)
        out["all_reduce_ (in place)"] = t
        return out

    def functional(x, i):
        w = F.wait_tensor
        t = x.clone()
        w(F.all_reduce_(t, "sum", name))
        return {
            "all_reduce avg": w(F.all_reduce(x, "avg", name)),
            "all_reduce premul_sum(0.5)": w(F.all_reduce(x * 0.5, "sum", name)),
            "all_reduce bxor int32": w(F.all_reduce(i, "bxor", name)),
            "all_to_all_single splits [4]": w(F.all_to_all_single(x, [4], [4], name)),
            "broadcast": w(F.broadcast(x, 0, name)),
            "all_reduce_ (in place)": t,
        }

    e = {k: v.cpu() for k, v in eager(x0.to(dev), i0.to(dev)).items()}
    compiled_fn = torch.compile(functional, backend="openxla", fullgraph=True)
    with xla.static_split_bound(4):
        c = {k: v.cpu() for k, v in compiled_fn(x0.to(dev), i0.to(dev)).items()}
    ok = True
    w = max(len(k) for k in e)
    print(f"  {'call (world 1, executed)':<{w}}  {'eager dist.*':<28} compiled (openxla) agrees")
    for k in e:
        agree = torch.equal(e[k], c[k])
        ok &= agree
        print(f"  {k:<{w}}  {str(e[k].tolist()):<28} {'yes' if agree else 'NO'}")
    if own:
        dist.destroy_process_group()
    return ok


def _virtual_hlo() -> dict:
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, PYTHONPATH=root + os.pathsep + os.environ.get("PYTHONPATH", ""))
    p = subprocess.run([sys.executable, "-m", "funcoll.demo_xla", "--virtual-hlo"], cwd=root, env=env,
                       capture_output=True, text=True, timeout=180)
    if p.returncode != 0:
        raise RuntimeError(f"the virtual 4-rank world failed:\n{p.stderr[-3000:]}")
    return json.loads(p.stdout.split("JSON:", 1)[1])


def virtual_hlo_main() -> int:
    """Rank 1 of a virtual 4-rank funcoll world (HashStore, nothing executed): prints JSON {call: HLO lines}."""
    import torch.distributed as dist
    import torch_xla
    from torch.distributed.device_mesh import init_device_mesh

    import funcoll
    from funcoll import testing, xla
    from funcoll.testing import xla_collectives

    dist.init_process_group("funcoll", store=dist.HashStore(), rank=1, world_size=4)
    funcoll.install(["xla"])
    dev = torch_xla.device()
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    funcoll.groups.register_mesh(mesh)
    lone = dist.new_group([1, 2, 3])
    out = {}

    def show(name, fn, keep=None):
        xla.reset_token()
        out[name] = xla_collectives(fn(), keep)
        xla.reset_token()

    def ar(group=None, op=dist.ReduceOp.SUM):
        t = torch.ones(4, device=dev)
        dist.all_reduce(t, op=op, group=group)
        return t

    def a2a():
        o = torch.empty(5, device=dev)
        with xla.static_split_bound(2):
            dist.all_to_all_single(o, torch.arange(6.0).to(dev), [1, 2, 1, 1], [2, 1, 2, 1])
        return o

    show("all_reduce, world", ar)
    show("all_reduce, mesh dim dp", lambda: ar(mesh.get_group("dp")))
    show("all_reduce, mesh dim tp", lambda: ar(mesh.get_group("tp")))
    show("all_reduce, lone group [1,2,3]", lambda: ar(lone))
    show("all_reduce AVG", lambda: ar(op=dist.ReduceOp.AVG), testing.COLLECTIVE_OPCODES + ("divide",))
    show("all_to_all_single uneven (bound 2)", a2a)
    print("JSON:" + json.dumps(out))
    dist.destroy_process_group()
    return 0


def main() -> int:
    t0 = time.monotonic()
    os.environ.setdefault("PJRT_DEVICE", "CPU")
    ok = _world1()
    print(f"  eager == compiled on every call: {ok}")
    hlo = _virtual_hlo()
    print("\n  the HLO rank 1 of a virtual 4-rank job would compile (mesh 2x2 registered; nothing executed):")
    for name, text in hlo.items():
        lines = text.splitlines()
        print(f"  - {name}:")
        for line in lines:
            print(f"      {line if len(line) <= 140 else line[:137] + '...'}")
    print(f"  ({time.monotonic() - t0:.1f}s)")
    return 0 if ok else 1


if __name__ == "__main__":
    if sys.argv[1:] == ["--virtual-hlo"]:
        sys.exit(virtual_hlo_main())
    sys.exit(main())
