// Helpers shared by the reliability suites: small checkpoints written in-process, file
// mutation, and running the CLI with a time limit.
#pragma once

#include <sys/wait.h>

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "ckpt/synth.h"
#include "test_util.h"

namespace ckpt::reliability {

using testing::Slurp;
using testing::Spit;

// Whether strace(1) is installed (tools/lib.sh installs it; the traced suites need it).
inline bool HaveStrace() { return testing::RunShell("command -v strace >/dev/null 2>&1") == 0; }

// Source tree (for tools/*.sh).
inline std::string SourceDir() { return CKPT_RELIABILITY_SOURCE_DIR; }

// Exit code of `ckpt ARGS` (stdout+stderr into *output when given), or -1 when it crashed or
// ran past `seconds` (timeout(1) exits 124, a signal shows as 128+n).
inline int RunCli(const std::string& args, std::string* output = nullptr, int seconds = 60) {
  testing::ScratchDir tmp("ckpt-cli-out");
  const std::string out = tmp / "out.txt";
  // Under ASan (tools/test.sh sets detect_leaks=1) LeakSanitizer would turn the CLI's exit
  // code into 23 at exit; these tests judge exit codes, so leak checking is left to the
  // in-process suites.
  const std::string cmd = "ASAN_OPTIONS=\"${ASAN_OPTIONS:-}:detect_leaks=0\" timeout -s KILL " +
                          std::to_string(seconds) + " " + testing::CkptCommand(args) + " >" + out +
                          " 2>&1";
  int rc = testing::RunShell(cmd);
  if (output) *output = Slurp(out);
  if (rc >= 124) return -1;
  return rc;
}

// A synthetic checkpoint root with `tags` tags (global_step100, 200, ...).
inline std::vector<std::string> WriteSmallRoot(const std::string& root, int ranks, int zero,
                                               const char* compression, int tags = 2,
                                               int64_t params = 3000) {
  SynthOptions o;
  o.ranks = ranks;
  o.params = params;
  o.zero_stage = zero;
  o.tags = tags;
  o.chunk_bytes = 2048;  // many chunks per tensor, so flips land in distinct chunks
  o.piece_bytes = 1024;  // many checksummed pieces per tensor (format 1.3)
  o.compression = Compression::Parse(compression).value();
  auto written = WriteSynthetic(root, o);
  if (!written.ok()) throw std::runtime_error(written.status().ToString());
  return *written;
}

// Copies a directory tree (restoring a pristine fixture between cases).
inline void CopyTree(const std::string& from, const std::string& to) {
  std::filesystem::remove_all(to);
  std::filesystem::copy(from, to, std::filesystem::copy_options::recursive);
}

}  // namespace ckpt::reliability
