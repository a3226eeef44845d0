"""The eager fast path (docs/design.md, "The eager pipeline"; its Works: docs/work.md): one function per kind of c10d
method (its row in :data:`funcoll.entry.methods.METHODS` names it) reads the request as c10d passes it (positional
arguments, options last; one dense tensor of a plain class per argument) and builds its signature key; :func:`_take`
asks ``funcoll.algorithms.native_*_call`` about a new key once per group and issues the native call, or answers a
:class:`Full`: the full path serves the request, with the key's description (its fingerprint, made once per key)
when the fast path read the request.
"""

from __future__ import annotations

import time
from typing import NamedTuple, Optional

import torch

from funcoll import algorithms
from funcoll.entry import peers
from funcoll.entry.errors import CollectiveError
from funcoll.entry.fingerprint import fingerprint
from funcoll.entry.work import ERROR, NativeWork, failure
from funcoll.transport import wait_quietly

__all__ = ["Full", "FULL", "issuing_error", "all_reduce", "base", "all_to_all_single", "broadcast", "list_form", "p2p",
           "rooted", "barrier"]


class Full(NamedTuple):
    """The answer "not one native call": the full path serves the request. ``description``: its fingerprint, when the
    fast path read the request (every tensor dense and strided, no keyword argument) and its key determines it."""

    description: Optional[dict]


FULL = Full(None)  # a request the fast path did not read
_CACHE_MAX = 4096  # signatures per group; the cache starts over past it
_now = time.time
_STRIDED = torch.strided
_PLAIN = (torch.Tensor, torch.nn.Parameter)
_C = torch._C._distributed_c10d


def issuing_error(call, e: Exception, state) -> CollectiveError:
    """The error for a backend that failed while issuing ``call`` (recorded as failed), naming the collective and the
    group's peers whose process has exited (funcoll.entry.peers; a receive that blocks while it is issued, as the xccl
    profile's, fails here)."""
    call.failed(e)
    gone, exited = peers.lost(state, e)
    if exited:
        state.error = ERROR.REMOTE_ERROR
    return CollectiveError(f"funcoll: {call.label()} failed: {str(e).strip()}{gone}")


def _described(pg, row, args) -> Optional[dict]:
    """The fingerprint a signature key keeps: None when it holds a value the key leaves out (a premul_sum factor: the
    key has the op's kind only), so that the full path describes each such call itself."""
    fp = fingerprint(pg, row, args, {})
    return None if str(fp.get("reduce_op")).startswith("premul_sum") else fp


def _plan(pg, st, row, args, tp, key: tuple, plan, request: tuple):
    """A new signature (or one answered under other capabilities or transport class: funcoll.probe's demotion):
    ``(Native or None, its fingerprint)``, cached; ``(None, None)`` uncached for an invalid request."""
    cache = st.native
    if key in cache or len(cache) >= _CACHE_MAX:
        cache.clear()  # every answer made under the old capabilities goes
    try:
        call = plan(tp, *request)
    except Exception:  # noqa: BLE001 - an invalid request: the full path names the problem
        return None, None
    nat = tp.native_method(*call, row.backend_method) if call is not None else None
    cache[key] = got = (nat, _described(pg, row, args))
    return got


def _take(pg, st, row, args: tuple, tp, key: tuple, plan, *request, changed=None):
    """Issues the request ``args`` (its options last) as one native call when its signature ``key`` is one on
    transport ``tp`` (``plan(tp, *request)``: the algorithms' answer, asked once per key), else a :class:`Full` with
    the key's description.
    ``changed``: the key leaves out values the answer does not depend on once they are valid (an uneven
    all_to_all's split sizes, new at every MoE step); ``changed(description)`` tells whether this call's differ from
    the ones the cached description holds: then the request is described again and kept as the key's (checked again
    first when the answer is native: the full path's body checks the others)."""
    if tp is None:
        return FULL
    got = st.native.get(key)
    if got is None or (got[0] is not None and (got[0].caps is not tp.caps or got[0].cls is not type(tp))):
        got = _plan(pg, st, row, args, tp, key, plan, request)
    elif changed is not None and got[1] is not None and changed(got[1]):
        if got[0] is not None:  # a native answer holds for valid values only (the full path's body checks its own)
            try:
                valid = plan(tp, *request) is not None
            except Exception:  # noqa: BLE001 - an invalid request: the full path names the problem
                valid = False
            if not valid:
                return FULL
        st.native[key] = got = (got[0], _described(pg, row, args))
    nat, description = got
    if nat is None:
        return Full(description)
    blocking = not row.p2p and not args[-1].asyncOp  # point-to-point calls are always asynchronous (c10d waits)
    if blocking and nat.cpu and st.guard:
        return Full(description)  # the full path runs the size guard
    rec = st.trace.native_record(row.op, row.method, description, row.p2p)
    try:
        work = nat.issue(*args)
        if not blocking:
            return NativeWork(work, rec, st, args, row.outputs, row.quiet)
        if row.quiet:
            wait_quietly(work)
        else:
            work.wait()
    except Exception as e:  # noqa: BLE001 - re-raised naming the collective
        call = st.trace.promote(rec)
        if not blocking:
            raise issuing_error(call, e, st) from e
        call.timeout = st.timeout_s
        raise failure(call, st.trace, e, st) from e
    rec.t_done = _now()
    return None  # c10d's blocking dist.* functions take None as "the backend has synced" (docs/work.md)


