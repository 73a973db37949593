"""The measurement driver of tools/bench.sh (run it through bench.sh, which builds first).

Every phase runs on the same bytes in this one invocation, so each ratio compares ckpt with
the raw floor measured minutes earlier on the same machine. Each timed phase runs --reps times
(the page cache is dropped before each one when the OS allows it); figures are the median with
min-max. Peak RSS is the child's ru_maxrss from wait4. The targets come from issue 7; the
benchmark prints PASS/MISS and never fails on a timing.
"""
import argparse
import atexit
import datetime
import json
import os
import platform
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

import memdisk
import throttle

GiB = 1024.0 ** 3
MiB = 1024.0 ** 2


def parse_size(text):
    m = re.fullmatch(r"\s*([0-9.]+)\s*([KMGT]i?B?|B?)\s*", text, re.I)
    if not m:
        raise argparse.ArgumentTypeError("bad size %r (e.g. 2GiB, 512MiB)" % text)
    unit = m.group(2).upper().replace("IB", "").replace("B", "")
    mult = {"": 1, "K": 1024, "M": 1024 ** 2, "G": 1024 ** 3, "T": 1024 ** 4}[unit]
    return int(float(m.group(1)) * mult)


def log(msg):
    sys.stderr.write("\033[1m==> %s\033[0m\n" % msg)
    sys.stderr.flush()


class Runner:
    def __init__(self, bin_dir):
        self.bin = bin_dir

    def run(self, cmd, env=None, check=True, preexec=None):
        """Runs cmd; returns (stdout, stderr, seconds, maxrss_kib, exit code). preexec: run in
        the child before cmd (joining a throttled cgroup)."""
        with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
            t0 = time.perf_counter()
            p = subprocess.Popen(cmd, stdout=out, stderr=err, env=env, preexec_fn=preexec)
            _, status, ru = os.wait4(p.pid, 0)
            secs = time.perf_counter() - t0
            p.returncode = os.waitstatus_to_exitcode(status)
            out.seek(0)
            err.seek(0)
            o, e = out.read().decode(errors="replace"), err.read().decode(errors="replace")
        if check and p.returncode != 0:
            raise RuntimeError("%s failed (exit %d):\n%s\n%s" % (" ".join(cmd), p.returncode,
                                                               o[-2000:], e[-2000:]))
        return o, e, secs, ru.ru_maxrss, p.returncode

    def json(self, cmd, env=None, preexec=None):
        o, e, secs, rss, rc = self.run(cmd, env=env, preexec=preexec)
        try:
            return json.loads(o), secs, rss
        except ValueError:
            last = [line for line in o.splitlines() if line.strip().startswith("{")]
            return json.loads(last[-1]), secs, rss


def floor_after(rep):
    """The side of repetition `rep` its paired floor runs on (as ckpt_io's FloorAfter): before
    on even repetitions, after on odd ones, so that the host's cache of the virtual disk and
    its writeback favour neither (docs/performance.md)."""
    return rep % 2 == 1


def paired(j):
    """Per repetition: the best floor's time for the same bytes just before / the ckpt time,
    and the same against the old floor (buffered_4MiB)."""
    ratios = [r["raw_seconds"] / r["seconds"] for r in j["reps"]]
    raw_gibs = [j["logical_bytes"] / GiB / r["raw_seconds"] for r in j["reps"]]
    out = {"ratio": stats(ratios), "raw_gib_per_s": stats(raw_gibs),
           "best_variants": [r.get("raw_best_variant") for r in j["reps"]],
           "note": "the run's best raw variant (of buffered, sync_file_range, O_DIRECT "
                   "4/16/64 MiB, measured in the raw phase) on the same in-memory bytes, one "
                   "file per rank, three seconds before (even repetitions) or after (odd ones) "
                   "each ckpt repetition (loads: reading the checkpoint's own rank files)"}
    old = [r["raw_buffered_seconds"] / r["seconds"] for r in j["reps"]
           if r.get("raw_buffered_seconds", -1) > 0]
    if old:
        out["ratio_to_buffered"] = stats(old)
    out.update(best_variant_ratio([r.get("raw_variants") or {} for r in j["reps"]],
                                  [r["seconds"] for r in j["reps"]]))
    return out


def best_variant_ratio(variants, secs):
    """The pairs against one floor variant, the one with the least median over the pairs,
    instead of the least of every variant in each pair: the least of several noisy runs is
    biased low against a single ckpt run. Empty when no variant ran in every pair."""
    names = set.intersection(*(set(k for k, t in v.items() if t) for v in variants)) \
        if variants else set()
    if not names:
        return {}
    best = min(sorted(names), key=lambda n: statistics.median(v[n] for v in variants))
    return {"best_variant_by_median": best,
            "ratio_best_variant": stats([v[best] / t for v, t in zip(variants, secs)])}


def null_row(j, variant):
    """A calibration run (ckpt_io --null-variant): the pairs of one floor variant timed in
    ckpt's place against the same floor passes."""
    p = paired(j)
    out = {"variant": variant, "seconds": stats([r["seconds"] for r in j["reps"]]),
           "ratio": p["ratio"]}
    if "ratio_best_variant" in p:
        out["ratio_best_variant"] = p["ratio_best_variant"]
        out["best_variant_by_median"] = p["best_variant_by_median"]
    return out


def paired_codec(j):
    """Per repetition: zstd's own time for the same bytes (same level, shuffle, chunks and
    threads per rank, plus the write + fsync or the cold read) just before / the ckpt time."""
    reps = [r for r in j["reps"] if r.get("codec_seconds")]
    if not reps:
        return None
    out = {"ratio": stats([r["codec_seconds"] / r["seconds"] for r in reps]),
           "codec_gib_per_s": stats([j["logical_bytes"] / GiB / r["codec_seconds"] for r in reps]),
           "threads_per_rank": reps[0]["codec_threads"],
           "note": "the codec floor (tools/bench/ckpt_io.cc): save = zstd's multithreaded "
                   "streaming compression (context warmed up before the clock) of the rank's "
                   "chunked (and shuffled) bytes written and fsynced; load = the same chunks "
                   "as frames in one file per rank, read front to back with O_DIRECT into "
                   "touched memory while the same number of threads decompress each frame as "
                   "its bytes arrive, from a cold cache; floor and ckpt alternate which runs "
                   "first, each right after deleting its own last files and a cache drop"}
    # CPU seconds of ckpt's load and of the codec floor (loads as threads): whether the two
    # are bound by the cores rather than the disk.
    cpu = [r for r in reps if "cpu_seconds" in r and "codec_cpu_seconds" in r]
    if cpu:
        out["cpu_seconds"] = stats([r["cpu_seconds"] for r in cpu])
        out["codec_cpu_seconds"] = stats([r["codec_cpu_seconds"] for r in cpu])
    return out


def debian_torch():
    """Whether /usr/bin/python3 imports torch (the torch and DeepSpeed phases run it)."""
    if not os.path.exists("/usr/bin/python3"):
        return False
    return subprocess.run(["/usr/bin/python3", "-c", "import torch"], stdout=subprocess.DEVNULL,
                          stderr=subprocess.DEVNULL).returncode == 0


def drop_caches():
    os.sync()
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        return "ok"
    except OSError as e:
        return "could not drop the page cache (%s); reads may come from memory" % e


def drop_caches_keep_program(binary, warm=None):
    """Drops the page cache, then runs `binary --version` untimed, so a timed run of it starts
    with its data cold but the program and its shared libraries (about 50 with HDF5's) paged
    in, as in use; the raw floors are timed inside their process and pay neither. warm: the
    arguments of one more untimed run, for the libraries a command opens only when it needs
    them (libzip and libcrypto, for a DeepSpeed checkpoint's .pt files)."""
    status = drop_caches()
    for args in [["--version"]] + ([warm] if warm else []):
        subprocess.run([binary] + args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return status


def start_costs(ckpt, raw_io, R, reps=15):
    """Wall seconds of `ckpt --version` and of `raw_io variants read` (a small program of the
    same build), medians of `reps` alternating runs, programs warm."""
    times = {"ckpt": [], "raw_io": []}
    for _ in range(reps):
        times["ckpt"].append(R.run([ckpt, "--version"])[2])
        times["raw_io"].append(R.run([raw_io, "variants", "read"])[2])
    return {k + "_seconds": stats(v) for k, v in times.items()}


def stats(values):
    return {"median": statistics.median(values), "min": min(values), "max": max(values),
            "n": len(values), "values": values}


def fmt_range(s, scale=1.0, digits=2):
    return "%.*f (%.*f-%.*f)" % (digits, s["median"] * scale, digits, s["min"] * scale,
                                 digits, s["max"] * scale)


def machine_info(work_dir):
    info = {"nproc": os.cpu_count(), "kernel": platform.release()}
    try:
        lscpu = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
        for line in lscpu.splitlines():
            if line.startswith("Model name:"):
                info["cpu"] = line.split(":", 1)[1].strip()
        flags = open("/proc/cpuinfo").read()
        info["avx2"] = " avx2 " in flags
        info["avx512f"] = " avx512f " in flags
    except OSError:
        pass
    try:
        info["mem_gib"] = round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / GiB, 1)
    except (ValueError, OSError):
        pass
    try:
        df = subprocess.run(["df", "-hT", work_dir], capture_output=True, text=True).stdout
        info["disk"] = df.splitlines()[-1]
        dev = df.splitlines()[-1].split()[0]
        base = os.path.basename(dev)
        # A whole disk as it is (loop3, nvme0n1), a partition by its disk (sda1, nvme0n1p1).
        if not os.path.exists("/sys/block/" + base):
            base = re.sub(r"p?[0-9]+$", "", base)
        rot = "/sys/block/%s/queue/rotational" % base
        if os.path.exists(rot):
            info["disk_rotational"] = open(rot).read().strip() == "1"
        backing = memdisk.backing_file(base)  # a loop device: the file it is made of
        if backing:
            info["disk_backing_file"] = backing
    except (OSError, IndexError):
        pass
    info["loadavg_at_start"] = os.getloadavg()
    return info


