// The CUDA implementation of UpdatePass: device buffers and a stream owned by RAII handles,
// host<->device copies around the next-update kernel, CUDA errors turned into Status (the
// sticky error is cleared at this edge).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "next_update_kernel.cuh"
#include "update_pass_internal.h"
#include "ckpt/cuda_status.h"

namespace ckpt::verify {
namespace {

// Device memory, move-only.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  ~DeviceBuffer() { Reset(); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  Status Allocate(size_t bytes) {
    if (bytes <= bytes_ && ptr_) return Status::Ok();
    Reset();
    void* p = nullptr;
    Status s = CudaStatus(cudaMalloc(&p, std::max<size_t>(bytes, 16)), "cudaMalloc");
    if (!s.ok()) return s;
    ptr_ = p;
    bytes_ = bytes;
    return Status::Ok();
  }
  template <typename T>
  T* as() const {
    return static_cast<T*>(ptr_);
  }

 private:
  void Reset() {
    if (ptr_) cudaFree(ptr_);
    ptr_ = nullptr;
    bytes_ = 0;
  }
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

class Stream {
 public:
  Stream() = default;
  ~Stream() {
    if (s_) cudaStreamDestroy(s_);
  }
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  Status Create() {
    return CudaStatus(cudaStreamCreateWithFlags(&s_, cudaStreamNonBlocking), "cudaStreamCreate");
  }
  cudaStream_t get() const { return s_; }

 private:
  cudaStream_t s_ = nullptr;
};

class Event {
 public:
  Event() = default;
  ~Event() {
    if (e_) cudaEventDestroy(e_);
  }
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  Status Create() { return CudaStatus(cudaEventCreate(&e_), "cudaEventCreate"); }
  cudaEvent_t get() const { return e_; }

 private:
  cudaEvent_t e_ = nullptr;
};

PassStats ToPassStats(const DeviceStats& d, size_t n) {
  PassStats s;
  s.n = n;
  s.sum_sq_full = d.sum_sq_full;
  s.sum_sq_update_full = d.sum_sq_update_full;
  double b_max = 0, c_max = 0;
  std::memcpy(&b_max, &d.b_max_bits, sizeof(double));
  std::memcpy(&c_max, &d.c_max_bits, sizeof(double));
  s.weights_only = {b_max, d.b_sq, d.b_differ, d.b_upd};
  s.moments_dropped = {c_max, d.c_sq, d.c_differ, d.c_upd};
  return s;
}

class CudaPass final : public UpdatePass {
 public:
  Status Init() {
    Status s = stream_.Create();
    if (!s.ok()) return s;
    return stats_.Allocate(sizeof(DeviceStats));
  }
  Device device() const override { return Device::kCuda; }

  Result<PassStats> Run(const PassHyper& hyper, const PassInputs& in,
                        const PassOutputs& out) override {
    const size_t bytes = in.n * sizeof(float);
    for (DeviceBuffer* b : {&w_, &m_, &v_, &g_, &wa_, &ma_, &va_, &wb_, &wc_}) {
      CKPT_RETURN_IF_ERROR(b->Allocate(bytes), "next-update on cuda");
    }
    cudaStream_t st = stream_.get();
    const std::pair<DeviceBuffer*, const float*> uploads[] = {
        {&w_, in.w}, {&m_, in.m}, {&v_, in.v}, {&g_, in.g}};
    for (const auto& [dev, host] : uploads) {
      CKPT_RETURN_IF_ERROR(
          CudaStatus(cudaMemcpyAsync(dev->as<float>(), host, bytes, cudaMemcpyHostToDevice, st),
                     "cudaMemcpy host to device"),
          "next-update on cuda");
    }
    DevicePassArgs a{w_.as<float>(),
                     m_.as<float>(),
                     v_.as<float>(),
                     g_.as<float>(),
                     out.w_full ? wa_.as<float>() : nullptr,
                     out.m_full ? ma_.as<float>() : nullptr,
                     out.v_full ? va_.as<float>() : nullptr,
                     out.w_weights_only ? wb_.as<float>() : nullptr,
                     out.w_moments_dropped ? wc_.as<float>() : nullptr,
                     in.n};
    CKPT_RETURN_IF_ERROR(CudaStatus(LaunchNextUpdate(MakeAdamWFactors(hyper.full),
                                                     MakeAdamWFactors(hyper.WeightsOnly()), a,
                                                     stats_.as<DeviceStats>(), st),
                                    "next-update kernel launch"),
                         "next-update on cuda");
    const std::pair<float*, float*> downloads[] = {{out.w_full, a.w_full},
                                                   {out.m_full, a.m_full},
                                                   {out.v_full, a.v_full},
                                                   {out.w_weights_only, a.w_weights_only},
                                                   {out.w_moments_dropped, a.w_moments_dropped}};
    for (const auto& [host, dev] : downloads) {
      if (!host) continue;
      CKPT_RETURN_IF_ERROR(CudaStatus(cudaMemcpyAsync(host, dev, bytes, cudaMemcpyDeviceToHost, st),
                                      "cudaMemcpy device to host"),
                           "next-update on cuda");
    }
    DeviceStats d{};
    CKPT_RETURN_IF_ERROR(CudaStatus(cudaMemcpyAsync(&d, stats_.as<DeviceStats>(), sizeof(d),
                                                    cudaMemcpyDeviceToHost, st),
                                    "cudaMemcpy stats"),
                         "next-update on cuda");
    CKPT_RETURN_IF_ERROR(CudaStatus(cudaStreamSynchronize(st), "cudaStreamSynchronize"),
                         "next-update on cuda");
    return ToPassStats(d, in.n);
  }

