"""The flight recorder: the last N collectives of every funcoll group on this rank, like NCCL's trace buffer.

Every collective a :class:`~funcoll.entry.process_group.ProcessGroupFuncoll` runs gets a :class:`Call` entry: its
sequence number in the group, the op, the strategies funcoll chose, the shapes and dtypes, the reduce op / root /
peer / split sizes, and its state (``issued`` -> ``completed``, or ``failed`` / ``invalid``), with timestamps.
Point-to-point ops get their own counter (``p2p_seq``): they involve two ranks, not the group, so they do not
advance the group's sequence number.

On a timeout the trace of the group is dumped (``FUNCOLL_TRACE_DIR``: one JSON file per rank and group, as
NCCL's ``TORCH_NCCL_DEBUG_INFO_TEMP_FILE``) and the last entries are quoted in the error. On demand::

    funcoll.flight_recorder.entries(group)         # [Call, ...], oldest first
    funcoll.flight_recorder.dump(group)            # a JSON-able dict; dump(path=...) writes it
    funcoll.flight_recorder.format(group)          # the table, one line per collective

``FUNCOLL_TRACE_BUFFER_SIZE`` (default 256; 0 turns the recorder off) sets N.
"""

from __future__ import annotations

import collections
import itertools
import json
import os
import threading
import time
import weakref
from typing import List, Optional, Sequence

import torch

__all__ = ["Call", "GroupTrace", "trace_of", "entries", "dump", "format", "buffer_size", "all_traces"]

ISSUED, COMPLETED, FAILED, INVALID = "issued", "completed", "failed", "invalid"


def buffer_size() -> int:
    try:
        return max(0, int(os.environ.get("FUNCOLL_TRACE_BUFFER_SIZE", "256")))
    except ValueError:
        return 256


def _dt(dtype) -> str:
    return str(dtype).replace("torch.", "")


def _ranks(ranks: Sequence[int]) -> str:
    ranks = list(ranks)
    if len(ranks) > 2 and ranks == list(range(ranks[0], ranks[-1] + 1)):
        return f"{ranks[0]}-{ranks[-1]}"
    s = ",".join(map(str, ranks[:16]))
    return s + (",..." if len(ranks) > 16 else "")


class Call:
    """One collective (or point-to-point op) of one group on this rank."""

    __slots__ = ("group", "global_ranks", "rank", "size", "seq", "p2p_seq", "op", "method", "fingerprint",
                 "strategies", "state", "t_issued", "t_done", "error", "thread", "timeout")

    def __init__(self, group: str, global_ranks: Sequence[int], rank: int, size: int, op: str, method: str,
                 fingerprint: dict, seq: Optional[int] = None, p2p_seq: Optional[int] = None):
        self.group = group
        self.global_ranks = tuple(global_ranks)
        self.rank = rank
        self.size = size
        self.seq = seq
        self.p2p_seq = p2p_seq
        self.op = op
        self.method = method
        self.fingerprint = fingerprint
        self.strategies: List[str] = []
        self.state = ISSUED
        self.t_issued = time.time()
        self.t_done: Optional[float] = None
        self.error: Optional[str] = None
        self.thread = threading.current_thread().name
        self.timeout: Optional[float] = None  # the group's timeout when issued, in seconds

    # -- state ----------------------------------------------------------------------------------------
    def completed(self) -> None:
        if self.state == ISSUED:
            self.state = COMPLETED
            self.t_done = time.time()

    def failed(self, error: BaseException, state: str = FAILED) -> None:
        if self.state in (ISSUED, COMPLETED):
            self.state = state
            self.t_done = time.time()
            self.error = f"{type(error).__name__}: {error}".splitlines()[0][:300]

    # -- text -----------------------------------------------------------------------------------------
    def number(self) -> str:
        if self.seq is not None:
            return f"#{self.seq}"
        return f"p2p #{self.p2p_seq}" if self.p2p_seq is not None else "-"

    def label(self) -> str:
        """``all_reduce #5 on group 'default_pg' (global ranks 0,1; this is rank 0 of 2)``."""
        return (f"{self.op} {self.number()} on group {self.group!r} (global ranks {_ranks(self.global_ranks)}; "
                f"this is rank {self.rank} of {self.size})")

    def describe(self) -> str:
        """The call's arguments, as a fingerprint line: ``all_reduce(reduce_op=sum, float32[4])``."""
        return describe(self.fingerprint)

    def line(self) -> str:
        dur = ""
        if self.t_done is not None:
            dur = f" {1e3 * (self.t_done - self.t_issued):.1f} ms"
        strat = f" [{'; '.join(self.strategies)}]" if self.strategies else ""
        err = f" -- {self.error}" if self.error else ""
        return f"{self.number():>9} {self.state:<9}{dur} {self.describe()}{strat}{err}"

    def as_dict(self) -> dict:
        return {"group": self.group, "global_ranks": list(self.global_ranks), "rank": self.rank,
                "size": self.size, "seq": self.seq, "p2p_seq": self.p2p_seq, "op": self.op,
                "method": self.method, "fingerprint": dict(self.fingerprint), "strategies": list(self.strategies),
                "state": self.state, "time_issued": self.t_issued, "time_done": self.t_done,
                "duration_ms": None if self.t_done is None else 1e3 * (self.t_done - self.t_issued),
                "error": self.error, "thread": self.thread}

    def __repr__(self) -> str:
        return f"Call({self.label()}: {self.line().strip()})"


