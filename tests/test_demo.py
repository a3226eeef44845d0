"""The README's first command works: the demo runs, agrees native vs xccl profile, eager vs compiled."""

import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_demo_runs_and_agrees():
    env = dict(os.environ, PYTHONPATH=ROOT, PJRT_DEVICE="CPU")
    env.pop("FUNCOLL_PROFILE", None)
    p = subprocess.run([sys.executable, "-m", "funcoll.demo"], cwd=ROOT, env=env, capture_output=True, text=True,
                       timeout=300)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    assert "native == xccl profile on every call: True" in p.stdout
    assert "eager == compiled training step (bit-identical): True" in p.stdout
    assert "all_to_all+local bxor+all_gather" in p.stdout and "uneven all_to_all=pairwise send/recv" in p.stdout
