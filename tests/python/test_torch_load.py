"""ckpt.torch.load in one process, on checkpoints whose every checksum matches but whose torch
state does not parse (a generator state of the wrong size or not JSON, optimizer steps that are
not numbers, parameter groups or a scheduler state of the wrong shape): refused with ckpt.Error
naming the dataset, and nothing changed (model, optimizer, scheduler, generators). Until
2026-12-07 the generator states were parsed after the weights and moments were copied in, so
such a load failed with a bare Python error and a half-restored model; and a param group's
values were applied as they were (an `lr` of "fast" reached the optimizer, which failed at its
next step; a `params` key replaced the group's parameters, so the optimizer updated none). ckpt.torch.load_export
never reads a file its index points to outside the export's directory, and refuses a damaged
index or tied_weights with ckpt.CorruptionError (it read `../outside.safetensors` as a shard
and failed on a missing alias with KeyError until 2026-12-07)."""
import json
import os
import random
import unittest

import numpy as np
import torch

import ckpt
import ckpt.torch
import util


def make():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 2))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2)
    model(torch.randn(5, 4)).sum().backward()
    opt.step()
    sched.step()
    return model, opt, sched


def snapshot(model, opt, sched):
    return ({k: v.clone() for k, v in model.state_dict().items()},
            {id(p): {k: (v.clone() if torch.is_tensor(v) else v) for k, v in s.items()}
             for p, s in opt.state.items()},
            [dict(g, params=None) for g in opt.param_groups], sched.state_dict(),
            torch.get_rng_state().clone(), np.random.get_state()[1].copy(), random.getstate())


def same(a, b):
    wa, sa, ga, sca, ta, na, pa = a
    wb, sb, gb, scb, tb, nb, pb = b
    return (all(torch.equal(wa[k], wb[k]) for k in wa) and sa.keys() == sb.keys() and
            all(torch.equal(v, sb[p][k]) if torch.is_tensor(v) else v == sb[p][k]
                for p, s in sa.items() for k, v in s.items()) and
            ga == gb and sca == scb and torch.equal(ta, tb) and np.array_equal(na, nb) and pa == pb)


class LoadRefusals(unittest.TestCase):
    def save_with(self, root, name, value):
        """A checkpoint of make()'s state whose dataset `name` holds `value` instead, written
        by the library (so its checksums match what it holds)."""
        model, opt, sched = make()
        real = ckpt.save_shard

        def patched(root_, manifest, datasets, *args, **kw):
            hit = [d for d in datasets if d.name == name]
            self.assertEqual(len(hit), 1, name)
            d = hit[0]
            d.value = value if d.kind == "blob" else ckpt.Dataset.json(name, value).value
            return real(root_, manifest, datasets, *args, **kw)

        ckpt.save_shard = patched
        try:
            ckpt.torch.save(root, 1, model, opt, scheduler=sched)
        finally:
            ckpt.save_shard = real

    def test_unparsable_torch_state_refused_before_anything_changes(self):
        cases = [
            ("rng/torch_cpu", b"\x01\x02\x03"),
            ("rng/numpy", b"{not json"),
            ("rng/numpy", b'{"kind": "MT19937", "keys": [1, 2], "pos": 0, "has_gauss": 0, '
                          b'"cached_gaussian": 0.0}'),
            ("rng/python", b'{"version": 3, "state": [1, 2], "gauss_next": null}'),
            ("torch/optimizer_steps", {"0.weight": "many"}),
            ("torch/param_groups", {"lr": 1}),
            ("torch/param_groups", [{"lr": "fast"}]),
            ("torch/param_groups", [{"lr": 1e-3, "params": []}]),
            ("torch/param_groups", [{"betas": [0.9]}]),
            ("torch/param_groups", [{"weight_decay": True}]),
            ("torch/param_groups", [{"maximize": "yes"}]),
            ("scheduler", {"torch": [1, 2], "next_lr": 0.1}),
        ]
        for name, value in cases:
            with self.subTest(name=name, value=value):
                root = util.tempdir(self)
                self.save_with(root, name, value)
                self.assertEqual(ckpt.check(root, deep=True)["ok"], True)  # every checksum holds
                torch.manual_seed(7)  # a model, optimizer and generators unlike the saved ones
                model, opt, sched = make()
                with torch.no_grad():
                    for p in model.parameters():
                        p.add_(1.0)
                np.random.seed(3)
                random.seed(4)
                before = snapshot(model, opt, sched)
                with self.assertRaises(ckpt.Error) as caught:
                    ckpt.torch.load(root, model, opt, scheduler=sched)
                self.assertIn(name, str(caught.exception))
                self.assertIn("nothing was changed", str(caught.exception))
                self.assertTrue(same(before, snapshot(model, opt, sched)), name)

    def test_a_good_checkpoint_still_loads_every_state(self):
        root = util.tempdir(self)
        model, opt, sched = make()
        np.random.seed(5)
        random.seed(6)
        saved = snapshot(model, opt, sched)
        ckpt.torch.save(root, 1, model, opt, scheduler=sched)
        torch.manual_seed(7)
        model2, opt2, sched2 = make()
        np.random.seed(8)
        random.seed(9)
        ckpt.torch.load(root, model2, opt2, scheduler=sched2)
        got = snapshot(model2, opt2, sched2)
        self.assertTrue(all(torch.equal(saved[0][k], got[0][k]) for k in saved[0]))
        self.assertEqual(saved[3], got[3])
        self.assertTrue(torch.equal(saved[4], got[4]))
        self.assertTrue(np.array_equal(saved[5], got[5]))
        self.assertEqual(saved[6], got[6])



class LoadExport(unittest.TestCase):
    def export_dir(self, weight_map, tied=None):
        root = util.tempdir(self)
        d = os.path.join(root, "export")
        os.makedirs(d)
        shard = "model-00001-of-00001.safetensors"
        meta = {"tied_weights": json.dumps(tied)} if tied is not None else {}
        ckpt.write_safetensors(os.path.join(d, shard), {"w": np.arange(6, dtype=np.float32)}, meta)
        ckpt.write_safetensors(os.path.join(root, "outside.safetensors"),
                               {"secret": np.ones(3, dtype=np.float32)})
        with open(os.path.join(d, "model.safetensors.index.json"), "w") as f:
            json.dump({"metadata": {}, "weight_map": weight_map}, f)
        return d

    def test_a_good_export_with_an_alias(self):
        d = self.export_dir({"w": "model-00001-of-00001.safetensors"}, tied={"v": "w"})
        state = ckpt.torch.load_export(d)
        self.assertEqual(sorted(state), ["v", "w"])
        self.assertTrue(torch.equal(state["v"], torch.arange(6, dtype=torch.float32)))

    def test_nothing_outside_the_directory_and_damage_refused(self):
        shard = "model-00001-of-00001.safetensors"
        for weight_map, tied, says in [
                ({"w": shard, "secret": "../outside.safetensors"}, None, "not a shard"),
                ({"w": shard, "secret": os.path.abspath("/tmp/x.safetensors")}, None,
                 "not a shard"),
                ({"w": shard}, {"v": "missing"}, "does not hold"),
                ({"w": shard}, ["v"], "not a map of aliases"),
                ([shard], None, "not a safetensors index")]:
            with self.subTest(weight_map=weight_map, tied=tied):
                d = self.export_dir(weight_map, tied)
                with self.assertRaises(ckpt.CorruptionError) as caught:
                    ckpt.torch.load_export(d)
                self.assertIn(says, str(caught.exception))


if __name__ == "__main__":
    unittest.main()
