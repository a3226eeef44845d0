"""The size guard: a cheap cross-rank check of every blocking collective on a CPU (gloo) funcoll group, on under
``TORCH_DISTRIBUTED_DEBUG=DETAIL`` or ``FUNCOLL_GUARD=1`` (torch's convention for checks that cost a collective: a
user's job does not pay for it by default).

gloo aborts the whole process (``gloo::EnforceNotMet ... Received data size doesn't match expected size``, SIGABRT)
when the ranks of a group disagree on how many bytes a collective moves: all_reduce of shapes [4] and [5], an
all_gather or reduce_scatter of different shapes, all_to_all with split sizes that do not pair up, dtypes of
different widths. The debug mode (:func:`funcoll.entry.debug.check`) prevents that, but costs four store round trips
per collective, so it is opt-in. The guard prevents it, where it is on, for the price of one small collective:

1. right before the collective's first primitive sends (the entry's ``before_send`` hook: funcoll's own validation
   has passed, the call has its sequence number), every rank makes a *digest* of the call, three int64: the
   sequence number, a stable 64-bit hash (blake2b, not Python's salted ``hash()``) of the fields of the call's
   fingerprint that must be equal on every rank (op, reduce op, root, dtypes, shapes, output shapes, device), and a
   sum of 64-bit hashes of the per-peer fields (all_to_all split sizes and per-peer shapes, a gather/scatter root's
   list) that is zero mod 2**64 over the group exactly when every send pairs with a matching receive;
2. the ranks exchange their digests with ONE ``all_gather`` of ``3 * group size`` int64 on the group's gloo
   backend, the one that carries the data;
3. each rank compares the table locally. Equal (the only case in a correct program): the collective runs. Not
   equal (every rank sees the same table, so every rank decides the same): the slow path exchanges the full
   fingerprints (two more all_gathers, of their lengths and of their JSON) and raises
   :class:`~funcoll.entry.work.CollectiveMismatchError` with the debug mode's message
   (:func:`funcoll.entry.debug.compare`), the same text on every rank. Nothing of the collective was sent and
   every rank used its sequence number, so the ranks stay in step: the next collective works.

A rank that never reaches the collective makes the others' digest exchange time out (the group timeout):
:class:`~funcoll.entry.work.CollectiveTimeoutError` naming the collective, with the flight recorder dumped.

Where it runs: blocking collectives (never ``async_op=True`` ones, whose issue must not wait for the peers, nor
point-to-point send/recv) on the CPU transport of funcoll groups of two or more ranks with a real store. Not on
world size 1, virtual worlds (HashStore, FakeStore), XLA or XPU tensors: there an
extra collective costs real device latency, and the debug mode stays opt-in. On with ``FUNCOLL_GUARD=1`` or
``TORCH_DISTRIBUTED_DEBUG=DETAIL`` (``FUNCOLL_GUARD=0`` keeps it off under DETAIL; read when a group runs its first
collective), per group with :func:`set_guard` (on every rank between the same two collectives), or
``funcoll.Options(guard=True)``. In debug mode the debug check runs instead (it checks the same and more).
Without it, a size mismatch does what it does on raw gloo: the receiving process aborts.
"""

from __future__ import annotations

import array
import hashlib
import json
import os
import threading
from typing import List, Optional

import torch

from funcoll.entry import flight_recorder
from funcoll.entry.work import CollectiveError, CollectiveMismatchError, CollectiveTimeoutError

__all__ = ["guard", "set_guard", "guard_enabled", "guard_from_env", "digest", "agree", "applies"]

_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")
_M = (1 << 64) - 1
_SLOTS = 3  # seq, hash of the common fields, sum of the per-peer hashes

# keys of a fingerprint that legitimately differ between ranks (debug._PER_RANK): checked against each other
_PER_RANK = frozenset(("input_split_sizes", "output_split_sizes", "per_peer_in", "per_peer_out", "root_outputs",
                       "root_inputs", "root_output_numel"))


