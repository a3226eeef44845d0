"""The eager entry point: ``ProcessGroupFuncoll``, the torch.distributed backend ``"funcoll"``. Each c10d method
unpacks its options, finds the transport for the tensors' device and calls one function of :mod:`funcoll.algorithms`;
:func:`~funcoll.entry.pipeline.collective` runs each call's pipeline around it. Group creation and transport choice go
to the funcoll log (``TORCH_LOGS="+funcoll"``).
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import os
import threading
from dataclasses import dataclass, replace
from datetime import timedelta
from typing import Callable, Dict, List, Optional, Sequence

import torch
import torch._C._distributed_c10d as C
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d
from torch._C._distributed_c10d import ProcessGroup

from funcoll import algorithms
from funcoll.algorithms.observe import LOG
from funcoll.entry import flight_recorder
from funcoll.entry.checks import P2PCheck
from funcoll.entry.errors import CollectiveError
from funcoll.entry.group_state import GroupState, unwrap_store
from funcoll.entry.methods import ALIASES
from funcoll.entry.pipeline import collective
from funcoll.entry.work import FuncollWork
from funcoll.semantics import groups
from funcoll.transport import Transport
from funcoll.transport.c10d import in_background
from funcoll.transport.registry import GroupContext, cpu_transport, funcoll_factory

__all__ = ["ProcessGroupFuncoll", "Options", "FuncollWork", "BACKEND_NAME", "TRANSPORT_HOOKS"]

BACKEND_NAME = "funcoll"


@dataclass
class Options:
    """``pg_options`` for ``init_process_group("funcoll", pg_options=funcoll.Options(...))``.

    ``lazy_cpu``: create the CPU (gloo) transport at the first CPU collective instead of at group creation.
    None (default) means lazy only when the store cannot rendezvous other processes (HashStore, FakeStore),
    as when a single process builds a virtual world to read the HLO it would compile.
    ``profile``: a capability profile for this group's CPU transport, overriding ``FUNCOLL_PROFILE``.
    ``guard``: the size guard on this group's CPU collectives (:mod:`funcoll.entry.checks`); None (default) means
    ``FUNCOLL_GUARD`` (on when 1, off when 0; unset: on only under ``TORCH_DISTRIBUTED_DEBUG=DETAIL``).
    """

    lazy_cpu: Optional[bool] = None
    profile: Optional[str] = None
    guard: Optional[bool] = None
    # what c10d reads of a backend's options (gloo's have the same three), filled in by the group: torch's pipelining
    # reads ``_timeout`` (torch/distributed/pipelining/_p2p.py); ``dist.set_timeout`` changes it
    _timeout: Optional[timedelta] = None
    group_name: str = ""
    global_ranks_in_group: Sequence[int] = ()


def _red(opts):
    """The reduce op of a method's options (or the op itself; none: sum)."""
    return "sum" if opts is None else getattr(opts, "reduceOp", opts)


# called as hook(group, device_type, transport) with every transport a funcoll group makes (funcoll.probe adds one)
TRANSPORT_HOOKS: List[Callable] = []


