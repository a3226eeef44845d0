"""Each collective's cross-rank rules, written once and side by side (as JAX's ``lax/parallel.py`` keeps each
primitive's rules together): pure functions, tested without processes.

A *fingerprint* describes one call as a dict of JSON values: op, reduce op, root, dtypes, shapes, split sizes or
per-peer shapes. Most fields must be equal on every rank of the group; the *per-rank* fields of an op (all_to_all
split sizes and per-peer shapes, a rooted gather/scatter's list) legitimately differ and are checked against each
other instead. One row of :data:`RULES` per op (:class:`Rule`); each c10d method's row
(:data:`funcoll.entry.methods.METHODS`) names the function here that describes its call.
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import json
import math
from typing import Callable, Dict, List, NamedTuple, Optional, Tuple

import torch
import torch.distributed as dist

from funcoll.semantics import dtype_name, parse_reduction, ranks_text

__all__ = ["Rule", "RULES", "row_of", "describe", "PER_RANK", "fingerprint", "compare", "mismatch", "digest", "agree",
           "check_nan", "flat", "SLOTS", "DEBUG_CHECK", "plain", "sized_list", "a2a_single", "a2a", "rooted",
           "gather_single", "p2p", "recv_any", "barrier"]


# -- reading a call's arguments (c10d passes them positionally, options last)
def _at(args, i: int, default=None):
    return args[i] if len(args) > i else default


def _listed(x) -> list:
    return [x] if isinstance(x, torch.Tensor) else list(x)


def _ts(ts) -> list:
    return [[dtype_name(t.dtype), list(t.shape)] for t in ts if isinstance(t, torch.Tensor)]


def _shapes(x) -> list:
    """The shapes of the tensors in ``x``, nested as its lists are."""
    return list(x.shape) if isinstance(x, torch.Tensor) else [_shapes(v) for v in x]


_PREMUL = dist.ReduceOp.RedOpType.PREMUL_SUM  # type: ignore[attr-defined]


def _reduce_op(opts, opname: str) -> Optional[str]:
    op = getattr(opts, "reduceOp", opts)  # an options object, or the op itself
    if op is None:
        return "sum"
    if isinstance(op, dist.ReduceOp):  # the common case, without parsing: ReduceOp.SUM -> "sum"
        kind = op.op  # type: ignore[attr-defined]
        if kind != _PREMUL:
            return kind.name.lower()
    try:
        red = parse_reduction(op, opname)
    except Exception:  # noqa: BLE001 - validation is the algorithm's job; describe what was given
        return repr(op)
    f = red.factor
    if f is not None:
        f = float(f.reshape(-1)[0]) if isinstance(f, torch.Tensor) else float(f)
        return f"{red.op}({f:g})"
    return str(red.op)


def _root(opts) -> int:
    return int(getattr(opts, "rootRank", None) or 0)


def _device(ts) -> Optional[str]:
    return next((t.device.type for t in ts if isinstance(t, torch.Tensor)), None)


def flat(x) -> list:
    """Every tensor in ``x`` (nested lists and tuples)."""
    if isinstance(x, (list, tuple)):
        return [t for v in x for t in flat(v)]
    return [x] if isinstance(x, torch.Tensor) else []


def _splits(splits, t, n: int):
    if splits is not None and len(splits):
        return [int(s) for s in splits]
    if t.dim() and t.shape[0] % n == 0:
        return [t.shape[0] // n] * n
    return None


def _numel(shape) -> int:
    return math.prod(int(d) for d in shape or [])


# -- the size guard's per-peer sum: + every edge a rank sends, - every edge it expects to receive; over the group
# the shares add up to 0 (mod 2**64) exactly when every send meets an equal receive
_M = (1 << 64) - 1
SLOTS = 3  # a digest: seq, hash of the common fields, sum of the per-peer hashes


def _hash(text: str) -> int:
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
    v = value if isinstance(value, int) else _hash(repr(value))
    return _mix(_mix(_mix((kind << 48) ^ src) ^ dst) ^ (v & _M))


def _exchange(kind: int, rank: int, sends: list, receives: list) -> int:
    """+ every edge ``rank`` sends (``sends[q]`` to rank q), - every edge it expects (``receives[q]`` from rank q)."""
    return (sum(_edge(kind, rank, q, v) for q, v in enumerate(sends))
            - sum(_edge(kind, q, rank, v) for q, v in enumerate(receives)))


_A2A, _A2A_LIST, _GATHER, _SCATTER, _AG_LIST, _RS_LIST = 1, 2, 3, 4, 5, 6
_NUMEL = 0x9E3779B97F4A7C15 | 1  # odd: multiplying by it is a bijection mod 2**64


# -- each op's row: its per-rank rules where it has per-rank fields (the check, every rank's fingerprint at hand:
# the message; the share, this rank's fingerprint alone: the size guard's sum) and the sizes torch's recorder lists
def _shapes_of(fp: dict) -> list:
    """The shapes of a fingerprint's tensors, where it names them."""
    return [list(shape) for _, shape in fp.get("tensors") or [] if shape is not None]


