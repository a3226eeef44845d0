# Run on 2 CPU ranks: ./dev python -m torch.distributed.run --nproc-per-node 2 examples/quickstart.py
import torch
import torch.distributed as dist

import funcoll  # registers the "funcoll" backend; overrides nothing

dist.init_process_group("funcoll")  # or "cpu:funcoll,xla:funcoll", "cpu:gloo,xpu:funcoll"
funcoll.install()  # kernels for _c10d_functional on XLA (if in use: PJRT_DEVICE, torch_xla imported) and XPU
rank = dist.get_rank()

t = torch.tensor([5, 12, 7], dtype=torch.int16) * (rank + 1)
dist.all_reduce(t, op=dist.ReduceOp.BXOR)  # gloo moves no int16: funcoll reduces it as int32 (XCCL: no BXOR either)

grad = torch.tensor([1.0, 2.0, 3.0]) * (rank + 1)
with funcoll.record() as calls:
    dist.all_reduce(grad, op=dist.ReduceOp.AVG)
if rank == 0:
    print("bxor:", t.tolist(), "avg:", grad.tolist())
    print("strategies:", calls)  # [('all_reduce', ['native'])]; under FUNCOLL_PROFILE=xccl: avg=sum+scale
    print("native on xccl:", sorted(str(op) for op in funcoll.capabilities("cpu", profile="xccl").reduce_ops))
dist.destroy_process_group()
