// Device selection for the next-update pass.
#include "verify/update_pass.h"

#include <algorithm>

#include "update_pass_internal.h"
#include "verify/nccl_combine.h"

namespace ckpt::verify {

void PathStats::Merge(const PathStats& o) {
  max_abs = std::max(max_abs, o.max_abs);
  sum_sq_diff += o.sum_sq_diff;
  n_differ += o.n_differ;
  sum_sq_update += o.sum_sq_update;
}

void PassStats::Merge(const PassStats& o) {
  n += o.n;
  sum_sq_full += o.sum_sq_full;
  sum_sq_update_full += o.sum_sq_update_full;
  weights_only.Merge(o.weights_only);
  moments_dropped.Merge(o.moments_dropped);
}

Result<Device> ParseDevice(std::string_view text) {
  if (text == "auto") return Device::kAuto;
  if (text == "cpu") return Device::kCpu;
  if (text == "cuda") return Device::kCuda;
  return InvalidArgument("unknown device '" + std::string(text) + "' (auto, cpu, cuda)");
}

std::string_view DeviceName(Device d) {
  switch (d) {
    case Device::kAuto:
      return "auto";
    case Device::kCpu:
      return "cpu";
    case Device::kCuda:
      return "cuda";
  }
  return "?";
}

int CudaDeviceCount(std::string* why) {
#ifdef CKPT_VERIFY_HAVE_CUDA
  return CudaDeviceCountImpl(why);
#else
  if (why) *why = "ckpt was built without CUDA";
  return 0;
#endif
}

Status SelectCudaDevice(int device) {
#ifdef CKPT_VERIFY_HAVE_CUDA
  return SelectCudaDeviceImpl(device);
#else
  (void)device;
  return Unimplemented("this ckpt was built without CUDA (nvcc not found)");
#endif
}

Result<std::unique_ptr<UpdatePass>> MakeUpdatePass(Device device) {
  if (device == Device::kCpu) return MakeCpuPass();
#ifdef CKPT_VERIFY_HAVE_CUDA
  std::string why;
  const int count = CudaDeviceCountImpl(&why);
  if (count > 0) return MakeCudaPass();
  if (device == Device::kAuto) return MakeCpuPass();
  return FailedPrecondition("--device cuda: no CUDA device (" + why + ")");
#else
  if (device == Device::kAuto) return MakeCpuPass();
  return Unimplemented("--device cuda: this ckpt was built without CUDA (nvcc not found)");
#endif
}

Result<PassBench> BenchUpdatePass(Device device, uint64_t input_bytes, int reps) {
  if (input_bytes == 0) return InvalidArgument("bench: byte count must be positive");
  if (device == Device::kCpu) return BenchCpuPass(input_bytes, reps);
#ifdef CKPT_VERIFY_HAVE_CUDA
  std::string why;
  if (CudaDeviceCountImpl(&why) > 0) return BenchCudaPass(input_bytes, reps);
  if (device == Device::kAuto) return BenchCpuPass(input_bytes, reps);
  return FailedPrecondition("--device cuda: no CUDA device (" + why + ")");
#else
  if (device == Device::kAuto) return BenchCpuPass(input_bytes, reps);
  return Unimplemented("--device cuda: this ckpt was built without CUDA (nvcc not found)");
#endif
}

#ifndef CKPT_VERIFY_HAVE_NCCL
// Without NCCL (or without CUDA) the combiner exists but refuses to run.
bool HaveNcclCombine() { return false; }
Result<std::string> NcclStatsCombiner::NewUniqueId() {
  return Unimplemented("this ckpt was built without NCCL");
}
Result<std::unique_ptr<NcclStatsCombiner>> NcclStatsCombiner::Create(const std::string&, int, int,
                                                                     int) {
  return Unimplemented("this ckpt was built without NCCL");
}
#endif

}  // namespace ckpt::verify
