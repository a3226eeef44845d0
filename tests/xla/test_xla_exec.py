"""XLA lowering, executed: torch_xla on the CPU PJRT device, a funcoll world of one rank.

Every eager ``dist.*`` call on a funcoll group and every ``_c10d_functional`` op (with ``funcoll.install(["xla"])``),
eagerly and under ``torch.compile(backend="openxla", fullgraph=True)``, is compared with a reference computed on
the CPU from the ranks' inputs (one rank here: the reference still applies the op, e.g. PREMUL_SUM's factor,
AVG's integer truncation, the gathered layout). Eager calls must cause no graph execution and no CPU fallback
before a result is read. Multi-replica behaviour is checked by HLO (test_xla_hlo.py).
"""

import os

import pytest

pytest.importorskip("torch_xla", reason="needs torch_xla (the XLA transport); runs on PJRT_DEVICE=CPU")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.distributed._functional_collectives as fc  # noqa: E402
import torch_xla  # noqa: E402
import torch_xla.debug.metrics as met  # noqa: E402

import funcoll  # noqa: E402
from funcoll import xla  # noqa: E402
from tests import reference as ref  # noqa: E402

pytestmark = pytest.mark.xla
R = dist.ReduceOp
F = torch.ops._c10d_functional
OPS = ["all_gather_into_tensor", "all_gather_into_tensor_coalesced", "all_gather_into_tensor_out", "all_reduce",
       "all_reduce_", "all_reduce_coalesced", "all_reduce_coalesced_", "all_to_all_single", "broadcast",
       "broadcast_", "reduce_scatter_tensor", "reduce_scatter_tensor_coalesced"]


@pytest.fixture(scope="module")
def group():
    assert not dist.is_initialized(), "another test left a default process group behind"
    dist.init_process_group("funcoll", store=dist.HashStore(), rank=0, world_size=1)
    before = funcoll.installed()
    funcoll.install(["xla"])
    yield dist.group.WORLD
    if "xla" not in before:
        funcoll.uninstall(["xla"])
    dist.destroy_process_group()


def dev():
    return torch_xla.device()


def same(got, want):
    """Exact (the comparator of tests/reference.py with one rank: a one-rank reduction rounds nothing)."""
    return ref.close(got, want) is None


INPUTS = {
    torch.float32: [1.5, -2.0, 3.25, -0.0],
    torch.float16: [1.5, -2.0, 3.25, 0.5],
    torch.bfloat16: [1.5, -2.0, 3.25, 0.5],  # the CPU runtime has no bf16 all-reduce: moved, or AVG (in f32) only
    torch.int32: [5, -12, 7, 3],
    torch.int16: [5, -12, 7, 3],
    torch.uint8: [5, 200, 7, 3],
    torch.uint32: [5, 2 ** 31 + 7, 7, 3],
    torch.bool: [True, False, True, False],
}


def cpu_input(dtype):
    return torch.tensor(INPUTS[dtype], dtype=dtype)


REDUCE_CASES = [(op, dt) for op in ("SUM", "AVG", "PRODUCT", "MIN", "MAX", "BAND", "BOR", "BXOR", "PREMUL_SUM")
                for dt in INPUTS if op.lower() in ref.valid_ops(dt) and (dt != torch.bfloat16 or op == "AVG")]


class Steps:
    """Counts graph executions and CPU fallbacks (``aten::`` counters) while a call builds its collective."""

    @staticmethod
    def _executed():  # executions finish (and are counted) asynchronously: wait for them first
        torch_xla._XLAC._xla_wait_device_ops([])
        return (met.metric_data("ExecuteTime") or (0,))[0]

    def __enter__(self):
        torch_xla.sync()
        met.clear_counters()
        self.before = self._executed()
        return self

    def __exit__(self, *exc):
        self.executions = self._executed() - self.before
        self.fallbacks = sorted(c for c in met.counter_names() if c.startswith("aten::"))


