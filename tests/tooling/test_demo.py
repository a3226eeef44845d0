"""The README's first command works: the demo runs, agrees native vs xccl profile, eager vs compiled."""


def test_demo_runs_and_agrees(demo_run):
    p = demo_run  # one run of the demo for this module and tests/tooling/test_cli.py (tests/conftest.py)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    assert "native == xccl profile on every call: True" in p.stdout
    assert "eager == compiled training step (bit-identical): True" in p.stdout
    assert "all_to_all+local bxor+all_gather" in p.stdout and "uneven all_to_all=pairwise send/recv" in p.stdout
