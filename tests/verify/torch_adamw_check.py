#!/usr/bin/python3
"""Cross-checks `ckpt next-update --out` against torch.optim.AdamW and an fp64 AdamW.

usage: torch_adamw_check.py STATE_DIR RESULT_DIR LR BETA1 BETA2 EPS WEIGHT_DECAY STEP
STATE_DIR holds w/m/v/g.safetensors (full tensors by parameter name, the checkpoint's state and
the gradient); RESULT_DIR holds next-update's full_state / weights_only / moments_dropped
.safetensors. STEP is the number of updates already applied. Exit 0 when every tensor of every
path is within 1e-6 relative of both references, 1 otherwise; prints the worst errors.
"""
import json
import struct
import sys

import numpy as np
import torch


def read_safetensors(path):
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        assert info["dtype"] == "F32", (path, name, info["dtype"])
        b, e = info["data_offsets"]
        out[name] = np.frombuffer(data[b:e], dtype="<f4").reshape(info["shape"]).copy()
    return out


def torch_adamw(w, m, v, g, lr, betas, eps, wd, step):
    """One torch.optim.AdamW step from the given state (m, v None: a fresh optimizer)."""
    p = torch.nn.Parameter(torch.from_numpy(w.copy()))
    opt = torch.optim.AdamW([p], lr=lr, betas=betas, eps=eps, weight_decay=wd, foreach=False)
    p.grad = torch.from_numpy(g.copy())
    if m is not None:
        opt.state[p] = {
            "step": torch.tensor(float(step)),
            "exp_avg": torch.from_numpy(m.copy()),
            "exp_avg_sq": torch.from_numpy(v.copy()),
        }
    opt.step()
    return p.detach().numpy().astype(np.float64)


def fp64_adamw(w, m, v, g, lr, b1, b2, eps, wd, step):
    w, m, v, g = (x.astype(np.float64) for x in (w, m, v, g))
    t = step + 1
    w = w * (1 - lr * wd)
    m = b1 * m + (1 - b1) * g
    v = b2 * v + (1 - b2) * g * g
    denom = np.sqrt(v) / np.sqrt(1 - b2**t) + eps
    return w - lr / (1 - b1**t) * m / denom


def main():
    state_dir, result_dir = sys.argv[1], sys.argv[2]
    lr, b1, b2, eps, wd = (float(x) for x in sys.argv[3:8])
    step = int(sys.argv[8])
    w, m, v, g = (read_safetensors(f"{state_dir}/{k}.safetensors") for k in "wmvg")
    results = {k: read_safetensors(f"{result_dir}/{k}.safetensors")
               for k in ("full_state", "weights_only", "moments_dropped")}
    worst = {}
    ok = True
    for name in w:
        zeros = np.zeros_like(m[name])
        cases = {
            "full_state": (m[name], v[name], step, m[name], v[name]),
            "weights_only": (None, None, 0, zeros, zeros),
            "moments_dropped": (zeros, zeros, step, zeros, zeros),
        }
        for path, (tm, tv, tstep, fm, fv) in cases.items():
            got = results[path][name].astype(np.float64)
            ref_t = torch_adamw(w[name], tm, tv, g[name], lr, (b1, b2), eps, wd, tstep)
            ref_d = fp64_adamw(w[name], fm, fv, g[name], lr, b1, b2, eps, wd, tstep)
            scale = np.maximum(np.maximum(np.abs(ref_d), np.abs(w[name].astype(np.float64))), 1e-3)
            for ref_name, ref in (("torch", ref_t), ("fp64", ref_d)):
                err = float(np.max(np.abs(got - ref) / scale))
                key = f"{path} vs {ref_name}"
                worst[key] = max(worst.get(key, 0.0), err)
                if not err <= 1e-6:
                    ok = False
                    print(f"FAIL {name} {key}: relative error {err:.3g}", file=sys.stderr)
    # The paths must really differ from the full state (a weights-only restore is not free).
    gap = max(float(np.max(np.abs(results["weights_only"][n] - results["full_state"][n])))
              for n in w)
    print(json.dumps({"worst_relative_error": worst, "weights_only_max_gap": gap,
                      "torch": torch.__version__}))
    if not gap > 0:
        ok = False
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
