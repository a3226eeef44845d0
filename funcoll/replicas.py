"""Executes what the ranks of an N-rank XLA job compile, on N replicas of the XLA CPU runtime (docs/xla-replicas.md):
:func:`capture` builds every rank's program in this process (nothing executes), :func:`execute` runs them in jaxlib
subprocesses (``_replica_worker.py``), :func:`run` is both."""

from __future__ import annotations

import os
import pickle
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any, Callable, List, Optional, Sequence, Tuple

import torch

from .launch import _free_port

__all__ = ["capture", "execute", "run", "World", "RankProgram", "ReplicaRuntimeError", "available"]

_WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_replica_worker.py")
_INSTRUCTION = re.compile(r"^\s*(?:ROOT )?%([\w.\-]+) = ")
_METADATA = re.compile(r", metadata=\{[^}]*\}")
_MODULE_LINE = re.compile(r"^HloModule [\w.\-]+")
_NAME = re.compile(r"%([\w.\-]+)")
_HEADER = re.compile(r"^((?:ENTRY )?%[\w.\-]+) \(.*\) -> (.*\{)\s*$")
_TORCH_OF = {name: getattr(torch, name) for name in ("bool", "int8", "uint8", "int16", "uint16", "int32", "uint32",
                                                   "int64", "uint64", "float16", "bfloat16", "float32", "float64",
                                                   "complex64", "complex128")}
_NAME_OF = {v: k for k, v in _TORCH_OF.items()}


class ReplicaRuntimeError(RuntimeError):
    """The XLA CPU runtime could not compile or run a rank's module (the message names the instruction when XLA's
    error does), or the run did not finish in time."""


def available() -> Optional[str]:
    """None when the replica runner can run here, else why not (no torch_xla, no jaxlib)."""
    import importlib.util

    for mod, extra in (("torch_xla", "xla"), ("jaxlib", "xla-replicas"), ("jax", "xla-replicas")):
        if importlib.util.find_spec(mod) is None:
            return f"funcoll.replicas needs {mod} (pip install funcoll[{extra}])"
    return None


@dataclass
class RankProgram:
    """What one rank compiled: its HLO module (``proto``: a serialized HloModuleProto; ``text``: the HLO text) and the
    values of the module's parameters, in parameter order (CPU tensors: the rank's inputs and the device data funcoll
    made, such as the rank's own mask of a broadcast)."""

    rank: int
    proto: bytes
    text: str
    params: List[torch.Tensor]
    structure: Any = None  # how fn's result nests (a torch.utils._pytree spec)
    returned: int = 0  # the module's first outputs are fn's results; the rest are what funcoll keeps until the step


@dataclass
class World:
    """The programs of every rank of a virtual world of ``size`` ranks. ``same``: every rank compiled rank 0's module;
    else ``why`` says where the first rank that differs differs."""

    size: int
    ranks: List[RankProgram]
    why: Optional[str] = None
    same: bool = field(init=False)

    def __post_init__(self) -> None:
        self.why = _difference(self.ranks)
        self.same = self.why is None


def _canonical(text: str) -> List[str]:
    """The module's lines without its name, without metadata, and with every ``%name`` numbered in order of first
    appearance: two modules that compute the same thing the same way read the same, whatever ids torch_xla gave."""
    lines: List[str] = []
    names: dict = {}

    def rename(m):
        return "%" + names.setdefault(m.group(1), f"v{len(names)}")

    for line in text.splitlines():
        line = _MODULE_LINE.sub("HloModule m", _METADATA.sub("", line))
        line = _HEADER.sub(r"\1 -> \2", line)  # a computation's parameter names: its parameter lines show them
        if line.strip():
            lines.append(_NAME.sub(rename, line))
    return lines


def _difference(ranks: Sequence[RankProgram]) -> Optional[str]:
    base = _canonical(ranks[0].text)
    for p in ranks[1:]:
        mine = _canonical(p.text)
        if mine == base:
            continue
        # the instructions first: the module's header repeats every parameter and result shape on one line
        for i, (a, b) in enumerate(list(zip(base[1:], mine[1:])) + [(base[0], mine[0])]):
            if a != b:
                where = f"line {i + 2}" if i + 1 < min(len(base), len(mine)) else "its header"
                return (f"rank {p.rank}'s module differs from rank 0's at {where}:\n  rank 0: {a.strip()}\n"
                        f"  rank {p.rank}: {b.strip()}")
        return f"rank {p.rank}'s module has {len(mine)} lines, rank 0's {len(base)}"
    return None


