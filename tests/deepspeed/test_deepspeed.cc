// DeepSpeed checkpoints end to end (tests/deepspeed/check_deepspeed.py): every fixture of ZeRO
// 1/2/3 x world 1/2/3 x fp32/bf16 (+ BF16_Optimizer) against torch's recomputation through
// export-fp32, import-deepspeed, inspect, check, to-universal and reshard; hostile inputs refused.
#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

#include "test_util.h"

TEST_CASE("DeepSpeed fixtures: ckpt equals torch's recomputation; hostile files refused", "[io]") {
  ckpt::testing::ScratchDir dir("ds");
  const std::string cmd = "/usr/bin/python3 " + std::string(CKPT_SOURCE_DIR) +
                          "/tests/deepspeed/check_deepspeed.py " + ckpt::testing::BinDir() +
                          "/ckpt " + dir.path().string();
  REQUIRE(ckpt::testing::RunShell(cmd) == 0);
}

TEST_CASE("docs/deepspeed.md examples run", "[io]") {
  ckpt::testing::ScratchDir dir("dsdoc");
  std::ifstream in(std::string(CKPT_SOURCE_DIR) + "/docs/deepspeed.md");
  const std::string doc((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::string script;
  int blocks = 0;
  for (size_t at = doc.find("```sh\n"); at != std::string::npos; at = doc.find("```sh\n", at)) {
    const size_t end = doc.find("```\n", at + 6);
    REQUIRE(end != std::string::npos);
    script += doc.substr(at + 6, end - at - 6);
    at = end + 4;
    ++blocks;
  }
  REQUIRE(blocks >= 2);
  // The examples run from the repository root's point of view (tests/ reachable) in a scratch
  // directory, with the built ckpt first on PATH.
  std::filesystem::create_directory_symlink(std::string(CKPT_SOURCE_DIR) + "/tests", dir / "tests");
  std::ofstream(dir / "examples.sh") << script;
  const std::string cmd = "cd " + dir.path().string() + " && PATH=" + ckpt::testing::BinDir() +
                          ":$PATH bash -euo pipefail examples.sh >examples.log 2>&1";
  const int rc = ckpt::testing::RunShell(cmd);
  if (rc != 0) {
    std::ifstream log(dir / "examples.log");
    FAIL(std::string((std::istreambuf_iterator<char>(log)), std::istreambuf_iterator<char>()));
  }
  REQUIRE(std::filesystem::exists(dir / "hf_model/model.safetensors"));
  REQUIRE(std::filesystem::exists(dir / "ckpt_dp3/latest"));
}
