"""The capability probe (docs/observability.md): :func:`run` checks a tiny collective per native request
(:func:`requests`) on the live group against :mod:`funcoll.reference` computed from every rank's seeded inputs, and
every rank demotes the same wrong ones for this process (:func:`demote`)."""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import platform
import socket
import time
import weakref
from collections import Counter
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import torch
import torch.distributed as dist

from funcoll import algorithms, reference
from funcoll.algorithms.observe import LOG, group_label
from funcoll.entry.group_state import is_local_store
from funcoll.report import markdown_table
from funcoll.semantics import FLOAT8, OPS, ReduceOp, Reduction, dtype_name
from funcoll.transport import REDUCING, Capabilities
from funcoll.transport.registry import transport_for

__all__ = ["run", "probe_transport", "ProbeResult", "Request", "requests", "demote", "results", "cache_dir"]

SCHEMA = 1
# what the planner ever sends natively for bool: an op's logical twin (or / and), else the op itself (bxor)
_BOOL_NATIVE = frozenset(row.bool_op or row.op for row in OPS.values())
_BATCH_BYTES = 16 << 20  # at most this many bytes of this rank's inputs per batch (on XLA: one graph)
_EXTRA_SIZES = (1, 2, 5, 8, 33, 256)  # elements per rank, besides 3 and ~1024/n, for a request a report keeps off
_DROPPABLE = ("reduce", "broadcast", "gather", "scatter", "all_reduce_coalesced")  # demote: composed from the rest

_results: List["ProbeResult"] = []
_probed: "weakref.WeakKeyDictionary[Any, ProbeResult]" = weakref.WeakKeyDictionary()  # transport -> its result


@dataclass(frozen=True)
class Request:
    """One native request: ``primitive`` is a transport primitive, or ``"all_to_all uneven"``."""

    primitive: str
    op: Optional[ReduceOp]
    dtype: torch.dtype

    @property
    def name(self) -> str:
        return " ".join([self.primitive] + ([str(self.op)] if self.op is not None else []) + [dtype_name(self.dtype)])

    @staticmethod
    def parse(name: str) -> "Request":
        """``"all_reduce max int32"``, ``"all_to_all uneven float32"``, ``"all_gather bfloat16"``."""
        parts = name.split()
        with contextlib.suppress(AttributeError, IndexError, ValueError):
            dtype = getattr(torch, parts[-1])
            if not isinstance(dtype, torch.dtype):
                raise ValueError(parts[-1])
            if parts[:2] == ["all_to_all", "uneven"] and len(parts) == 3:
                return Request("all_to_all uneven", None, dtype)
            if len(parts) == 3 and parts[0] in REDUCING:
                return Request(parts[0], ReduceOp(parts[1]), dtype)
            if len(parts) == 2:
                return Request(parts[0], None, dtype)
        raise ValueError(f"funcoll.probe: cannot read a request from {name!r}; write e.g. 'all_reduce max int32', "
                         f"'all_to_all uneven float32' or 'all_gather bfloat16'")

    @property
    def reduction(self) -> Reduction:
        assert self.op is not None, self.name
        return Reduction(self.op, reference.PREMUL if self.op is ReduceOp.PREMUL_SUM else None)


def requests(caps: Capabilities, size: int) -> List[Request]:
    """Every request ``caps`` calls native that funcoll's algorithms can send natively, in a fixed order."""
    dtypes = sorted(caps.dtypes, key=str)
    reduced = [(prim, dt, reference.valid_ops(dt)) for prim in REDUCING if caps.has(prim) for dt in dtypes
               if not (dt.is_complex or dt in FLOAT8)]
    out = [Request(prim, op, dt) for prim, dt, valid in reduced for op in ReduceOp
           if caps.reduces(prim, op, dt) and op.value in valid and (dt != torch.bool or op in _BOOL_NATIVE)]
    moves = [p for p in ("all_gather", "all_to_all", "broadcast", "gather", "scatter") if caps.has(p)]
    moves += ["all_to_all uneven"] if caps.has("all_to_all") and caps.uneven_all_to_all and size > 1 else []
    return out + [Request(p, None, dt) for dt in dtypes for p in moves]