def _flatten(result) -> Tuple[List[torch.Tensor], Any]:
    from torch.utils._pytree import tree_flatten

    leaves, spec = tree_flatten(result)
    for leaf in leaves:
        if not isinstance(leaf, torch.Tensor) or leaf.device.type != "xla":
            raise TypeError(f"funcoll.replicas: fn must return XLA tensors (a tensor, or lists, tuples or dicts of "
                            f"them), got a {type(leaf).__name__}"
                            + (f" on {leaf.device}" if isinstance(leaf, torch.Tensor) else ""))
    if not leaves:
        raise ValueError("funcoll.replicas: fn returned no tensor")
    return leaves, spec


def _program(rank: int, outs: List[torch.Tensor], structure) -> RankProgram:
    import torch_xla

    X = torch_xla._XLAC
    returned = len(outs)
    # a collective whose result no output of this rank reads (a send; reduce's all-reduce on a rank that is not dst)
    # is kept alive until the next step (funcoll's Transport.retain): it is part of what this rank runs
    outs = outs + _step_tensors()
    proto = X._get_xla_tensors_hlo_proto(outs)
    text = X._get_xla_tensors_hlo(outs)
    if not text.strip():
        raise ValueError(f"funcoll.replicas: rank {rank}'s results hold no computation to run: their graph already ran "
                         f"on this process's single replica (torch_xla.sync(), .cpu(), or "
                         f"torch.compile(backend='openxla'), which compiles and runs its graph at once); build them "
                         f"lazily (compile with backend='aot_eager')")
    _, values = X._get_tensors_xla_device_data_node(outs)
    return RankProgram(rank, proto, text, [v.detach().cpu() for v in values], structure, returned)


def capture(fn: Callable[[], Any], world_size: int, install: bool = True) -> World:
    """Calls ``fn()`` once as each rank of a virtual world of ``world_size`` ranks (a ``HashStore`` default group and
    ``funcoll.install(["xla"])`` per rank; ``install=False``: ``funcoll.uninstall()``, torch_xla's own kernels) and
    returns every rank's program; nothing is executed (docs/xla-replicas.md). ``fn`` returns the XLA tensors to
    compute (a tensor, or lists, tuples or dicts of them). Needs torch_xla (PJRT_DEVICE=CPU), jaxlib when an uneven
    ``all_to_all_single`` agrees on its split sizes (:class:`_Agreements`), and no default process group here."""
    import torch.distributed as dist

    if not isinstance(world_size, int) or isinstance(world_size, bool) or world_size < 1:
        raise ValueError(f"funcoll.replicas.capture: world_size must be a positive int, got {world_size!r}")
    if dist.is_initialized():
        raise RuntimeError("funcoll.replicas.capture builds a virtual world per rank as the default process group; "
                           "this process already has one: call it in a process without one (e.g. a subprocess)")
    told: dict = {}  # without a split-size agreement the first pass is the only one
    programs = _capture_pass(fn, world_size, install, _Agreements(told, None))
    if told:
        programs = _capture_pass(fn, world_size, install, _Agreements({}, _run_agreements(told, world_size)))
    return World(world_size, programs)


def _run_agreements(told: dict, world_size: int) -> dict:
    """Runs the split-size agreements a first pass recorded (``told``: (this global rank, the group's global ranks,
    the agreement's index on that group) -> the values this rank sends) on ``world_size`` replicas, each one funcoll's
    all_gather over its group (a sub-group made anew from its ranks: the replica groups funcoll gives it when no
    partition is registered). Returns the same keys -> the rows this rank's all_gather returned (one per member, in
    group order)."""
    import torch.distributed as dist
    import torch_xla

    keys = sorted({(ranks, i) for (_, ranks, i) in told})
    for ranks, i in keys:
        missing = [r for r in ranks if (r, ranks, i) not in told]
        if missing:
            me = next(r for r in ranks if (r, ranks, i) in told)
            raise RuntimeError(f"funcoll.replicas: ranks {missing} made no split-size agreement #{i} on the group "
                               f"{list(ranks)} while rank {me} did: the ranks' programs diverge")
    everyone = tuple(range(world_size))

    def gather_values():
        rank = dist.get_rank()
        # every rank makes every group, in one order (c10d's rule); a member gathers its values on the group
        groups = {ranks: dist.group.WORLD if ranks == everyone else dist.new_group(list(ranks))
                  for ranks in dict.fromkeys(r for r, _ in keys)}
        out = {}
        for ranks, i in keys:
            if rank in ranks:
                mine = torch.tensor(told[(rank, ranks, i)], dtype=torch.int64).to(torch_xla.device())
                rows = mine.new_empty((len(ranks) * mine.numel(),))
                dist.all_gather_into_tensor(rows, mine, group=groups[ranks])
                out[f"{list(ranks)} #{i}"] = rows
        return out or {"no agreement on this rank": torch.zeros(1, dtype=torch.int64).to(torch_xla.device())}

    gathered = execute(capture(gather_values, world_size))
    return {(me, ranks, i): gathered[me][f"{list(ranks)} #{i}"].view(len(ranks), -1).tolist()
            for (me, ranks, i) in told}


