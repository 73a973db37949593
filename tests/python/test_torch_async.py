"""Async saves from Python: ckpt.AsyncSaver commits the state at the call (the arrays are
scribbled right after save() returns), a background failure is raised by the next wait() or
save() with the file named and the previous checkpoint kept, and examples/torch/train.py with
--async-save (ckpt.torch.save(async_=True), 2 gloo ranks) writes the same run log and the same
checkpoints as a run that saves synchronously (but for the unseeded global RNG states)."""
import json
import os
import re
import unittest

import numpy as np

import ckpt
import util

PARAMS = [{"name": "w", "shape": [64, 8]}]


def manifest(step):
    planned = ckpt.plan(PARAMS, 1, zero_stage=0)
    return {"tag": f"global_step{step}", "counters": {"global_step": step},
            "topology": {"dp_world_size": 1, "zero_stage": 0},
            "optimizer": {"type": "adamw", "lr": 1e-3, "step": step},
            "partition": planned["partition"], "params": planned["params"]}, \
        planned["partition"]["shard_numel"][0]


def datasets(state):
    return [ckpt.Dataset.tensor(k, state[k]) for k in ("master", "exp_avg", "exp_avg_sq")]


class AsyncSaverTest(unittest.TestCase):
    def test_commits_the_state_at_the_call(self):
        root = util.tempdir(self)
        saver = ckpt.AsyncSaver()
        for step in (1, 2, 3):
            m, n = manifest(step)
            state = {k: np.full(n, step + i, dtype=np.float32)
                     for i, k in enumerate(("master", "exp_avg", "exp_avg_sq"))}
            want = {k: v.copy() for k, v in state.items()}
            saver.save(root, m, datasets(state))
            for v in state.values():
                v[:] = -1.0  # the caller's next step overwrites its buffers at once
            saver.wait()
            r = ckpt.Reader(root)
            self.assertEqual(r.tag, f"global_step{step}")
            for k, v in want.items():
                self.assertTrue(np.array_equal(r.read_dataset(0, k), v), k)
        self.assertTrue(saver.done())

    def test_background_failure_is_raised_once_and_keeps_latest(self):
        root = util.tempdir(self)
        saver = ckpt.AsyncSaver()
        m, n = manifest(1)
        state = {k: np.ones(n, dtype=np.float32) for k in ("master", "exp_avg", "exp_avg_sq")}
        saver.save(root, m, datasets(state))
        saver.wait()
        # The same tag again: the background commit refuses it (AlreadyExists), naming it.
        saver.save(root, m, datasets(state))
        with self.assertRaises(ckpt.Error) as e:
            saver.wait()
        self.assertIn(os.path.join(root, "global_step1"), str(e.exception))
        saver.wait()  # reported once
        saver.save(root, m, datasets(state))
        m2, _ = manifest(2)
        with self.assertRaises(ckpt.Error) as e:
            saver.save(root, m2, datasets(state))  # reported by the next save, which starts nothing
        self.assertIn("previous async save", str(e.exception))
        saver.save(root, m2, datasets(state))
        saver.wait()
        self.assertEqual([t["tag"] for t in ckpt.ls(root)["tags"]], ["global_step1", "global_step2"])
        self.assertTrue(ckpt.check(root, deep=True)["ok"])


class TorchAsyncSave(unittest.TestCase):
    def test_same_run_log_and_checkpoints_as_synchronous_saves(self):
        base = util.tempdir(self)
        sync, asyn = os.path.join(base, "sync"), os.path.join(base, "async")
        args = ["--steps", "4", "--save-every", "1", "--micro-batch", "2", "--zero", "1"]
        util.torchrun(2, "--ckpt-dir", sync, *args)
        util.torchrun(2, "--ckpt-dir", asyn, "--async-save", *args)
        log = util.read_log(os.path.join(sync, "trainlog.jsonl"))
        self.assertEqual(len(log), 4)
        self.assertEqual(util.read_log(os.path.join(asyn, "trainlog.jsonl")), log)
        tags = [t["tag"] for t in ckpt.ls(asyn)["tags"]]
        self.assertEqual(tags, [f"global_step{s}" for s in (1, 2, 3, 4)])
        # Every dataset equal, except the global numpy and Python generator states: the example
        # trainer never seeds them (it draws nothing from them), so they differ between any two
        # runs, synchronous or not.
        unseeded = re.compile(r"^rank \d+ rng/(numpy|python): ")
        for tag in tags:
            p = util.run([util.CLI, "diff", "--json", os.path.join(sync, tag),
                          os.path.join(asyn, tag)], check=False)
            self.assertIn(p.returncode, (0, 1), p.stderr)
            what = [d["what"] for d in json.loads(p.stdout)["differences"]]
            self.assertEqual([w for w in what if not unseeded.match(w)], [], tag)
        self.assertTrue(ckpt.check(asyn, deep=True)["ok"])


if __name__ == "__main__":
    unittest.main()
