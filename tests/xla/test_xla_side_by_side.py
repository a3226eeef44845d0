"""The same programs through torch_xla 2.9's own kernels and through funcoll's, side by side, so the difference
stays visible (docs/xla.md has the table).

Compiled path: a virtual 4-rank world (rank 1) calls the ``_c10d_functional`` ops first with torch_xla's kernels,
then after ``funcoll.install(["xla"])``, then after ``funcoll.uninstall()`` (torch_xla's behaviour is back).
Eager path: on a 1-replica world (executed), torch_xla's ProcessGroupXla next to funcoll's process group: what
raises, and how many graph executions a call causes before any result is read.
"""

import pytest

pytest.importorskip("torch_xla", reason="needs torch_xla (the XLA transport); runs on PJRT_DEVICE=CPU")
import expecttest  # noqa: E402

from tests import fresh  # noqa: E402
from tests.xla.replica_runs import XLA_CPU  # noqa: E402

pytestmark = pytest.mark.xla
_cache: dict = {}


def results():
    if not _cache:
        runs = {"functional": ("tests.xla.xla_cases:side_by_side", 4, 1),
                "eager": ("tests.xla.xla_cases:process_group_xla",)}
        _cache.update(fresh.run_all(runs, env=XLA_CPU, timeout=240))
    return _cache


def table(rows: dict, columns) -> str:
    return "\n".join(f"-- {name}\n" + "\n".join(f"[{c}] {row[c]}" for c in columns) for name, row in rows.items())


class TestSideBySide(expecttest.TestCase):
    maxDiff = None

    def test_functional_ops_torch_xla_vs_funcoll(self):
        # torch_xla: the group is ignored (replica_groups={} is the whole world; a gather takes ranks 0..n-1),
        # avg/bxor/uneven splits/in-place raise, broadcast multiplies by 0/1 and, in a world whose runtime has one
        # replica, builds no collective at all (xm.all_reduce skips it)
        self.assertExpectedInline(table(results()["functional"], ("torch_xla", "funcoll")), """\
-- all_reduce sum on group [0, 1]
[torch_xla] all-reduce(f32[4], f32[]) -> (f32[4],f32[])  replica_groups={} to_apply=add
[funcoll] all-reduce(f32[4], f32[]) -> (f32[4],f32[])  replica_groups={{0,1},{2,3}} to_apply=add
-- all_reduce avg
[torch_xla] raises RuntimeError: Unknown AllReduce type: avg
[funcoll] all-reduce(f32[4], f32[]) -> (f32[4],f32[])  replica_groups={} to_apply=add
divide(f32[4], f32[4]) -> f32[4]
-- all_reduce bxor int32
[torch_xla] raises RuntimeError: Unknown AllReduce type: bxor
[funcoll] all-to-all(s32[1], s32[1], s32[1], s32[1]) -> (s32[1],s32[1],s32[1],s32[1])  replica_groups={}
all-gather(s32[1]) -> s32[4]  replica_groups={} dimensions={0}
-- all_gather_into_tensor on group [0, 1]
[torch_xla] all-gather(f32[4]) -> f32[8]  replica_groups={{0,1}} dimensions={0}
[funcoll] all-gather(s32[4]) -> s32[8]  replica_groups={{0,1},{2,3}} dimensions={0}
-- all_to_all_single uneven
[torch_xla] raises RuntimeError: torch_xla does not support arbitrary split sizes for all_to_all
[funcoll] all-to-all(s32[3], s32[3], s32[3], s32[3]) -> (s32[3],s32[3],s32[3],s32[3])  replica_groups={}
-- broadcast src=1 on group [0, 1]
[torch_xla] multiply(f32[4], f32[4]) -> f32[4]
[funcoll] all-reduce(s32[4], s32[]) -> (s32[4],s32[])  replica_groups={{0,1},{2,3}} to_apply=add
-- all_reduce_ (in place)
[torch_xla] raises RuntimeError: Found a custom (non-ATen) operator whose output has alias annotations: \
_c10d_functional::all_reduce_(Tensor(a!) input, str reduce_op, str group_name) -> Tensor(a!) ...
[funcoll] all-reduce(f32[4], f32[]) -> (f32[4],f32[])  replica_groups={} to_apply=add""")

    def test_uninstall_restores_torch_xla_behaviour(self):
        rows = results()["functional"]
        assert {name: row["after_uninstall"] for name, row in rows.items()} == \
            {name: row["torch_xla"] for name, row in rows.items()}
        assert any(row["torch_xla"] != row["funcoll"] for row in rows.values())

    def test_eager_process_group_xla_vs_funcoll(self):
        # split sizes passed: the ranks agree on the largest split first (one graph execution: a rank cannot know that
        # its peers' splits are equal too), unless every rank promised a static split bound
        self.assertExpectedInline(table(results()["eager"], ("ProcessGroupXla", "funcoll")), """\
-- all_reduce AVG
[ProcessGroupXla] raises ValueError: Invalid reduce op <torch.distributed.distributed_c10d.ReduceOp object>
[funcoll] 0 graph execution(s) before any result is read
-- all_reduce PREMUL_SUM
[ProcessGroupXla] raises ValueError: Invalid reduce op <torch.distributed.distributed_c10d.ReduceOp object>
[funcoll] 0 graph execution(s) before any result is read
-- all_reduce BXOR
[ProcessGroupXla] raises NotImplementedError: reduce op <torch.distributed.distributed_c10d.ReduceOp object>
[funcoll] 0 graph execution(s) before any result is read
-- all_to_all_single with split sizes
[ProcessGroupXla] raises AssertionError: XLA doesn't support specifying non-empty output_split_sizes and \
input_split_sizes
[funcoll] 1 graph execution(s) before any result is read
-- all_to_all_single with split sizes, static_split_bound(4)
[ProcessGroupXla] raises AssertionError: XLA doesn't support specifying non-empty output_split_sizes and \
input_split_sizes
[funcoll] 0 graph execution(s) before any result is read
-- all_reduce_coalesced
[ProcessGroupXla] raises NotImplementedError: 
[funcoll] 0 graph execution(s) before any result is read
-- reduce
[ProcessGroupXla] 1 graph execution(s) before any result is read
[funcoll] 0 graph execution(s) before any result is read
-- gather
[ProcessGroupXla] 1 graph execution(s) before any result is read
[funcoll] 0 graph execution(s) before any result is read""")  # noqa: W291 (the empty exception message above)
