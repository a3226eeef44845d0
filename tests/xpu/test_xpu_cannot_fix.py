"""What XPU users hit that funcoll cannot fix (docs/xpu.md, "What funcoll cannot fix"), as far as a CPU machine lets
it be tested.

* **expandable segments.** With the XPU caching allocator in expandable-segments mode, large XCCL all_reduces have
  ended in ``UR_RESULT_ERROR_DEVICE_LOST`` and FSDP2 has hung (intel/torch-xpu-ops#4427, open). The first XPU transport
  of a process warns, once, exactly when the allocator settings torch itself read turn the mode on. Which variable
  torch reads is torch's business and differs by version: 2.15 takes the first set of PYTORCH_CUDA_ALLOC_CONF,
  PYTORCH_HIP_ALLOC_CONF and PYTORCH_ALLOC_CONF for every accelerator (so a CUDA-named setting reaches XPU, as #4427
  found); neither torch reads a PYTORCH_XPU_ALLOC_CONF; torch 2.9's XPU allocator has no expandable segments
  (pytorch/pytorch#166292 added them for 2.10) and no call to read the settings back, so funcoll never warns there.
  Each case runs in a fresh interpreter (torch parses the variables once per process).
* **split groups.** ProcessGroupXCCL does not override ``Backend::supportsSplitting()`` (pytorch/pytorch#186548, open;
  intel/torch-xpu-ops#5385), so ``dist.split_group`` raises on an XCCL group, and DeviceMesh calls it for every mesh
  dimension once the default group is bound to a device (``init_process_group(..., device_id=...)``) and an
  accelerator is present (torch 2.15's ``DeviceMesh._init_one_process_group``). A funcoll group splits. The test makes
  DeviceMesh take that path on a CPU world: ``torch.accelerator`` answers "xpu" (the one thing a CPU machine cannot
  give), the default group is ``"cpu:gloo,xpu:funcoll"`` with the ``bound_device_id`` that
  ``init_process_group(..., device_id=...)`` records; DeviceMesh's own gate (with a backend override it compares
  ``default_group._get_backend(accelerator).name()`` with it) and ``dist.split_group`` then run as torch wrote them, and
  every mesh dimension's group is a funcoll group made by ``split_group`` whose all_reduce gives the sums computed
  here. The same world with ``supports_splitting`` False, as ProcessGroupXCCL reports it, raises
  the error #186548 reports.
"""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.distributed as dist

from funcoll.launch import run_world
from tests import fresh

TEXT = ("funcoll: the XPU caching allocator runs with expandable segments ({how}); on Intel GPUs they have ended large "
        "XCCL all_reduces in UR_RESULT_ERROR_DEVICE_LOST and hung FSDP2 (intel/torch-xpu-ops#4427, open: Arc Pro B70 "
        "with the DLE 2026.1 runtime, not seen with DLE 2025.3). funcoll cannot fill this; if you see either, run "
        "without expandable_segments (docs/xpu.md, \"What funcoll cannot fix\")")
READS_SETTINGS = hasattr(torch._C, "_accelerator_getAllocatorSettings")  # torch >= 2.10 (2.15 here); not 2.9


def transports(set_at_run_time=None):
    """In a fresh interpreter: three XPU transports made over a one-rank gloo backend (the class funcoll makes for
    every XPU group, on CPU tensors), every warning recorded; ``set_at_run_time``: allocator settings set through torch
    first. Returns [(category, message)]."""
    from funcoll.transport import profile
    from funcoll.transport.xpu import XcclTransport

    if set_at_run_time is not None:
        torch._C._accelerator_setAllocatorSettings(set_at_run_time)
    backend = dist.ProcessGroupGloo(dist.HashStore(), 0, 1)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(3):
            XcclTransport(backend, profile("xccl"), "cpu", device_type="cpu")
    return [(w.category.__name__, str(w.message)) for w in caught if "funcoll" in str(w.message)]


