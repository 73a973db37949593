// Learning-rate schedule: linear warmup to the peak, then a cosine decay to min_lr at
// decay_steps. Its state (scheduler steps taken, the decay horizon) is saved in each rank
// file's `scheduler` dataset so a resumed run continues the same curve.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>

#include "ckpt/status.h"

namespace engine_min {

class WarmupCosine {
 public:
  WarmupCosine() = default;
  WarmupCosine(double base_lr, double min_lr, int64_t warmup_steps, int64_t decay_steps)
      : base_lr_(base_lr), min_lr_(min_lr), warmup_(warmup_steps), decay_steps_(decay_steps) {}

  // Rate of the update after `step` scheduler steps: warmup (step + 1) / warmup × base, then
  // min + (base - min) × (1 + cos(pi × progress)) / 2, progress clamped to [0, 1].
  double LrAt(int64_t step) const;
  double CurrentLr() const { return LrAt(step_); }
  void Advance() { ++step_; }

  int64_t step() const { return step_; }
  void set_step(int64_t s) { step_ = s; }
  int64_t decay_steps() const { return decay_steps_; }

  nlohmann::json ToJson() const;
  // Restores step and decay horizon; the rates come from the run's configuration.
  ckpt::Status RestoreFrom(const nlohmann::json& j);

 private:
  double base_lr_ = 1e-3;
  double min_lr_ = 0;
  int64_t warmup_ = 0;
  int64_t decay_steps_ = 1;
  int64_t step_ = 0;
};

}  // namespace engine_min
