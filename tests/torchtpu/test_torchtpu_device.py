# ruff: noqa: E501
"""funcoll's ``tpu`` kernels next to TorchTPU itself: torch_tpu loaded in a fresh interpreter (it renames the
PrivateUse1 key process-wide, and a real ``tpu`` tensor aborts a process without a TPU), its device init run by hand,
then (tests/torchtpu/torchtpu_cases.py ``torch_tpu_main``):

* FX graphs of every ``_c10d_functional`` op traced on fake ``tpu`` tensors over a fake 4-rank group: the graph is
  pinned, identical with and without funcoll's kernels installed, and the graph a CUDA user gets (funcoll changes the
  kernel behind each node, never the graph: TorchTPU's compile still sees one collective node per collective);
* funcoll's kernels on the PrivateUse1 key reached by redispatching CPU tensors to it, on a 1-rank gloo group under
  ``FUNCOLL_PROFILE=torchtpu``: the strategies of the TorchTPU table run; after ``uninstall`` they no longer do.

Needs torch_tpu (the ``torchtpu`` environment); skipped elsewhere. No real ``tpu`` tensor is made in this process.
"""

import importlib.util

import pytest

from tests import fresh

pytestmark = pytest.mark.skipif(importlib.util.find_spec("torch_tpu") is None,
                                reason="torch_tpu is not installed in this environment (TorchTPU needs torch "
                                       "2.11-2.15: the 'torchtpu' environment has it)")

# the graph as funcoll.testing.render_graph prints it (one node per line; long lines are the nodes)
GRAPH = """\
x_1: float32[8, 4]@tpu
y_1: bfloat16[4]@tpu
z_1: int32[8]@tpu
w_1: float32[4, 3]@tpu
f8_1: float8_e4m3fn[2, 4]@tpu
all_reduce = c10d.all_reduce(x_1, 'avg', <world>) -> float32[8, 4]@tpu
wait_tensor = c10d.wait_tensor(all_reduce) -> float32[8, 4]@tpu
all_reduce_coalesced = c10d.all_reduce_coalesced([x_1, y_1], 'max', <world>) -> (float32[8, 4]@tpu, bfloat16[4]@tpu)
getitem = getitem(all_reduce_coalesced, 0) -> float32[8, 4]@tpu
getitem_1 = getitem(all_reduce_coalesced, 1) -> bfloat16[4]@tpu
wait_tensors = c10d.wait_tensors([getitem, getitem_1]) -> (float32[8, 4]@tpu, bfloat16[4]@tpu)
getitem_2 = getitem(wait_tensors, 0) -> float32[8, 4]@tpu
getitem_3 = getitem(wait_tensors, 1) -> bfloat16[4]@tpu
all_gather_into_tensor = c10d.all_gather_into_tensor(f8_1, 4, <world>) -> float8_e4m3fn[8, 4]@tpu
wait_tensor_1 = c10d.wait_tensor(all_gather_into_tensor) -> float8_e4m3fn[8, 4]@tpu
all_gather_into_tensor_coalesced = c10d.all_gather_into_tensor_coalesced([x_1, z_1], 4, <world>) -> (float32[32, 4]@tpu, int32[32]@tpu)
getitem_4 = getitem(all_gather_into_tensor_coalesced, 0) -> float32[32, 4]@tpu
getitem_5 = getitem(all_gather_into_tensor_coalesced, 1) -> int32[32]@tpu
wait_tensors_1 = c10d.wait_tensors([getitem_4, getitem_5]) -> (float32[32, 4]@tpu, int32[32]@tpu)
getitem_6 = getitem(wait_tensors_1, 0) -> float32[32, 4]@tpu
getitem_7 = getitem(wait_tensors_1, 1) -> int32[32]@tpu
reduce_scatter_tensor = c10d.reduce_scatter_tensor(x_1, 'max', 4, <world>) -> float32[2, 4]@tpu
wait_tensor_2 = c10d.wait_tensor(reduce_scatter_tensor) -> float32[2, 4]@tpu
reduce_scatter_tensor_coalesced = c10d.reduce_scatter_tensor_coalesced([x_1, z_1], 'sum', 4, <world>) -> (float32[2, 4]@tpu, int32[2]@tpu)
getitem_8 = getitem(reduce_scatter_tensor_coalesced, 0) -> float32[2, 4]@tpu
getitem_9 = getitem(reduce_scatter_tensor_coalesced, 1) -> int32[2]@tpu
wait_tensors_2 = c10d.wait_tensors([getitem_8, getitem_9]) -> (float32[2, 4]@tpu, int32[2]@tpu)
getitem_10 = getitem(wait_tensors_2, 0) -> float32[2, 4]@tpu
getitem_11 = getitem(wait_tensors_2, 1) -> int32[2]@tpu
all_to_all_single = c10d.all_to_all_single(w_1, [3, 1], [2, 2], <group 0,1>) -> float32[4, 3]@tpu
wait_tensor_3 = c10d.wait_tensor(all_to_all_single) -> float32[4, 3]@tpu
broadcast = c10d.broadcast(y_1, 1, <world>) -> bfloat16[4]@tpu
wait_tensor_4 = c10d.wait_tensor(broadcast) -> bfloat16[4]@tpu
mul = aten.mul.Tensor(wait_tensor, 2) -> float32[8, 4]@tpu
return [mul, getitem_2, getitem_3, wait_tensor_1, getitem_6, getitem_7, wait_tensor_2, getitem_10, getitem_11, wait_tensor_3, wait_tensor_4]"""