CLEAN = {v: None for v in ("PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_HIP_ALLOC_CONF",
                           "PYTORCH_XPU_ALLOC_CONF")}
# (environment, the warning's "how" on a torch that reads its settings back, or None: no warning)
CASES = {
    "unset": ({}, None),
    "PYTORCH_ALLOC_CONF on": ({"PYTORCH_ALLOC_CONF": "expandable_segments:True"},
                              "PYTORCH_ALLOC_CONF=expandable_segments:True"),
    "PYTORCH_ALLOC_CONF off": ({"PYTORCH_ALLOC_CONF": "expandable_segments:False"}, None),
    "PYTORCH_ALLOC_CONF on, among others": ({"PYTORCH_ALLOC_CONF": "max_split_size_mb:64,expandable_segments:True"},
                                            "PYTORCH_ALLOC_CONF=max_split_size_mb:64,expandable_segments:True"),
    "PYTORCH_ALLOC_CONF on, then off": ({"PYTORCH_ALLOC_CONF": "expandable_segments:True,expandable_segments:False"},
                                        None),
    "PYTORCH_CUDA_ALLOC_CONF on": ({"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"},
                                   "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True"),
    # torch 2.15 reads PYTORCH_CUDA_ALLOC_CONF before PYTORCH_ALLOC_CONF: the mode stays off
    "PYTORCH_CUDA_ALLOC_CONF off, PYTORCH_ALLOC_CONF on": (
        {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:False", "PYTORCH_ALLOC_CONF": "expandable_segments:True"},
        None),
    "PYTORCH_XPU_ALLOC_CONF on": ({"PYTORCH_XPU_ALLOC_CONF": "expandable_segments:True"}, None),  # read by no torch
}


@pytest.fixture(scope="module")
def warned():
    """Each case's warnings, from a fresh interpreter of its own environment (two at a time)."""
    from concurrent.futures import ThreadPoolExecutor

    def one(name):
        env = {**CLEAN, **CASES[name][0], "TORCH_DEVICE_BACKEND_AUTOLOAD": "0"}
        return fresh.run("tests.xpu.test_xpu_cannot_fix:transports", env=env, timeout=180)

    with ThreadPoolExecutor(2) as pool:
        got = dict(zip(CASES, pool.map(one, CASES)))
    if READS_SETTINGS:
        got["set at run time"] = fresh.run("tests.xpu.test_xpu_cannot_fix:transports", "expandable_segments:True",
                                           env={**CLEAN, "TORCH_DEVICE_BACKEND_AUTOLOAD": "0"}, timeout=180)
    return got


@pytest.mark.parametrize("case", sorted(CASES))
def test_expandable_segments_warning_once_exactly_when_torch_turns_them_on(warned, case):
    how = CASES[case][1]
    want = [["RuntimeWarning", TEXT.format(how=how)]] if how is not None and READS_SETTINGS else []
    assert warned[case] == want, (case, warned[case])


@pytest.mark.skipif(not READS_SETTINGS, reason="torch 2.9 has no torch._C._accelerator_setAllocatorSettings (and its "
                                               "XPU allocator no expandable segments)")
def test_expandable_segments_set_through_torch_at_run_time(warned):
    assert warned["set at run time"] == [["RuntimeWarning", TEXT.format(
        how="torch._C._accelerator_setAllocatorSettings('expandable_segments:True')")]]


# -- split groups: the path DeviceMesh takes ------------------------------------------------------------------------
def mesh(rank, n, splits: bool, override: bool):
    """A (2, 2) DeviceMesh on the funcoll default group bound to a device, with ``torch.accelerator`` answering "xpu"
    (what an XPU host answers): what DeviceMesh hands ``dist.split_group``, the sums over each mesh dimension's group;
    or the error. ``override``: every dimension's backend named "funcoll" (``backend_override``), which DeviceMesh's
    gate compares with ``default_group._get_backend(accelerator).name()``. ``splits=False``: the group's backend
    reports ``supports_splitting`` False, as ProcessGroupXCCL's does (it inherits Backend's default)."""
    from contextlib import nullcontext
    from unittest import mock

    from torch.distributed import device_mesh

    import funcoll

    xpu = torch.device("xpu")
    default = dist.group.WORLD
    out = {"default": type(default).__name__}
    out["xpu backend name"] = default._get_backend(xpu).name()
    default.bound_device_id = torch.device("cpu", 0)  # what init_process_group(device_id=...) records
    handed = []  # what DeviceMesh hands dist.split_group
    real_split = dist.split_group

    def spy(*args, **kwargs):
        handed.append(kwargs.get("split_ranks"))
        return real_split(*args, **kwargs)

    no_split = nullcontext() if splits else mock.patch.object(funcoll.ProcessGroupFuncoll, "supports_splitting", False)
    with mock.patch.object(torch.accelerator, "is_available", return_value=True), \
            mock.patch.object(torch.accelerator, "current_accelerator", return_value=xpu), \
            mock.patch.object(device_mesh, "split_group", spy), no_split:
        try:
            m = device_mesh.init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"), backend_override=(
                {"dp": "funcoll", "tp": "funcoll"} if override else None))
        except RuntimeError as e:
            out["error"] = str(e)
            return out
    out["split_ranks"] = handed
    for dim in ("dp", "tp"):
        g = m.get_group(dim)
        t = torch.tensor([float(rank + 1)])
        dist.all_reduce(t, group=g)
        out[dim] = (type(g).__name__, dist.get_process_group_ranks(g), t.item())
    return out


