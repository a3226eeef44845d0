"""The flight recorder: the last ``FUNCOLL_TRACE_BUFFER_SIZE`` (default 256; 0: off) collectives of every funcoll
group on this rank, like NCCL's trace buffer, one :class:`Call` each. Point-to-point ops get their own counter
(``p2p_seq``): they involve two ranks, not the group, so they do not advance the group's sequence number. What it
shows, how to read it and when it is dumped (also in torch's format): docs/conformance.md, "Flight recorder".
"""

from __future__ import annotations

import atexit
import collections
import json
import os
import pickle
import threading
import time
import weakref
from typing import List, Optional, Sequence

import torch
import torch.distributed as dist

from funcoll.algorithms.observe import comm_name
from funcoll.entry.fingerprint import describe, row_of
from funcoll.semantics import ranks_text
from funcoll.semantics.groups import resolve

__all__ = ["Call", "NativeEntry", "GroupTrace", "trace_of", "recent", "entries", "dump", "format", "buffer_size",
           "torch_dump", "write_torch_dump", "register"]

ISSUED, COMPLETED, FAILED, INVALID = "issued", "completed", "failed", "invalid"


def buffer_size() -> int:
    try:
        return max(0, int(os.environ.get("FUNCOLL_TRACE_BUFFER_SIZE", "256")))
    except ValueError:
        return 256


class Call:
    """One collective (or point-to-point op) of one group on this rank."""

    __slots__ = ("group", "global_ranks", "rank", "size", "seq", "p2p_seq", "op", "method", "fingerprint",
                 "strategies", "state", "t_issued", "t_done", "error", "thread", "timeout", "name")

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
        self.name = comm_name()  # the enclosing torch.distributed.record_comm's name, "" if none (~40 ns a read)

    def completed(self) -> None:
        if self.state == ISSUED:
            self.state = COMPLETED
            self.t_done = time.time()

    def failed(self, error: BaseException, state: str = FAILED) -> None:
        if self.state in (ISSUED, COMPLETED):
            self.state = state
            self.t_done = time.time()
            self.error = f"{type(error).__name__}: {error}".splitlines()[0][:300]

    def number(self) -> str:
        if self.seq is not None:
            return f"#{self.seq}"
        return f"p2p #{self.p2p_seq}" if self.p2p_seq is not None else "-"

    def label(self) -> str:
        """``all_reduce #5 on group 'default_pg' (global ranks 0,1; this is rank 0 of 2)``."""
        return (f"{self.op} {self.number()} on group {self.group!r} (global ranks {ranks_text(self.global_ranks)}; "
                f"this is rank {self.rank} of {self.size})")

    def describe(self) -> str:
        """The call's arguments, as a fingerprint line: ``all_reduce(reduce_op=sum, float32[4])``."""
        return describe(self.fingerprint)

    def line(self) -> str:
        dur = "" if self.t_done is None else f" {1e3 * (self.t_done - self.t_issued):.1f} ms"
        strat = f" [{'; '.join(self.strategies)}]" if self.strategies else ""
        err = f" -- {self.error}" if self.error else ""
        name = f" as {self.name!r}" if self.name else ""
        return f"{self.number():>9} {self.state:<9}{dur} {self.describe()}{name}{strat}{err}"

    def as_dict(self) -> dict:
        return {"group": self.group, "global_ranks": list(self.global_ranks), "rank": self.rank,
                "size": self.size, "seq": self.seq, "p2p_seq": self.p2p_seq, "op": self.op,
                "method": self.method, "fingerprint": dict(self.fingerprint), "strategies": list(self.strategies),
                "state": self.state, "time_issued": self.t_issued, "time_done": self.t_done,
                "duration_ms": None if self.t_done is None else 1e3 * (self.t_done - self.t_issued),
                "error": self.error, "thread": self.thread, "name": self.name}

    def __repr__(self) -> str:
        return f"Call({self.label()}: {self.line().strip()})"


