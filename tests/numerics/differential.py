"""A seeded generator of random collective programs, run on funcoll and on raw gloo side by side in the same world.

Every rank of a world holds a funcoll group and a raw gloo group (``new_group(backend="gloo")``) over the same ranks
and, at 3+ ranks, three sub-groups of each ({0, 1}, {1, ..., n-1}, {0, n-1}). Case ``i`` of seed ``s`` is drawn
from ``random.Random(f"{s}/{i}")`` -- the same on every rank. The first ``len(KINDS)`` cases of every seed are every
kind of :data:`KINDS` once, in an order drawn from the seed; the rest are drawn at random. A kind is an op (every
eager op, p2p, batch_isend_irecv, coalesced and object collectives, the functional ops eagerly and compiled with
``torch.compile(backend="aot_eager")``), or one of: list ``all_gather`` with a different size per rank, list
``reduce_scatter`` with a different size per destination, ``all_to_all_single`` whose split sizes are all equal on
one rank and uneven on the others, and moves (broadcast, scatter, all_gather, all_to_all_single, send/recv) of random
bit patterns (NaN payloads, signalling NaNs, -0.0, subnormals: tests/bit_patterns.py) compared bit for bit, the
senders' tensors included. Each case also draws a dtype, shape and reduce op of the valid requests
(tests/reference.py's ``valid_ops``, pinned from what the backends accept), a memory layout per rank (ranks differ
most of the time), blocking or async (waited out of order, through futures, with a timeout or by polling), the world
or a sub-group, and sometimes an invalid request.

The truth is the value rebuilt from the seed: every rank rebuilds every rank's input, so the expected value is
computed locally (tests/reference.py). funcoll's result must equal it. So must raw gloo's, run on the same case
right after, unless gloo's behaviour is one of the named, reproduced entries of :data:`GLOO_KNOWN` (each with a
few lines of raw torch.distributed that show it, which tests/numerics/test_differential.py runs on the installed
torch): a refusal is matched by its exception type and message, a wrong result by the defect's description; an
exception or a difference that matches no entry fails the case, as a refusal on some ranks only does. An invalid
request must raise on every rank and leave the ranks in step. After every case the ranks exchange their outcome
(which keeps them in step). A watchdog fails a case that hangs. A failure prints a one-line repro.

    ./dev python -m tests.numerics.differential --seeds 0-14 --world 2,3,4 --profile native,xccl,xla   # the long run
    ./dev python -m tests.numerics.differential --seeds 7 --case 12 --profile xla     # one case (a failure's repro)
    ./dev python -m tests.numerics.differential --seeds 7 --case 0-12 --profile xla   # a case after the ones before it

(``FUNCOLL_ENVS=latest ./dev python ...`` runs it on the latest environment's torch.) It prints, per profile and
world, the count of each kind and of each outcome. ``tests/numerics/test_differential.py`` runs one seed per profile
at worlds 2 and 3 as part of the suite.
"""

from __future__ import annotations

import argparse
import os
import random
import re
import sys
import threading
import time
import traceback
import zlib
from dataclasses import dataclass
from datetime import timedelta
from typing import Callable, Optional, Tuple

import torch
import torch.distributed as dist

from tests import bit_patterns
from tests import reference as ref

CASES_PER_SEED = 40
WAIT = timedelta(seconds=60)  # every async wait has a timeout
# a case running longer than this is a hang: the watchdog fails it
HANG_S = float(os.environ.get("FUNCOLL_DIFF_HANG_S", "90"))

FLOATS = [torch.float32, torch.float16, torch.bfloat16, torch.float64]
INTS = [torch.int8, torch.uint8, torch.int16, torch.int32, torch.int64, torch.uint16, torch.uint32, torch.uint64]
MOVE_ONLY = [torch.complex64, torch.float8_e4m3fn, torch.float8_e5m2]
DTYPES = FLOATS + INTS + [torch.bool] + MOVE_ONLY
BITS_DTYPES = FLOATS + MOVE_ONLY  # the dtypes whose bit patterns a move must keep
LAYOUTS = ["contiguous", "contiguous", "strided", "transposed", "offset"]
MOVES_BITS = ["broadcast", "scatter", "all_gather", "all_to_all_single", "send_recv"]
KINDS = ["all_reduce", "all_reduce_coalesced", "all_gather", "all_gather_uneven", "all_gather_into_tensor",
         "reduce_scatter", "reduce_scatter_uneven", "reduce_scatter_tensor", "all_to_all_single",
         "all_to_all_single_mixed", "all_to_all", "broadcast", "reduce", "gather", "scatter", "send_recv",
         "batch_isend_irecv", "objects", "functional", "compiled", "async_batch", "invalid"] + [
    f"{k}_bits" for k in MOVES_BITS]
REDUCING = {"all_reduce", "all_reduce_coalesced", "reduce_scatter", "reduce_scatter_uneven", "reduce_scatter_tensor",
            "reduce"}
P2P = {"send_recv", "batch_isend_irecv"}
NO_DTYPE = {"objects", "async_batch", "invalid"}  # kinds whose tensors do not take the case's dtype


class CaseFailure(AssertionError):
    pass


def _lay(t: torch.Tensor, kind: str) -> torch.Tensor:
    from tests.semantics.test_layouts import lay

    return lay(t, kind) if t.dim() >= 1 and t.numel() else t.clone()


def _values(op: str, dtype: torch.dtype) -> str:
    if dtype.is_floating_point or dtype.is_complex:
        return "grid"
    return "small" if op in ("product", "avg", "premul_sum") else "random"


def _collective(kind: str) -> str:
    """The collective whose valid (dtype, reduce op) requests a reducing kind draws from (tests/oracle.py)."""
    return "reduce" if kind == "reduce" else "reduce_scatter" if kind.startswith("reduce_scatter") else "all_reduce"


def subgroups(n: int) -> list:
    """The sub-groups a world of ``n`` ranks draws from (global ranks): none below 3 ranks."""
    return [] if n < 3 else [[0, 1], list(range(1, n)), [0, n - 1]]