def describe(fp: dict) -> str:
    """``all_reduce(reduce_op=sum, float32[4])`` from a fingerprint (:mod:`funcoll.debug`)."""
    parts = []
    for key in ("reduce_op", "root", "peer", "tag"):
        if fp.get(key) is not None:
            parts.append(f"{key}={fp[key]}")
    tensors = fp.get("tensors") or []
    parts += [f"{d}{list(s)}" for d, s in tensors]
    for key in ("outputs", "input_split_sizes", "output_split_sizes", "per_peer_in", "per_peer_out",
                "root_outputs", "root_inputs", "root_output_numel"):
        if fp.get(key) is not None:
            parts.append(f"{key}={fp[key]}")
    return f"{fp.get('op', '?')}({', '.join(parts)})"


class GroupTrace:
    """The ring buffer of one group, and its two counters."""

    def __init__(self, group: str, global_ranks: Sequence[int], rank: int, size: int, maxlen: Optional[int] = None):
        self.group = group
        self.global_ranks = tuple(global_ranks)
        self.rank = rank
        self.size = size
        self._seq = itertools.count()  # the collectives' sequence numbers: next() is atomic, no lock needed
        self.p2p_seq = 0
        self.lock = threading.Lock()
        n = buffer_size() if maxlen is None else maxlen
        self.enabled = n > 0
        self.buffer: collections.deque = collections.deque(maxlen=max(n, 1))
        _traces[id(self)] = self

    @property
    def seq(self) -> int:
        """The sequence number the next collective will get."""
        return int(repr(self._seq)[6:-1])  # "count(N)": itertools.count shows its next value, and has no peek

    def call(self, op: str, method: str, fingerprint: dict) -> Call:
        """A new entry, not numbered yet (:meth:`number` when its first byte is about to be sent)."""
        return Call(self.group, self.global_ranks, self.rank, self.size, op, method, fingerprint)

    def number(self, call: Call, p2p: bool = False) -> Call:
        """Gives ``call`` the next sequence number of the group (or of its point-to-point ops) and records it."""
        with self.lock:
            if p2p:
                call.p2p_seq = self.p2p_seq
                self.p2p_seq += 1
            else:
                call.seq = next(self._seq)
            if self.enabled:
                self.buffer.append(call)
        return call

    def native_record(self, op: str, method: str, fingerprint: dict) -> list:
        """A numbered, recorded entry for a collective the eager fast path issues as one native backend call (its
        strategy "native", its fingerprint the one of its signature, computed once per signature), at the cost of a
        list: ``[seq, op, method, fingerprint, time issued, time done (None while running), thread id]``; the caller
        sets ``[5]`` when it completes.
        Read as a :class:`Call` (:meth:`entries`); :meth:`promote` turns it into one in place (a failure)."""
        rec = [next(self._seq), op, method, fingerprint, _time(), None, _ident()]
        if self.enabled:
            self.buffer.append(rec)
        return rec

    def _call_of(self, rec: list, names: Optional[dict] = None) -> Call:
        call = Call(self.group, self.global_ranks, self.rank, self.size, rec[1], rec[2], rec[3], seq=rec[0])
        call.strategies = ["native"]
        call.t_issued = rec[4]
        if rec[5] is not None:
            call.state, call.t_done = COMPLETED, rec[5]
        if names is None:
            names = _thread_names()
        call.thread = names.get(rec[6], f"thread {rec[6]}")
        return call

    def promote(self, rec: list) -> Call:
        """The :class:`Call` of a record, put in its place in the buffer: its state is the Call's from now on."""
        call = self._call_of(rec)
        with self.lock:
            for i, c in enumerate(self.buffer):
                if c is rec:
                    self.buffer[i] = call
                    break
        return call

    def keep(self, call: Call) -> Call:
        """Records ``call`` without a number: a request rejected before anything was sent, a monitored_barrier."""
        with self.lock:
            if self.enabled:
                self.buffer.append(call)
        return call

    def start(self, op: str, method: str, fingerprint: dict, p2p: bool = False, counted: bool = True) -> Call:
        call = self.call(op, method, fingerprint)
        return self.number(call, p2p) if counted else self.keep(call)

    def entries(self) -> List[Call]:
        with self.lock:
            items = list(self.buffer)
        if any(type(c) is list for c in items):  # blocking native calls, recorded as lists: read as Calls
            names = _thread_names()
            items = [self._call_of(c, names) if type(c) is list else c for c in items]
        return items

    def format(self, last: Optional[int] = None) -> str:
        calls = self.entries()
        if last is not None:
            calls = calls[-last:]
        head = (f"funcoll flight recorder: group {self.group!r} (global ranks {_ranks(self.global_ranks)}), "
                f"rank {self.rank} of {self.size}, next sequence number {self.seq}")
        return "\n".join([head] + ["  " + c.line() for c in calls])

    def dump(self) -> dict:
        return {"group": self.group, "global_ranks": list(self.global_ranks), "rank": self.rank,
                "size": self.size, "next_seq": self.seq, "next_p2p_seq": self.p2p_seq, "pid": os.getpid(),
                "torch": torch.__version__, "entries": [c.as_dict() for c in self.entries()]}


