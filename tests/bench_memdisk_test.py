#!/usr/bin/python3
"""tools/bench/memdisk.py, which gives the bench a disk in memory (`tools/bench.sh --memory-disk`):
the reasons it refuses (a backing directory not on tmpfs, too little room there, a mount point
with files in it), the bench's report lines for it, and, where this machine lets it (root, loop
devices, a tmpfs /dev/shm), a real one: a mount of a /dev/loopN at the chosen directory, 4 MiB
written and read back with O_DIRECT, and nothing left once closed (no mount, no loop device,
no file on the tmpfs), a second close() doing nothing."""
import mmap
import os
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tools", "bench"))
import memdisk  # noqa: E402

MiB = 1 << 20
GiB = 1 << 30


def refused(expect, *args, **kwargs):
    """MemoryDisk(*args) raises Unavailable with `expect` in its reason, leaving nothing."""
    before = set(os.listdir(kwargs.get("backing_dir", "/dev/shm")))
    try:
        d = memdisk.MemoryDisk(*args, **kwargs)
    except memdisk.Unavailable as e:
        assert expect in str(e), "%r not in %r" % (expect, str(e))
        after = set(os.listdir(kwargs.get("backing_dir", "/dev/shm")))
        assert not [n for n in after - before if n.startswith("ckpt-memdisk-")], after - before
        return str(e)
    d.close()
    raise AssertionError("MemoryDisk%r was not refused (expected %r)" % (args, expect))


def test_refusals(tmp):
    """What can be provoked without root tricks."""
    mnt = os.path.join(tmp, "mnt")
    # The backing directory on the work disk: not memory.
    not_tmpfs = os.path.join(tmp, "backing")
    os.mkdir(not_tmpfs)
    m = memdisk.mount_of(not_tmpfs)
    if m and m[2] == "tmpfs":
        print("SKIP not-tmpfs refusal: %s is itself on tmpfs" % tmp)
    else:
        print("refused: %s" % refused("not on tmpfs", mnt, 64 * MiB, backing_dir=not_tmpfs))
    if memdisk.mount_of("/dev/shm")[2] != "tmpfs":
        print("SKIP tmpfs refusals: /dev/shm is not tmpfs here")
        return
    # More than the tmpfs has free.
    st = os.statvfs("/dev/shm")
    free = st.f_bavail * st.f_frsize
    print("refused: %s" % refused("not enough free space", mnt, free + GiB,
                                  backing_dir="/dev/shm"))
    # A mount point with a file in it (a disk there would hide it), and one that is a file.
    os.mkdir(mnt)
    with open(os.path.join(mnt, "keep"), "w") as f:
        f.write("x")
    print("refused: %s" % refused("not empty", mnt, 64 * MiB))
    print("refused: %s" % refused("not a directory", os.path.join(mnt, "keep"), 64 * MiB))
    os.remove(os.path.join(mnt, "keep"))
    os.rmdir(mnt)
    print("refused: %s" % refused("too small", mnt, 1 * MiB))
    assert not os.path.exists(mnt), "a refused MemoryDisk left its mount point"


def losetup_j(path):
    return subprocess.run(["losetup", "-j", path], capture_output=True, text=True).stdout.strip()


