"""funcoll.algorithms.observe: torch.profiler ranges read back from a real trace of a 2-rank world, the cost of the
hook when no profiler runs, and the ``TORCH_LOGS="+funcoll"`` output of a 2-rank world, snapshotted."""

import json
import os
import re

import torch

from funcoll.launch import run_world

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
R = torch.distributed.ReduceOp


# ---------------------------------------------------------------------------------------------------
# rank side
# ---------------------------------------------------------------------------------------------------
def trace_case(rank, n, path):
    """Four collectives under torch.profiler; returns the trace's complete events and the results."""
    import torch.distributed as dist
    from torch.profiler import ProfilerActivity, profile

    import funcoll

    xccl = dist.new_group(backend="funcoll", pg_options=funcoll.Options(profile="xccl"))
    for g in (None, xccl):  # connections made before tracing
        dist.all_reduce(torch.ones(1), group=g)
    a = torch.tensor([1.0, 2.0, 3.0, 4.0]) * (rank + 1)
    b = a.clone()
    m = torch.tensor([-7, 3, 5], dtype=torch.int32) * (1 if rank == 0 else -1)
    ins = [1, 2] if rank == 0 else [3, 1]
    outs = [1, 3] if rank == 0 else [2, 1]
    inp = torch.arange(float(sum(ins))) + 10 * rank
    out = torch.empty(sum(outs))
    named = a.clone()
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as p:
        with funcoll.record() as calls:
            dist.all_reduce(a, op=R.AVG)  # native on gloo
            dist.all_reduce(b, op=R.AVG, group=xccl)  # avg=sum+scale
            dist.all_reduce(m, op=R.MAX, group=xccl)  # XCCL's table: integer MAX filled
            dist.all_to_all_single(out, inp, outs, ins, group=xccl)  # pairwise send/recv
        if hasattr(dist, "record_comm"):  # torch 2.15: the collective's range takes the user's name
            with dist.record_comm("step::avg"):
                dist.all_reduce(named, op=R.AVG, group=xccl)
    file = f"{path}/trace{rank}.json"
    p.export_chrome_trace(file)
    with open(file) as f:
        events = [e for e in json.load(f)["traceEvents"] if e.get("ph") == "X"]
    keep = ("group", "rank", "group_size", "transport", "shapes", "dtypes", "args", "op", "global_ranks", "collective")
    events = [{"name": e["name"], "ts": float(e["ts"]), "dur": float(e.get("dur", 0)), "tid": e.get("tid"),
               "args": {k: v for k, v in e.get("args", {}).items() if k in keep}} for e in events]
    return {"events": events, "world": dist.group.WORLD.group_name, "xccl": xccl.group_name, "calls": calls,
            "a": a, "b": b, "m": m, "out": out}


def log_case(rank, n):
    """What the funcoll log shows for a small program (the world group was created by the harness)."""
    import torch.distributed as dist

    import funcoll

    print(f"GROUPS world={dist.group.WORLD.group_name}", flush=True)
    xccl = dist.new_group(backend="funcoll", pg_options=funcoll.Options(profile="xccl"))
    print(f"GROUPS xccl={xccl.group_name}", flush=True)
    with funcoll.record() as calls:
        for _ in range(2):  # a decision is logged once per signature
            dist.all_reduce(torch.ones(3), op=R.AVG)
            dist.all_reduce(torch.ones(3), op=R.AVG, group=xccl)
        dist.all_reduce(torch.ones(3, dtype=torch.int32), op=R.MAX, group=xccl)
        dist.all_reduce(torch.ones(2, dtype=torch.bfloat16), op=R.AVG, group=xccl)
        dist.barrier()
    if rank == 0:
        print("STRATEGIES " + json.dumps(["; ".join(notes) for _, notes in calls]), flush=True)
    funcoll.install(["cpu"])
    funcoll.uninstall(["cpu"])
    dist.barrier()
    return True


# ---------------------------------------------------------------------------------------------------
# profiler ranges
# ---------------------------------------------------------------------------------------------------
def _inside(child, parent):
    return (child["tid"] == parent["tid"] and parent["ts"] - 1e-3 <= child["ts"]
            and child["ts"] + child["dur"] <= parent["ts"] + parent["dur"] + 1e-3)


def _children(events, parent, name):
    return [e for e in events if e is not parent and e["name"] == name and _inside(e, parent)]


