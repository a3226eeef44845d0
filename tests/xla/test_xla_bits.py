"""Moves move bytes on XLA, executed on 2, 4 and 8 replicas of the XLA CPU runtime (funcoll.replicas, jaxlib) with
arbitrary bit patterns of float16, bfloat16, float32, float64 and the float8s (tests/bit_patterns.py: every float8
pattern; specials of both signs and random patterns, half of them NaNs with random payloads, for the others: NaN
payloads, signalling NaNs, -0.0, subnormals, inf).

One program, the same on every rank: broadcast from the first and the last rank, the functional broadcast, and the
world's all_gather_into_tensor and even all_to_all_single. A program per rank (each rank's module in its own process):
scatter and gather, whose root stacks its inputs or keeps the rows, and at world 4 the all_gather, all_to_all and
gather of a group whose replica groups have mixed sizes, which XLA has no all-gather or all-to-all for (funcoll fills
them with a masked all-reduce).

Every rank must end with the root's bits and the root's tensor keeps its own (NCCL and gloo copy these bytes); each
collective is of integers (a float all-reduce quiets signalling NaNs and canonicalises payloads, and XLA's CPU compiler
turns a float all-gather into one), a broadcast one all-reduce of the tensor's size; building the calls executes
nothing and falls back to the CPU for nothing (no host sync: ``torch_xla.debug.metrics``).

The inputs are uploaded as integers and read as floats on the device (an HLO ``bitcast-convert`` made here with
torch_xla's ``xla_op_registry``), the results read back as integers the same way: torch_xla 2.9 reads a float16 tensor
back to the host through float32, which canonicalises NaN payloads, so a float parameter would lose bits before any
collective ran. ``world_main(N)`` runs in a fresh interpreter (tests/fresh.py) and returns every rank's results.
"""

from __future__ import annotations

import re

import pytest

from tests import fresh
from tests.xla.replica_runs import XLA_CPU, mismatches, skip_without_replicas

WORLDS = (2, 4, 8)
KINDS = {"float16": "f16", "bfloat16": "bf16", "float32": "f32", "float64": "f64", "float8_e4m3fn": "f8e4m3fn",
         "float8_e5m2": "f8e5m2"}
INT_KIND = {1: "u8", 2: "s16", 4: "s32", 8: "s64"}
SMALL = 64  # elements per tensor (the specials, then random bits); float8: every pattern, 256
SMALL_OF = {name: 256 if name.startswith("float8") else SMALL for name in KINDS}


# ---------------------------------------------------------------------------------------------------
# the fresh interpreter: every rank's programs, executed on the replicas
# ---------------------------------------------------------------------------------------------------
_ops: dict = {}


def _bitcast(t, kind: str):
    """``t``'s bits as XLA element type ``kind``, on the device (an HLO bitcast-convert)."""
    import torch_xla.core.xla_op_registry as xor

    if kind not in _ops:
        _ops[kind] = xor.register(f"test_bits_{kind}", lambda x: x.bitcast(kind))
    return _ops[kind](t)


def _on_device(dtype, rank: int, salt: str, rows: int = 1):
    """Rank ``rank``'s patterns of ``dtype`` on the XLA device, uploaded as integers; ``rows`` x the length."""
    import torch
    import torch_xla

    from tests.bit_patterns import bits, patterns

    host = torch.cat([bits(patterns(dtype, rank, f"{salt}/{i}", SMALL)) for i in range(rows)])
    return _bitcast(host.to(torch_xla.device()), KINDS[str(dtype)[6:]])


def _back(t):
    """An XLA tensor of a float dtype as integers of its width (on the device)."""
    return _bitcast(t, INT_KIND[t.element_size()])


def _want(dtype, rank: int, salt: str, rows: int = 1) -> list:
    import torch

    from tests.bit_patterns import bits, patterns

    return torch.cat([bits(patterns(dtype, rank, f"{salt}/{i}", SMALL)) for i in range(rows)]).tolist()


def _dtypes():
    import torch

    return [getattr(torch, name) for name in KINDS]


