"""ckpt.torch: save and resume a torch.distributed run through ckpt (docs/python.md).

    ckpt.torch.save(root, step, model, optimizer, scheduler=..., data_state=..., client_state=...)
    pending = ckpt.torch.save(..., async_=True)  # persists in the background; pending.wait()
    info = ckpt.torch.load(root, model, optimizer, scheduler=...)   # info.step, info.data_state

Both are called on every rank of the default process group (or without one: a single process).
Supported optimizers:
  * torch.optim.AdamW / Adam, the model wrapped in DistributedDataParallel (or not): the state
    is replicated, so rank 0 saves all of it and the other ranks none ("replicated", ZeRO-0);
  * torch.distributed.optim.ZeroRedundancyOptimizer over AdamW / Adam (ZeRO-1): each rank saves
    the parameters it owns, recorded in the partition map ("param_owner").
fp32 master weights and both moments go into the standard datasets, so every `ckpt` command
(check, export-fp32, reshard, next-update, diff) works on these checkpoints. Per rank: the RNG
states (torch CPU, CUDA when initialised, numpy, python `random`) and the data position; on
every rank the scheduler state; client_state in the manifest.
"""

import atexit
import json
import math
import random
import sys
import zlib

import numpy as np
import torch
import torch.distributed as dist

import ckpt

__all__ = ["save", "load", "load_export", "LoadInfo", "TorchCollective", "AsyncSave", "param_table",
           "trainable_parameters", "owner_ranks"]

_RNG_TORCH = "rng/torch_cpu"
_RNG_NUMPY = "rng/numpy"
_RNG_PYTHON = "rng/python"
_RNG_CUDA = "rng/cuda_"
_OPT_STEPS = "torch/optimizer_steps"
_PARAM_GROUPS = "torch/param_groups"
_HYPER_KEYS = ("lr", "betas", "eps", "weight_decay", "initial_lr", "amsgrad", "maximize")


class TorchCollective:
    """ckpt's collective over torch.distributed: object collectives on a gloo group (the default
    group when it is gloo; a new gloo group over the same ranks otherwise, e.g. under NCCL)."""

    def __init__(self, group=None):
        if group is None and dist.get_backend() != "gloo":
            group = dist.new_group(backend="gloo")
        self.group = group

    def rank(self):
        return dist.get_rank(self.group)

    def world_size(self):
        return dist.get_world_size(self.group)

    def barrier(self):
        dist.barrier(group=self.group)

    def gather(self, payload):
        out = [None] * self.world_size() if self.rank() == 0 else None
        dist.gather_object(payload, out, dst=0, group=self.group)
        return out if out is not None else []

    def broadcast(self, payload):
        box = [payload]
        dist.broadcast_object_list(box, src=0, group=self.group)
        return box[0]


_COLLECTIVES = {}


def _collective(group):
    """One TorchCollective per process group (creating a gloo group is itself collective)."""
    if group not in _COLLECTIVES:
        _COLLECTIVES[group] = TorchCollective(group)
    return _COLLECTIVES[group]


class AsyncSave:
    """What save(..., async_=True) returns: ``tag``, persisting in the background. wait() blocks
    until it is committed and returns the tag, or raises ckpt.Error (on every rank) when the
    background save failed; done() tells without blocking. The next save waits for this one
    first and raises its error instead, if wait() did not."""

    def __init__(self, tag, saver):
        self.tag, self._saver = tag, saver

    def wait(self):
        self._saver.wait()
        return self.tag

    def done(self):
        return self._saver.done()


_ASYNC = {}


def _async_saver(group, world):
    """One ckpt.AsyncSaver per process group, committing over a gloo group of its own (the
    background thread's collectives must not interleave with the training's)."""
    if group not in _ASYNC:
        collective = TorchCollective(dist.new_group(backend="gloo")) if world > 1 else None
        _ASYNC[group] = (ckpt.AsyncSaver(), collective)
    return _ASYNC[group]


@atexit.register
def _finish_async_saves():
    # A save still in flight at exit is finished (never left half done); its error is printed.
    for saver, _ in _ASYNC.values():
        try:
            saver.wait()
        except ckpt.Error as e:
            print(f"ckpt.torch: background save failed: {e}", file=sys.stderr)