def _draw(seed: int, i: int, n: int, compiled_ok: bool) -> dict:
    """Case ``i`` of ``seed`` in a world of ``n``: a dict every rank draws alike. Cases ``0 .. len(KINDS) - 1`` are
    every kind once (in an order drawn from the seed), the rest any kind."""
    rng = random.Random(f"{seed}/{i}")
    if i < len(KINDS):
        order = list(KINDS)
        random.Random(f"{seed}/kinds").shuffle(order)
        label = order[i]
    else:
        label = rng.choice(KINDS)
    if label == "compiled" and not compiled_ok:
        label = "functional"
    bits = label.endswith("_bits")
    kind = label[:-len("_bits")] if bits else label
    if kind in REDUCING:
        dtype = rng.choice([d for d in DTYPES if ref.valid_ops(d, _collective(kind))])
        op = rng.choice(ref.valid_ops(dtype, _collective(kind)))
    else:
        dtype = rng.choice(BITS_DTYPES if bits else DTYPES)
        ops = ref.valid_ops(dtype)
        op = rng.choice(ops) if ops else "sum"  # the functional kinds' reduce op
    rows = rng.choice([0, 1, 2, 3])
    shape = rng.choice([(), (0,), (5,), (2, 3), (rows, 3)]) if kind == "all_reduce" else (rng.choice([0, 1, 2]), 3)
    if bits:  # enough elements for the specials and random patterns
        shape = (rng.choice([0, 1, 2, 12]), 3)
    if kind in ("reduce_scatter_tensor", "scatter", "reduce_scatter") and shape == ():
        shape = (1,)
    subs = subgroups(n)
    sub = rng.randrange(len(subs)) if subs and rng.random() < 0.3 else None
    return _case(seed=seed, i=i, kind=kind, bits=bits, dtype=dtype, op=op, shape=shape,
                 layouts=[rng.choice(LAYOUTS) for _ in range(n)], async_=rng.random() < 0.4,
                 wait=rng.choice(["wait", "future", "timeout", "poll"]), root=rng.randrange(n), sub=sub,
                 rng=rng.random())


def _case(seed, i, kind, dtype, op, shape, layouts, async_=False, wait="wait", root=0, sub=None, rng=0.5,
          bits=False, ignore=()) -> dict:
    """A case (what :func:`_draw` returns); tests/numerics/test_differential.py writes some out this way.
    ``ignore``: names of :data:`GLOO_KNOWN` entries this case does not accept (the test that shows the oracle
    fails without them)."""
    return {"seed": seed, "i": i, "kind": kind, "bits": bits, "label": kind + ("_bits" if bits else ""),
            "dtype": dtype, "op": op, "shape": shape, "layouts": layouts, "async": async_, "wait": wait,
            "root": root, "sub": sub, "rng": rng, "salt": f"{seed}/{i}", "ignore": tuple(ignore)}


def _bits_input(dtype: torch.dtype, shape, rank: int, salt) -> torch.Tensor:
    """Rank ``rank``'s input of bit patterns (tests/bit_patterns.py), a window of them that depends on the salt."""
    numel = 1
    for s in shape:
        numel *= s
    p = bit_patterns.patterns(dtype, rank, salt, numel=numel + 18)
    ints = bit_patterns.INT_OF_SIZE[dtype.itemsize]
    shift = zlib.crc32(f"{salt}/{rank}".encode()) % p.numel()
    return torch.roll(p.view(ints), shift)[:numel].clone().view(dtype).reshape(shape)


def _uneven(c: dict, n: int) -> list:
    """The rows of each of ``n`` ranks (or destinations) of an uneven list collective: not all equal."""
    rng = random.Random(c["salt"] + "/sizes")
    sizes = [rng.randrange(4) for _ in range(n)]
    if len(set(sizes)) == 1:
        sizes[0] = (sizes[0] + 1) % 4
    return sizes


def _mixed_splits(c: dict, n: int) -> list:
    """``sp[r][j]``: the rows rank r sends rank j, uneven across the group but all equal, in and out, on one rank."""
    rng = random.Random(c["salt"] + "/splits")
    even, a = rng.randrange(n), rng.randrange(1, 3)
    sp = [[a if even in (r, j) else rng.randrange(4) for j in range(n)] for r in range(n)]
    for r in range(n):
        if r != even and len(set(sp[r])) == 1:
            sp[r][r] = a + 1
    return sp


def _a2a_splits(c: dict, n: int) -> tuple:
    """(whether uneven, ``sp``) of an all_to_all_single case: ``sp[r][j]`` the rows rank r sends rank j."""
    if c["kind"] == "all_to_all_single_mixed":
        return True, _mixed_splits(c, n)
    uneven = c["rng"] < 0.5
    return uneven, [[(r + j + int(c["rng"] * 10)) % 3 if uneven else c["shape"][0] for j in range(n)]
                    for r in range(n)]


# -- raw gloo: what it is known to refuse or get wrong ----------------------------------------------------------
@dataclass(frozen=True)
class Known:
    """A behaviour of raw gloo that differs from the reference.

    ``applies(c)`` says whether it covers a case (``c`` holds the case and, for this rank, ``me`` (its index in the
    group), ``n`` and ``lays``, the group's layouts). ``error``: for a refusal, the exception type and a regular
    expression its message matches (the case then counts under the name; any other exception fails it); None: a
    wrong result (gloo's output differs from the reference), or, with ``asked=False``, a case gloo is not given
    (its reproducer shows why). ``repro(rank)`` shows it in a 2-rank raw gloo world, in a few lines of
    torch.distributed: a refusal's raises ``error`` on every rank, the others return True on a rank where it shows.
    ``torch``: the torch versions it was seen on (first, last; None: the newest one checked, 2.15.0, too); the suite
    checks 2.9.0 and 2.15.0: on a torch between them an entry that names only one of them does not apply (a case it
    would cover fails, and says what gloo did).
    """

    name: str
    applies: Callable[[dict], bool]
    repro: Callable[[int], object]
    error: Optional[Tuple[type, str]] = None
    asked: bool = True
    torch: Tuple[str, Optional[str]] = ("2.9", None)

    def current(self) -> bool:
        """Whether the running torch is in :attr:`torch`."""
        def v(s):
            return tuple(int(x) for x in re.findall(r"\d+", s)[:2])
        first, last = self.torch
        return v(first) <= v(torch.__version__) and (last is None or v(torch.__version__) <= v(last))


