"""funcoll.probe on real 2-rank worlds: every native request verified on gloo, the disk cache, a deliberately wrong
transport caught and demoted (the collective after it is right), ``FUNCOLL_PROBE=1`` at group creation; and the
probe's own pieces (its reference, its demotions) against independent computations."""

import functools
import json
import os

import pytest
import torch

from funcoll import probe
from funcoll.launch import run_world
from funcoll.semantics import ReduceOp
from funcoll.transport import DONE, profile
from funcoll.transport.c10d import C10dTransport

R = torch.distributed.ReduceOp


class WrongTransport(C10dTransport):
    """What a broken collective library does: int32 MAX all_reduce returns the SUM; uneven all_to_all delivers the
    received chunks in reverse order."""

    def _all_reduce(self, t, red):
        if t.dtype == torch.int32 and red.op is ReduceOp.MAX:
            from funcoll.semantics import Reduction

            red = Reduction(ReduceOp.SUM)
        return super()._all_reduce(t, red)

    def _all_to_all(self, out, inp, out_splits, in_splits):
        h = super()._all_to_all(out, inp, out_splits, in_splits)
        if out_splits:
            h.wait()
            out.copy_(out.flip(0))
            return DONE
        return h


def _max_case(rank, group=None):
    """int32 MAX of [-7, 3, 5] * (1, -1): the reference is computed here, from both ranks' inputs. Also returns the
    strategies the transport's current table plans for it (a dry run), to compare with those that ran."""
    import torch.distributed as dist

    import funcoll
    from funcoll import algorithms
    from funcoll.report import DryRunTransport
    from funcoll.transport.registry import transport_for

    ins = [torch.tensor([-7, 3, 5], dtype=torch.int32) * s for s in (1, -1)]
    want = [max(a, b) for a, b in zip(ins[0].tolist(), ins[1].tolist())]
    x = ins[rank].clone()
    with funcoll.record() as calls:
        dist.all_reduce(x, op=R.MAX, group=group)
    with algorithms.record() as planned:
        algorithms.all_reduce(DryRunTransport(transport_for(group or dist.group.WORLD, "cpu").caps, 2),
                     torch.ones(3, dtype=torch.int32), "max").wait()
    ran = [s for _, ns in calls for s in ns]
    return x.tolist() == want, x.tolist(), ran, ran == [s for _, ns in planned for s in ns]


def _uneven_case(rank, group=None):
    import torch.distributed as dist

    import funcoll

    ins_splits = [[1, 2], [3, 1]]
    inputs = [torch.arange(float(sum(s))) + 10 * r for r, s in enumerate(ins_splits)]
    outs = [ins_splits[j][rank] for j in range(2)]
    want = []
    for j in range(2):
        off = sum(ins_splits[j][:rank])
        want += inputs[j][off:off + ins_splits[j][rank]].tolist()
    out = torch.empty(sum(outs))
    with funcoll.record() as calls:
        dist.all_to_all_single(out, inputs[rank], outs, ins_splits[rank], group=group)
    return out.tolist() == want, [s for _, ns in calls for s in ns]


# ---------------------------------------------------------------------------------------------------
# rank side
# ---------------------------------------------------------------------------------------------------
def healthy_case(rank, n):
    import torch.distributed as dist

    import funcoll

    tp = dist.group.WORLD.transport("cpu")
    first = funcoll.probe.run()
    calls = dict(tp.calls)
    again = funcoll.probe.run()  # probed in this process: the same result, nothing sent
    same = again is first and dict(tp.calls) == calls
    fresh = dist.new_group(backend="funcoll")  # another transport, same stack: the cache
    tp2 = fresh.transport("cpu")
    before = dict(tp2.calls)
    cached = funcoll.probe.run(fresh)
    sent = {k: v - before.get(k, 0) for k, v in tp2.calls.items() if v != before.get(k, 0)}
    return first.to_dict(), same, cached.to_dict(), sent