def _world():
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def _unwrap(model):
    return model.module if hasattr(model, "module") and isinstance(
        model, torch.nn.parallel.DistributedDataParallel) else model


def param_table(model):
    """[(name, tensor, tied_to)] for every parameter in registration order, tied aliases
    included (tied_to names the first name of the same tensor), then the floating-point
    persistent buffers (stored like frozen parameters, so an fp32 export loads with
    load_state_dict(strict=True))."""
    model = _unwrap(model)
    first = {}
    out = []

    def walk(module, prefix):
        for name, p in module._parameters.items():
            if p is None:
                continue
            full = prefix + name
            out.append((full, p, first.get(id(p))))
            first.setdefault(id(p), full)
        for name, child in module._modules.items():
            if child is not None:
                walk(child, prefix + name + ".")

    walk(model, "")
    sd_keys = set(model.state_dict().keys())
    for name, b in model.named_buffers():
        if name in sd_keys and b.is_floating_point():
            out.append((name, b, None))
    return out


def trainable_parameters(model):
    """[(name, parameter)] of the trainable parameters in table order (tied aliases excluded)."""
    names = {id(p) for _, p in _unwrap(model).named_parameters()}
    return [(n, p) for n, p, tied in param_table(model)
            if tied is None and isinstance(p, torch.nn.Parameter) and p.requires_grad
            and id(p) in names]


_DTYPE_NAMES = {torch.float32: "fp32", torch.float64: "fp64", torch.bfloat16: "bf16",
                torch.float16: "fp16"}


def _table_json(model):
    trainable = {id(p) for _, p in trainable_parameters(model)}
    table = []
    for name, t, tied in param_table(model):
        if t.dtype not in _DTYPE_NAMES:
            raise ckpt.Error(f"InvalidArgument: {name} has dtype {t.dtype}; ckpt.torch saves "
                             "floating-point parameters and buffers")
        is_trainable = tied is None and id(t) in trainable
        if is_trainable and t.dtype != torch.float32:
            raise ckpt.Error(f"InvalidArgument: trainable parameter {name} is {t.dtype}; ckpt "
                             "stores fp32 master weights (keep fp32 masters, e.g. with autocast)")
        table.append({"name": name, "shape": list(t.shape), "dtype": _DTYPE_NAMES[t.dtype],
                      "frozen": tied is None and not is_trainable, "tied_to": tied})
    return table


class _Layout:
    """The optimizer's kind and who owns which parameter (indexed like param_table)."""

    def __init__(self, model, optimizer):
        from torch.distributed.optim import ZeroRedundancyOptimizer
        self.zero = isinstance(optimizer, ZeroRedundancyOptimizer)
        self.local = optimizer.optim if self.zero else optimizer
        if not isinstance(self.local, (torch.optim.AdamW, torch.optim.Adam)):
            raise ckpt.Error("InvalidArgument: ckpt.torch saves torch.optim.AdamW / Adam, alone "
                             "or inside ZeroRedundancyOptimizer; got "
                             f"{type(self.local).__name__}")
        for g in self.local.param_groups:
            if g.get("amsgrad"):
                raise ckpt.Error("InvalidArgument: amsgrad keeps a third moment ckpt does not store")
        self.optimizer = optimizer
        self.zero_stage = 1 if self.zero else 0
        self.type = "adamw" if isinstance(self.local, torch.optim.AdamW) else "adam"
        self.trainable = trainable_parameters(model)
        in_opt = {id(p) for g in optimizer.param_groups for p in g["params"]}
        missing = [n for n, p in self.trainable if id(p) not in in_opt]
        if missing:
            raise ckpt.Error("InvalidArgument: trainable parameters not in the optimizer: " +
                             ", ".join(missing[:5]))
        self.local_ids = {id(p) for g in self.local.param_groups for p in g["params"]}

    def owners(self, table):
        """Owner rank of each table entry (ZeRO-1: the rank whose optimizer holds it)."""
        by_id = owner_ranks(self.optimizer)
        tensors = {n: p for n, p in self.trainable}
        return [by_id.get(id(tensors[e["name"]]), 0) if e["name"] in tensors else 0
                for e in table]


