// ckpt verify-resume. Each run (the plain resume and one per ablation) gets its own scratch
// root holding hard links to the checkpoint's files, so engine_min can save there and apply
// its retention without touching the original. The plain run saves its final state, which is
// the reference the ablations' weight gaps are measured against.
#include "verify/resume.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <sstream>

#include "ckpt/manifest.h"
#include "ckpt/reader.h"
#include "ckpt/root.h"
#include "convert/reshard.h"
#include "convert/universal.h"
#include "temp_dir.h"
#include "verify/trainlog.h"

namespace ckpt::verify {
namespace fs = std::filesystem;

const std::vector<std::string>& AblationComponents() {
  static const std::vector<std::string> kComponents = {"moments", "step", "rng", "data",
                                                       "scheduler"};
  return kComponents;
}

Result<std::vector<std::string>> ParseAblate(const std::string& text) {
  if (text.empty() || text == "none") return std::vector<std::string>{};
  if (text == "all") return AblationComponents();
  std::vector<std::string> out;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) {
    const auto& all = AblationComponents();
    if (std::find(all.begin(), all.end(), item) == all.end()) {
      return InvalidArgument("--ablate: unknown component '" + item +
                             "' (none, moments, step, rng, data, scheduler, all)");
    }
    if (std::find(out.begin(), out.end(), item) == out.end()) out.push_back(item);
  }
  return out;
}

namespace {

// Links (or, across file systems, copies) every file of the tag into run_root/<tag>/ and
// points run_root/latest at it. The directory, the listing and `latest` go through Env; a
// hard link (Env has none) and its copy fallback do not.
Status StageCheckpoint(const std::string& tag_dir, const std::string& tag,
                       const std::string& run_root) {
  Env* env = Env::Default();
  const std::string dst = run_root + "/" + tag;
  CKPT_RETURN_IF_ERROR(env->CreateDirs(dst));
  CKPT_ASSIGN_OR_RETURN(std::vector<DirEntry> entries, env->ListDir(tag_dir));
  for (const DirEntry& entry : entries) {
    if (entry.is_dir) continue;
    const fs::path from = fs::path(tag_dir) / entry.name;
    const fs::path target = fs::path(dst) / entry.name;
    std::error_code ec;
    fs::create_hard_link(from, target, ec);
    if (ec) {
      ec.clear();
      fs::copy_file(from, target, ec);
      if (ec) return IOError("copy " + from.string() + ": " + ec.message());
    }
  }
  return WriteFileAtomic(env, run_root + "/latest", tag + "\n");
}

// --dp M: the checkpoint converted once to the universal layout, then resharded for M ranks
// into each run's root (a normal root holding the tag, as `ckpt reshard` writes it).
class ReshardedSource {
 public:
  static Result<ReshardedSource> Create(const std::string& tag_dir, const std::string& scratch,
                                        int dp) {
    ReshardedSource r(scratch + "/universal", dp);
    CKPT_RETURN_IF_ERROR(convert::ConvertToUniversal(tag_dir, r.universal_).status(),
                         "to-universal " + tag_dir);
    return r;
  }
  Status StageRun(const std::string& run_root) const {
    convert::ReshardOptions opts;
    opts.dp = dp_;
    return convert::Reshard(universal_, run_root, opts)
        .status()
        .WithContext("reshard to " + std::to_string(dp_) + " ranks");
  }

