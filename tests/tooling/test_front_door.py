"""``import funcoll`` imports the layers and registers the backend, not the tools beside them (the probe, the report,
the replica runner, the launcher, the test helpers): those load on first use, ``funcoll.probe`` as an attribute too.
``FUNCOLL_PROBE=1``, read when a group is made, still probes every group (the probe is imported then)."""

from tests import fresh

TOOLS = ["funcoll.probe", "funcoll.report", "funcoll.replicas", "funcoll.launch", "funcoll.testing"]


def front_door(probe_groups: bool, store_path: str) -> dict:
    """In a fresh interpreter: which tools ``import funcoll`` and a 1-rank funcoll world imported, and what the probe
    then says of that world."""
    import os
    import sys

    import torch
    import torch.distributed as dist

    import funcoll

    seen = {"after import": [m for m in TOOLS if m in sys.modules]}
    if probe_groups:
        os.environ["FUNCOLL_PROBE"] = "1"
    dist.init_process_group("funcoll", init_method=f"file://{store_path}", rank=0, world_size=1)
    t = torch.arange(4.0)
    dist.all_reduce(t)
    seen["after a collective"] = [m for m in TOOLS if m in sys.modules]
    seen["sum"] = t.tolist()
    seen["probed"] = [(r.group, r.device_type, r.wrong, bool(r.checked)) for r in funcoll.probe.results()]
    seen["all resolve"] = all(hasattr(funcoll, name) for name in funcoll.__all__)
    dist.destroy_process_group()
    return seen


def test_import_funcoll_imports_no_tool_and_the_probe_loads_on_first_use(tmp_path):
    env = {"FUNCOLL_PROBE": None, "FUNCOLL_PROBE_CACHE": "off", "FUNCOLL_PROFILE": None}
    got = fresh.run_all({probe: ("tests.tooling.test_front_door:front_door", probe, str(tmp_path / f"store{probe}"))
                         for probe in (False, True)}, env=env, timeout=300)
    assert got[False] == {"after import": [], "after a collective": [], "sum": [0.0, 1.0, 2.0, 3.0], "probed": [],
                          "all resolve": True}
    # FUNCOLL_PROBE=1 set after the import, before the group: the world's transport is probed at its creation
    assert got[True] == {"after import": [], "after a collective": ["funcoll.probe", "funcoll.report"],
                         "sum": [0.0, 1.0, 2.0, 3.0], "probed": [["0", "cpu", {}, True]], "all resolve": True}
