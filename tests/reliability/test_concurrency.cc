// Concurrency on one root, with real processes: two savers, a reader during saves, gc during
// saves (library and CLI). Each operation either works or fails with a clear error (the lock
// holder named); nothing committed is ever damaged.
#include <catch2/catch.hpp>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <thread>

#include "ckpt/reader.h"
#include "ckpt/root.h"
#include "ckpt_test_helpers.h"
#include "reliability_util.h"

using namespace ckpt;
using ckpt::reliability::RunCli;
using ckpt::reliability::Slurp;
using ckpt::testing::SaveWithThreads;
using ckpt::testing::ScratchDir;
using Clock = std::chrono::steady_clock;

namespace {

struct SaverReport {
  int ok = 0;
  int locked = 0;  // refused because another saver or gc held the lock
};

// Child process: saves tags global_step<first + k * stride> for `seconds`, writes
// "ok locked" to report_path; exits 3 (message in the report) on any other error.
[[noreturn]] void SaverLoop(const std::string& root, int first, int stride, double seconds,
                            const std::string& report_path) {
  SaverReport rep;
  SaveOptions o;
  o.keep_last = 4;
  const auto end = Clock::now() + std::chrono::duration<double>(seconds);
  for (int step = first; Clock::now() < end; step += stride) {
    Manifest m = ckpt::testing::SmallModel("global_step" + std::to_string(step), 2, 1 + step % 3);
    m.counters.global_step = step;
    Status s = SaveWithThreads(root, m, o, step);
    if (s.ok()) {
      ++rep.ok;
    } else if (s.code() == StatusCode::kFailedPrecondition &&
               s.message().find(".lock") != std::string::npos) {
      ++rep.locked;
    } else {
      std::ofstream(report_path) << "error " << s.ToString();
      _exit(3);
    }
    // A gap between saves, as training has between checkpoints: gc and the other saver get
    // their chance at the lock even when a save takes long (sanitizers, a loaded machine).
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  std::ofstream(report_path) << rep.ok << " " << rep.locked;
  _exit(0);
}

pid_t StartSaver(const std::string& root, int first, int stride, double seconds,
                 const std::string& report) {
  pid_t pid = fork();
  if (pid == 0) SaverLoop(root, first, stride, seconds, report);
  return pid;
}

SaverReport JoinSaver(pid_t pid, const std::string& report) {
  int status = 0;
  waitpid(pid, &status, 0);
  INFO("saver report: " << Slurp(report));
  REQUIRE(WIFEXITED(status));
  REQUIRE(WEXITSTATUS(status) == 0);
  SaverReport rep;
  std::ifstream(report) >> rep.ok >> rep.locked;
  return rep;
}

// Every committed tag passes the deep check and `latest` names one of them.
int ExpectRootHealthy(const std::string& root) {
  auto listing = ListRoot(root);
  REQUIRE(listing.ok());
  REQUIRE_FALSE(listing->latest.empty());
  bool latest_found = false;
  for (const auto& t : listing->tags) {
    INFO(t.tag << " " << t.error);
    CHECK(t.error.empty());
    auto problems = CheckCheckpoint(t.path, true);
    REQUIRE(problems.ok());
    for (const auto& p : *problems) FAIL(t.tag << ": " << p.file << " " << p.dataset << " " << p.what);
    latest_found |= t.tag == listing->latest;
  }
  CHECK(latest_found);
  return static_cast<int>(listing->tags.size());
}

}  // namespace

TEST_CASE("two savers on one root: each save commits or is refused at the lock", "[io]") {
  ScratchDir d("ckpt-two-savers");
  const std::string root = d / "root";
  pid_t a = StartSaver(root, 1, 2, 3.0, d / "a.txt");
  pid_t b = StartSaver(root, 2, 2, 3.0, d / "b.txt");
  SaverReport ra = JoinSaver(a, d / "a.txt");
  SaverReport rb = JoinSaver(b, d / "b.txt");
  const int tags = ExpectRootHealthy(root);
  std::printf("two savers, 3 s: %d + %d commits, %d + %d refused at the lock, %d tags kept\n",
              ra.ok, rb.ok, ra.locked, rb.locked, tags);
  CHECK(ra.ok + rb.ok > 0);  // progress (the counts depend on the machine's load)
  CHECK(ra.locked + rb.locked > 0);  // they did contend
}

TEST_CASE("a reader during saves always finds a complete latest checkpoint", "[io]") {
  ScratchDir d("ckpt-reader");
  const std::string root = d / "root";
  REQUIRE(SaveWithThreads(root, ckpt::testing::SmallModel("global_step0", 2, 2), {}, 0).ok());
  pid_t saver = StartSaver(root, 1, 1, 3.0, d / "s.txt");
  int reads = 0, retired = 0;
  const auto end = Clock::now() + std::chrono::seconds(3);
  while (Clock::now() < end) {
    auto dir = ResolveTagDir(root);
    if (!dir.ok()) {
      // Only acceptable when `latest` moved on and retention retired what we had read.
      auto again = ResolveTagDir(root);
      INFO(dir.status().ToString());
      REQUIRE(again.ok());
      ++retired;
      continue;
    }
    auto problems = CheckCheckpoint(*dir, true);
    auto r = CheckpointReader::Open(*dir);
    Status load = r.ok() ? r->ReadDatasetBytes(0, "master").status() : r.status();
    const bool healthy = problems.ok() && problems->empty() && load.ok();
    if (!healthy && !std::filesystem::exists(*dir)) {
      // Retention (keep_last 4) deleted the tag while we read it: an error value, not damage.
      ++retired;
      continue;
    }
    INFO(*dir << ": " << (problems.ok() ? std::to_string(problems->size()) + " problem(s)"
                                        : problems.status().ToString())
              << ", load " << load.ToString());
    REQUIRE(healthy);
    ++reads;
  }
  SaverReport rep = JoinSaver(saver, d / "s.txt");
  ExpectRootHealthy(root);
  std::printf("reader during saves, 3 s: %d deep reads of latest ok, %d hit a tag retired by "
              "retention, %d commits\n", reads, retired, rep.ok);
  CHECK(reads > 0);
  CHECK(rep.ok > 0);
}

TEST_CASE("gc during saves removes nothing a saver needs", "[io]") {
  ScratchDir d("ckpt-gc-during");
  const std::string root = d / "root";
  pid_t saver = StartSaver(root, 1, 1, 3.0, d / "s.txt");
  int gc_ok = 0, gc_locked = 0, cli_ok = 0, cli_locked = 0, removed_tags = 0;
  const auto end = Clock::now() + std::chrono::seconds(3);
  for (int i = 0; Clock::now() < end; ++i) {
    if (i % 10 == 9) {
      std::string out;
      const int rc = RunCli("gc --keep-last 2 " + root, &out);
      INFO("ckpt gc: exit " << rc << ": " << out);
      REQUIRE((rc == 0 || rc == 2));
      if (rc == 0) ++cli_ok;
      else {
        CHECK(out.find(".lock") != std::string::npos);
        ++cli_locked;
      }
      continue;
    }
    if (!std::filesystem::exists(root)) continue;
    auto gc = CollectGarbage(root, 2);
    if (gc.ok()) {
      ++gc_ok;
      removed_tags += static_cast<int>(gc->removed_tags.size());
    } else {
      INFO(gc.status().ToString());
      REQUIRE(gc.status().code() == StatusCode::kFailedPrecondition);
      CHECK(gc.status().message().find(".lock") != std::string::npos);
      ++gc_locked;
    }
  }
  SaverReport rep = JoinSaver(saver, d / "s.txt");
  ExpectRootHealthy(root);
  REQUIRE(CollectGarbage(root, 0).ok());
  CHECK(ListRoot(root)->temporary.empty());
  std::printf("gc during saves, 3 s: gc ran %d times (%d refused at the lock), ckpt gc %d (%d "
              "refused), %d tags retired; saver %d commits, %d refused at the lock\n",
              gc_ok, gc_locked, cli_ok, cli_locked, removed_tags, rep.ok, rep.locked);
  CHECK(rep.ok > 0);
  CHECK(gc_ok + cli_ok > 0);
}
