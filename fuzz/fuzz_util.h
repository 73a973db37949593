// Helpers shared by the libFuzzer targets in this folder.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

#include "ckpt/status.h"

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

// The whole file at `path` (empty when it cannot be read).
inline std::vector<uint8_t> ReadFile(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::vector<uint8_t>((std::istreambuf_iterator<char>(in)),
                              std::istreambuf_iterator<char>());
}

// Replaces the file at `path` with data[0, size): a harness's input put where the code under
// test reads it. Aborts when the write fails (the run would fuzz stale bytes).
inline void WriteFile(const std::string& path, const void* data, size_t size) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(static_cast<const char*>(data), static_cast<std::streamsize>(size));
  out.close();
  if (!out) std::abort();
}

// Whether `text` (a message or a report a command prints) shows on a terminal as text: every
// line printable UTF-8 (ckpt::PrintableUtf8: no C0 control but the newlines between lines, no
// DEL, no C1, no invalid UTF-8). Whatever an input holds reaches messages escaped (Excerpt) or
// not at all; the harnesses' own paths are plain ASCII.
inline bool TerminalSafe(std::string_view text) {
  for (size_t start = 0;;) {
    const size_t nl = text.find('\n', start);
    if (!ckpt::PrintableUtf8(text.substr(start, nl == std::string_view::npos ? nl : nl - start)))
      return false;
    if (nl == std::string_view::npos) return true;
    start = nl + 1;
  }
}

// Traps when an error's message would print something of the input raw.
inline void RequireTerminalSafe(const ckpt::Status& s) {
  if (!s.ok() && !TerminalSafe(s.message())) __builtin_trap();
}

}  // namespace ckpt_fuzz
