// Large writes that bypass the page cache (issue 19): PosixWritableFile's large appends (an
// export's tensor pieces) and PosixRandomWriteFile::WriteThrough (a rank file's data). Private
// to the format library (env_posix.cc).
//
// A save through the page cache hands every byte to the kernel twice over on a small machine:
// copied into the cache, then written back in requests no larger than the page cache's
// scattered 4 KiB pages allow (about 1 MiB on the development VM's virtio disk, 254 segments).
// DirectWriter copies the caller's bytes into aligned staging buffers in huge pages
// (GetIoBlock: kept from one file to the next) and writes them with O_DIRECT on two helper
// threads while the caller hashes and copies the next ones; 2 MiB pages let a request reach the
// device's 4 MiB limit. Bytes that already lie in such memory (IsIoMemory), at their file
// offset's position within a 4 KiB block, are written from where they are: no copy, no
// staging, and the caller hashes them while a writer writes them.
// Only whole 4 KiB blocks inside the range go this way (the writer aligns large datasets to
// 4 KiB); the unaligned head and tail use pwrite. A file system that refuses O_DIRECT (at open
// or at the first write) gets pwrite from the same staging buffer, and every later range of
// the file goes through pwrite; so does a range whose staging memory cannot be allocated.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "ckpt/aligned_buffer.h"
#include "ckpt/env.h"
#include "ckpt/run_ahead.h"
#include "direct_read.h"

namespace ckpt::internal {

class DirectWriter {
 public:
  static constexpr uint64_t kBlock = 8u << 20;  // bytes per O_DIRECT write
  static constexpr int kSlots = 4;              // staging buffers (up to 32 MiB, as needed)
  static constexpr int kWriters = 2;            // O_DIRECT writes in flight at once
  static constexpr uint64_t kAlign = 4096;
  static constexpr uint64_t kMinInPlace = 1u << 20;
  static constexpr uint64_t kMinDeferred = 512u << 10;  // staged with Write's `defer`

  // `fd` is the file's ordinary descriptor (not owned); `path` names it in errors.
  DirectWriter(int fd, std::string path);
  ~DirectWriter();
  DirectWriter(const DirectWriter&) = delete;
  DirectWriter& operator=(const DirectWriter&) = delete;

  // Whether Write takes `data` at `offset`: O_DIRECT not refused for this file, not switched
  // off by CKPT_DIRECT_IO=off, and at least one whole block in the aligned middle, or
  // kMinInPlace bytes when the middle leaves from where it is (InPlace: no staging to fill), or
  // kMinDeferred bytes when `deferred` (Write's `defer`: small ranges overlap the next ones).
  // Through the page cache, an export's last 5.5 MB piece of each 89 MB tensor took 20 ms
  // (its fresh cache pages, then its writeback at the fsync) where O_DIRECT writes 8 MiB in
  // 8-15 ms (docs/performance.md, 2026-12-03 16:30).
  bool Wanted(uint64_t offset, std::string_view data, bool deferred = false) const;

  // Whether `data`'s aligned middle can leave from where it is: I/O memory (IsIoMemory) at the
  // same position within a 4 KiB block as `offset`. Write then copies nothing.
  static bool InPlace(uint64_t offset, std::string_view data);

  // Writes `data` at `offset` (Wanted holds), handing each piece of at most
  // RandomWriteFile::kWritePiece bytes to `before` first, in order. Returns once every byte is
  // on file, or with `defer` once the middle's blocks are staged and with the writers (bytes
  // written from where they lie are always waited for): their writes go on while the caller
  // goes on, and an error among them is returned by a later Write, WaitFor or Drain. A range
  // over bytes that an earlier one's writes still carry waits for those writes first (two
  // writers take blocks in any order), so the file ends with the later bytes.
  Status Write(uint64_t offset, std::string_view data, const RandomWriteFile::PieceFn& before,
               bool defer = false);

  // Waits until no write handed over and not yet done touches [offset, offset + n); the first
  // error of any write so far. The carried block (below) is handed over first.
  Status WaitFor(uint64_t offset, uint64_t n);
  // Waits for every write handed over, the carried block's too; the first error of any.
  Status Drain();

 private:
  struct Job {
    uint64_t pos, len;
    int slot;
    const char* buf;
    bool in_place;
    // A carried range's unaligned edge (under 4 KiB), copied: written with pwrite by a writer,
    // since on ext4 a pwrite waits for the O_DIRECT write in flight (1.2-1.4 ms on the
    // development VM, docs/performance.md 2026-12-06 18:50), which the caller then would too.
    std::shared_ptr<const std::string> edge;
  };
  void HandOver(const Job& j);      // queued for the writers and pending until written
  Status WriteBlock(const Job& j);  // one block, O_DIRECT or (refused) pwrite
  // A deferred staged range through the carry: its bytes continue the staging block the range
  // before left open when it begins where that one ended; each block is handed to the writers
  // once full, and the last, partly filled one stays open for the next range. A file of many
  // small datasets laid end to end (universal.h5: 903 of 1 MiB, each sharing a 4 KiB block
  // with the next) leaves in 8 MiB writes instead of one 1 MiB write and two small page-cache
  // writes each.
  Status WriteCarried(uint64_t offset, std::string_view data,
                      const RandomWriteFile::PieceFn& before);
  // Hands the carried block's whole 4 KiB blocks to the writers, and its unaligned rest as an
  // edge; nothing carried afterwards. The caller's thread.
  Status FlushCarry();
  // WaitFor without handing the carried block over: for a range that continues it.
  Status WaitForPending(uint64_t offset, uint64_t n);
  // Whether a range at `offset` continues the carry.
  bool Continues(uint64_t offset) const { return carrying_ && offset == carry_end_; }
  // Makes sure up to `want` staging buffers exist (fewer when memory cannot be had); how many.
  int GrowStaging(int want);
  // Waits for a slot below `slots` that no pending block holds (the carry's, if any, is not
  // pending: called only with none open); -1 once a write failed.
  int FreeSlot(int slots);
  void WriterLoop();
  bool StartWriters();  // false when no helper thread could be started

  int fd_;
  std::string path_;
  DirectDescriptor direct_;  // used under mu_
  int dfd_ = -1;             // the O_DIRECT descriptor once opened (under mu_; open till the end)
  // Staging buffers (GetIoBlock), kept for the file's later ranges (a rank file has a few large
  // datasets), then handed back for the next file's: a fresh one costs its page faults.
  std::vector<uint8_t*> staging_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Job> queue_;     // handed over, not yet taken by a writer
  std::vector<Job> pending_;  // handed over, not yet done (queued or being written); its
                              // blocks' slots are the busy ones
  // The carry (WriteCarried): the file offset at which the next range continues it, and the
  // staging slot holding its bytes [carry_pos_, carry_pos_ + carry_len_) (-1: none yet, the
  // next block starts at carry_end_). The caller's thread only.
  bool carrying_ = false;
  uint64_t carry_end_ = 0, carry_pos_ = 0, carry_len_ = 0;
  int carry_slot_ = -1;
  bool closing_ = false;
  Status failed_ = Status::Ok();
  // Writer threads, started at the first block and kept for the file's life (joined first in
  // the destructor, after the queue is empty).
  Helpers writers_;
  bool writers_tried_ = false;
};

// pwrite of all of `data` at `offset` (EINTR and short writes retried).
Status PwriteAll(int fd, uint64_t offset, std::string_view data, const std::string& path);

// Counts WriteThrough bytes written with pwrite (for GetDirectWriteStats).
void CountBufferedWrite(uint64_t n);

}  // namespace ckpt::internal
