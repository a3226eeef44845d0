"""The XPU capability table as a pure function of (torch version, oneCCL version, override), and how the running
stack is read (without touching the XPU runtime)."""

import pytest
import torch

import funcoll
from funcoll.semantics import FLOAT8
from funcoll.semantics import ReduceOp as R
from funcoll.transport import ALL_DTYPES, PROFILES, REDUCING, xpu

REDUCE_OPS = list(R)
INTS = [torch.int8, torch.uint8, torch.int32, torch.int64, torch.bool]
FLOATS = [torch.float16, torch.bfloat16, torch.float32, torch.float64]


def native_reductions(caps):
    return {(p, o, d) for p in REDUCING for o in REDUCE_OPS for d in ALL_DTYPES if caps.reduces(p, o, d)}


def test_unknown_oneccl_is_the_conservative_table():
    caps = xpu.derive("2.9.0+xpu", None)
    assert caps.name == "xccl[torch 2.9, oneCCL unknown, scale-out]"
    assert caps.reduce_ops == {R.SUM, R.PRODUCT, R.MIN, R.MAX}
    assert caps.dtypes == caps.reduce_dtypes == {torch.uint8, torch.int8, torch.int32, torch.int64, torch.float16,
                                                 torch.float32, torch.float64, torch.bfloat16, torch.bool}
    assert not caps.uneven_all_to_all
    assert caps.is_async
    assert "all_reduce_coalesced" not in caps.primitives
    assert caps.primitives == {"all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast", "reduce",
                               "gather", "scatter", "send_recv", "barrier"}
    for d in INTS:
        assert not caps.reduces("all_reduce", R.MIN, d) and not caps.reduces("reduce_scatter", R.MAX, d)
        assert caps.reduces("all_reduce", R.SUM, d)
    for d in FLOATS:
        assert caps.reduces("all_reduce", R.MAX, d) and not caps.reduces("all_reduce", R.AVG, d)
    for op in (R.BAND, R.BOR, R.BXOR, R.PREMUL_SUM):
        assert not any(caps.reduces(p, op, d) for p in REDUCING for d in ALL_DTYPES)
    for d in [torch.int16, torch.uint16, torch.uint32, torch.uint64, *FLOAT8]:
        assert not caps.moves(d)
    assert caps.versions == {"torch": "2.9", "oneccl": "unknown", "topology": "scale-out"}
    # the same row on scale-up: nothing topology-dependent is native before oneCCL 2022
    assert native_reductions(xpu.derive("2.9.0+xpu", None, topology="scale-up")) == native_reductions(caps)


@pytest.mark.parametrize("oneccl", [None, "2021.14.0", "2021.15.1", "2021.16.1", "2021.17.1", "2021.99"])
def test_avg_stays_a_strategy_before_oneccl_2022(oneccl):
    """< 2021.15: no ccl avg (the backend does SUM + div_); 2021.15-2021.x: ccl avg, broken on some paths."""
    caps = xpu.derive("2.10.0", oneccl)
    assert R.AVG not in caps.reduce_ops
    assert native_reductions(caps) == native_reductions(xpu.derive("2.10.0", None))


@pytest.mark.parametrize("torch_version", ["2.8.0+xpu", "2.9.0", "2.12.0.dev20260301+xpu", "2.14.1+xpu"])
@pytest.mark.parametrize("oneccl", ["2022.0", "2022.1.2", (2023, 1)])
def test_avg_native_from_oneccl_2022_per_topology(torch_version, oneccl):
    """scale-up: AVG on all_reduce and reduce_scatter; scale-out (also an unknown topology): AVG on all_reduce only
    (oneCCL#195 adds it to scale-out AllReduce); reduce never."""
    for topology, prims in (("scale-up", ("all_reduce", "reduce_scatter")), ("scale-out", ("all_reduce",)),
                            (None, ("all_reduce",))):
        caps = xpu.derive(torch_version, oneccl, topology=topology)
        assert R.AVG in caps.reduce_ops
        for d in FLOATS:
            assert not caps.reduces("reduce", R.AVG, d)  # oneCCL#195: no AVG in Reduce
        for d in INTS:
            assert not caps.reduces("all_reduce", R.AVG, d)
        added = native_reductions(caps) - native_reductions(xpu.derive(torch_version, None))
        assert added == {(p, R.AVG, d) for p in prims for d in FLOATS}, topology
        assert native_reductions(xpu.derive(torch_version, None)) <= native_reductions(caps)


