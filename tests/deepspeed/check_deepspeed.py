#!/usr/bin/python3
"""End-to-end check of ckpt on DeepSpeed checkpoints against torch's own recomputation.

    check_deepspeed.py CKPT_BIN WORK_DIR [--quick]

For ZeRO 1, 2, 3 x world 1, 2, 3 x fp32 / bf16 (and DeepSpeed's BF16_Optimizer layout) it writes
a checkpoint with make_ds_checkpoint.py and its truth (what zero_to_fp32 reconstructs: the flat
partitions concatenated, padding stripped, split by param_shapes; plus the moments), then:
  1. `ckpt export-fp32 DS` equals the truth bitwise (trainable, frozen, buffers; tied recorded);
  2. `ckpt import-deepspeed DS` + `ckpt export-fp32` gives the same bytes as (1);
  3. `ckpt to-universal DS` and `ckpt reshard DS --dp M` (read back through to-universal) hold
     master, exp_avg and exp_avg_sq equal to the truth bitwise, with step and hyper-parameters;
  4. `ckpt inspect --json` and `ckpt check` agree with the fixture (check: exit 0, no checksums);
     inspect and `ckpt diff` read its universal copy, which diff finds identical;
  5. `ckpt next-update DS --grad G` equals torch.optim.AdamW on the fixture's state.
Then the hostile variants (truncated zip, os.system / eval globals, a storage too small for its
view, mismatched partition counts, a missing rank file, a missing model-states file, a
parameter name of invalid UTF-8 with a terminal escape, a data.pkl changed in place under its
CRC-32, a frozen parameter of 2**34 elements over one stored element, a deflated storage whose
headers and pickle claim more bytes than deflate can hold) must each be refused by
export-fp32, inspect and check with exit 1 or 2, a message naming the file and holding no raw
bytes of it, nothing executed, nothing written; and 100 randomly damaged copies of a small
checkpoint's .pt files (check_mutations) never crash check or export-fp32 nor make them print
raw bytes.
Exit 0 when everything holds; 1 with a message at the first failure.
"""
import argparse
import json
import os
import shutil
import struct
import subprocess
import sys

import h5py
import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import make_ds_checkpoint as gen  # noqa: E402

ST_DTYPES = {"F32": np.float32, "BF16": np.uint16, "F16": np.float16, "F64": np.float64,
             "I64": np.int64}


def fail(msg):
    print("check_deepspeed: FAIL: " + msg, file=sys.stderr)
    sys.exit(1)


def run(args, expect=0):
    p = subprocess.run(args, capture_output=True, text=True)
    if expect is not None and p.returncode != expect:
        fail(f"{' '.join(args)} exited {p.returncode}, expected {expect}\n{p.stdout}{p.stderr}")
    return p


def read_safetensors(path):
    with open(path, "rb") as f:
        data = f.read()
    n = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8:8 + n])
    meta = header.pop("__metadata__", {})
    out = {}
    for name, e in header.items():
        b, en = e["data_offsets"]
        raw = data[8 + n + b:8 + n + en]
        out[name] = (e["dtype"], np.frombuffer(raw, dtype=ST_DTYPES[e["dtype"]]).reshape(e["shape"]))
    return meta, out


def exported(dirname):
    files = sorted(f for f in os.listdir(dirname) if f.endswith(".safetensors"))
    meta, tensors = {}, {}
    for f in files:
        m, t = read_safetensors(os.path.join(dirname, f))
        meta.update(m)
        tensors.update(t)
    return meta, tensors


def make(work, zero, world, dtype, optimizer="zero", hostile=None, blocks=0):
    name = f"z{zero}w{world}{dtype}{'-' + optimizer if optimizer != 'zero' else ''}"
    if blocks:
        name += f"-b{blocks}"
    if hostile:
        name += "-" + hostile
    root = os.path.join(work, name)
    shutil.rmtree(root, ignore_errors=True)
    args = argparse.Namespace(out=root, zero=zero, world=world, dtype=dtype, optimizer=optimizer,
                              tag="global_step7", steps=7, hidden=24, vocab=37, seed=zero * 10 + world,
                              truth=os.path.join(work, name + ".truth.pt"), hostile=hostile,
                              blocks=blocks, frozen_blocks=0, block_width=512)
    gen.write(args)
    if hostile:
        gen.hostile(args)
    return root, torch.load(args.truth)


