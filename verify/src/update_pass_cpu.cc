// The CPU reference of the next-update pass. Path (a) goes through ckpt::AdamWElement, so it
// is bitwise what engine_min computed; paths (b) and (c) repeat the rule's operations with
// shared zero-moment terms (RunBlock). Vector and scalar code give the same bits because the
// rule is IEEE add, multiply, divide and sqrt with contraction off. The reductions
// use independent lanes; their summation order only changes the statistics, never a weight.
#include <unistd.h>

#include <algorithm>
#include <cassert>
#include <cstdint>
#include <cstring>
#include <ctime>
#include <vector>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define CKPT_VERIFY_X86 1
#endif

#include "update_pass_internal.h"
#include "verify/update_pass.h"

namespace ckpt::verify {
namespace {

constexpr size_t kBlock = 512;  // a multiple of kLanes
constexpr int kLanes = 16;

// Per-block partial sums in float lanes (at most kBlock / kLanes terms each), folded into
// these doubles once per block: the statistics keep ~1e-6 relative accuracy at any size.
struct Accumulator {
  double sum_sq_full = 0, sum_sq_update_full = 0;
  double b_sq = 0, b_upd = 0, c_sq = 0, c_upd = 0;
  double b_max = 0, c_max = 0;
  uint64_t b_differ = 0, c_differ = 0;
};

// Streaming (non-temporal) stores. Above the last-level cache an ordinary store first reads
// the destination line (read-for-ownership) only for the line to be evicted unread later: 20
// bytes of extra memory traffic per element on top of the 36 the pass must move (glibc's
// memcpy avoids the same cost for large copies the same way). SSE2's 16-byte streaming store
// exists on every x86-64, so the vectorized clones below all use it; other architectures
// store normally.
#ifdef CKPT_VERIFY_X86
inline void StreamLine(float* dst, const float* src) {  // 16 floats; dst 64-byte aligned
  for (int q = 0; q < 16; q += 4) _mm_stream_ps(dst + q, _mm_load_ps(src + q));
}
inline void StreamFence() { _mm_sfence(); }
constexpr bool kCanStream = true;
#else
inline void StreamLine(float* dst, const float* src) { std::memcpy(dst, src, 16 * sizeof(float)); }
inline void StreamFence() {}
constexpr bool kCanStream = false;
#endif

// Outputs larger than half of this core's share of the last-level cache are streamed: they
// would not stay in the cache anyway (the pass also streams its inputs through it). glibc
// sizes its non-temporal memcpy threshold the same way (3/4 of the per-thread share).
// sysconf reports 0 when it does not know; 8 MiB of cache then.
size_t StreamThresholdBytes() {
  static const size_t threshold = [] {
    const long llc = sysconf(_SC_LEVEL3_CACHE_SIZE);
    const long cores = sysconf(_SC_NPROCESSORS_ONLN);
    const size_t share = (llc > 0 ? static_cast<size_t>(llc) : size_t{8} << 20) /
                         static_cast<size_t>(cores > 0 ? cores : 1);
    return share / 2;
  }();
  return threshold;
}

// The five output arrays of one block; nullptr: not wanted.
struct BlockOutputs {
  float* wa;
  float* ma;
  float* va;
  float* wb;
  float* wc;
};

// One block of k <= kBlock elements: the three updates and the comparison, fused so each
// input is read once. The inner loop over kLanes consecutive elements has no cross-lane
// dependency, so it vectorizes (AVX-512 or AVX2 when the CPU has them: target_clones picks at
// load time); each group's results go to a 64-byte stack line per output and from there to
// the output with plain stores or, with `stream` (outputs 64-byte aligned), streaming stores
// of whole lines, so the streaming stores spread evenly over the computation. Outputs must not
// alias inputs.
//
// Paths (b) and (c) both start from zero moments, and the moment updates and sqrt(v) of the
// rule do not depend on the step (MakeAdamWFactors: only inv_bc2_sqrt and step_size do), so
// they are computed once for both: the same IEEE operations on the same operands in the same
// order as ckpt::AdamWElement, hence the same bits (update_pass_test checks it against
// ckpt::AdamWUpdate) with one square root and one decay multiply fewer per element.
__attribute__((target_clones("avx512f", "avx2", "default"))) void RunBlock(
    const AdamWFactors& fa, const AdamWFactors& fb, const float* __restrict w0,
    const float* __restrict m0, const float* __restrict v0, const float* __restrict g,
    const BlockOutputs& out, bool stream, size_t k, Accumulator& acc) {
  float s_full[kLanes] = {}, s_upd[kLanes] = {}, s_b[kLanes] = {}, s_bu[kLanes] = {};
  float s_c[kLanes] = {}, s_cu[kLanes] = {}, max_b[kLanes] = {}, max_c[kLanes] = {};
  uint32_t n_b[kLanes] = {}, n_c[kLanes] = {};
  // Each group's results, one 64-byte line per output.
  alignas(64) float res[5][kLanes];
  // Copies, so the compiler knows they do not change under the output stores.
  const AdamWFactors a_f = fa, b_f = fb;
  float* const dst[5] = {out.wa, out.ma, out.va, out.wb, out.wc};
  // Element j into result slot t, statistics lane l.
  auto element = [&](size_t j, int t, int l) __attribute__((always_inline)) {
    const float z = w0[j], gj = g[j];
    float a = z, m = m0[j], v = v0[j];
    AdamWElement(a_f, a, m, v, gj);  // (a) full state
    // (b) weights only (fresh moments, t = 1) and (c) moments dropped (step kept):
    // AdamWElement with m = v = 0, sharing everything but the step-dependent factors.
    const float zero = 0.0f;
    const float decayed = z * a_f.decay;
    const float m0z = zero + a_f.one_minus_b1 * (gj - zero);
    const float v0z = a_f.beta2 * zero + a_f.one_minus_b2 * (gj * gj);
    const float root = __builtin_sqrtf(v0z);
    const float b = decayed - b_f.step_size * (m0z / (root * b_f.inv_bc2_sqrt + b_f.eps));
    const float c = decayed - a_f.step_size * (m0z / (root * a_f.inv_bc2_sqrt + a_f.eps));
    res[0][t] = a;
    res[1][t] = m;
    res[2][t] = v;
    res[3][t] = b;
    res[4][t] = c;
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
    for (int l = 0; l < kLanes; ++l) element(i + l, l, l);
    for (int o = 0; o < 5; ++o) {
      if (dst[o] == nullptr) continue;
      if (stream) {
        StreamLine(dst[o] + i, res[o]);
      } else {
        for (int l = 0; l < kLanes; ++l) dst[o][i + l] = res[o][l];
      }
    }
  }
  // The partial last group of the tensor.
  const int rest = static_cast<int>(k - i);
  for (int t = 0; t < rest; ++t) element(i + t, t, 0);
  for (int o = 0; o < 5; ++o) {
    if (dst[o] == nullptr) continue;
    for (int t = 0; t < rest; ++t) dst[o][i + t] = res[o][t];
  }
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
  explicit CpuPass(uint64_t stream_threshold_bytes)
      : stream_threshold_bytes_(stream_threshold_bytes) {}
  Device device() const override { return Device::kCpu; }

  Result<PassStats> Run(const PassHyper& hyper, const PassInputs& in,
                        const PassOutputs& out) override {
    const AdamWFactors fa = MakeAdamWFactors(hyper.full);
    const AdamWFactors fb = MakeAdamWFactors(hyper.WeightsOnly());
    // RunBlock's shared zero-moment terms rely on this: only the step differs.
    assert(fa.decay == fb.decay && fa.one_minus_b1 == fb.one_minus_b1 && fa.beta2 == fb.beta2 &&
           fa.one_minus_b2 == fb.one_minus_b2 && fa.eps == fb.eps);
    Accumulator acc;
    float* const dsts[5] = {out.w_full, out.m_full, out.v_full, out.w_weights_only,
                            out.w_moments_dropped};
    // Streaming pays only for whole cache lines: a line written in two halves holds its
    // write-combining buffer open, and five outputs exhaust them. So every output must be
    // 64-byte aligned (the CLI and the bench allocate them so); kBlock and kLanes keep every
    // group on a line. Which stores are used never changes the blocks, groups or lanes, so
    // neither the outputs nor the statistics depend on it.
    size_t out_bytes = 0;
    bool aligned = true;
    for (float* p : dsts) {
      if (p == nullptr) continue;
      out_bytes += in.n * sizeof(float);
      aligned = aligned && reinterpret_cast<uintptr_t>(p) % 64 == 0;
    }
    const bool stream = kCanStream && aligned && out_bytes > stream_threshold_bytes_;
    for (size_t base = 0; base < in.n; base += kBlock) {
      auto at = [&](float* p) { return p ? p + base : nullptr; };
      const BlockOutputs o{at(out.w_full), at(out.m_full), at(out.v_full), at(out.w_weights_only),
                           at(out.w_moments_dropped)};
      RunBlock(fa, fb, in.w + base, in.m + base, in.v + base, in.g + base, o, stream,
               std::min(kBlock, in.n - base), acc);
    }
    // Streaming stores are weakly ordered: make them visible before anyone reads the outputs.
    if (stream) StreamFence();
    PassStats s;
    s.n = in.n;
    s.sum_sq_full = acc.sum_sq_full;
    s.sum_sq_update_full = acc.sum_sq_update_full;
    s.weights_only = {acc.b_max, acc.b_sq, acc.b_differ, acc.b_upd};
    s.moments_dropped = {acc.c_max, acc.c_sq, acc.c_differ, acc.c_upd};
    return s;
  }

 private:
  uint64_t stream_threshold_bytes_;
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

std::unique_ptr<UpdatePass> MakeCpuPass() {
  return std::make_unique<CpuPass>(StreamThresholdBytes());
}
std::unique_ptr<UpdatePass> MakeCpuPass(uint64_t stream_threshold_bytes) {
  return std::make_unique<CpuPass>(stream_threshold_bytes);
}

Result<PassBench> BenchCpuPass(uint64_t input_bytes, int reps) {
  const uint64_t n = std::max<uint64_t>(input_bytes / 16, 1024);
  // Inputs in one buffer so the memcpy copies exactly the bytes the pass reads.
  std::vector<float> inputs(4 * n), copy(4 * n);
  PassBuffer w_full(n), m_full(n), v_full(n), w_b(n), w_c(n);
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
  CpuPass pass(StreamThresholdBytes());
  PassBench b;
  b.device = Device::kCpu;
  b.elements = n;
  b.memcpy_bytes = 16 * n;
  b.pass_bytes_moved = 16 * n + 20 * n;
  b.outputs = 5;
  b.stream_threshold_bytes = StreamThresholdBytes();
  b.streaming_stores = kCanStream && 20 * n > b.stream_threshold_bytes;  // PassBuffers: aligned
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
