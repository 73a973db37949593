#!/usr/bin/env python3
"""Independent check of `ckpt export-fp32` and `ckpt to-universal`.

Rebuilds every tensor of a sharded checkpoint from its rank files with h5py, following
docs/format.md (manifest params[].ranges -> rank file /master hyperslabs; frozen parameters in
/frozen/<name>), and compares it bitwise with the export, read by the minimal safetensors reader
below, and optionally with a universal checkpoint read by h5py following docs/convert.md.

usage: check_export.py TAG_DIR EXPORT_DIR [--dtype fp32|bf16|fp16] [--universal DIR]
                       [--tied copy|metadata]
exit 0 when everything matches, 1 with a message on the first difference.
"""
import argparse
import json
import os
import struct
import sys

import h5py
import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "ckpt"))
from h5py_crosscheck import read_by_chunks  # noqa: E402

ST_DTYPES = {"F32": np.float32, "F16": np.float16, "BF16": np.uint16, "F64": np.float64,
             "I64": np.int64, "I32": np.int32, "U8": np.uint8, "U16": np.uint16}


def fail(msg):
    print("check_export: " + msg, file=sys.stderr)
    sys.exit(1)


def read_safetensors(path):
    """Minimal safetensors reader: returns (metadata, {name: (dtype_tag, ndarray)})."""
    with open(path, "rb") as f:
        data = f.read()
    if len(data) < 8:
        fail(path + ": too short")
    (n,) = struct.unpack("<Q", data[:8])
    if (8 + n) % 8 != 0:
        fail(path + ": data section not 8-byte aligned")
    header = json.loads(data[8:8 + n].decode("utf-8"))
    meta = header.pop("__metadata__", {})
    if not all(isinstance(v, str) for v in meta.values()):
        fail(path + ": a __metadata__ value is not a string (other safetensors readers refuse it)")
    check_integrity_record(path, data[:8 + n], meta, header)
    base = 8 + n
    spans = sorted((v["data_offsets"][0], v["data_offsets"][1], k) for k, v in header.items())
    cursor = 0
    for b, e, k in spans:
        if b != cursor:
            fail("%s: tensor %s starts at %d, expected %d" % (path, k, b, cursor))
        cursor = e
    if base + cursor != len(data):
        fail(path + ": data section length mismatch")
    tensors = {}
    for k, v in header.items():
        b, e = v["data_offsets"]
        dt = np.dtype(ST_DTYPES[v["dtype"]])
        count = int(np.prod(v["shape"], dtype=np.int64))
        if count * dt.itemsize != e - b:
            fail("%s: %s dtype x shape != byte length" % (path, k))
        arr = np.frombuffer(data, dtype=dt, count=count, offset=base + b).reshape(v["shape"])
        tensors[k] = (v["dtype"], arr)
    return meta, tensors


def is_digest(text):
    return len(text) == 16 and all(c in "0123456789abcdef" for c in text)


def check_integrity_record(path, head, meta, header):
    """ckpt's integrity record (docs/convert.md): layout only; Debian's python has no xxhash,
    the digests themselves are checked by the C++ tests against libxxhash."""
    digests = meta.get("ckpt_tensor_xxh3")
    whole = meta.get("ckpt_header_xxh3")
    if digests is None or whole is None:
        fail(path + ": export without ckpt_tensor_xxh3 / ckpt_header_xxh3")
    listed = digests.split(" ") if digests else []
    if len(listed) != len(header) or not all(is_digest(d) for d in listed):
        fail(path + ": ckpt_tensor_xxh3 does not hold one digest per tensor")
    needle = ('"ckpt_header_xxh3":"' + whole + '"').encode()
    if not is_digest(whole) or head.count(needle) != 1:
        fail(path + ": ckpt_header_xxh3 is not stored once in the documented layout")


def bf16_bits_to_f32(bits):
    return (bits.astype(np.uint32) << 16).view(np.float32)


