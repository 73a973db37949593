#include "ckpt/aligned_buffer.h"

#include <sys/mman.h>

#include <cstdint>
#include <cstdlib>
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
  if (align != kHugePage) return std::aligned_alloc(align, size);
  // From 2 MiB up the memory is a mapping of its own, not malloc's: freed, it goes back to the
  // kernel at once. Through malloc, large blocks freed stayed in the heap of the arena they came
  // from (glibc raises its mmap threshold to the largest block freed, so the next ones come from
  // the heaps, and each helper thread has its own arena): a reshard of 1 to 4 ranks whose working
  // set is 52 MiB peaked at 76-100 MiB, its reader's cached pieces allocated on each new rank's
  // fill thread (RankFile's PieceCache keeps them in this memory now; docs/performance.md,
  // 2026-12-05 20:30). Mapped with 2 MiB to spare, then trimmed to a 2 MiB-aligned start.
  if (size > SIZE_MAX - kHugePage) return nullptr;
  void* m =
      mmap(nullptr, size + kHugePage, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (m == MAP_FAILED) return nullptr;
  const auto lo = reinterpret_cast<uintptr_t>(m);
  const uintptr_t at = (lo + kHugePage - 1) / kHugePage * kHugePage;
  if (at > lo) munmap(m, at - lo);
  if (const uintptr_t end = lo + size + kHugePage; end > at + size)
    munmap(reinterpret_cast<void*>(at + size), end - (at + size));
  void* p = reinterpret_cast<void*>(at);
  // A hint: a kernel without transparent huge pages (or with them "never") refuses it, and the
  // memory is ordinary pages.
  AdviseHugePages(p, size);
  try {
    IoRegistry& r = Registry();
    std::lock_guard<std::mutex> lock(r.mu);
    r.live[at] = size;  // FreeIoMemory's size for munmap
  } catch (const std::bad_alloc&) {
    munmap(p, size);
    return nullptr;
  }
  return p;
}

void FreeIoMemory(void* p) {
  if (p == nullptr) return;
  size_t mapped = 0;
  {
    IoRegistry& r = Registry();
    std::lock_guard<std::mutex> lock(r.mu);
    if (auto it = r.live.find(reinterpret_cast<uintptr_t>(p)); it != r.live.end()) {
      mapped = it->second;
      r.live.erase(it);
    }
  }
  if (mapped > 0) {
    munmap(p, mapped);
  } else {
    std::free(p);
  }
}

void AdviseHugePages(void* p, size_t n) {
  const auto lo = reinterpret_cast<uintptr_t>(p);
  if (n < kHugePage || lo > UINTPTR_MAX - n) return;
  const uintptr_t at = (lo + kHugePage - 1) / kHugePage * kHugePage;
  const uintptr_t end = (lo + n) / kHugePage * kHugePage;
  if (end > at) madvise(reinterpret_cast<void*>(at), end - at, MADV_HUGEPAGE);
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
