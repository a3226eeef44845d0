"""``./dev python -m tests.conformance [--full] [--profiles native,xccl] [--no-cache] [-k substring]``

Runs PyTorch's backend test suite on gloo and on funcoll side by side (docs/conformance.md) and prints the counts,
the explained differences and any unexplained one; exits 1 on an unexplained difference or a stale row.
``--full`` also runs, for funcoll, the tests gloo skips (they skip on funcoll too; ~2 min more per profile).
``--functional`` adds the CPU tests of upstream's test_functional_api.py / test_c10d_functional_native.py
(tests/conformance/functional.py).
"""

from __future__ import annotations

import argparse
import sys

from .compare import report, run_all


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tests.conformance", description=__doc__.split("\n")[0])
    ap.add_argument("--profiles", default="native,xccl")
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--full", action="store_true", help="run for funcoll the tests gloo skips too")
    ap.add_argument("--no-cache", action="store_true", help="re-run gloo instead of reading its cached results")
    ap.add_argument("-k", action="append", default=[], help="only tests whose name contains this")
    ap.add_argument("--functional", action="store_true", help="also run tests/conformance/functional.py")
    a = ap.parse_args(argv)
    res = run_all(tuple(p.strip() for p in a.profiles.split(",") if p.strip()), a.world, a.full,
                  not a.no_cache, a.k or None)
    print(report(res))
    bad = any(c["unexplained"] or c["stale"] for c in res["comparisons"])
    if a.functional:
        from .functional import main as functional_main

        bad = functional_main([]) != 0 or bad
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
