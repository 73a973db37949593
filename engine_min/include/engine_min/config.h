// engine_min settings: the command line (docs/architecture.md, "engine_min command line"),
// the defaults, and how a resumed run merges the flags it was given with the checkpoint's
// engine_config. Settings are kept as the JSON object that is saved as engine_config, so
// everything needed to relaunch a run is in the checkpoint.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "ckpt/status.h"
#include "engine_min/model.h"

namespace engine_min {

struct EngineConfig {
  std::string model = "tiny";
  ModelShape shape;
  double dropout = 0.1;
  int zero_stage = 0;
  int64_t steps = 100;
  int64_t micro_batch = 4;
  int64_t grad_accum = 1;
  int64_t global_batch = 4;
  int dp_world_size = 1;
  double lr = 1e-3;
  double min_lr = 1e-4;
  int64_t warmup = 10;
  int64_t lr_decay_steps = 0;  // cosine horizon; 0: --steps
  double weight_decay = 0.01;
  double grad_clip = 1.0;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  uint64_t seed = 1234;
  int64_t save_every = 0;
  int keep_last = 0;
  std::string compress = "none";
  std::string corpus;  // path; empty: the corpus shipped in the source tree
  int sample_min = 8;
  int sample_max = 48;
  std::string comm = "mpi";  // "mpi" | "nccl"
  // Topology-invariant mode (docs/engine.md, "Invariant mode"): dropout keyed by the sample,
  // gradients, loss and norm summed exactly; the trajectory is the same bits for every world
  // size, ZeRO stage and accumulation split of the same global batch.
  bool invariant = false;

  int64_t DecaySteps() const { return lr_decay_steps > 0 ? lr_decay_steps : steps; }
  // engine_config as saved in the manifest.
  nlohmann::json ToJson() const;
};

// What the command line asked for, before defaults and the checkpoint are merged in.
struct CommandLine {
  std::string command;                              // "train" | "grad"
  nlohmann::json given = nlohmann::json::object();  // only the settings present on the line
  std::string ckpt_dir;
  bool resume = false;
  std::string resume_tag;
  std::string trainlog;  // empty: <ckpt-dir>/trainlog.jsonl
  bool no_final_save = false;
  // Saves snapshot the state and persist it in the background (Engine::EnableAsyncSave). Not
  // part of engine_config: the checkpoints are the same bits either way.
  bool async_save = false;
  // A fresh run into a root that holds one, or a resume whose saves move `latest` back
  // (main.cc, CheckNoRewind); a fresh run first removes the root's tags and run log.
  bool overwrite = false;
  std::set<std::string> reset_on_resume;  // moments, step, rng, data, scheduler
  nlohmann::json client_state = nlohmann::json::object();
  std::string grad_out;  // grad: output safetensors path
  // Test-only: rank kill_rank raises SIGKILL in the middle of the save at global_step
  // kill_step (after its rank file is written, before the commit). -1: off.
  int kill_rank = -1;
  int64_t kill_step = -1;
  bool kill_stalls = false;  // --test-stall-in-save: the rank sleeps there instead
  // The checkpoint collectives give up after this many seconds (0: never): a stopped or hung
  // rank fails the save with a clear error and the job aborts, the previous checkpoint intact.
  double collective_timeout = 600;
  bool help = false;
  std::string help_text;
};

// Parses argv (argv[0] is the program). InvalidArgument with a usage message on bad input.
ckpt::Result<CommandLine> ParseCommandLine(int argc, char** argv);

// Merges defaults (and the --model preset), `base` (a checkpoint's engine_config; null for a
// fresh run) and the settings given on the command line, for `world` data-parallel ranks.
// Batch rules: global_batch = micro_batch × grad_accum × world. Given all three they must
// agree; given two the third is derived; on resume the global batch is kept from the
// checkpoint and a missing --grad-accum is derived from it. InvalidArgument names the flags.
ckpt::Result<EngineConfig> ResolveConfig(const nlohmann::json& given, const nlohmann::json& base,
                                         int world);

// The shipped corpus (engine_min/data/corpus.txt in the source tree).
std::string DefaultCorpusPath();

}  // namespace engine_min
