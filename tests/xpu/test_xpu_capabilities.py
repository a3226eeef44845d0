"""The XPU capability table as a pure function of (torch version, oneCCL version, override), and how the running
stack is read (without touching the XPU runtime)."""

import pytest
import torch

import funcoll
from funcoll.semantics import FLOAT8, MX
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
    for d in [torch.int16, torch.uint16, torch.uint32, torch.uint64, *FLOAT8, *MX]:
        assert not caps.moves(d)
    assert caps.unverified is None  # nothing an open report keeps off: no version gate passes
    assert caps.versions == {"torch": "2.9", "oneccl": "unknown", "oneccl_build": "unknown", "topology": "scale-out",
                             "graph_capture": "not supported before torch 2.13", "backend": "ProcessGroupXCCL",
                             "gpu": "unknown"}
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
    """scale-out (also an unknown topology): AVG on all_reduce only (oneCCL#195 adds it to scale-out AllReduce in
    2022.0); scale-up: nothing by default (open reports of ccl avg raising on one node and dividing twice on Arc B60,
    no fixed oneCCL named), all_reduce and reduce_scatter once probed; reduce never."""
    up = xpu.derive(torch_version, oneccl, topology="scale-up")
    assert R.AVG not in up.reduce_ops
    assert native_reductions(up) == native_reductions(xpu.derive(torch_version, None, topology="scale-up"))
    assert up.unverified is not None
    assert native_reductions(up.unverified) - native_reductions(up) == {
        (p, R.AVG, d) for p in ("all_reduce", "reduce_scatter") for d in FLOATS}
    for topology, prims in (("scale-up", ("all_reduce", "reduce_scatter")), ("scale-out", ("all_reduce",)),
                            (None, ("all_reduce",))):
        caps = xpu.derive(torch_version, oneccl, override="avg=native,avg_reduce_scatter=native" if
                          topology == "scale-up" else "", topology=topology)
        assert R.AVG in caps.reduce_ops
        for d in FLOATS:
            assert not caps.reduces("reduce", R.AVG, d)  # oneCCL#195: no AVG in Reduce
        for d in INTS:
            assert not caps.reduces("all_reduce", R.AVG, d)
        added = native_reductions(caps) - native_reductions(xpu.derive(torch_version, None))
        assert added == {(p, R.AVG, d) for p in prims for d in FLOATS}, topology
        assert native_reductions(xpu.derive(torch_version, None)) <= native_reductions(caps)


ROWS = ["2.9", "2.10", "2.11", "2.12", "2.13", "2.14", "2.15"]
INFO = ("graph_capture", "nan_check", "oneccl_api", "send_recv")
ONECCLS = [None, (2021, 16, 1), (2021, 17, 2), (2022, 0), (2022, 2, 0)]
BUILDS = [None, (2021, 16, 1), (2021, 17, 2), (2022, 0, 0)]


def v(row):
    return tuple(int(x) for x in row.split("."))


def expected_label(fact, row, oneccl, topology):
    """funcoll's default per fact and stack, written from the research notes (not from the code's table)."""
    new = oneccl is not None and oneccl >= (2022, 0)
    if fact in INFO:
        return "info"
    if fact == "avg":  # scale-up: intel/torch-xpu-ops#2361 and #3020 are open, no fixed oneCCL named
        return "native" if new and topology == "scale-out" else "strategy"
    if fact == "avg_reduce_scatter":  # scale-up only, where #2361 (FSDP2 on one node) is open
        return "strategy"
    if fact == "premul_sum":  # 2.12+: ProcessGroupXCCL scales the all_reduce tensor and sums, on every topology
        return "native" if v(row) >= (2, 12) else "strategy"
    return "strategy"


def expected_overridable(fact, row, build):
    if fact == "premul_sum":
        if v(row) <= (2, 10):
            return ()
        if row == "2.11":  # oneCCL's own PreMulSum: scale-up only, and only in builds against oneCCL >= 2021.17
            return ("scale-up",) if build is not None and build >= (2021, 17) else ()
        return ("scale-up", "scale-out")
    if fact == "premul_sum_reduce_scatter":  # from 2.12 XCCL would scale the caller's input
        return ("scale-up",) if row == "2.11" and build is not None and build >= (2021, 17) else ()
    return {"avg": ("scale-up", "scale-out"), "int_minmax": ("scale-up", "scale-out"),
            "uneven_all_to_all": ("scale-up", "scale-out"), "avg_reduce_scatter": ("scale-up",)}.get(fact, ())


