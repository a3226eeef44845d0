"""Every eager collective's entry: sequence numbers, the flight recorder, and the debug mode's cross-rank check.

:func:`instrument` wraps each collective method of :class:`~funcoll.entry.process_group.ProcessGroupFuncoll` once, at
import. Per call it

1. describes the call as a *fingerprint*: op, reduce op, root, dtypes, shapes, split sizes / per-peer shapes;
2. gives it the group's next sequence number (point-to-point ops have their own counter) and a flight-recorder
   entry (:mod:`funcoll.flight_recorder`);
3. in debug mode, checks the fingerprints of every rank of the group *before anything is sent*
   (:func:`check`); a mismatch raises :class:`~funcoll.entry.work.CollectiveMismatchError` on every rank, with the
   same message; a rank that does not arrive within the group's timeout is named
   (:class:`~funcoll.entry.work.CollectiveTimeoutError`);
4. runs the method; an error the backend raises while issuing is re-raised naming the collective
   (:class:`~funcoll.entry.work.CollectiveError`); funcoll's own validation errors (ValueError, TypeError) pass
   unchanged;
5. hands the entry to the returned :class:`~funcoll.entry.work.FuncollWork`, which completes or fails it.

The native fast path: when the transport's backend serves the request as it is under funcoll's semantics (one cached
lookup per signature in :mod:`funcoll.algorithms`, e.g. ``native_all_reduce_request``: a new signature is validated
in full, an invalid one is never cached), the entry numbers the call, records it in the flight recorder (a list,
read as a :class:`~funcoll.flight_recorder.Call`; the signature's fingerprint is computed once) and calls the backend's
own method with the caller's arguments. A blocking call (``opts.asyncOp`` False, as ``dist.*`` passes it) is waited on
here, a failure raised naming the collective, and the backend's own Work returned; an async one gets a
:class:`~funcoll.entry.work.NativeWork`. The full path runs instead in debug mode, while coalescing, for CPU requests
while the size guard (:mod:`funcoll.entry.guard`, run in ``start()`` before anything is sent) is on for the group,
while ``record()``, a profiler or the funcoll debug log observe (``algorithms.watched()``), for a group's first
collective, and for anything the lookup does not call native.

Debug mode: ``FUNCOLL_DEBUG=1`` or ``TORCH_DISTRIBUTED_DEBUG=DETAIL`` (``FUNCOLL_DEBUG=0`` turns it off under
DETAIL), read when a group first runs a collective; :func:`set_debug` per group. The check goes through the
group's c10d store, never through the backend that carries the data: mismatched requests never reach gloo,
which aborts the process on some of them ("Received data size doesn't match expected size"). Groups on a local
store (HashStore, FakeStore: a virtual world in one process) are never checked.

Also here: :func:`monitored_barrier`, gloo's own (the group's CPU transport is a gloo backend): it names the
ranks that did not arrive within the timeout. On torch versions whose ``dist.monitored_barrier`` accepts only
groups named "gloo" (2.9), :func:`patch_monitored_barrier` lets it reach funcoll groups (every other group calls
the original function).
"""

from __future__ import annotations

import functools
import json
import os
import threading
import time
import warnings
import weakref
from datetime import timedelta
from typing import Callable, Dict, List, Optional

import torch
import torch.distributed as dist

from funcoll.entry import flight_recorder, guard
from funcoll.entry.work import (
    CollectiveError,
    CollectiveMismatchError,
    CollectiveTimeoutError,
    FuncollWork,
    NativeWork,
    failure,
)
from funcoll.semantics import check_layout

__all__ = ["instrument", "state_of", "set_debug", "debug_enabled", "sequence_number", "check", "fingerprint",
           "monitored_barrier", "patch_monitored_barrier", "compare"]

_TRUE = ("1", "true", "yes", "on", "detail")
_FALSE = ("0", "false", "no", "off")


def debug_from_env() -> bool:
    v = os.environ.get("FUNCOLL_DEBUG", "").strip().lower()
    if v in _TRUE:
        return True
    if v in _FALSE:
        return False
    try:
        return dist.get_debug_level() == dist.DebugLevel.DETAIL
    except Exception:  # noqa: BLE001 - a torch without debug levels
        return os.environ.get("TORCH_DISTRIBUTED_DEBUG", "").upper() == "DETAIL"


