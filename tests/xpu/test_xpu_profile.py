"""The XCCL profile run for real over gloo (FUNCOLL_PROFILE=xccl), 2 and 3 ranks.

Every gap of the XCCL table (AVG, PREMUL_SUM, BAND/BOR/BXOR, int16/uint16/uint32/uint64, integer MIN/MAX, uneven
all_to_all incl. zero splits, float8 moved by all_gather/all_to_all/broadcast) is filled, through three entry paths
(eager ``dist.*`` on the funcoll group; the XPU transport class over a spied real backend; the kernels on the XPU
dispatch key), and every result equals a reference computed independently from all ranks' inputs. The refused
native primitives are never called: the spy logs every call the backend receives, the transports count theirs,
and ``funcoll.record()`` names the strategy that ran.
"""

import pytest
import torch
import torch.distributed as dist

import funcoll
from funcoll.launch import run_world
from funcoll.semantics import FLOAT8
from tests.xpu import xpu_cases

UNCARRIED = {str(d) for d in (torch.int16, torch.uint16, torch.uint32, torch.uint64)} | {str(d) for d in FLOAT8}
INT_NAMES = {str(d) for d in (torch.int8, torch.uint8, torch.int32, torch.int64, torch.bool)}


@pytest.fixture(scope="module", params=[2, 3], ids=["2ranks", "3ranks"])
def world(request):
    return request.param, run_world("tests.xpu.xpu_cases:gaps", request.param, "xccl", timeout=170, coll_timeout=40)


def expected_cases(n):
    keys = []
    for op, dtype, note in xpu_cases.ALL_REDUCE:
        for path in ("eager", "xpu_tp", "xpu_key"):
            if not (path == "xpu_key" and op == "premul_sum"):
                keys.append((("all_reduce", op, str(dtype), path), note))
    for op, dtype, note in xpu_cases.REDUCE_SCATTER:
        for path in ("eager", "xpu_tp", "xpu_key"):
            if not (path == "xpu_key" and op == "premul_sum"):
                keys.append((("reduce_scatter", op, str(dtype), path), note))
    return keys


def test_every_result_equals_the_independent_reference(world):
    n, results = world
    bad = [(r, k, d) for r, res in enumerate(results) for k, (ok, d) in res["results"].items() if not ok]
    assert not bad, "\n".join(f"rank {r} {k}: {d}" for r, k, d in bad)
    # every case ran on every rank (all_reduce/reduce_scatter x 3 paths, moves, all_to_all, reduce, coalesced)
    n_cases = len(expected_cases(n)) + len(xpu_cases.MOVED) * 6 + 4 * 3 + 1 + 2 + 2
    assert [len(r["results"]) for r in results] == [n_cases] * n


def test_each_gap_is_filled_by_the_named_strategy(world):
    n, results = world
    for r, res in enumerate(results):
        for key, note in expected_cases(n):
            notes = res["notes"][key]
            if note == "native":
                assert notes == ["native"], (r, key, notes)
            else:
                assert any(note in s for s in notes), (r, key, note, notes)
        for dtype in xpu_cases.MOVED:
            for kind in ("all_gather", "broadcast"):
                notes = res["notes"][(kind, "", str(dtype), "xpu_tp")]
                # the same-width integer XCCL carries; no 16-bit integer: bytes (never float bits, which can be a
                # NaN pattern that XCCL's NaN check rejects)
                width = {1: "torch.uint8", 2: "bytes", 4: "torch.int32", 8: "torch.int64"}
                carrier = width[dtype.itemsize]
                # recorded once per call (the output and input views of all_gather share the note)
                assert notes == [f"{dtype} moved as {carrier}"], (kind, dtype, notes)
        for dtype in (torch.float32, torch.int16, torch.float8_e5m2, torch.uint64):
            for path in ("eager", "xpu_tp", "xpu_key"):
                notes = res["notes"][("all_to_all_uneven", "", str(dtype), path)]
                if n == 2:  # pairwise rounds at world 2; above it the carried exchange
                    assert "uneven all_to_all=pairwise send/recv" in notes, notes
                else:
                    assert any(x.startswith("uneven all_to_all=carried") or "split statistics all_to_all" in x
                               for x in notes), notes
        assert res["notes"][("reduce", "avg", "torch.float32", "xpu_tp")] == ["reduce=all_reduce", "avg=sum+scale"]
        assert res["notes"][("all_reduce_coalesced", "avg", "float32+bfloat16", "xpu_tp")] == [
            "flat buffer of 2 torch.float32 tensors", "avg=sum+scale", "avg=float32 reduce_scatter+scale+all_gather"]


