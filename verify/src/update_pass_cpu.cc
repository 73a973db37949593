// The CPU reference of the next-update pass. Every update goes through ckpt::AdamWElement, so
// path (a) is bitwise what engine_min computed. The tensor is processed in blocks that stay in
// L1: first the three updates (vectorizable loops with no reduction, so vector and scalar
// code give the same bits: the rule is IEEE add, multiply, divide and sqrt with contraction
// off), then the reductions over the block with independent lanes (their summation order only
// changes the statistics, never a weight).
#include <algorithm>
#include <chrono>
#include <cstring>
#include <vector>

#include "update_pass_internal.h"
#include "verify/update_pass.h"

namespace ckpt::verify {
namespace {

constexpr size_t kBlock = 512;
constexpr int kLanes = 8;

struct Lanes {
  double sum_sq_full[kLanes] = {};
  double sum_sq_update_full[kLanes] = {};
  double b_max[kLanes] = {}, b_sq[kLanes] = {}, b_upd[kLanes] = {};
  double c_max[kLanes] = {}, c_sq[kLanes] = {}, c_upd[kLanes] = {};
  uint64_t b_differ[kLanes] = {}, c_differ[kLanes] = {};
};

inline void Accumulate(Lanes& a, int l, float w0, float wa, float wb, float wc) {
  const double da = static_cast<double>(wa);
  const double ua = da - static_cast<double>(w0);
  const double db = static_cast<double>(wb) - da;
  const double dc = static_cast<double>(wc) - da;
  const double ub = static_cast<double>(wb) - static_cast<double>(w0);
  const double uc = static_cast<double>(wc) - static_cast<double>(w0);
  a.sum_sq_full[l] += da * da;
  a.sum_sq_update_full[l] += ua * ua;
  const double abs_b = db < 0 ? -db : db;
  const double abs_c = dc < 0 ? -dc : dc;
  a.b_max[l] = abs_b > a.b_max[l] ? abs_b : a.b_max[l];
  a.c_max[l] = abs_c > a.c_max[l] ? abs_c : a.c_max[l];
  a.b_sq[l] += db * db;
  a.c_sq[l] += dc * dc;
  a.b_upd[l] += ub * ub;
  a.c_upd[l] += uc * uc;
  a.b_differ[l] += wb != wa;
  a.c_differ[l] += wc != wa;
}

class CpuPass final : public UpdatePass {
 public:
  Device device() const override { return Device::kCpu; }