def wrong_case(rank, n):
    import torch.distributed as dist

    import funcoll

    tp = dist.group.WORLD.transport("cpu")
    tp.__class__ = WrongTransport
    before = _max_case(rank), _uneven_case(rank)
    res = funcoll.probe.run(cache=False)
    key = ("all_reduce", "max", torch.int32)
    native_max = tp.calls[key]
    after = _max_case(rank), _uneven_case(rank)
    x = torch.tensor([1, 2], dtype=torch.int32)
    with funcoll.record() as calls:
        dist.all_reduce(x)  # untouched by the demotions: native, right
    caps = tp.caps
    return (before, res.to_dict(), after, tp.calls[key] - native_max, x.tolist(), calls,
            caps.name, (ReduceOp.MAX, torch.int32) in caps.refused_pairs, caps.uneven_all_to_all)


def at_creation_case(rank, n):
    import torch.distributed as dist

    import funcoll
    from funcoll.transport import registry as lowering

    at_init = [r.to_dict() for r in funcoll.probe.results()]  # the world group, probed while it was created
    real = lowering._funcoll_factories["cpu"]

    def wrong_factory(ctx):
        tp = real(ctx)
        tp.__class__ = WrongTransport
        return tp

    lowering._funcoll_factories["cpu"] = wrong_factory
    try:
        g = dist.new_group(backend="funcoll")  # FUNCOLL_PROBE=1: probed before its first collective
    finally:
        lowering._funcoll_factories["cpu"] = real
    made = funcoll.probe.results()[-1]
    return at_init, made.to_dict(), made.to_markdown(), _max_case(rank, g), _uneven_case(rank, g)


# ---------------------------------------------------------------------------------------------------
# tests
# ---------------------------------------------------------------------------------------------------
def _gloo_expected_requests():
    """Independently of funcoll.probe.requests: what gloo's table calls native, per the facts in transport.py."""
    ints = ["int8", "uint8", "int32", "int64"]
    floats = ["float16", "bfloat16", "float32", "float64"]
    want = set()
    for prim in ("all_reduce", "reduce_scatter", "reduce"):
        for dt in ints + floats:
            for op in ("sum", "product", "min", "max"):
                want.add(f"{prim} {op} {dt}")
        for dt in floats:
            want.add(f"{prim} avg {dt}")
        for dt in ints + ["bool"]:
            for op in ("band", "bor", "bxor"):
                want.add(f"{prim} {op} {dt}")
    for dt in ints + floats + ["bool"]:
        for prim in ("all_gather", "all_to_all", "all_to_all uneven", "broadcast", "gather", "scatter"):
            want.add(f"{prim} {dt}")
    return want


def test_probe_verifies_every_native_gloo_request_and_caches_it(tmp_path, monkeypatch):
    monkeypatch.setenv("FUNCOLL_PROBE_CACHE", str(tmp_path))
    monkeypatch.delenv("FUNCOLL_PROBE", raising=False)
    res = run_world("tests.observability.test_probe:healthy_case", 2, None, timeout=240)
    for first, same, cached, sent in res:
        assert set(first["checked"]) == _gloo_expected_requests()
        assert first["wrong"] == {} and first["demoted"] == [] and not first["cached"]
        assert first["capabilities"] == "gloo"
        key = first["key"]
        assert key["torch"] == torch.__version__ and key["group_size"] == 2 and key["library"] == "gloo"
        assert key["topology"] == "1 host x 2 ranks" and key["capabilities"] == "gloo"
        assert same
        assert cached["cached"] and cached["wrong"] == {} and cached["key"] == key
        # applied from the cache: only the two tiny agreement gathers were sent (hosts, cache digests)
        assert sent == {("all_gather", "", torch.uint8): 2}, sent
    (entry,) = [json.load(open(tmp_path / f)) for f in os.listdir(tmp_path)]
    assert entry["key"] == res[0][0]["key"] and entry["wrong"] == {} and len(entry["checked"]) == 207


def _max_as_sum() -> str:
    """What the probe says of an int32 MAX all_reduce answered with the SUM, on 2 ranks, up to the rank: the first
    size's case (6 elements, all shown), computed here in Python integers."""
    case = probe._Case(probe.Request.parse("all_reduce max int32"), 2, 3)
    xs = [_ints(case.inputs(r)) for r in range(2)]
    return f"got {_python_reduce(xs, 'sum', 32, True)} want {_python_reduce(xs, 'max', 32, True)} on rank"