 private:
  ReshardedSource(std::string universal, int dp) : universal_(std::move(universal)), dp_(dp) {}
  std::string universal_;
  int dp_;
};

struct StateGap {
  double master = 0, exp_avg = 0, exp_avg_sq = 0;
};

Result<double> MaxAbsGap(const CheckpointReader& a, const CheckpointReader& b,
                         std::string_view state) {
  double gap = 0;
  for (const ParamEntry& p : a.manifest().params) {
    if (!p.trainable()) continue;
    const ParamEntry* q = b.manifest().FindParam(p.name);
    if (q == nullptr || q->shape != p.shape) {
      return FailedPrecondition("parameter " + p.name + " differs between " + a.dir() + " and " +
                                b.dir());
    }
    CKPT_ASSIGN_OR_RETURN(std::vector<float> x, a.ReadParamFull(p.name, state), a.dir());
    CKPT_ASSIGN_OR_RETURN(std::vector<float> y, b.ReadParamFull(p.name, state), b.dir());
    for (size_t i = 0; i < x.size(); ++i) {
      const double d = std::fabs(static_cast<double>(x[i]) - static_cast<double>(y[i]));
      if (!(d <= gap)) gap = std::isnan(d) ? INFINITY : d;
    }
  }
  return gap;
}

Result<StateGap> CompareStates(const std::string& dir_a, const std::string& dir_b) {
  CKPT_ASSIGN_OR_RETURN(CheckpointReader a, CheckpointReader::Open(dir_a), "open " + dir_a);
  CKPT_ASSIGN_OR_RETURN(CheckpointReader b, CheckpointReader::Open(dir_b), "open " + dir_b);
  StateGap g;
  CKPT_ASSIGN_OR_RETURN(g.master, MaxAbsGap(a, b, kMaster), "compare master weights");
  CKPT_ASSIGN_OR_RETURN(g.exp_avg, MaxAbsGap(a, b, kExpAvg), "compare exp_avg");
  CKPT_ASSIGN_OR_RETURN(g.exp_avg_sq, MaxAbsGap(a, b, kExpAvgSq), "compare exp_avg_sq");
  return g;
}

// The i-th update after the resume in `run` against step from+i of `ref`, i = 1..k; the first
// quantity that differs. Positions, not step numbers: a run whose step counter was reset
// (--ablate step) logs its first update as step 1. `run_first` is the first logged step that
// belongs to the resumed run.
std::optional<Divergence> CompareLogs(const std::map<int64_t, TrainlogEntry>& ref,
                                      const std::map<int64_t, TrainlogEntry>& run,
                                      int64_t run_first, int64_t from, int64_t k,
                                      int64_t* compared) {
  *compared = 0;
  auto it = run.lower_bound(run_first);
  for (int64_t s = from + 1; s <= from + k; ++s, ++it) {
    const TrainlogEntry& e = ref.at(s);
    if (it == run.end()) {
      return Divergence{s, "missing", std::nullopt,
                        "the resumed run logged only " + std::to_string(*compared) + " step(s)"};
    }
    const TrainlogEntry& r = it->second;
    ++*compared;
    auto num = [&](const char* q, double a, double b) -> std::optional<Divergence> {
      if (a == b || (std::isnan(a) && std::isnan(b))) return std::nullopt;
      char buf[160];
      std::snprintf(buf, sizeof buf, "original %.9g, resumed %.9g", a, b);
      return Divergence{s, q, std::fabs(a - b), buf};
    };
    auto dig = [&](const char* q, const std::string& a,
                   const std::string& b) -> std::optional<Divergence> {
      if (a == b || a.empty()) return std::nullopt;
      return Divergence{s, q, std::nullopt, "original " + a + ", resumed " + b};
    };
    if (auto d = num("loss", e.loss, r.loss)) return d;
    if (auto d = num("grad_norm", e.grad_norm, r.grad_norm)) return d;
    if (e.lr != 0 || r.lr != 0) {
      if (auto d = num("lr", e.lr, r.lr)) return d;
    }
    if (auto d = dig("weights_xxh3", e.weights_xxh3, r.weights_xxh3)) return d;
    if (auto d = dig("exp_avg_xxh3", e.exp_avg_xxh3, r.exp_avg_xxh3)) return d;
    if (auto d = dig("exp_avg_sq_xxh3", e.exp_avg_sq_xxh3, r.exp_avg_sq_xxh3)) return d;
  }
  return std::nullopt;
}

std::string ShellQuote(const std::string& s) {
  std::string out = "'";
  for (char c : s) {
    if (c == '\'') out += "'\\''";
    else out += c;
  }
  return out + "'";
}

struct RunSpec {
  std::string name;       // "plain" or the component
  std::string component;  // empty for the plain run
};

}  // namespace

namespace {

// Logged steps that follow `step` without a gap.
int64_t LoggedStepsAfter(const std::map<int64_t, TrainlogEntry>& log, int64_t step) {
  int64_t n = 0;
  while (log.count(step + n + 1)) ++n;
  return n;
}

}  // namespace