_GLOO_DTYPES = {torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.int8, torch.uint8, torch.int32,
                torch.int64, torch.bool}


def _repro_dtype(rank):
    t = torch.arange(4, dtype=torch.int16)
    dist.broadcast(t, src=0)  # RuntimeError: Invalid scalar type


def _repro_premul(rank):
    dist.all_reduce(torch.ones(3), op=dist._make_nccl_premul_sum(0.5))  # Cannot use ReduceOp.PREMUL_SUM with Gloo


def _repro_int_avg(rank):
    g = dist.new_group(backend="gloo", timeout=timedelta(seconds=2))  # a group of its own: it may be broken after
    try:
        dist.all_reduce(torch.ones(3, dtype=torch.int32), op=dist.ReduceOp.AVG, group=g)
    except RuntimeError as e:
        # after the exchange; g's next operation then fails too on some runs (the same error again, or a timeout)
        return "result type Float can't be cast to the desired output type Int" in str(e)
    return False


def _repro_all_to_all(rank):
    dist.all_to_all([torch.zeros(1), torch.zeros(1)], [torch.ones(1), torch.ones(1)])  # does not support alltoall


def _repro_all_to_all_sizes(rank):
    # rank r sends r + j + 1 elements to rank j
    outs, ins = [torch.zeros(r + rank + 1) for r in range(2)], [torch.ones(rank + j + 1) for j in range(2)]
    dist.all_to_all(outs, ins)  # ProcessGroupGloo::alltoall: invalid tensor size


def _repro_a2a_contiguous(rank):
    dist.all_to_all_single(torch.zeros(2, 3), torch.ones(3, 2).t())  # ValueError: Tensors must be contiguous


def _repro_send_contiguous(rank):
    t = torch.ones(3, 2).t()
    dist.send(t, 1) if rank == 0 else dist.recv(t, 0)  # RuntimeError: input tensor has to be contiguous


def _repro_all_gather_uneven(rank):
    outs = [torch.zeros(1), torch.zeros(2)]
    dist.all_gather(outs, torch.ones(rank + 1))  # ProcessGroupGloo::allgather: invalid tensor size


def _repro_mixed_contiguity(rank):
    g = dist.new_group(backend="gloo", timeout=timedelta(seconds=2))
    x = torch.ones(3, 2).t() if rank == 0 else torch.ones(2, 3)  # rank 0's is transposed, rank 1's contiguous
    try:
        dist.all_to_all_single(torch.zeros(2, 3), x, group=g)
    except ValueError as e:  # rank 0, before sending
        return rank == 0 and "Tensors must be contiguous" in str(e)
    except RuntimeError as e:  # rank 1, which waited for rank 0 until the group's timeout
        return rank == 1 and "imed out" in str(e)
    return False


def _repro_reduce_non_root(rank):
    t = torch.full((4,), float(rank + 1))
    dist.reduce(t, dst=0)
    return rank == 1 and not torch.equal(t, torch.full((4,), 2.0))  # rank 1's tensor holds a partial result


def _repro_memory_order(rank):
    x = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    t = x.clone() if rank == 0 else x.t().contiguous().t()  # rank 1's is transposed (column-major)
    dist.all_reduce(t)
    buf = torch.zeros(2, 6)
    s = buf[:, ::2]  # every other element of a wider buffer
    s.copy_(x)
    dist.all_reduce(s)
    # each rank added the other's elements in memory order, and the strided view's buffer from its start
    return not torch.equal(t, 2 * x) and not torch.equal(s, 2 * x)


def _dtype_refused(c):
    if c["kind"] in NO_DTYPE or c["kind"] in P2P:
        return False
    dt = c["dtype"] if c["kind"] != "compiled" else torch.float32
    return dt not in _GLOO_DTYPES and not (dt == torch.complex64 and c["kind"] != "gather")


def _noncontiguous(c) -> list:
    """Whether each member's tensor of an all_to_all_single or send_recv case is non-contiguous (a transposed
    tensor of one row is contiguous)."""
    sp = _a2a_splits(c, c["n"])[1] if c["kind"].startswith("all_to_all_single") else None
    shapes = [(sum(sp[r]), 3) if sp else c["shape"] for r in range(c["n"])]
    return [not _lay(torch.empty(shp), lay).is_contiguous() for shp, lay in zip(shapes, c["lays"])]


def _functional_op(c) -> str:
    return ["all_reduce", "all_gather_tensor", "reduce_scatter_tensor", "all_to_all_single", "broadcast"][
        int(c["rng"] * 5)]