class _Case:
    """One request at one size on a group of ``n`` ranks."""

    def __init__(self, req: Request, n: int, k: int):
        self.req, self.n, self.k = req, n, k
        self.root = n - 1  # dst/src of rooted ops: not rank 0, to catch a root mix-up
        # all_to_all uneven: splits[r][j] is what rank r sends to rank j (uneven, with zeros)
        self.splits = ([[k * ((r + 2 * j) % 3) + (1 if j == r else 0) for j in range(n)] for r in range(n)]
                       if req.primitive == "all_to_all uneven" else None)
        self.numel = [sum(self.splits[r]) if self.splits else k if req.primitive in ("all_gather", "gather")
                      else n * k for r in range(n)]

    def inputs(self, r: int) -> torch.Tensor:
        """The input of rank ``r`` (CPU): :func:`funcoll.reference.make`'s "grid" values for a reduction."""
        return reference.make(self.req.dtype, (self.numel[r],), r, f"funcoll.probe/{self.req.name}/{self.numel[r]}",
                              "random" if self.req.op is None else "grid")

    def run(self, tp, x: torch.Tensor, dev) -> Tuple[Any, List[torch.Tensor]]:
        """Issues the native call with this rank's input ``x``; returns (handle, outputs to read)."""
        p, n, k, req, rank = self.req.primitive, self.n, self.k, self.req, tp.rank
        data = x.to(dev)
        if p == "all_reduce":
            return tp.all_reduce(data, req.reduction), [data]
        if p == "all_reduce_coalesced":
            first, second = data[: len(data) // 2].clone(), data[len(data) // 2:].clone()
            return tp.all_reduce_coalesced([first, second], req.reduction), [first, second]
        if p == "reduce_scatter":
            out = data.new_empty((k,))
            return tp.reduce_scatter(out, data, req.reduction), [out]
        if p == "reduce":
            return tp.reduce(data, self.root, req.reduction), [data]
        if p == "all_gather":
            out = data.new_empty((n * k,))
            return tp.all_gather(out, data), [out]
        if p == "all_to_all":
            out = torch.empty_like(data)
            return tp.all_to_all(out, data, None, None), [out]
        if p == "all_to_all uneven":
            assert self.splits is not None
            outs = [s[rank] for s in self.splits]
            out = data.new_empty((sum(outs),))
            return tp.all_to_all(out, data, outs, self.splits[rank]), [out]
        if p == "broadcast":
            return tp.broadcast(data, self.root), [data]
        if p == "gather":
            parts = [data.new_empty((k,)) for _ in range(n)] if rank == self.root else None
            return tp.gather(parts, data, self.root), list(parts or [])
        assert p == "scatter", p
        out = data.new_empty((k,))
        chunks = [t.contiguous() for t in data.view(n, k).unbind(0)] if rank == self.root else None
        return tp.scatter(out, chunks, self.root), [out]

    def check(self, rank: int, inputs: Sequence[torch.Tensor], outputs: List[torch.Tensor]) -> Optional[str]:
        """``inputs``: every rank's input; ``outputs``: this rank's (CPU)."""
        p, req, mine = self.req.primitive, self.req, slice(rank * self.k, (rank + 1) * self.k)
        if p in ("reduce", "gather") and rank != self.root:
            return None
        if p in REDUCING:
            want = reference.reduce(str(req.op), inputs, reference.PREMUL)
            want = want[mine] if p == "reduce_scatter" else want
        elif p in ("all_gather", "gather"):
            want = torch.cat(list(inputs))
        elif p == "all_to_all":
            want = torch.cat([x[mine] for x in inputs])
        elif p == "all_to_all uneven":
            assert self.splits is not None
            want = torch.cat([x[sum(s[:rank]):sum(s[:rank + 1])] for x, s in zip(inputs, self.splits)])
        elif p == "broadcast":
            want = inputs[self.root]
        else:  # scatter
            want = inputs[self.root][mine]
        # reduced: within the reference's tolerance over n ranks; moved: as over one rank (equal values, equal bits)
        return reference.close(torch.cat(outputs), want, self.n if req.op is not None else 1, str(req.op), "grid")


def demote(caps: Capabilities, wrong: Dict[str, str]) -> Tuple[Capabilities, List[str], List[str]]:
    """``caps`` with the requests named in ``wrong`` (name -> what was wrong) taken off the native path.
    Returns (new capabilities, what was demoted, what cannot be routed around)."""
    refused, prims, dtypes = set(caps.refused_pairs), set(caps.primitives), set(caps.dtypes)
    uneven = caps.uneven_all_to_all
    demoted, unfixable, sources = [], [], dict(caps.sources)
    for name in wrong:
        req = Request.parse(name)
        p = req.primitive
        if p in ("all_reduce", "reduce_scatter"):
            refused.add((req.op, req.dtype))
            what = f"{req.op} on {dtype_name(req.dtype)}: the strategy, on every reducing primitive"
        elif p in _DROPPABLE:
            prims.discard(p)
            what = f"{p}: composed from the other primitives"
        elif p == "all_to_all uneven":
            uneven = False
            what = "uneven all_to_all: pad, even all_to_all, unpad"
        elif req.dtype not in caps.reduce_dtypes and any(
                d in dtypes and d != req.dtype and d.itemsize == req.dtype.itemsize for d in caps.dtypes):
            dtypes.discard(req.dtype)
            what = f"{dtype_name(req.dtype)}: moved as the raw bits of another dtype"
        else:
            unfixable.append(name)
            continue
        demoted.append(f"{name} -> {what}")
        sources[f"probe.{name}"] = f"wrong native result on this machine ({wrong[name]}); demoted by funcoll.probe"
    new = replace(caps, refused_pairs=frozenset(refused), primitives=frozenset(prims), dtypes=frozenset(dtypes),
                  uneven_all_to_all=uneven, sources=sources,
                  name=caps.name if not demoted or caps.name.endswith("+probe") else caps.name + "+probe")
    return new, demoted, unfixable


@dataclass
class ProbeResult:
    group: str
    device_type: str
    key: Dict[str, object]
    checked: List[str]
    wrong: Dict[str, str] = field(default_factory=dict)
    demoted: List[str] = field(default_factory=list)
    unfixable: List[str] = field(default_factory=list)
    cached: bool = False
    seconds: float = 0.0
    capabilities: str = ""
    verified: List[str] = field(default_factory=list)  # requests an open report kept off, right here: now native

    def to_dict(self) -> dict:
        return asdict(self)

    def to_markdown(self) -> str:
        k = self.key
        lines = [f"### funcoll.probe: group {self.group}, {self.device_type}",
                 "",
                 f"- stack: torch {k.get('torch')}, {k.get('library')}, device {k.get('device')}, "
                 f"topology {k.get('topology')}, group size {k.get('group_size')}",
                 f"- capability table: {k.get('capabilities')} -> {self.capabilities}",
                 f"- {len(self.checked)} native requests verified "
                 f"({'from the cache' if self.cached else f'in {self.seconds:.2f}s'}); "
                 f"{len(self.wrong)} wrong",
                 *([f"- verified on this group and now native (an open report keeps them off by default): "
                    f"{', '.join(self.verified)}"] if self.verified else []),
                 ""]
        if self.wrong:
            now = dict(d.split(" -> ", 1) for d in self.demoted)
            lines.append(markdown_table(["native request", "wrong result", "now"], [
                [name, why, now.get(name, "UNFIXABLE: still native")] for name, why in self.wrong.items()]))
        return "\n".join(lines)


def results() -> List[ProbeResult]:
    """The probes run (or applied from the cache) in this process, oldest first."""
    return list(_results)


def cache_dir() -> Optional[str]:
    """``FUNCOLL_PROBE_CACHE`` (``off``/``0``/``none``: no cache), default ``~/.cache/funcoll/probe``."""
    env = os.environ.get("FUNCOLL_PROBE_CACHE", "").strip()
    if env.lower() in ("off", "0", "none", "no", "false"):
        return None
    return env or os.path.join(os.path.expanduser("~"), ".cache", "funcoll", "probe")


def _device_name(device_type: str, dev) -> str:
    with contextlib.suppress(Exception):  # no such line (StopIteration) or no such device
        if device_type == "xpu":
            return torch.xpu.get_device_name(dev)
        if device_type == "xla":
            import torch_xla.core.xla_model as xm
            import torch_xla.runtime as xr

            return str(xr.global_runtime_device_attributes()[0].get("device_kind") or xm.xla_device_hw(dev))
        with open("/proc/cpuinfo") as f:
            return next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    return platform.machine() or "unknown"


def _library(tp, device_type: str) -> str:
    if device_type == "xpu":
        from funcoll.transport.xpu import stack_versions

        return f"oneCCL {stack_versions(True)[1] or 'unknown'}"
    if device_type == "xla":  # an XLA transport exists only where torch_xla imports
        import torch_xla

        return f"torch_xla {torch_xla.__version__}"
    backend = getattr(tp, "backend", None)
    return type(backend).__name__.replace("ProcessGroup", "").lower() if backend is not None else type(tp).__name__


def _topology(host_ids: List[bytes]) -> str:
    counts = Counter(host_ids)
    per_host = sorted(set(counts.values()))
    hosts = len(counts)
    return (f"{hosts} host{'s' if hosts > 1 else ''} x {per_host[0]} rank{'s' if per_host[0] > 1 else ''}"
            if len(per_host) == 1 else f"{hosts} hosts, {per_host[0]}-{per_host[-1]} ranks each")


def _sha(obj) -> bytes:
    return hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).digest()