def _sizes(fp: dict) -> tuple:
    """(input, output) sizes as torch's flight recorder lists them: the tensors' shapes, ``outputs`` (else those)."""
    ins = _shapes_of(fp)
    return ins, ins if fp.get("outputs") is None else fp["outputs"]


def _pairs(fps: List[dict], n: int, r_key: str, q_key: str):
    """``(r, q, rank r's r_key, rank q's q_key)`` for every two ranks r, q of the group that give both fields."""
    for r in range(n):
        for q in range(n):
            mine, theirs = fps[r].get(r_key), fps[q].get(q_key)
            if mine is not None and theirs is not None:
                yield r, q, mine, theirs


def _pairwise(kind: int, ins_key: str, outs_key: str, check: Callable, shown: Tuple[str, ...],
              sizes: Optional[Callable] = None) -> "Rule":
    """all_to_all's rule: its per-peer fields ``ins_key`` (what this rank sends each peer: rows, or a shape) and
    ``outs_key`` (what it expects from each), shown after ``shown``; the share: + every send, - every receive; sizes:
    those, or ``sizes``."""
    def share(fp: dict, rank: int) -> int:
        ins, outs = fp.get(ins_key), fp.get(outs_key)
        return 0 if ins is None or outs is None else _exchange(kind, rank, ins, outs)

    def per_peer(fp: dict) -> tuple:
        return fp.get(ins_key) or [], fp.get(outs_key) or []
    return Rule((*shown, ins_key, outs_key), (ins_key, outs_key), check, share, sizes or per_peer)


def _split_sums(fp: dict) -> tuple:
    """all_to_all_single's sizes: every row it sends, and every row it receives, by the row shape."""
    rest = (_shapes_of(fp) or [[]])[0]
    return ([[sum(fp.get("input_split_sizes") or [0]), *rest]],
            [[sum(fp.get("output_split_sizes") or [0]), *rest]])


def _check_a2a_single(fps: List[dict], n: int) -> Optional[str]:
    trailing = fps[0]["tensors"][0][1] if fps[0].get("tensors") else []
    for r, q, out_s, in_s in _pairs(fps, n, "output_split_sizes", "input_split_sizes"):
        if len(out_s) != n or len(in_s) != n:
            return (f"rank {r} gives {len(out_s)} output_split_sizes and rank {q} {len(in_s)} "
                    f"input_split_sizes for a group of {n}")
        if out_s[q] != in_s[r]:
            return (f"the split sizes do not match: rank {q} sends {in_s[r]} rows to rank {r} "
                    f"(input_split_sizes={in_s}) but rank {r} expects {out_s[q]} from rank {q} "
                    f"(output_split_sizes={out_s}); row shape {trailing}")
    return None


def _check_a2a(fps: List[dict], n: int) -> Optional[str]:
    for r, q, outs, ins in _pairs(fps, n, "per_peer_out", "per_peer_in"):
        if len(outs) == n and len(ins) == n and outs[q] != ins[r]:
            return (f"the per-peer shapes do not match: rank {q} sends a tensor of shape {ins[r]} to rank {r}, "
                    f"which expects {outs[q]}")
    return None


