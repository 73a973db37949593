#include "ckpt/adamw.h"

#include <cmath>

namespace ckpt {

AdamWFactors MakeAdamWFactors(const AdamWHyper& h) {
  const double t = static_cast<double>(h.step + 1);
  const double bc1 = 1.0 - std::pow(h.beta1, t);
  const double bc2 = 1.0 - std::pow(h.beta2, t);
  AdamWFactors f;
  f.decay = static_cast<float>(1.0 - h.lr * h.weight_decay);
  f.one_minus_b1 = static_cast<float>(1.0 - h.beta1);
  f.beta2 = static_cast<float>(h.beta2);
  f.one_minus_b2 = static_cast<float>(1.0 - h.beta2);
  f.inv_bc2_sqrt = static_cast<float>(1.0 / std::sqrt(bc2));
  f.eps = static_cast<float>(h.eps);
  f.step_size = static_cast<float>(h.lr / bc1);
  return f;
}

void AdamWUpdate(const AdamWHyper& h, float* w, float* m, float* v, const float* g, size_t n) {
  const AdamWFactors f = MakeAdamWFactors(h);
  for (size_t i = 0; i < n; ++i) AdamWElement(f, w[i], m[i], v[i], g[i]);
}

}  // namespace ckpt
