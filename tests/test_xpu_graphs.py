"""FX graphs traced with fake XPU tensors, on a fake process group (no XPU, no real collective).

One function uses every ``_c10d_functional`` op (through the public functional API where it exists, the raw ops
for the in-place/out variants). Its graph, traced and rendered with funcoll.testing's public helpers
(``trace_fake``, ``render_graph``: group names shown by their ranks), is snapshotted (expecttest), shown identical to
the graph traced with fake CUDA tensors (the graph a CUDA user gets), identical with and without funcoll's XPU
kernels installed (funcoll changes the kernel behind each node, never the graph), and tracing never touches the
XPU runtime.
"""

import expecttest
import pytest
import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
from torch._subclasses.fake_tensor import FakeTensorMode

import funcoll
from funcoll.testing import render_graph as render, trace_fake

C = torch.ops._c10d_functional
WORLD_SIZE = 4


@pytest.fixture(scope="module", autouse=True)
def fake_world():
    from torch.testing._internal.distributed.fake_pg import FakeStore

    if dist.is_initialized():
        pytest.skip("a process group is already initialised in this process")
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=WORLD_SIZE)
    try:
        yield
    finally:
        dist.destroy_process_group()


def step(x, y, z, w, f8):
    world = dist.group.WORLD
    sub = SUB[0]
    g = world.group_name
    a = funcol.all_reduce(x, "avg", world)
    b = C.wait_tensor(C.all_reduce_(y.clone(), "sum", g))
    cs = funcol.all_reduce_coalesced([x, y], "max", world)
    ci = [x.clone(), y.clone()]
    for t in C.all_reduce_coalesced_(ci, "product", g):
        C.wait_tensor(t)
    ag = funcol.all_gather_tensor(f8, 0, world)
    out = torch.empty((WORLD_SIZE * z.shape[0],), dtype=z.dtype, device=z.device)
    ago = C.wait_tensor(C.all_gather_into_tensor_out(z, WORLD_SIZE, g, out=out))
    agc = funcol.all_gather_into_tensor_coalesced([x, z], world)
    rs = funcol.reduce_scatter_tensor(x, "max", 0, world)
    rsc = funcol.reduce_scatter_tensor_coalesced([x, z], "sum", [0, 0], world)
    a2a = funcol.all_to_all_single(w, [3, 1], [2, 2], sub)
    bc = funcol.broadcast(y, 1, world)
    bi = y.clone()
    C.wait_tensor(C.broadcast_(bi, 0, g))
    return a, b, *cs, *ci, ag, ago, *agc, rs, *rsc, a2a, bc, bi


def step_functional(x, y, z, w, f8):
    """The functional ops only (what torch.compile graphs contain; in-place variants cannot be functionalized)."""
    world = dist.group.WORLD
    a = funcol.all_reduce(x, "avg", world)
    cs = funcol.all_reduce_coalesced([x, y], "max", world)
    ag = funcol.all_gather_tensor(f8, 0, world)
    agc = funcol.all_gather_into_tensor_coalesced([x, z], world)
    rs = funcol.reduce_scatter_tensor(x, "max", 0, world)
    rsc = funcol.reduce_scatter_tensor_coalesced([x, z], "sum", [0, 0], world)
    a2a = funcol.all_to_all_single(w, [3, 1], [2, 2], SUB[0])
    bc = funcol.broadcast(y, 1, world)
    return a * 2, *cs, ag, *agc, rs, *rsc, a2a, bc


SUB = []


def trace(device_type, functional=False):
    if not SUB:
        SUB.append(dist.new_group([0, 1]))
    with FakeTensorMode():
        args = (torch.empty(8, 4, device=device_type), torch.empty(4, device=device_type, dtype=torch.bfloat16),
                torch.empty(8, device=device_type, dtype=torch.int32), torch.empty(4, 3, device=device_type),
                torch.empty(2, 4, device=device_type, dtype=torch.float8_e4m3fn))
    return trace_fake(step_functional if functional else step, *args, functional=functional)