class NativeEntry:
    """The record of a collective the eager fast path issued as one native backend call (its fingerprint is its
    signature's; ``fut``: the backend's future handed to the caller, :meth:`GroupTrace.watch`). Read as a Call."""

    __slots__ = ("seq", "op", "method", "fingerprint", "t_issued", "t_done", "thread", "p2p_seq", "fut", "name")

    def __init__(self, seq: Optional[int], op: str, method: str, fingerprint: dict, p2p_seq: Optional[int] = None):
        self.seq, self.op, self.method, self.fingerprint, self.p2p_seq = seq, op, method, fingerprint, p2p_seq
        self.t_issued = _time()
        self.t_done: Optional[float] = None
        self.thread = _ident()
        self.fut = None
        self.name = comm_name()


class GroupTrace:
    """The ring buffer of one group, and its two counters."""

    def __init__(self, group: str, global_ranks: Sequence[int], rank: int, size: int, maxlen: Optional[int] = None):
        self.group = group
        self.desc = ""  # the group's description (dist.new_group(group_desc=...)), set by the group
        self.global_ranks = tuple(global_ranks)
        self.rank = rank
        self.size = size
        # the sequence number the next collective will get, and the one the next point-to-point op will: each is taken
        # and bumped in one statement, with no call in between (no lock: the fast path takes none)
        self.seq = self.p2p_seq = 0
        self.lock = threading.Lock()
        n = buffer_size() if maxlen is None else maxlen
        self.enabled = n > 0
        self.buffer: collections.deque = collections.deque(maxlen=max(n, 1))
        self._watched: List[NativeEntry] = []  # records whose outcome only a handed-out backend future knows

    def call(self, op: str, method: str, fingerprint: dict) -> Call:
        """A new entry, not numbered yet (:meth:`number` when its first byte is about to be sent)."""
        if self._watched:
            self.discover()
        return Call(self.group, self.global_ranks, self.rank, self.size, op, method, fingerprint)

    def number(self, call: Call, p2p: bool = False) -> Call:
        """Gives ``call`` the next sequence number of the group (or of its point-to-point ops) and records it."""
        if p2p:
            call.p2p_seq, self.p2p_seq = self.p2p_seq, self.p2p_seq + 1
        else:
            call.seq, self.seq = self.seq, self.seq + 1
        return self.keep(call)

    def native_record(self, op: str, method: str, fingerprint: dict, p2p: bool = False) -> "NativeEntry":
        """A numbered, recorded :class:`NativeEntry` for a call the eager fast path issues as one native backend call
        (cheaper to make than a :class:`Call`, read as one; :meth:`promote` makes it one in place when it fails)."""
        if self._watched:
            self.discover()
        if p2p:
            n, self.p2p_seq = self.p2p_seq, self.p2p_seq + 1
            rec = NativeEntry(None, op, method, fingerprint, n)
        else:
            n, self.seq = self.seq, self.seq + 1
            rec = NativeEntry(n, op, method, fingerprint)
        if self.enabled:
            self.buffer.append(rec)
        return rec

    def watch(self, rec: "NativeEntry", fut) -> None:
        """``rec``'s collective ends when the backend future ``fut`` does, which nothing of funcoll's waits on (the
        fast path handed it to the caller, as DDP's Reducer asks): as c10d's watchdog does, its outcome is discovered
        (``time_done``) at the group's next call and whenever the recorder is read; ``fut`` is held until then."""
        rec.fut = fut
        with self.lock:
            self._watched.append(rec)

    def discover(self) -> None:
        """Completes (or fails) the watched records whose future has ended (:meth:`watch`)."""
        with self.lock:
            watched, self._watched = self._watched, []
        running: List[NativeEntry] = []
        for rec in watched:
            fut, rec.fut = rec.fut, None
            if fut is None or rec.t_done is not None:  # its Work's wait() has seen it end
                continue
            if not fut.done():
                rec.fut = fut
                running.append(rec)
                continue
            try:
                fut.value()  # re-raises the backend's error
            except Exception as e:  # noqa: BLE001 - recorded, as the Work's wait() would
                self.promote(rec).failed(e)
                continue
            rec.t_done = _time()
        if running:
            with self.lock:
                self._watched[:0] = running

    def _call_of(self, rec: "NativeEntry", names: Optional[dict] = None) -> Call:
        call = Call(self.group, self.global_ranks, self.rank, self.size, rec.op, rec.method, rec.fingerprint,
                    seq=rec.seq, p2p_seq=rec.p2p_seq)
        call.strategies = ["native"]
        call.name = rec.name
        call.t_issued = rec.t_issued
        if rec.t_done is not None:
            call.state, call.t_done = COMPLETED, rec.t_done
        call.thread = (names or _thread_names()).get(rec.thread, f"thread {rec.thread}")
        return call

    def promote(self, rec: "NativeEntry") -> Call:
        """The :class:`Call` of a record, put in its place in the buffer: its state is the Call's from now on."""
        call = self._call_of(rec)
        with self.lock:
            # the fast path appends without the lock: the record is found in a copy (made in C, at once) and replaced
            # only where it still is (an append to a full buffer shifts every index by one)
            for _ in range(3):
                i = next((i for i, c in enumerate(list(self.buffer)) if c is rec), None)
                if i is None:  # no longer in the buffer
                    break
                try:
                    if self.buffer[i] is rec:
                        self.buffer[i] = call
                        break
                except IndexError:
                    pass
        return call

    def keep(self, call: Call) -> Call:
        """Records ``call`` without a number: a request rejected before anything was sent, a monitored_barrier."""
        with self.lock:
            if self.enabled:
                self.buffer.append(call)
        return call

    def entries(self) -> List[Call]:
        if self._watched:
            self.discover()
        with self.lock:
            items = list(self.buffer)
        if any(type(c) is NativeEntry for c in items):  # native calls of the fast path: read as Calls
            names = _thread_names()
            items = [self._call_of(c, names) if type(c) is NativeEntry else c for c in items]
        return items

    def dump(self) -> dict:
        return {"group": self.group, "global_ranks": list(self.global_ranks), "rank": self.rank,
                "size": self.size, "next_seq": self.seq, "next_p2p_seq": self.p2p_seq, "pid": os.getpid(),
                "torch": torch.__version__, "entries": [c.as_dict() for c in self.entries()]}