GLOO_KNOWN = [
    Known("gloo moves no int16, uint16, uint32, uint64 or float8, and gathers no complex",
          _dtype_refused, _repro_dtype, (RuntimeError, r"Invalid scalar type")),
    Known("gloo has no PREMUL_SUM",
          lambda c: c["kind"] in REDUCING and c["op"] == "premul_sum" and not _dtype_refused(c),
          _repro_premul, (RuntimeError, r"Cannot use ReduceOp\.PREMUL_SUM with Gloo")),
    Known("not asked: gloo's AVG divides the sum in place, which an integer tensor cannot hold: it raises after the "
          "exchange, and the group's next operation may fail too",
          lambda c: c["kind"] in REDUCING and c["op"] == "avg" and not c["dtype"].is_floating_point
          and not c["dtype"].is_complex and not _dtype_refused(c), _repro_int_avg, asked=False),
    Known("gloo has no list all_to_all",
          lambda c: c["kind"] == "all_to_all", _repro_all_to_all, (RuntimeError, r"does not support alltoall"),
          torch=("2.9", "2.9")),
    Known("gloo's list all_to_all takes tensors of one size only",
          lambda c: c["kind"] == "all_to_all" and c["rng"] < 0.5, _repro_all_to_all_sizes,
          (RuntimeError, r"ProcessGroupGloo::alltoall: invalid tensor size"), torch=("2.15", None)),
    Known("gloo's all_to_all_single refuses non-contiguous tensors",
          lambda c: c["kind"].startswith("all_to_all_single") and all(_noncontiguous(c)),
          _repro_a2a_contiguous, (ValueError, r"Tensors must be contiguous")),
    Known("gloo's send and recv refuse non-contiguous tensors",
          lambda c: c["kind"] == "send_recv" and all(_noncontiguous(c)),
          _repro_send_contiguous, (RuntimeError, r"tensor has to be contiguous")),
    Known("gloo's list all_gather takes outputs of the input's size only",
          lambda c: c["kind"] == "all_gather_uneven", _repro_all_gather_uneven,
          (RuntimeError, r"ProcessGroupGloo::allgather: invalid tensor size")),
    Known("not asked: gloo's all_to_all_single, send and recv refuse a non-contiguous tensor on the ranks that have "
          "one only, and their peers wait in the exchange",
          lambda c: (c["kind"].startswith("all_to_all_single") or c["kind"] == "send_recv")
          and len(set(_noncontiguous(c))) > 1, _repro_mixed_contiguity, asked=False),
    Known("gloo's reduce leaves partial results in the tensors of the ranks other than dst",
          lambda c: c["kind"] == "reduce" and c["me"] != c["root"] % c["n"], _repro_reduce_non_root),
    Known("gloo reads and writes a tensor in memory order, as if it were contiguous: a strided one, or a transposed "
          "one where a peer's is not",
          lambda c: c["kind"] in ("all_reduce", "all_reduce_coalesced", "async_batch", "reduce", "reduce_scatter",
                                  "reduce_scatter_uneven", "reduce_scatter_tensor", "scatter", "broadcast")
          and ("strided" in c["lays"] or len({lay == "transposed" for lay in c["lays"]}) > 1), _repro_memory_order),
]


def gloo_repros(rank: int, n: int) -> list:
    """Runs every entry's reproducer that applies to the running torch on a raw gloo world of 2 ranks; returns
    ``(name, what it showed)``: "raised" (a refusal raised its error), the return value of the others (True: shown),
    or what happened instead."""
    # the barrier after each runs on a group of its own: gloo's barrier waits for the work its group still lists as
    # in progress, and re-raises its error (a refused all_reduce may still be listed when its wait has returned)
    out, sync = [], dist.new_group(backend="gloo")
    for k in GLOO_KNOWN:
        if not k.current():
            continue
        try:
            got = k.repro(rank)
        except Exception as e:  # noqa: BLE001 - compared with the entry's error
            ok = k.error is not None and isinstance(e, k.error[0]) and re.search(k.error[1], str(e))
            got = "raised" if ok else f"{type(e).__name__}: {str(e)[:200]}"
        else:
            if k.error is not None:
                got = f"returned {got!r} instead of raising"
        out.append((k.name, got))
        dist.barrier(group=sync)
    return out


def _known(c: dict, error=None) -> Optional[Known]:
    """The entry of :data:`GLOO_KNOWN` that covers case view ``c`` (refusals: whose error ``error`` matches;
    ``error=None``: the wrong results)."""
    for k in GLOO_KNOWN:
        if not k.asked or not k.current() or k.name in c["ignore"] or not k.applies(c):
            continue
        if error is None and k.error is None:
            return k
        if error is not None and k.error is not None and isinstance(error, k.error[0]) \
                and re.search(k.error[1], str(error)):
            return k
    return None


