"""funcoll.launch: what the harness reports about a world whose ranks die; how its ranks start."""

import os
import signal
import time
from datetime import timedelta

from funcoll.launch import _spawn_world, run_world

PAYLOAD = 1 << 20  # more than a pipe holds: a result still being written when the rank dies would be lost


def _rank_dies_at_teardown(rank, n):
    """Returns its result, then the process aborts while the harness destroys the group."""
    import torch.distributed as dist

    dist.destroy_process_group = os.abort  # the harness calls it after handing over the result
    return {"rank": rank, "payload": b"x" * PAYLOAD}


def test_a_rank_that_dies_in_the_teardown_is_reported_with_its_result_and_exit_code():
    results, codes, hung = _spawn_world("tests.faults.test_launch:_rank_dies_at_teardown", 2, deadline=60,
                                        coll_timeout=10)
    assert hung == [] and codes == [-6, -6], (codes, hung)
    for rank in (0, 1):
        assert results[rank] is not None, f"rank {rank}'s result was lost"
        status, value = results[rank]
        assert status == "ok" and value == {"rank": rank, "payload": b"x" * PAYLOAD}


def _rank_leaves_at_once(rank, n):
    """Rank 0 closes its group the moment its target starts; every other rank then runs an all_reduce on the
    default group's gloo backend it made (each counting what it sees of the store's keys first). Rank 0 hosts the
    store the others make their new group with: its process stays until they are done (its group is closed)."""
    import torch
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d

    store = c10d._get_default_store()
    if rank == 0:
        dist.destroy_process_group()
        store.wait(["test-launch/done"], timedelta(seconds=60))  # set by the last of the others
        return "left"
    # every rank, rank 0 included, had made its group before any target ran: none is still connecting to rank 0
    made = int(store.add("funcoll-launch/connected", 0))
    sub = dist.new_group([r for r in range(1, n)], backend="gloo")
    t = torch.ones(1)
    dist.all_reduce(t, group=sub)
    if store.add("test-launch/finished", 1) == n - 1:
        store.set("test-launch/done", "1")
    return made, t.item()


def test_every_rank_has_made_its_group_before_any_target_runs():
    """A target may destroy its group (or exit) at once: a gloo peer still making its full mesh would fail with
    "Connection closed by peer" when a rank it reached closes its side; the launcher starts no target before every
    rank's default group is made."""
    results = run_world("tests.faults.test_launch:_rank_leaves_at_once", 4, timeout=120, coll_timeout=20)
    assert results == ["left"] + [(4, 3.0)] * 3, results


def _rank_reports(rank, n, keys):
    """What a rank sees: its parent process, the environment variables ``keys``, torch's distributed debug level
    (read when torch.distributed is imported); it prints a line to stdout and one to stderr."""
    import torch.distributed as dist

    os.write(1, f"stdout of rank {rank}\n".encode())  # one write per line: the ranks' lines never interleave
    os.write(2, f"stderr of rank {rank}\n".encode())
    return os.getppid(), {k: os.environ.get(k) for k in keys}, str(dist.get_debug_level())


def test_ranks_start_from_the_fork_server_with_the_environment_of_the_launch(monkeypatch, tmp_path):
    import torch.distributed as dist

    from funcoll.launch import run_world

    keys = ["FUNCOLL_LAUNCH_PROBE", "FUNCOLL_GONE", "FUNCOLL_PROFILE", "TORCHINDUCTOR_CACHE_DIR"]
    run_world("tests.faults.test_launch:_rank_reports", 2, args=(keys,), timeout=60)  # the fork server is running
    monkeypatch.setenv("FUNCOLL_LAUNCH_PROBE", "set after the server started")
    monkeypatch.setenv("FUNCOLL_GONE", "removed for the ranks")
    # what Inductor sets in this process at its first compile: read by torch only once Inductor is imported
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    # the ranks print into this process's stdout and stderr of now, not the fork server's
    out, err = tmp_path / "out", tmp_path / "err"
    saved = os.dup(1), os.dup(2)
    try:
        with open(out, "wb") as o, open(err, "wb") as e:
            os.dup2(o.fileno(), 1)
            os.dup2(e.fileno(), 2)
            got = run_world("tests.faults.test_launch:_rank_reports", 2, profile="xccl", args=(keys,), timeout=60,
                            env={"FUNCOLL_GONE": None})
    finally:
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
    for rank, (ppid, env, debug) in enumerate(got):
        assert ppid != os.getpid(), f"rank {rank} was spawned, not forked by the fork server"
        assert env == {"FUNCOLL_LAUNCH_PROBE": "set after the server started", "FUNCOLL_GONE": None,
                       "FUNCOLL_PROFILE": "xccl", "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor")}
        assert debug == str(dist.get_debug_level())
        assert f"stdout of rank {rank}\n" in out.read_text()
        assert f"stderr of rank {rank}\n" in err.read_text()


