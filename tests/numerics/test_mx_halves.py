"""The two halves of an MX tensor (torchao's MXTensor keeps packed fp4 pairs, ``float4_e2m1fn_x2``, and e8m0 scales,
``float8_e8m0fnu``, as two tensors, so a collective on an MX tensor is two collectives) are moved bit for bit by every
collective that moves data, on the path users get by default (no ``funcoll.record()`` around the call) and on the
full path, on the native gloo transport and under the xccl, xla and torchtpu capability profiles, at 2 and 3 CPU
ranks; every reduction of them is refused with funcoll's TypeError before anything is sent.

What the backends do with them (the oracle the test is written from): ProcessGroupXCCL maps both to onecclUint8 for
non-reducing ops from intel/torch-xpu-ops#5240 (merged 2026-09-18; before it they are not in ``xcclDatatypes``, a
TypeError); gloo moves neither ("Invalid scalar type", ProcessGroupGlooDetail.hpp ``GENERATE_ALL_TYPES``); both are
one byte per element, so their bytes are what moves. A tensor of each holds every byte pattern (tests/bit_patterns.py);
the expected bytes are the senders' inputs, rebuilt on every rank from the seed, never computed by funcoll.

Torch's own limits, asserted as they are: torch 2.9 has no copy kernel for ``float4_e2m1fn_x2`` (``clone``,
``copy_`` and ``contiguous`` of a strided one raise NotImplementedError '"copy_kernel" not implemented for
'Float4_e2m1fn_x2''; torch 2.15 has one), so torch's functional broadcast kernel, which begins with a clone of its
input, raises there before any collective (funcoll's kernel copies the bytes); every other path moves float4 on both
torches, strided tensors included, because funcoll moves both halves as their uint8 view from the first step.
"""

from __future__ import annotations

import os

import pytest
import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol

import funcoll
from funcoll.launch import run_world
from tests import profiles
from tests.bit_patterns import differ, patterns

MX = [torch.float8_e8m0fnu, torch.float4_e2m1fn_x2]
PROFILES = [None, "xccl", "xla", "torchtpu"]
F = torch.ops._c10d_functional


def _torch_copies_float4() -> bool:
    """Whether the running torch has a copy kernel for float4_e2m1fn_x2 (2.15: yes; 2.9: no)."""
    try:
        torch.empty(2, dtype=torch.uint8).view(torch.float4_e2m1fn_x2).clone()
    except NotImplementedError:
        return False
    return True


FLOAT4_COPIES = _torch_copies_float4()
NO_COPY = "\"copy_kernel\" not implemented for 'Float4_e2m1fn_x2'"
REFUSED = ("funcoll.{op}: {dt} tensors cannot be reduced ({kind} is supported by non-reducing ops only); upcast to "
           "bfloat16 or float32 before reducing")


def u8(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.uint8)


def pat(dt, rank, salt, numel=None):
    """Rank ``rank``'s bytes as ``dt`` (every byte pattern, cut to ``numel``), built from uint8."""
    b = u8(patterns(dt, rank, salt))
    return (b if numel is None else b[:numel]).view(dt)


def cat(ts, dt):
    """The concatenation of ``ts`` (tensors of ``dt``), made in uint8."""
    return torch.cat([u8(t).reshape(-1) for t in ts]).view(dt)


def strided(t: torch.Tensor, rows: int) -> torch.Tensor:
    """``t`` as ``[rows, -1]`` in a transposed (non-contiguous) layout, made in uint8: the same values."""
    b = u8(t).view(rows, -1)
    return b.t().contiguous().t().view(t.dtype)


def a2a_splits(n):
    """in_splits[r][j]: rows rank r sends rank j (one zero split per rank from 3 ranks on)."""
    return [[0 if n > 2 and (r + j) % n == 2 else (r + 2 * j) % 3 + 1 for j in range(n)] for r in range(n)]


