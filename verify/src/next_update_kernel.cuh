// The next-update kernel family: one pass over w, m, v, g (float4 loads) that applies the
// AdamW rule three ways (full state, weights only, moments dropped; verify/update_pass.h) and
// reduces the comparison statistics into a DeviceStats with one atomic per block and field.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

#include "ckpt/adamw.h"

namespace ckpt::verify {

// Reduced on the device. Max values are non-negative doubles compared by their bit patterns.
struct DeviceStats {
  double sum_sq_full;
  double sum_sq_update_full;
  double b_sq, b_upd, c_sq, c_upd;
  unsigned long long b_max_bits, c_max_bits;
  unsigned long long b_differ, c_differ;
};

// Device pointers; inputs must be 16-byte aligned for the float4 path (cudaMalloc'd buffers
// are), outputs may be nullptr (not written).
struct DevicePassArgs {
  const float* w;
  const float* m;
  const float* v;
  const float* g;
  float* w_full;
  float* m_full;
  float* v_full;
  float* w_weights_only;
  float* w_moments_dropped;
  size_t n;
};

// Zeroes *stats and enqueues the pass on `stream`. `fa` is paths (a) and (c), `fb` path (b).
// Returns the launch error (cudaSuccess when enqueued).
cudaError_t LaunchNextUpdate(const AdamWFactors& fa, const AdamWFactors& fb,
                             const DevicePassArgs& args, DeviceStats* stats, cudaStream_t stream);

}  // namespace ckpt::verify
