// A shared library opened at run time (dlopen) rather than linked: for dependencies that only
// some commands use and that every process would otherwise load and relocate at start (libzip
// with libcrypto for reading .pt files, libnccl for next-update --gpus; issue 19: each cost a
// `ckpt` command about 4 ms at start on the development VM).
#pragma once

#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "ckpt/status.h"

namespace ckpt {

// Opened once and never closed (dlclose while function pointers are held would unmap them).
class SharedLibrary {
 public:
  // The first of `candidates` (SONAMEs for the loader's search, or paths) that loads, with
  // RTLD_NOW | RTLD_LOCAL. FailedPrecondition naming `what`, every candidate and the loader's
  // reason when none does.
  static Result<SharedLibrary> Open(const std::vector<std::string>& candidates,
                                    std::string_view what);

  // *fn = the function `name`; FailedPrecondition naming the library and the symbol when the
  // library lacks it.
  template <typename Fn>
  Status Find(const char* name, Fn** fn) const {
    *fn = reinterpret_cast<Fn*>(Symbol(name));
    if (*fn) return Status::Ok();
    return FailedPrecondition(what_ + " (" + path_ + ") lacks " + name);
  }

  const std::string& path() const { return path_; }  // the candidate that loaded

 private:
  SharedLibrary(void* handle, std::string path, std::string what)
      : handle_(handle), path_(std::move(path)), what_(std::move(what)) {}
  void* Symbol(const char* name) const;
  void* handle_ = nullptr;
  std::string path_, what_;
};

}  // namespace ckpt