# ---------------------------------------------------------------------------------------------------
# per-group state
# ---------------------------------------------------------------------------------------------------
class GroupState:
    """Sequence numbers, flight recorder and debug switch of one funcoll group."""

    def __init__(self, pg):
        from funcoll.entry.process_group import _LOCAL_STORES, _unwrap_store

        self._pg = weakref.ref(pg)
        self.store = pg._store
        self.local_store = isinstance(_unwrap_store(pg._store), _LOCAL_STORES)
        self.trace = flight_recorder.GroupTrace(pg.group_name or "(unnamed)", pg._global_ranks, pg.rank(), pg.size(),
                                                desc=pg.group_desc)
        self.debug = debug_from_env() and not self.local_store and pg.size() > 1
        # torch's backend-agnostic NaN check (torch >= 2.15 attaches it to every group; funcoll runs it itself, on every
        # torch version): a floating input holding a NaN is refused before anything is sent
        self.nan_check = os.environ.get("TORCH_DIST_NAN_CHECK", "0") == "1"

    def timeout_s(self) -> float:
        pg = self._pg()
        t = getattr(pg, "_timeout", None) if pg is not None else None
        return t.total_seconds() if t is not None else 1800.0


_state_lock = threading.Lock()


def state_of(pg) -> GroupState:
    st = pg.__dict__.get("_funcoll_state")
    if st is None:
        with _state_lock:
            st = pg.__dict__.get("_funcoll_state")
            if st is None:
                st = GroupState(pg)
                pg.__dict__["_funcoll_state"] = st
    return st


def set_debug(group, enabled: bool = True) -> None:
    """Turns the cross-rank check on or off for one group (every rank of the group must do the same, between the
    same two collectives)."""
    st = state_of(group)
    st.debug = bool(enabled) and not st.local_store and group.size() > 1


def debug_enabled(group) -> bool:
    return state_of(group).debug


def sequence_number(group) -> int:
    """The sequence number the group's next collective will get (the count of collectives so far)."""
    return state_of(group).trace.seq


# ---------------------------------------------------------------------------------------------------
# fingerprints
# ---------------------------------------------------------------------------------------------------
def _arg(args, kwargs, i: int, name: str, default=None):
    if len(args) > i:
        return args[i]
    return kwargs.get(name, default)


def _dt(dtype) -> str:
    return str(dtype).replace("torch.", "")


def _t(t) -> list:
    return [_dt(t.dtype), list(t.shape)]


def _ts(ts) -> list:
    return [_t(t) for t in ts if isinstance(t, torch.Tensor)]


def _shapes(ts) -> list:
    return [list(t.shape) for t in ts]


_PREMUL = dist.ReduceOp.RedOpType.PREMUL_SUM  # type: ignore[attr-defined]


def _reduce_op(opts, opname: str) -> Optional[str]:
    op = opts
    if opts is not None and not isinstance(opts, (str, dist.ReduceOp)) and hasattr(opts, "reduceOp"):
        op = opts.reduceOp
    if op is None:
        return "sum"
    if isinstance(op, dist.ReduceOp):  # the common case, without parsing: ReduceOp.SUM -> "sum"
        kind = op.op  # type: ignore[attr-defined]
        if kind != _PREMUL:
            return kind.name.lower()
    try:
        from funcoll.semantics import parse_reduction

        red = parse_reduction(op, opname)
    except Exception:  # noqa: BLE001 - validation is the algorithm's job; describe what was given
        return repr(op)
    f = red.factor
    if f is not None:
        f = float(f.reshape(-1)[0]) if isinstance(f, torch.Tensor) else float(f)
        return f"{red.op}({f:g})"
    return str(red.op)


def _root(opts) -> Optional[int]:
    r = getattr(opts, "rootRank", None)
    return int(r) if r is not None else 0


def _device(ts) -> Optional[str]:
    for t in ts:
        if isinstance(t, torch.Tensor):
            return t.device.type
    return None


def _flat(x) -> list:
    out = []
    for v in x if isinstance(x, (list, tuple)) else [x]:
        if isinstance(v, (list, tuple)):
            out += _flat(v)
        elif isinstance(v, torch.Tensor):
            out.append(v)
    return out


