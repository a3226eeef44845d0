"""funcoll's XLA lowering executed at world 2, 4 and 8 on the XLA CPU runtime (funcoll.replicas, jaxlib), every
number checked against tests/reference.py (bit for bit for integers, bool and data movement).

Each world runs in a fresh interpreter (``tests.xla.xla_replica_cases:funcoll_world``, run by tests/fresh.py): every
rank of a virtual world of N ranks builds its program, then the programs run on N CPU replicas. One module holds every
case whose program is the same on every rank: all_reduce with every reduce op funcoll serves on XLA (AVG, PREMUL_SUM,
bitwise via all_to_all + local reduce + all_gather, bool xor as a count, int16 and unsigned) for every dtype at world
2 and seven at 4 and 8, on 15 elements (divisible by no world size) and 8, all_gather_into_tensor,
reduce_scatter_tensor, even all_to_all_single, broadcast, coalesced and in-place forms, a mesh's registered partitions
and aligned ``new_subgroups``, and (worlds 2 and 4) three steps of a compiled training step. A second program depends
on the rank (uneven all_to_all_single padded to the agreed bound and to a static bound, ``reduce`` keeping its result
on dst only, groups that only their members call, padded with singletons): each rank's own module runs in its own
process. Then torch_xla's own kernels are run the same way, side by side.
"""

import os

import pytest

from tests import fresh
from tests.xla.replica_runs import XLA_CPU, skip_without_replicas

skip_without_replicas()

pytestmark = pytest.mark.xla
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
WORLDS = (2, 4, 8)
_cache: dict = {}


def doc_example() -> int:
    """Runs the first Python block of docs/xla-replicas.md as a script (its asserts check every rank's average)."""
    page = open(os.path.join(ROOT, "docs", "xla-replicas.md")).read()
    code = page.split("```python\n", 1)[1].split("```", 1)[0]
    exec(compile(code, "docs/xla-replicas.md", "exec"), {"__name__": "__main__"})
    return 0


def results() -> dict:
    """Every fresh interpreter's result, all started at once (one run for every test of this file)."""
    if not _cache:
        cases = "tests.xla.xla_replica_cases:"
        runs = {f"world {n}": (cases + "funcoll_world", n) for n in WORLDS}
        runs.update({"side by side": (cases + "side_by_side", 4), "unsupported": (cases + "unsupported",),
                     "doc example": ("tests.xla.test_xla_replicas:doc_example",)})
        _cache.update(fresh.run_all(runs, env=XLA_CPU, timeout=900))
    return _cache


# the number of checks per world (each rank's outputs, each against its reference): a case that silently stopped
# running would lower it
COUNTS = {2: 462, 4: 534, 8: 1030}


@pytest.mark.parametrize("n", WORLDS)
def test_every_strategy_executed_matches_the_reference(n):
    got = results()[f"world {n}"]
    assert got["failures"] == [], "\n".join(got["failures"][:30])
    assert got["count"] == COUNTS[n]


@pytest.mark.parametrize("n", WORLDS)
def test_one_module_for_every_rank_except_where_the_program_depends_on_the_rank(n):
    got = results()[f"world {n}"]
    # the cases of the first program compile to the same module on every rank (rank-dependent values are parameters)
    assert got["same"][0] is True, got["why"][0]
    # an uneven all_to_all pads and slices by the rank's own splits: rank 1 sends and receives other sizes than rank 0
    assert got["same"][1] is False
    assert got["why"][1].startswith("rank 1's module differs from rank 0's at ")


def test_torch_xla_kernels_side_by_side():
    rows = results()["side by side"]
    # funcoll: right on the world and on every block of the mesh dim
    for name, row in rows.items():
        assert row.get("right funcoll") is True, (name, row)
    # torch_xla 2.9's kernels: right on the world; on a group they sum the whole world or build HLO that XLA rejects,
    # and avg raises
    assert rows["all_reduce sum, world"]["right torch_xla"] is True
    assert rows["all_reduce sum, tp group"]["right torch_xla"] is False
    assert rows["all_reduce sum, tp group"]["torch_xla"] == [rows["all_reduce sum, world"]["want"][0]] * 4
    assert rows["all_gather_into_tensor, tp group"]["torch_xla"].startswith(
        "raises ReplicaRuntimeError: funcoll.replicas: the XLA CPU runtime cannot compile instruction %all-gather")
    assert rows["reduce_scatter_tensor sum, tp group"]["torch_xla"].startswith(
        "raises ReplicaRuntimeError: funcoll.replicas: the XLA CPU runtime cannot compile instruction %reduce-scatter")
    assert rows["all_reduce avg, world"]["torch_xla"] == "raises RuntimeError: Unknown AllReduce type: avg"
    assert rows["all_to_all_single, tp group"]["torch_xla"] == (
        "raises RuntimeError: torch_xla does not support arbitrary split sizes for all_to_all")


def test_an_instruction_the_cpu_runtime_cannot_run_is_named():
    assert results()["unsupported"]["tpu custom call"] == (
        'funcoll.replicas: the XLA CPU runtime cannot compile instruction %custom-call.13 = f32[4]{0} '
        'custom-call(f32[4]{0} %get-tuple-element.11), custom_call_target="tpu_custom_call", '
        'operand_layout_constraints={f32[4]{0}}, backend_config={} (module 0): JaxRuntimeError: NOT_FOUND: No '
        'registered implementation for untyped custom call to tpu_custom_call for Host')


def test_the_doc_example_runs():
    # its asserts (every rank's average) ran in the fresh interpreter
    assert results()["doc example"] == 0


def test_a_graph_that_already_ran_is_refused():
    # torch.compile(backend="openxla") compiles and runs its graph at once, on the process's one replica
    assert results()["unsupported"]["openxla"] == (
        "funcoll.replicas: rank 0's results hold no computation to run: their graph already ran on this process's "
        "single replica (torch_xla.sync(), .cpu(), or torch.compile(backend='openxla'), which compiles and runs its "
        "graph at once); build them lazily (compile with backend='aot_eager')")


_CHATTY_WORKER = '''
import os, pickle, sys, time
mode, job, out, rank = sys.argv[1:5]
done = os.path.join(os.path.dirname(out), "rank1.done")
if rank == "1":  # far more output than a pipe holds, then what rank 0 waits for
    sys.stderr.write("x" * 1_000_000)
    sys.stderr.flush()
    open(done, "w").close()
else:
    end = time.monotonic() + 60
    while not os.path.exists(done) and time.monotonic() < end:
        time.sleep(0.01)
with open(out, "wb") as f:
    pickle.dump({"outputs": [[[]]]}, f)
'''


def test_a_rank_that_writes_much_output_does_not_stall_the_others(tmp_path, monkeypatch):
    """Each rank's process of a rank-dependent world writes as much as it likes while the runner waits on another
    rank (whose collective waits for it): the runner reads nothing from a pipe that could fill up."""
    from funcoll import replicas

    worker = tmp_path / "worker.py"
    worker.write_text(_CHATTY_WORKER)
    monkeypatch.setattr(replicas, "_WORKER", str(worker))
    world = replicas.World(2, [replicas.RankProgram(r, b"", f"HloModule m\nrank {r}", []) for r in range(2)])
    assert not world.same  # one process per rank
    assert replicas.execute(world, timeout=20) == [[], []]