def test_live(tmp):
    """A 64 MiB memory disk at a fresh directory: mounted from a loop device, O_DIRECT written and
    read back, all gone after close(). Returns whether it ran."""
    why = None
    if os.geteuid() != 0:
        why = "not root"
    elif not os.path.exists("/dev/loop-control"):
        why = "no /dev/loop-control (no loop devices here)"
    elif (memdisk.mount_of("/dev/shm") or ("", "", ""))[2] != "tmpfs":
        why = "/dev/shm is not tmpfs"
    if why:
        print("SKIP the real memory disk: %s" % why)
        return False
    mnt = os.path.join(tmp, "work")  # made by MemoryDisk, removed by close()
    try:
        d = memdisk.MemoryDisk(mnt, 64 * MiB)
    except memdisk.Unavailable as e:
        print("SKIP the real memory disk: %s" % e)
        return False
    backing = d.backing
    try:
        print(d.describe())
        assert d.dev.startswith("/dev/loop"), d.dev
        assert d.size_bytes == 64 * MiB
        assert os.path.dirname(backing) == "/dev/shm" and str(os.getpid()) in backing, backing
        assert os.path.getsize(backing) == 64 * MiB
        src, where, fstype = memdisk.mount_of(mnt)
        assert (src, where, fstype) == (d.dev, os.path.realpath(mnt), "ext4"), (src, where, fstype)
        assert d.dev + " " + os.path.realpath(mnt) + " ext4 " in open("/proc/mounts").read()
        assert memdisk.backing_file(d.dev) == backing, memdisk.backing_file(d.dev)
        assert os.listdir(mnt) == [], os.listdir(mnt)
        assert "ext4 on %s over a 64 MiB file on tmpfs (/dev/shm), mounted at %s" % (
            d.dev, mnt) in d.describe(), d.describe()
        # 4 MiB with O_DIRECT from page-aligned memory (an anonymous mmap), read back the same way.
        n = 4 * MiB
        buf = mmap.mmap(-1, n)
        pattern = bytes(range(256)) * (n // 256)
        buf[:] = pattern
        path = os.path.join(mnt, "direct.bin")
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_DIRECT, 0o600)
        try:
            assert os.writev(fd, [buf]) == n
            os.fsync(fd)
        finally:
            os.close(fd)
        back = mmap.mmap(-1, n)
        fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
        try:
            assert os.readv(fd, [back]) == n
        finally:
            os.close(fd)
        assert back[:] == pattern, "the bytes read back differ"
    finally:  # the second close() is harmless
        d.close()
        d.close()
    mounts = open("/proc/mounts").read()
    assert d.dev + " " not in mounts and os.path.realpath(mnt) + " " not in mounts, mounts
    assert losetup_j(backing) == "", "loop device still attached: %s" % losetup_j(backing)
    assert not os.path.exists(backing), "%s left behind" % backing
    assert not os.path.exists(mnt), "the mount point MemoryDisk made was left"
    assert d not in memdisk._open
    # A mount point that was there before is kept; close_all() closes what is open.
    os.mkdir(mnt)
    d = memdisk.MemoryDisk(mnt, 32 * MiB)
    backing = d.backing
    assert os.path.ismount(mnt)
    memdisk.close_all()
    assert not os.path.ismount(mnt) and os.path.isdir(mnt) and not os.path.exists(backing)
    assert losetup_j(backing) == ""
    os.rmdir(mnt)
    print("64 MiB memory disk: mounted, 4 MiB O_DIRECT written and read back, all gone after close")
    return True


def test_report():
    """bench.py's text and Markdown reports, given a run's results with a memory disk."""
    import contextlib
    import io
    import bench
    text = ("a memory disk: ext4 on /dev/loop3 over a 6.0 GiB file on tmpfs (/dev/shm), "
            "mounted at /w")
    secs = bench.stats([0.5, 0.6, 0.4])
    raw = {"bytes": GiB, "seconds": secs, "maxrss_kib": 1024, "variant": "direct_16MiB",
           "variants": {"direct_16MiB": secs}, "unsupported": []}
    res = {"size_bytes": GiB, "ranks": 4, "reps": 1, "when_utc": "2026-12-06T00:00:00Z",
           "command": "tools/bench.sh --memory-disk 6GiB", "drop_caches": "ok",
           "elapsed_seconds": 1.0, "targets": [], "notes": [],
           "phases": {"raw_write": raw, "raw_read": raw},
           "machine": {"nproc": 2, "loadavg_at_start": (0.5, 0, 0), "loadavg_at_end": (0.7, 0, 0),
                       "disk": "/dev/loop3 ext4 5.9G 24K 5.9G 1% /w"},
           "memory_disk": {"size_bytes": 6 * GiB, "dev": "/dev/loop3",
                           "backing": "/dev/shm/ckpt-memdisk-1-0.img", "text": text}}
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        bench.print_table(res)
    # The description once, without its own "a memory disk: ".
    line = ("on a memory disk: ext4 on /dev/loop3 over a 6.0 GiB file on tmpfs (/dev/shm), "
            "mounted at /w")
    assert "\nevery phase " + line + "\n" in out.getvalue(), out.getvalue()
    md = bench.markdown(res)
    assert "\n\nEvery phase ran " + line + ".\n" in md, md
    # Both, the throttle on the memory disk: the memory disk's line first.
    res["throttle"] = {"text": "disk 7:3 throttled by cgroup v1 (writes 400 MiB/s, reads "
                               "unlimited)"}
    md = bench.markdown(res)
    assert md.index("on a memory disk") < md.index("on a throttled disk"), md


def main():
    test_report()
    tmp = tempfile.mkdtemp(prefix="ckpt-memdisk-", dir=os.getcwd())
    try:
        test_refusals(tmp)
        ran = test_live(tmp)
    finally:
        shutil.rmtree(tmp)
    print("bench_memdisk_test: ok%s" % ("" if ran else " (no real memory disk here)"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
