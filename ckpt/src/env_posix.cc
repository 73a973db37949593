// PosixEnv: the real file system. Every call maps errno through PosixError, naming the step and
// the path (leveldb's util/env_posix.cc).
#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <random>

#include "ckpt/env.h"
#include "ckpt/unique_fd.h"
#include "direct_read.h"
#include "direct_write.h"

namespace ckpt {

void UniqueFd::reset(int fd) {
  if (fd_ >= 0) ::close(fd_);
  fd_ = fd;
}

Status UniqueFd::Close(std::string_view path) {
  const int fd = std::exchange(fd_, -1);
  if (fd >= 0 && ::close(fd) != 0) return PosixError("close " + std::string(path), errno);
  return Status::Ok();
}

namespace {

using internal::PreadExact;

using internal::PwriteAll;

Result<uint64_t> SizeOf(int fd, const std::string& path) {
  struct stat st{};
  if (::fstat(fd, &st) != 0) return PosixError("stat " + path, errno);
  return static_cast<uint64_t>(st.st_size);
}

class PosixRandomAccessFile final : public RandomAccessFile {
 public:
  PosixRandomAccessFile(std::string path, UniqueFd fd, uint64_t size)
      : path_(std::move(path)), fd_(std::move(fd)), size_(size), direct_(fd_.get(), path_) {}
  Status Read(uint64_t offset, size_t n, void* out) const override {
    return PreadExact(fd_.get(), offset, n, out, path_);
  }
  uint64_t size() const override { return size_; }
  void WillNeed(uint64_t offset, uint64_t n) const override {
    (void)::posix_fadvise(fd_.get(), static_cast<off_t>(offset), static_cast<off_t>(n),
                          POSIX_FADV_WILLNEED);
  }

  // Uncached ranges bypass the page cache (internal::DirectReader); the rest reads as the
  // defaults do.
  Status ReadLarge(uint64_t offset, uint64_t n, void* out,
                   const PartFn& on_filled) const override {
    const bool into = internal::DirectReader::CanReadInto(offset, n, out);
    if (direct_.Wanted(
            offset, n,
            into ? internal::DirectReader::kMinIntoBytes : internal::DirectReader::kMinBytes)) {
      auto* dst = static_cast<uint8_t*>(out);
      bool fell_back = false;
      if (into) {
        Status s = direct_.ReadInto(offset, n, dst, on_filled, &fell_back);
        if (!fell_back) return s;
      }
      Status s = direct_.Scan(
          offset, n,
          [&](uint64_t at, const uint8_t* p, size_t len) -> Status {
            // Copied and handed on 1 MiB at a time, so on_filled finds it in cache.
            constexpr size_t kStep = 1u << 20;
            for (size_t k = 0; k < len; k += kStep) {
              const size_t m = std::min(kStep, len - k);
              uint8_t* to = dst + (at + k - offset);
              std::memcpy(to, p + k, m);
              if (on_filled) CKPT_RETURN_IF_ERROR(on_filled(at + k, to, m), "");
            }
            return Status::Ok();
          },
          &fell_back);
      if (!fell_back) return s;
    }
    internal::CountBufferedRead(n);
    return RandomAccessFile::ReadLarge(offset, n, out, on_filled);
  }
  Status Scan(uint64_t offset, uint64_t n, const PartFn& consume) const override {
    if (direct_.Wanted(offset, n)) {
      bool fell_back = false;
      Status s = direct_.Scan(offset, n, consume, &fell_back);
      if (!fell_back) return s;
    }
    internal::CountBufferedRead(n);
    return RandomAccessFile::Scan(offset, n, consume);
  }

