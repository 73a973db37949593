// DeepSpeed's ZeRO-2/3 estimator tables (seed 000, docs/code-docs/source/memory.rst) and the
// per-rank state table (seed 001), reproduced digit for digit.
#include <catch2/catch.hpp>

#include "estimate/zero_memory.h"

namespace est = ckpt::estimate;

namespace {

constexpr int64_t kT5_3bParams = 2851000000;  // total_params=2851e6
constexpr int64_t kT5_3bLargest = 32000000;   // largest_layer_params=32e6
const est::ClusterShape kOneNodeEightGpus{8, 1, 1.5};

}  // namespace

TEST_CASE("zero2 cold table for t5-3b matches memory.rst under the legacy formula", "[unit]") {
  auto e = est::EstimateZero2(kT5_3bParams, kOneNodeEightGpus, est::ZeroFormula::kLegacy);
  REQUIRE(e.ok());
  CHECK(est::FormatZeroTable(*e) ==
        "Estimated memory needed for params, optim states and gradients for a:\n"
        "HW: Setup with 1 node, 8 GPUs per node.\n"
        "SW: Model with 2851M total params.\n"
        "  per CPU  |  per GPU |   Options\n"
        "  127.45GB |   5.31GB | offload_optimizer=cpu\n"
        "  127.45GB |  15.93GB | offload_optimizer=none\n");
  // DeepSpeed's integers before formatting: 4P + int(16P/8) and P*max(4*8,16)*1.5.
  REQUIRE(e->rows.size() == 2);
  CHECK(e->rows[1].per_gpu_bytes == 4 * kT5_3bParams + 16 * kT5_3bParams / 8);
  CHECK(e->rows[0].per_cpu_bytes == 136848000000);
  CHECK(e->rows[0].per_gpu_bytes == 2 * kT5_3bParams);
  CHECK(e->rows[1].per_cpu_bytes == 136848000000);
}

TEST_CASE("zero2 current formula (DeepSpeed PR #5099) changes only the no-offload GPU figure",
          "[unit]") {
  auto legacy = est::EstimateZero2(kT5_3bParams, kOneNodeEightGpus, est::ZeroFormula::kLegacy);
  auto current = est::EstimateZero2(kT5_3bParams, kOneNodeEightGpus);
  REQUIRE(legacy.ok());
  REQUIRE(current.ok());
  CHECK(current->formula == est::ZeroFormula::kCurrent);
  // 2P + int(18P / 8) = 5702000000 + 6414750000.
  CHECK(current->rows[1].per_gpu_bytes == 12116750000);
  CHECK(current->rows[0].per_gpu_bytes == legacy->rows[0].per_gpu_bytes);
  CHECK(current->rows[0].per_cpu_bytes == legacy->rows[0].per_cpu_bytes);
  CHECK(current->rows[1].per_cpu_bytes == legacy->rows[1].per_cpu_bytes);
  CHECK(est::FormatZeroTable(*current).find("  127.45GB |  11.28GB | offload_optimizer=none\n") !=
        std::string::npos);
}

TEST_CASE("zero3 cold table for t5-3b matches memory.rst", "[unit]") {
  auto e = est::EstimateZero3(kT5_3bParams, kT5_3bLargest, kOneNodeEightGpus);
  REQUIRE(e.ok());
  CHECK(est::FormatZeroTable(*e) ==
        "Estimated memory needed for params, optim states and gradients for a:\n"
        "HW: Setup with 1 node, 8 GPUs per node.\n"
        "SW: Model with 2851M total params, 32M largest layer params.\n"
        "  per CPU  |  per GPU |   Options\n"
        "   71.69GB |   0.12GB | offload_param=cpu , offload_optimizer=cpu , zero_init=1\n"
        "  127.45GB |   0.12GB | offload_param=cpu , offload_optimizer=cpu , zero_init=0\n"
        "   63.72GB |   0.78GB | offload_param=none, offload_optimizer=cpu , zero_init=1\n"
        "  127.45GB |   0.78GB | offload_param=none, offload_optimizer=cpu , zero_init=0\n"
        "    1.43GB |   6.09GB | offload_param=none, offload_optimizer=none, zero_init=1\n"
        "  127.45GB |   6.09GB | offload_param=none, offload_optimizer=none, zero_init=0\n");
  REQUIRE(e->rows.size() == 6);
  CHECK(e->largest_layer_memory == 4 * kT5_3bLargest);
  CHECK(e->rows[0].per_cpu_bytes == 76977000000);  // P*18*(1/1)*1.5
  CHECK(e->rows[4].per_cpu_bytes == 1536000000);   // L*4*8*1.5
  CHECK(e->rows[4].per_gpu_bytes == 4 * kT5_3bLargest + 18 * kT5_3bParams / 8);
}