class _Agreements:
    """Serves XlaTransport.agreed, whose all_gather a virtual world cannot run in the middle of a rank's program:
    records what each rank would send (``record``), answers from ``known`` (what each rank's all_gather of the first
    pass's values returned on the replicas: :func:`_run_agreements`) or, in the first pass, as if every member had
    this rank's values."""

    def __init__(self, record: dict, known: Optional[dict]):
        self.record, self.known = record, known
        self.count: dict = {}

    def __call__(self, ranks, me, values):
        ranks = tuple(ranks)
        i = self.count[(me, ranks)] = self.count.get((me, ranks), -1) + 1
        self.record[(me, ranks, i)] = values
        if self.known is None:
            return [values for _ in ranks]
        if (me, ranks, i) not in self.known:
            raise RuntimeError(f"funcoll.replicas: rank {me} made a split-size agreement #{i} on the group "
                               f"{list(ranks)} in its second pass but not in its first: its program depends on more "
                               f"than its own values")
        return self.known[(me, ranks, i)]


def _capture_pass(fn, world_size: int, install: bool, agreements: _Agreements) -> List[RankProgram]:
    import torch.distributed as dist

    import funcoll
    from funcoll import xla
    from funcoll.transport import xla as xla_transport

    programs = []
    for rank in range(world_size):
        dist.init_process_group("funcoll", store=dist.HashStore(), rank=rank, world_size=world_size)
        xla_transport._agreements.serve = agreements
        try:
            if install:
                funcoll.install(["xla"])
            else:
                funcoll.uninstall()
            xla.reset_token()
            _step_tensors()
            outs, structure = _flatten(fn())
            programs.append(_program(rank, outs, structure))
            del outs
        finally:
            xla_transport._agreements.serve = None
            xla.reset_token()
            _step_tensors()
            dist.destroy_process_group()
            funcoll.groups.clear()
    return programs


def _step_tensors() -> List[torch.Tensor]:
    """Takes the XLA tensors that step closures keep alive until the next ``torch_xla.sync()`` (which would run them):
    a virtual world must never run them, and they belong to the rank's module."""
    import torch_xla.core.xla_model as xm

    devctx = xm._get_device_context()
    closures = getattr(devctx, "step_closures", None) or []
    devctx.step_closures = []  # type: ignore[attr-defined]
    return [a for c in closures for a in (getattr(c, "__defaults__", None) or ((),))[0] or ()
            if isinstance(a, torch.Tensor) and a.device.type == "xla"]


def _encode(t: torch.Tensor):
    if t.dtype not in _NAME_OF:
        raise TypeError(f"funcoll.replicas: a parameter of dtype {t.dtype} cannot be passed to the XLA CPU runtime")
    t = t.detach().contiguous()
    data = t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""
    return (_NAME_OF[t.dtype], tuple(t.shape), data)


def _decode(spec) -> torch.Tensor:
    dtype, shape, data = spec
    tdt = _TORCH_OF[dtype]
    if not data:
        return torch.empty(shape, dtype=tdt)
    return torch.frombuffer(bytearray(data), dtype=torch.uint8).view(tdt).reshape(shape)


def _instruction_named(text: str, message: str) -> Optional[str]:
    """The line of ``text`` defining the first instruction ``message`` names (``%name`` or a bare name)."""
    names = {}
    for line in text.splitlines():
        defined = _INSTRUCTION.match(line)
        if defined:
            names[defined.group(1)] = _METADATA.sub("", line).strip()
    # XLA's verifier prints the instruction it rejects with the name torch_xla gave it as op_name
    for token in re.findall(r'op_name="([^"]+)"', message):
        if token in names:
            return names[token]
    tokens = [t for t in re.findall(r"%?([A-Za-z_][\w\-]*\.\d+)", message) if t in names]
    if tokens:  # an operand (a parameter) is named too: the instruction itself first
        return names[next((t for t in tokens if " parameter(" not in names[t]), tokens[0])]
    for opcode in re.findall(r"(?:opcode|instruction|Unimplemented|not implemented)[^A-Za-z]*([a-z][\w\-]+)",
                             message):
        for line in names.values():
            if f" {opcode}(" in line:
                return line
    for line in names.values():  # a custom call is what a TPU-only lowering brings
        target = re.search(r'custom_call_target="([^"]+)"', line)
        if target and "custom-call(" in line and target.group(1) in message:
            return line
    return None