# ---------------------------------------------------------------------------------------------------
# eager dist.* on a funcoll group
# ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("op,dtype", REDUCE_CASES, ids=[f"{o}-{str(d)[6:]}" for o, d in REDUCE_CASES])
def test_eager_all_reduce(group, op, dtype):
    x = cpu_input(dtype).to(dev())
    with Steps() as s:
        dist.all_reduce(x, op=ref.c10d_op(op.lower()))
    assert same(x, ref.reduce(op, [cpu_input(dtype)]))
    assert (s.executions, s.fallbacks) == (0, [])


def _eager_calls():
    """name -> (call(input on XLA) -> outputs, reference(cpu input) -> outputs, graph executions allowed)."""
    def bc(x):
        dist.broadcast(x, src=0)
        return [x]

    def ag(x):
        o = torch.empty(4, dtype=x.dtype, device=x.device)
        dist.all_gather_into_tensor(o, x)
        return [o]

    def ag_list(x):
        outs = [torch.empty_like(x)]
        dist.all_gather(outs, x)
        return outs

    def rs(op):
        def run(x):
            o = torch.empty(4, dtype=x.dtype, device=x.device)
            dist.reduce_scatter_tensor(o, x, op=op)
            return [o]
        return run

    def rs_list(x):
        o = torch.empty_like(x)
        dist.reduce_scatter(o, [x])
        return [o]

    def a2a(splits, bound=None):
        def run(x):
            o = torch.empty_like(x)
            if bound is None:
                dist.all_to_all_single(o, x, splits, splits)
            else:
                with xla.static_split_bound(bound):
                    dist.all_to_all_single(o, x, splits, splits)
            return [o]
        return run

    def a2a_list(x):
        outs = [torch.empty_like(x)]
        dist.all_to_all(outs, [x])
        return outs

    def reduce(x):
        dist.reduce(x, dst=0, op=R.MAX)
        return [x]

    def gather(x):
        outs = [torch.empty_like(x)]
        dist.gather(x, outs, dst=0)
        return outs

    def scatter(x):
        o = torch.empty_like(x)
        dist.scatter(o, [x * 3], src=0)
        return [o]

    def coalesced(x):
        ts = [x.clone(), (x * 2).view(2, 2)]
        dist.all_reduce_coalesced(ts, op=R.AVG)
        return ts

    def barrier(x):
        dist.barrier()
        return [x]

    ident = lambda x: [x]  # noqa: E731 - one rank: the gathered/scattered/broadcast value is the input itself
    return {
        "broadcast": (bc, ident, 0),
        "all_gather_into_tensor": (ag, ident, 0),
        "all_gather (list)": (ag_list, ident, 0),
        "reduce_scatter_tensor sum": (rs(R.SUM), ident, 0),
        "reduce_scatter_tensor avg": (rs(R.AVG), ident, 0),
        "reduce_scatter (list)": (rs_list, ident, 0),
        "all_to_all_single even": (a2a(None), ident, 0),
        # split sizes passed take the uneven exchange whatever their values (a rank cannot know that its peers' are
        # equal too): the ranks agree on the largest split first, one sync; the agreed splits are even, so the even
        # exchange follows
        "all_to_all_single split sizes (agreement: one sync)": (a2a([4]), ident, 1),
        "all_to_all_single split sizes, static bound": (a2a([4], bound=6), ident, 0),
        "all_to_all (list: sizes given, agreement: one sync)": (a2a_list, ident, 1),
        "reduce max": (reduce, lambda x: [ref.reduce(R.MAX, [x])], 0),
        "gather": (gather, ident, 0),
        "scatter": (scatter, lambda x: [x * 3], 0),
        "all_reduce_coalesced avg": (coalesced,
                                     lambda x: [ref.reduce(R.AVG, [x]), ref.reduce(R.AVG, [x * 2]).view(2, 2)], 0),
        "barrier": (barrier, ident, 0),
    }


EAGER = _eager_calls()


