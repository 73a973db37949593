// The raw I/O floors of tools/bench.sh (issue 19), one copy for raw_io and ckpt_io.
//
// A floor is what a program that only moves bytes gets from this machine for the same byte
// count, split over the same files and threads: no HDF5, no hashing. Which way of moving them is
// fastest depends on the disk and the kernel, so the benchmark measures several and compares
// ckpt with the best one of the same run:
//   write: buffered write(2) in 4 MiB blocks + fsync (the old floor), the same with
//          sync_file_range(SYNC_FILE_RANGE_WRITE) after every block (writeback started as the
//          data arrives), and O_DIRECT writes of 4, 16 and 64 MiB aligned blocks;
//   read:  buffered read(2) in 4 MiB blocks and O_DIRECT reads of 4, 16 and 64 MiB blocks.
// Every variant writes or reads one file per thread (DIR/raw_<i>.bin), and a write pass ends
// with an fsync of each file and of DIR, as a checkpoint commit does.
//
// The bytes: each file's source (or destination) is one page-aligned buffer, filled before the
// clock starts. O_DIRECT needs aligned memory, offsets and lengths; a file whose length is not
// a multiple of 4 KiB gets its last block padded and is truncated back to its length before
// the fsync (what an O_DIRECT writer does). Where O_DIRECT is refused (tmpfs, some network
// file systems) the variant reports "unsupported" and the best of the others is the floor.
#pragma once

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

namespace raw_floor {

constexpr size_t kAlign = 4096;

enum class Mode { kBuffered, kSyncFileRange, kDirect };

struct Variant {
  std::string name;  // e.g. "direct_16MiB"
  Mode mode;
  size_t block;
};

inline std::vector<Variant> WriteVariants() {
  return {{"buffered_4MiB", Mode::kBuffered, 4u << 20},
          {"sync_file_range_4MiB", Mode::kSyncFileRange, 4u << 20},
          {"direct_4MiB", Mode::kDirect, 4u << 20},
          {"direct_16MiB", Mode::kDirect, 16u << 20},
          {"direct_64MiB", Mode::kDirect, 64u << 20}};
}

inline std::vector<Variant> ReadVariants() {
  return {{"buffered_4MiB", Mode::kBuffered, 4u << 20},
          {"direct_4MiB", Mode::kDirect, 4u << 20},
          {"direct_16MiB", Mode::kDirect, 16u << 20},
          {"direct_64MiB", Mode::kDirect, 64u << 20}};
}

// One page-aligned buffer per file, its length a multiple of kAlign (the slack is zero). From
// 2 MiB up it is aligned to 2 MiB and asks for transparent huge pages, as ckpt's I/O memory
// does (ckpt/aligned_buffer.h): an O_DIRECT transfer into 4 KiB pages leaves this VM's disk as
// ~1 MiB requests (254 segments), into 2 MiB pages as 4 MiB ones: the same reads ran 2.1-2.4x
// faster, the writes 1.3-1.5x (docs/performance.md, 2026-12-02 05:40). A floor without it
// would be weak.
//
// `touch` false leaves the memory untouched: fresh memory, whose first touch the caller times
// (the floor of a load that must return new memory, ckpt_io reshard-load).
class AlignedBuffer {
 public:
  explicit AlignedBuffer(size_t bytes, bool touch = true) : bytes_(bytes) {
    constexpr size_t kHuge = 2u << 20;
    const size_t align = bytes >= kHuge ? kHuge : kAlign;
    const size_t cap = std::max((bytes + align - 1) / align * align, align);
    void* p = nullptr;
    if (posix_memalign(&p, align, cap) != 0) throw std::bad_alloc();
    if (align == kHuge) madvise(p, cap, MADV_HUGEPAGE);  // a hint: refused is fine
    data_.reset(static_cast<uint8_t*>(p));
    if (touch) std::memset(data_.get(), 0, cap);  // touched before any clock starts
  }
  uint8_t* data() const { return data_.get(); }
  size_t size() const { return bytes_; }

