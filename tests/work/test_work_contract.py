"""Every Work funcoll returns keeps c10d's contract, for every op, strategy and profile: ``wait()`` (also twice, also
after ``get_future()``, also with a timeout), ``get_future()`` completing with the outputs (also where the wrapped
gloo backend has no future: send/recv, reduce_scatter), ``is_completed()`` turning True once the data is in place
without any ``wait()``, ``is_success()``/``exception()``, ``result()``, ``_source_rank()`` of a recv;
``torch.futures.collect_all`` over mixed Works; DDP with a reduce-scatter-based comm hook and with
``bf16_compress_hook`` trains to the numbers of DDP on raw gloo in the same world. Under the native profile the
native requests (all_reduce, all_gather and reduce_scatter in both forms, all_to_all_single, broadcast, barrier,
isend/irecv) take the eager fast path: its Works (NativeWork) are held to the same contract.
"""

from __future__ import annotations

import time
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist

from funcoll.launch import run_world
from tests import reference as ref

DEADLINE = 20.0  # seconds a Work may take to report completion by polling alone


def _cases(rank, n):
    """(name, issue) pairs: ``issue()`` starts the op with async_op=True and returns (Works, check), where ``check()``
    compares the outputs with the reference (None: right)."""
    cases = []
    peer = (rank + 1) % n

    def add(name):
        def deco(fn):
            cases.append((name, fn))
            return fn
        return deco

    for op in ("sum", "avg", "max", "bxor", "premul_sum"):
        dt = torch.int32 if op == "bxor" else torch.float32

        @add(f"all_reduce {op}")
        def _(op=op, dt=dt):
            xs = ref.all_inputs(n, dt, (5,), f"ar/{op}", "grid")
            t = xs[rank].clone()
            w = dist.all_reduce(t, op=ref.c10d_op(op), async_op=True)
            return [w], lambda: ref.close(t, ref.reduce(op, xs), n, op, "grid")

    @add("all_reduce bf16 avg")
    def _():
        xs = ref.all_inputs(n, torch.bfloat16, (6,), "arb", "grid")
        t = xs[rank].clone()
        w = dist.all_reduce(t, op=dist.ReduceOp.AVG, async_op=True)
        return [w], lambda: ref.close(t, ref.reduce("avg", xs), n, "avg", "grid")

    @add("all_reduce_coalesced")
    def _():
        a = ref.all_inputs(n, torch.float32, (3,), "arc1", "grid")
        b = ref.all_inputs(n, torch.float32, (2, 2), "arc2", "grid")
        ts = [a[rank].clone(), b[rank].clone()]
        opts = dist.AllreduceCoalescedOptions()
        opts.reduceOp = dist.ReduceOp.SUM
        w = dist.group.WORLD.allreduce_coalesced(ts, opts)  # the Work (dist.all_reduce_coalesced returns its future)
        return [w], lambda: ref.close(ts[0], ref.reduce("sum", a), n, "sum", "grid") or ref.close(
            ts[1], ref.reduce("sum", b), n, "sum", "grid")

    @add("all_gather_into_tensor")
    def _():
        xs = ref.all_inputs(n, torch.float16, (2, 3), "agt")
        out = torch.empty(2 * n, 3, dtype=torch.float16)
        w = dist.all_gather_into_tensor(out, xs[rank], async_op=True)
        return [w], lambda: ref.close(out, torch.cat(xs))

    @add("all_gather")
    def _():
        xs = ref.all_inputs(n, torch.uint16, (4,), "ag")
        outs = [torch.empty(4, dtype=torch.uint16) for _ in range(n)]
        w = dist.all_gather(outs, xs[rank], async_op=True)
        return [w], lambda: next((ref.close(o, x) for o, x in zip(outs, xs) if ref.close(o, x)), None)

    @add("all_gather native")  # float32: the eager fast path (one call of gloo's own list-form allgather)
    def _():
        xs = ref.all_inputs(n, torch.float32, (2, 2), "agn")
        outs = [torch.empty(2, 2) for _ in range(n)]
        w = dist.all_gather(outs, xs[rank], async_op=True)
        return [w], lambda: next((ref.close(o, x) for o, x in zip(outs, xs) if ref.close(o, x)), None)

    for op in ("sum", "avg", "min"):
        @add(f"reduce_scatter_tensor {op}")
        def _(op=op):
            xs = ref.all_inputs(n, torch.float32, (2 * n, 2), f"rst/{op}", "grid")
            out = torch.empty(2, 2)
            w = dist.reduce_scatter_tensor(out, xs[rank], op=ref.c10d_op(op), async_op=True)
            return [w], lambda: ref.close(out, ref.reduce(op, xs)[2 * rank:2 * rank + 2], n, op, "grid")

    @add("reduce_scatter")
    def _():
        xs = [ref.all_inputs(n, torch.int64, (3,), f"rs{j}") for j in range(n)]
        out = torch.empty(3, dtype=torch.int64)
        w = dist.reduce_scatter(out, [xs[j][rank] for j in range(n)], async_op=True)
        return [w], lambda: ref.close(out, ref.reduce("sum", xs[rank]))

    @add("all_to_all_single even")
    def _():
        xs = ref.all_inputs(n, torch.float32, (2 * n,), "a2a")
        out = torch.empty(2 * n)
        w = dist.all_to_all_single(out, xs[rank], async_op=True)
        return [w], lambda: ref.close(out, torch.cat([x[2 * rank:2 * rank + 2] for x in xs]))

    @add("all_to_all_single uneven")
    def _():
        rows = [[r + j + 1 for j in range(n)] for r in range(n)]
        xs = [ref.make(torch.float32, (sum(rows[r]),), r, "a2av") for r in range(n)]
        out = torch.empty(sum(rows[r][rank] for r in range(n)))
        w = dist.all_to_all_single(out, xs[rank], [rows[r][rank] for r in range(n)], rows[rank], async_op=True)
        want = torch.cat([xs[r][sum(rows[r][:rank]):sum(rows[r][:rank + 1])] for r in range(n)])
        return [w], lambda: ref.close(out, want)

    @add("all_to_all list")
    def _():
        xs = [[ref.make(torch.float32, (r + j + 1,), r, f"a2l{j}") for j in range(n)] for r in range(n)]
        outs = [torch.empty(r + rank + 1) for r in range(n)]
        w = dist.all_to_all(outs, xs[rank], async_op=True)
        return [w], lambda: next((ref.close(outs[r], xs[r][rank]) for r in range(n)
                                  if ref.close(outs[r], xs[r][rank])), None)

    @add("broadcast")
    def _():
        xs = ref.all_inputs(n, torch.bool, (7,), "bc")
        t = xs[rank].clone()
        w = dist.broadcast(t, src=n - 1, async_op=True)
        return [w], lambda: ref.close(t, xs[n - 1])

    @add("reduce")
    def _():
        xs = ref.all_inputs(n, torch.float32, (4,), "red", "grid")
        t = xs[rank].clone()
        w = dist.reduce(t, dst=0, op=dist.ReduceOp.MAX, async_op=True)
        return [w], lambda: ref.close(t, ref.reduce("max", xs)) if rank == 0 else None

    @add("gather")
    def _():
        xs = ref.all_inputs(n, torch.int8, (3,), "ga")
        outs = [torch.empty(3, dtype=torch.int8) for _ in range(n)] if rank == 0 else None
        w = dist.gather(xs[rank], outs, dst=0, async_op=True)
        return [w], lambda: None if rank else next((ref.close(o, x) for o, x in zip(outs, xs)
                                                    if ref.close(o, x)), None)

    @add("scatter")
    def _():
        xs = ref.all_inputs(n, torch.float64, (2,), "sc")
        out = torch.empty(2, dtype=torch.float64)
        w = dist.scatter(out, xs if rank == 0 else None, src=0, async_op=True)
        return [w], lambda: ref.close(out, xs[rank])

    @add("isend/irecv")
    def _():
        xs = ref.all_inputs(n, torch.float32, (5,), "p2p")
        got = torch.empty(5)
        src = (rank - 1) % n
        ws = [dist.isend(xs[rank], dst=peer), dist.irecv(got, src=src)]
        return ws, lambda: ref.close(got, xs[src])

    @add("batch_isend_irecv")
    def _():
        xs = ref.all_inputs(n, torch.int16, (3,), "batch")
        got = torch.empty(3, dtype=torch.int16)
        src = (rank - 1) % n
        ws = dist.batch_isend_irecv([dist.P2POp(dist.isend, xs[rank], peer), dist.P2POp(dist.irecv, got, src)])
        return ws, lambda: ref.close(got, xs[src])

    @add("barrier")
    def _():
        return [dist.barrier(async_op=True)], lambda: None

    return cases