def test_profiler_trace_has_a_range_per_collective_with_its_strategy_and_the_native_call_inside(tmp_path):
    res = run_world("tests.observability.test_observe:trace_case", 2, None, args=(str(tmp_path),), timeout=180)
    for rank, r in enumerate(res):
        ev, world, xccl = r["events"], r["world"], r["xccl"]
        # the results are right (the ranges change nothing)
        assert r["a"].tolist() == [1.5, 3.0, 4.5, 6.0] and r["b"].tolist() == [1.5, 3.0, 4.5, 6.0]
        assert r["m"].tolist() == [7, 3, 5]
        want_out = {0: [0.0, 10.0, 11.0, 12.0], 1: [1.0, 2.0, 13.0]}[rank]
        assert r["out"].tolist() == want_out
        ars = [e for e in ev if e["name"] == "funcoll::all_reduce"]
        assert len(ars) == 3, [e["name"] for e in ev if e["name"].startswith("funcoll")]
        native_avg, xccl_avg, xccl_max = sorted(ars, key=lambda e: e["ts"])
        assert native_avg["args"] == {"group": world, "rank": rank, "group_size": 2, "transport": "gloo",
                                      "shapes": "[[4]]", "dtypes": "float32", "args": "op=avg", "global_ranks": "0,1"}
        assert xccl_avg["args"] == {"group": xccl, "rank": rank, "group_size": 2, "transport": "gloo[xccl]",
                                    "shapes": "[[4]]", "dtypes": "float32", "args": "op=avg", "global_ranks": "0,1"}
        assert xccl_max["args"]["args"] == "op=max" and xccl_max["args"]["dtypes"] == "int32"
        # record() says which strategies ran: the trace has a range for each, inside the collective's range
        calls = r["calls"]
        assert [op for op, _ in calls] == ["all_reduce"] * 3 + ["all_to_all_single"], calls
        (_, s_native), (_, s_avg), (_, s_max), (_, s_a2a) = calls
        assert s_native == ["native"] and s_avg == ["avg=sum+scale"] and s_max != ["native"]
        # native: the native call inside, no strategy range
        (nat,) = _children(ev, native_avg, "funcoll::native all_reduce")
        assert nat["args"]["op"] == "avg" and nat["args"]["transport"] == "gloo"
        assert not [e for e in ev if e["name"].startswith("funcoll::all_reduce ") and _inside(e, native_avg)]
        # a strategy: its range inside the collective's, the native SUM inside the strategy's
        (strat,) = _children(ev, xccl_avg, "funcoll::all_reduce avg=sum+scale")
        (nat,) = _children(ev, strat, "funcoll::native all_reduce")
        assert nat["args"]["op"] == "sum" and nat["args"]["transport"] == "gloo[xccl]"
        # each strategy of the integer MAX has its range; the native calls run inside the first one
        ranges = [e for e in ev if e["name"].startswith("funcoll::all_reduce ") and _inside(e, xccl_max)]
        assert sorted(e["name"] for e in ranges) == sorted(f"funcoll::all_reduce {x}" for x in s_max)
        first = min(ranges, key=lambda e: e["ts"])
        natives = [e for e in ev if e["name"].startswith("funcoll::native ") and _inside(e, xccl_max)]
        assert natives and all(_inside(e, first) for e in natives)
        assert not any(e["name"] == "funcoll::native all_reduce" and e["args"].get("op") == "max" for e in natives)
        # uneven all_to_all under XCCL's table: pairwise send/recv, the native calls inside the strategy's range
        (a2a,) = [e for e in ev if e["name"] == "funcoll::all_to_all_single"]
        assert a2a["args"]["args"] == f"output_split_sizes={[1, 3] if rank == 0 else [2, 1]} " \
                                      f"input_split_sizes={[1, 2] if rank == 0 else [3, 1]}"
        assert s_a2a == ["uneven all_to_all=pairwise send/recv"], s_a2a
        (strat,) = _children(ev, a2a, "funcoll::all_to_all_single uneven all_to_all=pairwise send/recv")
        assert not _children(ev, a2a, "funcoll::native all_gather")  # no agreement on the splits
        p2p = [e["name"] for e in ev if e["name"].startswith("funcoll::native") and _inside(e, strat)]
        assert sorted(p2p) == ["funcoll::native recv", "funcoll::native send"], p2p
        # the backend's own events of the native calls are in the trace too (gloo runs them on its threads)
        assert any(e["name"] == "gloo:all_reduce" for e in ev) and any(e["name"] == "gloo:all_gather" for e in ev)
        if hasattr(torch.distributed, "record_comm"):
            # inside dist.record_comm: the collective's range is titled with the name (as c10d titles its Works),
            # funcoll's op in its args; the strategy and native ranges inside keep funcoll's names
            (named,) = [e for e in ev if e["name"] == "step::avg" and "collective" in e["args"]]
            assert named["args"]["collective"] == "funcoll::all_reduce" and named["args"]["args"] == "op=avg"
            (strat,) = _children(ev, named, "funcoll::all_reduce avg=sum+scale")
            assert _children(ev, strat, "funcoll::native all_reduce")


