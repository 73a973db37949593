// Host <-> device copy rates for the save / load path (issue 7, GPU item), built and run by
// tools/bench/gpu.sh on a machine with a GPU. A save moves the state device -> host (pinned
// staging buffer, or pageable memory when the engine has none); a load moves it back.
//
//   copy_rates [BYTES]      default 1 GiB; prints one JSON object
//
// Each direction and host-memory kind: best of 5 copies timed with CUDA events; plus a
// device -> device copy of the same bytes (the floor the next-update kernel is held to).
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>

#define CHECK(x)                                                                  \
  do {                                                                            \
    cudaError_t e_ = (x);                                                         \
    if (e_ != cudaSuccess) {                                                      \
      std::fprintf(stderr, "copy_rates: %s: %s\n", #x, cudaGetErrorString(e_)); \
      std::exit(2);                                                               \
    }                                                                             \
  } while (0)

static float BestMs(void* dst, const void* src, size_t n, cudaMemcpyKind kind) {
  cudaEvent_t a, b;
  CHECK(cudaEventCreate(&a));
  CHECK(cudaEventCreate(&b));
  CHECK(cudaMemcpy(dst, src, n, kind));  // warm-up
  float best = 1e30f;
  for (int i = 0; i < 5; ++i) {
    CHECK(cudaEventRecord(a));
    CHECK(cudaMemcpyAsync(dst, src, n, kind));
    CHECK(cudaEventRecord(b));
    CHECK(cudaEventSynchronize(b));
    float ms = 0;
    CHECK(cudaEventElapsedTime(&ms, a, b));
    if (ms < best) best = ms;
  }
  CHECK(cudaEventDestroy(a));
  CHECK(cudaEventDestroy(b));
  return best;
}

int main(int argc, char** argv) {
  const size_t n = argc > 1 ? std::strtoull(argv[1], nullptr, 10) : (size_t{1} << 30);
  cudaDeviceProp prop{};
  CHECK(cudaGetDeviceProperties(&prop, 0));
  void *dev = nullptr, *dev2 = nullptr, *pinned = nullptr;
  CHECK(cudaMalloc(&dev, n));
  CHECK(cudaMalloc(&dev2, n));
  CHECK(cudaMallocHost(&pinned, n));
  void* pageable = std::malloc(n);
  if (!pageable) {
    std::fprintf(stderr, "copy_rates: out of host memory\n");
    return 2;
  }
  std::memset(pageable, 1, n);
  std::memset(pinned, 1, n);
  CHECK(cudaMemset(dev, 0, n));
  const double gb = static_cast<double>(n) / 1e9;
  const float h2d_pinned = BestMs(dev, pinned, n, cudaMemcpyHostToDevice);
  const float d2h_pinned = BestMs(pinned, dev, n, cudaMemcpyDeviceToHost);
  const float h2d_pageable = BestMs(dev, pageable, n, cudaMemcpyHostToDevice);
  const float d2h_pageable = BestMs(pageable, dev, n, cudaMemcpyDeviceToHost);
  const float d2d = BestMs(dev2, dev, n, cudaMemcpyDeviceToDevice);
  std::printf(
      "{\"device\": \"%s\", \"bytes\": %zu, \"timing\": \"CUDA events, best of 5\", "
      "\"h2d_pinned_gb_per_s\": %.2f, \"d2h_pinned_gb_per_s\": %.2f, "
      "\"h2d_pageable_gb_per_s\": %.2f, \"d2h_pageable_gb_per_s\": %.2f, "
      "\"d2d_gb_per_s_read_plus_written\": %.2f}\n",
      prop.name, n, gb / (h2d_pinned / 1e3), gb / (d2h_pinned / 1e3), gb / (h2d_pageable / 1e3),
      gb / (d2h_pageable / 1e3), 2 * gb / (d2d / 1e3));
  std::free(pageable);
  CHECK(cudaFreeHost(pinned));
  CHECK(cudaFree(dev));
  CHECK(cudaFree(dev2));
  return 0;
}
