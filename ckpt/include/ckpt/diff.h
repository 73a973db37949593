// `ckpt diff A B`: tensor-by-tensor comparison of two checkpoints of any kind a StateSource
// opens (ckpt/state_source.h): a ckpt root or tag, a universal directory, a DeepSpeed
// checkpoint. So a checkpoint and its universal copy, or a DeepSpeed checkpoint and its import,
// compare like two ckpt checkpoints.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "ckpt/env.h"
#include "ckpt/status.h"

namespace ckpt {

struct DiffOptions {
  std::string tag_a, tag_b;     // empty: `latest` (or the directory itself)
  double atol = 0.0;            // both 0: bitwise equality (sign of zero included)
  double rtol = 0.0;            // |a - b| <= atol + rtol * |b| is equal
  Env* env = nullptr;           // nullptr: Env::Default()
  bool progress = false;        // a progress bar on a TTY over the bytes compared
};

struct Difference {
  std::string what;  // "exp_avg layers.0.w", "counters.global_step: 5 vs 6", "param x: only in A"
  std::optional<double> max_abs;
  std::optional<double> max_rel;
};

struct DiffReport {
  std::string dir_a, dir_b;  // the tag directories compared
  std::vector<Difference> differences;
  bool identical() const { return differences.empty(); }
};

// Compares counters, optimizer settings, client_state, the parameter tables, every parameter's
// master weights and both moments (streamed in bounded memory, each source's checksums verified
// as it is read), and each rank's blob and json datasets (RNG, data position, scheduler; json
// compared as values). Errors (prefixed "A: " or "B: "): the checkpoint cannot be opened or read
// (NotFound, DataLoss for damaged data).
Result<DiffReport> DiffCheckpoints(const std::string& a, const std::string& b,
                                   const DiffOptions& options = {});

// `ckpt diff --json`: {"identical", "differences": [{"what", "max_abs", "max_rel"}]} (null when
// a difference has no magnitude).
nlohmann::json DiffReportToJson(const DiffReport& report);
// "identical" / "identical within tolerance", or "N difference(s)" and one line each.
std::string DiffReportToText(const DiffReport& report, bool tolerance);

}  // namespace ckpt
