#include "direct_write.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <new>
#include <vector>

#include "ckpt/aligned_buffer.h"
#include "ckpt/run_ahead.h"
#include "direct_read.h"

namespace ckpt {
namespace {

std::atomic<uint64_t> g_direct_bytes{0}, g_in_place_bytes{0}, g_buffered_bytes{0}, g_refused{0};

}  // namespace

DirectWriteStats GetDirectWriteStats() {
  DirectWriteStats s;
  s.direct_bytes = g_direct_bytes.load();
  s.in_place_bytes = g_in_place_bytes.load();
  s.buffered_bytes = g_buffered_bytes.load();
  s.refused = g_refused.load();
  return s;
}

namespace internal {

Status PwriteAll(int fd, uint64_t offset, std::string_view data, const std::string& path) {
  const char* p = data.data();
  size_t n = data.size();
  while (n > 0) {
    const ssize_t w = ::pwrite(fd, p, n, static_cast<off_t>(offset));
    if (w < 0) {
      if (errno == EINTR) continue;
      return PosixError("write " + path, errno);
    }
    p += w;
    n -= static_cast<size_t>(w);
    offset += static_cast<uint64_t>(w);
  }
  return Status::Ok();
}

void CountBufferedWrite(uint64_t n) { g_buffered_bytes += n; }

DirectWriter::DirectWriter(int fd, std::string path) : fd_(fd), path_(std::move(path)) {}

DirectWriter::~DirectWriter() {
  FlushCarry().IgnoreError();  // Close drains first; here only when the file is let go
  {
    std::lock_guard<std::mutex> lock(mu_);
    closing_ = true;
  }
  cv_.notify_all();
  writers_.Join();  // they leave once the queue is empty: every deferred block written
  for (uint8_t* p : staging_) PutIoBlock(p);
}

bool DirectWriter::Wanted(uint64_t offset, std::string_view data, bool deferred) const {
  {
    std::lock_guard<std::mutex> lock(mu_);  // a writer may refuse O_DIRECT meanwhile
    if (direct_.refused()) return false;
  }
  if (DirectIoOff()) return false;
  // A deferred range that continues the carry joins it, however small.
  if (deferred && Continues(offset) && !InPlace(offset, data)) return true;
  const uint64_t middle = AlignedMiddle(offset, data.size()).bytes();
  if (InPlace(offset, data)) return middle >= kMinInPlace;
  return middle >= (deferred ? kMinDeferred : kBlock);
}

bool DirectWriter::InPlace(uint64_t offset, std::string_view data) {
  const auto addr = reinterpret_cast<uintptr_t>(data.data());
  if ((addr - offset) % kAlign != 0) return false;
  const AlignedMiddle mid(offset, data.size());
  return !mid.empty() && IsIoMemory(data.data() + (mid.lo - offset), mid.bytes());
}

Status DirectWriter::WriteBlock(const Job& j) {
  if (j.edge) {
    g_buffered_bytes += j.len;
    return PwriteAll(fd_, j.pos, *j.edge, path_);
  }
  bool direct;
  int dfd;
  {
    std::lock_guard<std::mutex> lock(mu_);
    direct = !direct_.refused();
    dfd = dfd_;
  }
  if (direct) {
    uint64_t done = 0;
    while (done < j.len) {
      const ssize_t w = ::pwrite(dfd, j.buf + done, j.len - done, static_cast<off_t>(j.pos + done));
      if (w < 0 && errno == EINTR) continue;
      if (w < 0 && errno == EINVAL && done == 0) {  // accepted at open, refused for writes
        std::lock_guard<std::mutex> lock(mu_);
        direct_.Refuse(&g_refused);
        break;
      }
      if (w < 0) return PosixError("write " + path_, errno);
      done += static_cast<uint64_t>(w);
      if (done < j.len && done % kAlign != 0) break;  // a short write off the alignment
    }
    g_direct_bytes += done;
    if (j.in_place) g_in_place_bytes += done;
    if (done == j.len) return Status::Ok();
    g_buffered_bytes += j.len - done;
    return PwriteAll(fd_, j.pos + done, std::string_view(j.buf + done, j.len - done), path_);
  }
  g_buffered_bytes += j.len;
  return PwriteAll(fd_, j.pos, std::string_view(j.buf, j.len), path_);
}

void DirectWriter::WriterLoop() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    cv_.wait(lock, [&] { return closing_ || !queue_.empty(); });
    if (queue_.empty()) return;
    const Job j = queue_.front();
    queue_.pop_front();
    lock.unlock();
    Status s = Status::Ok();
    try {
      s = WriteBlock(j);
    } catch (const std::bad_alloc&) {  // an error message that could not be built
      s = ResourceExhausted("out of memory");
    }
    lock.lock();
    if (!s.ok() && failed_.ok()) failed_ = std::move(s);
    for (auto it = pending_.begin(); it != pending_.end(); ++it) {
      if (it->pos == j.pos && it->len == j.len) {
        pending_.erase(it);
        break;
      }
    }
    cv_.notify_all();
  }
}