 private:
  std::string path_;
  UniqueFd fd_;
  uint64_t size_;
  internal::DirectReader direct_;
};

class PosixRandomWriteFile final : public RandomWriteFile {
 public:
  PosixRandomWriteFile(std::string path, UniqueFd fd)
      : path_(std::move(path)), fd_(std::move(fd)), direct_(fd_.get(), path_) {}
  Status Write(uint64_t offset, std::string_view data) override {
    CKPT_RETURN_IF_ERROR(direct_.WaitFor(offset, data.size()), "");
    return PwriteAll(fd_.get(), offset, data, path_);
  }
  // A rank file's data leaves past the page cache (DirectWriter): from where it lies when it is
  // in I/O memory, else through staging, whose writes go on while the next range is hashed and
  // copied (from 512 KiB of whole 4 KiB blocks: a file of many small tensors overlaps them
  // too). The page cache was 1.5x slower from the second save on a fast disk, and 5-8x for the
  // first; on the development VM's disk about even (docs/performance.md, 2026-12-06 12:00).
  // CKPT_DIRECT_IO=off keeps it in the page cache.
  Status WriteThrough(uint64_t offset, std::string_view data, const PieceFn& before) override {
    if (direct_.Wanted(offset, data, /*deferred=*/true))
      return direct_.Write(offset, data, before, /*defer=*/true);
    internal::CountBufferedWrite(data.size());  // through Write: after earlier writes of it
    return RandomWriteFile::WriteThrough(offset, data, before);
  }
  Status Read(uint64_t offset, size_t n, void* out) override {
    CKPT_RETURN_IF_ERROR(direct_.WaitFor(offset, n), "");
    return PreadExact(fd_.get(), offset, n, out, path_);
  }
  Result<uint64_t> Size() override {
    CKPT_RETURN_IF_ERROR(direct_.Drain(), "");
    return SizeOf(fd_.get(), path_);
  }
  Status Reserve(uint64_t size) override {
    if (size > 0 && ::fallocate(fd_.get(), 0, 0, static_cast<off_t>(size)) != 0 &&
        errno != EOPNOTSUPP && errno != ENOSYS && errno != EINVAL) {
      return PosixError("reserve " + std::to_string(size) + " bytes for " + path_, errno);
    }
    return Status::Ok();
  }
  void StartWriteback(uint64_t offset, uint64_t n) override {
    ::sync_file_range(fd_.get(), static_cast<off_t>(offset), static_cast<off_t>(n),
                      SYNC_FILE_RANGE_WRITE);
  }
  Status Sync() override {
    CKPT_RETURN_IF_ERROR(direct_.Drain(), "");
    if (::fsync(fd_.get()) != 0) return PosixError("fsync " + path_, errno);
    return Status::Ok();
  }
  Status Close() override {
    const Status drained = direct_.Drain();
    const Status closed = fd_.Close(path_);
    return drained.ok() ? closed : drained;
  }

 private:
  std::string path_;
  UniqueFd fd_;
  internal::DirectWriter direct_;  // destroyed first: its writers finish before fd_ closes
};

// Holding the descriptor holds the flock; closing it releases the lock.
class PosixFileLock final : public FileLock {
 public:
  explicit PosixFileLock(UniqueFd fd) : fd_(std::move(fd)) {}

 private:
  UniqueFd fd_;
};

class PosixWritableFile final : public WritableFile {
 public:
  // `appending`: opened with O_APPEND (a run log), whose writes stay plain write(2).
  PosixWritableFile(std::string path, UniqueFd fd, bool appending)
      : path_(std::move(path)), fd_(std::move(fd)), direct_(fd_.get(), path_),
        appending_(appending) {
    // Where the writes begin: 0 for a new file, the end for an appendable one.
    const off_t end = ::lseek(fd_.get(), 0, SEEK_END);
    written_ = writeback_from_ = end > 0 ? static_cast<uint64_t>(end) : 0;
  }
  ~PosixWritableFile() override { Close().IgnoreError(); }

