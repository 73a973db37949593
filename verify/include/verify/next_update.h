// `ckpt next-update`: replays the next AdamW update of a checkpoint three ways (full state,
// weights only, moments dropped; verify/update_pass.h) and reports what a weights-only restore
// would lose. The gradient comes from a safetensors file (full-shape fp32 tensors named by
// trainable parameter) or, for engine_min checkpoints, from `engine_min grad`.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "ckpt/status.h"
#include "verify/update_pass.h"

namespace ckpt::verify {

struct NextUpdateOptions {
  std::string root;       // checkpoint root or tag directory
  std::string tag;        // empty: `latest` (or the tag directory itself)
  std::string grad_file;  // empty: run `engine_min grad` (engine checkpoints only)
  Device device = Device::kAuto;
  std::string out_dir;    // non-empty: write the three weight sets as safetensors there
  std::string reference;  // trainlog.jsonl; empty: ROOT/trainlog.jsonl (engine gradient only)
  std::string bin_dir;    // where engine_min lives; empty: $CKPT_BIN_DIR or this program's dir
  // Processes the pass is split over: on CUDA one per GPU, `gpus` of them (0: every visible
  // GPU); on the CPU `procs` (1: this process alone). Each loads only its share of the state.
  // The worker program (kNextUpdateWorkerProgram) is looked for in bin_dir.
  int gpus = 0;
  int procs = 1;
};

struct PathReport {
  double max_abs = 0;
  double rel_l2 = 0;      // ||w_x - w_full|| / ||w_full||
  double rel_update = 0;  // ||w_x - w_full|| / ||w_full - w||
  double frac_differ = 0;
  uint64_t n_differ = 0;
  double update_norm = 0;       // ||w_x - w||
  double update_norm_full = 0;  // ||w_full - w||
};
PathReport MakePathReport(const PassStats& s, const PathStats& p);

struct TensorReport {
  std::string name;
  std::vector<int64_t> shape;
  PassStats stats;
};

struct NextUpdateReport {
  std::string tag_dir;
  std::string tag;
  AdamWHyper hyper;
  std::string hyper_source;  // where lr/step came from, for the reader of the report
  Device device = Device::kCpu;
  int processes = 1;         // processes the pass ran in
  std::vector<int> devices;  // CUDA: the GPU of each process (empty on the CPU)
  std::string grad_source;   // the file, or "engine_min grad"
  std::vector<TensorReport> tensors;
  PassStats overall;
  std::string full_weights_xxh3;  // digest of path (a)'s weights (docs/architecture.md)
  std::string full_exp_avg_xxh3;
  std::string full_exp_avg_sq_xxh3;
  std::optional<bool> matches_reference;  // engine gradient + reference log only
  nlohmann::json reference = nullptr;     // details of that comparison
};

// NotFound: checkpoint, gradient file, engine_min or mpirun missing. DataLoss: the checkpoint
// fails its checksums. InvalidArgument: the gradient's names/shapes/dtypes don't match the
// trainable parameters. FailedPrecondition: no gradient given for a non-engine checkpoint.
// InvalidArgument: --procs with CUDA, --gpus on the CPU. FailedPrecondition: more GPUs asked
// for than visible, or several GPUs without NCCL. With several processes, an error of one of
// them comes back with its code and message, prefixed by "worker <rank>".
Result<NextUpdateReport> RunNextUpdate(const NextUpdateOptions& options);

// One process of a split run (next_update_split.cc has the protocol): the job its launcher
// wrote in `dir`, the share of worker `rank`. Its results, or its error, go to files in `dir`.
Status RunNextUpdateWorker(const std::string& dir, int rank);

// The worker program a split run starts once per process (build/bin/next_update_worker, next
// to ckpt and engine_min): `next_update_worker DIR RANK` is main() over this function. Exit 0,
// 1 (the checkpoint fails its checksums), 2 (any other error, or a usage error).
inline constexpr const char* kNextUpdateWorkerProgram = "next_update_worker";
int NextUpdateWorkerMain(int argc, char** argv);

// The `--json` object (contract in issue 5; fields are only ever added).
nlohmann::json NextUpdateToJson(const NextUpdateReport& r);
// A human-readable table.
std::string NextUpdateToText(const NextUpdateReport& r);

}  // namespace ckpt::verify