def test_probe_catches_a_wrong_native_result_and_the_next_collective_is_right(monkeypatch):
    monkeypatch.delenv("FUNCOLL_PROBE", raising=False)
    res = run_world("tests.observability.test_probe:wrong_case", 2, None, timeout=240)
    for before, probed, after, native_after, x, calls, name, refused, uneven in res:
        (max_ok, max_got, max_strats, _), (a2a_ok, a2a_strats) = before
        assert not max_ok and max_got == [0, 0, 0] and max_strats == ["native"]  # the SUM: the injection works
        assert not a2a_ok and a2a_strats == ["native"]
        uneven_wrong = {f"all_to_all uneven {d}" for d in ("bfloat16", "bool", "float16", "float32", "float64",
                                                            "int32", "int64", "int8", "uint8")}
        assert set(probed["wrong"]) == {"all_reduce max int32"} | uneven_wrong, probed["wrong"]
        assert probed["wrong"]["all_reduce max int32"].startswith(_max_as_sum())
        assert probed["unfixable"] == []
        assert "all_reduce max int32 -> max on int32: the strategy, on every reducing primitive" in probed["demoted"]
        (max_ok, max_got, max_strats, as_planned), (a2a_ok, a2a_strats) = after
        # the strategy the demoted table plans (whatever its name), not the native request
        assert max_ok and max_got == [7, 3, 5] and max_strats != ["native"] and as_planned
        assert a2a_ok and a2a_strats == ["uneven all_to_all=pairwise send/recv"], a2a_strats
        assert native_after == 0  # the wrong native request was never sent again
        assert x == [2, 4] and calls == [("all_reduce", ["native"])]
        assert name == "gloo+probe" and refused and not uneven


def test_funcoll_probe_1_probes_each_group_at_creation(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("FUNCOLL_PROBE", "1")
    monkeypatch.setenv("FUNCOLL_PROBE_CACHE", str(tmp_path))
    res = run_world("tests.observability.test_probe:at_creation_case", 2, None, timeout=240)
    for at_init, made, text, (max_ok, _, max_strats, as_planned), (a2a_ok, _) in res:
        assert len(at_init) == 1 and at_init[0]["wrong"] == {} and len(at_init[0]["checked"]) == 207
        assert "all_reduce max int32" in made["wrong"] and made["key"]["transport"] == "WrongTransport"
        assert max_ok and max_strats != ["native"] and as_planned and a2a_ok
        assert f"| all_reduce max int32 | {_max_as_sum()}" in text
    # the results are in the report (from the cache this run wrote)
    from funcoll.__main__ import main

    capsys.readouterr()
    assert main(["report", "--device", "cpu", "--probed"]) == 0
    out = capsys.readouterr().out
    assert "## Verified on this machine (funcoll.probe cache)" in out
    assert "207 native requests verified, 0 wrong" in out and "207 native requests verified, 10 wrong" in out
    assert f"  - all_reduce max int32: {_max_as_sum()}" in out


# ---------------------------------------------------------------------------------------------------
# the pieces, without a world
# ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["all_reduce max int32", "reduce_scatter avg bfloat16", "all_to_all uneven bool",
                                  "all_gather uint64", "reduce bxor bool"])
def test_request_names_round_trip(name):
    assert probe.Request.parse(name).name == name


def test_request_names_are_checked():
    for bad in ("all_reduce max", "all_reduce maximum int32", "all_gather int33", "broadcast sum float32 x"):
        with pytest.raises(ValueError, match="cannot read a request"):
            probe.Request.parse(bad)


def test_the_wrong_result_hook_is_not_public_api():
    """``python -m funcoll probe --simulate-wrong`` breaks a transport through a private hook, which refuses a move."""
    assert not hasattr(probe, "inject_wrong") and all(not name.startswith("_") for name in probe.__all__)
    with pytest.raises(ValueError, match=r"^funcoll\.probe\.inject_wrong: only reductions can be made wrong, got "
                                         r"'all_gather float32'$"):
        probe._inject_wrong(object(), "all_gather float32")


def _python_reduce(values, op, bits, signed):
    """Per element, in Python integers, wrapped to the width: independent of the probe's check."""
    fn = {"sum": lambda a, b: a + b, "product": lambda a, b: a * b, "min": min, "max": max,
          "band": lambda a, b: a & b, "bor": lambda a, b: a | b, "bxor": lambda a, b: a ^ b}[op]
    out = []
    for col in zip(*values):
        v = functools.reduce(fn, col) % (1 << bits)
        out.append(v - (1 << bits) if signed and v >= 1 << (bits - 1) else v)
    return out


