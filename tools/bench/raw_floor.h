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
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
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
class AlignedBuffer {
 public:
  explicit AlignedBuffer(size_t bytes) : bytes_(bytes) {
    constexpr size_t kHuge = 2u << 20;
    const size_t align = bytes >= kHuge ? kHuge : kAlign;
    const size_t cap = std::max((bytes + align - 1) / align * align, align);
    void* p = nullptr;
    if (posix_memalign(&p, align, cap) != 0) throw std::bad_alloc();
    if (align == kHuge) madvise(p, cap, MADV_HUGEPAGE);  // a hint: refused is fine
    data_.reset(static_cast<uint8_t*>(p));
    std::memset(data_.get(), 0, cap);  // touched before any clock starts
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

}  // namespace raw_floor
