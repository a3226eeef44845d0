"""The benchmark (``python -m bench``, what ``./dev bench`` runs) runs and reports every case in the table's format (a
smoke test with 2 blocks; its numbers are read by people, not asserted), without rewriting docs/performance.md when
asked not to."""

import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_bench_runs_and_reports_every_case(bench_run):
    p, before = bench_run  # tests/conftest.py
    page = os.path.join(ROOT, "docs", "performance.md")
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    assert "[bench] CPU world of 2 rank(s)" in p.stderr  # progress on stderr
    # the table closes the output (the ranks' backends print their own lines before it): a title, a header, then every
    # row: case, world, raw and funcoll µs per call, the median ratio, its quartiles, the extra column
    lines = p.stdout.splitlines()
    title = [i for i, line in enumerate(lines) if line.startswith("funcoll bench: torch ")]
    assert len(title) == 1 and lines[title[0] + 1].split() == ["case", "world", "raw", "funcoll", "ratio", "spread",
                                                               "extra"], p.stdout[-3000:]
    row = re.compile(r"^(?P<case>.+?)  +(?P<world>\d+) +(?P<raw>\d+\.\d)us +(?P<ours>\d+\.\d)us +"
                     r"(?P<ratio>\d+\.\d\d) +(?P<q1>-?\d+\.\d\d)-(?P<q3>\d+\.\d\d) *(?P<extra>.*)$")
    rows = {}
    for line in lines[title[0] + 2:]:
        m = row.match(line)
        assert m, line
        assert float(m["q1"]) <= float(m["ratio"]) <= float(m["q3"]), line  # the median within its quartiles
    for line in p.stdout.splitlines():
        parts = line.split()
        if len(parts) >= 6 and parts[-1] != "extra" and any(w.endswith("us") for w in parts):
            name = line[:line.index("  ")].strip().replace(" (1 CPU)", "")  # world 1 runs pinned to one CPU
            rows.setdefault(name, []).append(line)
    for size in ("4 B", "64 B", "1 KiB", "16 KiB", "256 KiB", "1 MiB"):
        assert len(rows[f"all_reduce {size}"]) == 2, rows.keys()  # world 1 and world 2
    for case in ("all_gather_into_tensor 1 KiB", "reduce_scatter_tensor 1 KiB", "all_to_all_single 1 KiB",
                 "broadcast 1 KiB", "all_gather 1 KiB", "reduce_scatter 1 KiB", "gather 1 KiB", "scatter 1 KiB",
                 "barrier", "async issue all_reduce 4 B", "pooled all_reduce 4 B-1 MiB", "pooled all_gather 4 B-1 MiB"):
        assert len(rows[case]) == 2, case
        # the median per-call difference funcoll - raw, with its quartiles, then the calling thread's CPU difference
        assert all(re.search(r" [+-]\d+\.\dus \[[+-]\d+\.\.[+-]\d+\] cpu [+-]\d+\.\dus$", line)
                   for line in rows[case]), rows[case]
    assert len(rows["send/recv round trip 1 KiB"]) == 1  # world 2 only
    assert len(rows["compiled step, 10 all_reduce 256 B"]) == 1
    assert len(rows["all_reduce 4 B-1 MiB, forward only"]) == 1  # world 1: the floor of a Python process group
    for case in ("all_reduce 4 B", "all_gather_into_tensor 4 B", "reduce_scatter_tensor 4 B", "all_to_all_single 4 B",
                 "broadcast 4 B", "all_gather 4 B", "reduce_scatter 4 B", "gather 4 B", "scatter 4 B", "barrier",
                 "send/recv round trip 4 B"):  # world 2: the floor per op, with the caller's CPU difference
        (line,) = rows[f"{case}, forward only"]
        assert re.search(r" cpu [+-]\d+\.\dus$", line), line
    assert re.search(r"; load average \d+\.\d-\d+\.\d$", lines[title[0]]), lines[title[0]]
    for case in ("all_reduce 4 B, profiler on", "all_reduce 4 B, record()"):  # the optional machinery, both worlds
        assert len(rows[case]) == 2, case
    for case in ("all_reduce 4 B, size guard", "all_reduce 4 B, debug check", "all_reduce 4 B, flight recorder off"):
        assert len(rows[case]) == 1, case  # world 2: checks across ranks
    for case in ("BXOR 16 MiB i32", "MAX 16 MiB i32", "any (MAX) 16 MiB bool", "AVG 16 MiB bf16"):
        assert "peak +" in rows[case][0], rows[case]
    assert "sent " in rows["uneven all_to_all 16 MiB, 10:1"][0]
    for case in ("DDP", "DDP + bf16_compress_hook", "FSDP2 fp32", "FSDP2 bf16 mixed precision",
                 "tensor parallel + sequence parallel", "ZeRO-like dist.* loop"):  # funcoll trains to gloo's losses
        (line,) = rows[f"train step: {case}"]
        assert re.search(r" cpu [+-]\d+us, losses equal$", line.rstrip()), line  # the caller's CPU per step
    # every raw side is c10d's stock path over funcoll's own gloo backend (a second gloo backend differs by itself)
    assert "no stock group" not in p.stderr, p.stderr[-3000:]
    try:
        import torch_xla  # noqa: F401
    except ImportError:
        assert not any(k.startswith("XLA build") for k in rows)
    else:
        assert {f"XLA build all_reduce, world {w}" for w in (4, 64, 256)} <= set(rows)
    assert (open(page).read() if os.path.exists(page) else None) == before  # --no-docs: the page is untouched
    assert "[bench] world 2: uneven all_to_all 16 MiB, 10:1" in p.stderr  # progress on stderr


