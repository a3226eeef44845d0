"""Which peers of a group are gone, read when one of its collectives fails (docs/fault-tolerance.md, "Losing a rank").

Every rank of a group of two or more processes says where it runs -- host, pid, the process's start time -- in the
group's store when the group is made (one ``set``; nothing else is paid while the job is healthy). A rank whose
collective fails with a backend error reads every peer's entry and looks at the processes on its own host: a pid that
is gone, or now belongs to a process started later, has exited. It writes what it saw to the store, so that a rank on
another host, which cannot see that process, names it too. The sentence :func:`lost` returns ends the error.
"""

from __future__ import annotations

import contextlib
import os
import socket
import time
from typing import Dict, List, Optional, Tuple

__all__ = ["register", "lost"]

_WHERE = "funcoll-peers/{rank}"  # "host\npid\nstart time"
_EXITED = "funcoll-peers/exited/{rank}"  # written by a rank that saw that process gone: its host
_REMOTE_WAIT_S = 1.0  # how long a rank waits for another host's ranks to say that a peer there has exited
_DYING_S = 0.5  # how long a rank looks again at a peer whose connection closed: its process may still be exiting
_VERDICT_S = 5.0  # one look per group in that time: the outstanding calls a lost peer fails all read it
_LOST_WORDS = ("closed", "reset", "refused", "broken pipe", "timed out", "timeout", "connection", "socket")


def _stat(pid: int) -> Optional[Tuple[str, str]]:
    """(state, start time) of process ``pid`` (/proc/<pid>/stat fields 3 and 22: "Z" for a process that has exited
    and not been reaped; clock ticks since boot); None without /proc or without that process."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()  # the fields after the command name, which may hold spaces
    except OSError:
        return None
    return fields[0], fields[19]


def register(state) -> None:
    """This rank's entry in the group's store (a group of two or more processes on a shared store); a store that
    takes no entry (a store of the caller's own) leaves the group's peers unnamed, nothing else."""
    pid = os.getpid()
    stat = _stat(pid)
    with contextlib.suppress(RuntimeError):  # c10d's "Not implemented" of a Store subclass without set()
        state.store.set(_WHERE.format(rank=state.rank), f"{socket.gethostname()}\n{pid}\n{stat[1] if stat else ''}")


def _exited(pid: int, start: str) -> bool:
    """Whether process ``pid`` (started at ``start``, "" if unknown) on this host has exited."""
    if start:
        now = _stat(pid)
        if now is not None or os.path.isdir("/proc"):
            # gone, exited (a zombie, or dying), or the pid now belongs to a process started later
            return now is None or now[0] in "ZXx" or now[1] != start
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:  # alive, another user's
        return False
    return False


def _where(state) -> Dict[int, Tuple[str, int, str]]:
    store, keys = state.store, {r: _WHERE.format(rank=r) for r in range(state.size) if r != state.rank}
    if not store.check(list(keys.values())):  # a peer that never registered: nothing to read
        return {}
    out = {}
    for r, value in zip(keys, store.multi_get(list(keys.values()))):
        host, pid, start = bytes(value).decode().split("\n")
        out[r] = (host, int(pid), start)
    return out


def lost(state, error: BaseException) -> Tuple[str, List[int]]:
    """The sentence that names the ranks of the group whose process has exited, for a collective that failed with
    ``error`` ("" where there is nothing to say: a group of one process, an error that is not about a peer), and those
    ranks."""
    if state.size < 2 or state.local_store:
        return "", []
    now = time.monotonic()
    cached = getattr(state, "_lost", None)
    if cached is not None and now - cached[0] < _VERDICT_S:
        return cached[1]
    verdict = _look(state, error)
    state._lost = (now, verdict)
    return verdict


def _look(state, error: BaseException) -> Tuple[str, List[int]]:
    ranks = state.trace.global_ranks
    try:
        where = _where(state)
    except Exception as e:  # noqa: BLE001 - said in the sentence
        return (f" The group's store cannot be reached ({str(e).strip().splitlines()[0][:200]}): the process that "
                "hosts it (rank 0 under init_method='tcp://...', or torchrun's agent) may be the one that is gone.",
                [])
    if not where:
        return "", []
    host = socket.gethostname()
    remote = [r for r, (h, _, _) in where.items() if h != host]
    local = {r: w for r, w in where.items() if w[0] == host}
    lost_words = any(w in str(error).lower() for w in _LOST_WORDS)
    # a lost connection may reach this rank while the peer's process is still exiting (its sockets close first)
    end = time.monotonic() + (_DYING_S if lost_words else 0.0)
    while True:
        dead = [(r, f"pid {pid} on this host") for r, (_, pid, start) in local.items() if _exited(pid, start)]
        if dead or time.monotonic() >= end:
            break
        time.sleep(0.02)
    # best effort: the store's host may be the process that is gone (the sentence is then this host's alone)
    with contextlib.suppress(Exception):  # the collective's own error is what the caller gets
        for r, _ in dead:
            state.store.set(_EXITED.format(rank=r), host)
        if not dead and remote:  # a rank on another host may have seen it: read what they wrote
            end = time.monotonic() + _REMOTE_WAIT_S
            keys = {r: _EXITED.format(rank=r) for r in remote}
            while not dead:
                dead = [(r, f"on host {where[r][0]!r}, seen by a rank on its host") for r, k in keys.items()
                        if state.store.check([k])]
                if dead or time.monotonic() >= end:
                    break
                time.sleep(0.05)
    if dead:
        return " " + " ".join(f"Peer rank {r} of the group (global rank {ranks[r]}, {how}) has exited."
                              for r, how in sorted(dead)), sorted(r for r, _ in dead)
    if not lost_words:
        return "", []
    far = f"; ranks {', '.join(map(str, sorted(remote)))} run on other hosts, whose processes it cannot see" \
        if remote else ""
    return f" No other process of the group on this host has exited{far}.", []