  // An append whose aligned middle holds 8 MiB or more leaves with O_DIRECT (below). Other
  // large outputs (universal files, small tensors) go out in 4 MiB writes, and the writeback of
  // every 4 MiB written is started at once (sync_file_range, as RocksDB's bytes_per_sync and the
  // rank files' data phase): the disk works while the caller produces the next bytes, and the
  // final fsync finds little left to do instead of the whole file dirty in the page cache
  // (issue 19: export-fp32 spent 1.8 s of system time on 341 MiB that way). Small files
  // (manifests, `latest`) never reach the threshold.
  Status Append(std::string_view data) override { return AppendThrough(data, nullptr); }
  Status AppendThrough(std::string_view data, const PieceFn& before) override {
    constexpr size_t kWriteBytes = 4u << 20;
    // A large append (an export's tensor piece) leaves past the page cache (DirectWriter: its
    // aligned middle with O_DIRECT from staging in huge pages): a 358 MB export-fp32 took
    // 0.45-0.50 s against 0.46-0.63 s through the page cache (docs/performance.md).
    if (!appending_ && direct_.Wanted(written_, data)) {
      if (written_ > writeback_from_)
        ::sync_file_range(fd_.get(), static_cast<off_t>(writeback_from_),
                          static_cast<off_t>(written_ - writeback_from_), SYNC_FILE_RANGE_WRITE);
      CKPT_RETURN_IF_ERROR(direct_.Write(written_, data, before), "");
      written_ += data.size();
      writeback_from_ = written_;
      // DirectWriter writes at offsets: the next write(2) continues where these bytes end.
      if (::lseek(fd_.get(), static_cast<off_t>(written_), SEEK_SET) < 0)
        return ErrnoError("seek " + path_, errno);
      return Status::Ok();
    }
    const char* p = data.data();
    size_t left = data.size();
    size_t handed = 0;  // bytes given to `before` so far
    while (left > 0) {
      const size_t want = std::min(left, kWriteBytes);
      for (; before && handed < data.size() - left + want; handed += kAppendPiece) {
        const size_t k = std::min(kAppendPiece, data.size() - handed);
        before(reinterpret_cast<const uint8_t*>(data.data()) + handed, k);
      }
      ssize_t n = ::write(fd_.get(), p, want);
      if (n < 0) {
        if (errno == EINTR) continue;
        return ErrnoError("write " + path_, errno);
      }
      p += n;
      left -= static_cast<size_t>(n);
      written_ += static_cast<uint64_t>(n);
      if (written_ - writeback_from_ >= kWriteBytes) {
        ::sync_file_range(fd_.get(), static_cast<off_t>(writeback_from_),
                          static_cast<off_t>(written_ - writeback_from_), SYNC_FILE_RANGE_WRITE);
        writeback_from_ = written_;  // a hint: errors surface at Sync()
      }
    }
    return Status::Ok();
  }
  Status Sync() override {
    if (::fsync(fd_.get()) != 0) return ErrnoError("fsync " + path_, errno);
    return Status::Ok();
  }
  Status Close() override { return fd_.Close(path_); }