def _contract(rank, n):
    """Each case three times: completion seen by polling alone, then the future (and wait after it, twice), then a
    wait with a timeout; and collect_all over the futures of every case's Works at once."""
    c = ref.Cases(rank, n)
    cases = _cases(rank, n)
    for name, issue in cases:
        def polled(issue=issue):
            works, check = issue()
            end = time.monotonic() + DEADLINE
            while not all(w.is_completed() for w in works):  # no wait(): the data must land all the same
                if time.monotonic() > end:
                    return "is_completed() stayed False without wait()"
                time.sleep(0.002)
            err = check()
            if err:
                return "after is_completed(): " + err
            if not all(w.is_success() and w.exception() is None for w in works):
                return f"is_success {[w.is_success() for w in works]} exception {[w.exception() for w in works]}"
            if not all(w.wait() is True and w.wait() is True for w in works):
                return "wait() did not return True"
            return None

        def future(issue=issue, name=name):
            works, check = issue()
            futs = [w.get_future() for w in works]
            for f in futs:
                f.wait()
            values = [f.value() for f in futs]
            err = check()
            if err:
                return "after the future: " + err
            for w in works:  # wait after get_future, twice; is_completed, result
                if not (w.wait() and w.wait() and w.is_completed() and w.is_success()):
                    return "wait/is_completed/is_success after the future"
            if name.startswith("all_reduce ") and not torch.equal(values[0][0], works[0].result()[0]):
                return f"the future's value {values[0]} is not the Work's result {works[0].result()}"
            return None

        def timed(issue=issue):
            works, check = issue()
            for w in works:
                w.wait(timeout=timedelta(seconds=DEADLINE))
            return check()

        c.check(f"{name}: polled", polled)
        c.check(f"{name}: future", future)
        c.check(f"{name}: wait(timeout)", timed)

    def collect_all():
        issued = [issue() for _, issue in cases if not _.startswith("barrier")]
        futs = [w.get_future() for works, _ in issued for w in works]
        torch.futures.collect_all(futs).wait()
        return next((f"case {i}: {err}" for i, (_, check) in enumerate(issued) if (err := check())), None)

    c.check("collect_all over every case's Works", collect_all)

    def out_of_order():
        issued = [issue() for _, issue in cases if not _.startswith("barrier")]
        for works, _ in reversed(issued):
            for w in reversed(works):
                w.wait()
        return next((f"case {i}: {err}" for i, (_, check) in enumerate(issued) if (err := check())), None)

    c.check("waited in reverse order", out_of_order)

    def source():
        got = torch.empty(2)
        if rank == 0:
            dist.send(torch.ones(2), dst=1)
            return None
        w = dist.irecv(got, src=0)
        return None if w._source_rank() == 0 and torch.equal(got, torch.ones(2)) else f"{w._source_rank()} {got}"

    c.check("recv's _source_rank", source)
    return c.failures, c.count, len(cases)