def test_the_xpu_transport_never_sends_what_xccl_refuses(world):
    """Every native call the (spied) backend received is one ProcessGroupXCCL serves correctly."""
    n, results = world
    for res in results:
        log = res["spy"]
        assert log, "the backend received no call"
        methods = {m for m, *_ in log}
        assert {"allreduce", "_allgather_base", "_reduce_scatter_base", "alltoall_base", "broadcast"} <= methods
        for method, op, dtype, uneven, devices in log:
            assert dtype not in UNCARRIED, (method, dtype)
            assert op not in ("avg", "premul_sum", "band", "bor", "bxor"), (method, op, dtype)
            assert not (op in ("min", "max") and dtype in INT_NAMES), (method, op, dtype)
            assert not uneven, (method, "uneven splits reached the backend")
            assert method != "allreduce_coalesced"
            assert devices == ["cpu"]  # the tensors' own device (XPU on XPU): nothing staged elsewhere
        # the transport's own counter agrees with the backend's log
        assert sum(res["tp_calls"].values()) == len(log)
        assert not res["native_avg"]


def test_the_eager_group_never_sends_what_xccl_refuses(world):
    n, results = world
    for res in results:
        for (prim, op, dtype), count in res["pg_calls"].items():
            assert count > 0
            assert dtype not in UNCARRIED, (prim, dtype)
            # PREMUL_SUM reaches the backend on all_reduce only, and only where the running torch's row has it
            # (2.12+: ProcessGroupXCCL scales the tensor in place and sums; the CPU transport does the same)
            premul_ok = op == "premul_sum" and prim == "all_reduce" and xpu_cases.PREMUL_NATIVE
            assert op not in ("avg", "premul_sum", "band", "bor", "bxor") or premul_ok, (prim, op)
            assert not (op in ("min", "max") and dtype in INT_NAMES), (prim, op, dtype)
        if xpu_cases.PREMUL_NATIVE:
            assert res["pg_calls"].get(("all_reduce", "premul_sum", "torch.float32"), 0) > 0


def test_no_buffer_sent_holds_a_nan_even_when_uninitialised_memory_is_nan():
    """XCCL's NaN check (TORCH_XCCL_NAN_CHECK) asserts on a NaN in any buffer sent. Every strategy runs with
    torch.empty / empty_like / new_empty returning NaN-filled floating tensors, over the spied backend, which checks
    what XCCL checks (the inputs of every collective; the root's buffer of broadcast and scatter; a send): no buffer
    sent holds a NaN (the inputs are finite), and every result is still right. A control send of a torch.empty buffer
    is caught, so the fill and the check are live."""
    results = run_world("tests.xpu.xpu_cases:gaps", 2, "xccl", args=(None, True), timeout=170, coll_timeout=40)
    for res in results:
        bad = [(k, d) for k, (ok, d) in res["results"].items() if not ok]
        assert not bad, bad
        assert res["nan"] == []
        assert res["nan_control"] == [("allreduce", "sum", "torch.float32")]
        assert len(res["spy"]) > 50


