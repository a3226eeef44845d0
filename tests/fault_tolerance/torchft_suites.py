"""torchft's own test suites, as its wheel installs them, with funcoll's classes (``funcoll.torchft``) in the place of
torchft's gloo classes; tests/fault_tolerance/test_torchft.py runs them in an interpreter of their own (:func:`run`)
and reports each as a test of its own.

The suites are torchft's modules themselves (``torchft.manager_integ_test``, ``torchft.local_sgd_integ_test``,
``torchft.process_group_test``, ``torchft.checkpointing.pg_transport_test``): while a test runs, their module-level
``ProcessGroupGloo`` / ``ProcessGroupBabyGloo`` are funcoll's classes, and their ``Manager`` one that binds a port
the system picks (torchft's tests bind 19530 + replica id, which two suites running at once would both take). The
replicas are threads of one process, the lighthouse is torchft's own (``torchft._torchft``, IPv6 loopback). What
they check less than they say is checked here too (docs/fault-tolerance.md lists each addition).

Why an interpreter of their own: their replicas train on CPU in the process that runs them, and on torch 2.9 a CPU
backward before torch_xla's device exists breaks every later XLA backward in that process (the autograd engine sizes
its device queues once: ``device_ready_queues_`` INTERNAL ASSERT); they also leave a default process group, daemon
threads and subprocesses behind, and their modules set the root logger to INFO when imported.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import logging
import math
import operator
import sys
import time
import unittest
import warnings
from contextlib import ExitStack
from datetime import timedelta
from typing import Dict, List
from unittest import mock

import torch
import torch.distributed as dist


def _import_torchft_tests():
    """torchft's test modules; each calls ``logging.basicConfig(level=INFO)`` when imported, which would turn on
    every library's INFO log for the rest of the process: the root logger is put back as it was."""
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
from tests.fault_tolerance.torchft_cases import PatientBaby  # noqa: E402


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


# what a replica's quorum call raises when its timeout expires (torchft's Rust manager asking the lighthouse logs
# "lighthouse quorum failed. error: status: Cancelled, ...")
LIGHTHOUSE_TIMEOUT = 'status: Cancelled, message: "Timeout expired"'
ATTEMPTS = 3
RERUN_NOTE = "running it again"
# the tests whose design races something against the machine's load: name prefix -> (what their failure raises, the
# text that says it lost the race, which race), and only then are they run again
RACES = {
    # a third replica joins after the two others' step 2, and those two can finish their last quorum before the
    # joining one asks for its first, which then waits alone for min_replicas=2 until its 10 s quorum timeout, whatever
    # the process group (torchft's own module with its gloo class, here at load 5-7: 6 of 96 upscale tests failed so)
    "test_streaming_diloco_upscale": (TimeoutError, LIGHTHOUSE_TIMEOUT, "lost torchft's lighthouse race"),
    # configure() with a 10 ms timeout must fail in the store's wait, but under load the store client's connect, made
    # with the same 10 ms (torchft's create_store_client, before any process group), times out first with words the
    # test's regex does not take; torchft's gloo class is configured through the same code
    "test_gloo_timeout": (AssertionError, "The client socket has timed out after 10ms while trying to connect",
                          "lost its 10 ms store connect to the load"),
}


def _rerun_races(cls):
    """The tests of ``cls`` named in :data:`RACES` are run again (up to :data:`ATTEMPTS` runs) when they failed by
    losing their race, and only then. torchft's CI reruns its tests likewise (``pytest --reruns 3``,
    .github/workflows/unittest.yaml, "retrying flaky integration tests"). Any other failure fails at once, every
    other test is run once (a replica stuck in a collective would also time its peer's quorum out), and each rerun is
    reported as a warning."""

    def rerun(fn, raised, text, race):
        @functools.wraps(fn)
        def run(self, *args, **kwargs):
            for attempt in range(1, ATTEMPTS + 1):
                try:
                    return fn(self, *args, **kwargs)
                except raised as e:
                    if attempt == ATTEMPTS or text not in str(e):
                        raise
                    warnings.warn(f"{self.id()}: run {attempt} of {ATTEMPTS} {race} ({text}); {RERUN_NOTE}",
                                  stacklevel=1)

        return run

    for name in dir(cls):
        for prefix, why in RACES.items():
            if name.startswith(prefix) and callable(getattr(cls, name)):
                setattr(cls, name, rerun(getattr(cls, name), *why))
    return cls


# -- the DDP manager integration tests: healthy, recovery (async and sync quorum), multi-rank recovery, skip-init-sync,
#    quorum timeout, manager allreduce; a replica fails at step 2 and recovers live from its peer over HTTP ------------
class TestManagerIntegFuncoll(_Swapped, mit.ManagerIntegTest):
    pass


