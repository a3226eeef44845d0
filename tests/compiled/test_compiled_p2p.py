"""Point-to-point calls inside torch.compile on a funcoll world (2 and 3 CPU ranks).

With ``torch._dynamo.config.enable_p2p_compilation`` on (torch >= 2.15), Dynamo turns ``dist.isend``/``irecv`` and
``dist.batch_isend_irecv`` into ``_c10d_functional.isend``/``irecv``/``batch_p2p_ops`` nodes. isend/irecv reach the
group's send and recv through torch's kernels; torch's batch kernel needs a C++ backend per device, which a Python
group has not, so funcoll serves the batch on its groups (and torch's kernel still serves other groups). The numbers
of the eager, aot_eager and inductor runs equal the reference on every rank, and each function is one graph.
"""

import pytest
import torch

from funcoll.launch import run_world

pytestmark = pytest.mark.skipif(not hasattr(torch.ops._c10d_functional, "batch_p2p_ops"),
                                reason=f"torch {torch.__version__} does not compile point-to-point calls")

RING = """arg0_1: float32[3, 2]@cpu
empty_like = aten.empty_like(arg0_1) -> float32[3, 2]@cpu
add = aten.add.Tensor(arg0_1, {rank}) -> float32[3, 2]@cpu
batch_p2p_ops = c10d.batch_p2p_ops(['isend', 'irecv'], [{nxt}, {prv}], [0, 0], [add, empty_like], <world>) \
-> (float32[0]@cpu, float32[3, 2]@cpu)
getitem = getitem(batch_p2p_ops, 0) -> float32[0]@cpu
getitem_1 = getitem(batch_p2p_ops, 1) -> float32[3, 2]@cpu
wait_tensors = c10d.wait_tensors([getitem, getitem_1]) -> (float32[0]@cpu, float32[3, 2]@cpu)
getitem_3 = getitem(wait_tensors, 1) -> float32[3, 2]@cpu
mul = aten.mul.Tensor(getitem_3, 3) -> float32[3, 2]@cpu
return [mul]"""

PAIR_RANK0 = """arg0_1: int64[4]@cpu
arg1_1: float32[3, 2]@cpu
empty_like = aten.empty_like(arg0_1) -> int64[4]@cpu
mul = aten.mul.Tensor(arg1_1, 2) -> float32[3, 2]@cpu
isend = c10d.isend(mul, 1, 0, <world>) -> float32[0]@cpu
irecv = c10d.irecv(empty_like, 1, 0, <world>) -> int64[4]@cpu
wait_tensor = c10d.wait_tensor(irecv) -> int64[4]@cpu
wait_tensor_1 = c10d.wait_tensor(isend) -> float32[0]@cpu
wait_tensor_2 = c10d.wait_tensor(wait_tensor) -> int64[4]@cpu
return [empty_like]"""


@pytest.mark.parametrize("n", [2, 3])
def test_compiled_isend_irecv_and_batch_give_the_reference_in_one_graph(n):
    for rank, r in enumerate(run_world("tests.compiled.cases_compiled_p2p:main", n, timeout=300)):
        assert r["failures"] == [], "\n".join(r["failures"])
        names = {f"ring {b}" for b in ("aot_eager", "inductor")} | ({"pair aot_eager", "pair inductor"} if n == 2
                                                                     else set())
        assert set(r["nodes"]) == names
        assert all(count == 1 for count, _ in r["nodes"].values())
        ring = RING.format(rank=rank, nxt=(rank + 1) % n, prv=(rank - 1) % n)
        assert r["nodes"]["ring aot_eager"][1] == ring
        assert "c10d.batch_p2p_ops(['isend', 'irecv']" in r["nodes"]["ring inductor"][1]
        if n == 2 and rank == 0:
            assert r["nodes"]["pair aot_eager"][1] == PAIR_RANK0
