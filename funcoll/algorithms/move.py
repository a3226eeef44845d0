"""The collectives that move data without reducing it: all_gather (tensor, coalesced and list forms), all_to_all
(even, uneven, list form), broadcast, gather, scatter, send, recv and barrier, each filled from the primitives the
transport has (:mod:`funcoll.algorithms.planner` lists the strategies), the halves of an MX tensor as their uint8 view
(:func:`~funcoll.algorithms.tensors._mx_as_bytes`); the even all_gather and all_to_all, and what
``native_*_call`` answer, are in :mod:`funcoll.algorithms.reduce`."""

from __future__ import annotations

import functools
import math
from typing import Optional, Sequence

import torch

from funcoll import semantics
from funcoll.algorithms import planner
from funcoll.algorithms.pending import Pending, _entry, _note
from funcoll.algorithms.reduce import _a2a_even, _ag, _ar, _masked_sum
from funcoll.algorithms.tensors import (
    _bits,
    _coalesced,
    _flat,
    _mx_as_bytes,
    _offsets,
    _padded_to,
    _summable,
    _unflatten,
    _with_contig_out,
    _with_contig_outs,
    _write_bits,
)
from funcoll.semantics import ReduceOp, Reduction
from funcoll.transport import P2P, Transport, wait_quietly


# -- is the plan native? (the eager fast path) -------------------------------------------------------------------------
def _native_move(tp: Transport, primitive: str, dtype: torch.dtype) -> Optional[tuple]:
    """The native call ``(primitive, "", dtype)`` when the transport has ``primitive`` and moves ``dtype``, else None
    (:mod:`funcoll.algorithms.reduce` says what ``native_*_call`` answer)."""
    caps = tp.caps
    return (primitive, "", dtype) if caps.has(primitive) and caps.moves(dtype) else None


def native_all_gather_call(tp: Transport, out: torch.Tensor, inp: torch.Tensor) -> Optional[tuple]:
    """``ProcessGroup._allgather_base(out, inp, opts)`` (output in the concatenated shape)."""
    shape = semantics.check_all_gather("all_gather_into_tensor", out, inp, tp.size)
    if out.numel() == 0 or inp.dim() == 0 or tuple(out.shape) != tuple(shape):
        return None
    return _native_move(tp, "all_gather", inp.dtype)


def native_all_to_all_call(tp: Transport, out: torch.Tensor, inp: torch.Tensor, osz: tuple, isz: tuple):
    """``ProcessGroup.alltoall_base(out, inp, osz, isz, opts)`` (split sizes empty: even splits)."""
    outs, ins = semantics.check_all_to_all("all_to_all_single", out, inp, list(osz), list(isz), tp.size)
    if (osz or isz) and not (tp.caps.uneven_all_to_all and list(osz) == outs and list(isz) == ins):
        return None
    return _native_move(tp, "all_to_all", inp.dtype)


def native_broadcast_call(tp: Transport, t: torch.Tensor, src, root_tensor) -> Optional[tuple]:
    """``ProcessGroup.broadcast([t], opts)`` (group-local ``src = opts.rootRank``)."""
    semantics.check_root("broadcast", "src", src, tp.size)
    return None if root_tensor != 0 or t.numel() == 0 else _native_move(tp, "broadcast", t.dtype)


def _ag_list_native(tp: Transport, dtype: torch.dtype, shapes: Sequence[tuple]) -> bool:
    """Whether ``dist.all_gather`` (the list form) goes to the backend's own list all_gather: a function of what every
    rank shares (the transport, the dtype, every rank's output shape). gloo's takes one shape for every output."""
    caps = tp.caps
    return ("all_gather" in tp.list_forms and caps.has("all_gather") and caps.moves(dtype)
            and (len(set(shapes)) == 1 or caps.uneven_all_gather))