bool DirectWriter::StartWriters() {
  if (!writers_tried_) {
    writers_tried_ = true;
    for (int t = 0; t < kWriters; ++t) {
      if (!writers_.Start([this] { WriterLoop(); })) break;
    }
  }
  return writers_.started() > 0;
}

Status DirectWriter::WaitFor(uint64_t offset, uint64_t n) {
  const Status flushed = FlushCarry();
  if (!flushed.ok()) {
    std::lock_guard<std::mutex> lock(mu_);
    if (failed_.ok()) failed_ = flushed;
  }
  return WaitForPending(offset, n);
}

Status DirectWriter::WaitForPending(uint64_t offset, uint64_t n) {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] {
    for (const Job& j : pending_)
      if (j.pos < offset + n && offset < j.pos + j.len) return false;
    return true;
  });
  return failed_;
}

Status DirectWriter::Drain() {
  const Status flushed = FlushCarry();
  std::unique_lock<std::mutex> lock(mu_);
  if (!flushed.ok() && failed_.ok()) failed_ = flushed;
  cv_.wait(lock, [&] { return pending_.empty(); });
  return failed_;
}

void DirectWriter::HandOver(const Job& j) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back(j);
    pending_.push_back(j);
  }
  cv_.notify_all();
}

int DirectWriter::GrowStaging(int want) {
  static_assert(kBlock == DirectReader::kBlock, "staging comes from the I/O blocks");
  while (staging_.size() < static_cast<size_t>(want)) {
    auto* p = static_cast<uint8_t*>(GetIoBlock());
    if (!p) break;
    try {
      staging_.push_back(p);
    } catch (const std::bad_alloc&) {
      PutIoBlock(p);
      break;
    }
  }
  return static_cast<int>(staging_.size());
}

int DirectWriter::FreeSlot(int slots) {
  std::unique_lock<std::mutex> lock(mu_);
  int k = -1;
  cv_.wait(lock, [&] {
    if (!failed_.ok()) return true;
    for (k = 0; k < slots; ++k)
      if (std::none_of(pending_.begin(), pending_.end(), [&](const Job& p) { return p.slot == k; }))
        return true;
    return false;
  });
  return failed_.ok() ? k : -1;
}

Status DirectWriter::FlushCarry() {
  if (!carrying_) return Status::Ok();
  carrying_ = false;
  const int k = carry_slot_;
  carry_slot_ = -1;
  if (k < 0 || carry_len_ == 0) return Status::Ok();
  uint8_t* buf = staging_[static_cast<size_t>(k)];
  const uint64_t whole = carry_len_ & ~(kAlign - 1);
  if (whole > 0) HandOver({carry_pos_, whole, k, reinterpret_cast<const char*>(buf), false, {}});
  if (carry_len_ == whole) return Status::Ok();
  // The last, partial 4 KiB block: through the page cache, by a writer. Called from WaitFor,
  // Drain and the destructor too, so a failed allocation is a status, not an exception.
  const uint64_t rest = carry_len_ - whole;
  try {
    auto edge = std::make_shared<const std::string>(reinterpret_cast<const char*>(buf) + whole,
                                                    static_cast<size_t>(rest));
    HandOver({carry_pos_ + whole, rest, -1, edge->data(), false, std::move(edge)});
  } catch (const std::bad_alloc&) {
    return ResourceExhausted(path_ + ": " + OutOfMemoryText());
  }
  return Status::Ok();
}

