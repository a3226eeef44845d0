"""Upstream APIs on a funcoll group: DTensor redistribute and FSDP2 gradients (reduce_scatter AVG), DDP.

The rank bodies run on every rank of a real world (``funcoll.launch.run_world``; one world per profile runs both,
``fsdp2_and_dtensor`` then ``ddp``) and compare against an unsharded, undistributed copy of the model; the tests below
assert on what they return.
"""

import pytest
import torch

import funcoll
from funcoll.launch import run_world


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))


def _data(rank):
    g = torch.Generator().manual_seed(1000 + rank)
    return torch.randn(3, 4, generator=g)


def _reference_grads(n):
    """Every rank's gradient on an unsharded, undistributed copy, averaged locally."""
    refs = []
    for r in range(n):
        ref = _model()
        ref(_data(r)).sum().backward()
        refs.append([p.grad for p in ref.parameters()])
    return [torch.stack(gs).mean(0) for gs in zip(*refs)]


def fsdp2_and_dtensor(rank, n):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    mesh = init_device_mesh("cpu", (n,))
    x = distribute_tensor(torch.arange(4.0 * n).reshape(2 * n, 2), mesh, [Shard(0)])
    gathered = x.redistribute(mesh, [Replicate()]).to_local()
    m = _model()
    for layer in m:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer)
    fully_shard(m)
    with funcoll.record() as log:
        m(_data(rank)).sum().backward()
    grads = [p.grad.full_tensor() for p in m.parameters()]
    want = _reference_grads(n)
    max_diff = max(float((g - w).abs().max()) for g, w in zip(grads, want))
    return {"gathered": gathered, "max_diff": max_diff, "ops": sorted({o for o, _ in log}),
            "strategies": sorted({s for _, ns in log for s in ns})}


def ddp(rank, n):
    """DDP on a funcoll group: parameters broadcast from rank 0 at construction, gradients averaged."""
    m = _model()
    if rank:  # diverge, so the construction-time broadcast has something to do
        with torch.no_grad():
            for p in m.parameters():
                p.add_(float(rank))
    with funcoll.record() as log:
        d = torch.nn.parallel.DistributedDataParallel(m)
        d(_data(rank)).sum().backward()
    want = _reference_grads(n)
    ref_params = [p.detach() for p in _model().parameters()]
    return {"params_equal_rank0": all(torch.equal(p.detach(), q) for p, q in zip(m.parameters(), ref_params)),
            "max_diff": max(float((p.grad - w).abs().max()) for p, w in zip(m.parameters(), want)),
            "ops": sorted({o for o, _ in log})}


def both(rank, n):
    """The two bodies, one after the other in the same world: ``{body: its result}``."""
    return {"fsdp2_and_dtensor": fsdp2_and_dtensor(rank, n), "ddp": ddp(rank, n)}


# -- the tests --------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def worlds():
    """``worlds(profile, body)``: every rank's result of ``body`` in the one world of ``profile``."""
    cache = {}

    def get(profile, body):
        if profile not in cache:
            cache[profile] = run_world("tests.numerics.test_upstream:both", 2, profile, timeout=400)
        return [r[body] for r in cache[profile]]

    return get


@pytest.mark.parametrize("profile", [None, "xccl"], ids=["gloo", "xccl"])
def test_fsdp2_and_dtensor_on_funcoll(worlds, profile):
    results = worlds(profile, "fsdp2_and_dtensor")
    for r in results:
        assert torch.equal(r["gathered"], torch.arange(8.0).reshape(4, 2))
        assert r["max_diff"] < 1e-6, r["max_diff"]
        assert r["ops"] == ["all_gather_into_tensor", "reduce_scatter_tensor"]
        # FSDP2 reduces gradients with AVG: native on gloo, SUM then scale where XCCL lacks it
        assert r["strategies"] == (["native"] if profile is None else ["avg=sum+scale", "native"])


@pytest.mark.parametrize("profile", [None, "xccl"], ids=["gloo", "xccl"])
def test_ddp_on_funcoll(worlds, profile):
    for r in worlds(profile, "ddp"):
        assert r["params_equal_rank0"]
        assert r["max_diff"] < 1e-6, r["max_diff"]
        # construction broadcasts the parameters; gradients go through all_reduce (DDP's buckets)
        assert "broadcast" in r["ops"] and "all_reduce" in r["ops"], r["ops"]
