#!/usr/bin/python3
"""Writes a checkpoint with the structure DeepSpeed 0.19 saves, without DeepSpeed.

    make_ds_checkpoint.py OUT_ROOT --zero {1,2,3} --world {1,2,3} --dtype {fp32,bf16}
        [--tag global_step7] [--hidden 24] [--vocab 37] [--optimizer bf16]
        [--truth TRUTH.pt] [--hostile KIND]

OUT_ROOT gets `latest` and OUT_ROOT/<tag>/ with exactly the files, keys, nesting and flat
partition layout of deepspeed/runtime/engine.py (_save_checkpoint, _save_zero_checkpoint) and
deepspeed/runtime/zero/stage_1_and_2.py / stage3.py / bf16_optimizer.py (state_dict);
docs/deepspeed.md lists the source lines each structure follows. Classes DeepSpeed pickles
(LossScaler, ZeroStageEnum, fragment_address) are stand-ins registered under DeepSpeed's module
paths so the pickle names them exactly as DeepSpeed's own would.

--truth writes what a DeepSpeed user would get back (torch's own recomputation): the fp32
weights zero_to_fp32 reconstructs (concatenate the flat partitions, strip padding, split by
param_shapes; frozen, buffers and tied names added), the per-parameter exp_avg / exp_avg_sq, the
AdamW hyper-parameters and step. Tests compare ckpt's output with it.

--hostile writes a damaged variant for the refusal tests (see HOSTILE below).
"""
import argparse
import collections
import dataclasses
import enum
import io
import math
import os
import pickletools
import struct
import sys
import types
import zipfile

import torch


# ---- stand-ins for the classes DeepSpeed pickles, under their DeepSpeed module paths -------

def _module(name):
    if name in sys.modules:
        return sys.modules[name]
    mod = types.ModuleType(name)
    sys.modules[name] = mod
    parent, _, child = name.rpartition(".")
    if parent:
        setattr(_module(parent), child, mod)
    return mod


class LossScaler:
    """deepspeed/runtime/fp16/loss_scaler.py LossScaler (static scale, used for fp32/bf16)."""

    def __init__(self, scale=1.0):
        self.cur_scale = scale
        self.dynamic = False


class ZeroStageEnum(int, enum.Enum):
    """deepspeed/runtime/zero/config.py ZeroStageEnum."""
    disabled = 0
    optimizer_states = 1
    gradients = 2
    weights = 3
    max_stage = 3


@dataclasses.dataclass
class fragment_address:  # noqa: N801 (DeepSpeed's name)
    """deepspeed/utils/tensor_fragment.py fragment_address."""
    numel: int
    start: int


for _cls, _mod in ((LossScaler, "deepspeed.runtime.fp16.loss_scaler"),
                   (ZeroStageEnum, "deepspeed.runtime.zero.config"),
                   (fragment_address, "deepspeed.utils.tensor_fragment")):
    _cls.__module__ = _mod
    setattr(_module(_mod), _cls.__name__, _cls)


# ---- the model ------------------------------------------------------------------------------

def model_spec(hidden, vocab, blocks=0, block_width=512, frozen_blocks=0):
    """(name, shape, kind) in named_parameters order; kind: trainable | frozen | tied:<owner>.
    Two optimizer groups: weights (group 0) and biases / norms (group 1). `blocks` adds that
    many [block_width, block_width] trainable weights (large fixtures for memory and speed),
    `frozen_blocks` that many frozen ones (a LoRA fine-tune's frozen base)."""
    h = hidden
    big = [(f"blocks.{k}.weight", (block_width, block_width), "trainable") for k in range(blocks)]
    big += [(f"base.{k}.weight", (block_width, block_width), "frozen")
            for k in range(frozen_blocks)]
    return big + [
        ("embed.weight", (vocab, h), "trainable"),
        ("layers.0.weight", (h, h), "trainable"),
        ("layers.0.bias", (h,), "trainable"),
        ("frozen_proj.weight", (h, 5), "frozen"),
        ("layers.1.weight", (2 * h + 1, h), "trainable"),
        ("layers.1.bias", (2 * h + 1,), "trainable"),
        ("frozen_proj.bias", (5,), "frozen"),
        ("norm.weight", (h,), "trainable"),
        ("lm_head.weight", (vocab, h), "tied:embed.weight"),
    ]


