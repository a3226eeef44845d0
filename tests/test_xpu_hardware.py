"""Tests that need real Intel GPUs: 2 ranks, eager and compiled, numbers against the independent references.

They skip on machines without two XPUs and torch's XCCL backend (this CPU-only machine included): what they check
on hardware - XCCL itself, the device kernels, streams, and that results stay on the XPU - cannot be observed
without one. Run them on an XPU host with ``./dev test tests/test_xpu_hardware.py``.
"""

import pytest
import torch
import torch.distributed as dist

from tests import xpu_cases as X
from tests.world import run_world


def _why_skip():
    if not (hasattr(torch, "xpu") and torch.xpu.is_available()):
        return f"needs Intel GPUs: torch.xpu.is_available() is False (torch {torch.__version__})"
    if torch.xpu.device_count() < 2:
        return f"needs 2 Intel GPUs, found {torch.xpu.device_count()}"
    if not (hasattr(dist, "is_xccl_available") and dist.is_xccl_available()):
        return "needs torch's XCCL backend: torch.distributed.is_xccl_available() is False"
    return None


pytestmark = pytest.mark.skipif(_why_skip() is not None, reason=_why_skip() or "")


@pytest.mark.parametrize("backend", ["funcoll", "cpu:gloo,xpu:funcoll"])
def test_eager_on_two_xpus(backend):
    results = run_world("tests.xpu_cases:hardware_eager", 2, None, timeout=300, backend=backend)
    for res in results:
        bad = {k: d for k, (ok, d) in res["results"].items() if not ok}
        assert not bad, bad
        assert res["caps"].startswith("xccl[")
        # the refused primitives never reached XCCL
        for (prim, op, dtype) in res["calls"]:
            assert op not in ("premul_sum", "band", "bor", "bxor"), (prim, op)
            assert dtype not in ("torch.int16", "torch.uint16", "torch.uint32", "torch.uint64"), (prim, dtype)
        assert "gather+local bxor" in res["notes"] and "premul_sum=scale+sum" in res["notes"]


@pytest.mark.parametrize("compile_backend", ["aot_eager", "inductor"])
def test_compiled_on_two_xpus_over_an_xccl_group(compile_backend):
    """torch.compile'd functional collectives on a group made with the stock xccl backend; funcoll's kernels on
    the XPU key take them over after funcoll.install(["xpu"])."""
    results = run_world("tests.xpu_cases:hardware_compiled", 2, None, args=(compile_backend,), timeout=600,
                        backend="cpu:gloo,xpu:xccl")
    for res in results:
        bad = {k: v for k, v in res["results"].items() if v is not True and not (isinstance(v, tuple) and v[0])}
        assert not bad, bad
        assert "gather+local bxor" in res["notes"]
        assert any("moved as torch.uint8" in s for s in res["notes"])
