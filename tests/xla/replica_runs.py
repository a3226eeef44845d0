"""What the tests that run XLA programs in a fresh interpreter (tests/fresh.py) share: the environment of such a run,
and the per-rank comparison of its results with the reference."""

from __future__ import annotations

import pytest

from funcoll.replicas import available

# a fresh interpreter with torch_xla on the CPU device, under funcoll's default profile
XLA_CPU = {"PJRT_DEVICE": "CPU", "FUNCOLL_PROFILE": None}


def skip_without_replicas() -> None:
    """Skips the calling test (or module) where funcoll.replicas cannot run: no torch_xla, or no jax and jaxlib."""
    why = available()
    if why:
        pytest.skip(why, allow_module_level=True)


def mismatches(n: int, got: list, expected, differ) -> list:
    """Every rank's results ``got[rank]`` (name -> tensor) against ``expected(rank)`` (name -> list of values): the
    cases on one side only, and for each case whose values differ, ``differ(values, wanted)``'s text."""
    failures = []
    for rank, res in enumerate(got):
        want = expected(rank)
        if set(res) != set(want):
            failures.append(f"[rank {rank}] cases {sorted(set(res) ^ set(want))} on one side only")
        for name in sorted(set(res) & set(want)):
            g = res[name].reshape(-1).tolist()
            if g != want[name]:
                failures.append(f"[world {n} rank {rank}] {name}: {differ(g, want[name])}")
    return failures