 private:
  struct Free {
    void operator()(uint8_t* p) const { std::free(p); }
  };
  std::unique_ptr<uint8_t, Free> data_;
  size_t bytes_;
};

inline std::string FileName(const std::string& dir, size_t i) {
  return dir + "/raw_" + std::to_string(i) + ".bin";
}

// Moves one file's bytes; returns "" or the error. "unsupported" when O_DIRECT is refused.
inline std::string MoveFile(const std::string& path, const AlignedBuffer& buf, bool write_pass,
                            const Variant& v) {
  int flags = write_pass ? (O_WRONLY | O_CREAT | O_TRUNC) : O_RDONLY;
  flags |= O_CLOEXEC;
  if (v.mode == Mode::kDirect) flags |= O_DIRECT;
  const int fd = open(path.c_str(), flags, 0644);
  if (fd < 0) {
    if (v.mode == Mode::kDirect && errno == EINVAL) return "unsupported";
    return "open " + path + ": " + std::strerror(errno);
  }
  const size_t len = buf.size();
  // O_DIRECT moves whole aligned blocks: the last one is padded (writes) or may come back
  // short at the end of the file (reads).
  const size_t span = v.mode == Mode::kDirect ? (len + kAlign - 1) / kAlign * kAlign : len;
  std::string err;
  for (size_t done = 0; done < span;) {
    const size_t n = std::min(v.block, span - done);
    const ssize_t got = write_pass ? pwrite(fd, buf.data() + done, n, static_cast<off_t>(done))
                                   : pread(fd, buf.data() + done, n, static_cast<off_t>(done));
    if (got < 0 && errno == EINTR) continue;
    if (got < 0 && v.mode == Mode::kDirect && errno == EINVAL && done == 0) {
      err = "unsupported";
      break;
    }
    if (got < 0) {
      err = std::string(write_pass ? "write " : "read ") + path + ": " + std::strerror(errno);
      break;
    }
    if (got == 0) break;  // end of file (reads)
    if (write_pass && v.mode == Mode::kSyncFileRange)
      sync_file_range(fd, static_cast<off_t>(done), got, SYNC_FILE_RANGE_WRITE);
    done += static_cast<size_t>(got);
  }
  if (err.empty() && write_pass && span != len && ftruncate(fd, static_cast<off_t>(len)) != 0)
    err = "truncate " + path + ": " + std::strerror(errno);
  if (err.empty() && write_pass && fsync(fd) != 0)
    err = "fsync " + path + ": " + std::strerror(errno);
  close(fd);
  return err;
}

struct PassResult {
  std::optional<double> seconds;  // empty when the variant is unsupported here
  std::string error;              // an I/O error other than "unsupported"
};

// One pass of `v` over every file, one thread per file, timed from the first open to the
// fsync of DIR (writes) or the last byte read.
inline PassResult Pass(const std::string& dir, const std::vector<AlignedBuffer>& files,
                       bool write_pass, const Variant& v) {
  std::vector<std::string> errors(files.size());
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<std::thread> threads;
  for (size_t i = 0; i < files.size(); ++i)
    threads.emplace_back(
        [&, i] { errors[i] = MoveFile(FileName(dir, i), files[i], write_pass, v); });
  for (auto& t : threads) t.join();
  if (write_pass) {
    const int dfd = open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd >= 0) {
      fsync(dfd);
      close(dfd);
    }
  }
  const double secs =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  PassResult r;
  for (const auto& e : errors) {
    if (e == "unsupported") return r;
    if (!e.empty()) {
      r.error = e;
      return r;
    }
  }
  r.seconds = secs;
  return r;
}

// The copy floor (export-fp32's job without ckpt): the first bytes of several source files read
// in order and written one after the other into one output file, then fsync of it and of its
// directory, by a program that only moves bytes. Reads and writes overlap through a ring of
// 2 x `inflight` block buffers: `inflight` reader threads fill blocks in order, as many writer
// threads write them, so up to `inflight` reads and `inflight` writes are in flight at once.
// Unlike the other floors the ring is allocated inside the clock, as any copying process must
// (fresh memory, the transparent-huge-page hint of AlignedBuffer): a copy that pre-touched its
// buffers would hide a cost no program that starts up avoids. Each source's byte count is
// rounded down to whole 4 KiB blocks so that every write stays aligned (at most 4 KiB less a
// file).
struct CopyVariant {
  std::string name;  // e.g. "direct_16MiB_x2"
  Mode mode;         // kBuffered (both sides) or kDirect (both sides)
  size_t block;
  int inflight;
};

inline std::vector<CopyVariant> CopyVariants() {
  return {{"buffered_4MiB_x1", Mode::kBuffered, 4u << 20, 1},
          {"direct_8MiB_x2", Mode::kDirect, 8u << 20, 2},
          {"direct_16MiB_x1", Mode::kDirect, 16u << 20, 1},
          {"direct_16MiB_x2", Mode::kDirect, 16u << 20, 2},
          {"direct_64MiB_x1", Mode::kDirect, 64u << 20, 1}};
}

