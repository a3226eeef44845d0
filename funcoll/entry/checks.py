"""The cross-rank checks of an eager collective, run right before its first byte is sent: the debug mode's
:func:`store_check` (through the group's c10d store, never through the backend that carries the data) and the size
guard (:func:`size_guard`: one all_gather of every rank's digest on the group's gloo backend). Both compare by the
rules of :mod:`funcoll.entry.fingerprint` and raise the same error on every rank; when each runs and what it costs:
docs/conformance.md, "The size guard" and "Debug mode".
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from typing import Callable, List, Optional

import torch

from funcoll.entry import flight_recorder
from funcoll.entry.errors import (
    CollectiveError,
    CollectiveMismatchError,
    CollectiveTimeoutError,
    backend_message,
    is_backend_timeout,
)
from funcoll.entry.fingerprint import agree, compare, digest, mismatch, who
from funcoll.entry.flight_recorder import Call, describe, recent
from funcoll.entry.group_state import GroupState
from funcoll.transport import Handle

__all__ = ["store_check", "size_guard", "P2PCheck"]


_KEY = "funcoll-check/{seq}/{rank}"


def store_check(st: GroupState, call: Call) -> None:
    """Publishes this rank's fingerprint of ``call`` in the group's store, waits (group timeout) for every other
    rank's, compares: CollectiveMismatchError, or CollectiveTimeoutError naming the ranks that did not arrive."""
    n, me, seq, store = st.size, st.rank, call.seq, st.store
    keys = [_KEY.format(seq=seq, rank=r) for r in range(n)]
    others = [keys[r] for r in range(n) if r != me]
    try:
        store.set(keys[me], json.dumps(call.fingerprint))
        try:
            store.wait(others, st.timeout)
        except Exception as e:  # noqa: BLE001 - DistStoreError("Wait timeout") or a dead store
            missing: List[int] = []  # cannot tell, where the store does not answer
            with contextlib.suppress(Exception):
                missing = [r for r in range(n) if r != me and not store.check([keys[r]])]
            if missing:
                raise CollectiveTimeoutError(
                    f"funcoll: {call.label()}: {who(missing, st.trace.global_ranks)} did not reach this collective "
                    f"within {st.timeout_s:g} s (debug check of every collective: the rank is behind, skipped the "
                    f"call, hangs in another call, or died). This rank called {describe(call.fingerprint)}."
                    + recent(call, st.trace, dump=True)) from e
            raise
        values = store.multi_get(others)
    except CollectiveError:
        raise
    except Exception as e:  # noqa: BLE001 - the store itself failed (its server, rank 0, died)
        raise CollectiveError(f"funcoll: {call.label()}: the debug check could not reach the group's store: {e}") from e
    it = iter(values)
    fps: List[dict] = [call.fingerprint if r == me else json.loads(bytes(next(it)).decode()) for r in range(n)]
    if seq:  # every rank has read this rank's previous fingerprint: it published this one after that
        with contextlib.suppress(Exception):  # best effort
            store.delete_key(_KEY.format(seq=seq - 1, rank=me))
    msg = compare(fps, int(seq or 0), st.trace.group, st.trace.global_ranks)
    if msg is not None:
        raise CollectiveMismatchError(msg)


def size_guard(st: GroupState, call: Call) -> None:
    """Checks that ``call`` moves the same bytes on every rank of the group, before it sends anything; returns at once
    where it does not apply (off, one rank, a virtual world, not a CPU collective). Raises CollectiveMismatchError,
    CollectiveTimeoutError (a rank did not reach the collective) or CollectiveError (a peer died)."""
    if not st.guard:
        return
    fp = call.fingerprint
    tp = st.guard_transport  # the group's CPU transport, once it has one
    if tp is None or fp.get("device", "cpu" if fp.get("op") == "barrier" else None) != "cpu":
        return  # a barrier runs on the CPU transport whenever the group has one
    n = st.size
    mine = digest(fp, call.seq if call.seq is not None else -1, st.rank, n)
    try:
        table = tp.gathered(torch.tensor(mine, dtype=torch.int64)).tolist()
    except Exception as e:  # noqa: BLE001 - the digest exchange failed: a rank is missing or dead
        raise _failure(st, call, e) from e
    if not agree(table, n):
        _mismatch(st, call, tp, n)


