// DeepSpeed checkpoints end to end (tests/deepspeed/check_deepspeed.py): every fixture of ZeRO
// 1/2/3 x world 1/2/3 x fp32/bf16 (+ BF16_Optimizer) against torch's recomputation through
// export-fp32, import-deepspeed, inspect, check, to-universal, reshard and next-update; hostile
// inputs refused. (docs/deepspeed.md's examples run in the docs suite, tests/docs.)
#include <catch2/catch.hpp>
#include <string>

#include "test_util.h"

TEST_CASE("DeepSpeed fixtures: ckpt equals torch's recomputation; hostile files refused", "[io]") {
  ckpt::testing::ScratchDir dir("ds");
  const std::string cmd = "/usr/bin/python3 " + std::string(CKPT_SOURCE_DIR) +
                          "/tests/deepspeed/check_deepspeed.py " + ckpt::testing::BinDir() +
                          "/ckpt " + dir.path().string();
  REQUIRE(ckpt::testing::RunShell(cmd) == 0);
}

