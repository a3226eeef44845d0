"""torch's own debugging tools work on funcoll groups, on every torch version funcoll supports.

- The flight recorder: with ``TORCH_FR_DUMP_TEMP_FILE`` set, every rank writes its funcoll groups' recent collectives
  in torch's format (on a timeout, when a group is destroyed, at exit), and torch's analyser
  (``python -m torch.distributed.flight_recorder.fr_trace DIR``, shipped with torch 2.15) names the collective a rank
  never joined, its group, its sequence number and the missing rank. funcoll records itself (it declares itself a
  self-recording backend to torch >= 2.15, which then attaches no hook of its own), so each collective is recorded
  once.
- ``TORCH_DIST_NAN_CHECK=1``: a floating input holding a NaN is refused on the calling rank before anything is sent,
  with torch's message.
"""

from __future__ import annotations

import os
import pickle
import subprocess
import sys

import pytest

from funcoll.launch import _spawn_world


def _rank_hang(rank, n):
    """Five collectives on both ranks, then an all_reduce that rank 1 never joins."""
    import time

    import torch
    import torch.distributed as dist

    t = torch.ones(4)
    for _ in range(3):
        dist.all_reduce(t)
    dist.broadcast(t, 0)
    dist.all_gather_into_tensor(torch.empty(8), t)
    if rank == 0:
        try:
            dist.all_reduce(t)
        except Exception as e:  # noqa: BLE001 - reported to the parent
            return type(e).__name__
        return "no error"
    time.sleep(5)  # rank 0 times out meanwhile; this rank writes its dump when its group is destroyed
    return "skipped"


@pytest.fixture(scope="module")
def hung_world(tmp_path_factory):
    where = tmp_path_factory.mktemp("fr")
    res = _spawn_world("tests.faults.test_torch_debug_tools:_rank_hang", 2, deadline=90, coll_timeout=3,
                       env={"TORCH_FR_DUMP_TEMP_FILE": str(where / "trace_"), "FUNCOLL_TRACE_DIR": None})
    results, codes, hung = res
    assert not hung and codes == [0, 0], (codes, hung, results)
    assert [r[1] for r in results] == ["CollectiveTimeoutError", "skipped"], results
    return where


def test_every_rank_dumps_its_groups_in_torch_format(hung_world):
    files = sorted(os.listdir(hung_world))
    assert files == ["trace_0", "trace_1"]
    dumps = [pickle.load(open(hung_world / f, "rb")) for f in files]
    for d in dumps:
        assert set(d) == {"version", "pg_config", "pg_status", "comm_lib_version", "entries"}
        assert d["pg_config"] == {"0": {"name": "0", "desc": "default_pg", "ranks": "[0, 1]"}}
    ops = [[(e["collective_seq_id"], e["profiling_name"], e["state"]) for e in d["entries"]] for d in dumps]
    both = [(0, "funcoll:all_reduce", "completed"), (1, "funcoll:all_reduce", "completed"),
            (2, "funcoll:all_reduce", "completed"), (3, "funcoll:broadcast", "completed"),
            (4, "funcoll:_all_gather_base", "completed")]
    assert ops[0] == both + [(5, "funcoll:all_reduce", "scheduled")]
    assert ops[1] == both
    gather = dumps[0]["entries"][4]
    assert (gather["input_sizes"], gather["output_sizes"], gather["input_dtypes"]) == ([[4]], [[8]], ["Float"])
    assert dumps[0]["entries"][5]["process_group"] == ("0", "default_pg")
    assert dumps[0]["entries"][5]["timeout_ms"] == 3000
    assert dumps[0]["pg_status"] == {"0": {"last_enqueued_collective": 5, "last_started_collective": -1,
                                           "last_completed_collective": 4}}


def test_torchs_analyser_names_the_collective_its_group_and_the_missing_rank(hung_world):
    try:
        import torch.distributed.flight_recorder.fr_trace  # noqa: F401
    except ImportError:
        pytest.skip("this torch ships no flight-recorder analyser (torch.distributed.flight_recorder: 2.15 and newer)")
    out = subprocess.run([sys.executable, "-m", "torch.distributed.flight_recorder.fr_trace", str(hung_world)],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    lines = [ln.strip() for ln in (out.stdout + out.stderr).splitlines()]  # the analyser reports through logging
    i = lines.index("Not all ranks joining collective, sequence number: 5")
    assert lines[i + 2:i + 5] == ["group info: 0:default_pg", "collective: funcoll:all_reduce", "missing ranks: {1}"]
    assert "input sizes: [[4]]" in lines[i:]


def _rank_nan(rank, n):
    import torch
    import torch.distributed as dist

    nan = torch.tensor([1.0, float("nan")])
    refused = {}
    for name, call in [("all_reduce", lambda: dist.all_reduce(nan)),
                       ("broadcast", lambda: dist.broadcast(nan, 0)),
                       ("all_gather_into_tensor", lambda: dist.all_gather_into_tensor(torch.empty(4), nan)),
                       ("reduce_scatter_tensor", lambda: dist.reduce_scatter_tensor(torch.empty(1), nan)),
                       ("all_to_all_single", lambda: dist.all_to_all_single(torch.empty(2), nan)),
                       ("send", lambda: dist.send(nan, 1 - rank) if rank == 0 else None),
                       ("all_reduce_async", lambda: dist.all_reduce(nan, async_op=True))]:
        try:
            call()
            refused[name] = None
        except RuntimeError as e:
            refused[name] = str(e)
    ints = torch.tensor([rank, 1], dtype=torch.int32)
    dist.all_reduce(ints)  # integers hold no NaN: sent
    finite = torch.tensor([1.0, 2.0]) * (rank + 1)
    dist.all_reduce(finite)  # nothing of the refused calls was sent: the ranks are still in step
    return refused, ints.tolist(), finite.tolist()


def test_nan_check_refuses_a_nan_input_before_sending():
    results, codes, hung = _spawn_world("tests.faults.test_torch_debug_tools:_rank_nan", 2, deadline=90,
                                        coll_timeout=10, env={"TORCH_DIST_NAN_CHECK": "1"})
    assert not hung and codes == [0, 0], (codes, results)
    for rank, (state, (refused, ints, finite)) in enumerate(results):
        assert state == "ok"
        expect = {"all_reduce", "broadcast", "all_gather_into_tensor", "reduce_scatter_tensor", "all_to_all_single",
                  "all_reduce_async"} | ({"send"} if rank == 0 else set())
        assert {k for k, v in refused.items() if v is not None} == expect
        op = {"all_reduce": "all_reduce", "all_reduce_async": "all_reduce"}
        for name in expect:
            assert refused[name] == (
                f"NaN found in input tensor. (funcoll: {op.get(name, name)} on group '0', rank {rank} of 2; "
                "TORCH_DIST_NAN_CHECK=1; nothing was sent)")
        assert ints == [1, 2] and finite == [3.0, 6.0]


def _rank_nan_unchecked(rank, n):
    import torch
    import torch.distributed as dist

    t = torch.tensor([1.0, float("nan")])
    dist.all_reduce(t)
    return [str(v) for v in t.tolist()]


def test_without_the_nan_check_a_nan_is_reduced_as_gloo_does():
    results, codes, hung = _spawn_world("tests.faults.test_torch_debug_tools:_rank_nan_unchecked", 2, deadline=60,
                                        coll_timeout=10, env={"TORCH_DIST_NAN_CHECK": None})
    assert not hung and codes == [0, 0]
    assert [r[1] for r in results] == [["2.0", "nan"], ["2.0", "nan"]]
