"""Every question torch's c10d, FSDP2, DeviceMesh and pipelining ask of a group or of its backend gets an answer on a
funcoll group instead of an exception: the C++ answers of a Python ProcessGroup raise ("Could not find the default
backend type 0 for Process Group with name funcoll"), and a funcoll group answers for itself.

The oracle is gloo in the same process: funcoll answers as gloo does, except where the tables below say why it
answers otherwise. The questions are the ones the running torch's sources ask (torch 2.15.0: distributed_c10d.py,
fsdp/_fully_shard/_fsdp_collectives.py, device_mesh.py, pipelining/_p2p.py), and every ``supports_*`` property the
running torch's C++ ``ProcessGroup`` and ``Backend`` classes declare, read from them, so that a question a newer torch
adds is asked here too.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

from funcoll.launch import run_world
from tests import fresh

TORCH_2_15 = hasattr(torch._C._distributed_c10d, "ReconfigureOptions")
needs_2_15 = pytest.mark.skipif(not TORCH_2_15, reason="torch >= 2.15 asks these (ReconfigureOptions, shrink_group)")

# questions whose answer a funcoll group gives as gloo's does: (what is asked, the call)
SAME_AS_GLOO = {
    "c10d._supports_window(pg)": lambda pg, b: c10d._supports_window(pg),
    "pg.supports_window": lambda pg, b: pg.supports_window,
    "pg.supports_abort_hooks": lambda pg, b: pg.supports_abort_hooks,
    "pg.supports_completion_hooks": lambda pg, b: pg.supports_completion_hooks,
    "c10d._supports_reconfigure(pg)": lambda pg, b: c10d._supports_reconfigure(pg),
    "backend.supports_reconfigure": lambda pg, b: b.supports_reconfigure,
    "backend.supports_splitting": lambda pg, b: b.supports_splitting,
    "backend.supports_tensor_alloc(cpu)": lambda pg, b: b.supports_tensor_alloc(torch.device("cpu")),
    "backend._supports_time_estimate": lambda pg, b: b._supports_time_estimate,
    "backend.get_error()": lambda pg, b: b.get_error(),
    "backend.bound_device_id": lambda pg, b: b.bound_device_id,
    "backend.options._timeout": lambda pg, b: b.options._timeout,
    "backend.options.group_name": lambda pg, b: b.options.group_name,
    "pg._has_hooks()": lambda pg, b: pg._has_hooks() if hasattr(pg, "_has_hooks") else False,
}
# the calls gloo refuses, with the same RuntimeError text, naming its backend ("Backend gloo does not support ...")
SAME_REFUSAL = {
    "backend.allocate_tensor": lambda pg, b: b.allocate_tensor(4, dtype=torch.float32, device=torch.device("cpu")),
    "backend.memory_stats()": lambda pg, b: b.memory_stats(),
    "backend.mem_allocator": lambda pg, b: b.mem_allocator,
}
# where funcoll answers otherwise, and why: (the call, gloo's answer, funcoll's)
OTHERWISE = {
    # funcoll shrinks its groups itself (ProcessGroupFuncoll.shrink); ProcessGroupGloo does not (torch 2.15)
    "backend.supports_shrinking": (lambda pg, b: b.supports_shrinking, False, True),
    # c10d's batch_isend_irecv hands a funcoll group its batch to issue as one group
    "backend.supports_coalescing": (lambda pg, b: b.supports_coalescing, False, True),
    "backend.name()": (lambda pg, b: b.name(), "gloo", "funcoll"),
    "dist.get_backend(pg)": (lambda pg, b: dist.get_backend(pg), "gloo", "funcoll"),
}


def _answers(backend: str) -> dict:
    """Every question above on a one-rank group of ``backend`` in this process: its answer, or the exception."""
    dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1, timeout=timedelta(seconds=30))
    pg = dist.group.WORLD
    b = pg._get_backend(torch.device("cpu"))
    out = {}
    table = {**SAME_AS_GLOO, **SAME_REFUSAL, **{k: v[0] for k, v in OTHERWISE.items()}}
    for name, ask in table.items():
        try:
            out[name] = ("ok", repr(ask(pg, b)))
        except Exception as e:  # noqa: BLE001 - compared with gloo's
            out[name] = ("raises", type(e).__name__, str(e).replace("gloo", "<backend>").replace("funcoll",
                                                                                               "<backend>"))
    # every supports_* property the running torch's C++ classes declare, on the group and on its backend
    cpp = torch._C._distributed_c10d
    for owner, obj in (("pg", pg), ("backend", b)):
        for cls in (cpp.ProcessGroup, cpp.Backend):
            for attr in dir(cls):
                if attr.startswith(("supports_", "_supports_")) and hasattr(obj, attr):
                    try:
                        value = getattr(obj, attr)
                        value = value(torch.device("cpu")) if callable(value) else value
                        out[f"declared {owner}.{attr}"] = ("ok", type(value).__name__)
                    except Exception as e:  # noqa: BLE001
                        out[f"declared {owner}.{attr}"] = ("raises", type(e).__name__, str(e))
    dist.destroy_process_group()
    return out


def answers(backend: str) -> dict:
    if backend == "funcoll":
        import funcoll  # noqa: F401
    return _answers(backend)


@pytest.fixture(scope="module")
def both():
    return {b: fresh.run("tests.fault_tolerance.test_probes:answers", b, timeout=120) for b in ("gloo", "funcoll")}


@needs_2_15
def test_funcoll_answers_as_gloo_does(both):
    gloo, fc = both["gloo"], both["funcoll"]
    for name in SAME_AS_GLOO:
        assert fc[name] == gloo[name] and fc[name][0] == "ok", (name, gloo[name], fc[name])
    for name in SAME_REFUSAL:
        assert gloo[name][0] == "raises", (name, gloo[name])
        assert fc[name] == gloo[name], (name, gloo[name], fc[name])


@needs_2_15
def test_where_funcoll_answers_otherwise_it_says_what(both):
    for name, (_, at_gloo, at_funcoll) in OTHERWISE.items():
        assert both["gloo"][name] == ["ok", repr(at_gloo)], (name, both["gloo"][name])
        assert both["funcoll"][name] == ["ok", repr(at_funcoll)], (name, both["funcoll"][name])


@needs_2_15
def test_every_declared_supports_property_answers(both):
    declared = {k: v for k, v in both["funcoll"].items() if k.startswith("declared ")}
    assert {"declared backend.supports_shrinking", "declared pg.supports_reconfigure",
            "declared backend.supports_tensor_alloc"} <= set(declared), sorted(declared)
    raising = {k: v for k, v in declared.items() if v[0] != "ok"}
    assert not raising, raising
    # a gloo group's backend is another object; a funcoll group is its own backend: it answers what either answers
    assert {k for k in both["gloo"] if k.startswith("declared ")} <= set(declared)


# -- the questions asked with a world: FSDP2's memory opt-in, DeviceMesh's split, pipelining's edge groups ---------
def _rank_asked(rank, world):
    import torch.distributed.pipelining._p2p as p2p
    from torch.distributed._composable.fsdp import fully_shard
    from torch.distributed.device_mesh import init_device_mesh

    out = {}
    model = torch.nn.Linear(4, 4, bias=False)
    torch.manual_seed(0)
    torch.nn.init.normal_(model.weight)
    mesh = init_device_mesh("cpu", (world,))
    fully_shard(model, mesh=mesh)
    model.set_allocate_memory_from_process_group_for_comm(True)  # FSDP2 asks supports_tensor_alloc, then falls back
    x = torch.ones(2, 4) * (rank + 1)
    model(x).sum().backward()
    out["fsdp_grad"] = model.weight.grad.full_tensor().tolist()
    # pipelining's per-edge groups: supports_splitting, options._timeout, then split_group per round
    groups, rounds = p2p._build_p2p_edge_groups(dist.group.WORLD, {0: 0, 1: 1}, torch.device("cpu"))
    out["edges"] = sorted(groups)
    out["edge_backends"] = sorted({type(g).__name__ for g in groups.values()})
    t = torch.full((3,), float(rank))
    for (src, dst), g in sorted(groups.items()):  # each directed edge's own group carries its messages
        if src == rank:
            dist.send(t, dst=dst, group=g)
        else:
            r = torch.empty(3)
            dist.recv(r, src=src, group=g)
            out[f"from {src}"] = r.tolist()
    return out


@needs_2_15
def test_fsdp2_memory_opt_in_and_pipelining_edge_groups_on_a_funcoll_world():
    res = run_world("tests.fault_tolerance.test_probes:_rank_asked", 2, timeout=120, coll_timeout=30)
    # the gradient of sum(W x) over both ranks' inputs: every row is the sum of the inputs (1 + 2) * ones
    for r in res:
        assert r["fsdp_grad"] == [[3.0] * 4] * 4, r["fsdp_grad"]
        assert r["edges"] == [(0, 1), (1, 0)] and r["edge_backends"] == ["ProcessGroupFuncoll"], r
    assert res[0]["from 1"] == [1.0] * 3 and res[1]["from 0"] == [0.0] * 3, res
