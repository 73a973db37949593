// The hyper-parameters of the next update (docs/verify.md, "The hyper-parameters"), read from
// the manifest and rank 0's scheduler state; shared by the single-process pass and the workers
// of a split run.
#include "next_update_hyper.h"

#include "ckpt/manifest.h"

namespace ckpt::verify {

namespace {

double JsonNumber(const nlohmann::json& j, const char* key, double fallback, bool* found) {
  if (j.is_object() && j.contains(key) && j[key].is_number()) {
    if (found) *found = true;
    return j[key].get<double>();
  }
  return fallback;
}

}  // namespace

// The hyper-parameters of the next update. engine_min records the optimizer's settings and
// its update count in manifest.optimizer and the rate of the next update in rank 0's
// `scheduler` dataset; other writers may only have manifest.optimizer.
Result<AdamWHyper> ResolveHyper(const CheckpointReader& reader, std::string* source) {
  const Manifest& m = reader.manifest();
  const nlohmann::json& opt = m.optimizer;
  AdamWHyper h;
  if (opt.is_object() && opt.contains("type") && opt["type"].is_string()) {
    const std::string type = opt["type"].get<std::string>();
    if (type != "adamw" && type != "adam") {
      return Unimplemented("optimizer type '" + type +
                           "' in manifest.json: next-update replays "
                           "AdamW only");
    }
  }
  // A DeepSpeed source whose optimizer groups differ records them all as an array
  // (docs/deepspeed.md); one replay with one set of hyper-parameters would be wrong for some
  // parameters. (ckpt.torch records only the number of groups there.)
  if (opt.is_object() && opt.contains("param_groups") && opt["param_groups"].is_array())
    return Unimplemented("optimizer groups with different hyper-parameters: next-update replays "
                         "one AdamW setting");
  bool have_lr = false;
  h.lr = JsonNumber(opt, "lr", h.lr, &have_lr);
  if (opt.contains("betas") && opt["betas"].is_array() && opt["betas"].size() == 2) {
    h.beta1 = opt["betas"][0].get<double>();
    h.beta2 = opt["betas"][1].get<double>();
  }
  h.beta1 = JsonNumber(opt, "beta1", h.beta1, nullptr);
  h.beta2 = JsonNumber(opt, "beta2", h.beta2, nullptr);
  h.eps = JsonNumber(opt, "eps", h.eps, nullptr);
  h.weight_decay = JsonNumber(opt, "weight_decay", h.weight_decay, nullptr);
  std::string lr_from = have_lr ? "manifest optimizer.lr" : "default lr";
  bool have_step = false;
  h.step = static_cast<int64_t>(JsonNumber(opt, "step", -1, &have_step));
  std::string step_from = "manifest optimizer.step";
  if (!have_step || h.step < 0) {
    h.step = m.counters.global_step - m.counters.skipped_steps;
    step_from = "counters.global_step - skipped_steps";
  }
  if (m.FindDataset(0, kScheduler) != nullptr) {
    auto sched = reader.ReadJson(0, kScheduler);
    CKPT_RETURN_IF_ERROR(sched, "rank 0 scheduler state");
    for (const char* key : {"next_lr", "lr"}) {
      bool found = false;
      const double lr = JsonNumber(*sched, key, 0, &found);
      if (found) {
        h.lr = lr;
        lr_from = std::string("scheduler.") + key;
        break;
      }
    }
    for (const char* key : {"optimizer_step", "step"}) {
      bool found = false;
      const double step = JsonNumber(*sched, key, 0, &found);
      if (found && !have_step) {
        h.step = static_cast<int64_t>(step);
        step_from = std::string("scheduler.") + key;
        break;
      }
    }
  }
  if (!(h.lr >= 0) || !(h.beta1 >= 0 && h.beta1 < 1) || !(h.beta2 >= 0 && h.beta2 < 1) ||
      !(h.eps > 0) || h.step < 0) {
    return DataLoss("optimizer hyper-parameters in manifest.json are out of range");
  }
  if (source) *source = "lr: " + lr_from + "; step: " + step_from;
  return h;
}

}  // namespace ckpt::verify
