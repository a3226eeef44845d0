"""Upstream APIs on a funcoll group: DTensor redistribute and FSDP2 gradients (reduce_scatter AVG)."""

import pytest
import torch

from tests.world import run_world


@pytest.mark.parametrize("profile", [None, "xccl"], ids=["gloo", "xccl"])
def test_fsdp2_and_dtensor_on_funcoll(profile):
    results = run_world("tests.cases_upstream:fsdp2_and_dtensor", 2, profile, timeout=200)
    for r in results:
        assert torch.equal(r["gathered"], torch.arange(8.0).reshape(4, 2))
        assert r["max_diff"] < 1e-6, r["max_diff"]
        assert r["ops"] == ["all_gather_into_tensor", "reduce_scatter_tensor"]
        # FSDP2 reduces gradients with AVG: native on gloo, SUM then scale where XCCL lacks it
        assert r["strategies"] == (["native"] if profile is None else ["avg=sum+scale", "native"])


@pytest.mark.parametrize("profile", [None, "xccl"], ids=["gloo", "xccl"])
def test_ddp_on_funcoll(profile):
    for r in run_world("tests.cases_upstream:ddp", 2, profile, timeout=200):
        assert r["params_equal_rank0"]
        assert r["max_diff"] < 1e-6, r["max_diff"]
        # construction broadcasts the parameters; gradients go through all_reduce (DDP's buckets)
        assert "broadcast" in r["ops"] and "all_reduce" in r["ops"], r["ops"]
