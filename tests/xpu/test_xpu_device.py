"""Tensors stay on the device: every gap-filling strategy, run by funcoll's real algorithms over the XPU transport
class, creates and reads tensors on the input's device only - no host staging - and hands only such tensors to the
backend.

There is no XPU here, and fake XPU tensors cannot run in-place ops in a build without XPU support (they need the
XPU device guard), so the device is ``meta``: any tensor a strategy put on the host would show up as a CPU tensor.
The backend is a recorder (it only logs what it is handed); the numbers these strategies produce are checked for
real, over gloo, in test_xpu_profile.py.

The one documented exception is uneven all_to_all: its split-size agreement gathers 2 int64 per rank on the XPU
and copies those 2n integers to the host, because buffer sizes are host values. Its payload is padded, exchanged
and unpadded on the device. It needs real data, so it is not run here.
"""

import pytest
import torch
import torch.distributed as dist
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from funcoll import algorithms
from funcoll.transport import Done, xpu

DEV = torch.device("meta")


class Recorder:
    """Stands in for ProcessGroupXCCL: rank 0 of ``size``, logs (method, devices, dtype) of what it is handed."""

    def __init__(self, size):
        self._size = size
        self.log = []

    def rank(self):
        return 0

    def size(self):
        return self._size

    def __getattr__(self, name):
        def call(*args):
            tensors = [t for t in tree_flatten(list(args))[0] if isinstance(t, torch.Tensor)]
            self.log.append((name, {t.device for t in tensors}, {t.dtype for t in tensors}))
            return Done()

        return call


class DeviceSpy(TorchDispatchMode):
    """Logs every aten op whose tensor inputs or outputs are not on the device under test."""

    def __init__(self):
        super().__init__()
        self.off_device = []
        self.ops = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        self.ops += 1
        for t in tree_flatten((args, kwargs, out))[0]:
            if isinstance(t, torch.Tensor) and t.device != DEV:
                self.off_device.append((str(func), str(t.device)))
        return out


def run(size, fn, dtype, shape, caps=None):
    rec = Recorder(size)
    tp = xpu.XcclTransport(rec, caps or xpu.derive("2.9.0", None), device=DEV)
    ts = [torch.empty(shape, dtype=dtype, device=DEV) for _ in range(3)]
    with DeviceSpy() as spy:
        fn(tp, *ts)
    return rec, spy


def premul():
    return dist._make_nccl_premul_sum(0.5)


