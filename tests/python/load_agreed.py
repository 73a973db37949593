"""Run by test_torch_dist.py under tools/torchrun.sh 2: every rank of ckpt.torch.load opens the
tag rank 0 resolved, even when a newer tag is committed between rank 0's open and rank 1's (a
training job saving where an evaluation job loads). The commit is simulated: global_step2 is
rolled back (its directory moved aside), rank 0 resolves `latest` to global_step1, then moves global_step2
back into the root, which makes it the latest by the commit-point rule; only then does rank 1
call load. Each rank writes the tag and step it loaded to OUT/rank<r>.json."""
import json
import os
import subprocess
import sys
import time

import torch
import torch.distributed as dist

import ckpt
import ckpt.torch

root, out = sys.argv[1], sys.argv[2]
dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
model = torch.nn.Linear(4, 4)
opt = torch.optim.AdamW(model.parameters(), lr=1e-2)


def train_step():
    model(torch.randn(2, 4)).sum().backward()
    opt.step()
    opt.zero_grad()


for step in (1, 2):
    train_step()
    ckpt.torch.save(root, step, model, opt)
dist.barrier()
flag = os.path.join(out, "committed")
if rank == 0:
    cli = os.path.join(os.environ["CKPT_BIN_DIR"], "ckpt")
    subprocess.run([cli, "rollback", root, "--to", "global_step1"], check=True,
                   capture_output=True)
    aside = [d for d in os.listdir(root) if d.startswith(".rolled-back-")]
    assert len(aside) == 1, aside
    opened = ckpt.Reader

    def reader_then_commit(*args, **kw):
        try:
            r = opened(*args, **kw)
            assert r.tag == "global_step1", r.tag
            os.rename(os.path.join(root, aside[0]), os.path.join(root, "global_step2"))
            assert ckpt.ls(root)["latest"] == "global_step2"
            return r
        finally:
            open(flag, "w").close()  # rank 1 goes on, whatever happened here

    ckpt.Reader = reader_then_commit
else:
    deadline = time.monotonic() + 120
    while not os.path.exists(flag):
        if time.monotonic() > deadline:
            sys.exit("rank 1: rank 0 never resolved the checkpoint")
        time.sleep(0.01)
info = ckpt.torch.load(root, model, opt)
with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
    json.dump({"tag": info.tag, "step": info.step}, f)
dist.barrier()
dist.destroy_process_group()
# Without the interpreter's finalization, as examples/torch/train.py leaves (its leave(): a
# gloo thread of torch 1.13 releasing a tensor while Python finalizes can abort the rank).
sys.stdout.flush()
sys.stderr.flush()
os._exit(0)
