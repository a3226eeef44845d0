"""The capability table, derived from the code: each cell is what funcoll's algorithms (their reduction planner and
fallbacks) really do for that request on a real transport's capabilities (a dry run over a transport that only
copies), so the docs cannot drift from the code. ``python -m funcoll.report`` prints it as Markdown;
docs/capabilities.md holds it."""

from __future__ import annotations

import torch

from funcoll import algorithms, transport
from funcoll.semantics import Reduction


class DryRunTransport(transport.Transport):
    """Shape-correct primitives that move no data between ranks (used only to read which strategy runs)."""

    def __init__(self, caps, size=4):
        super().__init__(0, size, caps)

    def _all_reduce(self, t, red):
        return transport.DONE

    def _all_reduce_coalesced(self, ts, red):
        return transport.DONE

    def _all_gather(self, out, inp):
        out.view(self.size, -1).copy_(inp.reshape(1, -1))
        return transport.DONE

    def _reduce_scatter(self, out, inp, red):
        out.copy_(inp[: out.shape[0]])
        return transport.DONE

    def _all_to_all(self, out, inp, out_splits, in_splits):
        if out.numel() == inp.numel():
            out.copy_(inp)
        return transport.DONE

    def _broadcast(self, t, src):
        return transport.DONE

    def _reduce(self, t, dst, red):
        return transport.DONE

    def _gather(self, outs, inp, dst):
        return transport.DONE

    def _scatter(self, out, inps, src):
        return transport.DONE

    def _send(self, t, dst, tag):
        return transport.DONE

    def _recv(self, t, src, tag):
        return transport.DONE

    def _barrier(self):
        return transport.DONE


def _cell(caps, run) -> str:
    tp = DryRunTransport(caps)
    try:
        with algorithms.record() as log:
            run(tp).wait()
    except TypeError:
        return "refused (TypeError)"
    notes = [s for _, ns in log for s in ns]
    return "native" if notes == ["native"] else "; ".join(notes).replace("torch.", "")


def rows():
    n = 4
    f = lambda dt, k=8: torch.ones(k, dtype=dt)  # noqa: E731
    ar = lambda dt, op: (lambda tp: algorithms.all_reduce(tp, f(dt), op))  # noqa: E731
    yield "all_reduce sum float32/bfloat16", ar(torch.bfloat16, "sum")
    yield "all_reduce avg float32", ar(torch.float32, "avg")
    yield "all_reduce avg bfloat16/float16", ar(torch.bfloat16, "avg")
    yield "all_reduce avg int32", ar(torch.int32, "avg")
    yield "all_reduce premul_sum float32", lambda tp: algorithms.all_reduce(
        tp, f(torch.float32), Reduction(algorithms.R.PREMUL_SUM, 0.5))
    yield "all_reduce product int64", ar(torch.int64, "product")
    yield "all_reduce min/max float32", ar(torch.float32, "max")
    yield "all_reduce min/max int32", ar(torch.int32, "max")
    yield "all_reduce band/bor/bxor int32", ar(torch.int32, "bxor")
    yield "all_reduce bxor float32", ar(torch.float32, "bxor")
    yield "all_reduce sum bool (= any)", ar(torch.bool, "sum")
    yield "all_reduce sum int16", ar(torch.int16, "sum")
    yield "all_reduce sum uint32", ar(torch.uint32, "sum")
    yield "all_reduce max uint64", ar(torch.uint64, "max")
    yield "all_reduce sum complex64", ar(torch.complex64, "sum")
    yield "all_reduce max complex64", ar(torch.complex64, "max")
    yield "all_reduce sum float8_e4m3fn", lambda tp: algorithms.all_reduce(tp, f(torch.float8_e4m3fn), "sum")
    yield "all_reduce_coalesced (3 float32)", lambda tp: algorithms.all_reduce_coalesced(
        tp, [f(torch.float32, 2), f(torch.float32, 3), f(torch.float32, 4)], "sum")
    yield "reduce_scatter avg float32", lambda tp: algorithms.reduce_scatter_tensor(
        tp, f(torch.float32, 2), f(torch.float32), "avg")
    yield "reduce_scatter bor int32", lambda tp: algorithms.reduce_scatter_tensor(
        tp, f(torch.int32, 2), f(torch.int32), "bor")
    yield "all_gather float32", lambda tp: algorithms.all_gather_into_tensor(
        tp, f(torch.float32, 4 * n), f(torch.float32, 4))
    yield "all_gather uint16", lambda tp: algorithms.all_gather_into_tensor(
        tp, f(torch.uint16, 4 * n), f(torch.uint16, 4))
    yield "all_gather float8_e4m3fn", lambda tp: algorithms.all_gather_into_tensor(
        tp, f(torch.float8_e4m3fn, 4 * n), f(torch.float8_e4m3fn, 4))
    yield "all_to_all_single even", lambda tp: algorithms.all_to_all_single(tp, f(torch.float32), f(torch.float32))
    yield "all_to_all_single uneven", lambda tp: algorithms.all_to_all_single(
        tp, f(torch.float32, 6), f(torch.float32, 6), [1, 0, 3, 2], [1, 2, 3, 0])
    yield "broadcast", lambda tp: algorithms.broadcast(tp, f(torch.float32), 1)
    yield "reduce", lambda tp: algorithms.reduce(tp, f(torch.float32), 1, "sum")
    yield "gather", lambda tp: algorithms.gather(tp, None, f(torch.float32), 1)
    yield "scatter", lambda tp: algorithms.scatter(tp, f(torch.float32), None, 1)
    yield "barrier", lambda tp: algorithms.barrier(tp)


COLUMNS = ("gloo", "xccl", "xccl-2022-scale-up", "xla")


def transport_capabilities(name: str):
    """The capabilities of a real transport, by column name: ``gloo`` (the CPU transport), ``xccl`` (the XPU
    transport for an unknown or pre-2022 oneCCL, scale-out: what a job gets when nothing better is known),
    ``xccl-2022-scale-up`` (oneCCL >= 2022.0, all ranks on one node), ``xla`` (the XLA transport on a group whose
    replica groups have one size; torch_xla need not be installed: it is the ``xla`` profile, which a test checks
    against the transport). Any other name is a capability profile."""
    import torch

    from funcoll.transport import gloo, xpu

    if name == "gloo":
        return gloo.capabilities("gloo")
    if name == "xccl":
        return xpu.derive(torch.__version__, None, override="")
    if name == "xccl-2022-scale-up":
        return xpu.derive(torch.__version__, "2022.0", override="", topology="scale-up")
    return transport.profile(name)


def capability_table(profiles=COLUMNS) -> str:
    lines = ["| request | " + " | ".join(profiles) + " |", "|---|" + "---|" * len(profiles)]
    for name, run in rows():
        cells = [_cell(transport_capabilities(p), run) for p in profiles]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(capability_table(), end="")
