#include "ckpt/aligned_buffer.h"

#include <sys/mman.h>

#include <cstdint>
#include <map>
#include <mutex>

namespace ckpt {
namespace {

constexpr size_t kPage = 4096, kHugePage = 2u << 20;

// The live huge-page allocations, start -> size: what IsIoMemory answers from.
struct IoRegistry {
  std::mutex mu;
  std::map<uintptr_t, size_t> live;
};
IoRegistry& Registry() {
  static auto* r = new IoRegistry;  // never destroyed: buffers may be freed during exit
  return *r;
}

}  // namespace

void* AllocateIoMemory(size_t bytes) {
  const size_t align = bytes >= kHugePage ? kHugePage : kPage;
  const size_t size = bytes == 0 ? align : (bytes + align - 1) / align * align;
  if (size < bytes) return nullptr;  // overflow
  void* p = std::aligned_alloc(align, size);
  if (p == nullptr || align != kHugePage) return p;
  // A hint: a kernel without transparent huge pages (or with them "never") refuses it, and the
  // memory is ordinary pages.
  madvise(p, size, MADV_HUGEPAGE);
  try {
    IoRegistry& r = Registry();
    std::lock_guard<std::mutex> lock(r.mu);
    r.live[reinterpret_cast<uintptr_t>(p)] = size;
  } catch (const std::bad_alloc&) {
    // Unregistered, the memory is still good; its writes are staged like any other memory's.
  }
  return p;
}

void FreeIoMemory(void* p) {
  if (p == nullptr) return;
  {
    IoRegistry& r = Registry();
    std::lock_guard<std::mutex> lock(r.mu);
    r.live.erase(reinterpret_cast<uintptr_t>(p));
  }
  std::free(p);
}

bool IsIoMemory(const void* p, size_t n) {
  const auto a = reinterpret_cast<uintptr_t>(p);
  IoRegistry& r = Registry();
  std::lock_guard<std::mutex> lock(r.mu);
  auto it = r.live.upper_bound(a);
  if (it == r.live.begin()) return false;
  --it;
  return a - it->first <= it->second && n <= it->second - (a - it->first);
}

}  // namespace ckpt