def _failure(st: GroupState, call: Call, e: BaseException) -> CollectiveError:
    if is_backend_timeout(e):
        return CollectiveTimeoutError(
            f"funcoll: {call.label()} timed out (group timeout {st.timeout_s:g} s): {backend_message(e)} "
            f"(while the ranks exchanged this collective's size digest before sending it: a rank did not reach it "
            f"-- it is behind, skipped the call, or hangs in another one; this rank called "
            f"{describe(call.fingerprint)})." + recent(call, st.trace, dump=True))
    return CollectiveError(f"funcoll: {call.label()} failed: {backend_message(e)}")


_GUARD = "funcoll's size guard on CPU groups; FUNCOLL_GUARD=0 turns it off"


def _mismatch(st: GroupState, call: Call, tp, n: int) -> None:
    """The slow path: every rank's full fingerprint (two more all_gathers), then the debug mode's message."""
    payload = json.dumps({"seq": call.seq, "fp": call.fingerprint}).encode()
    try:
        lengths = tp.gathered(torch.tensor([len(payload)], dtype=torch.int64)).tolist()
        size = max(lengths)
        buf = torch.zeros(size, dtype=torch.uint8)
        buf[:len(payload)] = torch.frombuffer(bytearray(payload), dtype=torch.uint8)
        table = tp.gathered(buf).view(n, size)
    except Exception as e:  # noqa: BLE001
        raise _failure(st, call, e) from e
    got = [json.loads(bytes(table[r, :lengths[r]].tolist()).decode()) for r in range(n)]
    fps = [d["fp"] for d in got]
    seqs = [int(d["seq"]) for d in got]
    group, ranks = st.trace.group, st.trace.global_ranks
    if len(set(seqs)) > 1:
        at = ", ".join(f"rank {r} at #{s}" for r, s in enumerate(seqs))
        why = f"the ranks are at different sequence numbers ({at}): a rank skipped a collective or issued one more"
    else:
        msg = compare(fps, seqs[0], group, ranks, _GUARD)
        if msg is not None:
            raise CollectiveMismatchError(msg)
        why = "their size digests differ (funcoll internal: the fingerprints compare equal; please report)"
    lines = [f"rank {r}: #{s} {describe(fp)}" for r, (s, fp) in enumerate(zip(seqs, fps))]
    raise CollectiveMismatchError(mismatch(group, ranks, min(seqs), why, lines, _GUARD))


# The point-to-point check (debug mode; docs/conformance.md, "Debug mode"): a send and its receive must move the same
# bytes (gloo aborts the receiving process when a larger message arrives). On a mismatch the receiver writes a verdict
# that the sender's Work reads while it waits.
_P2P_KEY = "funcoll-p2p/{src}-{dst}/{k}"


def _p2p_desc(t: torch.Tensor) -> dict:
    return {"dtype": str(t.dtype).replace("torch.", ""), "shape": list(t.shape), "bytes": t.numel() * t.element_size()}


def _p2p_text(d: dict) -> str:
    return f"{d['dtype']}{d['shape']} ({d['bytes']} bytes)"


