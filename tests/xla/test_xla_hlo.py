"""The HLO a multi-replica XLA job compiles, read from virtual funcoll worlds of 2, 4 and 8 ranks.

The worlds are built one after the other in a fresh interpreter (``tests.xla.xla_cases:funcoll_worlds`` run by
tests/fresh.py: this process may have its own default process group) with a HashStore; the collectives are built
lazily and their HLO read, never run (the CPU PJRT device has one replica). Snapshots are of rank 1; world 4 also
runs as ranks 0, 2 and 3 to show that every rank emits the same collectives. Regenerate a snapshot with
``EXPECTTEST_ACCEPT=1 ./dev test tests/xla/test_xla_hlo.py`` and review the diff.
"""

import pytest

pytest.importorskip("torch_xla", reason="needs torch_xla (the XLA transport); runs on PJRT_DEVICE=CPU")
import expecttest  # noqa: E402

from tests import fresh  # noqa: E402
from tests.xla.replica_runs import XLA_CPU  # noqa: E402

pytestmark = pytest.mark.xla
RUNS = [(2, 1), (4, 0), (4, 1), (4, 2), (4, 3), (8, 1)]
_cache: dict = {}


def world(size: int, rank: int = 1) -> dict:
    """{case: HLO text} of rank ``rank`` of the virtual world of ``size`` (all built once, in one fresh interpreter)."""
    if not _cache:
        _cache.update(fresh.run("tests.xla.xla_cases:funcoll_worlds", [f"{w}:{r}" for w, r in RUNS], env=XLA_CPU,
                                timeout=300))
    return _cache[f"{size}:{rank}"]


def show(*cases) -> str:
    """``(world size, case name)`` pairs as one text: a header line per case, then its HLO lines."""
    return "\n".join(f"-- world {w}: {name}\n{world(w)[name]}" for w, name in cases)


