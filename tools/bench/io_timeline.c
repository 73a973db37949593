// io_timeline.so: a timeline of a program's file I/O calls, taken inside the process (issue 19).
//
//   gcc -O2 -shared -fPIC -o io_timeline.so tools/bench/io_timeline.c -ldl
//   IO_TIMELINE=trace.txt LD_PRELOAD=$PWD/io_timeline.so ckpt export-fp32 CKPT OUT
//   python3 tools/bench/io_timeline.py trace.txt
//
// Loaded with LD_PRELOAD, it wraps pread, pwrite, preadv, preadv2, fsync and fdatasync, records
// each call's thread, start, end and result in a fixed table (no allocation, no lock: one atomic
// counter), and writes the table to the file named by IO_TIMELINE when the program exits
// normally. Times are nanoseconds of CLOCK_MONOTONIC since the library was loaded. Unlike
// `strace`, which stops the traced thread at every system call (and slowed export's many small
// calls so much that its timeline changed shape), it costs two clock reads per call.
// Calls beyond the table's capacity are counted, not recorded. A measurement aid for
// docs/performance.md; nothing in ckpt depends on it.
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

enum { kCapacity = 1 << 18 };
enum Op { kRead = 0, kWrite = 1, kSync = 2 };

struct Event {
  long long start, end;  // ns since load
  long long result;      // bytes moved, or the call's return value
  int op;
  int tid;
};

static struct Event events[kCapacity];
static atomic_long next_event;
static long long loaded_at;

static long long Now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec * 1000000000LL + t.tv_nsec;
}

__attribute__((constructor)) static void Loaded(void) { loaded_at = Now(); }

static void Record(int op, long long start, long long result) {
  const long i = atomic_fetch_add(&next_event, 1);
  if (i >= kCapacity) return;
  events[i].start = start - loaded_at;
  events[i].end = Now() - loaded_at;
  events[i].result = result;
  events[i].op = op;
  events[i].tid = (int)syscall(SYS_gettid);
}

static void* Next(const char* name) {
  void* f = dlsym(RTLD_NEXT, name);
  if (!f) {
    fprintf(stderr, "io_timeline: %s not found\n", name);
    abort();
  }
  return f;
}

ssize_t pread64(int fd, void* buf, size_t n, off_t offset) {
  static ssize_t (*real)(int, void*, size_t, off_t);
  if (!real) real = (ssize_t(*)(int, void*, size_t, off_t))Next("pread64");
  const long long t = Now();
  const ssize_t r = real(fd, buf, n, offset);
  Record(kRead, t, r);
  return r;
}

ssize_t pwrite64(int fd, const void* buf, size_t n, off_t offset) {
  static ssize_t (*real)(int, const void*, size_t, off_t);
  if (!real) real = (ssize_t(*)(int, const void*, size_t, off_t))Next("pwrite64");
  const long long t = Now();
  const ssize_t r = real(fd, buf, n, offset);
  Record(kWrite, t, r);
  return r;
}

// On x86-64 and aarch64 glibc, off_t is 64 bits and pread is pread64.
ssize_t pread(int fd, void* buf, size_t n, off_t offset) __attribute__((alias("pread64")));
ssize_t pwrite(int fd, const void* buf, size_t n, off_t offset) __attribute__((alias("pwrite64")));

ssize_t preadv64(int fd, const struct iovec* iov, int count, off_t offset) {
  static ssize_t (*real)(int, const struct iovec*, int, off_t);
  if (!real) real = (ssize_t(*)(int, const struct iovec*, int, off_t))Next("preadv64");
  const long long t = Now();
  const ssize_t r = real(fd, iov, count, offset);
  Record(kRead, t, r);
  return r;
}
ssize_t preadv(int fd, const struct iovec* iov, int count, off_t offset)
    __attribute__((alias("preadv64")));

ssize_t preadv2(int fd, const struct iovec* iov, int count, off_t offset, int flags) {
  static ssize_t (*real)(int, const struct iovec*, int, off_t, int);
  if (!real) real = (ssize_t(*)(int, const struct iovec*, int, off_t, int))Next("preadv2");
  const long long t = Now();
  const ssize_t r = real(fd, iov, count, offset, flags);
  Record(kRead, t, r);
  return r;
}

int fsync(int fd) {
  static int (*real)(int);
  if (!real) real = (int (*)(int))Next("fsync");
  const long long t = Now();
  const int r = real(fd);
  Record(kSync, t, r);
  return r;
}

int fdatasync(int fd) {
  static int (*real)(int);
  if (!real) real = (int (*)(int))Next("fdatasync");
  const long long t = Now();
  const int r = real(fd);
  Record(kSync, t, r);
  return r;
}

// One line of header, then one line per call: tid op start_ns end_ns result.
__attribute__((destructor)) static void Unloaded(void) {
  const char* path = getenv("IO_TIMELINE");
  if (!path || !*path) return;
  FILE* out = fopen(path, "w");
  if (!out) {
    perror(path);
    return;
  }
  const long total = atomic_load(&next_event);
  const long n = total < kCapacity ? total : kCapacity;
  fprintf(out, "io_timeline 1 exit_ns %lld calls %ld dropped %ld\n", Now() - loaded_at, total,
          total - n);
  for (long i = 0; i < n; ++i)
    fprintf(out, "%d %d %lld %lld %lld\n", events[i].tid, events[i].op, events[i].start,
            events[i].end, events[i].result);
  fclose(out);
}