def premul_trap(rank, n):
    """Rank body: PREMUL_SUM through every entry that reaches a reducing primitive, on the running torch's row
    (eager, FUNCOLL_PROFILE=xccl), on the 2.15 row over the XPU transport class (whatever torch runs), and on a naive
    table that calls PREMUL_SUM native on reduce_scatter (the control: the caller's input is scaled in place)."""
    import dataclasses

    from funcoll import algorithms
    from funcoll.semantics import ReduceOp as R
    from funcoll.transport import xpu
    from tests import reference as ref

    op = ref.c10d_op("premul_sum")
    ins = xpu_cases.inputs(n, torch.float32, (2 * n, 3), 500)
    want_rs = ref.reduce("premul_sum", ins)[2 * rank:2 * rank + 2]
    want_ar = ref.reduce("premul_sum", ins)
    out = {}

    def rs(name, run):
        x = ins[rank].clone()
        o = torch.zeros((2, 3))
        with funcoll.record() as log:
            run(o, x)
        out[name] = (xpu_cases.check(o, want_rs, n, "premul_sum")[0], torch.equal(x, ins[rank]),
                     torch.equal(x, ins[rank] * ref.PREMUL), [s for _, ss in log for s in ss])

    def ar(name, run):
        t = ins[rank].clone()
        with funcoll.record() as log:
            run(t)
        out[name] = (xpu_cases.check(t, want_ar, n, "premul_sum")[0], [s for _, ss in log for s in ss])

    rs("eager reduce_scatter_tensor", lambda o, x: dist.reduce_scatter_tensor(o, x, op=op))
    rs("eager reduce_scatter (list)", lambda o, x: dist.reduce_scatter(o, list(x.chunk(n)), op=op))
    ar("eager all_reduce", lambda t: dist.all_reduce(t, op=op))
    t = ins[rank].clone()
    dist.reduce(t, dst=0, op=op)
    out["eager reduce"] = xpu_cases.check(t, want_ar if rank == 0 else ins[rank], n, "premul_sum" if rank == 0
                                          else "")[0]
    tp, spy = xpu_cases.spied_transport(rank, n, None, "2.15.0", prefix="trap")
    rs("2.15 reduce_scatter_tensor", lambda o, x: algorithms.reduce_scatter_tensor(tp, o, x, op).wait())
    ar("2.15 all_reduce", lambda t: algorithms.all_reduce(tp, t, op).wait())
    out["2.15 calls"] = sorted((p, o) for p, o, _ in tp.calls)
    derived = xpu.derive("2.15.0", None)
    naive = dataclasses.replace(derived, refused_on=derived.refused_on - {("reduce_scatter", R.PREMUL_SUM)})
    tp2, _ = xpu_cases.spied_transport(rank, n, None, caps=naive, prefix="naive")
    rs("naive reduce_scatter_tensor", lambda o, x: algorithms.reduce_scatter_tensor(tp2, o, x, op).wait())
    dist.barrier()
    return out


def test_premul_sum_never_scales_the_callers_input():
    """From torch 2.12, ProcessGroupXCCL does PREMUL_SUM as input.mul_(factor) + SUM on the tensor it is handed;
    under the xccl profile the CPU transport does the same. funcoll hands it only all_reduce (the tensor is the
    output), never reduce_scatter (the caller's input) or reduce: every output is right and no caller's input changes.
    The naive table (PREMUL_SUM native on reduce_scatter) gets the right output and a scaled input: the trap is
    real."""
    results = run_world("tests.xpu.test_xpu_profile:premul_trap", 2, "xccl", timeout=150, coll_timeout=40)
    ar_note = ["native"] if xpu_cases.PREMUL_NATIVE else ["premul_sum=scale+sum"]
    for res in results:
        for name in ("eager reduce_scatter_tensor", "eager reduce_scatter (list)", "2.15 reduce_scatter_tensor"):
            right, unchanged, scaled, notes = res[name]
            assert right and unchanged and not scaled, (name, res[name])
            assert "premul_sum=scale+sum" in notes, (name, notes)
        assert res["eager all_reduce"] == (True, ar_note)
        assert res["eager reduce"] is True
        assert res["2.15 all_reduce"] == (True, ["native"])
        assert ("all_reduce", "premul_sum") in res["2.15 calls"]
        assert ("reduce_scatter", "premul_sum") not in res["2.15 calls"]
        right, unchanged, scaled, notes = res["naive reduce_scatter_tensor"]
        assert right and not unchanged and scaled and notes == ["native"], res["naive reduce_scatter_tensor"]


