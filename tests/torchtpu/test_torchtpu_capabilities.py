"""The TorchTPU fact table and what is derived from it: funcoll.transport.tpu.derive per torch_tpu version, the
``torchtpu`` profile, ``funcoll.capabilities("tpu")``, the report, and the kernels' guard on the PrivateUse1 key.
Nothing here imports torch_tpu."""

import json
import sys
from dataclasses import fields

import pytest
import torch

import funcoll
from funcoll.semantics import ReduceOp as R
from funcoll.transport import Capabilities, tpu
from tests.tooling.test_cli import _run

SWITCHES = [k for k, f in tpu.TORCHTPU_FACTS.items() if not f.info]


def test_every_fact_has_its_evidence_and_what_processgrouptpu_does_per_row():
    for key, fact in tpu.TORCHTPU_FACTS.items():
        assert fact.source and fact.strategy and fact.what, key
        for row in tpu.VERSION_ROWS:
            assert fact.at(row), (key, row)
        assert fact.at(None).startswith("unknown torch_tpu version: "), key


def test_the_0_2_row():
    caps = tpu.derive("0.2.0")
    assert caps.name == "torchtpu[0.2.0]" and caps.versions == {"torch_tpu": "0.2.0", "row": "0.2"}
    assert caps.primitives == {"all_reduce", "all_gather", "reduce_scatter", "all_to_all", "send_recv", "gather",
                               "barrier"}
    assert caps.reduce_ops == {R.SUM, R.PRODUCT, R.MIN, R.MAX, R.AVG, R.BAND, R.BOR, R.BXOR}
    # AVG is handed over on float32/float64 only: fp16/bf16 would be summed in the dtype, integers would overflow
    for d in (torch.float32, torch.float64):
        assert caps.reduces("all_reduce", R.AVG, d) and caps.reduces("reduce_scatter", R.AVG, d)
    for d in (torch.float16, torch.bfloat16, torch.int8, torch.int64, torch.uint8, torch.bool):
        assert not caps.reduces("all_reduce", R.AVG, d), d
    assert caps.reduces("all_reduce", R.BXOR, torch.uint64) and not caps.reduces("all_reduce", R.BXOR, torch.float32)
    assert not caps.uneven_all_to_all and not caps.p2p_any_shape
    assert all(caps.moves(d) for d in (torch.float8_e4m3fn, torch.uint16, torch.complex64) if d in caps.dtypes)
    assert {k: caps.sources[f"torchtpu.{k}"].split(":", 1)[0] for k in SWITCHES} == {
        "avg_float": "native", "avg_low_precision": "strategy", "avg_int": "strategy", "premul_sum": "strategy",
        "bitwise": "native", "broadcast": "strategy", "scatter": "strategy", "reduce": "strategy",
        "gather": "native", "barrier": "native", "uneven_all_to_all": "strategy", "all_reduce_coalesced": "strategy",
        "coalescing": "strategy", "sequence_numbers": "strategy"}


@pytest.mark.parametrize("version", [None, "", "0.1.0", "0.3.0", "1.0"])
def test_an_unknown_version_hands_over_only_the_baseline(version):
    caps = tpu.derive(version)
    assert caps.primitives == {"all_reduce", "all_gather", "reduce_scatter", "all_to_all", "send_recv"}
    assert caps.reduce_ops == {R.SUM, R.PRODUCT, R.MIN, R.MAX}
    assert all(caps.sources[f"torchtpu.{k}"].startswith("strategy: ") for k in SWITCHES)
    assert caps.versions["row"] == "unknown"


def test_a_patch_release_takes_its_row_and_a_bad_version_is_named():
    a, b = tpu.derive("0.2.7"), tpu.derive("0.2.0")
    assert tpu.version_row("0.2.7") == "0.2" and a.versions["row"] == "0.2" and a.name == "torchtpu[0.2.7]"
    assert all(getattr(a, f.name) == getattr(b, f.name) for f in fields(Capabilities) if f.name != "name")
    with pytest.raises(ValueError, match=r"^funcoll.tpu: cannot read a torch_tpu version from 'beta'; write it as "
                                         r"e.g. 0.2.0$"):
        tpu.derive("beta")


def test_the_profile_is_the_newest_row():
    prof, row = funcoll.PROFILES["torchtpu"], tpu.derive(tpu.VERSION_ROWS[-1] + ".0")
    assert prof.name == "torchtpu" and type(prof) is Capabilities
    assert all(getattr(prof, f.name) == getattr(row, f.name) for f in fields(Capabilities) if f.name != "name")
    assert "torchtpu" in funcoll.PROFILES
    cpu = funcoll.capabilities("cpu", profile="torchtpu")
    assert cpu.name == "gloo[torchtpu]" and "broadcast" not in cpu.primitives and "reduce" not in cpu.primitives


