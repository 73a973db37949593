// `ckpt estimate` end to end: the seed 000 tables as printed, --json, exit codes.
#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include "test_util.h"

namespace {

using ckpt::testing::CliResult;
using ckpt::testing::ScratchDir;

CliResult Estimate(const std::string& args) { return ckpt::testing::RunCkpt("estimate " + args); }

}  // namespace

TEST_CASE("ckpt estimate zero2/zero3 print memory.rst's tables", "[unit]") {
  auto legacy = Estimate("zero2 --params 2851e6 --gpus-per-node 8 --nodes 1 --formula legacy");
  INFO(legacy.err);
  REQUIRE(legacy.rc == 0);
  CHECK(legacy.out.rfind(
            "Estimated memory needed for params, optim states and gradients for a:\n"
            "HW: Setup with 1 node, 8 GPUs per node.\n"
            "SW: Model with 2851M total params.\n"
            "  per CPU  |  per GPU |   Options\n"
            "  127.45GB |   5.31GB | offload_optimizer=cpu\n"
            "  127.45GB |  15.93GB | offload_optimizer=none\n",
            0) == 0);
  auto current = Estimate("zero2 -p 2.851B --gpus-per-node 8");
  REQUIRE(current.rc == 0);
  CHECK(current.out.find("  127.45GB |  11.28GB | offload_optimizer=none\n") != std::string::npos);
  auto z3 = Estimate("zero3 --params 2851M --largest-layer-params 32M --gpus-per-node 8");
  REQUIRE(z3.rc == 0);
  CHECK(z3.out.find("SW: Model with 2851M total params, 32M largest layer params.\n"
                    "  per CPU  |  per GPU |   Options\n"
                    "   71.69GB |   0.12GB | offload_param=cpu , offload_optimizer=cpu , zero_init=1\n"
                    "  127.45GB |   0.12GB | offload_param=cpu , offload_optimizer=cpu , zero_init=0\n"
                    "   63.72GB |   0.78GB | offload_param=none, offload_optimizer=cpu , zero_init=1\n"
                    "  127.45GB |   0.78GB | offload_param=none, offload_optimizer=cpu , zero_init=0\n"
                    "    1.43GB |   6.09GB | offload_param=none, offload_optimizer=none, zero_init=1\n"
                    "  127.45GB |   6.09GB | offload_param=none, offload_optimizer=none, zero_init=0\n") !=
        std::string::npos);
}

TEST_CASE("ckpt estimate --json uses the documented field names", "[unit]") {
  auto r = Estimate("zero3 --params 7B --largest-layer-params 350M --gpus-per-node 8 --nodes 2 --json");
  INFO(r.err);
  REQUIRE(r.rc == 0);
  auto j = nlohmann::json::parse(r.out);
  CHECK(j["total_params"] == 7000000000);
  CHECK(j["largest_layer_params"] == 350000000);
  REQUIRE(j["rows"].size() == 6);
  for (const auto& row : j["rows"]) {
    CHECK(row["options"].contains("offload_param"));
    CHECK(row["options"].contains("offload_optimizer"));
    CHECK(row["options"].contains("zero_init"));
    CHECK(row["per_cpu_bytes"].is_number_integer());
    CHECK(row["per_gpu_bytes"].is_number_integer());
  }
  // (none, none, zero_init): 4L + int(18P / 16).
  CHECK(j["rows"][4]["per_gpu_bytes"] == 4LL * 350000000 + 18LL * 7000000000 / 16);
  auto s = Estimate("states --params 1.5B --ranks 4 --json");
  REQUIRE(s.rc == 0);
  auto sj = nlohmann::json::parse(s.out);
  CHECK(sj["rows"][0]["bytes"] == 24000000000);
  CHECK(sj["rows"][3]["bytes"] == 6000000000);
  auto t = Estimate("train --layers 96 --hidden 12288 --heads 96 --vocab 50257 --seq-len 2048 "
                    "--tp 8 --pp 8 --dp 4 --sequence-parallel --recompute selective --zero 1 --json");
  INFO(t.err);
  REQUIRE(t.rc == 0);
  auto tj = nlohmann::json::parse(t.out);
  CHECK(tj["params"] == 174604234752);
  CHECK(tj["items"][3]["name"] == "activations");
  CHECK(tj["items"][3]["bytes"] == 96LL * 2048 * 12288 * 34 / 8);
  auto i = Estimate("infer --layers 32 --hidden 4096 --heads 32 --kv-heads 8 --params 7B "
                    "--context 4096 --json");
  REQUIRE(i.rc == 0);
  CHECK(nlohmann::json::parse(i.out)["items"][1]["bytes"] == 536870912);
}

TEST_CASE("ckpt estimate refuses bad input with exit 2 and a message", "[unit]") {
  for (const char* args :
       {"zero2 --params -5", "zero2 --params 7B --gpus-per-node 0", "zero2 --params 7B --nodes 0",
        "zero2 --params seven", "zero3 --params 7B", "zero2 --params 7B --formula newest",
        "states --params 1B --ranks 0", "train --layers 2 --hidden 64 --heads 4 --vocab 10 "
        "--seq-len 8 --zero 4",
        "checkpoint --params 1M --ranks 2 --zero 7", "checkpoint --params 1M --ranks 0 --zero 1",
        "zero2 --from-checkpoint /nonexistent/ckpt-root", "zero9 --params 1B"}) {
    auto r = Estimate(args);
    INFO(args << ": " << r.out << r.err);
    CHECK(r.rc == 2);
    CHECK(!r.err.empty());
  }
  auto j = Estimate("states --params 1B --ranks 0 --json");
  CHECK(j.rc == 2);
  CHECK(nlohmann::json::parse(j.out)["error"]["code"] == "InvalidArgument");
}

