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
from tests import xpu_cases

UNCARRIED = {str(d) for d in (torch.int16, torch.uint16, torch.uint32, torch.uint64)} | {str(d) for d in FLOAT8}
INT_NAMES = {str(d) for d in (torch.int8, torch.uint8, torch.int32, torch.int64, torch.bool)}


@pytest.fixture(scope="module", params=[2, 3], ids=["2ranks", "3ranks"])
def world(request):
    return request.param, run_world("tests.xpu_cases:gaps", request.param, "xccl", timeout=170, coll_timeout=40)


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
                # the first same-width dtype XCCL carries (no 16-bit integer: float16 bits)
                width = {1: "torch.uint8", 2: "torch.float16", 4: "torch.int32", 8: "torch.int64"}
                carrier = width[dtype.itemsize]
                # recorded once per call (the output and input views of all_gather share the note)
                assert notes == [f"{dtype} moved as {carrier}"], (kind, dtype, notes)
        for dtype in (torch.float32, torch.int16, torch.float8_e5m2, torch.uint64):
            for path in ("eager", "xpu_tp", "xpu_key"):
                notes = res["notes"][("all_to_all_uneven", "", str(dtype), path)]
                assert "uneven all_to_all=pairwise send/recv" in notes, notes
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
            assert op not in ("avg", "premul_sum", "band", "bor", "bxor"), (prim, op)
            assert not (op in ("min", "max") and dtype in INT_NAMES), (prim, op, dtype)


def test_with_onccl_2022_avg_goes_native_but_reduce_avg_does_not():
    """The version-derived table for oneCCL 2022.0 over the same real backend: AVG on floats is sent natively
    (gloo implements it), integer AVG and AVG-to-one-rank still take funcoll's strategies."""
    results = run_world("tests.xpu_cases:gaps", 2, "", args=("2022.0",), timeout=170, coll_timeout=40)
    for res in results:
        bad = [(k, d) for k, (ok, d) in res["results"].items() if not ok]
        assert not bad, bad
        assert res["native_avg"]
        assert res["caps_name"] == f"xccl[torch {'.'.join(torch.__version__.split('.')[:2])}, oneCCL 2022.0, scale-out][gloo]"
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
    results = run_world("tests.test_xpu_profile:composite", 2, None, backend="cpu:gloo,xpu:funcoll", timeout=120)
    for res in results:
        assert res["pg"] == "ProcessGroupFuncoll"
        assert res["avg"] == [1, -1]  # (1 + 2) // 2 and -(3 // 2), truncated like NCCL
        assert res["log"] == [("all_reduce", ["avg=int64 sum+truncating divide"])]
        # XPU tensors on this group would get the XCCL transport; this torch has no XCCL
        assert res["xpu_error"].startswith("funcoll: XPU tensors need torch's XCCL backend "
                                           "(torch.distributed.is_xccl_available() is False in torch ")
