"""A seeded generator of random collective programs, run on funcoll and on raw gloo side by side in the same world.

Every rank of a world holds two groups over the same ranks (and, at 3+ ranks, two sub-groups): the default funcoll
group and a gloo group made with ``new_group(backend="gloo")``. Case ``i`` of seed ``s`` is drawn from
``random.Random(f"{s}/{i}")`` -- the same on every rank -- and picks an op (every eager op, p2p, batch_isend_irecv,
coalesced and object collectives, the functional ops eagerly and a few compiled), a dtype, shape and reduce op of
docs/capabilities.md (0-size and 0-dim tensors included), a memory layout per rank, blocking or async (waited out of
order, through futures or with a timeout), world or sub-group, and sometimes an invalid request. Each rank rebuilds
every rank's input from the seed, so the expected value is computed locally (tests/reference.py); funcoll's result
must match it and gloo's. Where gloo itself refuses a case (dtypes it does not move, PREMUL_SUM), the case records
that and funcoll must still give the expected value, as its docs say. An invalid request must raise on every rank
and leave the ranks in step (the next case runs). A watchdog fails a case that hangs. A failure prints a one-line
repro.

    ./dev python -m tests.numerics.differential --seeds 0-999                       # the long run (native profile)
    ./dev python -m tests.numerics.differential --seeds 0-99 --profile xccl --world 3
    ./dev python -m tests.numerics.differential --seeds 7 --case 12 --profile xla     # one case (a failure's repro)
    ./dev python -m tests.numerics.differential --seeds 7 --case 0-12 --profile xla   # a case after the ones before it

``tests/numerics/test_differential.py`` runs a short run (native, xccl and xla profiles) as part of the suite.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import threading
import time
import traceback
from datetime import timedelta

import torch
import torch.distributed as dist

from tests import reference as ref

CASES_PER_SEED = 40
WAIT = timedelta(seconds=60)  # every async wait has a timeout
# a case running longer than this is a hang: the watchdog fails it
HANG_S = float(os.environ.get("FUNCOLL_DIFF_HANG_S", "90"))

FLOATS = [torch.float32, torch.float16, torch.bfloat16, torch.float64]
INTS = [torch.int8, torch.uint8, torch.int16, torch.int32, torch.int64, torch.uint16, torch.uint32, torch.uint64]
MOVE_ONLY = [torch.complex64, torch.float8_e4m3fn, torch.float8_e5m2]
DTYPES = FLOATS + INTS + [torch.bool] + MOVE_ONLY
LAYOUTS = ["contiguous", "contiguous", "strided", "transposed", "offset"]
OPS = ["all_reduce", "all_reduce_coalesced", "all_gather", "all_gather_into_tensor", "reduce_scatter",
       "reduce_scatter_tensor", "all_to_all_single", "all_to_all", "broadcast", "reduce", "gather", "scatter",
       "send_recv", "batch_isend_irecv", "objects", "functional", "async_batch", "invalid"]
REDUCING = {"all_reduce", "all_reduce_coalesced", "reduce_scatter", "reduce_scatter_tensor", "reduce"}


class CaseFailure(AssertionError):
    pass


def _lay(t: torch.Tensor, kind: str) -> torch.Tensor:
    from tests.semantics.test_layouts import lay

    return lay(t, kind) if t.dim() >= 1 and t.numel() else t.clone()


def _values(op: str, dtype: torch.dtype) -> str:
    if dtype.is_floating_point or dtype.is_complex:
        return "grid"
    return "small" if op in ("product", "avg", "premul_sum") else "random"


def _draw(seed: int, i: int, n: int, compiled_ok: bool) -> dict:
    """Case ``i`` of ``seed``: a dict every rank draws alike."""
    rng = random.Random(f"{seed}/{i}")
    kind = rng.choice(OPS)
    if kind == "functional" and compiled_ok and rng.random() < 0.1:
        kind = "compiled"
    reducing = kind in REDUCING
    dtype = rng.choice([d for d in DTYPES if not reducing or ref.valid_ops(d)])
    ops = ref.valid_ops(dtype)
    op = rng.choice(ops) if ops else "sum"
    rows = rng.choice([0, 1, 2, 3])
    shape = rng.choice([(), (0,), (5,), (2, 3), (rows, 3)]) if kind == "all_reduce" else (rng.choice([0, 1, 2]), 3)
    if kind in ("reduce_scatter_tensor", "scatter", "reduce_scatter") and shape == ():
        shape = (1,)
    return {"seed": seed, "i": i, "kind": kind, "dtype": dtype, "op": op, "shape": shape,
            "layouts": [rng.choice(LAYOUTS) for _ in range(n)], "async": rng.random() < 0.4,
            "wait": rng.choice(["wait", "future", "timeout", "poll"]), "root": rng.randrange(n),
            "sub": rng.random() < 0.3, "rng": rng.random(), "salt": f"{seed}/{i}"}


class Runner:
    def __init__(self, rank: int, n: int, profile: str | None):
        self.rank, self.n, self.profile = rank, n, profile
        self.fc = dist.group.WORLD
        self.gloo = dist.new_group(backend="gloo")
        self.subs = None
        if n >= 3:  # the first two ranks
            self.subs = (dist.new_group([0, 1]), dist.new_group([0, 1], backend="gloo"))
        self.count = {"cases": 0, "invalid": 0, "skipped (not a member)": 0}
        self.compiled: dict = {}

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
        """Runs case ``c`` on ``group`` (group ranks ``ranks``, global); returns the outputs to compare and the
        expected ones."""
        me = ranks.index(self.rank)
        n = len(ranks)
        dt, op, shape, kind = c["dtype"], c["op"], c["shape"], c["kind"]
        vals = _values(op, dt)
        salt = c["salt"]
        lay = c["layouts"][me]
        asy = c["async"]
        root = c["root"] % n
        groot = ranks[root]
        xs = ref.all_inputs(n, dt, shape, salt, vals)
        aop = {"async_op": True} if asy else {}

        def fin(w):
            if asy:
                # raw gloo's reduce_scatter Work never turns completed when polled (funcoll's does): gloo is waited on
                self._finish(w, "wait" if is_gloo and c["wait"] == "poll" else c["wait"])

        if kind == "all_reduce":
            t = _lay(xs[me], lay)
            fin(dist.all_reduce(t, op=ref.c10d_op(op), group=group, **aop))
            return [t], [ref.reduce(op, xs)], op, vals
        if kind == "all_reduce_coalesced":
            ys = ref.all_inputs(n, dt, (3,), salt + "b", vals)
            ts = [_lay(xs[me], lay), ys[me].clone()]
            out = dist.all_reduce_coalesced(ts, op=ref.c10d_op(op), group=group, **aop)
            if asy:
                self._finish(out, "future" if c["wait"] != "timeout" else "future")
            return ts, [ref.reduce(op, xs), ref.reduce(op, ys)], op, vals
        if kind == "all_gather":
            outs = [_lay(torch.zeros(shape, dtype=dt), lay) for _ in range(n)]
            fin(dist.all_gather(outs, _lay(xs[me], lay), group=group, **aop))
            return outs, xs, "none", vals
        if kind == "all_gather_into_tensor":
            out = torch.zeros((n * shape[0],) + shape[1:], dtype=dt)
            fin(dist.all_gather_into_tensor(out, _lay(xs[me], lay), group=group, **aop))
            return [out], [torch.cat(xs)], "none", vals
        if kind == "reduce_scatter":
            ins = [ref.all_inputs(n, dt, shape, f"{salt}/{j}", vals) for j in range(n)]
            out = _lay(torch.zeros(shape, dtype=dt), lay)
            fin(dist.reduce_scatter(out, [_lay(ins[j][me], lay) for j in range(n)], op=ref.c10d_op(op), group=group,
                                    **aop))
            return [out], [ref.reduce(op, ins[me])], op, vals
        if kind == "reduce_scatter_tensor":
            big = ref.all_inputs(n, dt, (n * shape[0],) + shape[1:], salt, vals)
            out = torch.zeros(shape, dtype=dt)
            fin(dist.reduce_scatter_tensor(out, _lay(big[me], lay), op=ref.c10d_op(op), group=group, **aop))
            k = shape[0]
            return [out], [ref.reduce(op, big)[me * k:(me + 1) * k]], op, vals
        if kind == "all_to_all_single":
            uneven = c["rng"] < 0.5
            sp = [[(r + j + int(c["rng"] * 10)) % 3 if uneven else shape[0] for j in range(n)] for r in range(n)]
            ins = [ref.make(dt, (sum(sp[r]), 3), r, salt, vals) for r in range(n)]
            out = torch.zeros((sum(sp[r][me] for r in range(n)), 3), dtype=dt)
            osz, isz = ([sp[r][me] for r in range(n)], sp[me]) if uneven or c["rng"] < 0.75 else (None, None)
            fin(dist.all_to_all_single(out, _lay(ins[me], lay), osz, isz, group=group, **aop))
            want = torch.cat([ins[r][sum(sp[r][:me]):sum(sp[r][:me + 1])] for r in range(n)])
            return [out], [want], "none", vals
        if kind == "all_to_all":
            ins = [[ref.make(dt, ((r + j) % 3, 2), r, f"{salt}/{j}", vals) for j in range(n)] for r in range(n)]
            outs = [torch.zeros(((r + me) % 3, 2), dtype=dt) for r in range(n)]
            fin(dist.all_to_all(outs, [_lay(t, lay) for t in ins[me]], group=group, **aop))
            return outs, [ins[r][me] for r in range(n)], "none", vals
        if kind == "broadcast":
            t = _lay(xs[me], lay)
            fin(dist.broadcast(t, src=groot, group=group, **aop))
            return [t], [xs[root]], "none", vals
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
            fin(dist.scatter(out, [_lay(x, lay) for x in xs] if me == root else None, src=groot, group=group, **aop))
            return [out], [xs[me]], "none", vals
        if kind == "send_recv":  # a ring: isend to the next, irecv from the previous (or blocking, ordered by parity)
            got = _lay(torch.zeros(shape, dtype=dt), lay)
            nxt, prv = ranks[(me + 1) % n], ranks[(me - 1) % n]
            if asy:
                ws = [dist.isend(_lay(xs[me], lay), nxt, group=group), dist.irecv(got, prv, group=group)]
                # raw gloo's point-to-point Works have no future and do not complete by polling: gloo is waited on
                self._finish(ws, "wait" if is_gloo and c["wait"] in ("future", "poll") else c["wait"])
            elif me % 2 == 0:
                dist.send(_lay(xs[me], lay), nxt, group=group)
                dist.recv(got, prv, group=group)
            else:
                dist.recv(got, prv, group=group)
                dist.send(_lay(xs[me], lay), nxt, group=group)
            return [got], [xs[(me - 1) % n]], "none", vals
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
            got = [None] if me == root else None
            dist.gather_object(objs[me], [None] * n if me == root else None, dst=groot, group=group)
            sc = [None]
            dist.scatter_object_list(sc, objs if me == root else None, src=groot, group=group)
            ok = gathered == objs and box[0] == objs[root] and sc[0] == objs[me]
            del got
            return [torch.tensor(ok)], [torch.tensor(True)], "none", vals
        if kind in ("functional", "compiled"):
            import torch.distributed._functional_collectives as fc

            which = ["all_reduce", "all_gather_tensor", "reduce_scatter_tensor", "all_to_all_single",
                     "broadcast"][int(c["rng"] * 5)]
            fdt = dt if kind == "functional" else torch.float32
            fshape = (2 * n, 3) if kind == "compiled" else (2 * n,) + tuple(shape[1:])
            fop = op if kind == "functional" and which in ("all_reduce", "reduce_scatter_tensor") else "sum"
            if kind == "compiled" or fop not in ref.valid_ops(fdt) or fop == "premul_sum":  # no functional premul
                fop = "sum" if "sum" in ref.valid_ops(fdt) else "none"
            if fop == "none" and which in ("all_reduce", "reduce_scatter_tensor"):
                which = "all_gather_tensor"
            fv = _values(fop, fdt)
            ins = ref.all_inputs(n, fdt, fshape, salt + "f", fv)
            # upstream's functional ops other than all_reduce require a contiguous input (an assert or TORCH_CHECK on
            # the calling rank alone, before funcoll is reached): those get one
            x = _lay(ins[me], lay) if which == "all_reduce" else ins[me].clone()
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

            if kind == "compiled":
                key = (which, fop, root, is_gloo, id(group))
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

    # -- one case: funcoll vs expected vs gloo ------------------------------------------------------------
    def case(self, c: dict) -> None:
        self.count["cases"] += 1
        if c["kind"] == "invalid":
            self.invalid(c)
            return
        if c["sub"] and self.subs is not None:
            groups, ranks = self.subs, [0, 1]
            if self.rank not in ranks:
                self.count["skipped (not a member)"] += 1
                return
        else:
            groups, ranks = (self.fc, self.gloo), list(range(self.n))
        n = len(ranks)
        got, want, op, vals = self.run(c, groups[0], ranks, False)
        for j, (g, w) in enumerate(zip(got, want)):
            err = ref.close(g.contiguous(), w, n if op != "none" else 1, op if op != "none" else "sum", vals)
            if err:
                raise CaseFailure(f"funcoll output {j} differs from the expected value: {err}")
        if not _gloo_can(c):
            self.count["gloo not asked (would abort)"] = self.count.get("gloo not asked (would abort)", 0) + 1
            return
        gc = c
        if len(set(c["layouts"][r] for r in range(n))) > 1:
            # gloo refuses some layouts on the rank that has them only (the others then wait in the collective):
            # ranks with different layouts hand gloo contiguous copies
            gc = dict(c, layouts=["contiguous"] * len(c["layouts"]))
            self.count["gloo given contiguous copies"] = self.count.get("gloo given contiguous copies", 0) + 1
        try:
            ggot, _, _, _ = self.run(gc, groups[1], ranks, True)
        except Exception as e:  # noqa: BLE001 - gloo refuses it: recorded; funcoll was checked against the expected
            why = str(e).strip().splitlines()[0][:80] if str(e).strip() else type(e).__name__
            key = f"gloo raised: {why}"
            self.count[key] = self.count.get(key, 0) + 1
            # a rank gloo refused before sending stays in step with one it did not (on the case's group: a rank
            # outside a sub-group has moved on)
            dist.barrier(group=groups[1])
            return
        for j, b in enumerate(ggot[:len(got)]):
            if ref.close(b.contiguous(), want[j], n if op != "none" else 1, op if op != "none" else "sum", vals):
                self.count["gloo wrong (funcoll right)"] = self.count.get("gloo wrong (funcoll right)", 0) + 1
                return
        self.count["agreed with gloo"] = self.count.get("agreed with gloo", 0) + 1


_GLOO_MOVES = {torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.int8, torch.uint8, torch.int32,
               torch.int64, torch.bool}


def _gloo_can(c: dict) -> bool:
    """Whether the case may be sent to raw gloo: gloo aborts the process (SIGABRT, not an exception) on some requests
    funcoll serves -- dtypes it does not move -- or fails them on a worker thread, leaving the group broken (integer
    AVG), or refuses them on some ranks only (PREMUL_SUM); those are recorded as not asked."""
    if c["kind"] in ("compiled", "objects", "async_batch"):
        return True
    if c["kind"] in REDUCING and c["op"] == "avg" and not c["dtype"].is_floating_point:
        return False  # gloo fails integer AVG on its worker thread, and the gloo group is unusable afterwards
    if c["op"] == "premul_sum" and c["kind"] in REDUCING:
        # gloo has no PREMUL_SUM; it refuses it on some ranks only (the root of a reduce) or on its worker thread
        # (async reduce_scatter), and its group falls out of step: nothing to compare with
        return False
    return c["dtype"] in _GLOO_MOVES


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
    return (f"./dev python -m tests.numerics.differential --seeds {c['seed']} --case {c['i']} "
            f"--profile {profile or 'native'} "
            f"--world {n}   # {c['kind']} {c['dtype']} {c['op']} {c['shape']} layouts={c['layouts']} "
            f"async={c['async']}/{c['wait']} sub={c['sub']}")


def rank_main(rank: int, n: int, seeds: list, case, profile, compiled: bool) -> dict:
    """Runs every case of ``seeds`` (or the cases listed in ``case``) on this rank; returns the counts and failures
    (repro lines)."""
    return rank_jobs(rank, n, [(seeds, case, compiled)], profile)[0]


def rank_jobs(rank: int, n: int, jobs: list, profile) -> list:
    """Runs the jobs ``(seeds, case, compiled)`` one after the other in this world (as :func:`rank_main` runs one);
    returns each job's counts and failures. A job that stops early (more than 5 failures: the ranks may be out of
    step) leaves the jobs after it not run, each saying so."""
    import torch._dynamo

    # every compiled case traces the same small function with another dtype, shape, op or root: thousands of
    # recompilations of one code object are what the long run asks for, not a fault
    torch._dynamo.config.recompile_limit = torch._dynamo.config.accumulated_recompile_limit = 1 << 20
    runner = Runner(rank, n, profile)
    dog = Watchdog()
    out: list = []
    for seeds, case, compiled in jobs:
        if out and len(out[-1]["failures"]) > 5:
            out.append({"counts": {}, "failures": [f"[rank {rank}] not run: an earlier job of this world stopped"]})
            continue
        before = dict(runner.count)
        failures = _job(runner, dog, rank, n, seeds, case, profile, compiled)
        out.append({"counts": {k: v - before.get(k, 0) for k, v in runner.count.items()}, "failures": failures})
    return out


def _job(runner: Runner, dog: Watchdog, rank: int, n: int, seeds: list, case, profile, compiled: bool) -> list:
    failures: list = []
    for seed in seeds:
        for i in (case if case is not None else range(CASES_PER_SEED)):
            c = _draw(seed, i, n, compiled)
            line = repro(c, profile, n)
            dog.arm(line)
            try:
                runner.case(c)
            except Exception as e:  # noqa: BLE001 - reported with the repro
                failures.append(f"[rank {rank}] {line}\n    {type(e).__name__}: {str(e)[:500]}\n"
                                + "".join(traceback.format_exc(limit=4)))
                print(failures[-1], file=sys.stderr, flush=True)  # seen even if the world then hangs
                if len(failures) > 5:
                    dog.disarm()
                    return failures
                dist.barrier(group=runner.gloo)  # back in step for the next case
            dog.disarm()
    return failures


def _seeds(text: str) -> list:  # "0-9", "3,5,7" (seeds or cases)
    out = []
    for part in text.split(","):
        a, _, b = part.partition("-")
        out += list(range(int(a), int(b or a) + 1))
    return out


def run(seeds: list, profile=None, world: int = 2, case=None, compiled: bool = True, deadline: float = 3600):
    from funcoll.launch import spawn_world

    results, codes, hung = spawn_world("tests.numerics.differential:rank_main", world, profile,
                                       args=(seeds, case, profile, compiled), deadline=deadline, coll_timeout=60)
    return results, codes, hung


def run_jobs(jobs: list, profile=None, world: int = 2, deadline: float = 3600):
    """:func:`rank_jobs` on one world: ``(results, exit codes, hung)`` as :func:`run` (a rank's value is the list of
    its jobs' counts and failures)."""
    from funcoll.launch import spawn_world

    return spawn_world("tests.numerics.differential:rank_jobs", world, profile, args=(jobs, profile),
                       deadline=deadline, coll_timeout=60)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", default="0-9", help="e.g. 0-999 or 3,5,7")
    ap.add_argument("--case", default=None, help="run these cases of each seed (a repro), e.g. 12 or 0-12: a case that "
                    "fails in a run but passes alone depends on what the cases before it left behind")
    ap.add_argument("--profile", default="native", choices=["native", "xccl", "xla"])
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--no-compiled", action="store_true")
    a = ap.parse_args(argv)
    profile = None if a.profile == "native" else a.profile
    t0 = time.monotonic()
    cases = None if a.case is None else _seeds(a.case)
    results, codes, hung = run(_seeds(a.seeds), profile, a.world, cases, not a.no_compiled)
    bad = False
    for r, res in enumerate(results):
        if res is None:
            print(f"rank {r}: no result (exit code {codes[r]}{', hung' if r in hung else ''})")
            bad = True
        elif res[0] != "ok":
            print(f"rank {r} failed:\n{res[1]}")
            bad = True
        else:
            print(f"rank {r}: {res[1]['counts']}")
            for f in res[1]["failures"]:
                print(f)
                bad = True
    print(f"{time.monotonic() - t0:.0f} s, profile {a.profile}, world {a.world}: {'FAILED' if bad else 'ok'}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