def test_with_onccl_2022_avg_goes_native_but_reduce_avg_does_not():
    """The version-derived table for oneCCL 2022.0 over the same real backend: AVG on floats is sent natively
    (gloo implements it), integer AVG and AVG-to-one-rank still take funcoll's strategies."""
    results = run_world("tests.xpu.xpu_cases:gaps", 2, "", args=("2022.0",), timeout=170, coll_timeout=40)
    for res in results:
        bad = [(k, d) for k, (ok, d) in res["results"].items() if not ok]
        assert not bad, bad
        assert res["native_avg"]
        torch_minor = ".".join(torch.__version__.split(".")[:2])
        assert res["caps_name"] == f"xccl[torch {torch_minor}, oneCCL 2022.0, scale-out][gloo]"
        avg_calls = {(m, d) for m, op, d, *_ in res["spy"] if op == "avg"}
        # an unknown topology is the scale-out row: AVG on all_reduce only (oneCCL#195), reduce_scatter is filled
        assert avg_calls == {("allreduce", "torch.float32"), ("allreduce", "torch.float16"),
                             ("allreduce", "torch.bfloat16")}
        assert not any(m == "reduce" for m, *_ in res["spy"])  # AVG to one rank went through all_reduce
        assert res["notes"][("all_reduce", "avg", "torch.float32", "xpu_tp")] == ["native"]
        assert res["notes"][("all_reduce", "avg", "torch.int64", "xpu_tp")] == ["avg=int64 sum+truncating divide"]
        assert res["notes"][("reduce", "avg", "torch.float32", "xpu_tp")] == ["reduce=all_reduce"]


def composite(rank, n):
    """Rank body. ``init_process_group("cpu:gloo,xpu:funcoll")``: with torch 2.9 a ProcessGroup-subclass backend
    becomes the whole group, so CPU tensors run through funcoll's own gloo transport and XPU tensors would get the
    XCCL one."""
    pg = dist.group.WORLD
    t = torch.tensor([rank + 1, -(rank + 1)], dtype=torch.int64)
    with funcoll.record() as log:
        dist.all_reduce(t, op=dist.ReduceOp.AVG)
    try:
        pg.transport("xpu")
        xpu_error = None
    except RuntimeError as e:
        xpu_error = str(e)
    return {"pg": type(pg).__name__, "backend": dist.get_backend(), "avg": t.tolist(), "log": log,
            "xpu_error": xpu_error}


def test_composite_backend_string_gives_the_funcoll_group():
    results = run_world("tests.xpu.test_xpu_profile:composite", 2, None, backend="cpu:gloo,xpu:funcoll", timeout=120)
    for res in results:
        assert res["pg"] == "ProcessGroupFuncoll"
        assert res["avg"] == [1, -1]  # (1 + 2) // 2 and -(3 // 2), truncated like NCCL
        assert res["log"] == [("all_reduce", ["avg=int64 sum+truncating divide"])]
        # XPU tensors on this group would get the XCCL transport; this torch has no XCCL
        assert res["xpu_error"].startswith("funcoll: XPU tensors need torch's XCCL backend "
                                           "(torch.distributed.is_xccl_available() is False in torch ")


PROFILES_EVERY = ("gloo", "xccl", "xla", "torchtpu")


