"""``python -m funcoll report|probe|demo``: each subcommand run as a user runs it."""

import json
import os
import subprocess
import sys

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _env(**env_extra):
    """The environment a user's command runs in: this checkout on the path, none of funcoll's switches."""
    env = dict(os.environ, PYTHONPATH=ROOT, PJRT_DEVICE="CPU", **env_extra)
    for k in ("FUNCOLL_PROFILE", "FUNCOLL_PROBE", "TORCH_LOGS", "RANK", "WORLD_SIZE"):
        if k not in env_extra:
            env.pop(k, None)
    return env


def _run(*args, timeout=300, **env_extra):
    return subprocess.run([sys.executable, "-m", "funcoll", *args], cwd=ROOT, env=_env(**env_extra),
                          capture_output=True, text=True, timeout=timeout)


def _main(*args):
    """``python -m funcoll ARGS`` called in this process (``funcoll.__main__.main``, what the module's ``sys.exit``
    returns), for the report's pure tables: ``(exit code, stdout)``. The tests that start a process keep the entry
    point itself, the environment and errors on the command line tested."""
    import contextlib
    import io

    from funcoll.__main__ import main

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main(list(args))
    return code, out.getvalue()


def test_no_subcommand_prints_the_usage():
    p = _run()
    assert p.returncode == 2 and "{report,probe,demo}" in p.stdout


def test_report_is_the_capability_table_of_the_code():
    from funcoll.report import capability_table

    p = _run("report")
    assert p.returncode == 0, p.stderr[-2000:]
    assert p.stdout == capability_table()
    code, out = _main("report", "--profile", "xccl")
    assert code == 0 and out == capability_table(("xccl",))


def test_report_for_a_device_and_versions_as_json():
    code, out = _main("report", "--device", "xpu", "--device", "cpu", "--torch-version", "2.9.0", "--oneccl-version",
                      "2021.16.1", "--format", "json")
    assert code == 0
    doc = json.loads(out)
    assert doc["torch"] == torch.__version__
    (xpu, cpu) = [c["name"] for c in doc["columns"]]
    assert xpu.startswith("xpu: xccl[torch 2.9, oneCCL 2021.16.1") and cpu == "cpu: gloo"
    rows = {r["request"]: r["cells"] for r in doc["rows"]}
    # XCCL has no bitwise ops, gloo has; neither reduces int16 nor has PREMUL_SUM
    bitwise, i16, premul = (rows[k] for k in ("all_reduce band/bor/bxor int32", "all_reduce sum int16",
                                               "all_reduce premul_sum float32"))
    assert bitwise[cpu] == "native" and bitwise[xpu] not in ("native", "") and "bxor" in bitwise[xpu]
    assert "native" not in (i16[xpu], i16[cpu], premul[xpu], premul[cpu])
    assert "xccl.bitwise" in doc["columns"][0]["sources"]


def test_report_shows_the_xccl_fact_rows_of_a_chosen_stack():
    """--torch-version / --oneccl-version / --oneccl-build-version / --topology / --override pick the row: torch 2.11
    built against oneCCL 2021.17.2 may send PREMUL_SUM to oneCCL on one node when asked; torch 2.15 hands the
    all_reduce to ProcessGroupXCCL (it scales and sums itself), never the reduce_scatter."""
    code, out = _main("report", "--device", "xpu", "--torch-version", "2.11.0", "--oneccl-version", "2022.0",
                      "--oneccl-build-version", "2021.17.2", "--topology", "scale-up", "--override",
                      "premul_sum=native")
    assert code == 0
    lines = out.splitlines()
    assert "## XCCL facts: torch 2.11, oneCCL 2022.0 at run time, 2021.17.2 at build time, scale-up" in lines
    assert "| all_reduce premul_sum float32 | native |" in lines
    premul = [line for line in lines if line.startswith("- `premul_sum`: ")]
    assert premul == ["- `premul_sum`: **native** - ProcessGroupXCCL: oneCCL PreMulSum on all_reduce, reduce_scatter "
                      "and reduce, fp16/bf16/fp32/fp64, no scale-out guard; ValueError 'PreMulSum requires "
                      "oneCCL>=2021.17' in builds against older oneCCL (release/2.11 xccl.h:29-33, :341-363)"]
    assert "- `bitwise`: **strategy** - ProcessGroupXCCL: raises ValueError" in lines
    code, out = _main("report", "--device", "xpu", "--torch-version", "2.15.0", "--oneccl-version", "2021.17.2",
                      "--format", "json")
    assert code == 0
    doc = json.loads(out)
    facts = {f["fact"]: f for f in doc["xccl_facts"]["facts"]}
    assert doc["xccl_facts"]["stack"]["graph_capture"] == "refused (NotImplementedError): oneCCL < 2022.0"
    assert facts["premul_sum"]["funcoll"] == "native" and facts["premul_sum_reduce_scatter"]["funcoll"] == "strategy"
    assert facts["uneven_all_to_all"]["xccl"] == ("one grouped send/recv; onecclAllToAllV if the torch-xpu-ops pin "
                                                  "includes #5057 and the build's oneCCL headers declare it "
                                                  "(XCCL_HAS_ALLTOALLV)")
    assert doc["rows"][4]["request"] == "all_reduce premul_sum float32"
    assert list(doc["rows"][4]["cells"].values()) == ["native"]
    # a flip the row does not allow: the error, on the command line
    p = _run("report", "--device", "xpu", "--torch-version", "2.10.0", "--override", "premul_sum=native")
    assert p.returncode != 0 and ("funcoll.xpu: override 'premul_sum' cannot be overridden on torch 2.10 "
                                  "(ProcessGroupXCCL raises on PREMUL_SUM)") in p.stderr


def test_probe_catches_a_simulated_wrong_result():
    p = _run("probe", "--simulate-wrong", "all_reduce max int32", "--no-cache", "--format", "json", timeout=300)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    doc = json.loads(p.stdout)
    assert list(doc["probe"]["wrong"]) == ["all_reduce max int32"]
    after = doc["after"]
    assert after["request"] == "all_reduce max int32" and after["right"] is True
    assert after["strategies"] and after["strategies"] != ["native"]
    assert "native all_reduce max int32 gave a wrong result" in p.stderr  # a warning, printed by default


def test_probe_markdown_on_a_healthy_world(tmp_path):
    p = _run("probe", "--profile", "xccl", timeout=300, FUNCOLL_PROBE_CACHE=str(tmp_path))
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    assert "### funcoll.probe: group 0, cpu" in p.stdout
    assert "- capability table: gloo[xccl] -> gloo[xccl]" in p.stdout and "; 0 wrong" in p.stdout
    assert len(os.listdir(tmp_path)) == 1


def test_demo(demo_run):
    p = demo_run  # the run tests/tooling/test_demo.py asserts on too (tests/conftest.py)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    assert "native == xccl profile on every call: True" in p.stdout
    assert "eager == compiled training step (bit-identical): True" in p.stdout
