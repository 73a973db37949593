"""Shared helpers of the Python suites: where the build is, running the CLI and the launcher."""
import json
import os
import subprocess
import sys
import tempfile

SOURCE = os.environ.get("CKPT_SOURCE_DIR") or os.path.abspath(
    os.path.join(os.path.dirname(__file__), "..", ".."))
BIN = os.environ.get("CKPT_BIN_DIR") or os.path.join(SOURCE, "build", "bin")
CLI = os.path.join(BIN, "ckpt")
TORCHRUN = os.path.join(SOURCE, "tools", "torchrun.sh")
TRAIN = os.path.join(SOURCE, "examples", "torch", "train.py")


def run(args, check=True, **kw):
    """Runs a command; returns CompletedProcess (text). Raises with its output when check and the
    exit status is not 0."""
    p = subprocess.run(args, capture_output=True, text=True, **kw)
    if check and p.returncode != 0:
        raise AssertionError(f"{args} exited {p.returncode}:\n{p.stdout}\n{p.stderr}")
    return p


def cli_json(*args, check=True):
    p = run([CLI, *args, "--json"], check=check)
    return json.loads(p.stdout), p.returncode


def torchrun(n, *args, check=True, timeout=300):
    return run([TORCHRUN, str(n), TRAIN, *args], check=check, timeout=timeout)


def free_port():
    """A free loopback port for MASTER_PORT (tools/free_port.py says how it is chosen)."""
    return int(subprocess.run([sys.executable, os.path.join(SOURCE, "tools", "free_port.py")],
                              check=True, capture_output=True, text=True).stdout)


def tree_digest(root):
    """{relative path: (size, mtime_ns)} of every file under root (to show nothing changed)."""
    out = {}
    for d, _, files in os.walk(root):
        for f in files:
            p = os.path.join(d, f)
            st = os.stat(p)
            out[os.path.relpath(p, root)] = (st.st_size, st.st_mtime_ns)
    return out


def tempdir(test):
    d = tempfile.TemporaryDirectory(prefix="ckpt-py-")
    test.addCleanup(d.cleanup)
    return d.name


def read_log(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]