def test_premul_sum_native_only_on_scale_up_when_asked_and_never_on_reduce():
    """#1948/#3173: PREMUL_SUM on allreduce/reduce_scatter, scale-up only; scale-out has none (oneCCL#196, #2903)."""
    for topology in ("scale-up", "scale-out", None):  # default: funcoll scales itself
        assert R.PREMUL_SUM not in xpu.derive("2.14.1", "2022.1.2", topology=topology).reduce_ops
    up = xpu.derive("2.14.1", "2022.1.2", "premul_sum=native", topology="scale-up")
    added = native_reductions(up) - native_reductions(xpu.derive("2.14.1", "2022.1.2", topology="scale-up"))
    assert added == {(p, R.PREMUL_SUM, d) for p in ("all_reduce", "reduce_scatter")
                     for d in (torch.float16, torch.bfloat16, torch.float32)}
    with pytest.raises(ValueError) as e:
        xpu.derive("2.14.1", "2022.1.2", "premul_sum=native", topology="scale-out")
    assert str(e.value) == ("funcoll.xpu: override 'premul_sum' cannot be overridden on the scale-out path (the "
                            "library has it on scale-up only); overridable facts on scale-out: avg, int_minmax, "
                            "uneven_all_to_all")
    with pytest.raises(ValueError, match=r"^funcoll.xpu: unknown topology 'two nodes'; use scale-up \(one node\) or "
                                         r"scale-out \(several nodes\)$"):
        xpu.derive("2.14.1", "2022.1.2", topology="two nodes")


def xpu_environment(monkeypatch, oneccl=None):
    """No profile, override or topology in the environment; FUNCOLL_ONECCL_VERSION=oneccl (unset if None)."""
    for name in ("FUNCOLL_PROFILE", xpu.ENV_OVERRIDE, xpu.ENV_ONECCL_VERSION, xpu.ENV_TOPOLOGY):
        monkeypatch.delenv(name, raising=False)
    if oneccl is not None:
        monkeypatch.setenv(xpu.ENV_ONECCL_VERSION, oneccl)


def test_topology_from_the_environment_and_the_store(monkeypatch):
    xpu_environment(monkeypatch, "2022.0")
    caps = funcoll.capabilities("xpu")
    assert caps.versions["topology"] == "scale-out" and not caps.reduces("reduce_scatter", R.AVG, torch.float32)
    assert caps.sources["xccl.topology"] == "scale-out (unknown: scale-out assumed (every path has it))"
    monkeypatch.setenv(xpu.ENV_TOPOLOGY, "scale-up")
    caps = funcoll.capabilities("xpu")
    assert caps.versions["topology"] == "scale-up" and caps.reduces("reduce_scatter", R.AVG, torch.float32)
    assert caps.sources["xccl.topology"] == "scale-up (FUNCOLL_XPU_TOPOLOGY)"
    # measured through a store: one host is scale-up; another rank's host name makes it scale-out
    import socket
    from datetime import timedelta

    import torch.distributed as dist

    store = dist.HashStore()
    store.set("funcoll-topology/1", socket.gethostname())
    assert xpu.measure_topology(store, 0, 2, timedelta(seconds=5)) == "scale-up"
    store = dist.HashStore()
    store.set("funcoll-topology/1", "another-node")
    assert xpu.measure_topology(store, 0, 2, timedelta(seconds=5)) == "scale-out"


def test_the_table_is_a_pure_function():
    a, b = xpu.derive("2.9.0", "2022.1"), xpu.derive("2.9.0", (2022, 1))
    assert a == b and a is not b
    assert xpu.derive("2.9.0", "2021.16.1") == xpu.derive("2.9.0", "2021.16.1")
    assert xpu.derive("2.9.0", "2021.16.1").sources == xpu.derive("2.9.0", "2021.16.1").sources


def test_overrides_flip_single_facts():
    base = xpu.derive("2.9.0", "2022.0")
    broken_avg = xpu.derive("2.9.0", "2022.0", "avg=strategy")
    assert R.AVG in base.reduce_ops and R.AVG not in broken_avg.reduce_ops
    assert native_reductions(broken_avg) == native_reductions(xpu.derive("2.9.0", None))
    good = xpu.derive("2.9.0", None, "int_minmax=native, uneven_all_to_all=native, avg=native")
    assert good.uneven_all_to_all
    assert all(good.reduces("all_reduce", op, d) for op in (R.MIN, R.MAX) for d in INTS)
    assert good.reduces("all_reduce", R.AVG, torch.float32) and not good.reduces("reduce", R.AVG, torch.float32)
    assert xpu.derive("2.9.0", None, {"uneven_all_to_all": True}).uneven_all_to_all
    assert xpu.derive("2.9.0", None, "").uneven_all_to_all is False
    assert good.sources["xccl.int_minmax"].startswith("native: ")
    assert base.sources["xccl.int_minmax"].startswith("strategy: ")


@pytest.mark.parametrize("override,message", [
    ("bitwise=native", "funcoll.xpu: override 'bitwise' cannot be overridden (the library has no native path); "
                       "overridable facts on scale-out: avg, int_minmax, uneven_all_to_all"),
    ("avx=native", "funcoll.xpu: override 'avx' is not a fact; overridable facts on scale-out: avg, int_minmax, "
                   "uneven_all_to_all"),
    ("avg", "funcoll.xpu: override entry 'avg' must be <fact>=native or <fact>=strategy"),
    ("avg=maybe", "funcoll.xpu: override avg='maybe': use avg=native or avg=strategy"),
])
def test_bad_overrides_are_value_errors(override, message):
    with pytest.raises(ValueError) as e:
        xpu.derive("2.9.0", None, override)
    assert str(e.value) == message


