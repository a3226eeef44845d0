"""funcoll found by its backend name. torch >= 2.14 looks a backend string it does not know up in the
``torch.distributed.backends`` entry-point group and loads the backend only then (pytorch/pytorch#187388;
``Backend._ensure_backend_registered``, called by ``BackendConfig``, ``is_backend_available``, ``new_group`` and
``_new_process_group_helper``). funcoll declares itself there (pyproject.toml), so a process that never imports funcoll
gets it from ``init_process_group("funcoll")``, and servers that take a backend name (torchtitan, sglang) reach it
without code of their own.

The entry point is read from installed package metadata, which a checkout on PYTHONPATH has none of: the wheel is
built from this checkout, installed with ``pip install --no-deps --target`` into a directory of its own, and every run
here is a fresh interpreter whose import path is that directory (never the checkout), asserting that funcoll was not
imported before the call that names it and was imported, from that directory, by it. torch 2.9 does not read the group:
there the same calls (the torchtitan and sglang ones) run after ``import funcoll``, which the README asks for.
"""

import json
import os
import shutil
import signal
import subprocess
import sys

import pytest
import torch
import torch.distributed as dist

from funcoll.launch import _free_port
from tests import fresh

ROOT = fresh.ROOT
CASES = os.path.join(ROOT, "tests", "tooling", "by_name_cases.py")
LAZY = hasattr(dist.Backend, "_ensure_backend_registered")  # torch >= 2.14 reads the entry-point group
NOT_LAZY = (f"torch {torch.__version__} registers a backend only when its package is imported (torch >= 2.14 reads "
            "the torch.distributed.backends entry points): `import funcoll` first")
GROUP = "funcoll.entry.process_group.ProcessGroupFuncoll"


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """funcoll's wheel built from this checkout (a copy of what the wheel is made of, so the build writes nothing into
    the checkout) and installed into a directory of its own: ``(that directory, the wheel)``."""
    tmp = tmp_path_factory.mktemp("wheel")
    src = tmp / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(os.path.join(ROOT, name), src / name)
    shutil.copytree(os.path.join(ROOT, "funcoll"), src / "funcoll", ignore=shutil.ignore_patterns("__pycache__"))
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    p = subprocess.run([*pip, "wheel", "--no-deps", "--no-build-isolation", "-w", str(tmp / "dist"), str(src)],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-3000:]
    (wheel,) = (tmp / "dist").iterdir()
    site = tmp / "site"
    p = subprocess.run([*pip, "install", "--no-deps", "--no-index", "--target", str(site), str(wheel)],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-3000:]
    return str(site), wheel


def _checks(r: dict, site=None) -> None:
    """funcoll was loaded by the call, not before it, from the installed wheel (or, site None, imported first)."""
    if site is None:
        assert r["imported_before"] and r["registered_before"], r
        return
    assert not r["imported_before"] and not r["registered_before"], r
    assert r["imported_after"] and r["registered_after"], r
    assert r["funcoll_file"] == os.path.join(site, "funcoll", "__init__.py"), r
    assert r["dist_info"] == os.path.join(site, "funcoll-0.1.0.dist-info"), r


def test_the_wheel_declares_funcoll_in_torchs_backend_group(installed):
    """The metadata torch reads (on every torch: what the wheel holds): one entry named as the backend, whose target,
    called, registers that name, as ``_ensure_backend_registered`` checks after calling it."""
    from importlib import metadata

    import funcoll
    from funcoll.entry import c10d_patches
    from funcoll.entry.process_group import BACKEND_NAME

    site, _ = installed
    (d,) = [d for d in metadata.distributions(path=[site]) if d.metadata["Name"] == "funcoll"]
    eps = [e for e in d.entry_points if e.group == "torch.distributed.backends"]
    assert [(e.name, e.value) for e in eps] == [("funcoll", "funcoll.entry.c10d_patches:register_backend")]
    assert eps[0].name == BACKEND_NAME
    assert funcoll.register_backend is c10d_patches.register_backend  # what import funcoll runs
    c10d_patches.register_backend()  # torch calls it again after loading it: a no-op once registered
    assert dist.Backend._plugins["FUNCOLL"].creator_fn is c10d_patches._create


def test_a_run_given_the_wheels_directory_sees_no_checkout(installed):
    site, _ = installed
    r = fresh.run(CASES + ":where", path=[site], timeout=120)
    assert r["funcoll"] == os.path.join(site, "funcoll", "__init__.py")
    # "" is the working directory (python -c), outside the checkout
    assert ROOT not in r["sys_path"] and not r["cwd"].startswith(ROOT), r