def xccl_raises(row, prim, op, dtype, build):
    """Whether ProcessGroupXCCL of torch ``row`` built against oneCCL ``build`` raises on the request (research
    notes: xccl.h of release/2.10-2.14 and main)."""
    if dtype not in {torch.uint8, torch.int8, torch.int32, torch.int64, torch.float16, torch.bfloat16, torch.float32,
                     torch.float64, torch.bool}:
        return True
    if op in (R.BAND, R.BOR, R.BXOR) or (op is R.AVG and dtype == torch.bool):
        return True
    if op is R.PREMUL_SUM:
        if v(row) <= (2, 10) or dtype not in FLOATS:
            return True
        if row == "2.11":
            return build is None or build < (2021, 17)
        if prim == "reduce":
            return row == "2.12" or build is None or build < (2022, 0)
    return False


@pytest.mark.parametrize("row", ROWS)
@pytest.mark.parametrize("fact", sorted(xpu.XCCL_FACTS))
def test_each_fact_per_torch_version(fact, row):
    """derive(...) for every torch row, oneCCL at run time, build oneCCL and topology: funcoll's choice, what may be
    overridden, and what the capabilities then let through, against expectations written from the sources."""
    f = xpu.XCCL_FACTS[fact]
    assert f.at(row) and f.source and f.strategy and f.what
    for oneccl in ONECCLS:
        for topology in ("scale-up", "scale-out"):
            for build in BUILDS:
                caps = xpu.derive(f"{row}.0+xpu", oneccl, "", topology, build)
                label = caps.sources[f"xccl.{fact}"].split(":")[0]
                assert label == expected_label(fact, row, oneccl, topology), (oneccl, topology, build)
                native = label == "native"
                if fact == "avg":
                    assert caps.reduces("all_reduce", R.AVG, torch.float32) == native
                elif fact == "avg_reduce_scatter":
                    assert caps.reduces("reduce_scatter", R.AVG, torch.bfloat16) == native
                elif fact == "avg_reduce":
                    assert not any(caps.reduces("reduce", R.AVG, d) for d in ALL_DTYPES)
                elif fact == "avg_int":
                    assert not any(caps.reduces(p, R.AVG, d) for p in REDUCING for d in INTS)
                elif fact == "premul_sum":
                    assert all(caps.reduces("all_reduce", R.PREMUL_SUM, d) == native for d in FLOATS)
                elif fact == "premul_sum_reduce_scatter":
                    assert not any(caps.reduces(p, R.PREMUL_SUM, d) for p in ("reduce_scatter", "reduce")
                                   for d in ALL_DTYPES)
                elif fact == "bitwise":
                    assert not any(caps.reduces(p, o, d) for p in REDUCING for o in (R.BAND, R.BOR, R.BXOR)
                                   for d in ALL_DTYPES)
                elif fact == "int_minmax":
                    assert not any(caps.reduces(p, o, d) for p in REDUCING for o in (R.MIN, R.MAX) for d in INTS)
                elif fact == "dtypes_16_unsigned":
                    assert not any(caps.moves(d) for d in (torch.int16, torch.uint16, torch.uint32, torch.uint64))
                elif fact == "float8":
                    assert not any(caps.moves(d) for d in FLOAT8)
                elif fact == "mx":  # moved as uint8 by funcoll itself: the bytes intel/torch-xpu-ops#5240 sends
                    assert not any(caps.moves(d) for d in MX) and caps.moves(torch.uint8)
                elif fact == "uneven_all_to_all":
                    assert not caps.uneven_all_to_all
                elif fact == "all_reduce_coalesced":
                    assert not caps.has("all_reduce_coalesced")
                elif fact == "graph_capture":
                    want = ("not supported before torch 2.13" if v(row) < (2, 13) else
                            "unknown (oneCCL unknown at run time)" if oneccl is None else
                            "allowed" if oneccl >= (2022, 0) else "refused (NotImplementedError): oneCCL < 2022.0")
                    assert caps.versions["graph_capture"] == want
                # the override: allowed exactly where expected, and it flips the fact
                allowed = expected_overridable(fact, row, build)
                assert xpu.overridable(fact, row, build) == allowed
                flip = "strategy" if native else "native"
                if topology in allowed:
                    got = xpu.derive(f"{row}.0", oneccl, f"{fact}={flip}", topology, build)
                    assert got.sources[f"xccl.{fact}"].startswith(flip + ":")
                else:
                    with pytest.raises(ValueError, match=rf"^funcoll.xpu: override '{fact}' "):
                        xpu.derive(f"{row}.0", oneccl, f"{fact}={flip}", topology, build)


