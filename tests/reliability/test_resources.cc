// Resource limits on the CLI and engine_min (issue 20, item 4): a save past the file-size limit
// (`ulimit -f`) and a run past the memory limit (`ulimit -v`, `ulimit -d`) end with a message and
// exit 2, never a signal, and leave no staging directory behind; with no thread to be had the
// commands run on their own thread (docs/reliability.md, "Resource limits"). The limits apply to
// the child process only (a `bash -c 'ulimit ...; exec ckpt ...'` child).
#include <catch2/catch.hpp>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>

#include "ckpt_test_helpers.h"
#include "reliability_util.h"

namespace fs = std::filesystem;
using ckpt::reliability::Slurp;
using ckpt::testing::ScratchDir;

namespace {

// Exit status of `ckpt ARGS` run under the shell limit `ulimit_args`, with stdout+stderr in
// *out: a signal shows as 128+n.
int RunLimited(const std::string& ulimit_args, const std::string& args, std::string* out,
               const std::string& program = "ckpt") {
  ScratchDir tmp("ckpt-limited-out");
  const std::string log = tmp / "out.txt";
  const int rc = ckpt::testing::RunShell("bash -c 'ulimit " + ulimit_args + "; exec " +
                                         ckpt::testing::BinDir() + "/" + program + " " + args +
                                         "' >" + log + " 2>&1");
  *out = Slurp(log);
  return rc;
}

// Names in `dir` starting with ".tmp-" (0 when dir is missing).
int Staging(const std::string& dir) {
  int n = 0;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec))
    if (e.path().filename().string().rfind(".tmp-", 0) == 0) ++n;
  return n;
}

// Exit status of `ckpt ARGS` run unable to start a thread (the no_threads launcher), output in
// *out.
int RunNoThreads(const std::string& args, std::string* out) {
  ScratchDir tmp("ckpt-no-threads-out");
  const std::string log = tmp / "out.txt";
  const std::string bin = ckpt::testing::BinDir();
  const int rc =
      ckpt::testing::RunShell(bin + "/no_threads " + bin + "/ckpt " + args + " >" + log + " 2>&1");
  *out = Slurp(log);
  return rc;
}

}  // namespace