def spmd_program(n: int, notes: list):
    """Broadcast from the first and the last rank, the functional broadcast, and the world's all_gather_into_tensor and
    even all_to_all_single (native on XLA), every dtype: the same program on every rank."""
    import torch
    import torch.distributed as dist
    import torch_xla.debug.metrics as met

    F = torch.ops._c10d_functional

    def fn():
        r = dist.get_rank()
        inputs, res = {}, {}
        for dt in _dtypes():
            name = str(dt)[6:]
            for src in (0, n - 1):
                inputs[f"broadcast {name} src={src}"] = _on_device(dt, r, f"bc {src}")
            inputs[f"functional broadcast {name}"] = _on_device(dt, r, "fbc")
            inputs[f"all_gather {name}"] = _on_device(dt, r, "ag")
            inputs[f"all_to_all {name}"] = _on_device(dt, r, "a2a", n)
        met.clear_all()
        for dt in _dtypes():
            name = str(dt)[6:]
            for src in (0, n - 1):
                t = inputs[f"broadcast {name} src={src}"]
                dist.broadcast(t, src=src)
                res[f"broadcast {name} src={src}"] = t
            res[f"functional broadcast {name}"] = F.wait_tensor(
                F.broadcast(inputs[f"functional broadcast {name}"], 1, dist.group.WORLD.group_name))
            x = inputs[f"all_gather {name}"]
            o = x.new_empty((n * x.numel(),))
            dist.all_gather_into_tensor(o, x)
            res[f"all_gather {name}"] = o
            x = inputs[f"all_to_all {name}"]
            o = torch.empty_like(x)
            dist.all_to_all_single(o, x)
            res[f"all_to_all {name}"] = o
        notes.append(_host_work(met))
        return {k: _back(v) for k, v in res.items()}

    def expected(rank):
        want = {}
        for dt in _dtypes():
            name = str(dt)[6:]
            for src in (0, n - 1):
                want[f"broadcast {name} src={src}"] = _want(dt, src, f"bc {src}")
            want[f"functional broadcast {name}"] = _want(dt, 1, "fbc")
            want[f"all_gather {name}"] = sum((_want(dt, q, "ag") for q in range(n)), [])
            want[f"all_to_all {name}"] = sum((_want(dt, q, "a2a", n)[rank * SMALL_OF[name]:(rank + 1) * SMALL_OF[name]]
                                              for q in range(n)), [])
        return want

    return fn, expected


def mpmd_program(n: int, notes: list):
    """scatter from and gather to the last rank (its root stacks its inputs, or keeps the rows: a program of its own),
    every dtype; and at world 4,
    all_gather_into_tensor, gather and all_to_all_single on the group of every rank but 0 (a lone group: its replica
    groups have mixed sizes, so XLA has no all-gather or all-to-all for it and funcoll fills them with a masked
    all-reduce), called by its members only."""
    import torch
    import torch.distributed as dist
    import torch_xla.debug.metrics as met

    members = list(range(1, n)) if n == 4 else []
    k = len(members)

    def fn():
        r = dist.get_rank()
        g = dist.new_group(members) if members else None
        inputs, res = {}, {}
        for dt in _dtypes():
            name = str(dt)[6:]
            inputs[f"scatter {name}"] = [_on_device(dt, j, "sc") for j in range(n)] if r == n - 1 else None
            inputs[f"scatter out {name}"] = _on_device(dt, r, "sc out")
            inputs[f"gather {name}"] = _on_device(dt, r, "gat")
            if r in members:
                inputs[name] = (_on_device(dt, r, "lag"), _on_device(dt, r, "la2a", k), _on_device(dt, r, "lgat"))
        met.clear_all()
        for dt in _dtypes():
            name = str(dt)[6:]
            out = inputs[f"scatter out {name}"]
            dist.scatter(out, inputs[f"scatter {name}"], src=n - 1)
            res[f"scatter {name}"] = out
            x = inputs[f"gather {name}"]
            outs = [torch.empty_like(x) for _ in range(n)] if r == n - 1 else None
            dist.gather(x, outs, dst=n - 1)
            for q, o in enumerate(outs or []):  # each read back as it is (XLA's CPU compiler concatenates bfloat16
                res[f"gather {name} from {q}"] = o  # through float32)
            if r not in members:
                continue
            ag_in, a2a_in, gat_in = inputs[name]
            o = ag_in.new_empty((k * ag_in.numel(),))
            dist.all_gather_into_tensor(o, ag_in, group=g)
            res[f"lone all_gather {name}"] = o
            o = torch.empty_like(a2a_in)
            dist.all_to_all_single(o, a2a_in, group=g)
            res[f"lone all_to_all {name}"] = o
            outs = [torch.empty_like(gat_in) for _ in members] if r == members[-1] else None
            dist.gather(gat_in, outs, dst=members[-1], group=g)
            for q, o in zip(members, outs or []):
                res[f"lone gather {name} from {q}"] = o
        notes.append(_host_work(met))
        return {key: _back(v) for key, v in res.items()}

    def expected(rank):
        want: dict = {}
        for dt in _dtypes():
            name = str(dt)[6:]
            want[f"scatter {name}"] = _want(dt, rank, "sc")
            if rank == n - 1:
                want.update({f"gather {name} from {q}": _want(dt, q, "gat") for q in range(n)})
            if rank not in members:
                continue
            me, size = members.index(rank), SMALL_OF[name]
            want[f"lone all_gather {name}"] = sum((_want(dt, q, "lag") for q in members), [])
            want[f"lone all_to_all {name}"] = sum((_want(dt, q, "la2a", k)[me * size:(me + 1) * size]
                                                   for q in members), [])
            if rank == members[-1]:
                want.update({f"lone gather {name} from {q}": _want(dt, q, "lgat") for q in members})
        return want

    return fn, expected


