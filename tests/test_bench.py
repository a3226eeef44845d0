"""The benchmark runs (a smoke test with 2 repetitions; its numbers are read by people, not asserted)."""

import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_bench_runs_and_reports_every_case():
    env = dict(os.environ, PYTHONPATH=ROOT, PJRT_DEVICE="CPU")
    env.pop("FUNCOLL_PROFILE", None)
    p = subprocess.run([sys.executable, "-m", "bench", "2"], cwd=ROOT, env=env, capture_output=True, text=True,
                       timeout=400)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    for case in ("all_reduce 1 KiB f32 latency", "AVG 4 MiB bf16: native vs sum+scale in f32",
                 "all_to_all 256 KiB: uneven native vs padded"):
        assert case in p.stdout, p.stdout
    try:
        import torch_xla  # noqa: F401
    except ImportError:
        return
    lines = [ln.split() for ln in p.stdout.splitlines() if ln.startswith("all_reduce sum 1 MiB f32")]
    assert [ln[5] for ln in lines] == ["torch_xla", "funcoll"], p.stdout
    # the same HLO size and one collective either way: funcoll's lowering adds nothing where torch_xla is native
    assert lines[0][-3:-1] == lines[1][-3:-1] and lines[1][-2] == "1", p.stdout
    assert "raises (not lowered)" in p.stdout
