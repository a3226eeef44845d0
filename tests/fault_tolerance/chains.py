"""Rank bodies of the lose-a-rank tests (tests/fault_tolerance/test_lose_a_rank.py): a small data-parallel training
job whose ranks are killed (SIGKILL) one after another, each in the middle of a kind of communication, and whose
survivors recover through a route and go on training; and the same job on gloo where the ranks leave instead of
dying, the reference its parameters and optimizer state are compared with, bit for bit.

The job's store is the test process's (as torchrun's agent hosts the rendezvous store), so that any rank may die.
A rank is known by its *stable id*, its rank in the first world: its data, and the reference's, follow it.
"""

from __future__ import annotations

import os
import signal
import time
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

STEPS = 2  # steps of each phase: the victim of the phase dies in its first, which the survivors then redo
GROUP_TIMEOUT = 5.0
# how each scenario communicates in a step (the victim dies right before its first communication of the step, so its
# peers are in the middle of it): eager = blocking all_reduce SUM of each gradient on the fast path, then a divide;
# batch = one async all_reduce AVG per gradient, waited on together; compiled = a torch.compile'd function of
# functional all_reduce AVGs; p2p = a pipeline-style handoff (each rank sends its batch to the next rank and
# receives the previous rank's, blocking send and recv), then all_reduce AVG of the gradients
SCENARIOS = ("eager", "batch", "compiled", "p2p")


def _model():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    return model, torch.optim.Adam(model.parameters(), lr=0.05)


def _data(step: int, stable: int):
    g = torch.Generator().manual_seed(1000 * step + stable)
    return torch.randn(4, 6, generator=g), torch.randn(4, 1, generator=g)


def _snapshot(model, opt):
    return ({k: v.clone() for k, v in model.state_dict().items()},
            {"state": {k: {n: (t.clone() if torch.is_tensor(t) else t) for n, t in s.items()}
                       for k, s in opt.state_dict()["state"].items()},
             "param_groups": opt.state_dict()["param_groups"]})


def _restore(model, opt, snap):
    model.load_state_dict(snap[0])
    opt.load_state_dict(snap[1])


def _die():
    os.kill(os.getpid(), signal.SIGKILL)


_COMPILED: dict = {}


def _compiled_sync(grads, group):
    import torch.distributed._functional_collectives as fc

    name = group.group_name
    if name not in _COMPILED:  # a new group after a recovery: compiled anew (its name is in the graph)
        def sync(gs):
            return [fc.all_reduce(g, "avg", group) for g in gs]

        _COMPILED[name] = torch.compile(sync, backend="aot_eager", fullgraph=True)
    return _COMPILED[name](grads)


def _warm_up(model, group):
    """Compiles the step's sync for ``group`` and runs it once on zeros. The ranks finish compiling seconds apart on a
    loaded machine, so its collectives wait with a longer timeout than the group's (which the deaths are timed by)."""
    group.set_timeout(timedelta(seconds=60))
    try:
        _compiled_sync([torch.zeros_like(p) for p in model.parameters()], group)
    finally:
        group.set_timeout(timedelta(seconds=GROUP_TIMEOUT))


def _step(scenario, model, opt, step, stable, members, die_here, began):
    """One training step; ``die_here``: this rank dies right before its first communication of the step;
    ``began[0]`` is set to the time of that communication."""
    world, rank = dist.get_world_size(), dist.get_rank()
    assert world == len(members) and members[rank] == stable, (world, rank, members, stable)
    x, y = _data(step, stable)
    if scenario == "p2p":  # the previous rank's batch joins this rank's (a pipeline's handoff of activations)
        prev = torch.empty_like(x)
        if die_here:
            _die()
        began[0] = time.monotonic()
        nxt, prv = (rank + 1) % world, (rank - 1) % world
        if rank % 2 == 0:
            dist.send(x, nxt)
            dist.recv(prev, prv)
        else:
            dist.recv(prev, prv)
            dist.send(x, nxt)
        x, y = torch.cat([x, prev]), torch.cat([y, y])
    opt.zero_grad()
    loss = ((model(x) - y) ** 2).mean()
    loss.backward()
    grads = [p.grad for p in model.parameters()]
    if die_here:
        _die()
    if scenario != "p2p":
        began[0] = time.monotonic()
    if scenario == "eager":
        for g in grads:
            dist.all_reduce(g)
            g.div_(world)
    elif scenario == "batch":
        works = [dist.all_reduce(g, op=dist.ReduceOp.AVG, async_op=True) for g in grads]
        for w in works:
            w.wait()
    elif scenario == "compiled":
        for g, synced in zip(grads, _compiled_sync(grads, dist.group.WORLD)):
            g.copy_(synced)
    else:  # p2p
        for g in grads:
            dist.all_reduce(g, op=dist.ReduceOp.AVG)
    opt.step()