def _host_work(met) -> dict:
    """What building the calls ran on the host: torch_xla's CPU fallbacks and graph executions (none: no sync)."""
    return {"fallbacks": met.executed_fallback_ops(), "executions": met.counter_value("ExecuteComputation") or 0,
            "aten counters": [c for c in met.counter_names() if c.startswith("aten::")]}


def _collectives(text: str) -> list:
    """Every all-reduce, all-gather and all-to-all of an HLO module: ``(opcode, first operand's element type, its
    element count)``."""
    out = []
    for m in re.finditer(r"\b(all-reduce|all-gather|all-to-all)\((\w+)\[([\d,]*)\]", text):
        count = 1
        for d in filter(None, m.group(3).split(",")):
            count *= int(d)
        out.append((m.group(1), m.group(2), count))
    return out


def _bits_differ(got: list, want: list) -> str:
    bad = [i for i, (a, b) in enumerate(zip(got, want)) if a != b]
    first = bad[0] if bad else min(len(got), len(want))
    return f"{len(bad)} of {len(want)} elements differ, first at {first}"


def world_main(n: int) -> dict:
    import time

    from funcoll import replicas

    out: dict = {}
    for label, make in (("spmd", spmd_program), ("mpmd", mpmd_program)):
        start = time.monotonic()
        notes: list = []
        fn, expected = make(n, notes)
        world = replicas.capture(fn, n)
        got = replicas.execute(world)
        failures = mismatches(n, got, expected, _bits_differ)
        out[label] = {"failures": failures, "count": sum(len(expected(r)) for r in range(n)), "same": world.same,
                      "collectives": [_collectives(p.text) for p in world.ranks], "notes": notes,
                      "seconds": round(time.monotonic() - start, 1)}
    return out


# ---------------------------------------------------------------------------------------------------
# the tests
# ---------------------------------------------------------------------------------------------------
pytestmark = pytest.mark.xla
_cache: dict = {}
INTS = {"s16": "float16 bfloat16", "s32": "float32", "s64": "float64", "u8": "float8_e4m3fn float8_e5m2"}


def results() -> dict:
    if not _cache:
        skip_without_replicas()
        _cache.update(fresh.run_all({n: ("tests.xla.test_xla_bits:world_main", n) for n in WORLDS}, env=XLA_CPU))
    return _cache


def _int_of(name: str) -> str:
    return next(kind for kind, names in INTS.items() if name in names.split())


@pytest.mark.parametrize("n", WORLDS)
def test_every_rank_gets_the_roots_bits(n):
    got = results()[n]["spmd"]
    assert got["failures"] == [], "\n".join(got["failures"][:20])
    assert got["count"] == n * 5 * len(KINDS)
    assert got["same"] is True  # the root is device data, not a constant: one module for every rank


@pytest.mark.parametrize("n", WORLDS)
def test_scatter_gather_and_the_fills_of_a_group_of_mixed_replica_sizes_deliver_the_bits(n):
    got = results()[n]["mpmd"]
    assert got["failures"] == [], "\n".join(got["failures"][:20])
    lone = 0 if n != 4 else (n - 1) * 2 * len(KINDS) + (n - 1) * len(KINDS)  # all_gather, all_to_all; gather
    assert got["count"] == n * len(KINDS) + n * len(KINDS) + lone  # scatter on every rank, gather on its dst


@pytest.mark.parametrize("n", WORLDS)
def test_each_move_is_one_collective_of_integers_of_the_tensors_size(n):
    # broadcast: one all-reduce of the tensor's integers (the tensor's bytes); all_gather and all_to_all: XLA's own,
    # of integers (XLA's CPU compiler turns a float all-gather into a float all-reduce; the all-to-all has one operand
    # per rank, the first is counted)
    want = []
    for name in KINDS:
        ints, numel = _int_of(name), SMALL_OF[name]
        want += [("all-reduce", ints, numel)] * 3 + [("all-gather", ints, numel), ("all-to-all", ints, numel)]
    collectives = [[tuple(c) for c in rank] for rank in results()[n]["spmd"]["collectives"]]
    assert sorted(collectives[0]) == sorted(want)
    # scatter: one all-reduce of the n stacked rows, on every rank; gather: an all-gather, the lone group's fills
    # all-reduces, of integers
    for rank, found in enumerate(results()[n]["mpmd"]["collectives"]):
        found = [tuple(c) for c in found]
        scatters = [c for c in found if c[0] == "all-reduce" and c[2] in (n * SMALL, n * 256)]
        assert sorted(scatters) == sorted(("all-reduce", _int_of(name), n * SMALL_OF[name]) for name in KINDS), rank
        assert all(c[0] in ("all-reduce", "all-gather") and c[1] in INTS for c in found), found


@pytest.mark.parametrize("n", WORLDS)
def test_building_the_moves_runs_nothing_on_the_host(n):
    for label in ("spmd", "mpmd"):
        for note in results()[n][label]["notes"]:
            assert note == {"fallbacks": [], "executions": 0, "aten counters": []}, (label, note)
