// `ckpt verify-resume`: resumes engine_min from a checkpoint in fresh processes, with the
// checkpoint's topology, on a scratch copy (hard links) so the original is never touched, and
// compares every step of the new run log with the original run's. Ablations resume with one
// component reset to its fresh-start value (engine_min --reset-on-resume) and report whether
// and where the trajectory leaves the original one.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "ckpt/status.h"

namespace ckpt::verify {

// The components --ablate accepts, in table order.
const std::vector<std::string>& AblationComponents();
// "none" -> {}, "all" -> every component, "moments,step" -> those; InvalidArgument otherwise.
Result<std::vector<std::string>> ParseAblate(const std::string& text);

// The checkpoint a verification runs on. An explicit tag, or a tag directory, is taken as
// given. Without one, the newest committed tag of `root` whose step the run log (`reference`,
// default ROOT/trainlog.jsonl) continues for at least `steps` logged steps: `latest` is
// usually the end of the run, which no log continues. A root without a run log (not written by
// engine_min) resolves to `latest`. FailedPrecondition naming the tags that would work (and the
// --steps each allows) when no tag qualifies.
struct TagChoice {
  std::string tag_dir;
  std::string note;  // non-empty when chosen by default: which tag and why, for the output
};
Result<TagChoice> ChooseTagToVerify(const std::string& root, const std::string& tag,
                                    const std::string& reference, int64_t steps);

struct ResumeOptions {
  std::string root;
  std::string tag;
  int64_t steps = 1;                // K optimizer steps after the checkpoint
  std::string reference;            // empty: ROOT/trainlog.jsonl
  std::vector<std::string> ablate;  // components to reset, one run each
  std::string bin_dir;              // empty: EngineBinDir("")
  std::string scratch;              // empty: a temporary directory, removed afterwards
  bool keep_scratch = false;
  bool checked = false;  // the caller has deep-checked the checkpoint (ckpt verify)
  // > 0: resume on this many ranks instead of the checkpoint's, through `ckpt to-universal`
  // + `ckpt reshard --dp` of the checkpoint (into the scratch directory). The grad-accum split
  // is derived by engine_min from the kept global batch.
  int dp = 0;
  // Non-empty: relaunch the user's trainer instead of engine_min (any writer, no engine_config
  // needed). A shell command template (run with /bin/sh -c from the current directory) whose
  // placeholders are replaced by shell-quoted values: {world} the checkpoint's data-parallel
  // size, {root} the scratch root holding the staged checkpoint (the trainer resumes from it and
  // may save there), {tag} the tag to resume, {until} the total step count to stop at,
  // {trainlog} the run log the trainer appends to (default when absent from the template:
  // {root}/trainlog.jsonl), {extra} the flags verify-resume adds (`--reset-on-resume C` for an
  // ablation, `--no-final-save` when the run ends at the checkpoint's own step), appended to the
  // command when the template has no {extra}. The contract is the run log
  // (docs/architecture.md): one entry per optimizer step.
  std::string launch;
};

// The command of one --launch run: the template with its placeholders replaced (see above).
std::string ExpandLaunchTemplate(const std::string& launch, int world, const std::string& root,
                                 const std::string& tag, int64_t until,
                                 const std::string& trainlog, const std::vector<std::string>& extra);

struct Divergence {
  int64_t step = 0;
  std::string
      quantity;  // loss | grad_norm | lr | weights_xxh3 | exp_avg_xxh3 | exp_avg_sq_xxh3 | missing
  std::optional<double> gap;  // |difference| for numbers; for digests the max element gap
                              // of that tensor set after the last step, when measurable
  std::string detail;
};

struct RunOutcome {
  std::optional<Divergence> first;
  int64_t steps_compared = 0;
  // Max |difference| of the master weights after the last step, against the plain resume
  // (ablations) or against the original run's checkpoint at that step (plain, when it exists).
  std::optional<double> max_weight_gap;
  std::optional<double> max_exp_avg_gap;
  std::optional<double> max_exp_avg_sq_gap;
  std::string final_tag_dir;
};

struct AblationResult {
  std::string component;
  RunOutcome outcome;
  std::string note;
};

struct ResumeReport {
  std::string tag_dir;
  std::string tag_note;  // TagChoice::note
  int64_t from_step = 0;
  int64_t steps = 0;
  int ranks = 1;         // ranks of the resumed runs
  int source_ranks = 1;  // ranks that wrote the checkpoint (differs from `ranks` with --dp)
  int zero_stage = 0;
  std::string reference;
  RunOutcome plain;
  std::vector<AblationResult> ablations;
  bool bitwise() const { return !plain.first.has_value(); }
};

// Without a tag, runs on ChooseTagToVerify's choice. The checkpoint is checked (sizes, file
// checksums) before engine_min is launched. NotFound: checkpoint, reference log or engine_min
// missing. FailedPrecondition: not an engine_min checkpoint and
// no launch template, the log does not cover the K
// steps, or engine_min failed (its output is in the message). DataLoss: a corrupt checkpoint
// (exit 1) or an unreadable log.
Result<ResumeReport> RunVerifyResume(const ResumeOptions& options);

// `--json` contract (issue 5): {"verdict", "steps", "first_divergence", "ablations": [...]}.
nlohmann::json ResumeToJson(const ResumeReport& r);
std::string ResumeToText(const ResumeReport& r);

}  // namespace ckpt::verify
