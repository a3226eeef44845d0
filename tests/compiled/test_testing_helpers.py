"""funcoll.testing's own helpers, in one process: the compile counters on functions that really break and
recompile, the normalisation, the graph renderer and the collectives lister (on a fake 4-rank world)."""

import expecttest
import pytest
import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as fc
from torch._subclasses.fake_tensor import FakeTensorMode

from funcoll import testing


# -- graph breaks and recompilations ----------------------------------------------------------------
def breaks_twice(x):
    y = x * 2
    torch._dynamo.graph_break()
    y = y + 1
    if y.sum().item() > 0:  # data-dependent branch: .item() breaks the graph
        y = y * 3
    return y


def scaled(x, k):
    return x * k


def sine(x):
    return torch.sin(x)


def test_count_compiles_on_a_function_that_breaks():
    c = testing.count_compiles(breaks_twice, torch.ones(3), torch.ones(3), torch.ones(3))
    # three graphs (before the break, between the breaks, after the .item()), compiled once: the second and
    # third calls hit the cache
    assert (c.graphs, c.graph_breaks, c.recompiles) == (3, 2, 0)
    assert c.break_reasons == ["Call to `torch._dynamo.graph_break()`",
                               "Unsupported Tensor.item() call with capture_scalar_outputs=False"]


def test_count_compiles_counts_recompilations_and_says_why():
    c = testing.count_compiles(scaled, (torch.ones(3), 2), (torch.ones(3), 2), (torch.ones(3), 3))
    assert (c.graphs, c.graph_breaks, c.recompiles) == (2, 0, 1)
    assert c.recompile_reasons == ["k == 2 # return x * k # test_testing_helpers.py:25 in scaled"]
    # a new shape recompiles; without dynamic=False the second recompile is dynamic and covers the third
    shapes = [torch.ones(3), torch.ones(4), torch.ones(5)]
    static = testing.count_compiles(sine, *shapes, dynamic=False)
    assert (static.graphs, static.recompiles) == (3, 2)
    assert static.recompile_reasons[0] == "tensor 'x' size mismatch at index 0. expected 3, actual 4"
    with torch._dynamo.config.patch(automatic_dynamic_shapes=True):  # torch_xla's import turns it off
        auto = testing.count_compiles(sine, *shapes)
    assert (auto.graphs, auto.recompiles) == (2, 1)


def test_count_compiles_without_break_or_recompile():
    c = testing.count_compiles(scaled, *[(torch.full((3,), float(i)), 2) for i in range(4)], backend="aot_eager")
    assert (c.graphs, c.graph_breaks, c.break_reasons, c.recompiles) == (1, 0, [], 0)


def test_compile_counts_block_counts_every_compiled_function():
    torch._dynamo.reset()
    f, g = torch.compile(breaks_twice, backend="eager"), torch.compile(scaled, backend="eager")
    with testing.compile_counts() as c:
        f(torch.ones(2))
        g(torch.ones(2), 5)
        g(torch.ones(2), 6)
    assert (c.graphs, c.graph_breaks, c.recompiles) == (5, 2, 1)


# -- normalisation ----------------------------------------------------------------------------------
def test_normalize_text_removes_addresses_and_directories():
    text = 'at 0x7f3a2b10 in File "/home/ci/venv/lib/torch/nn/modules.py", line 3 and C:\\src\\m.py:4'
    assert testing.normalize_text(text) == 'at 0x? in File "modules.py", line 3 and m.py:4'


# -- rendering and listing ---------------------------------------------------------------------------
@pytest.fixture(scope="module")
def fake_world():
    from torch.testing._internal.distributed.fake_pg import FakeStore

    assert not dist.is_initialized(), "another test left a default process group behind"
    dist.init_process_group("fake", store=FakeStore(), rank=2, world_size=4)  # rank 2: in the pair
    try:
        dist.new_group([0, 1])  # a group created first shifts the names of the next ones, not their labels
        yield dist.new_group([2, 3])
    finally:
        dist.destroy_process_group()


def tp_step(x, w, pair):
    g = fc.all_gather_tensor(x, 0, dist.group.WORLD)
    h = fc.reduce_scatter_tensor(g @ w, "avg", 0, pair)
    return fc.all_to_all_single(h, [3, 1], [2, 2], pair)


