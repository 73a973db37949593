#!/usr/bin/python3
"""Checks that the declared layers hold in the sources (docs/architecture.md, "Layers").

Fails (exit 1, one line per finding) when
  1. a library includes another library's private header (a quoted include that resolves only
     to some other folder's src/), or a CMakeLists.txt adds another folder's src/ to its
     include path;
  2. a library includes a public header of a library it may not depend on (an upward arrow);
  3. the private modules (src/foo.h + src/foo.cc + src/foo.cu/.cuh) of a library depend on each
     other in a cycle: module A depends on B when a file of A includes B's header, or when A
     calls a function that a private header A includes declares and a file of B defines (so
     two files sharing one "internal" header that each define what the other calls are a
     cycle). A public header is a module of its own (an interface: depending on its types is
     not a cycle).
Usage: tools/check_layers.py [SOURCE_DIR]   (default: the repository holding this script)
"""
import os
import re
import sys

# Folder -> the library folders it may include public headers of (its own is implied).
LAYERS = {
    "ckpt": set(),
    "safetensors": {"ckpt"},
    "convert": {"ckpt", "safetensors"},
    "estimate": {"ckpt", "safetensors", "convert"},
    "verify": {"ckpt", "safetensors", "convert"},
    "engine_min": {"ckpt", "safetensors"},
    # The wiring: the CLI, benches, tests and fuzzers use public headers of every library.
    "tools": {"ckpt", "safetensors", "convert", "estimate", "verify", "engine_min"},
    "tests": {"ckpt", "safetensors", "convert", "estimate", "verify", "engine_min"},
    "fuzz": {"ckpt", "safetensors", "convert", "estimate", "verify", "engine_min"},
    # The Python binding wraps the libraries' public faces.
    "python": {"ckpt", "safetensors", "convert", "estimate", "verify"},
}
LIBRARIES = [l for l in LAYERS if l not in ("tools", "tests", "fuzz", "python")]
SOURCE_EXT = (".h", ".cc", ".cu", ".cuh")
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def sources(root, folder):
    for dirpath, dirnames, filenames in os.walk(os.path.join(root, folder)):
        dirnames[:] = [d for d in dirnames if d not in ("build", "data")]
        for f in filenames:
            if f.endswith(SOURCE_EXT):
                yield os.path.join(dirpath, f)


def is_public_path(rel):
    return os.sep + "include" + os.sep in rel


COMMENT = re.compile(r"//[^\n]*|/\*.*?\*/", re.S)
STRING = re.compile(r'"(?:\\.|[^"\\\n])*"')
# A free function declared at namespace scope in a header: a line that starts at column 0,
# names the function, and whose statement ends with ';' after the parameter list.
DECLARATION = re.compile(r"^(?![#\s}])[^;{}()=]*?\b([A-Za-z_]\w*)\s*\(", re.M)


def strip(text):
    return STRING.sub('""', COMMENT.sub(" ", text))


def after_parens(text, open_at):
    """Index just past the parenthesis that closes the one at open_at (-1 when unbalanced)."""
    depth = 0
    for i in range(open_at, len(text)):
        if text[i] == "(":
            depth += 1
        elif text[i] == ")":
            depth -= 1
            if depth == 0:
                return i + 1
    return -1


def functions(text, defined):
    """Names of the functions declared (defined=False) or defined (True) at column 0."""
    names = set()
    for m in DECLARATION.finditer(text):
        end = after_parens(text, m.end() - 1)
        if end < 0:
            continue
        rest = re.match(r"[\s\w:&*<>,\->]*([;{])", text[end:])
        if rest and (rest.group(1) == "{") == defined:
            names.add(m.group(1))
    return names


def add_call_edges(texts, private_includes, edges):
    """Module A -> module B when A calls a function a private header it includes declares and
    B defines."""
    library = {p: os.path.normpath(p).split(os.sep) for p in texts}
    stripped = {p: strip(t) for p, t in texts.items()}
    defined_in = {}  # (library dir, function) -> {module stem}
    for p, t in stripped.items():
        if p.endswith((".cc", ".cu")):
            for name in functions(t, defined=True):
                defined_in.setdefault((os.path.dirname(p), name), set()).add(
                    os.path.splitext(os.path.basename(p))[0])
    for p, headers in private_includes.items():
        if p not in stripped:
            continue
        here = os.path.dirname(p)
        lib = os.path.basename(os.path.dirname(here))
        stem = os.path.splitext(os.path.basename(p))[0]
        for h in headers:
            if h not in stripped:
                continue
            for name in functions(stripped[h], defined=False):
                if not re.search(r"\b" + re.escape(name) + r"\b", stripped[p]):
                    continue
                for owner in defined_in.get((here, name), ()):
                    if owner != stem:
                        edges.setdefault((lib, stem), set()).add((lib, owner))


