#include "direct_read.h"

#include <fcntl.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "ckpt/aligned_buffer.h"
#include "ckpt/run_ahead.h"

namespace ckpt {
namespace {

std::atomic<uint64_t> g_direct_bytes{0}, g_buffered_bytes{0}, g_cached_ranges{0}, g_refused{0},
    g_into_caller{0};

enum class Mode { kAuto, kOn, kOff };

// Read on every call: tests and tools switch it within one process.
Mode ModeFromEnvironment() {
  const char* v = std::getenv("CKPT_DIRECT_IO");
  if (v == nullptr) return Mode::kAuto;
  const std::string s(v);
  if (s == "off" || s == "0") return Mode::kOff;
  if (s == "on" || s == "1") return Mode::kOn;
  return Mode::kAuto;
}

// Aligned kBlock buffers, kept for the next transfer: a fresh buffer costs its page faults (6 ms
// for 24 MiB here), a noticeable share of a 100 MiB read, and a save's staging (four per rank
// file written) paid them at every save. At most kKeep are kept (128 MiB: four ranks' staging
// as threads, or a read's and a few files' written at once).
class BufferPool {
 public:
  static constexpr size_t kKeep = 16;
  void* Get() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!free_.empty()) {
        void* p = free_.back();
        free_.pop_back();
        return p;
      }
    }
    return AllocateIoMemory(internal::DirectReader::kBlock);  // huge pages: 4 MiB requests
  }
  void Put(void* p) {
    std::lock_guard<std::mutex> lock(mu_);
    if (free_.size() < kKeep) {
      free_.push_back(p);
      return;
    }
    FreeIoMemory(p);
  }

 private:
  std::mutex mu_;
  std::vector<void*> free_;
};

BufferPool& Pool() {
  static BufferPool* pool = new BufferPool;  // never destroyed: reads may run during exit
  return *pool;
}

// The producer's signal that O_DIRECT was refused: ends the run, never returned.
Status RefusedSignal() { return Internal("O_DIRECT refused"); }

// One O_DIRECT request: `need` bytes at `pos` into `buf` (both aligned), asking for `ask` (need
// rounded up to kAlign: the file's last block may come back short). EINVAL on the first request
// of a read, before any byte arrived, means the file system refuses O_DIRECT for reads
// (*refused, RefusedSignal()). Returns the bytes that arrived in *got (>= need).
Status DirectPread(int dfd, const std::string& path, uint8_t* buf, uint64_t pos, uint64_t need,
                   uint64_t ask, bool first, bool* refused, uint64_t* got_out) {
  uint64_t got = 0;
  while (got < need) {
    const ssize_t r = ::pread(dfd, buf + got, ask - got, static_cast<off_t>(pos + got));
    if (r < 0) {
      if (errno == EINTR) continue;
      if (errno == EINVAL && first && got == 0) {
        *refused = true;  // O_DIRECT accepted at open, refused for reads
        return RefusedSignal();
      }
      return PosixError("read " + path, errno);
    }
    got += static_cast<uint64_t>(r);
    // The end of the file: nothing more, or a partial block (a further O_DIRECT request
    // would start unaligned).
    if (got < need && (r == 0 || got % internal::DirectReader::kAlign != 0))
      return DataLoss(path + ": unexpected end of file at byte " + std::to_string(pos + got));
  }
  *got_out = got;
  return Status::Ok();
}

