// UniqueFd: the one owner of a POSIX file descriptor (tensorstore's unique_handle). Move-only;
// the destructor closes quietly, Close() reports a failed close (some file systems report
// write errors only there) with the path it names.
#pragma once

#include <string_view>
#include <utility>

#include "ckpt/status.h"

namespace ckpt {

class UniqueFd {
 public:
  UniqueFd() = default;
  explicit UniqueFd(int fd) : fd_(fd) {}
  UniqueFd(UniqueFd&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}
  UniqueFd& operator=(UniqueFd&& o) noexcept {
    if (this != &o) reset(std::exchange(o.fd_, -1));
    return *this;
  }
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;
  ~UniqueFd() { reset(); }

  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  // Gives up ownership without closing.
  int release() { return std::exchange(fd_, -1); }
  // Closes the descriptor held (quietly) and takes fd.
  void reset(int fd = -1);
  // Closes now; a failure is PosixError("close <path>"). No-op when nothing is held.
  Status Close(std::string_view path);

 private:
  int fd_ = -1;
};

}  // namespace ckpt