def premul_spellings(rank, n):
    """Rank body. PREMUL_SUM spelled ``ReduceOp.PREMUL_SUM(factor)`` (callable on torch 2.15), else
    ``_make_nccl_premul_sum(factor)`` (what torch 2.9 has), with a float and a tensor factor, on a funcoll group of
    every profile: eager all_reduce, reduce_scatter_tensor and reduce; where the functional ops take a ReduceOp
    (2.15: all_reduce, all_reduce_coalesced; reduce_scatter_tensor's reduce_op is a str), functional all_reduce and
    all_reduce_coalesced, through torch's CPU kernel and through funcoll's (install(["cpu"])). Returns
    {(profile, path, factor): (result, caller's input after the call)}."""
    import torch.distributed._functional_collectives as funcol

    callable_op = callable(dist.ReduceOp.PREMUL_SUM)
    spell = dist.ReduceOp.PREMUL_SUM if callable_op else dist._make_nccl_premul_sum
    x = torch.tensor([1.0, 2.0, 3.0, 4.0]) * (rank + 1) - rank
    out = {}
    for prof in PROFILES_EVERY:
        g = dist.new_group(backend="funcoll", pg_options=funcoll.Options(profile=prof))
        for fname, factor in ((0.5, 0.5), ("tensor(0.25)", torch.tensor(0.25))):
            t = x.clone()
            dist.all_reduce(t, op=spell(factor), group=g)
            out[(prof, "all_reduce", fname)] = (t.tolist(), None)
            inp, o = x.clone(), torch.empty(2)
            dist.reduce_scatter_tensor(o, inp, op=spell(factor), group=g)
            out[(prof, "reduce_scatter_tensor", fname)] = (o.tolist(), inp.tolist())
            t = x.clone()
            dist.reduce(t, dst=1, op=spell(factor), group=g)
            if rank == 1:
                out[(prof, "reduce", fname)] = (t.tolist(), None)
            if callable_op:
                for kernel in ("torch", "funcoll"):
                    if kernel == "funcoll":
                        funcoll.install(["cpu"])
                    before = len(funcoll.flight_recorder.entries(g))
                    try:
                        inp = x.clone()
                        y = funcol.wait_tensor(funcol.all_reduce(inp, spell(factor), g))
                        ys = [funcol.wait_tensor(t) for t in funcol.all_reduce_coalesced(
                            [inp[:1], inp[1:]], spell(factor), g)]
                    finally:
                        if kernel == "funcoll":
                            funcoll.uninstall(["cpu"])
                    # torch's CPU kernel calls the group (its flight recorder counts the calls); funcoll's does not
                    out[(prof, f"group calls ({kernel} kernel)", fname)] = (
                        len(funcoll.flight_recorder.entries(g)) - before, None)
                    out[(prof, f"functional all_reduce ({kernel} kernel)", fname)] = (y.tolist(), inp.tolist())
                    out[(prof, f"functional all_reduce_coalesced ({kernel} kernel)", fname)] = (
                        torch.cat(ys).tolist(), inp.tolist())
    return out


def test_premul_sum_callable_and_factory_spellings_on_every_profile():
    """Every result against the sum over the ranks of factor * input (computed here), every caller's input left as it
    was; the functional calls reach both torch's kernel (which calls the group) and funcoll's (which does not). torch
    2.9 has no callable ``ReduceOp.PREMUL_SUM`` (its RedOpType is not callable) and its functional ops take a str:
    there the factory spelling runs the eager calls."""
    results = run_world("tests.xpu.test_xpu_profile:premul_spellings", 2, None, timeout=170, coll_timeout=40)
    ins = [[1.0, 2.0, 3.0, 4.0], [1.0, 3.0, 5.0, 7.0]]
    callable_op = callable(dist.ReduceOp.PREMUL_SUM)
    for rank, res in enumerate(results):
        calls = {(prof, path, f): res.pop((prof, path, f))[0] for prof, path, f in list(res)
                 if path.startswith("group calls")}
        assert {(path, n) for (_, path, _), n in calls.items()} == (
            {("group calls (torch kernel)", 2), ("group calls (funcoll kernel)", 0)} if callable_op else set())
        paths = {path for _, path, _ in res}
        want_paths = {"all_reduce", "reduce_scatter_tensor"} | ({"reduce"} if rank == 1 else set())
        if callable_op:
            want_paths |= {f"functional {op} ({k} kernel)" for op in ("all_reduce", "all_reduce_coalesced")
                           for k in ("torch", "funcoll")}
        assert paths == want_paths
        assert {(p, f) for p, _, f in res} == {(p, f) for p in PROFILES_EVERY
                                               for f in (0.5, "tensor(0.25)")}
        for (prof, path, fname), (got, inp_after) in res.items():
            f = float(str(fname).replace("tensor(", "").rstrip(")"))
            total = [f * (a + b) for a, b in zip(*ins)]
            want = total[2 * rank:2 * rank + 2] if path == "reduce_scatter_tensor" else total
            assert got == want, (prof, path, fname, got, want)
            assert inp_after is None or inp_after == ins[rank], (prof, path, fname, inp_after)


