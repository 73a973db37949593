"""A disk of a chosen speed on this machine: the block I/O of chosen processes throttled by the
kernel's cgroup controller (cgroup v2 `io.max`, or v1 `blkio.throttle.*_bps_device`), for the
bench's slow-disk runs (`tools/bench.sh --throttle`) and its measured compression rule (the
`compress_rule` phase, issue 19 item 5).

The throttle caps the bytes per second that the member processes' requests move to or from
the whole disk holding a path, O_DIRECT and buffered alike (v1 charges a buffered write's
writeback to the process that starts it: ckpt's `sync_file_range` and `fsync` calls do; the
kernel's own flusher is not throttled there). It needs root and a mounted io or blkio
controller; `Throttle` raises `Unavailable` with the reason where either is missing.

    t = Throttle("/path/on/the/disk")     # a new, empty cgroup
    t.set(write_bps=200 << 20)            # 0: no limit that way
    subprocess.run(cmd, preexec_fn=t.preexec)
    t.close()                             # members back where they came from, cgroup removed
"""
import itertools
import math
import os


class Unavailable(Exception):
    """Throttling cannot be set up here; the message says why."""


_V2_ROOT = "/sys/fs/cgroup"
_V1_ROOT = "/sys/fs/cgroup/blkio"
_counter = itertools.count()
_open = set()  # Throttles not closed yet (close_all)


def disk_of(path):
    """"MAJ:MIN" of the whole disk that holds `path` (a partition's parent disk: the kernel
    throttles requests where they reach the disk)."""
    st = os.stat(path)
    dev = "%d:%d" % (os.major(st.st_dev), os.minor(st.st_dev))
    sys_dev = "/sys/dev/block/" + dev
    if not os.path.exists(sys_dev):
        raise Unavailable("%s is not on a block device (device %s: tmpfs, overlay or a network "
                          "file system)" % (path, dev))
    if os.path.exists(os.path.join(sys_dev, "partition")):
        with open(os.path.join(os.path.realpath(sys_dev), "..", "dev")) as f:
            dev = f.read().strip()
    return dev


def _read(path):
    with open(path) as f:
        return f.read()


def _write(path, text):
    with open(path, "w") as f:
        f.write(text)


def _own_cgroup(controller):
    """This process's cgroup path in the hierarchy of `controller` ("" for v2's)."""
    for line in _read("/proc/self/cgroup").splitlines():
        _, names, path = line.split(":", 2)
        if (controller == "" and names == "") or controller in names.split(","):
            return path
    return "/"


class Throttle:
    def __init__(self, path, name="ckpt-bench"):
        self.dev = disk_of(path)
        if os.geteuid() != 0:
            raise Unavailable("throttling the disk needs root")
        v2 = os.path.join(_V2_ROOT, "cgroup.controllers")
        if os.path.exists(v2) and "io" in _read(v2).split():
            self.kind, base, home = "v2", _V2_ROOT, _own_cgroup("")
            try:
                _write(os.path.join(_V2_ROOT, "cgroup.subtree_control"), "+io")
            except OSError as e:
                raise Unavailable("cannot enable the io controller: %s" % e)
        elif os.path.exists(os.path.join(_V1_ROOT, "blkio.throttle.write_bps_device")):
            self.kind, base, home = "v1", _V1_ROOT, _own_cgroup("blkio")
        else:
            raise Unavailable("no cgroup io (v2) or blkio (v1) controller is mounted")
        self.home = os.path.join(base, home.lstrip("/"))
        self.dir = os.path.join(base, "%s-%d-%d" % (name, os.getpid(), next(_counter)))
        try:
            os.mkdir(self.dir)
        except OSError as e:
            raise Unavailable("cannot create %s: %s" % (self.dir, e))
        _open.add(self)
        self.write_bps = self.read_bps = 0

    def set(self, write_bps=0, read_bps=0):
        """Caps writes and reads of the disk at these bytes per second (0: no cap). Raises
        Unavailable where the kernel refuses the limit (a device it cannot throttle)."""
        try:
            if self.kind == "v2":
                _write(os.path.join(self.dir, "io.max"), "%s rbps=%s wbps=%s" % (
                    self.dev, read_bps or "max", write_bps or "max"))
            else:
                for name, bps in [("write", write_bps), ("read", read_bps)]:
                    _write(os.path.join(self.dir, "blkio.throttle.%s_bps_device" % name),
                           "%s %d" % (self.dev, bps))
        except OSError as e:
            raise Unavailable("cannot throttle disk %s: %s" % (self.dev, e))
        self.write_bps, self.read_bps = write_bps, read_bps

    def join(self, pid):
        _write(os.path.join(self.dir, "cgroup.procs"), "%d\n" % pid)

    def preexec(self):
        """For subprocess's preexec_fn: the child joins before it runs its program."""
        self.join(os.getpid())

    def close(self):
        """Moves every member back to this process's own cgroup and removes the cgroup."""
        try:
            for pid in _read(os.path.join(self.dir, "cgroup.procs")).split():
                try:
                    _write(os.path.join(self.home, "cgroup.procs"), pid + "\n")
                except OSError:
                    pass  # gone already
            os.rmdir(self.dir)
        except OSError:
            pass
        _open.discard(self)

    def describe(self):
        def mib(b):
            return "%.0f MiB/s" % (b / 2.0 ** 20) if b else "unlimited"
        return "disk %s throttled by cgroup %s (writes %s, reads %s)" % (
            self.dev, self.kind, mib(self.write_bps), mib(self.read_bps))


def close_all():
    """Closes every Throttle still open (a process stopped by a signal)."""
    for t in list(_open):
        t.close()


def crossover(rows):
    """The disk write rate below which the compressed save is the faster one, from rows of
    (write bytes per second, speedup = uncompressed seconds / compressed seconds) at finite
    rates: interpolated on log(rate) between the last rate where compression won (speedup >=
    1) and the first where it lost. Returns (rate or None, how it was found)."""
    pts = sorted((r, s) for r, s in rows if r)
    if not pts:
        return None, "no throttled rate measured"
    if pts[0][1] < 1:
        return None, "compression lost at every rate measured (the lowest: %.0f MiB/s)" % (
            pts[0][0] / 2.0 ** 20)
    for (r1, s1), (r2, s2) in zip(pts, pts[1:]):
        if s1 >= 1 > s2:
            f = (s1 - 1) / (s1 - s2)
            x = math.exp(math.log(r1) + f * (math.log(r2) - math.log(r1)))
            return x, "interpolated between %.0f and %.0f MiB/s" % (r1 / 2.0 ** 20,
                                                                      r2 / 2.0 ** 20)
    return None, "compression won at every rate measured (the highest: %.0f MiB/s)" % (
        pts[-1][0] / 2.0 ** 20)
