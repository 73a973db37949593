"""A save killed mid-way (SIGKILL of one rank) leaves the previous checkpoint as latest, intact
and loadable; the surviving rank gets an error, not a hang or a crash."""
import os
import signal
import subprocess
import sys
import unittest

import ckpt
import util


class KilledSave(unittest.TestCase):
    def test_sigkill_of_one_rank_during_save(self):
        root = util.tempdir(self)
        script = os.path.join(os.path.dirname(__file__), "kill_in_save.py")
        # The ranks are started here rather than by tools/torchrun.sh, which would stop rank 0
        # as soon as rank 1 died: this test wants to see rank 0's side of the failure.
        port = util.free_port()
        procs = [subprocess.Popen([sys.executable, script, root], stderr=subprocess.PIPE,
                                  text=True, env=dict(os.environ, RANK=str(r), WORLD_SIZE="2",
                                                      MASTER_ADDR="127.0.0.1",
                                                      MASTER_PORT=str(port)))
                 for r in range(2)]
        errs = [p.communicate(timeout=300)[1] for p in procs]
        self.assertEqual(procs[1].returncode, -signal.SIGKILL)
        self.assertEqual(procs[0].returncode, 3, errs[0])  # a clean ckpt.Error, not a crash
        self.assertIn("save 2 failed", errs[0])
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