def _dense(t) -> bool:
    return t.__class__ in _PLAIN and t.layout is _STRIDED and t.is_contiguous()


def _dense_on(ts, like) -> bool:
    """Every tensor of ``ts`` dense, of a plain class, on ``like``'s device."""
    if like.is_cpu:
        return all(_dense(t) and t.is_cpu for t in ts)
    dev = like.device
    return all(_dense(t) and t.device == dev for t in ts)


def _one(tensors):
    """The one dense tensor of a plain class in the list ``tensors``, else None."""
    return tensors[0] if type(tensors) is list and len(tensors) == 1 and _dense(tensors[0]) else None


def _transport(pg, t):
    return pg._transports.get("cpu" if t.is_cpu else t.device.type)


def _sig(ts) -> tuple:
    return tuple([(t.dtype, t.shape) for t in ts])


# -- one function per c10d method: (pg, state, row, args, kwargs) -> the call's result, or FULL ------------------
# the three FSDP2 and ZeRO engines call most are written out: inside a training step, between two collectives, each
# Python call runs from cold caches and costs several us
def all_reduce(pg, st, row, args, kwargs, _opts=_C.AllreduceOptions, _plan=algorithms.native_all_reduce_call):
    if len(args) == 2 and not kwargs:
        tensors, opts = args
        if type(opts) is _opts and type(tensors) is list and len(tensors) == 1:
            t = tensors[0]
            if t.__class__ in _PLAIN and t.layout is _STRIDED and t.is_contiguous():
                # the options' c10d ReduceOp (a new object per read, with a slow __eq__) is keyed by its hash, its
                # RedOpType (PREMUL_SUM's factor is not in it: no PREMUL_SUM is native here)
                op = opts.reduceOp
                key = (row.op, hash(op), t.dtype, t.shape, t.get_device())
                return _take(pg, st, row, args, pg._transports.get("cpu" if t.is_cpu else t.device.type), key,
                             _plan, op, t)
    return FULL


def base(opts_type, plan, reduces: bool):
    """all_gather_into_tensor (``reduces`` False) or reduce_scatter_tensor (``reduces``: the options' reduce op is
    planned with): ``(out, inp, opts)``, one dense tensor each."""

    def fast(pg, st, row, args, kwargs):
        if len(args) == 3 and type(args[2]) is opts_type and not kwargs:
            out, inp = args[0], args[1]
            if (out.__class__ in _PLAIN and inp.__class__ in _PLAIN and out.layout is _STRIDED
                    and inp.layout is _STRIDED and out.is_contiguous() and inp.is_contiguous()):
                tp = pg._transports.get("cpu" if inp.is_cpu else inp.device.type)
                if reduces:
                    op = args[2].reduceOp
                    return _take(pg, st, row, args, tp, (row.op, hash(op), out.dtype, out.shape, out.get_device(),
                                                         inp.dtype, inp.shape, inp.get_device()), plan, op, out, inp)
                return _take(pg, st, row, args, tp, (row.op, out.dtype, out.shape, out.get_device(), inp.dtype,
                                                     inp.shape, inp.get_device()), plan, out, inp)
        return FULL

    return fast