class _Job:
    """The job's membership and its route back after a loss: ``shrink`` (dist.shrink_group of the default group),
    ``reconfigure`` (c10d's _reconfigure of the default group with the survivors' handles, exchanged through the
    store), or, in the gloo reference, ``leave`` (the survivors make a new default group on a new store prefix)."""

    def __init__(self, store, stable: int, world: int, route: str, backend: str):
        self.store, self.stable, self.route, self.backend = store, stable, route, backend
        self.members = list(range(world))
        self.epoch = 0
        dist.init_process_group(backend, store=dist.PrefixStore("job/0/", store), rank=stable, world_size=world,
                                timeout=timedelta(seconds=GROUP_TIMEOUT),
                                **({"enable_reconfigure": True} if route == "reconfigure" else {}))
        if route == "reconfigure":
            self._reconfigure()

    def _reconfigure(self):
        pg = dist.group.WORLD
        self.store.set(f"handles/{self.epoch}/{self.stable}", c10d._get_reconfigure_handle(pg))
        handles = [self.store.get(f"handles/{self.epoch}/{s}").decode() for s in self.members]
        c10d._reconfigure(self.epoch, handles, pg, timeout=timedelta(seconds=30)).wait()

    def lose(self, victim: int):
        """The survivors of ``victim``'s death (or departure) make the job's group anew."""
        group_rank = self.members.index(victim)
        self.members.remove(victim)
        self.epoch += 1
        if self.route == "shrink":
            dist.shrink_group([group_rank], shrink_flags=c10d.SHRINK_ABORT)
        elif self.route == "reconfigure":
            self._reconfigure()
        else:  # leave: a new group of the members, the way an elastic job restarts its workers' group
            dist.destroy_process_group()
            dist.init_process_group(self.backend, store=dist.PrefixStore(f"job/{self.epoch}/", self.store),
                                    rank=self.members.index(self.stable), world_size=len(self.members),
                                    timeout=timedelta(seconds=GROUP_TIMEOUT))


def _train(store_port: int, prefix: str, route: str, plan, stable: int, world: int, backend: str):
    agent = dist.TCPStore("127.0.0.1", store_port, is_master=False, timeout=timedelta(seconds=120))
    store = dist.PrefixStore(f"{prefix}/", agent)  # this job's keys
    job = _Job(store, stable, world, route, backend)
    model, opt = _model()
    errors, step = [], 0
    for scenario, victim in plan:
        snap, s = _snapshot(model, opt), 0
        while s < STEPS:
            dies = s == 0 and stable == victim
            if dies and route == "leave":  # the reference: the victim leaves before the step
                return None
            if s == 0 and route == "leave" and victim in job.members:
                job.lose(victim)
            if scenario == "compiled":  # compiled for this group before the step (the victim too), not in it
                _warm_up(model, dist.group.WORLD)
            began = [time.monotonic()]
            try:
                _step(scenario, model, opt, step, stable, job.members, dies, began)
            except Exception as e:  # noqa: BLE001 - asserted by the test
                errors.append({"scenario": scenario, "step": step, "world": len(job.members),
                               "rank": job.members.index(stable), "type": type(e).__name__, "msg": str(e),
                               "secs": time.monotonic() - began[0]})
                _restore(model, opt, snap)  # the step is redone from the last one every survivor completed
                job.lose(victim)
                continue
            snap, s, step = _snapshot(model, opt), s + 1, step + 1
    state = _snapshot(model, opt)
    dist.destroy_process_group()
    return {"stable": stable, "members": job.members, "errors": errors, "state": state,
            "world": dist.get_world_size() if dist.is_initialized() else len(job.members)}


def rank_chain(rank, world, store_port, prefix, route, plan):
    """A rank of the funcoll job on the keys ``prefix`` of the agent's store (spawned by funcoll.launch, whose own
    default group it leaves first)."""
    dist.destroy_process_group()
    return _train(store_port, prefix, route, plan, rank, world, "funcoll")