@pytest.mark.parametrize("name", list(EAGER))
@pytest.mark.parametrize("dtype", [torch.float32, torch.int32], ids=["f32", "i32"])
def test_eager_collectives(group, name, dtype):
    call, reference, syncs = EAGER[name]
    x = cpu_input(dtype).to(dev())
    with Steps() as s:
        outs = call(x)
    want = reference(cpu_input(dtype))
    assert len(outs) == len(want) and all(same(o, w) for o, w in zip(outs, want)), (outs, want)
    assert (s.executions, s.fallbacks) == (syncs, [])


def test_eager_broadcast_is_bit_exact(group):
    x = torch.tensor([-0.0, float("inf"), float("-inf"), float("nan"), 1e-40, 3.0]).to(dev())
    dist.broadcast(x, src=0)
    got = x.cpu()
    want = torch.tensor([-0.0, float("inf"), float("-inf"), float("nan"), 1e-40, 3.0])
    assert torch.equal(got.view(torch.int32), want.view(torch.int32))


def test_split_sizes_at_the_static_bound_are_sent_as_they_are(group):
    """Split sizes passed are padded to the static split bound every rank promised, whatever their values: splits
    at the bound are the padded layout already (no sync, no copy), a split above it is the calling rank's
    ValueError before anything is built."""
    x = torch.arange(4.0).to(dev())
    out = torch.empty(4, device=dev())
    with xla.static_split_bound(4), Steps() as s:
        dist.all_to_all_single(out, x, [4], [4])
    assert (s.executions, s.fallbacks) == (0, [])
    assert same(out, torch.arange(4.0))
    too_big = r"a split size \(4\) exceeds the static split bound 3 promised by funcoll.xla.static_split_bound"
    with xla.static_split_bound(3), pytest.raises(ValueError, match=too_big):
        dist.all_to_all_single(out, x, [4], [4])


# ---------------------------------------------------------------------------------------------------
# the _c10d_functional ops and the upstream functional API: eager, and compiled with openxla
# ---------------------------------------------------------------------------------------------------
def functional_program(x, i, b, u, group_name):
    g = group_name
    out = {}
    out["all_reduce avg"] = F.wait_tensor(F.all_reduce(x, "avg", g))
    out["all_reduce max i32"] = F.wait_tensor(F.all_reduce(i, "max", g))
    out["all_reduce bxor i32"] = F.wait_tensor(F.all_reduce(i, "bxor", g))
    out["all_reduce band i32"] = F.wait_tensor(F.all_reduce(i, "band", g))
    out["all_reduce min u32"] = F.wait_tensor(F.all_reduce(u, "min", g))
    out["all_reduce product f16"] = F.wait_tensor(F.all_reduce(b.half(), "product", g))
    y = x.clone()
    F.wait_tensor(F.all_reduce_(y, "sum", g))
    out["all_reduce_"] = y
    c0, c1 = F.all_reduce_coalesced([x, i], "sum", g)
    out["all_reduce_coalesced 0"], out["all_reduce_coalesced 1"] = F.wait_tensor(c0), F.wait_tensor(c1)
    ws = [x.clone(), x * 2]
    F.all_reduce_coalesced_(ws, "sum", g)
    out["all_reduce_coalesced_ 0"], out["all_reduce_coalesced_ 1"] = F.wait_tensor(ws[0]), F.wait_tensor(ws[1])
    out["all_gather_into_tensor"] = F.wait_tensor(F.all_gather_into_tensor(x, 1, g))
    o = torch.empty_like(x)
    F.all_gather_into_tensor_out(x, 1, g, out=o)
    out["all_gather_into_tensor_out"] = F.wait_tensor(o)
    a0, a1 = F.all_gather_into_tensor_coalesced([x, i], 1, g)
    out["all_gather_into_tensor_coalesced 0"] = F.wait_tensor(a0)
    out["all_gather_into_tensor_coalesced 1"] = F.wait_tensor(a1)
    out["reduce_scatter_tensor"] = F.wait_tensor(F.reduce_scatter_tensor(x, "sum", 1, g))
    r0, r1 = F.reduce_scatter_tensor_coalesced([x, b], "avg", 1, g)
    out["reduce_scatter_tensor_coalesced 0"] = F.wait_tensor(r0)
    out["reduce_scatter_tensor_coalesced 1"] = F.wait_tensor(r1)
    out["all_to_all_single"] = F.wait_tensor(F.all_to_all_single(x, [4], [4], g))
    out["broadcast"] = F.wait_tensor(F.broadcast(x, 0, g))
    z = x.clone()
    F.wait_tensor(F.broadcast_(z, 0, g))
    out["broadcast_"] = z
    # the upstream API on top
    out["fc.all_reduce avg"] = fc.all_reduce(x, "avg", g)
    out["fc.all_gather_tensor"] = fc.all_gather_tensor(i, 0, g)
    out["fc.reduce_scatter_tensor"] = fc.reduce_scatter_tensor(x, "sum", 0, g)
    out["fc.all_to_all_single"] = fc.all_to_all_single(i, [4], [4], g)
    return {k: fc.wait_tensor(v) if isinstance(v, fc.AsyncCollectiveTensor) else v for k, v in out.items()}


