// A child process saving in a loop is killed with SIGKILL at random moments; `latest` must
// always name a checkpoint that loads and passes a deep check.
#include <catch2/catch.hpp>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <random>
#include <thread>

#include "ckpt/reader.h"
#include "ckpt/root.h"
#include "ckpt_test_helpers.h"
#include "test_util.h"

using namespace ckpt;
using namespace ckpt::testing;

namespace {

[[noreturn]] void SaveForever(const std::string& root, int first_step) {
  SaveOptions o;
  o.keep_last = 3;
  if (first_step % 2) o.compression = Compression::Parse("zstd:1").value();
  for (int step = first_step;; ++step) {
    Manifest m = SmallModel("global_step" + std::to_string(step), 3, 2 + step % 2);
    m.counters.global_step = step;
    Status s = SaveWithThreads(root, m, o, step);
    if (!s.ok() && s.code() != StatusCode::kFailedPrecondition) _exit(3);
  }
}

}  // namespace

TEST_CASE("SIGKILL at random moments during saves never breaks latest", "[io][slow]") {
  ScratchDir d;
  std::mt19937 rng(12345);
  int first_step = 1;
  int trials = 0, with_latest = 0, temporaries = 0;
  for (int trial = 0; trial < 40; ++trial) {
    pid_t pid = fork();
    REQUIRE(pid >= 0);
    if (pid == 0) SaveForever(d.str(), first_step);
    std::this_thread::sleep_for(std::chrono::milliseconds(std::uniform_int_distribution<>(1, 120)(rng)));
    kill(pid, SIGKILL);
    int status = 0;
    waitpid(pid, &status, 0);
    REQUIRE(WIFSIGNALED(status));  // it was still saving, not failing
    ++trials;
    auto listing = ListRoot(d.str());
    REQUIRE(listing.ok());
    temporaries += static_cast<int>(listing->temporary.size());
    for (const auto& t : listing->tags) {
      INFO(t.tag << ": " << t.error);
      CHECK(t.error.empty());
    }
    if (!listing->latest.empty()) {
      ++with_latest;
      auto probs = CheckCheckpoint(d / listing->latest, true);
      REQUIRE(probs.ok());
      for (const auto& p : *probs) FAIL("latest " << listing->latest << ": " << p.file << " " << p.what);
      auto r = CheckpointReader::Open(d.str());
      REQUIRE(r.ok());
      first_step = static_cast<int>(r->manifest().counters.global_step) + 1;
      for (const auto& t : listing->tags)
        first_step = std::max<int>(first_step, static_cast<int>(t.global_step) + 1);
    }
    auto gc = CollectGarbage(d.str(), 0);
    REQUIRE(gc.ok());
    CHECK(ListRoot(d.str())->temporary.empty());
  }
  CHECK(trials == 40);
  CHECK(with_latest > 20);  // most trials got past the first commit
  WARN("crash trials " << trials << ", with latest " << with_latest
                       << ", temporary dirs left by kills " << temporaries);
}
