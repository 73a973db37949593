"""A disk in memory on this machine: an ext4 file system on a loop device over a sparse file on
tmpfs, for the bench's fast-disk runs (`tools/bench.sh --memory-disk SIZE`), as throttle.py
gives it a slow one.

A disk faster than the cores: where the real disk is slow (or, as on the development VM, shares
its rate between reads and writes), ckpt's CPU costs hide behind it; on this one they show.
`O_DIRECT` works on it, and dropping the page cache drops ext4's cache but not the tmpfs pages
behind the loop device, so a cold read goes through the loop device from memory. The loop
driver copies every byte on the same cores, so it costs CPU per byte: it is not a stand-in for a
fast NVMe disk in everything. The file fills as the disk does (at most `size_bytes` of memory).
It needs root, `mkfs.ext4` (e2fsprogs), `losetup` and `mount` (util-linux / mount) and a tmpfs
with room for the file; `MemoryDisk` raises `Unavailable` with the reason where one is missing.

    d = MemoryDisk("/path/to/work", 6 << 30)  # an empty, fresh ext4 mounted there
    print(d.describe())                       # "a memory disk: ext4 on /dev/loop3 over ..."
    subprocess.run(cmd)                       # its files under /path/to/work
    d.close()                                 # unmounted, detached, its file removed
"""
import itertools
import os
import re
import shutil
import subprocess
import time


class Unavailable(Exception):
    """A memory disk cannot be set up here; the message says why."""


MARGIN = 128 << 20  # room left on the tmpfs beyond the disk's own size
_TOOLS = ("mkfs.ext4", "losetup", "mount", "umount")
_counter = itertools.count()
_open = set()  # MemoryDisks not closed yet (close_all)


def _unescape(field):
    """A /proc/mounts field with its octal escapes (\\040 for a space) decoded."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def mount_of(path):
    """(source, mount point, file system type) of the mount holding `path`, from /proc/mounts
    (the last of the longest mount points that contain it: a later mount hides an earlier one)."""
    path = os.path.realpath(path)
    best = None
    with open("/proc/mounts") as f:
        for line in f:
            fields = line.split()
            if len(fields) < 3:
                continue
            src, mnt, fstype = _unescape(fields[0]), _unescape(fields[1]), fields[2]
            if path == mnt or path.startswith(mnt.rstrip("/") + "/"):
                if best is None or len(mnt) >= len(best[1]):
                    best = (src, mnt, fstype)
    return best


def backing_file(dev):
    """The file behind loop device `dev` ("/dev/loop3"), or None (not a loop device, or none)."""
    try:
        with open("/sys/block/%s/loop/backing_file" % os.path.basename(dev)) as f:
            return f.read().strip()
    except OSError:
        return None


def _tool(name):
    """The absolute path of a program, also from the sbin directories a user's PATH may lack."""
    path = os.environ.get("PATH", "") + ":/usr/local/sbin:/usr/sbin:/sbin:/usr/bin:/bin"
    return shutil.which(name, path=path)


def _run(cmd, what):
    try:
        p = subprocess.run(cmd, capture_output=True, text=True)
    except OSError as e:
        raise Unavailable("%s: %s" % (what, e))
    if p.returncode != 0:
        raise Unavailable("%s failed (%s, exit %d): %s" % (
            what, " ".join(cmd), p.returncode, (p.stderr or p.stdout).strip()))
    return p.stdout


def _gib(n):
    return "%.1f GiB" % (n / 2.0 ** 30) if n >= 1 << 30 else "%.0f MiB" % (n / 2.0 ** 20)