CASES = {
    "avg f32": (lambda tp, t, o, _: algorithms.all_reduce(tp, t, "avg").wait(), torch.float32, (6,)),
    "avg bf16": (lambda tp, t, o, _: algorithms.all_reduce(tp, t, "avg").wait(), torch.bfloat16, (6,)),
    "avg int32": (lambda tp, t, o, _: algorithms.all_reduce(tp, t, "avg").wait(), torch.int32, (6,)),
    "avg complex": (lambda tp, t, o, _: algorithms.all_reduce(tp, t, "avg").wait(), torch.complex64, (6,)),
    "premul_sum": (lambda tp, t, o, _: algorithms.all_reduce(tp, t, premul()).wait(), torch.float32, (6,)),
    "band int32": (lambda tp, t, o, _: algorithms.all_reduce(tp, t, "band").wait(), torch.int32, (6,)),
    "bxor bool": (lambda tp, t, o, _: algorithms.all_reduce(tp, t, "bxor").wait(), torch.bool, (6,)),
    "max int64": (lambda tp, t, o, _: algorithms.all_reduce(tp, t, "max").wait(), torch.int64, (6,)),
    "sum int16": (lambda tp, t, o, _: algorithms.all_reduce(tp, t, "sum").wait(), torch.int16, (6,)),
    "min uint16": (lambda tp, t, o, _: algorithms.all_reduce(tp, t, "min").wait(), torch.uint16, (6,)),
    "max uint64": (lambda tp, t, o, _: algorithms.all_reduce(tp, t, "max").wait(), torch.uint64, (6,)),
    "rs avg": (lambda tp, t, o, _: algorithms.reduce_scatter_tensor(tp, o[:6 // tp.size], t, "avg").wait(),
               torch.float32, (6,)),
    "rs bxor": (lambda tp, t, o, _: algorithms.reduce_scatter_tensor(tp, o[:6 // tp.size], t, "bxor").wait(),
                torch.int32, (6,)),
    "rs min uint32": (lambda tp, t, o, _: algorithms.reduce_scatter_tensor(tp, o[:6 // tp.size], t, "min").wait(),
                      torch.uint32, (6,)),
    "ag int16": (lambda tp, t, o, _: algorithms.all_gather_into_tensor(tp, torch.cat([o, o]), t).wait(),
                 torch.int16, (6,)),
    "ag fp8": (lambda tp, t, o, _: algorithms.all_gather_into_tensor(tp, torch.cat([o, o]), t).wait(),
               torch.float8_e4m3fn, (6,)),
    "bcast fp8": (lambda tp, t, o, _: algorithms.broadcast(tp, t, 1).wait(), torch.float8_e5m2, (6,)),
    "a2a even fp8": (lambda tp, t, o, _: algorithms.all_to_all_single(tp, o, t).wait(), torch.float8_e5m2, (6,)),
    "reduce avg": (lambda tp, t, o, _: algorithms.reduce(tp, t, 0, "avg").wait(), torch.float32, (6,)),
    "coalesced avg": (lambda tp, t, o, u: algorithms.all_reduce_coalesced(tp, [t, o, u.to(torch.bfloat16)],
                                                                          "avg").wait(),
                      torch.float32, (6,)),
}


@pytest.mark.parametrize("name", list(CASES))
def test_strategy_stays_on_the_device(name):
    fn, dtype, shape = CASES[name]
    rec, spy = run(2, fn, dtype, shape)
    assert spy.ops > 0
    assert spy.off_device == []
    assert rec.log, "nothing reached the backend"
    for method, devices, _ in rec.log:
        assert devices == {DEV}, (method, devices)


def test_strategies_and_native_calls_are_the_derived_ones():
    """What the recorder receives for a few gaps: the native primitive funcoll composes, never the refused one."""
    rec, _ = run(2, CASES["avg bf16"][0], torch.bfloat16, (6,))  # float32 reduce_scatter, bf16 all_gather
    assert [(m, d) for m, _, d in rec.log] == [("_reduce_scatter_base", {torch.float32}),
                                               ("_allgather_base", {torch.bfloat16})]
    rec, _ = run(2, CASES["band int32"][0], torch.int32, (6,))  # all_to_all, local band, all_gather
    assert [(m, d) for m, _, d in rec.log] == [("alltoall_base", {torch.int32}), ("_allgather_base", {torch.int32})]
    rec, _ = run(2, CASES["ag fp8"][0], torch.float8_e4m3fn, (6,))
    assert [(m, d) for m, _, d in rec.log] == [("_allgather_base", {torch.uint8})]
    rec, _ = run(3, CASES["rs bxor"][0], torch.int32, (6,))
    assert [(m, d) for m, _, d in rec.log] == [("alltoall_base", {torch.int32})]
    # with oneCCL 2022 the backend is handed AVG itself, on the device
    rec, spy = run(2, CASES["avg f32"][0], torch.float32, (6,), xpu.derive("2.9.0", "2022.0"))
    assert [(m, d) for m, _, d in rec.log] == [("allreduce", {torch.float32})] and spy.off_device == []


def test_control_device_is_the_transports_device():
    tp = xpu.XcclTransport(Recorder(2), xpu.derive("2.9.0", None), device=torch.device("xpu", 1))
    assert tp.control_device == torch.device("xpu", 1) and tp.device_type == "xpu"
    assert not torch.xpu.is_initialized()


def test_the_spy_sees_host_tensors_the_uneven_split_agreement():
    """Control: the spy does catch host tensors. The one place funcoll creates any is the split-size agreement of
    uneven all_to_all (2 int64 per rank, copied to the host to size the buffers), taken where the transport has no
    point-to-point (XCCL itself gets pairwise send/recv, with no agreement)."""
    from dataclasses import replace

    rec = Recorder(2)
    caps = xpu.derive("2.9.0", None)
    tp = xpu.XcclTransport(rec, replace(caps, primitives=caps.primitives - {"send_recv"}), device=DEV)
    x, out = torch.empty((6, 2), device=DEV), torch.empty((4, 2), device=DEV)
    with DeviceSpy() as spy, pytest.raises(NotImplementedError, match="meta"):
        algorithms.all_to_all_single(tp, out, x, [2, 2], [2, 4]).wait()
    assert [m for m, _, _ in rec.log] == ["_allgather_base"]  # the agreement: on the device, int64
    assert rec.log[0][1:] == ({DEV}, {torch.int64})
    # the local split sizes, built from Python ints on the host and moved to the device; the gathered 2n values
    # then come back with .cpu() (which meta cannot do: the NotImplementedError above)
    assert spy.off_device == [("aten.lift_fresh.default", "cpu")] * 2 + [("aten._to_copy.default", "cpu")]


def test_premul_sum_on_the_torch_2_15_row_stays_on_the_device():
    """torch 2.12+: the all_reduce goes to the backend with PREMUL_SUM (it scales the tensor in place itself); the
    reduce_scatter is funcoll's scaled copy and a SUM. Both on the device, nothing else sent."""
    caps = xpu.derive("2.15.0", None)
    rec, spy = run(2, CASES["premul_sum"][0], torch.float32, (6,), caps)
    assert [(m, d) for m, _, d in rec.log] == [("allreduce", {torch.float32})] and spy.off_device == []
    rs = lambda tp, t, o, _: algorithms.reduce_scatter_tensor(tp, o[:3], t, premul()).wait()  # noqa: E731
    rec, spy = run(2, rs, torch.float32, (6,), caps)
    assert [(m, d) for m, _, d in rec.log] == [("_reduce_scatter_base", {torch.float32})] and spy.off_device == []
