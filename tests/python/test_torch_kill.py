"""A save killed mid-way (SIGKILL of one rank) leaves the previous checkpoint as latest, intact
and loadable; the surviving rank gets an error, not a hang or a crash."""
import os
import unittest

import ckpt
import util


class KilledSave(unittest.TestCase):
    def test_sigkill_of_one_rank_during_save(self):
        root = util.tempdir(self)
        script = os.path.join(os.path.dirname(__file__), "kill_in_save.py")
        p = util.run([util.TORCHRUN, "2", script, root], check=False, timeout=300)
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("save 2 failed", p.stderr)  # rank 0 saw the failure as ckpt.Error
        listing = ckpt.ls(root)
        self.assertEqual(listing["latest"], "global_step1")
        self.assertEqual([t["tag"] for t in listing["tags"]], ["global_step1"])
        self.assertTrue(ckpt.check(root, deep=True)["ok"])
        # Loadable: every state of every parameter reads back with its checksums verified.
        r = ckpt.Reader(root)
        self.assertEqual(r.tag, "global_step1")
        for p in r.manifest["params"]:
            for state in ("master", "exp_avg", "exp_avg_sq"):
                self.assertEqual(list(r.read_param(p["name"], state).shape), p["shape"])
        # Whatever the dead save left behind is temporary, and gc removes it.
        gc, _ = util.cli_json("gc", root)
        self.assertEqual(sorted(gc["removed_temporary"]), sorted(listing["temporary"]))
        self.assertEqual(ckpt.ls(root)["temporary"], [])

if __name__ == "__main__":
    unittest.main()