def test_ranks_whose_torch_reads_another_environment_at_import_are_spawned():
    """TORCH_DISTRIBUTED_DEBUG is read when torch.distributed is imported: the fork server's import cannot serve a
    rank that sets it, so the ranks are spawned and see it (torch's debug level is DETAIL)."""
    from funcoll.launch import run_world

    got = run_world("tests.faults.test_launch:_rank_reports", 2, args=([],), timeout=120,
                    env={"TORCH_DISTRIBUTED_DEBUG": "DETAIL"})
    for ppid, _, debug in got:
        assert ppid == os.getpid() and debug == "DebugLevel.DETAIL", (ppid, debug)


def _kill_fork_server() -> None:
    from funcoll import launch

    pid = launch._fork_server_pid()
    assert isinstance(pid, int) and pid is not False, pid
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while open(f"/proc/{pid}/stat").read().split()[2] != "Z":  # a zombie until the next launch reaps it
        assert time.monotonic() < deadline, "the fork server did not die"
        time.sleep(0.01)


def test_a_fork_server_that_died_is_started_again_and_its_new_environment_is_the_one_compared(monkeypatch):
    """The fork server is killed, then the launching process sets a variable torch reads at import: the server started
    again imports torch under it, so ranks that must not see it are spawned (torch's debug level stays OFF)."""
    from funcoll.launch import run_world

    run_world("tests.faults.test_launch:_rank_reports", 2, args=([],), timeout=60)
    _kill_fork_server()
    try:
        with monkeypatch.context() as m:
            m.setenv("TORCH_DISTRIBUTED_DEBUG", "DETAIL")
            got = run_world("tests.faults.test_launch:_rank_reports", 2, args=(["TORCH_DISTRIBUTED_DEBUG"],),
                            timeout=120, env={"TORCH_DISTRIBUTED_DEBUG": None})
    finally:
        _kill_fork_server()  # the next launch starts it again, under the environment of the tests that follow
    for _, env, debug in got:
        assert env == {"TORCH_DISTRIBUTED_DEBUG": None} and debug == "DebugLevel.OFF", (env, debug)


def test_a_python_whose_fork_server_keeps_its_pid_elsewhere_spawns_the_ranks(monkeypatch):
    """Without CPython's private ``forkserver._forkserver._forkserver_pid`` the launcher cannot tell which environment
    its fork server started under: the ranks are spawned (their parent is this process) and still run."""
    from multiprocessing import forkserver

    monkeypatch.setattr(forkserver, "_forkserver", object())
    got = run_world("tests.faults.test_launch:_rank_reports", 2, args=([],), timeout=120)
    assert [ppid for ppid, _, _ in got] == [os.getpid()] * 2, got


def test_a_port_taken_between_its_choice_and_the_rendezvous_is_replaced(monkeypatch):
    """Another process may bind the port _free_port() chose before rank 0's store does (two suites at once): the
    world starts again on a new port instead of failing with EADDRINUSE."""
    import socket

    from funcoll import launch

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        ports = iter([taken.getsockname()[1]])
        real = launch._free_port
        monkeypatch.setattr(launch, "_free_port", lambda: next(ports, None) or real())
        got = run_world("tests.faults.test_launch:_rank_reports", 2, args=([],), timeout=60)
    assert [g[1] for g in got] == [{}, {}]  # both ranks ran the target
