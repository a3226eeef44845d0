"""One row per c10d method that :class:`~funcoll.entry.process_group.ProcessGroupFuncoll` serves (as torch's
``_functional_collectives.py`` keeps one flat registration table): its op, how its call is described
(:mod:`funcoll.entry.fingerprint`), the argument it sends, its fast path (:mod:`funcoll.entry.fast_path`) and what
the fast path's Work completes with. The pipeline's decorator finds a method's row by the method's own name, and the
row object, not its name, travels to the fingerprint, the NaN check and the trace; the fast path hands the transport
the row's backend method to call (so no transport keeps a table of method names). A new method with a fast path is
one row here plus its body in process_group.py.
"""

from __future__ import annotations

import copy
import operator
from typing import Callable, Dict, Optional, Tuple

import torch

from funcoll import algorithms
from funcoll.entry import fast_path as fast
from funcoll.entry import fingerprint as fp
from funcoll.entry.fingerprint import RULES

__all__ = ["MethodRow", "METHODS", "ALIASES"]

_C = torch._C._distributed_c10d
_first_list = operator.itemgetter(0)  # the outputs of a call whose first argument is its list of outputs


class MethodRow:
    """One c10d method: ``method`` its name (the one torch 2.15's c10d calls), ``backend_method`` the backend's method
    of the same request (the same name, or the older one the C++ backends keep, which torch 2.9's c10d calls the group
    by too), ``aliases`` the other names c10d calls it by, ``op`` its collective, ``fingerprint(pg, args)``
    its call's description (args positional, options last), ``sends`` the index of the argument it sends (None:
    nothing of its own; the NaN check reads it), ``p2p`` whether it is point-to-point (its op's rule),
    ``fast(pg, state, row, args, kwargs)`` its fast path (None: always the full path), and for the fast path's Work:
    ``outputs(args)``, what its future completes with where the backend's Work has no future and no result() (gloo's
    send, recv and reduce_scatter), and ``quiet``: its backend writes the outputs in wait() (gloo's reduce_scatter
    copies its slice then: waited on with autograd off)."""

    __slots__ = ("method", "backend_method", "aliases", "op", "fingerprint", "sends", "p2p", "fast", "outputs", "quiet")

    def __init__(self, method: str, op: str, fingerprint: Callable, sends: Optional[int] = 1,
                 fast: Optional[Callable] = None, outputs: Optional[Callable] = None, quiet: bool = False,
                 backend: Optional[str] = None, aliases: Tuple[str, ...] = ()):
        self.method, self.backend_method = method, backend or method
        self.aliases = aliases + ((backend,) if backend else ())
        self.op, self.fingerprint, self.sends, self.p2p = op, fingerprint, sends, RULES[op].p2p
        self.fast, self.outputs, self.quiet = fast, outputs, quiet

    def __repr__(self) -> str:
        return f"MethodRow({self.method!r}, op={self.op!r})"


def _plain(method: str, op: str, sends: int = 1, mine: int = 0, other: Optional[int] = None, red: bool = False,
           root: bool = False, **row) -> MethodRow:
    """A method ``(mine[, other], opts)`` whose fields every rank shares (:func:`funcoll.entry.fingerprint.plain`)."""
    return MethodRow(method, op, fp.plain(op, mine, other, red, root), sends, **row)


_ROWS = (
    _plain("allreduce", "all_reduce", 0, red=True, fast=fast.all_reduce),
    _plain("allreduce_coalesced", "all_reduce_coalesced", 0, red=True),
    _plain("all_gather_single", "all_gather_into_tensor", mine=1, other=0, backend="_allgather_base",
           fast=fast.base(_C.AllgatherOptions, algorithms.native_all_gather_call, False)),
    MethodRow("allgather", "all_gather", fp.sized_list("all_gather", "input_shape", "output_shapes", True),
              fast=fast.list_form(_C.AllgatherOptions, algorithms.native_all_gather_list_call, True)),
    _plain("all_gather_single_coalesced", "all_gather_into_tensor_coalesced", mine=1, other=0,
           backend="allgather_into_tensor_coalesced"),
    _plain("allgather_coalesced", "all_gather_coalesced", mine=1, other=0),
    _plain("reduce_scatter_single", "reduce_scatter_tensor", mine=1, other=0, red=True, outputs=lambda a: [a[0]],
           quiet=True, backend="_reduce_scatter_base",
           fast=fast.base(_C.ReduceScatterOptions, algorithms.native_reduce_scatter_call, True)),
    MethodRow("reduce_scatter", "reduce_scatter",
              fp.sized_list("reduce_scatter", "output_shape", "input_shapes", False), outputs=_first_list, quiet=True,
              fast=fast.list_form(_C.ReduceScatterOptions, algorithms.native_reduce_scatter_list_call, False)),
    _plain("reduce_scatter_single_coalesced", "reduce_scatter_tensor_coalesced", mine=1, other=0, red=True,
           backend="reduce_scatter_tensor_coalesced"),
    MethodRow("all_to_all_single", "all_to_all_single", fp.a2a_single, fast=fast.all_to_all_single,
              backend="alltoall_base"),
    MethodRow("alltoall", "all_to_all", fp.a2a),
    _plain("broadcast", "broadcast", 0, root=True, fast=fast.broadcast),
    _plain("reduce", "reduce", 0, red=True, root=True),
    MethodRow("gather", "gather", fp.rooted("gather", "root_outputs"), fast=fast.rooted(_C.GatherOptions, False)),
    MethodRow("scatter", "scatter", fp.rooted("scatter", "root_inputs"), fast=fast.rooted(_C.ScatterOptions, True)),
    MethodRow("gather_single", "gather_single", fp.gather_single, aliases=("gather_into_tensor",)),
    MethodRow("barrier", "barrier", fp.barrier, None, fast=fast.barrier),
    MethodRow("send", "send", fp.p2p("send"), 0, fast=fast.p2p, outputs=_first_list),
    MethodRow("recv", "recv", fp.p2p("recv"), None, fast=fast.p2p, outputs=_first_list),
    MethodRow("recv_anysource", "recv", fp.recv_any, None),
)
METHODS: Dict[str, MethodRow] = {row.method: row for row in _ROWS}

# a row's aliases (its backend method's name among them, which torch 2.9's c10d calls): each inherits the row under its
# own name (and ProcessGroupFuncoll runs the row's body under it)
ALIASES = {alias: row.method for row in _ROWS for alias in row.aliases}
for _alias, _method in ALIASES.items():
    METHODS[_alias] = copy.copy(METHODS[_method])
    METHODS[_alias].method = _alias
del _alias, _method