// At a thread limit (RLIMIT_NPROC, or no memory for a thread's stack) every helper thread is
// optional: reads, checks, exports and conversions run on the command's own thread and give the
// same bytes; a save whose ranks are threads that must meet (ckpt synth --ranks N) fails with
// exit 2 and a message, and leaves nothing behind; a save of one rank, and a reshard (whose new
// ranks share nothing until the commit), run on the caller's thread.
TEST_CASE("at the thread limit the commands run on their own thread or fail cleanly", "[io]") {
  ScratchDir d("ckpt-no-threads");
  std::string out;
  const std::string bin = ckpt::testing::BinDir();
  if (ckpt::testing::RunShell(bin + "/no_threads /bin/true 2>/dev/null") != 0) {
    WARN("no_threads cannot install its seccomp filter here (x86-64 Linux with seccomp needed)");
    return;
  }
  // The launcher does stop threads: ranks as threads cannot start.
  int rc = RunNoThreads("synth " + d / "multi" + " --params 1M --ranks 2", &out);
  INFO(out);
  CHECK(rc == 2);
  CHECK(out.find("over the thread limit") != std::string::npos);
  CHECK(Staging(d / "multi") == 0);
  CHECK_FALSE(fs::exists(d / "multi/latest"));
  // Checkpoints saved with threads: plain (4 ranks) and zstd-compressed (2 ranks).
  const std::string root = d / "root", zroot = d / "zroot";
  REQUIRE(RunLimited("-c 0", "synth " + root + " --params 4M --ranks 4 --zero 2", &out) == 0);
  REQUIRE(RunLimited("-c 0",
                     "synth " + zroot + " --params 4M --ranks 2 --zero 2 --compress zstd:1+shuffle",
                     &out) == 0);
  for (const std::string& args : {"check " + root, "check --deep " + root, "check --deep " + zroot,
                                  "inspect " + root, "diff " + root + " " + root}) {
    rc = RunNoThreads(args, &out);
    INFO(args << ": " << out);
    CHECK(rc == 0);
  }
  // Exports: the same bytes as with threads.
  for (const std::string& src : {root, zroot}) {
    const std::string name = fs::path(src).filename().string();
    REQUIRE(RunLimited("-c 0", "export-fp32 " + src + " " + d / (name + "_ref"), &out) == 0);
    rc = RunNoThreads("export-fp32 " + src + " " + d / (name + "_nt"), &out);
    INFO(out);
    REQUIRE(rc == 0);
    const std::string ref = Slurp(d / (name + "_ref/model.safetensors"));
    CHECK(ref.size() > (1u << 20));
    CHECK(Slurp(d / (name + "_nt/model.safetensors")) == ref);
  }
  // A save of one rank and a reshard onto two run on the command's thread.
  rc = RunNoThreads("synth " + d / "one" + " --params 1M --ranks 1", &out);
  INFO(out);
  CHECK(rc == 0);
  CHECK(RunLimited("-c 0", "check --deep " + d / "one", &out) == 0);
  rc = RunNoThreads("reshard " + root + " " + d / "rs" + " --dp 2", &out);
  INFO(out);
  CHECK(rc == 0);
  REQUIRE(RunLimited("-c 0", "reshard " + root + " " + d / "rs_ref" + " --dp 2", &out) == 0);
  rc = RunLimited("-c 0", "diff " + d / "rs" + " " + d / "rs_ref", &out);
  INFO(out);
  CHECK(rc == 0);
  CHECK(out.find("identical") != std::string::npos);
  // A damaged tensor is still found on one thread.
  const std::string victim = root + "/global_step100/" + ckpt::RankFileName(1);
  {
    std::fstream f(victim, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(static_cast<std::streamoff>(fs::file_size(victim) / 2));
    char c = 0;
    f.read(&c, 1);
    f.seekp(static_cast<std::streamoff>(fs::file_size(victim) / 2));
    c = static_cast<char>(c ^ 0x01);
    f.write(&c, 1);
  }
  rc = RunNoThreads("check --deep " + root, &out);
  INFO(out);
  CHECK(rc == 1);
  CHECK(out.find(ckpt::RankFileName(1)) != std::string::npos);
}

TEST_CASE("ckpt synth past ulimit -f: EFBIG, exit 2, nothing left behind", "[io]") {
  ScratchDir d("ckpt-ulimit-f");
  const std::string root = d / "root";
  std::string out;
  // 200 KiB: the manifest fits, the 1.2 MB rank files do not.
  const int rc = RunLimited("-f 200", "synth " + root + " --params 100k --ranks 2", &out);
  INFO(out);
  CHECK(rc == 2);  // not 153 (SIGXFSZ)
  CHECK(out.find(std::strerror(EFBIG)) != std::string::npos);
  CHECK(Staging(root) == 0);
  CHECK_FALSE(fs::exists(root + "/latest"));
}

TEST_CASE("ckpt synth and reshard past ulimit -v / -d: out of memory, exit 2, no staging",
          "[io]") {
  ScratchDir d("ckpt-ulimit-v");
  const std::string root = d / "root";
  std::string out;
  REQUIRE(RunLimited("-c 0", "synth " + root + " --params 4M --ranks 2 --zero 2", &out) == 0);
  // 1 GiB of address space: the libraries and threads fit; 400M parameters (4.8 GB of state
  // across the ranks) do not.
  int rc = RunLimited("-v 1048576", "synth " + d / "big" + " --params 400M --ranks 2 --zero 2",
                      &out);
  INFO(out);
  CHECK(rc == 2);  // not 134 (std::terminate in a rank thread)
  CHECK(out.find("out of memory") != std::string::npos);
  // The text names the limit that was met, with its size.
  CHECK(out.find("address-space limit (ulimit -v 1048576 KiB)") != std::string::npos);
  CHECK(Staging(d / "big") == 0);
  // reshard onto one rank: the new rank's 48 MB of state (built by ckpt::LoadResharded inside
  // SaveRanks' worker thread) in 32 MiB of data segment (`ulimit -d` counts the heap and
  // anonymous mappings, not the shared libraries, so the margin does not depend on which
  // libraries the binary maps).
  rc = RunLimited("-d 32768", "reshard " + root + " " + d / "out" + " --dp 1", &out);
  INFO(out);
  CHECK(rc == 2);
  CHECK(out.find("out of memory") != std::string::npos);
  CHECK(out.find("data-segment limit (ulimit -d 32768 KiB)") != std::string::npos);
  CHECK(Staging(d.str()) == 0);
  CHECK_FALSE(fs::exists(d / "out"));
}

TEST_CASE("engine_min past ulimit -d: out of memory, the job aborts with exit 2", "[io][mpi]") {
  ScratchDir d("ckpt-ulimit-d-engine");
  std::string out;
  // One rank (MPI singleton), the `small` model (25M parameters, ~0.5 GB of weights, gradients
  // and optimizer state) in 256 MiB of data segment: MPI starts, the engine's state does not fit.
  const int rc = RunLimited("-d 262144",
                            "train --model small --zero 0 --steps 1 --ckpt-dir " + d / "run",
                            &out, "engine_min");
  INFO(out);
  CHECK(rc == 2);  // not 134 (std::terminate on the uncaught std::bad_alloc)
  CHECK(out.find("ResourceExhausted: out of memory") != std::string::npos);
  CHECK(out.find("ulimit -d 262144 KiB") != std::string::npos);
  CHECK(Staging(d / "run") == 0);
}
