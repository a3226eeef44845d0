"""What tests/fault_tolerance/test_torchft.py runs in an interpreter of its own (tests/fresh.py): TorchTPU renames
PrivateUse1 to ``tpu`` process-wide, and a real ``tpu`` tensor aborts a process without a TPU, so only fake ``tpu``
tensors are made here."""

from __future__ import annotations


def refusals(device_type: str) -> dict:
    """The error each funcoll.torchft class raises when a collective is given a ``device_type`` tensor (``tpu``: a
    fake one, after TorchTPU's own device init, which runs without a TPU), before any group is configured: nothing
    is sent, nothing moved to shared memory, no subprocess started."""
    import torch
    import torch.distributed as dist

    from funcoll.torchft import ProcessGroupBabyFuncoll, ProcessGroupFuncoll

    if device_type == "tpu":
        import torch_tpu  # noqa: F401
        from torch._subclasses.fake_tensor import FakeTensorMode
        from torch_tpu import _loader

        _loader._init_device("tpu")
        with FakeTensorMode():
            t = torch.empty(4, device="tpu")
    else:
        t = torch.empty(4, device=device_type)
    out = {"device": str(t.device)}
    for cls in (ProcessGroupFuncoll, ProcessGroupBabyFuncoll):
        pg = cls()
        try:
            pg.allreduce([t], dist.AllreduceOptions())
        except ValueError as e:
            out[cls.__name__] = str(e)
        out[cls.__name__ + " child"] = getattr(pg, "_p", None) is not None
    return out
