#!/usr/bin/python3
"""A strict torch load of an `export-fp32` output (issue 18, defect 4).

Builds a torch module with the checkpoint's parameter table (every name and shape; a tied
alias is registered as its owner's Parameter object, as a model with tied embeddings is),
loads the export with load_state_dict(strict=True) and checks every loaded value bitwise
against the export. Reads the export with check_export.py's independent safetensors reader.

usage: strict_load.py TAG_DIR EXPORT_DIR [--expect-missing NAME]
  --expect-missing NAME  the strict load must fail, naming NAME as a missing key
exit 0 as expected, 1 with a message otherwise.
"""
import argparse
import json
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from check_export import load_export  # noqa: E402


def build_model(params):
    root = torch.nn.Module()

    def module_of(path):
        m = root
        for part in path:
            if not hasattr(m, part):
                m.add_module(part, torch.nn.Module())
            m = getattr(m, part)
        return m

    owners = {}
    for p in params:
        if p["tied_to"]:
            continue
        *path, leaf = p["name"].split(".")
        param = torch.nn.Parameter(torch.zeros(p["shape"], dtype=torch.float32))
        module_of(path).register_parameter(leaf, param)
        owners[p["name"]] = param
    for p in params:
        if p["tied_to"]:
            *path, leaf = p["name"].split(".")
            module_of(path).register_parameter(leaf, owners[p["tied_to"]])
    return root


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("tag_dir")
    ap.add_argument("export_dir")
    ap.add_argument("--expect-missing")
    args = ap.parse_args()
    m = json.load(open(os.path.join(args.tag_dir, "manifest.json")))
    model = build_model(m["params"])
    _, exported, _ = load_export(args.export_dir)
    state = {}
    for name, (tag, arr) in exported.items():
        if tag != "F32":
            print("strict_load: %s is %s; run on an fp32 export" % (name, tag), file=sys.stderr)
            return 1
        state[name] = torch.from_numpy(np.array(arr))
    try:
        model.load_state_dict(state, strict=True)
    except RuntimeError as e:
        if args.expect_missing and "Missing key(s)" in str(e) and args.expect_missing in str(e):
            print("strict load fails as expected: missing %s" % args.expect_missing)
            return 0
        print("strict_load: load_state_dict(strict=True) failed: %s" % e, file=sys.stderr)
        return 1
    if args.expect_missing:
        print("strict_load: the strict load succeeded, expected %s missing" % args.expect_missing,
              file=sys.stderr)
        return 1
    for name, tensor in model.state_dict().items():
        if tensor.numpy().tobytes() != state[name].numpy().tobytes():
            print("strict_load: %s differs after the load" % name, file=sys.stderr)
            return 1
    print("strict load: %d keys, values bitwise equal to the export" % len(model.state_dict()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
