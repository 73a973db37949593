// Helpers shared by the libFuzzer targets in this folder.
#pragma once

#include <cstdlib>
#include <filesystem>
#include <string>
#include <system_error>

namespace ckpt_fuzz {

// A fresh directory /tmp/<prefix>-XXXXXX for a harness's fixtures, removed when the process
// exits normally (libFuzzer's runs end with exit(); a crash leaves it, with the input that
// crashed). Aborts when it cannot be made. One per process: call it once, from a static.
inline std::string TempDir(const std::string& prefix) {
  static std::string made;
  if (!made.empty()) std::abort();
  std::string tmpl = "/tmp/" + prefix + "-XXXXXX";
  if (!mkdtemp(tmpl.data())) std::abort();
  made = tmpl;
  std::atexit([] {
    std::error_code ec;
    std::filesystem::remove_all(made, ec);
  });
  return made;
}

}  // namespace ckpt_fuzz