def _read_cache(path: Optional[str], key: Optional[dict] = None, names: Optional[List[str]] = None) -> Optional[dict]:
    """The cache entry at ``path`` (None: none, unreadable, or not for ``key`` and ``names`` when given)."""
    try:
        with open(path or "") as f:
            entry = json.load(f)
    except (OSError, ValueError):
        return None
    if not isinstance(entry, dict) or not isinstance(entry.get("wrong"), dict) or (
            key is not None and (entry.get("key") != key or entry.get("checked") != names)):
        return None
    return entry


def cached_entries(device_types: Sequence[str] = ()) -> List[dict]:
    """Every probe result cached on this machine for this torch version (of ``device_types``, when given)."""
    root = cache_dir()
    names = sorted(os.listdir(root)) if root and os.path.isdir(root) else []
    found = [_read_cache(os.path.join(root or "", name)) for name in names if name.endswith(".json")
             and (not device_types or name.split("-")[0] in device_types)]
    return [e for e in found if e is not None and e.get("key", {}).get("torch") == torch.__version__]


def _write_cache(path: str, entry: dict) -> None:
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "w") as f:
            json.dump(entry, f, indent=1, sort_keys=True)
        os.replace(tmp, path)
    except OSError as e:  # a read-only home: the probe still applies
        LOG.warning("funcoll.probe: cannot write the cache %s: %s", path, e)