def same(a, b, what):
    a = np.asarray(a)
    b = np.asarray(b)
    if a.shape != b.shape or a.dtype != b.dtype or a.tobytes() != b.tobytes():
        fail(f"{what}: differs (shapes {a.shape} / {b.shape}, dtypes {a.dtype} / {b.dtype})")


def check_weights(tensors, meta, truth, what):
    tied = json.loads(meta.get("tied_weights", "{}"))
    for name, t in truth["weights"].items():
        if name in truth["tied"]:
            if tied.get(name) != truth["tied"][name]:
                fail(f"{what}: tied {name} not recorded as {truth['tied'][name]} ({tied})")
            continue
        if name not in tensors:
            fail(f"{what}: {name} missing from the export")
        dt, arr = tensors[name]
        if dt != "F32":
            fail(f"{what}: {name} exported as {dt}")
        same(arr, t.float().numpy(), f"{what}: {name}")
    extra = set(tensors) - set(truth["weights"])
    if extra:
        fail(f"{what}: unexpected tensors {sorted(extra)}")


def check_universal(udir, truth, what):
    with h5py.File(os.path.join(udir, "universal.h5"), "r") as f:
        for name in truth["exp_avg"]:
            g = "params/" + name.replace("%", "%25").replace("/", "%2F")
            for key, ref in (("master", truth["weights"][name]), ("exp_avg", truth["exp_avg"][name]),
                             ("exp_avg_sq", truth["exp_avg_sq"][name])):
                same(f[g][key][()].reshape(ref.shape), ref.float().numpy(), f"{what}: {name}/{key}")
    with open(os.path.join(udir, "manifest.json")) as fh:
        m = json.load(fh)
    opt = m["optimizer"]
    if opt.get("step") != truth["step"] or opt.get("type") != "adamw":
        fail(f"{what}: optimizer {opt}, expected step {truth['step']} adamw")
    for key, ref in (("lr", truth["lr"]), ("beta1", truth["betas"][0]), ("beta2", truth["betas"][1]),
                     ("eps", truth["eps"]), ("weight_decay", truth["weight_decay"])):
        if abs(opt.get(key, -1) - ref) > 0:
            fail(f"{what}: optimizer {key} {opt.get(key)} != {ref}")
    if m["counters"]["global_step"] != truth["step"]:
        fail(f"{what}: global_step {m['counters']['global_step']}")


