"""A small GPT-style byte-level model trained with torch.distributed and saved through ckpt.

    tools/torchrun.sh 2 examples/torch/train.py --zero 1 --steps 8 --save-every 4 --ckpt-dir /tmp/t
    tools/torchrun.sh 2 examples/torch/train.py --resume --ckpt-dir /tmp/t --steps 12
    tools/torchrun.sh 2 examples/torch/train.py grad --ckpt-dir /tmp/t --out /tmp/grad.safetensors

--zero 0: DistributedDataParallel + AdamW (replicated optimizer state, ZeRO-0);
--zero 1: DistributedDataParallel + ZeroRedundancyOptimizer(AdamW) (ZeRO-1).
Dropout on, AdamW with linear warmup + cosine decay, gradient clipping and accumulation. Rank 0
appends one line per optimizer step to ROOT/trainlog.jsonl (or --trainlog) with the fields of
engine_min's run log (docs/architecture.md), the contract `ckpt verify-resume --launch` checks.
Deterministic on CPU: a resumed run is bitwise equal to the straight run.
`grad` writes the gradient the next optimizer step would apply (accumulated over the global
batch, averaged over ranks, clipped) as fp32 safetensors, for `ckpt next-update --grad`.
"""

import argparse
import json
import math
import os
import sys

import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

import ckpt
import ckpt.torch

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_CORPUS = os.path.join(HERE, "..", "..", "engine_min", "data", "corpus.txt")
# Settings a resumed run takes from the checkpoint unless given again.
CONFIG_KEYS = ("zero", "d_model", "layers", "heads", "context", "dropout", "micro_batch",
               "grad_accum", "lr", "min_lr", "warmup", "weight_decay", "grad_clip", "seed",
               "corpus", "save_every", "keep_last", "schedule_steps")
DEFAULTS = dict(zero=0, d_model=32, layers=2, heads=2, context=32, dropout=0.1, micro_batch=4,
                grad_accum=2, lr=3e-3, min_lr=3e-4, warmup=4, weight_decay=0.1, grad_clip=1.0,
                seed=1234, corpus=DEFAULT_CORPUS, save_every=0, keep_last=0, schedule_steps=0)
RESETTABLE = ("moments", "step", "rng", "data", "scheduler")


