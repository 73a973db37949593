#include "ckpt/aligned_buffer.h"

#include <sys/mman.h>

namespace ckpt {

void* AllocateIoMemory(size_t bytes) {
  constexpr size_t kPage = 4096, kHugePage = 2u << 20;
  const size_t align = bytes >= kHugePage ? kHugePage : kPage;
  const size_t size = bytes == 0 ? align : (bytes + align - 1) / align * align;
  if (size < bytes) return nullptr;  // overflow
  void* p = std::aligned_alloc(align, size);
  // A hint: a kernel without transparent huge pages (or with them "never") refuses it, and the
  // memory is ordinary pages.
  if (p != nullptr && align == kHugePage) madvise(p, size, MADV_HUGEPAGE);
  return p;
}

}  // namespace ckpt
