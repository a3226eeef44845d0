"""Pure checks of the semantics layer and the capability table (no processes)."""

import os

import pytest
import torch
import torch.distributed as dist

import funcoll
from funcoll import semantics
from funcoll.semantics import ReduceOp, Reduction
from funcoll.transport import PROFILES, active_profile_name


@pytest.mark.parametrize("given,want", [
    ("sum", Reduction(ReduceOp.SUM)), ("AVG", Reduction(ReduceOp.AVG)), ("mul", Reduction(ReduceOp.PRODUCT)),
    (dist.ReduceOp.BXOR, Reduction(ReduceOp.BXOR)), (dist.ReduceOp.MAX, Reduction(ReduceOp.MAX)),
    (dist.ReduceOp.RedOpType.MIN, Reduction(ReduceOp.MIN)), (ReduceOp.BOR, Reduction(ReduceOp.BOR)),
])
def test_parse_reduction(given, want):
    assert semantics.parse_reduction(given, "all_reduce") == want


def test_premul_sum_factor_is_read_from_the_c10d_reduce_op():
    red = semantics.parse_reduction(dist._make_nccl_premul_sum(0.25), "all_reduce")
    assert red.op is ReduceOp.PREMUL_SUM and red.factor == 0.25
    red = semantics.parse_reduction(dist._make_nccl_premul_sum(torch.tensor([3.0])), "all_reduce")
    assert torch.equal(red.factor, torch.tensor([3.0]))


def test_premul_sum_without_factor():
    with pytest.raises(ValueError, match=r"funcoll.all_reduce: reduce op premul_sum needs a factor; build it with "
                                         r"torch.distributed._make_nccl_premul_sum\(factor\)"):
        semantics.parse_reduction("premul_sum", "all_reduce")


@pytest.mark.parametrize("op,dtype,msg", [
    ("band", torch.bfloat16, "reduce op band needs an integer or bool tensor, got torch.bfloat16"),
    ("product", torch.complex64, "reduce op product is not defined for complex tensors (torch.complex64); only sum "
                                 "and avg are"),
    ("avg", torch.bool, "reduce op avg is not defined for bool tensors"),
    ("sum", torch.float8_e5m2, "torch.float8_e5m2 tensors cannot be reduced"),
    ("avg", torch.uint64, "reduce op avg on torch.uint64 cannot be computed exactly; use sum and divide"),
])
def test_reduce_op_invalid_for_dtype(op, dtype, msg):
    with pytest.raises(TypeError) as e:
        semantics.check_reduction("reduce_scatter_tensor", semantics.parse_reduction(op, "x"), dtype)
    assert str(e.value).startswith("funcoll.reduce_scatter_tensor: ") and msg in str(e.value)


def test_valid_pairs_do_not_raise():
    for dtype in (torch.float32, torch.int8, torch.uint32, torch.bool, torch.complex128):
        for op in ("sum", "max", "bxor", "avg"):
            kind = semantics.dtype_kind(dtype)
            bad = (kind == "float" and op == "bxor") or (kind == "complex" and op in ("max", "bxor")) or \
                  (kind == "bool" and op == "avg")
            if not bad:
                semantics.check_reduction("all_reduce", semantics.parse_reduction(op, "x"), dtype)


def test_shape_rules():
    x = torch.ones(6, 2)
    assert semantics.check_reduce_scatter("rs", None, x, 3) == (2, 2)
    with pytest.raises(ValueError, match=r"funcoll.rs: input dim 0 \(6\) must be divisible by the group size "
                                         r"\(4\); pad the input to a multiple of 4"):
        semantics.check_reduce_scatter("rs", None, x, 4)
    assert semantics.check_all_to_all("a2a", torch.empty(3, 2), x, [1, 2], [6, 0], 2) == ([1, 2], [6, 0])
    assert semantics.check_all_to_all("a2a", torch.empty(6, 2), x, None, None, 3) == ([2, 2, 2], [2, 2, 2])
    with pytest.raises(ValueError, match=r"output shape \(6, 3\) and input shape \(6, 2\) must agree after dim 0"):
        semantics.check_all_to_all("a2a", torch.empty(6, 3), x, None, None, 3)
    with pytest.raises(ValueError, match=r"input dim 0 \(6\) is not divisible by the group size \(4\) and no "
                                         r"input_split_sizes were given"):
        semantics.check_all_to_all("a2a", torch.empty(8, 2), x, None, None, 4)
    with pytest.raises(ValueError, match=r"funcoll.bc: src=True is outside the group"):
        semantics.check_root("bc", "src", True, 2)