def _rooted(key: str, kind: int) -> "Rule":
    """gather (the root's list of output shapes) and scatter (of input shapes): the root's list against every
    rank's own tensor; its sizes are this rank's tensor and the root's list."""
    what, way = ("receive", "from") if kind == _GATHER else ("send", "to")

    def check(fps: List[dict], n: int) -> Optional[str]:
        root = fps[0].get("root")
        if root is None or not 0 <= root < n or fps[root].get(key) is None:
            return None
        shapes = fps[root][key]
        if len(shapes) != n:
            return f"the root (rank {root}) passes {len(shapes)} tensors for a group of {n}"
        for q in range(n):
            mine = (fps[q].get("tensors") or [[None, None]])[0][1]
            if shapes[q] != mine:
                return (f"the root (rank {root}) would {what} a tensor of shape {shapes[q]} {way} rank {q}, whose "
                        f"tensor has shape {mine}")
        return None

    def share(fp: dict, rank: int) -> int:
        s = _edge(kind, rank, -1, (fp.get("tensors") or [[None, None]])[0][1])
        if rank == fp.get("root"):
            s -= sum(_edge(kind, q, -1, shape) for q, shape in enumerate(fp.get(key) or ()))
        return s

    def sizes(fp: dict) -> tuple:
        mine, listed = _shapes_of(fp), fp.get(key) or []
        return (mine, listed) if kind == _GATHER else (listed, mine)

    return Rule(("root", "tensors", key), (key,), check, share, sizes)


def _check_gather_single(fps: List[dict], n: int) -> Optional[str]:
    root = fps[0].get("root")
    if root is None or not 0 <= root < n or fps[root].get("root_output_numel") is None:
        return None
    numels = sum(_numel((fp.get("tensors") or [[None, []]])[0][1]) for fp in fps)
    if fps[root]["root_output_numel"] != numels:
        return f"the root's output has {fps[root]['root_output_numel']} elements, the inputs {numels}"
    return None


def _share_gather_single(fp: dict, rank: int) -> int:
    s = _numel((fp.get("tensors") or [[None, []]])[0][1]) * _NUMEL
    if fp.get("root_output_numel") is not None and rank == fp.get("root"):
        s -= int(fp["root_output_numel"]) * _NUMEL
    return s


def _sizes_gather_single(fp: dict) -> tuple:
    numel = fp.get("root_output_numel")
    return _shapes_of(fp), [] if numel is None else [[numel]]


def _gathered(fp: dict) -> tuple:
    """all_gather_coalesced's sizes: its inputs, and every output of every rank's list."""
    return _shapes_of(fp), [shape for shapes in fp.get("outputs") or [] for shape in shapes]


def _flattened(shapes: list) -> list:
    """A list of tensors' sizes as NCCL's flight recorder lists them: equal shapes as the one ``[n, *shape]`` tensor
    they are flattened into (``ProcessGroupNCCL::allgather``/``reduce_scatter`` in pytorch's
    torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp: ``newLikeFlat``, then ``collective(input, outputFlattened)``),
    else each tensor's shape (as c10d's FlightRecorderHook lists a caller's list; torch 2.15's
    torch/distributed/flight_recorder/components/types.py, ``Op._gathered_numel_matches``, reads both)."""
    if shapes and all(s == shapes[0] for s in shapes):
        return [[len(shapes), *shapes[0]]]
    return [list(s) for s in shapes]


def _sized_list(kind: int, own_key: str, list_key: str) -> "Rule":
    """The list all_gather (``own_key`` "input_shape", this rank's input; ``list_key`` "output_shapes", what it
    expects from each rank) and the list reduce_scatter ("output_shape", "input_shapes": what it reduces into each
    rank): sizes may differ per rank, but each rank's list must carry every rank's own size (numbers of elements, as
    NCCL reads them)."""
    gathers = kind == _AG_LIST
    arg, verb, own_name = ("output", "expects", "input") if gathers else ("input", "reduces", "output")
    shown = ("tensors", own_key, list_key) if gathers else ("reduce_op", "tensors", own_key, list_key)

    def check(fps: List[dict], n: int) -> Optional[str]:
        for r, q, own, shapes in _pairs(fps, n, own_key, list_key):
            if len(shapes) != n:
                return f"rank {q} passes {len(shapes)} {arg} tensors for a group of {n}"
            if _numel(shapes[r]) != _numel(own):
                return (f"the sizes do not match: rank {q} {verb} {_numel(shapes[r])} elements "
                        f"{'from' if gathers else 'into'} rank {r} ({arg}[{r}] of shape {shapes[r]}) but rank "
                        f"{r}'s {own_name} has {_numel(own)} (shape {own})")
        return None

    def share(fp: dict, rank: int) -> int:
        own, shapes = fp.get(own_key), fp.get(list_key)
        if own is None or shapes is None:
            return 0
        mine, each = [_numel(own)] * len(shapes), [_numel(s) for s in shapes]
        # all_gather sends its input to every rank and receives each rank's from it; reduce_scatter the other way
        return _exchange(kind, rank, mine, each) if gathers else _exchange(kind, rank, each, mine)

    def sizes(fp: dict) -> tuple:
        own = [fp[own_key]] if fp.get(own_key) is not None else []
        listed = _flattened(fp.get(list_key) or [])
        return (own, listed) if gathers else (listed, own)

    return Rule(shown, (own_key, list_key), check, share, sizes)


