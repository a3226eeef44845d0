"""torchft's own test suites with funcoll's classes in the place of torchft's gloo classes
(tests/fault_tolerance/torchft_suites.py has them and says how), each reported here as a test of its own, and what
they leave out: the collectives torchft's gloo class refuses, PREMUL_SUM, the device types a quorum serves, the
recipe of docs/fault-tolerance.md.

torchft's suites run in one interpreter of their own (tests/fresh.py), started by the first of their tests this
session selects, with exactly the selected ones (``-k`` works as usual); each test here asserts its outcome there.
What cannot run here skips with torchft's reason (CUDA, torchcomms).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import warnings
from datetime import timedelta
from unittest import mock

import pytest
import torch
import torch.distributed as dist

pytest.importorskip("torchft", reason="needs torchft >= 0.2 (funcoll's test extra; Linux x86-64 wheels)")
pytest.importorskip("parameterized", reason="torchft's test modules import parameterized (torchft's dev extra; "
                                            "funcoll's test extra)")

from torchft.process_group import ProcessGroupGloo  # noqa: E402

from funcoll.torchft import ProcessGroupBabyFuncoll, ProcessGroupFuncoll  # noqa: E402
from tests import fresh  # noqa: E402
from tests.fault_tolerance import torchft_suites as suites  # noqa: E402

# torchft_suites' TestCases are never imported by name here: pytest would collect them and run them in this process

ROOT = fresh.ROOT


@pytest.fixture(scope="module")
def outcomes(request):
    """The outcome of every torchft test this session selected, run in one interpreter of its own."""
    selected = [item.callspec.params["test_id"] for item in request.session.items
                if getattr(item, "originalname", "") == "test_torchft_suite" and item.module.__name__ == __name__]
    # torchft's tests leave gloo groups behind (torchft's own classes, the Managers of replicas they failed): their
    # interpreter ends once the outcomes are written, as a finalization that meets their worker threads can abort
    return fresh.run("tests.fault_tolerance.torchft_suites:run", selected, timeout=1500,
                     env={"PJRT_DEVICE": "CPU", "TPU_SKIP_MDS_QUERY": "1"}, finalize=False)


@pytest.mark.parametrize("test_id", suites.test_ids())
def test_torchft_suite(outcomes, test_id):
    """One of torchft's tests (or funcoll's additions in the same harness), run in the suites' interpreter: it
    passed, or it skipped with its reason; its reruns after a lost race (torchft_suites.RACES) are warnings here."""
    got = outcomes[test_id]
    for note in got["reruns"]:
        warnings.warn(note, stacklevel=1)
    print(f"{test_id}: {got['outcome']} in {got['seconds']} s (in the suites' interpreter)")
    if got["outcome"] == "skipped":
        pytest.skip(got["detail"])
    assert got["outcome"] == "passed", got["detail"]


def test_the_suites_cover_every_collective():
    """torchft's gloo classes skip three collectives; here none is skipped, and reduce_scatter's check runs on CPU."""
    skipped = set(suites.pgt.NormalGlooMultiPgTest.SKIP)
    assert skipped == {"alltoall_base", "reduce_scatter", "reduce_scatter_tensor_coalesced"}
    assert skipped < set(suites.ALL_COLLECTIVES) == set(suites.pgt._COLLECTIVE_TO_FUNC)
    tests = [n for n in suites.test_ids() if n.startswith("TestMultiPgFuncoll.test_collective")]
    for name in suites.ALL_COLLECTIVES:
        assert sum(n.endswith("_" + name.replace("/", "_")) for n in tests) == 2, name  # plain and resiliency


def _world(cls, n: int, fn, timeout: float = 30):
    """``fn(pg, rank)`` on ``n`` threads, each with a ``cls`` configured on one fresh store (as torchft's tests run
    their ranks); returns the results in rank order."""
    from concurrent.futures import ThreadPoolExecutor

    store = dist.TCPStore("localhost", 0, is_master=True, wait_for_workers=False)

    def rank_main(rank):
        pg = cls(timeout=timedelta(seconds=timeout))
        pg.configure(f"localhost:{store.port}/world", "0", rank, n)
        try:
            return fn(pg, rank)
        finally:
            pg.shutdown()

    with ThreadPoolExecutor(n) as ex:
        return [f.result(timeout=timeout) for f in [ex.submit(rank_main, r) for r in range(n)]]


def test_torchfts_gloo_class_refuses_what_funcolls_serves():
    """torchft's gloo class as it runs here: PREMUL_SUM, a BXOR of int16 and reduce_scatter raise (the messages are
    gloo's and torchft's); funcoll's class serves the same calls (their results are checked in the suites' gap-filling
    and reduce_scatter cases: ``torchft_suites._gap_filling``, ``_reduce_scatter_on_cpu``)."""

    def calls(pg, rank):
        out = []
        for run in (lambda: pg.allreduce([torch.ones(2)], suites._premul_sum(2.5)).wait(),
                    lambda: pg.allreduce([torch.ones(2, dtype=torch.int16)], dist.ReduceOp.BXOR).wait(),
                    lambda: pg.reduce_scatter([torch.empty(1)], [[torch.ones(1), torch.ones(1)]],
                                              dist.ReduceScatterOptions())):
            try:
                run()
                out.append("served")
            except RuntimeError as e:
                out.append(str(e))
        return out

    want = ["Cannot use ReduceOp.PREMUL_SUM with Gloo", "Invalid scalar type",
            "ProcessGroupGloo does not support reduce_scatter."]
    assert _world(ProcessGroupGloo, 2, calls) == [want, want]
    assert _world(ProcessGroupFuncoll, 2, calls) == [["served"] * 3] * 2


@pytest.fixture
def registered():
    """The c10d backends a test registers, taken out of c10d's tables afterwards."""
    names: list = []
    defaults = dict(dist.Backend.default_device_backend_map)
    yield names
    dist.Backend.default_device_backend_map.clear()
    dist.Backend.default_device_backend_map.update(defaults)
    for name in names:
        for table in (dist.Backend.backend_capability, dist.Backend.backend_type_map):
            table.pop(name, None)
        dist.Backend._plugins.pop(name.upper(), None)
        if name in dist.Backend.backend_list:
            dist.Backend.backend_list.remove(name)
        if hasattr(dist.Backend, name.upper()):
            delattr(dist.Backend, name.upper())