Status DirectWriter::WriteCarried(uint64_t offset, std::string_view data,
                                  const RandomWriteFile::PieceFn& before) {
  const auto* src = reinterpret_cast<const uint8_t*>(data.data());
  const uint64_t end = offset + data.size();
  uint64_t at = offset;
  uint64_t head = 0;  // bytes before the first 4 KiB boundary of a range that starts a carry
  const bool continues = Continues(offset);
  // After any earlier write of these bytes still going out (a range written over again): two
  // writers take blocks in any order. A range that continues the carry keeps it open (its own
  // blocks all lie before `offset`); any other hands it over first, as Write does.
  CKPT_RETURN_IF_ERROR(
      continues ? WaitForPending(offset, data.size()) : WaitFor(offset, data.size()), "");
  if (!continues) {
    const AlignedMiddle mid(offset, data.size());  // not empty: Write
    head = mid.lo - offset;
    // Handed to `before` in order; written once the first block is with the writers.
    if (before && head > 0) before(src, static_cast<size_t>(head));
    at = mid.lo;
    carrying_ = true;
    carry_end_ = at;
    carry_slot_ = -1;
  }
  const int slots = static_cast<int>(staging_.size());  // at least one (Write)
  Status status = Status::Ok();
  bool head_written = head == 0;
  auto write_head = [&] {
    head_written = true;
    auto edge = std::make_shared<const std::string>(data.data(), static_cast<size_t>(head));
    HandOver({offset, head, -1, edge->data(), false, std::move(edge)});
  };
  try {
    while (at < end) {
      if (carry_slot_ < 0) {
        carry_slot_ = FreeSlot(slots);
        if (carry_slot_ < 0) break;  // a write failed
        carry_pos_ = carry_end_;
        carry_len_ = 0;
      }
      uint8_t* slot = staging_[static_cast<size_t>(carry_slot_)];
      const size_t n = static_cast<size_t>(
          std::min<uint64_t>({end - at, kBlock - carry_len_, RandomWriteFile::kWritePiece}));
      const uint8_t* p = src + (at - offset);
      if (before) before(p, n);
      std::memcpy(slot + carry_len_, p, n);
      carry_len_ += n;
      carry_end_ += n;
      at += n;
      if (carry_len_ == kBlock) {
        HandOver({carry_pos_, kBlock, carry_slot_, reinterpret_cast<const char*>(slot), false, {}});
        carry_slot_ = -1;
        if (!head_written) write_head();
      }
    }
    if (!head_written) write_head();
  } catch (const std::bad_alloc&) {
    status = ResourceExhausted(path_ + ": " + OutOfMemoryText());
  }
  if (!status.ok()) {
    carrying_ = false;
    carry_slot_ = -1;
    Drain().IgnoreError();
    return status;
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (!failed_.ok()) {
    carrying_ = false;
    carry_slot_ = -1;
  }
  return failed_;
}

Status DirectWriter::Write(uint64_t offset, std::string_view data,
                           const RandomWriteFile::PieceFn& before, bool defer) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!failed_.ok()) return failed_;  // an earlier deferred block's error
  }
  const auto* src = reinterpret_cast<const uint8_t*>(data.data());
  const uint64_t end = offset + data.size();
  // pwrite of bytes [at, at + n) of the file, counted as buffered.
  auto put = [&](uint64_t at, size_t n) -> Status {
    CKPT_RETURN_IF_ERROR(
        PwriteAll(fd_, at, std::string_view(data.data() + (at - offset), n), path_), "");
    g_buffered_bytes += n;
    return Status::Ok();
  };
  // Pieces of [from, to) of the range: `before`, then pwrite (a range that goes without
  // O_DIRECT, and the unaligned tail of one that does).
  auto buffered = [&](uint64_t from, uint64_t to) -> Status {
    for (uint64_t at = from; at < to;) {
      const size_t n =
          static_cast<size_t>(std::min<uint64_t>(to - at, RandomWriteFile::kWritePiece));
      if (before) before(src + (at - offset), n);
      CKPT_RETURN_IF_ERROR(put(at, n), "");
      at += n;
    }
    return Status::Ok();
  };
  int dfd;
  {
    std::lock_guard<std::mutex> lock(mu_);
    dfd = direct_.Get(fd_, O_WRONLY, &g_refused);  // -1 once refused; dfd_ stays open
    if (dfd >= 0) dfd_ = dfd;
  }
  // Two blocks being written while a third fills; without staging memory, or writers, the
  // range goes the way below (through pwrite).
  if (defer && dfd >= 0 && !InPlace(offset, data) &&
      (Continues(offset) || !AlignedMiddle(offset, data.size()).empty()) && StartWriters() &&
      GrowStaging(kWriters + 1) > 0)
    return WriteCarried(offset, data, before);
  // The carried block handed over, then after any earlier write of these bytes still going
  // out (a range written over again: two writers take blocks in any order).
  CKPT_RETURN_IF_ERROR(WaitFor(offset, data.size()), "");
  const AlignedMiddle mid(offset, data.size());
  if (dfd < 0 || mid.empty()) return buffered(offset, end);
  const uint64_t lo = mid.lo, hi = mid.hi;  // plain locals: lambdas below capture them
  // Slots: staging buffers, or with `in_place` places in the caller's memory, as many as the
  // range has blocks up to kSlots (a staged range takes any free staging buffer, some of which
  // may still hold an earlier range's deferred blocks). Staging memory that cannot be had is no
  // error: the range goes through pwrite, as it did before staging existed.
  const bool in_place = InPlace(offset, data);
  const int want = static_cast<int>(std::min<uint64_t>(kSlots, (hi - lo + kBlock - 1) / kBlock));
  const int slots = in_place ? want : GrowStaging(want);
  if (slots == 0) return buffered(offset, end);
  // The unaligned head and tail (under 4 KiB each) are handed to `before` in order with the
  // rest and written with pwrite once the middle's blocks are with the writers, not on either
  // side of them: each small write through the page cache took 0.1-0.4 ms on the development
  // VM with the disk idle (docs/performance.md, 2026-12-06 08:00).
  if (before && lo > offset) before(src, static_cast<size_t>(lo - offset));

  // The middle: the caller's thread hashes (before) each block and copies it into a free slot
  // (in place: the block stays where it is); the writers write the filled slots, in any order.
  const bool threaded = StartWriters();  // none: the caller writes each block itself below
  Status status = Status::Ok();
  try {
    for (uint64_t pos = lo; pos < hi; pos += kBlock) {
      const int k = FreeSlot(slots);  // a slot no pending block holds
      if (k < 0) break;               // a write failed
      const uint64_t len = std::min(kBlock, hi - pos);
      uint8_t* slot = in_place ? nullptr : staging_[static_cast<size_t>(k)];
      // `before` (the output's hash) and the copy into staging for a staged block, before its
      // write; after it is handed to a writer for a block written in place, whose bytes the
      // write only reads: the hash of 8 MiB (0.55 ms) before each write left the disk idle
      // that long per block of an export (docs/performance.md, 2026-12-06 08:00).
      auto pieces = [&] {
        for (uint64_t at = 0; at < len; at += RandomWriteFile::kWritePiece) {
          const size_t n =
              static_cast<size_t>(std::min<uint64_t>(len - at, RandomWriteFile::kWritePiece));
          const uint8_t* p = src + (pos + at - offset);
          if (before) before(p, n);
          if (slot) std::memcpy(slot + at, p, n);
        }
      };
      if (!in_place) pieces();
      const auto* from = reinterpret_cast<const char*>(in_place ? src + (pos - offset) : slot);
      const Job j{pos, len, k, from, in_place, {}};
      if (!threaded) {
        if (in_place) pieces();
        status = WriteBlock(j);
        if (!status.ok()) break;
        continue;
      }
      {
        std::lock_guard<std::mutex> lock(mu_);
        queue_.push_back(j);
        pending_.push_back(j);
      }
      cv_.notify_all();
      if (in_place) pieces();
    }
    bool middle_failed;  // a writer's error: the head and tail need not go out
    {
      std::lock_guard<std::mutex> lock(mu_);
      middle_failed = !failed_.ok();
    }
    // The head, handed to `before` above; the tail, handed over and written now.
    if (status.ok() && !middle_failed && lo > offset)
      status = put(offset, static_cast<size_t>(lo - offset));
    if (status.ok() && !middle_failed) status = buffered(hi, end);
  } catch (const std::bad_alloc&) {
    status = ResourceExhausted(path_ + ": " + OutOfMemoryText());
  }
  // Bytes that lie in the caller's memory are on file before the call returns; so is
  // everything when the caller did not ask to defer (and after any error).
  const Status drained = (in_place || !defer || !status.ok()) ? Drain() : Status::Ok();
  if (status.ok()) status = drained;
  if (status.ok()) {
    std::lock_guard<std::mutex> lock(mu_);
    status = failed_;
  }
  return status;
}

}  // namespace internal
}  // namespace ckpt
