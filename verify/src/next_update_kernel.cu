// The next-update kernel. Each element goes through AdamWElementDevice, which repeats
// ckpt::AdamWElement's operation order with explicit round-to-nearest intrinsics (no FMA
// contraction, IEEE division and square root), so a GPU result has the CPU reference's bits.
#include <algorithm>

#include "next_update_kernel.cuh"

namespace ckpt::verify {
namespace {

constexpr int kThreads = 256;

__device__ __forceinline__ void AdamWElementDevice(const AdamWFactors& f, float& w, float& m,
                                                   float& v, float g) {
  w = __fmul_rn(w, f.decay);
  m = __fadd_rn(m, __fmul_rn(f.one_minus_b1, __fsub_rn(g, m)));
  v = __fadd_rn(__fmul_rn(f.beta2, v), __fmul_rn(f.one_minus_b2, __fmul_rn(g, g)));
  const float denom = __fadd_rn(__fmul_rn(__fsqrt_rn(v), f.inv_bc2_sqrt), f.eps);
  w = __fsub_rn(w, __fmul_rn(f.step_size, __fdiv_rn(m, denom)));
}

struct ThreadStats {
  double sum_sq_full = 0, sum_sq_update_full = 0;
  double b_sq = 0, b_upd = 0, c_sq = 0, c_upd = 0;
  double b_max = 0, c_max = 0;
  unsigned long long b_differ = 0, c_differ = 0;
};

struct ElementOut {
  float wa, ma, va, wb, wc;
};

__device__ __forceinline__ ElementOut Element(const AdamWFactors& fa, const AdamWFactors& fb,
                                              float w0, float m0, float v0, float g,
                                              ThreadStats& s) {
  ElementOut o;
  o.wa = w0;
  o.ma = m0;
  o.va = v0;
  AdamWElementDevice(fa, o.wa, o.ma, o.va, g);
  float mb = 0.f, vb = 0.f;
  o.wb = w0;
  AdamWElementDevice(fb, o.wb, mb, vb, g);
  float mc = 0.f, vc = 0.f;
  o.wc = w0;
  AdamWElementDevice(fa, o.wc, mc, vc, g);
  const double da = o.wa, d0 = w0;
  const double db = double(o.wb) - da, dc = double(o.wc) - da;
  const double ua = da - d0, ub = double(o.wb) - d0, uc = double(o.wc) - d0;
  s.sum_sq_full += da * da;
  s.sum_sq_update_full += ua * ua;
  s.b_sq += db * db;
  s.c_sq += dc * dc;
  s.b_upd += ub * ub;
  s.c_upd += uc * uc;
  s.b_max = fmax(s.b_max, fabs(db));
  s.c_max = fmax(s.c_max, fabs(dc));
  s.b_differ += o.wb != o.wa;
  s.c_differ += o.wc != o.wa;
  return o;
}

__device__ __forceinline__ double WarpSum(double x) {
  for (int o = 16; o > 0; o >>= 1) x += __shfl_down_sync(0xffffffffu, x, o);
  return x;
}
__device__ __forceinline__ double WarpMax(double x) {
  for (int o = 16; o > 0; o >>= 1) x = fmax(x, __shfl_down_sync(0xffffffffu, x, o));
  return x;
}
__device__ __forceinline__ unsigned long long WarpSumU(unsigned long long x) {
  for (int o = 16; o > 0; o >>= 1) x += __shfl_down_sync(0xffffffffu, x, o);
  return x;
}

__global__ void NextUpdateKernel(AdamWFactors fa, AdamWFactors fb, DevicePassArgs a,
                                 DeviceStats* out) {
  ThreadStats s;
  const size_t stride = size_t(gridDim.x) * blockDim.x;
  const size_t tid = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const size_t n4 = a.n / 4;
  const float4* w4 = reinterpret_cast<const float4*>(a.w);
  const float4* m4 = reinterpret_cast<const float4*>(a.m);
  const float4* v4 = reinterpret_cast<const float4*>(a.v);
  const float4* g4 = reinterpret_cast<const float4*>(a.g);
  for (size_t i = tid; i < n4; i += stride) {
    const float4 w = w4[i], m = m4[i], v = v4[i], g = g4[i];
    const ElementOut e0 = Element(fa, fb, w.x, m.x, v.x, g.x, s);
    const ElementOut e1 = Element(fa, fb, w.y, m.y, v.y, g.y, s);
    const ElementOut e2 = Element(fa, fb, w.z, m.z, v.z, g.z, s);
    const ElementOut e3 = Element(fa, fb, w.w, m.w, v.w, g.w, s);
    if (a.w_full) reinterpret_cast<float4*>(a.w_full)[i] = make_float4(e0.wa, e1.wa, e2.wa, e3.wa);
    if (a.m_full) reinterpret_cast<float4*>(a.m_full)[i] = make_float4(e0.ma, e1.ma, e2.ma, e3.ma);
    if (a.v_full) reinterpret_cast<float4*>(a.v_full)[i] = make_float4(e0.va, e1.va, e2.va, e3.va);
    if (a.w_weights_only)
      reinterpret_cast<float4*>(a.w_weights_only)[i] = make_float4(e0.wb, e1.wb, e2.wb, e3.wb);
    if (a.w_moments_dropped)
      reinterpret_cast<float4*>(a.w_moments_dropped)[i] = make_float4(e0.wc, e1.wc, e2.wc, e3.wc);
  }
  for (size_t i = 4 * n4 + tid; i < a.n; i += stride) {
    const ElementOut e = Element(fa, fb, a.w[i], a.m[i], a.v[i], a.g[i], s);
    if (a.w_full) a.w_full[i] = e.wa;
    if (a.m_full) a.m_full[i] = e.ma;
    if (a.v_full) a.v_full[i] = e.va;
    if (a.w_weights_only) a.w_weights_only[i] = e.wb;
    if (a.w_moments_dropped) a.w_moments_dropped[i] = e.wc;
  }

  // Block reduction: warp shuffles, then one warp over the per-warp partials.
  __shared__ double sh_d[8][kThreads / 32];
  __shared__ unsigned long long sh_u[2][kThreads / 32];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  double d[8] = {s.sum_sq_full, s.sum_sq_update_full, s.b_sq, s.b_upd, s.c_sq, s.c_upd, s.b_max,
                 s.c_max};
  unsigned long long u[2] = {s.b_differ, s.c_differ};
  for (int k = 0; k < 6; ++k) d[k] = WarpSum(d[k]);
  d[6] = WarpMax(d[6]);
  d[7] = WarpMax(d[7]);
  u[0] = WarpSumU(u[0]);
  u[1] = WarpSumU(u[1]);
  if (lane == 0) {
    for (int k = 0; k < 8; ++k) sh_d[k][warp] = d[k];
    sh_u[0][warp] = u[0];
    sh_u[1][warp] = u[1];
  }
  __syncthreads();
  if (warp == 0) {
    const bool live = lane < kThreads / 32;
    for (int k = 0; k < 8; ++k) d[k] = live ? sh_d[k][lane] : 0.0;
    u[0] = live ? sh_u[0][lane] : 0ull;
    u[1] = live ? sh_u[1][lane] : 0ull;
    for (int k = 0; k < 6; ++k) d[k] = WarpSum(d[k]);
    d[6] = WarpMax(d[6]);
    d[7] = WarpMax(d[7]);
    u[0] = WarpSumU(u[0]);
    u[1] = WarpSumU(u[1]);
    if (lane == 0) {
      atomicAdd(&out->sum_sq_full, d[0]);
      atomicAdd(&out->sum_sq_update_full, d[1]);
      atomicAdd(&out->b_sq, d[2]);
      atomicAdd(&out->b_upd, d[3]);
      atomicAdd(&out->c_sq, d[4]);
      atomicAdd(&out->c_upd, d[5]);
      atomicMax(&out->b_max_bits, static_cast<unsigned long long>(__double_as_longlong(d[6])));
      atomicMax(&out->c_max_bits, static_cast<unsigned long long>(__double_as_longlong(d[7])));
      atomicAdd(&out->b_differ, u[0]);
      atomicAdd(&out->c_differ, u[1]);
    }
  }
}

}  // namespace

cudaError_t LaunchNextUpdate(const AdamWFactors& fa, const AdamWFactors& fb,
                             const DevicePassArgs& args, DeviceStats* stats, cudaStream_t stream) {
  cudaError_t err = cudaMemsetAsync(stats, 0, sizeof(DeviceStats), stream);
  if (err != cudaSuccess) return err;
  if (args.n == 0) return cudaSuccess;
  int device = 0, sms = 0;
  if ((err = cudaGetDevice(&device)) != cudaSuccess) return err;
  if ((err = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device)) != cudaSuccess)
    return err;
  const size_t work = (args.n + 3) / 4;
  const size_t blocks = std::min<size_t>((work + kThreads - 1) / kThreads, size_t(sms) * 8);
  NextUpdateKernel<<<static_cast<unsigned>(std::max<size_t>(blocks, 1)), kThreads, 0, stream>>>(
      fa, fb, args, stats);
  return cudaGetLastError();
}

}  // namespace ckpt::verify
