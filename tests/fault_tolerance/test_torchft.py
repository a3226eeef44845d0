"""torchft's own test suites, as its wheel installs them, with funcoll's classes (``funcoll.torchft``) in the place of
torchft's gloo classes, plus what those suites leave out: the collectives torchft's gloo class refuses, PREMUL_SUM,
the device types a quorum serves.

The suites are torchft's modules themselves (``torchft.manager_integ_test``, ``torchft.local_sgd_integ_test``,
``torchft.process_group_test``): their module-level names ``ProcessGroupGloo`` / ``ProcessGroupBabyGloo`` are
swapped for funcoll's classes while a test runs, and their ``Manager`` for one that binds a port the system picks
(torchft's tests bind 19530 + replica id, which two suites running at once would both take). Nothing else changes:
the replicas are threads of this process, the lighthouse is torchft's own (``torchft._torchft``, IPv6 loopback).
What cannot run here skips with its reason (CUDA, torchcomms). docs/fault-tolerance.md lists what runs.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import math
import operator
import os
import sys
import warnings
from contextlib import ExitStack
from datetime import timedelta
from unittest import mock

import pytest
import torch
import torch.distributed as dist
from torch.distributed.distributed_c10d import AllgatherOptions

pytest.importorskip("torchft", reason="needs torchft >= 0.2 (funcoll's test extra; Linux x86-64 wheels)")
pytest.importorskip("parameterized", reason="torchft's test modules import parameterized (torchft's dev extra; "
                                            "funcoll's test extra)")


def _import_torchft_tests():
    """torchft's test modules; each calls ``logging.basicConfig(level=INFO)`` when imported, which would turn on
    every library's INFO log for the rest of the session: the root logger is put back as it was."""
    import importlib

    root = logging.getLogger()
    level, handlers = root.level, root.handlers[:]
    try:
        return [importlib.import_module(m) for m in ("torchft.manager_integ_test", "torchft.local_sgd_integ_test",
                                                     "torchft.process_group_test", "torchft._test.diloco_trainer",
                                                     "torchft.checkpointing.pg_transport_test")]
    finally:
        root.setLevel(level)
        root.handlers[:] = handlers


mit, lsit, pgt, diloco_trainer, pgtt = _import_torchft_tests()

from parameterized import parameterized  # noqa: E402
from torchft.manager import Manager  # noqa: E402
from torchft.process_group import ProcessGroupBabyGloo, ProcessGroupGloo  # noqa: E402

from funcoll import CollectiveError as FuncollError  # noqa: E402
from funcoll.torchft import ProcessGroupBabyFuncoll, ProcessGroupFuncoll  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class _AnyPortManager(Manager):
    """torchft's Manager on a port the system picks (``port=0``): the train loops of torchft's tests pass
    ``port=19530 + replica_id``."""

    def __init__(self, *args, port=None, **kwargs):
        super().__init__(*args, port=0, **kwargs)