class MemoryDisk:
    def __init__(self, mountpoint, size_bytes, backing_dir="/dev/shm"):
        self.mountpoint = os.path.abspath(mountpoint)
        self.size_bytes = int(size_bytes)
        self.backing_dir = os.path.abspath(backing_dir)
        self.dev = None      # "/dev/loopN" once attached
        self.backing = None  # the file on tmpfs once created
        self._pid = os.getpid()  # a forked child never tears down its parent's disk
        self._made_dir = self._file = self._attached = self._mounted = False
        # What can be told without touching anything: the arguments, then the privileges.
        if self.size_bytes < 16 << 20:
            raise Unavailable("a memory disk of %d bytes is too small (16 MiB at least)" %
                              self.size_bytes)
        if not os.path.isdir(self.backing_dir):
            raise Unavailable("%s is not a directory" % self.backing_dir)
        m = mount_of(self.backing_dir)
        if not m or m[2] != "tmpfs":
            raise Unavailable("%s is not on tmpfs (it is on %s at %s): the disk's file must be "
                              "in memory" % (self.backing_dir, m[2] if m else "?",
                                             m[1] if m else "?"))
        st = os.statvfs(self.backing_dir)
        free = st.f_bavail * st.f_frsize
        if free < self.size_bytes + MARGIN:
            raise Unavailable("not enough free space on the tmpfs at %s for a %s disk: %s free, "
                              "%s needed (the disk and a margin of %d MiB)" % (
                                  self.backing_dir, _gib(self.size_bytes), _gib(free),
                                  _gib(self.size_bytes + MARGIN), MARGIN >> 20))
        if os.path.ismount(self.mountpoint):
            raise Unavailable("%s is a mount point already" % self.mountpoint)
        if os.path.lexists(self.mountpoint):
            if not os.path.isdir(self.mountpoint):
                raise Unavailable("%s is not a directory" % self.mountpoint)
            if os.listdir(self.mountpoint):
                raise Unavailable("%s is not empty: a disk mounted there would hide its files" %
                                  self.mountpoint)
        if os.geteuid() != 0:
            raise Unavailable("a memory disk needs root (losetup, mount)")
        tools = {t: _tool(t) for t in _TOOLS}
        lacking = [t for t, p in tools.items() if not p]
        if lacking:
            raise Unavailable("no %s here (Debian: e2fsprogs for mkfs.ext4, mount for losetup "
                              "and mount)" % ", ".join(lacking))
        self._tools = tools
        _open.add(self)
        try:
            self._make()
        except BaseException:  # Unavailable, OSError, KeyboardInterrupt: undo what was made
            self.close()
            raise

    def _make(self):
        t = self._tools
        name = "ckpt-memdisk-%d-%d.img" % (os.getpid(), next(_counter))
        path = os.path.join(self.backing_dir, name)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except OSError as e:
            raise Unavailable("cannot create %s: %s" % (path, e))
        self.backing, self._file = path, True
        try:
            os.ftruncate(fd, self.size_bytes)  # sparse: memory is taken as the disk fills
        except OSError as e:
            raise Unavailable("cannot size %s: %s" % (path, e))
        finally:
            os.close(fd)
        # mke2fs zeroes the inode tables and journal of a file by punching holes (instant), so
        # no lazy-init thread writes behind the bench's back; no discard, no reserved blocks.
        _run([t["mkfs.ext4"], "-q", "-F", "-m", "0",
              "-E", "nodiscard,lazy_itable_init=0,lazy_journal_init=0", path], "mkfs.ext4")
        self.dev = _run([t["losetup"], "--find", "--show", path], "losetup").strip()
        self._attached = True
        if not self.dev.startswith("/dev/"):
            raise Unavailable("losetup printed %r, not a device" % self.dev)
        if not os.path.isdir(self.mountpoint):
            try:
                os.makedirs(self.mountpoint)
            except OSError as e:
                raise Unavailable("cannot create %s: %s" % (self.mountpoint, e))
            self._made_dir = True
        before = os.stat(self.mountpoint)
        _run([t["mount"], "-t", "ext4", self.dev, self.mountpoint], "mount")
        self._mounted = True
        # As empty, and owned, as the directory it covers (e2fsck makes a lost+found again).
        try:
            os.rmdir(os.path.join(self.mountpoint, "lost+found"))
            os.chown(self.mountpoint, before.st_uid, before.st_gid)
            os.chmod(self.mountpoint, before.st_mode & 0o7777)
        except OSError as e:
            raise Unavailable("cannot prepare %s: %s" % (self.mountpoint, e))

    def close(self):
        """Unmounts, detaches the loop device, removes the file (and the mount point where this
        made it). Idempotent; safe from atexit and from a signal handler. A mount still busy
        (a child not yet gone) after 2 s is detached lazily: the kernel frees the disk when its
        last user goes (the loop device is then cleared by itself)."""
        if self._pid != os.getpid():
            return
        t = getattr(self, "_tools", {})
        if self._mounted:
            for _ in range(20):
                if subprocess.run([t["umount"], self.mountpoint], stdout=subprocess.DEVNULL,
                                  stderr=subprocess.DEVNULL).returncode == 0 \
                        or not os.path.ismount(self.mountpoint):
                    break
                time.sleep(0.1)
            else:
                subprocess.run([t["umount"], "-l", self.mountpoint], stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)
            self._mounted = False
        if self._attached:
            # On a device still in use this sets autoclear and succeeds: detached when freed.
            subprocess.run([t["losetup"], "-d", self.dev], stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL)
            self._attached = False
        if self._file:
            try:
                os.remove(self.backing)  # its memory goes when the loop device lets go of it
            except FileNotFoundError:
                pass
            except OSError:
                return  # kept open: a later close() tries again
            self._file = False
        if self._made_dir:
            try:
                os.rmdir(self.mountpoint)
            except OSError:
                pass
            self._made_dir = False
        _open.discard(self)

    def describe(self):
        return "a memory disk: ext4 on %s over a %s file on tmpfs (%s), mounted at %s" % (
            self.dev, _gib(self.size_bytes), self.backing_dir, self.mountpoint)


def close_all():
    """Closes every MemoryDisk still open (a process stopped by a signal)."""
    for d in list(_open):
        d.close()