def test_profiles_table():
    gloo, xccl, xla = PROFILES["gloo"], PROFILES["xccl"], PROFILES["xla"]
    assert gloo.reduces("all_reduce", ReduceOp.AVG, torch.float32)
    assert not gloo.reduces("all_reduce", ReduceOp.AVG, torch.int32)
    assert not gloo.moves(torch.uint16)
    for op in (ReduceOp.AVG, ReduceOp.PREMUL_SUM, ReduceOp.BAND, ReduceOp.BOR, ReduceOp.BXOR):
        assert not xccl.reduces("all_reduce", op, torch.int32)
    assert not xccl.reduces("all_reduce", ReduceOp.MAX, torch.int32)
    assert xccl.reduces("all_reduce", ReduceOp.MAX, torch.float32)
    assert not xccl.uneven_all_to_all and not xccl.moves(torch.int16)
    assert not xla.has("broadcast") and not xla.reduces("all_reduce", ReduceOp.BXOR, torch.int32)
    both = gloo.restrict(xccl)
    assert both.name == "gloo[xccl]" and not both.reduces("all_reduce", ReduceOp.AVG, torch.float32)
    assert all(c.sources for c in PROFILES.values())


def test_funcoll_profile_env(monkeypatch):
    monkeypatch.setenv("FUNCOLL_PROFILE", "XCCL")
    assert active_profile_name() == "xccl"
    assert funcoll.capabilities("cpu").name == "gloo[xccl]"
    monkeypatch.setenv("FUNCOLL_PROFILE", "nccl")
    with pytest.raises(ValueError,
                       match="funcoll: unknown capability profile 'nccl'; use one of gloo, torchtpu, xccl, xla"):
        active_profile_name()
    monkeypatch.delenv("FUNCOLL_PROFILE")
    assert funcoll.capabilities("cpu").name == "gloo"
    assert funcoll.capabilities("cpu", profile="xla").name == "gloo[xla]"


def test_import_registers_the_backend_and_overrides_nothing():
    assert "funcoll" in dist.Backend.backend_list
    assert dist.Backend.backend_capability["funcoll"] == ["cpu", "xla", "xpu"]
    assert funcoll.installed() == []
    dump = torch._C._dispatch_dump("_c10d_functional::all_reduce")
    pkg = os.path.dirname(funcoll.__file__)  # no kernel registered from funcoll's own files
    assert pkg not in dump and "funcoll/entry/kernels.py" not in dump and "funcoll/lowering" not in dump


def test_install_cpu_and_uninstall_restore_the_dispatch_table():
    before = torch._C._dispatch_dump("_c10d_functional::all_reduce")
    assert funcoll.install(["cpu"]) == ["cpu"]
    assert funcoll.install(["cpu"]) == ["cpu"]  # idempotent
    during = torch._C._dispatch_dump("_c10d_functional::all_reduce")
    assert "CPU: registered at" in during and "CPU: registered at" not in before
    funcoll.uninstall()
    assert torch._C._dispatch_dump("_c10d_functional::all_reduce") == before
    with pytest.raises(ValueError, match="funcoll.install: unknown device type 'cuda'; use one of cpu, xla, xpu"):
        funcoll.install(["cuda"])


def install_without_arguments() -> list:
    """Run in a fresh interpreter: what ``funcoll.install()`` installs, and whether torch_xla is imported after it."""
    import sys

    return [funcoll.install(), "torch_xla" in sys.modules]


def test_install_without_arguments_takes_xla_only_when_it_is_in_use():
    """torch_xla being installed is not enough: a CPU-only run (no PJRT_DEVICE, torch_xla not imported) installs
    nothing and never imports torch_xla; with PJRT_DEVICE set, XLA is installed."""
    import importlib.util

    from tests import fresh

    pytest.importorskip("torch_xla")
    target = "tests.semantics.test_semantics:install_without_arguments"
    want = [["xla"], True] if importlib.util.find_spec("libtpu") else [[], False]  # a TPU host: in use
    assert fresh.run(target, env={"PJRT_DEVICE": None}, timeout=120) == want
    assert fresh.run(target, env={"PJRT_DEVICE": "CPU"}, timeout=120) == [["xla"], True]
