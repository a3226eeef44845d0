"""HLO of compiled functions on XLA, with the same funcoll.testing helpers as on CPU: a virtual 4-rank funcoll
world built in this process (nothing is executed, the collectives are read from the HLO torch.compile's graph
produces with funcoll's XLA kernels installed)."""

import expecttest
import pytest
import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as fc

torch_xla = pytest.importorskip("torch_xla")

import funcoll  # noqa: E402
from funcoll import testing  # noqa: E402

pytestmark = pytest.mark.xla


@pytest.fixture(scope="module")
def world():
    assert not dist.is_initialized(), "another test left a default process group behind"
    dist.init_process_group("funcoll", store=dist.HashStore(), rank=0, world_size=4)
    had = "xla" in funcoll.installed()
    funcoll.install(["xla"])
    try:
        pairs = funcoll.groups.new_subgroups(2)  # [0,1] and [2,3]: one partition
        yield pairs[0] if isinstance(pairs, tuple) else pairs
    finally:
        if not had:
            funcoll.uninstall(["xla"])
        dist.destroy_process_group()
        # nothing of this virtual world may reach a later sync in this process (it cannot run on one replica):
        # Dynamo's caches keep the compiled steps' tensors alive, and the ordering token chains collectives
        import gc

        from funcoll import xla

        torch._dynamo.reset()
        gc.collect()
        xla.reset_token()


def step(x, y, pair):
    a = fc.all_reduce(x, "avg", dist.group.WORLD)
    dist.all_reduce(y, group=pair)  # eager-style, rewritten by Dynamo
    g = fc.all_gather_tensor(x, 0, pair)
    r = fc.reduce_scatter_tensor(g, "max", 0, dist.group.WORLD)
    return a, g, r


def tp(x, w, pair):
    return fc.reduce_scatter_tensor_autograd(fc.all_gather_tensor_autograd(x, 0, pair) @ w, "sum", 0, pair)


class TestCompiledHlo(expecttest.TestCase):
    @pytest.fixture(autouse=True)
    def _world(self, world):
        self.pair = world
        self.dev = torch_xla.device()

    def test_collectives_of_a_compiled_step(self):
        x, y = torch.ones(4, 2, device=self.dev), torch.ones(3, device=self.dev)
        self.assertExpectedInline(testing.xla_compiled_collectives(lambda x, y: step(x, y, self.pair), x, y), """\
all-reduce(f32[4,2], f32[]) -> (f32[4,2],f32[])  replica_groups={} to_apply=add
all-reduce(f32[3], f32[]) -> (f32[3],f32[])  replica_groups={{0,1},{2,3}} to_apply=add
all-gather(s32[4,2]) -> s32[8,2]  replica_groups={{0,1},{2,3}} dimensions={0}
reduce-scatter(f32[8,2]) -> f32[2,2]  replica_groups={} dimensions={0} to_apply=maximum""")

    def test_the_fx_graph_is_the_one_cpu_gets(self):
        x, y = torch.ones(4, 2, device=self.dev), torch.ones(3, device=self.dev)
        cap = testing.capture_graphs(lambda x, y: step(x, y, self.pair), x, y)
        self.assertExpectedInline("\n".join(map(str, cap.collectives())), """\
all_reduce avg group=[0,1,2,3]: float32[4, 2] -> float32[4, 2]
all_reduce sum group=[0,1]: float32[3] -> float32[3]
all_gather_into_tensor group=[0,1] group_size=2: float32[4, 2] -> float32[8, 2]
reduce_scatter_tensor max group=[0,1,2,3] group_size=4: float32[8, 2] -> float32[2, 2]""")

    def test_training_forward_and_backward_hlo(self):
        x = torch.ones(2, 3, device=self.dev, requires_grad=True)
        w = torch.ones(3, 3, device=self.dev, requires_grad=True)
        self.assertExpectedInline(testing.xla_compiled_collectives(lambda x, w: tp(x, w, self.pair), x, w,
                                                             backward=True), """\
all-gather(s32[2,3]) -> s32[4,3]  replica_groups={{0,1},{2,3}} dimensions={0}
reduce-scatter(f32[4,3]) -> f32[2,3]  replica_groups={{0,1},{2,3}} dimensions={0} to_apply=add
all-gather(s32[2,3]) -> s32[4,3]  replica_groups={{0,1},{2,3}} dimensions={0}
reduce-scatter(f32[4,3]) -> f32[2,3]  replica_groups={{0,1},{2,3}} dimensions={0} to_apply=add""")
