"""Losing a rank, end to end: at world 4, then at world 3, one rank is killed (SIGKILL) in the middle of a step of a
small data-parallel training job -- an eager collective on the fast path, an async batch, a compiled step, a
pipeline-style send/recv (tests/fault_tolerance/chains.py) -- and the survivors:

- each raise an error naming the collective, the group and the peer that died, within the group's timeout (no hang,
  no abort of the survivor's process);
- recover through a route (torch >= 2.15's ``dist.shrink_group`` or c10d's ``_reconfigure`` of the default group)
  and redo the step from the state every survivor had completed;
- end with parameters and Adam's state equal, bit for bit, to a reference job on gloo whose ranks leave at the same
  steps instead of dying (the oracle: gloo's numbers for the same membership).

Each chain kills two ranks, one at world 4 and one at world 3 (CASES says which chains and routes each profile runs:
native gloo, ``FUNCOLL_PROFILE=xccl``, ``FUNCOLL_PROFILE=xla``). On torch 2.9 and 2.15 the same deaths are also
survived through torchft's quorums (each rank a replica group with funcoll.torchft's group), ending equal, bit for bit,
to torchft on gloo with the same deaths (PROFILES says which profiles each torch runs). The job's store lives in this
process, as torchrun's agent hosts it, so that any rank, rank 0 included, can die.
"""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist

from funcoll.launch import _spawn_world
from tests.fault_tolerance.chains import GROUP_TIMEOUT

SLACK = 10.0
needs_2_15 = pytest.mark.skipif(not hasattr(dist, "shrink_group"),
                                reason="dist.shrink_group and c10d's _reconfigure are torch >= 2.15")

# chain -> (scenario, stable id of its victim) per phase: between the two chains each scenario dies once, rank 0 of
# the first world among the victims of each
PLANS = {"B": [("batch", 2), ("compiled", 0)], "D": [("p2p", 0), ("eager", 2)]}
# (profile, chain, route): chains B and D together kill every scenario once (rank 0 of the first world in each), and
# every profile runs both, one per route, so that each profile sees every scenario die, and each route too
CASES = [(None, "B", "shrink"), (None, "D", "reconfigure"), ("xccl", "B", "reconfigure"), ("xccl", "D", "shrink"),
         ("xla", "B", "shrink"), ("xla", "D", "reconfigure")]
# the torchft route: native on both torches, the xccl profile on the newest (what XPU users run), the xla profile on
# torch_xla's torch
PROFILES = (None, "xccl") if hasattr(dist, "shrink_group") else (None, "xla")
# the communication a scenario's error names
OPS = {"eager": ("all_reduce",), "batch": ("all_reduce",), "compiled": ("all_reduce",),
       "p2p": ("send", "recv", "all_reduce")}


@pytest.fixture(scope="module")
def agent_store():
    """The job's store, in this process (as torchrun's agent hosts it)."""
    return dist.TCPStore("127.0.0.1", 0, None, True, timedelta(seconds=120), wait_for_workers=False)


def _world(target, args, profile=None):
    # coll_timeout is the launcher's default group's, which every chain target leaves at once (its own groups carry
    # GROUP_TIMEOUT): its connect gets the time a loaded machine needs to start four ranks (5 s ran out once)
    results, codes, hung = _spawn_world(target, 4, profile, args, deadline=240, coll_timeout=60)
    assert not hung, f"ranks {hung} still running past the deadline (exit codes {codes})"
    return results, codes


_references: dict = {}


def _reference(chain, agent_store):
    """Each surviving stable id's final state in the gloo reference of ``chain`` (one run per chain)."""
    if chain not in _references:
        results, codes = _world("tests.fault_tolerance.chains:rank_reference",
                                (agent_store.port, f"reference-{chain}", PLANS[chain]))
        assert codes == [0, 0, 0, 0] and all(r is None or r[0] == "ok" for r in results), (codes, results)
        _references[chain] = {r[1]["stable"]: r[1]["state"] for r in results if r[1] is not None}
    return _references[chain]


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.detach().contiguous().view(torch.int32 if t.element_size() == 4 else torch.int64)


def _assert_same_state(got, want, who):
    (params, opt), (ref_params, ref_opt) = got, want
    for k in ref_params:
        assert torch.equal(_bits(params[k]), _bits(ref_params[k])), (who, k, params[k], ref_params[k])
    assert ref_opt["state"].keys() == opt["state"].keys(), who
    for k, s in ref_opt["state"].items():
        for name, t in s.items():
            assert torch.equal(_bits(opt["state"][k][name]), _bits(t)), (who, k, name)