@pytest.mark.parametrize("profile", [None, "xccl", "xla"])
def test_every_work_serves_the_whole_contract(profile):
    for failures, count, cases in run_world("tests.work.test_work_contract:_contract", 2, profile, timeout=300,
                                            coll_timeout=60):
        assert failures == [], "\n".join(failures)
        assert count == 3 * cases + 3 and cases == 24


# ---------------------------------------------------------------------------------------------------
# DDP comm hooks: funcoll's futures against raw gloo's numbers
# ---------------------------------------------------------------------------------------------------
def _rs_hook(group, bucket):
    """A reduce-scatter-based DDP comm hook: reduce_scatter the (padded) bucket, chain on its future to all_gather
    the averaged shards back into the bucket."""
    n = group.size()
    buf = bucket.buffer()
    pad = -buf.numel() % n
    flat = torch.cat([buf, buf.new_zeros(pad)]) if pad else buf.clone()
    shard = flat.new_empty(flat.numel() // n)
    fut = dist.reduce_scatter_tensor(shard, flat, group=group, async_op=True).get_future()

    def gather(f):
        f.value()
        full = flat.new_empty(flat.numel())
        dist.all_gather_into_tensor(full, shard.div_(n), group=group)
        buf.copy_(full[:buf.numel()])
        return buf

    return fut.then(gather)


def _train(model_group, hook, steps=4, seed=0):
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3))
    ddp = DDP(model, process_group=model_group, bucket_cap_mb=100)
    if hook == "rs":
        ddp.register_comm_hook(model_group, _rs_hook)
    elif hook == "bf16":
        from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import bf16_compress_hook

        ddp.register_comm_hook(model_group, bf16_compress_hook)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    rank = dist.get_rank()
    for step in range(steps):
        g = torch.Generator().manual_seed(100 * step + rank)
        x, y = torch.randn(4, 6, generator=g), torch.randn(4, 3, generator=g)
        opt.zero_grad()
        torch.nn.functional.mse_loss(ddp(x), y).backward()
        opt.step()
    return [p.detach().clone() for p in model.parameters()]


