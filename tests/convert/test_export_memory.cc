// Peak resident memory of `ckpt export-fp32` (and `ckpt to-universal`) on a synthetic
// checkpoint with many tensors whose master weights alone exceed the bound: the bound
// 2 × largest tensor + 64 MiB can only hold if the export streams.
#include <sys/resource.h>

#include <catch2/catch.hpp>
#include <cstdio>
#include <nlohmann/json.hpp>
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

// ckpt reshard writes the new ranks a few at a time (--threads), each a window at a time
// (issue 15): a new rank's state is never in memory whole, so peak memory is `threads` x (a
// window + its source reader's piece cache, at most 6 x 4 MiB) + the process, whatever the
// model size. Two models four times apart: the peak must stay about the same, while one new
// shard grows by 72 MiB (holding a shard, as reshard did before, grows the peak by that).
TEST_CASE("reshard peak RSS is flat in the model size: windows, not shards", "[io][slow]") {
  ckpt::testing::ScratchDir dir("mem-reshard");
  const std::string bin = ckpt::testing::BinDir() + "/ckpt";
  const int dp = 2;
  uint64_t peak[2] = {0, 0}, shard[2] = {0, 0};
  const int64_t params[2] = {4'000'000, 16'000'000};
  for (int i = 0; i < 2; ++i) {
    const std::string src = dir / ("src" + std::to_string(i));
    const std::string out = dir / ("r" + std::to_string(i));
    REQUIRE(ckpt::testing::RunMeasured({bin, "synth", src, "--ranks", "1", "--params",
                                        std::to_string(params[i] / 1'000'000) + "M", "--zero",
                                        "2", "--seed", "3", "--json"})
                .first == 0);
    auto [rc, rss] = ckpt::testing::RunMeasured(
        {bin, "reshard", src, out, "--dp", std::to_string(dp), "--threads", "1", "--json"},
        dir / ("r" + std::to_string(i) + ".json"));
    REQUIRE(rc == 0);
    peak[i] = rss;
    shard[i] = static_cast<uint64_t>(params[i]) * 12 / dp;  // master + two moments
    const nlohmann::json report =
        nlohmann::json::parse(ckpt::testing::Slurp(dir / ("r" + std::to_string(i) + ".json")));
    // It went through the windowed path: each new rank in many windows of at most 8 MiB.
    for (const auto& r : report["ranks"]) CHECK(r["windows"].get<uint64_t>() >= shard[i] / (8 << 20));
    std::printf("reshard 1 -> %d of %.0f M parameters, --threads 1: peak RSS %.1f MiB (one new "
                "shard %.1f MiB)\n",
                dp, params[i] / 1e6, rss / 1048576.0, shard[i] / 1048576.0);
  }
  // The large model's new shard does not fit where the peak is...
  CHECK(peak[1] < shard[1]);
  // ...and the peak grows by far less than the shard does (holding a shard: by all of it).
  const double growth = static_cast<double>(peak[1]) - static_cast<double>(peak[0]);
  std::printf("peak RSS growth %.1f MiB for %.1f MiB more per new shard\n", growth / 1048576.0,
              (shard[1] - shard[0]) / 1048576.0);
  CHECK(growth < 0.15 * static_cast<double>(shard[1] - shard[0]));
  // Nor does it grow with the number of new ranks, written one after the other: the windows
  // and cached pieces of one rank's writer are reused or returned, not left in the allocator of
  // the thread that freed them (through malloc, 1 -> 4 peaked at 76-100 MiB against 1 -> 2's
  // 53 MiB: glibc's per-thread arenas kept them; AllocateIoMemory maps them).
  auto [rc4, rss4] = ckpt::testing::RunMeasured(
      {bin, "reshard", dir / "src1", dir / "t1", "--dp", "4", "--threads", "1", "--json"});
  REQUIRE(rc4 == 0);
  std::printf("reshard 1 -> 4, --threads 1: peak RSS %.1f MiB\n", rss4 / 1048576.0);
  CHECK(static_cast<double>(rss4) < 1.15 * static_cast<double>(peak[1]));
  // --threads 2: two windows and piece caches (holding two new shards of 46 MiB: 2 x 78 MiB).
  auto [rc2, rss2] = ckpt::testing::RunMeasured(
      {bin, "reshard", dir / "src1", dir / "t2", "--dp", "4", "--threads", "2", "--json"});
  REQUIRE(rc2 == 0);
  std::printf("reshard 1 -> 4, --threads 2: peak RSS %.1f MiB\n", rss2 / 1048576.0);
  CHECK(rss2 < 2 * peak[1]);
  // The output is whole: every new rank verifies.
  CHECK(ckpt::testing::RunMeasured({bin, "check", dir / "r1", "--deep", "--json"}).first == 0);
}
