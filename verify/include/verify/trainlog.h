// trainlog.jsonl, engine_min's run log (docs/architecture.md, "Run log"): one JSON object per
// optimizer step. Also the weights digest it records and the helpers that launch engine_min.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "ckpt/env.h"
#include "ckpt/status.h"

namespace ckpt::verify {

struct TrainlogEntry {
  int64_t step = 0;  // global_step after the update
  double loss = 0;
  double grad_norm = 0;
  double lr = 0;
  int64_t tokens = 0;
  std::string weights_xxh3;
  std::string exp_avg_xxh3;
  std::string exp_avg_sq_xxh3;
};

// Entries by step. A step logged twice (a run resumed from an earlier checkpoint into the same
// log) keeps the last entry. NotFound when the file is missing; DataLoss naming the line when
// a line is not a valid entry. Read through env (nullptr: Env::Default()); other read errors
// keep the Env's code.
Result<std::map<int64_t, TrainlogEntry>> ReadTrainlog(const std::string& path, Env* env = nullptr);

// Whether engine_min wrote the checkpoint: its engine_config is engine_min's (it holds
// global_batch), the condition for relaunching engine_min on it. Other writers may store
// their own engine_config (ckpt synth: {"generator": ...}); those need --grad.
bool HasEngineConfig(const nlohmann::json& engine_config);
// The message when it is not: "<dir>: this checkpoint has no engine config: pass --grad ...".
std::string NoEngineConfigMessage(const std::string& tag_dir, const std::string& what);

// Directory holding engine_min: `bin_dir` when non-empty, else $CKPT_BIN_DIR, else the
// directory of /proc/self/exe.
std::string EngineBinDir(const std::string& bin_dir);

// Starts argv (argv[0] looked up in PATH) with stdout and stderr going to log_path (appended,
// or truncated first) and stdin from /dev/null; returns its pid without waiting. NotFound when
// the program cannot be started.
Result<pid_t> SpawnLogged(const std::vector<std::string>& argv, const std::string& log_path,
                          bool append = true);
// SpawnLogged, then waits: the exit status (128 + signal when killed).
Result<int> RunProcess(const std::vector<std::string>& argv, const std::string& log_path);
// The last `max_bytes` of a file, for error messages.
std::string TailOfFile(const std::string& path, size_t max_bytes = 2000);

// `mpirun --allow-run-as-root --oversubscribe -n <ranks> <bin_dir>/engine_min <args...>`.
std::vector<std::string> EngineCommand(const std::string& bin_dir, int ranks,
                                       const std::vector<std::string>& args);

}  // namespace ckpt::verify
