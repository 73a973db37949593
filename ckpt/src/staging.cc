#include "staging.h"

#include "ckpt/aligned_buffer.h"

#include <cstdlib>
#include <new>
#include <string>

#if CKPT_STAGING_CUDA
#include "ckpt/cuda_status.h"
#endif

namespace ckpt::internal {

StagingBuffer::~StagingBuffer() { Free(); }

void StagingBuffer::Free() {
  if (data_ == nullptr) return;
#if CKPT_STAGING_CUDA
  if (kind_ == Kind::kPinned) {
    cudaFreeHost(data_);
    data_ = nullptr;
    capacity_ = 0;
    return;
  }
#endif
  FreeIoMemory(data_);
  data_ = nullptr;
  capacity_ = 0;
}

Result<uint8_t*> StagingBuffer::Reserve(size_t bytes) {
  if (bytes <= capacity_ && data_ != nullptr) return data_;
  Free();
  const size_t size = (bytes + kStagingAlignment - 1) / kStagingAlignment * kStagingAlignment;
  if (size < bytes) return ResourceExhausted("staging " + std::to_string(bytes) + " bytes");
  const size_t alloc = size == 0 ? kStagingAlignment : size;
  void* p = nullptr;
  if (kind_ == Kind::kPinned) {
#if CKPT_STAGING_CUDA
    CKPT_RETURN_IF_ERROR(CudaStatus(cudaHostAlloc(&p, alloc, cudaHostAllocDefault),
                                    "cudaHostAlloc " + std::to_string(alloc) + " bytes"),
                         "async save staging");
#else
    return Internal("pinned staging memory needs a CUDA build");
#endif
  } else {
    p = AllocateIoMemory(alloc);
    if (p == nullptr)
      return ResourceExhausted("async save staging: cannot allocate " + std::to_string(alloc) +
                               " bytes of host memory");
  }
  data_ = static_cast<uint8_t*>(p);
  capacity_ = alloc;
  ++allocations_;
  return data_;
}

#if CKPT_STAGING_CUDA

namespace {
// Asked once: a build with CUDA on a machine without a GPU (or driver) stages everything as
// host memory and never calls CUDA again.
bool CudaUsable() {
  static const bool usable = [] {
    int n = 0;
    const cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) cudaGetLastError();
    return e == cudaSuccess && n > 0;
  }();
  return usable;
}
}  // namespace

void ProbeDevices() { (void)CudaUsable(); }

bool IsDeviceMemory(const void* p) {
  if (p == nullptr || !CudaUsable()) return false;
  cudaPointerAttributes a{};
  if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
    cudaGetLastError();  // not a pointer CUDA knows: host memory
    return false;
  }
  return a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged;
}

Status CopyFromDevice(void* dst, const void* src, size_t n) {
  return CudaStatus(cudaMemcpy(dst, src, n, cudaMemcpyDefault), "async save: device-to-host copy");
}

#else

void ProbeDevices() {}

bool IsDeviceMemory(const void*) { return false; }

Status CopyFromDevice(void*, const void*, size_t) {
  return Internal("async save: device memory needs a CUDA build");
}

#endif

}  // namespace ckpt::internal