def guard_from_env() -> bool:
    """``FUNCOLL_GUARD``: 1/true/yes/on turns the guard on, 0/false/no/off off; unset, it follows torch's convention
    for cross-rank checks: on under ``TORCH_DISTRIBUTED_DEBUG=DETAIL``, off otherwise (a user's job pays no extra
    collective by default)."""
    v = os.environ.get("FUNCOLL_GUARD", "").strip().lower()
    if v in _TRUE:
        return True
    if v in _FALSE:
        return False
    try:
        import torch.distributed as dist

        return dist.get_debug_level() == dist.DebugLevel.DETAIL
    except Exception:  # noqa: BLE001 - a torch without debug levels
        return os.environ.get("TORCH_DISTRIBUTED_DEBUG", "").upper() == "DETAIL"


class _Guard:
    __slots__ = ("on", "backend", "lock", "bufs")

    def __init__(self, on: bool):
        self.on = on
        self.backend = None  # the CPU transport's gloo backend, found at the first guarded call
        self.lock = threading.Lock()  # the reused digest buffers (another thread on the same group allocates its own)
        self.bufs: Optional[tuple] = None

    @staticmethod
    def buffers(n: int) -> tuple:
        """``(input, output)`` int64 tensors for the digest exchange, and Python arrays sharing their memory (cheaper
        to fill and read than tensor ops: this is most of the guard's own time; no numpy needed)."""
        inp_arr = array.array("q", bytes(8 * _SLOTS))
        out_arr = array.array("q", bytes(8 * n * _SLOTS))
        return (torch.frombuffer(inp_arr, dtype=torch.int64), torch.frombuffer(out_arr, dtype=torch.int64),
                inp_arr, out_arr)


_lock = threading.Lock()


def _state(pg, st=None) -> _Guard:
    g = pg.__dict__.get("_funcoll_guard")
    if g is None:
        with _lock:
            g = pg.__dict__.get("_funcoll_guard")
            if g is None:
                opt = getattr(getattr(pg, "options", None), "guard", None)
                on = guard_from_env() if opt is None else bool(opt)
                local = st.local_store if st is not None else _local_store(pg)
                g = _Guard(on and pg.size() > 1 and not local)
                pg.__dict__["_funcoll_guard"] = g
    return g


def _local_store(pg) -> bool:
    from funcoll.entry.process_group import _LOCAL_STORES, _unwrap_store

    return isinstance(_unwrap_store(pg._store), _LOCAL_STORES)


def set_guard(group, enabled: bool = True) -> None:
    """Turns the size guard on or off for one group. Every rank of the group must do the same, between the same two
    collectives (a rank that guards and one that does not would pair a digest exchange with a collective)."""
    g = _state(group)
    g.on = bool(enabled) and group.size() > 1 and not _local_store(group)


def guard_enabled(group) -> bool:
    return _state(group).on


def applies(pg, st=None) -> bool:
    """Whether the guard checks this group's CPU collectives (its state is made at the first question: cheap, once
    per group). The entry's native fast path must not bypass :func:`guard` for a CPU collective where this is True."""
    g = pg.__dict__.get("_funcoll_guard") or _state(pg, st)
    return g.on


# ---------------------------------------------------------------------------------------------------
# the digest (pure: tested without processes)
# ---------------------------------------------------------------------------------------------------
def _h(text: str) -> int:
    """A stable unsigned 64-bit hash of ``text`` (the same in every process, unlike ``hash()``)."""
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little")


def _mix(x: int) -> int:
    """splitmix64's finalizer: a stable 64-bit mix of a small integer tuple's encoding."""
    x = (x + 0x9E3779B97F4A7C15) & _M
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _M
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _M
    return x ^ (x >> 31)


def _edge(kind: int, src: int, dst: int, value) -> int:
    """The hash of "rank ``src`` sends ``value`` (rows, a shape) to rank ``dst``"."""
    v = value if isinstance(value, int) else _h(repr(value))
    return _mix(_mix(_mix((kind << 48) ^ src) ^ dst) ^ (v & _M))


_A2A, _A2A_LIST, _GATHER, _SCATTER = 1, 2, 3, 4
_CROSS_OPS = frozenset(("all_to_all_single", "all_to_all", "gather", "scatter", "gather_single"))
_NUMEL = 0x9E3779B97F4A7C15 | 1  # odd: multiplying by it is a bijection mod 2**64


