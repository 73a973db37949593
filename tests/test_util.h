// Helpers shared by the test suites: scratch directories and running the built binaries.
#pragma once

#include <cstdlib>
#include <filesystem>
#include <random>
#include <string>
#include <sys/wait.h>

namespace ckpt::testing {

// A fresh directory under $TMPDIR, removed when the object dies.
class ScratchDir {
 public:
  explicit ScratchDir(const std::string& label = "ckpt-test") {
    std::random_device rd;
    auto base = std::filesystem::temp_directory_path();
    path_ = base / (label + "-" + std::to_string(rd()) + std::to_string(rd()));
    std::filesystem::create_directories(path_);
  }
  ~ScratchDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;
  const std::filesystem::path& path() const { return path_; }
  std::string str() const { return path_.string(); }
  std::string operator/(const std::string& child) const { return (path_ / child).string(); }

 private:
  std::filesystem::path path_;
};

// Directory of the built binaries (build/bin).
inline std::string BinDir() {
  if (const char* d = std::getenv("CKPT_BIN_DIR")) return d;
  return std::string(CKPT_BINARY_DIR) + "/bin";
}

// Runs a shell command, returns its exit code (or -1 when it did not exit normally).
inline int RunShell(const std::string& cmd) {
  int rc = std::system(cmd.c_str());
  if (rc == -1 || !WIFEXITED(rc)) return -1;
  return WEXITSTATUS(rc);
}

}  // namespace ckpt::testing
