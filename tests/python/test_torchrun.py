"""tools/torchrun.sh, the loopback launcher: each rank's environment, the exit status (0, the
first failure, a signal), and no rank outliving the launcher."""
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import unittest

import util

RANK_SCRIPT = """
import json, os, sys, time
rank = int(os.environ["RANK"])
out = sys.argv[1]
path = os.path.join(out, f"rank{rank}.json")
with open(path + ".tmp", "w") as f:
    json.dump({k: os.environ.get(k) for k in
               ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
                "MASTER_PORT")} | {"pid": os.getpid(), "args": sys.argv[2:]}, f)
os.rename(path + ".tmp", path)  # whole when it appears
mode = sys.argv[2]
if mode == "fail" and rank == 1:
    while not os.path.exists(os.path.join(out, "rank0.json")):  # rank 0 is up: it is stopped
        time.sleep(0.01)                                          # running, not while starting
    sys.exit(3)
if mode in ("fail", "sleep"):
    time.sleep(120)
"""


def alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:  # a zombie has ended
        return f.read().rsplit(")", 1)[1].split()[0] != "Z"


class TorchRun(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="ckpt-torchrun-")
        self.script = os.path.join(self.dir, "rank.py")
        with open(self.script, "w") as f:
            f.write(RANK_SCRIPT)
        self.env = dict(os.environ, CKPT_PYTHON=sys.executable)

    def tearDown(self):
        subprocess.run(["rm", "-rf", self.dir])

    def ranks(self, n):
        out = []
        for r in range(n):
            path = os.path.join(self.dir, f"rank{r}.json")
            for _ in range(600):  # the ranks may still be starting
                if os.path.exists(path):
                    break
                time.sleep(0.05)
            with open(path) as f:
                out.append(json.load(f))
        return out

    def start(self, n, mode):
        return subprocess.Popen([util.TORCHRUN, str(n), self.script, self.dir, mode],
                                env=self.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True)

    def test_every_rank_gets_its_environment(self):
        p = util.run([util.TORCHRUN, "3", self.script, self.dir, "ok", "x y"], env=self.env)
        self.assertEqual(p.stderr, "")
        got = self.ranks(3)
        port = got[0]["MASTER_PORT"]
        self.assertTrue(port.isdigit(), port)
        for r, e in enumerate(got):
            self.assertEqual((e["RANK"], e["LOCAL_RANK"]), (str(r), str(r)))
            self.assertEqual((e["WORLD_SIZE"], e["LOCAL_WORLD_SIZE"]), ("3", "3"))
            self.assertEqual((e["MASTER_ADDR"], e["MASTER_PORT"]), ("127.0.0.1", port))
            self.assertEqual(e["args"], ["ok", "x y"])

    def test_first_failure_is_the_status_and_stops_the_others(self):
        t0 = time.monotonic()
        p = self.start(2, "fail")
        out, err = p.communicate(timeout=60)
        self.assertEqual(p.returncode, 3, err)
        self.assertLess(time.monotonic() - t0, 60)
        self.assertNotIn("unbound", err)
        self.assertFalse(alive(self.ranks(2)[0]["pid"]), "rank 0 outlived the launcher")

    def test_sigterm_stops_every_rank(self):
        p = self.start(2, "sleep")
        pids = [e["pid"] for e in self.ranks(2)]
        p.send_signal(signal.SIGTERM)
        out, err = p.communicate(timeout=60)
        # The ranks died of SIGTERM: 128 + 15, the shell's status for them. Before, a signal
        # during the wait left the launcher without a pid, and `set -u` ended it with status 1.
        self.assertEqual(p.returncode, 128 + signal.SIGTERM, err)
        self.assertNotIn("unbound", err)
        for pid in pids:
            self.assertFalse(alive(pid), f"rank pid {pid} outlived the launcher")

    def test_ranks_that_end_together(self):
        # Ranks that end at the same moment: bash's wait -n may find no job left while a rank's
        # status is still to be collected (about 1 run in 500 failed before). A canary: each
        # run takes milliseconds with /bin/true as the "interpreter".
        env = dict(os.environ, CKPT_PYTHON="/bin/true", MASTER_PORT="29500")
        for i in range(200):
            p = util.run([util.TORCHRUN, "4", "x"], check=False, env=env)
            self.assertEqual((p.returncode, p.stderr), (0, ""), f"run {i}")
        env["CKPT_PYTHON"] = "/bin/false"
        p = util.run([util.TORCHRUN, "4", "x"], check=False, env=env)
        self.assertEqual(p.returncode, 1, p.stderr)

    def test_usage(self):
        for args in (["2"], ["0", "x.py"], ["two", "x.py"]):
            p = util.run([util.TORCHRUN, *args], check=False)
            self.assertEqual(p.returncode, 2, args)
            self.assertIn("torchrun.sh", p.stderr)


if __name__ == "__main__":
    unittest.main()
