"""Runs test modules' XLA replica programs in fresh interpreters (``python -m <module> <args>``, the module printing
``JSON:`` and its result), every run at once, and reads their results back; a run still going when the test ends is
killed."""

from __future__ import annotations

import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def run_modules(runs: dict, timeout: float = 600) -> dict:
    """``runs``: key -> (module, *args). Returns key -> the JSON the module printed; a run that exits non-zero fails
    with the end of its stderr."""
    env = dict(os.environ, PYTHONPATH=ROOT, PJRT_DEVICE="CPU")
    env.pop("FUNCOLL_PROFILE", None)
    procs = {key: subprocess.Popen([sys.executable, "-m", module, *map(str, args)], cwd=ROOT, env=env,
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for key, (module, *args) in runs.items()}
    out = {}
    try:
        for key, p in procs.items():
            stdout, stderr = p.communicate(timeout=timeout)
            assert p.returncode == 0, f"{' '.join(map(str, runs[key]))} failed:\n{stderr[-4000:]}"
            out[key] = json.loads(stdout.split("JSON:", 1)[1])
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()
                p.wait()
    return out


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