def main():
    ap = argparse.ArgumentParser(prog="tools/bench.sh")
    ap.add_argument("--size", type=parse_size, default=parse_size("1GiB"),
                    help="checkpoint bytes (master + exp_avg + exp_avg_sq), default 1GiB: a 2GiB "
                         "run does not fit in 10 minutes on the 2-core development VM, whose "
                         "shared disk gives 0.1-0.5 GiB/s (docs/performance.md)")
    ap.add_argument("--ranks", type=int, default=4, help="data-parallel ranks (files, threads)")
    ap.add_argument("--many-ranks", type=int, default=64,
                    help="rank files of the many_files phase's checkpoint (the same state as "
                         "--ranks writes, in this many files): check --deep and export-fp32 of it")
    ap.add_argument("--reps", type=int, default=5,
                    help="repetitions of the phases with a target (raw floor, save, load, export)")
    ap.add_argument("--reps2", type=int, default=1,
                    help="repetitions of the other phases (variants, zstd, reshard, scaling)")
    ap.add_argument("--json", help="write every figure here")
    ap.add_argument("--markdown", help="also write the tables as Markdown (for docs/performance.md)")
    ap.add_argument("--work", default=None, help="scratch directory (default build-bench/bench-work)")
    ap.add_argument("--compress", default="zstd:1+shuffle", help="compression for the zstd save phase")
    ap.add_argument("--engine-model", default="tiny", help="engine_min preset for the zstd study")
    ap.add_argument("--engine-steps", type=int, default=200, help="training steps for the zstd study")
    ap.add_argument("--async-model", default="small",
                    help="engine_min preset for the async-save throughput rows (default small)")
    ap.add_argument("--async-steps", type=int, default=4,
                    help="engine_min steps (each saved) per async-save throughput run")
    ap.add_argument("--skip", default="", help="comma list of phases to skip: torch,scaling,zstd,"
                    "variants,reshard,reshard_load,reshard_rss,export,many_files,deepspeed,lora,nextupdate,"
                    "async,async_engine,rule")
    ap.add_argument("--throttle", default=None, metavar="W[,R]",
                    help="run every phase on a slower disk: the work directory's disk throttled "
                         "to W MiB/s of writes and R of reads (default: unthrottled) for this "
                         "process and its children (root, cgroup io or blkio: throttle.py)")
    ap.add_argument("--rule-rates", default="100,200,400,800,0", metavar="MIBPS,...",
                    help="disk write rates (MiB/s; 0: unthrottled) at which the compress_rule "
                         "phase times an uncompressed and a --compress save of half of "
                         "--size; the rule is the rate below which the compressed one is faster")
    ap.add_argument("--memory-disk", type=parse_size, default=None, metavar="SIZE",
                    help="run every phase on a disk in memory: an ext4 file system of SIZE (e.g. "
                         "6GiB) on a loop device over a tmpfs file in /dev/shm, mounted at the "
                         "work directory; a disk faster than the cores, where ckpt's CPU costs "
                         "show (the loop driver's copies take CPU too). With --throttle, the "
                         "throttle applies to it (root: memdisk.py)")
    ap.add_argument("--bin", default=None, help=argparse.SUPPRESS)
    a = ap.parse_args()
    root_dir = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    bin_dir = a.bin or os.path.join(root_dir, "build-bench", "bin")
    work = a.work or os.path.join(root_dir, "build-bench", "bench-work")
    skip = set(x for x in a.skip.split(",") if x)
    if a.ranks < 1 or a.reps < 1 or a.reps2 < 1:
        ap.error("--ranks and --reps must be positive")
    # Phases whose programs this machine lacks (tools/bench.sh --prebuilt on a machine without
    # the Debian packages): skipped, and the report says so.
    missing = {}
    if not os.path.exists(os.path.join(bin_dir, "engine_min")):
        missing.update({"zstd": "engine_min", "async_engine": "engine_min"})
    if not {"torch", "deepspeed"} <= skip and not debian_torch():
        missing.update({"torch": "torch under /usr/bin/python3",
                        "deepspeed": "torch under /usr/bin/python3"})
    skipped_for_want = sorted(p for p in missing if p not in skip)
    skip |= set(missing)
    if os.path.ismount(work):
        # rmtree would empty someone's disk: a memory disk left by a run stopped by SIGKILL?
        src = (memdisk.mount_of(work) or ("?",))[0]
        backing = memdisk.backing_file(src)
        ap.error("the work directory %s is a mount point (of %s%s): unmount it first%s" % (
            work, src, ", over %s" % backing if backing else "",
            " (umount %s; losetup -d %s; rm %s)" % (work, src, backing) if backing else ""))
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    try:
        rule_rates = [float(x) for x in a.rule_rates.split(",") if x.strip()]
    except ValueError:
        rule_rates = []
    if not rule_rates or min(rule_rates) < 0:
        ap.error("--rule-rates takes MiB/s, 0 for unthrottled, e.g. 100,400,0")
    # --memory-disk: mounted at the work directory before the throttle looks for its disk (so a
    # throttle applies to the loop device) and before machine_info describes it.
    mem = None
    if a.memory_disk:
        try:
            mem = memdisk.MemoryDisk(work, a.memory_disk)
        except (memdisk.Unavailable, OSError) as e:
            ap.error("--memory-disk: %s" % e)
        atexit.register(mem.close)  # also when a phase fails
    slow = None  # --throttle: this process's cgroup, its children in it too
    if a.throttle:
        try:
            w, _, r = a.throttle.partition(",")
            limits = (int(float(w) * MiB), int(float(r) * MiB) if r else 0)
        except ValueError:
            ap.error("--throttle takes W[,R] in MiB/s, e.g. 400 or 400,800")
        try:
            slow = throttle.Throttle(work)
            atexit.register(slow.close)  # also when a phase fails
            slow.set(*limits)
            slow.join(os.getpid())
        except (throttle.Unavailable, OSError) as e:
            if slow:
                slow.close()
            ap.error("--throttle: %s" % e)
    R = Runner(bin_dir)
    ckpt = os.path.join(bin_dir, "ckpt")
    raw_io = os.path.join(bin_dir, "raw_io")
    ckpt_io = os.path.join(bin_dir, "ckpt_io")
    t_start = time.perf_counter()
    res = {"when_utc": datetime.datetime.utcnow().strftime("%Y-%m-%dT%H:%M:%SZ"),
           "command": " ".join(["tools/bench.sh"] + sys.argv[1:]),
           "size_bytes": a.size, "ranks": a.ranks, "reps": a.reps, "reps2": a.reps2,
           "machine": machine_info(work), "phases": {}, "targets": [], "notes": []}
    ph = res["phases"]
    if mem:
        res["memory_disk"] = {"size_bytes": mem.size_bytes, "dev": mem.dev,
                              "backing": mem.backing, "text": mem.describe()}
        log(mem.describe())
    if slow:
        res["throttle"] = {"write_bytes_per_s": slow.write_bps, "read_bytes_per_s": slow.read_bps,
                           "disk": slow.dev, "cgroup": slow.kind, "text": slow.describe()}
        log(slow.describe())

    def on_term(signum, _frame):
        # Stopped from outside (`timeout` on a lent machine): the phases finished so far.
        res["interrupted"] = "signal %d after %.0f s" % (signum, time.perf_counter() - t_start)
        if a.json:
            with open(a.json, "w") as f:
                json.dump(res, f, indent=1)
            log("interrupted; wrote the finished phases to %s" % a.json)
        throttle.close_all()  # --throttle's cgroup, and compress_rule's if it was running
        memdisk.close_all()  # --memory-disk: unmounted, detached, its file removed
        os._exit(128 + signum)

    signal.signal(signal.SIGTERM, on_term)
    # What first-touching memory costs here (raw_io touch): the floors' buffers are touched
    # before their clocks, a ckpt process's working memory (and the page cache) inside.
    try:
        res["machine"]["memory_touch"] = R.json([raw_io, "touch", str(min(a.size, GiB))])[0]
    except Exception as e:  # a probe, never a reason to stop
        res["notes"].append("raw_io touch: %s" % e)
    # What starting a `ckpt` command costs (its program warm): the raw floors are timed inside
    # their process, the CLI rows (check --deep, export-fp32) as whole commands; raw_io's own
    # start is the reference (docs/performance.md, 2026-12-02 12:40, says what a start costs).
    try:
        res["machine"]["ckpt_start"] = start_costs(ckpt, raw_io, R)
    except Exception as e:  # a probe, never a reason to stop
        res["notes"].append("start-up probe: %s" % e)
    for p in skipped_for_want:
        res["notes"].append("phase %s skipped: no %s here" % (p, missing[p]))
        log(res["notes"][-1])
    res["drop_caches"] = drop_caches()
    if res["drop_caches"] != "ok":
        res["notes"].append(res["drop_caches"])
    params = max(64, a.size // 12)
    per_file = a.size // a.ranks
    log("size %.2f GiB, %d ranks, %d params, %d reps; work dir %s; page cache: %s" %
        (a.size / GiB, a.ranks, params, a.reps, work, res["drop_caches"]))

    # --- raw floors ----------------------------------------------------------------------
    # Every variant of tools/bench/raw_floor.h (buffered, sync_file_range, O_DIRECT with 4, 16
    # and 64 MiB blocks) on the same bytes, interleaved per repetition; the floor is the best
    # variant by median, the old one (buffered_4MiB) is kept beside it (issue 19).
    def raw_pass(op, d, files, variant, per_file=None):
        """One raw_io pass over `files` files in d after dropping the page cache (a write
        pass empties d first): (seconds, or None where the file system refuses the variant;
        peak RSS in KiB)."""
        if op == "write":
            shutil.rmtree(d, ignore_errors=True)
            os.makedirs(d)
        drop_caches()
        cmd = [raw_io, op, d, "--files", str(files), "--variant", variant]
        if per_file is not None:
            cmd += ["--bytes-per-file", str(per_file)]
        j, _, rss = R.json(cmd)
        return (None if j.get("unsupported") else j["seconds"]), rss

    raw_dir = os.path.join(work, "raw")
    variants = {op: R.run([raw_io, "variants", op])[0].split() for op in ("write", "read", "copy")}
    times = {op: {v: [] for v in variants[op]} for op in ("write", "read")}
    rss_w = rss_r = 0
    for _ in range(a.reps):
        for v in variants["write"]:
            t, rss_w = raw_pass("write", raw_dir, a.ranks, v, per_file)
            if t is not None:
                times["write"][v].append(t)
        for v in variants["read"]:
            t, rss_r = raw_pass("read", raw_dir, a.ranks, v)
            if t is not None:
                times["read"][v].append(t)
    raw_bytes = per_file * a.ranks
    shutil.rmtree(raw_dir)
    for op, rss in (("write", rss_w), ("read", rss_r)):
        measured = {v: stats(t) for v, t in times[op].items() if t}
        best = min(measured, key=lambda v: measured[v]["median"])
        ph["raw_" + op] = {"bytes": raw_bytes, "seconds": measured[best], "maxrss_kib": rss,
                           "variant": best, "variants": measured,
                           "unsupported": [v for v, t in times[op].items() if not t]}
        if "buffered_4MiB" in measured:
            ph["raw_" + op + "_buffered"] = {"bytes": raw_bytes, "maxrss_kib": rss,
                                            "seconds": measured["buffered_4MiB"],
                                            "variant": "buffered_4MiB"}
    raw_w_gibs = raw_bytes / GiB / ph["raw_write"]["seconds"]["median"]
    raw_r_gibs = raw_bytes / GiB / ph["raw_read"]["seconds"]["median"]
    log("raw write %.2f GiB/s (%s), read %.2f GiB/s (%s)" % (
        raw_w_gibs, ph["raw_write"]["variant"], raw_r_gibs, ph["raw_read"]["variant"]))

    def record(name, nbytes, secs, rss, floor_gibs, extra=None):
        s = stats(secs)
        gibs = nbytes / GiB / s["median"]
        d = {"bytes": nbytes, "seconds": s, "gib_per_s": gibs,
             "gib_per_s_range": [nbytes / GiB / s["max"], nbytes / GiB / s["min"]],
             "maxrss_kib": rss}
        if floor_gibs:
            d["floor_gib_per_s"] = floor_gibs
            d["ratio"] = gibs / floor_gibs
        if extra:
            d.update(extra)
        ph[name] = d
        log("%s: %.2f GiB/s%s" % (name, gibs, (", %.2fx floor" % d["ratio"]) if floor_gibs else ""))
        return d

    # --- ckpt save, no compression -------------------------------------------------------
    ck_root = os.path.join(work, "ckpt")
    paired_dir = os.path.join(work, "paired_raw")
    # The paired write floor runs every write variant each time (no --paired-variant): which
    # one wins depends on the memory the machine has at hand, not only on the disk (a buffered
    # variant right after a cache drop reuses the freed pages; a while later it pays host page
    # faults for them on the development VM: docs/performance.md, 2026-12-02 09:40).
    j, _, rss = R.json([ckpt_io, "save", ck_root, "--ranks", str(a.ranks), "--params", str(params),
                        "--reps", str(a.reps), "--drop-caches", "--paired-raw", paired_dir])
    save = record("save", j["logical_bytes"], [r["seconds"] for r in j["reps"]], rss, raw_w_gibs,
                  {"file_bytes": j["reps"][-1]["file_bytes"],
                   "rss_over_state_kib": j["maxrss_kib"] - j["maxrss_kib_before"],
                   "compress": "none", "direct_write": j.get("direct_write")})
    save["paired"] = paired(j)
    logical = j["logical_bytes"]
    # The calibration of the pairing: the run's best write variant timed in the save's place
    # (ckpt_io --null-variant), paired with the same floor passes in the same order. Its ratio
    # is what this pairing gives a program that is the floor, on this machine, in this run.
    null_root = os.path.join(work, "null_save")
    j, _, _ = R.json([ckpt_io, "save", null_root, "--ranks", str(a.ranks), "--params",
                      str(params), "--reps", str(a.reps), "--drop-caches", "--paired-raw",
                      paired_dir, "--null-variant", ph["raw_write"]["variant"]])
    save["null"] = null_row(j, ph["raw_write"]["variant"])
    shutil.rmtree(null_root, ignore_errors=True)
    pr_root = os.path.join(work, "ckpt_procs")
    j, _, rss = R.json([ckpt_io, "save", pr_root, "--ranks", str(a.ranks), "--params", str(params),
                        "--reps", str(a.reps), "--drop-caches", "--procs",
                        "--paired-raw", paired_dir])
    record("save_procs", j["logical_bytes"], [r["seconds"] for r in j["reps"]],
           j["rank_maxrss_kib"], raw_w_gibs,
           {"note": "one process per rank (as under mpirun); peak RSS is one rank's",
            "paired": paired(j)})
    shutil.rmtree(pr_root, ignore_errors=True)
    # The same save from tensors in ordinary heap memory (std::vector), which cannot leave
    # with O_DIRECT as it lies: its bytes are copied, into the page cache.
    hp_root = os.path.join(work, "ckpt_heap")
    j, _, rss = R.json([ckpt_io, "save", hp_root, "--ranks", str(a.ranks), "--params", str(params),
                        "--reps", str(a.reps), "--drop-caches", "--heap-state",
                        "--paired-raw", paired_dir])
    record("save_heap_state", j["logical_bytes"], [r["seconds"] for r in j["reps"]], rss,
           raw_w_gibs, {"note": "tensors in heap memory (std::vector), not I/O memory",
                        "direct_write": j.get("direct_write"), "paired": paired(j)})
    shutil.rmtree(hp_root, ignore_errors=True)

    # --- load with checksum verification -------------------------------------------------
    j, _, rss = R.json([ckpt_io, "load", ck_root, "--reps", str(a.reps), "--drop-caches",
                        "--paired-raw", paired_dir, "--paired-variant", ph["raw_read"]["variant"]])
    record("load_verified", j["logical_bytes"], [r["seconds"] for r in j["reps"]], rss, raw_r_gibs,
           {"rss_over_buffers_kib": j["maxrss_kib"] - j["maxrss_kib_before"],
            "paired": paired(j), "direct_read": j.get("direct_read")})
    # Its calibration: the paired read variant timed in the load's place.
    j, _, _ = R.json([ckpt_io, "load", ck_root, "--reps", str(a.reps), "--drop-caches",
                      "--paired-raw", paired_dir, "--paired-variant", ph["raw_read"]["variant"],
                      "--null-variant", ph["raw_read"]["variant"]])
    ph["load_verified"]["null"] = null_row(j, ph["raw_read"]["variant"])
    j, _, rss = R.json([ckpt_io, "load", ck_root, "--reps", str(a.reps), "--drop-caches", "--procs",
                        "--paired-raw", paired_dir, "--paired-variant", ph["raw_read"]["variant"]])
    record("load_verified_procs", j["logical_bytes"], [r["seconds"] for r in j["reps"]],
           max(r["rank_maxrss_kib"] for r in j["reps"]), raw_r_gibs,
           {"note": "one process per rank (as under mpirun); peak RSS is one rank's",
            "paired": paired(j)})
    j, _, rss = R.json([ckpt_io, "load", ck_root, "--reps", "1", "--drop-caches", "--no-verify"])
    record("load_unverified", j["logical_bytes"], [r["seconds"] for r in j["reps"]], rss, raw_r_gibs)
    # check --deep, paired with a cold read of the same files (hard links named as raw_io
    # reads them) by the best read variant, just before each repetition.
    def paired_check(name, args, files, note, warm=None):
        link_dir = os.path.join(work, "check_floor")
        os.makedirs(link_dir)
        for i, f in enumerate(files):
            os.link(f, os.path.join(link_dir, "raw_%d.bin" % i))
        check_bytes = sum(os.path.getsize(f) for f in files)
        c_secs, c_floor, rc = [], [], 0
        for rep in range(a.reps):
            def floor():
                c_floor.append(raw_pass("read", link_dir, len(files),
                                        ph["raw_read"]["variant"])[0])
                time.sleep(3)
            if not floor_after(rep):
                floor()
            drop_caches_keep_program(ckpt, warm)
            _, _, secs, rss, rc = R.run([ckpt, "check"] + args, check=False)
            c_secs.append(secs)
            if floor_after(rep):
                time.sleep(3)
                floor()
        shutil.rmtree(link_dir)
        record(name, check_bytes, c_secs, rss, raw_r_gibs,
               {"exit": rc, "note": note,
                "paired": {"ratio": stats([f / s for f, s in zip(c_floor, c_secs)]),
                           "raw_gib_per_s": stats([check_bytes / GiB / f for f in c_floor]),
                           "note": "a cold read of the same files by the best read variant, "
                                   "three seconds before (even repetitions) or after (odd ones) "
                                   "each repetition"}})

    tag_dir = os.path.join(ck_root, save_tag(ck_root))
    rank_files = sorted(f for f in os.listdir(tag_dir) if f.endswith(".h5"))
    paired_check("check_deep", ["--deep", ck_root], [os.path.join(tag_dir, f) for f in rank_files],
                 "one pass over each file (file and dataset XXH3 from the same bytes), the files "
                 "in parallel; bytes are the files' bytes")

    # --- save variants: what each SaveOptions knob costs ---------------------------------
    if "variants" not in skip:
        var_root = os.path.join(work, "variants")
        # Uncompressed tensors are stored contiguously (chunk_bytes only shapes zstd chunks),
        # so the knobs left are the whole-file checksum and zstd without the byte shuffle.
        for name, extra in [("save_no_file_checksum", ["--no-file-checksum"]),
                            ("save_zstd1", ["--compress", "zstd:1"])]:
            shutil.rmtree(var_root, ignore_errors=True)
            j, _, rss = R.json([ckpt_io, "save", var_root, "--ranks", str(a.ranks), "--params",
                                str(params), "--reps", str(a.reps2), "--drop-caches",
                                "--paired-raw", paired_dir,
                                "--paired-variant", ph["raw_write"]["variant"]] + extra)
            extra_fields = {"paired": paired(j)}
            if name == "save_zstd1":
                extra_fields["file_bytes"] = j["reps"][-1]["file_bytes"]
                extra_fields["compression_ratio"] = j["logical_bytes"] / j["reps"][-1]["file_bytes"]
            record(name, j["logical_bytes"], [r["seconds"] for r in j["reps"]], rss, raw_w_gibs,
                   extra_fields)
        shutil.rmtree(var_root, ignore_errors=True)

    # --- zstd save -----------------------------------------------------------------------
    z_root = os.path.join(work, "ckpt_zstd")
    codec_dir = os.path.join(work, "paired_codec")
    j, _, rss = R.json([ckpt_io, "save", z_root, "--ranks", str(a.ranks), "--params", str(params),
                        "--reps", str(a.reps2), "--drop-caches", "--compress", a.compress,
                        "--paired-codec", codec_dir])
    record("save_" + a.compress.replace(":", "").replace("+", "_"), j["logical_bytes"],
           [r["seconds"] for r in j["reps"]], rss, raw_w_gibs,
           {"file_bytes": j["reps"][-1]["file_bytes"],
            "compression_ratio": j["logical_bytes"] / j["reps"][-1]["file_bytes"],
            "compress": j["compress"], "codec": paired_codec(j)})
    zname = a.compress.replace(":", "").replace("+", "_")
    j, _, rss = R.json([ckpt_io, "load", z_root, "--reps", str(a.reps2), "--drop-caches",
                        "--paired-codec", codec_dir])
    record("load_" + zname, j["logical_bytes"], [r["seconds"] for r in j["reps"]], rss, raw_r_gibs,
           {"codec": paired_codec(j)})
    j, _, rss = R.json([ckpt_io, "load", z_root, "--reps", str(a.reps2), "--drop-caches", "--procs"])
    record("load_" + zname + "_procs", j["logical_bytes"], [r["seconds"] for r in j["reps"]],
           max(r["rank_maxrss_kib"] for r in j["reps"]), raw_r_gibs,
           {"note": "one process per rank: decompression outside a shared HDF5 lock"})
    shutil.rmtree(z_root, ignore_errors=True)

    # --- export-fp32 ---------------------------------------------------------------------
    # export_fp32(src, name, extra, data_files): a.reps timed exports of src (cold cache), each
    # paired with the floor of reading what export reads (as many bytes, from the start of each
    # of the source's data files: hard links named as raw_io reads them) plus writing what it
    # writes, both in the same minutes as the export; with peak RSS beside the documented bound
    # (2 x largest tensor + 64 MiB).
    def export_fp32(src, name, extra, data_files, null=None, command="export-fp32",
                    out_file=None, copy=True, warm=None):
        """With null (a raw_io copy variant): the calibration of the pairing instead, that copy
        timed in export's place against the same floors; returns its figures. command: the ckpt
        subcommand timed (to-universal too: `ckpt command SRC OUT --json` reporting
        bytes_read); out_file: the one output file its write floor writes (to-universal's
        universal.h5, not its manifest), else every file of OUT. copy=False: no copy floor
        (raw_io copy writes what it reads; an export that widens bf16 to fp32 writes twice
        that)."""
        secs, rsss, floors, w1, r1, copies, copy_each = [], [], [], [], [], [], []
        out = os.path.join(work, name)
        one_dir = os.path.join(work, name + "_floor")
        read_dir = os.path.join(work, name + "_read_floor")
        # One untimed export for the sizes the floor needs (what it reads and writes).
        shutil.rmtree(out, ignore_errors=True)
        ej = json.loads(R.run([ckpt, command, src, out, "--json"])[0])
        outs = [out_file] if out_file else os.listdir(out)
        written = sum(os.path.getsize(os.path.join(out, f)) for f in outs)
        nfiles = len(outs)
        shutil.rmtree(read_dir, ignore_errors=True)
        os.makedirs(read_dir)
        for i, f in enumerate(data_files):
            os.link(f, os.path.join(read_dir, "raw_%d.bin" % i))
        # As many bytes as export reads, from the start of each data file: each file up to
        # the same count, a file shorter than that read whole (a LoRA checkpoint's model file
        # holds most of what export reads, its optimizer files little).
        read_per_file = even_share(ej["bytes_read"], [os.path.getsize(f) for f in data_files])

        one_best = []  # the best one-file variant of each floor

        def one_file_floor():
            # What export reads, then the output written as export writes it (one file unless
            # sharded), each by every variant each time (as the save's paired floor): the best
            # read plus the best write. (Every read variant, not the run's best as check --deep
            # does: a variant that wins on whole files, 64 MiB blocks, is not the best on
            # export's shorter reads.)
            r = min(t for t in (raw_pass("read", read_dir, len(data_files), v, read_per_file)[0]
                                for v in variants["read"]) if t is not None)
            r1.append(r)
            best = None
            for v in variants["write"]:
                t, _ = raw_pass("write", one_dir, nfiles, v, max(1, written // nfiles))
                if t is not None and (best is None or t < best):
                    best, best_v = t, v
            one_best.append(best_v)
            shutil.rmtree(one_dir, ignore_errors=True)
            w1.append(best)
            floors.append(r + best)
            # The copy floor: the same reads and writes by one program that overlaps them
            # (raw_io copy, every variant, best counts): whether the disk gives a copy the sum
            # of its separate read and write rates. Timed as export is, the process from its
            # start to its exit (its own clock, which leaves out loading and exiting, is kept
            # beside it: until 2026-12-04 the ratio used that one).
            best = None
            each = {}
            for v in (variants["copy"] if copy else []):
                shutil.rmtree(one_dir, ignore_errors=True)
                os.makedirs(one_dir)
                drop_caches()
                j, wall, _ = R.json([raw_io, "copy", read_dir, one_dir, "--files",
                                     str(len(data_files)), "--bytes-per-file", str(read_per_file),
                                     "--variant", v])
                if not j.get("unsupported"):
                    each[v] = wall
                    if best is None or wall < best[0]:
                        best = (wall, v, j["seconds"])
            shutil.rmtree(one_dir, ignore_errors=True)
            if best is not None:
                copies.append(best)
                copy_each.append(each)
            time.sleep(3)

        for rep in range(a.reps):
            if not floor_after(rep):
                one_file_floor()
            shutil.rmtree(out, ignore_errors=True)
            if null:
                os.makedirs(out)
                drop_caches_keep_program(raw_io)
                _, _, t, rss, _ = R.run([raw_io, "copy", read_dir, out, "--files",
                                         str(len(data_files)), "--bytes-per-file",
                                         str(read_per_file), "--variant", null])
            else:
                drop_caches_keep_program(ckpt, warm)
                o, _, t, rss, _ = R.run([ckpt, command, src, out, "--json"])
            secs.append(t)
            rsss.append(rss)
            if floor_after(rep):
                time.sleep(3)
                one_file_floor()
        shutil.rmtree(read_dir, ignore_errors=True)
        if null:
            shutil.rmtree(out, ignore_errors=True)
            return {"variant": null, "seconds": stats(secs),
                    "ratio": stats([f / t for f, t in zip(floors, secs)]),
                    "copy_ratio": stats([c / t for (c, _, _), t in zip(copies, secs)])
                    if len(copies) == len(secs) else None,
                    **best_variant_ratio(copy_each, secs),
                    "note": "raw_io copy --variant %s of the same bytes, timed from its start "
                            "to its exit in export's place, paired with the same floors" % null}
        ej = json.loads(o)
        # The run's floor: the read and the write at the rates of the raw phase (four files
        # in parallel), as before; the paired floor reads the source's own files and writes
        # the export's own file count.
        floor_t = ej["bytes_read"] / GiB / raw_r_gibs + written / GiB / raw_w_gibs
        s = stats(secs)
        ph[name] = dict(extra, **{
            "bytes_read": ej["bytes_read"], "bytes_written": written, "files": nfiles,
            "seconds": s, "floor_seconds": floor_t, "ratio_run_floor": floor_t / s["median"],
            "ratio": stats([f / t for f, t in zip(floors, secs)])["median"],
            "paired": {"ratio": stats([f / t for f, t in zip(floors, secs)]),
                       "floor_seconds": stats(floors), "write_variants": one_best,
                       "write_gib_per_s": stats([written / GiB / w for w in w1]),
                       "read_gib_per_s": stats([ej["bytes_read"] / GiB / r for r in r1]),
                       "read_seconds": stats(r1),
                       "note": "reading as many bytes as export reads from the source's %d "
                               "data file(s) by the best of every read variant, plus writing its "
                               "output as it does (%d file(s)) by the best of every write "
                               "variant, three seconds before (even repetitions) or after "
                               "(odd ones) each export" % (len(data_files), nfiles)},
            "copy_floor": None if len(copies) != len(secs) else {
                "seconds": stats([c for c, _, _ in copies]),
                "ratio": stats([c / t for (c, _, _), t in zip(copies, secs)]),
                "variants": [v for _, v, _ in copies],
                "own_clock_seconds": stats([c for _, _, c in copies]),
                "ratio_own_clock": stats([c / t for (_, _, c), t in zip(copies, secs)]),
                **best_variant_ratio(copy_each, secs),
                "note": "raw_io copy: the same bytes read from the same files and written to one "
                        "file by one program, reads and writes overlapped (best of every copy "
                        "variant, its ring buffers fresh memory), paired as the floor above; "
                        "timed from its start to its exit as export is (own_clock_seconds: its "
                        "own clock, without loading and exiting)"},
            "gib_per_s_read_plus_written": (ej["bytes_read"] + written) / GiB / s["median"],
            "maxrss_kib": max(rsss), "maxrss_kib_all": rsss,
            "largest_tensor_bytes": ej.get("largest_tensor_bytes"),
            "rss_bound_kib": (2 * ej["largest_tensor_bytes"] + 64 * MiB) / 1024
            if "largest_tensor_bytes" in ej else None})
        log("%s: %.2fs, paired floor %.2fs (%.2fx), run floor %.2fs (%.2fx); peak RSS %.0f MiB" %
            (name, s["median"], stats(floors)["median"], ph[name]["ratio"], floor_t,
             floor_t / s["median"], max(rsss) / 1024))
        if ph[name]["copy_floor"]:
            log("%s: copy floor %.2fs (%.2fx)" % (
                name, ph[name]["copy_floor"]["seconds"]["median"],
                ph[name]["copy_floor"]["ratio"]["median"]))
        shutil.rmtree(out, ignore_errors=True)

    if "export" not in skip:
        export_fp32(ck_root, "export_fp32", {},
                    [os.path.join(tag_dir, f) for f in rank_files])
        # Its calibration: the copy variant with the best median over export's pairs, timed
        # in export's place.
        cf = ph["export_fp32"]["copy_floor"]
        if cf and cf.get("best_variant_by_median"):
            ph["export_fp32"]["null"] = export_fp32(
                ck_root, "export_fp32_null", {}, [os.path.join(tag_dir, f) for f in rank_files],
                null=cf["best_variant_by_median"])

    # --- one file per rank at scale ------------------------------------------------------
    # The same state written by --many-ranks ranks (ckpt synth, ZeRO-2): as many rank files,
    # each its HDF5 open, probe and seal, as a large job's checkpoint has. check --deep and
    # export-fp32 of it, against the same kinds of paired floors as the rows of --ranks files
    # (on 2026-12-07 a probe process per file cost export a quarter of its time on 64 files).
    if "many_files" not in skip and a.many_ranks > a.ranks:
        many_root = os.path.join(work, "ckpt_many")
        R.run([ckpt, "synth", many_root, "--ranks", str(a.many_ranks), "--params", str(params),
               "--zero", "2", "--json"])
        many_tag = os.path.join(many_root, save_tag(many_root))
        many_files = sorted(os.path.join(many_tag, f) for f in os.listdir(many_tag)
                            if f.endswith(".h5"))
        paired_check("check_deep_many_files", ["--deep", many_root], many_files,
                     "check --deep of the same state in %d rank files" % len(many_files))
        if "export" not in skip:
            export_fp32(many_root, "export_fp32_many_files", {"rank_files": len(many_files)},
                        many_files)
        shutil.rmtree(many_root, ignore_errors=True)

    # --- export-fp32 of a DeepSpeed ZeRO-2 checkpoint (docs/deepspeed.md) --------------------
    # A bf16 ZeRO-2 checkpoint of about --size on disk (14 bytes a parameter: fp32 master and
    # moments in the optimizer files, bf16 weights in the model file), written by the test
    # generator; the floor is reading what export reads plus writing what it writes at the raw
    # rates, and the peak RSS is compared with the documented bound.
    if "deepspeed" not in skip:
        width = 512
        blocks = max(1, a.size // (14 * width * width))
        ds_root = os.path.join(work, "deepspeed")
        gen = os.path.join(root_dir, "tests", "deepspeed", "make_ds_checkpoint.py")
        R.run(["/usr/bin/python3", gen, ds_root, "--zero", "2", "--world", str(min(a.ranks, 3)),
               "--dtype", "bf16", "--blocks", str(blocks), "--block-width", str(width)])
        # A checkpoint of a few KB whose check, untimed after each drop, pages in the
        # libraries that read .pt files (since 2026-12-05 23:30; until then these rows paid
        # for reading libcrypto's 4.7 MB from the disk in each run).
        ds_warm_root = os.path.join(work, "deepspeed_warm")
        R.run(["/usr/bin/python3", gen, ds_warm_root, "--zero", "2", "--world", "1", "--dtype",
               "bf16"])
        ds_warm = ["check", ds_warm_root]
        ds_bytes = sum(os.path.getsize(os.path.join(dp, f))
                       for dp, _, fs in os.walk(ds_root) for f in fs)
        # Its data: the optimizer files, where the fp32 masters are.
        optim_files = sorted(os.path.join(dp, f) for dp, _, fs in os.walk(ds_root) for f in fs
                             if f.endswith("optim_states.pt"))
        export_fp32(ds_root, "deepspeed_export_fp32", {"checkpoint_bytes": ds_bytes}, optim_files,
                    warm=ds_warm)
        # ckpt to-universal of it (no target): the three states of every parameter read from the
        # optimizer files and written to universal.h5, against the same kind of floor.
        export_fp32(ds_root, "deepspeed_to_universal", {"checkpoint_bytes": ds_bytes},
                    optim_files, command="to-universal", out_file="universal.h5", warm=ds_warm)
        # ckpt check of it: every zip record's CRC-32, paired with a cold read of all its files.
        paired_check("deepspeed_check", [ds_root], ds_files(ds_root),
                     "every zip record read and its CRC-32 checked, each file as soon as it is "
                     "open, the files in parallel; bytes are the files' bytes",
                     warm=ds_warm)
        shutil.rmtree(ds_root, ignore_errors=True)

    # --- a LoRA fine-tune's DeepSpeed checkpoint ---------------------------------------------
    # A frozen bf16 base of 2 MB tensors (1024 x 1024) holding about --size, in the model
    # file, beside two trainable blocks (ZeRO-2 over 2 ranks): export reads the base from the
    # model file and writes it as fp32 (twice its bytes), and check reads every record. The
    # floors are those of the rows above; export has no copy floor (a copy writes what it
    # reads).
    if "deepspeed" not in skip and "lora" not in skip:
        width = 1024
        frozen_blocks = max(1, a.size // (2 * width * width))
        lora_root = os.path.join(work, "deepspeed_lora")
        R.run(["/usr/bin/python3", gen, lora_root, "--zero", "2", "--world", "2", "--dtype",
               "bf16", "--blocks", "2", "--frozen-blocks", str(frozen_blocks), "--block-width",
               str(width)])
        lora_files = ds_files(lora_root)
        lora_bytes = sum(os.path.getsize(f) for f in lora_files)
        export_fp32(lora_root, "deepspeed_lora_export_fp32",
                    {"checkpoint_bytes": lora_bytes, "frozen_tensors": frozen_blocks},
                    lora_files, copy=False, warm=ds_warm)
        paired_check("deepspeed_lora_check", [lora_root], lora_files,
                     "a LoRA-like checkpoint (%d frozen bf16 tensors of 2 MB in the model file): "
                     "every zip record read and its CRC-32 checked; bytes are the files' bytes"
                     % frozen_blocks, warm=ds_warm)
        shutil.rmtree(lora_root, ignore_errors=True)
    if "deepspeed" not in skip:
        shutil.rmtree(ds_warm_root, ignore_errors=True)

    # --- reshard N -> N/2 ----------------------------------------------------------------
    if "reshard" not in skip and a.ranks >= 2:
        dp = a.ranks // 2
        out = os.path.join(work, "reshard")
        secs, rsss = [], []
        for _ in range(a.reps2):
            shutil.rmtree(out, ignore_errors=True)
            drop_caches()
            o, _, t, rss, _ = R.run([ckpt, "reshard", ck_root, out, "--dp", str(dp), "--json"])
            secs.append(t)
            rsss.append(rss)
        rj = json.loads(o)
        s = stats(secs)
        moved = rj["verify_bytes"] + sum(r["bytes_read"] for r in rj["ranks"]) + logical
        floor_t = (rj["verify_bytes"] + sum(r["bytes_read"] for r in rj["ranks"])) / GiB / raw_r_gibs \
            + logical / GiB / raw_w_gibs
        ph["reshard"] = {"from": a.ranks, "to": dp, "seconds": s, "maxrss_kib": max(rsss),
                         "ranks": rj["ranks"], "max_read_ratio": rj["max_ratio"],
                         "verify_bytes": rj["verify_bytes"], "floor_seconds": floor_t,
                         "ratio": floor_t / s["median"],
                         "note": "floor: the verify pass + every rank's reads at the raw read "
                                 "rate, plus writing the checkpoint at the raw write rate"}
        log("reshard %d->%d: %.2fs, max read/owned %.4f, %.2fx floor" %
            (a.ranks, dp, s["median"], rj["max_ratio"], floor_t / s["median"]))
        shutil.rmtree(out, ignore_errors=True)

    # --- load-time reshard: N -> N/2 and N -> N-1 (issue 15) -----------------------------
    # ckpt::LoadResharded for every new rank at once (threads, as the new ranks of a resumed
    # run), paired per repetition with the floors: every raw read variant of as many bytes as
    # each new rank owns, one file per new rank, taken just before; the ratio is to the best
    # (ckpt_io reshard-load).
    if "reshard_load" not in skip and a.ranks >= 2:
        for m in sorted(set(x for x in (a.ranks // 2, a.ranks - 1) if x >= 1), reverse=True):
            j, _, rss = R.json([ckpt_io, "reshard-load", ck_root, "--to", str(m),
                                "--reps", str(max(5, a.reps)), "--drop-caches",
                                "--paired-raw", os.path.join(work, "reshard_raw")])
            reps = j["reps"]
            pr = paired(j)
            d = {"from": a.ranks, "to": m, "bytes": j["logical_bytes"],
                 "seconds": stats([r["seconds"] for r in reps]),
                 "raw_seconds": stats([r["raw_seconds"] for r in reps]),
                 "ratio": pr["ratio"], "paired": pr,
                 "bytes_read": reps[-1]["bytes_read"], "ranks": j["ranks"],
                 "max_read_ratio": max(x["ratio"] for x in j["ranks"]), "maxrss_kib": rss,
                 "note": "every new rank's LoadResharded concurrently (threads); floor: the best "
                         "raw read variant of as many bytes as each new rank owns, one file per "
                         "new rank, just before each repetition"}
            fresh = [(r["fresh_memory_seconds"], r["seconds"]) for r in reps
                     if r.get("fresh_memory_seconds")]
            if fresh:  # the floor of a load that returns new memory (ckpt_io.cc)
                d["fresh_memory_seconds"] = stats([f for f, _ in fresh])
                d["fresh_memory_ratio"] = stats([f / t for f, t in fresh])
            d["gib_per_s"] = d["bytes"] / GiB / d["seconds"]["median"]
            ph["reshard_load_%d_%d" % (a.ranks, m)] = d
            log("load-time reshard %d->%d: %.2fs, raw %.2fs, paired ratio %s, read/owned %.3f%s" %
                (a.ranks, m, d["seconds"]["median"], d["raw_seconds"]["median"],
                 fmt_range(d["ratio"]), d["max_read_ratio"],
                 ", to reads into fresh memory %s" % fmt_range(d["fresh_memory_ratio"])
                 if fresh else ""))

    # --- ckpt reshard's peak RSS at 0.25x, 1x and 3x --size ----------------------------------
    # A `ckpt synth` checkpoint of each size on --ranks ranks, resharded to --ranks / 2 with
    # the default --threads and with --threads 1: peak RSS (wait4) against the state's size.
    if "reshard_rss" not in skip and a.ranks >= 2:
        dp = a.ranks // 2
        rows = []
        src = os.path.join(work, "rss_src")
        out = os.path.join(work, "rss_out")
        for f in (0.25, 1, 3):
            size = int(a.size * f)
            free = shutil.disk_usage(work).free
            if 2 * size + (256 << 20) > free:
                res["notes"].append("reshard peak RSS at %.2f GiB skipped: %.1f GiB free in %s" %
                                    (size / GiB, free / GiB, work))
                log(res["notes"][-1])
                continue
            shutil.rmtree(src, ignore_errors=True)
            R.run([ckpt, "synth", src, "--ranks", str(a.ranks), "--params",
                   str(max(64, size // 12)), "--zero", "2", "--json"])
            for threads in (None, 1):
                shutil.rmtree(out, ignore_errors=True)
                drop_caches()
                o, _, t, rss, _ = R.run([ckpt, "reshard", src, out, "--dp", str(dp), "--json"] +
                                        (["--threads", str(threads)] if threads else []))
                rj = json.loads(o)
                state = sum(x["bytes_owned"] for x in rj["ranks"])
                shard = max(x["bytes_owned"] for x in rj["ranks"])
                rows.append({"size_bytes": size, "state_bytes": state, "largest_shard_bytes": shard,
                             "from": a.ranks, "to": dp, "threads": rj["threads"],
                             "seconds": t, "maxrss_kib": rss})
                log("reshard %d->%d of %.2f GiB, --threads %d: peak RSS %.0f MiB (one new shard "
                    "%.0f MiB), %.1fs" % (a.ranks, dp, size / GiB, rj["threads"], rss / 1024,
                                         shard / MiB, t))
            shutil.rmtree(out, ignore_errors=True)
        shutil.rmtree(src, ignore_errors=True)
        ph["reshard_rss"] = {"rows": rows,
                             "note": "peak RSS of `ckpt reshard` (wait4) per source size"}

    # --- next-update CPU vs memcpy -------------------------------------------------------
    if "nextupdate" not in skip:
        nb = min(a.size, 256 << 20)
        ratios, pass_gbs, copy_gbs = [], [], []
        for _ in range(a.reps):
            j, _, rss = R.json([ckpt, "next-update", "--bench-bytes", str(nb), "--bench-reps", "3",
                                "--device", "cpu", "--json"])
            ratios.append(j["ratio"])
            pass_gbs.append(j["pass_gb_per_s"])
            copy_gbs.append(j["memcpy_gb_per_s"])
        # Also at 64 MiB (what docs/verify.md quotes): glibc's memcpy switches to non-temporal
        # stores above a fraction of the last-level cache, the pass does not, so the ratio
        # depends on the size.
        small = []
        for _ in range(a.reps):
            js, _, _ = R.json([ckpt, "next-update", "--bench-bytes", str(64 << 20), "--bench-reps",
                               "3", "--device", "cpu", "--json"])
            small.append(js["ratio"])
        ph["next_update_cpu_64MiB"] = {"input_bytes": 64 << 20, "ratio": stats(small)}
        ph["next_update_cpu"] = {"input_bytes": nb, "ratio": stats(ratios),
                                 "pass_gb_per_s": stats(pass_gbs),
                                 "memcpy_gb_per_s": stats(copy_gbs), "maxrss_kib": rss,
                                 "timing": j["timing"]}
        log("next-update CPU: %.2fx memcpy" % statistics.median(ratios))

    # --- torch.save / torch.load --------------------------------------------------------
    if "torch" not in skip:
        man = json.load(open(os.path.join(ck_root, save_tag(ck_root), "manifest.json")))
        shard = ",".join(str(n) for n in man["partition"]["shard_numel"])
        tdir = os.path.join(work, "torch")
        try:
            j, _, rss = R.json(["/usr/bin/python3", os.path.join(root_dir, "tools", "bench",
                                                                  "torch_io.py"), tdir,
                                "--ranks", str(a.ranks), "--shard-numel", shard,
                                "--reps", str(a.reps2), "--drop-caches"])
        except (RuntimeError, OSError, ValueError) as e:
            j = {"status": "failed: %s" % str(e)[:300]}
        if j.get("status") == "ok":
            record("torch_save", j["logical_bytes"], j["save_seconds"], rss, raw_w_gibs,
                   {"torch": j["torch"], "file_bytes": j["file_bytes"]})
            record("torch_load", j["logical_bytes"], j["load_seconds"], rss, raw_r_gibs)
        else:
            ph["torch"] = {"status": j.get("status", "not installed")}
            log("torch: %s" % ph["torch"]["status"])
        shutil.rmtree(tdir, ignore_errors=True)

    # --- scaling: fixed shard per rank -----------------------------------------------------
    if "scaling" not in skip:
        rows = []
        shard_params = params // a.ranks
        n = 1
        counts = []
        while n <= a.ranks:
            counts.append(n)
            n *= 2
        if counts[-1] != a.ranks:
            counts.append(a.ranks)
        sreps = a.reps2
        for n in counts:
            sd = os.path.join(work, "scale")
            ws = [raw_pass("write", sd, n, ph["raw_write"]["variant"], per_file)[0]
                  for _ in range(sreps)]
            shutil.rmtree(sd)
            j, _, _ = R.json([ckpt_io, "save", sd, "--ranks", str(n), "--params",
                              str(shard_params * n), "--reps", str(sreps), "--drop-caches"])
            cs = [r["seconds"] for r in j["reps"]]
            shutil.rmtree(sd)
            row = {"ranks": n, "bytes": j["logical_bytes"], "save_seconds": stats(cs),
                   "raw_bytes": per_file * n, "raw_write_seconds": stats(ws)}
            row["save_gib_per_s"] = row["bytes"] / GiB / row["save_seconds"]["median"]
            row["raw_gib_per_s"] = row["raw_bytes"] / GiB / row["raw_write_seconds"]["median"]
            row["ratio"] = row["save_gib_per_s"] / row["raw_gib_per_s"]
            rows.append(row)
            log("scaling %d rank(s): save %.2fs (%.2f GiB/s), raw %.2fs, %.2fx" %
                (n, row["save_seconds"]["median"], row["save_gib_per_s"],
                 row["raw_write_seconds"]["median"], row["ratio"]))
        ph["scaling"] = {"shard_bytes_per_rank": per_file, "rows": rows}

    # --- zstd study on a trained engine checkpoint ----------------------------------------
    if "zstd" not in skip:
        study = {}
        eng_dir = os.path.join(root_dir, "build-bench", "bench-engine",
                               "%s-%d" % (a.engine_model, a.engine_steps))
        if not os.path.exists(os.path.join(eng_dir, "latest")):
            shutil.rmtree(eng_dir, ignore_errors=True)
            os.makedirs(eng_dir)
            env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
                       OMPI_MCA_rmaps_base_oversubscribe="1")
            log("training engine_min --model %s for %d steps (cached in %s)" %
                (a.engine_model, a.engine_steps, eng_dir))
            _, _, t, _, _ = R.run(["mpirun", "--allow-run-as-root", "--oversubscribe", "-n", "2",
                                   os.path.join(bin_dir, "engine_min"), "train", "--model",
                                   a.engine_model, "--steps", str(a.engine_steps), "--save-every",
                                   "0", "--ckpt-dir", eng_dir], env=env)
            study["train_seconds"] = t
        j, _, _ = R.json([ckpt_io, "zstd", eng_dir, "--levels", "1,3,9", "--max-mib", "64"])
        study["engine"] = {"model": a.engine_model, "steps": a.engine_steps, "dir": eng_dir,
                           "states": j["states"]}
        j, _, _ = R.json([ckpt_io, "zstd", ck_root, "--levels", "1,3", "--max-mib", "32"])
        study["synthetic"] = {"states": j["states"],
                              "note": "ckpt synth values: uniform random mantissas"}
        ph["zstd_study"] = study
        # End to end on the trained checkpoint's sizes is small; the write-path cost of shuffle
        # on the big synthetic save:
        zs_root = os.path.join(work, "ckpt_zstd_study")
        for comp in ["zstd:1", "zstd:1+shuffle"]:
            if comp == a.compress:
                continue
            shutil.rmtree(zs_root, ignore_errors=True)
            j, _, rss = R.json([ckpt_io, "save", zs_root, "--ranks", str(a.ranks), "--params",
                                str(params), "--reps", str(a.reps2), "--drop-caches", "--compress",
                                comp])
            record("save_" + comp.replace(":", "").replace("+", "_"), j["logical_bytes"],
                   [r["seconds"] for r in j["reps"]], rss, raw_w_gibs,
                   {"file_bytes": j["reps"][-1]["file_bytes"],
                    "compression_ratio": j["logical_bytes"] / j["reps"][-1]["file_bytes"],
                    "compress": comp})
        shutil.rmtree(zs_root, ignore_errors=True)

    # --- the compression rule, measured on a throttled disk (issue 19 item 5) ---------------
    # An uncompressed and a --compress save of half of --size, alternating, with the disk
    # throttled to each of --rule-rates: the rule "compress when the disk writes below X" is
    # the rate where the two take as long (interpolated), and C, the compressed save's own
    # rate, is its logical bytes over its unthrottled time.
    if "rule" not in skip:
        try:
            ph["compress_rule"] = compress_rule(a, [int(x * MiB) for x in rule_rates], work,
                                                ckpt_io, ckpt, R)
        except throttle.Unavailable as e:
            res["notes"].append("phase compress_rule skipped: %s" % e)
            log(res["notes"][-1])

    # --- async save: the training stall against a memcpy, the persist against a sync save --
    if "async" not in skip:
        j, _, rss = R.json([ckpt_io, "async", os.path.join(work, "async"), "--ranks", str(a.ranks),
                            "--params", str(params), "--reps", str(max(4, a.reps + 1))])
        steady = j["reps"][1:]  # repetition 0 allocates and first touches the staging memory
        ph["async_save"] = {
            "bytes": j["logical_bytes"], "maxrss_kib": rss, "ranks": a.ranks,
            "memcpy_seconds": stats([r["memcpy_seconds"] for r in steady]),
            "stall_seconds": stats([r["stall_seconds"] for r in steady]),
            "stall_ratio": stats([r["stall_seconds"] / r["memcpy_seconds"] for r in steady]),
            "persist_seconds": stats([r["persist_seconds"] for r in steady]),
            "sync_seconds": stats([r["sync_seconds"] for r in steady]),
            "persist_ratio": stats([r["persist_seconds"] / r["sync_seconds"] for r in steady]),
            "first_stall_seconds": j["reps"][0]["stall_seconds"],
            "staging_bytes_rank0": j["staging_bytes_rank0"],
            "staging_allocations_rank0": j["staging_allocations_rank0"]}
        log("async save: stall %.3f s vs memcpy %.3f s (%.2fx); persist %.2f s vs sync %.2f s" % (
            ph["async_save"]["stall_seconds"]["median"], ph["async_save"]["memcpy_seconds"]["median"],
            ph["async_save"]["stall_ratio"]["median"], ph["async_save"]["persist_seconds"]["median"],
            ph["async_save"]["sync_seconds"]["median"]))
    if "async_engine" not in skip:
        rows = []
        for mode in ["sync", "async"]:
            d = os.path.join(work, "async-engine-" + mode)
            cmd = [os.path.join(bin_dir, "engine_min"), "train", "--model", a.async_model,
                   "--steps", str(a.async_steps), "--save-every", "1", "--warmup", "2",
                   "--keep-last", "2", "--ckpt-dir", d]
            o, _, secs, rss, _ = R.run(cmd + (["--async-save"] if mode == "async" else []))
            rate = re.search(r"(\d+) tokens in ([\d.]+) s: ([\d.]+) tokens/s", o)
            stall = re.search(r"(\d+) saves \((\w+)\) in the loop: ([\d.]+) s inside Save", o)
            rows.append({"mode": mode, "tokens": int(rate.group(1)), "seconds": float(rate.group(2)),
                         "tokens_per_s": float(rate.group(3)), "saves": int(stall.group(1)),
                         "saved_as": stall.group(2), "inside_save_seconds": float(stall.group(3)),
                         "maxrss_kib": rss})
            shutil.rmtree(d, ignore_errors=True)
        ph["async_engine"] = {"model": a.async_model, "steps": a.async_steps, "rows": rows,
                              "speedup": rows[1]["tokens_per_s"] / rows[0]["tokens_per_s"]}
        log("engine_min --model %s --save-every 1: %.1f tokens/s sync, %.1f async" % (
            a.async_model, rows[0]["tokens_per_s"], rows[1]["tokens_per_s"]))

    # --- targets -------------------------------------------------------------------------
    T = res["targets"]

    def target(name, value, op, goal, unit="", paired=None, null=None):
        ok = value >= goal if op == ">=" else value <= goal
        T.append({"target": name, "value": value, "goal": "%s %s" % (op, goal),
                  "status": "PASS" if ok else "MISS"})
        if paired and "ratio_best_variant" in paired:
            # Beside it, not counted: the pairs against the variant with the best median.
            T[-1]["against_best_variant"] = paired["ratio_best_variant"]["median"]
            T[-1]["best_variant"] = paired["best_variant_by_median"]
        if null:
            # Beside it, not counted: the same ratio of the calibration run, a floor variant
            # timed in ckpt's place (what the pairing gives the floor itself).
            T[-1]["null"] = null["ratio"]["median"]
            T[-1]["null_variant"] = null["variant"]

    for key, name in [("save", "save >= 0.9x raw write"),
                      ("load_verified", "load (verified) >= 0.9x raw read"),
                      ("save_procs", "save, one process per rank >= 0.9x raw write"),
                      ("load_verified_procs", "load, one process per rank >= 0.9x raw read"),
                      ("check_deep", "check --deep >= 0.9x cold read of the files"),
                      ("check_deep_many_files", "check --deep of --many-ranks files >= 0.9x "
                                                "cold read of the files"),
                      ("deepspeed_check", "check of a DeepSpeed checkpoint >= 0.9x cold read of "
                                          "its files"),
                      ("deepspeed_lora_check", "check of a LoRA-like DeepSpeed checkpoint >= 0.9x "
                                               "cold read of its files")]:
        if key not in ph:
            continue
        target(name + " (paired, median of reps)", ph[key]["paired"]["ratio"]["median"], ">=",
               0.9, paired=ph[key]["paired"], null=ph[key].get("null"))
    if "export_fp32" in ph:
        e = ph["export_fp32"]
        target("export >= 0.9x read+write floor (paired, its own output files)", e["ratio"],
               ">=", 0.9, null=e.get("null"))
        target("export peak RSS <= 2x largest tensor + 64 MiB (MiB)", e["maxrss_kib"] / 1024,
               "<=", round(e["rss_bound_kib"] / 1024, 1))
    if "export_fp32_many_files" in ph:
        e = ph["export_fp32_many_files"]
        target("export of %d rank files >= 0.9x read+write floor (paired)" % e["rank_files"],
               e["ratio"], ">=", 0.9)
    if "reshard" in ph:
        target("reshard bytes read per rank <= 1.05x owned", ph["reshard"]["max_read_ratio"],
               "<=", 1.05)
    for k in sorted(x for x in ph if x.startswith("reshard_load_")):
        target("load-time reshard %d->%d: read / (1.05x owned + a piece per slice edge)" %
               (ph[k]["from"], ph[k]["to"]),
               max(x["bytes_read"] / (1.05 * x["bytes_owned"] + 2 * x["slices"] * x["piece_bytes"])
                   for x in ph[k]["ranks"]), "<=", 1.0)
    if "next_update_cpu" in ph:
        target("CPU next-update >= 0.5x memcpy", ph["next_update_cpu"]["ratio"]["median"], ">=", 0.5)
    if "async_save" in ph:
        target("async save stall <= 1.2x memcpy of the same bytes (median)",
               ph["async_save"]["stall_ratio"]["median"], "<=", 1.2)
    res["elapsed_seconds"] = time.perf_counter() - t_start
    res["machine"]["loadavg_at_end"] = os.getloadavg()
    print_table(res)
    if a.markdown:
        with open(a.markdown, "w") as f:
            f.write(markdown(res))
        log("wrote %s" % a.markdown)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1)
        log("wrote %s" % a.json)
    if mem:
        mem.close()  # the work directory's files go with the disk
    shutil.rmtree(work, ignore_errors=True)
    if slow:
        slow.close()
    return 0


def compress_rule(a, rates, work, ckpt_io, ckpt, R):
    """The compress_rule phase: at each of `rates` (--rule-rates as main checked them, in bytes
    per second of writes the work directory's disk is throttled to; 0: unthrottled), --reps2
    (at least 3) alternating pairs of an uncompressed and a --compress save (ckpt_io save,
    ranks as threads) of half of --size (at least a second at 400 MiB/s for 1 GiB: the kernel
    lets a throttled stream run ahead of its limit for about a tenth of a second).
    Then `ckpt probe` of the same bytes on the unthrottled disk (--reps2 pairs, at least 3): the
    crossover a user's probe estimates, beside the one measured here (its accuracy).
    Raises throttle.Unavailable where the disk cannot be throttled."""
    slow = throttle.Throttle(work, name="ckpt-rule")
    params = max(64, a.size // 2 // 12)
    reps = max(3, a.reps2)
    root = os.path.join(work, "compress_rule")
    out = {"compress": a.compress, "ranks": a.ranks, "reps": reps, "cgroup": slow.kind,
           "disk": slow.dev, "rows": []}
    try:
        for rate in rates:
            slow.set(write_bps=rate)
            secs = {"none": [], "compressed": []}
            row = {"write_bytes_per_s": rate or None}
            for rep in range(reps):
                for comp in ["none", a.compress] if rep % 2 == 0 else [a.compress, "none"]:
                    shutil.rmtree(root, ignore_errors=True)
                    cmd = [ckpt_io, "save", root, "--ranks", str(a.ranks), "--params", str(params),
                           "--reps", "1", "--drop-caches"]
                    key = "none"
                    if comp != "none":
                        cmd += ["--compress", comp]
                        key = "compressed"
                    j, _, _ = R.json(cmd, preexec=slow.preexec)
                    secs[key].append(j["reps"][0]["seconds"])
                    row["file_bytes_" + key] = j["reps"][0]["file_bytes"]
                    out["bytes"] = j["logical_bytes"]
            row["none_seconds"] = stats(secs["none"])
            row["compressed_seconds"] = stats(secs["compressed"])
            row["speedup"] = row["none_seconds"]["median"] / row["compressed_seconds"]["median"]
            out["rows"].append(row)
            log("compress_rule at %s: uncompressed %.3f s, %s %.3f s, speedup %.2f" % (
                "%.0f MiB/s" % (rate / MiB) if rate else "full speed",
                row["none_seconds"]["median"], a.compress, row["compressed_seconds"]["median"],
                row["speedup"]))
        half = a.size // 2
        if half >= 16 * MiB:
            shutil.rmtree(root, ignore_errors=True)
            os.makedirs(root)
            slow.set(write_bps=0)
            # A failed probe (its --json error object) is a note, not the end of the bench.
            o, e, _, _, rc = R.run([ckpt, "probe", root, "--size", str(half), "--ranks",
                                    str(a.ranks), "--compress", a.compress, "--pairs", str(reps),
                                    "--json"], check=False, preexec=slow.preexec)
            try:
                j = json.loads(o)
            except ValueError:
                j = {"error": {"message": "exit %d: %s" % (rc, e.strip()[-300:])}}
            if "error" in j:
                out["probe_note"] = "ckpt probe failed: %s" % j["error"].get("message")
                log("compress_rule: " + out["probe_note"])
            else:
                out["probe"] = {k: j[k] for k in ("recommended", "crossover_bytes_per_s",
                                                   "ceiling_bytes_per_s", "compression_ratio")}
                out["probe"]["speedup"] = j["disk"]["speedup"]
                log("compress_rule: ckpt probe recommends %s (estimate %s)" % (
                    j["recommended"], "%.2f GiB/s" % (j["crossover_bytes_per_s"] / GiB)
                    if j["crossover_bytes_per_s"] else "none: compression won"))
        else:
            out["probe_note"] = "ckpt probe not run: half of --size is under its 16 MiB"
    finally:
        shutil.rmtree(root, ignore_errors=True)
        slow.close()
    x, how = throttle.crossover([(r["write_bytes_per_s"], r["speedup"]) for r in out["rows"]])
    out["crossover_bytes_per_s"], out["crossover_note"] = x, how
    free = [r for r in out["rows"] if not r["write_bytes_per_s"]]
    if free:
        out["compressed_save_bytes_per_s"] = out["bytes"] / free[0]["compressed_seconds"]["median"]
        out["uncompressed_save_bytes_per_s"] = out["bytes"] / free[0]["none_seconds"]["median"]
    out["compression_ratio"] = out["bytes"] / out["rows"][-1]["file_bytes_compressed"]
    return out


def even_share(total, sizes):
    """The least per-file count n with sum(min(size, n)) >= total: `total` bytes read from the
    start of files of these sizes, each up to n (all of a file shorter than n)."""
    left, n = total, 0
    for i, s in enumerate(sorted(sizes)):
        share = -(-left // (len(sizes) - i))
        if s >= share:
            return max(n, share)
        left -= s
        n = s
    return n


def ds_files(root):
    """A DeepSpeed checkpoint's .pt files, sorted."""
    return sorted(os.path.join(dp, f) for dp, _, fs in os.walk(root) for f in fs
                  if f.endswith(".pt"))


def save_tag(root):
    return open(os.path.join(root, "latest")).read().split("\n")[0].strip()  # line 1: the tag


def memory_disk_text(res):
    """--memory-disk's description for the reports, after their own "on a memory disk: "."""
    text = res["memory_disk"]["text"]
    return text[len("a memory disk: "):] if text.startswith("a memory disk: ") else text


def print_table(res):
    ph = res["phases"]
    m = res["machine"]
    print()
    print("ckpt benchmark: %.2f GiB, %d ranks, %d reps, %s" %
          (res["size_bytes"] / GiB, res["ranks"], res["reps"], res["when_utc"]))
    print("machine: %s, %s cores, %s GiB RAM; disk: %s; load avg %s -> %s" %
          (m.get("cpu", "?"), m.get("nproc"), m.get("mem_gib"), m.get("disk", "?"),
           "%.1f" % m["loadavg_at_start"][0], "%.1f" % m["loadavg_at_end"][0]))
    print("page cache: %s" % res["drop_caches"])
    if "memory_disk" in res:
        print("every phase on a memory disk: %s" % memory_disk_text(res))
    if "throttle" in res:
        print("every phase on a throttled disk: %s" % res["throttle"]["text"])
    st = m.get("ckpt_start")
    if st:
        print("starting a command: ckpt --version %.1f ms, raw_io %.1f ms (medians)" %
              (st["ckpt_seconds"]["median"] * 1e3, st["raw_io_seconds"]["median"] * 1e3))
    t = m.get("memory_touch")
    if t:
        print("first touch of fresh memory: %.2f GiB/s in 4 KiB pages, %.2f in 2 MiB pages "
              "(%.2f reused at once, %.2f after 3 s)" %
              (t["small_pages_gib_per_s"], t["huge_pages_gib_per_s"],
               t["huge_pages_reused_at_once_gib_per_s"], t["huge_pages_reused_after_3s_gib_per_s"]))
    print()
    hdr = "%-34s %8s %24s %7s %7s %10s" % ("phase", "GiB", "seconds median (min-max)",
                                             "GiB/s", "ratio", "peak RSS")
    print(hdr)
    print("-" * len(hdr))

    def row(name, nbytes, secs, gibs, ratio, rss_kib):
        print("%-34s %8.2f %24s %7s %7s %9.0fM" % (
            name, nbytes / GiB, fmt_range(secs), "%.2f" % gibs if gibs else "-",
            "%.2fx" % ratio if ratio else "-", rss_kib / 1024))

    for name in ["raw_write", "raw_write_buffered", "raw_read", "raw_read_buffered"]:
        if name not in ph:
            continue
        d = ph[name]
        row("%s [%s]" % (name, d["variant"]), d["bytes"], d["seconds"],
            d["bytes"] / GiB / d["seconds"]["median"], None, d["maxrss_kib"])
    for name in ["raw_write", "raw_read"]:
        print("  %s variants (GiB/s, median): %s%s" % (name, ", ".join(
            "%s %.2f" % (v, ph[name]["bytes"] / GiB / st["median"])
            for v, st in ph[name]["variants"].items()),
            "; unsupported here: " + ", ".join(ph[name]["unsupported"])
            if ph[name]["unsupported"] else ""))
    order = ["save", "save_procs", "save_heap_state", "save_no_file_checksum", "save_zstd1"]
    order += [k for k in ph if k.startswith("save_zstd")]
    order += ["load_verified", "load_verified_procs", "load_unverified"]
    order += [k for k in ph if k.startswith("load_zstd")]
    order += ["check_deep", "check_deep_many_files", "deepspeed_check", "deepspeed_lora_check",
              "torch_save", "torch_load"]
    order = list(dict.fromkeys(order))  # save_zstd1 is also a variant
    for name in order:
        if name in ph:
            d = ph[name]
            label = name + (" [%.3f:1]" % d["compression_ratio"] if "compression_ratio" in d else "")
            row(label, d["bytes"], d["seconds"], d["gib_per_s"], d.get("ratio"), d["maxrss_kib"])
    for name in ["save", "save_heap_state", "save_no_file_checksum", "save_zstd1", "load_verified",
                 "check_deep", "check_deep_many_files", "deepspeed_check",
                 "deepspeed_lora_check"]:
        if "paired" in ph.get(name, {}):
            p = ph[name]["paired"]
            print("  %s vs the paired raw passes of the same bytes: best floor %s GiB/s, ratio %s"
                  "%s" % (name, fmt_range(p["raw_gib_per_s"]), fmt_range(p["ratio"]),
                          " (to the old buffered floor %s)" % fmt_range(p["ratio_to_buffered"])
                          if "ratio_to_buffered" in p else ""))
            if "null" in ph[name]:
                n = ph[name]["null"]
                print("    calibration: %s in its place: %s s, ratio %s" % (
                    n["variant"], fmt_range(n["seconds"]), fmt_range(n["ratio"])))
    for name in [k for k in ("export_fp32", "export_fp32_many_files", "deepspeed_export_fp32",
                             "deepspeed_to_universal",
                             "deepspeed_lora_export_fp32")
                 if "paired" in ph.get(k, {})]:
        e = ph[name]
        print("  %s vs its paired floor (%d output file(s)): reads %s GiB/s, writes %s GiB/s, "
              "ratio %s; run floor %.2f" % (name, e["files"], fmt_range(e["paired"]["read_gib_per_s"]),
                                            fmt_range(e["paired"]["write_gib_per_s"]),
                                            fmt_range(e["paired"]["ratio"]), e["ratio_run_floor"]))
        if e.get("copy_floor"):
            print("  %s vs its paired copy floor (raw_io copy, the same bytes, start to exit): %s s, "
                  "ratio %s (its own clock: %s s, ratio %s)" % (
                      name, fmt_range(e["copy_floor"]["seconds"]),
                      fmt_range(e["copy_floor"]["ratio"]),
                      fmt_range(e["copy_floor"]["own_clock_seconds"]),
                      fmt_range(e["copy_floor"]["ratio_own_clock"])))
        if e.get("null"):
            n = e["null"]
            print("  %s's calibration: raw_io copy --variant %s in its place: %s s, ratio %s to "
                  "the read+write floor, %s to the copy floor" % (
                      name, n["variant"], fmt_range(n["seconds"]), fmt_range(n["ratio"]),
                      fmt_range(n["copy_ratio"]) if n.get("copy_ratio") else "-"))
    for name in [k for k in ph if k.startswith(("save_zstd", "load_zstd"))]:
        if ph[name].get("codec"):
            c = ph[name]["codec"]
            print("  %s vs the paired codec floor (zstd itself, %d threads per rank): %s GiB/s, "
                  "ratio %s" % (name, c["threads_per_rank"], fmt_range(c["codec_gib_per_s"]),
                                fmt_range(c["ratio"])))
            if "cpu_seconds" in c:
                print("    CPU seconds: ckpt %s, codec floor %s" % (
                    fmt_range(c["cpu_seconds"]), fmt_range(c["codec_cpu_seconds"])))
    if "export_fp32" in ph:
        e = ph["export_fp32"]
        row("export_fp32 (read+write)", e["bytes_read"] + e["bytes_written"], e["seconds"],
            e["gib_per_s_read_plus_written"], e["ratio"], e["maxrss_kib"])
    if "export_fp32_many_files" in ph:
        e = ph["export_fp32_many_files"]
        row("export_fp32, %d files (r+w)" % e["rank_files"], e["bytes_read"] + e["bytes_written"],
            e["seconds"], e["gib_per_s_read_plus_written"], e["ratio"], e["maxrss_kib"])
    if "deepspeed_export_fp32" in ph:
        e = ph["deepspeed_export_fp32"]
        row("deepspeed ZeRO-2 export (r+w)", e["bytes_read"] + e["bytes_written"], e["seconds"],
            e["gib_per_s_read_plus_written"], e["ratio"], e["maxrss_kib"])
        print("  DeepSpeed checkpoint %.2f GiB on disk; peak RSS bound %.0f MiB" %
              (e["checkpoint_bytes"] / GiB, e["rss_bound_kib"] / 1024))
    if "deepspeed_to_universal" in ph:
        e = ph["deepspeed_to_universal"]
        row("deepspeed to-universal (r+w)", e["bytes_read"] + e["bytes_written"], e["seconds"],
            e["gib_per_s_read_plus_written"], e["ratio"], e["maxrss_kib"])
    if "deepspeed_lora_export_fp32" in ph:
        e = ph["deepspeed_lora_export_fp32"]
        row("deepspeed LoRA export (r+w)", e["bytes_read"] + e["bytes_written"], e["seconds"],
            e["gib_per_s_read_plus_written"], e["ratio"], e["maxrss_kib"])
        print("  LoRA-like checkpoint %.2f GiB on disk, %d frozen bf16 tensors; peak RSS bound "
              "%.0f MiB" % (e["checkpoint_bytes"] / GiB, e["frozen_tensors"],
                            e["rss_bound_kib"] / 1024))
    if "reshard" in ph:
        r = ph["reshard"]
        row("reshard %d->%d" % (r["from"], r["to"]), sum(x["bytes_read"] for x in r["ranks"]),
            r["seconds"], None, r["ratio"], r["maxrss_kib"])
        for x in r["ranks"]:
            print("    new rank %d: read %.1f MiB, owned %.1f MiB, ratio %.4f" %
                  (x["rank"], x["bytes_read"] / MiB, x["bytes_owned"] / MiB, x["ratio"]))
    for k in sorted(x for x in ph if x.startswith("reshard_load_")):
        r = ph[k]
        row("load-time reshard %d->%d (owned)" % (r["from"], r["to"]), r["bytes"], r["seconds"],
            r["gib_per_s"], r["ratio"]["median"], r["maxrss_kib"])
        print("  vs the paired raw reads of the bytes each new rank owns: best floor %s s, ratio "
              "%s%s; read/owned max %.4f" % (
                  fmt_range(r["raw_seconds"]), fmt_range(r["ratio"]),
                  " (to the old buffered floor %s)" % fmt_range(r["paired"]["ratio_to_buffered"])
                  if "ratio_to_buffered" in r["paired"] else "", r["max_read_ratio"]))
        if "fresh_memory_ratio" in r:
            print("  vs the same reads into fresh memory (first touch paid): %s s, ratio %s" % (
                fmt_range(r["fresh_memory_seconds"]), fmt_range(r["fresh_memory_ratio"])))
    if "reshard_rss" in ph:
        print("reshard peak RSS by checkpoint size:")
        for x in ph["reshard_rss"]["rows"]:
            print("  %.2f GiB %d->%d --threads %d: %.0f MiB (one new shard %.0f MiB), %.1f s" % (
                x["size_bytes"] / GiB, x["from"], x["to"], x["threads"], x["maxrss_kib"] / 1024,
                x["largest_shard_bytes"] / MiB, x["seconds"]))
    if "torch" in ph:
        print("%-26s %s" % ("torch.save/torch.load", ph["torch"]["status"]))
    if "next_update_cpu" in ph:
        n = ph["next_update_cpu"]
        print("%-26s pass %s GB/s, memcpy %s GB/s, ratio %s (%s)" % (
            "next-update CPU", fmt_range(n["pass_gb_per_s"]), fmt_range(n["memcpy_gb_per_s"]),
            fmt_range(n["ratio"]), n["timing"]))
    if "scaling" in ph:
        print()
        print("scaling, %.0f MiB per rank: ranks, GiB, save s, raw write s, save GiB/s, ratio" %
              (ph["scaling"]["shard_bytes_per_rank"] / MiB))
        for r in ph["scaling"]["rows"]:
            print("  %d  %6.2f  %s  %s  %6.2f  %.2fx" % (
                r["ranks"], r["bytes"] / GiB, fmt_range(r["save_seconds"]),
                fmt_range(r["raw_write_seconds"]), r["save_gib_per_s"], r["ratio"]))
    if "zstd_study" in ph:
        z = ph["zstd_study"]
        for src in ["engine", "synthetic"]:
            if src not in z:
                continue
            print()
            title = ("trained engine_min --model %s, %d steps" % (z[src]["model"], z[src]["steps"])
                     if src == "engine" else "synthetic (random mantissas)")
            print("zstd on %s: state, level, shuffle, ratio, compress MiB/s, decompress MiB/s "
                  "(one thread, 4 MiB chunks)" % title)
            for state, d in z[src]["states"].items():
                for r in d["rows"]:
                    print("  %-32s %2d %-24s %6.3f %8.0f %8.0f" % (
                        "%s [%.0f MiB]" % (state, d["bytes"] / MiB), r["level"],
                        r.get("variant", "yes" if r["shuffle"] else "no"), r["ratio"], r["compress_mib_per_s"],
                        r["decompress_mib_per_s"]))
    if "async_save" in ph:
        x = ph["async_save"]
        print()
        print("async save, %.2f GiB over %d ranks (steady state; first save's stall %.3f s):" % (
            x["bytes"] / GiB, x["ranks"], x["first_stall_seconds"]))
        print("  stall in Save %s s, memcpy %s s, ratio %s" % (
            fmt_range(x["stall_seconds"], digits=3), fmt_range(x["memcpy_seconds"], digits=3),
            fmt_range(x["stall_ratio"])))
        print("  Save to committed %s s, synchronous save %s s, ratio %s" % (
            fmt_range(x["persist_seconds"]), fmt_range(x["sync_seconds"]),
            fmt_range(x["persist_ratio"])))
    if "async_engine" in ph:
        e = ph["async_engine"]
        print("engine_min --model %s, %d steps, --save-every 1:" % (e["model"], e["steps"]))
        for r in e["rows"]:
            print("  %-5s %8.1f tokens/s (%d tokens in %.1f s), %.2f s inside Save" % (
                r["mode"], r["tokens_per_s"], r["tokens"], r["seconds"], r["inside_save_seconds"]))
    if "compress_rule" in ph:
        print()
        print(compress_rule_text(ph["compress_rule"]))
    print()
    print("targets:")
    for t in res["targets"]:
        print("  %-4s %-55s %.3f (goal %s)%s%s" % (
            t["status"], t["target"], t["value"], t["goal"],
            "; %.3f against %s alone" % (t["against_best_variant"], t["best_variant"])
            if "against_best_variant" in t else "",
            "; the floor itself (%s in ckpt's place) %.3f" % (t["null_variant"], t["null"])
            if "null" in t else ""))
    print("elapsed %.0fs" % res["elapsed_seconds"])


def compress_rule_text(c, md=False):
    """The compress_rule phase: what was measured, a table (Markdown with md) and the rule."""
    what = ("%.2f GiB over %d ranks, %s stored %.3fx smaller, medians of %d alternating pairs, "
            "the disk (%s) throttled by cgroup %s" % (
                c["bytes"] / GiB, c["ranks"], "`%s`" % c["compress"] if md else c["compress"],
                c["compression_ratio"], c["reps"], c["disk"], c["cgroup"]))
    head = ("disk writes", "uncompressed s", "%s s" % c["compress"], "speedup")
    if md:
        L = ["The compression rule (`compress_rule`): %s:" % what, ""]
        L.append("| %s | %s | %s | %s |" % head)
        L.append("|---|---:|---:|---:|")
    else:
        L = ["compression rule: %s" % what]
        L.append("  %-14s %24s %24s %8s" % head)
    for r in c["rows"]:
        rate = ("%.0f MiB/s" % (r["write_bytes_per_s"] / MiB) if r["write_bytes_per_s"]
                else "unthrottled")
        cells = (rate, fmt_range(r["none_seconds"], digits=3),
                 fmt_range(r["compressed_seconds"], digits=3), "%.2f" % r["speedup"])
        L.append(("| %s | %s | %s | %s |" if md else "  %-14s %24s %24s %8s") % cells)
    x = c.get("crossover_bytes_per_s")
    rule = ("compress when the disk writes below %.2f GiB/s (%s)" % (x / GiB, c["crossover_note"])
            if x else "no crossover: %s" % c["crossover_note"])
    if c.get("compressed_save_bytes_per_s"):
        rule += "; unthrottled the compressed save ran at %.2f GiB/s, the uncompressed at %.2f" % (
            c["compressed_save_bytes_per_s"] / GiB, c["uncompressed_save_bytes_per_s"] / GiB)
    p = c.get("probe")
    if p:
        est = p["crossover_bytes_per_s"]
        rule += ". ckpt probe of the same state on the unthrottled disk: %s, %s" % (
            "compress" if p["recommended"] != "none" else "do not compress",
            "estimate %.2f GiB/s%s" % (est / GiB, " (%.2fx the measured crossover)" % (est / x)
                                       if x else "")
            if est else "no estimate (compression won there)")
        if p.get("ceiling_bytes_per_s"):
            rule += ", ceiling %.2f GiB/s" % (p["ceiling_bytes_per_s"] / GiB)
    elif c.get("probe_note"):
        rule += ". " + c["probe_note"]
    if md:
        L.append("")
    L.append(("" if md else "  ") + rule)
    return "\n".join(L)


def markdown(res):
    ph = res["phases"]
    m = res["machine"]
    L = []
    L.append("Command: `%s` (%s UTC). Machine: %s, %s cores (`nproc`), %s GiB RAM, disk `%s`; "
             "load average %.1f at start, %.1f at end. Page cache between phases: %s." % (
                 res["command"], res["when_utc"], m.get("cpu", "?"), m.get("nproc"),
                 m.get("mem_gib"), " ".join(m.get("disk", "?").split()[:2]),
                 m["loadavg_at_start"][0], m["loadavg_at_end"][0], res["drop_caches"]))
    if "memory_disk" in res:
        L.append("")
        L.append("Every phase ran on a memory disk: %s." % memory_disk_text(res))
    if "throttle" in res:
        L.append("")
        L.append("Every phase ran on a throttled disk: %s." % res["throttle"]["text"])
    st = m.get("ckpt_start")
    if st:
        L.append("")
        L.append("Starting a command (program warm, median of %d): `ckpt --version` %.1f ms, "
                 "`raw_io` %.1f ms. The CLI rows (check --deep, export-fp32) are timed as whole "
                 "commands, their floors inside `raw_io`'s process." %
                 (st["ckpt_seconds"]["n"], st["ckpt_seconds"]["median"] * 1e3,
                  st["raw_io_seconds"]["median"] * 1e3))
    t = m.get("memory_touch")
    if t:
        L.append("")
        L.append("First touch of fresh memory (`raw_io touch`): %.2f GiB/s in 4 KiB pages, %.2f in "
                 "2 MiB pages; 2 MiB pages freed and touched again at once %.2f, after 3 s %.2f." %
                 (t["small_pages_gib_per_s"], t["huge_pages_gib_per_s"],
                  t["huge_pages_reused_at_once_gib_per_s"], t["huge_pages_reused_after_3s_gib_per_s"]))
    L.append("")
    L.append("| phase | GiB | seconds, median (min-max) | GiB/s | ratio to floor | peak RSS |")
    L.append("|---|---:|---:|---:|---:|---:|")

    def row(name, nbytes, secs, gibs, ratio, rss_kib):
        L.append("| %s | %.2f | %s | %s | %s | %.0f MiB |" % (
            name, nbytes / GiB, fmt_range(secs), "%.2f" % gibs if gibs else "-",
            "%.2fx" % ratio if ratio else "-", rss_kib / 1024))

    for name in ["raw_write", "raw_write_buffered", "raw_read", "raw_read_buffered"]:
        if name not in ph:
            continue
        d = ph[name]
        label = ("%s, best floor: `%s`" if name in ("raw_write", "raw_read") else
                 "%s, old floor: `%s`") % (name.split("_")[1], d["variant"])
        row("raw " + label, d["bytes"], d["seconds"], d["bytes"] / GiB / d["seconds"]["median"],
            None, d["maxrss_kib"])
    order = ["save", "save_procs", "save_heap_state", "save_no_file_checksum", "save_zstd1"]
    order += [k for k in ph if k.startswith("save_zstd")]
    order += ["load_verified", "load_verified_procs", "load_unverified"]
    order += [k for k in ph if k.startswith("load_zstd")]
    order += ["check_deep", "check_deep_many_files", "deepspeed_check", "deepspeed_lora_check",
              "torch_save", "torch_load"]
    order = list(dict.fromkeys(order))  # save_zstd1 is also a variant
    for name in order:
        if name in ph:
            d = ph[name]
            label = "`%s`" % name + (" (file %.3f:1)" % d["compression_ratio"]
                                     if "compression_ratio" in d else "")
            row(label, d["bytes"], d["seconds"], d["gib_per_s"], d.get("ratio"), d["maxrss_kib"])
    if "export_fp32" in ph:
        e = ph["export_fp32"]
        row("`export_fp32` (read + written)", e["bytes_read"] + e["bytes_written"], e["seconds"],
            e["gib_per_s_read_plus_written"], e["ratio"], e["maxrss_kib"])
    if "export_fp32_many_files" in ph:
        e = ph["export_fp32_many_files"]
        row("`export_fp32_many_files`, %d rank files (read + written)" % e["rank_files"],
            e["bytes_read"] + e["bytes_written"], e["seconds"], e["gib_per_s_read_plus_written"],
            e["ratio"], e["maxrss_kib"])
    if "reshard" in ph:
        r = ph["reshard"]
        row("`reshard %d->%d` (bytes read by new ranks)" % (r["from"], r["to"]),
            sum(x["bytes_read"] for x in r["ranks"]), r["seconds"], None, r["ratio"],
            r["maxrss_kib"])
    for k in sorted(x for x in ph if x.startswith("reshard_load_")):
        r = ph[k]
        row("load-time reshard %d->%d (bytes owned; ratio: best paired raw read)" % (r["from"], r["to"]),
            r["bytes"], r["seconds"], r["gib_per_s"], r["ratio"]["median"], r["maxrss_kib"])
    if "torch" in ph:
        L.append("| torch.save / torch.load | %s | | | | |" % ph["torch"]["status"])
    L.append("")
    for name in ["save", "save_procs", "save_heap_state", "save_no_file_checksum", "save_zstd1",
                 "load_verified", "load_verified_procs", "check_deep", "check_deep_many_files",
                 "deepspeed_check",
                 "deepspeed_lora_check"]:
        if "paired" in ph.get(name, {}):
            p = ph[name]["paired"]
            L.append("`%s` against the paired raw %ss of the same bytes (%s, three seconds "
                     "before or after each repetition, alternating): floor "
                     "%s GiB/s, ratio %s%s." % (
                         name, "write" if name.startswith("save") else "read",
                         "the best of every write variant" if name.startswith("save")
                         else "the run's best read variant",
                         fmt_range(p["raw_gib_per_s"]), fmt_range(p["ratio"]),
                         "; against the old buffered floor %s" % fmt_range(p["ratio_to_buffered"])
                         if "ratio_to_buffered" in p else ""))
            L.append("")
    for name in [k for k in ("export_fp32", "export_fp32_many_files", "deepspeed_export_fp32",
                             "deepspeed_to_universal",
                             "deepspeed_lora_export_fp32")
                 if "paired" in ph.get(k, {})]:
        e = ph[name]
        L.append("`%s` against its paired floor (reading as many bytes as it reads from the "
                 "source's data files by the best of every read variant, plus writing its %d output "
                 "file(s) by the best of every write variant, three seconds before or after each "
                 "repetition, alternating): reads %s GiB/s, writes %s GiB/s, floor %s s, ratio %s; "
                 "against the run's four-file floor %.2f." % (
                     name, e["files"], fmt_range(e["paired"]["read_gib_per_s"]),
                     fmt_range(e["paired"]["write_gib_per_s"]),
                     fmt_range(e["paired"]["floor_seconds"]), fmt_range(e["paired"]["ratio"]),
                     e["ratio_run_floor"]))
        if e.get("copy_floor"):
            L.append("")
            L.append("`%s` against its paired copy floor (`raw_io copy`: the same bytes read from "
                     "the same files and written to one file by one program that overlaps its "
                     "reads and writes, best of %s, timed from its start to its exit as export "
                     "is): %s s, ratio %s (by its own clock: %s s, ratio %s)." % (
                         name, ", ".join(sorted(set(e["copy_floor"]["variants"]))),
                         fmt_range(e["copy_floor"]["seconds"]), fmt_range(e["copy_floor"]["ratio"]),
                         fmt_range(e["copy_floor"]["own_clock_seconds"]),
                         fmt_range(e["copy_floor"]["ratio_own_clock"])))
        L.append("")
    for name in [k for k in ph if k.startswith(("save_zstd", "load_zstd"))]:
        if ph[name].get("codec"):
            c = ph[name]["codec"]
            L.append("`%s` against the paired codec floor (zstd's own %s of the same bytes, same "
                     "level, shuffle and chunks, %d threads per rank, plus the %s; before or "
                     "after each repetition, alternating): %s GiB/s, ratio %s." % (
                         name, "multithreaded compression" if name.startswith("save")
                         else "decompression of the chunk frames", c["threads_per_rank"],
                         "write and fsync" if name.startswith("save") else "cold read",
                         fmt_range(c["codec_gib_per_s"]), fmt_range(c["ratio"])))
            if "cpu_seconds" in c:
                L[-1] += (" CPU seconds per repetition: ckpt %s, the codec floor %s (of %d "
                          "cores: both bound by the cores when these near the seconds times "
                          "the cores)." % (fmt_range(c["cpu_seconds"]),
                                           fmt_range(c["codec_cpu_seconds"]),
                                           os.cpu_count() or 1))
            L.append("")
    if "reshard" in ph:
        L.append("Reshard read accounting: " + "; ".join(
            "new rank %d read %.1f MiB, owns %.1f MiB (%.4f)" % (
                x["rank"], x["bytes_read"] / MiB, x["bytes_owned"] / MiB, x["ratio"])
            for x in ph["reshard"]["ranks"]) + ".")
        L.append("")
    for k in sorted(x for x in ph if x.startswith("reshard_load_")):
        r = ph[k]
        L.append("Load-time reshard %d->%d (`ckpt::LoadResharded`, every new rank at once) against "
                 "the paired raw reads of the bytes each new rank owns (every variant, just "
                 "before each repetition): best floor %s s, ckpt %s s, ratio %s%s; bytes read / "
                 "owned per new rank: %s." % (
                     r["from"], r["to"], fmt_range(r["raw_seconds"]), fmt_range(r["seconds"]),
                     fmt_range(r["ratio"]),
                     "; against the old buffered floor %s" % fmt_range(
                         r["paired"]["ratio_to_buffered"])
                     if "ratio_to_buffered" in r["paired"] else "",
                     ", ".join("%.4f" % x["ratio"] for x in r["ranks"])))
        if "fresh_memory_ratio" in r:
            L.append("")
            L.append("The shards come back in new memory, whose pages the first write faults in: "
                     "the same best-variant reads into memory allocated untouched (huge pages "
                     "asked for) and first touched inside the clock took %s s, and the load-time reshard is %s of that." % (
                         fmt_range(r["fresh_memory_seconds"]), fmt_range(r["fresh_memory_ratio"])))
        L.append("")
    if "reshard_rss" in ph:
        L.append("| `ckpt reshard` | state GiB | --threads | one new shard | seconds | peak RSS |")
        L.append("|---|---:|---:|---:|---:|---:|")
        for x in ph["reshard_rss"]["rows"]:
            L.append("| %d->%d | %.2f | %d | %.0f MiB | %.1f | %.0f MiB |" % (
                x["from"], x["to"], x["state_bytes"] / GiB, x["threads"],
                x["largest_shard_bytes"] / MiB, x["seconds"], x["maxrss_kib"] / 1024))
        L.append("")
    if "next_update_cpu" in ph:
        n = ph["next_update_cpu"]
        L.append("next-update CPU (%.0f MiB of w, m, v, g; %s): pass %s GB/s, memcpy %s GB/s, "
                 "ratio %s." % (n["input_bytes"] / MiB, n["timing"], fmt_range(n["pass_gb_per_s"]),
                                fmt_range(n["memcpy_gb_per_s"]), fmt_range(n["ratio"])))
        if "next_update_cpu_64MiB" in ph:
            L.append("")
            L.append("At 64 MiB of inputs the same measurement gives a ratio of %s." %
                     fmt_range(ph["next_update_cpu_64MiB"]["ratio"]))
        L.append("")
    if "scaling" in ph:
        L.append("Scaling, %.0f MiB per rank:" % (ph["scaling"]["shard_bytes_per_rank"] / MiB))
        L.append("")
        L.append("| ranks | GiB | save s | raw write s | save GiB/s | raw GiB/s | ratio |")
        L.append("|---:|---:|---:|---:|---:|---:|---:|")
        for r in ph["scaling"]["rows"]:
            L.append("| %d | %.2f | %s | %s | %.2f | %.2f | %.2fx |" % (
                r["ranks"], r["bytes"] / GiB, fmt_range(r["save_seconds"]),
                fmt_range(r["raw_write_seconds"]), r["save_gib_per_s"], r["raw_gib_per_s"],
                r["ratio"]))
        L.append("")
    if "zstd_study" in ph:
        z = ph["zstd_study"]
        for src in ["engine", "synthetic"]:
            if src not in z:
                continue
            title = ("trained `engine_min --model %s`, %d steps" % (z[src]["model"], z[src]["steps"])
                     if src == "engine" else "the synthetic checkpoint (uniform random mantissas)")
            L.append("zstd on %s (one thread, 4 MiB chunks, best of 3 per chunk):" % title)
            L.append("")
            L.append("| state | MiB | level | shuffle (byte planes) | ratio | compress MiB/s | decompress MiB/s |")
            L.append("|---|---:|---:|---|---:|---:|---:|")
            for state, d in z[src]["states"].items():
                for r in d["rows"]:
                    L.append("| %s | %.1f | %d | %s | %.3f | %.0f | %.0f |" % (
                        state, d["bytes"] / MiB, r["level"], r.get("variant", "yes" if r["shuffle"] else "no"),
                        r["ratio"], r["compress_mib_per_s"], r["decompress_mib_per_s"]))
            L.append("")
    if "async_save" in ph:
        x = ph["async_save"]
        L.append("Async save, %.2f GiB over %d ranks (repetitions after the first; the first "
                 "save's stall, which allocates the staging memory, was %.3f s):" % (
                     x["bytes"] / GiB, x["ranks"], x["first_stall_seconds"]))
        L.append("")
        L.append("| measure | seconds, median (min-max) | ratio |")
        L.append("|---|---:|---:|")
        L.append("| training stall (time inside `AsyncSaver::Save`) | %s | %s × memcpy |" % (
            fmt_range(x["stall_seconds"], digits=3), fmt_range(x["stall_ratio"])))
        L.append("| memcpy of the same bytes, same run | %s | |" % fmt_range(
            x["memcpy_seconds"], digits=3))
        L.append("| async: `Save` to committed | %s | %s × sync |" % (
            fmt_range(x["persist_seconds"]), fmt_range(x["persist_ratio"])))
        L.append("| synchronous `SaveCheckpoint` | %s | |" % fmt_range(x["sync_seconds"]))
        L.append("")
    if "async_engine" in ph:
        e = ph["async_engine"]
        L.append("| `engine_min --model %s --save-every 1`, %d steps | tokens/s | seconds | "
                 "inside `Save` |" % (e["model"], e["steps"]))
        L.append("|---|---:|---:|---:|")
        for r in e["rows"]:
            L.append("| %s | %.1f | %.1f | %.2f s |" % (r["mode"], r["tokens_per_s"], r["seconds"],
                                                    r["inside_save_seconds"]))
        L.append("")
    if "compress_rule" in ph:
        L.append(compress_rule_text(ph["compress_rule"], md=True))
        L.append("")
    L.append("| target | measured | goal | status | against the variant with the best median "
             "(not counted) | the floor itself in ckpt's place (not counted) |")
    L.append("|---|---:|---|---|---|---|")
    for t in res["targets"]:
        L.append("| %s | %.3f | %s | **%s** | %s | %s |" % (
            t["target"], t["value"], t["goal"], t["status"],
            "%.3f (%s)" % (t["against_best_variant"], t["best_variant"])
            if "against_best_variant" in t else "",
            "%.3f (`%s`)" % (t["null"], t["null_variant"]) if "null" in t else ""))
    L.append("")
    L.append("Elapsed: %.0f s." % res["elapsed_seconds"])
    return "\n".join(L) + "\n"


if __name__ == "__main__":
    sys.exit(main())
