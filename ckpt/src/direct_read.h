// Large reads that bypass the page cache (issue 19): PosixRandomAccessFile's ReadLarge and Scan.
// Private to the format library (env_posix.cc).
//
// A cold load through the page cache pays for it twice on a small machine: the kernel copies
// every byte out of its cache and fills, ages and evicts pages the caller never reads again;
// O_DIRECT reads of the same bytes in 16 MiB blocks ran 2.1× faster on the development VM
// (docs/performance.md). DirectReader reads [offset, offset + n) with O_DIRECT into aligned
// buffers on helper threads, up to kDepth blocks ahead of the caller, which consumes them in
// order (copies into its destination, hashes); two reads are in flight at once, since the disk
// serves one stream of single 8 MiB requests at well under its rate (0.37 GiB/s with 4 MiB
// requests, 0.61 with 16 MiB, one file, same run). The range is widened to the 4 KiB alignment
// O_DIRECT needs and the extra bytes are never handed out.
#pragma once

#include <atomic>
#include <cstdint>
#include <mutex>
#include <string>

#include "ckpt/env.h"
#include "ckpt/unique_fd.h"

namespace ckpt::internal {

// A file's O_DIRECT descriptor, for DirectReader and DirectWriter: the open file reopened on
// first use through /proc/self/fd (never its path again), and refused for good once the file
// system refuses O_DIRECT (at that open, or at a first read or write). Not thread-safe.
class DirectDescriptor {
 public:
  // The descriptor (`file` reopened with `flags` | O_DIRECT), or -1 once refused; a refusal is
  // counted in *refusals, once per file.
  int Get(int file, int flags, std::atomic<uint64_t>* refusals);
  void Refuse(std::atomic<uint64_t>* refusals);
  bool refused() const { return refused_; }

 private:
  bool opened_ = false;
  bool refused_ = false;
  UniqueFd fd_;
};

class DirectReader {
 public:
  static constexpr uint64_t kBlock = 8u << 20;  // bytes per O_DIRECT read
  static constexpr int kDepth = 3;              // buffers per large read (24 MiB)
  static constexpr int kProducers = 2;          // O_DIRECT reads in flight at once
  static constexpr int kIntoAhead = 4;          // ReadInto: blocks read ahead of on_filled
  static constexpr uint64_t kAlign = 4096;
  // Reads of fewer bytes go through the page cache, except into the caller's memory:
  static constexpr uint64_t kMinBytes = 8u << 20;
  // reads straight into memory that shares the data's place in a 4 KiB block (ReadInto) go
  // past the page cache from here: a compressed chunk's zstd frame (about 3.5 MiB for a 4 MiB
  // fp32 chunk) read into a reused aligned buffer, a 1 MiB tensor of a DeepSpeed optimizer
  // file read into to-universal's window (its aligned middle is under 1 MiB). On the
  // development VM a cold buffered read moved 0.52 GiB/s against 4.1 for O_DIRECT, the page
  // cache's fresh memory costing host page faults (docs/performance.md, 2026-12-02 09:40).
  static constexpr uint64_t kMinIntoBytes = 512u << 10;

  // `fd` is the file's ordinary descriptor (not owned); `path` names it in errors.
  DirectReader(int fd, std::string path) : fd_(fd), path_(std::move(path)) {}

  // Whether a read of [offset, offset + n) should bypass the page cache: at least `min_bytes`,
  // not switched off by CKPT_DIRECT_IO=off, O_DIRECT not refused for this file before, and
  // (unless CKPT_DIRECT_IO=on) the range not already in the page cache.
  bool Wanted(uint64_t offset, uint64_t n, uint64_t min_bytes = kMinBytes) const;

  // Whether ReadInto can read [offset, offset + n) into `out`: the destination and the file
  // offset share their position within a kAlign block (4 KiB-aligned memory and a dataset the
  // writer aligned to 4 KiB, issue 19), and the aligned middle holds at least kMinIntoBytes.
  static bool CanReadInto(uint64_t offset, uint64_t n, const void* out);

  // Reads [offset, offset + n) into `out` (CanReadInto holds): the aligned middle with O_DIRECT
  // straight into the caller's memory, several requests in flight (no bounce buffer: no copy;
  // and in 4 KiB pages O_DIRECT into a reused buffer ran 3.5x slower than into fresh memory,
  // an effect of request size that huge pages cure: AllocateIoMemory, docs/performance.md
  // 2026-12-02 05:40); the unaligned head and tail in the same requests as the first and last
  // blocks, their 4 KiB blocks read into scratch and copied out. `on_filled` (may be empty)
  // gets each consecutive part once it holds the file's bytes. *fell_back as for Scan:
  // nothing was handed out.
  Status ReadInto(uint64_t offset, uint64_t n, uint8_t* out,
                  const RandomAccessFile::PartFn& on_filled, bool* fell_back) const;

  // Hands [offset, offset + n) to `consume` in order. *fell_back is set when O_DIRECT was refused
  // before any byte was handed out: nothing was consumed, the caller reads another way.
  Status Scan(uint64_t offset, uint64_t n, const RandomAccessFile::PartFn& consume,
              bool* fell_back) const;

 private:
  // The O_DIRECT descriptor, opened on first use through /proc/self/fd (the same open file,
  // never the path again); -1 when the file system refuses it.
  int DirectFd() const;
  void Refuse() const;

  int fd_;
  std::string path_;
  mutable std::mutex mu_;
  mutable DirectDescriptor direct_;  // under mu_
};

// The whole 4 KiB blocks inside [offset, offset + n): what O_DIRECT moves of the range, the
// unaligned head [offset, lo) and tail [hi, offset + n) going through pread or pwrite. Empty
// (hi <= lo) when the range holds no whole block.
struct AlignedMiddle {
  static constexpr uint64_t kAlign = 4096;
  uint64_t lo, hi;
  AlignedMiddle(uint64_t offset, uint64_t n)
      : lo((offset + kAlign - 1) & ~(kAlign - 1)), hi((offset + n) & ~(kAlign - 1)) {}
  bool empty() const { return hi <= lo; }
  uint64_t bytes() const { return empty() ? 0 : hi - lo; }
};

// Whether CKPT_DIRECT_IO=off (or 0) switches O_DIRECT off for reads and writes.
bool DirectIoOff();

// A DirectReader::kBlock buffer of I/O memory for an O_DIRECT transfer (a read's slot, a
// write's staging), from those kept by earlier transfers when there is one; nullptr when none
// can be had. PutIoBlock hands it back to be kept (up to a bound) or freed.
void* GetIoBlock();
void PutIoBlock(void* p);

// pread of exactly n bytes (DataLoss naming `path` at the end of the file).
Status PreadExact(int fd, uint64_t offset, size_t n, void* out, const std::string& path);

// Counts a large read that went through the page cache (for GetDirectReadStats).
void CountBufferedRead(uint64_t n);

}  // namespace ckpt::internal
