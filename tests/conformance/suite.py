"""One run of PyTorch's own backend test suite, ``DistributedTest._DistTestBase``, on one backend, in this process.

    python -m tests.conformance.suite --backend funcoll --out results.json [--world 2] [-k substring ...]

Run in a fresh interpreter per backend and profile (``FUNCOLL_PROFILE`` is read from the environment): the suite
module reads ``BACKEND`` when it is imported. How the suite is held to gloo's standard, without editing torch:

* the suite module is imported with ``BACKEND=gloo``, so every decorator that picks tests by backend (``BACKEND !=
  "gloo"``, ``require_backend_is_available({"gloo"})``, the feature lists) selects exactly gloo's tests;
* at run time the suite's ``BACKEND`` is ``"funcoll"`` -- ``init_process_group`` and the checks of
  ``dist.get_backend()`` see funcoll -- as a str that also compares equal to ``"gloo"``, so the branches inside test
  bodies that pick the CPU path for gloo (``if BACKEND == "gloo": ... _prepare_cpu_module``) take it for funcoll
  too;
* ``DistTestCases.backend_feature`` gains ``funcoll`` wherever it lists gloo, and ``skip_collective`` wherever it
  lists gloo (nowhere today);
* each test runs in ``WORLD_SIZE`` forked ranks (the upstream runner spawns them; forking from this process, which
  has imported torch, the suite and funcoll once, costs ~0.1 s instead of ~5 s per test), with a per-test deadline.

``--backend gloo`` runs the suite unchanged (the reference counts).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
import traceback
import unittest


class BackendName(str):
    """The suite's ``BACKEND`` at run time: the string "funcoll", equal to "gloo" too (the CPU paths of test bodies)."""

    def __eq__(self, other):
        return str.__eq__(self, other) or other == "gloo"

    def __ne__(self, other):
        return not self.__eq__(other)

    __hash__ = str.__hash__


def _last_line(text: str) -> str:
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    for ln in reversed(lines):  # the exception line of the innermost traceback
        s = ln.strip()
        if (":" in s and s.split(":", 1)[0].replace(".", "").replace("_", "").isalnum()
                and ("Error" in s.split(":", 1)[0] or "Exception" in s.split(":", 1)[0])):
            return s[:400]
    return (lines[-1].strip() if lines else "")[:400]


def build(backend: str, world: int, test_timeout: int):
    """Imports the suite for ``backend`` and returns the TestCase class to run."""
    os.environ["BACKEND"] = "gloo"  # the selection: exactly gloo's tests (see the module docstring)
    os.environ["WORLD_SIZE"] = str(world)
    os.environ.setdefault("TEMP_DIR", tempfile.mkdtemp(prefix="funcoll-conformance-"))
    import torch

    if backend == "funcoll":
        import funcoll  # noqa: F401 - registers the backend
    from torch.testing._internal import common_distributed as cd

    cd.TIMEOUT_DEFAULT = test_timeout
    from torch.testing._internal.distributed import distributed_test as dt

    if backend != "gloo":
        for names in list(cd.DistTestCases.backend_feature.values()) + list(cd.DistTestCases.skip_collective.values()):
            if "gloo" in names:
                names.add(backend)
        dt.BACKEND = BackendName(backend)
        os.environ["BACKEND"] = backend

    fork = torch.multiprocessing.get_context("fork").Process

    class Conformance(dt.TestDistBackend, dt.DistributedTest._DistTestBase):
        def setUp(self):
            super().setUp()
            self._start_processes(fork)

        @classmethod
        def _run(cls, rank, test_name, file_name, pipe, **kwargs):
            # the child: the group under test must be the backend asked for
            orig_init = torch.distributed.init_process_group

            def init(*args, **kw):  # the harness's own init, before the test: checked once, then unhooked
                torch.distributed.init_process_group = orig_init
                orig_init(*args, **kw)
                got = torch.distributed.get_backend()
                if got != backend or (backend == "funcoll" and
                                      type(torch.distributed.group.WORLD).__name__ != "ProcessGroupFuncoll"):
                    raise AssertionError(f"conformance: the default group is {got!r}, not {backend!r}")

            torch.distributed.init_process_group = init
            try:
                return super()._run(rank, test_name, file_name, pipe, **kwargs)
            finally:
                torch.distributed.init_process_group = orig_init

    Conformance.__name__ = Conformance.__qualname__ = f"TestDistBackend_{backend}"
    return Conformance


def run(backend: str, world: int, patterns, out: str, test_timeout: int = 120, names=None) -> dict:
    cls = build(backend, world, test_timeout)
    import torch

    all_names = sorted(n for n in dir(cls) if n.startswith("test_"))
    if names:
        wanted = set(names)
        all_names = [n for n in all_names if n in wanted]
    if patterns:
        all_names = [n for n in all_names if any(p in n for p in patterns)]
    results = {}
    t_start = time.monotonic()
    for name in all_names:
        res = unittest.TestResult()
        t0 = time.monotonic()
        cls(name).run(res)
        secs = round(time.monotonic() - t0, 2)
        if res.errors or res.failures:
            tb = (res.errors + res.failures)[0][1]
            results[name] = ["fail", _last_line(tb), secs]
            print(f"FAIL {name} ({secs} s)\n{tb}", file=sys.stderr, flush=True)
        elif res.skipped:
            results[name] = ["skip", str(res.skipped[0][1]).strip().splitlines()[0][:200], secs]
        elif res.expectedFailures:
            results[name] = ["xfail", "", secs]
        else:
            results[name] = ["pass", "", secs]
        print(f"{results[name][0]:5} {secs:6.2f} {name}", file=sys.stderr, flush=True)
    doc = {"backend": backend, "profile": os.environ.get("FUNCOLL_PROFILE") or "native", "world": world,
           "torch": torch.__version__, "seconds": round(time.monotonic() - t_start, 1), "results": results}
    with open(out, "w") as f:
        json.dump(doc, f, indent=1, sort_keys=True)
    return doc


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--backend", required=True, choices=["gloo", "funcoll"])
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--out", required=True)
    ap.add_argument("--test-timeout", type=int, default=120, help="seconds per test before its ranks are killed")
    ap.add_argument("-k", action="append", default=[], help="run the tests whose name contains this (repeatable)")
    ap.add_argument("--names", help="a file with one test name per line: run only those")
    a = ap.parse_args(argv)
    names = None
    if a.names:
        with open(a.names) as f:
            names = [ln.strip() for ln in f if ln.strip()]
    try:
        run(a.backend, a.world, a.k, a.out, a.test_timeout, names)
    except Exception:  # noqa: BLE001
        traceback.print_exc()
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