@pytest.mark.parametrize("row", ROWS)
def test_no_native_request_xccl_raises_on_or_that_scales_a_callers_input(row):
    """On every torch row, topology, oneCCL (run time and build time) and every allowed override, nothing derive
    calls native is a request ProcessGroupXCCL raises on, and PREMUL_SUM on reduce_scatter (whose input XCCL 2.12+
    scales in place) or reduce is native only where oneCCL itself does it (torch 2.11, scale-up, asked)."""
    import itertools

    for topology in ("scale-up", "scale-out"):
        for oneccl in ONECCLS:
            for build in BUILDS:
                keys = [k for k in sorted(xpu.XCCL_FACTS) if topology in xpu.overridable(k, row, build)]
                for n in range(len(keys) + 1):
                    for chosen in itertools.combinations(keys, n):
                        caps = xpu.derive(row, oneccl, {k: True for k in chosen}, topology, build)
                        for p, op, d in native_reductions(caps):
                            assert not xccl_raises(row, p, op, d, build), (topology, oneccl, build, chosen, p, op, d)
                            if op is R.PREMUL_SUM and p != "all_reduce":
                                assert p == "reduce_scatter" and row == "2.11" and topology == "scale-up", (p, chosen)
                        # and the default (no override) never hands XCCL PREMUL_SUM but on a 2.12+ all_reduce
                        if not chosen:
                            premul = {p for p, op, _ in native_reductions(caps) if op is R.PREMUL_SUM}
                            assert premul == ({"all_reduce"} if v(row) >= (2, 12) else set())


def test_premul_sum_override_messages():
    with pytest.raises(ValueError) as e:
        xpu.derive("2.10.0", None, "premul_sum=native", "scale-up")
    assert str(e.value) == ("funcoll.xpu: override 'premul_sum' cannot be overridden on torch 2.10 (ProcessGroupXCCL "
                            "raises on PREMUL_SUM); overridable facts on scale-up: avg, avg_reduce_scatter, "
                            "int_minmax, uneven_all_to_all")
    with pytest.raises(ValueError) as e:
        xpu.derive("2.11.0", "2022.0", "premul_sum=native", "scale-up")
    assert str(e.value) == ("funcoll.xpu: override 'premul_sum' cannot be overridden on torch 2.11 built against an "
                            "unknown oneCCL (PreMulSum needs oneCCL >= 2021.17 at torch's build time; set "
                            "FUNCOLL_ONECCL_BUILD_VERSION); overridable facts on scale-up: avg, avg_reduce_scatter, "
                            "int_minmax, uneven_all_to_all")
    with pytest.raises(ValueError) as e:
        xpu.derive("2.11.0", "2022.0", "premul_sum=native", "scale-out", "2021.17.2")
    assert str(e.value) == ("funcoll.xpu: override 'premul_sum' cannot be overridden on the scale-out path (oneCCL "
                            "has PreMulSum on scale-up only); overridable facts on scale-out: avg, int_minmax, "
                            "uneven_all_to_all")
    with pytest.raises(ValueError) as e:
        xpu.derive("2.14.1", "2022.1.2", "premul_sum_reduce_scatter=native", "scale-up")
    assert str(e.value) == ("funcoll.xpu: override 'premul_sum_reduce_scatter' cannot be overridden on torch 2.14 "
                            "(ProcessGroupXCCL would scale the caller's input in place); overridable facts on "
                            "scale-up: avg, avg_reduce_scatter, int_minmax, premul_sum, uneven_all_to_all")
    up = xpu.derive("2.11.0", "2022.0", "premul_sum=native,premul_sum_reduce_scatter=native", "scale-up", "2021.17.2")
    added = native_reductions(up) - native_reductions(xpu.derive("2.11.0", "2022.0", "", "scale-up", "2021.17.2"))
    assert added == {(p, R.PREMUL_SUM, d) for p in ("all_reduce", "reduce_scatter") for d in FLOATS}
    off = xpu.derive("2.15.0", None, "premul_sum=strategy")
    assert R.PREMUL_SUM not in off.reduce_ops
    with pytest.raises(ValueError, match=r"^funcoll.xpu: unknown topology 'two nodes'; use scale-up \(one node\) or "
                                         r"scale-out \(several nodes\)$"):
        xpu.derive("2.14.1", "2022.1.2", topology="two nodes")