// ReadInto's request for the block at `pos` (`need` bytes into `buf`, the caller's memory) that
// also brings the range's unaligned edges: with `head` the 4 KiB block before `pos`, whose last
// `lo - offset` bytes are the range's first, and with `tail` the block at `pos + need`, of which
// `tail_bytes` are the range's last (it may end past the file's end). One O_DIRECT request
// (preadv: the edges into aligned scratch, copied out) instead of two page-cache reads after
// the large one: the tail's block is not cached when its range was not, and each such read
// waited for the disk on its own while nothing else was asked of it (a DeepSpeed record's data
// starts on a 64-byte boundary only: two such reads for each of export's pieces, 3-14 ms of
// a 0.36 s export on the development VM, 16-47 ms with the machine busy; docs/performance.md,
// 2026-12-05 11:00). Anything but the whole request answered (EINVAL from a
// file system refusing O_DIRECT, a short read, an error) is read again the way it was before:
// the middle by DirectPread, which tells a refusal and names errors, the edges by pread.
Status DirectPreadEdges(int fd, int dfd, const std::string& path, uint8_t* buf, uint64_t pos,
                        uint64_t need, uint8_t* head, uint64_t head_bytes, uint8_t* tail,
                        uint64_t tail_bytes, bool first, bool* refused) {
  constexpr uint64_t kAlign = internal::DirectReader::kAlign;
  alignas(kAlign) uint8_t edge[2][kAlign];
  iovec iov[3];
  int k = 0;
  if (head) iov[k++] = {edge[0], kAlign};
  iov[k++] = {buf, need};
  if (tail) iov[k++] = {edge[1], kAlign};
  const uint64_t at = head ? pos - kAlign : pos;
  const uint64_t must = (head ? kAlign : 0) + need + (tail ? tail_bytes : 0);
  const ssize_t r = ::preadv(dfd, iov, k, static_cast<off_t>(at));
  if (r >= 0 && static_cast<uint64_t>(r) >= must) {
    if (head) std::memcpy(head, edge[0] + kAlign - head_bytes, head_bytes);
    if (tail) std::memcpy(tail, edge[1], tail_bytes);
    return Status::Ok();
  }
  uint64_t got = 0;
  CKPT_RETURN_IF_ERROR(DirectPread(dfd, path, buf, pos, need, need, first, refused, &got), "");
  if (head)
    CKPT_RETURN_IF_ERROR(internal::PreadExact(fd, pos - head_bytes, head_bytes, head, path), "");
  if (tail) CKPT_RETURN_IF_ERROR(internal::PreadExact(fd, pos + need, tail_bytes, tail, path), "");
  return Status::Ok();
}

// Whether the byte at `offset` is in the page cache: a one-byte read that may not wait for
// the disk. A file system without RWF_NOWAIT for buffered reads answers "not cached". Not
// free where the byte is not cached: the kernel still starts reading its page into the page
// cache (a 4 KiB request beside the large read that follows).
bool ByteCached(int fd, uint64_t offset) {
  char c;
  iovec iov{&c, 1};
  return ::preadv2(fd, &iov, 1, static_cast<off_t>(offset), RWF_NOWAIT) == 1;
}

// cachestat(2), Linux 6.5: the page cache's count of a range's pages, without touching the
// disk. Debian 12's headers predate it; its number is the same on every architecture.
#ifdef __NR_cachestat
constexpr long kCachestat = __NR_cachestat;
#else
constexpr long kCachestat = 451;
#endif
struct CachestatRange {
  uint64_t off, len;
};
struct Cachestat {
  uint64_t nr_cache, nr_dirty, nr_writeback, nr_evicted, nr_recently_evicted;
};
std::atomic<bool> g_no_cachestat{false};  // an older kernel, or a seccomp filter refuses it

// Whether every page of [offset, offset + n) (n > 0) is in the page cache. Counted by
// cachestat where the kernel has it (about 1 us); else the range's first, middle and last
// bytes are probed with RWF_NOWAIT reads (on the development VM 6-35 us each, and each uncached
// probe started a 4 KiB read: 668 of them beside the 1 MiB reads of a 1 GiB `to-universal`,
// docs/performance.md, 2026-12-07).
bool RangeCached(int fd, uint64_t offset, uint64_t n) {
  if (!g_no_cachestat.load(std::memory_order_relaxed)) {
    static const uint64_t page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
    CachestatRange range{offset, n};
    Cachestat st{};
    if (::syscall(kCachestat, fd, &range, &st, 0) == 0)
      return st.nr_cache >= (offset + n - 1) / page - offset / page + 1;
    if (errno == ENOSYS || errno == EPERM) g_no_cachestat = true;
  }
  return ByteCached(fd, offset) && ByteCached(fd, offset + n / 2) && ByteCached(fd, offset + n - 1);
}

}  // namespace