class Runner:
    def __init__(self, rank: int, n: int, profile: str | None):
        self.rank, self.n, self.profile = rank, n, profile
        self.fc = dist.group.WORLD
        self.gloo = dist.new_group(backend="gloo")
        self.sync = dist.new_group(backend="gloo")  # the outcome exchange after every case
        self.subs = [(r, dist.new_group(r), dist.new_group(r, backend="gloo")) for r in subgroups(n)]
        self.count = {"cases": 0, "invalid": 0, "skipped (not a member)": 0, "sub-group": 0, "mixed layouts": 0}
        self.kinds: dict = {}  # kind -> outcome -> count
        self.gloo_known: dict = {}  # name of a GLOO_KNOWN entry -> count
        self.compiled: dict = {}

    def _tally(self, label: str, outcome: str, by=1) -> None:
        k = self.kinds.setdefault(label, {})
        k[outcome] = k.get(outcome, 0) + by

    # -- running one case on one group ------------------------------------------------------------------
    def _finish(self, works, how: str):
        works = [w for w in (works if isinstance(works, list) else [works]) if w is not None]
        if how == "future":
            for w in works:
                f = w.get_future() if hasattr(w, "get_future") else w
                f.wait()
        elif how == "poll":
            end = time.monotonic() + WAIT.total_seconds()
            while not all(w.is_completed() for w in works):
                if time.monotonic() > end:
                    raise CaseFailure("is_completed() stayed False")
                time.sleep(0.001)
        for w in reversed(works):  # out of order
            if how == "timeout":
                w.wait(timeout=WAIT)
            else:
                w.wait()

    def run(self, c: dict, group, ranks: list, is_gloo: bool):
        """Runs case ``c`` on ``group`` (group ranks ``ranks``, global); returns the outputs to compare, the expected
        ones, the reduce op ("none": a move, "bits": a move compared bit for bit) and the kind of values."""
        me = ranks.index(self.rank)
        n = len(ranks)
        dt, op, shape, kind, bits = c["dtype"], c["op"], c["shape"], c["kind"], c["bits"]
        vals = _values(op, dt)
        salt = c["salt"]
        lay = c["layouts"][me]
        asy = c["async"]
        root = c["root"] % n
        groot = ranks[root]
        moved = "bits" if bits else "none"

        def mk(shp, r, s=salt):
            return _bits_input(dt, shp, r, s) if bits else ref.make(dt, shp, r, s, vals)

        xs = [mk(shape, r) for r in range(n)]
        aop = {"async_op": True} if asy else {}

        def fin(w):
            if asy:
                # raw gloo's reduce_scatter Works have no future ("Work::getFuture not implemented") and never turn
                # completed when polled (funcoll's do: docs/work.md): gloo's are waited on
                no_future = is_gloo and kind.startswith("reduce_scatter") and c["wait"] in ("future", "poll")
                self._finish(w, "wait" if no_future else c["wait"])

        if kind == "all_reduce":
            t = _lay(xs[me], lay)
            fin(dist.all_reduce(t, op=ref.c10d_op(op), group=group, **aop))
            return [t], [ref.reduce(op, xs)], op, vals
        if kind == "all_reduce_coalesced":
            ys = ref.all_inputs(n, dt, (3,), salt + "b", vals)
            ts = [_lay(xs[me], lay), ys[me].clone()]
            out = dist.all_reduce_coalesced(ts, op=ref.c10d_op(op), group=group, **aop)
            if asy:
                self._finish(out, "future")
            return ts, [ref.reduce(op, xs), ref.reduce(op, ys)], op, vals
        if kind == "all_gather":
            outs = [_lay(torch.zeros(shape, dtype=dt), lay) for _ in range(n)]
            x = _lay(xs[me], lay)
            fin(dist.all_gather(outs, x, group=group, **aop))
            return outs + [x], xs + [xs[me]], moved, vals
        if kind == "all_gather_uneven":
            sizes = _uneven(c, n)
            xs = [mk((sizes[r], 3), r) for r in range(n)]
            outs = [_lay(torch.zeros((sizes[r], 3), dtype=dt), lay) for r in range(n)]
            fin(dist.all_gather(outs, _lay(xs[me], lay), group=group, **aop))
            return outs, xs, "none", vals
        if kind == "all_gather_into_tensor":
            out = torch.zeros((n * shape[0],) + shape[1:], dtype=dt)
            fin(dist.all_gather_into_tensor(out, _lay(xs[me], lay), group=group, **aop))
            return [out], [torch.cat(xs)], "none", vals
        if kind in ("reduce_scatter", "reduce_scatter_uneven"):
            sizes = _uneven(c, n) if kind == "reduce_scatter_uneven" else [shape[0]] * n
            # ins[j][r]: rank r's input for destination j
            ins = [ref.all_inputs(n, dt, (sizes[j],) + shape[1:], f"{salt}/{j}", vals) for j in range(n)]
            out = _lay(torch.zeros((sizes[me],) + shape[1:], dtype=dt), lay)
            fin(dist.reduce_scatter(out, [_lay(ins[j][me], lay) for j in range(n)], op=ref.c10d_op(op), group=group,
                                    **aop))
            return [out], [ref.reduce(op, ins[me])], op, vals
        if kind == "reduce_scatter_tensor":
            big = ref.all_inputs(n, dt, (n * shape[0],) + shape[1:], salt, vals)
            out = torch.zeros(shape, dtype=dt)
            fin(dist.reduce_scatter_tensor(out, _lay(big[me], lay), op=ref.c10d_op(op), group=group, **aop))
            k = shape[0]
            return [out], [ref.reduce(op, big)[me * k:(me + 1) * k]], op, vals
        if kind in ("all_to_all_single", "all_to_all_single_mixed"):
            uneven, sp = _a2a_splits(c, n)
            ins = [mk((sum(sp[r]), 3), r) for r in range(n)]
            out = torch.zeros((sum(sp[r][me] for r in range(n)), 3), dtype=dt)
            osz, isz = ([sp[r][me] for r in range(n)], sp[me]) if uneven or c["rng"] < 0.75 else (None, None)
            x = _lay(ins[me], lay)
            fin(dist.all_to_all_single(out, x, osz, isz, group=group, **aop))
            want = torch.cat([ins[r][sum(sp[r][:me]):sum(sp[r][:me + 1])] for r in range(n)])
            return [out, x], [want, ins[me]], moved, vals
        if kind == "all_to_all":  # uneven sizes, or one size for every tensor
            rows = (lambda r, j: (r + j) % 3) if c["rng"] < 0.5 else (lambda r, j: shape[0])
            ins = [[ref.make(dt, (rows(r, j), 2), r, f"{salt}/{j}", vals) for j in range(n)] for r in range(n)]
            outs = [torch.zeros((rows(r, me), 2), dtype=dt) for r in range(n)]
            fin(dist.all_to_all(outs, [_lay(t, lay) for t in ins[me]], group=group, **aop))
            return outs, [ins[r][me] for r in range(n)], "none", vals
        if kind == "broadcast":
            t = _lay(xs[me], lay)
            fin(dist.broadcast(t, src=groot, group=group, **aop))
            return [t], [xs[root]], moved, vals
        if kind == "reduce":
            t = _lay(xs[me], lay)
            fin(dist.reduce(t, dst=groot, op=ref.c10d_op(op), group=group, **aop))
            return ([t], [ref.reduce(op, xs)], op, vals) if me == root else ([t], [xs[me]], "none", vals)
        if kind == "gather":
            outs = [_lay(torch.zeros(shape, dtype=dt), lay) for _ in range(n)] if me == root else None
            fin(dist.gather(_lay(xs[me], lay), outs, dst=groot, group=group, **aop))
            return (outs, xs, "none", vals) if me == root else ([], [], "none", vals)
        if kind == "scatter":
            out = _lay(torch.zeros(shape, dtype=dt), lay)
            sent = [_lay(x, lay) for x in xs] if me == root else []
            fin(dist.scatter(out, sent or None, src=groot, group=group, **aop))
            return [out] + sent, [xs[me]] + (xs if sent else []), moved, vals
        if kind == "send_recv":  # a ring: isend to the next, irecv from the previous (or blocking, ordered by parity)
            got = _lay(torch.zeros(shape, dtype=dt), lay)
            sent = _lay(xs[me], lay)
            nxt, prv = ranks[(me + 1) % n], ranks[(me - 1) % n]
            if asy:
                ws = [dist.isend(sent, nxt, group=group), dist.irecv(got, prv, group=group)]
                # raw gloo's point-to-point Works have no future and do not complete by polling: gloo is waited on
                self._finish(ws, "wait" if is_gloo and c["wait"] in ("future", "poll") else c["wait"])
            elif me % 2 == 0:
                dist.send(sent, nxt, group=group)
                dist.recv(got, prv, group=group)
            else:
                dist.recv(got, prv, group=group)
                dist.send(sent, nxt, group=group)
            return [got, sent], [xs[(me - 1) % n], xs[me]], moved, vals
        if kind == "batch_isend_irecv":
            got = torch.zeros(shape, dtype=dt)
            nxt, prv = ranks[(me + 1) % n], ranks[(me - 1) % n]
            ws = dist.batch_isend_irecv([dist.P2POp(dist.isend, xs[me].clone(), nxt, group),
                                         dist.P2POp(dist.irecv, got, prv, group)])
            # gloo's point-to-point Works have no future and do not complete by polling: gloo is waited on
            self._finish(ws, c["wait"] if c["wait"] not in ("poll", "future") or not is_gloo else "wait")
            return [got], [xs[(me - 1) % n]], "none", vals
        if kind == "objects":
            objs = [{"rank": r, "salt": salt, "v": list(range(r + 1))} for r in range(n)]
            gathered = [None] * n
            dist.all_gather_object(gathered, objs[me], group=group)
            box = [objs[me]]
            dist.broadcast_object_list(box, src=groot, group=group)
            at_root = [None] * n if me == root else None
            dist.gather_object(objs[me], at_root, dst=groot, group=group)
            sc = [None]
            dist.scatter_object_list(sc, objs if me == root else None, src=groot, group=group)
            ok = gathered == objs and box[0] == objs[root] and sc[0] == objs[me] and at_root in (None, objs)
            return [torch.tensor(ok)], [torch.tensor(True)], "none", vals
        if kind in ("functional", "compiled"):
            return self._functional(c, group, me, n, root, is_gloo)
        if kind == "async_batch":  # several async ops, waited in a shuffled order, some through futures
            a = [_lay(x, lay) for x in ref.all_inputs(n, torch.float32, (4,), salt + "a", "grid")[me:me + 1]]
            g = torch.zeros(n * 3)
            bc = ref.all_inputs(n, torch.int64, (2,), salt + "c")
            b = bc[me].clone()
            ws = [dist.all_reduce(a[0], group=group, async_op=True),
                  dist.all_gather_into_tensor(g, ref.all_inputs(n, torch.float32, (3,), salt + "g")[me], group=group,
                                              async_op=True),
                  dist.broadcast(b, src=groot, group=group, async_op=True)]
            order = list(range(3))
            random.Random(salt).shuffle(order)
            for j in order:
                if j == 1 and not is_gloo:
                    ws[j].get_future().wait()
                ws[j].wait(timeout=WAIT)
            return ([a[0], g, b], [ref.reduce("sum", ref.all_inputs(n, torch.float32, (4,), salt + "a", "grid")),
                                   torch.cat(ref.all_inputs(n, torch.float32, (3,), salt + "g")), bc[root]],
                    "sum", "grid")
        raise AssertionError(kind)

    def _functional(self, c: dict, group, me: int, n: int, root: int, is_gloo: bool):
        """The functional collectives (torch.distributed._functional_collectives), eagerly or compiled."""
        import torch.distributed._functional_collectives as fc

        kind, dt, op, shape = c["kind"], c["dtype"], c["op"], c["shape"]
        which = _functional_op(c)
        fdt = dt if kind == "functional" else torch.float32
        fshape = (2 * n, 3) if kind == "compiled" else (2 * n,) + tuple(shape[1:])
        fop = op if kind == "functional" and which in ("all_reduce", "reduce_scatter_tensor") else "sum"
        if kind == "compiled" or fop not in ref.valid_ops(fdt, _collective(which)) or fop == "premul_sum":
            fop = "sum" if "sum" in ref.valid_ops(fdt, _collective(which)) else "none"  # no functional premul
        if fop == "none" and which in ("all_reduce", "reduce_scatter_tensor"):
            which = "all_gather_tensor"
        fv = _values(fop, fdt)
        ins = ref.all_inputs(n, fdt, fshape, c["salt"] + "f", fv)
        # upstream's functional ops other than all_reduce require a contiguous input (an assert or TORCH_CHECK on
        # the calling rank alone, before funcoll is reached): those get one
        x = _lay(ins[me], c["layouts"][me]) if which == "all_reduce" else ins[me].clone()
        k = fshape[0] // n

        def body(x, which=which, fop=fop):
            if which == "all_reduce":
                return fc.all_reduce(x, fop, group)
            if which == "all_gather_tensor":
                return fc.all_gather_tensor(x, 0, group)
            if which == "reduce_scatter_tensor":
                return fc.reduce_scatter_tensor(x, fop, 0, group)
            if which == "all_to_all_single":
                return fc.all_to_all_single(x, None, None, group)
            return fc.broadcast(x, root, group)

        if kind == "compiled" and not is_gloo:  # raw gloo runs the same ops eagerly (compiling them checks torch)
            key = (which, fop, root, id(group))
            if key not in self.compiled:
                self.compiled[key] = torch.compile(body, backend="aot_eager", fullgraph=True)
            y = self.compiled[key](x)
        else:
            y = body(x)
        y = fc.wait_tensor(y) if isinstance(y, torch.Tensor) else y
        want = {"all_reduce": lambda: ref.reduce(fop, ins),
                "all_gather_tensor": lambda: torch.cat(ins),
                "reduce_scatter_tensor": lambda: ref.reduce(fop, ins)[me * k:(me + 1) * k],
                "all_to_all_single": lambda: torch.cat([i[me * k:(me + 1) * k] for i in ins]),
                "broadcast": lambda: ins[root]}[which]()
        return [y], [want], fop if which in ("all_reduce", "reduce_scatter_tensor") else "none", fv

    def invalid(self, c: dict) -> None:
        """An invalid request on the funcoll group: it must raise here (and, as every rank draws the same case, on
        every rank) before anything is sent."""
        n = self.n
        which = int(c["rng"] * 6)
        try:
            if which == 0:
                dist.all_reduce(torch.ones(3), op=dist.ReduceOp.BXOR)
            elif which == 1:
                dist.all_reduce(torch.ones(3, dtype=torch.float8_e4m3fn))
            elif which == 2:
                dist.reduce_scatter_tensor(torch.empty(3), torch.ones(3 * n + 1))
            elif which == 3:
                dist.all_gather_into_tensor(torch.empty(2 * n + 1), torch.ones(2))
            elif which == 4:
                dist.all_to_all_single(torch.empty(4), torch.ones(4), [1] * n, [5] * n)
            else:
                dist.all_reduce(torch.ones(2), op=dist.ReduceOp.BAND)
        except (ValueError, TypeError, RuntimeError):
            self.count["invalid"] += 1
            return
        raise CaseFailure(f"invalid request {which} did not raise")

    @staticmethod
    def _differs(got, want, op, vals, n) -> Optional[str]:
        if len(got) != len(want):
            return f"{len(got)} outputs, expected {len(want)}"
        for j, (g, w) in enumerate(zip(got, want)):
            if op == "bits":
                err = bit_patterns.differ(g, w)
            else:
                err = ref.close(g.contiguous(), w, n if op != "none" else 1, op if op != "none" else "sum", vals)
            if err:
                return f"output {j}: {err}"
        return None

    # -- one case: funcoll vs the reference, then gloo vs the reference ---------------------------------------
    def case(self, c: dict) -> None:
        t0 = time.monotonic()
        try:
            self._case(c)
        finally:
            self._tally(c["label"], "seconds", time.monotonic() - t0)

    def _case(self, c: dict) -> None:
        self.count["cases"] += 1
        label = c["label"]
        self._tally(label, "cases")
        if c["kind"] == "invalid":
            self.invalid(c)
            return
        if c["sub"] is not None and self.subs:
            ranks, *groups = self.subs[c["sub"]]
            self.count["sub-group"] += 1
            self._tally(label, "sub-group")
        else:
            groups, ranks = [self.fc, self.gloo], list(range(self.n))
        n = len(ranks)
        if len(set(c["layouts"][:n])) > 1:
            self.count["mixed layouts"] += 1
        errors: list = []
        outcome = "not a member"
        if self.rank in ranks:
            try:
                err = self._differs(*self.run(c, groups[0], ranks, False), n)
            except Exception as e:  # noqa: BLE001 - reported with the repro
                err = f"raised {type(e).__name__}: {str(e)[:300]}"
            if err:
                errors.append(f"funcoll: {err}")
            outcome = self._gloo(c, groups[1], ranks, errors)
            self._tally(label, outcome)
        else:
            self.count["skipped (not a member)"] += 1
        # every rank's outcome (this also keeps the ranks in step): a refusal must be on every member
        every: list = [None] * self.n
        dist.all_gather_object(every, outcome, group=self.sync)
        refused = {o for r, o in enumerate(every) if r in ranks and o.startswith("gloo refused")}
        if refused and (len(refused) > 1 or any(every[r] not in refused for r in ranks)):
            errors.append(f"gloo's outcome differs between the ranks: {[every[r] for r in ranks]}")
        if errors:
            raise CaseFailure("; ".join(errors))

    def _gloo(self, c: dict, group, ranks: list, errors: list) -> str:
        """Runs case ``c`` on the raw gloo ``group``; returns its outcome (counted under that name) and appends to
        ``errors`` what matches no entry of :data:`GLOO_KNOWN`."""
        n = len(ranks)
        view = dict(c, me=ranks.index(self.rank), n=n, lays=c["layouts"][:n])
        for k in GLOO_KNOWN:
            if not k.asked and k.applies(view):
                self.gloo_known[k.name] = self.gloo_known.get(k.name, 0) + 1
                return "gloo not asked"
        try:
            got, want, op, vals = self.run(c, group, ranks, True)
        except Exception as e:  # noqa: BLE001 - matched with the known refusals
            k = _known(view, e)
            if k is None:
                errors.append(f"gloo raised {type(e).__name__}: {str(e)[:300]} (no known gloo refusal matches)")
                return "gloo failed"
            self.gloo_known[k.name] = self.gloo_known.get(k.name, 0) + 1
            return "gloo refused"
        err = self._differs(got, want, op, vals, n)
        if err is None:
            return "gloo agreed"
        k = _known(view)
        if k is None:
            errors.append(f"gloo differs from the reference, and no known gloo defect covers the case: {err}")
            return "gloo failed"
        self.gloo_known[k.name] = self.gloo_known.get(k.name, 0) + 1
        return "gloo defect"


