// Peak resident memory of `ckpt export-fp32` on a DeepSpeed ZeRO-2 checkpoint whose master
// weights alone exceed the bound 2 x largest tensor (fp32) + 64 MiB (docs/deepspeed.md): the
// tensors must be read lazily from the .pt archives for the bound to hold.
#include <sys/resource.h>

#include <catch2/catch.hpp>
#include <cstdio>
#include <string>

#include "test_util.h"

TEST_CASE("export-fp32 of a DeepSpeed checkpoint stays under 2 x largest tensor + 64 MiB",
          "[io][slow]") {
  ckpt::testing::ScratchDir dir("dsmem");
  const std::string src = dir / "ds";
  const int blocks = 76, width = 512;
  // Written by a child so that this process stays small (see RunMeasured).
  REQUIRE(ckpt::testing::RunMeasured(
              {"/usr/bin/python3",
               std::string(CKPT_SOURCE_DIR) + "/tests/deepspeed/make_ds_checkpoint.py", src,
               "--zero", "2", "--world", "2", "--dtype", "bf16", "--blocks",
               std::to_string(blocks), "--block-width", std::to_string(width)})
              .first == 0);
  const uint64_t largest = static_cast<uint64_t>(width) * width * 4;
  const uint64_t bound = 2 * largest + (64ull << 20);
  REQUIRE(static_cast<uint64_t>(blocks) * largest > bound);  // master weights exceed it
  auto [rc, rss] = ckpt::testing::RunMeasured(
      {ckpt::testing::BinDir() + "/ckpt", "export-fp32", src, dir / "out", "--json"});
  REQUIRE(rc == 0);
  std::printf("export-fp32 of DeepSpeed ZeRO-2 (bf16, 2 ranks): peak RSS %.1f MiB (bound %.1f "
              "MiB, master weights %.1f MiB)\n",
              rss / 1048576.0, bound / 1048576.0, blocks * largest / 1048576.0);
  CHECK(rss > 0);
  CHECK(rss <= bound);
}