@needs_2_15
@pytest.mark.parametrize("profile,chain,route", CASES, ids=[f"{p or 'native'}-{c}-{r}" for p, c, r in CASES])
def test_a_killed_rank_is_survived(agent_store, profile, chain, route):
    plan = PLANS[chain]
    prefix = f"{profile}-{chain}-{route}"
    results, codes = _world("tests.fault_tolerance.chains:rank_chain", (agent_store.port, prefix, route, plan),
                            profile)
    victims = [v for _, v in plan]
    assert [codes[v] for v in victims] == [-9, -9], (codes, [r if r is None else r[1] for r in results])
    survivors = [r for r in range(4) if r not in victims]
    for r in survivors:
        assert codes[r] == 0 and results[r] is not None and results[r][0] == "ok", (r, codes, results[r])
    reference = _reference(chain, agent_store)
    for r in survivors:
        out = results[r][1]
        assert out["members"] == survivors, out["members"]
        assert len(out["errors"]) == 2, out["errors"]
        members = list(range(4))
        for (scenario, victim), err in zip(plan, out["errors"]):
            who = f"stable {r}, {scenario} at world {len(members)}"
            assert err["world"] == len(members) and err["scenario"] == scenario, (who, err)
            assert err["type"] in ("CollectiveError", "CollectiveTimeoutError"), (who, err)
            assert err["secs"] < GROUP_TIMEOUT + SLACK, (who, err)
            m = re.match(r"funcoll: (\w+) (?:p2p )?#\d+ on group '([^']+)' \(global ranks ([\d,\-]+); this is rank "
                         rf"{err['rank']} of {len(members)}\) (?:failed|timed out)", err["msg"])
            assert m and m.group(1) in OPS[scenario], (who, err["msg"])
            g = members.index(victim)
            # a shrunk default group numbers the world anew (as NCCL's); a reconfigured one keeps the peers' own
            # global ranks (as gloo's)
            glob = g if route == "shrink" else victim
            assert re.search(rf"Peer rank {g} of the group \(global rank {glob}, pid \d+ on this host\) has "
                             "exited\\.", err["msg"]), (who, err["msg"])
            members.remove(victim)
        _assert_same_state(out["state"], reference[r], f"stable {r}")


# -- the torchft route (torch 2.9 and 2.15): each rank a replica group; torchft's Manager forms a quorum of the live
# ones every step, a failed step is not committed, the next quorum leaves the dead replica out ---------------------
TORCHFT_PLAN = [("eager", 3, 2), ("batch", 1, 4)]  # (scenario, victim, step): world 4, then 3
TORCHFT_PARTICIPANTS = [4, 4, 3, 3, 2, 2]  # of each committed step


@pytest.fixture
def lighthouse():
    torchft = pytest.importorskip("torchft._torchft", reason="needs torchft >= 0.2 (funcoll's test extra)")
    # every replica joins the first quorum (they start together); a replica is dead 3 s after its last heartbeat
    lh = torchft.LighthouseServer(bind="[::]:0", min_replicas=1, join_timeout_ms=3000, heartbeat_timeout_ms=3000)
    yield lh.address()
    lh.shutdown()


_torchft_references: dict = {}


def _torchft_world(kind, profile, agent_store, lighthouse, prefix):
    return _world("tests.fault_tolerance.chains:rank_torchft",
                  (agent_store.port, prefix, lighthouse, kind, TORCHFT_PLAN), profile)


@pytest.mark.parametrize("profile", PROFILES, ids=[p or "native" for p in PROFILES])
def test_a_killed_replica_is_survived_through_torchft_quorums(agent_store, lighthouse, profile):
    results, codes = _torchft_world("funcoll", profile, agent_store, lighthouse, f"torchft-{profile}")
    victims = [v for _, v, _ in TORCHFT_PLAN]
    assert [codes[v] for v in victims] == [-9, -9], (codes, [r if r is None else r[1] for r in results])
    survivors = [r for r in range(4) if r not in victims]
    if not _torchft_references:  # torchft on gloo, the same deaths at the same steps: the oracle
        ref, ref_codes = _torchft_world("gloo", None, agent_store, lighthouse, "torchft-reference")
        assert [ref_codes[v] for v in victims] == [-9, -9], ref_codes
        _torchft_references.update({r: ref[r][1] for r in survivors})
    for r in survivors:
        assert codes[r] == 0 and results[r][0] == "ok", (r, codes, results[r])
        out, want = results[r][1], _torchft_references[r]
        assert out["participants"] == want["participants"] == TORCHFT_PARTICIPANTS, (out["participants"], want)
        assert [e["step"] for e in out["errors"]] == [step for _, _, step in TORCHFT_PLAN], out["errors"]
        for err in out["errors"]:
            assert err["type"] in ("CollectiveError", "CollectiveTimeoutError"), err
            assert re.match(r"funcoll: all_reduce #\d+ on group 'torchft_quorum_\d+_rank_0' \(global ranks [\d,\-]+; "
                            r"this is rank \d of [43]\) (?:failed|timed out)", err["msg"]), err["msg"]
            assert re.search(r"Peer rank \d of the group \(global rank \d, pid \d+ on this host\) has exited\.",
                             err["msg"]), err["msg"]
        _assert_same_state(out["state"], want["state"], f"replica {r}")