class _OwnGeneratorModel(mit.MyModel):
    """torchft's ``MyModel``, its initial weights drawn as ``nn.Linear`` draws them, from a generator of its own seeded
    42. torchft's DDP loop seeds the global generator with 42 under a lock and builds the model, but the other
    replica's thread draws its batches from the global generator outside that lock: under load a draw falls between
    the seed and the weights, and ``test_ddp_skip_init_sync`` (``init_sync=False``: no sync at step 0) sees two
    different models, with torchft's gloo class too (seen here at load 12)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        gen = torch.Generator().manual_seed(42)
        with torch.no_grad():
            for layer in self.modules():
                if isinstance(layer, torch.nn.Linear):
                    torch.nn.init.kaiming_uniform_(layer.weight, a=math.sqrt(5), generator=gen)
                    bound = 1 / math.sqrt(layer.in_features)
                    torch.nn.init.uniform_(layer.bias, -bound, bound, generator=gen)


@pytest.fixture(autouse=True)
def _no_default_group_left():
    """torchft's DiLoCo trainer and ``dummy_init_pg`` make a default process group in this process (for DeviceMesh,
    functional collectives) and leave it: it is destroyed after the test, so later tests start without one."""
    had = dist.is_initialized()
    env = {k: os.environ.get(k) for k in ("MASTER_ADDR", "MASTER_PORT")}
    yield
    if dist.is_initialized() and not had:
        dist.destroy_process_group()
    for k, v in env.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


class _Swapped:
    """Mixin for a subclass of one of torchft's TestCases: while each test runs, torchft's test modules see ``PG``
    as ``ProcessGroupGloo`` and ``BABY`` as ``ProcessGroupBabyGloo``."""

    PG: type = ProcessGroupFuncoll
    BABY: type = ProcessGroupBabyFuncoll

    def setUp(self) -> None:
        super().setUp()  # type: ignore[misc]
        stack = ExitStack()
        self.addCleanup(stack.close)  # type: ignore[attr-defined]
        for mod in (mit, lsit, pgt, diloco_trainer, pgtt):
            for name, value in (("ProcessGroupGloo", self.PG), ("ProcessGroupBabyGloo", self.BABY)):
                if hasattr(mod, name):
                    stack.enter_context(mock.patch.object(mod, name, value))
            if hasattr(mod, "Manager") and mod is not pgt:  # process_group_test uses it only as a Mock's spec
                stack.enter_context(mock.patch.object(mod, "Manager", _AnyPortManager))
        stack.enter_context(mock.patch.object(mit, "MyModel", _OwnGeneratorModel))  # the DDP loop's model only


# the lighthouse's answer when a replica's quorum request times out (torchft/src/lighthouse.rs via the Manager)
LIGHTHOUSE_TIMEOUT = 'status: Cancelled, message: "Timeout expired"'
ATTEMPTS = 3


def _rerun_lighthouse_races(cls):
    """Every test of ``cls`` is run again (up to :data:`ATTEMPTS` runs) when a replica's quorum request timed out at
    the lighthouse, and only then: torchft's integration tests race their replica threads against the lighthouse
    (``test_streaming_diloco_upscale``: under load, the two running replicas can finish their last quorum before the
    joining one asks for its first, which then waits alone for ``min_replicas=2`` until its 10 s timeout), whatever
    the process group. torchft's CI reruns them likewise (``pytest --reruns 3``, .github/workflows/unittest.yaml,
    "retrying flaky integration tests"). Any other failure fails at once; each rerun is reported as a warning."""

    def rerun(fn):
        @functools.wraps(fn)
        def run(self, *args, **kwargs):
            for attempt in range(1, ATTEMPTS + 1):
                try:
                    return fn(self, *args, **kwargs)
                except TimeoutError as e:
                    if attempt == ATTEMPTS or LIGHTHOUSE_TIMEOUT not in str(e):
                        raise
                    warnings.warn(f"{self.id()}: run {attempt} of {ATTEMPTS} lost torchft's lighthouse race "
                                  f"({LIGHTHOUSE_TIMEOUT}); running it again", stacklevel=1)

        return run

    for name in dir(cls):
        if name.startswith("test") and callable(getattr(cls, name)):
            setattr(cls, name, rerun(getattr(cls, name)))
    return cls


# -- the DDP manager integration tests: healthy, recovery (async and sync quorum), multi-rank recovery, skip-init-sync,
#    quorum timeout, manager allreduce; a replica fails at step 2 and recovers live from its peer over HTTP ------------
@_rerun_lighthouse_races
class TestManagerIntegFuncoll(_Swapped, mit.ManagerIntegTest):
    pass


@_rerun_lighthouse_races
class TestManagerIntegGloo(_Swapped, mit.ManagerIntegTest):
    """The oracle: the same tests on torchft's gloo class, in the same environment."""

    PG, BABY = ProcessGroupGloo, ProcessGroupBabyGloo