DirectReadStats GetDirectReadStats() {
  DirectReadStats s;
  s.direct_bytes = g_direct_bytes.load();
  s.buffered_bytes = g_buffered_bytes.load();
  s.cached_ranges = g_cached_ranges.load();
  s.refused = g_refused.load();
  s.direct_into_caller_bytes = g_into_caller.load();
  return s;
}

namespace internal {

Status PreadExact(int fd, uint64_t offset, size_t n, void* out, const std::string& path) {
  auto* p = static_cast<uint8_t*>(out);
  while (n > 0) {
    const ssize_t r = ::pread(fd, p, n, static_cast<off_t>(offset));
    if (r < 0) {
      if (errno == EINTR) continue;
      return PosixError("read " + path, errno);
    }
    if (r == 0)
      return DataLoss(path + ": unexpected end of file at byte " + std::to_string(offset));
    p += r;
    n -= static_cast<size_t>(r);
    offset += static_cast<uint64_t>(r);
  }
  return Status::Ok();
}

void CountBufferedRead(uint64_t n) { g_buffered_bytes += n; }

bool DirectIoOff() { return ModeFromEnvironment() == Mode::kOff; }

void* GetIoBlock() { return Pool().Get(); }
void PutIoBlock(void* p) { Pool().Put(p); }

int DirectDescriptor::Get(int file, int flags, std::atomic<uint64_t>* refusals) {
  if (!opened_) {
    opened_ = true;
    const std::string self = "/proc/self/fd/" + std::to_string(file);
    fd_.reset(::open(self.c_str(), flags | O_DIRECT | O_CLOEXEC));
    if (!fd_.valid()) Refuse(refusals);
  }
  return refused_ ? -1 : fd_.get();
}

void DirectDescriptor::Refuse(std::atomic<uint64_t>* refusals) {
  if (!refused_) ++*refusals;
  refused_ = true;
}

int DirectReader::DirectFd() const {
  std::lock_guard<std::mutex> lock(mu_);
  return direct_.Get(fd_, O_RDONLY, &g_refused);
}

void DirectReader::Refuse() const {
  std::lock_guard<std::mutex> lock(mu_);
  direct_.Refuse(&g_refused);
}

bool DirectReader::Wanted(uint64_t offset, uint64_t n, uint64_t min_bytes) const {
  if (n < min_bytes) return false;
  const Mode mode = ModeFromEnvironment();
  if (mode == Mode::kOff) return false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (direct_.refused()) return false;
  }
  if (mode == Mode::kAuto && RangeCached(fd_, offset, n)) {
    ++g_cached_ranges;
    return false;
  }
  return true;
}

bool DirectReader::CanReadInto(uint64_t offset, uint64_t n, const void* out) {
  const uint64_t addr = reinterpret_cast<uintptr_t>(out);
  if ((addr - offset) % kAlign != 0) return false;
  return AlignedMiddle(offset, n).bytes() >= kMinIntoBytes;
}