 private:
  std::string path_;
  UniqueFd fd_;
  internal::DirectWriter direct_;
  bool appending_;
  uint64_t written_ = 0;         // the file offset after the bytes appended so far
  uint64_t writeback_from_ = 0;  // start of the bytes whose writeback is not started yet
};

Status SyncPath(const std::string& path, int flags, std::string_view what) {
  UniqueFd fd(::open(path.c_str(), flags | O_CLOEXEC));
  if (!fd.valid())
    return ErrnoError(std::string("open for ") + std::string(what) + " " + path, errno);
  if (::fsync(fd.get()) != 0) return ErrnoError(std::string(what) + " " + path, errno);
  return Status::Ok();
}

std::string ParentDir(const std::string& path) {
  const std::string d = std::filesystem::path(path).parent_path().string();
  return d.empty() ? "." : d;
}

class PosixEnv final : public Env {
 public:
  Result<std::unique_ptr<WritableFile>> NewWritableFile(const std::string& path) override {
    UniqueFd fd(::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
    if (!fd.valid()) return ErrnoError("create " + path, errno);
    return std::unique_ptr<WritableFile>(new PosixWritableFile(path, std::move(fd), false));
  }
  Result<std::unique_ptr<WritableFile>> NewAppendableFile(const std::string& path) override {
    UniqueFd fd(::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644));
    if (!fd.valid()) return ErrnoError("open for appending " + path, errno);
    return std::unique_ptr<WritableFile>(new PosixWritableFile(path, std::move(fd), true));
  }
  Status BeginExternalWrite(const std::string&) override { return Status::Ok(); }
  Status SyncFile(const std::string& path) override { return SyncPath(path, O_RDONLY, "fsync"); }
  Status SyncDir(const std::string& path) override {
    return SyncPath(path, O_RDONLY | O_DIRECTORY, "fsync directory");
  }
  Status RenameFile(const std::string& from, const std::string& to) override {
    if (::rename(from.c_str(), to.c_str()) != 0) {
      return ErrnoError("rename " + from + " -> " + to, errno);
    }
    return Status::Ok();
  }
  Status CreateDir(const std::string& path) override {
    if (::mkdir(path.c_str(), 0755) != 0) return ErrnoError("mkdir " + path, errno);
    return Status::Ok();
  }
  Status RemoveFile(const std::string& path) override {
    if (::unlink(path.c_str()) != 0) return ErrnoError("remove " + path, errno);
    return Status::Ok();
  }
  Status RemoveDirRecursive(const std::string& path) override {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
    if (ec) return IOError("remove " + path + ": " + ec.message());
    return Status::Ok();
  }
  Result<std::string> ReadFileToString(const std::string& path) override {
    UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
    if (!fd.valid()) {
      if (errno == ENOENT) return NotFound(path + ": no such file");
      return ErrnoError("open " + path, errno);
    }
    std::string out;
    char buf[1 << 16];
    for (;;) {
      ssize_t n = ::read(fd.get(), buf, sizeof buf);
      if (n < 0) {
        if (errno == EINTR) continue;
        return ErrnoError("read " + path, errno);
      }
      if (n == 0) break;
      out.append(buf, static_cast<size_t>(n));
    }
    return out;
  }
  Result<std::vector<DirEntry>> ListDir(const std::string& path) override {
    DIR* d = ::opendir(path.c_str());
    if (!d) {
      if (errno == ENOENT) return NotFound(path + ": no such directory");
      return ErrnoError("list " + path, errno);
    }
    std::vector<DirEntry> out;
    while (dirent* e = ::readdir(d)) {
      std::string name = e->d_name;
      if (name == "." || name == "..") continue;
      struct stat st;
      bool is_dir = ::stat((path + "/" + name).c_str(), &st) == 0 && S_ISDIR(st.st_mode);
      out.push_back({name, is_dir});
    }
    ::closedir(d);
    return out;
  }
  bool Exists(const std::string& path) override {
    struct stat st;
    return ::stat(path.c_str(), &st) == 0;
  }
  bool IsSymlink(const std::string& path) override {
    struct stat st;
    return ::lstat(path.c_str(), &st) == 0 && S_ISLNK(st.st_mode);
  }
  Result<uint64_t> FileSize(const std::string& path) override {
    struct stat st;
    if (::stat(path.c_str(), &st) != 0) {
      if (errno == ENOENT) return NotFound(path + ": no such file");
      return ErrnoError("stat " + path, errno);
    }
    return static_cast<uint64_t>(st.st_size);
  }

