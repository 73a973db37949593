#!/usr/bin/python3
"""Runs every example of one Markdown file (README.md, docs/*.md): the docs-examples test.

The convention every doc follows (also in docs/architecture.md, "Examples in the docs"):

  Every fenced block (```) names what it is in its info string; a bare ``` fails this test.

  ```sh            run: the block's lines, by `bash -euo pipefail`
  ```console       run: each `$ ` line (with `\\` continuations) is a command; the lines up to
                   the next `$ ` are its expected stdout, compared exactly (trailing spaces and
                   trailing blank lines aside). A `$ ` line with nothing after it only runs.
  ```python        run: by /usr/bin/python3 (Debian's, with torch, numpy and h5py)
  ```text          not code: diagrams, printed output, usage synopses with placeholders
  ```json          not code: a JSON shape (may hold "..." or placeholders)
  ```LANG illustrative
                   not run: a command or program the test cannot run (installs packages, needs
                   a GPU, takes minutes, a CI file of another system). Any language but
                   sh/console/python (yaml, cpp, ...) must say `illustrative`.

  Runnable blocks of one file run in document order in one scratch directory (later blocks see
  what earlier ones wrote), with `build/` linked to the build tree, every other top-level entry
  of the repository (tests/, tools/, ...) linked to the source, build/bin on PATH (so plain
  `ckpt` works), HDF5_PLUGIN_PATH set to the zstd filter and the OpenMPI root/oversubscribe
  variables set. Paths in runnable blocks are relative (`run`, not `/tmp/run`): a block that
  names /tmp fails, so runs never collide or leave files behind. Keep examples small (a few
  steps of the tiny model): CI runs them on 2 cores. A command expected to fail is written as
  such: `! ckpt check run --deep` or `ckpt ... || test $? -eq 1`.

usage: run_doc_examples.py SOURCE_DIR BUILD_DIR FILE.md [--list]
  --list   print the blocks and what would happen to each, run nothing
"""
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

RUNNABLE = {"sh", "console", "python"}
NOT_CODE = {"text", "json"}
BLOCK_TIMEOUT_S = 600


class Block:
    def __init__(self, line, lang, flags, body):
        self.line, self.lang, self.flags, self.body = line, lang, flags, body

    @property
    def runs(self):
        return self.lang in RUNNABLE and "illustrative" not in self.flags


def parse_blocks(path):
    """The fenced blocks of a Markdown file; errors for fences that break the convention."""
    blocks, errors = [], []
    with open(path, encoding="utf-8") as f:
        lines = f.read().split("\n")
    i = 0
    while i < len(lines):
        m = re.match(r"^(\s*)(```+|~~~+)(.*)$", lines[i])
        if not m:
            i += 1
            continue
        indent, fence, info = m.group(1), m.group(2), m.group(3).strip()
        start = i + 1
        body = []
        i += 1
        while i < len(lines) and not re.match(r"^\s*" + re.escape(fence) + r"\s*$", lines[i]):
            body.append(lines[i][len(indent):] if lines[i].startswith(indent) else lines[i])
            i += 1
        if i == len(lines):
            errors.append(f"{path}:{start}: fence never closed")
        i += 1
        words = info.split()
        if not words:
            errors.append(f"{path}:{start}: bare ``` fence: say what the block is (sh, console, "
                          "python, text, json, or LANG illustrative)")
            continue
        b = Block(start, words[0], words[1:], "\n".join(body) + "\n")
        if b.lang not in RUNNABLE | NOT_CODE and "illustrative" not in b.flags:
            errors.append(f"{path}:{start}: ```{info}: this test cannot run {b.lang}; mark it "
                          f"```{b.lang} illustrative")
        if b.runs and "/tmp" in b.body:
            errors.append(f"{path}:{start}: a runnable block names /tmp: use paths relative to "
                          "the scratch directory it runs in")
        blocks.append(b)
    return blocks, errors


def console_commands(body):
    """[(command, expected stdout)] of a console block."""
    out, cmd, expected = [], None, []
    lines = body.rstrip("\n").split("\n")
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("$ "):
            if cmd is not None:
                out.append((cmd, expected))
            cmd, expected = line[2:], []
            while cmd.endswith("\\") and i + 1 < len(lines):
                i += 1
                cmd = cmd[:-1] + " " + lines[i].strip()
        elif cmd is not None:
            expected.append(line)
        i += 1
    if cmd is not None:
        out.append((cmd, expected))
    return out