def rank_reference(rank, world, store_port, prefix, plan):
    """A rank of the gloo reference: the same job, each phase's victim leaving before the step it dies in."""
    dist.destroy_process_group()
    return _train(store_port, prefix, "leave", plan, rank, world, "gloo")


# -- the torchft route: each rank a replica group of its own, its Manager's quorums over the live ones ---------------
TORCHFT_STEPS = 6  # committed steps


def rank_torchft(rank, world, store_port, prefix, lighthouse, kind, plan):
    """A replica group (one rank) of a torchft job whose cross-replica group is ``kind`` ("funcoll":
    funcoll.torchft.ProcessGroupFuncoll, or "gloo": torchft's ProcessGroupGloo, the reference); ``plan``: (scenario,
    victim, step) per death, the victim killed right before its all_reduces of that step (eager: one all_reduce of a
    gradient waited on after another; batch: all issued, then waited on). Returns the state after TORCHFT_STEPS
    committed steps, the errors the Manager saw and the participants of each committed step."""
    from torchft import Manager, Optimizer

    if kind == "funcoll":
        from funcoll.torchft import ProcessGroupFuncoll as PG
    else:
        from torchft.process_group import ProcessGroupGloo as PG

    dist.destroy_process_group()  # funcoll.launch's
    agent = dist.PrefixStore(f"{prefix}/", dist.TCPStore("127.0.0.1", store_port, is_master=False,
                                                          timeout=timedelta(seconds=60)))
    own = dist.TCPStore("localhost", 0, is_master=True, wait_for_workers=False)  # this replica group's store
    model, opt = _model()

    def state_dict():
        return {"model": model.state_dict(), "optim": opt.state_dict()}

    def load_state_dict(sd):
        model.load_state_dict(sd["model"])
        opt.load_state_dict(sd["optim"])

    agent.add("ready", 1)  # every replica starts its Manager at once: the first quorum has them all
    while agent.add("ready", 0) < world:
        time.sleep(0.01)
    manager = Manager(pg=PG(timeout=timedelta(seconds=GROUP_TIMEOUT)), min_replica_size=1,
                      load_state_dict=load_state_dict, state_dict=state_dict, replica_id=f"replica_{rank}",
                      store_addr="localhost", store_port=own.port, rank=0, world_size=1, lighthouse_addr=lighthouse,
                      port=0, use_async_quorum=False, init_sync=False, timeout=timedelta(seconds=GROUP_TIMEOUT),
                      quorum_timeout=timedelta(seconds=60))
    optim = Optimizer(manager, opt)
    deaths = {step: (scenario, victim) for scenario, victim, step in plan}
    errors, participants, attempt, alive = [], [], 0, world
    while manager.current_step() < TORCHFT_STEPS:
        step = manager.current_step()
        scenario, victim = deaths.get(step, ("eager", None))
        # the live replicas ask for the step's quorum together, so that each quorum has them all (the lighthouse
        # forms one once every healthy replica joined, or at its join timeout: a dead one is healthy for 3 s more)
        key = f"quorum/{step}/{attempt}"
        agent.add(key, 1)
        while agent.add(key, 0) < alive:
            time.sleep(0.01)
        optim.zero_grad()  # the step's quorum
        x, y = _data(step, rank)
        ((model(x) - y) ** 2).mean().backward()
        if victim == rank:
            _die()
        if scenario == "batch":
            futures = [manager.allreduce(p.grad) for p in model.parameters()]
            for f in futures:
                f.wait()
        else:
            for p in model.parameters():
                manager.allreduce(p.grad).wait()
        err = manager.errored()
        if err is not None:
            errors.append({"step": step, "scenario": scenario, "type": type(err.original_exception).__name__,
                           "msg": str(err.original_exception)})
        n = manager.num_participants()
        optim.step()  # only if every participant got through the step (Manager.should_commit)
        if manager.current_step() > step:
            participants.append(n)
            attempt = 0
        else:  # the step is tried again without the replica that died in it
            attempt, alive = attempt + 1, alive - 1
    out = {"stable": rank, "errors": errors, "participants": participants, "state": _snapshot(model, opt)}
    manager.shutdown(wait=False)
    return out
