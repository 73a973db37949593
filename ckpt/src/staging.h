// Staging memory for AsyncSaver: one contiguous block, 4 KiB-aligned, allocated once and reused,
// replaced by a larger one only when a save needs more. Host blocks are plain memory; pinned
// blocks are page-locked (cudaHostAlloc) for copies from device memory. The CUDA parts exist
// only when the library is built with CUDA (CKPT_STAGING_CUDA); without it no pointer is ever
// on a device and no pinned block is made.
#pragma once

#include <cstddef>
#include <cstdint>

#include "ckpt/status.h"

namespace ckpt::internal {

inline constexpr size_t kStagingAlignment = 4096;

class StagingBuffer {
 public:
  enum class Kind { kHost, kPinned };
  explicit StagingBuffer(Kind kind) : kind_(kind) {}
  ~StagingBuffer();
  StagingBuffer(const StagingBuffer&) = delete;
  StagingBuffer& operator=(const StagingBuffer&) = delete;

  // A block of at least `bytes`: the current one when it is large enough, else a new one (the
  // old is freed first, so the peak stays at the larger size).
  Result<uint8_t*> Reserve(size_t bytes);
  size_t capacity() const { return capacity_; }
  int64_t allocations() const { return allocations_; }

 private:
  void Free();
  Kind kind_;
  uint8_t* data_ = nullptr;  // owned; freed by Free() with the allocator of kind_
  size_t capacity_ = 0;
  int64_t allocations_ = 0;
};

// Initialises what IsDeviceMemory needs (CUDA's device query, done once per process) so that
// the first save does not pay for it; a no-op without CUDA.
void ProbeDevices();

// True when p points into CUDA device (or managed) memory. Always false without CUDA, and on a
// machine with no usable GPU.
bool IsDeviceMemory(const void* p);

// Copies n bytes from device memory into pinned host memory; returns when they are there.
Status CopyFromDevice(void* dst, const void* src, size_t n);

}  // namespace ckpt::internal
