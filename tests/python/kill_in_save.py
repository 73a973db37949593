"""Run by test_torch_kill.py under tools/torchrun.sh 2: saves step 1, then rank 1 is SIGKILLed
inside the save of step 2 (after writing its rank file, while reporting to rank 0)."""
import os
import signal
import sys
from datetime import timedelta

import torch
import torch.distributed as dist

import ckpt
import ckpt.torch

root = sys.argv[1]
dist.init_process_group("gloo", timeout=timedelta(seconds=60))
torch.manual_seed(0)
model = torch.nn.Linear(8, 4)
ddp = torch.nn.parallel.DistributedDataParallel(model)
opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
for step in (1, 2):
    ddp(torch.randn(3, 8)).sum().backward()
    opt.step()
    if step == 2 and dist.get_rank() == 1:
        def die(self, payload):
            os.kill(os.getpid(), signal.SIGKILL)
        ckpt.torch.TorchCollective.gather = die
    try:
        ckpt.torch.save(root, step, model, opt)
    except ckpt.Error as e:
        print(f"rank {dist.get_rank()}: save {step} failed: {e}", file=sys.stderr)
        sys.exit(3)