class Rule(NamedTuple):
    """One op's row: ``shown``, the fingerprint fields its text shows, in order ("tensors": the dtypes and shapes);
    ``per_rank``, the fields that differ between ranks; ``check(fps, n)``, the message when those fields do not pair
    up (None when they do); ``share(fp, rank)``, this rank's share of the size guard's per-peer sum; ``sizes(fp)``, the
    (input, output) sizes torch's flight recorder lists; ``p2p``: a point-to-point op (its own counter, not checked);
    ``torch_name``: the collective's name in torch's flight recorder where it is not the op's (c10d's names, which its
    analyser knows). An op without per-rank fields needs every field equal."""

    shown: Tuple[str, ...]
    per_rank: Tuple[str, ...] = ()
    check: Optional[Callable] = None
    share: Optional[Callable] = None
    sizes: Callable = _sizes
    p2p: bool = False
    torch_name: Optional[str] = None


_REDUCED, _INTO = Rule(("reduce_op", "tensors")), Rule(("tensors", "outputs"))
_P2P = Rule(("peer", "tag", "tensors"), p2p=True)

RULES: Dict[str, Rule] = {  # op -> its row
    "all_reduce": _REDUCED, "all_reduce_coalesced": _REDUCED._replace(torch_name="allreduce_coalesced"),
    "all_gather_into_tensor": _INTO._replace(torch_name="_all_gather_base"),
    "all_gather": _sized_list(_AG_LIST, "input_shape", "output_shapes"),
    "all_gather_into_tensor_coalesced": _INTO,
    "all_gather_coalesced": _INTO._replace(sizes=_gathered, torch_name="allgather_coalesced"),
    "reduce_scatter_tensor": Rule(("reduce_op", "tensors", "outputs"), torch_name="_reduce_scatter_base"),
    "reduce_scatter": _sized_list(_RS_LIST, "output_shape", "input_shapes"),
    "reduce_scatter_tensor_coalesced": Rule(("reduce_op", "tensors", "outputs")),
    "broadcast": Rule(("root", "tensors")), "reduce": Rule(("reduce_op", "root", "tensors")), "barrier": Rule(()),
    "all_to_all_single": _pairwise(_A2A, "input_split_sizes", "output_split_sizes", _check_a2a_single,
                                   ("tensors", "outputs", "split_sizes"), _split_sums),
    "all_to_all": _pairwise(_A2A_LIST, "per_peer_in", "per_peer_out", _check_a2a, ("tensors",)),
    "gather": _rooted("root_outputs", _GATHER),
    "scatter": _rooted("root_inputs", _SCATTER),
    "gather_single": Rule(("root", "tensors", "root_output_numel"), ("root_output_numel",), _check_gather_single,
                          _share_gather_single, _sizes_gather_single, torch_name="gather"),
    "send": _P2P, "recv": _P2P,
}
PER_RANK = frozenset(k for rule in RULES.values() for k in rule.per_rank)
_UNLISTED = Rule(())


def row_of(op: str) -> Rule:
    """``op``'s row; an op without one (monitored_barrier) shows no field and needs every field equal."""
    return RULES.get(op, _UNLISTED)


def describe(fp: dict) -> str:
    """``all_reduce(reduce_op=sum, float32[4])``: a fingerprint's text, its row's fields in order. A list
    all_to_all's tensors differ in shape per peer: its entry is the dtype alone (the shapes follow)."""
    parts = []
    for key in row_of(fp.get("op", "")).shown:
        if key == "tensors":
            parts += [d if s is None else f"{d}{list(s)}" for d, s in fp.get("tensors") or []]
        elif fp.get(key) is not None:
            parts.append(f"{key}={fp[key]}")
    return f"{fp.get('op', '?')}({', '.join(parts)})"


# -- per c10d method: the function that describes its call (its row, funcoll.entry.methods.METHODS, names it)
def plain(op: str, mine: int = 0, other: Optional[int] = None, red: bool = False, root: bool = False) -> Callable:
    """A method ``(mine[, other], opts)`` whose fields every rank shares: the dtypes and shapes of its own tensors
    (argument ``mine``, a tensor or a list), the shapes of the other side (argument ``other``, as "outputs"), the
    reduce op (``red``) and the root (``root``) its options name."""
    def fn(pg, a):
        ts, opts = _listed(a[mine]), _at(a, 1 if other is None else 2)
        fp: dict = {"op": op}
        if root:
            fp["root"] = _root(opts)
        if red:
            fp["reduce_op"] = _reduce_op(opts, op)
        fp["tensors"] = _ts(ts)
        if other is not None:
            fp["outputs"] = _shapes(_listed(a[other]))
        fp["device"] = _device(ts)
        return fp
    return fn


