// AlignedBuffer: uninitialised heap memory aligned to 4 KiB, the destination of large reads.
// RandomAccessFile::ReadLarge reads straight into memory that shares the data's position within
// a 4 KiB block (O_DIRECT, no bounce buffer; the writer aligns large datasets to 4 KiB), and a
// buffer that is never zero-filled costs no page faults before the read (std::vector<float>
// zero-fills: export-fp32 spent a quarter of its CPU time in that memset and its faults).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <new>
#include <utility>

namespace ckpt {

class AlignedBuffer {
 public:
  static constexpr size_t kAlign = 4096;
  AlignedBuffer() = default;
  // At least `bytes` (rounded up to kAlign; std::bad_alloc when the memory cannot be had).
  explicit AlignedBuffer(size_t bytes) {
    const size_t cap = (bytes + kAlign - 1) / kAlign * kAlign;
    void* p = std::aligned_alloc(kAlign, cap == 0 ? kAlign : cap);
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
    void operator()(uint8_t* p) const { std::free(p); }
  };
  std::unique_ptr<uint8_t, Free> data_;
  size_t size_ = 0;
};

}  // namespace ckpt
