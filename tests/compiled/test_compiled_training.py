"""Eager == compiled: a training step whose gradients cross funcoll, on 2 ranks, native and FUNCOLL_PROFILE=xccl.

tests.compiled.cases_compiled:training trains a small model three SGD steps eagerly, with torch.compile(aot_eager) and
with torch.compile(inductor) (model and gradient averaging compiled with fullgraph=True). The hidden features
are all-gathered with all_gather_tensor_autograd (the backward reduce-scatters their gradient) and every
gradient is averaged with dist.all_reduce(op=AVG) (under the xccl profile: SUM then scale, funcoll's
strategy). Expected, and checked here:

* aot_eager runs the same aten kernels as eager: bit-identical parameters and losses;
* inductor generates its own fused C++ kernels for the elementwise work (bias, ReLU, MSE backward, the SGD
  update), whose float32 rounding may differ from eager's: within rtol=1e-5, atol=1e-6 (measured: at most
  3e-8, i.e. one ulp, after three steps);
* native and xccl profile bit-identical (AVG over 2 ranks: dividing by 2 and multiplying by 0.5 are exact);
* every variant within float32 tolerance of a single-process float64 reference on the whole batch;
* two graphs (the model, the averaging), no graph break, no recompilation over the three steps.
"""

import pytest
import torch

from funcoll.launch import run_world

from .cases_compiled import STEPS

MODES = ("eager", "aot_eager", "inductor")
INDUCTOR_TOL = dict(rtol=1e-5, atol=1e-6)


@pytest.fixture(scope="module")
def worlds():
    return {p: run_world("tests.compiled.cases_compiled:training", 2, p, timeout=420) for p in (None, "xccl")}


def runs(worlds):
    for profile, ranks in worlds.items():
        for rank, r in enumerate(ranks):
            yield profile, rank, r["train"]


def test_rank_side_checks_pass(worlds):
    for ranks in worlds.values():
        for r in ranks:
            assert r["failures"] == [], "\n".join(r["failures"])
            assert r["count"] == 57


def test_aot_eager_is_bit_identical_to_eager(worlds):
    for profile, rank, t in runs(worlds):
        for step in range(STEPS):
            assert torch.equal(t["aot_eager"]["params"][step], t["eager"]["params"][step]), (profile, rank, step)
            assert torch.equal(t["aot_eager"]["losses"][step], t["eager"]["losses"][step]), (profile, rank, step)


def test_inductor_matches_eager_within_tolerance(worlds):
    for _profile, _rank, t in runs(worlds):
        for step in range(STEPS):
            torch.testing.assert_close(t["inductor"]["params"][step], t["eager"]["params"][step], **INDUCTOR_TOL)
            torch.testing.assert_close(t["inductor"]["losses"][step], t["eager"]["losses"][step], **INDUCTOR_TOL)


def test_native_and_xccl_profile_are_bit_identical(worlds):
    for mode in MODES:
        for rank in range(2):
            native = worlds[None][rank]["train"][mode]
            xccl = worlds["xccl"][rank]["train"][mode]
            for step in range(STEPS):
                assert torch.equal(native["params"][step], xccl["params"][step]), (mode, rank, step)


def test_ranks_agree_and_match_the_single_process_reference(worlds):
    want = worlds[None][0]["reference"]  # computed on a rank: no autograd in this process (see train_reference)
    for profile, _rank, t in runs(worlds):
        for mode in MODES:
            for step in range(STEPS):
                got = t[mode]["params"][step]
                assert torch.equal(got, worlds[profile][0]["train"][mode]["params"][step])
                torch.testing.assert_close(got.double(), want[step], rtol=1e-5, atol=1e-6)
    # and training moved the parameters (a test of a no-op would pass the comparisons above)
    assert (want[-1] - want[0]).abs().max() > 1e-2


def test_the_xccl_profile_really_filled_avg(worlds):
    for profile, _rank, t in runs(worlds):
        for mode in MODES:
            # upstream's CPU kernels reach the group through its coalesced gather/reduce-scatter methods
            want = ["all_gather_into_tensor_coalesced: native",
                    "all_reduce: avg=sum+scale" if profile == "xccl" else "all_reduce: native",
                    "reduce_scatter_tensor_coalesced: native"]
            assert t[mode]["strategies"] == want, (profile, mode)


def test_compiled_once_no_break_no_recompile(worlds):
    for profile, rank, t in runs(worlds):
        assert t["eager"]["counts"] == {"graphs": 0, "graph_breaks": 0, "recompiles": 0, "reasons": []}
        for mode in ("aot_eager", "inductor"):
            assert t[mode]["counts"] == {"graphs": 2, "graph_breaks": 0, "recompiles": 0, "reasons": []}, \
                (profile, rank, mode)


def test_every_op_eager_style_and_autograd_with_inductor(worlds):
    once = {"graphs": 1, "graph_breaks": 0, "recompiles": 0, "reasons": []}
    for ranks in worlds.values():
        for r in ranks:
            assert r["counts inductor"] == {"every_op": once, "eager_style": once, "autograd": once}