def normalize(text_lines):
    lines = [l.rstrip() for l in text_lines]
    while lines and not lines[-1]:
        lines.pop()
    return lines


def make_scratch(source, build):
    scratch = tempfile.mkdtemp(prefix="ckpt-docs-")
    for entry in os.listdir(source):
        if entry in ("build", ".git") or entry.startswith("build-"):
            continue
        os.symlink(os.path.join(source, entry), os.path.join(scratch, entry))
    os.symlink(build, os.path.join(scratch, "build"))
    return scratch


def environment(build):
    env = dict(os.environ)
    env["PATH"] = os.path.join(build, "bin") + os.pathsep + env.get("PATH", "")
    env["HDF5_PLUGIN_PATH"] = os.path.join(build, "lib", "hdf5-plugins")
    env["OMPI_ALLOW_RUN_AS_ROOT"] = "1"
    env["OMPI_ALLOW_RUN_AS_ROOT_CONFIRM"] = "1"
    env["OMPI_MCA_rmaps_base_oversubscribe"] = "1"
    env["CKPT_BIN_DIR"] = os.path.join(build, "bin")
    return env


def run(argv, cwd, env):
    # stdin is /dev/null: mpirun forwards stdin, and would swallow a script read from it.
    return subprocess.run(argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL, capture_output=True,
                          text=True, timeout=BLOCK_TIMEOUT_S)


def script_file(b, cwd):
    path = os.path.join(cwd, ".tmp", f"block-{b.line}.{b.lang}")
    with open(path, "w") as f:
        f.write(b.body)
    return path


def run_block(b, path, cwd, env):
    """None when the block passed, else a message."""
    where = f"{path}:{b.line} ```{b.lang}"
    if b.lang == "sh":
        r = run(["bash", "-euo", "pipefail", script_file(b, cwd)], cwd, env)
        if r.returncode != 0:
            return (f"{where} exited with status {r.returncode}\n--- block\n{b.body}"
                    f"--- stdout\n{r.stdout}--- stderr\n{r.stderr}")
        return None
    if b.lang == "python":
        r = run(["/usr/bin/python3", script_file(b, cwd)], cwd, env)
        if r.returncode != 0:
            return (f"{where} exited with status {r.returncode}\n--- block\n{b.body}"
                    f"--- stdout\n{r.stdout}--- stderr\n{r.stderr}")
        return None
    for cmd, expected in console_commands(b.body):
        r = run(["bash", "-euo", "pipefail", "-c", cmd], cwd, env)
        if r.returncode != 0:
            return (f"{where}: `{cmd}` exited with status {r.returncode}\n--- stdout\n{r.stdout}"
                    f"--- stderr\n{r.stderr}")
        want, got = normalize(expected), normalize(r.stdout.split("\n"))
        if want and want != got:
            return (f"{where}: `{cmd}` printed something else\n--- expected\n" +
                    "\n".join(want) + "\n--- got\n" + "\n".join(got) + "\n")
    return None


def main(argv):
    if len(argv) < 4:
        print(__doc__, file=sys.stderr)
        return 2
    source, build, path = (os.path.abspath(a) for a in argv[1:4])
    blocks, errors = parse_blocks(path)
    rel = os.path.relpath(path, source)
    if "--list" in argv:
        for b in blocks:
            print(f"{rel}:{b.line}: {b.lang} {' '.join(b.flags)} -> "
                  f"{'run' if b.runs else 'not run'}")
        for e in errors:
            print(e)
        return 1 if errors else 0
    for e in errors:
        print(e, file=sys.stderr)
    if errors:
        return 1
    scratch = make_scratch(source, build)
    env = environment(build)
    env["TMPDIR"] = os.path.join(scratch, ".tmp")
    os.makedirs(env["TMPDIR"])
    failed = 0
    ran = 0
    try:
        for b in blocks:
            if not b.runs:
                continue
            t0 = time.monotonic()
            try:
                problem = run_block(b, rel, scratch, env)
            except subprocess.TimeoutExpired:
                problem = f"{rel}:{b.line}: did not finish within {BLOCK_TIMEOUT_S}s"
            ran += 1
            status = "ok" if problem is None else "FAILED"
            print(f"{rel}:{b.line} ```{b.lang}: {status} ({time.monotonic() - t0:.1f}s)")
            if problem:
                print(problem)
                failed += 1
                break  # later blocks build on this one
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    print(f"{rel}: {ran} block(s) run, {failed} failed, "
          f"{sum(1 for b in blocks if not b.runs)} not run (text, json or illustrative)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