def test_torch_rows():
    assert [xpu.torch_row(t) for t in ("2.8.0+xpu", "2.9.1", "2.12.0.dev20260301+xpu", "2.15.0+cu132", "2.17.0")] == [
        "2.9", "2.9", "2.12", "2.15", "2.15"]
    assert xpu.torch_row(None) is None
    unknown = xpu.derive(None, "2022.0")  # an unknown torch: nothing torch-gated is native
    assert R.PREMUL_SUM not in unknown.reduce_ops and unknown.name == "xccl[torch ?, oneCCL 2022.0, scale-out]"


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
    assert caps.versions["topology"] == "scale-up" and not caps.reduces("reduce_scatter", R.AVG, torch.float32)
    assert caps.unverified.reduces("reduce_scatter", R.AVG, torch.float32)  # once probed on the live group
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
    ("nan_check=native", "funcoll.xpu: override 'nan_check' is not a switch (funcoll's strategies respect it on every "
                         "version); overridable facts on scale-out: avg, int_minmax, uneven_all_to_all"),
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


def test_static_xccl_profile_is_the_running_torchs_row():
    """PROFILES['xccl'] (what FUNCOLL_PROFILE=xccl imposes on the CPU transport) reduces exactly what the derived
    table allows for the running torch with an unknown oneCCL, plus the tuple all_reduce the XPU transport does not
    use; on torch 2.12+ that includes PREMUL_SUM on all_reduce (only), which the CPU transport then does as XCCL does:
    scaling the tensor in place."""
    from funcoll.transport import gloo

    derived, static = xpu.derive(torch.__version__, None), PROFILES["xccl"]
    assert native_reductions(derived) == {t for t in native_reductions(static) if t[0] != "all_reduce_coalesced"}
    assert derived.dtypes == static.dtypes - FLOAT8  # float8 is moved as uint8 by funcoll on XPU
    assert derived.uneven_all_to_all == static.uneven_all_to_all
    old, new = xpu.conservative_profile("2.11.0"), xpu.conservative_profile("2.12.0")
    assert {(p, o) for p, o, _ in native_reductions(new) - native_reductions(old)} == {("all_reduce", R.PREMUL_SUM)}
    premul = tuple(int(x) for x in torch.__version__.split(".")[:2]) >= (2, 12)
    cpu = gloo.capabilities("xccl")
    assert cpu.reduces("all_reduce", R.PREMUL_SUM, torch.float32) == premul
    assert not cpu.reduces("reduce_scatter", R.PREMUL_SUM, torch.float32)
    assert not cpu.reduces("reduce", R.PREMUL_SUM, torch.float32)
    assert R.PREMUL_SUM not in gloo.capabilities("gloo").reduce_ops


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
    monkeypatch.delenv(xpu.ENV_ONECCL_BUILD_VERSION, raising=False)
    monkeypatch.setattr(xpu, "_oneccl_from_torch", lambda: None)
    monkeypatch.setattr(xpu, "_oneccl_from_metadata", lambda: None)
    monkeypatch.setattr(xpu, "_oneccl_from_flight_recorder", lambda: "2022.1.0")
    monkeypatch.setattr(xpu, "_oneccl_pinned_by_torch", lambda: None)
    assert xpu.stack_versions() == (torch.__version__, None,
                                    "unknown (conservative: every version-gated fact uses its strategy)")
    assert xpu.stack_versions(backend_created=True) == (torch.__version__, "2022.1.0",
                                                        "ProcessGroupXCCL flight recorder")
    monkeypatch.setattr(xpu, "_oneccl_from_metadata", lambda: "2021.16.1")
    assert xpu.stack_versions(True)[1:] == ("2021.16.1", "pip metadata of package 'oneccl'")
    # get_xccl_version() (the library really loaded) comes before the pip metadata and the flight recorder
    monkeypatch.setattr(xpu, "_oneccl_from_torch", lambda: "2022.0.0")
    assert xpu.stack_versions(True)[1:] == ("2022.0.0", "torch._C._distributed_c10d.get_xccl_version()")
    monkeypatch.setenv(xpu.ENV_ONECCL_VERSION, "2022.0")
    caps = funcoll.capabilities("xpu")
    assert caps.sources["xccl.version"] == "oneCCL 2022.0 (FUNCOLL_ONECCL_VERSION)"
    assert R.AVG in caps.reduce_ops
    monkeypatch.setenv(xpu.ENV_OVERRIDE, "avg=strategy")
    assert R.AVG not in funcoll.capabilities("xpu").reduce_ops
    monkeypatch.delenv(xpu.ENV_OVERRIDE)
    monkeypatch.setenv("FUNCOLL_PROFILE", "xccl")
    assert R.AVG not in funcoll.capabilities("xpu").reduce_ops
    # the oneCCL torch was built against: the environment, else the wheel's own oneccl== pin, else unknown
    assert xpu.build_version() == (None, "unknown (no override that needs it is allowed)")
    monkeypatch.setattr(xpu, "_oneccl_pinned_by_torch", lambda: "2021.17.2")
    assert xpu.build_version() == ("2021.17.2", "the torch wheel's Requires-Dist pin")
    monkeypatch.setenv(xpu.ENV_ONECCL_BUILD_VERSION, "2022.0.0")
    assert xpu.build_version() == ("2022.0.0", "FUNCOLL_ONECCL_BUILD_VERSION")
    monkeypatch.delenv("FUNCOLL_PROFILE")
    caps = xpu.capabilities(torch_version="2.11.0", topology="scale-up", override="premul_sum=native")
    assert caps.sources["xccl.build"] == "oneCCL 2022.0.0 at build time (FUNCOLL_ONECCL_BUILD_VERSION)"
    assert caps.reduces("all_reduce", R.PREMUL_SUM, torch.float64)
    # the real readers on this machine: no XPU build of torch, no oneccl package; nothing raises
    monkeypatch.undo()
    assert xpu._oneccl_from_torch() is None or xpu._oneccl_from_torch()[0].isdigit()


