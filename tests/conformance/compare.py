"""Runs the suite on gloo and funcoll (each in its own interpreter) and compares the outcomes.

The known differences live in one place, the table of docs/conformance.md between ``<!-- known-differences:
begin -->`` and ``<!-- known-differences: end -->``: one row per test, the torch versions and profiles it applies
to, and the reason. A test gloo passes and funcoll does not is *explained* when a row covers it; otherwise it is
*unexplained* (the runner fails). A row that covers a test funcoll now passes is *stale* (the runner fails too:
the document must say what is true).

gloo's results depend on torch and on this runner only: they are cached per torch version and runner source in
``~/.cache/funcoll/conformance`` (``--no-cache`` re-runs them).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List, Optional

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "conformance.md"
CACHE = Path(os.environ.get("FUNCOLL_VENV_DIR", Path.home() / ".cache" / "funcoll")) / "conformance"


def _torch_version() -> str:
    import torch

    return torch.__version__.split("+")[0]


def _runner_hash() -> str:
    h = hashlib.sha256()
    for name in ("suite.py", "compare.py"):
        h.update((Path(__file__).parent / name).read_bytes())
    return h.hexdigest()[:12]


def run_suite(backend: str, profile: Optional[str], world: int = 2, names: Optional[List[str]] = None,
              patterns: Optional[List[str]] = None, log_dir: Optional[Path] = None, timeout: float = 3600) -> dict:
    """One run of :mod:`tests.conformance.suite` in a fresh interpreter; returns its JSON document."""
    log_dir = Path(log_dir or (CACHE / "logs"))
    log_dir.mkdir(parents=True, exist_ok=True)
    tag = f"{backend}-{profile or 'native'}-w{world}-torch{_torch_version()}"
    out, log = log_dir / f"{tag}.json", log_dir / f"{tag}.log"
    cmd = [sys.executable, "-m", "tests.conformance.suite", "--backend", backend, "--world", str(world),
           "--out", str(out)]
    for p in patterns or []:
        cmd += ["-k", p]
    if names is not None:
        lst = log_dir / f"{tag}.names"
        lst.write_text("\n".join(names) + "\n")
        cmd += ["--names", str(lst)]
    env = dict(os.environ)
    env.pop("FUNCOLL_PROFILE", None)
    if profile:
        env["FUNCOLL_PROFILE"] = profile
    for k in ("FUNCOLL_DEBUG", "TORCH_DISTRIBUTED_DEBUG", "BACKEND", "WORLD_SIZE", "TEMP_DIR"):
        env.pop(k, None)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    if out.exists():
        out.unlink()
    with open(log, "w") as f:
        subprocess.run(cmd, cwd=ROOT, env=env, stdout=f, stderr=subprocess.STDOUT, timeout=timeout, check=False)
    if not out.exists():
        raise RuntimeError(f"conformance run {tag} wrote no results; see {log}:\n{log.read_text()[-3000:]}")
    doc = json.loads(out.read_text())
    doc["log"] = str(log)
    return doc


def gloo_reference(world: int = 2, use_cache: bool = True, patterns: Optional[List[str]] = None) -> dict:
    key = f"gloo-w{world}-torch{_torch_version()}-{_runner_hash()}{'-k' + '_'.join(patterns) if patterns else ''}"
    path = CACHE / f"{key}.json"
    if use_cache and path.exists():
        doc = json.loads(path.read_text())
        doc["cached"] = str(path)
        return doc
    doc = run_suite("gloo", None, world, patterns=patterns)
    CACHE.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=1, sort_keys=True))
    return doc


# ---------------------------------------------------------------------------------------------------
# the known differences (docs/conformance.md)
# ---------------------------------------------------------------------------------------------------
def _version_tuple(v: str):
    return tuple(int(x) for x in re.findall(r"\d+", v)[:2])


def _applies(spec: str, value: str, kind: str) -> bool:
    spec = spec.strip().strip("`")
    if spec in ("all", "*", ""):
        return True
    for part in (p.strip() for p in spec.split(",")):
        if kind == "torch":
            m = re.match(r"(>=|<=|<|>|==)?\s*(\d+\.\d+)", part)
            if not m:
                continue
            op, ver = m.group(1) or "==", _version_tuple(m.group(2))
            have = _version_tuple(value)
            if {"==": have == ver, ">=": have >= ver, "<=": have <= ver, "<": have < ver, ">": have > ver}[op]:
                return True
        elif part == value:
            return True
    return False


def known_differences(doc: Path = DOC) -> List[dict]:
    text = doc.read_text()
    m = re.search(r"<!-- known-differences: begin -->(.*?)<!-- known-differences: end -->", text, re.S)
    if not m:
        raise ValueError(f"{doc} has no known-differences table")
    rows = []
    for line in m.group(1).splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 4 or not cells[0].startswith("`"):
            continue
        for name in re.findall(r"`(test_\w+)`", cells[0]):
            rows.append({"test": name, "torch": cells[1], "profiles": cells[2], "why": cells[3]})
    return rows


def explanation(rows: List[dict], test: str, torch_version: str, profile: str) -> Optional[dict]:
    for row in rows:
        if row["test"] == test and _applies(row["torch"], torch_version, "torch") and \
                _applies(row["profiles"], profile, "profile"):
            return row
    return None


# ---------------------------------------------------------------------------------------------------
# the comparison
# ---------------------------------------------------------------------------------------------------
def counts(doc: dict) -> Dict[str, int]:
    c = {"pass": 0, "fail": 0, "skip": 0}
    for outcome, _, _ in doc["results"].values():
        c["fail" if outcome not in c else outcome] += 1
    return c


def compare(gloo: dict, funcoll: dict, rows: List[dict]) -> dict:
    """{'explained': [(test, why)], 'unexplained': [(test, outcome, detail)], 'stale': [test],
    'funcoll_only': [test]} for one funcoll run against the gloo reference."""
    tv, profile = funcoll["torch"].split("+")[0], funcoll["profile"]
    g, f = gloo["results"], funcoll["results"]
    explained, unexplained, stale, extra = [], [], [], []
    for name, (outcome, _, _) in sorted(g.items()):
        if name not in f:
            continue
        fo, fd, _ = f[name]
        row = explanation(rows, name, tv, profile)
        if outcome == "pass" and fo != "pass":
            if row is not None:
                explained.append((name, row["why"]))
            else:
                unexplained.append((name, fo, fd))
        elif fo == "pass" and row is not None:
            stale.append(name)
        if outcome != "pass" and fo == "pass":
            extra.append(name)
    return {"explained": explained, "unexplained": unexplained, "stale": stale, "funcoll_only": extra}


def table(gloo: dict, runs: List[dict], comparisons: List[dict]) -> str:
    """The side-by-side counts, as a markdown table."""
    head = ("| run | torch | passed | failed | skipped | of which explained in docs/conformance.md | unexplained "
            "| time |")
    lines = [head, "|---|---|---|---|---|---|---|---|"]
    c = counts(gloo)
    lines.append(f"| gloo | {gloo['torch']} | {c['pass']} | {c['fail']} | {c['skip']} | | | {gloo['seconds']} s |")
    for run, cmp_ in zip(runs, comparisons):
        c = counts(run)
        not_run = len(gloo["results"]) - len(run["results"])
        skipped = c["skip"] + not_run
        lines.append(f"| funcoll ({run['profile']}) | {run['torch']} | {c['pass']} | {c['fail']} | {skipped} | "
                     f"{len(cmp_['explained'])} | {len(cmp_['unexplained'])} | {run['seconds']} s |")
    return "\n".join(lines)


def run_all(profiles=("native", "xccl"), world: int = 2, full: bool = False, use_cache: bool = True,
            patterns: Optional[List[str]] = None) -> dict:
    """gloo (cached) then funcoll per profile. Without ``full``, funcoll runs the tests gloo did not skip (the
    selection is gloo's, so the rest skip on funcoll too); with it, every test."""
    t0 = time.monotonic()
    gloo = gloo_reference(world, use_cache, patterns)
    names = None if full else sorted(n for n, (o, _, _) in gloo["results"].items() if o != "skip")
    rows = known_differences()
    runs, comparisons = [], []
    for profile in profiles:
        run = run_suite("funcoll", None if profile == "native" else profile, world, names=names, patterns=patterns)
        runs.append(run)
        comparisons.append(compare(gloo, run, rows))
    return {"gloo": gloo, "runs": runs, "comparisons": comparisons, "rows": rows,
            "seconds": round(time.monotonic() - t0, 1)}


def report(res: dict) -> str:
    out = [table(res["gloo"], res["runs"], res["comparisons"])]
    for run, cmp_ in zip(res["runs"], res["comparisons"]):
        tag = f"funcoll ({run['profile']}, torch {run['torch']})"
        for name, why in cmp_["explained"]:
            out.append(f"{tag}: explained  {name}: {why[:110]}...")
        for name, outcome, detail in cmp_["unexplained"]:
            out.append(f"{tag}: UNEXPLAINED {name}: {outcome}: {detail}  (log: {run['log']})")
        for name in cmp_["stale"]:
            out.append(f"{tag}: STALE row in docs/conformance.md: {name} passes now")
        for name in cmp_["funcoll_only"]:
            out.append(f"{tag}: passes on funcoll, not on gloo: {name}")
    out.append(f"({res['seconds']} s; gloo {'cached: ' + res['gloo']['cached'] if 'cached' in res['gloo'] else 'run'})")
    return "\n".join(out)