def main():
    root = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else
                           os.path.join(os.path.dirname(__file__), ".."))
    problems = []
    # Which library's public include/<lib>/ or private src/ holds a header.
    public = {}   # "lib/x.h" -> lib
    private = {}  # "x.h" -> [lib, ...]
    for lib in LIBRARIES:
        inc = os.path.join(root, lib, "include")
        for path in sources(root, os.path.join(lib, "include")):
            public[os.path.relpath(path, inc)] = lib
        for path in sources(root, os.path.join(lib, "src")):
            private.setdefault(os.path.relpath(path, os.path.join(root, lib, "src")),
                               []).append(lib)

    edges = {}  # (lib, module) -> {(lib, module)}
    texts = {}  # path -> text, the private sources of each library
    private_includes = {}  # path -> the private headers of its own library it includes
    for folder in LAYERS:
        for path in sources(root, folder):
            rel = os.path.relpath(path, root)
            here = os.path.dirname(path)
            text = open(path, encoding="utf-8", errors="replace").read()
            if folder in LIBRARIES and not is_public_path(rel):
                texts[path] = text
            stem = os.path.splitext(os.path.basename(path))[0]
            is_public = os.sep + "include" + os.sep in rel
            module = (folder, stem + (".h" if is_public else ""))
            for name in INCLUDE.findall(text):
                if os.path.exists(os.path.join(here, name)):
                    target = os.path.normpath(os.path.join(here, name))
                    owner = os.path.relpath(target, root).split(os.sep)[0]
                    if owner != folder:
                        problems.append(f"{rel}: includes {name}, a file of {owner}/")
                    elif folder in LIBRARIES and os.sep + "src" + os.sep in target:
                        private_includes.setdefault(path, []).append(target)
                        stem = os.path.splitext(os.path.basename(target))[0]
                        if stem != module[1]:
                            edges.setdefault(module, set()).add((folder, stem))
                    continue
                if name in public:
                    lib = public[name]
                    if lib != folder and lib not in LAYERS[folder]:
                        problems.append(f"{rel}: includes {name}: {folder}/ may not depend on "
                                        f"{lib}/ (layers: docs/architecture.md)")
                    if lib == folder and folder in LIBRARIES:
                        target = (folder, os.path.splitext(os.path.basename(name))[0] + ".h")
                        if target != module:
                            edges.setdefault(module, set()).add(target)
                    continue
                owners = [l for l in private.get(name, []) if l != folder]
                if owners:
                    problems.append(f"{rel}: includes {name}, private to {owners[0]}/src")
    add_call_edges(texts, private_includes, edges)

    # Include paths that reach into another folder's src/.
    for folder in LAYERS:
        for dirpath, dirnames, filenames in os.walk(os.path.join(root, folder)):
            dirnames[:] = [d for d in dirnames if d != "build"]
            if "CMakeLists.txt" not in filenames:
                continue
            cm = os.path.join(dirpath, "CMakeLists.txt")
            for m in re.finditer(r"\$\{PROJECT_SOURCE_DIR\}/(\w+)/src", open(cm).read()):
                if m.group(1) != folder:
                    problems.append(f"{os.path.relpath(cm, root)}: include path reaches into "
                                    f"{m.group(1)}/src (private)")

    # Cycles among the modules of each library (Tarjan's strongly connected components).
    index, low, stack, on_stack, sccs = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                sccs.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for v in list(edges):
        if v not in index:
            visit(v)
    for comp in sccs:
        names = ", ".join(f"{lib}/{m}" for lib, m in comp)
        problems.append(f"include cycle between modules {names}")

    for p in sorted(set(problems)):
        print(p)
    if problems:
        print(f"check_layers: {len(set(problems))} problem(s)", file=sys.stderr)
        return 1
    print("check_layers: layers hold, no private header crosses a library, no include cycle")
    return 0


if __name__ == "__main__":
    sys.exit(main())