def _ints(t):
    if t.dtype == torch.uint64:
        return [v % (1 << 64) for v in t.view(torch.int64).tolist()]
    return t.to(torch.int64).tolist()


def _tensor(values, dtype):
    if dtype == torch.uint64:
        return torch.tensor([v - (1 << 64) if v >= 1 << 63 else v for v in values]).view(torch.uint64)
    return torch.tensor(values, dtype=torch.int64).to(dtype)


@pytest.mark.parametrize("dtype", [torch.int8, torch.uint8, torch.int16, torch.int32, torch.int64, torch.uint32,
                                   torch.uint64])
@pytest.mark.parametrize("op", ["sum", "product", "min", "max", "band", "bor", "bxor"])
def test_probe_check_matches_python_integers(dtype, op):
    """The probe's check of a native all_reduce passes the Python-integer result and catches another op's."""
    n = 3
    case = probe._Case(probe.Request("all_reduce", ReduceOp(op), dtype), n, 3)
    xs = [case.inputs(r) for r in range(n)]
    bits, signed = dtype.itemsize * 8, dtype not in (torch.uint8, torch.uint32, torch.uint64)
    right = _tensor(_python_reduce([_ints(x) for x in xs], op, bits, signed), dtype)
    assert case.check(0, xs, [right]) is None
    # and the inputs tell the op apart: another op's result is a mismatch
    wrong = _tensor(_python_reduce([_ints(x) for x in xs], "sum" if op != "sum" else "max", bits, signed), dtype)
    assert case.check(0, xs, [wrong]) is not None


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64])
def test_probe_check_floats_and_avg_divided_twice_is_caught(dtype):
    n = 2
    case = probe._Case(probe.Request("all_reduce", ReduceOp.AVG, dtype), n, 3)
    xs = [case.inputs(r) for r in range(n)]
    right = (xs[0].double() + xs[1].double()).div(n).to(dtype)
    assert case.check(0, xs, [right]) is None
    assert case.check(0, xs, [right.double().div(n).to(dtype)]) is not None  # AVG divided twice


def test_demotions():
    caps = profile("gloo")
    new, demoted, unfixable = probe.demote(caps, {"all_reduce max int32": "x", "reduce sum float32": "y",
                                              "all_to_all uneven float32": "z", "broadcast bool": "w",
                                              "all_gather float32": "v"})
    assert (ReduceOp.MAX, torch.int32) in new.refused_pairs and not new.reduces("all_reduce", ReduceOp.MAX,
                                                                               torch.int32)
    assert new.reduces("all_reduce", ReduceOp.SUM, torch.int32) and new.reduces("all_reduce", ReduceOp.MAX,
                                                                                torch.int64)
    assert not new.has("reduce") and not new.has("broadcast") and new.has("all_gather")
    assert not new.uneven_all_to_all and caps.uneven_all_to_all
    assert unfixable == ["all_gather float32"]  # funcoll reduces float32: it cannot move it as something else
    assert len(demoted) == 4 and new.name == "gloo+probe"
    assert new.sources["probe.all_reduce max int32"].startswith("wrong native result on this machine (x)")
    assert probe.demote(caps, {}) == (caps, [], [])
    # a dtype funcoll only moves can be moved as the raw bits of another
    xccl = profile("xccl")
    new, demoted, unfixable = probe.demote(xccl, {"all_gather float8_e4m3fn": "v"})
    assert unfixable == [] and torch.float8_e4m3fn not in new.dtypes and torch.float8_e4m3fn in xccl.dtypes
    assert demoted == ["all_gather float8_e4m3fn -> float8_e4m3fn: moved as the raw bits of another dtype"]


def test_requests_follow_the_table():
    xccl = profile("gloo").restrict(profile("xccl"))
    names = {r.name for r in probe.requests(xccl, 2)}
    assert "all_reduce max float32" in names and "all_reduce max int32" not in names  # refused: never probed
    assert "all_reduce avg float32" not in names and "all_reduce bxor int32" not in names
    assert not any(n.startswith("all_to_all uneven") for n in names)  # the xccl table pads
    assert "all_to_all float32" in names and "all_reduce sum bool" not in names
    assert not any(n.startswith("all_to_all uneven") for n in (r.name for r in probe.requests(profile("gloo"), 1)))