class P2PCheck:
    """One group's point-to-point check (above): per peer, the number of messages sent to it and received from it,
    which pairs the k-th send of one rank with the k-th receive of its peer."""

    def __init__(self, st: GroupState):
        self.st = st
        self.sent: dict = {}
        self.received: dict = {}
        self._lock = threading.Lock()
        self._last_posted: dict = {}  # src -> the Event of the last receive from src handed to the waiter threads

    def _key(self, counts: dict, src: int, dst: int, peer: int) -> str:
        with self._lock:
            k = counts.get(peer, 0)
            counts[peer] = k + 1
        return _P2P_KEY.format(src=src, dst=dst, k=k)

    def announce(self, dst: int, t: torch.Tensor) -> str:
        """Describes this rank's next message to ``dst`` in the store (does not wait); returns its key."""
        key = self._key(self.sent, self.st.rank, dst, dst)
        self.st.store.set(key, json.dumps(_p2p_desc(t)))
        return key

    def verify(self, src: int, t: torch.Tensor, key: str) -> None:
        """Waits (group timeout) for the description of the message ``key`` from ``src`` and compares it with the
        buffer ``t`` that receives it: CollectiveMismatchError (the verdict written for the sender) when they differ."""
        st = self.st
        try:
            st.store.wait([key], st.timeout)
            theirs = json.loads(bytes(st.store.get(key)).decode())
        except Exception as e:  # noqa: BLE001 - the send never came (DistStoreError "Wait timeout"), or no store
            raise CollectiveTimeoutError(
                f"funcoll: recv from rank {src} on group {st.trace.group!r}: its send was not issued within "
                f"{st.timeout_s:g} s (debug check of point-to-point sizes, TORCH_DISTRIBUTED_DEBUG=DETAIL): {e}") from e
        mine = _p2p_desc(t)
        if theirs["bytes"] != mine["bytes"]:
            msg = (f"funcoll: point-to-point message {key.rsplit('/', 1)[1]} from rank {src} to rank {st.rank} on "
                   f"group {st.trace.group!r} (global ranks {flight_recorder.ranks_text(st.trace.global_ranks)}): "
                   f"rank {src} sends {_p2p_text(theirs)}, rank {st.rank} receives into {_p2p_text(mine)}; a send "
                   f"and its receive must have the same size in bytes. Nothing was received "
                   f"(TORCH_DISTRIBUTED_DEBUG=DETAIL).")
            try:
                st.store.set(key + "/verdict", msg)
            finally:
                raise CollectiveMismatchError(msg)

    def receive_key(self, src: int) -> str:
        return self._key(self.received, src, self.st.rank, src)

    def checked_recv(self, src: int, t: torch.Tensor, post: Callable, run: Callable) -> "CheckedRecv":
        """A receive from ``src`` into ``t``, checked then posted (``post()``) on a waiter thread (``run(job)``), after
        the previous receive from ``src`` was posted (the order of the receives from one peer is kept)."""
        key = self.receive_key(src)
        with self._lock:
            before = self._last_posted.get(src)
            h = CheckedRecv()
            self._last_posted[src] = h.posted

        def job():
            if before is not None:
                before.wait()
            try:
                try:
                    self.verify(src, t, key)
                    inner = post()
                finally:
                    h.posted.set()
                inner.wait()
            except BaseException as e:  # noqa: BLE001 - the receive's error, raised by its wait()
                h.finish(e)
                return
            h.finish(None)

        run(job)
        return h

    def posted(self, src: int) -> None:
        """Waits (group timeout) until every single receive from ``src`` issued so far has been posted: a batch's
        receives from ``src`` are posted after them, in the order of the calls."""
        with self._lock:
            last = self._last_posted.get(src)
        if last is not None:
            last.wait(self.st.timeout_s)

    def watched(self, keys: List[str], h) -> "VerdictWatch":
        return VerdictWatch(self.st, keys, h)


class CheckedRecv(Handle):
    """A receive checked and posted on a waiter thread: complete when its data is in place, or failed."""

    def __init__(self):
        self.posted = threading.Event()
        self._done = threading.Event()
        self._error: Optional[BaseException] = None
        self._fut: torch.futures.Future = torch.futures.Future()

    def finish(self, error: Optional[BaseException]) -> None:
        self._error = error
        self._done.set()
        if error is not None:
            self._fut.set_exception(error)
        else:
            self._fut.set_result(None)

    def wait(self, timeout=None) -> None:
        if not self._done.wait(None if timeout is None else timeout.total_seconds()):
            raise RuntimeError("Operation timed out!")
        if self._error is not None:
            raise self._error

    def is_completed(self) -> bool:
        return self._done.is_set()

    def get_future(self) -> torch.futures.Future:
        return self._fut


class VerdictWatch(Handle):
    """The handle of sends checked in debug mode: waits for them, and fails with the receiver's verdict when a
    receiver found a size mismatch (those sends are never received)."""

    def __init__(self, st: GroupState, keys: List[str], h):
        self.st, self.keys, self.h = st, [k + "/verdict" for k in keys], h

    def _verdict(self) -> None:
        for key in self.keys:
            if self.st.store.check([key]):
                raise CollectiveMismatchError(bytes(self.st.store.get(key)).decode())

    def wait(self, timeout=None) -> None:
        end = time.monotonic() + (self.st.timeout_s if timeout is None else timeout.total_seconds())
        while not self.h.is_completed():
            self._verdict()
            if time.monotonic() >= end:
                break
            time.sleep(0.005)
        self._verdict()  # also when the message went after all (a receive of the right size took it later)
        self.h.wait() if timeout is None else self.h.wait(timeout)

    def is_completed(self) -> bool:
        return self.h.is_completed() or any(self.st.store.check([k]) for k in self.keys)

    def get_future(self):
        return self.h.future() if hasattr(self.h, "future") else self.h.get_future()  # type: ignore[attr-defined]
