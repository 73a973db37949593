// Private helpers: overflow-checked integer arithmetic and printf-style formatting.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>

#include "ckpt/status.h"
#include "ckpt/units.h"

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

// printf into a std::string: the format library's (ckpt/units.h).
using ::ckpt::StrFormat;

inline constexpr double kGiB = 1073741824.0;  // 2^30
inline constexpr double kGB = 1e9;

}  // namespace ckpt::estimate::internal