def a2a_single(pg, a):
    out, inp, n = a[0], a[1], pg.size()
    osz, isz = _at(a, 2), _at(a, 3)
    fp = {"op": "all_to_all_single", "tensors": [[dtype_name(inp.dtype), list(inp.shape[1:])]],
          "outputs": [list(out.shape[1:])], "device": inp.device.type}
    if not (osz is not None and len(osz)) and not (isz is not None and len(isz)):
        # no split sizes passed (the even exchange): shared by every rank, as the exchange depends on it (given
        # split sizes take the uneven exchange, whatever their values); the even splits are still checked per peer
        fp["split_sizes"] = "none"
    fp["input_split_sizes"], fp["output_split_sizes"] = _splits(isz, inp, n), _splits(osz, out, n)
    return fp


def sized_list(op: str, own_key: str, list_key: str, list_first: bool):
    """The list all_gather ``([outs], [inp], opts)`` (``list_first``) and reduce_scatter ``([out], [ins], opts)``: the
    dtype and device (shared), this rank's own tensor's shape and its list's shapes (per rank: sizes may differ)."""
    def fn(pg, a):
        many, one = (a[0], a[1]) if list_first else (a[1], a[0])
        many, own = list(many[0]), _listed(one)[0]
        fp: dict = {"op": op}
        if not list_first:
            fp["reduce_op"] = _reduce_op(_at(a, 2), op)
        fp.update({"tensors": [[dtype_name(own.dtype), None]], "device": own.device.type,
                   own_key: list(own.shape), list_key: _shapes(many)})
        return fp
    return fn


def a2a(pg, a):
    outs, ins = list(a[0]), list(a[1])
    return {"op": "all_to_all", "tensors": [[dtype_name(t.dtype), None] for t in ins[:1]], "device": _device(ins),
            "count": [len(ins), len(outs)], "per_peer_in": _shapes(ins), "per_peer_out": _shapes(outs)}


def rooted(op, key):
    def fn(pg, a):
        outs, ins = a[0], a[1]
        mine, lists = (list(ins), outs) if op == "gather" else (list(outs), ins)
        root = _root(_at(a, 2))
        fp = {"op": op, "root": root, "tensors": _ts(mine), "device": _device(mine)}
        if pg.rank() == root:
            fp[key] = _shapes(lists[0]) if lists else []
        return fp
    return fn


def gather_single(pg, a):
    out, inp, root = a[0], a[1], _root(_at(a, 2))
    fp = {"op": "gather_single", "root": root, "tensors": _ts([inp]), "device": inp.device.type}
    if pg.rank() == root:
        fp["root_output_numel"] = int(out.numel())
    return fp


def p2p(op):
    def fn(pg, a):
        return {"op": op, "peer": _at(a, 1), "tag": _at(a, 2, 0), "tensors": _ts(list(a[0]))}
    return fn


def recv_any(pg, a):
    return {"op": "recv", "peer": "any", "tag": _at(a, 1, 0), "tensors": _ts(list(a[0]))}


def barrier(pg, a):
    return {"op": "barrier"}


_signature = functools.lru_cache(maxsize=None)(inspect.signature)


def fingerprint(pg, row, args, kwargs) -> dict:
    """The fingerprint of a call of ``pg.<row.method>(*args, **kwargs)`` (``row``: its
    :class:`funcoll.entry.methods.MethodRow`)."""
    try:
        if kwargs:  # arguments passed by name: positional, as the method's signature orders them
            bound = _signature(getattr(type(pg), row.method)).bind(pg, *args, **kwargs)
            bound.apply_defaults()
            args = bound.args[1:]
        return row.fingerprint(pg, args)
    except Exception:  # noqa: BLE001 - a malformed call: the method itself raises the precise error
        return {"op": row.op, "malformed": True}


def check_nan(row, args) -> bool:
    """Whether a tensor the call sends holds a NaN (TORCH_DIST_NAN_CHECK=1), as torch's NanCheckHook checks."""
    i = row.sends  # c10d passes every argument positionally
    return i is not None and any(t.is_floating_point() and t.numel() and bool(torch.isnan(t).any())
                                 for t in flat(_at(args, i)))