TEST_CASE("zero3 GPU cases 1-3 for t5-large on 4 GPUs match memory.rst", "[unit]") {
  // memory.rst: total params 737.67M, largest layer 32.90M (the shared embedding, 32128 x
  // 1024), 4 GPUs: largest layer memory 125MB, case1 3291MB, case2 125MB, case3 477MB.
  const int64_t total = 737668096, largest = 32128 * 1024;
  auto e = est::EstimateZero3(total, largest, {4, 1, 1.5});
  REQUIRE(e.ok());
  CHECK((e->largest_layer_memory >> 20) == 125);
  auto gpu_mb = [&](bool offload_param, bool offload_optimizer) {
    for (const auto& r : e->rows) {
      if (r.options.offload_param == offload_param &&
          r.options.offload_optimizer == offload_optimizer && r.options.zero_init) {
        return r.per_gpu_bytes >> 20;
      }
    }
    return int64_t{-1};
  };
  CHECK(gpu_mb(false, false) == 3291);  // case 1
  CHECK(gpu_mb(true, true) == 125);     // case 2
  CHECK(gpu_mb(false, true) == 477);    // case 3
}

TEST_CASE("multi-node host figures use 1/num_nodes and total GPUs as DeepSpeed does", "[unit]") {
  // 2 nodes x 4 GPUs, P = 1e9, L = 1e7, factor 1.5.
  auto z3 = est::EstimateZero3(1000000000, 10000000, {4, 2, 1.5});
  REQUIRE(z3.ok());
  CHECK(z3->rows[0].per_cpu_bytes == 13500000000);  // 1e9*18*0.5*1.5
  CHECK(z3->rows[1].per_cpu_bytes == 24000000000);  // 1e9*max(16, 9)*1.5
  CHECK(z3->rows[2].per_cpu_bytes == 12000000000);  // 1e9*16*0.5*1.5
  CHECK(z3->rows[2].per_gpu_bytes == 40000000 + 250000000);  // 4L + int(2P/8)
  auto z2 = est::EstimateZero2(1000000000, {4, 2, 1.5});
  REQUIRE(z2.ok());
  CHECK(z2->rows[0].per_cpu_bytes == 48000000000);  // P*max(4*8,16)*1.5: total GPUs
  CHECK(z2->rows[1].per_cpu_bytes == 24000000000);  // P*4*4*1.5: GPUs per node
  CHECK(est::FormatZeroTable(*z2).find("HW: Setup with 2 nodes, 4 GPUs per node.") !=
        std::string::npos);
}