def test_funcoll_capabilities_reads_the_xpu_table(monkeypatch):
    xpu_environment(monkeypatch, "2021.16.1")
    monkeypatch.delenv(xpu.ENV_ONECCL_BUILD_VERSION, raising=False)
    caps = funcoll.capabilities("xpu")
    assert caps == xpu.derive(torch.__version__, "2021.16.1")
    assert set(caps.sources) == {f"xccl.{k}" for k in xpu.XCCL_FACTS} | {"xccl.version", "xccl.topology",
                                                                         "xccl.build", "xccl.capture",
                                                                         "xccl.backend", "xccl.gpu"}
    assert caps.sources["xccl.backend"] == "ProcessGroupXCCL (default)"
    for key, fact in xpu.XCCL_FACTS.items():
        assert fact.source and fact.strategy and fact.what
        assert caps.sources[f"xccl.{key}"].endswith(fact.source)
        assert caps.sources[f"xccl.{key}"].startswith(("native: ", "strategy: ", "info: "))


def test_docs_tables_are_the_derived_tables():
    """docs/xpu.md holds the per-torch-version table and the fact details exactly as funcoll.report renders them
    from XCCL_FACTS and derive(); every fact has a row in both."""
    import os

    from funcoll import report

    path = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "docs", "xpu.md")
    page = open(path, encoding="utf-8").read()
    table, details = report.xccl_fact_table(), report.xccl_fact_details()
    assert table in page, "regenerate with: ./dev python -m funcoll.report --xccl-facts"
    assert details in page, "regenerate with: ./dev python -m funcoll.report --xccl-facts"
    assert report.xccl2_fact_table() in page, "regenerate with: ./dev python -m funcoll.report --xccl-facts"
    for key in xpu.XCCL_FACTS:
        assert f"| `{key}` |" in table and f"**`{key}`**" in details
    # the table's cells are derive()'s labels: spot checks written from the sources
    rows = {line.split("|")[1].strip().strip("`"): [c.strip() for c in line.strip().strip("|").split("|")]
            for line in table.splitlines() if line.startswith("| `")}
    assert rows["premul_sum"][2:9] == ["strategy"] * 3 + ["native"] * 4
    assert rows["avg"][2:9] == ["native from oneCCL 2022.0 (scale-out)"] * 7
    assert rows["avg_reduce_scatter"][2] == "strategy"
    assert rows["bitwise"][2:9] == ["strategy"] * 7