def owner_ranks(optimizer):
    """{id(parameter): rank whose ZeroRedundancyOptimizer shard updates it}."""
    return {id(p): r for p, r in optimizer._param_to_rank.items()}


def _rng_datasets():
    out = [ckpt.Dataset.blob(_RNG_TORCH, torch.get_rng_state().numpy().tobytes(),
                             "torch_cpu_generator")]
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        for i, s in enumerate(torch.cuda.get_rng_state_all()):
            out.append(ckpt.Dataset.blob(_RNG_CUDA + str(i), s.numpy().tobytes(),
                                         "torch_cuda_generator"))
    kind, keys, pos, has_gauss, gauss = np.random.get_state()
    out.append(ckpt.Dataset.blob(_RNG_NUMPY, json.dumps(
        {"kind": kind, "keys": keys.tolist(), "pos": int(pos), "has_gauss": int(has_gauss),
         "cached_gaussian": float(gauss)}).encode(), "numpy_random_state_json"))
    version, state, gauss_next = random.getstate()
    out.append(ckpt.Dataset.blob(_RNG_PYTHON, json.dumps(
        {"version": version, "state": list(state), "gauss_next": gauss_next}).encode(),
        "python_random_state_json"))
    return out


def _number(v):
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


# What each saved hyper-parameter must be for load to apply it (what save writes from an AdamW
# or Adam group): anything else, or another key (`params` would replace the group's parameters),
# is refused before anything changes.
_HYPER_VALID = {
    "lr": (_number, "a finite number"),
    "eps": (_number, "a finite number"),
    "weight_decay": (_number, "a finite number"),
    "initial_lr": (_number, "a finite number"),
    "betas": (lambda v: isinstance(v, list) and len(v) == 2 and all(_number(b) for b in v),
              "a pair of finite numbers"),
    "amsgrad": (lambda v: isinstance(v, bool), "true or false"),
    "maximize": (lambda v: isinstance(v, bool), "true or false"),
}
assert set(_HYPER_VALID) == set(_HYPER_KEYS)


def _group_problem(group):
    """Why a saved param group cannot be applied, or None."""
    for k, v in group.items():
        if k not in _HYPER_VALID:
            return f"'{_shown(k)[:64]}' is not a hyper-parameter ckpt saves"
        ok, want = _HYPER_VALID[k]
        if not ok(v):
            return f"'{k}' is {_shown(json.dumps(v))[:64]}, not {want}"
    return None


def _shown(text):
    """`text` as a message may quote it: printable characters as they are, others escaped."""
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii")
                   for c in str(text))


def _hyper(group):
    return {k: (list(v) if isinstance(v, tuple) else v) for k, v in group.items()
            if k in _HYPER_KEYS}


