"""A reduce op is one row of ``funcoll.semantics.OPS``: a hypothetical op added as that one row (and nothing else) is
parsed by its names, refused with its name where its row says, planned as a local fill on transports that lack it,
reduced locally with its in-place reducer, computed by the reference and listed in the capability table."""

import dataclasses

import pytest
import torch

from funcoll import algorithms, reference, semantics
from funcoll.algorithms import planner
from funcoll.report import DryRunTransport, capability_table
from funcoll.semantics import OPS, OpRow, ReduceOp, Reduction
from funcoll.transport import gloo

ABSMAX = "absmax"  # a hypothetical reduce op: the largest absolute value (|x| of the element with the largest |x|)


@pytest.fixture
def absmax():
    """The op as one row, removed afterwards (and the plans made for it forgotten)."""
    OPS[ABSMAX] = OpRow(ABSMAX, (ABSMAX, "maxabs"), semantics.NO_COMPLEX + (semantics.NO_BOOL,),
                        lambda a, b: torch.maximum(a.abs_(), b.abs(), out=a),
                        exact=lambda column: max(abs(v) for v in column), wide=lambda w, factor: w.abs().amax(0))
    try:
        yield ABSMAX
    finally:
        del OPS[ABSMAX]
        planner.plan.cache_clear()


def test_the_registry_is_one_row_per_reduce_op_in_its_order():
    assert list(OPS) == list(ReduceOp)
    assert all(row.op is op and row.names[0] == str(op) for op, row in OPS.items())


def test_a_new_row_is_parsed_by_its_names(absmax):
    assert semantics.parse_reduction("MaxAbs", "all_reduce") == Reduction(ABSMAX)
    assert semantics.parse_reduction(ABSMAX, "all_reduce").op == ABSMAX
    with pytest.raises(ValueError) as err:
        semantics.parse_reduction("nand", "all_reduce")
    assert str(err.value) == ("funcoll.all_reduce: unknown reduce op 'nand'; use one of sum, avg, product, min, max, "
                              "band, bor, bxor, premul_sum, absmax")


@pytest.mark.parametrize("dtype,message", [
    (torch.complex64, "funcoll.all_reduce: reduce op absmax is not defined for complex tensors (torch.complex64); "
                      "only sum and avg are"),
    (torch.bool, "funcoll.all_reduce: reduce op absmax is not defined for bool tensors; convert to a floating point "
                 "dtype first"),
    (torch.float8_e4m3fn, "funcoll.all_reduce: torch.float8_e4m3fn tensors cannot be reduced (float8 is supported by "
                          "non-reducing ops only); upcast to bfloat16 or float32 before reducing"),
])
def test_a_new_row_is_refused_by_name_where_its_row_says(absmax, dtype, message):
    with pytest.raises(TypeError) as err:
        semantics.check_reduction("all_reduce", Reduction(ABSMAX), dtype)
    assert str(err.value) == message


def test_a_new_row_is_valid_on_the_dtypes_it_does_not_refuse(absmax):
    assert reference.valid_ops(torch.float32)[-1] == ABSMAX
    assert reference.valid_ops(torch.int16)[-1] == ABSMAX
    assert ABSMAX not in reference.valid_ops(torch.bool)
    semantics.check_reduction("all_reduce", Reduction(ABSMAX), torch.float32)  # no error


def _steps(caps, primitive, dtype):
    steps = planner.plan(caps, primitive, ABSMAX, dtype, 4).steps
    return "; ".join(f"{s.kind} {s.op} {str(s.dtype)[6:]}" for s in steps)


def test_a_new_row_is_planned_as_a_local_fill(absmax):
    caps = gloo.capabilities(None)
    no_a2a = dataclasses.replace(caps, primitives=caps.primitives - {"all_to_all"})
    assert _steps(caps, "all_reduce", torch.float32) == "rs_ag_local absmax float32"
    assert _steps(caps, "reduce_scatter", torch.float32) == "a2a_local absmax float32"
    assert _steps(caps, "all_reduce", torch.int16) == "widen absmax int32; rs_ag_local absmax int32"
    assert _steps(no_a2a, "all_reduce", torch.float32) == "gather_local absmax float32"
    assert _steps(no_a2a, "reduce_scatter", torch.float32) == "all_reduce_slice absmax float32"


def test_a_new_row_is_reduced_locally_with_its_in_place_reducer(absmax):
    """On a transport that only copies (each rank's "others" are this rank's own data), every local fill reduces
    blocks this test knows: the gathered rows are four copies of x, the exchanged blocks are x's four quarters."""
    caps = gloo.capabilities(None)
    no_a2a = dataclasses.replace(caps, primitives=caps.primitives - {"all_to_all"})
    x = torch.tensor([3.0, -7.0, 0.5, -0.25, 2.0, 1.0, -4.0, 6.0])
    quarters = x.view(4, 2).abs().amax(0)  # [max |x[0::2]|, max |x[1::2]|]
    out = x.clone()
    algorithms.all_reduce(DryRunTransport(no_a2a), out, "maxabs").wait()  # gather_local
    assert out.tolist() == x.abs().tolist()
    out = x.clone()
    algorithms.all_reduce(DryRunTransport(caps), out, ABSMAX).wait()  # rs_ag_local: this rank's block to every rank
    assert out.tolist() == quarters.repeat(4).tolist()
    out = torch.empty(2)
    algorithms.reduce_scatter_tensor(DryRunTransport(caps), out, x, ABSMAX).wait()  # a2a_local
    assert out.tolist() == quarters.tolist() == [4.0, 7.0]


@pytest.mark.parametrize("dtype", [torch.int32, torch.int8, torch.float32, torch.bfloat16])
def test_the_reference_computes_a_new_row(absmax, dtype):
    xs = [reference.make(dtype, (33,), rank, "absmax") for rank in range(3)]
    want = torch.stack([x.to(torch.float64 if dtype.is_floating_point else torch.int64) for x in xs]).abs().amax(0)
    got = reference.reduce(ABSMAX, xs)
    assert got.dtype == dtype
    assert torch.equal(got, want.to(dtype))  # an int8 -128's |x| = 128 wraps to -128 in both


def test_the_capability_table_lists_a_new_row(absmax):
    lines = capability_table(("gloo",)).splitlines()
    at = lines.index("| all_reduce absmax float32 | all_to_all+local absmax+all_gather |")
    assert lines[at - 1] == "| all_reduce bxor float32 | refused (TypeError) |"  # after the reduce ops' own lines


def test_the_capability_table_has_no_line_of_its_own_for_the_ops_its_lines_name():
    assert "absmax" not in capability_table(("gloo",))
    assert [line.split(" | ")[0] for line in capability_table(("gloo",)).splitlines()[2:12]] == [
        "| all_reduce sum float32/bfloat16", "| all_reduce avg float32", "| all_reduce avg bfloat16/float16",
        "| all_reduce avg int32", "| all_reduce premul_sum float32", "| all_reduce product int64",
        "| all_reduce min/max float32", "| all_reduce min/max int32", "| all_reduce band/bor/bxor int32",
        "| all_reduce bxor float32"]
