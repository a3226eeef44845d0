"""What tests/fault_tolerance/ runs outside the pytest process: torch_xla and TorchTPU change the process they are
loaded in (TorchTPU renames PrivateUse1 to ``tpu``; a real ``tpu`` tensor aborts a process without a TPU, so only fake
ones are made here), and on torch 2.9 a CPU backward in the pytest process would break its later XLA backward
(tests/fault_tolerance/torchft_suites.py says why)."""

from __future__ import annotations

from datetime import timedelta

from funcoll.torchft import ProcessGroupBabyFuncoll


class PatientBaby(ProcessGroupBabyFuncoll):
    """funcoll's Baby group with a start-up budget for the tests: ``configure`` waits at least :attr:`START` for its
    subprocess, which imports torch first (3-5 s on an idle 2-core machine, 10-12 s at load 20, for torchft's Baby
    gloo class as for funcoll's; three at once, as torchft's world-3 harness starts them, took over the 30 s it
    allows); every other wait keeps the timeout the test sets (1 s for the survivors of the resiliency test). Here,
    not in the test module: the subprocess imports the class's module."""

    START = timedelta(seconds=120)

    def configure(self, *args, **kwargs) -> None:
        timeout = self._timeout
        self._timeout = max(timeout, self.START.total_seconds())
        try:
            super().configure(*args, **kwargs)
        finally:
            self._timeout = timeout


def refusals(device_type: str) -> dict:  # "xla" or "tpu"
    """The error each funcoll.torchft class raises when a collective is given a ``device_type`` tensor (``tpu``: a
    fake one, after TorchTPU's own device init, which runs without a TPU): before any group is configured (nothing
    sent, nothing moved to shared memory, no subprocess started), and on a configured 1-rank group, which serves a CPU
    all_reduce afterwards."""
    from datetime import timedelta

    import torch
    import torch.distributed as dist
    from torch.distributed.distributed_c10d import AllgatherOptions

    from funcoll.torchft import ProcessGroupBabyFuncoll, ProcessGroupFuncoll

    if device_type == "tpu":
        import torch_tpu  # noqa: F401
        from torch._subclasses.fake_tensor import FakeTensorMode
        from torch_tpu import _loader

        _loader._init_device("tpu")
        with FakeTensorMode():
            t = torch.empty(4, device="tpu")
    else:
        import torch_xla  # noqa: F401  (PJRT_DEVICE=CPU: the CPU PJRT device)

        t = torch.empty(4, device=device_type)

    def refused(call, *args) -> str:
        try:
            call(*args)
        except ValueError as e:
            return str(e)
        return "not refused"

    out: dict = {"device": str(t.device)}
    for cls in (ProcessGroupFuncoll, ProcessGroupBabyFuncoll):
        pg = cls()
        out[cls.__name__] = refused(pg.allreduce, [t], dist.AllreduceOptions())
        out[cls.__name__ + " child"] = getattr(pg, "_p", None) is not None
    store = dist.TCPStore("localhost", 0, is_master=True, wait_for_workers=False)
    pg = ProcessGroupFuncoll(timeout=timedelta(seconds=30))
    pg.configure(f"localhost:{store.port}/refusals", "0", 0, 1)
    out["configured allgather"] = refused(pg.allgather, [[t]], [t], AllgatherOptions())
    cpu = torch.tensor([2.5])
    pg.allreduce([cpu], dist.AllreduceOptions()).wait()
    out["then a CPU all_reduce"] = cpu.tolist()
    pg.shutdown()
    return out


def expected_refusals(device_type: str) -> dict:
    """What :func:`refusals` must return: funcoll.torchft's message, naming the method, the device type, why and the
    fix, from every call."""
    from funcoll.torchft import UNSERVED

    def refused(method: str) -> str:
        return (f"funcoll.torchft: {method} on {device_type} tensors cannot cross torchft replica groups: "
                f"{UNSERVED[device_type]}; send a CPU copy instead (t.cpu()); nothing was sent")

    return {"device": f"{device_type}:0", "ProcessGroupFuncoll": refused("allreduce"),
            "ProcessGroupFuncoll child": False, "ProcessGroupBabyFuncoll": refused("allreduce"),
            "ProcessGroupBabyFuncoll child": False, "configured allgather": refused("allgather"),
            "then a CPU all_reduce": [2.5]}


def recipe_reference(steps: int = 5) -> str:
    """What examples/torchft_recipe.py's replica groups end with, computed on one model with plain torch: its
    initial weights, ``steps`` SGD steps on the mean of the two groups' gradients (each group's batches from its own
    generator), as ``step <n>: <weight> <bias>``."""
    import torch

    torch.manual_seed(0)
    ref = torch.nn.Linear(4, 2)
    sgd = torch.optim.SGD(ref.parameters(), lr=0.1)
    data = [torch.Generator().manual_seed(r) for r in range(2)]
    for _ in range(steps):
        grads = []
        for g in data:
            ref.zero_grad()
            ref(torch.randn(8, 4, generator=g)).pow(2).mean().backward()
            grads.append([p.grad.clone() for p in ref.parameters()])
        for p, g0, g1 in zip(ref.parameters(), *grads):
            p.grad = (g0 + g1) / 2  # the Manager's AVG: a SUM, then divided by the participants
        sgd.step()
    return f"step {steps}: {ref.weight.tolist()} {ref.bias.tolist()}"
