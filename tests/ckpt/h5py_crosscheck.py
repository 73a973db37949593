"""Reads a ckpt tag with h5py following docs/format.md alone and compares every dataset with
the bytes ckpt's reader returned (files in EXPECT_DIR named <rank>__<dataset, '/'->'@'>), and
every file's metadata seal (data_extents, metadata_xxh3) with h5py's own view of its storage.

Compressed chunks are read twice: through HDF5's filter pipeline (the ckpt_h5zstd plugin on
HDF5_PLUGIN_PATH) and independently with h5py's read_direct_chunk + python zstandard, undoing
the HDF5 byte shuffle in numpy.
"""
import ctypes
import ctypes.util
import functools
import json
import os
import sys

import h5py
import numpy as np
import zstandard

DTYPES = {"fp32": "<f4", "fp64": "<f8", "bf16": "<u2", "fp16": "<u2", "int64": "<i8",
          "int32": "<i4", "uint8": "u1", "uint16": "<u2"}


def unshuffle(raw, elem):
    n = len(raw) // elem
    body = np.frombuffer(raw[: n * elem], dtype=np.uint8).reshape(elem, n).T.copy()
    return body.tobytes() + raw[n * elem:]


def read_by_chunks(ds):
    """Reassembles a chunked 1-D or N-D dataset from raw chunks without HDF5 filters."""
    filters = ds.id.get_create_plist()
    ids = [filters.get_filter(i)[0] for i in range(filters.get_nfilters())]
    elem = ds.dtype.itemsize
    out = np.zeros(ds.shape, dtype=ds.dtype)
    rows = ds.chunks[0]
    for start in range(0, ds.shape[0], rows):
        offset = (start,) + (0,) * (len(ds.shape) - 1)
        mask, raw = ds.id.read_direct_chunk(offset)
        if 32015 in ids and not mask & (1 << ids.index(32015)):
            raw = zstandard.ZstdDecompressor().decompress(raw)
        if 2 in ids and not mask & (1 << ids.index(2)):
            raw = unshuffle(raw, elem)
        chunk = np.frombuffer(raw, dtype=ds.dtype).reshape((rows,) + ds.shape[1:])
        stop = min(start + rows, ds.shape[0])
        out[start:stop] = chunk[: stop - start]
    return out


@functools.lru_cache(maxsize=None)
def xxhash_lib():
    """The reference C library (Debian's python has no xxhash module), looked up once:
    find_library runs ldconfig, and a manifest may list a digest for every 8 bytes."""
    lib = ctypes.CDLL(ctypes.util.find_library("xxhash") or "libxxhash.so.0")
    lib.XXH3_64bits.restype = ctypes.c_uint64
    lib.XXH3_64bits.argtypes = [ctypes.c_char_p, ctypes.c_size_t]
    return lib


def xxh3_hex(data):
    """XXH3-64 of `data` as the manifest writes it."""
    return "%016x" % xxhash_lib().XXH3_64bits(data, len(data))


def data_extents(h):
    """The file's raw-data regions as docs/format.md defines the seal's: every contiguous
    dataset's storage and every stored chunk, sorted, adjacent or overlapping ones merged."""
    found = []

    def visit(_name, obj):
        if not isinstance(obj, h5py.Dataset):
            return
        if obj.chunks is None:
            offset, size = obj.id.get_offset(), obj.id.get_storage_size()
            if offset is not None and size > 0:
                found.append((offset, size))
        else:
            for i in range(obj.id.get_num_chunks()):
                info = obj.id.get_chunk_info(i)
                if info.byte_offset is not None and info.size > 0:
                    found.append((info.byte_offset, info.size))

    h.visititems(visit)
    merged = []
    for offset, size in sorted(found):
        if merged and offset <= merged[-1][0] + merged[-1][1]:
            last = merged[-1]
            merged[-1] = [last[0], max(last[0] + last[1], offset + size) - last[0]]
        else:
            merged.append([offset, size])
    return merged


def main(tag_dir, expect_dir):
    manifest = json.load(open(os.path.join(tag_dir, "manifest.json")))
    assert manifest["format"] == "ckpt", manifest["format"]
    assert manifest["format_version"].split(".")[0] == "1"
    checked = 0
    pieced = manifest["format_version"] < "1.3"
    for f in manifest["files"]:
        path = os.path.join(tag_dir, f["path"])
        h = h5py.File(path, "r")
        assert h.attrs["rank"] == f["rank"]
        # The metadata seal: the extents the writer recorded are the file's raw data, and the
        # digest covers every other byte.
        extents = data_extents(h)
        assert extents and extents == f["data_extents"], (f["path"], extents, f["data_extents"])
        raw = open(path, "rb").read()
        assert len(raw) == f["bytes"]
        outside, pos = bytearray(), 0
        for offset, size in extents:
            outside += raw[pos:offset]
            pos = offset + size
        outside += raw[pos:]
        assert xxh3_hex(bytes(outside)) == f["metadata_xxh3"], "metadata seal: " + f["path"]
        for d in f["datasets"]:
            ds = h[d["name"]]
            assert list(ds.shape) == d["shape"], (d["name"], ds.shape, d["shape"])
            assert ds.attrs["dtype"].decode() == d["dtype"]
            want = np.dtype(DTYPES[d["dtype"]])
            data = ds[()] if ds.shape != () else np.array(ds[()], dtype=want)
            got = np.ascontiguousarray(data).astype(want, copy=False).tobytes()
            name = "%d__%s" % (f["rank"], d["name"].replace("/", "@"))
            expect = open(os.path.join(expect_dir, name), "rb").read()
            assert got == expect, "filter pipeline read differs: " + d["name"]
            assert xxh3_hex(got) == d["xxh3"], "dataset digest: " + d["name"]
            if "piece_bytes" in d:  # format 1.3: the digest of every piece of the logical bytes
                pb = d["piece_bytes"]
                pieces = [xxh3_hex(got[k:k + pb]) for k in range(0, len(got), pb)]
                assert pieces == d["piece_xxh3"], "piece digests: " + d["name"]
                pieced = True
            if ds.chunks is not None and ds.size > 0:
                raw = read_by_chunks(ds).tobytes()
                assert raw == expect, "raw chunk read differs: " + d["name"]
            checked += 1
    # Rebuild every trainable parameter from the partition table alone.
    files = {f["rank"]: h5py.File(os.path.join(tag_dir, f["path"]), "r") for f in manifest["files"]}
    for p in manifest["params"]:
        if p["frozen"] or p["tied_to"] is not None:
            continue
        full = np.empty(p["numel"], dtype="<f4")
        for r in p["ranges"]:
            n = r["end"] - r["begin"]
            full[r["begin"]:r["end"]] = files[r["rank"]]["master"][r["shard_offset"]:r["shard_offset"] + n]
        assert np.isfinite(full).all()
    assert pieced, "a 1.3 manifest records piece digests"
    print("h5py cross-check: %d datasets identical, %d seals" % (checked, len(manifest["files"])))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
