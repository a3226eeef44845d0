"""The algorithms layer: every collective's full semantics, built from a transport's native primitives.

One function per collective, named as the op (``dist.<op>`` / ``_c10d_functional.<op>``): the reducing ones in
:mod:`~funcoll.algorithms.reduce`, the others in :mod:`~funcoll.algorithms.move` and :mod:`~funcoll.algorithms.p2p`.
Each validates through :mod:`funcoll.semantics`, then asks the transport's ``Capabilities`` whether the request is
native; if not, it runs the strategy :mod:`funcoll.algorithms.planner` lists (once, for every device). All ranks are
group-local. Every function returns a :class:`Pending` (:mod:`~funcoll.algorithms.pending`): waiting on it waits on the
native handles, then runs the local finishing steps. This module is their one flat table: every name the other layers
use is ``funcoll.algorithms.<name>``."""

from funcoll.algorithms.move import (
    all_gather,
    all_gather_into_tensor,
    all_gather_into_tensor_coalesced,
    all_to_all,
    all_to_all_single,
    barrier,
    broadcast,
    gather,
    native_all_gather_call,
    native_all_gather_list_call,
    native_all_to_all_call,
    native_barrier_call,
    native_broadcast_call,
    native_p2p_call,
    native_rooted_call,
    recv,
    scatter,
    send,
)
from funcoll.algorithms.p2p import P2P, Batch, batch_isend_irecv, p2p_op
from funcoll.algorithms.pending import Pending, record, this_call, watched
from funcoll.algorithms.reduce import (
    all_reduce,
    all_reduce_coalesced,
    native_all_reduce,
    native_all_reduce_call,
    native_reduce_scatter_call,
    native_reduce_scatter_list_call,
    reduce,
    reduce_scatter,
    reduce_scatter_tensor,
    reduce_scatter_tensor_coalesced,
)

__all__ = [  # one function per op, named as the op
    "Pending", "record", "all_reduce", "all_reduce_coalesced", "all_gather_into_tensor",
    "all_gather_into_tensor_coalesced", "reduce_scatter_tensor", "reduce_scatter_tensor_coalesced",
    "all_to_all_single", "all_gather", "reduce_scatter", "all_to_all", "broadcast", "reduce", "gather", "scatter",
    "send", "recv", "barrier",
    # a group of point-to-point operations (batch_isend_irecv), issued in an order that cannot deadlock
    "P2P", "Batch", "p2p_op", "batch_isend_irecv",
    # the fast paths: is this request's plan one native call? (None: no; else the call, for Transport.native_method)
    "native_all_reduce", "native_all_reduce_call", "native_all_gather_call", "native_reduce_scatter_call",
    "native_all_to_all_call", "native_broadcast_call", "native_all_gather_list_call", "native_reduce_scatter_list_call",
    "native_p2p_call", "native_rooted_call", "native_barrier_call", "watched", "this_call",
]