class Block(nn.Module):
    def __init__(self, d, heads, dropout):
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.ln2 = nn.LayerNorm(d)
        self.fc1 = nn.Linear(d, 4 * d)
        self.fc2 = nn.Linear(4 * d, d)
        self.drop = nn.Dropout(dropout)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=2)
        shape = (b, t, self.heads, d // self.heads)
        q, k, v = (z.reshape(shape).transpose(1, 2) for z in (q, k, v))
        att = (q @ k.transpose(-2, -1)) / math.sqrt(d // self.heads)
        mask = torch.ones(t, t, dtype=torch.bool).tril()
        att = self.drop(F.softmax(att.masked_fill(~mask, float("-inf")), dim=-1))
        y = (att @ v).transpose(1, 2).reshape(b, t, d)
        x = x + self.drop(self.proj(y))
        return x + self.drop(self.fc2(F.gelu(self.fc1(self.ln2(x)))))


class TinyGPT(nn.Module):
    """Byte-level: 256 tokens, learned positions, output head tied to the embedding."""

    def __init__(self, d, layers, heads, context, dropout):
        super().__init__()
        self.tok = nn.Embedding(256, d)
        self.pos = nn.Parameter(torch.zeros(context, d))
        self.drop = nn.Dropout(dropout)
        self.blocks = nn.ModuleList(Block(d, heads, dropout) for _ in range(layers))
        self.ln = nn.LayerNorm(d)
        self.head = nn.Linear(d, 256, bias=False)
        self.head.weight = self.tok.weight
        nn.init.normal_(self.pos, std=0.02)
        nn.init.normal_(self.tok.weight, std=0.02)

    def forward(self, idx):
        x = self.drop(self.tok(idx) + self.pos[: idx.shape[1]])
        for blk in self.blocks:
            x = blk(x)
        return self.head(self.ln(x))


class Data:
    """Windows of context+1 bytes of the corpus in a per-epoch permutation; the position
    {"epoch", "index"} is global (the same on every rank), each rank reads its slice."""

    def __init__(self, path, context, seed):
        self.bytes = np.frombuffer(open(path, "rb").read(), dtype=np.uint8)
        self.context, self.seed = context, seed
        self.count = (len(self.bytes) - 1) // context
        self.epoch, self.index = 0, 0

    def order(self, epoch):
        return np.random.default_rng([self.seed, epoch]).permutation(self.count)

    def take(self, n):
        """The next n sample indices of the global stream."""
        out = []
        while len(out) < n:
            if self.index >= self.count:
                self.epoch, self.index = self.epoch + 1, 0
            k = min(n - len(out), self.count - self.index)
            out.extend(self.order(self.epoch)[self.index:self.index + k].tolist())
            self.index += k
        return out

    def batch(self, samples):
        c = self.context
        rows = np.stack([self.bytes[s * c: s * c + c + 1] for s in samples]).astype(np.int64)
        t = torch.from_numpy(rows)
        return t[:, :-1], t[:, 1:]

    def state(self):
        return {"epoch": self.epoch, "index": self.index}

    def restore(self, s):
        self.epoch, self.index = int(s["epoch"]), int(s["index"])


def parse(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("command", nargs="?", default="train", choices=["train", "grad"])
    p.add_argument("--ckpt-dir", required=True)
    p.add_argument("--steps", type=int, default=None, help="total optimizer steps")
    p.add_argument("--resume", action="store_true")
    p.add_argument("--resume-tag", default=None)
    p.add_argument("--trainlog", default=None, help="default: CKPT_DIR/trainlog.jsonl")
    p.add_argument("--no-final-save", action="store_true")
    p.add_argument("--async-save", action="store_true",
                   help="persist checkpoints in the background (ckpt.torch.save(async_=True))")
    p.add_argument("--reset-on-resume", default="", help="comma list of " + ",".join(RESETTABLE))
    p.add_argument("--out", default=None, help="grad: the safetensors file to write")
    for k in CONFIG_KEYS:
        p.add_argument("--" + k.replace("_", "-"), type=type(DEFAULTS[k]), default=None)
    return p.parse_args(argv)


def init_distributed():
    """RANK/WORLD_SIZE/MASTER_* from tools/torchrun.sh (or torch.distributed.run); mpirun's
    OMPI_COMM_WORLD_* when those are missing; a single process otherwise."""
    env = os.environ
    if "RANK" not in env and "OMPI_COMM_WORLD_RANK" in env:
        env["RANK"] = env["OMPI_COMM_WORLD_RANK"]
        env["WORLD_SIZE"] = env["OMPI_COMM_WORLD_SIZE"]
    env.setdefault("RANK", "0")
    env.setdefault("WORLD_SIZE", "1")
    env.setdefault("MASTER_ADDR", "127.0.0.1")
    env.setdefault("MASTER_PORT", "29511")
    dist.init_process_group("gloo")
    return dist.get_rank(), dist.get_world_size()


def resolve_config(args):
    cfg = dict(DEFAULTS)
    if args.resume or args.command == "grad":
        info = ckpt.inspect(args.ckpt_dir, args.resume_tag or "")
        cfg.update(info["client_state"].get("train_config", {}))
    for k in CONFIG_KEYS:
        v = getattr(args, k)
        if v is not None:
            cfg[k] = v
    return cfg


def build(cfg, world):
    torch.manual_seed(cfg["seed"])
    model = TinyGPT(cfg["d_model"], cfg["layers"], cfg["heads"], cfg["context"], cfg["dropout"])
    ddp = nn.parallel.DistributedDataParallel(model)
    decay = dict(lr=cfg["lr"], betas=(0.9, 0.95), eps=1e-8, weight_decay=cfg["weight_decay"])
    if cfg["zero"] == 1:
        from torch.distributed.optim import ZeroRedundancyOptimizer
        opt = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.AdamW,
                                      **decay)
    else:
        opt = torch.optim.AdamW(model.parameters(), **decay)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, schedule(cfg))
    return model, ddp, opt, sched


def schedule(cfg):
    warm, total, floor = cfg["warmup"], cfg["schedule_steps"], cfg["min_lr"] / cfg["lr"]

    def factor(step):  # step: updates already applied
        if step < warm:
            return (step + 1) / warm
        frac = min(1.0, (step - warm) / max(1, total - warm))
        return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * frac))
    return factor