TEST_CASE("a JSON parameter table drives zero3 counts and checkpoint sizes", "[unit]") {
  ScratchDir dir("estimate-table");
  {
    std::ofstream out(dir / "table.json");
    out << R"([{"name": "embed.weight", "shape": [1000, 64]},
               {"name": "layers.0.attn.qkv", "shape": [64, 192]},
               {"name": "layers.0.attn.proj", "shape": [64, 64]},
               {"name": "pos", "shape": [128, 64], "dtype": "bf16", "frozen": true},
               {"name": "lm_head.weight", "shape": [1000, 64], "tied_to": "embed.weight"}])";
  }
  auto z3 = Estimate("zero3 --param-table " + dir / "table.json" + " --json");
  INFO(z3.err);
  REQUIRE(z3.rc == 0);
  auto j = nlohmann::json::parse(z3.out);
  // 64000 + 12288 + 4096 + 8192, the alias once; largest module: embed (or lm_head) 64000.
  CHECK(j["total_params"] == 88576);
  CHECK(j["largest_layer_params"] == 64000);
  auto ck = Estimate("checkpoint --param-table " + dir / "table.json" + " --ranks 2 --zero 3 --json");
  INFO(ck.err);
  REQUIRE(ck.rc == 0);
  auto cj = nlohmann::json::parse(ck.out);
  CHECK(cj["frozen_params"] == 8192);
  CHECK(cj["trainable_params"] == 80384);
  // ZeRO-3 shares: ceil(n/2) rounded up to 16: 32000 + 6144 + 2048 per rank, 12 bytes each;
  // rank 0 also stores the frozen bf16 table (16384 bytes).
  CHECK(cj["ranks"][0]["shard_numel"] == 40192);
  CHECK(cj["ranks"][0]["tensor_payload_bytes"] == 40192 * 12 + 16384);
  CHECK(cj["ranks"][1]["tensor_payload_bytes"] == 40192 * 12);
  {
    std::ofstream out(dir / "bad.json");
    out << R"([{"name": "a", "shape": [-1]}])";
  }
  CHECK(Estimate("checkpoint --param-table " + dir / "bad.json" + " --ranks 2 --zero 1").rc == 2);
}

TEST_CASE("hostile parameter tables and safetensors indexes: refused or read, never a crash",
          "[unit]") {
  // JSON nested 200000 deep in a safetensors index's metadata was dumped recursively (a stack
  // overflow: SIGSEGV, until 2026-12-07); names reached messages with their control bytes raw.
  ScratchDir dir("estimate-hostile");
  const std::string deep = std::string(200000, '[') + std::string(200000, ']');
  auto no_control = [](const std::string& s) {
    for (char c : s)
      if (static_cast<unsigned char>(c) < 0x20 && c != '\n') return false;
    return true;
  };
  const std::string st = dir / "st";
  std::filesystem::create_directories(st);
  {
    std::ofstream out(st + "/model.safetensors.index.json");
    out << R"({"weight_map": {"w": "model-1.safetensors"}, "metadata": {"x": {"y": )" << deep
        << "}}}";
  }
  auto r = Estimate("checkpoint --from-safetensors " + st + " --ranks 1 --zero 0");
  INFO(r.err);
  CHECK(r.rc == 1);
  CHECK(r.err.find("nested deeper than 128") != std::string::npos);
  {
    std::ofstream out(st + "/model.safetensors.index.json");
    out << R"({"weight_map": {"w\u001b[31m": 5, "v": "model-1.safetensors"}})";
  }
  r = Estimate("checkpoint --from-safetensors " + st + " --ranks 1 --zero 0");
  INFO(r.err);
  CHECK(r.rc == 1);
  CHECK(r.err.find("'w\\x1b[31m' is not a file name") != std::string::npos);
  CHECK(no_control(r.err));
  {
    std::ofstream out(dir / "table.json");
    out << R"([{"name": "a\u001b]0;t\u0007", "shape": [2]}, {"name": "a\u001b]0;t\u0007", "shape": [2]}])";
  }
  r = Estimate("checkpoint --param-table " + dir / "table.json" + " --ranks 1 --zero 0");
  INFO(r.err);
  CHECK(r.rc == 2);
  CHECK(r.err.find("duplicate name 'a\\x1b]0;t\\x07'") != std::string::npos);
  CHECK(no_control(r.err));
  {
    std::ofstream out(dir / "deep.json");
    out << R"([{"name": "a", "shape": [2], "x": )" << deep << "}]";
  }
  r = Estimate("checkpoint --param-table " + dir / "deep.json" + " --ranks 1 --zero 0");
  INFO(r.err);
  CHECK(r.rc == 1);
  CHECK(r.err.find("nested deeper than 128") != std::string::npos);
}
