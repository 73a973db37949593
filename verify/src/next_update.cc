// ckpt next-update: load the full optimizer state one trainable parameter at a time, get the
// next gradient, run the three-way update pass, stream the optional result files, and compare
// path (a) with the original run's log.
#include "verify/next_update.h"

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <optional>
#include <sstream>

#include "ckpt/deepspeed.h"
#include "ckpt/hash.h"
#include "ckpt/manifest.h"
#include "ckpt/root.h"
#include "ckpt/state_source.h"
#include "ckpt/shape.h"
#include "convert/output_dir.h"
#include "safetensors/safetensors.h"
#include "next_update_split.h"
#include "temp_dir.h"
#include "verify/trainlog.h"

namespace ckpt::verify {
namespace fs = std::filesystem;

PathReport MakePathReport(const PassStats& s, const PathStats& p) {
  PathReport r;
  r.max_abs = p.max_abs;
  const double diff = std::sqrt(p.sum_sq_diff);
  const double norm_full = std::sqrt(s.sum_sq_full);
  const double upd_full = std::sqrt(s.sum_sq_update_full);
  r.rel_l2 = norm_full > 0 ? diff / norm_full : (diff > 0 ? INFINITY : 0.0);
  r.rel_update = upd_full > 0 ? diff / upd_full : (diff > 0 ? INFINITY : 0.0);
  r.n_differ = p.n_differ;
  r.frac_differ = s.n > 0 ? static_cast<double>(p.n_differ) / static_cast<double>(s.n) : 0.0;
  r.update_norm = std::sqrt(p.sum_sq_update);
  r.update_norm_full = upd_full;
  return r;
}

namespace {

// Checks the gradient file against the trainable parameters before anything is computed.
Status CheckGradientFile(const Manifest& m, const std::string& path,
                         const safetensors::SafetensorsHeader& header) {
  std::vector<std::string> problems;
  for (const ParamEntry& p : m.params) {
    if (!p.trainable()) continue;
    const safetensors::SafetensorsTensor* t = header.Find(p.name);
    if (t == nullptr) {
      problems.push_back("missing tensor '" + p.name + "' " + ShapeText(p.shape, ","));
      continue;
    }
    if (t->shape != p.shape) {
      problems.push_back("tensor '" + p.name + "' has shape " + ShapeText(t->shape, ",") +
                         ", the checkpoint's parameter is " + ShapeText(p.shape, ","));
    }
    if (t->dtype != DType::kF32 && t->dtype != DType::kF64 && t->dtype != DType::kBF16 &&
        t->dtype != DType::kF16) {
      problems.push_back("tensor '" + p.name + "' has dtype " +
                         std::string(SafetensorsDTypeName(t->dtype)) + ", expected F32");
    }
  }
  for (const auto& t : header.tensors) {
    const ParamEntry* p = m.FindParam(t.name);
    if (p == nullptr) {
      problems.push_back("tensor '" + t.name + "' is not a parameter of the checkpoint");
    } else if (!p->trainable()) {
      problems.push_back(
          "tensor '" + t.name + "' is a " +
          (p->frozen ? std::string("frozen parameter") : "tied alias of '" + p->tied_to + "'") +
          ", not a trainable one");
    }
  }
  if (problems.empty()) return Status::Ok();
  std::string msg = "gradient file " + path +
                    " does not match the checkpoint's trainable "
                    "parameters: ";
  for (size_t i = 0; i < problems.size() && i < 8; ++i) msg += (i ? "; " : "") + problems[i];
  if (problems.size() > 8) msg += "; and " + std::to_string(problems.size() - 8) + " more";
  return InvalidArgument(msg);
}

// The checkpoint root of a tag directory (engine_min takes --ckpt-dir ROOT --resume-tag TAG).
std::string RootOfTagDir(const std::string& tag_dir) {
  return fs::path(tag_dir).lexically_normal().parent_path().string();
}

Status RunEngineGrad(const NextUpdateOptions& o, const StateSource& source,
                     const std::string& out_file, const std::string& log) {
  const std::string bin_dir = EngineBinDir(o.bin_dir);
  const std::string engine = bin_dir + "/engine_min";
  if (!Env::Default()->Exists(engine)) {
    return NotFound("no gradient file given (--grad) and engine_min not found at " + engine +
                    " (set CKPT_BIN_DIR)");
  }
  const std::string root = RootOfTagDir(source.dir());
  const int ranks = std::max(1, source.manifest().topology.dp_world_size);
  auto cmd =
      EngineCommand(bin_dir, ranks,
                    {"grad", "--ckpt-dir", root, "--resume-tag", source.tag(), "--out", out_file});
  auto rc = RunProcess(cmd, log);
  CKPT_RETURN_IF_ERROR(rc, "engine_min grad");
  if (*rc != 0) {
    return FailedPrecondition("engine_min grad exited with status " + std::to_string(*rc) +
                              "; its output:\n" + TailOfFile(log));
  }
  return Status::Ok();
}

// The pass in this process, one trainable parameter at a time.
Status RunSingleProcess(StateSource& source, const safetensors::SafetensorsHeader& gheader,
                        const std::string& grad_path, const AdamWHyper& hyper, UpdatePass& pass,
                        ResultSinks& sinks, NextUpdateReport& r) {
  const Manifest& m = source.manifest();
  // Range reads cannot check a checksum, so every optimizer-state dataset is verified whole
  // first: a corrupt shard is DataLoss, never a silent replay.
  CKPT_RETURN_IF_ERROR(source.FinishVerification({std::string(kMaster), std::string(kExpAvg),
                                                  std::string(kExpAvgSq)}),
                       "optimizer state of " + source.dir());

  for (const ParamEntry& p : m.params) {
    if (!p.trainable()) continue;
    std::vector<float> w(static_cast<size_t>(p.numel)), mo(w.size()), vo(w.size());
    CKPT_RETURN_IF_ERROR(source.ReadParamRange(p.name, kMaster, 0, p.numel, w.data()));
    CKPT_RETURN_IF_ERROR(source.ReadParamRange(p.name, kExpAvg, 0, p.numel, mo.data()));
    CKPT_RETURN_IF_ERROR(source.ReadParamRange(p.name, kExpAvgSq, 0, p.numel, vo.data()));
    CKPT_ASSIGN_OR_RETURN(std::vector<float> g,
                          safetensors::ReadSafetensorsTensorF32(grad_path, gheader, p.name),
                          "gradient file");
    const size_t n = static_cast<size_t>(p.numel);
    if (w.size() != n || mo.size() != n || vo.size() != n || g.size() != n) {
      return DataLoss(p.name + ": element counts differ between the state and the gradient");
    }
    // 64-byte aligned outputs: the CPU pass streams them out when they are large.
    PassBuffer wa(n), ma(n), va(n), wb, wc;
    PassOutputs out{wa.data(), ma.data(), va.data(), nullptr, nullptr};
    if (sinks.full) {
      wb = PassBuffer(n);
      wc = PassBuffer(n);
      out.w_weights_only = wb.data();
      out.w_moments_dropped = wc.data();
    }
    CKPT_ASSIGN_OR_RETURN(
        PassStats s, pass.Run(PassHyper{hyper}, {w.data(), mo.data(), vo.data(), g.data(), n}, out),
        p.name);
    sinks.weights.Update(wa.data(), n * sizeof(float));
    sinks.exp_avg.Update(ma.data(), n * sizeof(float));
    sinks.exp_avg_sq.Update(va.data(), n * sizeof(float));
    if (sinks.full) {
      CKPT_RETURN_IF_ERROR(sinks.full->Append(wa.data(), n * sizeof(float)),
                           "full_state.safetensors");
      CKPT_RETURN_IF_ERROR(sinks.weights_only->Append(wb.data(), n * sizeof(float)),
                           "weights_only.safetensors");
      CKPT_RETURN_IF_ERROR(sinks.moments_dropped->Append(wc.data(), n * sizeof(float)),
                           "moments_dropped.safetensors");
    }
    r.overall.Merge(s);
    r.tensors.push_back({p.name, p.shape, s});
  }
  return Status::Ok();
}

}  // namespace

namespace {

// The gradient file of the next step: --grad, or for an engine_min checkpoint the one
// `engine_min grad` writes into a scratch directory (kept alive by *scratch).
Result<std::string> ObtainGradient(const NextUpdateOptions& o, const StateSource& source,
                                   NextUpdateReport& r, std::optional<TempDir>& scratch) {
  if (!o.grad_file.empty()) {
    r.grad_source = o.grad_file;
    return o.grad_file;
  }
  if (source.kind() == SourceKind::kDeepSpeed) {
    return FailedPrecondition(o.root +
                              " is a DeepSpeed checkpoint: its next batch is unknown to ckpt, so "
                              "pass the gradient (--grad GRADS.safetensors)");
  }
  if (!HasEngineConfig(source.manifest().engine_config)) {
    return FailedPrecondition(NoEngineConfigMessage(
        r.tag_dir, "its next batch is unknown: pass --grad GRADS.safetensors"));
  }
  CKPT_ASSIGN_OR_RETURN(TempDir t, TempDir::Create("ckpt-next-update"), "scratch directory");
  scratch.emplace(std::move(t));
  const std::string grad_path = scratch->path() + "/grad.safetensors";
  CKPT_RETURN_IF_ERROR(RunEngineGrad(o, source, grad_path, scratch->path() + "/engine.log"),
                       "next gradient");
  r.grad_source = "engine_min grad";
  return grad_path;
}

// Where the pass runs: the device (kAuto resolved) and how many workers (GPUs or processes).
struct PassPlacement {
  Device device = Device::kCpu;
  int workers = 1;
};

Result<PassPlacement> PlacePass(const NextUpdateOptions& o) {
  PassPlacement p;
  p.device = o.device;
  std::string why;
  const int gpus_visible = p.device == Device::kCpu ? 0 : CudaDeviceCount(&why);
  if (p.device == Device::kAuto) p.device = gpus_visible > 0 ? Device::kCuda : Device::kCpu;
  if (p.device == Device::kCuda) {
    if (o.procs > 1) {
      return InvalidArgument("--procs splits the CPU pass; with --device cuda use --gpus");
    }
    // Without a GPU, MakeUpdatePass says why.
    p.workers = gpus_visible == 0 ? 1 : o.gpus > 0 ? o.gpus : gpus_visible;
    if (gpus_visible > 0 && p.workers > gpus_visible) {
      return FailedPrecondition("--gpus " + std::to_string(p.workers) + ": only " +
                                std::to_string(gpus_visible) + " CUDA device(s) visible");
    }
    return p;
  }
  if (o.gpus > 0) {
    return o.device == Device::kCpu
               ? InvalidArgument("--gpus needs --device cuda (or auto with a GPU)")
               : FailedPrecondition("--gpus " + std::to_string(o.gpus) + ": no CUDA device (" +
                                    why + ")");
  }
  p.workers = std::max(o.procs, 1);
  return p;
}

// --out's three result files, streamed one tensor at a time.
Status OpenResultFiles(const NextUpdateOptions& o, const Manifest& m, const std::string& tag_dir,
                       const convert::StagedOutput& out, ResultSinks& sinks) {
  std::vector<safetensors::SafetensorsTensorSpec> specs;
  for (const ParamEntry& p : m.params) {
    if (p.trainable()) specs.push_back({p.name, DType::kF32, p.shape});
  }
  const std::map<std::string, std::string> meta = {{"source", tag_dir},
                                                   {"producer", "ckpt next-update"}};
  auto make = [&](const char* name, const char* path_kind,
                  std::optional<safetensors::SafetensorsWriter>& w) -> Status {
    auto meta2 = meta;
    meta2["path"] = path_kind;
    auto writer = safetensors::SafetensorsWriter::Create(out.staging() + "/" + name, specs, meta2);
    CKPT_RETURN_IF_ERROR(writer, std::string("create ") + name);
    w.emplace(std::move(writer).value());
    return Status::Ok();
  };
  CKPT_RETURN_IF_ERROR(make("full_state.safetensors", "full_state", sinks.full), o.out_dir);
  CKPT_RETURN_IF_ERROR(make("weights_only.safetensors", "weights_only", sinks.weights_only),
                       o.out_dir);
  CKPT_RETURN_IF_ERROR(
      make("moments_dropped.safetensors", "moments_dropped", sinks.moments_dropped), o.out_dir);
  return Status::Ok();
}

// The original run's next weights (r.reference, r.matches_reference): only meaningful when the
// gradient is the run's own (engine_grad) or a --reference log is given.
Status CompareWithRunLog(const NextUpdateOptions& o, const Manifest& m, bool engine_grad,
                         NextUpdateReport& r) {
  const std::string log_path =
      !o.reference.empty() ? o.reference : RootOfTagDir(r.tag_dir) + "/trainlog.jsonl";
  if (!engine_grad && o.reference.empty()) return Status::Ok();
  const int64_t next = m.counters.global_step + 1;
  r.reference = {{"log", log_path}, {"step", next}};
  if (!Env::Default()->Exists(log_path)) {
    if (!o.reference.empty()) return NotFound("reference run log " + log_path + " not found");
    r.reference["note"] = "no run log at " + log_path + "; pass --reference";
    return Status::Ok();
  }
  CKPT_ASSIGN_OR_RETURN(auto log, ReadTrainlog(log_path), "reference");
  auto it = log.find(next);
  if (it == log.end()) {
    r.reference["note"] = "the run log has no entry for step " + std::to_string(next);
    return Status::Ok();
  }
  const TrainlogEntry& e = it->second;
  r.reference["weights_xxh3"] = e.weights_xxh3;
  r.reference["computed_weights_xxh3"] = r.full_weights_xxh3;
  r.reference["weights_match"] = e.weights_xxh3 == r.full_weights_xxh3;
  if (!e.exp_avg_xxh3.empty()) r.reference["exp_avg_match"] = e.exp_avg_xxh3 == r.full_exp_avg_xxh3;
  if (!e.exp_avg_sq_xxh3.empty())
    r.reference["exp_avg_sq_match"] = e.exp_avg_sq_xxh3 == r.full_exp_avg_sq_xxh3;
  if (e.lr != 0) r.reference["logged_lr"] = e.lr;
  r.matches_reference = e.weights_xxh3 == r.full_weights_xxh3;
  return Status::Ok();
}

}  // namespace

// Every kind of checkpoint reads through one StateSource (ckpt/state_source.h): a ckpt
// checkpoint, a universal directory, a DeepSpeed checkpoint (whose next batch is unknown to
// ckpt, so its gradient must be given with --grad).
Result<NextUpdateReport> RunNextUpdate(const NextUpdateOptions& o) {
  NextUpdateReport r;
  // --out: refused when it holds anything, written in a staging directory and published by
  // one rename at the end; on any failure nothing appears (convert/output_dir.h).
  std::optional<convert::StagedOutput> out;
  if (!o.out_dir.empty()) {
    CKPT_ASSIGN_OR_RETURN(convert::StagedOutput staged,
                          convert::StagedOutput::Begin(o.out_dir, Env::Default()), "--out");
    out.emplace(std::move(staged));
  }
  // Every file of the checkpoint is checked as export and reshard check them: a missing or
  // truncated rank file is DataLoss even when the pass reads nothing from it.
  SourceOptions so;
  so.tag = o.tag;
  so.probe_all = true;
  CKPT_ASSIGN_OR_RETURN(std::unique_ptr<StateSource> source, OpenStateSource(o.root, so),
                        "open checkpoint " + o.root);
  const Manifest& m = source->manifest();
  r.tag_dir = source->dir();
  r.tag = source->tag();
  CKPT_ASSIGN_OR_RETURN(r.hyper, source->OptimizerHyper(&r.hyper_source), r.tag_dir);
  if (const DeepSpeedInfo* ds = source->deepspeed()) {
    r.hyper_source += "; DeepSpeed " + ds->ds_version + " checkpoint (optimizer " +
                      ds->optimizer + ")";
  }

  std::optional<TempDir> scratch;
  CKPT_ASSIGN_OR_RETURN(const std::string grad_path, ObtainGradient(o, *source, r, scratch));
  CKPT_ASSIGN_OR_RETURN(safetensors::SafetensorsHeader gheader,
                        safetensors::ReadSafetensorsHeader(grad_path), "gradient file");
  CKPT_RETURN_IF_ERROR(CheckGradientFile(m, grad_path, gheader), "next-update");

  // One process, or one per GPU / per --procs.
  CKPT_ASSIGN_OR_RETURN(const PassPlacement place, PlacePass(o));
  std::unique_ptr<UpdatePass> pass;
  if (place.workers == 1) {
    CKPT_ASSIGN_OR_RETURN(pass, MakeUpdatePass(place.device), "next-update");
  }
  ResultSinks sinks;
  if (out) CKPT_RETURN_IF_ERROR(OpenResultFiles(o, m, r.tag_dir, *out, sinks));
  if (place.workers > 1) {
    r.device = place.device;
    CKPT_RETURN_IF_ERROR(RunSplitPass(o, *source, grad_path, place.device, place.workers, sinks, r),
                         "next-update over " + std::to_string(place.workers) + " processes");
  } else {
    r.device = pass->device();
    if (r.device == Device::kCuda) r.devices = {0};
    CKPT_RETURN_IF_ERROR(RunSingleProcess(*source, gheader, grad_path, r.hyper, *pass, sinks, r),
                         "next-update");
  }
  if (sinks.full) {
    CKPT_RETURN_IF_ERROR(sinks.full->Finish(), "full_state.safetensors");
    CKPT_RETURN_IF_ERROR(sinks.weights_only->Finish(), "weights_only.safetensors");
    CKPT_RETURN_IF_ERROR(sinks.moments_dropped->Finish(), "moments_dropped.safetensors");
  }
  r.full_weights_xxh3 = sinks.weights.HexDigest();
  r.full_exp_avg_xxh3 = sinks.exp_avg.HexDigest();
  r.full_exp_avg_sq_xxh3 = sinks.exp_avg_sq.HexDigest();
  CKPT_RETURN_IF_ERROR(CompareWithRunLog(o, m, /*engine_grad=*/o.grad_file.empty(), r));
  // Last: nothing after publishing can fail.
  if (out) CKPT_RETURN_IF_ERROR(out->Commit(), "publish " + o.out_dir);
  return r;
}

namespace {

nlohmann::json PathJson(const PathReport& p) {
  return {{"max_abs", p.max_abs},
          {"rel_l2", p.rel_l2},
          {"frac_differ", p.frac_differ},
          {"n_differ", p.n_differ},
          {"rel_update", p.rel_update},
          {"update_norm", p.update_norm},
          {"update_norm_full", p.update_norm_full}};
}

}  // namespace

nlohmann::json NextUpdateToJson(const NextUpdateReport& r) {
  nlohmann::json j;
  j["tag"] = r.tag;
  j["tag_dir"] = r.tag_dir;
  j["hyper"] = {{"lr", r.hyper.lr},
                {"beta1", r.hyper.beta1},
                {"beta2", r.hyper.beta2},
                {"eps", r.hyper.eps},
                {"weight_decay", r.hyper.weight_decay},
                {"step", r.hyper.step},
                {"source", r.hyper_source}};
  j["gradient"] = r.grad_source;
  j["elements"] = r.overall.n;
  j["overall"] = {
      {"weights_only", PathJson(MakePathReport(r.overall, r.overall.weights_only))},
      {"moments_dropped", PathJson(MakePathReport(r.overall, r.overall.moments_dropped))},
      {"full_update_norm", std::sqrt(r.overall.sum_sq_update_full)}};
  nlohmann::json tensors = nlohmann::json::array();
  for (const TensorReport& t : r.tensors) {
    tensors.push_back(
        {{"name", t.name},
         {"shape", t.shape},
         {"weights_only", PathJson(MakePathReport(t.stats, t.stats.weights_only))},
         {"moments_dropped", PathJson(MakePathReport(t.stats, t.stats.moments_dropped))},
         {"full_update_norm", std::sqrt(t.stats.sum_sq_update_full)}});
  }
  j["tensors"] = std::move(tensors);
  j["digests"] = {{"weights_xxh3", r.full_weights_xxh3},
                  {"exp_avg_xxh3", r.full_exp_avg_xxh3},
                  {"exp_avg_sq_xxh3", r.full_exp_avg_sq_xxh3}};
  j["matches_reference"] =
      r.matches_reference ? nlohmann::json(*r.matches_reference) : nlohmann::json(nullptr);
  j["reference"] = r.reference;
  j["device"] = std::string(DeviceName(r.device));
  j["processes"] = r.processes;
  j["devices"] = r.devices;
  return j;
}

std::string NextUpdateToText(const NextUpdateReport& r) {
  std::ostringstream os;
  char buf[512];
  os << "checkpoint " << r.tag_dir << "\n";
  std::snprintf(buf, sizeof buf,
                "next update: lr %.9g  betas (%.9g, %.9g)  eps %.3g  weight_decay %.9g  "
                "updates applied %lld (bias correction t=%lld)\n",
                r.hyper.lr, r.hyper.beta1, r.hyper.beta2, r.hyper.eps, r.hyper.weight_decay,
                static_cast<long long>(r.hyper.step), static_cast<long long>(r.hyper.step + 1));
  os << buf << "  (" << r.hyper_source << ")\n";
  os << "gradient: " << r.grad_source << "   device: " << DeviceName(r.device);
  if (r.processes > 1) os << " (" << r.processes << " processes)";
  os << "\n\n";
  std::snprintf(buf, sizeof buf, "%-32s %10s | %-34s | %-34s\n", "", "",
                "weights only (fresh optimizer)", "moments dropped, step kept");
  os << buf;
  std::snprintf(buf, sizeof buf, "%-32s %10s | %11s %11s %10s | %11s %11s %10s\n", "tensor",
                "numel", "max_abs", "rel_l2", "differ", "max_abs", "rel_l2", "differ");
  os << buf;
  auto row = [&](const std::string& name, const PassStats& s) {
    const PathReport b = MakePathReport(s, s.weights_only);
    const PathReport c = MakePathReport(s, s.moments_dropped);
    std::snprintf(buf, sizeof buf, "%-32s %10llu | %11.4e %11.4e %9.2f%% | %11.4e %11.4e %9.2f%%\n",
                  name.substr(0, 32).c_str(), static_cast<unsigned long long>(s.n), b.max_abs,
                  b.rel_l2, 100 * b.frac_differ, c.max_abs, c.rel_l2, 100 * c.frac_differ);
    os << buf;
  };
  for (const TensorReport& t : r.tensors) row(t.name, t.stats);
  row("overall", r.overall);
  const PathReport b = MakePathReport(r.overall, r.overall.weights_only);
  const PathReport c = MakePathReport(r.overall, r.overall.moments_dropped);
  std::snprintf(buf, sizeof buf,
                "\nupdate norms: full state %.6e, weights only %.6e, moments dropped %.6e\n",
                b.update_norm_full, b.update_norm, c.update_norm);
  os << buf;
  if (r.matches_reference) {
    os << "original run's next weights (step " << r.reference.value("step", int64_t{0})
       << "): " << (*r.matches_reference ? "match bitwise" : "DIFFER") << "\n";
  } else if (r.reference.is_object() && r.reference.contains("note")) {
    os << "original run's next weights: not compared (" << r.reference["note"].get<std::string>()
       << ")\n";
  }
  return os.str();
}

}  // namespace ckpt::verify
