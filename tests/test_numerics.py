"""Multi-process numerics: every op x reduce op x dtype, against independent references, for the native
gloo transport and under the xccl and xla capability profiles (the gap-filling strategies run for real)."""

import pytest

from tests.world import run_world

PROFILES = [None, "xccl", "xla"]


def _report(results):
    failures = [f for r in results for f in r["failures"]]
    assert not failures, f"{len(failures)} failing cases:\n" + "\n".join(failures[:30])


@pytest.fixture(scope="module")
def matrix():
    cache = {}

    def get(world, profile):
        key = (world, profile)
        if key not in cache:
            cache[key] = run_world("tests.cases_numerics:all_ops", world, profile, timeout=400)
        return cache[key]

    return get


@pytest.mark.parametrize("world", [2, 3])
@pytest.mark.parametrize("profile", PROFILES, ids=["gloo", "xccl", "xla"])
def test_every_op_dtype_reduce_op(matrix, world, profile):
    results = matrix(world, profile)
    assert results[0]["count"] > 300
    assert results[0]["caps"] == ("gloo" if profile is None else f"gloo[{profile}]")
    _report(results)


@pytest.mark.parametrize("world", [2, 3])
def test_xccl_profile_never_calls_what_xccl_lacks(matrix, world):
    results = matrix(world, "xccl")
    for r in results:
        calls = r["calls"]
        for key in calls:
            prim, op, dtype = key.split("|")
            assert op not in ("avg", "premul_sum", "band", "bor", "bxor"), key
            assert dtype not in ("torch.int16", "torch.uint16", "torch.uint32", "torch.uint64"), key
            if op in ("min", "max"):
                assert dtype.startswith("torch.float") or dtype == "torch.bfloat16", key
        # the strategies that fill those gaps did run
        s = r["strategies"]
        for needed in ("avg=sum+scale", "avg=sum+scale in float32", "premul_sum=scale+sum", "gather+local bxor",
                       "gather+local max", "widen torch.int16->torch.int32",
                       "torch.uint64 reduced as torch.int64", "torch.uint32 max as torch.int32 with the sign bit flipped",
                       "all_to_all+local band", "gather+local bor"):
            assert needed in s, (needed, s)
        assert any(x.startswith("uneven all_to_all=pad to") for x in s), s
        assert "torch.float8_e4m3fn moved as torch.uint8" in s


@pytest.mark.parametrize("world", [2, 3])
def test_native_gloo_uses_native_avg_and_bitwise(matrix, world):
    results = matrix(world, None)
    calls = results[0]["calls"]
    assert calls.get("all_reduce|avg|torch.float32", 0) > 0
    assert calls.get("all_reduce|bxor|torch.int32", 0) > 0
    assert calls.get("all_to_all|None|torch.float32", 0) == 0 or True
    assert not any(s.startswith("uneven all_to_all=pad") for s in results[0]["strategies"])
    assert "avg=sum+scale" not in results[0]["strategies"]


def test_xla_profile_fills_broadcast_and_bxor(matrix):
    s = matrix(2, "xla")[0]["strategies"]
    assert "broadcast=masked all_reduce" in s, s
    assert "gather+local bxor" in s and "gather=all_gather" in s and "scatter=broadcast+slice" in s
    assert "reduce=all_reduce" in s and "barrier=all_reduce of one element" in s


@pytest.mark.parametrize("profile", [None, "xccl"], ids=["gloo", "xccl"])
def test_functional_collectives_eager_and_compiled(profile):
    _report(run_world("tests.cases_numerics:functional", 2, profile, timeout=300))


@pytest.mark.parametrize("profile", [None, "xccl"], ids=["gloo", "xccl"])
def test_subgroups_of_three(profile):
    _report(run_world("tests.cases_numerics:subgroups", 3, profile, timeout=200))