def compiled(n: int, profile) -> bool:
    """Whether the world also runs the compiled cases: 2 ranks, the profiles tests/compiled runs (native, xccl)."""
    return n == 2 and profile in (None, "xccl")


def moves(rank, n):
    """Every move and gather of both halves; ``{name: difference or None}``, the notes of the full path, the dtypes
    that reached the backend, and the refusals."""
    group = dist.group.WORLD
    out: dict = {}
    errors: dict = {}

    def check(name, got, want):
        out[name] = differ(got, want)

    for dt in MX:
        name = str(dt).replace("torch.", "")
        x = pat(dt, rank, "ag")
        # all_gather_into_tensor, contiguous and strided input
        o = torch.empty(n * x.numel(), dtype=torch.uint8).view(dt)
        dist.all_gather_into_tensor(o, x)
        check(f"all_gather_into_tensor {name}", o, cat([pat(dt, r, "ag") for r in range(n)], dt))
        xs = strided(pat(dt, rank, "ags"), 16)
        o = torch.empty(n * 16, 16, dtype=torch.uint8).view(dt)
        dist.all_gather_into_tensor(o, xs)
        check(f"all_gather_into_tensor {name}, strided input", o,
              cat([strided(pat(dt, r, "ags"), 16) for r in range(n)], dt).view(n * 16, 16))
        # the list form, even and uneven (rank r's input has 8 * (r + 1) bytes)
        outs = [torch.empty(256, dtype=torch.uint8).view(dt) for _ in range(n)]
        dist.all_gather(outs, x)
        for r in range(n):
            check(f"all_gather (list) {name} from {r}", outs[r], pat(dt, r, "ag"))
        mine = pat(dt, rank, "agu", 8 * (rank + 1))
        outs = [torch.empty(8 * (r + 1), dtype=torch.uint8).view(dt) for r in range(n)]
        dist.all_gather(outs, mine)
        for r in range(n):
            check(f"all_gather (list, uneven) {name} from {r}", outs[r], pat(dt, r, "agu", 8 * (r + 1)))
        # all_to_all_single: even (12 bytes to each rank), uneven rows of 4 bytes, and the list form
        e = pat(dt, rank, "a2a", 12 * n)
        o = torch.empty(12 * n, dtype=torch.uint8).view(dt)
        dist.all_to_all_single(o, e)
        check(f"all_to_all_single (even) {name}", o,
              cat([u8(pat(dt, j, "a2a", 12 * n))[12 * rank:12 * rank + 12] for j in range(n)], dt))
        splits = a2a_splits(n)
        ins = [pat(dt, r, "a2av", 4 * sum(splits[r])).view(-1, 4) for r in range(n)]
        in_s, out_s = splits[rank], [splits[j][rank] for j in range(n)]
        want = cat([u8(ins[j])[sum(splits[j][:rank]):sum(splits[j][:rank + 1])] for j in range(n)], dt).view(-1, 4)
        o = torch.empty(sum(out_s), 4, dtype=torch.uint8).view(dt)
        dist.all_to_all_single(o, ins[rank], out_s, in_s)
        check(f"all_to_all_single (uneven) {name}", o, want)
        li = [pat(dt, rank * n + j, "a2al", 4 * (j + rank + 1)) for j in range(n)]
        lo = [torch.empty(4 * (rank + j + 1), dtype=torch.uint8).view(dt) for j in range(n)]
        dist.all_to_all(lo, li)
        for j in range(n):
            check(f"all_to_all (list) {name} from {j}", lo[j], pat(dt, j * n + rank, "a2al", 4 * (rank + j + 1)))
        # the functional collectives, through torch's CPU kernels (which call the group) and through funcoll's
        for kernel in ("torch", "funcoll"):
            if kernel == "funcoll":
                funcoll.install(["cpu"])
            try:
                got = F.wait_tensor(F.all_gather_into_tensor(x, n, group.group_name))
                check(f"functional all_gather_into_tensor {name} ({kernel})", got,
                      cat([pat(dt, r, "ag") for r in range(n)], dt))
                y = pat(dt, rank, "agc", 24)
                got = [F.wait_tensor(t) for t in F.all_gather_into_tensor_coalesced([x, y], n, group.group_name)]
                check(f"functional all_gather_into_tensor_coalesced {name} ({kernel}) [0]", got[0],
                      cat([pat(dt, r, "ag") for r in range(n)], dt))
                check(f"functional all_gather_into_tensor_coalesced {name} ({kernel}) [1]", got[1],
                      cat([pat(dt, r, "agc", 24) for r in range(n)], dt))
                got = F.wait_tensor(F.all_to_all_single(ins[rank], out_s, in_s, group.group_name))
                check(f"functional all_to_all_single (uneven) {name} ({kernel})", got, want)
                try:
                    got = F.wait_tensor(F.broadcast(pat(dt, rank, "fbc"), n - 1, group.group_name))
                    check(f"functional broadcast {name} ({kernel})", got, pat(dt, n - 1, "fbc"))
                except NotImplementedError as exc:
                    errors[f"functional broadcast {name} ({kernel})"] = str(exc).splitlines()[0]
            finally:
                if kernel == "funcoll":
                    funcoll.uninstall(["cpu"])
        # broadcast, from the first and the last rank, strided on odd ranks
        for src in (0, n - 1):
            t = pat(dt, rank, f"bc {src}")
            dist.broadcast(t, src=src)
            check(f"broadcast {name} src={src}", t, pat(dt, src, f"bc {src}"))
        t = pat(dt, rank, "bcs").view(16, 16)
        if rank % 2:
            t = strided(pat(dt, rank, "bcs"), 16)
        dist.broadcast(t, src=1)
        check(f"broadcast {name} src=1, strided on odd ranks", t, pat(dt, 1, "bcs").view(16, 16))
        # scatter from the last rank, gather to the first
        src = n - 1
        sins = [pat(dt, j, "sc", 32) for j in range(n)] if rank == src else None
        o = torch.empty(32, dtype=torch.uint8).view(dt)
        dist.scatter(o, sins, src=src)
        check(f"scatter {name}", o, pat(dt, rank, "sc", 32))
        gouts = [torch.empty(32, dtype=torch.uint8).view(dt) for _ in range(n)] if rank == 0 else None
        dist.gather(pat(dt, rank, "ga", 32), gouts, dst=0)
        if rank == 0:
            for j in range(n):
                check(f"gather {name} from {j}", gouts[j], pat(dt, j, "ga", 32))
        # point-to-point: a ring of isend/irecv, then the same ring as one batch into strided buffers
        nxt, prv = (rank + 1) % n, (rank - 1) % n
        r_buf = torch.empty(64, dtype=torch.uint8).view(dt)
        works = [dist.isend(pat(dt, rank, "p2p", 64), nxt), dist.irecv(r_buf, prv)]
        for w in works:
            w.wait()
        check(f"isend/irecv {name}", r_buf, pat(dt, prv, "p2p", 64))
        r_buf = strided(torch.zeros(64, dtype=torch.uint8).view(dt), 8)
        ops = [dist.P2POp(dist.irecv, r_buf, prv), dist.P2POp(dist.isend, strided(pat(dt, rank, "bp", 64), 8), nxt)]
        for w in dist.batch_isend_irecv(ops):
            w.wait()
        check(f"batch_isend_irecv {name}, strided buffers", r_buf, strided(pat(dt, prv, "bp", 64), 8))

    # compiled (aot_eager: funcoll's kernels or torch's run the graph's collectives), at 2 ranks on the profiles the
    # compiled suites run (tests/compiled: native and xccl)
    if compiled(n, os.environ.get("FUNCOLL_PROFILE") or None):
        for dt in MX:
            name = str(dt).replace("torch.", "")
            x, y = pat(dt, rank, "cag"), pat(dt, rank, "cagc", 8)
            splits = [[3, 7], [6, 4]]  # rows rank r sends rank j
            all_in = [pat(dt, r, "ca2a", 40).view(10, 4) for r in range(2)]
            ins, in_s, out_s = all_in[rank], splits[rank], [splits[j][rank] for j in range(2)]

            def moves_fn(x, y, ins, out_s=out_s, in_s=in_s):
                a = funcol.all_gather_tensor(x, 0, group)
                c = funcol.all_gather_into_tensor_coalesced([x, y], group)
                b = funcol.all_to_all_single(ins, out_s, in_s, group)
                return a, c[0], c[1], b

            def bcast_fn(x):
                return funcol.broadcast(x, 1, group)

            want_b = cat([u8(all_in[j])[sum(splits[j][:rank]):sum(splits[j][:rank + 1])] for j in range(2)],
                         dt).view(-1, 4)
            for kernel in ("torch", "funcoll"):
                if kernel == "funcoll":
                    funcoll.install(["cpu"])
                try:
                    torch._dynamo.reset()
                    a, c0, c1, b = torch.compile(moves_fn, backend="aot_eager", fullgraph=True)(x, y, ins)
                    check(f"compiled all_gather_tensor {name} ({kernel})", a,
                          cat([pat(dt, r, "cag") for r in range(2)], dt))
                    check(f"compiled all_gather_into_tensor_coalesced {name} ({kernel}) [0]", c0,
                          cat([pat(dt, r, "cag") for r in range(2)], dt))
                    check(f"compiled all_gather_into_tensor_coalesced {name} ({kernel}) [1]", c1,
                          cat([pat(dt, r, "cagc", 8) for r in range(2)], dt))
                    check(f"compiled all_to_all_single (uneven) {name} ({kernel})", b, want_b)
                    try:
                        got = torch.compile(bcast_fn, backend="aot_eager", fullgraph=True)(pat(dt, rank, "cbc"))
                        check(f"compiled broadcast {name} ({kernel})", got, pat(dt, 1, "cbc"))
                    except NotImplementedError as exc:
                        errors[f"compiled broadcast {name} ({kernel})"] = str(exc).splitlines()[0]
                finally:
                    if kernel == "funcoll":
                        funcoll.uninstall(["cpu"])
                    torch._dynamo.reset()

    # the same moves on the full path: what the strategies are, and what the backend was handed
    with funcoll.algorithms.record() as log:
        for dt in MX:
            o = torch.empty(n * 8, dtype=torch.uint8).view(dt)
            dist.all_gather_into_tensor(o, pat(dt, rank, "rec", 8))
            check(f"recorded all_gather_into_tensor {dt}", o, cat([pat(dt, r, "rec", 8) for r in range(n)], dt))
            t = pat(dt, rank, "recbc", 8)
            dist.broadcast(t, src=0)
            check(f"recorded broadcast {dt}", t, pat(dt, 0, "recbc", 8))
    notes = sorted({s for _, ss in log for s in ss})
    calls = sorted({str(d) for (_, _, d) in group.transport("cpu").calls if d is not None})

    # every reduction refused, the same message as float8's, nothing sent
    refused = {}
    tp = group.transport("cpu")
    sent = sum(tp.calls.values())
    for dt in MX:
        t = torch.zeros(2 * n, dtype=torch.uint8).view(dt)
        for op_name, call in (
                ("all_reduce", lambda t=t: dist.all_reduce(t)),
                ("reduce", lambda t=t: dist.reduce(t, 0, op=dist.ReduceOp.MAX)),
                ("reduce_scatter_tensor", lambda t=t: dist.reduce_scatter_tensor(t[:2], t)),
                ("reduce_scatter", lambda t=t: dist.reduce_scatter(t[:2], list(t.split(2)))),
                ("functional all_reduce", lambda t=t: F.wait_tensor(funcol.all_reduce(t, "avg", group))),
                ("functional all_reduce_coalesced",
                 lambda t=t: F.wait_tensor(funcol.all_reduce_coalesced([t], "max", group)[0]))):
            try:
                call()
                refused[(str(dt), op_name)] = "no error"
            except (TypeError, NotImplementedError) as exc:
                refused[(str(dt), op_name)] = (type(exc).__name__, str(exc).splitlines()[0])
    nothing_sent = sum(tp.calls.values()) == sent
    return {"diffs": out, "errors": errors, "notes": notes, "calls": calls, "refused": refused,
            "nothing_sent": nothing_sent}