def functional_premul(rank, n):
    """Rank body. ``funcol.all_reduce(t, PREMUL_SUM(2.0), group)`` (a ReduceOp object handed to the functional
    collective) on a funcoll group of the native and xccl profiles, spelled as each torch has it; what it gives, or what
    it raises and whether the group saw anything (its flight recorder, its transport's calls)."""
    import torch.distributed._functional_collectives as funcol

    out = {}
    x = torch.tensor([1.0, -2.0, 3.5, 0.25]) * (rank + 1)
    try:
        out["spelled"] = ("ReduceOp.PREMUL_SUM(2.0)", dist.ReduceOp.PREMUL_SUM(2.0))
    except TypeError as e:  # torch 2.9: RedOpType members are not callable
        out["PREMUL_SUM(2.0)"] = (type(e).__name__, str(e))
        out["spelled"] = ("_make_nccl_premul_sum(2.0)", dist._make_nccl_premul_sum(2.0))
    how, op = out.pop("spelled")
    out["how"] = how
    for prof in ("gloo", "xccl"):
        g = dist.new_group(backend="funcoll", pg_options=funcoll.Options(profile=prof))
        seen, calls = len(funcoll.flight_recorder.entries(g)), sum(g.transport("cpu").calls.values())
        t = x.clone()
        try:
            out[(prof, "result")] = funcol.wait_tensor(funcol.all_reduce(t, op, g)).tolist()
        except Exception as e:  # noqa: BLE001 - the upstream error is what the test pins
            out[(prof, "result")] = (type(e).__name__, str(e))
        out[(prof, "reached funcoll")] = (len(funcoll.flight_recorder.entries(g)) - seen,
                                          sum(g.transport("cpu").calls.values()) - calls)
        out[(prof, "input after")] = t.tolist()
    return out


def test_functional_all_reduce_with_a_premul_sum_object_per_torch_version():
    """torch 2.15: ``ReduceOp.PREMUL_SUM(factor)`` is callable and the functional all_reduce takes the ReduceOp it
    makes: 2 x the sum of the inputs (computed here), through torch's CPU kernel, which calls the funcoll group once.
    torch 2.9: neither, and both raise inside torch before funcoll is reached: ``ReduceOp.PREMUL_SUM(2.0)`` is a
    TypeError (its RedOpType is not callable), and the functional all_reduce calls ``reduceOp.lower()`` on the ReduceOp
    that ``_make_nccl_premul_sum(2.0)`` makes, an AttributeError (pytorch/pytorch#190942 let it take a ReduceOp;
    intel/torch-xpu-ops#4713 tracked the same error on XPU)."""
    res = run_world("tests.xpu.test_xpu_profile:functional_premul", 2, None, timeout=120)
    callable_op = callable(dist.ReduceOp.PREMUL_SUM)
    ins = [[1.0, -2.0, 3.5, 0.25], [2.0, -4.0, 7.0, 0.5]]
    want = [2.0 * (a + b) for a, b in zip(*ins)]
    for rank, got in enumerate(res):
        if callable_op:
            assert got["how"] == "ReduceOp.PREMUL_SUM(2.0)"
        else:
            assert got["how"] == "_make_nccl_premul_sum(2.0)"
            assert got["PREMUL_SUM(2.0)"] == ("TypeError", "'torch._C._distributed_c10d.RedOpType' object is not "
                                                           "callable")
        for prof in ("gloo", "xccl"):
            if callable_op:
                assert got[(prof, "result")] == want, (rank, prof, got)
                assert got[(prof, "reached funcoll")][0] == 1, (rank, prof, got)  # one all_reduce on the group
            else:
                assert got[(prof, "result")] == (
                    "AttributeError", "'torch._C._distributed_c10d.ReduceOp' object has no attribute 'lower'"), got
                assert got[(prof, "reached funcoll")] == (0, 0), (rank, prof, got)
            assert got[(prof, "input after")] == ins[rank], (rank, prof)
