// The next-update pass: one sweep over a tensor's master weights w, Adam moments m and v and
// the next gradient g that applies the AdamW rule (ckpt/adamw.h) three ways and compares them:
//   (a) full state      w, m, v, step           -> w_full (+ m, v after the update)
//   (b) weights only    w, 0, 0, step restarted -> w_weights_only   (a fresh optimizer: t = 1)
//   (c) moments dropped w, 0, 0, step kept      -> w_moments_dropped (seed 001's comparison)
// and reduces, for (b) and (c) against (a), the max absolute difference, the squared L2 of the
// difference, the number of elements that differ and the squared update norms.
//
// Two implementations behind one interface: the CPU reference (calls ckpt::AdamWElement, so
// its w_full is bitwise what engine_min computes) and CUDA kernels (one pass, float4 loads,
// block reductions; compiled without FMA contraction and with IEEE division and square root, so
// on the same inputs they produce the same bits as the CPU path; tests hold them to 1e-6).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <new>
#include <string>
#include <string_view>

#include "ckpt/adamw.h"
#include "ckpt/status.h"

namespace ckpt::verify {

// Inputs of one tensor; n elements each, read-only.
struct PassInputs {
  const float* w = nullptr;
  const float* m = nullptr;
  const float* v = nullptr;
  const float* g = nullptr;
  size_t n = 0;
};

// Optional outputs (nullptr: not written). n elements each, must not alias the inputs.
struct PassOutputs {
  float* w_full = nullptr;
  float* m_full = nullptr;
  float* v_full = nullptr;
  float* w_weights_only = nullptr;
  float* w_moments_dropped = nullptr;
};

// One restore path compared with the full-state path (a).
struct PathStats {
  double max_abs = 0.0;        // max |w_x - w_full|
  double sum_sq_diff = 0.0;    // sum (w_x - w_full)^2
  uint64_t n_differ = 0;       // elements with w_x != w_full
  double sum_sq_update = 0.0;  // sum (w_x - w)^2: this path's squared update norm
  void Merge(const PathStats& o);
};

struct PassStats {
  uint64_t n = 0;
  double sum_sq_full = 0.0;         // sum w_full^2 (denominator of the relative L2)
  double sum_sq_update_full = 0.0;  // sum (w_full - w)^2
  PathStats weights_only;
  PathStats moments_dropped;
  void Merge(const PassStats& o);
};

// The hyper-parameters of path (a); (c) uses the same, (b) the same with step = 0.
struct PassHyper {
  AdamWHyper full;
  AdamWHyper WeightsOnly() const {
    AdamWHyper h = full;
    h.step = 0;
    return h;
  }
};

enum class Device { kAuto, kCpu, kCuda };
Result<Device> ParseDevice(std::string_view text);  // "auto" | "cpu" | "cuda"
std::string_view DeviceName(Device d);

// Thread-compatible (one caller at a time); move-only through unique_ptr.
class UpdatePass {
 public:
  virtual ~UpdatePass() = default;
  virtual Device device() const = 0;
  // Runs the pass over one tensor. CPU: never fails. CUDA: IOError/Internal with the CUDA
  // error text when a copy or a launch fails (the sticky error is cleared).
  virtual Result<PassStats> Run(const PassHyper& hyper, const PassInputs& in,
                                const PassOutputs& out) = 0;
};

// An uninitialised float array on a 64-byte boundary: what the CPU pass wants its outputs in
// (see MakeCpuPass). Move-only.
class PassBuffer {
 public:
  PassBuffer() = default;
  explicit PassBuffer(size_t n)
      : data_(new (std::align_val_t{64}) float[n > 0 ? n : 1]), size_(n) {}
  float* data() const { return data_.get(); }
  size_t size() const { return size_; }
  float& operator[](size_t i) const { return data_[i]; }

 private:
  struct Free {
    void operator()(float* p) const { ::operator delete[](p, std::align_val_t{64}); }
  };
  std::unique_ptr<float[], Free> data_;
  size_t size_ = 0;
};

// The CPU reference. When every requested output is 64-byte aligned (PassBuffer) and together
// they exceed about half of one core's share of the last-level cache, they are written with
// streaming stores; the bits of the outputs and of the statistics are the same either way.
std::unique_ptr<UpdatePass> MakeCpuPass();
// The same with an explicit streaming threshold in output bytes per Run (0: always stream,
// UINT64_MAX: never), for tests and measurements.
std::unique_ptr<UpdatePass> MakeCpuPass(uint64_t stream_threshold_bytes);
// kCpu: the CPU reference. kCuda: the CUDA pass, FailedPrecondition when no GPU is present or
// Unimplemented when built without CUDA. kAuto: CUDA when a GPU is present, else CPU.
Result<std::unique_ptr<UpdatePass>> MakeUpdatePass(Device device);
// Number of usable CUDA devices (0 when built without CUDA or when the runtime finds none);
// `why` (optional) receives the runtime's explanation when it is 0.
int CudaDeviceCount(std::string* why = nullptr);
// Makes `device` the calling thread's CUDA device (the one MakeUpdatePass(kCuda) then uses).
// InvalidArgument for a device that does not exist; Unimplemented without CUDA.
Status SelectCudaDevice(int device);

// Measured throughput of the pass against a memcpy of its input bytes (w, m, v, g) in the
// same process, on the same buffers. CPU: one thread, memcpy(); CUDA: device-resident buffers,
// cudaMemcpyDeviceToDevice. The pass materialises all five output arrays (what `ckpt
// next-update --out` does; without --out the CLI stores three), through the same
// UpdatePass::Run the CLI calls.
struct PassBench {
  Device device = Device::kCpu;
  uint64_t elements = 0;
  uint64_t pass_bytes_moved = 0;  // read w, m, v, g + write w_full, m, v, w_b, w_c
  uint64_t memcpy_bytes = 0;      // bytes copied by the memcpy (= input bytes)
  double pass_seconds = 0.0;      // best of `reps`
  double memcpy_seconds = 0.0;    // best of `reps`
  int outputs = 5;                // output arrays written per element
  // CPU: output bytes per Run above which the pass uses streaming stores, and whether this
  // run did (0 / false on CUDA).
  uint64_t stream_threshold_bytes = 0;
  bool streaming_stores = false;
  // memcpy_seconds / pass_seconds: the pass over n elements takes 1/ratio the time of copying
  // its inputs once.
  double ratio() const { return pass_seconds > 0 ? memcpy_seconds / pass_seconds : 0.0; }
};
Result<PassBench> BenchUpdatePass(Device device, uint64_t input_bytes, int reps);

}  // namespace ckpt::verify
