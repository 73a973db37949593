#!/usr/bin/python3
"""Reads io_timeline.so's traces (tools/bench/io_timeline.c): where a program's data phase left
the disk without a request.

usage: io_timeline.py TRACE... [--large BYTES] [--gaps MS] [--json]

For each trace: when the first large request (BYTES or more, 1 MiB by default) began, the data
phase (from it to the end of the last large request), how long at least one large read, one
large write, and either was in flight, the idle time in between (no large request in flight),
the time in fsync/fdatasync and the exit. --gaps MS lists every idle stretch longer than MS
milliseconds with the calls made in it (r/w/f, bytes, start). Times in milliseconds since the
library was loaded.
"""
import argparse
import json
import sys

OPS = "rwf"


def load(path):
    with open(path) as f:
        head = f.readline().split()
        if len(head) < 7 or head[0] != "io_timeline" or head[1] != "1":
            sys.exit("%s: not an io_timeline trace" % path)
        exit_ms = int(head[3]) / 1e6
        calls = []
        for n, line in enumerate(f, start=2):
            parts = line.split()
            if len(parts) != 5:
                sys.exit("%s:%d: malformed line" % (path, n))
            tid, op, start, end, result = map(int, parts)
            if op not in (0, 1, 2):
                sys.exit("%s:%d: unknown operation %d" % (path, n, op))
            calls.append((start / 1e6, end / 1e6, op, result, tid))
    return exit_ms, int(head[7]), sorted(calls)


def union(spans):
    total, cur = 0.0, None
    for a, b in sorted(spans):
        if cur is None or a > cur[1]:
            if cur:
                total += cur[1] - cur[0]
            cur = [a, b]
        else:
            cur[1] = max(cur[1], b)
    if cur:
        total += cur[1] - cur[0]
    return total


def idle_gaps(large):
    gaps, reach = [], None
    for a, b, *_ in large:
        if reach is not None and a > reach:
            gaps.append((reach, a))
        reach = b if reach is None else max(reach, b)
    return gaps


def summary(path, large_bytes, gap_ms):
    exit_ms, dropped, calls = load(path)
    large = [c for c in calls if c[2] < 2 and c[3] >= large_bytes]
    s = {"trace": path, "exit_ms": exit_ms, "calls": len(calls), "dropped": dropped,
         "sync_ms": sum(b - a for a, b, op, _, _ in calls if op == 2)}
    if not large:
        s["large_requests"] = 0
        return s
    reads = [(a, b) for a, b, op, _, _ in large if op == 0]
    writes = [(a, b) for a, b, op, _, _ in large if op == 1]
    first, last = large[0][0], max(b for _, b, *_ in large)
    busy = union(reads + writes)
    gaps = idle_gaps(large)
    s.update({"large_requests": len(large), "large_reads": len(reads),
              "large_writes": len(writes), "first_large_ms": first, "data_ms": last - first,
              "reads_busy_ms": union(reads), "writes_busy_ms": union(writes), "busy_ms": busy,
              "idle_ms": (last - first) - busy, "idle_stretches": len(gaps)})
    if gap_ms is not None:
        s["gaps"] = [{"from_ms": g0, "to_ms": g1,
                      "calls": ["%s%d@%.2f" % (OPS[op], r, a) for a, _, op, r, _ in calls
                                if g0 <= a <= g1]}
                     for g0, g1 in gaps if g1 - g0 > gap_ms]
    return s


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("traces", nargs="+")
    ap.add_argument("--large", type=int, default=1 << 20)
    ap.add_argument("--gaps", type=float)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    out = [summary(p, a.large, a.gaps) for p in a.traces]
    if a.json:
        print(json.dumps(out, indent=1))
        return
    for s in out:
        if not s["large_requests"]:
            print("%s: no request of %d bytes or more; exit %.1f ms" % (s["trace"], a.large,
                                                                       s["exit_ms"]))
            continue
        print("%s: first large request %.1f ms, data %.1f ms (reads %d busy %.1f, writes %d "
              "busy %.1f, either %.1f, idle %.1f in %d stretches), fsync %.1f, exit %.1f"
              % (s["trace"], s["first_large_ms"], s["data_ms"], s["large_reads"],
                 s["reads_busy_ms"], s["large_writes"], s["writes_busy_ms"], s["busy_ms"],
                 s["idle_ms"], s["idle_stretches"], s["sync_ms"], s["exit_ms"]))
        if s["dropped"]:
            print("  (%d calls past the table's capacity were not recorded)" % s["dropped"])
        for g in s.get("gaps", []):
            print("  idle %.2f-%.2f (%.2f ms): %s" % (g["from_ms"], g["to_ms"],
                                                    g["to_ms"] - g["from_ms"],
                                                    " ".join(g["calls"][:8])))


if __name__ == "__main__":
    main()