// Copies `bytes[i]` (already rounded to kAlign) from the start of each `sources[i]` to `dest`.
inline PassResult CopyPass(const std::vector<std::string>& sources,
                           const std::vector<uint64_t>& bytes, const std::string& dest,
                           const std::string& dest_dir, const CopyVariant& v) {
  struct Block {
    size_t src;
    uint64_t from, to, len;
  };
  std::vector<Block> blocks;
  uint64_t out_at = 0;
  for (size_t f = 0; f < sources.size(); ++f)
    for (uint64_t at = 0; at < bytes[f]; at += v.block) {
      const uint64_t len = std::min<uint64_t>(v.block, bytes[f] - at);
      blocks.push_back({f, at, out_at, len});
      out_at += len;
    }
  PassResult r;
  const auto t0 = std::chrono::steady_clock::now();
  const int direct = v.mode == Mode::kDirect ? O_DIRECT : 0;
  std::vector<int> in;
  auto close_sources = [&in] {
    for (int fd : in)
      if (fd >= 0) close(fd);
  };
  for (const auto& path : sources) {
    in.push_back(open(path.c_str(), O_RDONLY | O_CLOEXEC | direct));
    if (in.back() < 0) {
      if (direct && errno == EINVAL) {  // unsupported
        close_sources();
        return r;
      }
      r.error = "open " + path + ": " + std::strerror(errno);
    }
  }
  const int out = open(dest.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | direct, 0644);
  if (out < 0 && r.error.empty()) {
    if (direct && errno == EINVAL) {
      close_sources();
      return r;
    }
    r.error = "open " + dest + ": " + std::strerror(errno);
  }
  const size_t slots = 2 * static_cast<size_t>(v.inflight);
  // Fresh memory, touched first by the reads themselves (not AlignedBuffer, which pre-touches).
  std::vector<uint8_t*> mem(slots, nullptr);
  for (size_t k = 0; k < slots && r.error.empty(); ++k) {
    void* p = nullptr;
    if (posix_memalign(&p, 2u << 20, v.block) != 0) {
      r.error = "out of memory";
      break;
    }
    madvise(p, v.block, MADV_HUGEPAGE);
    mem[k] = static_cast<uint8_t*>(p);
  }
  // held[k]: the block slot k holds (or will hold); full[k]: its bytes are read.
  std::mutex mu;
  std::condition_variable cv;
  std::vector<int64_t> held(slots, -1);
  std::vector<bool> full(slots, false);
  std::string failure;
  for (size_t k = 0; k < slots && k < blocks.size(); ++k) held[k] = static_cast<int64_t>(k);
  auto fail = [&](std::string what) {
    std::lock_guard<std::mutex> lock(mu);
    if (failure.empty()) failure = std::move(what);
    cv.notify_all();
  };
  auto reader = [&](size_t first) {
    for (size_t b = first; b < blocks.size(); b += static_cast<size_t>(v.inflight)) {
      const size_t k = b % slots;
      {
        std::unique_lock<std::mutex> lock(mu);
        cv.wait(lock, [&] { return held[k] == static_cast<int64_t>(b) || !failure.empty(); });
        if (!failure.empty()) return;
      }
      const Block& x = blocks[b];
      for (uint64_t done = 0; done < x.len;) {
        const ssize_t n =
            pread(in[x.src], mem[k] + done, x.len - done, static_cast<off_t>(x.from + done));
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0)
          return fail("read " + sources[x.src] + ": " +
                      (n == 0 ? std::string("short file") : std::strerror(errno)));
        done += static_cast<uint64_t>(n);
      }
      std::lock_guard<std::mutex> lock(mu);
      full[k] = true;
      cv.notify_all();
    }
  };
  auto writer = [&](size_t first) {
    for (size_t b = first; b < blocks.size(); b += static_cast<size_t>(v.inflight)) {
      const size_t k = b % slots;
      {
        std::unique_lock<std::mutex> lock(mu);
        cv.wait(lock, [&] {
          return (held[k] == static_cast<int64_t>(b) && full[k]) || !failure.empty();
        });
        if (!failure.empty()) return;
      }
      const Block& x = blocks[b];
      for (uint64_t done = 0; done < x.len;) {
        const ssize_t n = pwrite(out, mem[k] + done, x.len - done, static_cast<off_t>(x.to + done));
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) return fail("write " + dest + ": " + std::strerror(errno));
        done += static_cast<uint64_t>(n);
      }
      std::lock_guard<std::mutex> lock(mu);
      full[k] = false;
      held[k] = b + slots < blocks.size() ? static_cast<int64_t>(b + slots) : -1;
      cv.notify_all();
    }
  };
  if (r.error.empty()) {
    std::vector<std::thread> threads;
    for (int t = 0; t < v.inflight; ++t) {
      threads.emplace_back(reader, static_cast<size_t>(t));
      threads.emplace_back(writer, static_cast<size_t>(t));
    }
    for (auto& t : threads) t.join();
    if (!failure.empty()) r.error = failure;
  }
  if (r.error.empty() && fsync(out) != 0) r.error = "fsync " + dest + ": " + std::strerror(errno);
  close_sources();
  if (out >= 0) close(out);
  for (uint8_t* p : mem) std::free(p);
  if (!r.error.empty()) return r;
  const int dfd = open(dest_dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    fsync(dfd);
    close(dfd);
  }
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return r;
}

}  // namespace raw_floor
