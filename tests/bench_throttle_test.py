#!/usr/bin/python3
"""tools/bench/throttle.py, which gives the bench a disk of a chosen speed (`tools/bench.sh
--throttle`, the compress_rule phase): the crossover it reports, the disk it finds, and, where
this machine lets it (root, a cgroup io or blkio controller), a throttled write that takes as
long as the limit says, and the cgroup gone afterwards."""
import os
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tools", "bench"))
import throttle  # noqa: E402

MiB = 1 << 20
GiB = 1 << 30


def test_crossover():
    # Won at 100 and 200 MiB/s, lost at 800: between 200 and 800, on a log scale.
    x, how = throttle.crossover([(100 * MiB, 1.25), (200 * MiB, 1.5), (800 * MiB, 0.5),
                                 (None, 0.7)])
    assert x is not None and "200 and 800" in how, how
    # speedup 1.5 -> 0.5: halfway in log(rate), sqrt(200 * 800) = 400 MiB/s.
    assert abs(x / MiB - 400) < 1e-6, x / MiB
    # The first crossing counts; rows come in any order.
    x, how = throttle.crossover([(800 * MiB, 0.5), (100 * MiB, 2.0), (400 * MiB, 1.0)])
    assert abs(x / MiB - 400) < 1e-6 and "400 and 800" in how, (x, how)
    x, how = throttle.crossover([(100 * MiB, 0.9), (400 * MiB, 0.5)])
    assert x is None and "lost at every rate" in how and "100 MiB/s" in how, how
    x, how = throttle.crossover([(100 * MiB, 1.9), (400 * MiB, 1.1)])
    assert x is None and "won at every rate" in how and "400 MiB/s" in how, how
    x, how = throttle.crossover([(None, 0.7)])
    assert x is None and "no throttled rate" in how, how


def test_rule_report():
    """bench.py's report of a compress_rule phase (its JSON as the phase leaves it): the table in
    text and Markdown, the crossover and the unthrottled rates."""
    import bench

    def st(x):
        return bench.stats([x, x * 1.01, x * 0.99])

    rows = []
    for mibps, none, comp in [(100, 5.2, 4.1), (400, 1.5, 1.25), (800, 0.9, 1.0), (0, 0.5, 0.9)]:
        r = {"write_bytes_per_s": mibps * MiB or None, "none_seconds": st(none),
             "compressed_seconds": st(comp), "speedup": none / comp,
             "file_bytes_none": 512 * MiB, "file_bytes_compressed": 417 * MiB}
        rows.append(r)
    c = {"compress": "zstd:1+shuffle", "ranks": 4, "reps": 3, "cgroup": "v1", "disk": "254:0",
         "rows": rows, "bytes": 512 * MiB}
    x, how = throttle.crossover([(r["write_bytes_per_s"], r["speedup"]) for r in rows])
    c["crossover_bytes_per_s"], c["crossover_note"] = x, how
    c["compressed_save_bytes_per_s"] = c["bytes"] / 0.9
    c["uncompressed_save_bytes_per_s"] = c["bytes"] / 0.5
    c["compression_ratio"] = 512 / 417
    text = bench.compress_rule_text(c)
    md = bench.compress_rule_text(c, md=True)
    for out in (text, md):
        assert "100 MiB/s" in out and "unthrottled" in out, out
        assert "compress when the disk writes below 0.6" in out, out
        assert "between 400 and 800 MiB/s" in out, out
    assert "| 800 MiB/s |" in md and "|---|" in md and "\n\ncompress when" in md, md
    assert "1.228x smaller" in text, text
    c2 = dict(c, crossover_bytes_per_s=None, crossover_note="compression won at every rate")
    assert "no crossover: compression won at every rate" in bench.compress_rule_text(c2)
    # ckpt probe's estimate beside the measured crossover, or why it did not run.
    c3 = dict(c, probe={"recommended": "none", "crossover_bytes_per_s": 1.1 * x,
                        "ceiling_bytes_per_s": 1.0 * GiB, "compression_ratio": 1.23,
                        "speedup": 0.55})
    for out in (bench.compress_rule_text(c3), bench.compress_rule_text(c3, md=True)):
        assert "ckpt probe of the same state on the unthrottled disk: do not compress" in out, out
        assert "(1.10x the measured crossover), ceiling 1.00 GiB/s" in out, out
    c4 = dict(c, probe_note="ckpt probe not run: half of --size is under its 16 MiB")
    assert "ckpt probe not run" in bench.compress_rule_text(c4)


def test_disk_of(path):
    """The whole disk under `path`, or None where it is on none (then nothing can be throttled
    and the live part is skipped)."""
    try:
        throttle.disk_of("/proc/self")
        raise AssertionError("/proc has no block device, disk_of accepted it")
    except throttle.Unavailable as e:
        assert "not on a block device" in str(e), e
    try:
        dev = throttle.disk_of(path)
    except throttle.Unavailable as e:
        print("%s" % e)
        return None
    assert os.path.exists("/sys/dev/block/" + dev), dev
    # A whole disk, never a partition: the kernel throttles requests where they reach it.
    assert not os.path.exists("/sys/dev/block/%s/partition" % dev), dev
    return dev


def test_live(path):
    """Where throttling works here: 24 MiB written with O_DIRECT at 32 MiB/s take at least 0.5 s
    (the limit allows some burst; a busy machine only makes it slower), in a child that joined
    through preexec; close() removes the cgroup. Returns whether it ran."""
    try:
        t = throttle.Throttle(path, name="ckpt-throttle-test")
    except throttle.Unavailable as e:
        print("live part skipped: %s" % e)
        return False
    target = os.path.join(path, "throttled.bin")
    try:
        t.set(write_bps=32 * MiB)
        assert "32 MiB/s" in t.describe(), t.describe()
        t0 = time.perf_counter()
        p = subprocess.run(["dd", "if=/dev/zero", "of=" + target, "bs=1M", "count=24",
                            "oflag=direct", "conv=fsync", "status=none"], preexec_fn=t.preexec)
        secs = time.perf_counter() - t0
        assert p.returncode == 0, p.returncode
        assert os.path.getsize(target) == 24 * MiB
        assert secs >= 0.5, "24 MiB at 32 MiB/s took only %.3f s: not throttled" % secs
        print("24 MiB written at 32 MiB/s in %.3f s (%s)" % (secs, t.describe()))
    finally:
        t.close()
        if os.path.exists(target):
            os.remove(target)
    assert not os.path.exists(t.dir), "cgroup %s left behind" % t.dir
    return True


def main():
    test_crossover()
    test_rule_report()
    # A directory on a real disk: the build tree's (ctest runs in it), else the system temp.
    path = tempfile.mkdtemp(prefix="ckpt-throttle-", dir=os.getcwd())
    try:
        ran = test_disk_of(path) is not None and test_live(path)
    finally:
        os.rmdir(path)
    print("bench_throttle_test: ok%s" % ("" if ran else " (no live throttle here)"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
