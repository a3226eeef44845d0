# Run `torchft_lighthouse --min_replicas 2`, then one job per replica group i = 0, 1 (a test runs it):
# TORCHFT_LIGHTHOUSE=http://HOST:29510 REPLICA_GROUP_ID=i torchrun --master-port 2950i examples/torchft_recipe.py
import os

import torch
from torchft import DistributedDataParallel, Manager, Optimizer

from funcoll.torchft import ProcessGroupFuncoll  # a fresh funcoll group per quorum

replica = int(os.environ["REPLICA_GROUP_ID"])
torch.manual_seed(0)  # the same initial weights everywhere: no sync at step 0 (init_sync=False)
model = torch.nn.Linear(4, 2)
manager = Manager(pg=ProcessGroupFuncoll(), min_replica_size=2, replica_id=f"replica_{replica}", init_sync=False,
                  load_state_dict=model.load_state_dict, state_dict=model.state_dict)
optimizer = Optimizer(manager, torch.optim.SGD(model.parameters(), lr=0.1))
model = DistributedDataParallel(manager, model)
data = torch.Generator().manual_seed(replica)  # each replica group its own batches
while manager.current_step() < 5:
    optimizer.zero_grad()
    model(torch.randn(8, 4, generator=data)).pow(2).mean().backward()  # gradients averaged across the replica groups
    optimizer.step()  # commits only when every replica group of the quorum got through the step
print(f"replica {replica} step {manager.current_step()}: {model.module.weight.tolist()} {model.module.bias.tolist()}")
manager.shutdown()
