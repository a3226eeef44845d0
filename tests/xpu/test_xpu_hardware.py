"""Tests that need real Intel GPUs: 2 ranks, eager and compiled, numbers against the independent references.

They skip on machines without two XPUs and torch's XCCL backend (this CPU-only machine included): what they check
on hardware - XCCL itself, the device kernels, streams, and that results stay on the XPU - cannot be observed
without one. Run them on an XPU host with ``./dev test tests/xpu/test_xpu_hardware.py``.
"""

import pytest
import torch
import torch.distributed as dist

import funcoll
from funcoll.launch import run_world
from tests import reference as ref
from tests.xpu import xpu_cases


def _why_skip():
    if not (hasattr(torch, "xpu") and torch.xpu.is_available()):
        return f"needs Intel GPUs: torch.xpu.is_available() is False (torch {torch.__version__})"
    if torch.xpu.device_count() < 2:
        return f"needs 2 Intel GPUs, found {torch.xpu.device_count()}"
    if not (hasattr(dist, "is_xccl_available") and dist.is_xccl_available()):
        return "needs torch's XCCL backend: torch.distributed.is_xccl_available() is False"
    return None


pytestmark = pytest.mark.skipif(_why_skip() is not None, reason=_why_skip() or "")


# -- rank bodies (2 ranks, one XPU each) -----------------------------------------------------------------------
def hardware_eager(rank, n):
    torch.xpu.set_device(rank)
    dev = torch.device("xpu", rank)
    out = {}
    with funcoll.record() as log:
        for salt, (op, dtype, _) in enumerate(xpu_cases.ALL_REDUCE):
            ins = xpu_cases.inputs(n, dtype, (xpu_cases.N_ELEM,), salt)
            t = ins[rank].to(dev)
            dist.all_reduce(t, op=ref.c10d_op(op))
            out[("all_reduce", op, str(dtype))] = xpu_cases.check(t, ref.reduce(op, ins), n, op)
            assert t.device == dev
        send, recv = xpu_cases.splits(n, rank)
        x = xpu_cases.make(torch.float32, (sum(send), 3), rank, 300).to(dev)
        o = torch.empty((sum(recv), 3), device=dev)
        dist.all_to_all_single(o, x, recv, send)
        out[("all_to_all_uneven",)] = xpu_cases.check(o, torch.cat([xpu_cases.rows_from(n, j, rank, torch.float32, 300)
                                                            for j in range(n)]), n)
        ins = xpu_cases.inputs(n, torch.float8_e4m3fn, (2, 3), 200)
        g = torch.empty((2 * n, 3), dtype=torch.float8_e4m3fn, device=dev)
        dist.all_gather_into_tensor(g, ins[rank].to(dev))
        out[("all_gather", "float8")] = xpu_cases.check(g, torch.cat(ins), n)
    tp = dist.group.WORLD.transport("xpu")
    return {"results": out, "notes": [s for _, ss in log for s in ss], "caps": tp.caps.name,
            "calls": {(p, o, str(d)): v for (p, o, d), v in tp.calls.items()}}


def hardware_compiled(rank, n, backend="inductor"):
    import torch.distributed._functional_collectives as fc

    torch.xpu.set_device(rank)
    dev = torch.device("xpu", rank)
    funcoll.install(["xpu"])
    group = dist.group.WORLD

    def step(x, y, z):
        a = fc.all_reduce(x, "avg", group)
        b = fc.all_reduce(y, "bxor", group)
        c = fc.reduce_scatter_tensor(x, "max", 0, group)
        d = fc.all_gather_tensor(z, 0, group)
        return a * 1, b + 0, c, d

    x = xpu_cases.make(torch.float32, (2 * n, 4), rank, 1).to(dev)
    y = xpu_cases.make(torch.int32, (8,), rank, 2).to(dev)
    z = xpu_cases.make(torch.float8_e5m2, (2, 4), rank, 3).to(dev)
    with funcoll.record() as log:
        a, b, c, d = torch.compile(step, fullgraph=True, backend=backend)(x, y, z)
    xs = xpu_cases.inputs(n, torch.float32, (2 * n, 4), 1)
    res = {"avg": xpu_cases.check(a, ref.reduce("avg", xs), n, "avg"),
           "bxor": xpu_cases.check(b, ref.reduce("bxor", xpu_cases.inputs(n, torch.int32, (8,), 2)), n, "bxor"),
           "rs_max": xpu_cases.check(c, ref.reduce("max", xs)[2 * rank:2 * rank + 2], n, "max"),
           "ag_fp8": xpu_cases.check(d, torch.cat(xpu_cases.inputs(n, torch.float8_e5m2, (2, 4), 3)), n),
           "on_device": all(t.device == dev for t in (a, b, c, d))}
    funcoll.uninstall()
    return {"results": res, "notes": [s for _, ss in log for s in ss]}


# -- the tests -------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("backend", ["funcoll", "cpu:gloo,xpu:funcoll"])
def test_eager_on_two_xpus(backend):
    results = run_world("tests.xpu.test_xpu_hardware:hardware_eager", 2, None, timeout=300, backend=backend)
    for res in results:
        bad = {k: d for k, (ok, d) in res["results"].items() if not ok}
        assert not bad, bad
        assert res["caps"].startswith("xccl[")
        # the refused primitives never reached XCCL
        for (prim, op, dtype) in res["calls"]:
            # PREMUL_SUM reaches XCCL on all_reduce only, from torch 2.12 (it scales the tensor in place and sums)
            premul_ok = op == "premul_sum" and prim == "all_reduce" and xpu_cases.PREMUL_NATIVE
            assert op not in ("premul_sum", "band", "bor", "bxor") or premul_ok, (prim, op)
            assert dtype not in ("torch.int16", "torch.uint16", "torch.uint32", "torch.uint64"), (prim, dtype)
        assert "gather+local bxor" in res["notes"] and xpu_cases.PREMUL_AR in res["notes"]


@pytest.mark.parametrize("compile_backend", ["aot_eager", "inductor"])
def test_compiled_on_two_xpus_over_an_xccl_group(compile_backend):
    """torch.compile'd functional collectives on a group made with the stock xccl backend; funcoll's kernels on
    the XPU key take them over after funcoll.install(["xpu"])."""
    results = run_world("tests.xpu.test_xpu_hardware:hardware_compiled", 2, None, args=(compile_backend,), timeout=600,
                        backend="cpu:gloo,xpu:xccl")
    for res in results:
        bad = {k: v for k, v in res["results"].items() if v is not True and not (isinstance(v, tuple) and v[0])}
        assert not bad, bad
        assert "gather+local bxor" in res["notes"]
        assert any("moved as torch.uint8" in s for s in res["notes"])
