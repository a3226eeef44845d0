"""funcoll's kernels on the CPU key serving a group made with another backend (gloo): a world destroyed and made
again reuses its groups' names (c10d numbers them from "0" again), and the new group's collectives run over the new
group's own backend, never over the destroyed one's."""

from datetime import timedelta

from funcoll.launch import run_world


def _world_made_again(rank, n):
    """Rank r's functional all_reduce on the default gloo group, before and after the world is destroyed and made
    again on a new store: (group names, the two results, whether the transport serving the new group holds the new
    group's backend, whether that group has one transport however it is named)."""
    import socket

    import torch
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d

    import funcoll
    from funcoll.transport.registry import transport_for

    funcoll.install(["cpu"])
    ops = torch.ops._c10d_functional
    t = torch.full((2,), float(rank + 1))
    first_name = dist.group.WORLD.group_name
    first = ops.wait_tensor(ops.all_reduce(t, "sum", first_name)).tolist()
    store = c10d._get_default_store()
    if rank == 0:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            store.set("test/port", str(s.getsockname()[1]))
    port = int(store.get("test/port"))
    dist.barrier()
    dist.destroy_process_group()
    timeout = timedelta(seconds=20)
    dist.init_process_group("gloo", store=dist.TCPStore("127.0.0.1", port, n, rank == 0, timeout=timeout),
                            rank=rank, world_size=n, timeout=timeout)
    second_name = dist.group.WORLD.group_name
    second = ops.wait_tensor(ops.all_reduce(t * 10, "sum", second_name)).tolist()
    cpu = torch.device("cpu")
    served = transport_for(second_name, cpu)
    resolved = c10d._resolve_process_group(second_name)
    once = served is transport_for(dist.group.WORLD, cpu) is transport_for(resolved, cpu)
    return (first_name, second_name), first, second, served.backend is dist.group.WORLD._get_backend(cpu), once


def test_a_world_made_again_is_served_by_its_own_backend():
    results = run_world("tests.compiled.test_kernels_on_other_groups:_world_made_again", 2, backend="gloo",
                        timeout=120, coll_timeout=20)
    assert results == [(("0", "0"), [3.0, 3.0], [30.0, 30.0], True, True)] * 2, results