Result<TagChoice> ChooseTagToVerify(const std::string& root, const std::string& tag,
                                    const std::string& reference, int64_t steps) {
  if (!tag.empty() || Env::Default()->Exists(root + "/" + std::string(kManifestFile))) {
    CKPT_ASSIGN_OR_RETURN(std::string dir, ResolveTagDir(root, tag), "open checkpoint " + root);
    return TagChoice{dir, ""};
  }
  const std::string log_path = reference.empty() ? root + "/trainlog.jsonl" : reference;
  auto log = ReadTrainlog(log_path);
  if (!log.ok() && log.status().code() == StatusCode::kNotFound) {
    CKPT_ASSIGN_OR_RETURN(std::string dir, ResolveTagDir(root), "open checkpoint " + root);
    return TagChoice{dir, ""};
  }
  CKPT_RETURN_IF_ERROR(log.status(), "reference");
  CKPT_ASSIGN_OR_RETURN(RootListing listing, ListRoot(root), "open checkpoint " + root);
  const int64_t log_end = log->empty() ? -1 : log->rbegin()->first;
  std::string workable;
  for (auto t = listing.tags.rbegin(); t != listing.tags.rend(); ++t) {
    if (!t->error.empty()) continue;
    const int64_t after = LoggedStepsAfter(*log, t->global_step);
    if (after >= steps) {
      std::string note = "tag " + t->tag + " (default: the newest tag with at least " +
                         std::to_string(steps) + " logged step(s) after it in " + log_path;
      for (const TagInfo& l : listing.tags) {
        if (l.latest && !t->latest) {
          note += "; latest, " + l.tag + ", is followed by " +
                  std::to_string(LoggedStepsAfter(*log, l.global_step)) + "; --tag chooses";
        }
      }
      return TagChoice{t->path, note + ")"};
    }
    if (after > 0) {
      workable += (workable.empty() ? "" : ", ") + t->tag + " (--steps <= " +
                  std::to_string(after) + ")";
    }
  }
  if (listing.tags.empty()) return NotFound(root + " holds no committed checkpoint");
  return FailedPrecondition(
      "no tag of " + root + " is followed by " + std::to_string(steps) + " logged step(s) in " +
      log_path + " (it ends at step " + std::to_string(log_end) + "): " +
      (workable.empty() ? "no tag has a logged step after it; train past a saved tag first"
                        : "tags that would work: " + workable));
}

std::string ExpandLaunchTemplate(const std::string& launch, int world, const std::string& root,
                                 const std::string& tag, int64_t until,
                                 const std::string& trainlog,
                                 const std::vector<std::string>& extra) {
  std::string extra_text;
  for (const auto& e : extra) extra_text += (extra_text.empty() ? "" : " ") + ShellQuote(e);
  const std::vector<std::pair<std::string, std::string>> values = {
      {"{world}", std::to_string(world)}, {"{root}", ShellQuote(root)},
      {"{tag}", ShellQuote(tag)},         {"{until}", std::to_string(until)},
      {"{trainlog}", ShellQuote(trainlog)}, {"{extra}", extra_text}};
  std::string out;
  for (size_t i = 0; i < launch.size();) {
    bool replaced = false;
    for (const auto& [key, value] : values) {
      if (launch.compare(i, key.size(), key) == 0) {
        out += value;
        i += key.size();
        replaced = true;
        break;
      }
    }
    if (!replaced) out += launch[i++];
  }
  if (launch.find("{extra}") == std::string::npos && !extra_text.empty()) out += " " + extra_text;
  return out;
}

