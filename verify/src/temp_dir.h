// The verify library's one scratch-directory helper: a fresh directory under $TMPDIR
// (mkdtemp), or one the user named, removed with its contents through ckpt::Env when the
// object dies unless kept.
#pragma once

#include <stdlib.h>

#include <cerrno>
#include <filesystem>
#include <string>

#include "ckpt/env.h"
#include "ckpt/status.h"

namespace ckpt::verify {

class TempDir {
 public:
  // $TMPDIR/<label>-XXXXXX; removed on destruction unless `keep`.
  static Result<TempDir> Create(const std::string& label, bool keep = false) {
    std::string tmpl = (std::filesystem::temp_directory_path() / (label + "-XXXXXX")).string();
    if (mkdtemp(tmpl.data()) == nullptr) return ErrnoError("mkdtemp " + tmpl, errno);
    return TempDir(tmpl, keep);
  }
  // `path` (created with its parents when missing), never removed.
  static Result<TempDir> At(const std::string& path) {
    CKPT_RETURN_IF_ERROR(Env::Default()->CreateDirs(path));
    return TempDir(path, /*keep=*/true);
  }
  TempDir(TempDir&& o) noexcept : path_(std::move(o.path_)), keep_(o.keep_) { o.path_.clear(); }
  TempDir& operator=(TempDir&&) = delete;
  ~TempDir() {
    if (!keep_ && !path_.empty()) Env::Default()->RemoveDirRecursive(path_).IgnoreError();
  }
  const std::string& path() const { return path_; }

 private:
  TempDir(std::string path, bool keep) : path_(std::move(path)), keep_(keep) {}
  std::string path_;
  bool keep_ = false;
};

}  // namespace ckpt::verify
