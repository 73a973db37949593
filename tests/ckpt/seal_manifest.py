#!/usr/bin/python3
"""Seals a ckpt manifest with Python's json module alone (issue 18, defect 7).

docs/format.md, format 1.1: manifest_xxh3 is the XXH3-64 of the manifest file's bytes with the
value's 16 characters written as '0'. This re-writes TAG_DIR/manifest.json the way an
independent writer would: json.dumps (Python's own number formatting: 1e15 is written
1000000000000000.0, which nlohmann::json would write as 1e+15), a placeholder, the hash of the
bytes, the digest in place. XXH3-64 comes from the reference C library (libxxhash) via ctypes:
Debian's python has no xxhash module.

usage: seal_manifest.py TAG_DIR [--indent N]
"""
import argparse
import ctypes
import ctypes.util
import json
import os

PLACEHOLDER = "0" * 16


def xxh3_64(data):
    lib = ctypes.CDLL(ctypes.util.find_library("xxhash") or "libxxhash.so.0")
    lib.XXH3_64bits.restype = ctypes.c_uint64
    lib.XXH3_64bits.argtypes = [ctypes.c_char_p, ctypes.c_size_t]
    return lib.XXH3_64bits(data, len(data))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("tag_dir")
    ap.add_argument("--indent", type=int, default=4)
    args = ap.parse_args()
    path = os.path.join(args.tag_dir, "manifest.json")
    m = json.load(open(path))
    m["format_version"] = "1.1"
    m["client_state"]["python_float"] = 1e15
    m["manifest_xxh3"] = PLACEHOLDER
    text = json.dumps(m, indent=args.indent).encode() + b"\n"
    key = b'"manifest_xxh3": "' + PLACEHOLDER.encode() + b'"'
    assert text.count(key) == 1
    digest = "%016x" % xxh3_64(text)
    text = text.replace(key, b'"manifest_xxh3": "' + digest.encode() + b'"')
    assert b"1000000000000000.0" in text
    with open(path, "wb") as f:
        f.write(text)
    print("sealed %s: manifest_xxh3 %s" % (path, digest))


if __name__ == "__main__":
    main()