def native_all_gather_list_call(tp: Transport, outs: tuple, inp: torch.Tensor) -> Optional[tuple]:
    """``ProcessGroup.allgather([outs], [inp], opts)`` (``dist.all_gather``; ``outs``: each output's (dtype, shape))
    as the backend's list form, which wants this rank's input in its output's shape."""
    if (len(outs) != tp.size or any(d != inp.dtype for d, _ in outs) or outs[tp.rank][1] != inp.shape
            or not any(math.prod(s) for _, s in outs) or not _ag_list_native(tp, inp.dtype, [s for _, s in outs])):
        return None
    return ("all_gather", "", inp.dtype)


def native_p2p_call(tp: Transport, opname: str, t: torch.Tensor, peer) -> Optional[tuple]:
    """``ProcessGroup.send([t], dst, tag)`` or ``recv([t], src, tag)`` (``opname``)."""
    semantics.check_root(opname, "dst" if opname == "send" else "src", peer, tp.size)
    return None if peer == tp.rank else _native_move(tp, "send_recv", t.dtype)


def native_rooted_call(tp: Transport, opname: str, root, sig: Optional[tuple], t: torch.Tensor) -> Optional[tuple]:
    """``ProcessGroup.gather([outs] on the root, else [], [inp], opts)`` or ``scatter([out], [inps] on the root, else
    [], opts)`` (``opname``; ``sig``: the root's list's (dtype, shape)s; ``root = opts.rootRank``, group-local)."""
    semantics.check_root(opname, "dst" if opname == "gather" else "src", root, tp.size)
    if t.numel() == 0 or tp.rank == root and (sig is None or len(sig) != tp.size
                                              or any(dtype != t.dtype or shape != t.shape for dtype, shape in sig)):
        return None
    return _native_move(tp, opname, t.dtype)


def native_barrier_call(tp: Transport) -> Optional[tuple]:
    """``ProcessGroup.barrier(opts)``."""
    return ("barrier", "", None) if tp.caps.has("barrier") else None


# -- all_gather --------------------------------------------------------------------------------------------------------
@_entry
@_mx_as_bytes
def all_gather_into_tensor(tp: Transport, out: torch.Tensor, inp: torch.Tensor) -> Pending:
    shape = semantics.check_all_gather("all_gather_into_tensor", out, inp, tp.size)
    if out.numel() == 0:
        return Pending()  # nothing to send: complete at once
    inp = _flat(inp.contiguous())
    return _with_contig_out(out, lambda o: _ag(tp, o.view(shape), inp))


@_entry
@_mx_as_bytes
def all_gather_into_tensor_coalesced(tp: Transport, outs: Sequence[torch.Tensor],
                                     inps: Sequence[torch.Tensor]) -> Pending:
    """One flat buffer per dtype, one all_gather each."""
    if len(outs) != len(inps):
        raise ValueError(f"funcoll.all_gather_into_tensor_coalesced: {len(outs)} outputs for {len(inps)} inputs")
    for o, i in zip(outs, inps):
        semantics.check_all_gather("all_gather_into_tensor_coalesced", o, i, tp.size)
    n = tp.size

    def many(os_, ins) -> Pending:
        flat = torch.cat([i.reshape(-1) for i in ins])
        g = flat.new_empty((n * flat.numel(),))
        return _ag(tp, g, flat).and_then(functools.partial(_unflatten, g.view(n, -1), os_))

    return _coalesced(outs, inps, lambda o, i: _with_contig_out(o, lambda w: _ag(tp, w, _flat(i.contiguous()))), many)


# -- all_to_all --------------------------------------------------------------------------------------------------------
def _agree(tp: Transport, values: Sequence[int]) -> torch.Tensor:
    """Gathers a few int64 values from every rank: returns an [n, len(values)] tensor (CPU)."""
    # on the host, then moved: the one host tensor funcoll makes
    mine = torch.tensor(list(values), dtype=torch.int64).to(getattr(tp, "control_device", None) or "cpu")
    g = mine.new_empty((tp.size * mine.numel(),))
    _ag(tp, g, mine).wait()
    return g.view(tp.size, -1).cpu()