# -- the cross-rank comparison: every rank's fingerprint at hand (the debug mode; the size guard's slow path)
DEBUG_CHECK = "cross-rank check of FUNCOLL_DEBUG / TORCH_DISTRIBUTED_DEBUG=DETAIL"  # which check found a mismatch
_FIELD_NAMES = {"op": "the collective", "reduce_op": "the reduce op", "root": "the root", "device": "the device",
                "outputs": "the output shapes", "count": "the number of tensors",
                "split_sizes": "whether split sizes are passed", "malformed": "the arguments"}
_ORDER = ["op", "reduce_op", "root", "tensors", "device", "outputs", "count"]


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


def who(ranks: List[int], global_ranks) -> str:
    """``rank 1 (global 5)``, ``ranks 0,2``."""
    g = [global_ranks[r] for r in ranks] if global_ranks is not None else ranks
    base = ("rank " if len(ranks) == 1 else "ranks ") + ",".join(map(str, ranks))
    if g != ranks:
        base += f" (global {','.join(map(str, g))})"
    return base


def compare(fps: List[dict], seq: int, group: str, global_ranks=None, by: str = DEBUG_CHECK) -> Optional[str]:
    """The mismatch message for the fingerprints of every rank (index = group rank), or None when they agree.
    The same on every rank: it depends on the fingerprints only. ``by`` names the check (the closing parenthesis)."""
    common = [{k: v for k, v in fp.items() if k not in PER_RANK} for fp in fps]
    fields: List[str] = []
    if len({json.dumps(c, sort_keys=True) for c in common}) > 1:
        for key in sorted(set().union(*common), key=lambda k: (_ORDER.index(k) if k in _ORDER else len(_ORDER), k)):
            if key == "tensors":
                fields += _tensor_fields(fps)
            elif len({json.dumps(c.get(key), sort_keys=True) for c in common}) > 1:
                fields.append(_FIELD_NAMES.get(key, key))
        fields = fields or ["the arguments"]
        if "the collective" in fields:
            fields = ["the collective"]
        why: Optional[str] = "they differ in " + ", ".join(dict.fromkeys(fields))
    else:
        check = row_of(fps[0].get("op", "")).check
        why = check(fps, len(fps)) if check is not None else None
    if why is None:
        return None
    by_desc: Dict[str, List[int]] = {}
    for r, fp in enumerate(fps):
        by_desc.setdefault(describe(fp), []).append(r)
    return mismatch(group, global_ranks, seq, why, [f"{who(ranks, global_ranks)}: {d}" for d, ranks in by_desc.items()],
                    by)


def mismatch(group: str, global_ranks, seq: int, why: str, lines: List[str], by: str = DEBUG_CHECK) -> str:
    """The text of a CollectiveMismatchError: what differs (``why``), one line per rank or set of ranks, the rule."""
    gr = "" if global_ranks is None else f" (global ranks {ranks_text(global_ranks)})"
    return (f"funcoll: detected mismatch between collectives on group {group!r}{gr} at sequence number {seq}: "
            f"{why}.\n" + "".join(f"  {line}\n" for line in lines) + "Every rank of a group must issue the same "
            "collectives in the same order, with the same op, reduce op, root, dtypes and shapes, and matching split "
            f"sizes. Nothing of this collective was sent ({by}).")


# -- the size guard's digest: this rank's fingerprint alone
def _signed(x: int) -> int:
    x &= _M
    return x - (1 << 64) if x >> 63 else x


def digest(fp: dict, seq: int, rank: int, n: int) -> List[int]:
    """The call's digest, ``[seq, hash of the common fields, per-peer share]`` as signed int64."""
    # fingerprints are built by the same code on every rank: equal dicts, equal reprs
    common = repr(fp) if PER_RANK.isdisjoint(fp) else repr({k: v for k, v in fp.items() if k not in PER_RANK})
    share = row_of(fp.get("op", "")).share
    cross = share(fp, rank) & _M if share is not None else 0
    return [int(seq), _signed(_hash(common)), _signed(cross)]


def agree(table: List[int], n: int) -> bool:
    """Whether the digests of every rank (``table[3 * r: 3 * r + 3]``, rank r's) say the calls match."""
    return (table[0::SLOTS].count(table[0]) == n and table[1::SLOTS].count(table[1]) == n
            and sum(table[2::SLOTS]) & _M == 0)
