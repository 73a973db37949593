// The AdamW update rule that the optimizer state in a checkpoint belongs to. engine_min trains
// with it and verify's CPU reference replays it, so a resumed update is bitwise the one the
// original run would have made. It follows torch.optim.AdamW (decoupled weight decay, bias
// correction) in fp32 arithmetic with a fixed operation order:
//   t      = step + 1                       (step = updates already applied)
//   w     *= 1 - lr * weight_decay
//   m      = m + (1 - beta1) * (g - m)
//   v      = beta2 * v + (1 - beta2) * g * g
//   denom  = sqrt(v) / sqrt(1 - beta2^t) + eps
//   w     -= (lr / (1 - beta1^t)) * m / denom
// The scalar factors are computed in double and rounded to float once.
#pragma once

#include <cstddef>
#include <cstdint>

namespace ckpt {

struct AdamWHyper {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.0;
  int64_t step = 0;  // updates already applied; this update uses t = step + 1
};

// The fp32 scalar factors of one update, shared by every implementation (CPU, CUDA).
struct AdamWFactors {
  float decay;        // 1 - lr * weight_decay
  float one_minus_b1;  // 1 - beta1
  float beta2;
  float one_minus_b2;  // 1 - beta2
  float inv_bc2_sqrt;  // 1 / sqrt(1 - beta2^t)
  float eps;
  float step_size;     // lr / (1 - beta1^t)
};
AdamWFactors MakeAdamWFactors(const AdamWHyper& h);

// One element; inline so every CPU caller produces the same bits.
inline void AdamWElement(const AdamWFactors& f, float& w, float& m, float& v, float g) {
  w = w * f.decay;
  m = m + f.one_minus_b1 * (g - m);
  v = f.beta2 * v + f.one_minus_b2 * (g * g);
  const float denom = __builtin_sqrtf(v) * f.inv_bc2_sqrt + f.eps;
  w = w - f.step_size * (m / denom);
}

// In place over n elements. Not vectorized across a reduction, so results do not depend on n
// or on how the range is split across threads or ranks.
void AdamWUpdate(const AdamWHyper& h, float* w, float* m, float* v, const float* g, size_t n);

}  // namespace ckpt