Status DirectReader::ReadInto(uint64_t offset, uint64_t n, uint8_t* out,
                              const RandomAccessFile::PartFn& on_filled, bool* fell_back) const {
  *fell_back = false;
  const int dfd = DirectFd();
  if (dfd < 0) {
    *fell_back = true;
    return Status::Ok();
  }
  const uint64_t end = offset + n;
  const AlignedMiddle mid(offset, n);
  const uint64_t lo = mid.lo, hi = mid.hi;  // plain locals: lambdas below capture them
  const uint64_t blocks = (hi - lo + kBlock - 1) / kBlock;
  auto filled = [&](uint64_t at, uint64_t len) -> Status {
    if (!on_filled || len == 0) return Status::Ok();
    return on_filled(at, out + (at - offset), static_cast<size_t>(len));
  };
  bool refused = false;
  // A single block (a compressed chunk's frame) is read on this thread (RunAhead).
  Status status = RunAhead(
      blocks, kIntoAhead,
      [&](uint64_t i, int) -> Status {
        const uint64_t pos = lo + i * kBlock;
        const uint64_t need = std::min(kBlock, hi - pos);
        // The unaligned head comes with the first block's request, the tail with the last's.
        const bool head = i == 0 && lo > offset, tail = i + 1 == blocks && end > hi;
        if (head || tail)
          return DirectPreadEdges(fd_, dfd, path_, out + (pos - offset), pos, need,
                                  head ? out : nullptr, lo - offset,
                                  tail ? out + (hi - offset) : nullptr, end - hi, i == 0, &refused);
        uint64_t got = 0;
        return DirectPread(dfd, path_, out + (pos - offset), pos, need, need, i == 0, &refused,
                           &got);
      },
      [&](uint64_t i, int) -> Status {
        if (i == 0) CKPT_RETURN_IF_ERROR(filled(offset, lo - offset), "");  // the head
        const uint64_t pos = lo + i * kBlock;
        return filled(pos, std::min(kBlock, hi - pos));
      },
      kProducers);
  if (refused) {
    Refuse();
    *fell_back = true;
    return Status::Ok();
  }
  CKPT_RETURN_IF_ERROR(status, "");
  CKPT_RETURN_IF_ERROR(filled(hi, end - hi), "");  // the tail
  g_direct_bytes += n;
  g_into_caller += hi - lo;
  return Status::Ok();
}

Status DirectReader::Scan(uint64_t offset, uint64_t n, const RandomAccessFile::PartFn& consume,
                          bool* fell_back) const {
  *fell_back = false;
  if (n == 0) return Status::Ok();
  const int dfd = DirectFd();
  if (dfd < 0) {
    *fell_back = true;
    return Status::Ok();
  }
  const uint64_t end = offset + n;
  const uint64_t first = offset & ~(kAlign - 1);  // blocks start here, kBlock apart
  const uint64_t blocks = (end - first + kBlock - 1) / kBlock;
  struct Slot {
    uint8_t* buf = nullptr;
    uint64_t have = 0;  // bytes read into buf
  };
  Slot slots[kDepth];
  const int depth = static_cast<int>(std::min<uint64_t>(kDepth, blocks));
  Status status = Status::Ok();
  for (int k = 0; k < depth && status.ok(); ++k) {
    slots[k].buf = static_cast<uint8_t*>(Pool().Get());
    if (slots[k].buf == nullptr)
      status = ResourceExhausted(path_ + ": out of memory for read buffers");
  }
  bool refused = false;
  uint64_t delivered = 0;
  if (status.ok()) {
    status = RunAhead(
        blocks, depth,
        [&](uint64_t i, int k) -> Status {
          const uint64_t pos = first + i * kBlock;
          const uint64_t need = std::min(kBlock, end - pos);
          const uint64_t ask = (need + kAlign - 1) & ~(kAlign - 1);
          uint64_t got = 0;
          CKPT_RETURN_IF_ERROR(
              DirectPread(dfd, path_, slots[k].buf, pos, need, ask, i == 0, &refused, &got), "");
          slots[k].have = std::min(got, need);
          return Status::Ok();
        },
        [&](uint64_t i, int k) -> Status {
          const uint64_t pos = first + i * kBlock;
          const uint64_t lo = std::max(pos, offset), hi = std::min(pos + slots[k].have, end);
          delivered += hi - lo;
          return consume(lo, slots[k].buf + (lo - pos), static_cast<size_t>(hi - lo));
        },
        kProducers);
  }
  for (int k = 0; k < depth; ++k)
    if (slots[k].buf) Pool().Put(slots[k].buf);
  if (refused) {
    Refuse();
    *fell_back = true;
    return Status::Ok();
  }
  if (status.ok() && delivered != n)
    status = Internal(path_ + ": direct read delivered " + std::to_string(delivered) + " of " +
                      std::to_string(n) + " bytes");
  if (status.ok()) g_direct_bytes += n;
  return status;
}

}  // namespace internal
}  // namespace ckpt
