// The ownership lab of seed 001 ("Reduce first, then update the owned slice"), ported line by
// line from its Python: 11 scalar parameters, 4 contiguous owners, 5 plain-Adam updates
// (lr 0.01, no weight decay) in double precision. The fixture generator stores its result and
// the seed-001 test recomputes it to prove the fixture still holds the lab's state.
#pragma once

#include <array>
#include <cmath>
#include <vector>

namespace ckpt::testing {

struct LabState {
  double weight, first, second;
};

inline LabState LabAdamStep(LabState s, double gradient, int step, double lr = 0.01) {
  s.first = 0.9 * s.first + 0.1 * gradient;
  s.second = 0.999 * s.second + 0.001 * gradient * gradient;
  const double corrected_first = s.first / (1 - std::pow(0.9, step));
  const double corrected_second = s.second / (1 - std::pow(0.999, step));
  s.weight -= lr * corrected_first / (std::sqrt(corrected_second) + 1e-8);
  return s;
}

// compare_owned_updates(11, 4, 5): the reference trajectory (the sharded one equals it).
inline std::vector<LabState> OwnershipLab(int parameters = 11, int ranks = 4, int steps = 5) {
  std::vector<LabState> ref;
  for (int i = 0; i < parameters; ++i) ref.push_back({0.1 * i, 0.0, 0.0});
  for (int step = 1; step <= steps; ++step) {
    for (int i = 0; i < parameters; ++i) {
      double sum = 0;
      for (int r = 0; r < ranks; ++r) {
        // Python's % is non-negative here: (i + 2r + step) >= 1.
        sum += static_cast<double>((i + 2 * r + step) % 7 - 3) / 10;
      }
      ref[i] = LabAdamStep(ref[i], sum / ranks, step);
    }
  }
  return ref;
}

}  // namespace ckpt::testing
