"""The reduction planner, in process, table by table: (capabilities, primitive, op, dtype) -> plan."""

import pytest
import torch

from funcoll import semantics
from funcoll.algorithms import planner
from funcoll.semantics import ReduceOp as R
from funcoll.transport import ALL_DTYPES, PROFILES, gloo

T = torch


def caps_of(profile):
    return gloo.capabilities(None if profile == "gloo" else profile)


@pytest.mark.parametrize("profile,primitive,op,dtype,steps", [
    ("gloo", "all_reduce", "sum", T.float32, "native sum float32"),
    ("gloo", "all_reduce", "avg", T.int32, "avg_int sum int64; native sum int64"),
    ("gloo", "all_reduce", "sum", T.int16, "widen sum int32; native sum int32"),
    ("gloo", "all_reduce", "max", T.uint32, "signed_flip max int32; native max int32"),
    ("gloo", "all_reduce", "max", T.bool, "bool_op bor bool; native bor bool"),
    ("gloo", "all_reduce", "premul_sum", T.bfloat16, "premul sum bfloat16; native sum bfloat16"),
    ("xccl", "all_reduce", "avg", T.bfloat16, "avg_rs_ag sum float32"),
    ("xccl", "reduce_scatter", "avg", T.bfloat16, "avg_float32 sum float32; native sum float32"),
    ("xccl", "all_reduce", "bxor", T.int32, "rs_ag_local bxor int32"),
    ("xccl", "reduce_scatter", "bxor", T.int32, "a2a_local bxor int32"),
    ("xccl", "all_reduce", "max", T.int64, "rs_ag_local max int64"),
    ("xccl", "all_reduce", "max", T.bool, "bool_any sum uint8; native sum uint8"),
    ("xccl", "reduce_scatter", "min", T.bool, "bool_all sum uint8; native sum uint8"),
    ("xccl", "reduce", "avg", T.float32, "via_all_reduce avg float32; avg_float sum float32; native sum float32"),
    ("xccl", "all_reduce", "min", T.uint16, "signed_flip min int16; widen min int32; rs_ag_local min int32"),
    ("xccl", "all_reduce", "sum", T.complex64, "real_view sum float32; native sum float32"),
    ("xla", "all_reduce", "bxor", T.bool, "bool_parity sum uint8; native sum uint8"),
    ("xla", "all_reduce", "band", T.int32, "rs_ag_local band int32"),
    ("xla", "all_reduce", "max", T.bool, "bool_op bor bool; native bor bool"),
    ("xla", "reduce", "sum", T.float32, "via_all_reduce sum float32; native sum float32"),
])
def test_plans(profile, primitive, op, dtype, steps):
    plan = planner.plan(caps_of(profile), primitive, R(op), dtype, 4)
    assert "; ".join(f"{s.kind} {s.op} {str(s.dtype)[6:]}" for s in plan.steps) == steps


def test_notes_are_the_strategy_names_record_reports():
    xccl = caps_of("xccl")
    assert (planner.plan(xccl, "all_reduce", R.AVG, T.bfloat16).describe()
            == "avg=float32 reduce_scatter+scale+all_gather")
    assert planner.plan(xccl, "reduce_scatter", R.AVG, T.bfloat16).describe() == "avg=sum+scale in float32"
    assert planner.plan(xccl, "reduce", R.AVG, T.float32).notes == ("reduce=all_reduce", "avg=sum+scale")
    assert planner.plan(xccl, "all_reduce", R.MIN, T.uint16).notes == (
        "torch.uint16 min as torch.int16 with the sign bit flipped", "widen torch.int16->torch.int32",
        "all_to_all+local min+all_gather")
    assert planner.plan(caps_of("gloo"), "all_reduce", R.MAX, T.bool).notes == ("bool max as bor",)
    assert planner.plan(caps_of("gloo"), "all_reduce", R.SUM, T.float32).describe() == "native"


@pytest.mark.parametrize("profile", ["gloo", "xccl", "xla"])
@pytest.mark.parametrize("primitive", planner.REDUCING)
def test_every_valid_request_has_a_plan_that_ends_in_a_terminal(profile, primitive):
    caps = caps_of(profile)
    terminals = {planner.NATIVE, planner.GATHER_LOCAL, planner.A2A_LOCAL, planner.RS_AG_LOCAL, planner.AVG_RS_AG}
    for dtype in sorted(ALL_DTYPES | {T.complex64, T.complex128}, key=str):
        for op in R:
            red = semantics.Reduction(op, 2.0 if op is R.PREMUL_SUM else None)
            try:
                semantics.check_reduction("all_reduce", red, dtype)
            except TypeError:
                continue
            plan = planner.plan(caps, primitive, op, dtype)
            last = plan.steps[-1]
            assert last.kind in terminals, (primitive, op, dtype, plan)
            assert all(s.kind not in terminals for s in plan.steps[:-1])
            if last.kind == planner.NATIVE:  # what the transport is handed, it has
                assert caps.reduces(primitive if plan.steps[0].kind != planner.VIA_ALL_REDUCE else "all_reduce",
                                    last.op, last.dtype)
            # native as it is exactly when the capabilities say so (bool/complex always take their views)
            as_is = caps.reduces(primitive, op, dtype) and dtype != T.bool and not dtype.is_complex
            assert plan.native == as_is or (dtype == T.bool and plan.steps[0].kind == planner.NATIVE), (op, dtype)