@pytest.mark.parametrize("xpu", [False, True])
def test_registered_for_cpu_and_xpu(registered, xpu):
    """``register(name)`` (functional collectives, DeviceMesh) registers the group's c10d backend for the device
    types a quorum serves: ``cpu``, and ``xpu`` when present. torchft's own ``_register`` lists ``cuda`` first
    (torchft/process_group.py), which funcoll does not serve. No XPU here: ``torch.xpu.is_available()`` answers True
    by a patch for the xpu case."""
    with mock.patch("torch.xpu.is_available", return_value=xpu), \
            mock.patch("torch.cuda.is_available", return_value=True):
        for cls, name in ((ProcessGroupFuncoll, "ft_dev_a"), (ProcessGroupBabyFuncoll, "ft_dev_b"),
                          (ProcessGroupGloo, "ft_dev_c")):
            registered.append(cls()._register(f"{name}_{xpu}").lower())
    ours = ["cpu", "xpu"] if xpu else ["cpu"]
    assert [dist.Backend.backend_capability[n] for n in registered] == [ours, ours, ["cpu", "cuda"]]
    assert registered[:2] == [f"torchft-funcoll:ft_dev_a_{xpu}".lower(), f"torchft-baby-funcoll:ft_dev_b_{xpu}".lower()]


def test_the_recipe_runs_and_equals_the_same_steps_done_locally():
    """examples/torchft_recipe.py, as two replica groups (two processes, each the rank 0 of its group; the test hosts
    what torchrun and ``torchft_lighthouse`` would: each group's TCPStore and the lighthouse). Both end at step 5
    with the same parameters, bit for bit those of the same 5 SGD steps computed on one model with the mean of the
    two groups' gradients (``torchft_cases.recipe_reference``, in an interpreter of its own); the recipe is on
    docs/fault-tolerance.md verbatim."""
    from torchft._torchft import LighthouseServer

    code = open(os.path.join(ROOT, "examples", "torchft_recipe.py")).read()
    assert code in open(os.path.join(ROOT, "docs", "fault-tolerance.md")).read(), \
        "docs/fault-tolerance.md shows examples/torchft_recipe.py verbatim"
    lighthouse = LighthouseServer(bind="[::]:0", min_replicas=2)
    stores = [dist.TCPStore("localhost", 0, is_master=True, wait_for_workers=False) for _ in range(2)]
    procs = []
    try:
        for replica, store in enumerate(stores):
            env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")])),
                       TORCHFT_LIGHTHOUSE=lighthouse.address(), REPLICA_GROUP_ID=str(replica), RANK="0",
                       WORLD_SIZE="1", MASTER_ADDR="localhost", MASTER_PORT=str(store.port))
            procs.append(subprocess.Popen([sys.executable, os.path.join(ROOT, "examples", "torchft_recipe.py")],
                                          env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
        want = fresh.run("tests.fault_tolerance.torchft_cases:recipe_reference", timeout=240)
        outs = [p.communicate(timeout=180) for p in procs]
    finally:
        for p in procs:
            p.kill()
        lighthouse.shutdown()
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0, out[-2000:] + err[-4000:]
    for replica, (out, _) in enumerate(outs):
        assert re.findall(r"^replica \d step .*$", out, re.M) == [f"replica {replica} {want}"], out[-2000:]