def save(root, step, model, optimizer, *, scheduler=None, data_state=None, client_state=None,
         keep_last=None, compression="none", tokens_seen=0, samples_seen=0, group=None,
         async_=False):
    """Collective: every rank calls it after the same optimizer step. Writes ROOT/global_step<step>
    atomically (ckpt's commit protocol, rank 0 committing) and moves ROOT/latest to it; returns
    the tag.

    data_state: this rank's data position (JSON); client_state: JSON kept in the manifest.
    Raises ckpt.Error on every rank when the save fails; the previous checkpoint stays intact.

    async_=True: returns an AsyncSave once the state is copied; the write and the commit run in
    the background (docs/async.md) while training goes on, and the checkpoint holds the state at
    the call. Call .wait() on the last one before destroying the process group.
    """
    rank, world = _world()
    layout = _Layout(model, optimizer)
    table = _table_json(model)
    if layout.zero:
        planned = ckpt.plan(table, world, owners=layout.owners(table))
    else:
        planned = ckpt.plan(table, world, zero_stage=0)
    tensors = {n: t for n, t, _ in param_table(model)}
    shard_numel = planned["partition"]["shard_numel"][rank]
    shards = {k: np.zeros(shard_numel, dtype=np.float32)
              for k in ("master", "exp_avg", "exp_avg_sq")}
    steps = {}
    for entry in planned["params"]:
        for r in entry["ranges"]:
            if r["rank"] != rank:
                continue
            p = tensors[entry["name"]]
            n = r["end"] - r["begin"]
            sl = slice(r["shard_offset"], r["shard_offset"] + n)
            flat = p.detach().reshape(-1)[r["begin"]:r["end"]]
            shards["master"][sl] = flat.cpu().numpy()
            state = layout.local.state.get(p, {})
            if "exp_avg" in state:
                shards["exp_avg"][sl] = state["exp_avg"].reshape(-1)[r["begin"]:r["end"]].cpu().numpy()
                shards["exp_avg_sq"][sl] = state["exp_avg_sq"].reshape(-1)[r["begin"]:r["end"]].cpu().numpy()
            st = state.get("step", 0)
            steps[entry["name"]] = int(st.item() if torch.is_tensor(st) else st)
    datasets = []
    if shard_numel > 0:
        datasets += [ckpt.Dataset.tensor(k, v) for k, v in shards.items()]
    datasets += _rng_datasets()
    datasets.append(ckpt.Dataset.json(_OPT_STEPS, steps))
    datasets.append(ckpt.Dataset.json("data_position", data_state if data_state is not None else {}))
    groups = [_hyper(g) for g in optimizer.param_groups]
    lr = groups[0]["lr"] if groups else 0.0
    opt_step = max(steps.values(), default=0)
    if world > 1:
        opt_step = _max_over_ranks(opt_step, group)
    sched = {"torch": scheduler.state_dict() if scheduler is not None else None,
             "next_lr": lr, "optimizer_step": opt_step}
    datasets.append(ckpt.Dataset.json("scheduler", sched))
    if rank == 0:
        datasets.append(ckpt.Dataset.json(_PARAM_GROUPS, groups))
        for entry in planned["params"]:
            if entry["frozen"]:
                datasets.append(ckpt.Dataset.tensor("frozen/" + entry["name"],
                                                    tensors[entry["name"]].detach().cpu().contiguous()))
    g0 = groups[0] if groups else {}
    betas = g0.get("betas", [0.9, 0.999])
    manifest = {
        "tag": f"global_step{step}",
        "counters": {"global_step": int(step), "tokens_seen": int(tokens_seen),
                     "samples_seen": int(samples_seen)},
        "topology": {"dp_world_size": world, "zero_stage": layout.zero_stage},
        "optimizer": {"type": layout.type, "lr": lr, "beta1": betas[0], "beta2": betas[1],
                      "eps": g0.get("eps", 1e-8), "weight_decay": g0.get("weight_decay", 0.0),
                      "step": opt_step, "torch_class": type(optimizer).__name__,
                      "param_groups": len(groups)},
        "dtypes": {"master": "fp32", "exp_avg": "fp32", "exp_avg_sq": "fp32"},
        "partition": planned["partition"],
        "params": planned["params"],
        "client_state": client_state if client_state is not None else {},
    }
    if async_:
        saver, collective = _async_saver(group, world)
        saver.save(root, manifest, datasets, collective, compression=compression,
                   keep_last=keep_last or 0)
        return AsyncSave(manifest["tag"], saver)
    collective = _collective(group) if world > 1 else None
    ckpt.save_shard(root, manifest, datasets, collective, compression=compression,
                    keep_last=keep_last or 0)
    return manifest["tag"]


def _max_over_ranks(value, group):
    t = torch.tensor([value], dtype=torch.int64)
    if dist.get_backend(group) != "gloo":
        t = t.cuda()
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
    return int(t.item())


class LoadInfo:
    """What load() restored: tag, step (global_step), data_state (this rank's), client_state,
    manifest."""

    def __init__(self, tag, step, data_state, client_state, manifest):
        self.tag, self.step, self.data_state = tag, step, data_state
        self.client_state, self.manifest = client_state, manifest


def _refuse(what):
    raise ckpt.Error("FailedPrecondition: " + what + " (nothing was changed)")


