"""funcoll's kernels on the XPU dispatch key, on a machine without an XPU: registered by install(["xpu"]), gone
after uninstall(), skipped by install() when torch.xpu.is_available() is false, and none of it (nor importing
funcoll.transport.xpu, nor reading its capabilities) touches the XPU runtime."""

import pytest
import torch

import funcoll
from funcoll.entry import kernels
from tests import fresh

OPS = sorted(kernels.KERNELS)
# wait_tensor keeps its upstream (composite) kernel: it waits on the Work funcoll's kernels register.
NOT_ON_XPU = ["wait_tensor"]


def has_xpu_kernel(op):
    return torch._C._dispatch_has_kernel_for_dispatch_key(f"_c10d_functional::{op}", "XPU")


@pytest.fixture
def clean():
    """Starts without funcoll's XPU (and CPU) kernels; afterwards restores what other tests had installed."""
    before = funcoll.installed()
    funcoll.uninstall(["xpu", "cpu"])
    yield
    funcoll.uninstall([d for d in funcoll.installed() if d not in before])
    funcoll.install([d for d in before if d in ("xpu", "cpu")])


def test_op_list_is_the_whole_functional_surface():
    assert OPS == ["all_gather_into_tensor", "all_gather_into_tensor_coalesced", "all_gather_into_tensor_out",
                   "all_reduce", "all_reduce_", "all_reduce_coalesced", "all_reduce_coalesced_", "all_to_all_single",
                   "broadcast", "broadcast_", "reduce_scatter_tensor", "reduce_scatter_tensor_coalesced"]


def test_install_registers_on_the_xpu_key_and_uninstall_removes(clean):
    assert not torch.xpu.is_available()
    assert [op for op in OPS + NOT_ON_XPU if has_xpu_kernel(op)] == []
    others = {(op, key): torch._C._dispatch_has_kernel_for_dispatch_key(f"_c10d_functional::{op}", key)
              for op in OPS for key in ("CPU", "CUDA", "XLA")}
    assert funcoll.install(["xpu"]) == ["xpu"]
    assert "xpu" in funcoll.installed()
    assert [op for op in OPS if not has_xpu_kernel(op)] == []
    assert [op for op in NOT_ON_XPU if has_xpu_kernel(op)] == []
    dump = torch._C._dispatch_dump("_c10d_functional::all_reduce")
    xpu_lines = [line for line in dump.splitlines() if line.startswith("XPU:")]
    assert len(xpu_lines) == 1 and "funcoll/entry/kernels.py" in xpu_lines[0]
    # idempotent, and no other key was touched
    assert funcoll.install("xpu") == ["xpu"]
    assert others == {(op, key): torch._C._dispatch_has_kernel_for_dispatch_key(f"_c10d_functional::{op}", key)
                      for op in OPS for key in ("CPU", "CUDA", "XLA")}
    funcoll.uninstall(["xpu"])
    assert "xpu" not in funcoll.installed()
    assert [op for op in OPS if has_xpu_kernel(op)] == []
    assert "XPU:" not in torch._C._dispatch_dump("_c10d_functional::all_reduce")


def test_uninstall_of_one_device_type_keeps_the_others(clean):
    funcoll.install(["xpu", "cpu"])
    funcoll.uninstall(["xpu"])
    assert "cpu" in funcoll.installed() and "xpu" not in funcoll.installed()
    assert not has_xpu_kernel("all_reduce")
    assert torch._C._dispatch_has_kernel_for_dispatch_key("_c10d_functional::all_reduce", "CPU")


def test_install_without_arguments_skips_xpu_when_no_xpu_is_available(clean, monkeypatch):
    assert kernels._present("xpu") is False  # the real check, on this machine
    real = kernels._present
    monkeypatch.setattr(kernels, "_present", lambda d: False if d == "xla" else real(d))  # leave torch_xla alone
    assert funcoll.install() == []
    assert not has_xpu_kernel("all_reduce")
    assert "xpu" not in funcoll.installed()
    monkeypatch.setattr(torch.xpu, "is_available", lambda: True)  # an XPU machine
    assert funcoll.install() == ["xpu"]
    assert has_xpu_kernel("all_reduce")


def test_nothing_touches_the_xpu_runtime():
    """In a fresh interpreter whose XPU runtime entry points all raise: import funcoll, load the XPU lowering,
    register its kernels, read its capabilities (tests/xpu/runtime_untouched.py)."""
    env = {"FUNCOLL_ONECCL_VERSION": "2021.16.1", "FUNCOLL_PROFILE": None}
    name, initialized = fresh.run("tests.xpu.runtime_untouched:main", env=env, timeout=120)
    v = ".".join(torch.__version__.split(".")[:2])
    assert name == f"xccl[torch {v}, oneCCL 2021.16.1, scale-out]"
    assert initialized is False


def test_a_group_without_an_xpu_backend_gets_a_clear_error():
    """The c10d factory, for a group whose XPU backend lookup fails (as c10d's does for a gloo-only group)."""
    from funcoll.transport import xpu

    class FakePG:
        group_name = "g0"

        def _get_backend(self, device):
            raise RuntimeError("No backend type associated with device type xpu")

    with pytest.raises(ValueError) as e:
        xpu._c10d_xpu(FakePG(), torch.device("xpu", 0))
    assert str(e.value) == ("funcoll: group 'g0' has no XPU backend; create it with init_process_group('xccl') "
                            "or 'cpu:gloo,xpu:xccl' (or backend 'funcoll')")


def test_no_xccl_in_this_torch_is_a_clear_error():
    from funcoll.transport import xpu

    with pytest.raises(RuntimeError) as e:
        xpu._xccl_class()
    assert str(e.value).startswith("funcoll: XPU tensors need torch's XCCL backend "
                                   "(torch.distributed.is_xccl_available() is False in torch ")
