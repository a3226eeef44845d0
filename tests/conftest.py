"""Suite-wide pytest hooks.

``./dev test`` runs the suite once per environment (torch 2.9 + torch_xla, newest torch) and prints one closing
line over all of them: each run appends its counts to the file named by ``FUNCOLL_COUNTS``.
"""

import os

import pytest
import torch


def pytest_report_header(config):
    from importlib import metadata

    try:  # the version only: importing torch_xla here would change what the tests see
        xla = "torch_xla " + metadata.version("torch_xla")
    except metadata.PackageNotFoundError:
        xla = "no torch_xla"
    return f"funcoll environment {os.environ.get('FUNCOLL_ENV', '?')}: torch {torch.__version__}, {xla}"


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    path = os.environ.get("FUNCOLL_COUNTS")
    if not path:
        return
    stats = terminalreporter.stats

    def n(*keys):  # as pytest's own closing line counts them
        return sum(len(stats.get(k, [])) for k in keys)

    with open(path, "a") as f:
        f.write(f"{n('passed')} {n('failed', 'error')} {n('skipped')}\n")


# -- runs of the command line shared by several modules (each takes ~20 s): one run, asserted on by every test that
# needs it ---------------------------------------------------------------------------------------------------------
@pytest.fixture(scope="session")
def bench_run():
    """``python -m bench 2 --no-docs`` (what ``./dev bench 2 --no-docs`` runs), run once for
    tests/tooling/test_bench.py: ``(completed process, docs/performance.md before it)``."""
    import subprocess
    import sys

    from tests.tooling.test_cli import ROOT, _env

    page = os.path.join(ROOT, "docs", "performance.md")
    before = open(page).read() if os.path.exists(page) else None
    return subprocess.run([sys.executable, "-m", "bench", "2", "--no-docs"], cwd=ROOT, env=_env(),
                          capture_output=True, text=True, timeout=900), before


@pytest.fixture(scope="session")
def demo_run():
    """``python -m funcoll demo`` (``funcoll.demo.main``, as ``python -m funcoll.demo`` calls it), run once for
    tests/tooling/test_demo.py and tests/tooling/test_cli.py."""
    from tests.tooling.test_cli import _run

    return _run("demo", timeout=400)