def _check_topology(m, layout, world, path):
    saved_world = m["topology"]["dp_world_size"]
    if saved_world != world:
        _refuse(f"{path} was saved by {saved_world} ranks and this run has {world}; convert it "
                f"with `ckpt to-universal` + `ckpt reshard --dp {world}` first")
    stage = m["topology"]["zero_stage"]
    if layout.zero and stage == 0:
        _refuse(f"{path} holds replicated (ZeRO-0) optimizer state and this run uses "
                "ZeroRedundancyOptimizer; convert it with `ckpt reshard --zero 1` first")
    if not layout.zero and stage != 0:
        _refuse(f"{path} holds ZeRO-{stage} optimizer state and this run's optimizer is "
                f"{type(layout.optimizer).__name__}; convert it with `ckpt reshard --zero 0` first")


def _check_table(m, table, path):
    saved = {p["name"]: p for p in m["params"]}
    for e in table:
        p = saved.get(e["name"])
        if p is None:
            _refuse(f"{path} has no parameter {e['name']}")
        if p["shape"] != e["shape"] or bool(p["frozen"]) != bool(e["frozen"]) or \
                (p["tied_to"] or None) != (e["tied_to"] or None):
            _refuse(f"{path}: parameter {e['name']} is {p['shape']} "
                    f"{'frozen' if p['frozen'] else 'trainable'} there, {e['shape']} "
                    f"{'frozen' if e['frozen'] else 'trainable'} here")
    extra = set(saved) - {e["name"] for e in table}
    if extra:
        _refuse(f"{path} has parameters this model lacks: " + ", ".join(sorted(extra)[:5]))


def _read_rng(reader, rank, files):
    """This rank's generator states from the checkpoint, read and checked before anything is
    applied (a state that does not parse or fit refuses the load, nothing changed); returns the
    function that applies them."""
    names = {d["name"] for d in files.get(rank, [])}

    def parsed(name, make):
        try:
            return make(reader.read_blob(rank, name))
        except ckpt.Error:
            raise
        except Exception as e:  # noqa: BLE001 - any malformed state is the same refusal
            _refuse(f"{reader.dir}: {name} of rank {rank} is not a generator state "
                    f"({type(e).__name__}: {str(e)[:120]!r})")

    def torch_state(blob, device):
        t = torch.from_numpy(np.frombuffer(blob, dtype=np.uint8).copy())
        torch.Generator(device=device).set_state(t)  # a scratch generator: raises where torch would
        return t

    if _RNG_TORCH in names:
        cpu = parsed(_RNG_TORCH, lambda b: torch_state(b, "cpu"))
    else:  # a resharded checkpoint's new rank: seeded from (step, rank)
        cpu = zlib.crc32(f"{reader.manifest['counters']['global_step']}/{rank}".encode())
    cuda = sorted(n for n in names if n.startswith(_RNG_CUDA)) if torch.cuda.is_available() else []
    cuda = [parsed(n, lambda b: torch_state(b, "cuda")) for n in cuda]

    def numpy_state(blob):
        s = json.loads(blob)
        state = (s["kind"], np.array(s["keys"], dtype=np.uint32), s["pos"], s["has_gauss"],
                 s["cached_gaussian"])
        np.random.RandomState().set_state(state)  # raises where numpy would
        return state

    def python_state(blob):
        s = json.loads(blob)
        state = (s["version"], tuple(s["state"]), s["gauss_next"])
        random.Random().setstate(state)  # raises where random would
        return state

    np_state = parsed(_RNG_NUMPY, numpy_state) if _RNG_NUMPY in names else None
    py_state = parsed(_RNG_PYTHON, python_state) if _RNG_PYTHON in names else None

    def apply():
        if isinstance(cpu, int):
            torch.manual_seed(cpu)
        else:
            torch.set_rng_state(cpu)
        if cuda:
            torch.cuda.set_rng_state_all(cuda)
        if np_state is not None:
            np.random.set_state(np_state)
        if py_state is not None:
            random.setstate(py_state)
    return apply