class Watchdog:
    """Fails (exits the rank with code 3, printing the repro) when a case runs longer than ``HANG_S``."""

    def __init__(self):
        self.case = None
        self.started = 0.0
        self.lock = threading.Lock()
        threading.Thread(target=self._watch, daemon=True).start()

    def arm(self, repro):
        with self.lock:
            self.case, self.started = repro, time.monotonic()

    def disarm(self):
        with self.lock:
            self.case = None

    def _watch(self):
        while True:
            time.sleep(1.0)
            with self.lock:
                if self.case is not None and time.monotonic() - self.started > HANG_S:
                    print(f"HANG after {HANG_S:g} s: {self.case}", file=sys.stderr, flush=True)
                    import faulthandler

                    faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
                    os._exit(3)


def repro(c: dict, profile, n: int) -> str:
    sub = "" if c["sub"] is None else f" sub={subgroups(n)[c['sub']]}"
    return (f"./dev python -m tests.numerics.differential --seeds {c['seed']} --case {c['i']} "
            f"--profile {profile or 'native'} "
            f"--world {n}   # {c['label']} {c['dtype']} {c['op']} {c['shape']} layouts={c['layouts']} "
            f"async={c['async']}/{c['wait']} root={c['root']}{sub}")


def rank_main(rank: int, n: int, seeds: list, case, profile, compiled: bool) -> dict:
    """Runs every case of ``seeds`` (or the cases listed in ``case``) on this rank; returns the counts and failures
    (repro lines)."""
    return rank_jobs(rank, n, [(seeds, case, compiled)], profile)[0]


