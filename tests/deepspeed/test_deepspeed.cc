// DeepSpeed checkpoints end to end (tests/deepspeed/check_deepspeed.py): every fixture of ZeRO
// 1/2/3 x world 1/2/3 x fp32/bf16 (+ BF16_Optimizer) against torch's recomputation through
// export-fp32, import-deepspeed, inspect, check, to-universal, reshard and next-update; hostile
// inputs refused. (docs/deepspeed.md's examples run in the docs suite, tests/docs.)
#include <catch2/catch.hpp>
#include <string>

#include "ckpt/deepspeed.h"
#include "test_util.h"

namespace {

using ckpt::testing::Mapped;
// Read during static initialisation: what the program had loaded at start.
const bool g_libzip_mapped_at_start = Mapped("libzip");

}  // namespace

TEST_CASE("DeepSpeed fixtures: ckpt equals torch's recomputation; hostile files refused", "[io]") {
  ckpt::testing::ScratchDir dir("ds");
  const std::string cmd = "/usr/bin/python3 " + std::string(CKPT_SOURCE_DIR) +
                          "/tests/deepspeed/check_deepspeed.py " + ckpt::testing::BinDir() +
                          "/ckpt " + dir.path().string();
  REQUIRE(ckpt::testing::RunShell(cmd) == 0);
}

TEST_CASE("libzip is opened on first use, not loaded at start", "[io]") {
  // It needs libcrypto: loading both cost every ckpt command ~4 ms at start (issue 19).
  CHECK_FALSE(g_libzip_mapped_at_start);
  CHECK_FALSE(Mapped("libcrypto"));
  CHECK(ckpt::testing::RunShell("ldd " + ckpt::testing::BinDir() +
                                "/ckpt | grep -q -e libzip -e libcrypto") == 1);
  ckpt::testing::ScratchDir dir("dszip");
  REQUIRE(ckpt::testing::RunShell("/usr/bin/python3 " + std::string(CKPT_SOURCE_DIR) +
                                  "/tests/deepspeed/make_ds_checkpoint.py " + dir / "ds" +
                                  " --zero 2 --world 1 --dtype fp32 > /dev/null") == 0);
  auto r = ckpt::DeepSpeedReader::Open(dir / "ds");
  REQUIRE(r.ok());
  CHECK(r->info().optim_files.size() == 1);
  CHECK(Mapped("libzip"));
}
