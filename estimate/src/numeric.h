// Private helpers: overflow-checked integer arithmetic and printf-style formatting.
#pragma once

#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <string>

#include "ckpt/status.h"

namespace ckpt::estimate::internal {

// a * b, or InvalidArgument naming `what` when the product leaves int64.
inline Result<int64_t> CheckedMul(int64_t a, int64_t b, const char* what) {
  int64_t out = 0;
  if (__builtin_mul_overflow(a, b, &out)) {
    return InvalidArgument(std::string(what) + " overflows 64-bit byte counts");
  }
  return out;
}

inline Result<int64_t> CheckedAdd(int64_t a, int64_t b, const char* what) {
  int64_t out = 0;
  if (__builtin_add_overflow(a, b, &out)) {
    return InvalidArgument(std::string(what) + " overflows 64-bit byte counts");
  }
  return out;
}

// ceil(a / b) for a >= 0, b > 0.
inline int64_t CeilDiv(int64_t a, int64_t b) { return a / b + (a % b != 0 ? 1 : 0); }

// std::string printf. glibc's %f rounds the exact binary value half-to-even, as Python's
// format() does, which is what makes the DeepSpeed tables reproducible digit for digit.
__attribute__((format(printf, 1, 2))) inline std::string StrFormat(const char* fmt, ...) {
  va_list args;
  va_start(args, fmt);
  va_list copy;
  va_copy(copy, args);
  int n = std::vsnprintf(nullptr, 0, fmt, copy);
  va_end(copy);
  std::string out(n > 0 ? static_cast<size_t>(n) : 0, '\0');
  if (n > 0) std::vsnprintf(out.data(), out.size() + 1, fmt, args);
  va_end(args);
  return out;
}

inline constexpr double kGiB = 1073741824.0;  // 2^30
inline constexpr double kGB = 1e9;

}  // namespace ckpt::estimate::internal
