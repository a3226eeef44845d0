"""Runs a function in a fresh Python interpreter and returns its result, for the tests that need a process of their
own (one default process group per process, a torch_xla or TorchTPU that changes the process, a runtime stubbed
before funcoll is imported).

``run("tests.xla.xla_cases:funcoll_worlds", ["4:1"], env={"PJRT_DEVICE": "CPU"})`` starts ``python -m tests.fresh``
in the repository, which imports ``tests.xla.xla_cases``, calls ``funcoll_worlds(["4:1"])`` and writes what it
returns as JSON to a file the parent reads back (what it prints goes to the test's stdout). ``run_all`` starts
several runs at once. A run that exits with an error fails the test with the end of its stderr; what is still running
at the timeout (the run and any process it started) is killed. ``path=[...]`` gives a run that must not see this
checkout (funcoll installed from its wheel) exactly that import path, started outside the checkout; its targets are
then files (``"/path/to/cases.py:function"``).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from typing import Hashable, Mapping, Optional, Sequence

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run(target: str, *args, env: Optional[Mapping[str, Optional[str]]] = None, timeout: float = 600,
        path: Optional[Sequence[str]] = None, finalize: bool = True):
    """``target`` ("module:function") called with ``args`` (JSON values) in a fresh interpreter; returns its result
    as JSON gives it back (tuples become lists, dict keys strings). ``env`` sets (None: removes) environment
    variables of the run; ``path``: its whole import path instead of this checkout (see the module's docstring);
    ``finalize`` False: the run ends at once when its result is written, without the interpreter's finalization
    (for third-party tests that leave gloo groups undestroyed, whose worker threads can abort the finalization with
    "terminate called without an active exception": pytorch/pytorch#190489)."""
    return run_all({0: (target, *args)}, env, timeout, path, finalize)[0]


def run_all(runs: Mapping[Hashable, Sequence], env: Optional[Mapping[str, Optional[str]]] = None,
            timeout: float = 600, path: Optional[Sequence[str]] = None, finalize: bool = True) -> dict:
    """``runs``: key -> (target, *args), every run started at once. Returns key -> its result, as :func:`run`;
    ``timeout`` counts from the start of the runs."""
    pythonpath = [ROOT, os.environ.get("PYTHONPATH")] if path is None else list(path)
    child_env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, pythonpath)))
    for k, v in (env or {}).items():
        if v is None:
            child_env.pop(k, None)
        else:
            child_env[k] = v
    deadline = time.monotonic() + timeout
    procs: dict = {}  # key -> (the file of its result, the process)
    with tempfile.TemporaryDirectory(prefix="funcoll-fresh-") as tmp:
        try:
            for i, (key, (target, *args)) in enumerate(runs.items()):
                out = os.path.join(tmp, str(i))
                with open(out + ".err", "w") as err:  # a file, not a pipe: a run never waits for the parent to read
                    # a session of its own: the run and what it starts are killed together
                    # outside the checkout (path given), this file is run by its location: "-m tests.fresh" and a
                    # script's own directory would put the checkout on the run's path
                    main = ["-m", "tests.fresh"] if path is None else ["-c", _BY_LOCATION]
                    procs[key] = out, subprocess.Popen(
                        [sys.executable, *main, out, target, json.dumps(args), str(int(finalize))],
                        cwd=ROOT if path is None else tmp,
                        env=child_env, stderr=err, start_new_session=True)
            results = {}
            for key, (out, p) in procs.items():
                what = " ".join(map(str, runs[key]))
                try:
                    p.wait(timeout=max(0.1, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    raise TimeoutError(f"{what} did not finish in {timeout:g} s") from None
                with open(out + ".err") as err:
                    assert p.returncode == 0, f"{what} failed (exit code {p.returncode}):\n{err.read()[-4000:]}"
                with open(out) as f:
                    results[key] = json.load(f)
        finally:
            for _, p in procs.values():
                if p.poll() is None:
                    os.killpg(p.pid, signal.SIGKILL)
                    p.wait()
    return results


_BY_LOCATION = f"import runpy; runpy.run_path({os.path.abspath(__file__)!r}, run_name='__main__')"


def _main(out: str, target: str, args: str, finalize: str = "1") -> None:
    import importlib
    import importlib.util

    module, function = target.rsplit(":", 1)
    if module.endswith(".py"):  # a file, imported by its location (a run that does not see the checkout)
        spec = importlib.util.spec_from_file_location(os.path.basename(module)[:-3], module)
        assert spec is not None and spec.loader is not None, f"cannot import {module}"
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
    else:
        mod = importlib.import_module(module)
    result = getattr(mod, function)(*json.loads(args))
    with open(out, "w") as f:
        json.dump(result, f)
    if finalize == "0":
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)


if __name__ == "__main__":
    _main(*sys.argv[1:])