def _open_agreed(root, tag, verify_checksums, rank, world):
    """Every rank opens the same tag: rank 0 resolves ROOT (`latest`, unless `tag` names one)
    and sends the tag's name to the others, which open it under their own ROOT (another node
    may mount it elsewhere). Each rank resolving `latest` on its own could load different steps
    when a save commits into ROOT meanwhile (a training job writing where an evaluation job
    reads). When rank 0 cannot open it, every rank raises."""
    if world == 1:
        return ckpt.Reader(root, tag or "", verify_checksums)
    reader, failure = None, None
    if rank == 0:
        try:
            reader = ckpt.Reader(root, tag or "", verify_checksums)
        except Exception as e:  # noqa: BLE001 - re-raised below, after the others are told
            failure = e
    agreed = _collective(None).broadcast(
        {"tag": reader.tag} if reader is not None else {"error": str(failure)})
    if rank == 0:
        if failure is not None:
            raise failure
        return reader
    if "error" in agreed:
        raise ckpt.Error(f"rank 0 could not open {root}: {agreed['error']}")
    return ckpt.Reader(ckpt._ckpt.agreed_tag_dir(root, agreed["tag"]), "", verify_checksums)


def load(root, model, optimizer, *, tag=None, scheduler=None, restore_rng=True,
         verify_checksums=True):
    """Restores model, optimizer (and scheduler, RNG) from ROOT's latest tag or `tag`; every rank
    calls it. Refuses (ckpt.Error, nothing changed) a checkpoint of another world size, optimizer
    layout or parameter table, or one whose generator states, optimizer steps, parameter groups
    or scheduler state do not parse. Returns a LoadInfo."""
    rank, world = _world()
    layout = _Layout(model, optimizer)
    reader = _open_agreed(root, tag, verify_checksums, rank, world)
    m = reader.manifest
    _check_topology(m, layout, world, reader.dir)
    table = _table_json(model)
    _check_table(m, table, reader.dir)
    files = {f["rank"]: f["datasets"] for f in m["files"]}
    saved = {p["name"]: p for p in m["params"]}

    # Read everything first: a failure leaves model and optimizer untouched.
    weights, moments = {}, {}
    tensors = {n: t for n, t, _ in param_table(model)}
    for e in table:
        if e["tied_to"]:
            continue
        t = tensors[e["name"]]
        if e["frozen"]:
            raw = reader.read_dataset(0, "frozen/" + e["name"])
            weights[e["name"]] = _from_numpy(raw, t.dtype).reshape(t.shape)
            continue
        weights[e["name"]] = torch.from_numpy(reader.read_param(e["name"], "master").copy())
        if id(t) in layout.local_ids:
            moments[e["name"]] = (
                torch.from_numpy(reader.read_param(e["name"], "exp_avg").copy()),
                torch.from_numpy(reader.read_param(e["name"], "exp_avg_sq").copy()))
    step_of = {}
    for r, ds in files.items():
        if any(d["name"] == _OPT_STEPS for d in ds):
            steps = reader.read_json(r, _OPT_STEPS)
            if not isinstance(steps, dict) or not all(_number(v) for v in steps.values()):
                _refuse(f"{reader.dir}: {_OPT_STEPS} of rank {r} is not a step per parameter")
            step_of.update(steps)
    default_step = m["optimizer"].get("step", m["counters"]["global_step"])
    if not _number(default_step):
        _refuse(f"{reader.dir}: the manifest's optimizer step is not a number")
    default_step = int(default_step)
    groups = None
    if any(d["name"] == _PARAM_GROUPS for d in files.get(0, [])):
        groups = reader.read_json(0, _PARAM_GROUPS)
        if not isinstance(groups, list) or not all(isinstance(g, dict) for g in groups):
            _refuse(f"{reader.dir}: {_PARAM_GROUPS} is not a list of parameter groups")
        if len(groups) != len(optimizer.param_groups):
            _refuse(f"{reader.dir} has {len(groups)} optimizer param groups, this optimizer "
                    f"{len(optimizer.param_groups)}")
        for i, g in enumerate(groups):
            problem = _group_problem(g)
            if problem:
                _refuse(f"{reader.dir}: {_PARAM_GROUPS} group {i}: {problem}")
    own = rank if any(d["name"] == "scheduler" for d in files.get(rank, [])) else 0
    sched = reader.read_json(own, "scheduler") if any(
        d["name"] == "scheduler" for d in files.get(own, [])) else None
    if sched is not None and (not isinstance(sched, dict) or not isinstance(
            sched.get("torch", {}), (dict, type(None)))):
        _refuse(f"{reader.dir}: the scheduler state is not a state dict")
    data_rank = rank if any(d["name"] == "data_position" for d in files.get(rank, [])) else 0
    data_state = reader.read_json(data_rank, "data_position") if any(
        d["name"] == "data_position" for d in files.get(data_rank, [])) else None
    apply_rng = _read_rng(reader, rank, files) if restore_rng else None

    # Apply.
    with torch.no_grad():
        for name, w in weights.items():
            tensors[name].copy_(w.reshape(tensors[name].shape))
    name_of = {id(p): n for n, p in layout.trainable}
    state = {}
    for p in (p for g in layout.local.param_groups for p in g["params"]):
        name = name_of.get(id(p))
        if name is None or name not in moments:
            continue
        step = int(step_of.get(name, default_step) or 0)
        if step == 0:
            continue  # never updated: AdamW creates its state on the first step
        m1, m2 = moments[name]
        state[p] = {"step": torch.tensor(float(step)),
                    "exp_avg": m1.reshape(p.shape).to(p.device, p.dtype),
                    "exp_avg_sq": m2.reshape(p.shape).to(p.device, p.dtype)}
    layout.local.state.clear()
    for p, s in state.items():
        layout.local.state[p] = s
    if groups is not None:
        for g, saved_g in zip(optimizer.param_groups, groups):
            for k, v in saved_g.items():
                g[k] = tuple(v) if k == "betas" else v
        if layout.zero:  # the local AdamW takes its hyper-parameters from the global groups
            optimizer._sync_param_groups(optimizer.param_groups, layout.local.param_groups)
    if scheduler is not None and sched is not None and sched.get("torch") is not None:
        scheduler.load_state_dict(sched["torch"])
    if apply_rng is not None:
        apply_rng()
    return LoadInfo(reader.tag, m["counters"]["global_step"], data_state, m["client_state"], m)