_time = time.time
_ident = threading.get_ident


def _thread_names() -> dict:
    return {th.ident: th.name for th in threading.enumerate()}


# funcoll group -> its trace, registered when the group is made: every trace of this process
_by_group: "weakref.WeakKeyDictionary[object, GroupTrace]" = weakref.WeakKeyDictionary()


def register(group, trace: GroupTrace) -> None:
    """Records ``group``'s trace. With ``TORCH_FR_DUMP_TEMP_FILE`` set, the rank then also writes its dump when the
    interpreter exits (and when a group is destroyed): a rank that never joined a collective its peers timed out in
    leaves its dump too, which torch's analyser needs from every rank to name the missing one."""
    _by_group[group] = trace
    if os.environ.get("TORCH_FR_DUMP_TEMP_FILE", "").strip():
        atexit.unregister(write_torch_dump)  # registered once
        atexit.register(write_torch_dump)


def trace_of(group) -> GroupTrace:
    """The trace of a funcoll group (a ProcessGroupFuncoll or its name; None: the world)."""
    if isinstance(group, str):
        group = resolve(group)
    elif group is None:
        group = dist.group.WORLD
    try:
        return _by_group[group]
    except (KeyError, TypeError):
        raise ValueError(f"funcoll.flight_recorder: {group!r} is not a funcoll group") from None


