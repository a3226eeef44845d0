"""FX graphs traced with fake XPU tensors, on a fake process group (no XPU, no real collective).

One function uses every ``_c10d_functional`` op (through the public functional API where it exists, the raw ops
for the in-place/out variants). Its graph, traced and rendered with funcoll.testing's public helpers
(``trace_fake``, ``render_graph``: group names shown by their ranks), is shown identical to the graph traced with
fake CUDA tensors (the graph a CUDA user gets) and identical with and without funcoll's XPU kernels installed (funcoll
changes the kernel behind each node, never the graph), and tracing never touches the XPU runtime. The graph text
itself is upstream's (it changes with torch releases), so it is compared, not pinned.
"""

import expecttest
import pytest
import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
from torch._subclasses.fake_tensor import FakeTensorMode

import funcoll
from funcoll.testing import render_graph as render
from funcoll.testing import trace_fake

C = torch.ops._c10d_functional
WORLD_SIZE = 4


@pytest.fixture(scope="module", autouse=True)
def fake_world():
    from torch.testing._internal.distributed.fake_pg import FakeStore

    assert not dist.is_initialized(), "another test left a default process group behind"
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
        # torch >= 2.15 waits on a coalesced op's outputs with one wait_tensors (upstream's kernel: it waits on the
        # Works funcoll's kernels register)
        waits = {"wait_tensor"} | ({"wait_tensors"} if hasattr(torch.ops._c10d_functional, "wait_tensors") else set())
        assert targets == set(funcoll.entry.kernels.KERNELS) | waits