def forward_backward(cfg, model, ddp, data, rank, world):
    """One global batch: accumulated, averaged over ranks (DDP), clipped. (loss, grad_norm)."""
    accum, mb = cfg["grad_accum"], cfg["micro_batch"]
    samples = data.take(mb * accum * world)
    loss_sum = torch.zeros(())
    for a in range(accum):
        mine = samples[(a * world + rank) * mb:(a * world + rank + 1) * mb]
        x, y = data.batch(mine)
        sync = a == accum - 1
        ctx = ddp.no_sync() if not sync else _null()
        with ctx:
            loss = F.cross_entropy(ddp(x).reshape(-1, 256), y.reshape(-1))
            (loss / accum).backward()
        loss_sum += loss.detach()
    dist.all_reduce(loss_sum)
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), cfg["grad_clip"])
    return float(loss_sum) / (accum * world), float(grad_norm)


class _null:
    def __enter__(self):
        return self

    def __exit__(self, *a):
        return False


def digests(model, opt, zero):
    """XXH3 of the concatenated fp32 weights / exp_avg / exp_avg_sq of the trainable parameters
    in table order (docs/architecture.md), on rank 0."""
    local = opt.optim if zero else opt
    owner = ckpt.torch.owner_ranks(opt) if zero else {}
    hs = [ckpt.Xxh3(), ckpt.Xxh3(), ckpt.Xxh3()]
    for _, p in ckpt.torch.trainable_parameters(model):
        st = local.state.get(p, {})
        m = st.get("exp_avg", torch.zeros_like(p)).detach().clone()
        v = st.get("exp_avg_sq", torch.zeros_like(p)).detach().clone()
        if zero:
            dist.broadcast(m, src=owner[id(p)])
            dist.broadcast(v, src=owner[id(p)])
        for h, t in zip(hs, (p.detach(), m, v)):
            h.update(t.contiguous())
    return [h.hexdigest() for h in hs]


def reset_components(which, cfg, model, opt, sched, data, state):
    local = opt.optim if cfg["zero"] == 1 else opt
    if "moments" in which:
        for st in local.state.values():
            st["exp_avg"].zero_()
            st["exp_avg_sq"].zero_()
    if "step" in which:
        state["step"] = 0
        for st in local.state.values():
            st["step"] = torch.tensor(0.0)
    if "data" in which:
        data.restore({"epoch": 0, "index": 0})
    if "rng" in which:
        torch.manual_seed(cfg["seed"] * 1000 + dist.get_rank() + 1)
    if "scheduler" in which:
        for g in opt.param_groups:
            g["lr"] = g["initial_lr"]
        sched.__init__(opt, schedule(cfg), last_epoch=-1)