def _splits(splits, t, n: int):
    if splits is not None and len(splits):
        return [int(s) for s in splits]
    if t.dim() and t.shape[0] % n == 0:
        return [t.shape[0] // n] * n
    return None


class Spec:
    """How to fingerprint one ProcessGroup method. ``fn(pg, args, kwargs) -> dict``."""

    __slots__ = ("op", "fn", "p2p")

    def __init__(self, op: str, fn: Callable, p2p: bool = False):
        self.op, self.fn, self.p2p = op, fn, p2p


def _fp_allreduce(op):
    def fn(pg, a, k):
        ts = list(_arg(a, k, 0, "tensors"))
        return {"op": op, "reduce_op": _reduce_op(_arg(a, k, 1, "opts"), op), "tensors": _ts(ts),
                "device": _device(ts)}
    return fn


def _fp_gather_base(op):
    def fn(pg, a, k):
        out, inp = _arg(a, k, 0, "output"), _arg(a, k, 1, "input")
        return {"op": op, "tensors": [_t(inp)], "outputs": [list(out.shape)], "device": inp.device.type}
    return fn


def _fp_gather_coalesced(op):
    def fn(pg, a, k):
        outs, ins = list(_arg(a, k, 0, "outputs")), list(_arg(a, k, 1, "inputs"))
        return {"op": op, "tensors": _ts(ins), "outputs": _shapes(outs), "device": _device(ins)}
    return fn


def _fp_allgather(pg, a, k):
    outs, ins = _arg(a, k, 0, "output_tensors"), list(_arg(a, k, 1, "input_tensors"))
    return {"op": "all_gather", "tensors": _ts(ins), "outputs": [_shapes(o) for o in outs], "device": _device(ins)}


def _fp_allgather_coalesced(pg, a, k):
    outs, ins = _arg(a, k, 0, "output_lists"), list(_arg(a, k, 1, "input_list"))
    return {"op": "all_gather_coalesced", "tensors": _ts(ins), "outputs": [_shapes(o) for o in outs],
            "device": _device(ins)}


def _fp_rs_base(op):
    def fn(pg, a, k):
        out, inp = _arg(a, k, 0, "output"), _arg(a, k, 1, "input")
        return {"op": op, "reduce_op": _reduce_op(_arg(a, k, 2, "opts"), op), "tensors": [_t(inp)],
                "outputs": [list(out.shape)], "device": inp.device.type}
    return fn


def _fp_rs_coalesced(op):
    def fn(pg, a, k):
        outs, ins = list(_arg(a, k, 0, "outputs")), list(_arg(a, k, 1, "inputs"))
        return {"op": op, "reduce_op": _reduce_op(_arg(a, k, 2, "opts"), op), "tensors": _ts(ins),
                "outputs": _shapes(outs), "device": _device(ins)}
    return fn


def _fp_reduce_scatter(pg, a, k):
    outs, ins = list(_arg(a, k, 0, "output_tensors")), _arg(a, k, 1, "input_tensors")
    return {"op": "reduce_scatter", "reduce_op": _reduce_op(_arg(a, k, 2, "opts"), "reduce_scatter"),
            "tensors": _ts(outs), "inputs": [_shapes(i) for i in ins], "device": _device(outs)}


def _fp_a2a_base(op):
    def fn(pg, a, k):
        out, inp = _arg(a, k, 0, "output"), _arg(a, k, 1, "input")
        osz, isz = _arg(a, k, 2, "output_split_sizes"), _arg(a, k, 3, "input_split_sizes")
        n = pg.size()
        return {"op": op, "tensors": [[_dt(inp.dtype), list(inp.shape[1:])]], "outputs": [list(out.shape[1:])],
                "device": inp.device.type,
                "input_split_sizes": _splits(isz, inp, n), "output_split_sizes": _splits(osz, out, n)}
    return fn


def _fp_alltoall(pg, a, k):
    outs, ins = list(_arg(a, k, 0, "output_tensors")), list(_arg(a, k, 1, "input_tensors"))
    return {"op": "all_to_all", "tensors": [[_dt(t.dtype), None] for t in ins[:1]], "device": _device(ins),
            "count": [len(ins), len(outs)], "per_peer_in": _shapes(ins), "per_peer_out": _shapes(outs)}


def _fp_broadcast(pg, a, k):
    ts = list(_arg(a, k, 0, "tensors"))
    return {"op": "broadcast", "root": _root(_arg(a, k, 1, "opts")), "tensors": _ts(ts), "device": _device(ts)}


def _fp_reduce(pg, a, k):
    ts = list(_arg(a, k, 0, "tensors"))
    opts = _arg(a, k, 1, "opts")
    return {"op": "reduce", "root": _root(opts), "reduce_op": _reduce_op(opts, "reduce"), "tensors": _ts(ts),
            "device": _device(ts)}


def _fp_gather(pg, a, k):
    outs, ins = _arg(a, k, 0, "output_tensors"), list(_arg(a, k, 1, "input_tensors"))
    root = _root(_arg(a, k, 2, "opts"))
    fp = {"op": "gather", "root": root, "tensors": _ts(ins), "device": _device(ins)}
    if pg.rank() == root:
        fp["root_outputs"] = _shapes(outs[0]) if outs else []
    return fp


def _fp_scatter(pg, a, k):
    outs, ins = list(_arg(a, k, 0, "output_tensors")), _arg(a, k, 1, "input_tensors")
    root = _root(_arg(a, k, 2, "opts"))
    fp = {"op": "scatter", "root": root, "tensors": _ts(outs), "device": _device(outs)}
    if pg.rank() == root:
        fp["root_inputs"] = _shapes(ins[0]) if ins else []
    return fp


def _fp_gather_single(op):
    def fn(pg, a, k):
        out, inp = _arg(a, k, 0, "output"), _arg(a, k, 1, "input")
        root = _root(_arg(a, k, 2, "opts"))
        fp = {"op": op, "root": root, "tensors": [_t(inp)], "device": inp.device.type}
        if pg.rank() == root:
            fp["root_output_numel"] = int(out.numel())
        return fp
    return fn


def _fp_barrier(pg, a, k):
    return {"op": "barrier"}


def _fp_p2p(op, peer_arg):
    def fn(pg, a, k):
        ts = list(_arg(a, k, 0, "tensors"))
        return {"op": op, "peer": _arg(a, k, 1, peer_arg), "tag": _arg(a, k, 2, "tag", 0), "tensors": _ts(ts)}
    return fn


def _fp_recv_any(pg, a, k):
    ts = list(_arg(a, k, 0, "tensors"))
    return {"op": "recv", "peer": "any", "tag": _arg(a, k, 1, "tag", 0), "tensors": _ts(ts)}


SPECS: Dict[str, Spec] = {
    "allreduce": Spec("all_reduce", _fp_allreduce("all_reduce")),
    "allreduce_coalesced": Spec("all_reduce_coalesced", _fp_allreduce("all_reduce_coalesced")),
    "_allgather_base": Spec("all_gather_into_tensor", _fp_gather_base("all_gather_into_tensor")),
    "all_gather_single": Spec("all_gather_into_tensor", _fp_gather_base("all_gather_into_tensor")),
    "allgather": Spec("all_gather", _fp_allgather),
    "allgather_into_tensor_coalesced": Spec("all_gather_into_tensor_coalesced",
                                            _fp_gather_coalesced("all_gather_into_tensor_coalesced")),
    "all_gather_single_coalesced": Spec("all_gather_into_tensor_coalesced",
                                        _fp_gather_coalesced("all_gather_into_tensor_coalesced")),
    "allgather_coalesced": Spec("all_gather_coalesced", _fp_allgather_coalesced),
    "_reduce_scatter_base": Spec("reduce_scatter_tensor", _fp_rs_base("reduce_scatter_tensor")),
    "reduce_scatter_single": Spec("reduce_scatter_tensor", _fp_rs_base("reduce_scatter_tensor")),
    "reduce_scatter": Spec("reduce_scatter", _fp_reduce_scatter),
    "reduce_scatter_tensor_coalesced": Spec("reduce_scatter_tensor_coalesced",
                                            _fp_rs_coalesced("reduce_scatter_tensor_coalesced")),
    "reduce_scatter_single_coalesced": Spec("reduce_scatter_tensor_coalesced",
                                            _fp_rs_coalesced("reduce_scatter_tensor_coalesced")),
    "alltoall_base": Spec("all_to_all_single", _fp_a2a_base("all_to_all_single")),
    "all_to_all_single": Spec("all_to_all_single", _fp_a2a_base("all_to_all_single")),
    "alltoall": Spec("all_to_all", _fp_alltoall),
    "broadcast": Spec("broadcast", _fp_broadcast),
    "reduce": Spec("reduce", _fp_reduce),
    "gather": Spec("gather", _fp_gather),
    "scatter": Spec("scatter", _fp_scatter),
    "gather_single": Spec("gather_single", _fp_gather_single("gather_single")),
    "gather_into_tensor": Spec("gather_single", _fp_gather_single("gather_single")),
    "barrier": Spec("barrier", _fp_barrier),
    "send": Spec("send", _fp_p2p("send", "dstRank"), p2p=True),
    "recv": Spec("recv", _fp_p2p("recv", "srcRank"), p2p=True),
    "recv_anysource": Spec("recv", _fp_recv_any, p2p=True),
}

# where each method's inputs are (the tensors it sends), for the NaN check: the positional argument's index
_INPUTS = {"allreduce": 0, "allreduce_coalesced": 0, "broadcast": 0, "reduce": 0, "send": 0, "barrier": None,
           "recv": None, "recv_anysource": None}


def check_nan(method: str, args, kwargs) -> bool:
    """Whether a tensor the call sends holds a NaN (TORCH_DIST_NAN_CHECK=1), as torch's NanCheckHook checks."""
    i = _INPUTS.get(method, 1)
    if i is None:
        return False
    sent = args[i] if len(args) > i else None  # c10d passes every argument positionally
    return any(t.is_floating_point() and t.numel() and bool(torch.isnan(t).any()) for t in _flat(sent))


# keys that legitimately differ between ranks: checked against each other by compare(), not for equality
_PER_RANK = ("input_split_sizes", "output_split_sizes", "per_peer_in", "per_peer_out", "root_outputs",
             "root_inputs", "root_output_numel")


def fingerprint(pg, method: str, args, kwargs) -> dict:
    spec = SPECS[method]
    try:
        return spec.fn(pg, args, kwargs)
    except Exception:  # noqa: BLE001 - a malformed call: the method itself raises the precise error
        return {"op": spec.op, "malformed": True}


# ---------------------------------------------------------------------------------------------------
# the cross-rank comparison (pure: tested without processes)
# ---------------------------------------------------------------------------------------------------
_FIELD_NAMES = {"op": "the collective", "reduce_op": "the reduce op", "root": "the root", "device": "the device",
                "outputs": "the output shapes", "inputs": "the input shapes", "count": "the number of tensors",
                "malformed": "the arguments"}


def _tensor_fields(fps: List[dict]) -> List[str]:
    ts = [fp.get("tensors") or [] for fp in fps]
    if len({len(t) for t in ts}) > 1:
        return ["the number of tensors"]
    out = []
    if len({json.dumps([d for d, _ in t]) for t in ts}) > 1:
        out.append("the dtypes")
    if len({json.dumps([s for _, s in t]) for t in ts}) > 1:
        out.append("the shapes")
    return out


def _who(ranks: List[int], global_ranks) -> str:
    g = [global_ranks[r] for r in ranks] if global_ranks is not None else ranks
    base = ("rank " if len(ranks) == 1 else "ranks ") + ",".join(map(str, ranks))
    if g != ranks:
        base += f" (global {','.join(map(str, g))})"
    return base


def _cross(fps: List[dict], n: int) -> Optional[str]:
    """Per-peer consistency: all_to_all split sizes and per-peer shapes, rooted gather/scatter shapes."""
    fp0 = fps[0]
    op = fp0.get("op")
    if op == "all_to_all_single":
        trailing = fp0["tensors"][0][1] if fp0.get("tensors") else []
        for r in range(n):
            out_s = fps[r].get("output_split_sizes")
            for q in range(n):
                in_s = fps[q].get("input_split_sizes")
                if out_s is None or in_s is None:
                    continue
                if len(out_s) != n or len(in_s) != n:
                    return (f"rank {r} gives {len(out_s)} output_split_sizes and rank {q} {len(in_s)} "
                            f"input_split_sizes for a group of {n}")
                if out_s[q] != in_s[r]:
                    return (f"the split sizes do not match: rank {q} sends {in_s[r]} rows to rank {r} "
                            f"(input_split_sizes={in_s}) but rank {r} expects {out_s[q]} from rank {q} "
                            f"(output_split_sizes={out_s}); row shape {trailing}")
    elif op == "all_to_all":
        for r in range(n):
            outs = fps[r].get("per_peer_out") or []
            for q in range(n):
                ins = fps[q].get("per_peer_in") or []
                if len(outs) == n and len(ins) == n and outs[q] != ins[r]:
                    return (f"the per-peer shapes do not match: rank {q} sends a tensor of shape {ins[r]} to rank "
                            f"{r}, which expects {outs[q]}")
    elif op in ("gather", "scatter"):
        root = fp0.get("root")
        if root is not None and 0 <= root < n:
            key = "root_outputs" if op == "gather" else "root_inputs"
            shapes = fps[root].get(key)
            if shapes is not None:
                if len(shapes) != n:
                    return f"the root (rank {root}) passes {len(shapes)} tensors for a group of {n}"
                for q in range(n):
                    mine = (fps[q].get("tensors") or [[None, None]])[0][1]
                    if shapes[q] != mine:
                        what = "receive" if op == "gather" else "send"
                        return (f"the root (rank {root}) would {what} a tensor of shape {shapes[q]} "
                                f"{'from' if op == 'gather' else 'to'} rank {q}, whose tensor has shape {mine}")
    elif op == "gather_single":
        root = fp0.get("root")
        if root is not None and 0 <= root < n and fps[root].get("root_output_numel") is not None:
            numels = []
            for fp in fps:
                shape = (fp.get("tensors") or [[None, []]])[0][1] or []
                k = 1
                for s in shape:
                    k *= s
                numels.append(k)
            if fps[root]["root_output_numel"] != sum(numels):
                return (f"the root's output has {fps[root]['root_output_numel']} elements, the inputs "
                        f"{sum(numels)}")
    return None


def compare(fps: List[dict], seq: int, group: str, global_ranks=None) -> Optional[str]:
    """The mismatch message for the fingerprints of every rank (index = group rank), or None when they agree.
    The same on every rank: it depends on the fingerprints only."""
    n = len(fps)
    common = [{k: v for k, v in fp.items() if k not in _PER_RANK} for fp in fps]
    keys = [json.dumps(c, sort_keys=True) for c in common]
    fields: List[str] = []
    if len(set(keys)) > 1:
        order = ["op", "reduce_op", "root", "tensors", "device", "outputs", "inputs", "count"]
        for key in sorted(set().union(*common), key=lambda k: (order.index(k) if k in order else len(order), k)):
            if key == "tensors":
                fields += _tensor_fields(fps)
            elif len({json.dumps(c.get(key), sort_keys=True) for c in common}) > 1:
                fields.append(_FIELD_NAMES.get(key, key))
        fields = fields or ["the arguments"]
        if "the collective" in fields:
            fields = ["the collective"]
        why = "they differ in " + ", ".join(dict.fromkeys(fields))
    else:
        cross = _cross(fps, n)
        if cross is None:
            return None
        why = cross
    by_desc: Dict[str, List[int]] = {}
    for r, fp in enumerate(fps):
        by_desc.setdefault(flight_recorder.describe(fp), []).append(r)
    lines = [f"  {_who(ranks, global_ranks)}: {desc}" for desc, ranks in by_desc.items()]
    gr = "" if global_ranks is None else f" (global ranks {flight_recorder._ranks(global_ranks)})"
    return (f"funcoll: detected mismatch between collectives on group {group!r}{gr} at sequence number {seq}: "
            f"{why}.\n" + "\n".join(lines) + "\nEvery rank of a group must issue the same collectives in the same "
            "order, with the same op, reduce op, root, dtypes and shapes, and matching split sizes. Nothing of this "
            "collective was sent (cross-rank check of FUNCOLL_DEBUG / TORCH_DISTRIBUTED_DEBUG=DETAIL).")


# ---------------------------------------------------------------------------------------------------
# the check (through the group's store)
# ---------------------------------------------------------------------------------------------------
_KEY = "funcoll-check/{seq}/{rank}"


def check(pg, st: GroupState, call: flight_recorder.Call) -> None:
    """Publishes this rank's fingerprint of ``call`` in the group's store, waits (group timeout) for every other
    rank's, compares. Raises CollectiveMismatchError (same message on every rank) or CollectiveTimeoutError
    naming the ranks that did not arrive."""
    n, me, seq = pg.size(), pg.rank(), call.seq
    store = st.store
    keys = [_KEY.format(seq=seq, rank=r) for r in range(n)]
    others = [keys[r] for r in range(n) if r != me]
    timeout = st.timeout_s()
    try:
        store.set(keys[me], json.dumps(call.fingerprint))
        try:
            store.wait(others, timedelta(seconds=timeout))
        except Exception as e:  # noqa: BLE001 - DistStoreError("Wait timeout") or a dead store
            missing = []
            for r in range(n):
                if r == me:
                    continue
                try:
                    if not store.check([keys[r]]):
                        missing.append(r)
                except Exception:  # noqa: BLE001
                    missing = []  # cannot tell
                    break
            if missing:
                err = CollectiveTimeoutError(
                    f"funcoll: {call.label()}: {_who(missing, st.trace.global_ranks)} did not reach this collective "
                    f"within {timeout:g} s (debug check of every collective: the rank is behind, skipped the call, "
                    f"hangs in another call, or died). This rank called {flight_recorder.describe(call.fingerprint)}."
                    + _recent(st, call))
                raise err from e
            raise CollectiveError(f"funcoll: {call.label()}: the debug check could not reach the group's store: "
                                  f"{e}") from e
        values = store.multi_get(others)
    except CollectiveError:
        raise
    except Exception as e:  # noqa: BLE001 - the store itself failed (its server, rank 0, died)
        raise CollectiveError(f"funcoll: {call.label()}: the debug check could not reach the group's store: "
                              f"{e}") from e
    fps: List[dict] = []
    it = iter(values)
    for r in range(n):
        fps.append(call.fingerprint if r == me else json.loads(bytes(next(it)).decode()))
    if seq:
        try:  # every rank has read this rank's previous fingerprint: it published this one after that
            store.delete_key(_KEY.format(seq=seq - 1, rank=me))
        except Exception:  # noqa: BLE001 - best effort
            pass
    msg = compare(fps, int(seq or 0), st.trace.group, st.trace.global_ranks)
    if msg is not None:
        raise CollectiveMismatchError(msg)


def _recent(st: GroupState, call) -> str:
    from funcoll.entry.work import _recent as recent

    return recent(call, st.trace, dump=True)


# ---------------------------------------------------------------------------------------------------
# the hook: one wrapper per collective method
# ---------------------------------------------------------------------------------------------------
_now = time.time


class _Depth(threading.local):
    depth = 0  # > 0 inside a collective method: a method delegating to another is recorded once, as the outer one


_tls = _Depth()


def _is_async(args) -> bool:
    """The call was issued with ``async_op=True`` (c10d passes the options last, with ``asyncOp``)."""
    return bool(args) and getattr(args[-1], "asyncOp", False) is True


class _StrategyLog(list):
    """An ``algorithms.record()`` log that keeps only the calls of the thread that opened it."""

    __slots__ = ("tid",)

    def __init__(self):
        super().__init__()
        self.tid = threading.get_ident()

    def append(self, item) -> None:
        if threading.get_ident() == self.tid:
            list.append(self, item)


def _describe(nat, pg, method: str, args) -> dict:
    """The flight-recorder description of a native signature's calls, computed at its first call: the same for
    every call of it."""
    nat.note = fingerprint(pg, method, args, {})
    return nat.note


def _wrap(method: str, fn: Callable, spec: Spec, fast: Optional[Callable] = None) -> Callable:
    from funcoll import algorithms
    from funcoll.transport import before_send

    watched = algorithms.watched
    op = spec.op

    @functools.wraps(fn)
    def collective(self, *args, **kwargs):
        # The native fast path: not in debug mode, not while coalescing, not inside another collective method, not
        # while anyone observes collectives. ``fast`` (the entry's adapter) makes one cached lookup in
        # funcoll.algorithms: a Native when the backend serves the request as it is. The call is counted, numbered and
        # recorded ("native"), then the backend's own method is called with the caller's arguments. A blocking call
        # (opts.asyncOp False) is waited on here (a failure raises naming the collective) and the backend's own Work
        # returned; else a NativeWork wraps it. funcoll.entry.guard's size guard checks blocking CPU collectives of
        # groups of 2+ ranks before they send: those take the full path, which runs it. Every step here is one the full
        # path also makes; this is the hot path of every small eager collective, so it reads each thing once.
        st = self.__dict__.get("_funcoll_state")
        if (fast is not None and st is not None and not st.debug and not st.nan_check and self._coalesced is None
                and not kwargs and not _tls.depth and not watched()):
            try:
                nat = fast(self, args)
            except Exception:  # noqa: BLE001 - a request the adapter cannot read: the full path names the problem
                nat = None
            blocking = nat is not None and not args[-1].asyncOp
            if nat is not None and not (blocking and nat.cpu and guard.applies(self, st)):
                nat.tally.n += 1
                rec = st.trace.native_record(op, method, nat.note or _describe(nat, self, method, args))
                if not blocking:
                    try:
                        work = nat.issue(*args)
                    except Exception as e:  # noqa: BLE001 - the backend failed while issuing
                        call = st.trace.promote(rec)
                        call.failed(e)
                        raise CollectiveError(f"funcoll: {call.label()} failed: {str(e).strip()}") from e
                    return NativeWork(work, rec, st)
                try:
                    work = nat.issue(*args)
                    work.wait()
                except Exception as e:  # noqa: BLE001 - re-raised naming the collective
                    call = st.trace.promote(rec)
                    call.timeout = st.timeout_s()
                    raise failure(call, st.trace, e) from e
                rec[5] = _now()
                return work
        if _tls.depth:  # a method delegating to another: the outer call is the one recorded
            return fn(self, *args, **kwargs)
        st = state_of(self)
        call = st.trace.call(spec.op, method, fingerprint(self, method, args, kwargs))
        try:
            check_layout(spec.op, _flat(list(args) + list(kwargs.values())))
        except TypeError as e:  # a sparse tensor: rejected here, for every op (semantics.check_layout)
            call.failed(e, flight_recorder.INVALID)
            st.trace.keep(call)
            raise
        if st.nan_check and check_nan(method, args, kwargs):
            nan = RuntimeError(f"NaN found in input tensor. (funcoll: {spec.op} on group {st.trace.group!r}, "
                               f"rank {self.rank()} of {self.size()}; TORCH_DIST_NAN_CHECK=1; nothing was sent)")
            call.failed(nan, flight_recorder.INVALID)
            st.trace.keep(call)
            raise nan
        call.timeout = st.timeout_s()
        numbered = []

        def start():  # right before the first primitive sends: everything has been validated
            st.trace.number(call, spec.p2p)
            numbered.append(True)
            if not spec.p2p:
                if st.debug:
                    check(self, st, call)  # the full check, through the store
                elif not _is_async(args):
                    guard.guard(self, st, call)  # blocking CPU collectives, 2+ ranks: sizes agree, or a clear error

        log = _StrategyLog() if st.trace.enabled else None
        _tls.depth = 1
        before_send(start)
        try:
            if log is not None:
                algorithms._recorders.append(log)
            try:
                work = fn(self, *args, **kwargs)
            finally:
                if log is not None:
                    algorithms._forget(log)  # by identity: the user's record() log may hold equal contents
            before_send(None)
            if not numbered:  # nothing to send on this rank (empty tensors, a lazy transport): counted all the same
                start()
        except (ValueError, TypeError, NotImplementedError) as e:
            if numbered:
                call.failed(e)
            else:  # funcoll's validation: nothing was sent, no sequence number was used
                call.failed(e, flight_recorder.INVALID)
                st.trace.keep(call)
            raise
        except CollectiveError as e:
            call.failed(e)
            raise
        except Exception as e:  # noqa: BLE001 - the backend failed while issuing
            call.failed(e)
            if not numbered:
                st.trace.keep(call)
            raise CollectiveError(f"funcoll: {call.label()} failed: {str(e).strip()}") from e
        finally:
            before_send(None)
            _tls.depth = 0
        if log:
            call.strategies = list(dict.fromkeys(s for _, notes in log for s in notes))
        if isinstance(work, FuncollWork):
            work._attach(call, st.trace)
        else:
            call.completed()
        return work

    collective.__funcoll_spec__ = spec  # type: ignore[attr-defined]
    return collective


def instrument(cls, fast: Optional[Dict[str, Callable]] = None) -> None:
    """Wraps every collective method of ``cls`` (ProcessGroupFuncoll) that :data:`SPECS` describes. Idempotent.
    ``fast[method]``, where given, is the method's native fast path: ``fast(pg, args)`` -> a
    :class:`funcoll.algorithms.Native` when the request (positional arguments, options last) is one native backend
    call, else None."""
    for method, spec in SPECS.items():
        fn = cls.__dict__.get(method)
        if fn is None or hasattr(fn, "__funcoll_spec__"):
            continue
        setattr(cls, method, _wrap(method, fn, spec, (fast or {}).get(method)))


# ---------------------------------------------------------------------------------------------------
# monitored_barrier
# ---------------------------------------------------------------------------------------------------
def monitored_barrier(pg, timeout: Optional[timedelta] = None, wait_all_ranks: bool = False) -> None:
    """gloo's monitored barrier on the group's CPU transport: rank 0 waits up to ``timeout`` for every other rank
    and raises naming the first rank that did not arrive (all of them with ``wait_all_ranks``); the other ranks
    raise when rank 0 fails. Recorded in the flight recorder without a sequence number."""
    if timeout is None:
        timeout = pg._timeout
    elif not isinstance(timeout, timedelta):
        timeout = timedelta(seconds=float(timeout))
    st = state_of(pg)
    call = st.trace.start("monitored_barrier", "monitored_barrier",
                          {"op": "monitored_barrier", "timeout_s": timeout.total_seconds(),
                           "wait_all_ranks": bool(wait_all_ranks)}, counted=False)
    backend = getattr(pg.transport("cpu"), "backend", None)
    if backend is None or not hasattr(backend, "monitored_barrier"):
        e = NotImplementedError(f"funcoll: monitored_barrier needs a gloo CPU transport on group {pg.group_name!r}")
        call.failed(e)
        raise e
    try:
        backend.monitored_barrier(timeout, wait_all_ranks=wait_all_ranks)
    except RuntimeError as e:
        call.failed(e)
        raise CollectiveError(f"funcoll: monitored_barrier on group {st.trace.group!r} (global ranks "
                              f"{flight_recorder._ranks(st.trace.global_ranks)}): {str(e).strip()}") from e
    call.completed()


def patch_monitored_barrier() -> bool:
    """torch 2.9's ``dist.monitored_barrier`` refuses every group whose backend is not named "gloo" before reaching
    it. Where it does, this wraps it: funcoll groups get the same argument handling and then the group's own
    monitored barrier; every other group calls the original function. Returns whether it patched. Idempotent."""
    c10d = dist.distributed_c10d
    orig = c10d.monitored_barrier
    if getattr(orig, "__funcoll_patch__", False):
        return True
    consts = " ".join(c for c in orig.__code__.co_consts if isinstance(c, str))
    if "only implemented for GLOO backend" not in consts:
        return False

    @functools.wraps(orig)
    def monitored_barrier_(group=None, timeout=None, wait_all_ranks=False):
        from funcoll.entry.process_group import ProcessGroupFuncoll

        pg = group if group is not None else (c10d._get_default_group() if c10d.is_initialized() else None)
        if not isinstance(pg, ProcessGroupFuncoll) or c10d._rank_not_in_group(group):
            return orig(group, timeout, wait_all_ranks)
        if timeout is None:
            timeout = c10d._get_default_timeout(c10d.get_backend(group))
        elif isinstance(timeout, float):
            warnings.warn("Please specify timeout arg as a timedelta. "
                          f"Converting current value of {timeout} assuming it represents seconds", stacklevel=2)
            timeout = timedelta(seconds=timeout)
        c10d._check_valid_timeout(timeout)
        return pg.monitored_barrier(timeout, wait_all_ranks=wait_all_ranks)

    monitored_barrier_.__funcoll_patch__ = True  # type: ignore[attr-defined]
    monitored_barrier_.__funcoll_original__ = orig  # type: ignore[attr-defined]
    c10d.monitored_barrier = monitored_barrier_
    if dist.monitored_barrier is orig:
        dist.monitored_barrier = monitored_barrier_
    return True


# ---------------------------------------------------------------------------------------------------
# the cost of the hook, the flight recorder and the debug check
