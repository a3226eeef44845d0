"""funcoll's ``tpu`` transport class (:class:`funcoll.transport.tpu.TpuTransport`, with the torch_tpu 0.2 row of the
fact table) driving a stand-in for TorchTPU's ProcessGroupTpu (tests/torchtpu/torchtpu_cases.py: ProcessGroupTpu's
refusals with its exact messages, and its wrong answers, over a real gloo backend), on 2 and 3 CPU ranks.

Every op x reduce op x dtype and every move equals the independent reference, nothing the stand-in refuses or gets
wrong ever reaches it (it would raise, or the numbers would differ), and funcoll's answers to what ProcessGroupTpu
gets wrong (integer AVG, a broadcast of -0.0) are checked directly. The stand-in's own messages and wrong answers
are not tested here: they are the reading of TorchTPU's wheel it was written from, not ProcessGroupTpu.
"""

import pytest

from funcoll.launch import run_world
from tests.torchtpu.torchtpu_cases import check_torchtpu_strategies

REFUSED_OR_WRONG = {("allreduce", "avg"), ("_reduce_scatter_base", "avg")}


@pytest.fixture(scope="module", params=[2, 3], ids=["2ranks", "3ranks"])
def worlds(request):
    return request.param, run_world("tests.torchtpu.torchtpu_cases:standin_world", request.param, None, timeout=300,
                                    coll_timeout=40)


@pytest.fixture
def world(worlds):
    n, results = worlds
    return n, [r["cases"] for r in results]


def test_every_result_equals_the_reference(world):
    n, results = world
    failures = [f for r in results for f in r["failures"]]
    assert not failures, f"{len(failures)} failing cases:\n" + "\n".join(failures[:30])
    assert results[0]["count"] > 350


def test_nothing_processgrouptpu_refuses_or_gets_wrong_reaches_it(world):
    n, results = world
    for r in results:
        log = r["log"]
        methods = {m for m, *_ in log}
        assert {"allreduce", "_allgather_base", "_reduce_scatter_base", "alltoall_base", "gather", "barrier",
                "send", "recv"} <= methods, methods
        assert not methods & {"broadcast", "scatter"}, methods  # zeros + SUM: -0.0 lost; funcoll's are bit-exact
        for method, op, dtype, uneven in log:
            assert op != "premul_sum", (method, dtype)
            # AVG reaches ProcessGroupTpu only where its sum-then-divide is right: float32 / float64
            assert op != "avg" or dtype in ("torch.float32", "torch.float64"), (method, op, dtype)
            assert not uneven, (method, dtype)  # no store round trip per call, no symmetric-buffer rule
        assert r["tp_calls"] == len(log)  # the transport's counter agrees with what the backend received
        check_torchtpu_strategies(r["strategies"])
        assert "uneven all_to_all=pad to static bound 2+even all_to_all+unpad" in r["strategies"], r["strategies"]


def test_calls_answered_without_a_work_are_complete(worlds):
    """ProcessGroupTpu returns a Work only for asynchronous calls; a stand-in answering every call without one gets
    the same results through the transport."""
    for r in [r["sync"] for r in worlds[1]]:
        assert not r["failures"], r["failures"][:10]
        assert r["count"] > 30


def test_funcoll_answers_where_processgrouptpu_gets_it_wrong_and_the_transport_refuses_natively(worlds):
    """What funcoll gives for the requests ProcessGroupTpu 0.2 gets wrong (as read from its wheel: AVG summed in the
    dtype, broadcast as zeros + SUM), and the transport's refusal of what the fact table does not hand over, before
    the stand-in is called."""
    n, results = worlds
    for out in (r["controls"] for r in results):
        # int8 AVG of n times 100: funcoll sums in int64 (summed in int8 it would wrap)
        assert out["funcoll int8 avg of 100s"] == [100, 100]
        # the root's -0.0 arrives as -0.0 (zeros + SUM would give +0.0)
        assert out["funcoll broadcast of -0.0"] == ["-0.0", "1.0"]
        assert out["transport reduce"].startswith("NativeRefused: funcoll internal error: torchtpu[0.2.0][gloo] "
                                                  "transport was asked for native reduce(")
        assert out["transport premul"].startswith("NativeRefused: ")
        assert out["transport int avg"].startswith("NativeRefused: ")
        assert out["transport uneven"].endswith("with uneven splits, which it does not have")
        assert out["stand-in calls after refusals"] == 0
