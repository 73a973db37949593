// The CPU reference of the next-update pass. Every update goes through ckpt::AdamWElement, so
// path (a) is bitwise what engine_min computed: vector and scalar code give the same bits
// because the rule is IEEE add, multiply, divide and sqrt with contraction off. The reductions
// use independent lanes; their summation order only changes the statistics, never a weight.
#include <algorithm>
#include <cstring>
#include <ctime>
#include <vector>

#include "update_pass_internal.h"
#include "verify/update_pass.h"

namespace ckpt::verify {
namespace {

constexpr size_t kBlock = 512;
constexpr int kLanes = 16;

// Per-block partial sums in float lanes (at most kBlock / kLanes terms each), folded into
// these doubles once per block: the statistics keep ~1e-6 relative accuracy at any size.
struct Accumulator {
  double sum_sq_full = 0, sum_sq_update_full = 0;
  double b_sq = 0, b_upd = 0, c_sq = 0, c_upd = 0;
  double b_max = 0, c_max = 0;
  uint64_t b_differ = 0, c_differ = 0;
};

// One block of k <= kBlock elements: the three updates and the comparison, fused so each
// input is read once. The inner loop over kLanes consecutive elements has no cross-lane
// dependency, so it vectorizes; AVX2 when the CPU has it (target_clones picks at load time).
// Outputs must not alias inputs.
__attribute__((target_clones("avx2", "default"))) void RunBlock(
    const AdamWFactors& fa, const AdamWFactors& fb, const float* __restrict w0,
    const float* __restrict m0, const float* __restrict v0, const float* __restrict g,
    float* __restrict wa, float* __restrict ma, float* __restrict va, float* __restrict wb,
    float* __restrict wc, size_t k, Accumulator& acc) {
  float s_full[kLanes] = {}, s_upd[kLanes] = {}, s_b[kLanes] = {}, s_bu[kLanes] = {};
  float s_c[kLanes] = {}, s_cu[kLanes] = {}, max_b[kLanes] = {}, max_c[kLanes] = {};
  uint32_t n_b[kLanes] = {}, n_c[kLanes] = {};
  auto element = [&](size_t j, int l) {
    const float z = w0[j];
    float a = z, m = m0[j], v = v0[j];
    AdamWElement(fa, a, m, v, g[j]);  // (a) full state
    wa[j] = a;
    ma[j] = m;
    va[j] = v;
    float b = z, mb = 0.0f, vb = 0.0f;
    AdamWElement(fb, b, mb, vb, g[j]);  // (b) weights only: fresh moments, t = 1
    wb[j] = b;
    float c = z, mc = 0.0f, vc = 0.0f;
    AdamWElement(fa, c, mc, vc, g[j]);  // (c) moments dropped, step kept
    wc[j] = c;
    const float ua = a - z, db = b - a, dc = c - a, ub = b - z, uc = c - z;
    s_full[l] += a * a;
    s_upd[l] += ua * ua;
    s_b[l] += db * db;
    s_bu[l] += ub * ub;
    s_c[l] += dc * dc;
    s_cu[l] += uc * uc;
    const float abs_b = db < 0 ? -db : db, abs_c = dc < 0 ? -dc : dc;
    max_b[l] = abs_b > max_b[l] ? abs_b : max_b[l];
    max_c[l] = abs_c > max_c[l] ? abs_c : max_c[l];
    n_b[l] += b != a;
    n_c[l] += c != a;
  };
  size_t i = 0;
  for (; i + kLanes <= k; i += kLanes) {
    for (int l = 0; l < kLanes; ++l) element(i + l, l);
  }
  for (; i < k; ++i) element(i, 0);
  for (int l = 0; l < kLanes; ++l) {
    acc.sum_sq_full += s_full[l];
    acc.sum_sq_update_full += s_upd[l];
    acc.b_sq += s_b[l];
    acc.b_upd += s_bu[l];
    acc.c_sq += s_c[l];
    acc.c_upd += s_cu[l];
    acc.b_max = std::max<double>(acc.b_max, max_b[l]);
    acc.c_max = std::max<double>(acc.c_max, max_c[l]);
    acc.b_differ += n_b[l];
    acc.c_differ += n_c[l];
  }
}

class CpuPass final : public UpdatePass {
 public:
  Device device() const override { return Device::kCpu; }

  Result<PassStats> Run(const PassHyper& hyper, const PassInputs& in,
                        const PassOutputs& out) override {
    const AdamWFactors fa = MakeAdamWFactors(hyper.full);
    const AdamWFactors fb = MakeAdamWFactors(hyper.WeightsOnly());
    Accumulator acc;
    // Outputs the caller does not want land in block-sized scratch.
    alignas(64) float scratch[5][kBlock];
    for (size_t base = 0; base < in.n; base += kBlock) {
      const size_t k = std::min(kBlock, in.n - base);
      auto dst = [&](float* p, int which) { return p ? p + base : scratch[which]; };
      RunBlock(fa, fb, in.w + base, in.m + base, in.v + base, in.g + base, dst(out.w_full, 0),
               dst(out.m_full, 1), dst(out.v_full, 2), dst(out.w_weights_only, 3),
               dst(out.w_moments_dropped, 4), k, acc);
    }
    PassStats s;
    s.n = in.n;
    s.sum_sq_full = acc.sum_sq_full;
    s.sum_sq_update_full = acc.sum_sq_update_full;
    s.weights_only = {acc.b_max, acc.b_sq, acc.b_differ, acc.b_upd};
    s.moments_dropped = {acc.c_max, acc.c_sq, acc.c_differ, acc.c_upd};
    return s;
  }
};

// Thread CPU time: on a shared machine the wall clock of a long pass includes other
// processes' time slices that a short memcpy is likely to dodge; CPU time charges each only
// for the time it ran.
double ThreadSeconds() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

}  // namespace

std::unique_ptr<UpdatePass> MakeCpuPass() { return std::make_unique<CpuPass>(); }

Result<PassBench> BenchCpuPass(uint64_t input_bytes, int reps) {
  const uint64_t n = std::max<uint64_t>(input_bytes / 16, 1024);
  // Inputs in one buffer so the memcpy copies exactly the bytes the pass reads.
  std::vector<float> inputs(4 * n), copy(4 * n);
  std::vector<float> w_full(n), m_full(n), v_full(n), w_b(n), w_c(n);
  for (uint64_t i = 0; i < n; ++i) {
    inputs[i] = 0.01f * static_cast<float>(i % 1000) - 5.0f;         // w
    inputs[n + i] = 1e-3f * static_cast<float>(i % 97) - 0.05f;      // m
    inputs[2 * n + i] = 1e-5f * static_cast<float>(i % 89 + 1);      // v
    inputs[3 * n + i] = 1e-2f * static_cast<float>(i % 101) - 0.5f;  // g
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
    double t0 = ThreadSeconds();
    std::memcpy(copy.data(), inputs.data(), 16 * n);
    b.memcpy_seconds = std::min(b.memcpy_seconds, ThreadSeconds() - t0);
    t0 = ThreadSeconds();
    (void)pass.Run(hyper, in, out);
    b.pass_seconds = std::min(b.pass_seconds, ThreadSeconds() - t0);
  }
  // Keep the copy observable so it is not optimized away.
  if (copy[n / 2] != inputs[n / 2]) return Internal("bench: memcpy check failed");
  return b;
}

}  // namespace ckpt::verify