namespace {

// engine_min would find a corrupt file too, but as a failed launch (exit 2); corruption is a
// finding (DataLoss, exit 1), reported before anything runs.
Status CheckNotCorrupt(const std::string& tag_dir) {
  CKPT_ASSIGN_OR_RETURN(std::vector<Problem> problems, CheckCheckpoint(tag_dir, /*deep=*/true),
                        "check " + tag_dir);
  if (problems.empty()) return Status::Ok();
  const Problem& p = problems.front();
  return DataLoss(tag_dir + " is corrupt (" + std::to_string(problems.size()) +
                  " problem(s); ckpt check --deep lists them): " + p.file +
                  (p.dataset.empty() ? "" : " " + p.dataset) + ": " + p.what);
}

// The reference log must hold every step the resumed runs are compared on.
Status CheckReferenceCovers(const std::map<int64_t, TrainlogEntry>& ref_log,
                            const std::string& reference, int64_t from_step, int64_t steps) {
  for (int64_t s = from_step + 1; s <= from_step + steps; ++s) {
    if (ref_log.count(s)) continue;
    int64_t last = ref_log.empty() ? -1 : ref_log.rbegin()->first;
    const std::string advice =
        last > from_step
            ? "choose --steps <= " + std::to_string(last - from_step)
            : "the original run did not continue past this checkpoint; pick an earlier --tag";
    return FailedPrecondition("reference run log " + reference + " has no entry for step " +
                              std::to_string(s) + " (it ends at step " + std::to_string(last) +
                              "): " + advice);
  }
  return Status::Ok();
}

// What every resumed run shares.
struct ResumeContext {
  const ResumeOptions& o;
  const ResumeReport& rep;
  const std::map<int64_t, TrainlogEntry>& ref_log;
  const std::optional<ReshardedSource>& resharded;
  std::string tag;        // the checkpoint's tag
  std::string orig_root;  // the original run's root
  std::string bin_dir;
  std::string scratch;
  bool launch = false;  // --launch: the user's command instead of engine_min
};

// The command that resumes `run` into run_root (engine_min, or the --launch template); *what
// names it in messages.
std::vector<std::string> ResumeCommand(const ResumeContext& ctx, const RunSpec& run,
                                       const std::string& run_root, int64_t run_target,
                                       bool final_save, std::string* what) {
  const std::string log = run_root + "/trainlog.jsonl";
  if (ctx.launch) {
    std::vector<std::string> extra;
    if (!run.component.empty()) extra = {"--reset-on-resume", run.component};
    if (!final_save) extra.push_back("--no-final-save");
    *what = "--launch command";
    return {"/bin/sh", "-c",
            ExpandLaunchTemplate(ctx.o.launch, ctx.rep.ranks, run_root, ctx.tag, run_target, log,
                                 extra)};
  }
  std::vector<std::string> args = {
      "train",        "--ckpt-dir", run_root,     "--resume",
      "--resume-tag", ctx.tag,      "--steps",    std::to_string(run_target),
      "--save-every", "0",          "--trainlog", log};
  if (!final_save) args.push_back("--no-final-save");
  if (!run.component.empty()) {
    args.push_back("--reset-on-resume");
    args.push_back(run.component);
  }
  *what = "engine_min train";
  return EngineCommand(ctx.bin_dir, ctx.rep.ranks, args);
}

// Stages the checkpoint for `run`, resumes it and compares its run log with the reference and
// its final state with `plain_final` (ablations) or with the original run's checkpoint at the
// target step (the plain run, when the original saved one).
Result<RunOutcome> ResumeOnce(const ResumeContext& ctx, const RunSpec& run,
                              const std::string& plain_final) {
  const int64_t from_step = ctx.rep.from_step;
  const int64_t target = from_step + ctx.o.steps;
  const std::string run_root = ctx.scratch + "/" + run.name;
  CKPT_RETURN_IF_ERROR(ctx.resharded ? ctx.resharded->StageRun(run_root)
                                     : StageCheckpoint(ctx.rep.tag_dir, ctx.tag, run_root),
                       "stage " + run.name + " run");
  // A reset step counter starts the run at 0: it runs K steps to global_step K. Its final
  // save would collide with the staged tag when K equals the checkpoint's step; then it
  // does not save (and has no weight gap).
  const bool restarts_step = run.component == "step";
  const int64_t run_target = restarts_step ? ctx.o.steps : target;
  const bool final_save = run_target != from_step;
  std::string what;
  const std::vector<std::string> argv =
      ResumeCommand(ctx, run, run_root, run_target, final_save, &what);
  const std::string engine_log = run_root + "/engine.log";
  auto rc = RunProcess(argv, engine_log);
  CKPT_RETURN_IF_ERROR(rc, what + " (" + run.name + ")");
  if (*rc != 0) {
    return FailedPrecondition(what + " (" + run.name + " resume) exited with status " +
                              std::to_string(*rc) + ": " + argv.back() + "\nits output:\n" +
                              TailOfFile(engine_log));
  }
  CKPT_ASSIGN_OR_RETURN(auto run_log, ReadTrainlog(run_root + "/trainlog.jsonl"),
                        run.name + " run log");
  RunOutcome out;
  out.first = CompareLogs(ctx.ref_log, run_log, restarts_step ? 1 : from_step + 1, from_step,
                          ctx.o.steps, &out.steps_compared);
  auto final_dir = ResolveTagDir(run_root);
  if (final_save && final_dir.ok() && fs::path(*final_dir).filename() != ctx.tag) {
    out.final_tag_dir = *final_dir;
  }
  std::string against = plain_final;
  if (run.component.empty()) {
    // The original run's own checkpoint at the target step, when it saved one.
    auto listing = ListRoot(ctx.orig_root);
    if (listing.ok()) {
      for (const TagInfo& t : listing->tags) {
        if (t.global_step == target && t.error.empty()) against = t.path;
      }
    }
  }
  if (!against.empty() && !out.final_tag_dir.empty()) {
    CKPT_ASSIGN_OR_RETURN(StateGap g, CompareStates(against, out.final_tag_dir),
                          run.name + " final state");
    out.max_weight_gap = g.master;
    out.max_exp_avg_gap = g.exp_avg;
    out.max_exp_avg_sq_gap = g.exp_avg_sq;
    if (out.first && !out.first->gap) {
      if (out.first->quantity == "weights_xxh3") out.first->gap = g.master;
      if (out.first->quantity == "exp_avg_xxh3") out.first->gap = g.exp_avg;
      if (out.first->quantity == "exp_avg_sq_xxh3") out.first->gap = g.exp_avg_sq;
    }
  }
  return out;
}

// An ablation's outcome with the notes that explain an empty one.
AblationResult AblationOf(const std::string& component, RunOutcome out) {
  AblationResult a;
  a.component = component;
  if (!out.first) {
    a.note = "no effect on this run: resetting " + component +
             " leaves every logged quantity bitwise equal";
    if (component == "rng") a.note += " (e.g. dropout is off)";
  }
  if (!out.max_weight_gap) {
    a.note += std::string(a.note.empty() ? "" : "; ") +
              "weight gap not measured: the run ends at the checkpoint's own step, so it "
              "does not save";
  }
  a.outcome = std::move(out);
  return a;
}

}  // namespace