# -- AVG where open reports cover the stack ------------------------------------------------------------------------
B60, MAX1550 = "Intel(R) Arc(TM) Pro B60 Graphics", "Intel(R) Data Center GPU Max 1550"


@pytest.mark.parametrize("row", ROWS)
def test_avg_on_scale_up_is_the_strategy_while_reports_are_open(row):
    """oneCCL >= 2022.0 on one node: ccl avg raised on the scheduler path on 4x Max 1550 under FSDP2 and divided
    twice on Arc B60 (both reports open, no fixed oneCCL named), so AVG takes the strategy on every GPU by default;
    the probe's table (``unverified``) has AVG native on all_reduce and reduce_scatter of floats, nothing else more;
    the override still says native; scale-out (oneCCL#195 adds AVG to AllReduce in 2022.0, no open report) is
    native on all_reduce."""
    for gpu in (None, B60, MAX1550, "Intel(R) Arc(TM) A770 Graphics"):
        caps = xpu.derive(row, "2022.1.2", "", "scale-up", None, None, gpu)
        assert not any(caps.reduces(p, R.AVG, d) for p in REDUCING for d in ALL_DTYPES), gpu
        assert native_reductions(caps.unverified) - native_reductions(caps) == {
            (p, R.AVG, d) for p in ("all_reduce", "reduce_scatter") for d in FLOATS}
        assert caps.unverified.refused_on >= {("reduce", R.AVG)}
        why = caps.sources["xccl.avg"]
        assert why.startswith("strategy: open report") and "intel/torch-xpu-ops#2361" in why
        assert ("intel/torch-xpu-ops#3020" in why) == (gpu in (None, B60)), gpu  # Arc B-series, or unknown
        assert "intel/torch-xpu-ops#3020" not in caps.sources["xccl.avg_reduce_scatter"]
        forced = xpu.derive(row, "2022.1.2", "avg=native,avg_reduce_scatter=native", "scale-up", None, None, gpu)
        assert forced.reduces("all_reduce", R.AVG, torch.bfloat16) and forced.reduces("reduce_scatter", R.AVG,
                                                                                       torch.float32)
        assert forced.unverified is None  # nothing left for the probe to verify
    out = xpu.derive(row, "2022.1.2", "", "scale-out", None, None, B60)
    assert out.reduces("all_reduce", R.AVG, torch.float32) and not out.reduces("reduce_scatter", R.AVG, torch.float32)
    assert out.unverified is None
    # below oneCCL 2022.0 no gate passes: nothing for a probe to promote
    assert xpu.derive(row, "2021.17.2", "", "scale-up").unverified is None


def test_a_report_with_a_fixed_oneccl_or_another_gpu_family_stops_covering(monkeypatch):
    """Report.covers reads the fact, topology, oneCCL (below ``fixed_in``) and the GPU name (an unknown one is
    covered): with #3020 alone, and fixed in oneCCL 2022.3, AVG is native on scale-up from 2022.3, and on a GPU
    outside the family before it."""
    only = xpu.Report("intel/torch-xpu-ops#3020", ("avg",), ("scale-up",), r"Arc.*\bB\d{2,3}\b", "B60", "twice",
                      fixed_in=(2022, 3))
    monkeypatch.setattr(xpu, "OPEN_REPORTS", (only,))
    def avg(oneccl, gpu):
        return xpu.derive("2.15", oneccl, "", "scale-up", None, None, gpu).reduces("all_reduce", R.AVG, torch.float32)
    assert [avg("2022.2", g) for g in (None, B60, "Intel(R) Arc(TM) B580 Graphics", MAX1550)] == [
        False, False, False, True]
    assert [avg("2022.3", g) for g in (None, B60, MAX1550)] == [True, True, True]
    assert xpu.open_reports("avg", "scale-out", (2022, 2), B60) == ()