def rank_jobs(rank: int, n: int, jobs: list, profile) -> list:
    """Runs the jobs one after the other in this world (as :func:`rank_main` runs one); a job is ``(seeds, case,
    compiled)`` or a list of case dicts (:func:`_case`), run in order. Returns each job's counts (``counts``,
    ``kinds``: per kind, its outcomes; ``gloo known``: per entry of :data:`GLOO_KNOWN`, the cases it covered) and
    failures. A job that stops early (more than 5 failures: the ranks may be out of step) leaves the jobs after it
    not run, each saying so."""
    import torch._dynamo

    # every compiled case traces the same small function with another op or root: recompilations of one code
    # object are what the long run asks for, not a fault
    torch._dynamo.config.recompile_limit = torch._dynamo.config.accumulated_recompile_limit = 1 << 20
    runner = Runner(rank, n, profile)
    dog = Watchdog()
    out: list = []
    for job in jobs:
        if out and len(out[-1]["failures"]) > 5:
            out.append({"counts": {}, "kinds": {}, "gloo known": {},
                        "failures": [f"[rank {rank}] not run: an earlier job of this world stopped"]})
            continue
        runner.count = {k: 0 for k in runner.count}
        runner.kinds, runner.gloo_known = {}, {}
        if isinstance(job, list):
            cases = job
        else:
            seeds, case, compiled = job
            cases = (_draw(s, i, n, compiled) for s in seeds
                     for i in (case if case is not None else range(CASES_PER_SEED)))
        failures = _job(runner, dog, rank, n, cases, profile)
        out.append({"counts": dict(runner.count), "kinds": runner.kinds, "gloo known": runner.gloo_known,
                    "failures": failures})
    return out