def all_to_all_single(pg, st, row, args, kwargs):
    if len(args) != 5 or type(args[4]) is not _C.AllToAllOptions or kwargs:
        return FULL
    out, inp, osz, isz = args[0], args[1], args[2], args[3]
    if not (_dense(out) and _dense(inp)) or type(osz) is not list or type(isz) is not list:
        return FULL
    osz, isz = tuple(osz), tuple(isz)
    # split sizes: whether each list is given is the signature, not the sizes (checked and described anew when they
    # differ from the last call's)
    key = (row.op, out.dtype, out.shape, out.get_device(), inp.dtype, inp.shape, inp.get_device(), bool(osz),
           bool(isz))

    def changed(description) -> bool:
        return description["output_split_sizes"] != list(osz) or description["input_split_sizes"] != list(isz)

    return _take(pg, st, row, args, _transport(pg, inp), key, algorithms.native_all_to_all_call, out, inp, osz, isz,
                 changed=changed if osz or isz else None)


def broadcast(pg, st, row, args, kwargs):
    if len(args) != 2 or type(args[1]) is not _C.BroadcastOptions or kwargs:
        return FULL
    t, opts = _one(args[0]), args[1]
    if t is None:
        return FULL
    src, which = opts.rootRank, opts.rootTensor
    key = (row.op, src, which, t.dtype, t.shape, t.get_device())
    return _take(pg, st, row, args, _transport(pg, t), key, algorithms.native_broadcast_call, t, src, which)


def list_form(opts_type, plan, list_first: bool):
    """The list all_gather ``([[outs]], [inp], opts)`` (``list_first``) or reduce_scatter ``([out], [[ins]], opts)``:
    one dense tensor and a list of dense ones on its device."""

    def fast(pg, st, row, args, kwargs):
        if len(args) != 3 or type(args[2]) is not opts_type or kwargs:
            return FULL
        a, b = args[0], args[1]
        if type(a) is not list or type(b) is not list or len(a) != 1 or len(b) != 1:
            return FULL
        many, one = (a[0], b[0]) if list_first else (b[0], a[0])
        if type(many) is not list or not many or not _dense(one) or not _dense_on(many, one):
            return FULL
        sig, tp = _sig(many), _transport(pg, one)
        if list_first:
            return _take(pg, st, row, args, tp, (row.op, sig, one.dtype, one.shape, one.get_device()), plan,
                         sig, one)
        op = args[2].reduceOp
        key = (row.op, hash(op), one.dtype, one.shape, one.get_device(), sig)
        return _take(pg, st, row, args, tp, key, plan, op, one, sig)

    return fast


def p2p(pg, st, row, args, kwargs):
    if len(args) != 3 or kwargs:
        return FULL
    t, peer, tag = _one(args[0]), args[1], args[2]
    if t is None or type(peer) is not int or type(tag) is not int:
        return FULL
    key = (row.op, peer, tag, t.dtype, t.shape, t.get_device())
    return _take(pg, st, row, args, _transport(pg, t), key, algorithms.native_p2p_call, row.op, t, peer)


def rooted(opts_type, one_first: bool):
    """gather (``([outs] on the root, else [], [inp], GatherOptions)``; ``one_first`` False) or scatter
    (``([out], [inps] on the root, else [], ScatterOptions)``); a list passed on another rank goes to the full path."""

    def fast(pg, st, row, args, kwargs):
        if len(args) != 3 or type(args[2]) is not opts_type or kwargs:
            return FULL
        ones, roots = (args[0], args[1]) if one_first else (args[1], args[0])
        one, root, sig = _one(ones), args[2].rootRank, None
        if one is None or type(roots) is not list or len(roots) > 1:
            return FULL
        tp = _transport(pg, one)
        if roots:
            if tp is None or tp.rank != root or type(roots[0]) is not list or not _dense_on(roots[0], one):
                return FULL
            sig = _sig(roots[0])
        key = (row.op, root, sig, one.dtype, one.shape, one.get_device())
        return _take(pg, st, row, args, tp, key, algorithms.native_rooted_call, row.op, root, sig, one)

    return fast


def barrier(pg, st, row, args, kwargs):
    if kwargs:  # c10d calls group.barrier(opts=opts)
        if args or kwargs.keys() != {"opts"}:
            return FULL
        args = (kwargs["opts"],)
    if len(args) != 1 or type(args[0]) is not _C.BarrierOptions:
        return FULL
    # the full path's barrier runs on the CPU transport
    return _take(pg, st, row, args, pg._transports.get("cpu"), (row.op,), algorithms.native_barrier_call)