def functional_reference(x, i, b, u):
    avg = lambda t: ref.reduce(R.AVG, [t])  # noqa: E731
    return {
        "all_reduce avg": avg(x), "all_reduce max i32": ref.reduce(R.MAX, [i]),
        "all_reduce bxor i32": ref.reduce(R.BXOR, [i]), "all_reduce band i32": ref.reduce(R.BAND, [i]),
        "all_reduce min u32": ref.reduce(R.MIN, [u]), "all_reduce product f16": ref.reduce(R.PRODUCT, [b.half()]),
        "all_reduce_": ref.reduce(R.SUM, [x]),
        "all_reduce_coalesced 0": ref.reduce(R.SUM, [x]), "all_reduce_coalesced 1": ref.reduce(R.SUM, [i]),
        "all_reduce_coalesced_ 0": ref.reduce(R.SUM, [x]), "all_reduce_coalesced_ 1": ref.reduce(R.SUM, [x * 2]),
        "all_gather_into_tensor": x, "all_gather_into_tensor_out": x,
        "all_gather_into_tensor_coalesced 0": x, "all_gather_into_tensor_coalesced 1": i,
        "reduce_scatter_tensor": ref.reduce(R.SUM, [x]),
        "reduce_scatter_tensor_coalesced 0": avg(x), "reduce_scatter_tensor_coalesced 1": avg(b),
        "all_to_all_single": x, "broadcast": x, "broadcast_": x,
        "fc.all_reduce avg": avg(x), "fc.all_gather_tensor": i, "fc.reduce_scatter_tensor": ref.reduce(R.SUM, [x]),
        "fc.all_to_all_single": i,
    }


def _inputs():
    return [cpu_input(d) for d in (torch.float32, torch.int32, torch.bfloat16, torch.uint32)]


