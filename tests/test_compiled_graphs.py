"""Compiled graphs of every collective on a real 2-rank funcoll world (CPU, gloo), through funcoll.testing.

One world runs tests.cases_compiled:graphs: every functional op, the eager-style in-place calls users write
(dist.all_reduce(t), ..., dist.broadcast), the autograd variants (forward and backward) and the raw
in-place/out variants. Their graphs are snapshotted (group names normalised: the same text on both ranks and
on two captures), their collectives listed, their compile counts checked (one graph, no break, no
recompilation over three steps), and their numbers checked on the ranks against eager and references.
"""

import expecttest
import pytest
import torch

from funcoll.testing import Collective

from .world import run_world


@pytest.fixture(scope="module")
def world():
    return run_world("tests.cases_compiled:graphs", 2, None, timeout=300)


def swap_splits(text):
    """Rank 1's graph is rank 0's with its (rank-dependent) uneven split sizes."""
    return text.replace("[1, 3], [1, 3]", "[3, 1], [3, 1]").replace("=[1, 3]", "=[3, 1]")


def test_numbers_compiled_equal_eager_and_references(world):
    for r in world:
        assert r["failures"] == [], "\n".join(r["failures"])
        assert r["count"] == 60


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


def test_inplace_out_variant_needs_funcoll_kernels_on_cpu(world):
    # upstream's CPU kernel for all_gather_into_tensor_out calls ProcessGroup::_allgather_base, which torch's
    # Python ProcessGroup trampoline does not forward; with funcoll.install(["cpu"]) it runs (numbers checked)
    for r in world:
        assert r["inplace without install"] == "No backend type associated with device type cpu"


def test_funcoll_cpu_kernels_change_no_graph(world):
    for r in world:
        assert r["installed every_op same graph"] and r["installed eager_style same graph"]