TEST_CASE("zero estimate JSON carries the documented fields and DeepSpeed's integers",
          "[unit]") {
  auto e = est::EstimateZero3(kT5_3bParams, kT5_3bLargest, kOneNodeEightGpus);
  REQUIRE(e.ok());
  nlohmann::json j = est::ZeroEstimateToJson(*e);
  CHECK(j["total_params"] == kT5_3bParams);
  CHECK(j["largest_layer_params"] == kT5_3bLargest);
  REQUIRE(j["rows"].size() == 6);
  const auto& r0 = j["rows"][0];
  CHECK(r0["options"]["offload_param"] == "cpu");
  CHECK(r0["options"]["offload_optimizer"] == "cpu");
  CHECK(r0["options"]["zero_init"] == true);
  CHECK(r0["per_cpu_bytes"] == 76977000000);
  CHECK(r0["per_gpu_bytes"] == 128000000);
  auto z2 = est::EstimateZero2(kT5_3bParams, kOneNodeEightGpus);
  REQUIRE(z2.ok());
  nlohmann::json j2 = est::ZeroEstimateToJson(*z2);
  CHECK(j2["largest_layer_params"].is_null());
  CHECK(j2["rows"][1]["options"]["offload_param"] == "none");
  CHECK(j2["formula"] == "current");
}

TEST_CASE("zero estimators refuse bad input", "[unit]") {
  CHECK(est::EstimateZero2(-1, kOneNodeEightGpus).status().code() ==
        ckpt::StatusCode::kInvalidArgument);
  CHECK(!est::EstimateZero2(1000, {0, 1, 1.5}).ok());
  CHECK(!est::EstimateZero2(1000, {1, 0, 1.5}).ok());
  CHECK(!est::EstimateZero2(1000, {1, 1, 0.0}).ok());
  CHECK(!est::EstimateZero3(1000, 2000, kOneNodeEightGpus).ok());  // layer > total
  CHECK(!est::EstimateZero3(1000, -5, kOneNodeEightGpus).ok());
  CHECK(!est::EstimateZero2(est::kMaxParams + 1, kOneNodeEightGpus).ok());
  CHECK(!est::ParseZeroFormula("newest").ok());
  CHECK(est::ParseZeroFormula("legacy").value() == est::ZeroFormula::kLegacy);
}

TEST_CASE("states table reproduces seed 001 (1.5B params, 4 ranks, 2/2/12 bytes)", "[unit]") {
  auto t = est::EstimateStates(1500000000, 4, 2, 2, 12);
  REQUIRE(t.ok());
  REQUIRE(t->rows.size() == 4);
  CHECK(t->rows[0].bytes == 24000000000);
  CHECK(t->rows[1].bytes == 10500000000);
  CHECK(t->rows[2].bytes == 8250000000);
  CHECK(t->rows[3].bytes == 6000000000);
  const std::string text = est::FormatStatesTable(*t);
  CHECK(text.find("DP     24.00 GB | 22.35 GiB") != std::string::npos);
  CHECK(text.find("ZeRO-1 10.50 GB |  9.78 GiB") != std::string::npos);
  CHECK(text.find("ZeRO-2  8.25 GB |  7.68 GiB") != std::string::npos);
  CHECK(text.find("ZeRO-3  6.00 GB |  5.59 GiB") != std::string::npos);
  // The seed's own asserts: one rank holds 16 bytes per parameter at every stage, and
  // 4-byte gradients make ZeRO-3 4.5 GB for 1e9 parameters on 4 ranks.
  auto one = est::EstimateStates(17, 1, 2, 2, 12);
  REQUIRE(one.ok());
  for (const auto& r : one->rows) CHECK(r.bytes == 17 * 16);
  auto fp32_grads = est::EstimateStates(1000000000, 4, 2, 4, 12);
  REQUIRE(fp32_grads.ok());
  CHECK(fp32_grads->rows[3].bytes == 4500000000);
  // Uneven shards count the most loaded rank: ceil(10 / 4) = 3 elements.
  auto uneven = est::EstimateStates(10, 4, 2, 2, 12);
  REQUIRE(uneven.ok());
  CHECK(uneven->rows[3].bytes == 3 * 16);
  CHECK(!est::EstimateStates(0, 4, 2, 2, 12).ok());
  CHECK(!est::EstimateStates(10, 0, 2, 2, 12).ok());
  CHECK(!est::EstimateStates(10, 4, -2, 2, 12).ok());
}