@pytest.mark.skipif(not LAZY, reason=NOT_LAZY)
def test_named_without_import_funcoll(installed):
    """init_process_group("funcoll"), the "cpu:gloo,xpu:funcoll" string, is_backend_available and new_group, each in
    a process that never imported funcoll."""
    site, _ = installed
    cases = ("init", "parse", "available", "new_group")
    got = fresh.run_all({case: (f"{CASES}:{case}", "entry point") for case in cases}, path=[site], timeout=240)
    for r in got.values():
        _checks(r, site)
    assert got["init"]["group_class"] == GROUP and got["init"]["backend"] == "funcoll"
    assert got["init"]["result"] == [5, 12, 7]  # BXOR over one rank: the input
    assert got["parse"]["map"] == {"cpu": "gloo", "xpu": "funcoll"}
    assert got["available"]["available"] is True
    assert got["new_group"]["group_class"] == GROUP and got["new_group"]["backend"] == "funcoll"
    assert got["new_group"]["world_backend"] == "gloo"


@pytest.mark.skipif(not LAZY, reason=NOT_LAZY)
def test_torchrun_world_of_two_without_import_funcoll(installed, tmp_path):
    """``python -m torch.distributed.run --standalone --nproc-per-node 2`` of a script that calls
    ``init_process_group("funcoll")`` and never imports funcoll: both ranks' answers against sums computed here."""
    site, _ = installed
    env = dict(os.environ, PYTHONPATH=site)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nnodes", "1", "--nproc-per-node", "2",
           "--max-restarts", "0", CASES, str(tmp_path)]
    with open(tmp_path / "log", "w") as log:
        p = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            code = p.wait(timeout=240)
        except subprocess.TimeoutExpired:
            code = None
        finally:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
    log_text = (tmp_path / "log").read_text()
    assert code == 0, f"torchrun exited with {code}:\n{log_text[-4000:]}"
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    xs = [[5 * (r + 1), 12 * (r + 1), 7 * (r + 1)] for r in range(2)]
    for r, got in enumerate(ranks):
        _checks(got, site)
        assert (got["rank"], got["world"], got["group_class"], got["backend"]) == (r, 2, GROUP, "funcoll")
        assert got["bxor"] == [a ^ b for a, b in zip(*xs)] == [15, 20, 9]
        assert got["avg"] == [(1.0 + 2.0) / 2, (2.0 + 4.0) / 2, (3.0 + 6.0) / 2]


@pytest.fixture
def how_found(request):
    """(the runs' import path, the cases' ``found``, the directory funcoll must come from): the wheel's directory and
    no import where torch reads the entry points, else the checkout and ``import funcoll`` first."""
    if not LAZY:
        return [ROOT], "import", None
    site, _ = request.getfixturevalue("installed")
    return [site], "entry point", site


@pytest.mark.parametrize("cpu_backend", [False, True], ids=["funcoll", "xpu:funcoll,cpu:gloo"])
def test_torchtitan_routes_to_funcoll_through_default_device_backend_map(how_found, cpu_backend):
    """torchtitan asks ``Backend.default_device_backend_map`` for its device's backend: with
    ``default_device_backend_map["xpu"] = "funcoll"`` set before its init, its init_process_group makes a funcoll
    default group (the string it builds, with or without its CPU backend), and an AVG all_reduce over 2 ranks
    returns the mean computed here."""
    path, found, site = how_found
    port = _free_port()
    got = fresh.run_all({r: (f"{CASES}:torchtitan", found, r, 2, port, cpu_backend) for r in range(2)},
                        path=path, timeout=240)
    for r in range(2):
        _checks(got[r], site)
        want = "xpu:funcoll,cpu:gloo" if cpu_backend else "funcoll"
        assert got[r]["backend_string"] == want and got[r]["backend"] == want
        assert got[r]["group_class"] == GROUP  # the whole group is funcoll's: its CPU tensors go through gloo beneath
        assert got[r]["result"] == [(1.0 + 2.0) / 2, (2.0 + 4.0) / 2, (3.0 + 6.0) / 2]


def test_sglang_weight_update_group_on_funcoll(how_found):
    """sglang's ``init_weights_update_group`` with ``backend="funcoll"``: a 2-rank group made beside each process's
    own default group, as sglang's ``init_custom_process_group`` makes it; the weights broadcast from the trainer
    (rank 0) arrive bit for bit, async per tensor and as one flattened bucket."""
    path, found, site = how_found
    port = _free_port()
    got = fresh.run_all({r: (f"{CASES}:sglang", found, r, port) for r in range(2)}, path=path, timeout=240)
    for r in range(2):
        _checks(got[r], site)
        assert got[r]["group_class"] == GROUP and got[r]["backend"] == "funcoll" and got[r]["world_backend"] == "gloo"
        assert got[r]["equal"] == {"w": True, "b": True, "flat": True}