def check_fixture(ckpt, work, zero, world, dtype, optimizer="zero", quick=False):
    root, truth = make(work, zero, world, dtype, optimizer)
    what = os.path.basename(root)
    for suffix in (".export", ".export2", ".imported", ".universal", ".reshard",
                   ".reshard-universal"):
        shutil.rmtree(root + suffix, ignore_errors=True)
    e1 = root + ".export"
    run([ckpt, "export-fp32", root, e1, "--json"])
    meta, tensors = exported(e1)
    check_weights(tensors, meta, truth, what + " export-fp32")
    # inspect / check
    info = json.loads(run([ckpt, "inspect", root, "--json"]).stdout)
    if info["dp_world_size"] != world or info["zero_stage"] != zero or info["kind"] != "deepspeed":
        fail(f"{what}: inspect says dp {info['dp_world_size']} ZeRO-{info['zero_stage']}")
    if info["deepspeed"]["checksums"] is not False:
        fail(f"{what}: inspect does not say DeepSpeed has no checksums")
    chk = json.loads(run([ckpt, "check", root, "--json"]).stdout)
    if not chk["ok"] or chk["checksums"] is not False or "no checksums" not in chk["note"]:
        fail(f"{what}: check {chk}")
    # import + export: same bytes
    imp = root + ".imported"
    run([ckpt, "import-deepspeed", root, imp, "--json"])
    e2 = root + ".export2"
    run([ckpt, "export-fp32", imp, e2, "--json"])
    for f in sorted(os.listdir(e1)):
        with open(os.path.join(e1, f), "rb") as a, open(os.path.join(e2, f), "rb") as b:
            if a.read() != b.read():
                fail(f"{what}: import-deepspeed + export-fp32 differs from export-fp32 in {f}")
    run([ckpt, "check", imp, "--deep"])
    # state: to-universal directly and after a reshard to another world size
    u = root + ".universal"
    run([ckpt, "to-universal", root, u, "--json"])
    check_universal(u, truth, what + " to-universal")
    # one read interface: inspect and diff open the universal copy like the DeepSpeed original
    uinfo = json.loads(run([ckpt, "inspect", u, "--json"]).stdout)
    if uinfo["kind"] != "universal" or uinfo["total_params"] != info["total_params"]:
        fail(f"{what}: inspect of its universal copy says {uinfo['kind']}, "
             f"{uinfo['total_params']} parameters")
    d = json.loads(run([ckpt, "diff", root, u, "--json"]).stdout)
    if not d["identical"]:
        fail(f"{what}: diff against its universal copy: {d['differences'][:5]}")
    if not quick:
        m = 1 if world != 1 else 2
        rs = root + ".reshard"
        run([ckpt, "reshard", root, rs, "--dp", str(m), "--json"])
        ru = root + ".reshard-universal"
        run([ckpt, "to-universal", rs, ru, "--json"])
        check_universal(ru, truth, what + f" reshard --dp {m}")
        shutil.rmtree(rs)
        shutil.rmtree(ru)
    for d in (e1, e2, imp, u):
        shutil.rmtree(d)
    size = sum(os.path.getsize(os.path.join(dp, f)) for dp, _, fs in os.walk(root) for f in fs)
    if size > 2 << 20:
        fail(f"{what}: fixture is {size} bytes (over 2 MB)")
    print(f"ok {what}: export, import, inspect, check, to-universal"
          f"{'' if quick else ', reshard'} match torch ({size} bytes)")
    return root