def _sync(tp) -> None:
    if tp.device_type == "xla":
        import torch_xla

        torch_xla.sync()


def _xla_on_cpu() -> bool:
    try:
        import torch_xla.runtime as xr

        return xr.device_type() == "CPU"
    except Exception:  # pragma: no cover
        return False


def _raised(e: BaseException, when: str = "") -> str:
    text = str(e).strip()
    return f"raised {type(e).__name__}{when}: {text.splitlines()[0][:200] if text else ''}"


def _all_gather_bytes(tp, mine: bytes, dev) -> torch.Tensor:
    """[n, len] uint8 (CPU): every rank's ``mine`` (same length everywhere), by funcoll's all_gather."""
    local = torch.tensor(list(mine), dtype=torch.uint8).to(dev)
    gathered = local.new_empty((tp.size * local.numel(),))
    algorithms.all_gather_into_tensor(tp, gathered, local).wait()
    _sync(tp)
    return gathered.cpu().view(tp.size, local.numel())


def _run_batch(tp, cases: List[_Case], dev) -> List[Optional[str]]:
    """Issues every case's native request, waits, checks the outputs: this rank's verdict per case (None: right).
    When the whole batch fails (a lazy backend fails the graph), each case runs alone, to find the culprits."""
    issued: List[Tuple[Any, List[torch.Tensor], Optional[str]]] = []
    for case in cases:
        try:
            issued.append((*case.run(tp, case.inputs(tp.rank), dev), None))
        except Exception as e:  # noqa: BLE001 - a native request that raises is as wrong as a wrong result
            issued.append((None, [], _raised(e)))
    collected: Union[str, List[Tuple[List[torch.Tensor], Optional[str]]]]  # a batch's failure, or per case
    try:
        for i in range(len(issued)):
            try:
                if issued[i][2] is None:
                    issued[i][0].wait()
            except Exception as e:  # noqa: BLE001
                issued[i] = (None, [], _raised(e, " on wait"))
        _sync(tp)
        collected = [([t.cpu() for t in outs] if err is None else [], err) for _, outs, err in issued]
    except Exception as e:  # noqa: BLE001
        collected = _raised(e)
    del issued  # the device tensors (on XLA, those of a failed graph too) must not reach the next sync
    if isinstance(collected, str):
        if tp.device_type == "xla":  # later collectives must not stay chained to the failed graph
            from funcoll.transport.xla import reset_token

            reset_token(tp.control_device)
        return [collected] if len(cases) == 1 else [v for case in cases for v in _run_batch(tp, [case], dev)]
    verdicts = []
    for case, (outs, err) in zip(cases, collected):
        try:
            verdicts.append(err or case.check(tp.rank, [case.inputs(r) for r in range(tp.size)], outs))
        except Exception as e:  # noqa: BLE001 - a result that cannot even be compared is wrong
            verdicts.append(f"cannot compare: {type(e).__name__}: {e}")
    return verdicts


