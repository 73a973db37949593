// Concurrency on one root, with real processes: two savers, a reader during saves, gc during
// saves (library and CLI). Each operation either works or fails with a clear error (the lock
// holder named); nothing committed is ever damaged.
#include <catch2/catch.hpp>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
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

// Child process: saves tags global_step<first + k * stride> until `stop_path` exists (or 300 s
// pass), rewriting "ok locked" to report_path (atomically) after every attempt; exits 3 (message
// in the report) on any other error. Each save waits up to lock_wait seconds for the root lock
// (0: refused at once). The tests stop it once they have seen what they test, so a slow machine
// (sanitizers, load) gives a longer run, not a test that never reached its target.
[[noreturn]] void SaverLoop(const std::string& root, int first, int stride,
                            const std::string& stop_path, const std::string& report_path,
                            double lock_wait) {
  SaverReport rep;
  SaveOptions o;
  o.keep_last = 4;
  o.lock_wait_seconds = lock_wait;
  o.on_lock_wait = [](const std::string&) {};
  const auto cap = Clock::now() + std::chrono::seconds(300);
  auto report = [&](const std::string& text) {
    { std::ofstream(report_path + ".tmp") << text; }
    std::filesystem::rename(report_path + ".tmp", report_path);
  };
  for (int step = first; !std::filesystem::exists(stop_path) && Clock::now() < cap;
       step += stride) {
    Manifest m = ckpt::testing::SmallModel("global_step" + std::to_string(step), 2, 1 + step % 3);
    m.counters.global_step = step;
    Status s = SaveWithThreads(root, m, o, step);
    if (s.ok()) {
      ++rep.ok;
    } else if (s.code() == StatusCode::kFailedPrecondition &&
               s.message().find(".lock") != std::string::npos) {
      ++rep.locked;
    } else {
      report("error " + s.ToString());
      _exit(3);
    }
    report(std::to_string(rep.ok) + " " + std::to_string(rep.locked));
    // A gap between saves, as training has between checkpoints: gc and the other saver get
    // their chance at the lock even when a save takes long (sanitizers, a loaded machine).
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  report(std::to_string(rep.ok) + " " + std::to_string(rep.locked));
  _exit(0);
}

struct Saver {
  pid_t pid;
  std::string stop;
  std::string report;
};

Saver StartSaver(const std::string& root, int first, int stride, const std::string& dir,
                 const std::string& name, double lock_wait = 0) {
  Saver s{0, dir + "/" + name + ".stop", dir + "/" + name + ".txt"};
  s.pid = fork();
  if (s.pid == 0) SaverLoop(root, first, stride, s.stop, s.report, lock_wait);
  return s;
}

// The saver's counts so far (zero before its first report).
SaverReport PeekSaver(const Saver& s) {
  SaverReport rep;
  std::ifstream(s.report) >> rep.ok >> rep.locked;
  return rep;
}

SaverReport JoinSaver(const Saver& s) {
  { std::ofstream(s.stop) << "stop"; }
  int status = 0;
  waitpid(s.pid, &status, 0);
  INFO("saver report: " << Slurp(s.report));
  REQUIRE(WIFEXITED(status));
  REQUIRE(WEXITSTATUS(status) == 0);
  return PeekSaver(s);
}

// Runs `step` for at least 3 s and then until `reached()` says the test saw what it tests,
// for at most 240 s; returns the seconds it ran.
template <class Step, class Reached>
double RunAtLeast3s(Step step, Reached reached) {
  const auto start = Clock::now();
  const auto min_end = start + std::chrono::seconds(3);
  const auto cap = start + std::chrono::seconds(240);
  while (Clock::now() < cap && (Clock::now() < min_end || !reached())) step();
  return std::chrono::duration<double>(Clock::now() - start).count();
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
  Saver a = StartSaver(root, 1, 2, d.str(), "a");
  Saver b = StartSaver(root, 2, 2, d.str(), "b");
  const double seconds = RunAtLeast3s(
      [] { std::this_thread::sleep_for(std::chrono::milliseconds(50)); },
      [&] {
        SaverReport pa = PeekSaver(a), pb = PeekSaver(b);
        return pa.ok + pb.ok > 0 && pa.locked + pb.locked > 0;
      });
  SaverReport ra = JoinSaver(a);
  SaverReport rb = JoinSaver(b);
  const int tags = ExpectRootHealthy(root);
  std::printf("two savers, %.1f s: %d + %d commits, %d + %d refused at the lock, %d tags kept\n",
              seconds, ra.ok, rb.ok, ra.locked, rb.locked, tags);
  CHECK(ra.ok + rb.ok > 0);  // progress (the counts depend on the machine's load)
  CHECK(ra.locked + rb.locked > 0);  // they did contend
}

TEST_CASE("a reader during saves always finds a complete latest checkpoint", "[io]") {
  ScratchDir d("ckpt-reader");
  const std::string root = d / "root";
  REQUIRE(SaveWithThreads(root, ckpt::testing::SmallModel("global_step0", 2, 2), {}, 0).ok());
  Saver saver = StartSaver(root, 1, 1, d.str(), "s");
  int reads = 0, retired = 0;
  const double seconds = RunAtLeast3s(
      [&] {
        auto dir = ResolveTagDir(root);
        if (!dir.ok()) {
          // Only acceptable when `latest` moved on and retention retired what we had read.
          auto again = ResolveTagDir(root);
          INFO(dir.status().ToString());
          REQUIRE(again.ok());
          ++retired;
          return;
        }
        auto problems = CheckCheckpoint(*dir, true);
        auto r = CheckpointReader::Open(*dir);
        Status load = r.ok() ? r->ReadDatasetBytes(0, "master").status() : r.status();
        const bool healthy = problems.ok() && problems->empty() && load.ok();
        if (!healthy && !std::filesystem::exists(*dir)) {
          // Retention (keep_last 4) deleted the tag while we read it: an error value, not damage.
          ++retired;
          return;
        }
        INFO(*dir << ": " << (problems.ok() ? std::to_string(problems->size()) + " problem(s)"
                                            : problems.status().ToString())
                  << ", load " << load.ToString());
        REQUIRE(healthy);
        ++reads;
      },
      [&] { return reads > 0 && PeekSaver(saver).ok > 1; });
  SaverReport rep = JoinSaver(saver);
  ExpectRootHealthy(root);
  std::printf("reader during saves, %.1f s: %d deep reads of latest ok, %d hit a tag retired by "
              "retention, %d commits\n", seconds, reads, retired, rep.ok);
  CHECK(reads > 0);
  CHECK(rep.ok > 0);
}

TEST_CASE("gc during saves removes nothing a saver needs, and never fails a save", "[io]") {
  ScratchDir d("ckpt-gc-during");
  const std::string root = d / "root";
  // The saver waits for the lock as savers do by default (SaveOptions::lock_wait_seconds).
  Saver saver = StartSaver(root, 1, 1, d.str(), "s", /*lock_wait=*/60);
  int gc_ok = 0, gc_locked = 0, cli_ok = 0, cli_locked = 0, removed_tags = 0, i = 0;
  const double seconds = RunAtLeast3s(
      [&] {
        if (i++ % 10 == 9) {
          std::string out;
          const int rc = RunCli("gc --keep-last 2 " + root, &out);
          INFO("ckpt gc: exit " << rc << ": " << out);
          REQUIRE((rc == 0 || rc == 2));
          if (rc == 0) ++cli_ok;
          else {
            CHECK(out.find(".lock") != std::string::npos);
            ++cli_locked;
          }
          return;
        }
        if (!std::filesystem::exists(root)) return;
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
      },
      [&] { return gc_ok > 0 && cli_ok + cli_locked > 0 && PeekSaver(saver).ok > 1; });
  SaverReport rep = JoinSaver(saver);
  ExpectRootHealthy(root);
  REQUIRE(CollectGarbage(root, 0).ok());
  CHECK(ListRoot(root)->temporary.empty());
  std::printf("gc during saves, %.1f s: gc ran %d times (%d refused at the lock), ckpt gc %d (%d "
              "refused), %d tags retired; saver %d commits, %d refused at the lock\n",
              seconds, gc_ok, gc_locked, cli_ok, cli_locked, removed_tags, rep.ok, rep.locked);
  CHECK(rep.ok > 0);
  CHECK(rep.locked == 0);  // issue 20 item 10: a periodic gc no longer kills training
  CHECK(gc_ok + cli_ok > 0);
}

TEST_CASE("a saver waits for gc, bounded; gc yields to a waiting saver", "[io]") {
  ScratchDir d("ckpt-lock-wait");
  const std::string root = d / "root";
  Manifest first = ckpt::testing::SmallModel("global_step1", 2, 1);
  first.counters.global_step = 1;
  REQUIRE(SaveWithThreads(root, first, {}, 1).ok());
  Manifest m = ckpt::testing::SmallModel("global_step2", 2, 1);
  m.counters.global_step = 2;
  SECTION("the holder releases within the wait: the save commits, told once") {
    auto held = RootLock::TryAcquire(root);
    REQUIRE(held.ok());
    std::atomic<int> told{0};
    std::string message;  // written by the saving thread before `told`, read after the join
    SaveOptions o;
    o.lock_wait_seconds = 30;
    o.on_lock_wait = [&](const std::string& msg) {
      message = msg;
      ++told;
    };
    // Released only once the save said it waits (no timing assumption: a loaded machine
    // may take long to get there).
    std::thread release([&] {
      const auto cap = Clock::now() + std::chrono::seconds(240);
      while (told == 0 && Clock::now() < cap)
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
      RootLock gone = std::move(held).value();  // released at the end of this scope
    });
    Status s = SaveWithThreads(root, m, o, 2);
    release.join();
    CHECK(s.ok());
    CHECK(told == 1);
    CHECK(message.find(".lock") != std::string::npos);
    CHECK(ListRoot(root)->latest == "global_step2");
  }
  SECTION("the holder keeps it: FailedPrecondition after the wait, nothing committed") {
    auto held = RootLock::TryAcquire(root);
    REQUIRE(held.ok());
    SaveOptions o;
    o.lock_wait_seconds = 0.3;
    o.on_lock_wait = [](const std::string&) {};
    Status s = SaveWithThreads(root, m, o, 2);
    CHECK(s.code() == StatusCode::kFailedPrecondition);
    CHECK(s.message().find("waited") != std::string::npos);
    CHECK(ListRoot(root)->latest == "global_step1");
  }
  SECTION("gc with a saver waiting: stops before deleting, reports it, releases the lock") {
    for (int step : {3, 4}) {
      Manifest t = ckpt::testing::SmallModel("global_step" + std::to_string(step), 2, 1);
      t.counters.global_step = step;
      REQUIRE(SaveWithThreads(root, t, {}, step).ok());
    }
    {
      // What RootLock::Acquire holds while it waits.
      auto waiting = Env::Default()->TryLockFile(root + "/.lock.waiting");
      REQUIRE(waiting.ok());
      CHECK(SaverWaiting(root));
      auto gc = CollectGarbage(root, 1);
      REQUIRE(gc.ok());
      CHECK(gc->yielded);
      CHECK(gc->removed_tags.empty());
      CHECK(RootLock::TryAcquire(root).ok());  // released
    }
    CHECK_FALSE(SaverWaiting(root));
    auto gc = CollectGarbage(root, 1);
    REQUIRE(gc.ok());
    CHECK_FALSE(gc->yielded);
    CHECK(gc->removed_tags.size() == 2);
  }
}
