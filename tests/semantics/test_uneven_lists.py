"""The list forms ``dist.reduce_scatter(out, inputs)`` and ``dist.all_gather(outs, inp)`` on the path users get by
default (the native fast path on), at worlds 2 and 3, on the native, xccl, xla and torchtpu profiles.

* Sizes may differ per rank, as NCCL serves them (ProcessGroupNCCL::allgather / ::reduce_scatter: one broadcast / one
  reduce per rank when the sizes differ), as ProcessGroupXCCL does the same (intel/torch-xpu-ops
  src/xccl/ProcessGroupXCCL.cpp, release/2.9 to main ab84f925) and as gloo's list reduce_scatter does (one all_reduce
  per destination: pytorch/pytorch torch/csrc/distributed/c10d/ProcessGroupGloo.cpp; gloo's list allgather refuses
  them): ``inputs[r]`` has rank r's output size, ``outs[r]`` rank r's input size. Even sizes, sizes with a 0, and (at
  world 3) skewed sizes.
* Every rank's tensors have another layout (contiguous, transposed, a strided view): the exchange is a function of
  what every rank shares, so a contiguous rank (the backend's list form through the fast path) and a strided one (the
  full path) meet in the same exchange. Before, the full path of the list reduce_scatter ran gloo's tensor
  reduce_scatter (one all_reduce of the concatenation) where the fast path ran its list form (one all_reduce per
  destination), and gloo aborted the process ("Received data size doesn't match expected size").
* References are computed here with plain torch from every rank's input, and compared with raw gloo's results where
  gloo serves the request (on a plain gloo group of the same ranks).
* A size the ranks disagree on is an error naming both sides on every rank under ``TORCH_DISTRIBUTED_DEBUG=DETAIL``
  (tests/faults/test_faults.py, kinds "gather_list" and "reduce_scatter_list", with the other mismatches).
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from funcoll import algorithms
from funcoll.launch import run_world

R = dist.ReduceOp
LAYOUTS = ("contiguous", "transposed", "strided")

# per world: the output shape of each rank of a list reduce_scatter (the input shape of each rank of a list all_gather)
CASES = {
    2: {"even": [(2, 3), (2, 3)], "uneven": [(1, 2), (3, 2)], "zero": [(0, 2), (2, 2)]},
    3: {"even": [(2, 3)] * 3, "uneven": [(1, 2), (2, 2), (3, 2)], "skewed": [(0, 2), (1, 2), (6, 2)]},
}
RS_OPS = [(torch.float32, "SUM"), (torch.bfloat16, "MAX"), (torch.float32, "AVG")]
AG_DTYPES = [torch.float32, torch.bfloat16]


def _value(shape, dtype, rank: int, dest: int, salt: int) -> torch.Tensor:
    """Rank ``rank``'s tensor for rank ``dest``: small integers (exact in bfloat16, and in every sum and average)."""
    n = 1
    for d in shape:
        n *= d
    v = (torch.arange(n, dtype=torch.float64) * (rank + 1 + salt) + 7 * dest - 3 * rank) % 41 - 20
    return v.reshape(shape).to(dtype)


def _laid_out(t: torch.Tensor, layout: str) -> torch.Tensor:
    """``t``'s values in a tensor of ``layout``: contiguous, transposed (the strides of a transposed 2-D tensor), or a
    view of every other element of a larger buffer."""
    if layout == "contiguous":
        return t.clone()
    if layout == "transposed":
        return t.t().contiguous().t()
    buf = torch.full((2 * t.numel() + 1,), 99, dtype=t.dtype)
    view = buf[1::2].view(t.shape) if t.numel() else buf[:0].view(t.shape)
    view.copy_(t)
    return view


def _reduced(op: str, xs):
    x = torch.stack([t.double() for t in xs])
    if op == "SUM":
        return x.sum(0)
    if op == "MAX":
        return x.max(0).values
    return x.sum(0) / len(xs)


def _strategies(group) -> list:
    import funcoll

    return funcoll.flight_recorder.entries(group)[-1].strategies


