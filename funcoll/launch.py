"""Run a function on every rank of a small real world on this machine (separate processes, ``funcoll`` backend over
gloo): the demo, the tests and users' own multi-rank tests (docs/testing-compiled.md, "Multi-rank tests"). ``target``
is "module:function" (importable with the parent's sys.path), called as ``fn(rank, world_size, *args)`` after
``init_process_group``; its picklable return value comes back. Every rendezvous and collective has a timeout, and the
parent kills a world that overruns. Ranks start from a fork server that imported torch once, as fresh as spawned ones;
they are spawned when a variable outside ``_LATE_ENV`` differs from the fork server's (torch may have read it at
import), as always with ``FUNCOLL_LAUNCH=spawn``. :func:`run_world` is the public entry; the harness's own fault
tests use ``_spawn_world``, which reports ranks that die or hang instead of raising.
"""

from __future__ import annotations

import contextlib
import faulthandler
import importlib
import multiprocessing as mp
import os
import pickle
import queue
import socket
import time
import traceback
from datetime import timedelta
from multiprocessing import forkserver
from typing import Mapping, MutableMapping, Optional, Sequence, Tuple, Union

__all__ = ["run_world"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# what the fork server imports once (not funcoll: it reads FUNCOLL_* at import), and the environment variables a rank
# may hold with a value other than the fork server's, as importing torch does not read them (``TORCH_LOGS`` and
# ``TORCH_DISTRIBUTED_DEBUG`` it does): funcoll's, those of the runtimes and of the parts of torch the server has not
# imported (Dynamo, Inductor, torch_xla, libtpu), pytest's name of the running test
_PRELOAD = ["torch", "torch.distributed"]
_LATE_ENV = ("FUNCOLL_", "TORCHDYNAMO_", "TORCHINDUCTOR_", "PJRT_", "XLA_", "TPU_", "PYTEST_")
_server: dict = {}  # the fork server this process started: its pid and environment


def _fork_server_pid() -> Union[int, None, bool]:
    """The pid of this process's fork server (None: not running), False when this Python does not say. No public API
    says whether ``forkserver.ensure_running()`` found the server running (someone else chose its imports) or started
    it anew (under the environment of now, which ranks are compared with); a changed pid says both. CPython 3.10-3.13
    keep it in ``forkserver._forkserver._forkserver_pid`` (Lib/multiprocessing/forkserver.py)."""
    return getattr(getattr(forkserver, "_forkserver", None), "_forkserver_pid", False)


def _context(rank_env: Mapping[str, str]):
    """The multiprocessing context to start ranks of environment ``rank_env`` with: the fork server when its ranks
    would be what spawned ones are (see the module's docstring), else ``spawn``."""
    if os.environ.get("FUNCOLL_LAUNCH", "forkserver") == "spawn" or "forkserver" not in mp.get_all_start_methods():
        return mp.get_context("spawn")
    pid = _fork_server_pid()
    if pid is False or (not _server and pid is not None):  # unknown, or started by someone else: imports unknown
        return mp.get_context("spawn")
    if not _server:
        mp.set_forkserver_preload(_PRELOAD)
    forkserver.ensure_running()  # starts it, or starts it again if it died: under this process's environment of now
    pid = _fork_server_pid()
    if pid != _server.get("pid"):
        _server.update(pid=pid, env=dict(os.environ))
    env = _server["env"]
    differs = any(env.get(k) != rank_env.get(k) for k in set(env) | set(rank_env) if not k.startswith(_LATE_ENV))
    return mp.get_context("spawn" if differs else "forkserver")


def _as_spawned(env: Mapping[str, str], parent: int) -> None:
    """In a rank started by the fork server: the environment, stdout and stderr a spawned rank has (the launching
    process's, which the fork server's are not)."""
    os.environ.clear()
    os.environ.update(env)
    for fd in (1, 2):
        try:
            target = os.open(f"/proc/{parent}/fd/{fd}", os.O_WRONLY | os.O_APPEND)
        except OSError:  # a socket, or no /proc: the fork server's
            continue
        os.dup2(target, fd)
        os.close(target)


def _apply(environ: MutableMapping[str, str], env: Mapping[str, Optional[str]]) -> None:
    """Sets the variables of ``env`` in ``environ``; removes those whose value is None."""
    for k, v in env.items():
        if v is None:
            environ.pop(k, None)
        else:
            environ[k] = v


def _all_connected(world: int, timeout: float) -> None:
    """Returns once every rank's default group is made (a store counter, no collective: the targets' sequence numbers
    start at 1). A target may destroy the group or exit at once, and a gloo peer still making its full mesh fails
    ("Connection closed by peer") when a rank it already reached closes its side meanwhile."""
    import torch.distributed.distributed_c10d as c10d

    store = c10d._get_default_store()
    store.add("funcoll-launch/connected", 1)
    deadline = time.monotonic() + timeout
    while int(store.add("funcoll-launch/connected", 0)) < world:
        if time.monotonic() > deadline:
            raise TimeoutError(f"funcoll.launch: not every rank of {world} made its default group within {timeout}s")
        time.sleep(0.005)


def _child(rank, world, port, target, args, backend, results_queue, coll_timeout, forked=None):
    if forked is not None:
        _as_spawned(*forked)
    faulthandler.enable(all_threads=True)  # a rank that crashes (a signal, an abort) prints every thread's stack
    try:  # (spawn gives the child the parent's sys.path)
        import torch
        import torch.distributed as dist

        import funcoll  # noqa: F401  (registers the backend)

        torch.set_num_threads(1)
        dist.init_process_group(backend, rank=rank, world_size=world,
                                init_method=f"tcp://127.0.0.1:{port}",
                                timeout=timedelta(seconds=coll_timeout))
        _all_connected(world, coll_timeout)
        mod, fn = target.split(":")
        res = getattr(importlib.import_module(mod), fn)(rank, world, *args)
        results_queue.put((rank, "ok", pickle.dumps(res)))  # plain pickle: tensors travel by value
    except BaseException:  # noqa: BLE001 - reported to the parent
        results_queue.put((rank, "err", traceback.format_exc()))
    finally:
        # the result is written to the pipe before the teardown: a rank that dies while destroying its group is
        # reported with its result and its exit code, not as a rank that died without a result
        results_queue.close()
        results_queue.join_thread()
        with contextlib.suppress(Exception):
            import torch.distributed as dist

            if dist.is_initialized():
                dist.destroy_process_group()


def _spawn_world(target: str, world_size: int = 2, profile: Optional[str] = None, args: Sequence = (),
                 deadline: float = 180, backend: str = "funcoll", coll_timeout: float = 60,
                 env: Optional[Mapping[str, Optional[str]]] = None) -> Tuple[list, list, list]:
    """Runs ``target`` on ``world_size`` new ranks and reports what happened, ranks that die included (fault
    tests kill ranks on purpose). Returns ``(results, exit codes, hung)``: ``results[rank]`` is ``("ok", value)``,
    ``("err", traceback)`` or None (the rank died without a result); ranks still running at ``deadline`` seconds
    are killed and listed in ``hung``. ``env`` sets (None: removes) environment variables of the ranks;
    ``profile`` is their ``FUNCOLL_PROFILE``."""
    env = {**(env or {}), "FUNCOLL_PROFILE": profile}
    rank_env = dict(os.environ)
    _apply(rank_env, env)
    ctx = _context(rank_env)
    forked = (rank_env, os.getpid()) if ctx.get_start_method() == "forkserver" else None
    for _ in range(3):  # a port another process took between _free_port() and the store's bind: a new port
        results, codes, hung = _world(ctx, forked, env, target, world_size, args, deadline, backend, coll_timeout)
        if not any(map(_port_taken, results)):
            break
    return results, codes, hung


def _port_taken(res: Optional[tuple]) -> bool:
    """Whether a rank's result is the traceback of the store's bind failing on a port another process took meanwhile."""
    return res is not None and res[0] == "err" and "EADDRINUSE" in res[1] and "init_process_group" in res[1]


def _world(ctx, forked, env, target, world_size, args, deadline, backend, coll_timeout) -> Tuple[list, list, list]:
    results_queue = ctx.Queue()
    port = _free_port()
    procs = [ctx.Process(target=_child, args=(r, world_size, port, target, tuple(args), backend, results_queue,
                                              coll_timeout, forked), daemon=True)
             for r in range(world_size)]
    saved = {k: os.environ.get(k) for k in env}
    try:
        if forked is None:  # spawned ranks inherit the environment at start
            _apply(os.environ, env)
        for proc in procs:
            proc.start()
    finally:
        if forked is None:
            _apply(os.environ, saved)
    results: dict = {}
    end = time.monotonic() + deadline
    try:
        while len(results) < world_size and (left := end - time.monotonic()) > 0:
            try:
                rank, status, res = results_queue.get(timeout=min(left, 0.5))
            except queue.Empty:
                if all(not proc.is_alive() for proc in procs) and results_queue.empty():
                    break
                continue
            results[rank] = (status, pickle.loads(res) if status == "ok" else res)
            if _port_taken(results[rank]):  # the rendezvous never began: the others are stopped
                break
        hung = [r for r, proc in enumerate(procs) if r not in results and proc.is_alive()]
    finally:
        taken = any(map(_port_taken, results.values()))
        for proc in procs:
            proc.join(timeout=0 if taken else 10)
            if proc.is_alive():
                proc.kill()
                proc.join(timeout=5)
    return [results.get(r) for r in range(world_size)], [proc.exitcode for proc in procs], hung


def run_world(target: str, world_size: int = 2, profile: Optional[str] = None, args: Sequence = (),
              timeout: float = 180, backend: str = "funcoll", coll_timeout: float = 60,
              env: Optional[Mapping[str, Optional[str]]] = None) -> list:
    """Returns the per-rank results; raises AssertionError with the first failing rank's traceback, or naming the
    ranks that died without a result, and TimeoutError when the world does not finish in ``timeout`` seconds."""
    results, codes, hung = _spawn_world(target, world_size, profile, args, timeout, backend, coll_timeout, env)
    if hung:
        raise TimeoutError(f"{target} on {world_size} ranks did not finish in {timeout}s "
                           f"(ranks done: {[r for r, res in enumerate(results) if res is not None]})")
    errors = [(r, res[1]) for r, res in enumerate(results) if res is not None and res[0] != "ok"]
    if errors:
        rank, trace = errors[0]
        raise AssertionError(f"rank {rank} of {target} (world {world_size}, profile {profile}) failed:\n{trace}")
    dead = [r for r, res in enumerate(results) if res is None]
    if dead:
        raise AssertionError(f"ranks {dead} of {target} died without a result (exit codes {codes})")
    return [res[1] for res in results]
