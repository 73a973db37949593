"""ckpt.torch on a real 2-process gloo run of examples/torch/train.py, for both optimizer layouts:
the saved checkpoint passes a deep check and records the layout, a resumed run is bitwise equal
to the straight run, a wrong world size is refused with nothing changed, verify-resume --launch
reaches a bitwise verdict, and the fp32 export loads with load_state_dict(strict=True)."""
import json
import os
import sys
import unittest

import torch

import ckpt
import ckpt.torch
import util

sys.path.insert(0, os.path.dirname(util.TRAIN))
import train  # noqa: E402  (the example's model class)

SMALL = ["--steps", "4", "--save-every", "2", "--micro-batch", "2", "--grad-accum", "2"]


class TorchDistributed(unittest.TestCase):
    def run_layout(self, zero):
        root = util.tempdir(self)
        util.torchrun(2, "--zero", str(zero), "--ckpt-dir", root, *SMALL)
        straight = util.read_log(os.path.join(root, "trainlog.jsonl"))
        self.assertEqual([e["step"] for e in straight], [1, 2, 3, 4])
        self.assertEqual([t["tag"] for t in ckpt.ls(root)["tags"]], ["global_step2", "global_step4"])
        self.assertTrue(ckpt.check(root, deep=True)["ok"])
        # Resume from step 2 into another log: bitwise the straight run's steps 3 and 4.
        resumed_log = os.path.join(root, "resumed.jsonl")
        util.torchrun(2, "--resume", "--resume-tag", "global_step2", "--ckpt-dir", root,
                      "--steps", "4", "--save-every", "0", "--no-final-save",
                      "--trainlog", resumed_log)
        self.assertEqual(util.read_log(resumed_log), straight[2:])
        # A wrong world size is refused and changes nothing.
        before = util.tree_digest(root)
        p = util.torchrun(1, "--resume", "--ckpt-dir", root, "--steps", "6", check=False)
        self.assertEqual(p.returncode, 2, p.stderr)
        self.assertIn("saved by 2 ranks and this run has 1", p.stderr)
        self.assertEqual(util.tree_digest(root), before)
        return root

    def test_every_rank_loads_the_tag_rank_0_resolved(self):
        root, out = util.tempdir(self), util.tempdir(self)
        script = os.path.join(os.path.dirname(__file__), "load_agreed.py")
        util.run([util.TORCHRUN, "2", script, root, out], timeout=300)
        loaded = [json.load(open(os.path.join(out, f"rank{r}.json"))) for r in range(2)]
        # Rank 1 called load after global_step2 became the latest; it loads what rank 0 did.
        self.assertEqual(loaded, [{"tag": "global_step1", "step": 1}] * 2)
        self.assertEqual(ckpt.ls(root)["latest"], "global_step2")

    def test_ddp_adamw_replicated(self):
        root = self.run_layout(0)
        info = ckpt.inspect(root)
        self.assertEqual(info["partition"]["scheme"], "replicated")
        self.assertEqual(info["zero_stage"], 0)
        self.assertEqual(info["optimizer"]["type"], "adamw")
        self.assertGreater(info["partition"]["shard_numel"][0], 0)
        self.assertEqual(info["partition"]["shard_numel"][1], 0)
        # fp32 export -> the torch model, strict.
        out = os.path.join(util.tempdir(self), "export")
        util.run([util.CLI, "export-fp32", root, out])
        cfg = info["client_state"]["train_config"]
        model = train.TinyGPT(cfg["d_model"], cfg["layers"], cfg["heads"], cfg["context"],
                              cfg["dropout"])
        model.load_state_dict(ckpt.torch.load_export(out), strict=True)
        r = ckpt.Reader(root)
        self.assertTrue(torch.equal(model.blocks[0].fc1.weight.detach(),
                                    torch.from_numpy(r.read_param("blocks.0.fc1.weight"))))
        self.assertIs(model.head.weight, model.tok.weight)

    def test_zero_redundancy_optimizer_param_owner(self):
        root = self.run_layout(1)
        info = ckpt.inspect(root)
        self.assertEqual(info["partition"]["scheme"], "param_owner")
        self.assertEqual(info["zero_stage"], 1)
        self.assertEqual(info["format_version"], "1.3")
        self.assertEqual(info["optimizer"]["torch_class"], "ZeroRedundancyOptimizer")
        m = ckpt.Reader(root).manifest
        owners = {p["name"]: {r["rank"] for r in p["ranges"]} for p in m["params"] if p["ranges"]}
        self.assertTrue(all(len(o) == 1 for o in owners.values()))  # whole parameters
        self.assertEqual(set().union(*owners.values()), {0, 1})  # both ranks own some
        # verify-resume drives the trainer through the launch template.
        launch = (f"{util.TORCHRUN} {{world}} {util.TRAIN} --resume --ckpt-dir {{root}} "
                  "--resume-tag {tag} --steps {until} --trainlog {trainlog}")
        rep, rc = util.cli_json("verify-resume", root, "--tag", "global_step2", "--steps", "2",
                                "--launch", launch, "--ablate", "moments", check=False)
        self.assertEqual(rc, 0, rep)
        self.assertEqual(rep["verdict"], "bitwise")
        self.assertEqual(rep["steps_compared"], 2)
        self.assertEqual(rep["ranks"], 2)
        self.assertEqual(rep["max_weight_gap"], 0)  # against the original global_step4
        self.assertTrue(rep["ablations"][0]["matters"])
        # The same checkpoint without a template: refused with advice, exit 2.
        p = util.run([util.CLI, "verify-resume", root, "--steps", "1"], check=False)
        self.assertEqual(p.returncode, 2)
        self.assertIn("--launch", p.stderr)


if __name__ == "__main__":
    unittest.main()
