"""tests/fresh.py, the runner of the tests that need a fresh interpreter: results, environment, failures, timeouts."""

import os
import time

import pytest

from tests import fresh


def test_results_come_back_as_json_with_the_environment_given():
    got = fresh.run_all({"joined": ("os.path:join", "a", "b"), "set": ("os:getenv", "FRESH_X"),
                         "removed": ("os:getenv", "HOME")}, env={"FRESH_X": "1", "HOME": None}, timeout=60)
    assert got == {"joined": "a/b", "set": "1", "removed": None}


def test_a_failing_run_fails_with_its_error():
    with pytest.raises(AssertionError, match=r"(?s)json:loads \[ failed \(exit code 1\):.*JSONDecodeError"):
        fresh.run("json:loads", "[", timeout=60)


def test_the_timeout_kills_the_run_and_what_it_started(tmp_path):
    pid_file = tmp_path / "pid"
    with pytest.raises(TimeoutError, match=r"did not finish in 3 s"):
        fresh.run("subprocess:call", ["sh", "-c", f"echo $$ > {pid_file}; exec sleep 60"], timeout=3)
    pid = int(pid_file.read_text())
    for _ in range(50):  # the killed sleep is reaped by its new parent
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.1)
    pytest.fail(f"the process the run started ({pid}) is still alive")


def test_a_run_given_a_path_sees_that_path_and_not_the_checkout(tmp_path):
    """``path=[...]``: the run's import path is exactly that (and the standard library), it starts outside the
    checkout, and its target is a file imported by its location."""
    (tmp_path / "probe.py").write_text(
        "import importlib.util, os, sys\n\n\ndef where():\n"
        "    return {'path': sys.path, 'cwd': os.getcwd(), 'funcoll': importlib.util.find_spec('funcoll') is not None,"
        " 'tests': importlib.util.find_spec('tests') is not None}\n")
    site = tmp_path / "site"
    site.mkdir()
    got = fresh.run(f"{tmp_path / 'probe.py'}:where", path=[str(site)], timeout=60)
    assert got["funcoll"] is False and got["tests"] is False
    assert str(site) in got["path"] and fresh.ROOT not in got["path"] and not got["cwd"].startswith(fresh.ROOT)
