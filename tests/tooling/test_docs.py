"""The docs stay true: the capability table in docs/capabilities.md is the one the code produces."""

import pathlib

from funcoll.report import capability_table

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_capability_table_matches_the_code():
    page = (ROOT / "docs" / "capabilities.md").read_text()
    assert capability_table() in page, "regenerate the table with: ./dev python -m funcoll.report"


def test_readme_has_the_two_commands_and_ci_calls_the_test_one():
    readme = (ROOT / "README.md").read_text()
    assert "./dev demo" in readme and "./dev test" in readme
    assert "exec ./dev test" in (ROOT / ".ci" / "run").read_text()


def test_readme_example_is_the_runnable_quickstart_and_it_runs():
    import functools
    import os
    import subprocess
    import sys

    from funcoll.launch import _free_port

    code = (ROOT / "examples" / "quickstart.py").read_text()
    readme = (ROOT / "README.md").read_text()
    body = code.split("\n", 1)[1]  # the README shows the file without its "# Run on ..." line
    assert body.strip() in readme, "README's example must be examples/quickstart.py verbatim"
    want_xor = functools.reduce(lambda a, b: [x ^ y for x, y in zip(a, b)],
                                [[5 * (r + 1), 12 * (r + 1), 7 * (r + 1)] for r in range(2)])
    want_avg = [sum(v * (r + 1) for r in range(2)) / 2 for v in (1.0, 2.0, 3.0)]
    for profile, strategy in ((None, "native"), ("xccl", "avg=sum+scale")):
        env = dict(os.environ, PYTHONPATH=str(ROOT))
        env.pop("FUNCOLL_PROFILE", None)
        if profile:
            env["FUNCOLL_PROFILE"] = profile
        p = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
                            "--master-port", str(_free_port()), str(ROOT / "examples" / "quickstart.py")],
                           env=env, capture_output=True, text=True, timeout=180)
        assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-3000:]
        assert f"bxor: {want_xor} avg: {want_avg}" in p.stdout, p.stdout
        assert f"strategies: [('all_reduce', ['{strategy}'])]" in p.stdout, p.stdout
