// A tensor shape's element count and its text in messages.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace ckpt {

// The product of the dimensions (1 for a scalar). For shapes already validated (manifest,
// safetensors and pickle readers check that every dimension is non-negative and the product
// fits in int64 before they use it); not a check itself.
inline int64_t Numel(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

// "[2, 3]" (as `ckpt ls` prints a parameter's shape), or "[2,3]" with separator ","; "[]" for
// a scalar.
inline std::string ShapeText(const std::vector<int64_t>& shape, std::string_view separator = ", ") {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i > 0) s += separator;
    s += std::to_string(shape[i]);
  }
  return s + "]";
}

}  // namespace ckpt
