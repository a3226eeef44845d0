"""Suite-wide settings and pytest hooks.

``python -m pytest`` in any of funcoll's environments runs the suite as ``./dev test`` does: the settings ``./dev``
exports are set here, before torch is imported (a value already set wins, as in ``./dev``), and the ``torchtpu``
environment runs only the tests that need TorchTPU, whichever way pytest was started.

``./dev test`` runs the suite once per environment (torch 2.9 + torch_xla, the newest torch, TorchTPU's) and prints
one closing line over all of them: each run appends its counts to the file named by ``FUNCOLL_COUNTS``.
"""

import glob
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# what ./dev exports (tests/tooling/test_suite_env.py checks the two agree), set before torch is imported: torch
# autoloads device backends at import (TorchTPU is one: the suite runs as on a machine without them, and the TorchTPU
# tests load it themselves in fresh interpreters); libtpu would otherwise spend minutes asking a cloud metadata server
# that is not there; torch_xla runs on the CPU PJRT device; output is unbuffered
SUITE_ENV = {"TORCH_DEVICE_BACKEND_AUTOLOAD": "0", "TPU_SKIP_MDS_QUERY": "1", "PJRT_DEVICE": "CPU",
             "PYTHONUNBUFFERED": "1"}
for _k, _v in SUITE_ENV.items():
    os.environ.setdefault(_k, _v)
# the suite's own switch (not ./dev's: the demo and the bench run the transports as users do): every primitive is
# checked against the transport's capabilities and counted in Transport.calls, in this process and those it starts
os.environ.setdefault("FUNCOLL_COUNT_CALLS", "1")
# this checkout first on the path of every process the tests start (pytest puts it on this process's path itself)
if ROOT not in os.environ.get("PYTHONPATH", "").split(os.pathsep):
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")]))

import pytest  # noqa: E402
import torch  # noqa: E402


def environment() -> str:
    """The funcoll environment this interpreter belongs to: ``FUNCOLL_ENV`` (./dev sets it), else the name in the
    stamp ./dev leaves in the environment it made (``<venv>/.funcoll-<name>-<hash of its requirements>``)."""
    name = os.environ.get("FUNCOLL_ENV")
    if name:
        return name
    stamps = glob.glob(os.path.join(sys.prefix, ".funcoll-*"))
    return os.path.basename(stamps[0])[len(".funcoll-"):].rsplit("-", 1)[0] if len(stamps) == 1 else "?"


# the tests that need the torch_tpu package itself: all of tests/torchtpu and those marked ``torchtpu``; they are all
# the ``torchtpu`` environment runs
TORCHTPU_DIR = os.path.join(ROOT, "tests", "torchtpu")


def _needs_torchtpu(item) -> bool:
    return str(item.path).startswith(TORCHTPU_DIR + os.sep) or item.get_closest_marker("torchtpu") is not None


def pytest_ignore_collect(collection_path, config):
    """The torchtpu environment does not even collect a test file outside tests/torchtpu whose text names no
    ``torchtpu`` mark (collecting would import it, and count the modules that skip, e.g. the XLA ones)."""
    if environment() != "torchtpu" or collection_path.suffix != ".py" or not collection_path.name.startswith("test_"):
        return None
    if str(collection_path).startswith(TORCHTPU_DIR + os.sep):
        return None
    return True if "mark.torchtpu" not in collection_path.read_text() else None


def pytest_collection_modifyitems(config, items):
    if environment() != "torchtpu":
        return
    keep = [i for i in items if _needs_torchtpu(i)]
    dropped = [i for i in items if not _needs_torchtpu(i)]
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = keep


def pytest_sessionfinish(session, exitstatus):
    # the torchtpu environment given only tests it does not run (./dev test tests/xpu): nothing to run is no failure
    if environment() == "torchtpu" and exitstatus == pytest.ExitCode.NO_TESTS_COLLECTED:
        session.exitstatus = pytest.ExitCode.OK


def pytest_report_header(config):
    from importlib import metadata

    try:  # the version only: importing torch_xla here would change what the tests see
        xla = "torch_xla " + metadata.version("torch_xla")
    except metadata.PackageNotFoundError:
        xla = "no torch_xla"
    try:
        tpu = "torch_tpu " + metadata.version("torch-tpu")
    except metadata.PackageNotFoundError:
        tpu = "no torch_tpu"
    name = environment()
    only = " (runs only the tests that need torch_tpu)" if name == "torchtpu" else ""
    return f"funcoll environment {name}: torch {torch.__version__}, {xla}, {tpu}{only}"


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
