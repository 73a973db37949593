"""torch.save / torch.load of the same tensors a ckpt save writes, for tools/bench.sh.

usage: torch_io.py DIR --ranks N --shard-numel S[,S...] --reps R [--drop-caches]

Rank r's file holds {"master", "exp_avg", "exp_avg_sq"}: three fp32 tensors of shard_numel[r]
elements (the rank's shard, as in the ckpt rank file). All ranks save concurrently (one thread
each; torch's serializer releases the GIL while writing), each file is flushed and fsynced, as a
checkpoint must be; then the page cache is dropped and the files are loaded back concurrently.
Prints one JSON object with per-repetition seconds and the peak RSS of this process.
"""
import json
import os
import resource
import sys
import threading
import time


def drop_caches():
    os.sync()
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        return "ok"
    except OSError as e:
        return "could not drop: %s" % e


def main():
    args = sys.argv[1:]
    if not args:
        print("usage: torch_io.py DIR --ranks N --shard-numel S[,S...] --reps R", file=sys.stderr)
        return 2
    out_dir = args[0]
    opts = {"--ranks": "4", "--shard-numel": "", "--reps": "3"}
    drop = False
    i = 1
    while i < len(args):
        if args[i] == "--drop-caches":
            drop = True
            i += 1
            continue
        opts[args[i]] = args[i + 1]
        i += 2
    try:
        import torch
    except ImportError as e:
        print(json.dumps({"op": "torch", "status": "not installed (%s)" % e}))
        return 0
    ranks = int(opts["--ranks"])
    shard = [int(x) for x in opts["--shard-numel"].split(",")]
    if len(shard) == 1:
        shard = shard * ranks
    reps = int(opts["--reps"])
    torch.manual_seed(0)
    state = []
    for r in range(ranks):
        n = shard[r]
        state.append({"master": (torch.rand(n) * 2 - 1) * 0.05,
                      "exp_avg": (torch.rand(n) * 2 - 1) * 1e-3,
                      "exp_avg_sq": torch.rand(n) * 1e-6})
    logical = sum(4 * 3 * n for n in shard)
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    os.makedirs(out_dir, exist_ok=True)
    paths = [os.path.join(out_dir, "rank_%05d.pt" % r) for r in range(ranks)]

    def save(r):
        with open(paths[r], "wb") as f:
            torch.save(state[r], f)
            f.flush()
            os.fsync(f.fileno())

    loaded = [None] * ranks

    def load(r):
        loaded[r] = torch.load(paths[r])

    def run(fn):
        threads = [threading.Thread(target=fn, args=(r,)) for r in range(ranks)]
        t0 = time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return time.perf_counter() - t0

    saves, loads, drop_status = [], [], "not requested"
    for _ in range(reps):
        for p in paths:
            if os.path.exists(p):
                os.remove(p)
        if drop:
            drop_status = drop_caches()
        t = run(save)
        dfd = os.open(out_dir, os.O_RDONLY)
        os.fsync(dfd)
        os.close(dfd)
        saves.append(t)
        if drop:
            drop_status = drop_caches()
        loads.append(run(load))
        loaded[:] = [None] * ranks
    file_bytes = sum(os.path.getsize(p) for p in paths)
    print(json.dumps({"op": "torch", "status": "ok", "torch": torch.__version__,
                      "ranks": ranks, "logical_bytes": logical, "file_bytes": file_bytes,
                      "save_seconds": saves, "load_seconds": loads, "drop_caches": drop_status,
                      "maxrss_kib_before": rss_before,
                      "maxrss_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