def test_functional_ops_eager_and_compiled_equal_the_reference_and_each_other(group):
    cpu = _inputs()
    want = functional_reference(*cpu)
    xla = [t.to(dev()) for t in cpu]
    eager = {k: v.cpu() for k, v in functional_program(*xla, group.group_name).items()}
    assert sorted(eager) == sorted(want)
    assert [k for k in want if not same(eager[k], want[k])] == []

    compiles = []

    def counting_openxla(gm, example_inputs):
        from torch._dynamo.backends.registry import lookup_backend

        compiles.append(gm)
        return lookup_backend("openxla")(gm, example_inputs)

    torch._dynamo.reset()
    prog = torch.compile(functional_program, backend=counting_openxla, fullgraph=True)
    compiled = {k: v.cpu() for k, v in prog(*xla, group.group_name).items()}
    # torch_xla's openxla bridge hands every uint32 graph output back as int32 (even for t.clone()): same bits
    u32 = compiled.pop("all_reduce min u32")
    assert u32.dtype == torch.int32
    assert torch.equal(u32.to(torch.int64) & 0xFFFFFFFF, eager["all_reduce min u32"].to(torch.int64))
    assert [(k, compiled[k], eager[k]) for k in compiled if not same(compiled[k], eager[k])] == []
    # a second and a third call with the same shapes (new values): no new graph, no new XLA compilation
    xla2 = [(t * 2 if t.dtype != torch.bool else t).to(dev()) for t in cpu]
    again = {k: v.cpu() for k, v in prog(*xla2, group.group_name).items()}
    compile_time = (met.metric_data("CompileTime") or (0,))[0]
    again = {k: v.cpu() for k, v in prog(*xla2, group.group_name).items()}
    assert (met.metric_data("CompileTime") or (0,))[0] == compile_time
    assert len(compiles) == 1
    want2 = functional_reference(*[t * 2 for t in cpu])
    assert [k for k in want2 if k != "all_reduce min u32" and not same(again[k], want2[k])] == []


def test_compiled_graph_holds_funcoll_collectives_not_fallbacks(group):
    # the openxla bridge runs fallback ops outside the XLA graph: none of funcoll's ops may fall back
    x = cpu_input(torch.float32).to(dev())
    prog = torch.compile(lambda t: F.wait_tensor(F.broadcast(F.wait_tensor(F.all_reduce(t, "avg", group.group_name)),
                                                                0, group.group_name)),
                         backend="openxla", fullgraph=True)
    torch_xla.sync()
    met.clear_counters()
    got = prog(x).cpu()
    assert same(got, ref.reduce(R.AVG, [cpu_input(torch.float32)]))
    assert [c for c in met.counter_names() if c.startswith("aten::")] == []


# ---------------------------------------------------------------------------------------------------
# devices (DeepSpeed TPU review: never xla:{LOCAL_RANK})
# ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("spec", [None, 0, "0", " 0 ", "xla", "xla:0", torch.device("xla"), torch.device("xla", 0)],
                         ids=repr)
def test_device_index_accepts_every_spelling(spec):
    assert xla.device_index(spec) == 0
    assert xla.normalize_device(spec) == torch.device("xla", 0)


def test_local_rank_is_not_an_xla_device_index(monkeypatch):
    monkeypatch.setenv("LOCAL_RANK", "3")
    for spec in (3, os.environ["LOCAL_RANK"], "xla:3", torch.device("xla", 3)):
        with pytest.raises(ValueError) as e:
            xla.normalize_device(spec)
        assert str(e.value) == ("funcoll.xla: xla:3 is not addressable in this process (it has 1 XLA device: "
                                "xla:0..xla:0); a rank or LOCAL_RANK is not an XLA device index, use "
                                "torch_xla.device() (or index 0) in each process")


@pytest.mark.parametrize("spec,exc,message", [
    (True, TypeError, "funcoll.xla: device must be an int, a string or a torch.device, got True"),
    (1.0, TypeError, "funcoll.xla: device must be an int, a string or a torch.device, got float"),
    ("cpu", ValueError, "funcoll.xla: 'cpu' is not an XLA device; pass 'xla', 'xla:N' or an index of one of this "
                        "process's XLA devices"),
    ("gpu!", ValueError, "funcoll.xla: cannot read a device from 'gpu!'; pass an int, 'xla:N' or a torch.device"),
    (-1, ValueError, "funcoll.xla: xla:-1 is not addressable in this process (it has 1 XLA device: xla:0..xla:0); "
                     "a rank or LOCAL_RANK is not an XLA device index, use torch_xla.device() (or index 0) in each "
                     "process"),
])
def test_device_index_rejects_with_the_fix(spec, exc, message):
    with pytest.raises(exc) as e:
        xla.device_index(spec)
    assert str(e.value) == message