  Result<std::unique_ptr<RandomAccessFile>> NewRandomAccessFile(
      const std::string& path) override {
    UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
    if (!fd.valid()) {
      if (errno == ENOENT) return NotFound(path + ": no such file");
      return PosixError("open " + path, errno);
    }
    CKPT_ASSIGN_OR_RETURN(const uint64_t size, SizeOf(fd.get(), path));
    return std::unique_ptr<RandomAccessFile>(
        new PosixRandomAccessFile(path, std::move(fd), size));
  }
  Result<std::unique_ptr<RandomAccessFile>> NewCheckpointFile(const std::string& path) override {
    UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK));
    if (!fd.valid()) {
      if (errno == ENOENT) return NotFound(path + ": no such file");
      if (errno == ELOOP)
        return DataLoss(path + " is a symbolic link; files inside a checkpoint are never "
                               "followed through links");
      return PosixError("open " + path, errno);
    }
    struct stat st{};
    if (::fstat(fd.get(), &st) != 0) return PosixError("stat " + path, errno);
    if (!S_ISREG(st.st_mode)) return DataLoss(path + " is not a regular file");
    return std::unique_ptr<RandomAccessFile>(new PosixRandomAccessFile(
        path, std::move(fd), static_cast<uint64_t>(st.st_size)));
  }
  Result<std::unique_ptr<RandomWriteFile>> OpenRandomWriteFile(const std::string& path) override {
    UniqueFd fd(::open(path.c_str(), O_RDWR | O_CLOEXEC));
    if (!fd.valid()) return PosixError("open " + path, errno);
    return std::unique_ptr<RandomWriteFile>(new PosixRandomWriteFile(path, std::move(fd)));
  }
  Result<std::unique_ptr<FileLock>> TryLockFile(const std::string& path) override {
    UniqueFd fd(::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644));
    if (!fd.valid()) return PosixError("open lock " + path, errno);
    if (::flock(fd.get(), LOCK_EX | LOCK_NB) != 0) {
      const int err = errno;
      if (err != EWOULDBLOCK) return PosixError("lock " + path, err);
      char buf[32] = {0};
      const ssize_t n = ::pread(fd.get(), buf, sizeof buf - 1, 0);
      std::string holder = n > 0 ? std::string(buf, static_cast<size_t>(n)) : "";
      while (!holder.empty() && (holder.back() == '\n' || holder.back() == ' '))
        holder.pop_back();
      return FailedPrecondition(path + " is held by pid " + (holder.empty() ? "unknown" : holder));
    }
    const std::string pid = std::to_string(::getpid()) + "\n";
    if (::ftruncate(fd.get(), 0) == 0) {
      // The pid is a hint for the message of the next contender; the lock holds without it.
      const ssize_t w = ::pwrite(fd.get(), pid.data(), pid.size(), 0);
      (void)w;
    }
    return std::unique_ptr<FileLock>(new PosixFileLock(std::move(fd)));
  }
  Status CreateDirs(const std::string& path) override {
    struct stat st;
    if (::stat(path.c_str(), &st) == 0) {
      if (S_ISDIR(st.st_mode)) return Status::Ok();
      return AlreadyExists(path + " exists and is not a directory");
    }
    const std::string parent = ParentDir(path);
    if (parent != path && parent != "." && parent != "/") CKPT_RETURN_IF_ERROR(CreateDirs(parent));
    if (::mkdir(path.c_str(), 0755) != 0) {
      if (errno == EEXIST) return Status::Ok();  // created concurrently
      return PosixError("mkdir " + path, errno);
    }
    return SyncDir(parent);
  }
};

}  // namespace

Status RandomAccessFile::ReadLarge(uint64_t offset, uint64_t n, void* out,
                                   const PartFn& on_filled) const {
  auto* dst = static_cast<uint8_t*>(out);
  for (uint64_t done = 0; done < n;) {
    const size_t len = static_cast<size_t>(std::min<uint64_t>(n - done, kLargeReadBlock));
    CKPT_RETURN_IF_ERROR(Read(offset + done, len, dst + done), "");
    if (on_filled) CKPT_RETURN_IF_ERROR(on_filled(offset + done, dst + done, len), "");
    done += len;
  }
  return Status::Ok();
}