_traces: "weakref.WeakValueDictionary[int, GroupTrace]" = weakref.WeakValueDictionary()
_time = time.time
_ident = threading.get_ident


def _thread_names() -> dict:
    return {th.ident: th.name for th in threading.enumerate()}


def trace_of(group) -> GroupTrace:
    """The trace of a funcoll group (a ProcessGroupFuncoll or its name)."""
    from funcoll.entry.debug import state_of

    if isinstance(group, str):
        from funcoll.semantics.groups import resolve

        group = resolve(group)
    elif group is None:
        import torch.distributed as dist

        group = dist.group.WORLD
    return state_of(group).trace


def entries(group=None) -> List[Call]:
    """The recorded calls of ``group`` (default: the world), oldest first."""
    return trace_of(group).entries()


def format(group=None, last: Optional[int] = None) -> str:  # noqa: A001 - the module's verb
    return trace_of(group).format(last)


def all_traces() -> List[GroupTrace]:
    return list(_traces.values())


def dump(group=None, path: Optional[str] = None) -> dict:
    """The trace of ``group`` (default: the world) as a JSON-able dict; written to ``path`` when given."""
    d = trace_of(group).dump()
    if path is not None:
        with open(path, "w") as f:
            json.dump(d, f, indent=1)
    return d


def dump_on_timeout(trace: GroupTrace) -> Optional[str]:
    """Writes the group's trace to ``$FUNCOLL_TRACE_DIR/funcoll_trace_<group>_rank<r>_<pid>.json`` when that
    variable is set; returns the path (None otherwise). Never raises."""
    where = os.environ.get("FUNCOLL_TRACE_DIR", "").strip()
    if not where:
        return None
    try:
        os.makedirs(where, exist_ok=True)
        safe = "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in trace.group) or "group"
        path = os.path.join(where, f"funcoll_trace_{safe}_rank{trace.rank}_{os.getpid()}.json")
        with open(path, "w") as f:
            json.dump(trace.dump(), f, indent=1)
        return path
    except Exception:  # noqa: BLE001 - a dump never hides the error it documents
        return None