# -- LocalSGD, DiLoCo, streaming DiLoCo: recovery, upscale (a third replica joins), commit failure -----------------
@_rerun_lighthouse_races
class TestLocalSGDIntegFuncoll(_Swapped, lsit.LocalSGDIntegTest):
    pass


# -- the process-group suite at world 3: every collective, and the resiliency variant (the last rank shuts down; the
#    survivors fail with a recognised error, reconfigure and succeed) ---------------------------------------------
def _reduce_scatter_on_cpu(pg, rank: int, tensor: torch.Tensor) -> None:
    """torchft's ``run_reduce_scatter_test`` returns at once for CPU tensors ("reduce scatter not supported on GLOO"):
    the same rows and expectation, run on CPU. Every rank holds rows ``r*n+1 .. r*n+n``; rank r receives row r
    summed over the n ranks."""
    n = pg.size()
    rows = [torch.arange(r * n + 1, r * n + n + 1, dtype=torch.float32) for r in range(n)]
    out = torch.zeros(n)
    opts = dist.ReduceScatterOptions()
    opts.reduceOp = dist.ReduceOp.SUM
    pg.reduce_scatter([out], [rows], opts).wait()
    torch.testing.assert_close(out, torch.arange(rank * n + 1, rank * n + n + 1, dtype=torch.float32) * n)


def _premul_sum(factor):
    opts = dist.AllreduceOptions()
    opts.reduceOp = dist._make_nccl_premul_sum(factor)
    return opts


def _gap_filling(pg, rank: int, tensor: torch.Tensor) -> None:
    """What torchft's gloo class refuses or skips, through a quorum's group (both classes: the Baby group's options
    cross its pipe pickled), each result computed here from every rank's input: PREMUL_SUM(f) is f times the sum
    (NCCL's ncclRedOpCreatePreMulSum: each input scaled by f, then summed; gloo: "Cannot use ReduceOp.PREMUL_SUM with
    Gloo"), with a float factor and a tensor factor; BXOR of int16 (gloo: "Invalid scalar type"); an uneven
    all_to_all_single; reduce_scatter_tensor_coalesced with AVG."""
    n = pg.size()
    for factor in (2.5, torch.tensor([0.25])):
        t = torch.tensor([rank + 1.0, -2.0 * (rank + 1)])
        pg.allreduce([t], _premul_sum(factor)).wait()
        f = float(factor)
        sums = [sum(r + 1.0 for r in range(n)), sum(-2.0 * (r + 1) for r in range(n))]
        assert t.tolist() == [f * s for s in sums], (factor, t)  # exact: small integers times a power-of-two fraction
    bits = torch.tensor([0x1234 * (rank + 1), -7 * (rank + 3)], dtype=torch.int16)
    pg.allreduce([bits], dist.ReduceOp.BXOR).wait()
    want = [functools.reduce(operator.xor, [v(r) for r in range(n)]) for v in (lambda r: 0x1234 * (r + 1),
                                                                                lambda r: -7 * (r + 3))]
    assert bits.tolist() == want, bits
    # rank r sends r + j + 1 elements to rank j: 100 r + 10 j + k
    inp = torch.tensor([100.0 * rank + 10 * j + k for j in range(n) for k in range(rank + j + 1)])
    out = torch.empty(sum(j + rank + 1 for j in range(n)))
    pg.alltoall_base(out, inp, [j + rank + 1 for j in range(n)], [rank + j + 1 for j in range(n)],
                     dist.AllToAllOptions()).wait()
    assert out.tolist() == [100.0 * j + 10 * rank + k for j in range(n) for k in range(j + rank + 1)], out
    opts = dist.ReduceScatterOptions()
    opts.reduceOp = dist.ReduceOp.AVG
    ins = [torch.arange(n * 2, dtype=torch.float32) * (rank + 1), torch.full((n,), 3.0 * rank)]
    outs = [torch.empty(2), torch.empty(1)]
    pg.reduce_scatter_tensor_coalesced(outs, ins, opts).wait()
    mean = sum(r + 1 for r in range(n)) / n
    assert outs[0].tolist() == [mean * (2 * rank), mean * (2 * rank + 1)], outs
    assert outs[1].tolist() == [3.0 * sum(range(n)) / n], outs