# -- the backend class is part of the row --------------------------------------------------------------------------
def xccl2_expected(p, op, d):
    """What xccl2 (torchcomms' TorchCommXCCL at 59426ba4) reduces natively as funcoll reads it, written from its
    source: getXcclDataTypeInternal maps f32/f64/f16/bf16/i32/i64/i8/u8/bool only; AVG is SUM then div_ on every
    reducing collective (integer AVG in the tensor's own dtype: funcoll keeps its int64 strategy); PREMUL_SUM is a
    mul_ of the all_reduce tensor or of a clone of the input, then SUM (floats only); BAND/BOR/BXOR raise; integer
    MIN/MAX go to onecclMin/Max (funcoll's strategy, as on ProcessGroupXCCL)."""
    dtypes = {torch.uint8, torch.int8, torch.int32, torch.int64, *FLOATS, torch.bool}
    if d not in dtypes or op in (R.BAND, R.BOR, R.BXOR):
        return False
    if op in (R.AVG, R.PREMUL_SUM):
        return d in FLOATS
    if op in (R.MIN, R.MAX):
        return d in FLOATS
    return True


@pytest.mark.parametrize("backend", ["xccl2", "ProcessGroupXCCL2"])
def test_xccl2_has_its_own_row(backend):
    for row in ROWS:
        for oneccl in (None, "2021.17.2", "2022.1.2"):
            for topology in ("scale-up", "scale-out"):
                caps = xpu.derive(row, oneccl, "", topology, None, backend)
                assert caps.name == f"xccl2[torch {row}, oneCCL {oneccl or 'unknown'}, {topology}]"
                assert native_reductions(caps) == {(p, o, d) for p in REDUCING for o in REDUCE_OPS for d in ALL_DTYPES
                                                   if p != "all_reduce_coalesced" and xccl2_expected(p, o, d)}
                assert not caps.uneven_all_to_all and caps.unverified is None
                assert caps.versions["backend"] == "ProcessGroupXCCL2"
    # its overrides: AVG and PREMUL_SUM may be turned off (funcoll's own strategy), bitwise never
    off = xpu.derive("2.15", None, "avg=strategy,premul_sum_reduce_scatter=strategy", None, None, backend)
    assert not off.reduces("all_reduce", R.AVG, torch.float32) and off.reduces("reduce", R.AVG, torch.float32)
    assert not off.reduces("reduce", R.PREMUL_SUM, torch.float32) and off.reduces("all_reduce", R.PREMUL_SUM,
                                                                                   torch.float32)
    with pytest.raises(ValueError) as e:
        xpu.derive("2.15", None, "bitwise=native", None, None, backend)
    assert str(e.value) == ("funcoll.xpu: override 'bitwise' cannot be overridden (the library has no native path); "
                            "overridable facts on scale-out: avg, avg_reduce, avg_reduce_scatter, int_minmax, "
                            "premul_sum, premul_sum_reduce_scatter, uneven_all_to_all")


def test_an_unknown_backend_class_gets_the_conservative_row():
    conservative = {(p, o, d) for p in REDUCING for o in (R.SUM, R.PRODUCT, R.MIN, R.MAX)
                    for d in (torch.uint8, torch.int8, torch.int32, torch.int64, *FLOATS, torch.bool)
                    if p != "all_reduce_coalesced" and (o in (R.SUM, R.PRODUCT) or d in FLOATS)}
    for row in ROWS:
        caps = xpu.derive(row, "2022.1.2", "", "scale-up", "2022.1.2", "ProcessGroupXYZ")
        assert caps.name == f"xpu:ProcessGroupXYZ[torch {row}, oneCCL 2022.1.2, scale-up]"
        assert native_reductions(caps) == conservative
        assert not caps.uneven_all_to_all and caps.unverified is None
        assert all(v.startswith(("info: ", "strategy: ProcessGroupXYZ is an XPU backend funcoll has no facts for"))
                   for k, v in caps.sources.items())
    with pytest.raises(ValueError) as e:
        xpu.derive("2.15", "2022.1.2", "avg=native", "scale-up", None, "ProcessGroupXYZ")
    assert str(e.value) == ("funcoll.xpu: override 'avg' cannot be overridden on ProcessGroupXYZ (an XPU backend "
                            "funcoll has no facts for: the conservative row); overridable facts on scale-up: none")


