// Reproduces DeepSpeed's ZeRO-2/3 model-state estimators. Each expression keeps Python's
// evaluation order and types: integer products stay integers (exact), a product with the
// float buffer factor (or ZeRO-3's 1/num_nodes) converts the integer to a double first, and
// int() truncates toward zero. Inputs are bounded by kMaxParams so every integer that reaches
// a double is converted exactly where Python's would be.
#include "estimate/zero_memory.h"

#include <algorithm>
#include <cmath>

#include "numeric.h"

namespace ckpt::estimate {
namespace {

using internal::CheckedMul;
using internal::StrFormat;

Status ValidateCluster(int64_t total_params, const ClusterShape& c) {
  if (total_params < 0) {
    return InvalidArgument("total params must not be negative (got " +
                           std::to_string(total_params) + ")");
  }
  if (total_params > kMaxParams) {
    return InvalidArgument("total params " + std::to_string(total_params) +
                           " exceeds the supported maximum " + std::to_string(kMaxParams));
  }
  if (c.gpus_per_node < 1) {
    return InvalidArgument("GPUs per node must be at least 1 (got " +
                           std::to_string(c.gpus_per_node) + ")");
  }
  if (c.nodes < 1) {
    return InvalidArgument("nodes must be at least 1 (got " + std::to_string(c.nodes) + ")");
  }
  if (!std::isfinite(c.buffer_factor) || c.buffer_factor <= 0) {
    return InvalidArgument("buffer factor must be a positive number");
  }
  // The largest integer product formed is total_params * 4 * total_gpus.
  int64_t gpus = 0;
  if (__builtin_mul_overflow(c.gpus_per_node, c.nodes, &gpus)) {
    return InvalidArgument("GPUs per node × nodes overflows");
  }
  auto p = CheckedMul(total_params, 4, "total params × 4 × GPUs");
  if (!p.ok()) return p.status();
  auto q = CheckedMul(*p, std::max<int64_t>(gpus, 18), "total params × 4 × GPUs");
  if (!q.ok()) return q.status();
  if (static_cast<double>(*q) * c.buffer_factor >= 9.0e18) {
    return InvalidArgument("host-memory estimate overflows 64-bit byte counts");
  }
  return Status::Ok();
}

// Python: int(x) for a positive float.
int64_t Trunc(double x) { return static_cast<int64_t>(x); }
// Python: int(a / b) for positive ints below 2^53 (true division is correctly rounded, as
// the double division of two exactly converted operands is).
int64_t TruncDiv(int64_t a, int64_t b) {
  return Trunc(static_cast<double>(a) / static_cast<double>(b));
}

std::string OptionsString(int stage, const ZeroOptions& o) {
  // DeepSpeed pads the device name with f'{OffloadDeviceEnum.cpu:4}' -> "cpu ".
  auto device = [](bool cpu) { return std::string(cpu ? "cpu " : "none"); };
  if (stage == 2) return "offload_optimizer=" + device(o.offload_optimizer);
  return "offload_param=" + device(o.offload_param) +
         ", offload_optimizer=" + device(o.offload_optimizer) +
         ", zero_init=" + (o.zero_init ? "1" : "0");
}

std::string RStrip(std::string s) {
  while (!s.empty() && s.back() == ' ') s.pop_back();
  return s;
}

}  // namespace

std::string_view ZeroFormulaName(ZeroFormula f) {
  return f == ZeroFormula::kLegacy ? "legacy" : "current";
}

Result<ZeroFormula> ParseZeroFormula(std::string_view text) {
  if (text == "current") return ZeroFormula::kCurrent;
  if (text == "legacy") return ZeroFormula::kLegacy;
  return InvalidArgument("unknown formula '" + std::string(text) +
                         "' (expected current or legacy)");
}

Result<ZeroEstimate> EstimateZero2(int64_t total_params, const ClusterShape& cluster,
                                   ZeroFormula formula) {
  CKPT_RETURN_IF_ERROR(ValidateCluster(total_params, cluster), "zero2");
  const int64_t p = total_params;
  const int64_t total_gpus = cluster.total_gpus();
  const double bf = cluster.buffer_factor;
  ZeroEstimate e;
  e.stage = 2;
  e.formula = formula;
  e.total_params = p;
  e.cluster = cluster;
  for (bool cpu_offload : {true, false}) {
    ZeroRow row;
    row.options.offload_optimizer = cpu_offload;
    if (cpu_offload) {
      row.per_gpu_bytes = 2 * p;
      // total_params * max(4 * total_gpus, 16) * additional_buffer_factor
      row.per_cpu_bytes =
          Trunc(static_cast<double>(p * std::max<int64_t>(4 * total_gpus, 16)) * bf);
    } else {
      if (formula == ZeroFormula::kLegacy) {
        row.per_gpu_bytes = 4 * p + TruncDiv(16 * p, total_gpus);
      } else {
        row.per_gpu_bytes = 2 * p + TruncDiv(18 * p, total_gpus);
      }
      // total_params * 4 * num_gpus_per_node * additional_buffer_factor
      row.per_cpu_bytes = Trunc(static_cast<double>(p * 4 * cluster.gpus_per_node) * bf);
    }
    e.rows.push_back(row);
  }
  return e;
}

Result<ZeroEstimate> EstimateZero3(int64_t total_params, int64_t largest_layer_params,
                                   const ClusterShape& cluster) {
  CKPT_RETURN_IF_ERROR(ValidateCluster(total_params, cluster), "zero3");
  if (largest_layer_params < 0) {
    return InvalidArgument("zero3: largest layer params must not be negative (got " +
                           std::to_string(largest_layer_params) + ")");
  }
  if (largest_layer_params > total_params) {
    return InvalidArgument("zero3: largest layer params (" +
                           std::to_string(largest_layer_params) +
                           ") exceed total params (" + std::to_string(total_params) + ")");
  }
  const int64_t p = total_params;
  const int64_t l = largest_layer_params;
  const int64_t gpn = cluster.gpus_per_node;
  const int64_t total_gpus = cluster.total_gpus();
  const double bf = cluster.buffer_factor;
  const double gpus_factor = 1.0 / static_cast<double>(cluster.nodes);
  const int64_t largest_layer_memory = 4 * l;

  // Python's max(int, float) keeps the first argument on a tie; either way the product is
  // the same double because both factors are exact.
  auto host_max = [&](int64_t multiplier) {
    double a = static_cast<double>(4 * gpn);
    double b = static_cast<double>(multiplier) * gpus_factor;
    if (a >= b) return static_cast<double>(p * 4 * gpn) * bf;
    return static_cast<double>(p) * b * bf;
  };

  ZeroEstimate e;
  e.stage = 3;
  e.total_params = p;
  e.largest_layer_params = l;
  e.largest_layer_memory = largest_layer_memory;
  e.cluster = cluster;
  for (bool cpu_offload : {true, false}) {
    for (bool cpu_offload_params : {true, false}) {
      if (!cpu_offload && cpu_offload_params) continue;
      for (bool zero_init : {true, false}) {
        ZeroRow row;
        row.options = {cpu_offload_params, cpu_offload, zero_init};
        if (cpu_offload) {
          if (cpu_offload_params) {
            row.per_gpu_bytes = largest_layer_memory;
            // total_params * 18 * gpus_factor * additional_buffer_factor
            row.per_cpu_bytes =
                zero_init ? Trunc(static_cast<double>(p * 18) * gpus_factor * bf)
                          : Trunc(host_max(18));
          } else {
            row.per_gpu_bytes = largest_layer_memory + TruncDiv(2 * p, total_gpus);
            row.per_cpu_bytes =
                zero_init ? Trunc(static_cast<double>(p * 16) * gpus_factor * bf)
                          : Trunc(host_max(16));
          }
        } else {
          row.per_gpu_bytes = largest_layer_memory + TruncDiv(18 * p, total_gpus);
          row.per_cpu_bytes = zero_init ? Trunc(static_cast<double>(l * 4 * gpn) * bf)
                                        : Trunc(static_cast<double>(p * 4 * gpn) * bf);
        }
        e.rows.push_back(row);
      }
    }
  }
  return e;
}

std::string FormatZeroTable(const ZeroEstimate& e) {
  const auto& c = e.cluster;
  std::string out = "Estimated memory needed for params, optim states and gradients for a:\n";
  out += StrFormat("HW: Setup with %lld %s, %lld %s per node.\n",
                   static_cast<long long>(c.nodes), c.nodes > 1 ? "nodes" : "node",
                   static_cast<long long>(c.gpus_per_node),
                   c.gpus_per_node > 1 ? "GPUs" : "GPU");
  // int(total_params/1e6)
  out += StrFormat("SW: Model with %lldM total params",
                   static_cast<long long>(Trunc(static_cast<double>(e.total_params) / 1e6)));
  if (e.stage == 3 && e.largest_layer_params) {
    out += StrFormat(", %lldM largest layer params",
                     static_cast<long long>(
                         Trunc(static_cast<double>(*e.largest_layer_params) / 1e6)));
  }
  out += ".\n";
  out += "  per CPU  |  per GPU |   Options\n";
  for (const ZeroRow& r : e.rows) {
    out += RStrip(StrFormat(" %7.2fGB | %6.2fGB | %s",
                            static_cast<double>(r.per_cpu_bytes) / internal::kGiB,
                            static_cast<double>(r.per_gpu_bytes) / internal::kGiB,
                            OptionsString(e.stage, r.options).c_str()));
    out += "\n";
  }
  return out;
}

nlohmann::json ZeroEstimateToJson(const ZeroEstimate& e) {
  nlohmann::json rows = nlohmann::json::array();
  for (const ZeroRow& r : e.rows) {
    rows.push_back({{"options",
                     {{"offload_param", r.options.offload_param ? "cpu" : "none"},
                      {"offload_optimizer", r.options.offload_optimizer ? "cpu" : "none"},
                      {"zero_init", r.options.zero_init}}},
                    {"per_cpu_bytes", r.per_cpu_bytes},
                    {"per_gpu_bytes", r.per_gpu_bytes}});
  }
  nlohmann::json j = {{"stage", e.stage},
                      {"formula", std::string(ZeroFormulaName(e.formula))},
                      {"total_params", e.total_params},
                      {"largest_layer_params", nullptr},
                      {"gpus_per_node", e.cluster.gpus_per_node},
                      {"nodes", e.cluster.nodes},
                      {"total_gpus", e.cluster.total_gpus()},
                      {"buffer_factor", e.cluster.buffer_factor},
                      {"rows", rows}};
  if (e.largest_layer_params) j["largest_layer_params"] = *e.largest_layer_params;
  if (e.stage == 3) j["largest_layer_memory_bytes"] = e.largest_layer_memory;
  return j;
}

Result<StatesTable> EstimateStates(int64_t params, int64_t ranks, int64_t param_bytes,
                                   int64_t grad_bytes, int64_t optim_bytes) {
  if (params < 1) {
    return InvalidArgument("states: params must be at least 1 (got " + std::to_string(params) +
                           ")");
  }
  if (ranks < 1) {
    return InvalidArgument("states: ranks must be at least 1 (got " + std::to_string(ranks) +
                           ")");
  }
  if (param_bytes < 0 || grad_bytes < 0 || optim_bytes < 0) {
    return InvalidArgument("states: byte widths must not be negative");
  }
  StatesTable t;
  t.params = params;
  t.ranks = ranks;
  t.param_bytes = param_bytes;
  t.grad_bytes = grad_bytes;
  t.optim_bytes = optim_bytes;
  const int64_t shard = internal::CeilDiv(params, ranks);
  const char* what = "states";
  int64_t all = 0;
  CKPT_ASSIGN_OR_RETURN(all, CheckedMul(params, param_bytes + grad_bytes + optim_bytes, what),
                        "states");
  int64_t z1a = 0, z1b = 0, z2a = 0, z2b = 0, z3 = 0;
  CKPT_ASSIGN_OR_RETURN(z1a, CheckedMul(params, param_bytes + grad_bytes, what), "states");
  CKPT_ASSIGN_OR_RETURN(z1b, CheckedMul(shard, optim_bytes, what), "states");
  CKPT_ASSIGN_OR_RETURN(z2a, CheckedMul(params, param_bytes, what), "states");
  CKPT_ASSIGN_OR_RETURN(z2b, CheckedMul(shard, grad_bytes + optim_bytes, what), "states");
  CKPT_ASSIGN_OR_RETURN(z3, CheckedMul(shard, param_bytes + grad_bytes + optim_bytes, what),
                        "states");
  int64_t z1 = 0, z2 = 0;
  CKPT_ASSIGN_OR_RETURN(z1, internal::CheckedAdd(z1a, z1b, what), "states");
  CKPT_ASSIGN_OR_RETURN(z2, internal::CheckedAdd(z2a, z2b, what), "states");
  t.rows = {{"DP", "P*(p+g+o)", all},
            {"ZeRO-1", "P*(p+g) + ceil(P/N)*o", z1},
            {"ZeRO-2", "P*p + ceil(P/N)*(g+o)", z2},
            {"ZeRO-3", "ceil(P/N)*(p+g+o)", z3}};
  return t;
}

std::string FormatStatesTable(const StatesTable& t) {
  std::string out = StrFormat(
      "Per-rank persistent training state: P = %lld params, N = %lld ranks, "
      "p = %lld (weights), g = %lld (gradients), o = %lld (optimizer + master) bytes/param\n",
      static_cast<long long>(t.params), static_cast<long long>(t.ranks),
      static_cast<long long>(t.param_bytes), static_cast<long long>(t.grad_bytes),
      static_cast<long long>(t.optim_bytes));
  for (const StateRow& r : t.rows) {
    out += StrFormat("%-6s %5.2f GB | %5.2f GiB | %14lld bytes | %s\n", r.name.c_str(),
                     static_cast<double>(r.bytes) / internal::kGB,
                     static_cast<double>(r.bytes) / internal::kGiB,
                     static_cast<long long>(r.bytes), r.formula.c_str());
  }
  out += "GB = 10^9 bytes, GiB = 2^30 bytes. Balanced persistent state only: no padding, "
         "activations, gathered parameters, communication buffers or fragmentation.\n";
  return out;
}

nlohmann::json StatesTableToJson(const StatesTable& t) {
  nlohmann::json rows = nlohmann::json::array();
  for (const StateRow& r : t.rows) {
    rows.push_back({{"name", r.name}, {"formula", r.formula}, {"bytes", r.bytes}});
  }
  return {{"params", t.params},         {"ranks", t.ranks},
          {"param_bytes", t.param_bytes}, {"grad_bytes", t.grad_bytes},
          {"optim_bytes", t.optim_bytes}, {"rows", rows}};
}

}  // namespace ckpt::estimate
