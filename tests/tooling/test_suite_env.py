"""One suite however it is started: ``python -m pytest`` in an environment, without any of the variables ``./dev``
exports, runs as ``./dev test`` does (tests/conftest.py sets them before torch is imported). What goes wrong
otherwise: torch's device-backend autoload (the ``torch.backends`` entry points, run at ``import torch`` unless
``TORCH_DEVICE_BACKEND_AUTOLOAD=0``) loads TorchTPU into the test process, and libtpu's cloud metadata queries make
the multi-rank tests time out.
"""

import os
import re
import subprocess
import sys

import pytest

from tests.conftest import ROOT, SUITE_ENV

# what a plain shell has: none of ./dev's exports (nor the name of a funcoll environment)
UNSET = (*SUITE_ENV, "PYTHONPATH", "FUNCOLL_ENV", "FUNCOLL_COUNTS")


def _fake_backend(tmp_path):
    """An installed distribution with a ``torch.backends`` entry point (what torch_tpu declares) whose target writes
    a file when torch's autoload calls it: ``(its directory, the file)``."""
    site, marker = tmp_path / "site", tmp_path / "autoloaded"
    info = site / "fake_device_backend-0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: fake-device-backend\nVersion: 0\n")
    (info / "entry_points.txt").write_text("[torch.backends]\nfake_device = fake_device_backend:load\n")
    (site / "fake_device_backend.py").write_text(
        "import os\n\n\ndef load():\n    open(os.environ['FAKE_BACKEND_MARKER'], 'w').write('loaded')\n")
    return site, marker


def _env(site, marker, **extra):
    env = {k: v for k, v in os.environ.items() if k not in UNSET}
    return dict(env, PYTHONPATH=str(site), FAKE_BACKEND_MARKER=str(marker), **extra)


@pytest.mark.torchtpu  # where torch_tpu is installed this is the run that loaded it
def test_pytest_alone_runs_with_the_device_backend_autoload_off(tmp_path):
    site, marker = _fake_backend(tmp_path)
    # the probe works: a plain `import torch` in that environment runs the autoload (TPU_SKIP_MDS_QUERY: a torch_tpu
    # installed here loads too, quickly)
    p = subprocess.run([sys.executable, "-c", "import torch"], cwd=tmp_path, env=_env(site, marker,
                       TPU_SKIP_MDS_QUERY="1"), capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    assert marker.read_text() == "loaded"
    marker.unlink()
    # pytest started by hand, on the module whose pipeline tests timed out that way; collecting imports torch
    p = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--collect-only",
                        "tests/xpu/test_xpu_p2p.py"], cwd=ROOT, env=_env(site, marker), capture_output=True,
                       text=True, timeout=300)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    # collected (in the torchtpu environment, deselected: it runs only what needs torch_tpu)
    assert re.search(r"\b\d+ tests? collected\b|\bno tests collected \(\d+ deselected\)", p.stdout), p.stdout[-2000:]
    assert not marker.exists(), "torch's device-backend autoload ran in the test process"


def test_the_suite_sets_what_dev_exports():
    """tests/conftest.py's settings and ./dev's exports are the same names and defaults (./dev keeps its own for the
    demo and the bench; a value already set wins in both)."""
    text = open(os.path.join(ROOT, "dev")).read()
    exported = dict(re.findall(r'^export (\w+)="\$\{\1:-([^}]*)\}"$', text, re.M))
    exported.update(re.findall(r"^export (\w+)=(\w+)$", text, re.M))
    assert exported == SUITE_ENV
    assert re.search(r'^export PYTHONPATH="\$ROOT\$\{PYTHONPATH:\+:\$PYTHONPATH\}"$', text, re.M)