def _from_numpy(raw, dtype):
    t = torch.from_numpy(np.ascontiguousarray(raw))
    return t.view(dtype) if dtype in (torch.bfloat16,) else t.to(dtype)


def load_export(path):
    """The state_dict of a `ckpt export-fp32` output (a directory or one .safetensors file),
    tied aliases restored from its `tied_weights` metadata, as torch tensors: what
    model.load_state_dict(..., strict=True) takes. An index that names a file outside the
    directory, or an index or tied_weights that does not parse, raises ckpt.CorruptionError
    naming the file; nothing outside the directory is read."""
    import os

    def corrupt(where, what):
        raise ckpt.CorruptionError(f"DataLoss: {where}: {what}")

    if os.path.isdir(path):
        index = os.path.join(path, "model.safetensors.index.json")
        if os.path.exists(index):
            try:
                with open(index, "rb") as f:
                    weight_map = json.loads(f.read())["weight_map"]
                files = sorted(set(weight_map.values()))
            except (ValueError, KeyError, TypeError, AttributeError, RecursionError) as e:
                corrupt(index, f"not a safetensors index ({type(e).__name__})")
            for f in files:
                if (not isinstance(f, str) or not f.endswith(".safetensors") or "/" in f
                        or "\\" in f or f.startswith(".")):
                    corrupt(index, f"weight_map names {f!r}, not a shard of this directory")
        else:
            files = ["model.safetensors"]
        paths = [os.path.join(path, f) for f in files]
    else:
        paths = [path]
    state, tied = {}, {}
    for p in paths:
        tensors, meta = ckpt.read_safetensors(p, with_metadata=True)
        try:
            aliases = json.loads(meta.get("tied_weights", "{}"))
            if not isinstance(aliases, dict) or not all(
                    isinstance(k, str) and isinstance(v, str) for k, v in aliases.items()):
                raise TypeError("not an object of names")
        except (ValueError, TypeError, RecursionError) as e:
            corrupt(p, f"__metadata__ tied_weights is not a map of aliases ({e})")
        tied.update(aliases)
        for name, arr in tensors.items():
            t = torch.from_numpy(arr)
            state[name] = t.view(torch.bfloat16) if arr.dtype == np.uint16 else t
    for alias, owner in tied.items():
        if owner not in state:
            corrupt(paths[0], f"tied_weights names {alias!r} an alias of {owner!r}, "
                              "which the export does not hold")
        state[alias] = state[owner]
    return state
