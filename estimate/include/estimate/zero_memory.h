// DeepSpeed's ZeRO model-state memory estimators, reproduced figure for figure, and the
// per-rank persistent-state table of the ZeRO paper with explicit byte widths.
//
// The ZeRO-2/3 functions mirror deepspeed/runtime/zero/stage_1_and_2.py
// estimate_zero2_model_states_mem_needs and stage3.py estimate_zero3_model_states_mem_needs
// operation for operation (integer products, float buffer factor, truncation with int()), so
// the printed tables match DeepSpeed's to the last digit. docs/estimate.md lists the formulas.
// All functions are pure and thread-safe.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "ckpt/status.h"

namespace ckpt::estimate {

// Which DeepSpeed code to reproduce. Only ZeRO-2's no-offload GPU figure differs:
//   kCurrent: 2P + int(18P / gpus)  (DeepSpeed PR #5099, June 2024, and later)
//   kLegacy:  4P + int(16P / gpus)  (DeepSpeed before PR #5099; the memory.rst tables)
enum class ZeroFormula { kCurrent, kLegacy };
std::string_view ZeroFormulaName(ZeroFormula f);  // "current" | "legacy"
Result<ZeroFormula> ParseZeroFormula(std::string_view text);

struct ClusterShape {
  int64_t gpus_per_node = 1;
  int64_t nodes = 1;
  double buffer_factor = 1.5;  // DeepSpeed's additional_buffer_factor (host memory only)
  int64_t total_gpus() const { return gpus_per_node * nodes; }
};

struct ZeroOptions {
  bool offload_param = false;      // "cpu" when set, else "none"
  bool offload_optimizer = false;
  bool zero_init = false;          // deepspeed.zero.Init (ZeRO-3 only; false for ZeRO-2)
};

struct ZeroRow {
  ZeroOptions options;
  int64_t per_cpu_bytes = 0;  // DeepSpeed's int(cpu_mem)
  int64_t per_gpu_bytes = 0;  // DeepSpeed's int(gpu_mem)
};

struct ZeroEstimate {
  int stage = 2;
  ZeroFormula formula = ZeroFormula::kCurrent;
  int64_t total_params = 0;
  std::optional<int64_t> largest_layer_params;  // required for ZeRO-3
  int64_t largest_layer_memory = 0;             // ZeRO-3: 4 × largest_layer_params
  ClusterShape cluster;
  std::vector<ZeroRow> rows;  // in DeepSpeed's print order
};

// Largest parameter count accepted (2^53 / 64): every product the formulas form stays exact
// in a double, as it is in Python's integers.
inline constexpr int64_t kMaxParams = (int64_t{1} << 53) / 64;

// ZeRO-2 rows: offload_optimizer=cpu, then none. InvalidArgument for counts < 1 (params < 0),
// a buffer factor that is not finite and positive, or sizes beyond kMaxParams / int64.
Result<ZeroEstimate> EstimateZero2(int64_t total_params, const ClusterShape& cluster,
                                   ZeroFormula formula = ZeroFormula::kCurrent);
// ZeRO-3 rows: (param, optimizer) = (cpu, cpu), (none, cpu), (none, none), each with
// zero_init 1 then 0. Same errors, and largest_layer_params must not exceed total_params.
Result<ZeroEstimate> EstimateZero3(int64_t total_params, int64_t largest_layer_params,
                                   const ClusterShape& cluster);

// DeepSpeed's printed report: the "Estimated memory needed ..." header, the HW and SW lines
// and the " per CPU | per GPU | Options" table ("GB" = 2^30 bytes, two decimals), without
// trailing blanks.
std::string FormatZeroTable(const ZeroEstimate& e);
// {"stage", "formula", "total_params", "largest_layer_params" (null when unknown),
//  "largest_layer_memory_bytes", "gpus_per_node", "nodes", "total_gpus", "buffer_factor",
//  "rows": [{"options": {"offload_param", "offload_optimizer", "zero_init"},
//            "per_cpu_bytes", "per_gpu_bytes"}]}
nlohmann::json ZeroEstimateToJson(const ZeroEstimate& e);

// Per-rank persistent training state (ZeRO paper accounting) for `ranks` data-parallel ranks
// and byte widths p (compute weights), g (gradients), o (optimizer state incl. master copy).
// A sharded quantity counts ceil(P / ranks) elements: the most loaded rank, no padding.
struct StateRow {
  std::string name;     // "DP", "ZeRO-1", "ZeRO-2", "ZeRO-3"
  std::string formula;  // e.g. "P*(p+g) + ceil(P/N)*o"
  int64_t bytes = 0;
};
struct StatesTable {
  int64_t params = 0;
  int64_t ranks = 1;
  int64_t param_bytes = 2;
  int64_t grad_bytes = 2;
  int64_t optim_bytes = 12;
  std::vector<StateRow> rows;
};
// InvalidArgument for params < 1, ranks < 1, byte widths < 0, or int64 overflow.
Result<StatesTable> EstimateStates(int64_t params, int64_t ranks, int64_t param_bytes,
                                   int64_t grad_bytes, int64_t optim_bytes);
// "DP     24.00 GB | 22.35 GiB | 24000000000 bytes | P*(p+g+o)" per row, after a header.
std::string FormatStatesTable(const StatesTable& t);
nlohmann::json StatesTableToJson(const StatesTable& t);

}  // namespace ckpt::estimate