def test_the_hook_does_nothing_without_a_profiler_a_log_or_a_recorder(monkeypatch, caplog):
    """The entry builds an observe.Scope only while a profiler records or the funcoll log is at DEBUG (record()
    alone keeps its plain list); only a profiler makes it open ranges and wrap the transport."""
    import logging

    from funcoll import algorithms
    from funcoll.algorithms import observe, pending
    from funcoll.report import DryRunTransport
    from funcoll.transport import profile

    made = []

    class Counting(observe.Scope):
        __slots__ = ()

        def __init__(self, *a, **k):
            super().__init__(*a, **k)
            made.append((self._ranges is not None, isinstance(self.args[0], observe._Traced)))

    monkeypatch.setattr(pending, "Scope", Counting)
    tp = DryRunTransport(profile("gloo").restrict(profile("xccl")), size=2)
    t = torch.ones(2)
    assert not torch.autograd.profiler._is_profiler_enabled and not observe.LOG.isEnabledFor(logging.DEBUG)
    algorithms.all_reduce(tp, t, "avg")
    assert made == []
    with algorithms.record() as calls:
        algorithms.all_reduce(tp, t, "avg")
    assert made == [] and calls == [("all_reduce", ["avg=sum+scale"])]
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as p:
        with algorithms.record() as calls:
            algorithms.all_reduce(tp, t, "avg")
    assert made == [(True, True)] and calls == [("all_reduce", ["avg=sum+scale"])]
    names = [e.name for e in p.events()]
    assert names.count("funcoll::all_reduce") == 1 and names.count("funcoll::all_reduce avg=sum+scale") == 1
    assert names.count("funcoll::native all_reduce") == 1
    algorithms.all_reduce(tp, t, "avg")
    assert len(made) == 1
    with caplog.at_level(logging.DEBUG, logger="funcoll"):
        observe._decided.clear()
        for _ in range(3):
            algorithms.all_reduce(tp, t, "avg")
    assert made[1:] == [(False, False)] * 3
    assert [r.getMessage() for r in caplog.records] == [
        "all_reduce(avg, float32) on group ? [gloo[xccl]]: avg=sum+scale"]


# ---------------------------------------------------------------------------------------------------
# TORCH_LOGS
# ---------------------------------------------------------------------------------------------------
_GLOG = re.compile(r"^(?:\[rank(\d+)\]:)?([VIWEC])\d{4} [\d:.]+ \d+ (\S+):\d+\] (.*)$")


def _run_log_world(capfd, torch_logs):
    """The 2-rank world of ``log_case`` with ``TORCH_LOGS=torch_logs`` (None: unset) and none of funcoll's switches;
    its ranks write to this process's file descriptors 1 and 2 (inherited), read back through ``capfd``."""
    capfd.readouterr()  # what came before
    run_world("tests.observability.test_observe:log_case", 2, timeout=150,
              env={"PYTHONPATH": ROOT, "FUNCOLL_PROBE": None, "TORCH_LOGS": torch_logs})
    out, err = capfd.readouterr()
    names = dict(kv.split("=") for line in out.splitlines() if line.startswith("GROUPS ")
                 for kv in line.split()[1:])
    (strategies,) = [json.loads(line.split(" ", 1)[1]) for line in out.splitlines()
                     if line.startswith("STRATEGIES ")]
    return err, names, strategies