def test_the_c10d_factory_reads_the_backend_class_from_the_group():
    """A group made with another backend: the XPU transport's row is the one of the class its XPU backend has
    (``pg._get_backend(device)``); the backends here are real gloo backends under the classes' names."""
    from datetime import timedelta

    import torch.distributed as dist

    def group_with(cls):
        backend = cls(dist.HashStore(), 0, 1, timedelta(seconds=10))

        class PG:
            group_name = f"g-{cls.__name__}"

            def _get_backend(self, device):
                assert device == torch.device("xpu")
                return backend

        return PG()

    names = {}
    for name in ("ProcessGroupXCCL", "ProcessGroupXCCL2", "ProcessGroupSomethingElse"):
        tp = xpu._c10d_xpu(group_with(type(name, (dist.ProcessGroupGloo,), {})), torch.device("xpu", 0))
        assert isinstance(tp, xpu.XcclTransport)
        names[name] = tp.caps
    # TORCH_DISTRIBUTED_DEBUG=DETAIL: c10d wraps the backend; the row is the wrapped backend's, the wrapper is driven
    inner = type("ProcessGroupXCCL2", (dist.ProcessGroupGloo,), {})(dist.HashStore(), 0, 1, timedelta(seconds=10))
    wrapper = torch._C._distributed_c10d._ProcessGroupWrapper(
        inner, dist.ProcessGroupGloo(dist.HashStore(), 0, 1, timedelta(seconds=10)))

    class Wrapped:
        group_name = "g-wrapped"

        def _get_backend(self, device):
            return wrapper

    tp = xpu._c10d_xpu(Wrapped(), torch.device("xpu", 0))
    assert tp.backend is wrapper and tp.caps.versions["backend"] == "ProcessGroupXCCL2"
    assert names["ProcessGroupXCCL2"].reduces("reduce_scatter", R.AVG, torch.float32)
    assert names["ProcessGroupXCCL2"].sources["xccl.backend"] == "ProcessGroupXCCL2 (the backend that runs the calls)"
    assert not names["ProcessGroupXCCL"].reduces("reduce_scatter", R.AVG, torch.float32)
    assert names["ProcessGroupSomethingElse"].name.startswith("xpu:ProcessGroupSomethingElse[")
    assert not torch.xpu.is_initialized()


def test_report_shows_the_row_of_either_backend_class():
    import contextlib
    import io

    from funcoll.__main__ import main

    def report(*args):
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            assert main(["report", "--device", "xpu", "--torch-version", "2.15.0", *args]) == 0
        return out.getvalue().splitlines()

    lines = report("--oneccl-version", "2022.1.2", "--topology", "scale-up", "--gpu", B60)
    assert "| all_reduce avg float32 | avg=sum+scale |" in lines
    assert ("(backend ProcessGroupXCCL, GPU Intel(R) Arc(TM) Pro B60 Graphics; graph capture: allowed; torch 2.15 is "
            "known up to intel/torch-xpu-ops main at ab84f925 (2026-08-22))") in lines
    avg = next(line for line in lines if line.startswith("- `avg`: "))
    assert avg.startswith("- `avg`: **strategy** (open reports intel/torch-xpu-ops#2361, intel/torch-xpu-ops#3020 "
                          "cover this stack (scale-up, oneCCL 2022.1.2, GPU Intel(R) Arc(TM) Pro B60 Graphics): native "
                          "once funcoll.probe verifies it on the live group, or with FUNCOLL_XPU_OVERRIDE=avg=native) "
                          "- ProcessGroupXCCL: always onecclAvg")
    lines = report("--backend", "xccl2")
    assert "| all_reduce avg float32 | native |" in lines and "| reduce_scatter premul_sum float32 | native |" in lines
    assert ("- `premul_sum_reduce_scatter`: **native** - ProcessGroupXCCL2: input.clone().mul_(factor), then "
            "SUM") in lines
    assert "- `bitwise`: **strategy** - ProcessGroupXCCL2: raises std::runtime_error" in lines
    lines = report("--backend", "ProcessGroupXYZ")
    assert "| all_reduce avg float32 | avg=sum+scale |" in lines
    assert ("- `int_minmax`: **strategy** (ProcessGroupXYZ is an XPU backend funcoll has no facts for (the "
            "conservative row)) - ProcessGroupXYZ: unknown") in lines