Result<ResumeReport> RunVerifyResume(const ResumeOptions& o) {
  if (o.steps < 1) return InvalidArgument("--steps must be at least 1");
  ResumeReport rep;
  CKPT_ASSIGN_OR_RETURN(TagChoice choice,
                        ChooseTagToVerify(o.root, o.tag, o.reference, o.steps), "verify-resume");
  rep.tag_note = choice.note;
  CKPT_ASSIGN_OR_RETURN(CheckpointReader reader, CheckpointReader::Open(choice.tag_dir),
                        "open checkpoint " + o.root);
  const Manifest& m = reader.manifest();
  rep.tag_dir = reader.dir();
  rep.from_step = m.counters.global_step;
  if (!o.checked) CKPT_RETURN_IF_ERROR(CheckNotCorrupt(rep.tag_dir));
  rep.steps = o.steps;
  rep.source_ranks = std::max(1, m.topology.dp_world_size);
  if (o.dp < 0) return InvalidArgument("--dp must be at least 1");
  rep.ranks = o.dp > 0 ? o.dp : rep.source_ranks;
  rep.zero_stage = m.topology.zero_stage;
  const bool launch = !o.launch.empty();
  if (!HasEngineConfig(m.engine_config) && !launch) {
    return FailedPrecondition(NoEngineConfigMessage(
        rep.tag_dir, "there is no engine to relaunch: verify-resume needs an engine_min "
                     "checkpoint, or --launch with the command that resumes your trainer"));
  }
  const std::string orig_root = fs::path(rep.tag_dir).lexically_normal().parent_path().string();
  rep.reference = o.reference.empty() ? orig_root + "/trainlog.jsonl" : o.reference;
  CKPT_ASSIGN_OR_RETURN(auto ref_log, ReadTrainlog(rep.reference), "reference");
  CKPT_RETURN_IF_ERROR(CheckReferenceCovers(ref_log, rep.reference, rep.from_step, o.steps));
  const std::string bin_dir = EngineBinDir(o.bin_dir);
  if (!launch && !Env::Default()->Exists(bin_dir + "/engine_min")) {
    return NotFound("engine_min not found at " + bin_dir + "/engine_min (set CKPT_BIN_DIR)");
  }
  CKPT_ASSIGN_OR_RETURN(TempDir scratch,
                        o.scratch.empty() ? TempDir::Create("ckpt-verify-resume", o.keep_scratch)
                                          : TempDir::At(o.scratch),
                        "scratch directory");
  std::optional<ReshardedSource> resharded;
  if (o.dp > 0) {
    CKPT_ASSIGN_OR_RETURN(resharded, ReshardedSource::Create(rep.tag_dir, scratch.path(), o.dp),
                          "--dp " + std::to_string(o.dp));
  }

  const ResumeContext ctx{o,         rep,     ref_log,        resharded, reader.tag(),
                          orig_root, bin_dir, scratch.path(), launch};
  CKPT_ASSIGN_OR_RETURN(rep.plain, ResumeOnce(ctx, {"plain", ""}, ""));
  for (const auto& c : o.ablate) {
    CKPT_ASSIGN_OR_RETURN(RunOutcome out,
                          ResumeOnce(ctx, {"ablate-" + c, c}, rep.plain.final_tag_dir));
    rep.ablations.push_back(AblationOf(c, std::move(out)));
  }
  return rep;
}