class TestManagerIntegGloo(_Swapped, mit.ManagerIntegTest):
    """The oracle: the same tests on torchft's gloo class, in the same environment."""

    PG, BABY = ProcessGroupGloo, ProcessGroupBabyGloo


# -- LocalSGD, DiLoCo, streaming DiLoCo: recovery, upscale (a third replica joins), commit failure -----------------
@_rerun_races
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
    """Mixin for a subclass of torchft's ``MultiPgBaseTest`` at world 3: its harness runs every collective of
    :data:`_CASES` (torchft's own, the CPU reduce_scatter, the gap filling), and the survivors' errors of its
    resiliency test are kept: torchft's check also accepts a survivor whose collective did not fail ("no error")."""

    WORLD_SIZE = 3

    @parameterized.expand(ALL_COLLECTIVES + ["gap_filling"])
    def test_collective(self, collective: str) -> None:
        self._run_parallel(collective, device="cpu")  # type: ignore[attr-defined]

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
    @classmethod
    def _create_pg(cls, backend: str):
        return ProcessGroupFuncoll(timeout=timedelta(seconds=10))

    @parameterized.expand(ALL_COLLECTIVES)
    def test_collective_with_resiliency(self, collective: str) -> None:
        # funcoll's error names the collective and the group (the store prefix torchft's test reconfigured on)
        self._resilient(collective, where=" on group 'torchft:reconfig_{}' ")


@unittest.skipIf(sys.platform == "darwin", "torchft: not reliable on mac")
class TestBabyMultiPgFuncoll(_Cases, pgt.MultiPgBaseTest):
    """The subprocess group: every collective at world 3; the resiliency variant for the all_reduce a Manager's
    training step uses and an all_to_all (each reconfigure starts three subprocesses: :class:`PatientBaby` gives
    them a start-up budget); an abort that ends a stuck collective."""

    @classmethod
    def _create_pg(cls, backend: str):
        return PatientBaby(timeout=timedelta(seconds=60))

    @parameterized.expand(["allreduce", "alltoall_base"])
    def test_collective_with_resiliency(self, collective: str) -> None:
        # the survivor's child fails with funcoll's error, sent back through the pipe, or its wait times out first
        self._resilient(collective, failed=(FuncollError, TimeoutError))

    def test_collective_stuck_ends_at_abort(self) -> None:
        """Ranks 0 and 1 all_reduce, rank 2 never does: rank 0's ``abort()`` 1 s later kills its subprocess and its
        wait ends at once (the pipe is gone), not at the 60 s timeout; rank 1's wait is still stuck (its child waits
        on rank 2) until rank 1's ``abort()``. (Runs after the plain collectives on their group, before the resiliency
        variant, which makes new ones: the names sort so.)"""
        import threading

        start = time.monotonic()
        threading.Timer(1.0, self.pg_pool[0].abort).start()
        waits = [self.executor.submit(lambda pg: pg.allreduce([torch.ones(2)], dist.AllreduceOptions()).wait(),
                                      self.pg_pool[r]) for r in (0, 1)]
        with self.assertRaises((OSError, EOFError)):  # the pipe to the killed child: closed, or at its end
            waits[0].result(timeout=60)
        self.assertFalse(waits[1].done())  # rank 1's child still waits on rank 2 (its group's timeout: 30 min)
        self.pg_pool[1].abort()
        with self.assertRaises((OSError, EOFError)):
            waits[1].result(timeout=60)
        self.assertLess(time.monotonic() - start, 30)  # neither wait lasted its 60 s timeout
        self.pg_pool[2].abort()


@_rerun_races
class TestProcessGroupFuncoll(_Swapped, pgt.ProcessGroupTest):
    """torchft's single-group tests with funcoll's classes: every collective at world 1 and DDP over the group, the
    rendezvous timeout, the Baby group's API, its timeout and its reconfiguration, functional collectives on a
    registered group. Tests of torchft's other classes (dummy, error-swallowing, managed) are torchft's alone."""

    def test_baby_gloo_apis(self) -> None:
        """torchft's, with a start-up budget for the subprocess (torchft gives it the group's 10 s)."""
        with mock.patch.object(pgt, "ProcessGroupBabyGloo", PatientBaby):
            super().test_baby_gloo_apis()

    test_dummy = None
    test_process_group_wrapper = None
    test_error_swallowing_process_group_wrapper = None
    test_managed_process_group = None


# -- live recovery over the group itself: torchft's PGTransport sends a state dict from one rank to the others -------
class TestPGTransportFuncoll(_Swapped, pgtt.PGTransportTest):
    pass


