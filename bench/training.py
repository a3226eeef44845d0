"""Training steps as users run them, on a funcoll group and on c10d's stock path in the same 2-rank world.

Each row builds the same model twice from the same seed, one on the world's funcoll group and one on c10d's stock
ProcessGroup over the very gloo backend funcoll's group uses (:func:`bench.overhead.stock_group`), then times
alternating blocks of steps (which side goes first alternates; each rank pinned to a CPU of its own) and reports the
median of the per-block ratios funcoll / stock with its quartiles and a 95% interval of that median. Every step's
loss is compared between the two sides: the row records whether they were equal bit for bit (they should be: the
same collectives on the same data).

Rows: DDP (plain and with ``bf16_compress_hook``), FSDP2 (fp32, and bf16 mixed precision), tensor parallel with
sequence parallel (a two-layer MLP, colwise then rowwise, sequence-sharded around it), and a ZeRO-like loop written
with plain ``dist.*`` (reduce_scatter of the flat gradient, a local SGD step on this rank's shard, all_gather of the
parameters, a broadcast of a step counter). The defaults are funcoll's (no size guard, no debug mode).

``./dev python -m bench.training [blocks] [row name ...]`` runs the table alone; ``./dev bench`` includes it.
"""

from __future__ import annotations

import os
import sys

import torch

STEPS = 10  # steps per timed block
DIM, BATCH = 64, 16


def _mlp(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(DIM, 4 * DIM), torch.nn.ReLU(), torch.nn.Linear(4 * DIM, DIM))


def _batch(rank: int, step: int):
    g = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randn(BATCH, DIM, generator=g), torch.randn(BATCH, DIM, generator=g)


class _Side:
    """One side of a row: a step function over its own model and optimizer, and the losses it produced."""

    def __init__(self, step_fn):
        self.step_fn = step_fn
        self.losses: list = []
        self.i = 0

    def step(self):
        self.losses.append(float(self.step_fn(self.i)))
        self.i += 1


def _ddp(group, rank, hook=None):
    from torch.nn.parallel import DistributedDataParallel as DDP

    model = DDP(_mlp(0), process_group=group)
    if hook is not None:
        model.register_comm_hook(group, hook)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)

    def step(i):
        x, y = _batch(rank, i)
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        return loss.detach()

    return step


def _fsdp(group, rank, mixed=False):
    from torch.distributed.device_mesh import DeviceMesh

    try:
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    except ImportError:  # torch 2.9 keeps FSDP2 under _composable
        from torch.distributed._composable.fsdp import MixedPrecisionPolicy, fully_shard

    mesh = DeviceMesh.from_group(group, "cpu")
    model = _mlp(0)
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if mixed else None
    kw = {"mesh": mesh} if mp is None else {"mesh": mesh, "mp_policy": mp}
    for layer in (model[0], model[2]):
        fully_shard(layer, **kw)
    fully_shard(model, **kw)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)

    def step(i):
        x, y = _batch(rank, i)
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x).float(), y)
        loss.backward()
        opt.step()
        return loss.detach()

    return step


def _tp(group, rank):
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.tensor import Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleInput,
        RowwiseParallel,
        SequenceParallel,
        parallelize_module,
    )

    mesh = DeviceMesh.from_group(group, "cpu")

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.norm = torch.nn.LayerNorm(DIM)
            self.up = torch.nn.Linear(DIM, 4 * DIM)
            self.down = torch.nn.Linear(4 * DIM, DIM)

        def forward(self, x):
            h = self.norm(x)
            return x + self.down(torch.relu(self.up(h)))

    model = parallelize_module(Block(), mesh, {
        "norm": SequenceParallel(sequence_dim=0),  # the rows are the sequence: each rank normalises its own rows
        "up": ColwiseParallel(input_layouts=Shard(0)),  # all_gather of the rows, column shards of the weight
        "down": RowwiseParallel(output_layouts=Shard(0), use_local_output=False),  # reduce_scatter back to rows
    })
    model = parallelize_module(model, mesh, PrepareModuleInput(input_layouts=Shard(0), desired_input_layouts=Shard(0),
                                                               use_local_output=False))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)

    def step(i):
        x, y = _batch(0, i)  # tensor parallel: every rank sees the same batch, sharded along the sequence (dim 0)
        n = group.size()
        rows = x.shape[0] // n
        xs, ys = x[rank * rows:(rank + 1) * rows], y[rank * rows:(rank + 1) * rows]
        opt.zero_grad()
        out = model(xs)
        loss = torch.nn.functional.mse_loss(out.to_local() if hasattr(out, "to_local") else out, ys)
        loss.backward()
        opt.step()
        return loss.detach()

    return step