class TestHloSnapshots(expecttest.TestCase):
    maxDiff = None

    def test_replica_groups_world_mesh_and_lone_groups(self):
        self.assertExpectedInline(show(
            (2, "world all_reduce sum"), (4, "world all_reduce sum"), (8, "world all_reduce sum"),
            (2, "lone group [1] all_reduce"),
            (4, "lone group [1, 2] all_reduce"), (4, "lone group [1, 2, 3] all_reduce"),
            (8, "lone group [1, 2] all_reduce"), (8, "lone group [1, 2, 3, 4, 5, 6, 7] all_reduce"),
            (4, "mesh (2, 2) dp all_reduce"), (4, "mesh (2, 2) tp all_reduce"),
            (8, "mesh (2, 4) dp all_reduce"), (8, "mesh (2, 4) tp all_reduce")), """\
-- world 2: world all_reduce sum
all-reduce(f32[4], f32[]) -> (f32[4],f32[])  replica_groups={} to_apply=add
-- world 4: world all_reduce sum
all-reduce(f32[4], f32[]) -> (f32[4],f32[])  replica_groups={} to_apply=add
-- world 8: world all_reduce sum
all-reduce(f32[4], f32[]) -> (f32[4],f32[])  replica_groups={} to_apply=add
-- world 2: lone group [1] all_reduce
all-reduce(f32[4], f32[]) -> (f32[4],f32[])  replica_groups={{0},{1}} to_apply=add
-- world 4: lone group [1, 2] all_reduce
all-reduce(f32[4], f32[]) -> (f32[4],f32[])  replica_groups={{0},{1,2},{3}} to_apply=add
-- world 4: lone group [1, 2, 3] all_reduce
all-reduce(f32[4], f32[]) -> (f32[4],f32[])  replica_groups={{0},{1,2,3}} to_apply=add
-- world 8: lone group [1, 2] all_reduce
all-reduce(f32[4], f32[]) -> (f32[4],f32[])  replica_groups={{0},{1,2},{3},{4},{5},{6},{7}} to_apply=add
-- world 8: lone group [1, 2, 3, 4, 5, 6, 7] all_reduce
all-reduce(f32[4], f32[]) -> (f32[4],f32[])  replica_groups={{0},{1,2,3,4,5,6,7}} to_apply=add
-- world 4: mesh (2, 2) dp all_reduce
all-reduce(f32[4], f32[]) -> (f32[4],f32[])  replica_groups={{0,2},{1,3}} to_apply=add
-- world 4: mesh (2, 2) tp all_reduce
all-reduce(f32[4], f32[]) -> (f32[4],f32[])  replica_groups={{0,1},{2,3}} to_apply=add
-- world 8: mesh (2, 4) dp all_reduce
all-reduce(f32[4], f32[]) -> (f32[4],f32[])  replica_groups={{0,4},{1,5},{2,6},{3,7}} to_apply=add
-- world 8: mesh (2, 4) tp all_reduce
all-reduce(f32[4], f32[]) -> (f32[4],f32[])  replica_groups={{0,1,2,3},{4,5,6,7}} to_apply=add""")

    def test_the_whole_world_is_replica_groups_all(self):
        # a group of every rank emits replica_groups={} (every replica), as torch_xla's own kernels do: the same graph
        # as the default group's, and building it costs the same at any world size
        self.assertExpectedInline(show(
            (4, "new group of every rank all_reduce"), (4, "new group of every rank all_gather")), """\
-- world 4: new group of every rank all_reduce
all-reduce(f32[4], f32[]) -> (f32[4],f32[])  replica_groups={} to_apply=add
-- world 4: new group of every rank all_gather
all-gather(s32[4]) -> s32[16]  replica_groups={} dimensions={0}""")

    def test_a_mesh_dim_needs_no_registration(self):
        # without funcoll.groups.register_mesh(mesh) each rank knows only its own block, and infers the regular
        # partition it belongs to (funcoll.groups.regular_partition): the same groups as registered
        self.assertExpectedInline(show(
            (4, "mesh (2, 2) dp all_reduce, partition not registered"),
            (4, "mesh (2, 2) tp all_reduce, partition not registered")), """\
-- world 4: mesh (2, 2) dp all_reduce, partition not registered
all-reduce(f32[4], f32[]) -> (f32[4],f32[])  replica_groups={{0,2},{1,3}} to_apply=add
-- world 4: mesh (2, 2) tp all_reduce, partition not registered
all-reduce(f32[4], f32[]) -> (f32[4],f32[])  replica_groups={{0,1},{2,3}} to_apply=add""")

    def test_all_gather_on_lone_groups(self):
        # uniform blocks when the other ranks can be cut into blocks of the group's size, else one masked
        # all-reduce over the mixed-size groups (XLA's all-gather needs groups of one size); floats are moved as the
        # integers of their bits (XLA's CPU compiler turns a float all-gather into a float all-reduce)
        self.assertExpectedInline(show(
            (4, "lone group [1, 2] all_gather"), (4, "lone group [1, 2, 3] all_gather"),
            (8, "lone group [1, 2] all_gather"), (2, "lone group [1] all_gather")), """\
-- world 4: lone group [1, 2] all_gather
all-gather(s32[4]) -> s32[8]  replica_groups={{0,3},{1,2}} dimensions={0}
-- world 4: lone group [1, 2, 3] all_gather
all-reduce(s32[12], s32[]) -> (s32[12],s32[])  replica_groups={{0},{1,2,3}} to_apply=add
-- world 8: lone group [1, 2] all_gather
all-gather(s32[4]) -> s32[8]  replica_groups={{0,3},{1,2},{4,5},{6,7}} dimensions={0}
-- world 2: lone group [1] all_gather
all-gather(s32[4]) -> s32[4]  replica_groups={{0},{1}} dimensions={0}""")

    def test_avg_is_one_all_reduce_and_one_divide(self):
        self.assertExpectedInline(show(
            (2, "world all_reduce avg"), (4, "world all_reduce avg"), (8, "world all_reduce avg")), """\
-- world 2: world all_reduce avg
all-reduce(f32[4], f32[]) -> (f32[4],f32[])  replica_groups={} to_apply=add
divide(f32[4], f32[4]) -> f32[4]
-- world 4: world all_reduce avg
all-reduce(f32[4], f32[]) -> (f32[4],f32[])  replica_groups={} to_apply=add
divide(f32[4], f32[4]) -> f32[4]
-- world 8: world all_reduce avg
all-reduce(f32[4], f32[]) -> (f32[4],f32[])  replica_groups={} to_apply=add
divide(f32[4], f32[4]) -> f32[4]""")

    def test_premul_sum_is_one_multiply_and_one_all_reduce(self):
        self.assertExpectedInline(show(
            (2, "world all_reduce premul_sum 0.5"), (8, "world all_reduce premul_sum 0.5")), """\
-- world 2: world all_reduce premul_sum 0.5
multiply(f32[4], f32[4]) -> f32[4]
all-reduce(f32[4], f32[]) -> (f32[4],f32[])  replica_groups={} to_apply=add
-- world 8: world all_reduce premul_sum 0.5
multiply(f32[4], f32[4]) -> f32[4]
all-reduce(f32[4], f32[]) -> (f32[4],f32[])  replica_groups={} to_apply=add""")

    def test_bitwise_and_unsigned(self):
        # BXOR, and integer BAND/BOR (XLA runs and/or all-reduces on bool only): all-to-all, a local reduce, all-gather
        self.assertExpectedInline(show(
            (4, "world all_reduce bxor int32"), (4, "world all_reduce band int32"),
            (4, "world all_reduce max uint32")), """\
-- world 4: world all_reduce bxor int32
all-to-all(s32[1], s32[1], s32[1], s32[1]) -> (s32[1],s32[1],s32[1],s32[1])  replica_groups={}
all-gather(s32[1]) -> s32[4]  replica_groups={} dimensions={0}
-- world 4: world all_reduce band int32
all-to-all(s32[1], s32[1], s32[1], s32[1]) -> (s32[1],s32[1],s32[1],s32[1])  replica_groups={}
all-gather(s32[1]) -> s32[4]  replica_groups={} dimensions={0}
-- world 4: world all_reduce max uint32
all-reduce(u32[4], u32[]) -> (u32[4],u32[])  replica_groups={} to_apply=maximum""")

    def test_uneven_all_to_all_pads_to_the_static_bound(self):
        self.assertExpectedInline(show(
            (2, "world all_to_all uneven (static bound 3)"), (8, "world all_to_all uneven (static bound 3)"),
            (4, "world all_to_all uneven (static bound 3), pad/slice")), """\
-- world 2: world all_to_all uneven (static bound 3)
all-to-all(s32[3], s32[3]) -> (s32[3],s32[3])  replica_groups={}
-- world 8: world all_to_all uneven (static bound 3)
all-to-all(s32[3], s32[3], s32[3], s32[3], s32[3], s32[3], s32[3], s32[3]) -> \
(s32[3],s32[3],s32[3],s32[3],s32[3],s32[3],s32[3],s32[3])  replica_groups={}
-- world 4: world all_to_all uneven (static bound 3), pad/slice
slice(f32[8]) -> f32[2]  slice={[0:2]}
concatenate(f32[2], f32[1]) -> f32[3]  dimensions={0}
slice(f32[8]) -> f32[1]  slice={[2:3]}
concatenate(f32[1], f32[2]) -> f32[3]  dimensions={0}
slice(f32[8]) -> f32[3]  slice={[3:6]}
slice(f32[8]) -> f32[2]  slice={[6:8]}
concatenate(f32[2], f32[1]) -> f32[3]  dimensions={0}
concatenate(f32[3], f32[3], f32[3], f32[3]) -> f32[12]  dimensions={0}
slice(s32[12]) -> s32[3]  slice={[0:3]}
slice(s32[12]) -> s32[3]  slice={[3:6]}
slice(s32[12]) -> s32[3]  slice={[6:9]}
slice(s32[12]) -> s32[3]  slice={[9:12]}
all-to-all(s32[3], s32[3], s32[3], s32[3]) -> (s32[3],s32[3],s32[3],s32[3])  replica_groups={}
concatenate(s32[3], s32[3], s32[3], s32[3]) -> s32[12]  dimensions={0}
slice(f32[12]) -> f32[3]  slice={[0:3]}
slice(f32[12]) -> f32[1]  slice={[3:4]}
slice(f32[12]) -> f32[2]  slice={[6:8]}
slice(f32[12]) -> f32[3]  slice={[9:12]}
concatenate(f32[3], f32[1], f32[2], f32[3]) -> f32[9]  dimensions={0}""")

    def test_uneven_all_to_all_without_a_bound_on_a_virtual_world_is_a_clear_error(self):
        self.assertExpectedInline(world(4)["world all_to_all uneven, no bound"], """\
raises ValueError: funcoll.all_to_all_single: split sizes on a virtual XLA world (4 ranks in a process whose XLA \
runtime has fewer replicas) need a static bound: wrap the call in funcoll.xla.static_split_bound(bound). Without \
one, the ranks agree on the largest split with a collective that must run, and a virtual world cannot run \
collectives""")

    def test_coalesced_all_reduce_is_one_all_reduce_per_dtype(self):
        self.assertExpectedInline(show(
            (4, "world all_reduce_coalesced 3 f32"), (4, "functional all_reduce_coalesced f32+int32+f32")), """\
-- world 4: world all_reduce_coalesced 3 f32
all-reduce(f32[3], f32[2,2], f32[5], f32[]) -> (f32[3],f32[2,2],f32[5],f32[])  replica_groups={} to_apply=add
-- world 4: functional all_reduce_coalesced f32+int32+f32
all-reduce(s32[2], s32[]) -> (s32[2],s32[])  replica_groups={} to_apply=add
all-reduce(f32[3], f32[5], f32[]) -> (f32[3],f32[5],f32[])  replica_groups={} to_apply=add""")

    def test_broadcast_from_a_non_zero_root(self):
        # one all-reduce of the integers of the tensor's bits (the bits arrive as they are), every rank but the root
        # contributing 0; the root is device data, not a constant, so every rank compiles the same HLO
        # (test_every_rank_emits_the_same_collectives)
        self.assertExpectedInline(show(
            (2, "world broadcast src=1"), (4, "world broadcast src=3"), (8, "world broadcast src=7")), """\
-- world 2: world broadcast src=1
all-reduce(s32[4], s32[]) -> (s32[4],s32[])  replica_groups={} to_apply=add
-- world 4: world broadcast src=3
all-reduce(s32[4], s32[]) -> (s32[4],s32[])  replica_groups={} to_apply=add
-- world 8: world broadcast src=7
all-reduce(s32[4], s32[]) -> (s32[4],s32[])  replica_groups={} to_apply=add""")

    def test_reduce_scatter_on_a_mesh_dim(self):
        self.assertExpectedInline(show(
            (4, "mesh (2, 2) tp reduce_scatter"), (8, "mesh (2, 4) tp reduce_scatter"),
            (4, "mesh (2, 2) dp functional reduce_scatter avg")), """\
-- world 4: mesh (2, 2) tp reduce_scatter
reduce-scatter(f32[4]) -> f32[2]  replica_groups={{0,1},{2,3}} dimensions={0} to_apply=add
-- world 8: mesh (2, 4) tp reduce_scatter
reduce-scatter(f32[8]) -> f32[2]  replica_groups={{0,1,2,3},{4,5,6,7}} dimensions={0} to_apply=add
-- world 4: mesh (2, 2) dp functional reduce_scatter avg
reduce-scatter(f32[4]) -> f32[2]  replica_groups={{0,2},{1,3}} dimensions={0} to_apply=add
multiply(f32[], f32[]) -> f32[]
divide(f32[2], f32[2]) -> f32[2]""")

    def test_reduce_gather_scatter_send_recv_without_a_graph_sync(self):
        # torch_xla's ProcessGroupXla runs reduce/gather/send/recv with a torch_xla.sync() each; funcoll builds
        # them as one lazy collective (the sender's collective-permute is kept until the step)
        self.assertExpectedInline(show(
            (4, "world reduce dst=this rank"), (4, "world gather dst=this rank"), (4, "world scatter src=0"),
            (4, "lone group [1, 2] send 1->2 / recv")), """\
-- world 4: world reduce dst=this rank
all-reduce(f32[4], f32[]) -> (f32[4],f32[])  replica_groups={} to_apply=add
-- world 4: world gather dst=this rank
all-gather(s32[4]) -> s32[16]  replica_groups={} dimensions={0}
-- world 4: world scatter src=0
all-reduce(s32[16], s32[]) -> (s32[16],s32[])  replica_groups={} to_apply=add
-- world 4: lone group [1, 2] send 1->2 / recv
collective-permute(f32[4]) -> f32[4]  source_target_pairs={{1,2}}""")