def _cross(fp: dict, rank: int, n: int) -> int:
    """This rank's share of the per-peer sum: + every edge it sends, - every edge it expects to receive. Over the
    group the shares add up to 0 (mod 2**64) when every send meets an equal receive (debug._cross checks the same,
    with the per-rank values at hand)."""
    op = fp.get("op")
    s = 0
    if op == "all_to_all_single":
        ins, outs = fp.get("input_split_sizes"), fp.get("output_split_sizes")
        if ins is None or outs is None:
            return 0
        for q, k in enumerate(ins):
            s += _edge(_A2A, rank, q, int(k))
        for q, k in enumerate(outs):
            s -= _edge(_A2A, q, rank, int(k))
    elif op == "all_to_all":
        for q, shape in enumerate(fp.get("per_peer_in") or ()):
            s += _edge(_A2A_LIST, rank, q, shape)
        for q, shape in enumerate(fp.get("per_peer_out") or ()):
            s -= _edge(_A2A_LIST, q, rank, shape)
    elif op in ("gather", "scatter"):
        root = fp.get("root")
        kind = _GATHER if op == "gather" else _SCATTER
        mine = (fp.get("tensors") or [[None, None]])[0][1]
        s += _edge(kind, rank, -1, mine)
        if rank == root:
            for q, shape in enumerate(fp.get("root_outputs" if op == "gather" else "root_inputs") or ()):
                s -= _edge(kind, q, -1, shape)
    elif op == "gather_single":
        shape = (fp.get("tensors") or [[None, []]])[0][1] or []
        k = 1
        for d in shape:
            k *= int(d)
        s += k * _NUMEL
        if fp.get("root_output_numel") is not None and rank == fp.get("root"):
            s -= int(fp["root_output_numel"]) * _NUMEL
    return s & _M


def _signed(x: int) -> int:
    x &= _M
    return x - (1 << 64) if x >> 63 else x


def digest(fp: dict, seq: int, rank: int, n: int) -> List[int]:
    """The call's digest, ``[seq, hash of the common fields, per-peer share]`` as signed int64."""
    # fingerprints are built by the same code on every rank: equal dicts, equal reprs
    common = repr(fp) if _PER_RANK.isdisjoint(fp) else repr({k: v for k, v in fp.items() if k not in _PER_RANK})
    cross = _cross(fp, rank, n) if fp.get("op") in _CROSS_OPS else 0
    return [int(seq), _signed(_h(common)), _signed(cross)]


def agree(table: List[int], n: int) -> bool:
    """Whether the digests of every rank (``table[3 * r: 3 * r + 3]``, rank r's) say the calls match."""
    return (table[0::_SLOTS].count(table[0]) == n and table[1::_SLOTS].count(table[1]) == n
            and sum(table[2::_SLOTS]) & _M == 0)


# ---------------------------------------------------------------------------------------------------
# the check
# ---------------------------------------------------------------------------------------------------
def _device(pg, fp: dict) -> Optional[str]:
    dev = fp.get("device")
    if dev is not None or fp.get("op") != "barrier":
        return dev
    tps = getattr(pg, "_transports", None)  # barrier: the CPU transport unless the group has only others
    return "cpu" if not tps or "cpu" in tps else None


def _backend(pg, g: _Guard):
    b = g.backend
    if b is None:
        b = getattr(pg.transport("cpu"), "backend", None)
        if b is None or not hasattr(b, "_allgather_base"):
            g.on = False  # not a c10d gloo transport: nothing to guard with
            return None
        g.backend = b
    return b


def _exchange(backend, values: torch.Tensor, n: int) -> torch.Tensor:
    out = values.new_empty((n * values.numel(),))
    backend._allgather_base(out, values).wait()
    return out


def guard(pg, st, call: flight_recorder.Call) -> None:
    """Checks, across the ranks of ``pg``, that ``call`` moves the same bytes on every rank, before it sends
    anything (see the module's docstring). Returns at once where the guard does not apply (off, one rank, a virtual
    world, not a CPU collective). Raises CollectiveMismatchError (the same message on every rank),
    CollectiveTimeoutError (a rank did not reach the collective within the group's timeout) or CollectiveError (a
    peer died)."""
    g = pg.__dict__.get("_funcoll_guard") or _state(pg, st)
    if not g.on:
        return
    fp = call.fingerprint
    if _device(pg, fp) != "cpu":
        return
    backend = g.backend or _backend(pg, g)
    if backend is None:
        return
    n = pg.size()
    mine = digest(fp, call.seq if call.seq is not None else -1, pg.rank(), n)
    own = g.lock.acquire(blocking=False)
    try:
        bufs = g.bufs if own and g.bufs is not None else _Guard.buffers(n)
        if own:
            g.bufs = bufs
        inp, out, inp_arr, out_arr = bufs
        inp_arr[:] = array.array("q", mine)
        try:
            backend._allgather_base(out, inp).wait()
        except Exception as e:  # noqa: BLE001 - the digest exchange failed: a rank is missing or dead
            raise _failure(st, call, e) from e
        table = out_arr.tolist()
    finally:
        if own:
            g.lock.release()
    if agree(table, n):
        return
    _mismatch(pg, st, call, backend, n)