class TestSnapshots(expecttest.TestCase):
    @pytest.fixture(autouse=True)
    def _world(self, world):
        self.r = world[0]

    def test_every_functional_op(self):
        self.assertExpectedInline(self.r["every_op"], """\
arg0_1: float32[4, 3]@cpu
arg1_1: bfloat16[3]@cpu
arg2_1: int32[4]@cpu
arg3_1: float32[4, 2]@cpu
all_reduce = c10d.all_reduce(arg0_1, 'avg', <world>) -> float32[4, 3]@cpu
wait_tensor = c10d.wait_tensor(all_reduce) -> float32[4, 3]@cpu
all_reduce_coalesced = c10d.all_reduce_coalesced([arg0_1, arg1_1], 'max', <world>) -> (float32[4, 3]@cpu, bfloat16[3]@cpu)
getitem = getitem(all_reduce_coalesced, 0) -> float32[4, 3]@cpu
getitem_1 = getitem(all_reduce_coalesced, 1) -> bfloat16[3]@cpu
wait_tensor_1 = c10d.wait_tensor(getitem) -> float32[4, 3]@cpu
wait_tensor_2 = c10d.wait_tensor(getitem_1) -> bfloat16[3]@cpu
all_gather_into_tensor = c10d.all_gather_into_tensor(arg2_1, 2, <group 0,1>) -> int32[8]@cpu
wait_tensor_3 = c10d.wait_tensor(all_gather_into_tensor) -> int32[8]@cpu
all_gather_into_tensor_coalesced = c10d.all_gather_into_tensor_coalesced([arg0_1, arg2_1], 2, <world>) -> (float32[8, 3]@cpu, int32[8]@cpu)
getitem_2 = getitem(all_gather_into_tensor_coalesced, 0) -> float32[8, 3]@cpu
getitem_3 = getitem(all_gather_into_tensor_coalesced, 1) -> int32[8]@cpu
wait_tensor_4 = c10d.wait_tensor(getitem_2) -> float32[8, 3]@cpu
wait_tensor_5 = c10d.wait_tensor(getitem_3) -> int32[8]@cpu
reduce_scatter_tensor = c10d.reduce_scatter_tensor(arg0_1, 'sum', 2, <world>) -> float32[2, 3]@cpu
wait_tensor_6 = c10d.wait_tensor(reduce_scatter_tensor) -> float32[2, 3]@cpu
reduce_scatter_tensor_coalesced = c10d.reduce_scatter_tensor_coalesced([arg0_1, arg2_1], 'max', 2, <world>) -> (float32[2, 3]@cpu, int32[2]@cpu)
getitem_4 = getitem(reduce_scatter_tensor_coalesced, 0) -> float32[2, 3]@cpu
getitem_5 = getitem(reduce_scatter_tensor_coalesced, 1) -> int32[2]@cpu
wait_tensor_7 = c10d.wait_tensor(getitem_4) -> float32[2, 3]@cpu
wait_tensor_8 = c10d.wait_tensor(getitem_5) -> int32[2]@cpu
all_to_all_single = c10d.all_to_all_single(arg3_1, [2, 2], [2, 2], <group 0,1>) -> float32[4, 2]@cpu
wait_tensor_9 = c10d.wait_tensor(all_to_all_single) -> float32[4, 2]@cpu
broadcast = c10d.broadcast(arg1_1, 1, <world>) -> bfloat16[3]@cpu
wait_tensor_10 = c10d.wait_tensor(broadcast) -> bfloat16[3]@cpu
mul = aten.mul.Tensor(wait_tensor, 2) -> float32[4, 3]@cpu
return [mul, wait_tensor_1, wait_tensor_2, wait_tensor_3, wait_tensor_4, wait_tensor_5, wait_tensor_6, wait_tensor_7, wait_tensor_8, wait_tensor_9, wait_tensor_10]""")

    def test_eager_style_calls_dynamo_graph(self):
        self.assertExpectedInline(self.r["eager_style dynamo"], """\
l_x_: float32[4, 3]@cpu
l_y_: bfloat16[3]@cpu
l_z_: int32[4]@cpu
l_w_: float32[4, 2]@cpu
tensor = c10d.all_reduce(l_x_, 'sum', <world>) -> float32[4, 3]@cpu
wait_tensor = c10d.wait_tensor(tensor) -> float32[4, 3]@cpu
copy_ = l_x_.copy_(wait_tensor) -> float32[4, 3]@cpu
tensor_1 = c10d.all_reduce(l_y_, 'avg', <group 0,1>) -> bfloat16[3]@cpu
wait_tensor_1 = c10d.wait_tensor(tensor_1) -> bfloat16[3]@cpu
copy__1 = l_y_.copy_(wait_tensor_1) -> bfloat16[3]@cpu
o = l_z_.new_empty([8]) -> int32[8]@cpu
tensor_2 = c10d.all_gather_into_tensor(l_z_, 2, <world>) -> int32[8]@cpu
res = c10d.wait_tensor(tensor_2) -> int32[8]@cpu
copy__2 = o.copy_(res) -> int32[8]@cpu
r = l_x_.new_empty([2, 3]) -> float32[2, 3]@cpu
tensor_3 = c10d.reduce_scatter_tensor(l_x_, 'max', 2, <world>) -> float32[2, 3]@cpu
res_1 = c10d.wait_tensor(tensor_3) -> float32[2, 3]@cpu
copy__3 = r.copy_(res_1) -> float32[2, 3]@cpu
a = l_w_.new_empty([4, 2]) -> float32[4, 2]@cpu
tensor_4 = c10d.all_to_all_single(l_w_, [1, 3], [1, 3], <group 0,1>) -> float32[4, 2]@cpu
wait_tensor_4 = c10d.wait_tensor(tensor_4) -> float32[4, 2]@cpu
copy__4 = a.copy_(wait_tensor_4) -> float32[4, 2]@cpu
tensor_5 = c10d.broadcast(l_y_, 1, <group 0,1>) -> bfloat16[3]@cpu
wait_tensor_5 = c10d.wait_tensor(tensor_5) -> bfloat16[3]@cpu
copy__5 = l_y_.copy_(wait_tensor_5) -> bfloat16[3]@cpu
return [o, r, a]""")

    def test_eager_style_calls_forward_graph(self):
        self.assertExpectedInline(self.r["eager_style forward"], """\
arg0_1: float32[4, 3]@cpu
arg1_1: bfloat16[3]@cpu
arg2_1: int32[4]@cpu
arg3_1: float32[4, 2]@cpu
all_reduce = c10d.all_reduce(arg0_1, 'sum', <world>) -> float32[4, 3]@cpu
wait_tensor = c10d.wait_tensor(all_reduce) -> float32[4, 3]@cpu
copy = aten.copy(arg0_1, wait_tensor) -> float32[4, 3]@cpu
all_reduce_1 = c10d.all_reduce(arg1_1, 'avg', <group 0,1>) -> bfloat16[3]@cpu
wait_tensor_1 = c10d.wait_tensor(all_reduce_1) -> bfloat16[3]@cpu
copy_1 = aten.copy(arg1_1, wait_tensor_1) -> bfloat16[3]@cpu
new_empty = aten.new_empty(arg2_1, [8]) -> int32[8]@cpu
all_gather_into_tensor = c10d.all_gather_into_tensor(arg2_1, 2, <world>) -> int32[8]@cpu
wait_tensor_2 = c10d.wait_tensor(all_gather_into_tensor) -> int32[8]@cpu
copy_2 = aten.copy(new_empty, wait_tensor_2) -> int32[8]@cpu
new_empty_1 = aten.new_empty(copy, [2, 3]) -> float32[2, 3]@cpu
reduce_scatter_tensor = c10d.reduce_scatter_tensor(copy, 'max', 2, <world>) -> float32[2, 3]@cpu
wait_tensor_3 = c10d.wait_tensor(reduce_scatter_tensor) -> float32[2, 3]@cpu
copy_3 = aten.copy(new_empty_1, wait_tensor_3) -> float32[2, 3]@cpu
new_empty_2 = aten.new_empty(arg3_1, [4, 2]) -> float32[4, 2]@cpu
all_to_all_single = c10d.all_to_all_single(arg3_1, [1, 3], [1, 3], <group 0,1>) -> float32[4, 2]@cpu
wait_tensor_4 = c10d.wait_tensor(all_to_all_single) -> float32[4, 2]@cpu
copy_4 = aten.copy(new_empty_2, wait_tensor_4) -> float32[4, 2]@cpu
broadcast = c10d.broadcast(copy_1, 1, <group 0,1>) -> bfloat16[3]@cpu
wait_tensor_5 = c10d.wait_tensor(broadcast) -> bfloat16[3]@cpu
copy_5 = aten.copy(copy_1, wait_tensor_5) -> bfloat16[3]@cpu
copy_ = aten.copy_(arg0_1, copy) -> float32[4, 3]@cpu
copy__1 = aten.copy_(arg1_1, copy_5) -> bfloat16[3]@cpu
return [copy_2, copy_3, copy_4]""")

    def test_autograd_variants_forward_and_backward(self):
        self.assertExpectedInline("\n".join(self.r["autograd dynamo collectives"]), """\
autograd.all_gather_into_tensor group=[0,1] group_size=2: float32[2, 3] -> float32[4, 3]
autograd.reduce_scatter_tensor sum group=[0,1] group_size=2: float32[4, 3] -> float32[2, 3]
autograd.all_to_all_single group=[0,1] output_split_sizes=[1, 1] input_split_sizes=[1, 1]: float32[2, 3] -> float32[2, 3]""")
        self.assertExpectedInline(self.r["autograd forward"], """\
primals_1: float32[2, 3]@cpu
primals_2: float32[3, 3]@cpu
primals_3: float32[2, 3]@cpu
all_gather_into_tensor = c10d.all_gather_into_tensor(primals_1, 2, <world>) -> float32[4, 3]@cpu
wait_tensor = c10d.wait_tensor(all_gather_into_tensor) -> float32[4, 3]@cpu
mm = aten.mm(wait_tensor, primals_2) -> float32[4, 3]@cpu
reduce_scatter_tensor = c10d.reduce_scatter_tensor(mm, 'sum', 2, <world>) -> float32[2, 3]@cpu
wait_tensor_1 = c10d.wait_tensor(reduce_scatter_tensor) -> float32[2, 3]@cpu
all_to_all_single = c10d.all_to_all_single(wait_tensor_1, [1, 1], [1, 1], <world>) -> float32[2, 3]@cpu
wait_tensor_2 = c10d.wait_tensor(all_to_all_single) -> float32[2, 3]@cpu
mul = aten.mul.Tensor(wait_tensor_2, primals_3) -> float32[2, 3]@cpu
t = aten.t(wait_tensor) -> float32[3, 4]@cpu
t_1 = aten.t(primals_2) -> float32[3, 3]@cpu
return [mul, primals_3, t, t_1]""")
        self.assertExpectedInline(self.r["autograd backward"], """\
primals_3: float32[2, 3]@cpu
t: float32[3, 4]@cpu
t_1: float32[3, 3]@cpu
tangents_1: float32[2, 3]@cpu
mul_1 = aten.mul.Tensor(tangents_1, primals_3) -> float32[2, 3]@cpu
all_to_all_single_1 = c10d.all_to_all_single(mul_1, [1, 1], [1, 1], <world>) -> float32[2, 3]@cpu
wait_tensor_3 = c10d.wait_tensor(all_to_all_single_1) -> float32[2, 3]@cpu
all_gather_into_tensor_1 = c10d.all_gather_into_tensor(wait_tensor_3, 2, <world>) -> float32[4, 3]@cpu
wait_tensor_4 = c10d.wait_tensor(all_gather_into_tensor_1) -> float32[4, 3]@cpu
mm_1 = aten.mm(t, wait_tensor_4) -> float32[3, 3]@cpu
mm_2 = aten.mm(wait_tensor_4, t_1) -> float32[4, 3]@cpu
reduce_scatter_tensor_1 = c10d.reduce_scatter_tensor(mm_2, 'sum', 2, <world>) -> float32[2, 3]@cpu
wait_tensor_5 = c10d.wait_tensor(reduce_scatter_tensor_1) -> float32[2, 3]@cpu
return [wait_tensor_5, mm_1, None]""")
        self.assertExpectedInline("\n".join(self.r["autograd collectives"]), """\
all_gather_into_tensor group=[0,1] group_size=2: float32[2, 3] -> float32[4, 3]
reduce_scatter_tensor sum group=[0,1] group_size=2: float32[4, 3] -> float32[2, 3]
all_to_all_single group=[0,1] output_split_sizes=[1, 1] input_split_sizes=[1, 1]: float32[2, 3] -> float32[2, 3]
all_to_all_single group=[0,1] output_split_sizes=[1, 1] input_split_sizes=[1, 1]: float32[2, 3] -> float32[2, 3]
all_gather_into_tensor group=[0,1] group_size=2: float32[2, 3] -> float32[4, 3]
reduce_scatter_tensor sum group=[0,1] group_size=2: float32[4, 3] -> float32[2, 3]""")

    def test_inplace_and_out_variants(self):
        self.assertExpectedInline(self.r["inplace"], """\
x_1: float32[4, 3]@cpu
y_1: bfloat16[3]@cpu
z_1: int32[4]@cpu
clone = aten.clone(x_1) -> float32[4, 3]@cpu
all_reduce_ = c10d.all_reduce_(clone, 'sum', <world>) -> float32[4, 3]@cpu
wait_tensor = c10d.wait_tensor(all_reduce_) -> float32[4, 3]@cpu
clone_1 = aten.clone(x_1) -> float32[4, 3]@cpu
clone_2 = aten.clone(y_1) -> bfloat16[3]@cpu
all_reduce_coalesced_ = c10d.all_reduce_coalesced_([clone_1, clone_2], 'min', <world>) -> (float32[4, 3]@cpu, bfloat16[3]@cpu)
getitem = getitem(all_reduce_coalesced_, 0) -> float32[4, 3]@cpu
getitem_1 = getitem(all_reduce_coalesced_, 1) -> bfloat16[3]@cpu
wait_tensor_1 = c10d.wait_tensor(getitem) -> float32[4, 3]@cpu
wait_tensor_2 = c10d.wait_tensor(getitem_1) -> bfloat16[3]@cpu
empty = aten.empty.memory_format([8], dtype=int32, device=cpu) -> int32[8]@cpu
all_gather_into_tensor_out = c10d.all_gather_into_tensor_out(z_1, 2, <group 0,1>, out=empty) -> int32[8]@cpu
wait_tensor_3 = c10d.wait_tensor(all_gather_into_tensor_out) -> int32[8]@cpu
clone_3 = aten.clone(y_1) -> bfloat16[3]@cpu
broadcast_ = c10d.broadcast_(clone_3, 1, <world>) -> bfloat16[3]@cpu
wait_tensor_4 = c10d.wait_tensor(broadcast_) -> bfloat16[3]@cpu
return [wait_tensor, getitem, getitem_1, wait_tensor_3, broadcast_]""")