def f32_to_bf16_bits(x):
    """Round to nearest even, NaN stays a quiet NaN (as torch does)."""
    b = x.astype(np.float32).view(np.uint32).astype(np.uint64)
    out = ((b + 0x7FFF + ((b >> 16) & 1)) >> 16).astype(np.uint16)
    nan = np.isnan(x)
    out[nan] = ((b[nan] >> 16) | 0x40).astype(np.uint16)
    return out


def read_all(ds):
    """A dataset's values: compressed ones chunk by chunk with python zstandard (Debian's HDF5
    has no zstd filter to read them with)."""
    if ds.id.get_create_plist().get_nfilters() == 0:
        return ds[()]
    return read_by_chunks(ds)


def reconstruct(tag_dir):
    """{name: (ckpt dtype, ndarray as stored)} and the manifest, from the rank files only."""
    m = json.load(open(os.path.join(tag_dir, "manifest.json")))
    files = {f["rank"]: h5py.File(os.path.join(tag_dir, f["path"]), "r") for f in m["files"]}
    out = {}
    states = {}
    whole = {}  # (rank, dataset) -> its values, read once

    def data(rank, key):
        if (rank, key) not in whole:
            whole[(rank, key)] = read_all(files[rank][key])
        return whole[(rank, key)]

    for p in m["params"]:
        if p["tied_to"]:
            continue
        if p["frozen"]:
            key = "frozen/" + p["name"]
            holders = [r for r, f in files.items() if key in f]
            if len(holders) != 1:
                fail("frozen %s held by %d rank files" % (p["name"], len(holders)))
            out[p["name"]] = (p["dtype"], np.asarray(data(holders[0], key)).reshape(p["shape"]))
            continue
        full = {}
        for state in ("master", "exp_avg", "exp_avg_sq"):
            flat = np.full(p["numel"], np.nan, np.float32)
            covered = 0
            for r in p["ranges"]:
                n = r["end"] - r["begin"]
                flat[r["begin"]:r["end"]] = data(r["rank"], state)[r["shard_offset"]:r["shard_offset"] + n]
                covered += n
            if covered != p["numel"]:
                fail("%s: ranges cover %d of %d elements" % (p["name"], covered, p["numel"]))
            full[state] = flat.reshape(p["shape"])
        out[p["name"]] = ("fp32", full["master"])
        states[p["name"]] = full
    return m, out, states


def expected_export(dtype_name, stored_dtype, arr):
    """The bytes export-fp32 must write for a tensor stored as (stored_dtype, arr)."""
    if stored_dtype == "bf16":
        as_f32 = bf16_bits_to_f32(arr)
    elif stored_dtype == "fp16":
        as_f32 = arr.view(np.float16).astype(np.float32) if arr.dtype == np.uint16 else arr.astype(np.float32)
    elif stored_dtype in ("fp32", "fp64"):
        as_f32 = arr.astype(np.float32)
    else:
        return ST_TAG_OF_INT[stored_dtype], arr
    if dtype_name == "fp32":
        return "F32", as_f32
    if dtype_name == "bf16":
        return "BF16", f32_to_bf16_bits(as_f32)
    return "F16", as_f32.astype(np.float16)


ST_TAG_OF_INT = {"int64": "I64", "int32": "I32", "uint8": "U8", "uint16": "U16"}