_CASES = dict(pgt._COLLECTIVE_TO_FUNC, reduce_scatter=_reduce_scatter_on_cpu, gap_filling=_gap_filling)
ALL_COLLECTIVES = list(pgt._ALL_COLLECTIVES)  # no collective skipped (torchft's gloo classes skip three)


# how many of the two survivors must fail when the last rank shuts down: send/recv runs between ranks 0 and 1; a
# broadcast from rank 0 reaches rank 1 whatever rank 2 does (gloo sends to each peer); every other collective needs
# rank 2's part on every rank
SURVIVORS_FAILING = {"send/recv": (0,), "broadcast": (1, 2), "broadcast_one": (1, 2)}


class _Cases:
    """Mixin for a subclass of torchft's ``MultiPgBaseTest``: its harness runs :data:`_CASES` (torchft's own, the
    CPU reduce_scatter, the gap filling), and the survivors' errors of its resiliency test are kept: torchft's check
    also accepts a survivor whose collective did not fail ("no error")."""

    def setUp(self) -> None:
        super().setUp()  # type: ignore[misc]
        patcher = mock.patch.dict(pgt._COLLECTIVE_TO_FUNC, _CASES)
        patcher.start()
        self.addCleanup(patcher.stop)  # type: ignore[attr-defined]
        self._survivors: list = []

    def assertRaisesRegex(self, *args, **kwargs):  # noqa: N802 - unittest's name
        """unittest's, keeping the exception each survivor's ``with`` caught (torchft calls it from its workers)."""
        caught = super().assertRaisesRegex(*args, **kwargs)  # type: ignore[misc]
        survivors = self._survivors

        @contextlib.contextmanager
        def keep():
            with caught as cm:
                yield cm
            survivors.append(cm.exception)

        return keep()

    def _resilient(self, collective: str, failed=(FuncollError,), where: str = "") -> None:
        """torchft's resiliency test, then: the survivors that must fail did, each with an error of a type in
        ``failed`` whose message has ``where`` (``{}``: the collective); the others got torchft's "no error"."""
        self._run_with_resiliency(collective, device="cpu")  # type: ignore[attr-defined]
        errors = [e for e in self._survivors if str(e) != "no error"]
        assert len(self._survivors) == 2, self._survivors
        assert len(errors) in SURVIVORS_FAILING.get(collective, (2,)), (collective, self._survivors)
        for e in errors:
            assert isinstance(e, failed) and where.format(collective) in str(e), (collective, repr(e))


class TestMultiPgFuncoll(_Cases, pgt.MultiPgBaseTest):
    WORLD_SIZE = 3

    @classmethod
    def _create_pg(cls, backend: str):
        return ProcessGroupFuncoll(timeout=timedelta(seconds=10))

    @parameterized.expand(ALL_COLLECTIVES + ["gap_filling"])
    def test_collective(self, collective: str) -> None:
        self._run_parallel(collective, device="cpu")

    @parameterized.expand(ALL_COLLECTIVES)
    def test_collective_with_resiliency(self, collective: str) -> None:
        # funcoll's error names the collective and the group (the store prefix torchft's test reconfigured on)
        self._resilient(collective, where=" on group 'torchft:reconfig_{}' ")


@pytest.mark.skipif(sys.platform == "darwin", reason="torchft: not reliable on mac")
class TestBabyMultiPgFuncoll(_Cases, pgt.MultiPgBaseTest):
    """The subprocess group: every collective at world 3; the resiliency variant for the all_reduce a Manager's
    training step uses and an all_to_all, which torchft's Baby gloo class skips (each reconfigure starts three
    subprocesses: seconds)."""

    WORLD_SIZE = 3

    @classmethod
    def _create_pg(cls, backend: str):
        return ProcessGroupBabyFuncoll(timeout=timedelta(seconds=60))  # starting 3 children under load takes seconds

    @parameterized.expand(ALL_COLLECTIVES + ["gap_filling"])
    def test_collective(self, collective: str) -> None:
        self._run_parallel(collective, device="cpu")

    @parameterized.expand(["allreduce", "alltoall_base"])
    def test_collective_with_resiliency(self, collective: str) -> None:
        # the survivor's child fails with funcoll's error, sent back through the pipe, or its wait times out first
        self._resilient(collective, failed=(FuncollError, TimeoutError))