# ---------------------------------------------------------------------------------------------------
# a request an open report keeps off the native path, verified on the live group
# ---------------------------------------------------------------------------------------------------
def _oneccl_avg_case(rank, world, twice_below):
    """The XPU transport class with the scale-up, oneCCL 2022 table (torch 2.15), over a gloo backend whose AVG is
    ccl avg as a library would do it: SUM, then divide by the group size, divided twice for tensors of at most
    ``twice_below`` elements (what intel/torch-xpu-ops#3020 reports on Arc B60). Probes it, then runs one AVG
    all_reduce; the reference is computed here."""
    from datetime import timedelta

    import torch.distributed as dist

    from funcoll import algorithms
    from funcoll.semantics import Reduction
    from funcoll.transport import xpu

    class OnecclAvg(xpu.XcclTransport):
        def _avg(self, t, run):
            run(Reduction(ReduceOp.SUM)).wait()
            t.div_(self.size * (self.size if t.numel() <= twice_below else 1))
            return DONE

        def _all_reduce(self, t, red):
            if red.op is ReduceOp.AVG:
                return self._avg(t, lambda r: super(OnecclAvg, self)._all_reduce(t, r))
            return super()._all_reduce(t, red)

        def _reduce_scatter(self, out, inp, red):
            if red.op is ReduceOp.AVG:
                return self._avg(out, lambda r: super(OnecclAvg, self)._reduce_scatter(out, inp, r))
            return super()._reduce_scatter(out, inp, red)

    store = dist.PrefixStore(f"oneccl-avg-{twice_below}/", dist.distributed_c10d._get_default_store())
    gloo = dist.ProcessGroupGloo(store, rank, 2, timedelta(seconds=60))
    caps = xpu.derive("2.15.0", "2022.1.2", "", "scale-up")
    tp = OnecclAvg(gloo, caps, device="cpu", device_type="cpu")
    default = tp.caps.reduces("all_reduce", ReduceOp.AVG, torch.float32)
    res = probe.probe_transport(tp, "xpu", "oneccl-avg", cache=False)
    ins = [torch.tensor([1.0, 2.0, 4.0, 8.0]) * (r + 1) - 3 * r for r in range(2)]
    x = ins[rank].clone()
    with algorithms.record() as log:
        algorithms.all_reduce(tp, x, "avg").wait()
    want = [(a + b) / 2 for a, b in zip(ins[0].tolist(), ins[1].tolist())]
    return (default, res.verified, sorted(res.wrong), res.demoted, tp.caps.name, x.tolist(), want,
            [s for _, ns in log for s in ns])


AVG_REQUESTS = sorted(f"{p} avg {d}" for p in ("all_reduce", "reduce_scatter")
                      for d in ("float16", "bfloat16", "float32", "float64"))


def test_the_probe_makes_avg_native_where_only_an_open_report_kept_it_off(monkeypatch):
    """Scale-up with oneCCL 2022: AVG is on the strategy by default (open reports); a backend whose AVG is right on
    every size checked gets it native for that group, and the next AVG runs natively and is right."""
    monkeypatch.delenv("FUNCOLL_PROBE", raising=False)
    for default, verified, wrong, demoted, name, got, want, ran in run_world(
            f"{__name__}:_oneccl_avg_case", 2, None, (0,), timeout=240):
        assert not default
        assert sorted(verified) == AVG_REQUESTS and wrong == [] and demoted == []
        assert name == "xccl[torch 2.15, oneCCL 2022.1.2, scale-up]+probe"
        assert got == want and ran == ["native"]


def test_the_probe_keeps_avg_on_the_strategy_where_the_library_divides_twice(monkeypatch):
    """The same with AVG divided twice up to 64 elements: every AVG request is wrong at the small sizes, none is made
    native, nothing native was demoted, and the next AVG (4 elements) runs the strategy and is right."""
    monkeypatch.delenv("FUNCOLL_PROBE", raising=False)
    for default, verified, wrong, demoted, name, got, want, ran in run_world(
            f"{__name__}:_oneccl_avg_case", 2, None, (64,), timeout=240):
        assert not default
        assert verified == [] and wrong == AVG_REQUESTS and demoted == []
        assert name == "xccl[torch 2.15, oneCCL 2022.1.2, scale-up]"
        assert got == want and ran == ["avg=sum+scale"]