def _ddp(rank, n):
    gloo = dist.new_group(backend="gloo")
    world = dist.group.WORLD
    out = {}
    ref_plain = _train(gloo, None)
    out["rs"] = [torch.allclose(a, b, rtol=1e-6, atol=1e-7) for a, b in zip(_train(world, "rs"), ref_plain)]
    out["bf16"] = [torch.equal(a, b) for a, b in zip(_train(world, "bf16"), _train(gloo, "bf16"))]
    out["moved"] = not all(torch.equal(a, b) for a, b in zip(ref_plain, _train(gloo, None, steps=0)))
    return out


@pytest.mark.parametrize("profile", [None, "xccl"])
def test_ddp_comm_hooks_train_to_gloos_numbers(profile):
    for r in run_world("tests.work.test_work_contract:_ddp", 2, profile, timeout=300, coll_timeout=60):
        assert r["moved"], "training changed nothing: the comparison would be empty"
        assert all(r["rs"]), r
        assert all(r["bf16"]), r


# ---------------------------------------------------------------------------------------------------
# eager autograd collectives: a Work that writes its outputs when waited on (gloo's reduce_scatter copies its slice
# in wait(), on whichever thread waits) must not leave that write in the output's autograd history
# ---------------------------------------------------------------------------------------------------
def _grad_steps(rank, n, steps=30):
    import torch.distributed._functional_collectives as fc

    world = dist.group.WORLD
    base = torch.arange(12.0).reshape(4, 3)

    def upstream(r, rows):  # the gradient rank r feeds back: rows x 3, different on every rank
        return torch.arange(rows * 3.0).reshape(rows, 3) + 10 * r

    ops = {
        # op(x) -> y; the gradient each rank's x must get when every rank r feeds back upstream(r, len(y))
        "all_gather_tensor_autograd": (lambda x: fc.all_gather_tensor_autograd(x, 0, world), 4 * n,
                                       lambda: sum(upstream(r, 4 * n) for r in range(n))[rank * 4:rank * 4 + 4]),
        "reduce_scatter_tensor_autograd": (lambda x: fc.reduce_scatter_tensor_autograd(x, "sum", 0, world), 4 // n,
                                           lambda: torch.cat([upstream(r, 4 // n) for r in range(n)])),
        "all_to_all_single_autograd": (lambda x: fc.all_to_all_single_autograd(x, [4 // n] * n, [4 // n] * n, world),
                                       4, lambda: torch.cat([upstream(r, 4)[rank * (4 // n):(rank + 1) * (4 // n)]
                                                             for r in range(n)])),
    }
    wrong = {}
    for name, (op, rows, want) in ops.items():
        for waited in (False, True):  # the forward output used as it is, or waited on (read) before backward
            bad = 0
            for step in range(steps):
                x = (base + 100 * rank + step).requires_grad_()
                y = op(x)
                if waited:
                    y = fc.wait_tensor(y)
                y.backward(upstream(rank, rows))
                bad += not torch.equal(x.grad, want())
            wrong[f"{name} waited={waited}"] = bad
    return wrong


@pytest.mark.parametrize("profile", [None, "xccl"])
def test_eager_autograd_collectives_keep_their_gradients_every_step(profile):
    for wrong in run_world("tests.work.test_work_contract:_grad_steps", 2, profile, timeout=300, coll_timeout=60):
        assert len(wrong) == 6 and all(v == 0 for v in wrong.values()), wrong