def load_export(export_dir):
    single = os.path.join(export_dir, "model.safetensors")
    index_path = os.path.join(export_dir, "model.safetensors.index.json")
    tensors, metas = {}, []
    if os.path.exists(single):
        if os.path.exists(index_path):
            fail("both model.safetensors and an index")
        meta, t = read_safetensors(single)
        return meta, t, None
    index = json.load(open(index_path))
    files = sorted(set(index["weight_map"].values()))
    nfiles = len(files)
    for k, name in enumerate(files):
        want = "model-%05d-of-%05d.safetensors" % (k + 1, nfiles)
        if name != want:
            fail("shard %s is not named %s" % (name, want))
        meta, t = read_safetensors(os.path.join(export_dir, name))
        metas.append(meta)
        for tname, v in t.items():
            if index["weight_map"].get(tname) != name:
                fail("index maps %s elsewhere than %s" % (tname, name))
            tensors[tname] = v
    total = sum(v[1].nbytes for v in tensors.values())
    if index["metadata"]["total_size"] != total:
        fail("index total_size %d != %d" % (index["metadata"]["total_size"], total))
    if len(index["weight_map"]) != len(tensors):
        fail("index lists tensors that are in no shard")
    return metas[0], tensors, index


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("tag_dir")
    ap.add_argument("export_dir")
    ap.add_argument("--dtype", default="fp32")
    ap.add_argument("--exclude-frozen", action="store_true")
    ap.add_argument("--universal")
    ap.add_argument("--tied", default="metadata", choices=["copy", "metadata"])
    args = ap.parse_args()

    m, recon, states = reconstruct(args.tag_dir)
    meta, exported, _ = load_export(args.export_dir)
    if meta.get("format") != "pt":
        fail("__metadata__ format is not 'pt'")
    aliases = {p["name"]: p["tied_to"] for p in m["params"] if p["tied_to"]}
    frozen = {p["name"] for p in m["params"] if p["frozen"]}
    want_names = {n for n in recon if not (args.exclude_frozen and n in frozen)}
    want_aliases = {a: o for a, o in aliases.items() if not (args.exclude_frozen and o in frozen)}
    if args.tied == "copy":  # each alias a tensor of its own, holding its owner's values
        export_recon = dict(recon)
        for a, o in want_aliases.items():
            export_recon[a] = recon[o]
        want_names |= set(want_aliases)
        recon = export_recon
    if set(exported) != want_names:
        fail("exported names %s != expected %s" % (sorted(exported), sorted(want_names)))
    got_aliases = json.loads(meta.get("tied_weights", "{}"))
    if got_aliases != want_aliases:
        fail("tied_weights %s != %s" % (got_aliases, want_aliases))
    for name in sorted(want_names):
        stored_dtype, arr = recon[name]
        tag, want = expected_export(args.dtype, stored_dtype, arr)
        got_tag, got = exported[name]
        if got_tag != tag:
            fail("%s: dtype %s, expected %s" % (name, got_tag, tag))
        if list(got.shape) != list(want.shape):
            fail("%s: shape %s, expected %s" % (name, got.shape, want.shape))
        if got.tobytes() != np.ascontiguousarray(want).tobytes():
            fail("%s: values differ" % name)
    print("export: %d tensors bitwise equal to the reconstruction (%s)" % (len(want_names), args.dtype))

    if args.universal:
        man = json.load(open(os.path.join(args.universal, "manifest.json")))
        if man["kind"] != "universal":
            fail("universal manifest kind is %s" % man["kind"])
        f = h5py.File(os.path.join(args.universal, "universal.h5"), "r")
        if f.attrs["format"] not in ("ckpt-universal", b"ckpt-universal"):
            fail("universal.h5 format attribute")
        count = 0
        for name, (stored_dtype, arr) in recon.items():
            if name in aliases:
                continue  # the export's copy; the universal file stores the owner only
            g = f["params/" + name.replace("%", "%25").replace("/", "%2F")]
            if name in states:
                for state in ("master", "exp_avg", "exp_avg_sq"):
                    ds = g[state]
                    if list(ds.shape) != list(states[name][state].shape):
                        fail("universal %s/%s shape %s" % (name, state, ds.shape))
                    if read_all(ds).astype(np.float32).tobytes() != states[name][state].tobytes():
                        fail("universal %s/%s values differ" % (name, state))
                    count += 1
            else:
                if read_all(g["master"]).tobytes() != arr.tobytes():
                    fail("universal frozen %s differs" % name)
                count += 1
        for alias in aliases:
            if ("params/" + alias) in f:
                fail("alias %s stored in universal" % alias)
        print("universal: %d datasets bitwise equal to the reconstruction" % count)


if __name__ == "__main__":
    main()
