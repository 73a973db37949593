#include "engine_min/schedule.h"

#include <algorithm>
#include <cmath>

namespace engine_min {

double WarmupCosine::LrAt(int64_t step) const {
  if (warmup_ > 0 && step < warmup_) {
    return base_lr_ * static_cast<double>(step + 1) / static_cast<double>(warmup_);
  }
  const int64_t span = std::max<int64_t>(1, decay_steps_ - warmup_);
  const double progress =
      std::clamp(static_cast<double>(step - warmup_) / static_cast<double>(span), 0.0, 1.0);
  return min_lr_ + (base_lr_ - min_lr_) * 0.5 * (1.0 + std::cos(M_PI * progress));
}

nlohmann::json WarmupCosine::ToJson() const {
  return {{"type", "warmup_cosine"},     {"step", step_},       {"warmup_steps", warmup_},
          {"decay_steps", decay_steps_}, {"base_lr", base_lr_}, {"min_lr", min_lr_},
          {"next_lr", CurrentLr()}};
}

ckpt::Status WarmupCosine::RestoreFrom(const nlohmann::json& j) {
  if (!j.is_object() || j.value("type", "") != "warmup_cosine" || !j.contains("step") ||
      !j["step"].is_number_integer() || !j.contains("decay_steps") ||
      !j["decay_steps"].is_number_integer()) {
    return ckpt::DataLoss("scheduler state is not a warmup_cosine {step, decay_steps} object");
  }
  step_ = j["step"].get<int64_t>();
  decay_steps_ = j["decay_steps"].get<int64_t>();
  if (step_ < 0) return ckpt::DataLoss("scheduler step is negative");
  return ckpt::Status::Ok();
}

}  // namespace engine_min
