// Peak resident memory of `ckpt export-fp32` (and `ckpt to-universal`) on a synthetic
// checkpoint with many tensors whose master weights alone exceed the bound: the bound
// 2 × largest tensor + 64 MiB can only hold if the export streams.
#include <sys/resource.h>

#include <catch2/catch.hpp>
#include <cstdio>
#include <vector>

#include "convert_test_util.h"
#include "test_util.h"

TEST_CASE("export-fp32 peak RSS stays under 2 x largest tensor + 64 MiB", "[io][slow]") {
  ckpt::testing::ScratchDir dir("mem");
  const std::string src = dir / "src";
  const int64_t params = 24'000'000, largest = 256 * 1024;
  const std::string bin = ckpt::testing::BinDir() + "/ckpt";
  // Written by a child: on Linux a spawned child's ru_maxrss starts from the parent's
  // high-water mark (exec keeps the old mm's peak), so this process must stay small.
  REQUIRE(ckpt::testing::RunMeasured({bin, "synth", src, "--ranks", "4", "--params", "24M", "--zero", "2",
                       "--largest-tensor", "262144", "--seed", "7", "--json"})
              .first == 0);
  struct rusage self {};
  getrusage(RUSAGE_SELF, &self);
  std::printf("test process peak RSS %.1f MiB\n", self.ru_maxrss / 1024.0);
  const uint64_t bound = 2 * static_cast<uint64_t>(largest) * 4 + (64ull << 20);
  // The master weights alone are larger than the bound.
  REQUIRE(static_cast<uint64_t>(params) * 4 > bound);

  auto [rc, rss] = ckpt::testing::RunMeasured({bin, "export-fp32", src, dir / "e32", "--json"});
  REQUIRE(rc == 0);
  std::printf("export-fp32 fp32: peak RSS %.1f MiB (bound %.1f MiB, master %.1f MiB)\n",
              rss / 1048576.0, bound / 1048576.0, params * 4 / 1048576.0);
  CHECK(rss > 0);
  CHECK(rss <= bound);

  auto [rc2, rss2] = ckpt::testing::RunMeasured({bin, "export-fp32", src, dir / "ebf", "--dtype", "bf16",
                                  "--max-shard-size", "10MB", "--json"});
  REQUIRE(rc2 == 0);
  std::printf("export-fp32 bf16 sharded: peak RSS %.1f MiB\n", rss2 / 1048576.0);
  CHECK(rss2 <= bound);

  auto [rc3, rss3] = ckpt::testing::RunMeasured({bin, "to-universal", src, dir / "u", "--json"});
  REQUIRE(rc3 == 0);
  std::printf("to-universal: peak RSS %.1f MiB (state %.1f MiB)\n", rss3 / 1048576.0,
              params * 12 / 1048576.0);
  CHECK(rss3 <= bound);
}

// ckpt reshard writes the new ranks a few at a time (--threads): each new rank's shard exists
// only while its file is written, so peak memory is `threads` x (one new shard + its source
// reader's piece cache, at most 6 x 4 MiB) + the process, not the whole optimizer state
// (which all new ranks together hold, and which the bound is below).
TEST_CASE("reshard peak RSS: --threads new ranks' shards, not all of them", "[io][slow]") {
  ckpt::testing::ScratchDir dir("mem-reshard");
  const std::string src = dir / "src";
  const int64_t params = 16'000'000;
  const int dp = 8;
  const std::string bin = ckpt::testing::BinDir() + "/ckpt";
  REQUIRE(ckpt::testing::RunMeasured({bin, "synth", src, "--ranks", "1", "--params", "16M",
                                      "--zero", "2", "--seed", "3", "--json"})
              .first == 0);
  const uint64_t state = static_cast<uint64_t>(params) * 12;  // master + two moments
  const uint64_t shard = state / dp;
  for (int threads : {1, 2}) {
    const std::string out = dir / ("r" + std::to_string(threads));
    auto [rc, rss] = ckpt::testing::RunMeasured({bin, "reshard", src, out, "--dp",
                                                 std::to_string(dp), "--threads",
                                                 std::to_string(threads), "--json"});
    REQUIRE(rc == 0);
    const uint64_t bound = threads * (shard + (32ull << 20)) + (32ull << 20);
    std::printf("reshard 1 -> %d, --threads %d: peak RSS %.1f MiB (bound %.1f MiB, state %.1f "
                "MiB, one new shard %.1f MiB)\n",
                dp, threads, rss / 1048576.0, bound / 1048576.0, state / 1048576.0,
                shard / 1048576.0);
    // Holding every new rank at once (what reshard did before) cannot fit the bound.
    REQUIRE(state > bound);
    CHECK(rss > 0);
    CHECK(rss <= bound);
    // The output is whole: every new rank verifies.
    CHECK(ckpt::testing::RunMeasured({bin, "check", out, "--deep", "--json"}).first == 0);
  }
}