def entries(group=None) -> List[Call]:
    """The recorded calls of ``group`` (default: the world), oldest first."""
    return trace_of(group).entries()


def format(group=None, last: Optional[int] = None) -> str:  # noqa: A001 - the module's verb
    """The recorded calls of ``group`` (default: the world; the ``last`` ones), one line each, under a head line."""
    trace = trace_of(group)
    calls = trace.entries()
    if last is not None:
        calls = calls[-last:]
    head = (f"funcoll flight recorder: group {trace.group!r} (global ranks {ranks_text(trace.global_ranks)}), "
            f"rank {trace.rank} of {trace.size}, next sequence number {trace.seq}")
    return "\n".join([head] + ["  " + c.line() for c in calls])


def dump(group=None, path: Optional[str] = None) -> dict:
    """The trace of ``group`` (default: the world) as a JSON-able dict; written to ``path`` when given."""
    d = trace_of(group).dump()
    if path is not None:
        with open(path, "w") as f:
            json.dump(d, f, indent=1)
    return d


def dump_on_timeout(trace: GroupTrace) -> Optional[str]:
    """On a timeout: :func:`write_torch_dump`, and this group's trace as funcoll's JSON to
    ``$FUNCOLL_TRACE_DIR/funcoll_trace_<group>_rank<r>_<pid>.json``; returns the path written (the JSON one when both
    are; None when neither variable is set). Never raises."""
    torch_path = write_torch_dump()
    where = os.environ.get("FUNCOLL_TRACE_DIR", "").strip()
    if not where:
        return torch_path
    try:
        os.makedirs(where, exist_ok=True)
        safe = "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in trace.group) or "group"
        path = os.path.join(where, f"funcoll_trace_{safe}_rank{trace.rank}_{os.getpid()}.json")
        with open(path, "w") as f:
            json.dump(trace.dump(), f, indent=1)
        return path
    except Exception:  # noqa: BLE001 - a dump never hides the error it documents
        return None


def recent(call: Optional[Call], trace: Optional[GroupTrace], dump: bool) -> str:
    """The sentence an error ends with: the last collectives of the group on this rank (and, with ``dump``, where
    the trace was dumped, or how to dump it)."""
    if trace is None:
        return ""
    path = dump_on_timeout(trace) if dump else None
    last = [c for c in trace.entries() if c is not call][-4:]
    text = ""
    if last:
        text = " Last collectives of this group on this rank: " + "; ".join(
            f"{c.number()} {c.op} {c.state}" for c in last) + "."
    if path:
        text += f" Flight recorder dumped to {path}."
    elif dump:
        text += " (Set FUNCOLL_TRACE_DIR to dump the flight recorder, or call funcoll.flight_recorder.dump().)"
    return text


# -- torch's format: what ``python -m torch.distributed.flight_recorder.fr_trace DIR`` reads (one pickled dict per
# rank, every group of the rank); the sequence numbers are funcoll's own (the ones its errors name)
TORCH_DUMP_VERSION = "2.10"  # the version torch's analyser reads

# torch dtype -> c10's ScalarType name, as torch's recorder writes it
_SCALAR_NAMES = {"float32": "Float", "float64": "Double", "float16": "Half", "bfloat16": "BFloat16",
                 "complex64": "ComplexFloat", "complex128": "ComplexDouble", "complex32": "ComplexHalf",
                 "int8": "Char", "int16": "Short", "int32": "Int", "int64": "Long", "uint8": "Byte",
                 "uint16": "UInt16", "uint32": "UInt32", "uint64": "UInt64", "bool": "Bool",
                 "float8_e4m3fn": "Float8_e4m3fn", "float8_e5m2": "Float8_e5m2",
                 "float8_e4m3fnuz": "Float8_e4m3fnuz", "float8_e5m2fnuz": "Float8_e5m2fnuz"}


