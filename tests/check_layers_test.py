#!/usr/bin/python3
"""tools/check_layers.py finds what it is for: each case is a tiny source tree with one fault,
and the check must exit 1 naming it (and 0 on the tree without the fault)."""
import os
import shutil
import subprocess
import sys
import tempfile

CHECK = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tools", "check_layers.py")


def tree(files):
    root = tempfile.mkdtemp(prefix="check-layers-")
    for path, text in files.items():
        os.makedirs(os.path.dirname(os.path.join(root, path)), exist_ok=True)
        with open(os.path.join(root, path), "w") as f:
            f.write(text)
    return root


def run(files):
    root = tree(files)
    try:
        p = subprocess.run([sys.executable, CHECK, root], capture_output=True, text=True)
    finally:
        shutil.rmtree(root)
    return p.returncode, p.stdout


CLEAN = {
    "ckpt/include/ckpt/status.h": "#pragma once\n",
    "ckpt/src/rank_file.h": "#pragma once\nint RankFileSize();\n",
    "ckpt/src/rank_file.cc": '#include "rank_file.h"\nint RankFileSize() { return 1; }\n',
    "verify/src/hyper.h": "#pragma once\nint ResolveHyper();\n",
    "verify/src/hyper.cc": '#include "hyper.h"\nint ResolveHyper() { return 2; }\n',
    "verify/src/split.h": "#pragma once\nint RunSplit();\n",
    "verify/src/split.cc": ('#include "split.h"\n#include "hyper.h"\n'
                            "int RunSplit() { return ResolveHyper(); }\n"),
    "verify/src/next.cc": ('#include "split.h"\n#include "hyper.h"\n'
                           "int Next() { return RunSplit() + ResolveHyper(); }\n"),
}

CASES = {
    "private header across a library": (
        {"estimate/src/size.cc": '#include "rank_file.h"\nint S() { return RankFileSize(); }\n'},
        "estimate/src/size.cc: includes rank_file.h, private to ckpt/src"),
    "upward include": (
        {"ckpt/src/up.cc": '#include "verify/next_update.h"\n',
         "verify/include/verify/next_update.h": "#pragma once\n"},
        "ckpt/ may not depend on verify/"),
    "include path into another library's src": (
        {"convert/CMakeLists.txt": "target_include_directories(x PRIVATE ${PROJECT_SOURCE_DIR}/ckpt/src)\n"},
        "include path reaches into ckpt/src"),
    # next.cc and split.cc share one internal header; each defines what the other calls.
    "call cycle through a shared internal header": (
        {"verify/src/hyper.h": None, "verify/src/hyper.cc": None,
         "verify/src/split.h": "#pragma once\nint RunSplit();\nint ResolveHyper();\n",
         "verify/src/split.cc": '#include "split.h"\nint RunSplit() { return ResolveHyper(); }\n',
         "verify/src/next.cc": ('#include "split.h"\nint ResolveHyper() { return 2; }\n'
                                "int Next() { return RunSplit(); }\n")},
        "include cycle between modules verify/next, verify/split"),
}


def main():
    rc, out = run(CLEAN)
    failures = [] if rc == 0 else [f"clean tree: exit {rc}: {out}"]
    for name, (change, expect) in CASES.items():
        files = dict(CLEAN)
        for k, v in change.items():
            if v is None:
                files.pop(k)
            else:
                files[k] = v
        rc, out = run(files)
        if rc != 1 or expect not in out:
            failures.append(f"{name}: exit {rc}, expected 1 and '{expect}' in:\n{out}")
    for f in failures:
        print(f)
    print(f"check_layers_test: {len(CASES) + 1 - len(failures)} of {len(CASES) + 1} cases pass")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