def _failure(st, call, e: BaseException) -> CollectiveError:
    from funcoll.entry.work import _backend_message, _is_backend_timeout, _recent

    if _is_backend_timeout(e):
        return CollectiveTimeoutError(
            f"funcoll: {call.label()} timed out (group timeout {st.timeout_s():g} s): {_backend_message(e)} "
            f"(while the ranks exchanged this collective's size digest before sending it: a rank did not reach it "
            f"-- it is behind, skipped the call, or hangs in another one; this rank called "
            f"{flight_recorder.describe(call.fingerprint)})." + _recent(call, st.trace, dump=True))
    return CollectiveError(f"funcoll: {call.label()} failed: {_backend_message(e)}")


_DEBUG_SUFFIX = "(cross-rank check of FUNCOLL_DEBUG / TORCH_DISTRIBUTED_DEBUG=DETAIL)"
_GUARD_SUFFIX = "(funcoll's size guard on CPU groups; FUNCOLL_GUARD=0 turns it off)"


def _mismatch(pg, st, call, backend, n: int) -> None:
    """The slow path: every rank's full fingerprint, through two more all_gathers of sizes every rank knows, then
    the debug mode's message. Raises CollectiveMismatchError."""
    from funcoll.entry.debug import compare

    payload = json.dumps({"seq": call.seq, "fp": call.fingerprint}).encode()
    try:
        lengths = _exchange(backend, torch.tensor([len(payload)], dtype=torch.int64), n).tolist()
        size = max(lengths)
        buf = torch.zeros(size, dtype=torch.uint8)
        buf[:len(payload)] = torch.frombuffer(bytearray(payload), dtype=torch.uint8)
        table = _exchange(backend, buf, n).view(n, size)
    except Exception as e:  # noqa: BLE001
        raise _failure(st, call, e) from e
    got = [json.loads(bytes(table[r, :lengths[r]].tolist()).decode()) for r in range(n)]
    fps = [d["fp"] for d in got]
    seqs = [int(d["seq"]) for d in got]
    group, ranks = st.trace.group, st.trace.global_ranks
    if len(set(seqs)) == 1:
        msg = compare(fps, seqs[0], group, ranks)
        if msg is None:  # the digests differ, the fingerprints compare equal: say so rather than guess
            msg = _text(group, ranks, seqs, fps, "their size digests differ (funcoll internal: the fingerprints "
                        "compare equal; please report)")
    else:
        at = ", ".join(f"rank {r} at #{s}" for r, s in enumerate(seqs))
        msg = _text(group, ranks, seqs, fps, f"the ranks are at different sequence numbers ({at}): a rank skipped a "
                    "collective or issued one more earlier")
    msg = msg.replace(_DEBUG_SUFFIX, _GUARD_SUFFIX) if _DEBUG_SUFFIX in msg else msg + " " + _GUARD_SUFFIX
    raise CollectiveMismatchError(msg)


def _text(group: str, ranks, seqs: List[int], fps: List[dict], why: str) -> str:
    lines = [f"  rank {r}: #{s} {flight_recorder.describe(fp)}" for r, (s, fp) in enumerate(zip(seqs, fps))]
    gr = f" (global ranks {flight_recorder._ranks(ranks)})" if ranks is not None else ""
    return (f"funcoll: detected mismatch between collectives on group {group!r}{gr} at sequence number "
            f"{min(seqs)}: {why}.\n" + "\n".join(lines) + "\nEvery rank of a group must issue the same collectives "
            "in the same order. Nothing of this collective was sent.")