def _a2a(tp: Transport, out: torch.Tensor, inp: torch.Tensor, out_splits, in_splits, given: bool) -> Pending:
    caps = tp.caps
    if not given:
        return _a2a_even(tp, out, inp)
    if caps.uneven_all_to_all:
        return Pending([tp.all_to_all(_bits(out, caps), _bits(inp, caps), out_splits, in_splits)])
    # split sizes given, no uneven all_to_all: every rank takes this path, whatever its own splits (a rank whose splits
    # are all equal cannot know that its peers' are)
    bound = tp.split_bound()
    local = out_splits + in_splits
    if bound is not None and max(local) > bound:
        raise ValueError(f"funcoll.all_to_all_single: a split size ({max(local)}) exceeds the static split "
                         f"bound {bound} promised by funcoll.xla.static_split_bound; raise the bound")
    if caps.has("send_recv") and caps.p2p_any_shape and caps.has("all_to_all") and caps.moves(torch.uint8):
        return _planned_a2a(tp, out, inp, out_splits, in_splits, bound)
    if caps.has("send_recv") and caps.p2p_any_shape and bound is None:
        return _pairwise_a2a(tp, out, inp, out_splits, in_splits)
    if bound is not None:
        _note(f"uneven all_to_all=pad to static bound {bound}+even all_to_all+unpad")
        return _padded_a2a(tp, out, inp, out_splits, in_splits, bound)
    values = [max(local), -min(local)]
    agreed = tp.agreed(values) if tp.virtual else _agree(tp, values)  # a virtual world: funcoll.replicas knows them
    if agreed is None:
        world = getattr(tp, "world_size", "?")
        raise ValueError(
            f"funcoll.all_to_all_single: split sizes on a virtual XLA world ({world} ranks in a "
            f"process whose XLA runtime has fewer replicas) need a static bound: wrap the call in "
            f"funcoll.xla.static_split_bound(bound). Without one, the ranks agree on the largest "
            f"split with a collective that must run, and a virtual world cannot run collectives")
    chunk, smallest = int(agreed[:, 0].max()), -int(agreed[:, 1].max())
    if chunk == smallest:  # every rank's every split: a decision every rank makes from the same agreed values
        _note("splits even on every rank: even all_to_all")
        return _a2a_even(tp, out, inp)
    _note(f"uneven all_to_all=pad to {chunk}+even all_to_all+unpad")
    return _padded_a2a(tp, out, inp, out_splits, in_splits, chunk)


_A2A_TAG = 0x46430000  # funcoll's own point-to-point tag, apart from users' send/recv tags


