// Helpers shared by the test suites (leveldb's util/testutil.h): scratch directories, reading
// and writing whole files, running the built binaries. Each helper has this one copy.
#pragma once

#include <fcntl.h>
#include <spawn.h>
#include <sys/resource.h>
#include <sys/wait.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <utility>
#include <vector>

extern char** environ;

namespace ckpt::testing {

// Whether this process has a library whose path contains `name` mapped (/proc/self/maps).
inline bool Mapped(const std::string& name) {
  std::ifstream maps("/proc/self/maps");
  std::string line;
  while (std::getline(maps, line))
    if (line.find(name) != std::string::npos) return true;
  return false;
}

// The kernel's transparent huge page mode: "always", "madvise", "never", or "" when it has none
// (/sys/kernel/mm/transparent_hugepage/enabled names the mode in force in brackets).
inline std::string HugePageMode() {
  std::ifstream f("/sys/kernel/mm/transparent_hugepage/enabled");
  std::string line;
  std::getline(f, line);
  const auto lo = line.find('['), hi = line.find(']');
  return lo != std::string::npos && hi > lo ? line.substr(lo + 1, hi - lo - 1) : "";
}

// Whether the mapping that holds address `p` may get transparent huge pages (the THPeligible
// line of its /proc/self/smaps entry): 1 or 0, or -1 when no entry holds `p` or it has no such
// line.
inline int HugePageEligible(const void* p) {
  std::ifstream smaps("/proc/self/smaps");
  std::string line;
  bool inside = false;
  const auto at = reinterpret_cast<uintptr_t>(p);
  while (std::getline(smaps, line)) {
    unsigned long lo = 0, hi = 0;
    if (std::sscanf(line.c_str(), "%lx-%lx ", &lo, &hi) == 2 && line.find(':') > 8) {
      inside = lo <= at && at < hi;
      continue;
    }
    if (inside && line.rfind("THPeligible:", 0) == 0)
      return line.find('1') != std::string::npos ? 1 : 0;
  }
  return -1;
}

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

// The whole file as bytes; "" when it cannot be read.
inline std::string Slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// Replaces the file's contents with `data`.
inline void Spit(const std::string& path, const std::string& data) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(data.data(), static_cast<std::streamsize>(data.size()));
}

// Corrupts stored bytes found by content (e.g. 32 bytes of a dataset, read through a reader):
// XORs `mask` into the byte `flip` past the first occurrence of `needle` in the file. Returns
// how often `needle` occurs in the file (0: nothing changed), or 0 when the file does not read
// back as written.
inline size_t FlipByteAfter(const std::string& path, const std::string& needle, size_t flip,
                            uint8_t mask) {
  std::string content = Slurp(path);
  const size_t at = content.find(needle);
  if (at == std::string::npos || at + flip >= content.size()) return 0;
  size_t count = 0;
  for (size_t i = at; i != std::string::npos; i = content.find(needle, i + 1)) ++count;
  content[at + flip] = static_cast<char>(content[at + flip] ^ static_cast<char>(mask));
  Spit(path, content);
  return Slurp(path) == content ? count : 0;
}

// XORs `mask` into the byte at `offset` of the file, in place; false when that failed.
inline bool XorByteAt(const std::string& path, uint64_t offset, uint8_t mask) {
  std::fstream io(path, std::ios::binary | std::ios::in | std::ios::out);
  io.seekg(static_cast<std::streamoff>(offset));
  char c = 0;
  io.read(&c, 1);
  c = static_cast<char>(c ^ static_cast<char>(mask));
  io.seekp(static_cast<std::streamoff>(offset));
  io.write(&c, 1);
  return io.good();
}

// Directory of the built binaries (build/bin).
inline std::string BinDir() {
  if (const char* d = std::getenv("CKPT_BIN_DIR")) return d;
  return std::string(CKPT_BINARY_DIR) + "/bin";
}

// Whether build/bin holds `name` (engine_min, ckpt, ...).
inline bool HaveBinary(const std::string& name) {
  return std::filesystem::exists(BinDir() + "/" + name);
}

// The shell command that runs the built `ckpt` with `args` (shell syntax), for callers that
// pipe or redirect it themselves.
inline std::string CkptCommand(const std::string& args) { return BinDir() + "/ckpt " + args; }

// The seed of a randomized test: CKPT_TEST_SEED when set (to replay a failure, whose messages
// name its seed), else a fresh one.
inline uint64_t TestSeed() {
  if (const char* s = std::getenv("CKPT_TEST_SEED")) return std::strtoull(s, nullptr, 10);
  std::random_device rd;
  return (static_cast<uint64_t>(rd()) << 32) | rd();
}

// Runs a shell command, returns its exit code (or -1 when it did not exit normally).
inline int RunShell(const std::string& cmd) {
  int rc = std::system(cmd.c_str());
  if (rc == -1 || !WIFEXITED(rc)) return -1;
  return WEXITSTATUS(rc);
}

struct CliResult {
  int rc = -1;      // exit code, -1 when the command did not exit normally
  std::string out;  // stdout
  std::string err;  // stderr
};

// Runs a shell command with stdout and stderr captured.
inline CliResult RunCaptured(const std::string& cmd) {
  ScratchDir tmp("ckpt-test-run");
  const std::string out = tmp / "out", err = tmp / "err";
  CliResult r;
  r.rc = RunShell("(" + cmd + ") > " + out + " 2> " + err);
  r.out = Slurp(out);
  r.err = Slurp(err);
  return r;
}

// Runs the built `ckpt` with `args` (shell syntax), stdout and stderr captured.
inline CliResult RunCkpt(const std::string& args) { return RunCaptured(CkptCommand(args)); }

// Runs argv as a child (stdout to `stdout_path`, stderr to /dev/null) and returns its exit
// code and peak resident set size in bytes (wait4's ru_maxrss, KiB on Linux). On Linux a
// spawned child's ru_maxrss starts from the parent's high-water mark (exec keeps the old mm's
// peak), so the calling process must stay small: write large fixtures from a child too.
inline std::pair<int, uint64_t> RunMeasured(std::vector<std::string> args,
                                            const std::string& stdout_path = "/dev/null") {
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 1, stdout_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC,
                                   0644);
  posix_spawn_file_actions_addopen(&fa, 2, "/dev/null", O_WRONLY, 0);
  pid_t pid = 0;
  const int rc = posix_spawn(&pid, argv[0], &fa, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  if (rc != 0) return {-1, 0};
  int status = 0;
  struct rusage ru {};
  if (wait4(pid, &status, 0, &ru) != pid) return {-1, 0};
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, static_cast<uint64_t>(ru.ru_maxrss) * 1024};
}

// Sets CKPT_DIRECT_IO for the scope of one test section, restoring the previous value.
class DirectIoMode {
 public:
  explicit DirectIoMode(const char* mode) {
    const char* old = std::getenv("CKPT_DIRECT_IO");
    if (old) old_ = old;
    had_ = old != nullptr;
    setenv("CKPT_DIRECT_IO", mode, 1);
  }
  ~DirectIoMode() {
    if (had_)
      setenv("CKPT_DIRECT_IO", old_.c_str(), 1);
    else
      unsetenv("CKPT_DIRECT_IO");
  }
  DirectIoMode(const DirectIoMode&) = delete;
  DirectIoMode& operator=(const DirectIoMode&) = delete;

 private:
  std::string old_;
  bool had_ = false;
};

}  // namespace ckpt::testing