def group_of(name):
    return 1 if name.endswith("bias") or name.startswith("norm.") else 0


def numel(shape):
    return math.prod(shape)


def build(args):
    g = torch.Generator().manual_seed(args.seed)
    spec = model_spec(args.hidden, args.vocab, args.blocks, args.block_width, args.frozen_blocks)
    model_dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float32
    master, exp_avg, exp_avg_sq = {}, {}, {}
    frozen = {}
    for name, shape, kind in spec:
        if kind == "trainable":
            master[name] = torch.randn(shape, generator=g)
            exp_avg[name] = torch.randn(shape, generator=g) * 1e-2
            exp_avg_sq[name] = torch.rand(shape, generator=g) * 1e-4
        elif kind == "frozen":
            frozen[name] = torch.randn(shape, generator=g).to(model_dtype)
    buffers = {"norm.running_mean": torch.randn(args.hidden, generator=g)}
    return spec, model_dtype, master, exp_avg, exp_avg_sq, frozen, buffers


# ---- the save ---------------------------------------------------------------------------------

def hyper(group):
    # torch.optim.AdamW param_groups entry as torch 1.13/2.x writes it (params replaced by ids).
    return {"lr": 3e-4, "betas": (0.9, 0.95), "eps": 1e-8, "weight_decay": 0.1,
            "amsgrad": False, "maximize": False, "foreach": None, "capturable": False,
            "differentiable": False, "fused": None, "params": [group]}


def ds_config(args):
    cfg = {"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1,
           "optimizer": {"type": "AdamW", "params": {"lr": 3e-4, "betas": [0.9, 0.95],
                                                      "eps": 1e-8, "weight_decay": 0.1}},
           "scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": 10}},
           "zero_optimization": {"stage": args.zero}}
    if args.dtype == "bf16":
        cfg["bf16"] = {"enabled": True}
    if args.optimizer == "bf16":
        cfg["data_types"] = {"grad_accum_dtype": "fp32"}
    return cfg


def save(obj, path):
    torch.save(obj, path)  # protocol 2, zip archive: what DeepSpeed's TorchCheckpointEngine does


