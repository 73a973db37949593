// Orphaned and stuck ranks (issue 20, item 9): engine_min ranks die with their launcher, and a
// rank that hangs inside a save makes the save fail after --collective-timeout instead of
// leaving the other ranks waiting forever; the previous checkpoint stays `latest`.
#include <catch2/catch.hpp>

#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <string>
#include <thread>

#include "ckpt/reader.h"
#include "ckpt/root.h"
#include "reliability_util.h"

namespace fs = std::filesystem;
using namespace ckpt;
using namespace ckpt::reliability;

namespace {

// Number of live engine_min processes whose command line names `marker`.
int LiveRanks(const std::string& marker) {
  testing::ScratchDir tmp("ckpt-ranks-pgrep");
  const std::string out = tmp / "n.txt";
  // The ranks' command lines start with the engine_min path (mpirun's and the shell's do not).
  testing::RunShell("pgrep -c -f -- '^[^ ]*engine_min train.*" + marker + "' >" + out +
                    " 2>/dev/null");
  const std::string n = Slurp(out);
  return n.empty() ? 0 : std::stoi(n);
}

}  // namespace

TEST_CASE("engine ranks die with a SIGKILLed mpirun", "[io][mpi]") {
  testing::ScratchDir dir("ckpt-orphans");
  const std::string root = dir / "orphan-run";
  // A long run in the background; its pid is mpirun's.
  const std::string pidfile = dir / "mpirun.pid";
  REQUIRE(testing::RunShell("(mpirun -n 2 " + testing::BinDir() +
                            "/engine_min train --model tiny --zero 1 --steps 100000 "
                            "--save-every 5 --ckpt-dir " + root + " >" + (dir / "log.txt") +
                            " 2>&1 & echo $! >" + pidfile + ")") == 0);
  const pid_t mpirun = static_cast<pid_t>(std::stol(Slurp(pidfile)));
  // Wait until both ranks train (the first checkpoint is committed); a loaded machine only
  // makes this take longer.
  const auto start = std::chrono::steady_clock::now();
  while (!fs::exists(root + "/latest") &&
         std::chrono::steady_clock::now() - start < std::chrono::seconds(240))
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  const int before = LiveRanks(root);
  // mpirun dies first, whatever the checks below find (no run is ever left behind).
  REQUIRE(::kill(mpirun, SIGKILL) == 0);
  INFO(Slurp(dir / "log.txt"));
  CHECK(fs::exists(root + "/latest"));
  CHECK(before == 2);
  int live = before;
  // The kernel kills them when mpirun dies; polled for up to 60 s (a loaded machine).
  const auto killed = std::chrono::steady_clock::now();
  for (int i = 0; i < 600 && live > 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    live = LiveRanks(root);
  }
  std::printf("orphans: %d of %d ranks alive %.1f s after mpirun's SIGKILL\n", live, before,
              std::chrono::duration<double>(std::chrono::steady_clock::now() - killed).count());
  CHECK(live == 0);  // before: the ranks trained on alone and committed checkpoints
  if (live > 0) testing::RunShell("pkill -KILL -f -- '^[^ ]*engine_min train.*" + root + "'");
  // What they left is a root that checks and resumes (a kill mid-save is a crash like any).
  std::string out;
  CHECK(RunCli("gc " + root, &out) == 0);
  CHECK(RunCli("check --deep " + root, &out) == 0);
}

TEST_CASE("a rank hung inside a save: the save fails after --collective-timeout", "[io][mpi]") {
  testing::ScratchDir dir("ckpt-stuck-rank");
  const std::string root = dir / "run";
  const std::string log = dir / "log.txt";
  const auto start = std::chrono::steady_clock::now();
  // Rank 1 hangs in step 4's save after writing its rank file; rank 0 waits in the gather.
  // Without the timeout the job would wait until the test's own kill (exit 137).
  const int rc = testing::RunShell(
      "timeout -s KILL 300 mpirun -n 2 " + testing::BinDir() +
      "/engine_min train --model tiny --zero 2 --steps 6 --save-every 2 --collective-timeout 3 "
      "--test-stall-in-save 1:4 --ckpt-dir " + root + " >" + log + " 2>&1");
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  INFO(Slurp(log));
  std::printf("stuck rank: the job ended after %.1f s (collective timeout 3 s), exit %d\n",
              seconds, rc);
  CHECK(rc != 0);
  CHECK(rc != 137);  // not the test's own kill
  CHECK(Slurp(log).find("timed out after 3 s") != std::string::npos);
  auto latest = ReadLatest(root);
  REQUIRE(latest.ok());
  CHECK(*latest == "global_step2");
  CHECK_FALSE(fs::exists(root + "/global_step4"));
  std::string out;
  CHECK(RunCli("gc " + root, &out) == 0);
  CHECK(RunCli("check --deep " + root, &out) == 0);
  CHECK(LiveRanks(root) == 0);
}