 private:
  Stream stream_;
  DeviceBuffer stats_;
  DeviceBuffer w_, m_, v_, g_, wa_, ma_, va_, wb_, wc_;
};

__global__ void FillKernel(float* p, size_t n, float scale, float offset, int period) {
  for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += size_t(gridDim.x) * blockDim.x) {
    p[i] = scale * float(i % period) + offset;
  }
}

}  // namespace

int CudaDeviceCountImpl(std::string* why) {
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    cudaGetLastError();
    if (why) *why = std::string(cudaGetErrorName(err)) + ": " + cudaGetErrorString(err);
    return 0;
  }
  if (count == 0 && why) *why = "cudaGetDeviceCount found no device";
  return count;
}

Status SelectCudaDeviceImpl(int device) {
  std::string why;
  const int count = CudaDeviceCountImpl(&why);
  if (device < 0 || device >= count) {
    return InvalidArgument("CUDA device " + std::to_string(device) + " does not exist (" +
                           std::to_string(count) + " visible" + (why.empty() ? "" : ": " + why) +
                           ")");
  }
  return CudaStatus(cudaSetDevice(device), "cudaSetDevice");
}

Result<std::unique_ptr<UpdatePass>> MakeCudaPass() {
  auto pass = std::make_unique<CudaPass>();
  CKPT_RETURN_IF_ERROR(pass->Init(), "cuda next-update pass");
  return std::unique_ptr<UpdatePass>(std::move(pass));
}

Result<PassBench> BenchCudaPass(uint64_t input_bytes, int reps) {
  const size_t n = std::max<uint64_t>(input_bytes / 16, 1024) / 4 * 4;
  DeviceBuffer inputs, outputs, copy, stats;
  CKPT_RETURN_IF_ERROR(inputs.Allocate(16 * n), "bench");
  CKPT_RETURN_IF_ERROR(outputs.Allocate(20 * n), "bench");
  CKPT_RETURN_IF_ERROR(copy.Allocate(16 * n), "bench");
  CKPT_RETURN_IF_ERROR(stats.Allocate(sizeof(DeviceStats)), "bench");
  Stream stream;
  Event start, stop;
  CKPT_RETURN_IF_ERROR(stream.Create(), "bench");
  CKPT_RETURN_IF_ERROR(start.Create(), "bench");
  CKPT_RETURN_IF_ERROR(stop.Create(), "bench");
  cudaStream_t st = stream.get();
  float* in = inputs.as<float>();
  FillKernel<<<1024, 256, 0, st>>>(in, n, 0.01f, -5.0f, 1000);
  FillKernel<<<1024, 256, 0, st>>>(in + n, n, 1e-3f, -0.05f, 97);
  FillKernel<<<1024, 256, 0, st>>>(in + 2 * n, n, 1e-5f, 1e-5f, 89);
  FillKernel<<<1024, 256, 0, st>>>(in + 3 * n, n, 1e-2f, -0.5f, 101);
  float* o = outputs.as<float>();
  DevicePassArgs a{in,    in + n,    in + 2 * n, in + 3 * n, o,
                   o + n, o + 2 * n, o + 3 * n,  o + 4 * n,  n};
  AdamWHyper h;
  h.lr = 1e-3;
  h.weight_decay = 0.1;
  h.step = 100;
  AdamWHyper hb = h;
  hb.step = 0;
  const AdamWFactors fa = MakeAdamWFactors(h), fb = MakeAdamWFactors(hb);
  PassBench b;
  b.device = Device::kCuda;
  b.elements = n;
  b.memcpy_bytes = 16 * n;
  b.pass_bytes_moved = 36 * n;
  b.pass_seconds = 1e30;
  b.memcpy_seconds = 1e30;
  auto time_one = [&](bool pass, double& best) -> Status {
    CKPT_RETURN_IF_ERROR(CudaStatus(cudaEventRecord(start.get(), st), "cudaEventRecord"), "bench");
    if (pass) {
      CKPT_RETURN_IF_ERROR(
          CudaStatus(LaunchNextUpdate(fa, fb, a, stats.as<DeviceStats>(), st), "kernel launch"),
          "bench");
    } else {
      CKPT_RETURN_IF_ERROR(
          CudaStatus(cudaMemcpyAsync(copy.as<float>(), in, 16 * n, cudaMemcpyDeviceToDevice, st),
                     "cudaMemcpy device to device"),
          "bench");
    }
    CKPT_RETURN_IF_ERROR(CudaStatus(cudaEventRecord(stop.get(), st), "cudaEventRecord"), "bench");
    CKPT_RETURN_IF_ERROR(CudaStatus(cudaEventSynchronize(stop.get()), "cudaEventSynchronize"),
                         "bench");
    float ms = 0;
    CKPT_RETURN_IF_ERROR(
        CudaStatus(cudaEventElapsedTime(&ms, start.get(), stop.get()), "cudaEventElapsedTime"),
        "bench");
    best = std::min(best, ms / 1e3);
    return Status::Ok();
  };
  double ignore = 1e30;
  CKPT_RETURN_IF_ERROR(time_one(true, ignore), "warm-up");
  CKPT_RETURN_IF_ERROR(time_one(false, ignore), "warm-up");
  for (int r = 0; r < std::max(reps, 1); ++r) {
    CKPT_RETURN_IF_ERROR(time_one(false, b.memcpy_seconds), "memcpy");
    CKPT_RETURN_IF_ERROR(time_one(true, b.pass_seconds), "pass");
  }
  return b;
}

}  // namespace ckpt::verify
