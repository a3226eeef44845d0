"""funcoll's command line: ``python -m funcoll report|probe|demo`` (each option: ``--help``; examples:
docs/observability.md, "The command line").
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import List, Optional

import torch


def _columns(args):
    """(column label, Capabilities) per column: the named profiles, or each ``--device`` type's transport with the
    versions/profile the user named."""
    import funcoll
    from funcoll import report
    from funcoll.transport import xpu

    if not args.device:
        names = args.profile.split(",") if args.profile else list(report.COLUMNS)
        return [(n, report.transport_capabilities(n)) for n in names]
    given = {"profile": args.profile, "torch_version": args.torch_version, "oneccl_version": args.oneccl_version,
             "override": args.override, "topology": args.topology, "oneccl_build": args.oneccl_build_version,
             "backend": args.backend, "gpu": args.gpu}
    cols = [xpu.capabilities(**{k: v for k, v in given.items() if v is not None}) if device == "xpu" else
            funcoll.capabilities(device, profile=args.profile) for device in args.device]
    return [(f"{device}: {caps.name}", caps) for device, caps in zip(args.device, cols)]


def _facts(cols, key: str) -> Optional[dict]:
    """The fact rows (funcoll's choice, what the library does in that version) of the first column derived by
    ``key``'s table ("oneccl": XCCL, "torch_tpu": TorchTPU), or None when no column is one."""
    from funcoll.transport import tpu, xpu

    caps = next((c for _, c in cols if key in (getattr(c, "versions", None) or {})), None)
    if caps is None:
        return None
    v = caps.versions
    if key == "oneccl":
        table, prefix, lib, row, until = xpu.fact_table(v.get("backend")), "xccl", "xccl", v["torch"], xpu.KNOWN_UNTIL
        head, known = {"stack": dict(v)}, v.get("backend") in xpu.BACKEND_LABELS
    else:
        table, prefix, lib, row, until = tpu.TORCHTPU_FACTS, "torchtpu", "processgrouptpu", v["row"], tpu.KNOWN_UNTIL
        head, known = {"torch_tpu": v["torch_tpu"]}, True
    row = None if row in ("?", "unknown") else row
    return {**head, "known_until": until,
            "facts": [{"fact": k, "funcoll": caps.sources[f"{prefix}.{k}"].split(":", 1)[0],
                       "why": _why(caps.sources[f"{prefix}.{k}"]), lib: fact.at(row) if known else "unknown",
                       "strategy": fact.strategy} for k, fact in table.items()]}


def _why(source: str) -> str:
    """What keeps a fact off the native path beyond its library's facts (an open report, an unknown backend class):
    the first clause of its ``sources`` text, else ""."""
    first = source.split(": ", 1)[-1].split("; ", 1)[0]
    return first if first.startswith("open report") or "conservative row" in first else ""


def cmd_report(args) -> int:
    import funcoll
    from funcoll import report
    from funcoll.transport import xpu

    if not args.device and args.format == "markdown" and not args.probed:
        print(report.capability_table(tuple(args.profile.split(",")) if args.profile else report.COLUMNS), end="")
        return 0
    cols = _columns(args)
    rows = [(name, [report._cell(caps, run) for _, caps in cols]) for name, run in report.rows()]
    probes = funcoll.probe.cached_entries(args.device or []) if args.probed else None
    facts, tpu_facts = _facts(cols, "oneccl"), _facts(cols, "torch_tpu")
    if args.format == "json":
        doc = {"torch": torch.__version__,
               "columns": [{"name": label, "capabilities": caps.name, "sources": dict(caps.sources)}
                           for label, caps in cols],
               "rows": [{"request": name, "cells": dict(zip([c[0] for c in cols], cells))} for name, cells in rows],
               "xccl_facts": facts, "torchtpu_facts": tpu_facts, "probe": probes}
        print(json.dumps({k: v for k, v in doc.items() if v is not None}, indent=1))
        return 0
    print(report.markdown_table(["request", *(label for label, _ in cols)], [[n, *cells] for n, cells in rows]), end="")
    if facts is not None:
        v = facts["stack"]
        print(f"\n## XCCL facts: torch {v['torch']}, oneCCL {v['oneccl']} at run time, {v['oneccl_build']} at build "
              f"time, {v['topology']}\n")
        known = (f"torch 2.15 is known up to {facts['known_until']}" if v["backend"] == xpu.XCCL_CLASS else
                 f"read from {xpu.XCCL2_SOURCE}" if v["backend"] == xpu.XCCL2_CLASS else
                 "an XPU backend funcoll has no facts for: the conservative row")
        print(f"(backend {v['backend']}, GPU {v['gpu']}; graph capture: {v['graph_capture']}; {known})\n")
        for f in facts["facts"]:
            why = f" ({f['why']})" if f["why"] else ""
            print(f"- `{f['fact']}`: **{f['funcoll']}**{why} - {v['backend']}: {f['xccl']}")
    if tpu_facts is not None:
        print(f"\n## TorchTPU facts: torch_tpu {tpu_facts['torch_tpu']} (known up to {tpu_facts['known_until']})\n")
        for f in tpu_facts["facts"]:
            print(f"- `{f['fact']}`: **{f['funcoll']}** - ProcessGroupTpu: {f['processgrouptpu']}")
    if probes is not None:
        print("\n## Verified on this machine (funcoll.probe cache)\n")
        if not probes:
            print(f"(no probe results cached for torch {torch.__version__}; run: python -m funcoll probe)")
        for e in probes:
            k = e["key"]
            print(f"- {k.get('library')} on {k.get('device')}, {k.get('topology')}, group size {k.get('group_size')}, "
                  f"table {k.get('capabilities')}: {len(e['checked'])} native requests verified, "
                  f"{len(e['wrong'])} wrong ({e.get('created', '?')})")
            for name, why in e["wrong"].items():
                print(f"  - {name}: {why}")
    return 0


def _probe_rank(rank, n, device, cache, simulate):
    """Runs on every rank of the probe world: the probe, and with --simulate-wrong the demoted request through dist.*
    after it: (strategies, right?)."""
    import torch.distributed as dist

    import funcoll
    from funcoll.probe import Request, _Case
    from funcoll.transport.registry import transport_for

    if simulate:
        funcoll.probe._inject_wrong(transport_for(dist.group.WORLD, device), simulate)
    res = funcoll.probe.run(device=device, cache=cache)
    if not simulate:
        return res.to_dict(), res.to_markdown(), None
    case = _Case(Request.parse(simulate), n, 3)
    xs = [case.inputs(r) for r in range(n)]
    x = xs[rank].clone().to(device)
    op = getattr(dist.ReduceOp, str(case.req.op).upper())
    with funcoll.record() as calls:
        if case.req.primitive == "reduce_scatter":
            x, whole = x.new_empty((case.k,)), x
            dist.reduce_scatter_tensor(x, whole, op=op)
        elif case.req.primitive == "all_reduce":
            dist.all_reduce(x, op=op)
        else:
            dist.reduce(x, dst=n - 1, op=op)
    after = [s for _, notes in calls for s in notes], case.check(rank, xs, [x.cpu()]) is None
    return res.to_dict(), res.to_markdown(), after


def cmd_probe(args) -> int:
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:  # under torchrun: the live world
        import torch.distributed as dist

        import funcoll  # noqa: F401  (registers the backend)

        device = args.device or ("xpu" if torch.xpu.is_available() else "cpu")
        if not dist.is_initialized():
            dist.init_process_group(args.backend)
        rank = dist.get_rank()
        try:
            results = [_probe_rank(rank, dist.get_world_size(), device, not args.no_cache, args.simulate_wrong)]
        finally:
            dist.destroy_process_group()
        if rank != 0:
            return 0 if results[0][0]["wrong"] == {} or args.simulate_wrong else 1
    else:
        from funcoll.launch import run_world

        device = args.device or "cpu"
        if device != "cpu":
            print(f"funcoll probe: a local world runs on CPU only; run it under torchrun for {device}",
                  file=sys.stderr)
            return 2
        # the ranks' own prints (gloo's "connected" lines) go to stderr: stdout is the report alone
        sys.stdout.flush()
        saved = os.dup(1)
        os.dup2(2, 1)
        try:
            results = run_world("funcoll.__main__:_probe_rank", args.world, args.profile,
                                args=(device, not args.no_cache, args.simulate_wrong), timeout=args.timeout)
        finally:
            os.dup2(saved, 1)
            os.close(saved)
    res, text, after = results[0]
    if args.format == "json":
        print(json.dumps({"probe": res, "after": after and {"request": args.simulate_wrong,
                                                            "strategies": after[0], "right": after[1]}},
                         indent=1, default=str))
    else:
        print(text)
        if after is not None:
            print(f"after the probe, {args.simulate_wrong} through torch.distributed: strategies "
                  f"{'; '.join(after[0])}, result {'right' if after[1] else 'WRONG'}")
    if args.simulate_wrong:
        return 0 if after and after[1] and args.simulate_wrong in res["wrong"] else 1
    return 0 if not res["wrong"] else 1


def parser() -> argparse.ArgumentParser:
    cli = argparse.ArgumentParser(prog="python -m funcoll", description="funcoll: one collective path for PyTorch on "
                                  "TPU (torch_xla) and Intel GPU (XPU), with a CPU reference.")
    sub = cli.add_subparsers(dest="command", metavar="{report,probe,demo}")

    report = sub.add_parser("report", help="the capability table (what is native, what funcoll fills, how)")
    report.add_argument("--device", action="append", choices=("cpu", "xpu", "xla", "tpu"),
                        help="a column for this device type's transport on this stack (repeatable); default: the "
                        "columns of docs/capabilities.md")
    report.add_argument("--profile", help="columns (comma-separated: gloo, xccl, xccl-2022-scale-up, "
                                          "xccl-2022-probed, xccl2, xla or any profile), or with --device the profile "
                                          "to intersect with (as FUNCOLL_PROFILE)")
    report.add_argument("--torch-version", help="XPU: the torch version to derive the table for")
    report.add_argument("--oneccl-version", help="XPU: the oneCCL version found at run time to derive the table for")
    report.add_argument("--oneccl-build-version", help="XPU: the oneCCL version torch was built against")
    report.add_argument("--override", help="XPU: FUNCOLL_XPU_OVERRIDE, e.g. avg=strategy")
    report.add_argument("--topology", help="XPU: scale-up (one host) or scale-out")
    report.add_argument("--backend", help="XPU: the backend class that runs the calls: xccl (ProcessGroupXCCL, the "
                                          "default), xccl2 (ProcessGroupXCCL2) or another class name (the "
                                          "conservative row)")
    report.add_argument("--gpu", help="XPU: the device name (torch.xpu.get_device_name), e.g. 'Intel(R) Arc(TM) Pro "
                                      "B60 Graphics'; open reports tied to a GPU family cover an unknown one")
    report.add_argument("--format", choices=("markdown", "json"), default="markdown")
    report.add_argument("--probed", action="store_true", help="add the probe results cached on this machine")
    report.set_defaults(fn=cmd_report)

    probe = sub.add_parser("probe", help="verify on a live group that what the table calls native is right")
    probe.add_argument("--world", type=int, default=2, help="ranks of the local CPU world (without torchrun)")
    probe.add_argument("--profile", help="the CPU transport's profile (e.g. xccl), as FUNCOLL_PROFILE")
    probe.add_argument("--device", choices=("cpu", "xpu", "xla"), help="default: xpu where available, else cpu")
    probe.add_argument("--backend", default="funcoll", help="under torchrun: init_process_group backend")
    probe.add_argument("--no-cache", action="store_true", help="neither read nor write the probe cache")
    probe.add_argument("--simulate-wrong", metavar="REQUEST",
                       help="make the transport return a wrong result for REQUEST, e.g. 'all_reduce max int32'")
    probe.add_argument("--format", choices=("markdown", "json"), default="markdown")
    probe.add_argument("--timeout", type=float, default=300)
    probe.set_defaults(fn=cmd_probe)

    demo = sub.add_parser("demo", help="the demo: 2 CPU ranks, native vs FUNCOLL_PROFILE=xccl, eager and compiled")
    demo.add_argument("rest", nargs=argparse.REMAINDER)  # main() hands them to funcoll.demo as they are
    return cli


def main(argv: Optional[List[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    cli = parser()
    if argv and argv[0] == "demo" and not {"-h", "--help"} & set(argv[1:2]):
        from funcoll import demo

        # its arguments go through as they are (argparse would take an option of the demo's for one of its own)
        return demo.main(argv[1:]) or 0
    args = cli.parse_args(argv)
    if not getattr(args, "fn", None):
        cli.print_help()
        return 2
    return args.fn(args)


if __name__ == "__main__":
    sys.exit(main())
