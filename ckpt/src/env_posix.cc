// PosixEnv: the real file system. Every call maps errno to an IOError naming the step and path.
#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>
#include <random>

#include "ckpt/env.h"

namespace ckpt {

namespace {

class PosixWritableFile final : public WritableFile {
 public:
  PosixWritableFile(std::string path, int fd) : path_(std::move(path)), fd_(fd) {}
  ~PosixWritableFile() override { Close().IgnoreError(); }

  Status Append(std::string_view data) override {
    const char* p = data.data();
    size_t left = data.size();
    while (left > 0) {
      ssize_t n = ::write(fd_, p, left);
      if (n < 0) {
        if (errno == EINTR) continue;
        return ErrnoError("write " + path_, errno);
      }
      p += n;
      left -= static_cast<size_t>(n);
    }
    return Status::Ok();
  }
  Status Sync() override {
    if (::fsync(fd_) != 0) return ErrnoError("fsync " + path_, errno);
    return Status::Ok();
  }
  Status Close() override {
    if (fd_ < 0) return Status::Ok();
    int rc = ::close(fd_);
    fd_ = -1;
    if (rc != 0) return ErrnoError("close " + path_, errno);
    return Status::Ok();
  }

 private:
  std::string path_;
  int fd_;
};

Status SyncPath(const std::string& path, int flags, std::string_view what) {
  int fd = ::open(path.c_str(), flags | O_CLOEXEC);
  if (fd < 0) return ErrnoError(std::string("open for ") + std::string(what) + " " + path, errno);
  int rc = ::fsync(fd);
  int err = errno;
  ::close(fd);
  if (rc != 0) return ErrnoError(std::string(what) + " " + path, err);
  return Status::Ok();
}

class PosixEnv final : public Env {
 public:
  Result<std::unique_ptr<WritableFile>> NewWritableFile(const std::string& path) override {
    int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) return ErrnoError("create " + path, errno);
    return std::unique_ptr<WritableFile>(new PosixWritableFile(path, fd));
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
    int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
      if (errno == ENOENT) return NotFound(path + ": no such file");
      return ErrnoError("open " + path, errno);
    }
    std::string out;
    char buf[1 << 16];
    for (;;) {
      ssize_t n = ::read(fd, buf, sizeof buf);
      if (n < 0) {
        if (errno == EINTR) continue;
        int err = errno;
        ::close(fd);
        return ErrnoError("read " + path, err);
      }
      if (n == 0) break;
      out.append(buf, static_cast<size_t>(n));
    }
    ::close(fd);
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
  Result<uint64_t> FileSize(const std::string& path) override {
    struct stat st;
    if (::stat(path.c_str(), &st) != 0) {
      if (errno == ENOENT) return NotFound(path + ": no such file");
      return ErrnoError("stat " + path, errno);
    }
    return static_cast<uint64_t>(st.st_size);
  }
};

}  // namespace

Env* Env::Default() {
  static PosixEnv env;
  return &env;
}

Status WriteFileAtomic(Env* env, const std::string& path, std::string_view data) {
  if (env == nullptr) env = Env::Default();
  std::random_device rd;
  const std::string tmp = path + ".tmp-" + std::to_string(rd());
  const std::string dir = std::filesystem::path(path).parent_path().string();
  Status s = [&]() -> Status {
    CKPT_ASSIGN_OR_RETURN(auto file, env->NewWritableFile(tmp), "");
    CKPT_RETURN_IF_ERROR(file->Append(data), "");
    CKPT_RETURN_IF_ERROR(file->Sync(), "");
    CKPT_RETURN_IF_ERROR(file->Close(), "");
    CKPT_RETURN_IF_ERROR(env->RenameFile(tmp, path), "");
    return env->SyncDir(dir.empty() ? "." : dir);
  }();
  if (!s.ok() && env->Exists(tmp)) env->RemoveFile(tmp).IgnoreError();
  return s;
}

}  // namespace ckpt