def test_eager_and_compiled_entry_points_emit_the_same_collectives():
    for w in (2, 4, 8):
        cases = world(w)
        assert cases["functional all_reduce avg"] == cases["world all_reduce avg"]
        assert (cases["functional all_to_all uneven (static bound 3)"]
                == cases["world all_to_all uneven (static bound 3)"])
        assert cases[f"functional broadcast src={w - 1}"] == cases[f"world broadcast src={w - 1}"]


RANK_INDEPENDENT = ["world all_reduce sum", "world all_reduce avg", "world all_reduce premul_sum 0.5",
                    "world all_reduce bxor int32", "world all_reduce_coalesced 3 f32", "world broadcast src=3",
                    "world all_to_all uneven (static bound 3)", "world scatter src=0", "world reduce dst=this rank",
                    "mesh (2, 2) dp all_reduce", "mesh (2, 2) tp all_reduce", "mesh (2, 2) tp reduce_scatter",
                    "mesh (2, 2) dp functional reduce_scatter avg"]


def test_every_rank_emits_the_same_collectives():
    texts = {r: world(4, r) for r in range(4)}
    for name in RANK_INDEPENDENT:
        assert {texts[r][name] for r in range(4)} == {texts[1][name]}, name
        assert "replica_groups=" in texts[1][name], name


def test_without_the_registered_partition_ranks_still_agree_on_mesh_dims():
    # each rank knows only its own block of the mesh dim; the regular partition it infers is the same everywhere
    lines = {r: world(4, r)["mesh (2, 2) tp all_reduce, partition not registered"].split("replica_groups=")[1]
             for r in range(4)}
    assert lines == {r: "{{0,1},{2,3}} to_apply=add" for r in range(4)}
    lines = {r: world(4, r)["mesh (2, 2) dp all_reduce, partition not registered"].split("replica_groups=")[1]
             for r in range(4)}
    assert lines == {r: "{{0,2},{1,3}} to_apply=add" for r in range(4)}


def test_reduce_and_gather_keep_the_collective_on_ranks_that_are_not_dst():
    cases = world(4)
    assert cases["world reduce dst=other rank"] == cases["world reduce dst=this rank"]
    assert cases["world gather dst=other rank"] == cases["world gather dst=this rank"]