def _sends_first(rank: int, k: int, n: int) -> bool:
    """In round ``k`` of a pairwise exchange (send to rank+k, receive from rank-k), whether this rank sends before it
    receives: alternating along each cycle of x -> x+k, so that no cycle of ranks all send first and wait on each
    other (a transport whose large sends wait for the matching receive cannot deadlock)."""
    g = math.gcd(n, k)
    cycle = n // g
    pos = ((rank - rank % g) // g * pow(k // g, -1, cycle)) % cycle if cycle > 1 else 0
    return pos % 2 == 0


def _pairwise_a2a(tp: Transport, out, inp, out_splits, in_splits) -> Pending:
    """Uneven all_to_all as n-1 rounds of one send and one receive per rank, each message exactly its split: the
    bytes of a native alltoallv, no agreement, no padding."""
    _note(planner.A2aPlan(planner.PAIRWISE).note())
    n, r, caps = tp.size, tp.rank, tp.caps
    if out_splits[r] != in_splits[r]:
        raise ValueError(f"funcoll.all_to_all_single: this rank sends itself {in_splits[r]} rows "
                         f"(input_split_sizes[{r}]) but expects {out_splits[r]} (output_split_sizes[{r}])")
    ioff, ooff = _offsets(in_splits), _offsets(out_splits)
    if in_splits[r]:
        out[ooff[r]:ooff[r] + out_splits[r]].copy_(inp[ioff[r]:ioff[r] + in_splits[r]])
    handles = []
    for k in range(1, n):
        dst, src = (r + k) % n, (r - k) % n
        both = [(tp.send, inp[ioff[dst]:ioff[dst] + in_splits[dst]], dst),
                (tp.recv, out[ooff[src]:ooff[src] + out_splits[src]], src)]
        for issue, rows, peer in both if _sends_first(r, k, n) else both[::-1]:
            if rows.shape[0]:  # nothing to send or receive: no message
                handles.append(issue(_bits(rows, caps), peer, _A2A_TAG))
    return Pending(handles)


# a transport's ``_funcoll_carried``: per key (row bytes, device), the reader of every rank's split statistics as the
# last carried exchange of the key left them in its chunk headers (it waits for that exchange): what the next exchange
# of the key plans with, the same on every rank; at most this many keys
_CARRIED_KEYS = 64


def _planned_a2a(tp: Transport, out, inp, out_splits, in_splits, bound) -> Pending:
    """Uneven all_to_all on a transport with point-to-point messages of any size and an even all_to_all, by the
    planner's :func:`~funcoll.algorithms.planner.a2a_plan`: pairwise in the smallest worlds, else the carried exchange,
    planned from every rank's split statistics as the previous exchange of the same row size carried them (no
    agreement), or as one small all_gather agrees them when there is none (the first call); under a promised
    ``static_split_bound`` the bound is the chunk: no agreement, no host read."""
    n, r = tp.size, tp.rank
    row_bytes = math.prod(inp.shape[1:]) * inp.element_size()
    if n <= planner.PAIRWISE_WORLD:
        return _pairwise_a2a(tp, out, inp, out_splits, in_splits)
    if out_splits[r] != in_splits[r]:
        raise ValueError(f"funcoll.all_to_all_single: this rank sends itself {in_splits[r]} rows "
                         f"(input_split_sizes[{r}]) but expects {out_splits[r]} (output_split_sizes[{r}])")
    state = tp.__dict__.setdefault("_funcoll_carried", {})
    key = (row_bytes, str(inp.device))
    known = state.get(key)
    # under a promised bound nothing is read on the host (an XPU graph capture can hold the call): the bound is the
    # chunk; else the statistics the previous exchange carried, or the agreement
    stats = known() if known is not None and bound is None else None
    mine = planner.split_stats(in_splits)
    if stats is None and bound is None:
        _note("uneven all_to_all=agree on split statistics")
        stats = tuple(map(tuple, _agree(tp, mine).tolist()))
    p = planner.a2a_plan(n, stats, row_bytes, bound)
    _note(p.note())
    pending, read = _carried_a2a(tp, out, inp, out_splits, in_splits, p.chunk, mine, row_bytes)
    if len(state) >= _CARRIED_KEYS and key not in state:
        state.pop(next(iter(state)))
    state[key] = read
    return pending


def _carried_a2a(tp: Transport, out, inp, out_splits, in_splits, chunk: int, mine, row_bytes: int):
    """One even all_to_all of byte chunks, chunk j headed by this rank's split statistics ``mine`` and holding the
    first ``chunk`` rows it sends rank j (zeros after them), and the rows above ``chunk`` of every split as one group of
    send/recv, sends first; returns the Pending and the reader of every rank's statistics from the received headers
    (which waits for the exchange). Each side is a fixed number of tensor calls whatever the world: the pieces are
    views from one ``split`` each, joined by one ``cat`` (the output's, in place: the chunks received, this rank's own
    rows and the rows above the chunk, received beside it)."""
    n, r = tp.size, tp.rank
    head = planner.A2A_HEADER
    ib, ob = inp.reshape(-1).view(torch.uint8), out.reshape(-1).view(torch.uint8)
    width = head + chunk * row_bytes
    # the rows this rank sends rank j, cut in two: the first ``chunk`` (none of its own) and the rest
    cut_in = [min(s, chunk) if j != r else 0 for j, s in enumerate(in_splits)]
    cut_out = [min(s, chunk) if j != r else 0 for j, s in enumerate(out_splits)]
    sent = ib.split([b * row_bytes for k, s in zip(cut_in, in_splits) for b in (k, s - k)])
    pads = ib.new_zeros((sum(chunk - k for k in cut_in) * row_bytes,)).split([(chunk - k) * row_bytes for k in cut_in])
    header = torch.tensor(mine, dtype=torch.int64).view(torch.uint8).to(ib.device)
    send = torch.cat([x for j in range(n) for x in (header, sent[2 * j], pads[j])])
    recv = send.new_empty((n * width,))
    a2a = tp.all_to_all(recv, send, None, None)
    got = recv.split([b for k in cut_out for b in (head, k * row_bytes, width - head - k * row_bytes)])
    over_sizes = [(s - k) * row_bytes if j != r else 0 for j, (k, s) in enumerate(zip(cut_out, out_splits))]
    over = ob.new_empty((sum(over_sizes),)).split(over_sizes)
    ops = [P2P(True, sent[2 * j + 1], j, _A2A_TAG) for j in range(n) if j != r and in_splits[j] > chunk]
    ops += [P2P(False, over[j], j, _A2A_TAG) for j in range(n) if j != r and out_splits[j] > chunk]
    handles = [a2a] + (tp.p2p_group(ops) if ops and row_bytes else [])
    box: dict = {"recv": recv, "heads": None}  # the headers alone are kept once the exchange is complete

    def read():
        heads = box["heads"]
        if heads is None:
            wait_quietly(a2a)
            heads = box["recv"].view(n, width)[:, :head]
        return tuple(map(tuple, heads.contiguous().view(torch.int64).cpu().tolist()))  # the one host read

    def unpad():
        pieces = [x for j in range(n) for x in ((got[3 * j + 1], over[j]) if j != r else (sent[2 * r + 1],))]
        if ob.numel():
            torch.cat(pieces, out=ob)
        box["heads"], box["recv"] = recv.view(n, width)[:, :head].clone(), None

    return Pending(handles).and_then(unpad), read


def _padded_a2a(tp: Transport, out, inp, out_splits, in_splits, chunk: int) -> Pending:
    """Every split padded to ``chunk`` rows, one even all_to_all, the padding cut off (pieces joined with cat: no
    writes into slices, which a lazy transport would have to replay). The exchange depends on ``chunk`` alone: a rank
    whose splits are all ``chunk`` already holds the padded layout and sends its tensors as they are."""
    if all(s == chunk for s in out_splits + in_splits):
        return _a2a_even(tp, out, inp)
    padded = torch.cat([_padded_to(inp[off:off + s], chunk) for off, s in zip(_offsets(in_splits), in_splits)])
    recv = padded.new_empty(padded.shape)

    def unpad():
        outs = [recv[j * chunk:j * chunk + s] for j, s in enumerate(out_splits) if s]
        if outs:
            out.copy_(torch.cat(outs) if len(outs) > 1 else outs[0])

    return _a2a_even(tp, recv, padded).and_then(unpad)


@_entry
@_mx_as_bytes
def all_to_all_single(tp: Transport, out: torch.Tensor, inp: torch.Tensor, output_split_sizes=None,
               input_split_sizes=None) -> Pending:
    # whether split sizes are passed is part of the call every rank shares (as NCCL's and gloo's alltoall_base read
    # it: no lists, the even exchange; lists, the uneven one); their values are not: the plan never reads whether
    # this rank's happen to be equal (torch's functional all_to_all_single always passes lists)
    given = bool(output_split_sizes) or bool(input_split_sizes)
    out_splits, in_splits = semantics.check_all_to_all("all_to_all_single", out, inp, output_split_sizes,
                                               input_split_sizes, tp.size)
    inp = inp.contiguous()
    return _with_contig_out(out, lambda o: _a2a(tp, o, inp, out_splits, in_splits, given))


# -- broadcast, gather, scatter ----------------------------------------------------------------------------------------
def _bc(tp: Transport, t: torch.Tensor, src: int) -> Pending:
    caps = tp.caps
    if caps.has("broadcast"):
        return Pending([tp.broadcast(_bits(t, caps), src)])
    # no native broadcast (XLA, TorchTPU): the masked sum of the root's bits, the same program on every rank
    _note("broadcast=masked all_reduce")
    b = _summable(tp, t)
    return _masked_sum(tp, b, tp.rank_is(src, b), lambda got: _write_bits(tp, t, got))


@_entry
@_mx_as_bytes
def broadcast(tp: Transport, tensor: torch.Tensor, src: int) -> Pending:
    semantics.check_root("broadcast", "src", src, tp.size)
    if tensor.numel() == 0:
        return Pending()  # nothing to send: complete at once
    return _with_contig_out(tensor, lambda t: _bc(tp, t, src))


@_entry
@_mx_as_bytes
def gather(tp: Transport, outs: Optional[Sequence[torch.Tensor]], inp: torch.Tensor, dst: int) -> Pending:
    semantics.check_root("gather", "dst", dst, tp.size)
    if tp.rank == dst:
        semantics.check_root_list("gather", "output", outs, inp, tp.size)
    inp = inp.contiguous()
    caps = tp.caps
    outs = list(outs) if tp.rank == dst and outs is not None else []
    # the plan reads only what every rank shares (the backend, the dtype): the root's output layout changes only
    # the root's own copies (a plan only the root could evaluate would run different exchanges on the ranks)
    if caps.has("gather") and caps.moves(inp.dtype):
        if tp.rank != dst:
            return Pending([tp.gather(None, inp, dst)])
        return _with_contig_outs(outs, lambda work: Pending([tp.gather(work, inp, dst)]))
    # the rows gathered as the integers of their bits and cut there (on XLA's CPU runtime a bfloat16 slice can change
    # NaNs), each written into its output bit for bit
    _note("gather=all_gather")
    bits = _summable(tp, _flat(inp)).reshape(-1)
    g = bits.new_empty((tp.size * bits.numel(),))
    p = _ag(tp, g, bits)
    if tp.rank != dst:
        tp.retain(g)  # nobody reads it here, but the collective must run on this rank too
        return p

    def unpack() -> None:
        for o, row in zip(outs, g.view(tp.size, -1).unbind(0)):
            _write_bits(tp, o, row)

    return p.and_then(unpack)


@_entry
@_mx_as_bytes
def scatter(tp: Transport, out: torch.Tensor, inps: Optional[Sequence[torch.Tensor]], src: int) -> Pending:
    semantics.check_root("scatter", "src", src, tp.size)
    if tp.rank == src:
        semantics.check_root_list("scatter", "input", inps, out, tp.size)
    caps = tp.caps
    if caps.has("scatter") and caps.moves(out.dtype):
        ins = [t.contiguous() for t in inps] if tp.rank == src and inps is not None else None
        return _with_contig_out(out, lambda o: Pending([tp.scatter(o, ins, src)]))
    _note("scatter=broadcast+slice")
    n = tp.size
    if caps.has("broadcast"):  # a dtype the backend does not scatter but broadcasts (as bytes)
        buf = out.new_empty((n,) + tuple(out.shape))
        if tp.rank == src and inps is not None:
            torch.stack(list(inps), out=buf)
        return _bc(tp, buf, src).and_then(lambda: out.copy_(buf[tp.rank]))
    # stacked as the integers of their bits (XLA's CPU compiler concatenates bfloat16 through float32, which can change
    # NaNs), this rank's row selected in those integers by device data (the same program on every rank)
    _note("broadcast=masked all_reduce")
    if tp.rank == src and inps is not None:
        rows = torch.stack([_summable(tp, t.contiguous()).reshape(-1) for t in inps])
    else:
        rows = _summable(tp, out.new_empty((n,) + tuple(out.shape))).reshape(n, -1)
    return _masked_sum(tp, rows, tp.rank_is(src, rows), lambda got: _write_bits(
        tp, out, got.view(n, -1).index_select(0, tp.rank_index(got))))


# -- point-to-point and barrier ----------------------------------------------------------------------------------------
@_entry
@_mx_as_bytes
def send(tp: Transport, tensor: torch.Tensor, dst: int, tag: int = 0) -> Pending:
    semantics.check_root("send", "dst", dst, tp.size)
    if dst == tp.rank:
        raise ValueError(f"funcoll.send: dst={dst} is the calling rank; send to another rank")
    return Pending([tp.send(_bits(tensor.contiguous(), tp.caps), dst, tag)])


@_entry
@_mx_as_bytes
def recv(tp: Transport, tensor: torch.Tensor, src: int, tag: int = 0) -> Pending:
    semantics.check_root("recv", "src", src, tp.size)
    if src == tp.rank:
        raise ValueError(f"funcoll.recv: src={src} is the calling rank; receive from another rank")
    p = _with_contig_out(tensor, lambda t: Pending([tp.recv(_bits(t, tp.caps), src, tag)]))
    p._source = src
    return p


@_entry
def barrier(tp: Transport) -> Pending:
    if tp.caps.has("barrier"):
        return Pending([tp.barrier()])
    _note("barrier=all_reduce of one element")
    one = torch.zeros(1, dtype=torch.int32, device=getattr(tp, "control_device", None) or "cpu")
    p = _ar(tp, one, Reduction(ReduceOp.SUM))
    tp.retain(one)
    return p


# -- list forms of the eager API (allgather, alltoall with tensor lists) -----------------------------------------------
@_entry
@_mx_as_bytes
def all_gather(tp: Transport, outs: Sequence[torch.Tensor], inp: torch.Tensor) -> Pending:
    """``dist.all_gather``: every rank's ``inp`` lands in ``outs[rank]``; ``outs[r]`` has rank r's input size, which may
    differ per rank (as NCCL and XCCL serve the list form)."""
    sizes = semantics.check_rank_list("all_gather", "output", outs, inp, tp.size, tp.rank)
    if not any(sizes):
        return Pending()  # nothing to send on any rank (every rank sees every size): complete at once
    flat = inp.contiguous().reshape(-1)
    if _ag_list_native(tp, inp.dtype, [tuple(o.shape) for o in outs]):
        # the backend's own list form, whatever the layouts: the exchange the fast path issues on another rank
        mine = flat.view(outs[tp.rank].shape)
        return _with_contig_outs(outs, lambda work: Pending([tp.all_gather_list(work, mine)]))
    n, big, total = tp.size, max(sizes), sum(sizes)
    if len(set(sizes)) == 1:
        g = flat.new_empty((n * flat.numel(),))
        return _ag(tp, g, flat).and_then(lambda: _unflatten(g, outs))
    if n * big > 2 * total and tp.caps.has("broadcast"):
        # padding would more than double the bytes: one broadcast per rank, as NCCL's and XCCL's uneven all_gather
        _note("uneven all_gather=broadcast per rank")
        bufs = [flat if q == tp.rank else flat.new_empty((s,)) for q, s in enumerate(sizes)]
        p = Pending([_bc(tp, b, q) for q, b in enumerate(bufs) if b.numel()])
        return p.and_then(lambda: _unflatten(torch.cat(bufs), outs))
    # every size is in every rank's list: no agreement, no host sync (XLA)
    _note(f"uneven all_gather=pad to {big}+all_gather+unpad")
    g = flat.new_empty((n * big,))
    return _ag(tp, g, _padded_to(flat, big)).and_then(lambda: _unflatten(
        torch.cat([g[q * big:q * big + s] for q, s in enumerate(sizes)]), outs))


@_entry
@_mx_as_bytes
def all_to_all(tp: Transport, outs: Sequence[torch.Tensor], inps: Sequence[torch.Tensor]) -> Pending:
    """``dist.all_to_all``: ``inps[j]`` goes to rank j and lands in its ``outs[rank]``; sizes may differ."""
    n = tp.size
    if len(outs) != n or len(inps) != n:
        raise ValueError(f"funcoll.all_to_all: expected {n} output and {n} input tensors, "
                         f"got {len(outs)} and {len(inps)}")
    dtype = inps[0].dtype
    for t in list(inps) + list(outs):
        if t.dtype != dtype:
            raise TypeError(f"funcoll.all_to_all: all tensors must have dtype {dtype}, found {t.dtype}")
    flat_in = torch.cat([t.reshape(-1) for t in inps])
    out_splits = [o.numel() for o in outs]
    flat_out = flat_in.new_empty((sum(out_splits),))
    in_splits = [t.numel() for t in inps]
    return _a2a(tp, flat_out, flat_in, out_splits, in_splits, True).and_then(lambda: _unflatten(flat_out, outs))