def _per_rank(stderr, names):
    """funcoll's log lines per rank, normalised: level letter and message; group names as <world>/<xccl>."""
    out = {0: [], 1: []}
    for line in stderr.splitlines():
        m = _GLOG.match(line)
        if not m or not m.group(3).startswith("funcoll/"):
            continue
        rank, level, msg = m.group(1), m.group(2), m.group(4)
        if rank is None:  # before init_process_group returned: the message names the rank
            rank = re.search(r"rank (\d+)(?: of |/)2", msg).group(1)
        for key, val in names.items():
            msg = re.sub(rf"\bgroup {re.escape(val)}\b", f"group <{key}>", msg)
        msg = re.sub(r"store \w+", "store <store>", msg)
        out[int(rank)].append(f"{level} {msg}")
    return out


def test_torch_logs_funcoll_snapshot(capfd):
    stderr, names, strategies = _run_log_world(capfd, "+funcoll")
    assert set(names) == {"world", "xccl"}
    # the strategies the planner must choose (funcoll.record() of the same run agrees), and the log says each once
    # per signature: xccl has no int32 MAX and no bfloat16 AVG
    max_i32, avg_bf16, barrier = ("all_to_all+local max+all_gather", "avg=float32 reduce_scatter+scale+all_gather",
                                  "native")
    assert strategies == ["native", "avg=sum+scale", "native", "avg=sum+scale", max_i32, avg_bf16, barrier]
    got = _per_rank(stderr, names)
    for rank in (0, 1):
        assert got[rank] == [
            f"I group <world> created: rank {rank} of 2, global ranks 0,1, world size 2, store <store>, "
            "CPU transport now",
            f"I group <world> rank {rank}/2: cpu transport GlooTransport, capabilities gloo (the running stack)",
            f"I group <xccl> created: rank {rank} of 2, global ranks 0,1, world size 2, store <store>, "
            "CPU transport now",
            f"I group <xccl> rank {rank}/2: cpu transport StrictC10dTransport, capabilities gloo[xccl] "
            "(profile 'xccl' from funcoll.Options)",
            "V all_reduce(avg, float32) on group <world> [gloo]: native",
            "V all_reduce(avg, float32) on group <xccl> [gloo[xccl]]: avg=sum+scale",
            f"V all_reduce(max, int32) on group <xccl> [gloo[xccl]]: {max_i32}",
            f"V all_reduce(avg, bfloat16) on group <xccl> [gloo[xccl]]: {avg_bf16}",
            f"V barrier() on group <world> [gloo]: {barrier}",
            "I install: 12 funcoll kernels for _c10d_functional on dispatch key CPU (cpu)",
            "I uninstall: funcoll kernels removed from cpu; the previous kernels serve again",
        ], (rank, got[rank], stderr[-3000:])


def test_funcoll_log_is_silent_by_default(capfd):
    stderr, names, _ = _run_log_world(capfd, None)
    assert _per_rank(stderr, names) == {0: [], 1: []}
    for text in ("created: rank", "transport C10dTransport", "avg=sum+scale", "install:", "uninstall:"):
        assert text not in stderr, stderr[-3000:]


def lent_case(rank, n):
    """A compiled all_reduce on a group made with gloo (a transport lent to funcoll's kernels), logged at DEBUG: the
    log lines, and the group's name."""
    import logging
    import logging.handlers

    import torch.distributed as dist

    import funcoll

    handler = logging.handlers.BufferingHandler(1000)
    log = logging.getLogger("funcoll")
    log.addHandler(handler)
    log.setLevel(logging.DEBUG)
    group = dist.new_group(backend="gloo")
    funcoll.install(["cpu"])
    t = torch.ops._c10d_functional.all_reduce(torch.ones(3, dtype=torch.float64), "sum", group.group_name)
    torch.ops._c10d_functional.wait_tensor(t)
    funcoll.uninstall(["cpu"])
    return [r.getMessage() for r in handler.buffer if r.getMessage().startswith("all_reduce(")], group.group_name


def test_a_lent_transport_is_logged_under_the_name_of_the_group_that_lent_it():
    for lines, name in run_world("tests.observability.test_observe:lent_case", 2, timeout=150):
        assert lines == [f"all_reduce(sum, float64) on group {name} [gloo]: native"]


