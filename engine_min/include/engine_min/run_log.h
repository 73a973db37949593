// The run log (trainlog.jsonl, docs/engine.md): rank 0 appends one JSON line per step, each
// handed to the kernel before the next step. Every file-system call goes through ckpt::Env, so
// a fault-injecting Env reaches it.
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include "ckpt/env.h"
#include "ckpt/status.h"

namespace engine_min {

class RunLog {
 public:
  // Opens `path` for appending (created when missing). Errors name the file. env nullptr:
  // ckpt::Env::Default().
  static ckpt::Result<RunLog> Open(const std::string& path, ckpt::Env* env = nullptr);
  RunLog(RunLog&&) noexcept = default;
  RunLog& operator=(RunLog&&) noexcept = default;

  // Writes `line` and a newline. Errors name the file.
  ckpt::Status Append(std::string_view line);
  const std::string& path() const { return path_; }

 private:
  RunLog(std::string path, std::unique_ptr<ckpt::WritableFile> file)
      : path_(std::move(path)), file_(std::move(file)) {}
  std::string path_;
  std::unique_ptr<ckpt::WritableFile> file_;
};

}  // namespace engine_min
