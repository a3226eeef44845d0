"""Executes HLO modules on N replicas of the XLA CPU runtime (jaxlib); run by :mod:`funcoll.replicas`, as a script.

It imports neither torch nor funcoll (only numpy and jaxlib), so that it starts fast and that jaxlib's XLA never meets
torch_xla's in one process. ``spmd JOB OUT``: one process with N CPU devices runs each module on N replicas;
``mpmd JOB OUT RANK PORT``: one of N processes (``jax.distributed``, gloo between them) runs its own rank's module
(docs/xla-replicas.md, "One program, or one per rank").

A job: ``{"world": N, "modules": [[(hlo proto bytes, [(dtype, shape, bytes) per parameter]) per rank], ...]}``. The
answer: ``{"outputs": [[[(dtype, shape, bytes) per output] per rank] per module]}`` or ``{"error": text,
"module": i, "stage": "compile"|"execute"}``.
"""

from __future__ import annotations

import os
import pickle
import sys

import numpy as np


def _np_dtype(name: str):
    if name == "bfloat16":
        import ml_dtypes

        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(name)


def _array(spec):
    dtype, shape, data = spec
    return np.frombuffer(data, dtype=_np_dtype(dtype)).reshape(shape).copy()


def _spec(value):
    array = np.ascontiguousarray(np.asarray(value))
    return (str(array.dtype), tuple(array.shape), array.tobytes())


def _compile(client, devices, proto: bytes, world: int):
    from jax._src.lib import _jax
    from jax._src.lib import xla_client as xc

    stablehlo = _jax.mlir.hlo_to_stablehlo(proto)
    opts = xc.CompileOptions()
    build = opts.executable_build_options
    build.num_replicas = world
    build.num_partitions = 1
    build.device_assignment = xc.DeviceAssignment.create(np.array([d.id for d in devices]).reshape(world, 1))
    return client.compile_and_load(stablehlo, xc.DeviceList(tuple(devices)), opts)


def _run(exe, devices, local, params_of_local):
    """Runs ``exe``: ``params_of_local[i]`` holds, for each device of ``local``, its value of parameter i. Returns,
    per local device, the list of its outputs."""
    import jax

    mesh = jax.sharding.Mesh(np.array(devices), ("replica",))
    # one array per parameter holding one shard per replica; the replicas' values differ (each rank's own), which
    # execute_sharded takes as they are
    sharding = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
    args = [jax.make_array_from_single_device_arrays(values[0].shape, sharding,
                                                     [jax.device_put(v, d) for v, d in zip(values, local)])
            for values in params_of_local]
    results = exe.execute_sharded(args).disassemble_into_single_device_arrays()
    by_device: dict = {}
    for per_output in results:
        for array in per_output:
            (dev,) = array.devices()
            by_device.setdefault(dev.id, []).append(_spec(array))
    return [by_device.get(d.id, []) for d in local]


def _execute(job: dict, devices, local, ranks: list) -> dict:
    """Compiles and runs each module of the job over ``devices``: this process's devices ``local`` are ranks
    ``ranks``, and run those ranks' modules with their parameters."""
    outputs = []
    for i, module in enumerate(job["modules"]):
        stage = "compile"
        try:
            exe = _compile(local[0].client, devices, module[ranks[0]][0], job["world"])
            stage = "execute"
            params = [[_array(module[r][1][p]) for r in ranks] for p in range(len(module[ranks[0]][1]))]
            outputs.append(_run(exe, devices, local, params))
        except Exception as e:  # noqa: BLE001 - reported to the caller with the module and the stage
            return {"error": f"{type(e).__name__}: {e}", "module": i, "stage": stage}
    return {"outputs": outputs}


def spmd(job: dict) -> dict:
    world = job["world"]
    import jax

    jax.config.update("jax_enable_x64", True)  # else float64 and int64 parameters are narrowed on the way in
    devices = jax.devices("cpu")[:world]
    if len(devices) < world:
        return {"error": f"the XLA CPU runtime has {len(devices)} devices, {world} are needed", "module": None,
                "stage": "setup"}
    return _execute(job, devices, devices, list(range(world)))


def mpmd(job: dict, rank: int, port: int) -> dict:
    world = job["world"]
    import jax

    jax.config.update("jax_enable_x64", True)
    jax.config.update("jax_platforms", "cpu")
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(coordinator_address=f"127.0.0.1:{port}", num_processes=world, process_id=rank,
                               initialization_timeout=120, heartbeat_timeout_seconds=20,
                               shutdown_timeout_seconds=20)
    try:
        devices = sorted(jax.devices(), key=lambda d: d.process_index)
        return _execute(job, devices, jax.local_devices(), [rank])
    finally:
        jax.distributed.shutdown()


def main(argv) -> int:
    mode, job_path, out_path = argv[0], argv[1], argv[2]
    with open(job_path, "rb") as f:
        job = pickle.load(f)
    # test programs are small and run once: LLVM's optimisations would cost more than they save
    flags = " --xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true"
    if mode == "spmd":
        flags += f" --xla_force_host_platform_device_count={job['world']}"
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + flags).strip()  # read when jax is imported
    answer = spmd(job) if mode == "spmd" else mpmd(job, int(argv[3]), int(argv[4]))
    with open(out_path, "wb") as f:
        pickle.dump(answer, f)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