# ---------------------------------------------------------------------------------------------------
# torch.distributed.record_comm (torch 2.15): the name reaches funcoll's ranges and flight recorder
# ---------------------------------------------------------------------------------------------------
def record_comm_case(rank, n):
    """A native all_reduce (the eager fast path) and an AVG the xccl profile fills (avg=sum+scale), inside
    ``dist.record_comm``, then one outside it. Returns the flight recorder's lines and names, and the results (the
    profiler's view: the trace test)."""
    import torch.distributed as dist

    import funcoll

    xccl = dist.new_group(backend="funcoll", pg_options=funcoll.Options(profile="xccl"))
    a, b, c = (torch.tensor([1.0, 2.0, 4.0]) * (rank + 1) for _ in range(3))
    with dist.record_comm("FSDP::reduce (layer1)"):
        dist.all_reduce(a)
        dist.all_reduce(b, op=R.AVG, group=xccl)
    dist.all_reduce(c)
    entries = [(e.line(), e.name, e.as_dict()["name"]) for e in
               funcoll.flight_recorder.entries()[-2:] + funcoll.flight_recorder.entries(xccl)[-1:]]
    torch_fr = [e["profiling_name"] for e in funcoll.flight_recorder.torch_dump()["entries"]]
    return entries, torch_fr, [a.tolist(), b.tolist(), c.tolist()]


def test_record_comm_names_funcolls_flight_recorder_entries():
    import pytest

    if not hasattr(torch.distributed, "record_comm"):
        pytest.skip(f"torch {torch.__version__} has no torch.distributed.record_comm (torch 2.15 has it)")
    for entries, torch_fr, (a, b, c) in run_world("tests.observability.test_observe:record_comm_case", 2, None,
                                                  timeout=180):
        assert a == c == [3.0, 6.0, 12.0] and b == [1.5, 3.0, 6.0]
        (fast, plain, filled) = entries  # the world's last two (inside, outside), the xccl group's AVG
        assert fast[1:] == ("FSDP::reduce (layer1)",) * 2 and fast[0].endswith(
            "all_reduce(reduce_op=sum, float32[3]) as 'FSDP::reduce (layer1)' [native]")
        assert plain[1:] == ("", "") and " as " not in plain[0]
        assert filled[1] == "FSDP::reduce (layer1)" and filled[0].endswith(
            "as 'FSDP::reduce (layer1)' [avg=sum+scale]")
        assert "FSDP::reduce (layer1)" in torch_fr and "funcoll:all_reduce" in torch_fr


def list_sizes_case(rank, n):
    """A list all_gather of equal sizes, one of sizes that differ per rank, a list reduce_scatter; returns their
    entries of the torch-format dump: (name, input sizes, output sizes)."""
    import torch.distributed as dist

    import funcoll

    outs = [torch.empty(2, 3) for _ in range(n)]
    dist.all_gather(outs, torch.full((2, 3), float(rank)))
    uneven = [torch.empty(q + 1) for q in range(n)]
    dist.all_gather(uneven, torch.full((rank + 1,), float(rank)))
    dist.reduce_scatter(torch.empty(3), [torch.ones(3) for _ in range(n)])
    assert [t[0, 0].item() for t in outs] == [0.0, 1.0] and [t.tolist() for t in uneven] == [[0.0], [1.0, 1.0]]
    entries = funcoll.flight_recorder.torch_dump()["entries"][-3:]
    return [(e["profiling_name"], e["input_sizes"], e["output_sizes"]) for e in entries]


def test_torch_format_lists_the_sizes_of_the_list_all_gather_and_reduce_scatter():
    """As NCCL's flight recorder does: a list of equal tensors is the one [n, *shape] tensor it flattens them into;
    a list of sizes that differ, each tensor's shape."""
    for rank, got in enumerate(run_world("tests.observability.test_observe:list_sizes_case", 2, timeout=150)):
        assert got == [("funcoll:all_gather", [[2, 3]], [[2, 2, 3]]),
                       ("funcoll:all_gather", [[rank + 1]], [[1], [2]]),
                       ("funcoll:reduce_scatter", [[2, 3]], [[3]])]


def test_flight_recorder_entries_have_an_empty_name_without_record_comm():
    """On every torch (2.9 has no record_comm): an entry's name is "" and the line carries none."""
    from funcoll.algorithms.observe import comm_name
    from funcoll.entry.flight_recorder import Call

    call = Call("g", (0, 1), 0, 2, "all_reduce", "allreduce", {"op": "all_reduce", "reduce_op": "sum"})
    assert comm_name() == "" and call.name == "" and call.as_dict()["name"] == ""
    assert call.line().endswith("all_reduce(reduce_op=sum)")