@pytest.fixture(scope="module")
def tpu():
    env = {"TORCH_DEVICE_BACKEND_AUTOLOAD": "0", "TPU_SKIP_MDS_QUERY": "1", "FUNCOLL_PROFILE": "torchtpu",
           "PYTHONWARNINGS": "ignore"}
    return fresh.run("tests.torchtpu.torchtpu_cases:torch_tpu_main", env=env, timeout=240)


def test_torch_tpu_owns_privateuse1_and_registers_its_backends(tpu):
    assert tpu["privateuse1"] == "tpu"
    assert tpu["backends"] == ["tpu", "tpu_dist"]
    assert tpu["installed"] == ["tpu"]


def test_the_graph_of_every_functional_op_on_tpu_tensors(tpu):
    assert tpu["with_funcoll"]["true"] == GRAPH


def test_installing_funcoll_changes_no_graph_and_it_is_the_cuda_graph(tpu):
    for functional in ("false", "true"):
        assert tpu["with_funcoll"][functional] == tpu["before"][functional]
        assert tpu["with_funcoll"][functional] == tpu["cuda"][functional].replace("@cuda", "@tpu").replace(
            "device=cuda", "device=tpu")
    assert tpu["code_with_funcoll"] == tpu["cuda_code"]


def test_a_group_without_processgrouptpu_is_refused_with_the_fix(tpu):
    assert tpu["fake_backend"] == ("funcoll: the tpu backend of group '0' is FakeProcessGroup; funcoll drives "
                                   "TorchTPU's ProcessGroupTpu ('tpu_dist') on tpu")


def test_kernels_on_privateuse1_run_funcolls_strategies(tpu):
    assert tpu["redispatch"] == {
        "all_reduce avg int8": [3, -7, 100],  # one rank: the average is the value (int64 sum, truncating divide)
        "all_reduce bxor int32": [5, 6],
        "broadcast -0.0": ["-0.0", "2.5"],  # bit-exact: the sign of zero survives
        "all_gather float32": [1.5, 2.0],
        "reduce_scatter avg bfloat16": [1.0, 3.0],
        "all_to_all_single splits": [4.0, 5.0],
    }
    assert tpu["redispatch_log"] == [
        ["all_reduce", ["avg=int64 sum+truncating divide"]],
        ["all_reduce", ["native"]],
        ["broadcast", ["broadcast=masked all_reduce"]],
        ["all_gather_into_tensor", ["native"]],
        ["reduce_scatter_tensor", ["avg=sum+scale in float32"]],
        # split sizes passed (the functional op always passes them): the ranks agree on them, then the even exchange
        ["all_to_all_single", ["splits even on every rank: even all_to_all"]],
    ]
    assert tpu["after_uninstall_log"] == []