def _job(runner: Runner, dog: Watchdog, rank: int, n: int, cases, profile) -> list:
    failures: list = []
    for c in cases:
        line = repro(c, profile, n)
        dog.arm(line)
        try:
            runner.case(c)
        except Exception as e:  # noqa: BLE001 - reported with the repro
            failures.append(f"[rank {rank}] {line}\n    {type(e).__name__}: {str(e)[:1000]}\n"
                            + "".join(traceback.format_exc(limit=4)))
            print(failures[-1], file=sys.stderr, flush=True)  # seen even if the world then hangs
            if len(failures) > 5:
                dog.disarm()
                return failures
        dog.disarm()
    return failures


def _seeds(text: str) -> list:  # "0-9", "3,5,7" (seeds or cases)
    out = []
    for part in text.split(","):
        a, _, b = part.partition("-")
        out += list(range(int(a), int(b or a) + 1))
    return out


def run(seeds: list, profile=None, world: int = 2, case=None, compiled: bool = True, deadline: float = 3600):
    """:func:`rank_main` on a new world: ``(results, exit codes, hung)`` (funcoll.launch._spawn_world)."""
    return run_jobs([(seeds, case, compiled)], profile, world, deadline)


def run_jobs(jobs: list, profile=None, world: int = 2, deadline: float = 3600):
    """:func:`rank_jobs` on one world: ``(results, exit codes, hung)`` (a rank's value is the list of its jobs'
    counts and failures)."""
    from funcoll.launch import _spawn_world

    return _spawn_world("tests.numerics.differential:rank_jobs", world, profile, args=(jobs, profile),
                        deadline=deadline, coll_timeout=60)


def _table(per_rank: list) -> str:
    """Per kind, its outcomes summed over the ranks (a rank counts each case it took part in; "cases" is what
    rank 0 drew)."""
    kinds = sorted({k for res in per_rank for k in res["kinds"]}, key=lambda k: (KINDS + [k]).index(k))
    cols = ["cases", "sub-group", "gloo agreed", "gloo refused", "gloo defect", "gloo not asked", "gloo failed"]
    lines = [f"    {'kind':26}" + "".join(f"{c:>15}" for c in cols) + "  seconds (rank 0)"]
    for k in kinds:
        row = [per_rank[0]["kinds"].get(k, {}).get("cases", 0)] + [
            sum(res["kinds"].get(k, {}).get(c, 0) for res in per_rank) for c in cols[1:]]
        secs = per_rank[0]["kinds"].get(k, {}).get("seconds", 0.0)
        lines.append(f"    {k:26}" + "".join(f"{v:>15}" for v in row) + f"  {secs:7.1f}")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", default="0-9", help="e.g. 0-999 or 3,5,7")
    ap.add_argument("--case", default=None, help="run these cases of each seed (a repro), e.g. 12 or 0-12: a case that "
                    "fails in a run but passes alone depends on what the cases before it left behind")
    ap.add_argument("--profile", default="native", help="native, xccl, xla, or several: native,xccl,xla")
    ap.add_argument("--world", default="2", help="ranks: 2, or several: 2,3,4")
    ap.add_argument("--no-compiled", action="store_true")
    a = ap.parse_args(argv)
    profiles = a.profile.split(",")
    if not set(profiles) <= {"native", "xccl", "xla"}:
        ap.error(f"--profile {a.profile}: native, xccl or xla")
    cases = None if a.case is None else _seeds(a.case)
    seeds = _seeds(a.seeds)
    bad = False
    t_all = time.monotonic()
    total = 0
    known: dict = {}
    print(f"torch {torch.__version__}, seeds {a.seeds}" + (f", cases {a.case}" if cases else ""))
    for world in [int(w) for w in a.world.split(",")]:
        for name in profiles:
            profile = None if name == "native" else name
            t0 = time.monotonic()
            results, codes, hung = run(seeds, profile, world, cases, not a.no_compiled)
            was_bad, bad = bad, False
            per_rank = []
            for r, res in enumerate(results):
                if res is None:
                    print(f"rank {r}: no result (exit code {codes[r]}{', hung' if r in hung else ''})")
                    bad = True
                elif res[0] != "ok":
                    print(f"rank {r} failed:\n{res[1]}")
                    bad = True
                else:
                    per_rank.append(res[1][0])
                    for f in res[1][0]["failures"]:
                        print(f)
                        bad = True
            if per_rank:
                counts = per_rank[0]["counts"]
                total += counts["cases"]
                print(f"profile {name}, world {world}: {counts}")
                print(_table(per_rank))
                for res in per_rank:
                    for k, v in res["gloo known"].items():
                        known[k] = known.get(k, 0) + v
            print(f"profile {name}, world {world}: {time.monotonic() - t0:.0f} s, {'FAILED' if bad else 'ok'}",
                  flush=True)
            bad = bad or was_bad
    print("known gloo behaviour met (rank-cases):")
    for k, v in known.items():
        print(f"    {v:6}  {k}")
    print(f"{total} cases, {time.monotonic() - t_all:.0f} s, torch {torch.__version__}: {'FAILED' if bad else 'ok'}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
