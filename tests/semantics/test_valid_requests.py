"""The valid (collective, dtype, reduce op) requests are the ones tests/oracle.py pins from NCCL, gloo and XCCL plus
funcoll's promises: funcoll's table equals them exactly, the gloo column is what the installed gloo accepts, and
every other request is a TypeError on the calling rank with funcoll's message, raised before anything is sent.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

import funcoll
from funcoll.launch import run_world
from funcoll.reference import valid_ops as funcoll_valid_ops
from tests import oracle
from tests.reference import c10d_op


def _rows(valid) -> set:
    return {(c, dt, op) for c in oracle.COLLECTIVES for dt in oracle.DTYPES for op in valid(dt, c)}


def test_funcoll_takes_exactly_the_pinned_requests():
    """``funcoll.reference.valid_ops`` (read from funcoll's refusal table) against the oracle, on every collective."""
    theirs = _rows(lambda dt, c: funcoll_valid_ops(dt))
    missing, extra = oracle.VALID - theirs, theirs - oracle.VALID
    fmt = lambda s: "\n  ".join(f"{c} {dt} {op}" for c, dt, op in sorted(s, key=str))  # noqa: E731
    assert not missing and not extra, (f"funcoll refuses {len(missing)} pinned request(s):\n  {fmt(missing)}\n"
                                       f"funcoll accepts {len(extra)} unpinned request(s):\n  {fmt(extra)}")


def test_oracle_rows_are_what_their_reasons_say():
    """A promise is a request no backend accepts; a narrower row one a backend does; each with a reason."""
    for rows, why in oracle.PROMISES:
        assert rows and why and not rows & oracle.BACKENDS, sorted(rows & oracle.BACKENDS, key=str)
    for rows, why in oracle.NARROWER:
        assert rows and why and rows <= oracle.BACKENDS, sorted(rows - oracle.BACKENDS, key=str)
    # the requests every backend serves are valid, whatever funcoll's promises
    assert oracle.NCCL & oracle.GLOO & oracle.XCCL <= oracle.VALID
    assert oracle.valid_ops(torch.uint32) == ["sum", "avg", "product", "min", "max", "band", "bor", "bxor"]
    assert oracle.valid_ops(torch.float8_e5m2, "reduce") == []


# -- the gloo column, against the gloo installed -------------------------------------------------------------------
_FORMS = {"all_reduce": ("all_reduce",), "reduce": ("reduce",),
          "reduce_scatter": ("reduce_scatter_tensor", "reduce_scatter")}


def raw_gloo_accepts(rank, n):
    """On a raw gloo world: {form: [(dtype name, op)]} of the requests gloo completes."""
    out = {}
    for forms in _FORMS.values():
        for form in forms:
            ok = []
            for dt in oracle.DTYPES:
                for op in oracle.OPS:
                    t = torch.zeros(4 * dt.itemsize, dtype=torch.uint8).view(dt)
                    try:
                        if form == "all_reduce":
                            dist.all_reduce(t, op=c10d_op(op))
                        elif form == "reduce":
                            dist.reduce(t, 0, op=c10d_op(op))
                        elif form == "reduce_scatter_tensor":
                            dist.reduce_scatter_tensor(torch.empty_like(t), t, op=c10d_op(op))
                        else:
                            dist.reduce_scatter(torch.empty_like(t), [t], op=c10d_op(op))
                    except (RuntimeError, ValueError, TypeError):
                        continue
                    ok.append((str(dt), op))
            out[form] = ok
    return out


def test_the_gloo_column_is_what_the_installed_gloo_accepts():
    got = run_world("tests.semantics.test_valid_requests:raw_gloo_accepts", 1, backend="gloo", timeout=120)[0]
    for coll, forms in _FORMS.items():
        want = {(str(dt), op) for c, dt, op in oracle.GLOO if c == coll}
        for form in forms:
            have = set(got[form])
            assert have == want, (form, sorted(have - want), sorted(want - have))


# -- the refused requests: funcoll's TypeError, on the calling rank, nothing sent ---------------------------------
# funcoll's messages, per kind of refusal (funcoll/semantics): {op} the entry's name, {r} the reduce op, {dt} the dtype
_MESSAGES = {
    "float8": "funcoll.{op}: {dt} tensors cannot be reduced (float8 is supported by non-reducing ops only); upcast "
              "to bfloat16 or float32 before reducing",
    "float4": "funcoll.{op}: {dt} tensors cannot be reduced (float4 is supported by non-reducing ops only); upcast "
              "to bfloat16 or float32 before reducing",
    "float": "funcoll.{op}: reduce op {r} needs an integer or bool tensor, got {dt}; use sum/avg/product/min/max, or "
             "view the tensor as an integer dtype",
    "complex": "funcoll.{op}: reduce op {r} is not defined for complex tensors ({dt}); only sum and avg are",
    "bool": "funcoll.{op}: reduce op {r} is not defined for bool tensors; convert to a floating point dtype first",
    "int premul_sum": "funcoll.{op}: reduce op premul_sum needs a floating point tensor, got {dt}; multiply and use "
                      "sum instead",
    "uint64 avg": "funcoll.{op}: reduce op avg on torch.uint64 cannot be computed exactly; use sum and divide",
}
# ... except where torch's dist.all_reduce refuses first, the same for every backend (distributed_c10d.py,
# ``supports_complex``): a ValueError
_TORCH_COMPLEX = "all_reduce does not support {c10d} on complex tensors"
# torch's dist.all_reduce hands every backend the real view of a complex tensor unless the op is MAX, MIN, PRODUCT or a
# bitwise one (distributed_c10d.py, ``supports_complex``): complex PREMUL_SUM reaches funcoll as a float request and is
# served, as ProcessGroupNCCL serves it; funcoll refuses it where it sees the complex dtype (dist.reduce,
# reduce_scatter, the functional collectives)
_SERVED_AS_REAL = {("all_reduce", torch.complex64, "premul_sum"), ("all_reduce", torch.complex128, "premul_sum")}
_ENTRIES = {"all_reduce": "all_reduce", "reduce": "reduce", "reduce_scatter_tensor": "reduce_scatter",
            "reduce_scatter": "reduce_scatter"}  # the dist function -> the oracle's collective


def _kind(dt: torch.dtype, op: str) -> str:
    if dt in oracle.FLOAT8_OCP + oracle.FLOAT8_OTHER:
        return "float8"
    if dt in oracle.FLOAT4:
        return "float4"
    if dt in oracle.FLOATS:
        return "float"
    if dt in oracle.COMPLEX:
        return "complex"
    if dt == torch.bool:
        return "bool"
    return "uint64 avg" if (dt, op) == (torch.uint64, "avg") else "int premul_sum"


def _call(entry: str, t: torch.Tensor, op) -> None:
    """``entry`` (a key of :data:`_ENTRIES`) on the 4 elements of ``t``, at world 2."""
    if entry == "all_reduce":
        dist.all_reduce(t, op=op)
    elif entry == "reduce":
        dist.reduce(t, 1, op=op)
    elif entry == "reduce_scatter_tensor":
        dist.reduce_scatter_tensor(t[:2], t, op=op)
    else:
        dist.reduce_scatter(t[:2], [t[:2], t[2:]], op=op)


def refused_requests(rank, n):
    """Rank 0 makes every refused request on every reducing entry while rank 1 waits; then both all-reduce, which
    comes out right only if nothing of the refused requests reached the wire."""
    failures, count = [], 0
    tp = dist.group.WORLD.transport("cpu")
    trace = funcoll.flight_recorder.trace_of(None)
    if rank == 0:
        sent, seq = sum(tp.calls.values()), trace.seq
        for entry, coll in _ENTRIES.items():
            for dt, op in oracle.refused(coll):
                if (entry, dt, op) in _SERVED_AS_REAL:
                    continue
                count += 1
                t = torch.zeros(4 * dt.itemsize, dtype=torch.uint8).view(dt)
                want = _MESSAGES[_kind(dt, op)].format(op=entry, r=op, dt=dt)
                error = TypeError
                if entry == "all_reduce" and dt in oracle.COMPLEX and op not in ("sum", "avg", "premul_sum"):
                    want, error = _TORCH_COMPLEX.format(c10d=c10d_op(op)), ValueError
                try:
                    _call(entry, t, c10d_op(op))
                except error as e:
                    if str(e) != want:
                        failures.append(f"{entry} {dt} {op}: message {str(e)!r}, expected {want!r}")
                    continue
                except Exception as e:  # noqa: BLE001 - reported
                    failures.append(f"{entry} {dt} {op}: {type(e).__name__}: {e}")
                    continue
                failures.append(f"{entry} {dt} {op}: no error")
        if sum(tp.calls.values()) != sent or trace.seq != seq:
            failures.append(f"the refused requests sent: {sum(tp.calls.values()) - sent} native calls, "
                            f"{trace.seq - seq} sequence numbers")
    x = torch.arange(4.0) + rank
    dist.all_reduce(x)
    if not torch.equal(x, 2 * torch.arange(4.0) + 1):
        failures.append(f"the all_reduce after the refused requests: {x.tolist()}")
    for dt in oracle.COMPLEX:  # _SERVED_AS_REAL: served, with the numbers NCCL gives
        xs = [torch.complex(torch.arange(3.0) + r, torch.arange(3.0) - 2 * r).to(dt) for r in range(n)]
        z = xs[rank].clone()
        dist.all_reduce(z, op=c10d_op("premul_sum"))
        want = sum(xs) * 0.5
        if not torch.equal(z, want):
            failures.append(f"all_reduce {dt} premul_sum: {z.tolist()}, expected {want.tolist()}")
    return {"failures": failures, "count": count}


def test_refused_requests_raise_funcolls_type_error_before_anything_is_sent():
    res = run_world("tests.semantics.test_valid_requests:refused_requests", 2, timeout=120)
    assert res[0]["count"] == sum(len(oracle.refused(c)) for c in _ENTRIES.values()) - len(_SERVED_AS_REAL)
    failures = [f for r in res for f in r["failures"]]
    assert not failures, f"{len(failures)} failing:\n" + "\n".join(failures[:30])