namespace {

nlohmann::json OptNumber(const std::optional<double>& v) {
  return v ? nlohmann::json(*v) : nlohmann::json(nullptr);
}

nlohmann::json DivergenceJson(const std::optional<Divergence>& d) {
  if (!d) return nullptr;
  return {{"step", d->step},
          {"quantity", d->quantity},
          {"gap", OptNumber(d->gap)},
          {"detail", d->detail}};
}

}  // namespace

nlohmann::json ResumeToJson(const ResumeReport& r) {
  nlohmann::json j;
  j["verdict"] = r.bitwise() ? "bitwise" : "diverged";
  j["steps"] = r.steps;
  j["first_divergence"] = DivergenceJson(r.plain.first);
  j["from_step"] = r.from_step;
  j["checkpoint"] = r.tag_dir;
  if (!r.tag_note.empty()) j["tag_note"] = r.tag_note;
  j["reference"] = r.reference;
  j["ranks"] = r.ranks;
  j["source_ranks"] = r.source_ranks;
  j["zero_stage"] = r.zero_stage;
  j["steps_compared"] = r.plain.steps_compared;
  j["max_weight_gap"] = OptNumber(r.plain.max_weight_gap);
  nlohmann::json abl = nlohmann::json::array();
  for (const AblationResult& a : r.ablations) {
    const auto& f = a.outcome.first;
    nlohmann::json x = {{"component", a.component},
                        {"matters", f.has_value()},
                        {"diverges_at_step", f ? nlohmann::json(f->step) : nlohmann::json(nullptr)},
                        // null when not measured (no final state to compare).
                        {"max_weight_gap", OptNumber(a.outcome.max_weight_gap)},
                        {"first_divergence", DivergenceJson(f)},
                        {"max_exp_avg_gap", OptNumber(a.outcome.max_exp_avg_gap)},
                        {"max_exp_avg_sq_gap", OptNumber(a.outcome.max_exp_avg_sq_gap)}};
    if (!a.note.empty()) x["note"] = a.note;
    abl.push_back(std::move(x));
  }
  j["ablations"] = std::move(abl);
  return j;
}

std::string ResumeToText(const ResumeReport& r) {
  std::ostringstream os;
  char buf[512];
  if (!r.tag_note.empty()) os << r.tag_note << "\n";
  os << "resumed " << r.tag_dir << " (global_step " << r.from_step << ", " << r.ranks
     << " ranks, ZeRO-" << r.zero_stage;
  if (r.ranks != r.source_ranks) {
    os << "; saved by " << r.source_ranks << " ranks, resharded";
  }
  os << ") for " << r.steps << " step(s); reference " << r.reference << "\n";
  if (r.bitwise()) {
    os << "verdict: bitwise (loss, grad_norm, weights and moment digests equal at every step)\n";
  } else {
    const Divergence& d = *r.plain.first;
    os << "verdict: diverged at step " << d.step << " in " << d.quantity;
    if (d.gap) {
      std::snprintf(buf, sizeof buf, " (gap %.6g)", *d.gap);
      os << buf;
    }
    os << ": " << d.detail << "\n";
  }
  if (!r.ablations.empty()) {
    std::snprintf(buf, sizeof buf, "\n%-10s | %-18s | %-16s | %s\n", "component",
                  "diverges at step", "in", "max weight gap after K steps");
    os << buf;
    for (const AblationResult& a : r.ablations) {
      const auto& f = a.outcome.first;
      const std::string at = f ? std::to_string(f->step) : "never (no effect)";
      std::string gap = a.outcome.max_weight_gap
                            ? (std::snprintf(buf, sizeof buf, "%.6g", *a.outcome.max_weight_gap),
                               std::string(buf))
                            : std::string("n/a");
      std::snprintf(buf, sizeof buf, "%-10s | %-18s | %-16s | %s\n", a.component.c_str(),
                    at.c_str(), f ? f->quantity.c_str() : "-", gap.c_str());
      os << buf;
    }
  }
  return os.str();
}

}  // namespace ckpt::verify