# ---------------------------------------------------------------------------------------------------
# install / uninstall
# ---------------------------------------------------------------------------------------------------
def _xla_lines(op):
    return [line for line in torch._C._dispatch_dump(f"_c10d_functional::{op}").splitlines()
            if line.startswith(("XLA", "Functionalize"))]


def test_install_twice_is_harmless_and_uninstall_restores_torch_xla(group):
    funcoll.uninstall(["xla"])
    original = {op: _xla_lines(op) for op in OPS + ["wait_tensor"]}
    assert "torch_xla/csrc/cross_replica_reduces.cpp" in original["all_reduce"][0]
    x = cpu_input(torch.float32).to(dev())
    with pytest.raises(RuntimeError, match="Unknown AllReduce type: avg"):
        F.all_reduce(x, "avg", group.group_name)
    xla.reset_token()

    funcoll.install(["xla"])
    first = {op: _xla_lines(op) for op in OPS + ["wait_tensor"]}
    assert funcoll.install(["xla"]) == ["xla"]
    assert {op: _xla_lines(op) for op in OPS + ["wait_tensor"]} == first
    for op in OPS + ["wait_tensor"]:
        active = [line for line in first[op] if line.startswith("XLA:")]
        assert len(active) == 1 and "funcoll/entry/kernels.py" in active[0], (op, first[op])
    for op in kernel_ops_with_functionalize():
        assert any(line.startswith("Functionalize:") and "funcoll/entry/kernels.py" in line for line in first[op]), op
    assert "XLA (inactive)" in "\n".join(first["all_reduce"])  # torch_xla's, overridden
    assert same(F.wait_tensor(F.all_reduce(x, "avg", group.group_name)), ref.reduce(R.AVG, [cpu_input(torch.float32)]))

    funcoll.uninstall(["xla"])
    funcoll.uninstall(["xla"])  # twice is harmless too
    assert {op: _xla_lines(op) for op in OPS + ["wait_tensor"]} == original
    assert all("funcoll/entry/kernels.py" not in line for op in OPS for line in _xla_lines(op))
    with pytest.raises(RuntimeError, match="Unknown AllReduce type: avg"):
        F.all_reduce(x, "avg", group.group_name)
    xla.reset_token()
    funcoll.install(["xla"])  # the module's other tests run installed


def kernel_ops_with_functionalize():
    from funcoll.entry import kernels

    return sorted(kernels.FUNCTIONALIZE)


def composite_run() -> list:
    """Run in a fresh interpreter (its default group is the composite one)."""
    dist.init_process_group("cpu:funcoll,xla:funcoll", store=dist.HashStore(), rank=0, world_size=1)
    t = torch.tensor([1.0, -2.0])
    dist.all_reduce(t, op=dist.ReduceOp.AVG)
    x = torch.tensor([1.5, 3.0], device=torch_xla.device())
    with funcoll.record() as log:
        dist.all_reduce(x, op=dist.ReduceOp.AVG)
    i = torch.tensor([5, 6], dtype=torch.int32, device=torch_xla.device())
    dist.all_reduce(i, op=dist.ReduceOp.BXOR)
    return [type(dist.group.WORLD).__name__, t.tolist(), x.cpu().tolist(), i.cpu().tolist(), log]


def test_composite_backend_string_routes_cpu_and_xla_through_funcoll():
    """``init_process_group("cpu:funcoll,xla:funcoll")``: one ProcessGroupFuncoll, CPU tensors over its gloo
    transport, XLA tensors over its XLA transport (AVG and BXOR filled; ProcessGroupXla would raise)."""
    from tests import fresh

    got = fresh.run("tests.xla.test_xla_exec:composite_run", env={"PJRT_DEVICE": "CPU"}, timeout=180)
    assert got == ["ProcessGroupFuncoll", [1.0, -2.0], [1.5, 3.0], [5, 6], [["all_reduce", ["avg=sum+scale"]]]]