def main(argv):
    args = parse(argv)
    torch.set_num_threads(1)  # deterministic and polite on small machines
    rank, world = init_distributed()
    cfg = resolve_config(args)
    # --steps says where this run stops; the cosine's horizon is fixed by the first run (or
    # --schedule-steps), so a resumed run follows the same learning-rate curve.
    cfg["total_steps"] = args.steps if args.steps is not None else cfg.get("total_steps", 10)
    if cfg["schedule_steps"] <= 0:
        cfg["schedule_steps"] = cfg["total_steps"]
    model, ddp, opt, sched = build(cfg, world)
    data = Data(cfg["corpus"], cfg["context"], cfg["seed"])
    state = {"step": 0}
    if args.resume or args.command == "grad":
        info = ckpt.torch.load(args.ckpt_dir, model, opt, tag=args.resume_tag, scheduler=sched)
        state["step"] = info.step
        data.restore(info.data_state)
        which = [c for c in args.reset_on_resume.split(",") if c]
        bad = [c for c in which if c not in RESETTABLE]
        if bad:
            raise SystemExit(f"--reset-on-resume: unknown component {bad[0]}")
        reset_components(which, cfg, model, opt, sched, data, state)
        if "step" in which:
            # Steps restart at 0: periodic saves would land on the tags of the real trajectory.
            cfg["save_every"] = 0
    else:
        torch.manual_seed(cfg["seed"] * 1000 + rank + 1)  # dropout differs per rank
    if args.command == "grad":
        if not args.out:
            raise SystemExit("grad: --out GRADS.safetensors is required")
        forward_backward(cfg, model, ddp, data, rank, world)
        if rank == 0:
            ckpt.write_safetensors(args.out, [(n, p.grad.detach().contiguous())
                                              for n, p in ckpt.torch.trainable_parameters(model)])
        dist.barrier()
        return 0
    log_path = args.trainlog or os.path.join(args.ckpt_dir, "trainlog.jsonl")
    if rank == 0:
        os.makedirs(args.ckpt_dir, exist_ok=True)
    cfg_saved = {k: cfg[k] for k in CONFIG_KEYS + ("total_steps",)}
    tokens = cfg["micro_batch"] * cfg["grad_accum"] * world * cfg["context"]
    ran = False

    pending = []

    def save():
        p = ckpt.torch.save(args.ckpt_dir, state["step"], model, opt, scheduler=sched,
                            data_state=data.state(), client_state={"train_config": cfg_saved},
                            keep_last=cfg["keep_last"], async_=args.async_save)
        if args.async_save:
            pending[:] = [p]

    while state["step"] < cfg["total_steps"]:
        opt.zero_grad(set_to_none=True)
        loss, grad_norm = forward_backward(cfg, model, ddp, data, rank, world)
        lr = opt.param_groups[0]["lr"]
        opt.step()
        sched.step()
        state["step"] += 1
        ran = True
        w, m, v = digests(model, opt, cfg["zero"] == 1)
        if rank == 0:
            with open(log_path, "a") as f:
                f.write(json.dumps({"step": state["step"], "loss": loss, "grad_norm": grad_norm,
                                    "lr": lr, "tokens": tokens, "weights_xxh3": w,
                                    "exp_avg_xxh3": m, "exp_avg_sq_xxh3": v}) + "\n")
        if cfg["save_every"] > 0 and state["step"] % cfg["save_every"] == 0:
            save()
    final_saved = cfg["save_every"] > 0 and state["step"] % cfg["save_every"] == 0
    if ran and not args.no_final_save and not final_saved:
        save()
    for p in pending:
        p.wait()  # the background save commits before the process group goes away
    dist.barrier()
    dist.destroy_process_group()
    return 0


def leave(code):
    """Ends the process without the interpreter's finalization. Under torch 1.13 and Python 3.11
    a gloo worker thread can still be releasing a finished collective's tensors, one of which
    owns a Python object, while the interpreter finalizes; taking the GIL then ends that thread
    with pthread_exit inside a noexcept destructor and the rank aborts (status 134) after a run
    that succeeded. Called once main() returned: the run log is closed and every save (background
    ones included) has committed. A failure leaves through sys.exit, where ckpt.torch's exit
    handler still finishes a background save in flight."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    try:
        code = main(sys.argv[1:])
    except ckpt.Error as e:
        print(f"train.py: {e}", file=sys.stderr)
        sys.exit(1 if isinstance(e, ckpt.CorruptionError) else 2)
    leave(code)
