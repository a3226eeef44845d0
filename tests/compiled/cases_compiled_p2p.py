"""Rank-side cases for tests/compiled/test_compiled_p2p.py: point-to-point calls inside torch.compile on a funcoll
world.

torch 2.15's Dynamo rewrites ``dist.isend``/``dist.irecv`` and ``dist.batch_isend_irecv`` into the functional ops
``_c10d_functional.isend``/``irecv``/``batch_p2p_ops`` when ``torch._dynamo.config.enable_p2p_compilation`` is on
(``TORCHDYNAMO_ENABLE_P2P_COMPILATION=1``). Their kernels call the group's send/recv, so on a funcoll group they run
funcoll's. Each function runs eagerly and compiled (aot_eager and inductor); the numbers are checked against a
reference rebuilt from every rank's inputs, and the graph's p2p nodes are listed.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from funcoll import testing
from tests import reference as ref


def _inputs(rank):
    return ref.make(torch.float32, (3, 2), rank, "p2p-x"), ref.make(torch.int64, (4,), rank, "p2p-y")


def pair(x, y):
    """Rank 0 sends ``x * 2`` to rank 1 and receives rank 1's ``y``; rank 1 the other way round."""
    rank = dist.get_rank()
    got = torch.empty_like(y)
    if rank == 0:
        s = dist.isend(x * 2, 1)
        r = dist.irecv(got, 1)
    else:
        r = dist.irecv(x, 0)  # received in place into x
        s = dist.isend(y + 1, 0)
    s.wait()
    r.wait()
    return x, got


def ring(x, y, group=None):
    """batch_isend_irecv around the ring: each rank sends its x to the next and receives the previous one's."""
    rank, n = dist.get_rank(), dist.get_world_size()
    got = torch.empty_like(x)
    ops = [dist.P2POp(dist.isend, x + rank, (rank + 1) % n, group),
           dist.P2POp(dist.irecv, got, (rank - 1) % n, group)]
    for w in dist.batch_isend_irecv(ops):
        w.wait()
    return got * 3


def _pair_reference(rank):
    (x0, _y0), (_x1, y1) = _inputs(0), _inputs(1)
    return (x0, y1 + 1) if rank == 0 else (x0 * 2, torch.empty(0))


def _ring_reference(rank, n):
    prev = (rank - 1) % n
    return (_inputs(prev)[0] + prev) * 3


def _p2p_nodes(cap):
    """The graph count and the rendered forward graph (one graph: no break)."""
    return len(cap.forward), cap.text()


BACKENDS = ("eager-mode", "aot_eager", "inductor")


def compiled_p2p(rank, n):
    import torch._dynamo

    torch._dynamo.config.enable_p2p_compilation = True
    gloo = dist.new_group(backend="gloo")
    out = {"failures": [], "nodes": {}}

    def check(name, got, want):
        problem = ref.close(got, want)
        if problem:
            out["failures"].append(f"rank {rank} {name}: {problem}")

    for backend in BACKENDS:
        if n == 2:
            x, y = _inputs(rank)
            if backend == "eager-mode":
                gx, gy = pair(x, y)
            else:
                cap = testing.capture_graphs(pair, x, y, backend=backend)
                gx, gy = cap.result
                out["nodes"][f"pair {backend}"] = _p2p_nodes(cap)
            wx, wy = _pair_reference(rank)
            check(f"pair {backend} x", gx, wx)
            if rank == 0:
                check(f"pair {backend} got", gy, wy)
        x, y = _inputs(rank)
        if backend == "eager-mode":
            g = ring(x, y)
        else:
            cap = testing.capture_graphs(ring, x, y, backend=backend)
            g = cap.result
            out["nodes"][f"ring {backend}"] = _p2p_nodes(cap)
        check(f"ring {backend}", g, _ring_reference(rank, n))
        if backend == "aot_eager":  # a group of another backend keeps torch's own kernel
            g = testing.capture_graphs(ring, x, y, gloo, backend=backend).result
            check("ring aot_eager gloo group", g, _ring_reference(rank, n))
        dist.barrier()
    return out


def main(rank, n):
    return compiled_p2p(rank, n)