def test_capabilities_of_the_tpu_device_read_the_installed_version_without_importing_torch_tpu():
    def tpu_modules():
        return {m for m in sys.modules if m.startswith(("torch_tpu", "libtpu"))}

    before = tpu_modules()  # empty under ./dev (torch's device-backend autoload is off)
    caps = funcoll.capabilities("tpu")
    assert tpu_modules() == before
    assert caps.versions["torch_tpu"] == (tpu.torch_tpu_version() or "unknown")
    assert tpu.capabilities(version="0.2.0").sources["torchtpu.version"] == "torch_tpu 0.2.0 (given)"
    assert funcoll.capabilities("tpu", profile="xla").name.endswith("[xla]")


def test_static_split_bound_takes_a_positive_int():
    with tpu.static_split_bound(4) as b:
        assert b == 4 and tpu.TpuTransport.split_bound(object.__new__(tpu.TpuTransport)) == 4
    assert tpu.TpuTransport.split_bound(object.__new__(tpu.TpuTransport)) is None
    for bad in (0, -1, 2.0, True):
        with pytest.raises(ValueError, match="bound must be a positive int"):
            with tpu.static_split_bound(bad):
                pass


def test_kernels_are_installed_on_privateuse1_only_when_torchtpu_named_it():
    assert funcoll.entry.kernels.DISPATCH_KEYS["tpu"] == "PrivateUse1"
    name = torch._C._get_privateuse1_backend_name()
    assert name != "tpu"  # torch_tpu is never loaded in the test process
    with pytest.raises(ValueError) as e:
        funcoll.install(["tpu"])
    assert str(e.value) == (f"funcoll.install: the PrivateUse1 key is named {name!r}, not 'tpu': TorchTPU has not "
                            f"registered its device (import torch_tpu on a TPU host)")
    assert "tpu" not in funcoll.installed()


def test_report_shows_the_tpu_device_and_its_facts():
    p = _run("report", "--device", "tpu", "--format", "json")
    assert p.returncode == 0, p.stderr[-2000:]
    doc = json.loads(p.stdout)
    facts = {f["fact"]: f for f in doc["torchtpu_facts"]["facts"]}
    assert set(facts) == set(tpu.TORCHTPU_FACTS)
    v = tpu.torch_tpu_version()
    assert doc["columns"][0]["name"] == f"tpu: torchtpu[{v or 'unknown'}]"
    if v is not None and tpu.version_row(v) == "0.2":
        assert facts["premul_sum"] == {"fact": "premul_sum", "funcoll": "strategy", "why": "",
                                       "processgrouptpu": "refused: RuntimeError 'reduce option not supported'",
                                       "strategy": tpu.TORCHTPU_FACTS["premul_sum"].strategy}
        assert facts["avg_float"]["funcoll"] == "native"
    from funcoll.report import capability_table  # what `report --profile torchtpu` prints (tests/tooling/test_cli.py)

    table = capability_table(("torchtpu",))
    assert table.startswith("| request | torchtpu |")
    assert "| broadcast | broadcast=masked all_reduce |" in table.splitlines()


def test_the_docs_page_holds_the_fact_table_of_the_code():
    from pathlib import Path

    from funcoll.report import torchtpu_fact_table

    page = (Path(__file__).resolve().parents[2] / "docs" / "torchtpu.md").read_text()
    assert torchtpu_fact_table() in page, "regenerate with: ./dev python -m funcoll.report --torchtpu-facts"


def test_a_group_whose_size_does_not_divide_the_slice_is_refused_before_anything_is_made():
    from datetime import timedelta

    from funcoll.transport.registry import GroupContext

    ctx = GroupContext("3", None, 0, 2, timedelta(seconds=5), (0, 1), 3)  # no store: nothing may be created
    with pytest.raises(ValueError) as e:
        tpu._funcoll_tpu(ctx)
    assert str(e.value) == (
        "funcoll: group '3' has 2 ranks, which does not divide the TPU slice size (3, one TPU per process); "
        "TorchTPU's ProcessGroupTpu requires 'TPU slice size to be divisible by process group size', and funcoll "
        "cannot fill that on tpu: use groups whose size divides 3")
    tpu.check_group_size("4", 2, 4)  # 2 divides 4: accepted
