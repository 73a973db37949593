// I/O memory: AllocateIoMemory and AlignedBuffer, the destination of large reads and the
// buffers ckpt moves bytes through.
//
// RandomAccessFile::ReadLarge reads straight into memory that shares the data's position within
// a 4 KiB block (O_DIRECT, no bounce buffer; the writer aligns large datasets to 4 KiB), and a
// buffer that is never zero-filled costs no page faults before the read (std::vector<float>
// zero-fills: export-fp32 spent a quarter of its CPU time in that memset and its faults).
//
// From 2 MiB up the memory is a mapping of its own (mmap), returned to the kernel when freed
// rather than kept by malloc's per-thread arenas, aligned to 2 MiB, and asks the kernel for
// transparent huge pages (madvise(MADV_HUGEPAGE), honoured where THP is "always" or "madvise",
// the Debian default): a block device takes a bounded number of memory segments per request
// (254 on the development VM's virtio disk), so an O_DIRECT transfer into 4 KiB pages leaves as
// ~1 MiB requests and one into 2 MiB pages as requests of the device's maximum (4 MiB there).
// The same 1 GiB read in 16 MiB blocks took 0.17 s into huge pages against 0.36 s into 4 KiB
// pages (medians of 5 alternating passes; writes 0.70 against 1.03 s; docs/performance.md,
// 2026-12-02 05:40 UTC).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <new>
#include <utility>

namespace ckpt {

// At least `bytes` of uninitialised memory (rounded up to the alignment): 4 KiB-aligned, and
// from 2 MiB up 2 MiB-aligned with huge pages asked for. nullptr when it cannot be had. Freed
// with FreeIoMemory.
void* AllocateIoMemory(size_t bytes);
void FreeIoMemory(void* p);

// Whether [p, p + n) lies inside one live allocation of AllocateIoMemory of 2 MiB or more:
// memory in huge pages that a rank file's data can leave from with O_DIRECT as it is, without a
// copy into staging (direct_write.h). A save from tensors that live in such memory (an
// AlignedBuffer, as pinned host buffers are for a GPU trainer) writes at the disk's floor.
bool IsIoMemory(const void* p, size_t n);

// Asks for transparent huge pages for the whole 2 MiB blocks inside [p, p + n): memory another
// allocator gave (a std::vector's storage, reserved and not yet touched) that is about to be
// filled. Fresh memory is paid for at its first touch, a fault per 4 KiB page, and far more
// slowly than it is then written: the development VM faults 1 GiB in at 0.36 GiB/s in 4 KiB
// pages and at about 1.0 GiB/s in huge pages, where a memset of memory already touched runs at
// 20 GiB/s (docs/performance.md). A hint: nothing happens below 2 MiB or where the kernel
// refuses it.
void AdviseHugePages(void* p, size_t n);

class AlignedBuffer {
 public:
  static constexpr size_t kAlign = 4096;
  AlignedBuffer() = default;
  // At least `bytes` (AllocateIoMemory; std::bad_alloc when the memory cannot be had).
  explicit AlignedBuffer(size_t bytes) {
    void* p = AllocateIoMemory(bytes);
    if (p == nullptr) throw std::bad_alloc();
    data_.reset(static_cast<uint8_t*>(p));
    size_ = bytes;
  }
  AlignedBuffer(AlignedBuffer&& o) noexcept
      : data_(std::move(o.data_)), size_(std::exchange(o.size_, 0)) {}
  AlignedBuffer& operator=(AlignedBuffer&& o) noexcept {
    data_ = std::move(o.data_);
    size_ = std::exchange(o.size_, 0);
    return *this;
  }

  uint8_t* data() const { return data_.get(); }
  size_t size() const { return size_; }
  template <typename T>
  T* as() const {
    return reinterpret_cast<T*>(data_.get());
  }

 private:
  struct Free {
    void operator()(uint8_t* p) const { FreeIoMemory(p); }
  };
  std::unique_ptr<uint8_t, Free> data_;
  size_t size_ = 0;
};

}  // namespace ckpt