class TestProcessGroupFuncoll(_Swapped, pgt.ProcessGroupTest):
    """torchft's single-group tests with funcoll's classes: every collective at world 1 and DDP over the group, the
    rendezvous timeout, the Baby group's API, its timeout and its reconfiguration, functional collectives on a
    registered group. Tests of torchft's other classes (dummy, error-swallowing, managed) are torchft's alone."""

    test_dummy = None
    test_process_group_wrapper = None
    test_error_swallowing_process_group_wrapper = None
    test_managed_process_group = None


# -- live recovery over the group itself: torchft's PGTransport sends a state dict from one rank to the others -------
class TestPGTransportFuncoll(_Swapped, pgtt.PGTransportTest):
    pass


def test_the_suites_cover_every_collective():
    """torchft's gloo classes skip three collectives; here none is skipped, and reduce_scatter's check runs on CPU."""
    skipped = set(pgt.NormalGlooMultiPgTest.SKIP)
    assert skipped == {"alltoall_base", "reduce_scatter", "reduce_scatter_tensor_coalesced"}
    assert skipped < set(ALL_COLLECTIVES) == set(pgt._COLLECTIVE_TO_FUNC)
    tests = [n for n in dir(TestMultiPgFuncoll) if n.startswith("test_collective")]
    for name in ALL_COLLECTIVES:
        assert sum(n.endswith("_" + name.replace("/", "_")) for n in tests) == 2, name  # plain and resiliency


class TestMultiPgGloo(pgt.NormalGlooMultiPgTest):
    """The oracle: torchft's own gloo class at world 3, its collectives (it skips three). Its resiliency variant is
    left out here: survivors of an all_reduce wait out gloo's 30 s timeout (torchft's ``set_timeout`` does not reach
    a live gloo group), twice; docs/fault-tolerance.md has the full run."""