def _rank_lists(rank, n):
    """Every case, op and dtype, this rank's tensors in layout ``LAYOUTS[rank]``: results, raw gloo's results where gloo
    serves the request, the strategy each call took (the flight recorder, which keeps the fast path on)."""
    layout = LAYOUTS[rank % len(LAYOUTS)]
    gloo = dist.new_group(backend="gloo")
    world = dist.group.WORLD
    tp = world.transport("cpu")
    out = {"failures": [], "strategies": {}, "count": 0, "calls": {}, "full path": {}}
    full = {"reduce_scatter": 0, "all_gather": 0}  # calls that went through funcoll.algorithms (not the fast path)
    for op_name in full:
        def spy(*a, _orig=getattr(algorithms, op_name), _name=op_name, **k):
            full[_name] += 1
            return _orig(*a, **k)
        setattr(algorithms, op_name, spy)

    def calls_since(before: dict) -> list:
        """The backend calls made since ``before`` (the transport's count, which the fast path keeps too)."""
        return sorted((str(k), v - before.get(k, 0)) for k, v in tp.calls.items() if v != before.get(k, 0))

    def check(name, got, want, exact):
        out["count"] += 1
        ok = got.shape == want.shape and (torch.equal(got.double(), want.double()) if exact
                                          else torch.allclose(got.double(), want.double(), rtol=1e-6, atol=1e-6))
        if not ok:
            out["failures"].append(f"[rank {rank}] {name}: got {got.tolist()}, want {want.tolist()}")

    for case, shapes in CASES[n].items():
        for dtype, op in RS_OPS:
            name = f"reduce_scatter {case} {dtype} {op}"
            for again in range(2):  # the second call of a signature takes the fast path where it is native
                ins = [_laid_out(_value(shapes[d], dtype, rank, d, again), layout) for d in range(n)]
                o = _laid_out(torch.zeros(shapes[rank], dtype=dtype), layout)
                before, seen = dict(tp.calls), full["reduce_scatter"]
                dist.reduce_scatter(o, ins, op=getattr(R, op))
                out["calls"][f"{name} call {again}"] = calls_since(before)
                out["full path"][f"{name} call {again}"] = full["reduce_scatter"] - seen
                want = _reduced(op, [_value(shapes[rank], dtype, q, rank, again) for q in range(n)]).to(dtype)
                check(f"{name} call {again}", o, want, op != "AVG")
                assert all(torch.equal(t, _value(shapes[d], dtype, rank, d, again)) for d, t in enumerate(ins)), \
                    f"{name}: an input changed"
            out["strategies"][name] = _strategies(world)
            if case == "even":  # the tensor form of the same call, for its plan
                total = n * _value(shapes[0], dtype, 0, 0, 0).numel()
                dist.reduce_scatter_tensor(torch.zeros(total // n, dtype=dtype), torch.ones(total, dtype=dtype),
                                           op=getattr(R, op))
                out["strategies"][name.replace("reduce_scatter", "reduce_scatter_tensor")] = _strategies(world)
            # raw gloo serves every one of these list reduce_scatters (uneven ones too)
            g = torch.zeros(shapes[rank], dtype=dtype)
            dist.reduce_scatter(g, [_value(shapes[d], dtype, rank, d, 1) for d in range(n)], op=getattr(R, op),
                                group=gloo)
            check(f"{name} against raw gloo", o, g, op != "AVG")
        for dtype in AG_DTYPES:
            name = f"all_gather {case} {dtype}"
            for again in range(2):
                inp = _laid_out(_value(shapes[rank], dtype, rank, 0, again), layout)
                outs = [_laid_out(torch.zeros(shapes[q], dtype=dtype), layout) for q in range(n)]
                before, seen = dict(tp.calls), full["all_gather"]
                dist.all_gather(outs, inp)
                out["calls"][f"{name} call {again}"] = calls_since(before)
                out["full path"][f"{name} call {again}"] = full["all_gather"] - seen
                for q in range(n):
                    check(f"{name} call {again} from rank {q}", outs[q], _value(shapes[q], dtype, q, 0, again), True)
            out["strategies"][name] = _strategies(world)
            if case == "even":
                total = n * inp.numel()
                dist.all_gather_into_tensor(torch.zeros(total, dtype=dtype), torch.ones(total // n, dtype=dtype))
                out["strategies"][name.replace("all_gather", "all_gather_tensor")] = _strategies(world)
            if len(set(shapes)) == 1:  # raw gloo's list allgather takes one size for every rank
                g = [torch.zeros(shapes[q], dtype=dtype) for q in range(n)]
                dist.all_gather(g, _value(shapes[rank], dtype, rank, 0, 1), group=gloo)
                for q in range(n):
                    check(f"{name} against raw gloo, rank {q}", outs[q], g[q], True)
    return out


def _expected_strategy(op: str, case: str, profile, n: int, rs_op: str) -> str:
    """The plan of an uneven case: the backend's list form where it serves the sizes (gloo's list reduce_scatter, one
    all_reduce per destination: the native and xccl profiles, for the ops the profile reduces natively: AVG only on
    gloo itself), else the fill by bytes: every block padded to the largest, one even collective, unpad; or, where
    padding would more than double the bytes (n * largest > 2 * total), one all_reduce of the concatenation
    (reduce_scatter) or one broadcast per rank (all_gather, where the profile has broadcast: not xla, torchtpu)."""
    sizes = [a * b for a, b in CASES[n][case]]
    if op == "reduce_scatter" and profile in (None, "xccl") and (rs_op != "AVG" or profile is None):
        return "native"
    if n * max(sizes) > 2 * sum(sizes):
        if op == "reduce_scatter":
            return "uneven reduce_scatter=all_reduce+slice"
        if profile in (None, "xccl"):
            return "uneven all_gather=broadcast per rank"
    return f"uneven {op}=pad to {max(sizes)}+{op}+unpad"


@pytest.mark.parametrize("n", [2, 3])
@pytest.mark.parametrize("profile", [None, "xccl", "xla", "torchtpu"], ids=["native", "xccl", "xla", "torchtpu"])
def test_list_collectives_with_mixed_layouts_and_sizes_match_the_reference(n, profile):
    results = run_world("tests.semantics.test_uneven_lists:_rank_lists", n, profile, timeout=240, coll_timeout=60)
    for r in results:
        assert not r["failures"], "\n".join(r["failures"][:20])
        assert r["count"] > 0
    strategies = results[0]["strategies"]
    for r in results[1:]:
        assert r["strategies"] == strategies  # the plan is the same on every rank, whatever its layout
        assert r["calls"] == results[0]["calls"]  # and so are the backend calls (fast path or not)
    # a native request meets on two paths: rank 0's contiguous tensors take the fast path (the backend's list method,
    # straight away) from their second call on, the other ranks' strided ones the full path
    for name, taken in strategies.items():
        if taken == ["native"] and name.split()[0] in ("reduce_scatter", "all_gather"):
            assert results[0]["full path"][f"{name} call 1"] == 0, name
            assert all(r["full path"][f"{name} call 1"] == 1 for r in results[1:]), name
    for name, taken in strategies.items():
        words = name.split()
        op, case = words[0], words[1]
        if op not in ("reduce_scatter", "all_gather"):
            continue
        if case == "even":  # even sizes stay the even path: the plan of the tensor form of the same call
            assert taken == strategies[name.replace(op, op + "_tensor", 1)], name
        else:
            want = _expected_strategy(op, case, profile, n, words[-1])
            assert want == taken[0], f"{name}: {taken}, expected {want!r}"


def test_local_rules_are_those_nccl_has():
    """Only the rules NCCL's list forms have, checked on the calling rank before anything is sent: one tensor per rank,
    one dtype, and the entry at this rank's own index holding as many elements as its own tensor (its shape may
    differ: NCCL reads numbers of elements)."""
    from funcoll import semantics

    own = torch.zeros(2, 3)
    assert semantics.check_rank_list("reduce_scatter", "input", [torch.zeros(5), torch.zeros(3, 2)], own, 2, 1) == \
        [5, 6]
    with pytest.raises(ValueError, match=r"funcoll.reduce_scatter: input\[1\] \(this rank's own\) has 5 elements but "
                                         r"the output has 6; input\[r\] must have rank r's output size"):
        semantics.check_rank_list("reduce_scatter", "input", [torch.zeros(6), torch.zeros(5)], own, 2, 1)
    with pytest.raises(ValueError, match=r"funcoll.all_gather: expected 2 output tensors, got 3"):
        semantics.check_rank_list("all_gather", "output", [own] * 3, own, 2, 0)
    with pytest.raises(TypeError, match=r"funcoll.all_gather: output\[1\] has dtype torch.int32"):
        semantics.check_rank_list("all_gather", "output", [own, own.int()], own, 2, 0)