def write(args):
    spec, model_dtype, master, exp_avg, exp_avg_sq, frozen, buffers = build(args)
    W, Z = args.world, args.zero
    tag_dir = os.path.join(args.out, args.tag)
    os.makedirs(tag_dir, exist_ok=True)
    trainable = [n for n, _, k in spec if k == "trainable"]
    groups = [[n for n in trainable if group_of(n) == gi] for gi in (0, 1)]
    shapes = {n: s for n, s, _ in spec}
    step = args.steps
    cfg = ds_config(args)
    bf16_optimizer = args.optimizer == "bf16"  # BF16_Optimizer: ZeRO-1 with fp32 grad accumulation
    prefix = "bf16_" if args.dtype == "bf16" else ""

    # Per-rank optimizer state.
    optim = [dict() for _ in range(W)]
    if Z in (1, 2):
        paddings = [[] for _ in range(W)]
        parts = [[] for _ in range(W)]
        states = [dict() for _ in range(W)]
        mappings = [[] for _ in range(W)]
        for gi, names in enumerate(groups):
            flat_w = torch.cat([master[n].reshape(-1) for n in names])
            flat_m = torch.cat([exp_avg[n].reshape(-1) for n in names])
            flat_v = torch.cat([exp_avg_sq[n].reshape(-1) for n in names])
            orig = flat_w.numel()
            align = 2 * W  # nccl_start_alignment_factor * dp world size
            aligned = int(math.ceil(orig / align)) * align
            P = aligned // W
            pad = lambda t: torch.cat([t, torch.zeros(aligned - orig)])
            flat_w, flat_m, flat_v = pad(flat_w), pad(flat_m), pad(flat_v)
            for r in range(W):
                left = r * P
                if orig <= left:
                    padding = P
                elif orig < left + P:
                    padding = left + P - orig
                else:
                    padding = 0
                paddings[r].append(padding)
                part = flat_w[left:left + P].clone()  # its own storage of P elements
                # stage_1_and_2 saves part[:P - padding] (a view: the storage keeps the padding);
                # BF16_Optimizer saves the padded partition itself.
                parts[r].append(part if bf16_optimizer else part[:P - padding])
                states[r][gi] = {"step": torch.tensor(float(step)),
                                 "exp_avg": flat_m[left:left + P].clone(),
                                 "exp_avg_sq": flat_v[left:left + P].clone()}
                mp = collections.OrderedDict()
                off = 0
                for n in names:
                    k = numel(shapes[n])
                    lo, hi = max(off, left), min(off + k, left + P)
                    if lo < hi:
                        mp[n] = fragment_address(numel=hi - lo, start=lo - left)
                    off += k
                mappings[r].append(mp)
        for r in range(W):
            base = {"state": states[r], "param_groups": [hyper(0), hyper(1)]}
            if bf16_optimizer:
                sd = {"clip_grad": 1.0, "base_optimizer_state": base,
                      "single_partition_of_fp32_groups": parts[r], "group_paddings": paddings[r],
                      "partition_count": [W, W], "ds_version": "0.19.6",
                      "param_slice_mappings": mappings[r]}
            else:
                sd = {"loss_scaler": LossScaler(1.0), "dynamic_loss_scale": False,
                      "overflow": False, "clip_grad": 1.0, "base_optimizer_state": base,
                      "single_partition_of_fp32_groups": parts[r],
                      "zero_stage": ZeroStageEnum.gradients if Z == 2 else
                      ZeroStageEnum.optimizer_states,
                      "group_paddings": paddings[r], "partition_count": [W, W],
                      "ds_version": "0.19.6", "param_slice_mappings": mappings[r]}
            optim[r] = sd
    else:
        flats = [[] for _ in range(W)]
        states = [dict() for _ in range(W)]
        for gi, names in enumerate(groups):
            per_rank = {k: [[] for _ in range(W)] for k in ("w", "m", "v")}
            for n in names:
                k = numel(shapes[n])
                ps = int(math.ceil(k / W))
                for key, src in (("w", master), ("m", exp_avg), ("v", exp_avg_sq)):
                    padded = torch.cat([src[n].reshape(-1), torch.zeros(ps * W - k)])
                    for r in range(W):
                        per_rank[key][r].append(padded[r * ps:(r + 1) * ps])
            for r in range(W):
                flats[r].append(torch.cat(per_rank["w"][r]))
                states[r][gi] = {"step": torch.tensor(float(step)),
                                 "exp_avg": torch.cat(per_rank["m"][r]),
                                 "exp_avg_sq": torch.cat(per_rank["v"][r])}
        for r in range(W):
            optim[r] = {"zero_stage": ZeroStageEnum.weights, "loss_scaler": LossScaler(1.0),
                        "dynamic_loss_scale": False, "overflow": False, "partition_count": W,
                        "optimizer_state_dict": {"state": states[r],
                                                 "param_groups": [hyper(0), hyper(1)]},
                        "fp32_flat_groups": flats[r]}

    # Model states.
    module = collections.OrderedDict()
    for name, shape, kind in spec:
        if kind == "trainable":
            t = master[name].to(model_dtype) if Z < 3 else torch.empty(0, dtype=model_dtype)
            module[name] = t
        elif kind == "frozen":
            module[name] = frozen[name] if Z < 3 else torch.empty(0, dtype=model_dtype)
        else:
            module[name] = module[kind.split(":", 1)[1]]  # same tensor: one storage in the file
        if name == "norm.weight":
            module["norm.running_mean"] = buffers["norm.running_mean"]
    frozen_names = [n for n, _, k in spec if k == "frozen"]
    save_frozen = Z >= 2
    param_shapes = [collections.OrderedDict((n, torch.Size(shapes[n])) for n in names)
                    for names in groups]
    shared = {n: k.split(":", 1)[1] for n, _, k in spec if k.startswith("tied:")}
    sched = {"warmup_min_lr": 0.0, "warmup_max_lr": 3e-4, "warmup_num_steps": 10,
             "warmup_type": "log", "inverse_log_warm_up": 0.4, "last_batch_iteration": step - 1}
    client = {"epoch": 1, "args": argparse.Namespace(seed=args.seed, note="client state")}

    def model_state(rank):
        frags = None
        if save_frozen:
            frags = collections.OrderedDict()
            for n in frozen_names:
                t = frozen[n].reshape(-1)
                if Z == 3:  # param.ds_tensor: this rank's padded share
                    ps = int(math.ceil(t.numel() / W))
                    t = torch.cat([t, torch.zeros(ps * W - t.numel(), dtype=t.dtype)])
                    t = t[rank * ps:(rank + 1) * ps].clone()
                else:
                    t = frozen[n]
                frags[n] = t
        state = dict(module=module,
                     buffer_names=["norm.running_mean"],
                     optimizer=None,
                     param_shapes=param_shapes,
                     frozen_param_shapes=collections.OrderedDict(
                         (n, torch.Size(shapes[n])) for n in frozen_names) if save_frozen else None,
                     shared_params=shared,
                     frozen_param_fragments=frags,
                     lr_scheduler=sched,
                     data_sampler=None,
                     random_ltd=None,
                     sparse_tensor_module_names=set(),
                     skipped_steps=0,
                     global_steps=step,
                     global_samples=step * 2 * W,
                     dp_world_size=W,
                     mp_world_size=1,
                     checkpoint_parallel_dimensions={"pp_degree": 1, "tp_degree": 1},
                     ds_config=cfg,
                     ds_version="0.19.6")
        state.update(client)
        return state

    if Z == 3:
        for r in range(W):
            save(model_state(r), os.path.join(tag_dir, f"zero_pp_rank_{r}_mp_rank_00_model_states.pt"))
    else:
        save(model_state(0), os.path.join(tag_dir, "mp_rank_00_model_states.pt"))
    for r in range(W):
        save({"optimizer_state_dict": optim[r], "ds_config": cfg, "ds_version": "0.19.6"},
             os.path.join(tag_dir, f"{prefix}zero_pp_rank_{r}_mp_rank_00_optim_states.pt"))
    with open(os.path.join(args.out, "latest"), "w") as f:
        f.write(args.tag)

    if args.truth:
        weights = collections.OrderedDict()
        weights.update({k: v.float() for k, v in buffers.items()})
        for n in frozen_names:
            weights[n] = frozen[n]
        for n in trainable:
            weights[n] = master[n]
        for alias, owner in shared.items():
            weights[alias] = weights[owner]
        torch.save({"weights": weights, "exp_avg": exp_avg, "exp_avg_sq": exp_avg_sq,
                    "lr": 3e-4, "betas": (0.9, 0.95), "eps": 1e-8, "weight_decay": 0.1,
                    "step": step, "frozen": frozen_names, "tied": shared,
                    "buffers": list(buffers)}, args.truth)