for _name in dir(TestMultiPgGloo):
    if _name.startswith("test_collective_with_resiliency"):
        setattr(TestMultiPgGloo, _name, None)


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
    """The contrast to the gap filling above, on torchft's gloo class as it runs here: PREMUL_SUM, a BXOR of int16
    and reduce_scatter raise (the messages are gloo's and torchft's); funcoll's class serves the same calls
    (:func:`_gap_filling`, :func:`_reduce_scatter_on_cpu`)."""

    def calls(pg, rank):
        out = []
        for run in (lambda: pg.allreduce([torch.ones(2)], _premul_sum(2.5)).wait(),
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
    (torchft/process_group.py), which funcoll does not serve. No XPU here: its presence is what torch answers."""
    with mock.patch("torch.xpu.is_available", return_value=xpu), \
            mock.patch("torch.cuda.is_available", return_value=True):
        for cls, name in ((ProcessGroupFuncoll, "ft_dev_a"), (ProcessGroupBabyFuncoll, "ft_dev_b"),
                          (ProcessGroupGloo, "ft_dev_c")):
            registered.append(cls()._register(f"{name}_{xpu}").lower())
    ours = ["cpu", "xpu"] if xpu else ["cpu"]
    assert [dist.Backend.backend_capability[n] for n in registered] == [ours, ours, ["cpu", "cuda"]]
    assert registered[:2] == [f"torchft-funcoll:ft_dev_a_{xpu}".lower(), f"torchft-baby-funcoll:ft_dev_b_{xpu}".lower()]


def _refused(device_type: str, method: str) -> str:
    from funcoll.torchft import UNSERVED

    return (f"funcoll.torchft: {method} on {device_type} tensors cannot cross torchft replica groups: "
            f"{UNSERVED[device_type]}; send a CPU copy instead (t.cpu()); nothing was sent")


def test_xla_tensors_are_refused_before_anything_is_sent():
    """An ``xla`` tensor (torch_xla on the CPU PJRT device): both classes raise on the calling rank, before a group
    exists (the Baby group before its tensors would go to shared memory: torch_xla's own error there is
    "_share_fd_: only available on CPU"); a configured group still serves CPU tensors after the refusal."""
    pytest.importorskip("torch_xla", reason="needs torch_xla (the torch 2.9 environment); runs on PJRT_DEVICE=CPU")
    from tests.fault_tolerance.torchft_cases import refusals

    assert refusals("xla") == {"device": "xla:0", "ProcessGroupFuncoll": _refused("xla", "allreduce"),
                               "ProcessGroupFuncoll child": False,
                               "ProcessGroupBabyFuncoll": _refused("xla", "allreduce"),
                               "ProcessGroupBabyFuncoll child": False}

    def after(pg, rank):
        with pytest.raises(ValueError, match="cannot cross torchft replica groups"):
            pg.allgather([[torch.empty(1, device="xla")]], [torch.ones(1, device="xla")], AllgatherOptions())
        t = torch.tensor([rank + 1.0])
        pg.allreduce([t], dist.AllreduceOptions()).wait()
        return t.item()

    assert _world(ProcessGroupFuncoll, 2, after) == [3.0, 3.0]


def test_tpu_tensors_are_refused_before_anything_is_sent():
    """A ``tpu`` tensor (a fake one: TorchTPU loaded, its device initialised without a TPU, in an interpreter of its
    own): both classes raise before anything is sent."""
    pytest.importorskip("torch_tpu", reason="needs torch-tpu (the newest-torch environment)")
    from tests import fresh

    got = fresh.run("tests.fault_tolerance.torchft_cases:refusals", "tpu", env={"TPU_SKIP_MDS_QUERY": "1"},
                    timeout=240)
    assert got == {"device": "tpu:0", "ProcessGroupFuncoll": _refused("tpu", "allreduce"),
                   "ProcessGroupFuncoll child": False, "ProcessGroupBabyFuncoll": _refused("tpu", "allreduce"),
                   "ProcessGroupBabyFuncoll child": False}


def test_the_recipe_runs_and_equals_the_same_steps_done_locally():
    """examples/torchft_recipe.py, as two replica groups (two processes, each the rank 0 of its group; the test hosts
    what torchrun and ``torchft_lighthouse`` would: each group's TCPStore and the lighthouse). Both end at step 5
    with the same parameters, bit for bit those of the same 5 SGD steps computed here on one model with the mean
    of the two groups' gradients; the recipe is on docs/fault-tolerance.md verbatim."""
    import re
    import subprocess

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
        outs = [p.communicate(timeout=180) for p in procs]
    finally:
        for p in procs:
            p.kill()
        lighthouse.shutdown()
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0, out[-2000:] + err[-4000:]

    torch.manual_seed(0)
    ref = torch.nn.Linear(4, 2)
    sgd = torch.optim.SGD(ref.parameters(), lr=0.1)
    data = [torch.Generator().manual_seed(r) for r in range(2)]
    for _ in range(5):
        grads = []
        for g in data:
            ref.zero_grad()
            ref(torch.randn(8, 4, generator=g)).pow(2).mean().backward()
            grads.append([p.grad.clone() for p in ref.parameters()])
        for p, g0, g1 in zip(ref.parameters(), *grads):
            p.grad = (g0 + g1) / 2  # the Manager's AVG: a SUM, then divided by the participants
        sgd.step()
    want = f"step 5: {ref.weight.tolist()} {ref.bias.tolist()}"
    for replica, (out, _) in enumerate(outs):
        assert re.findall(r"^replica \d step .*$", out, re.M) == [f"replica {replica} {want}"], out[-2000:]