class TestMultiPgGloo(pgt.MultiPgBaseTest):
    """The oracle: torchft's gloo class at world 3 (its ``NormalGlooMultiPgTest``: the collectives it does not skip,
    in a stable order: torchft lists them from a set, whose order changes with each interpreter's hash seed). Its
    resiliency variant is left out here: the survivors of an all_reduce wait out gloo's 30 s timeout (torchft's
    ``set_timeout`` does not reach a live gloo group), twice; docs/fault-tolerance.md has the full run."""

    BACKEND, WORLD_SIZE = pgt.NormalGlooMultiPgTest.BACKEND, pgt.NormalGlooMultiPgTest.WORLD_SIZE

    @parameterized.expand(sorted(pgt.NormalGlooMultiPgTest.COLLECTIVES))
    def test_collective(self, collective: str) -> None:
        self._run_parallel(collective, device="cpu")


class TestUnservedDevices(unittest.TestCase):
    """``xla`` and ``tpu`` tensors: both classes refuse them on the calling rank before anything is sent
    (``torchft_cases.refusals``). Here, after the suites above: loading torch_xla or TorchTPU changes the process."""

    def _check(self, device_type: str) -> None:
        from tests.fault_tolerance.torchft_cases import expected_refusals, refusals

        self.assertEqual(refusals(device_type), expected_refusals(device_type))

    @unittest.skipUnless(importlib.util.find_spec("torch_xla"), "needs torch_xla (the torch 2.9 environment)")
    def test_xla_tensors_are_refused_before_anything_is_sent(self) -> None:
        self._check("xla")

    @unittest.skipUnless(importlib.util.find_spec("torch_tpu"), "needs torch-tpu (the newest-torch environment)")
    def test_tpu_tensors_are_refused_before_anything_is_sent(self) -> None:
        self._check("tpu")


# every suite, in the order they run
SUITES = [TestManagerIntegFuncoll, TestManagerIntegGloo, TestLocalSGDIntegFuncoll, TestMultiPgFuncoll,
          TestMultiPgGloo, TestBabyMultiPgFuncoll, TestProcessGroupFuncoll, TestPGTransportFuncoll,
          TestUnservedDevices]


def test_ids() -> List[str]:
    """``<class>.<test method>`` of every test of :data:`SUITES`, in the order unittest runs them."""
    loader = unittest.TestLoader()
    return [f"{cls.__name__}.{name}" for cls in SUITES for name in loader.getTestCaseNames(cls)]


class _Outcomes(unittest.TestResult):
    """Each test's outcome, its detail (the traceback and the output it printed, or the skip's reason), its time and
    the reruns it needed; a default process group a test leaves (torchft's DiLoCo trainer makes one for DeviceMesh) is
    destroyed after it."""

    def __init__(self):
        super().__init__()
        self.buffer = True  # what a test prints goes with its failure
        self.outcomes: Dict[str, dict] = {}

    @staticmethod
    def _id(test) -> str:
        return f"{type(test).__name__}.{test._testMethodName}"

    def startTest(self, test):
        self._had_group = dist.is_initialized()
        self._catcher = warnings.catch_warnings(record=True)
        self._caught = self._catcher.__enter__()
        warnings.simplefilter("always")
        self._start = time.monotonic()
        self.outcomes[self._id(test)] = {"outcome": "passed", "detail": ""}
        super().startTest(test)

    def stopTest(self, test):
        super().stopTest(test)
        self._catcher.__exit__(None, None, None)
        if dist.is_initialized() and not self._had_group:
            dist.destroy_process_group()
        self.outcomes[self._id(test)].update(
            seconds=round(time.monotonic() - self._start, 2),
            reruns=[str(w.message) for w in self._caught if RERUN_NOTE in str(w.message)])

    def _set(self, test, outcome, detail):
        self.outcomes.setdefault(self._id(test), {}).update(outcome=outcome, detail=detail)

    def addError(self, test, err):
        super().addError(test, err)
        if isinstance(test, unittest.TestCase):  # else a class's setUpClass (its tests are reported below)
            self._set(test, "failed", self.errors[-1][1])

    def addFailure(self, test, err):
        super().addFailure(test, err)
        self._set(test, "failed", self.failures[-1][1])

    def addSkip(self, test, reason):
        super().addSkip(test, reason)
        self._set(test, "skipped", reason)


def run(ids: List[str]) -> Dict[str, dict]:
    """Runs the tests ``ids`` (of :func:`test_ids`) in :data:`SUITES`' order (each class's ``setUpClass`` once);
    returns id -> {outcome ("passed", "failed", "skipped"), detail, seconds, reruns}."""
    wanted = set(ids)
    suite = unittest.TestSuite(unittest.TestLoader().loadTestsFromName(i, sys.modules[__name__])
                               for i in test_ids() if i in wanted)
    result = _Outcomes()
    suite.run(result)
    setup_errors = "\n".join(detail for test, detail in result.errors if not isinstance(test, unittest.TestCase))
    for i in wanted - set(result.outcomes):  # its class's setUpClass failed
        result.outcomes[i] = {"outcome": "failed", "seconds": 0.0, "reruns": [],
                              "detail": "not run: " + (setup_errors[-4000:] or "no such test in this interpreter")}
    return result.outcomes