@pytest.fixture(scope="module")
def results():
    cache: dict = {}

    def get(world, profile):
        if (world, profile) not in cache:
            cache[(world, profile)] = run_world("tests.numerics.test_mx_halves:moves", world, profile, timeout=170)
        return cache[(world, profile)]

    return get


def expected_cases(rank: int, n: int, profile) -> int:
    """How many comparisons a rank makes: per dtype 10 + 3n eager ones (the root of gather n more), 4 functional ones
    per kernel and, where :func:`compiled`, 4 compiled ones per kernel (each way with a broadcast per kernel, but
    torch's of float4 where torch has no copy for it), and 2 per dtype on the full path."""
    eager = 2 * (10 + 3 * n + (n if rank == 0 else 0))
    broadcasts = 3 + (1 if FLOAT4_COPIES else 0)  # per way of calling: two kernels (torch's cannot copy float4 on 2.9)
    functional = 2 * 2 * 4 + broadcasts
    return eager + functional + (2 * 2 * 4 + broadcasts if compiled(n, profile) else 0) + 4


@pytest.mark.parametrize("world", [2, 3])
@pytest.mark.parametrize("profile", profiles.params(PROFILES, ["gloo", "xccl", "xla", "torchtpu"]))
def test_mx_halves_move_bit_for_bit_and_are_never_reduced(results, world, profile):
    got = results(world, profile)
    for rank, res in enumerate(got):
        bad = {k: v for k, v in res["diffs"].items() if v is not None}
        assert not bad, (rank, bad)
        assert len(res["diffs"]) == expected_cases(rank, world, profile), (rank, sorted(res["diffs"]))
        # torch 2.9: torch's functional broadcast kernel clones the input first, which torch cannot do for
        # float4_e2m1fn_x2 (funcoll's kernel copies its bytes); nothing else needs a float4 copy
        ways = ("functional", "compiled") if compiled(world, profile) else ("functional",)
        assert res["errors"] == ({} if FLOAT4_COPIES else {
            f"{how} broadcast float4_e2m1fn_x2 (torch)": NO_COPY for how in ways}), (rank, res["errors"])
        # the full path moved each half as its uint8 view, and the backend was handed integers only
        assert {"torch.float8_e8m0fnu moved as torch.uint8", "torch.float4_e2m1fn_x2 moved as torch.uint8"} <= set(
            res["notes"]), res["notes"]
        assert ("broadcast=masked all_reduce" in res["notes"]) is (profile in ("xla", "torchtpu")), res["notes"]
        assert set(res["calls"]) <= {"torch.uint8", "torch.int64"}, res["calls"]
        # every reduction refused with float8's wording (torch 2.9's functional kernels clone a float4 input first)
        assert res["nothing_sent"], rank
        for dt in MX:
            kind = "float4" if dt == torch.float4_e2m1fn_x2 else "float8"
            for entry in ("all_reduce", "reduce", "reduce_scatter_tensor", "reduce_scatter", "functional all_reduce",
                          "functional all_reduce_coalesced"):
                op = entry.removeprefix("functional ")
                want = ("TypeError", REFUSED.format(op=op, dt=dt, kind=kind))
                if entry.startswith("functional") and dt == torch.float4_e2m1fn_x2 and not FLOAT4_COPIES:
                    want = ("NotImplementedError", NO_COPY)
                assert res["refused"][(str(dt), entry)] == want, (rank, dt, entry)