class ProcessGroupFuncoll(ProcessGroup):
    """torch.distributed backend ``"funcoll"``: every eager collective runs funcoll's algorithms over the transport of
    the tensors' device."""

    def __init__(self, store, rank: int, size: int, timeout: timedelta, group_name: str = "",
                 global_ranks: Sequence[int] = (), world_size: Optional[int] = None,
                 options: Optional[Options] = None, enable_reconfigure: bool = False):
        super().__init__(rank, size)  # type: ignore[call-arg]  # torch's stubs name only the store-taking overload
        ranks = tuple(global_ranks) or tuple(range(size))
        self._options = replace(options or Options(), _timeout=timeout, group_name=group_name,
                                global_ranks_in_group=ranks)
        self._world_size = world_size if world_size is not None else size
        self._transports: Dict[str, Transport] = {}
        self._aborted: List[Transport] = []  # transports an abort stopped: shut down with the group
        self._lock = threading.Lock()
        self._coalesced: Optional[list] = None  # the Works issued since _start_coalescing
        self._batch: Optional[algorithms.Batch] = None  # the point-to-point operations held since _start_coalescing
        self._held: list = []  # their Works
        self._state = GroupState(store, rank, size, timeout, group_name, ranks, self._options.guard)
        self._p2p_check = P2PCheck(self._state)  # debug mode: the sizes of point-to-point messages (entry/checks)
        flight_recorder.register(self, self._state.trace)
        if group_name:
            groups.register(group_name, ranks, self._world_size)
        lazy = self._state.local_store if self._options.lazy_cpu is None else self._options.lazy_cpu
        if LOG.isEnabledFor(logging.INFO):
            LOG.info("group %s created: rank %d of %d, global ranks %s, world size %d, store %s, CPU transport %s",
                     group_name or "(unnamed)", rank, size, flight_recorder.ranks_text(ranks), self._world_size,
                     type(unwrap_store(store)).__name__, "at the first CPU collective" if lazy else "now")
        self._uuid = -1  # the uuid of the last reconfigure (gloo's handle starts at -1 too)
        self._configured = not enable_reconfigure  # enable_reconfigure=True: no collective before the first one
        self._shrinks = 0  # shrink() calls so far: every member of the group makes the same ones
        if not lazy and self._configured:
            self.transport("cpu")

    # -- identity -------------------------------------------------------------------------------------
    def getBackendName(self) -> str:
        return BACKEND_NAME

    def rank(self) -> int:  # c10d reads them from Python; a reconfigure changes them (reconfigure below)
        return self._state.rank

    def size(self) -> int:
        return self._state.size

    name = getBackendName

    def _set_group_name(self, name: str) -> None:
        if self._state.name and self._state.name != name:
            groups.unregister(self._state.name)
        self._state.rename(name)
        for tp in list(self._transports.values()):
            tp.group_name = name
        groups.register(name, self._state.trace.global_ranks, self._world_size)

    @property
    def group_name(self):  # not annotated: torch >= 2.10 types it GroupName, which torch 2.9 does not have
        return self._state.name

    def _set_group_desc(self, desc: str) -> None:
        self._state.trace.desc = desc

    @property
    def group_desc(self) -> str:
        return self._state.trace.desc

    @property
    def options(self) -> Options:
        return self._options

    def __repr__(self) -> str:
        return f"ProcessGroupFuncoll(name={self._state.name!r}, rank={self.rank()}, size={self.size()})"

    # -- transports -----------------------------------------------------------------------------------
    def transport(self, device_type: str) -> Transport:
        tp = self._transports.get(device_type)
        if tp is not None:
            return tp
        with self._lock:
            tp = self._transports.get(device_type)
            if tp is None:
                st = self._state
                if st.aborted is not None:
                    raise RuntimeError(f"funcoll: group {st.trace.group!r} was aborted ({st.aborted}); "
                                       "collectives need a new group (docs/fault-tolerance.md: shrink_group, "
                                       "_reconfigure, a new torchft quorum)")
                if not self._configured:
                    raise RuntimeError(f"funcoll: group {st.trace.group!r} has not been initialized. Call "
                                       "reconfigure() (torch.distributed.distributed_c10d._reconfigure) before issuing "
                                       "collectives when enable_reconfigure=True.")
                tp = self._make(device_type, st.store, st.rank, st.size, st.timeout)
                self._made(device_type, tp)
        return tp

    def _make(self, device_type: str, store, rank: int, size: int, timeout: timedelta) -> Transport:
        """A new transport for ``device_type`` over ``store`` (a collective of the group's ranks)."""
        st = self._state
        ctx = GroupContext(st.name, dist.PrefixStore(f"{device_type}/", store), rank, size, timeout,
                           st.trace.global_ranks, self._world_size)
        if device_type == "cpu" and self._options.profile is not None:
            return cpu_transport(ctx, self._options.profile)
        return funcoll_factory(device_type)(ctx)

    def _made(self, device_type: str, tp: Transport) -> None:
        """A transport was made: it learns the group's name (for the log and profiler events), the size guard the CPU
        one; the log says which, the hooks run, and the group keeps it as its transport of ``device_type``."""
        tp.group_name, tp.global_ranks = self._state.name, self._state.trace.global_ranks
        if device_type == "cpu":
            self._state.guard_transport = tp
        if LOG.isEnabledFor(logging.INFO):
            env = os.environ.get("FUNCOLL_PROFILE", "").strip()
            why = (f"profile {self._options.profile!r} from funcoll.Options"
                   if device_type == "cpu" and self._options.profile is not None
                   else f"FUNCOLL_PROFILE={env}" if env else "the running stack")
            LOG.info("group %s rank %d/%d: %s transport %s, capabilities %s (%s)", self._state.trace.group,
                     self.rank(), self.size(), device_type, type(tp).__name__, tp.caps.name, why)
        for hook in TRANSPORT_HOOKS:
            hook(self, device_type, tp)
        self._transports[device_type] = tp

    funcoll_transport = transport  # how the transport layer finds a funcoll group's transports (duck typing)

    def _tp(self, tensors) -> Transport:
        t = tensors
        while isinstance(t, (list, tuple)):
            if not t:
                raise ValueError("funcoll: a collective needs at least one tensor")
            t = t[0]
        return self.transport(t.device.type)

    @staticmethod
    def _one(opname: str, tensors):
        if len(tensors) != 1:
            raise ValueError(f"funcoll.{opname}: expects exactly one tensor per call, got {len(tensors)}")
        return tensors[0]

    def _work(self, pending: algorithms.Pending, result=()) -> FuncollWork:
        work = FuncollWork(pending, result)
        if self._coalesced is not None:  # between _start_coalescing and _end_coalescing
            self._coalesced.append(work)
        return work

    # -- collectives ----------------------------------------------------------------------------------
    @collective
    def allreduce(self, tensors, opts=None):
        t = self._one("all_reduce", tensors)
        return self._work(algorithms.all_reduce(self._tp(t), t, _red(opts)), tensors)

    @collective
    def allreduce_coalesced(self, tensors, opts=None):
        return self._work(algorithms.all_reduce_coalesced(self._tp(tensors), list(tensors), _red(opts)), tensors)

    @collective
    def all_gather_single(self, output, input, opts=None):
        return self._work(algorithms.all_gather_into_tensor(self._tp(input), output, input), [output])

    @collective
    def allgather(self, output_tensors, input_tensors, opts=None):
        inp = self._one("all_gather", input_tensors)
        outs = output_tensors[0]
        return self._work(algorithms.all_gather(self._tp(inp), list(outs), inp), outs)

    @collective
    def all_gather_single_coalesced(self, outputs, inputs, opts=None):
        return self._work(algorithms.all_gather_into_tensor_coalesced(self._tp(inputs), list(outputs), list(inputs)),
                          outputs)

    @collective
    def allgather_coalesced(self, output_lists, input_list, opts=None):
        """``dist.all_gather_coalesced``: ``output_lists[r][i]`` receives rank r's ``input_list[i]``."""
        tp = self._tp(input_list)
        if len(output_lists) != self.size() or any(len(outs) != len(input_list) for outs in output_lists):
            raise ValueError(f"funcoll.all_gather_coalesced: expected {self.size()} output lists (one per rank) of "
                             f"{len(input_list)} tensors (one per input), got {[len(o) for o in output_lists]}")
        return self._work(algorithms.Pending([algorithms.all_gather(tp, [outs[i] for outs in output_lists], inp)
                                     for i, inp in enumerate(input_list)]), output_lists)

    @collective
    def reduce_scatter_single(self, output, input, opts=None):
        return self._work(algorithms.reduce_scatter_tensor(self._tp(input), output, input, _red(opts)), [output])

    @collective
    def reduce_scatter(self, output_tensors, input_tensors, opts=None):
        out = self._one("reduce_scatter", output_tensors)
        return self._work(algorithms.reduce_scatter(self._tp(out), out, list(input_tensors[0]), _red(opts)), [out])

    @collective
    def reduce_scatter_single_coalesced(self, outputs, inputs, opts=None):
        return self._work(algorithms.reduce_scatter_tensor_coalesced(self._tp(inputs), list(outputs), list(inputs),
                                                                     _red(opts)), outputs)

    @collective
    def all_to_all_single(self, output, input, output_split_sizes, input_split_sizes, opts=None):
        return self._work(algorithms.all_to_all_single(self._tp(input), output, input, list(output_split_sizes or []),
                                       list(input_split_sizes or [])), [output])

    @collective
    def alltoall(self, output_tensors, input_tensors, opts=None):
        return self._work(algorithms.all_to_all(self._tp(input_tensors), list(output_tensors),
                                            list(input_tensors)), output_tensors)

    @collective
    def broadcast(self, tensors, opts=None):
        src = opts.rootRank if opts is not None else 0
        t = self._one("broadcast", tensors)
        return self._work(algorithms.broadcast(self._tp(t), t, src), tensors)

    @collective
    def reduce(self, tensors, opts=None):
        t = self._one("reduce", tensors)
        return self._work(algorithms.reduce(self._tp(t), t, opts.rootRank, opts.reduceOp), tensors)

    @collective
    def gather(self, output_tensors, input_tensors, opts=None):
        inp = self._one("gather", input_tensors)
        outs = output_tensors[0] if output_tensors else None
        return self._work(algorithms.gather(self._tp(inp), outs, inp, opts.rootRank), outs or [])

    @collective
    def scatter(self, output_tensors, input_tensors, opts=None):
        out = self._one("scatter", output_tensors)
        ins = input_tensors[0] if input_tensors else None
        return self._work(algorithms.scatter(self._tp(out), out, ins, opts.rootRank), [out])

    @collective
    def send(self, tensors, dstRank, tag=0):
        t = self._one("send", tensors)
        tp = self._tp(t)
        if self._batch is not None:
            return self._hold(tp, True, t, dstRank, tag, tensors)
        if self._state.debug:  # described for its receiver first; fails with the receiver's verdict on a mismatch
            algorithms.p2p_op(tp, True, t, dstRank, tag)  # funcoll's own validation first: nothing described then
            key = self._p2p_check.announce(dstRank, t)
            sent = algorithms.send(tp, t, dstRank, tag)
            return self._work(algorithms.Pending([self._p2p_check.watched([key], sent)]), tensors)
        return self._work(algorithms.send(tp, t, dstRank, tag), tensors)

    @collective
    def recv(self, tensors, srcRank, tag=0):
        t = self._one("recv", tensors)
        tp = self._tp(t)
        if self._batch is not None:
            return self._hold(tp, False, t, srcRank, tag, tensors)
        if self._state.debug:  # checked against its send's description, then posted, on a waiter thread
            algorithms.p2p_op(tp, False, t, srcRank, tag)  # funcoll's own validation, on the calling thread
            h = self._p2p_check.checked_recv(srcRank, t, lambda: algorithms.recv(tp, t, srcRank, tag), in_background)
            p = algorithms.Pending([h])
            p._source = srcRank
            return self._work(p, tensors)
        return self._work(algorithms.recv(tp, t, srcRank, tag), tensors)

    def _hold(self, tp: Transport, send: bool, t, peer: int, tag: int, tensors) -> FuncollWork:
        """A send or receive between _start_coalescing and _end_coalescing: checked now, held, issued with its batch."""
        assert self._batch is not None
        work = FuncollWork(self._batch.hold(tp, algorithms.p2p_op(tp, send, t, peer, tag)), tensors)
        self._held.append(work)
        return work

    @collective
    def gather_single(self, output, input, opts=None):
        """``dist.gather_single``: the root's ``output`` gets every rank's ``input`` (its element count matters)."""
        root = opts.rootRank if opts is not None else 0
        outs, work = None, output
        if self.rank() == root:
            n = self.size()
            if output.numel() != n * input.numel():
                raise ValueError(f"funcoll.gather_single: output has {output.numel()} elements, expected "
                                 f"{n} x {input.numel()} (one input per rank)")
            # the root's layout changes only its own copy: a strided output is gathered into a contiguous one
            work = output if output.is_contiguous() else output.new_empty(output.shape)
            outs = list(work.view((n,) + tuple(input.shape)).unbind(0))
        p = algorithms.gather(self._tp(input), outs, input, root)
        return self._work(p if work is output else p.and_then(lambda: output.copy_(work)), [output])

    @collective
    def recv_anysource(self, tensors, tag=0):
        raise NotImplementedError("funcoll.recv: receiving from any source is not supported; pass src")

    @collective
    def barrier(self, opts=None):
        # the CPU transport, else the first the group made (none yet: the CPU one)
        device = "cpu" if "cpu" in self._transports else next(iter(self._transports), "cpu")
        return self._work(algorithms.barrier(self.transport(device)))

    def monitored_barrier(self, timeout=None, wait_all_ranks=False) -> None:
        """gloo's monitored barrier on the group's CPU transport (rank 0 names the ranks that did not arrive), recorded
        in the flight recorder without a sequence number."""
        if timeout is None:
            timeout = self._state.timeout
        elif not isinstance(timeout, timedelta):
            timeout = timedelta(seconds=float(timeout))
        trace = self._state.trace
        call = trace.keep(trace.call("monitored_barrier", "monitored_barrier",
                                     {"op": "monitored_barrier", "timeout_s": timeout.total_seconds(),
                                      "wait_all_ranks": bool(wait_all_ranks)}))
        backend = getattr(self.transport("cpu"), "backend", None)
        if backend is None or not hasattr(backend, "monitored_barrier"):
            e = NotImplementedError(f"funcoll: monitored_barrier needs a gloo CPU transport on group "
                                    f"{self.group_name!r}")
            call.failed(e)
            raise e
        try:
            backend.monitored_barrier(timeout, wait_all_ranks=wait_all_ranks)
        except RuntimeError as e:
            call.failed(e)
            raise CollectiveError(f"funcoll: monitored_barrier on group {trace.group!r} (global ranks "
                                  f"{flight_recorder.ranks_text(trace.global_ranks)}): {str(e).strip()}") from e
        call.completed()

    # -- lifecycle and the rest of c10d's ProcessGroup surface (torch 2.9 to the newest) -----------------------
    # A Python process group has no per-device backend registered in C++: where c10d asks for one (get_backend), the
    # group answers for itself, and it answers every question torch's c10d, FSDP2, DeviceMesh and pipelining ask of a
    # group or its backend (the C++ answers raise for a Python group: "Could not find the default backend type 0")
    supports_coalescing = True  # c10d's batch_isend_irecv hands the batch to _start_coalescing/_end_coalescing
    supports_splitting = True  # split_group() below; c10d asks the backend of the accelerator (torch >= 2.10)
    # torch >= 2.15 asks before registering abort or completion hooks, a window, a shrink or a reconfigure
    supports_abort_hooks = False
    supports_completion_hooks = False
    supports_window = False  # one-sided windows (dist._new_window): gloo has none either
    supports_reconfigure = hasattr(C, "ReconfigureOptions")  # reconfigure() below (torch >= 2.15's _reconfigure)
    supports_shrinking = hasattr(c10d, "shrink_group")  # shrink() below (torch >= 2.15's shrink_group)
    _supports_time_estimate = False  # c10d's _time_estimator

    def supports_tensor_alloc(self, device) -> bool:
        """FSDP2's ``set_allocate_memory_from_process_group`` asks first: funcoll allocates no communication
        memory of its own (as gloo)."""
        return False

    def allocate_tensor(self, size, *, dtype=None, device=None):
        raise RuntimeError(f"Backend {BACKEND_NAME} does not support allocateTensor")  # gloo's words

    @property
    def mem_allocator(self):
        raise RuntimeError(f"Backend {BACKEND_NAME} does not support getMemAllocator")

    def memory_stats(self):
        raise RuntimeError(f"Backend {BACKEND_NAME} does not support getMemoryStats")

    def get_error(self):
        """c10d's ErrorType of the group's last failed collective (SUCCESS while none failed)."""
        return self._state.error

    def new_window(self, tensor=None):
        raise RuntimeError(f"funcoll: group {self._state.trace.group!r} has no one-sided windows "
                           "(supports_window is False)")

    def eager_connect_single_device(self, device=None) -> None:
        """``init_process_group(device_id=...)``: the transport of that device is created now, not at first use."""
        if device is not None:
            self.transport(torch.device(device).type)

    def get_backend(self, device=None):
        return self

    _get_backend = get_backend

    @property
    def _device_types(self):
        return [torch.device(t) for t in dict.fromkeys(["cpu", *self._transports])]

    def get_group_store(self):
        return self._state.store

    @property
    def timeout(self) -> timedelta:
        return self._state.timeout

    def set_timeout(self, timeout: timedelta) -> None:
        """``dist.set_timeout``: the timeout of every later collective of this group, on every transport."""
        self._state.set_timeout(timeout)
        self._options._timeout = timeout
        self._on_backends("_set_default_timeout", timeout)

    _set_default_timeout = set_timeout

    def _add_ephemeral_timeout(self, timeout: timedelta) -> None:
        self._on_backends("_add_ephemeral_timeout", timeout)

    def _on_backends(self, method: str, *args) -> None:
        """Calls ``method`` on the backend of every transport that has one with that method."""
        for tp in list(self._transports.values()):
            fn = getattr(getattr(tp, "backend", None), method, None)
            if fn is not None:
                fn(*args)

    def _start_coalescing(self, device=None) -> None:
        """c10d's coalescing manager: the collectives until :meth:`_end_coalescing` run as they come; the sends and
        receives are held and issued at the end as one group (:mod:`funcoll.algorithms.p2p`)."""
        if self._coalesced is not None:
            raise RuntimeError(f"funcoll: group {self._state.name!r} is already coalescing; end it first")
        self._coalesced, self._batch, self._held = [], algorithms.Batch(), []

    def _end_coalescing(self, device=None) -> FuncollWork:
        if self._coalesced is None or self._batch is None:
            raise RuntimeError(f"funcoll: _end_coalescing on group {self._state.name!r} without _start_coalescing")
        works, self._coalesced = self._coalesced, None
        batch, held, self._batch, self._held = self._batch, self._held, None, []
        pendings = [w._pending for w in works]
        if batch.ops:
            try:  # a backend that runs the group as it is issued (oneCCL's groupEnd) fails here
                if self._state.debug:  # sizes: the sends described first, then the receives checked, then issued
                    check = self._p2p_check
                    keys = [check.announce(op.peer, op.tensor) for op in batch.ops if op.send]
                    for op in batch.ops:
                        if not op.send:
                            check.verify(op.peer, op.tensor, check.receive_key(op.peer))
                            check.posted(op.peer)
                    pendings.append(algorithms.Pending([check.watched(keys, batch.issue())]))
                else:
                    pendings.append(batch.issue())
            except Exception as e:
                errors = [w._failure(e) for w in held]  # each held call records it; the first one is raised
                raise errors[0] from e
        done = algorithms.Pending(pendings)
        if held:  # the held operations' own Works complete with the batch (their flight-recorder entries too)
            done.and_then(lambda: [w.wait() for w in held])
        return FuncollWork(done, [t for w in works + held for t in w._result])

    def _wait_for_pending_works(self) -> None:
        """Nothing to do: funcoll keeps no Work alive after handing it to the caller."""

    def _stop_transports(self, how: str) -> None:
        """Stops the transports: "abort" aborts them (:meth:`Transport.abort`) and keeps them for the shutdown,
        "shutdown" shuts down every one the group made since the last."""
        with self._lock:
            transports, self._transports = list(self._transports.values()), {}
            if how == "abort":
                self._aborted += transports
            else:
                transports, self._aborted = transports + self._aborted, []
        self._state.guard_transport = None  # the size guard's CPU transport
        for tp in transports:
            with contextlib.suppress(RuntimeError):  # already shut down or aborted
                tp.abort() if how == "abort" else tp.shutdown()

    def shutdown(self) -> None:
        """``destroy_process_group``: the recorder dumped (``TORCH_FR_DUMP_TEMP_FILE``), the backends shut down."""
        flight_recorder.write_torch_dump()
        self._stop_transports("shutdown")
        if self._state.name:
            groups.unregister(self._state.name)

    def abort(self) -> None:
        """``pg.abort()`` (c10d's ``_abort_process_group``, torchft, ``shrink_group(..., SHRINK_ABORT)``): every
        in-flight collective of the group ends at once, each wait and future failing with CollectiveAbortedError; the
        group's transports are aborted (on CPU, gloo's connections close, so the collectives in gloo's own threads end
        too and the peers' fail at once) and dropped; the group sends nothing more (docs/fault-tolerance.md)."""
        self._abort(f"pg.abort() was called on group {self._state.trace.group!r} on this rank")

    def _abort(self, reason: str) -> None:
        if self._state.aborted is None:
            self._state.aborted = reason  # first: the errors the abort causes say that it did
        self._stop_transports("abort")

    # -- losing a rank: torch >= 2.15's reconfigure and shrink (docs/fault-tolerance.md) -------------------
    def get_reconfigure_handle(self) -> str:
        """``dist.distributed_c10d._get_reconfigure_handle``: ``funcoll:<rank>:<uuid>:<global rank>:<store>``, the
        fields and order of gloo's handle (torch/csrc/distributed/c10d/ProcessGroupGlooReconfigure.cpp)."""
        st = self._state
        return (f"{BACKEND_NAME}:{st.rank}:{self._uuid}:{st.trace.global_ranks[st.rank]}:"
                f"{_store_address(st.base_store)}")

    def reconfigure(self, opts) -> FuncollWork:
        """``dist.distributed_c10d._reconfigure(uuid, handles, group, timeout)``: the group is made anew over the
        peers of ``opts.handles`` (one :meth:`get_reconfigure_handle` per peer, each taken after the last
        reconfigure; a list assigns ranks by position, a set in sorted order), on the store prefix of ``opts.uuid``,
        which a group uses once. As gloo's: the new rank 0 claims the uuid, every collective is numbered from 0
        again, and ``opts.timeout`` bounds the rendezvous (the group's timeout stays). Refused handles change
        nothing; past them the old transports are aborted first (what they had in flight ends, here and at their
        peers), so a failed rendezvous leaves the group aborted until a reconfigure succeeds."""
        handles = sorted(opts.handles) if isinstance(opts.handles, (set, frozenset)) else list(opts.handles)
        if not handles:
            raise RuntimeError("funcoll: reconfigure requires at least one handle")
        if len(set(handles)) != len(handles):
            raise RuntimeError("funcoll: reconfigure handles must be unique")
        stable = [_parse_handle(h) for h in handles]
        me = self.get_reconfigure_handle()
        if me not in handles:
            raise RuntimeError(f"funcoll: the local reconfigure handle {me!r} is not part of the new communicator "
                               f"({handles})")
        st, rank, size = self._state, handles.index(me), len(handles)
        store = dist.PrefixStore(f"reconfigure/{int(opts.uuid)}/", st.base_store)
        if rank == 0:
            claimed = bytes(store.compare_set("claimed", "", me)).decode()
            if claimed != me:
                raise RuntimeError(f"funcoll: reconfigure uuid {opts.uuid} was already used; each reconfigure() "
                                   "requires a unique uuid")
        timeout = opts.timeout if getattr(opts, "timeout", None) is not None else st.timeout
        # the old transports first: their collectives in flight end, and so do their peers' (who then reconfigure too)
        self._abort(f"group {st.trace.group!r} was reconfigured (uuid {opts.uuid}) on this rank")
        cpu = self._make("cpu", store, rank, size, timeout)  # the rendezvous (failed: the group stays aborted)
        if timeout != st.timeout:
            cpu.backend._set_default_timeout(st.timeout)  # type: ignore[attr-defined]  # a gloo transport's
        st.reconfigure(store, rank, size, stable)  # its global ranks: the peers' own, as gloo's (defaultRanks_)
        self._options.global_ranks_in_group = st.trace.global_ranks
        self._made("cpu", cpu)
        self._uuid, self._configured = int(opts.uuid), True
        if st.name:
            groups.register(st.name, st.trace.global_ranks, self._world_size)
        done = FuncollWork(algorithms.Pending())
        done.wait()
        return done

    def shrink(self, ranks_to_exclude, shrink_flags: int = 0, opts=None) -> "ProcessGroupFuncoll":
        """``dist.shrink_group`` (torch >= 2.15 asks the group, as its backend, for the shrunk one): a new funcoll
        group over the ranks of this group not excluded, made by them alone from this group's store (the excluded
        ranks do not call); ``SHRINK_ABORT`` aborts this group's in-flight collectives first. torch then destroys this
        group, names the new one and, when this was the default group, makes it the default."""
        excluded = sorted({int(r) for r in ranks_to_exclude})
        st = self._state
        if st.rank in excluded:
            raise RuntimeError(f"funcoll: rank {st.rank} is excluded from the shrunk group and must not call shrink")
        if shrink_flags & getattr(c10d, "SHRINK_ABORT", 1):
            self._abort(f"shrink_group(..., SHRINK_ABORT) was called on group {st.trace.group!r} on this rank")
        remaining = [r for r in range(st.size) if r not in excluded]
        self._shrinks += 1
        store = dist.PrefixStore(f"shrink/{self._shrinks}/{','.join(map(str, excluded))}/", st.store)
        if c10d.GroupMember.WORLD is self:  # the new default group numbers the world anew, as NCCL's shrink does
            ranks, world = list(range(len(remaining))), len(remaining)
        else:
            ranks, world = [st.trace.global_ranks[r] for r in remaining], self._world_size
        return ProcessGroupFuncoll(store, remaining.index(st.rank), len(remaining), st.timeout, global_ranks=ranks,
                                   world_size=world, options=opts if isinstance(opts, Options) else self._options)

    def split_group(self, ranks, timeout=None, opts=None, group_name=None, group_desc=None, device_types=None):
        """``dist.split_group`` (torch >= 2.10 calls it on the parent group): a funcoll group over ``ranks`` (ranks of
        this group), created by its members from this group's store; None on the other ranks."""
        ranks = [int(r) for r in ranks]
        if self.rank() not in ranks:
            return None
        st = self._state
        name = group_name or f"{st.name}:split:{','.join(map(str, ranks))}"
        child = ProcessGroupFuncoll(dist.PrefixStore(f"split/{name}/", st.store), ranks.index(self.rank()),
                                    len(ranks), timeout or st.timeout, group_name=name,
                                    global_ranks=[st.trace.global_ranks[r] for r in ranks],
                                    world_size=self._world_size,
                                    options=opts if isinstance(opts, Options) else self._options)
        if group_desc:
            child._set_group_desc(group_desc)
        return child


def _store_address(store) -> str:
    """``host:port`` of a TCPStore (under prefixes), "" for another store: the last field of a reconfigure handle."""
    store = unwrap_store(store)
    return f"{store.host}:{store.port}" if isinstance(store, dist.TCPStore) else ""


def _parse_handle(handle: str) -> int:
    """The global rank a reconfigure handle names (its fourth field)."""
    fields = handle.split(":", 4)
    if len(fields) != 5 or fields[0] != BACKEND_NAME or not all(f.lstrip("-").isdigit() for f in fields[1:4]):
        raise RuntimeError(f"funcoll: invalid reconfigure handle {handle!r} "
                           f"(expected {BACKEND_NAME}:<rank>:<uuid>:<global rank>:<store>)")
    return int(fields[3])


# a method's other names (methods.ALIASES: the older ones torch 2.9's c10d calls among them) run its body under their
# own name; the C++ defaults would look for a per-device backend ("No backend type associated with device type cpu")
for _alias, _method in ALIASES.items():
    setattr(ProcessGroupFuncoll, _alias, collective(inspect.unwrap(getattr(ProcessGroupFuncoll, _method)), _alias))
del _alias, _method