class TestXpuGraphs(expecttest.TestCase):
    def test_every_functional_op_on_fake_xpu_tensors(self):
        self.assertExpectedInline(render(trace("xpu")), """\
x_1: float32[8, 4]@xpu
y_1: bfloat16[4]@xpu
z_1: int32[8]@xpu
w_1: float32[4, 3]@xpu
f8_1: float8_e4m3fn[2, 4]@xpu
all_reduce = c10d.all_reduce(x_1, 'avg', <world>) -> float32[8, 4]@xpu
wait_tensor = c10d.wait_tensor(all_reduce) -> float32[8, 4]@xpu
clone = aten.clone(y_1) -> bfloat16[4]@xpu
all_reduce_ = c10d.all_reduce_(clone, 'sum', <world>) -> bfloat16[4]@xpu
wait_tensor_1 = c10d.wait_tensor(all_reduce_) -> bfloat16[4]@xpu
all_reduce_coalesced = c10d.all_reduce_coalesced([x_1, y_1], 'max', <world>) -> (float32[8, 4]@xpu, bfloat16[4]@xpu)
getitem = getitem(all_reduce_coalesced, 0) -> float32[8, 4]@xpu
getitem_1 = getitem(all_reduce_coalesced, 1) -> bfloat16[4]@xpu
wait_tensor_2 = c10d.wait_tensor(getitem) -> float32[8, 4]@xpu
wait_tensor_3 = c10d.wait_tensor(getitem_1) -> bfloat16[4]@xpu
clone_1 = aten.clone(x_1) -> float32[8, 4]@xpu
clone_2 = aten.clone(y_1) -> bfloat16[4]@xpu
all_reduce_coalesced_ = c10d.all_reduce_coalesced_([clone_1, clone_2], 'product', <world>) -> (float32[8, 4]@xpu, bfloat16[4]@xpu)
getitem_2 = getitem(all_reduce_coalesced_, 0) -> float32[8, 4]@xpu
getitem_3 = getitem(all_reduce_coalesced_, 1) -> bfloat16[4]@xpu
wait_tensor_4 = c10d.wait_tensor(getitem_2) -> float32[8, 4]@xpu
wait_tensor_5 = c10d.wait_tensor(getitem_3) -> bfloat16[4]@xpu
all_gather_into_tensor = c10d.all_gather_into_tensor(f8_1, 4, <world>) -> float8_e4m3fn[8, 4]@xpu
wait_tensor_6 = c10d.wait_tensor(all_gather_into_tensor) -> float8_e4m3fn[8, 4]@xpu
empty = aten.empty.memory_format([32], dtype=int32, device=xpu) -> int32[32]@xpu
all_gather_into_tensor_out = c10d.all_gather_into_tensor_out(z_1, 4, <world>, out=empty) -> int32[32]@xpu
wait_tensor_7 = c10d.wait_tensor(all_gather_into_tensor_out) -> int32[32]@xpu
all_gather_into_tensor_coalesced = c10d.all_gather_into_tensor_coalesced([x_1, z_1], 4, <world>) -> (float32[32, 4]@xpu, int32[32]@xpu)
getitem_4 = getitem(all_gather_into_tensor_coalesced, 0) -> float32[32, 4]@xpu
getitem_5 = getitem(all_gather_into_tensor_coalesced, 1) -> int32[32]@xpu
wait_tensor_8 = c10d.wait_tensor(getitem_4) -> float32[32, 4]@xpu
wait_tensor_9 = c10d.wait_tensor(getitem_5) -> int32[32]@xpu
reduce_scatter_tensor = c10d.reduce_scatter_tensor(x_1, 'max', 4, <world>) -> float32[2, 4]@xpu
wait_tensor_10 = c10d.wait_tensor(reduce_scatter_tensor) -> float32[2, 4]@xpu
reduce_scatter_tensor_coalesced = c10d.reduce_scatter_tensor_coalesced([x_1, z_1], 'sum', 4, <world>) -> (float32[2, 4]@xpu, int32[2]@xpu)
getitem_6 = getitem(reduce_scatter_tensor_coalesced, 0) -> float32[2, 4]@xpu
getitem_7 = getitem(reduce_scatter_tensor_coalesced, 1) -> int32[2]@xpu
wait_tensor_11 = c10d.wait_tensor(getitem_6) -> float32[2, 4]@xpu
wait_tensor_12 = c10d.wait_tensor(getitem_7) -> int32[2]@xpu
all_to_all_single = c10d.all_to_all_single(w_1, [3, 1], [2, 2], <group 0,1>) -> float32[4, 3]@xpu
wait_tensor_13 = c10d.wait_tensor(all_to_all_single) -> float32[4, 3]@xpu
broadcast = c10d.broadcast(y_1, 1, <world>) -> bfloat16[4]@xpu
wait_tensor_14 = c10d.wait_tensor(broadcast) -> bfloat16[4]@xpu
clone_3 = aten.clone(y_1) -> bfloat16[4]@xpu
broadcast_ = c10d.broadcast_(clone_3, 0, <world>) -> bfloat16[4]@xpu
wait_tensor_15 = c10d.wait_tensor(broadcast_) -> bfloat16[4]@xpu
return [wait_tensor, wait_tensor_1, wait_tensor_2, wait_tensor_3, getitem_2, getitem_3, wait_tensor_6, wait_tensor_7, wait_tensor_8, wait_tensor_9, wait_tensor_10, wait_tensor_11, wait_tensor_12, wait_tensor_13, wait_tensor_14, broadcast_]""")

    def test_functionalized_graph_as_aot_autograd_sees_it(self):
        self.assertExpectedInline(render(trace("xpu", functional=True)), """\
x_1: float32[8, 4]@xpu
y_1: bfloat16[4]@xpu
z_1: int32[8]@xpu
w_1: float32[4, 3]@xpu
f8_1: float8_e4m3fn[2, 4]@xpu
all_reduce = c10d.all_reduce(x_1, 'avg', <world>) -> float32[8, 4]@xpu
wait_tensor = c10d.wait_tensor(all_reduce) -> float32[8, 4]@xpu
all_reduce_coalesced = c10d.all_reduce_coalesced([x_1, y_1], 'max', <world>) -> (float32[8, 4]@xpu, bfloat16[4]@xpu)
getitem = getitem(all_reduce_coalesced, 0) -> float32[8, 4]@xpu
getitem_1 = getitem(all_reduce_coalesced, 1) -> bfloat16[4]@xpu
wait_tensor_1 = c10d.wait_tensor(getitem) -> float32[8, 4]@xpu
wait_tensor_2 = c10d.wait_tensor(getitem_1) -> bfloat16[4]@xpu
all_gather_into_tensor = c10d.all_gather_into_tensor(f8_1, 4, <world>) -> float8_e4m3fn[8, 4]@xpu
wait_tensor_3 = c10d.wait_tensor(all_gather_into_tensor) -> float8_e4m3fn[8, 4]@xpu
all_gather_into_tensor_coalesced = c10d.all_gather_into_tensor_coalesced([x_1, z_1], 4, <world>) -> (float32[32, 4]@xpu, int32[32]@xpu)
getitem_2 = getitem(all_gather_into_tensor_coalesced, 0) -> float32[32, 4]@xpu
getitem_3 = getitem(all_gather_into_tensor_coalesced, 1) -> int32[32]@xpu
wait_tensor_4 = c10d.wait_tensor(getitem_2) -> float32[32, 4]@xpu
wait_tensor_5 = c10d.wait_tensor(getitem_3) -> int32[32]@xpu
reduce_scatter_tensor = c10d.reduce_scatter_tensor(x_1, 'max', 4, <world>) -> float32[2, 4]@xpu
wait_tensor_6 = c10d.wait_tensor(reduce_scatter_tensor) -> float32[2, 4]@xpu
reduce_scatter_tensor_coalesced = c10d.reduce_scatter_tensor_coalesced([x_1, z_1], 'sum', 4, <world>) -> (float32[2, 4]@xpu, int32[2]@xpu)
getitem_4 = getitem(reduce_scatter_tensor_coalesced, 0) -> float32[2, 4]@xpu
getitem_5 = getitem(reduce_scatter_tensor_coalesced, 1) -> int32[2]@xpu
wait_tensor_7 = c10d.wait_tensor(getitem_4) -> float32[2, 4]@xpu
wait_tensor_8 = c10d.wait_tensor(getitem_5) -> int32[2]@xpu
all_to_all_single = c10d.all_to_all_single(w_1, [3, 1], [2, 2], <group 0,1>) -> float32[4, 3]@xpu
wait_tensor_9 = c10d.wait_tensor(all_to_all_single) -> float32[4, 3]@xpu
broadcast = c10d.broadcast(y_1, 1, <world>) -> bfloat16[4]@xpu
wait_tensor_10 = c10d.wait_tensor(broadcast) -> bfloat16[4]@xpu
mul = aten.mul.Tensor(wait_tensor, 2) -> float32[8, 4]@xpu
return [mul, wait_tensor_1, wait_tensor_2, wait_tensor_3, wait_tensor_4, wait_tensor_5, wait_tensor_6, wait_tensor_7, wait_tensor_8, wait_tensor_9, wait_tensor_10]""")

    def test_the_graph_is_the_one_a_cuda_user_gets(self):
        for functional in (False, True):
            xpu, cuda = render(trace("xpu", functional)), render(trace("cuda", functional))
            assert "@cuda" not in xpu and "@xpu" not in cuda
            assert xpu == cuda.replace("@cuda", "@xpu").replace("device=cuda", "device=xpu")
            # the generated Python code is character for character the same, up to the device name
            gx, gc = trace("xpu", functional), trace("cuda", functional)
            assert gx.code == gc.code.replace("'cuda'", "'xpu'")

    def test_installing_funcoll_changes_no_graph(self):
        had = "xpu" in funcoll.installed()
        funcoll.uninstall(["xpu"])
        before = render(trace("xpu"))
        assert funcoll.install(["xpu"]) == ["xpu"]
        try:
            assert render(trace("xpu")) == before
            assert render(trace("xpu", True)) == render(trace("cuda", True)).replace("@cuda", "@xpu").replace(
                "device=cuda", "device=xpu")
        finally:
            if not had:
                funcoll.uninstall(["xpu"])
        assert not torch.xpu.is_initialized()

    def test_every_op_of_the_surface_is_in_the_graph(self):
        targets = {n.target.__name__.split(".")[0] for n in trace("xpu").graph.nodes
                   if n.op == "call_function" and "c10d_functional" in str(n.target)}
        assert targets == set(funcoll.kernels.OPS) | {"wait_tensor"}