def test_bad_versions_are_value_errors():
    with pytest.raises(ValueError, match=r"^funcoll.xpu: cannot read a version from 'latest'; write it as e.g. "
                                         r"2021.16.1$"):
        xpu.derive("2.9.0", "latest")


def test_static_xccl_profile_is_the_conservative_row():
    """PROFILES['xccl'] (what FUNCOLL_PROFILE=xccl imposes on the CPU transport) reduces exactly what the derived
    table allows for an unknown/old oneCCL, plus the tuple all_reduce the XPU transport does not use."""
    derived, static = xpu.derive("2.9.0", None), PROFILES["xccl"]
    assert native_reductions(derived) == {t for t in native_reductions(static) if t[0] != "all_reduce_coalesced"}
    assert derived.dtypes == static.dtypes - FLOAT8  # float8 is moved as uint8 by funcoll on XPU
    assert derived.uneven_all_to_all == static.uneven_all_to_all


def test_profile_restricts_the_derived_table():
    caps = xpu.capabilities("xccl", torch_version="2.9.0", oneccl_version="2022.0", override="")
    assert isinstance(caps, xpu.XcclCapabilities)
    assert R.AVG not in caps.reduce_ops  # the conservative static profile wins
    assert not caps.reduces("reduce", R.AVG, torch.float32)
    assert caps.name == "xccl[torch 2.9, oneCCL 2022.0, scale-out][xccl]"
    assert xpu.capabilities("gloo", torch_version="2.9.0", oneccl_version="2022.0", override="",
                            topology="scale-up").name == "xccl[torch 2.9, oneCCL 2022.0, scale-up][gloo]"


def test_running_stack_sources(monkeypatch):
    xpu_environment(monkeypatch)
    monkeypatch.setattr(xpu, "_oneccl_from_metadata", lambda: None)
    monkeypatch.setattr(xpu, "_oneccl_from_flight_recorder", lambda: "2022.1.0")
    assert xpu.stack_versions() == (torch.__version__, None,
                                    "unknown (conservative: every version-gated fact uses its strategy)")
    assert xpu.stack_versions(backend_created=True) == (torch.__version__, "2022.1.0",
                                                        "ProcessGroupXCCL flight recorder")
    monkeypatch.setattr(xpu, "_oneccl_from_metadata", lambda: "2021.16.1")
    assert xpu.stack_versions(True)[1:] == ("2021.16.1", "pip metadata of package 'oneccl'")
    monkeypatch.setenv(xpu.ENV_ONECCL_VERSION, "2022.0")
    caps = funcoll.capabilities("xpu")
    assert caps.sources["xccl.version"] == "oneCCL 2022.0 (FUNCOLL_ONECCL_VERSION)"
    assert R.AVG in caps.reduce_ops
    monkeypatch.setenv(xpu.ENV_OVERRIDE, "avg=strategy")
    assert R.AVG not in funcoll.capabilities("xpu").reduce_ops
    monkeypatch.delenv(xpu.ENV_OVERRIDE)
    monkeypatch.setenv("FUNCOLL_PROFILE", "xccl")
    assert R.AVG not in funcoll.capabilities("xpu").reduce_ops


def test_funcoll_capabilities_reads_the_xpu_table(monkeypatch):
    xpu_environment(monkeypatch, "2021.16.1")
    caps = funcoll.capabilities("xpu")
    assert caps == xpu.derive(torch.__version__, "2021.16.1")
    assert set(caps.sources) == {f"xccl.{k}" for k in xpu.XCCL_FACTS} | {"xccl.version", "xccl.topology"}
    for key, fact in xpu.XCCL_FACTS.items():
        assert fact.source and fact.strategy and fact.what
        assert caps.sources[f"xccl.{key}"].endswith(fact.source)


def test_docs_table_is_the_derived_table():
    """docs/xpu.md renders XCCL_FACTS: one row per fact, its three version columns and override flag as derived."""
    import os

    path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "docs", "xpu.md")
    rows = {}
    for line in open(path, encoding="utf-8"):
        if line.startswith("| `"):
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            rows[cells[0].strip("`")] = cells
    assert set(rows) == set(xpu.XCCL_FACTS)
    columns = {2: (None, None), 3: ("2021.17.1", None), 4: ("2022.0", "scale-up"), 5: ("2022.0", "scale-out")}
    for key, fact in xpu.XCCL_FACTS.items():
        cells = rows[key]
        for col, (oneccl, topology) in columns.items():
            got = xpu.derive("2.10.0", oneccl, topology=topology).sources[f"xccl.{key}"].split(":")[0]
            assert cells[col] == got, (key, col)
        assert cells[6] == (", ".join(fact.overridable) if fact.overridable else "no"), key