def test_plans_are_cached_and_follow_the_capabilities():
    xccl, gloo_caps = caps_of("xccl"), caps_of("gloo")
    assert planner.plan(xccl, "all_reduce", R.AVG, T.float32) is planner.plan(xccl, "all_reduce", R.AVG, T.float32)
    assert planner.plan(gloo_caps, "all_reduce", R.AVG, T.float32).native
    assert not planner.plan(xccl, "all_reduce", R.AVG, T.float32).native
    assert PROFILES["xccl"].reduces("all_reduce", R.SUM, T.float32)


def test_unknown_primitive_is_a_value_error():
    with pytest.raises(ValueError, match=r"^funcoll.algorithms.planner: 'all_gather' is not a reducing primitive; "
                                         r"use one of \('all_reduce', 'reduce_scatter', 'reduce'\)$"):
        planner.plan(caps_of("gloo"), "all_gather", R.SUM, T.float32)


def test_bool_counts_are_exact_at_any_group_size():
    """uint8 counts the Trues below 256 ranks; from 256 on, any/all count in int32 (uint8 would wrap to 0); parity
    is exact in uint8 at any size (256 is even)."""
    xccl = caps_of("xccl")
    assert planner.plan(xccl, "all_reduce", R.MAX, T.bool, 255).steps[0].dtype == T.uint8
    assert planner.plan(xccl, "all_reduce", R.MAX, T.bool, 256).steps[0].dtype == T.int32
    assert planner.plan(xccl, "all_reduce", R.MIN, T.bool, 1024).steps[0].dtype == T.int32
    assert planner.plan(xccl, "all_reduce", R.BXOR, T.bool, 1024).steps[0].dtype == T.uint8


def test_uneven_all_to_all_plan_bounds_rounds_and_bytes():
    """The uneven all_to_all plan without a native alltoallv: pairwise only at world 2; above it the carried exchange,
    whose bytes, counted here from the split matrix itself (every split padded to the chunk, the rows above it once),
    stay within 1.3x the exact exchange (+ the headers) for splits up to 2x apart, at worlds 3 to 1024, or, where the
    exchange is latency-bound, at most 200 KB per rank above it and then in one collective (the chunk holds every
    split: no message); the plan is the same for any order of a rank's splits (it reads only the shared statistics)."""
    import random

    from funcoll.algorithms import planner as P

    assert P.a2a_plan(2, None, 256).kind == P.PAIRWISE
    padded_worlds = {}
    for row_bytes in (256, 4096):
        for n in (3, 4, 8, 64, 1024):
            rng = random.Random(n)
            sp = [[rng.randint(50, 100) for _ in range(n)] for _ in range(n)]
            stats = tuple(P.split_stats(row) for row in sp)
            p = P.a2a_plan(n, stats, row_bytes)
            assert p.kind == P.CARRIED
            assert P.a2a_plan(n, tuple(P.split_stats(sorted(row)) for row in sp), row_bytes) == p
            exact = sum(sum(row) for row in sp)
            moved = sum(max(s, p.chunk) for row in sp for s in row)
            if moved > 1.3 * exact * 1.02:  # 2%: the statistics are 8 sizes per rank
                assert (moved - exact) * row_bytes <= 200_000 * n, (n, row_bytes, p, moved / exact)
                assert p.chunk >= max(max(row) for row in sp), (n, row_bytes, p)
                padded_worlds.setdefault(row_bytes, []).append(n)
            assert P.a2a_plan(n, None, row_bytes, bound=100) == P.A2aPlan(P.CARRIED, 100)  # a promised bound
    # rows of 256 B pad at small worlds (latency-bound), not at 64 ranks and more; rows of 4 KiB never go past 1.3x
    assert set(padded_worlds) == {256} and max(padded_worlds[256]) <= 8, padded_worlds


def test_the_scale_model_has_a_row_for_every_strategy():
    from bench import model

    text = model.markdown()
    for call in ("uneven all_to_all (2x)", "uneven all_to_all (one sender)", "uneven list all_gather",
                 "uneven list reduce_scatter", "gather", "scatter", "size guard (per call)", "debug check (per call)"):
        assert f"| {call} |" in text, call
    # no planned strategy's sequential rounds grow with the world: the carried exchange's are at most 2, 8 to 1024
    for kind in ("2x", "hot x4", "one sender"):
        row = next(line for line in text.splitlines()
                   if line.startswith(f"| uneven all_to_all ({kind}) | carried (planned)"))
        rounds = [int(cell.split(" / ")[1]) for cell in row.strip("|").split("|")[3:]]
        assert len(rounds) == len(model.WORLDS) and max(rounds) <= 2, row