def _torch_entry(call: Call, pg_id: int, trace: GroupTrace) -> dict:
    fp = call.fingerprint or {}
    row = row_of(call.op)
    ins, outs = row.sizes(fp)
    dtypes = [_SCALAR_NAMES.get(d, d) for d, _ in fp.get("tensors") or [] if d]
    p2p = row.p2p
    name = row.torch_name or call.op  # c10d's name, which torch's analyser knows
    if p2p:
        peer = fp.get("peer")
        peer = "?" if peer in (None, "any") else peer
        name = f"send {call.rank}->{peer}" if call.op == "send" else f"recv {call.rank}<-{peer}"
    return {"frames": [], "record_id": None, "pg_id": pg_id, "process_group": (trace.group, trace.desc),
            "thread_name": call.thread, "thread_id": call.thread,
            "collective_seq_id": trace.seq if p2p else call.seq,
            "p2p_seq_id": call.p2p_seq if p2p else 0, "op_id": None,
            "profiling_name": call.name or f"funcoll:{name}", "time_created_ns": int(call.t_issued * 1e9),
            "input_sizes": ins, "input_dtypes": dtypes, "output_sizes": outs, "output_dtypes": dtypes,
            "state": "completed" if call.state == COMPLETED else "scheduled",
            "time_discovered_started_ns": None,
            "time_discovered_completed_ns": int(call.t_done * 1e9) if call.t_done is not None else None,
            "retired": call.state == COMPLETED, "timeout_ms": int((call.timeout or 0) * 1e3), "is_p2p": p2p,
            "funcoll_state": call.state, "funcoll_strategies": list(call.strategies)}


def torch_dump() -> dict:
    """Every funcoll group of this process, in the format of torch's flight recorder (the dict torch pickles into
    ``$TORCH_FR_DUMP_TEMP_FILE<rank>``), so torch's analyser reads a funcoll job as it reads an NCCL one. Only numbered
    entries are listed: a request rejected before anything was sent, or a monitored_barrier, has no sequence number
    to match across ranks."""
    pg_config: dict = {}
    pg_status: dict = {}
    entries: list = []
    for pg_id, trace in enumerate(sorted(list(_by_group.values()), key=lambda t: (t.group, t.global_ranks))):
        pg_config[trace.group] = {"name": trace.group, "desc": trace.desc, "ranks": str(list(trace.global_ranks))}
        calls = [c for c in trace.entries() if c.seq is not None or c.p2p_seq is not None]
        done = [c.seq for c in calls if c.seq is not None and c.state == COMPLETED]
        pg_status[str(pg_id)] = {"last_enqueued_collective": trace.seq - 1, "last_started_collective": -1,
                                 "last_completed_collective": max(done) if done else -1}
        entries += [_torch_entry(c, pg_id, trace) for c in calls]
    entries.sort(key=lambda e: e["time_created_ns"])
    for i, e in enumerate(entries):
        e["record_id"] = e["op_id"] = i
    return {"version": TORCH_DUMP_VERSION, "pg_config": pg_config, "pg_status": pg_status, "comm_lib_version": "",
            "entries": entries}


def write_torch_dump(path: Optional[str] = None) -> Optional[str]:
    """Writes :func:`torch_dump` (pickled, as torch writes its own) to ``path``, by default
    ``$TORCH_FR_DUMP_TEMP_FILE<global rank>`` (torch's default prefix ``/tmp/nccl_trace_rank_`` is not assumed:
    without the variable nothing is written); returns the path, or None. Never raises."""
    try:
        if path is None:
            prefix = os.environ.get("TORCH_FR_DUMP_TEMP_FILE", "").strip()
            rank = next((trace.global_ranks[trace.rank] for trace in list(_by_group.values())), None)
            if not prefix or rank is None:
                return None
            path = f"{prefix}{rank}"
        d = torch_dump()
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        with open(path, "wb") as f:
            pickle.dump(d, f)
        return path
    except Exception:  # noqa: BLE001 - a dump never hides the error it documents
        return None