def execute(worlds, timeout: float = 300.0) -> list:
    """Runs the programs of a :class:`World` (or of each of a list of worlds of one size, all in one subprocess
    start) on ``size`` replicas of the XLA CPU runtime. Returns, per rank, its outputs as CPU tensors in the
    structure ``fn`` returned (for a list of worlds: one such list per world). Raises :class:`ReplicaRuntimeError`
    naming the instruction XLA could not compile or run, or when the run takes longer than ``timeout`` seconds (a
    collective that some replica never reaches waits)."""
    from torch.utils._pytree import tree_unflatten

    single = isinstance(worlds, World)
    worlds = [worlds] if single else list(worlds)
    if not worlds:
        return []
    why = available()
    if why:
        raise ReplicaRuntimeError(why)
    size = worlds[0].size
    if any(w.size != size for w in worlds):
        raise ValueError("funcoll.replicas.execute: every world must have the same size")
    mpmd = any(not w.same for w in worlds)
    job = {"world": size, "modules": [[(p.proto, [_encode(t) for t in p.params]) for p in w.ranks]
                                      for w in worlds]}
    env = {k: v for k, v in os.environ.items() if k != "PJRT_DEVICE"}
    with tempfile.TemporaryDirectory(prefix="funcoll-replicas-") as tmp:
        job_path = os.path.join(tmp, "job.pkl")
        with open(job_path, "wb") as f:
            pickle.dump(job, f)
        if mpmd:  # one process per rank
            port = str(_free_port())
            runs = [["mpmd", job_path, os.path.join(tmp, f"out{r}.pkl"), str(r), port] for r in range(size)]
        else:
            runs = [["spmd", job_path, os.path.join(tmp, "out.pkl")]]
        # each process's output goes to a file: a pipe nobody reads while another rank is waited on could fill up
        logs = [os.path.join(tmp, f"log{i}.txt") for i in range(len(runs))]
        procs = []
        for run, log in zip(runs, logs):
            with open(log, "w") as f:
                procs.append(subprocess.Popen([sys.executable, _WORKER, *run], env=env, stdout=f, stderr=f))
        answers = _wait(procs, logs, [run[2] for run in runs], timeout, mpmd)
    err = next((a for a in answers if "error" in a), None)
    if err is not None:
        raise _error(worlds, err, mpmd)
    results = []
    for i, w in enumerate(worlds):
        per_rank = [a["outputs"][i][0] for a in answers] if mpmd else answers[0]["outputs"][i]
        ranks = []
        for p, specs in zip(w.ranks, per_rank):
            tensors = [_decode(s) for s in specs[:p.returned]]
            ranks.append(tree_unflatten(tensors, p.structure) if p.structure is not None else tensors)
        results.append(ranks)
    return results[0] if single else results


def _wait(procs, logs, outs, timeout, mpmd) -> list:
    deadline = time.monotonic() + timeout
    failed = []
    try:
        for r, (p, log) in enumerate(zip(procs, logs)):
            try:
                p.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                raise ReplicaRuntimeError(
                    f"funcoll.replicas: the replicas did not finish in {timeout:g} s; a collective that some replica "
                    f"never reaches waits for it (do the ranks' programs run the same collectives in the same "
                    f"order?)") from None
            if p.returncode != 0:
                with open(log) as f:
                    tail = "\n".join(f.read().strip().splitlines()[-8:])
                failed.append(f"{'rank ' + str(r) + ' ' if mpmd else ''}(exit code {p.returncode}):\n{tail}")
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    if failed:
        raise ReplicaRuntimeError("funcoll.replicas: the XLA CPU runtime's process failed " + "\n".join(failed))
    answers = []
    for path in outs:
        with open(path, "rb") as f:
            answers.append(pickle.load(f))
    return answers


def _error(worlds, err: dict, mpmd: bool) -> ReplicaRuntimeError:
    message = err["error"].strip()
    lines = [ln.strip() for ln in message.splitlines() if ln.strip() and not ln.startswith("See https")]
    first = " ".join(lines[:2]) if lines else "unknown error"
    i = err.get("module")
    if i is None:
        return ReplicaRuntimeError(f"funcoll.replicas: {first}")
    line = _instruction_named(worlds[i].ranks[0].text, message)
    where = f"instruction {line}" if line else "an instruction XLA's message does not name"
    return ReplicaRuntimeError(f"funcoll.replicas: the XLA CPU runtime cannot {err['stage']} {where} "
                               f"(module {i}): {first}")


def run(fn: Callable[[], Any], world_size: int, timeout: float = 300.0, install: bool = True) -> list:
    """:func:`capture` then :func:`execute`: ``fn()`` as every rank of a virtual world of ``world_size`` ranks, run on
    ``world_size`` CPU replicas; returns each rank's outputs (``result[r]`` is rank r's, shaped as fn's result)."""
    return execute(capture(fn, world_size, install=install), timeout=timeout)