SPLITS = hasattr(dist, "split_group") and "torch.accelerator.is_available()" in (
    open(torch.distributed.device_mesh.__file__).read())  # torch 2.15's gate; 2.9's asks torch.cuda


@pytest.mark.skipif(not SPLITS, reason="torch 2.9's DeviceMesh splits only CUDA groups (torch.cuda.is_available() in "
                                       "its gate), so an XPU mesh never reaches split_group there")
@pytest.mark.parametrize("override", [False, True], ids=["default backend", "backend_override funcoll"])
def test_device_mesh_splits_a_funcoll_default_group_where_it_would_split_xccl(override):
    res = run_world("tests.xpu.test_xpu_cannot_fix:mesh", 4, None, args=(True, override), timeout=170,
                    backend="cpu:gloo,xpu:funcoll")
    for rank, got in enumerate(res):
        assert "error" not in got, got
        assert got["default"] == "ProcessGroupFuncoll" and got["xpu backend name"] == "funcoll", got
        assert got["split_ranks"] == [[[0, 1], [2, 3]], [[0, 2], [1, 3]]] or got["split_ranks"] == [
            [[0, 2], [1, 3]], [[0, 1], [2, 3]]], got["split_ranks"]
        dp = [rank % 2, rank % 2 + 2]  # mesh [[0, 1], [2, 3]]: dp is a column, tp a row
        tp = [rank // 2 * 2, rank // 2 * 2 + 1]
        for dim, ranks in (("dp", dp), ("tp", tp)):
            cls, members, total = got[dim]
            assert cls == "ProcessGroupFuncoll" and members == ranks, (rank, dim, got[dim])
            assert total == float(sum(r + 1 for r in ranks)), (rank, dim, total)


@pytest.mark.skipif(not SPLITS, reason="torch 2.9's DeviceMesh splits only CUDA groups")
def test_device_mesh_on_a_backend_that_cannot_split_raises_what_xccl_users_see():
    """The same world, the one difference ProcessGroupXCCL makes: ``supports_splitting`` False."""
    res = run_world("tests.xpu.test_xpu_cannot_fix:mesh", 4, None, args=(False, False), timeout=170,
                    backend="cpu:gloo,xpu:funcoll")
    for got in res:
        assert got.get("error") == "No backend for the parent process group or its backend does not support " \
                                   "splitting", got
