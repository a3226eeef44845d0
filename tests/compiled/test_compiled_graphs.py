"""Compiled graphs of every collective on a real 2-rank funcoll world (CPU, gloo), through funcoll.testing.

One world runs tests.compiled.cases_compiled:graphs: every functional op, the eager-style in-place calls users write
(dist.all_reduce(t), ..., dist.broadcast), the autograd variants (forward and backward) and the raw
in-place/out variants. Their graphs are snapshotted (group names normalised: the same text on both ranks and
on two captures), their collectives listed, their compile counts checked (one graph, no break, no
recompilation over three steps), and their numbers checked on the ranks against eager and references.
"""

import expecttest
import pytest
import torch

from funcoll.launch import run_world
from funcoll.testing import Collective


@pytest.fixture(scope="module")
def world():
    return run_world("tests.compiled.cases_compiled:graphs", 2, None, timeout=300)


def swap_splits(text):
    """Rank 1's graph is rank 0's with its (rank-dependent) uneven split sizes."""
    return text.replace("[1, 3], [1, 3]", "[3, 1], [3, 1]").replace("=[1, 3]", "=[3, 1]")


def test_numbers_compiled_equal_eager_and_references(world):
    for r in world:
        assert r["failures"] == [], "\n".join(r["failures"])
        # 5 more where upstream's kernel of the out variant runs without funcoll's (torch >= 2.10)
        assert r["count"] == (60 if r["inplace without install"] != "ran" else 65)


def test_graphs_are_the_same_text_on_every_rank_and_every_capture(world):
    r0, r1 = world
    assert r0["every_op stable"] and r1["every_op stable"]
    for key in ("every_op", "autograd forward", "autograd backward", "inplace", "every_op collectives"):
        assert r0[key] == r1[key], key
    for key in ("eager_style dynamo", "eager_style forward"):
        assert r0[key] != r1[key]  # the split sizes are constants of each rank's graph
        assert swap_splits(r0[key]) == r1[key], key


def test_compile_counts_aot_eager(world):
    once = {"graphs": 1, "graph_breaks": 0, "recompiles": 0, "reasons": []}
    for r in world:
        assert r["counts aot_eager"] == {"every_op": once, "eager_style": once, "autograd": once}


def test_every_op_collectives_listed(world):
    f32, bf16, i32 = torch.float32, torch.bfloat16, torch.int32
    g = (0, 1)
    want = [
        Collective("all_reduce", "avg", g, ((f32, (4, 3)),), ((f32, (4, 3)),)),
        Collective("all_reduce_coalesced", "max", g, ((f32, (4, 3)), (bf16, (3,))), ((f32, (4, 3)), (bf16, (3,)))),
        Collective("all_gather_into_tensor", None, g, ((i32, (4,)),), ((i32, (8,)),), (("group_size", 2),)),
        Collective("all_gather_into_tensor_coalesced", None, g, ((f32, (4, 3)), (i32, (4,))),
                   ((f32, (8, 3)), (i32, (8,))), (("group_size", 2),)),
        Collective("reduce_scatter_tensor", "sum", g, ((f32, (4, 3)),), ((f32, (2, 3)),), (("group_size", 2),)),
        Collective("reduce_scatter_tensor_coalesced", "max", g, ((f32, (4, 3)), (i32, (4,))),
                   ((f32, (2, 3)), (i32, (2,))), (("group_size", 2),)),
        Collective("all_to_all_single", None, g, ((f32, (4, 2)),), ((f32, (4, 2)),),
                   (("output_split_sizes", [2, 2]), ("input_split_sizes", [2, 2]))),
        Collective("broadcast", None, g, ((bf16, (3,)),), ((bf16, (3,)),), (("src", 1),)),
    ]
    for r in world:
        assert r["every_op collective values"] == want
        assert r["every_op collectives"] == [str(c) for c in want]


def test_inplace_out_variant_without_funcoll_kernels_on_cpu(world):
    """Upstream's CPU kernel of all_gather_into_tensor_out calls ProcessGroup::_allgather_base in C++, which torch
    2.9's Python ProcessGroup trampoline does not forward to a Python subclass; newer c10d (measured on 2.14.1)
    reaches the group's Python methods, and the numbers are checked on the ranks. funcoll.install(["cpu"]) serves it
    on every torch."""
    for r in world:
        if torch.torch_version.TorchVersion(torch.__version__) < (2, 10):
            assert r["inplace without install"] == "No backend type associated with device type cpu"
        else:
            assert r["inplace without install"] == "ran"


def test_upstream_graphs_are_the_same_with_funcoll_cpu_kernels(world):
    """The AOT/Dynamo graphs are upstream's (they change with every torch release, so they are not pinned here):
    funcoll's kernels on the CPU key sit below them and leave every graph as it was."""
    for r in world:
        assert r["installed every_op same graph"] and r["installed eager_style same graph"]
        assert r["installed autograd same graphs"] == [True, True, True]
        assert r["installed inplace same graph"]


class TestSnapshots(expecttest.TestCase):
    """What funcoll itself puts into a graph: the Dynamo rewrite of ``dist.broadcast`` on a funcoll group (where
    Dynamo lacks one: torch 2.9 through 2.14), as the functional broadcast copied back into the tensor."""

    @pytest.fixture(autouse=True)
    def _world(self, world):
        self.r = world[0]

    def test_broadcast_rewrite_in_the_dynamo_graph(self):
        lines = self.r["eager_style dynamo"].splitlines()
        i = next(k for k, line in enumerate(lines) if "c10d.broadcast(" in line)
        self.assertExpectedInline("\n".join(lines[i:i + 3]), """\
tensor_5 = c10d.broadcast(l_y_, 1, <group 0,1>) -> bfloat16[3]@cpu
wait_tensor_5 = c10d.wait_tensor(tensor_5) -> bfloat16[3]@cpu
copy__5 = l_y_.copy_(wait_tensor_5) -> bfloat16[3]@cpu""")