def probe_transport(tp, device_type: Optional[str] = None, group: Optional[str] = None, *,
                    cache: bool = True) -> ProbeResult:
    """Probes one transport (collective: every rank of its group calls it) and demotes what is wrong on it. A transport
    probed before in this process returns that result (no collective) unless ``cache=False``."""
    if tp.device_type == "xla" and _xla_on_cpu():
        raise RuntimeError("funcoll.probe: the XLA transport on the CPU PJRT device (PJRT_DEVICE=CPU) runs no "
                           "multi-replica collective and has no bf16 all-reduce; torch_xla 2.9 crashes after a few "
                           "failed ones. Probe XLA on a TPU (PJRT_DEVICE=TPU)")
    done = _probed.get(tp)
    if cache and done is not None:  # probed in this process already (every rank of the group was part of it)
        return done
    t0 = time.monotonic()
    device_type = device_type or tp.device_type
    group = str(group) if group is not None else group_label(tp)
    dev = torch.device(getattr(tp, "control_device", None) or "cpu")
    caps = tp.table  # the probe replaces the table; a group may read less of it (XLA's, by its replica groups)
    n, rank = tp.size, tp.rank
    reqs = requests(tp.caps, n)
    # requests only an open report keeps off the native path (XCCL's AVG on scale-up): checked too, at more sizes
    # (a report may be size-dependent), and native for this group when right on every rank
    unverified = getattr(caps, "unverified", None)
    extra = [r for r in requests(unverified, n) if r not in reqs] if unverified is not None else []
    reqs += extra
    names = [r.name for r in reqs]
    # 1. the topology (host of each rank) and the cache entry every rank holds
    host = hashlib.sha256(socket.gethostname().encode()).digest()[:8]
    hosts = _all_gather_bytes(tp, host, dev)
    topology = _topology([bytes(hosts[r].tolist()) for r in range(n)])
    key = {"schema": SCHEMA, "torch": torch.__version__, "library": _library(tp, device_type),
           "transport": type(tp).__name__, "device": _device_name(device_type, dev), "topology": topology,
           "group_size": n, "capabilities": caps.name}
    root = cache_dir() if cache else None
    path = os.path.join(root, f"{device_type}-{_sha(key).hex()[:16]}.json") if root else None
    entry = _read_cache(path, key, names)
    digest = _sha({k: entry[k] for k in ("key", "checked", "wrong")}) if entry is not None else bytes(32)
    digests = _all_gather_bytes(tp, digest, dev)
    cached = entry is not None and all(torch.equal(digests[r], digests[0]) for r in range(n))
    if cached and entry is not None:
        wrong = dict(entry["wrong"])
    else:
        # 2. every native request, at two sizes (3 elements per rank, about 1024 in all), in batches of bounded size
        sizes = [(j, k) for k in (3, max(1, math.ceil(1024 / n))) for j in range(len(reqs))]
        sizes += [(j, k) for k in _EXTRA_SIZES + (math.ceil(65536 / n),) for j in range(len(reqs)) if reqs[j] in extra]
        cases = [_Case(reqs[j], n, k) for j, k in sizes]
        per_batch = max(1, _BATCH_BYTES // max([max(case.numel) * 8 for case in cases], default=1))  # cases
        if extra:  # the transport is asked for the extra requests natively: it runs under that table meanwhile
            tp.use_table(unverified)
        try:
            verdicts = [v for i in range(0, len(cases), per_batch)
                        for v in _run_batch(tp, cases[i:i + per_batch], dev)]
        finally:
            tp.use_table(caps)
        errors = [[v for (i, _), v in zip(sizes, verdicts) if i == j and v] for j in range(len(reqs))]  # this rank's
        # 3. every rank's verdicts: the union, so that every rank demotes the same requests
        every = _all_gather_bytes(tp, bytes(bool(e) for e in errors), dev)
        wrong = {}
        for j, req in enumerate(reqs):
            bad = [r for r in range(n) if every[r, j]]
            if bad:
                wrong[req.name] = (f"{errors[j][0]} on rank {rank}" if errors[j] else "wrong") + \
                    (f"; wrong on rank{'s' if len(bad) > 1 else ''} {', '.join(map(str, bad))}" if n > 1 else "")
    extra_names = {r.name for r in extra}
    new, demoted, unfixable = demote(caps, {k: v for k, v in wrong.items() if k not in extra_names})
    verified = [r.name for r in extra if r.name not in wrong]
    if verified and unverified is not None:  # the table with the reported facts native, less what was wrong
        new = demote(unverified, wrong)[0]
        new = replace(new, name=f"{caps.name}+probe", sources={
            **new.sources, **{f"probe.{name}": "verified on this group by funcoll.probe (an open report keeps it "
                              "off the native path by default)" for name in verified}})
    if demoted or verified:
        tp.use_table(new)
    res = ProbeResult(group, device_type, key, names, wrong, demoted, unfixable, cached, time.monotonic() - t0,
                      tp.caps.name, verified)
    _results.append(res)
    _probed[tp] = res
    if not cached and path is not None:
        _write_cache(path, {"key": key, "checked": names, "wrong": wrong, "demoted": demoted,
                            "unfixable": unfixable, "created": time.strftime("%Y-%m-%dT%H:%M:%S")})
    for name, why in wrong.items():
        then = ("it stays on its strategy (an open report covers this stack)" if name in extra_names else
                "funcoll cannot route around it" if name in unfixable else "demoted to its strategy for this process")
        (LOG.error if name in unfixable else LOG.warning)(
            "funcoll.probe: group %s %s: native %s gave a wrong result (%s); %s", group, device_type, name, why, then)
    LOG.info("funcoll.probe: group %s %s: %d native requests of %s verified (%s): %s", group, device_type,
             len(names), caps.name, "cache" if cached else f"{res.seconds:.2f}s",
             "all right" if not wrong else f"{len(wrong)} wrong, {len(demoted)} demoted")
    return res


def run(group=None, device: Optional[str] = None, *, cache: bool = True) -> ProbeResult:
    """:func:`probe_transport` of ``group``'s (default: the world's) transport for ``device`` ("cpu", "xpu", "xla";
    default: "xpu" where an XPU is available, else "cpu"). Collective: every rank of the group calls it.
    ``cache=False`` ignores and does not write the disk cache."""
    group = dist.group.WORLD if group is None else group
    device = device or ("xpu" if torch.xpu.is_available() else "cpu")
    tp = transport_for(group, device)
    return probe_transport(tp, torch.device(device).type, getattr(group, "group_name", None) or group_label(tp),
                           cache=cache)


def at_creation(pg, device_type: str, tp) -> None:
    """Probes a transport a funcoll group just made, unless the world is virtual: run by the hook ``import funcoll``
    registers (``funcoll._probe_at_creation``) when ``FUNCOLL_PROBE=1``."""
    if is_local_store(pg.get_group_store()) or getattr(tp, "virtual", False):
        LOG.info("funcoll.probe: group %s %s: not probed (a virtual group)", pg.group_name, device_type)
        return
    if device_type == "xla" and _xla_on_cpu():
        LOG.info("funcoll.probe: group %s xla: not probed (the CPU PJRT device)", pg.group_name)
        return
    probe_transport(tp, device_type, pg.group_name or "(unnamed)")


def _inject_wrong(tp, name: str) -> None:
    """``python -m funcoll probe --simulate-wrong``: ``tp`` reduces one native reduction (``"all_reduce max int32"``)
    with SUM instead (MAX where SUM was asked), as a broken collective library would."""
    req = Request.parse(name)
    if req.primitive not in ("all_reduce", "reduce_scatter", "reduce"):
        raise ValueError(f"funcoll.probe.inject_wrong: only reductions can be made wrong, got {name!r}")
    swap = Reduction(ReduceOp.MAX if req.op is ReduceOp.SUM else ReduceOp.SUM)
    cls = type(tp)
    method = "_" + req.primitive

    def wrong(self, *args):
        t = args[1] if req.primitive == "reduce_scatter" else args[0]
        if t.dtype == req.dtype and args[-1].op is req.op:  # the reduction is the last argument
            args = (*args[:-1], swap)
        return getattr(cls, method)(self, *args)

    tp.__class__ = type(f"Wrong{cls.__name__}", (cls,), {method: wrong})