class TestRender(expecttest.TestCase):
    @pytest.fixture(autouse=True)
    def _world(self, fake_world):
        self.pair = fake_world

    def trace(self):
        with FakeTensorMode():
            args = (torch.empty(2, 3, device="xpu"), torch.empty(3, 5, device="xpu"))
        return testing.trace_fake(lambda x, w: tp_step(x, w, self.pair), *args)

    def test_group_labels_are_ranks_not_names(self):
        assert testing.group_label(dist.group.WORLD.group_name) == "<world>"
        assert testing.group_label(self.pair.group_name) == "<group 2,3>"
        assert self.pair.group_name != "1"  # the name is a counter, the label is not
        assert testing.group_label("no such group") == "no such group"
        assert testing.group_label(self.pair.group_name, {self.pair.group_name: "<tp>"}) == "<tp>"

    def test_render_graph_of_a_fake_xpu_trace(self):
        self.assertExpectedInline(testing.render_graph(self.trace()), """\
x_1: float32[2, 3]@xpu
w_1: float32[3, 5]@xpu
all_gather_into_tensor = c10d.all_gather_into_tensor(x_1, 4, <world>) -> float32[8, 3]@xpu
wait_tensor = c10d.wait_tensor(all_gather_into_tensor) -> float32[8, 3]@xpu
mm = aten.mm(wait_tensor, w_1) -> float32[8, 5]@xpu
reduce_scatter_tensor = c10d.reduce_scatter_tensor(mm, 'avg', 2, <group 2,3>) -> float32[4, 5]@xpu
wait_tensor_1 = c10d.wait_tensor(reduce_scatter_tensor) -> float32[4, 5]@xpu
all_to_all_single = c10d.all_to_all_single(wait_tensor_1, [3, 1], [2, 2], <group 2,3>) -> float32[4, 5]@xpu
wait_tensor_2 = c10d.wait_tensor(all_to_all_single) -> float32[4, 5]@xpu
return wait_tensor_2""")

    def test_render_graph_of_a_dynamo_graph(self):
        with FakeTensorMode():
            args = (torch.empty(2, 3), torch.empty(3, 5))
        cap = testing.capture_graphs(lambda x, w: tp_step(x, w, self.pair), *args, backend="eager")
        self.assertExpectedInline(cap.text("dynamo"), """\
l_x_: float32[2, 3]@cpu
l_w_: float32[3, 5]@cpu
tensor = c10d.all_gather_into_tensor(l_x_, 4, <world>) -> float32[8, 3]@cpu
res = c10d.wait_tensor(tensor) -> float32[8, 3]@cpu
matmul = matmul(res, l_w_) -> float32[8, 5]@cpu
tensor_1 = c10d.reduce_scatter_tensor(matmul, 'avg', 2, <group 2,3>) -> float32[4, 5]@cpu
res_1 = c10d.wait_tensor(tensor_1) -> float32[4, 5]@cpu
tensor_2 = c10d.all_to_all_single(res_1, [3, 1], [2, 2], <group 2,3>) -> float32[4, 5]@cpu
wait_tensor_2 = c10d.wait_tensor(tensor_2) -> float32[4, 5]@cpu
return [wait_tensor_2]""")
        assert cap.forward == [] and cap.backward == []

    def test_collectives_lists_op_reduce_op_group_and_shapes(self):
        f32 = torch.float32
        got = testing.collectives(self.trace())
        assert got == [
            testing.Collective("all_gather_into_tensor", None, (0, 1, 2, 3), ((f32, (2, 3)),), ((f32, (8, 3)),),
                         (("group_size", 4),)),
            testing.Collective("reduce_scatter_tensor", "avg", (2, 3), ((f32, (8, 5)),), ((f32, (4, 5)),),
                         (("group_size", 2),)),
            testing.Collective("all_to_all_single", None, (2, 3), ((f32, (4, 5)),), ((f32, (4, 5)),),
                         (("output_split_sizes", [3, 1]), ("input_split_sizes", [2, 2]))),
        ]
        self.assertExpectedInline("\n".join(map(str, got)), """\
all_gather_into_tensor group=[0,1,2,3] group_size=4: float32[2, 3] -> float32[8, 3]
reduce_scatter_tensor avg group=[2,3] group_size=2: float32[8, 5] -> float32[4, 5]
all_to_all_single group=[2,3] output_split_sizes=[3, 1] input_split_sizes=[2, 2]: float32[4, 5] -> float32[4, 5]""")


def test_the_docs_example_runs_and_its_snapshots_hold(tmp_path):
    """docs/testing-compiled.md's example, copied as a user would, passes as written (no EXPECTTEST_ACCEPT)."""
    import os
    import pathlib
    import re
    import subprocess
    import sys

    root = pathlib.Path(__file__).resolve().parents[2]
    page = (root / "docs" / "testing-compiled.md").read_text()
    assert "docs/testing-compiled.md" in (root / "README.md").read_text()
    code = re.search(r"## A complete example.*?```python\n(.*?)```", page, re.S).group(1)
    (tmp_path / "test_my_graphs.py").write_text(code)
    env = dict(os.environ, PYTHONPATH=str(root))
    env.pop("EXPECTTEST_ACCEPT", None)
    p = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_my_graphs.py"],
                       cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    assert "3 passed" in p.stdout
    assert (tmp_path / "test_my_graphs.py").read_text() == code  # nothing was accepted into the file