def test_the_page_shows_each_op_pooled_and_keeps_its_prose(tmp_path, monkeypatch):
    """``bench.report.write`` rewrites docs/performance.md below its marker only, with one row per op where the bench
    pooled the op's sizes (the printed table keeps every size)."""
    from bench import report

    def row(case, world, ratio, **extra):
        return {"case": case, "bytes": 4, "world": world, "raw_us": 10.0, "funcoll_us": 10.0 * ratio,
                "ratio": ratio, "q1": ratio - 0.1, "q3": ratio + 0.1, **extra}

    sizes = [row(f"all_reduce {s}{pin}", w, 1.1) for w, pin in ((1, " (1 CPU)"), (2, "")) for s in ("4 B", "1 MiB")]
    pooled = [row("pooled all_reduce 4 B-1 MiB (1 CPU)", 1, 1.2), row("pooled all_reduce 4 B-1 MiB", 2, 1.3)]
    alone = [row("all_reduce 4 B, forward only", 2, 0.9), row("async issue all_reduce 4 B (1 CPU)", 1, 1.4),
             row("gather 4 B", 2, 1.5),  # no pooled row of its own
             row("train step: DDP", 2, 1.0, losses_equal=True, m_lo=0.9, m_hi=1.1, cpu_delta_us=200.0)]
    rows = sizes + pooled + alone
    (tmp_path / "docs").mkdir()
    page = tmp_path / "docs" / "performance.md"
    page.write_text("# Performance\n\nprose\n\n<!-- bench -->\n\nthe previous table\n")
    monkeypatch.setattr(report, "ROOT", str(tmp_path))
    report.write(rows, xla=False, load=(1.0, 2.5))
    text = page.read_text()
    assert text.startswith("# Performance\n\nprose\n\n<!-- bench -->\n") and "the previous table" not in text
    cases = [line.split("  ")[0] for line in text.split("```\n")[1].splitlines()[2:]]
    assert cases == [r["case"] for r in pooled + alone], cases
    assert "; load average 1.0-2.5\n" in text and (tmp_path / "docs" / "performance.png").exists()
    printed = [line.split("  ")[0] for line in report.table(rows).splitlines()[2:]]
    assert printed == [r["case"] for r in rows]