  Result<PassStats> Run(const PassHyper& hyper, const PassInputs& in,
                        const PassOutputs& out) override {
    const AdamWFactors fa = MakeAdamWFactors(hyper.full);
    const AdamWFactors fb = MakeAdamWFactors(hyper.WeightsOnly());
    Lanes lanes;
    alignas(64) float wa[kBlock], ma[kBlock], va[kBlock], wb[kBlock], wc[kBlock];
    for (size_t base = 0; base < in.n; base += kBlock) {
      const size_t k = std::min(kBlock, in.n - base);
      const float* w0 = in.w + base;
      const float* g = in.g + base;
      std::memcpy(wa, w0, k * sizeof(float));
      std::memcpy(ma, in.m + base, k * sizeof(float));
      std::memcpy(va, in.v + base, k * sizeof(float));
      for (size_t i = 0; i < k; ++i) AdamWElement(fa, wa[i], ma[i], va[i], g[i]);
      for (size_t i = 0; i < k; ++i) {
        float w = w0[i], m = 0.0f, v = 0.0f;
        AdamWElement(fb, w, m, v, g[i]);
        wb[i] = w;
      }
      for (size_t i = 0; i < k; ++i) {
        float w = w0[i], m = 0.0f, v = 0.0f;
        AdamWElement(fa, w, m, v, g[i]);
        wc[i] = w;
      }
      size_t i = 0;
      for (; i + kLanes <= k; i += kLanes) {
        for (int l = 0; l < kLanes; ++l) Accumulate(lanes, l, w0[i + l], wa[i + l], wb[i + l], wc[i + l]);
      }
      for (; i < k; ++i) Accumulate(lanes, 0, w0[i], wa[i], wb[i], wc[i]);
      if (out.w_full) std::memcpy(out.w_full + base, wa, k * sizeof(float));
      if (out.m_full) std::memcpy(out.m_full + base, ma, k * sizeof(float));
      if (out.v_full) std::memcpy(out.v_full + base, va, k * sizeof(float));
      if (out.w_weights_only) std::memcpy(out.w_weights_only + base, wb, k * sizeof(float));
      if (out.w_moments_dropped) std::memcpy(out.w_moments_dropped + base, wc, k * sizeof(float));
    }
    PassStats s;
    s.n = in.n;
    for (int l = 0; l < kLanes; ++l) {
      s.sum_sq_full += lanes.sum_sq_full[l];
      s.sum_sq_update_full += lanes.sum_sq_update_full[l];
      s.weights_only.max_abs = std::max(s.weights_only.max_abs, lanes.b_max[l]);
      s.weights_only.sum_sq_diff += lanes.b_sq[l];
      s.weights_only.sum_sq_update += lanes.b_upd[l];
      s.weights_only.n_differ += lanes.b_differ[l];
      s.moments_dropped.max_abs = std::max(s.moments_dropped.max_abs, lanes.c_max[l]);
      s.moments_dropped.sum_sq_diff += lanes.c_sq[l];
      s.moments_dropped.sum_sq_update += lanes.c_upd[l];
      s.moments_dropped.n_differ += lanes.c_differ[l];
    }
    return s;
  }
};

double SecondsSince(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

std::unique_ptr<UpdatePass> MakeCpuPass() { return std::make_unique<CpuPass>(); }

Result<PassBench> BenchCpuPass(uint64_t input_bytes, int reps) {
  const uint64_t n = std::max<uint64_t>(input_bytes / 16, 1024);
  // Inputs in one buffer so the memcpy copies exactly the bytes the pass reads.
  std::vector<float> inputs(4 * n), copy(4 * n);
  std::vector<float> w_full(n), m_full(n), v_full(n), w_b(n), w_c(n);
  for (uint64_t i = 0; i < n; ++i) {
    inputs[i] = 0.01f * static_cast<float>(i % 1000) - 5.0f;             // w
    inputs[n + i] = 1e-3f * static_cast<float>(i % 97) - 0.05f;          // m
    inputs[2 * n + i] = 1e-5f * static_cast<float>(i % 89 + 1);          // v
    inputs[3 * n + i] = 1e-2f * static_cast<float>(i % 101) - 0.5f;      // g
  }
  PassInputs in{inputs.data(), inputs.data() + n, inputs.data() + 2 * n, inputs.data() + 3 * n, n};
  PassOutputs out{w_full.data(), m_full.data(), v_full.data(), w_b.data(), w_c.data()};
  PassHyper hyper;
  hyper.full.lr = 1e-3;
  hyper.full.weight_decay = 0.1;
  hyper.full.step = 100;
  CpuPass pass;
  PassBench b;
  b.device = Device::kCpu;
  b.elements = n;
  b.memcpy_bytes = 16 * n;
  b.pass_bytes_moved = 16 * n + 20 * n;
  b.pass_seconds = 1e30;
  b.memcpy_seconds = 1e30;
  // Warm both (page faults on the outputs and the copy target happen here).
  std::memcpy(copy.data(), inputs.data(), 16 * n);
  (void)pass.Run(hyper, in, out);
  for (int r = 0; r < std::max(reps, 1); ++r) {
    auto t0 = std::chrono::steady_clock::now();
    std::memcpy(copy.data(), inputs.data(), 16 * n);
    b.memcpy_seconds = std::min(b.memcpy_seconds, SecondsSince(t0));
    t0 = std::chrono::steady_clock::now();
    (void)pass.Run(hyper, in, out);
    b.pass_seconds = std::min(b.pass_seconds, SecondsSince(t0));
  }
  // Keep the copy observable so it is not optimized away.
  if (copy[n / 2] != inputs[n / 2]) return Internal("bench: memcpy check failed");
  return b;
}

}  // namespace ckpt::verify