static_assert(WritableFile::kAppendPiece == RandomWriteFile::kWritePiece,
              "DirectWriter hands AppendThrough's pieces over in RandomWriteFile's size");

Status WritableFile::AppendThrough(std::string_view data, const PieceFn& before) {
  for (size_t done = 0; done < data.size(); done += kAppendPiece) {
    const size_t n = std::min(data.size() - done, kAppendPiece);
    if (before) before(reinterpret_cast<const uint8_t*>(data.data()) + done, n);
    CKPT_RETURN_IF_ERROR(Append(data.substr(done, n)), "");
  }
  return Status::Ok();
}

Status RandomWriteFile::WriteThrough(uint64_t offset, std::string_view data,
                                     const PieceFn& before) {
  for (size_t done = 0; done < data.size(); done += kWritePiece) {
    const size_t n = std::min(data.size() - done, kWritePiece);
    if (before) before(reinterpret_cast<const uint8_t*>(data.data()) + done, n);
    CKPT_RETURN_IF_ERROR(Write(offset + done, data.substr(done, n)), "");
    StartWriteback(offset + done, n);
  }
  return Status::Ok();
}

Status RandomAccessFile::Scan(uint64_t offset, uint64_t n, const PartFn& consume) const {
  std::vector<uint8_t> buf(static_cast<size_t>(std::min<uint64_t>(n, kLargeReadBlock)));
  for (uint64_t done = 0; done < n;) {
    const size_t len = static_cast<size_t>(std::min<uint64_t>(n - done, kLargeReadBlock));
    CKPT_RETURN_IF_ERROR(Read(offset + done, len, buf.data()), "");
    CKPT_RETURN_IF_ERROR(consume(offset + done, buf.data(), len), "");
    done += len;
  }
  return Status::Ok();
}

Status ReadCheckpointFileInto(Env* env, const std::string& path, uint64_t max_bytes,
                              std::string* out) {
  if (!env) env = Env::Default();
  out->clear();
  CKPT_ASSIGN_OR_RETURN(std::unique_ptr<RandomAccessFile> file, env->NewCheckpointFile(path));
  const uint64_t size = file->size();
  if (size > max_bytes)
    return DataLoss(path + ": " + std::to_string(size) + " bytes, more than the " +
                    std::to_string(max_bytes) + " such a file may have; not read");
  out->resize(static_cast<size_t>(size));  // within the kept capacity: no new memory
  if (size > 0) {
    Status read = file->Read(0, out->size(), out->data());
    if (!read.ok()) {
      out->clear();
      return read;
    }
  }
  return Status::Ok();
}

Result<std::string> ReadCheckpointFileToString(Env* env, const std::string& path,
                                               uint64_t max_bytes) {
  std::string text;
  CKPT_RETURN_IF_ERROR(ReadCheckpointFileInto(env, path, max_bytes, &text), "");
  return text;
}

Env* Env::Default() {
  static PosixEnv env;
  return &env;
}

Status WriteFileAtomic(Env* env, const std::string& path, std::string_view data) {
  if (env == nullptr) env = Env::Default();
  std::random_device rd;
  const std::string tmp = path + ".tmp-" + std::to_string(rd());
  const std::string dir = ParentDir(path);
  Status s = [&]() -> Status {
    CKPT_ASSIGN_OR_RETURN(auto file, env->NewWritableFile(tmp), "");
    CKPT_RETURN_IF_ERROR(file->Append(data), "");
    CKPT_RETURN_IF_ERROR(file->Sync(), "");
    CKPT_RETURN_IF_ERROR(file->Close(), "");
    CKPT_RETURN_IF_ERROR(env->RenameFile(tmp, path), "");
    return env->SyncDir(dir);
  }();
  if (!s.ok() && env->Exists(tmp)) env->RemoveFile(tmp).IgnoreError();
  return s;
}

}  // namespace ckpt