def _zero(group, rank):
    """ZeRO-like data parallel with plain dist.*: each rank owns 1/n of the flat parameters."""
    import torch.distributed as dist

    n = group.size()
    model = _mlp(0)
    params = list(model.parameters())
    numel = sum(p.numel() for p in params)
    pad = (-numel) % n
    shard = (numel + pad) // n
    flat = torch.cat([p.detach().reshape(-1) for p in params] + [torch.zeros(pad)])
    mine = flat[rank * shard:(rank + 1) * shard].clone()
    counter = torch.zeros(1, dtype=torch.int64)

    def load(full):
        off = 0
        with torch.no_grad():
            for p in params:
                p.copy_(full[off:off + p.numel()].view_as(p))
                off += p.numel()

    def step(i):
        x, y = _batch(rank, i)
        for p in params:
            p.grad = None
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        grads = torch.cat([p.grad.reshape(-1) for p in params] + [torch.zeros(pad)])
        g_mine = torch.empty(shard)
        dist.reduce_scatter_tensor(g_mine, grads, group=group)
        mine.sub_(g_mine, alpha=0.01 / n)
        full = torch.empty(shard * n)
        dist.all_gather_into_tensor(full, mine, group=group)
        load(full)
        counter.fill_(i if rank == 0 else -1)
        dist.broadcast(counter, dist.get_global_rank(group, 0), group=group)  # the step counter, from rank 0
        return loss.detach()

    return step


def _rows():
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    return [
        ("DDP", lambda g, r: _ddp(g, r)),
        ("DDP + bf16_compress_hook", lambda g, r: _ddp(g, r, default_hooks.bf16_compress_hook)),
        ("FSDP2 fp32", lambda g, r: _fsdp(g, r)),
        ("FSDP2 bf16 mixed precision", lambda g, r: _fsdp(g, r, mixed=True)),
        ("tensor parallel + sequence parallel", lambda g, r: _tp(g, r)),
        ("ZeRO-like dist.* loop", lambda g, r: _zero(g, r)),
    ]


def rank_main(rank: int, n: int, blocks: int, only=None) -> list:
    import torch.distributed as dist

    from bench.overhead import _pin_process, _unpin, forget_stock, paired, stock_group

    torch.set_num_threads(1)
    ours = dist.group.WORLD
    raw = stock_group(ours) or dist.new_group(backend="gloo")  # c10d's own path over funcoll's gloo backend
    rows = []
    for case, make in _rows():
        if only and case not in only:
            continue
        a, b = _Side(make(ours, rank)), _Side(make(raw, rank))
        # each rank on a CPU of its own, with its gloo threads (FUNCOLL_BENCH_PIN=0: the machine's scheduling): on 2
        # shared vCPUs, where each thread wakes decides a step's time more than the software does (measured: the
        # quartiles of a DDP step's ratio 0.90-1.35 unpinned, 0.98-1.25 pinned; FSDP2 0.94-1.16 and 0.91-1.07)
        pinned = _pin_process(rank % max(1, len(os.sched_getaffinity(0))))
        # overhead.paired: a warm-up step each (lazy init, connections), then alternating blocks of STEPS steps
        try:
            r = paired(b.step, a.step, blocks, k=STEPS)
        finally:
            _unpin(pinned)
        for key in ("ratios", "deltas", "cpu_deltas"):
            r.pop(key, None)
        rows.append({"case": f"train step: {case}", "bytes": 0, "world": n, **r,
                     "losses_equal": a.losses == b.losses, "steps": len(a.losses)})
    dist.barrier()
    forget_stock(raw)
    return rows


def run(blocks: int = 9, world: int = 2, only=None) -> list:
    from funcoll.launch import run_world

    print(f"[bench] training steps on a CPU world of {world}", file=sys.stderr, flush=True)
    return run_world("bench.training:rank_main", world, None, args=(blocks, only), timeout=1200)[0]


if __name__ == "__main__":
    from bench.report import table

    args = sys.argv[1:]
    only = tuple(a for a in args if not a.isdigit()) or None  # row names to run (default: all)
    rows = run(next((int(a) for a in args if a.isdigit()), 9), only=only)
    print(table(rows))
    for r in rows:
        print(f"{r['case']}: losses equal over {r['steps']} steps: {r['losses_equal']}")