def write_safetensors(path, tensors):
    header, blobs, off = {}, [], 0
    for name, t in tensors.items():
        b = t.float().contiguous().numpy().astype("<f4").tobytes()
        header[name] = {"dtype": "F32", "shape": list(t.shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    h = json.dumps(header).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def check_next_update(ckpt, work, zero, world, dtype):
    """`ckpt next-update DS --grad` against torch.optim.AdamW on the fixture's own state
    (tests/verify/torch_adamw_check.py: every path within 1e-6 of torch and of fp64)."""
    root, truth = make(work, zero, world, dtype)
    what = os.path.basename(root)
    state = root + ".state"
    shutil.rmtree(state, ignore_errors=True)
    shutil.rmtree(root + ".next", ignore_errors=True)
    os.makedirs(state)
    names = list(truth["exp_avg"])
    g = torch.Generator().manual_seed(11)
    grads = {n: torch.randn(truth["exp_avg"][n].shape, generator=g) * 1e-2 for n in names}
    write_safetensors(os.path.join(state, "w.safetensors"), {n: truth["weights"][n] for n in names})
    write_safetensors(os.path.join(state, "m.safetensors"), {n: truth["exp_avg"][n] for n in names})
    write_safetensors(os.path.join(state, "v.safetensors"), {n: truth["exp_avg_sq"][n] for n in names})
    write_safetensors(os.path.join(state, "g.safetensors"), grads)
    r = json.loads(run([ckpt, "next-update", root, "--grad", os.path.join(state, "g.safetensors"),
                        "--out", root + ".next", "--device", "cpu", "--json"]).stdout)
    hyper = r.get("hyper", {})
    if hyper.get("step") != truth["step"]:
        fail(f"{what} next-update: step {hyper.get('step')} != {truth['step']} ({r})")
    # The interpreter running this check (Debian's /usr/bin/python3 in CI; a lent machine's own
    # Python with a newer torch when run there: docs/deepspeed.md).
    p = run([sys.executable, os.path.join(HERE, "..", "verify", "torch_adamw_check.py"), state,
             root + ".next", str(truth["lr"]), str(truth["betas"][0]), str(truth["betas"][1]),
             str(truth["eps"]), str(truth["weight_decay"]), str(truth["step"])], expect=None)
    if p.returncode != 0:
        fail(f"{what} next-update differs from torch AdamW:\n{p.stdout}{p.stderr}")
    shutil.rmtree(state)
    shutil.rmtree(root + ".next")
    print(f"ok {what}: next-update --grad matches torch.optim.AdamW ({p.stdout.strip()[:120]})")


def printable(p, what):
    """A finished command's stdout + stderr as text, failing unless whatever a file held reached
    it escaped: valid UTF-8 with no control character but newline and tab."""
    raw = p.stdout + p.stderr
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        fail(f"{what} printed raw bytes from the file: {raw[-300:]!r}")
    if any(c < 0x20 and c not in (0x0a, 0x09) for c in raw):
        fail(f"{what} printed a control byte: {raw[-300:]!r}")
    return text


# What the refusal of each hostile kind must say: a refusal for another cause would pass
# unnoticed (a claimed size met by allocating it and failing at the record's end; a damaged
# pickle refused for an earlier reason than the one the kind plants).
HOSTILE_MESSAGES = {
    "truncate": "not a readable PyTorch zip archive",
    "os_system": "ckpt never runs code from a checkpoint",
    "eval": "a Python builtin that can run code",
    "short_storage": "tensor view (offset 0, shape [1320]) needs element 1319 of storage",
    "partitions": "records partition_count 3, found 2 optimizer file(s)",
    "missing_rank": "zero_pp_rank_1_mp_rank_00_optim_states.pt is missing",
    "missing_model": "mp_rank_00_model_states.pt is missing",
    "bad_name": "is not printable UTF-8",
    "pickle_crc": "record mp_rank_00_model_states/data.pkl: CRC error",
    "repeat_view": "its elements repeat",
    "deflate_claim": "more than deflate can hold",
    "huge_padding": "more than a partition of its group holds",
}


def check_hostile(ckpt, work, kind, zero=2, world=2, dtype="bf16"):
    root, _ = make(work, zero, world, dtype, hostile=kind)
    for suffix in (".out", ".imp"):
        shutil.rmtree(root + suffix, ignore_errors=True)
    marker = os.path.join(root, "PWNED")
    for cmd in (["export-fp32", root, root + ".out"], ["inspect", root], ["check", root],
                ["import-deepspeed", root, root + ".imp"], ["diff", root, root]):
        p = subprocess.run([ckpt] + cmd, capture_output=True)
        text = printable(p, f"hostile {kind}: ckpt {cmd[0]}")
        if p.returncode not in (1, 2):
            fail(f"hostile {kind}: ckpt {cmd[0]} exited {p.returncode}\n{text}")
        if ".pt" not in text:
            fail(f"hostile {kind}: ckpt {cmd[0]} message names no file: {text}")
        if HOSTILE_MESSAGES[kind] not in text:
            fail(f"hostile {kind}: ckpt {cmd[0]} refused without saying "
                 f"{HOSTILE_MESSAGES[kind]!r}: {text}")
        if os.path.exists(marker):
            fail(f"hostile {kind}: the pickle's code ran (found {marker})")
        for out in (root + ".out", root + ".imp"):
            if os.path.exists(out):
                fail(f"hostile {kind}: ckpt {cmd[0]} wrote {out}")
    print(f"ok hostile {kind}: refused ({text.strip().splitlines()[-1][:160]})")


def check_odd_version(ckpt, work):
    """A ds_version of a terminal escape and invalid UTF-8 (a pickle holds any bytes) is no
    reason to refuse a checkpoint, but it reaches inspect's text and JSON and import's summary
    escaped, never raw (until 2026-12-07 the escape reached the terminal as it was)."""
    root, _ = make(work, 2, 1, "bf16", hostile="bad_version")
    shutil.rmtree(root + ".imp", ignore_errors=True)
    want = "0.19\\x1b[31mRED\\xed\\xa0\\x80"  # the UTF-8 Python writes for U+D800
    for cmd in (["inspect", root], ["inspect", "--json", root], ["check", root],
                ["import-deepspeed", root, root + ".imp"]):
        p = subprocess.run([ckpt] + cmd, capture_output=True)
        text = printable(p, f"odd ds_version: ckpt {cmd[0]}")
        if p.returncode != 0:
            fail(f"odd ds_version: ckpt {' '.join(cmd[:2])} exited {p.returncode}\n{text}")
        if cmd[1] == "--json":
            got = json.loads(p.stdout)["deepspeed"]["ds_version"]
            if got != want:
                fail(f"odd ds_version: inspect --json says {got!r}")
        elif cmd[0] != "check" and want not in text:
            fail(f"odd ds_version: ckpt {cmd[0]} does not show it escaped: {text}")
    print("ok odd ds_version: reported escaped")


def check_odd_names(ckpt, work):
    """Names a DeepSpeed root holds that no DeepSpeed run writes, as an archive unpacks them:
    a `latest` naming a tag directory whose name carries a terminal escape is refused with the
    name escaped (until 2026-12-07 it was followed and the directory's path reached every
    message raw), and a file in the tag directory named with one (ending _model_states.pt,
    which was refused as a tensor-parallel file, its name printed raw) is passed over."""
    esc = "global_step7\x1b[31mRED\x07"
    escaped = "'global_step7\\x1b[31mRED\\x07'"
    # 1. `latest` names a directory with an escape in its name.
    root, _ = make(work, 2, 2, "bf16")
    os.rename(os.path.join(root, "global_step7"), os.path.join(root, esc))
    with open(os.path.join(root, "latest"), "w") as f:
        f.write(esc)
    shutil.rmtree(root + ".out", ignore_errors=True)
    for cmd in (["inspect", root], ["check", root], ["export-fp32", root, root + ".out"],
                ["import-deepspeed", root, root + ".out"]):
        p = subprocess.run([ckpt] + cmd, capture_output=True)
        text = printable(p, f"odd latest: ckpt {cmd[0]}")
        if p.returncode != 1 or "latest" not in text or escaped not in text:
            fail(f"odd latest: ckpt {cmd[0]} exited {p.returncode}: {text}")
        if os.path.exists(root + ".out"):
            fail(f"odd latest: ckpt {cmd[0]} wrote {root}.out")
    # 2. A file named with an escape beside the checkpoint's own: not DeepSpeed's, passed over.
    root, truth = make(work, 2, 2, "bf16")
    tag = os.path.join(root, "global_step7")
    shutil.copy(os.path.join(tag, "mp_rank_00_model_states.pt"),
                os.path.join(tag, "\x1b[31mRED_model_states.pt"))
    shutil.rmtree(root + ".out", ignore_errors=True)
    for cmd in (["inspect", root], ["check", root], ["export-fp32", root, root + ".out"]):
        p = subprocess.run([ckpt] + cmd, capture_output=True)
        text = printable(p, f"odd file name: ckpt {cmd[0]}")
        if p.returncode != 0:
            fail(f"odd file name: ckpt {cmd[0]} exited {p.returncode}: {text}")
    meta, tensors = exported(root + ".out")
    check_weights(tensors, meta, truth, "odd file name: export-fp32")
    print("ok odd names: a `latest` naming one refused escaped, a file named with one passed over")


def check_mutations(ckpt, work, count=100, seed=20261203, blocks=0):
    """Damaged copies of a small checkpoint's .pt files (bits flipped anywhere or in the zip's
    central directory, bytes cut off or taken out): `check` and `export-fp32` exit 0 or 1,
    never crash, print no raw byte of the file, and write nothing on a refusal. Both outcomes
    must occur (flips inside tensor data pass: DeepSpeed records no checksums but the zip's
    CRC-32, which `check` reads), so the mutations reach past the archive's parsing. An export
    that succeeds wrote exactly the undamaged checkpoint's export: damage in what it reads (the
    fp32 masters, frozen tensors) is refused by their records' CRC-32. With
    `blocks`, the checkpoint gets that many 512 x 512 blocks: storages of a MiB and more, which
    `check` reads from where they lie and CRCs itself (records under 64 KiB go through libzip),
    and a flip in one must be reported with that path's message."""
    import random
    rng = random.Random(seed)
    root, _ = make(work, 2, 1, "fp32", blocks=blocks)
    tag = os.path.join(root, "global_step7")
    files = sorted(f for f in os.listdir(tag) if f.endswith(".pt"))
    pristine = {f: open(os.path.join(tag, f), "rb").read() for f in files}
    truth_out = root + ".mut.truth"
    shutil.rmtree(truth_out, ignore_errors=True)
    run([ckpt, "export-fp32", root, truth_out])
    truth = {f: open(os.path.join(truth_out, f), "rb").read() for f in os.listdir(truth_out)}
    seen = {}
    out = root + ".mut.out"
    for _ in range(count):
        name = rng.choice(files)
        b = bytearray(pristine[name])
        kind = rng.choice(["flip", "flip", "cut", "hole", "directory"])
        if kind == "flip":
            for _ in range(rng.randint(1, 8)):
                b[rng.randrange(len(b))] ^= 1 << rng.randrange(8)
        elif kind == "cut":
            del b[rng.randrange(len(b)):]
        elif kind == "hole":
            at = rng.randrange(len(b))
            del b[at:at + rng.randint(1, 64)]
        else:
            for _ in range(rng.randint(1, 4)):
                b[len(b) - 1 - rng.randrange(min(4096, len(b)))] ^= 1 << rng.randrange(8)
        for f in files:  # one damaged file at a time, the others as written
            with open(os.path.join(tag, f), "wb") as w:
                w.write(b if f == name else pristine[f])
        for cmd in (["check", root], ["export-fp32", root, out]):
            shutil.rmtree(out, ignore_errors=True)
            p = subprocess.run([ckpt] + cmd, capture_output=True)
            text = printable(p, f"mutated {name} ({kind}): ckpt {cmd[0]}")
            if p.returncode not in (0, 1):
                fail(f"mutated {name} ({kind}): ckpt {cmd[0]} exited {p.returncode}\n{text[-500:]}")
            if p.returncode == 1 and os.path.exists(out):
                fail(f"mutated {name} ({kind}): ckpt {cmd[0]} failed but wrote {out}")
            if cmd[0] == "export-fp32" and p.returncode == 0:
                got = {f: open(os.path.join(out, f), "rb").read() for f in os.listdir(out)}
                if got != truth:
                    fail(f"mutated {name} ({kind}): export-fp32 exited 0 with other bytes than "
                         f"the undamaged checkpoint's export")
            seen[(cmd[0], p.returncode)] = seen.get((cmd[0], p.returncode), 0) + 1
            if "the bytes give" in text:
                seen[f"crc by {cmd[0]}"] = seen.get(f"crc by {cmd[0]}", 0) + 1
    for need in (("check", 1), ("export-fp32", 0), ("export-fp32", 1), "crc by export-fp32") + (
            ("crc by check",) if blocks else ()):
        if not seen.get(need):
            fail(f"mutations never gave {need}: {seen}")
    shutil.rmtree(out, ignore_errors=True)
    shutil.rmtree(truth_out, ignore_errors=True)
    print(f"ok mutations: {count} damaged copies{f' of {blocks} large blocks' if blocks else ''}, "
          f"outcomes {sorted(seen.items(), key=str)}")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("ckpt")
    p.add_argument("work")
    p.add_argument("--quick", action="store_true", help="fewer fixtures (no reshard)")
    a = p.parse_args()
    os.makedirs(a.work, exist_ok=True)
    worlds = (1, 3) if a.quick else (1, 2, 3)
    for zero in (1, 2, 3):
        for world in worlds:
            for dtype in ("fp32", "bf16"):
                check_fixture(a.ckpt, a.work, zero, world, dtype, quick=a.quick)
    check_fixture(a.ckpt, a.work, 1, 2, "bf16", optimizer="bf16", quick=a.quick)
    check_next_update(a.ckpt, a.work, 2, 2, "bf16")
    check_next_update(a.ckpt, a.work, 3, 3, "fp32")
    for kind in ("truncate", "os_system", "eval", "short_storage", "partitions", "missing_rank",
                 "missing_model", "bad_name", "pickle_crc", "repeat_view", "deflate_claim", "huge_padding"):
        check_hostile(a.ckpt, a.work, kind)
    check_odd_version(a.ckpt, a.work)
    check_odd_names(a.ckpt, a.work)
    check_mutations(a.ckpt, a.work)
    check_mutations(a.ckpt, a.work, count=40, seed=20261205, blocks=2)
    print("check_deepspeed: all ok")


if __name__ == "__main__":
    main()