# ---- hostile variants -------------------------------------------------------------------------

class _Evil:
    def __init__(self, fn, arg):
        self.fn, self.arg = fn, arg

    def __reduce__(self):
        return (self.fn, (self.arg,))


def hostile(args):
    """Damages the checkpoint written by write(): KIND is
    truncate      the first optimizer file cut in half (a truncated zip)
    os_system     rank 0's optimizer file's pickle calls os.system (never run by ckpt)
    eval          the model file's pickle calls builtins.eval
    short_storage a tensor whose view needs more elements than its storage holds
    partitions    rank 0's partition_count disagrees with the number of rank files
    missing_rank  the last rank's optimizer file deleted
    missing_model the model-states file deleted (ZeRO-3: rank 0's), optimizer files intact
    bad_name      the first parameter's name (param_shapes and module) holds a lone surrogate
                  (invalid UTF-8 once pickled) and a terminal escape sequence
    pickle_crc    one letter of a name inside the model file's data.pkl changed in place: still
                  a valid pickle, but the record no longer matches its CRC-32
    bad_version   ds_version (rank 0's optimizer file) holds a terminal escape and a lone
                  surrogate (accepted: reported escaped)
    repeat_view   (ZeRO >= 2) a frozen parameter of 2**34 elements whose fragment is one
                  stored element expanded (stride 0): 2 bytes in the file claiming 32 GiB
    deflate_claim (ZeRO >= 2) the model file's records deflated, a frozen fragment's storage
                  claiming 2**30 elements (pickle and zip headers agree) where its deflated
                  bytes hold 4099: a claim no deflate stream of that size can meet
    huge_padding  (ZeRO 1/2) every rank's group_paddings claims 2**40 elements for group 0, so
                  the partitions still agree in length: padding no byte backs (DeepSpeed pads
                  only the last rank, by less than a partition)"""
    tag_dir = os.path.join(args.out, args.tag)
    prefix = "bf16_" if args.dtype == "bf16" else ""
    optim0 = os.path.join(tag_dir, f"{prefix}zero_pp_rank_0_mp_rank_00_optim_states.pt")
    model = os.path.join(tag_dir, "mp_rank_00_model_states.pt" if args.zero < 3 else
                         "zero_pp_rank_0_mp_rank_00_model_states.pt")
    kind = args.hostile
    if kind == "truncate":
        size = os.path.getsize(optim0)
        with open(optim0, "r+b") as f:
            f.truncate(size // 2)
    elif kind in ("os_system", "eval"):
        marker = os.path.join(args.out, "PWNED")
        evil = (_Evil(os.system, f"touch {marker}") if kind == "os_system"
                else _Evil(eval, f"open({marker!r}, 'w').write('x')"))
        target = optim0 if kind == "os_system" else model
        sd = torch.load(target)
        sd["evil"] = evil
        save(sd, target)
    elif kind == "short_storage":
        rewrite_pickle(optim0, shrink_first_storage)
    elif kind == "partitions":
        sd = torch.load(optim0)
        osd = sd["optimizer_state_dict"]
        osd["partition_count"] = ([args.world + 1] * 2 if isinstance(osd["partition_count"], list)
                                  else args.world + 1)
        save(sd, optim0)
    elif kind == "bad_name":
        sd = torch.load(model)
        first = next(iter(sd["param_shapes"][0]))
        bad = first + "\ud800\x1b[31m"

        def renamed(d):
            return collections.OrderedDict((bad if k == first else k, v) for k, v in d.items())
        sd["param_shapes"] = [renamed(g) for g in sd["param_shapes"]]
        sd["module"] = renamed(sd["module"])
        save(sd, model)
    elif kind == "pickle_crc":
        with zipfile.ZipFile(model) as z:
            info = next(i for i in z.infolist() if i.filename.endswith("/data.pkl"))
        with open(model, "r+b") as f:
            f.seek(info.header_offset)
            name_len, extra_len = struct.unpack("<HH", f.read(30)[26:30])
            start = info.header_offset + 30 + name_len + extra_len
            f.seek(start)
            data = bytearray(f.read(info.file_size))
            at = data.find(b"embed.weight")
            data[at] = ord("E")
            f.seek(start)
            f.write(data)
    elif kind == "missing_rank":
        os.unlink(os.path.join(tag_dir, f"{prefix}zero_pp_rank_{args.world - 1}"
                                        "_mp_rank_00_optim_states.pt"))
    elif kind == "missing_model":
        os.unlink(model)
    elif kind == "bad_version":
        sd = torch.load(optim0)
        sd["ds_version"] = "0.19\x1b[31mRED\ud800"
        save(sd, optim0)
    elif kind == "repeat_view":
        sd = torch.load(model)
        name = next(iter(sd["frozen_param_shapes"]))
        n = 2 ** 34
        sd["frozen_param_shapes"][name] = torch.Size([n])
        dt = sd["frozen_param_fragments"][name].dtype
        sd["frozen_param_fragments"][name] = torch.zeros(1, dtype=dt).expand(n)
        save(sd, model)
    elif kind == "deflate_claim":
        sd = torch.load(model)
        name = next(iter(sd["frozen_param_shapes"]))
        small, claim = 4099, 2 ** 30  # 4099: an int no other field of the fixture holds
        sd["frozen_param_shapes"][name] = torch.Size([small])
        dt = sd["frozen_param_fragments"][name].dtype
        sd["frozen_param_fragments"][name] = torch.zeros(small, dtype=dt)
        save(sd, model)
        claim_size(model, small, claim, torch.tensor([], dtype=dt).element_size())
    elif kind == "huge_padding":
        for r in range(args.world):
            path = os.path.join(tag_dir, f"{prefix}zero_pp_rank_{r}_mp_rank_00_optim_states.pt")
            sd = torch.load(path)
            sd["optimizer_state_dict"]["group_paddings"][0] = 2 ** 40
            save(sd, path)
    else:
        raise SystemExit(f"unknown --hostile {kind}")


def shrink_first_storage(data):
    """Rewrites the element count in the first multi-element storage's persistent id
    ('storage', type, key, location, numel) to 1, so its tensor's view no longer fits."""
    ops = list(pickletools.genops(data))
    for k, (op, arg, pos) in enumerate(ops):
        if op.name != "BINPERSID":
            continue
        j = k - 1
        while ops[j][0].name in ("BINPUT", "LONG_BINPUT", "MEMOIZE"):
            j -= 1
        numel_op, numel, at = ops[j - 1]  # the op before TUPLE
        if numel_op.name in ("BININT1", "BININT2", "BININT") and numel > 1:
            end = ops[j][2]  # the TUPLE opcode
            return data[:at] + b"K\x01" + data[end:]
    raise SystemExit("no multi-element storage to shrink")


def claim_size(path, small, claim, itemsize):
    """Rewrites the .pt file at `path` with every record deflated, every `small` in data.pkl
    (a storage's element count and the shapes that use it) made `claim`, and the zip headers
    (local and central) of the storage record that held `small` elements claiming
    `claim` * itemsize bytes: the headers and the pickle agree, the deflated bytes do not."""
    def grow(data):
        ops = list(pickletools.genops(data))
        ends = [pos for _, _, pos in ops[1:]] + [len(data)]
        out = bytearray()
        for (op, arg, pos), end in zip(ops, ends):
            if op.name in ("BININT1", "BININT2", "BININT") and arg == small:
                out += b"J" + struct.pack("<i", claim)  # BININT
            else:
                out += data[pos:end]
        return bytes(out)

    with zipfile.ZipFile(path) as z:
        entries = [(i, z.read(i)) for i in z.infolist()]
    target = [i.filename for i, d in entries if len(d) == small * itemsize]
    assert len(target) == 1, target
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        for info, data in entries:
            if info.filename.endswith("/data.pkl"):
                data = grow(data)
            z.writestr(info.filename, data)
    with zipfile.ZipFile(path) as z:
        local = z.getinfo(target[0]).header_offset
    raw = bytearray(open(path, "rb").read())
    raw[local + 22:local + 26] = struct.pack("<I", claim * itemsize)
    central = raw.find(b"PK\x01\x02")  # the central directory's first entry
    name = target[0].encode()
    while central >= 0:
        n = struct.unpack("<H", raw[central + 28:central + 30])[0]
        if raw[central + 46:central + 46 + n] == name:
            raw[central + 24:central + 28] = struct.pack("<I", claim * itemsize)
            break
        central = raw.find(b"PK\x01\x02", central + 46)
    assert central >= 0
    open(path, "wb").write(raw)


def rewrite_pickle(path, edit):
    with zipfile.ZipFile(path) as z:
        entries = [(i, z.read(i)) for i in z.infolist()]
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as z:
        for info, data in entries:
            if info.filename.endswith("/data.pkl"):
                data = edit(data)
            z.writestr(info, data)


def main():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("out")
    p.add_argument("--zero", type=int, choices=(1, 2, 3), required=True)
    p.add_argument("--world", type=int, choices=(1, 2, 3), required=True)
    p.add_argument("--dtype", choices=("fp32", "bf16"), required=True)
    p.add_argument("--optimizer", choices=("zero", "bf16"), default="zero",
                   help="bf16: BF16_Optimizer (ZeRO-1, bf16, fp32 gradient accumulation)")
    p.add_argument("--tag", default="global_step7")
    p.add_argument("--steps", type=int, default=7)
    p.add_argument("--hidden", type=int, default=24)
    p.add_argument("--vocab", type=int, default=37)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--blocks", type=int, default=0,
                   help="extra [W, W] trainable weights (W = --block-width) for large fixtures")
    p.add_argument("--frozen-blocks", type=int, default=0,
                   help="extra [W, W] frozen weights (a LoRA fine-tune's frozen base)")
    p.add_argument("--block-width", type=int, default=512)
    p.add_argument("--truth")
    p.add_argument("--hostile")
    args = p.parse_args()
    if args.optimizer == "bf16" and (args.zero != 1 or args.dtype != "bf16"):
        raise SystemExit("--optimizer bf16 is DeepSpeed's BF16_Optimizer: ZeRO-1 with bf16 only")
    write(args)
    if args.hostile:
        hostile(args)


if __name__ == "__main__":
    main()
