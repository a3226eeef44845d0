"""funcoll held to PyTorch's backend test suite as upstream holds gloo (docs/conformance.md, tests/conformance/).

Runs ``DistributedTest._DistTestBase`` on 2 CPU ranks: gloo (the reference; cached per torch version) and funcoll,
native and under ``FUNCOLL_PROFILE=xccl``, on every test gloo does not skip. ~1 min per funcoll profile, ~2 min more
the first time (gloo). The full run: ``./dev python -m tests.conformance --full``.
"""

import pytest

from tests.conformance import compare

PROFILES = ("native", "xccl")


@pytest.fixture(scope="module")
def conformance():
    """``compare.run_all(PROFILES)``, its funcoll runs at the same time: each run (its own interpreter, logs and
    results file) spends most of its time waiting (the upstream harness polls its forked ranks every 0.1 s)."""
    from concurrent.futures import ThreadPoolExecutor

    compare.gloo_reference()  # cached per torch version: run (once) before the funcoll runs select by it
    with ThreadPoolExecutor(len(PROFILES)) as pool:
        parts = list(pool.map(lambda profile: compare.run_all((profile,)), PROFILES))
    return {"gloo": parts[0]["gloo"], "runs": [p["runs"][0] for p in parts],
            "comparisons": [p["comparisons"][0] for p in parts], "rows": parts[0]["rows"],
            "seconds": max(p["seconds"] for p in parts)}


@pytest.mark.parametrize("profile", PROFILES)
def test_every_test_gloo_passes_passes_on_funcoll_or_is_explained(conformance, profile):
    i = PROFILES.index(profile)
    run, cmp_ = conformance["runs"][i], conformance["comparisons"][i]
    assert run["profile"] == profile and run["backend"] == "funcoll"
    assert not cmp_["unexplained"], compare.report(conformance)
    gloo_pass = [n for n, (o, _, _) in conformance["gloo"]["results"].items() if o == "pass"]
    assert len(gloo_pass) >= 85, compare.counts(conformance["gloo"])  # the suite ran for real (90 on torch 2.14)
    passed = {n for n, (o, _, _) in run["results"].items() if o == "pass"}
    assert passed == set(gloo_pass) - {n for n, _ in cmp_["explained"]}


@pytest.mark.parametrize("profile", PROFILES)
def test_docs_list_no_stale_difference(conformance, profile):
    cmp_ = conformance["comparisons"][PROFILES.index(profile)]
    assert not cmp_["stale"], f"rows of docs/conformance.md for tests funcoll passes now: {cmp_['stale']}"


def test_the_suite_ran_on_funcoll_groups(conformance):
    """The runner checks in every test that the default group is a ProcessGroupFuncoll: a test that ran on another
    backend would have failed with this message."""
    for run in conformance["runs"]:
        assert "the default group is" not in open(run["log"]).read()


def test_known_differences_parse_and_apply():
    rows = compare.known_differences()
    names = {r["test"] for r in rows}
    assert {"test_send_recv_any_source", "test_sparse_all_reduce_sum"} <= names
    assert compare._applies(">=2.10", "2.14.1", "torch") and not compare._applies(">=2.10", "2.9.0", "torch")
    assert compare._applies("2.9", "2.9.0", "torch") and compare._applies("all", "2.9.0", "torch")
    assert compare._applies("xccl", "xccl", "profile") and not compare._applies("xccl", "native", "profile")


@pytest.mark.parametrize("profile", [None, "xccl"], ids=["native", "xccl"])
def test_upstream_functional_collective_checks_on_funcoll(profile):
    """tests/conformance/functional.py: the CPU-capable checks of upstream's test_c10d_functional_native.py and
    test_functional_api.py on a 2-rank funcoll world."""
    import torch

    from tests.conformance import functional as F

    r = F.run(profile)
    assert not r["unexplained"], "\n".join(r["failures"])
    assert not r["stale"], f"known failures that pass now: {r['stale']}"
    assert sorted(r["failed"]) == sorted(F.known_for(torch.__version__))
    assert len(r["done"]) + len(r["failed"]) == F.CHECKS
