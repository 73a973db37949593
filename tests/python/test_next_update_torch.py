"""`ckpt next-update --grad` on a checkpoint written by ckpt.torch.save: its full-state path
equals the weights torch.optim.AdamW computes from the same state and gradient, within 1e-6
relative (and mostly bitwise: the arithmetic differs only in how m is updated)."""
import os
import unittest

import numpy as np
import torch

import ckpt
import ckpt.torch
import util


class NextUpdateVsTorch(unittest.TestCase):
    def test_full_state_path_matches_torch_adamw(self):
        root = util.tempdir(self)
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(),
                                    torch.nn.Linear(32, 8))
        opt = torch.optim.AdamW(model.parameters(), lr=3e-3, betas=(0.9, 0.95), eps=1e-8,
                                weight_decay=0.1)
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 / (1 + s))
        for _ in range(3):
            opt.zero_grad()
            model(torch.randn(4, 16)).pow(2).mean().backward()
            opt.step()
            sched.step()
        ckpt.torch.save(root, 3, model, opt, scheduler=sched)
        # The next gradient, and what torch does with it.
        opt.zero_grad()
        model(torch.randn(4, 16)).pow(2).mean().backward()
        names = [n for n, _ in ckpt.torch.trainable_parameters(model)]
        grads = {n: p.grad.detach().clone() for n, p in ckpt.torch.trainable_parameters(model)}
        grad_path = os.path.join(root, "grad.safetensors")
        ckpt.write_safetensors(grad_path, grads)
        opt.step()
        expect = {n: p.detach().numpy().copy() for n, p in ckpt.torch.trainable_parameters(model)}

        out = os.path.join(util.tempdir(self), "out")
        rep, rc = util.cli_json("next-update", root, "--grad", grad_path, "--out", out,
                                "--device", "cpu")
        self.assertEqual(rc, 0, rep)
        self.assertEqual(rep["hyper"]["step"], 3)
        self.assertEqual(rep["hyper"]["lr"], opt.param_groups[0]["lr"])  # 3e-3 / 4
        got = ckpt.read_safetensors(os.path.join(out, "full_state.safetensors"))
        self.assertEqual(sorted(got), sorted(names))
        total, same, worst = 0, 0, 0.0
        for n in names:
            a, b = got[n].astype(np.float64), expect[n].astype(np.float64)
            total += a.size
            same += int(np.sum(got[n] == expect[n]))
            worst = max(worst, float(np.max(np.abs(a - b) / np.maximum(np.abs(b), 1e-3))))
        print(f"next-update vs torch AdamW: {same}/{total} bitwise, max rel {worst:.3g}")
        self.assertLessEqual(worst, 1e-6)
        self.assertGreater(same, total // 2)
        # And it is the update, not a copy of the old weights: those are farther away.
        before = ckpt.Reader(root).read_param(names[0])
        self.assertGreater(np.max(np.abs(before - expect[names[0]])), 1e-5)


if __name__ == "__main__":
    unittest.main()
