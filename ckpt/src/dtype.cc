#include "ckpt/dtype.h"

#include <cstring>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

namespace ckpt {

namespace {
struct DTypeRow {
  DType type;
  std::string_view name;
  std::string_view alt;
  std::string_view safetensors;
  size_t size;
};
constexpr DTypeRow kRows[] = {
    {DType::kF32, "fp32", "float32", "F32", 4}, {DType::kF64, "fp64", "float64", "F64", 8},
    {DType::kBF16, "bf16", "bfloat16", "BF16", 2}, {DType::kF16, "fp16", "float16", "F16", 2},
    {DType::kI64, "int64", "i64", "I64", 8},     {DType::kI32, "int32", "i32", "I32", 4},
    {DType::kU8, "uint8", "u8", "U8", 1},        {DType::kU16, "uint16", "u16", "U16", 2},
};
const DTypeRow& Row(DType t) {
  for (const auto& r : kRows)
    if (r.type == t) return r;
  return kRows[0];
}
}  // namespace

std::string_view DTypeName(DType t) { return Row(t).name; }
size_t DTypeSize(DType t) { return Row(t).size; }
std::string_view SafetensorsDTypeName(DType t) { return Row(t).safetensors; }

std::optional<DType> DTypeFromName(std::string_view name) {
  for (const auto& r : kRows)
    if (r.name == name || r.alt == name) return r.type;
  return std::nullopt;
}

std::optional<DType> DTypeFromSafetensorsName(std::string_view name) {
  for (const auto& r : kRows)
    if (r.safetensors == name) return r.type;
  return std::nullopt;
}

namespace {

// The conversions, with internal linkage so that the loops below inline them (a call per
// element made a frozen bf16 base of 200 M elements cost export-fp32 seconds:
// docs/performance.md, 2026-12-05 17:00).
uint16_t ToBf16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  if ((bits & 0x7f800000u) == 0x7f800000u && (bits & 0x007fffffu) != 0) {
    return static_cast<uint16_t>((bits >> 16) | 0x0040u);  // quiet NaN, keep sign
  }
  const uint32_t rounding_bias = 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>((bits + rounding_bias) >> 16);
}

float FromBf16(uint16_t h) {
  uint32_t bits = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

uint16_t ToFp16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  const uint32_t sign = (x >> 16) & 0x8000u;
  const uint32_t abs = x & 0x7fffffffu;
  if (abs >= 0x7f800000u) {  // inf or NaN
    return static_cast<uint16_t>(sign | 0x7c00u | (abs > 0x7f800000u ? 0x200u : 0u));
  }
  if (abs >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // rounds to inf
  if (abs < 0x38800000u) {  // subnormal or zero in fp16
    if (abs < 0x33000000u) return static_cast<uint16_t>(sign);  // < half the smallest subnormal
    const uint32_t exp = abs >> 23;
    const uint32_t mant = (abs & 0x7fffffu) | 0x800000u;
    const uint32_t shift = 126 - exp;  // 14 + (112 - exp) ... bits to drop
    const uint32_t drop = shift;       // mant >> (shift) gives subnormal mantissa
    uint32_t result = mant >> drop;
    const uint32_t rem = mant & ((1u << drop) - 1);
    const uint32_t half = 1u << (drop - 1);
    if (rem > half || (rem == half && (result & 1u))) ++result;
    return static_cast<uint16_t>(sign | result);
  }
  uint32_t result = ((abs - 0x38000000u) >> 13);  // rebias exponent 127 -> 15
  const uint32_t rem = abs & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (result & 1u))) ++result;
  return static_cast<uint16_t>(sign | result);
}

float FromFp16(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  uint32_t bits;
  if (exp == 0) {
    if (mant == 0) {
      bits = sign;
    } else {  // subnormal: normalize
      exp = 127 - 15 + 1;
      while ((mant & 0x400u) == 0) {
        mant <<= 1;
        --exp;
      }
      mant &= 0x3ffu;
      bits = sign | (exp << 23) | (mant << 13);
    }
  } else if (exp == 0x1f) {
    bits = sign | 0x7f800000u | (mant << 13);
  } else {
    bits = sign | ((exp + 127 - 15) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

}  // namespace

uint16_t FloatToBf16(float f) { return ToBf16(f); }
float Bf16ToFloat(uint16_t h) { return FromBf16(h); }
uint16_t FloatToFp16(float f) { return ToFp16(f); }
float Fp16ToFloat(uint16_t h) { return FromFp16(h); }

bool FloatsToF32(DType t, const void* raw, size_t n, float* out) {
  const auto* bytes = static_cast<const uint8_t*>(raw);
  switch (t) {
    case DType::kF32:
      if (n) std::memcpy(out, bytes, n * 4);
      return true;
    case DType::kF64:
      for (size_t i = 0; i < n; ++i) {
        double d;
        std::memcpy(&d, bytes + 8 * i, 8);
        out[i] = static_cast<float>(d);
      }
      return true;
    case DType::kBF16: {
      size_t i = 0;
#if defined(__SSE2__)
      // A bf16 value is the upper half of its fp32: eight at a time, interleaved with zero
      // lower halves.
      const __m128i zero = _mm_setzero_si128();
      for (; i + 8 <= n; i += 8) {
        const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(bytes + 2 * i));
        _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i), _mm_unpacklo_epi16(zero, h));
        _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i + 4), _mm_unpackhi_epi16(zero, h));
      }
#endif
      for (; i < n; ++i) {
        uint16_t h;
        std::memcpy(&h, bytes + 2 * i, 2);
        out[i] = FromBf16(h);
      }
      return true;
    }
    case DType::kF16:
      for (size_t i = 0; i < n; ++i) {
        uint16_t h;
        std::memcpy(&h, bytes + 2 * i, 2);
        out[i] = FromFp16(h);
      }
      return true;
    default:
      return false;
  }
}

bool F32ToFloats(DType t, const float* in, size_t n, void* out) {
  auto* bytes = static_cast<uint8_t*>(out);
  switch (t) {
    case DType::kF32:
      if (n) std::memcpy(bytes, in, n * 4);
      return true;
    case DType::kF64:
      for (size_t i = 0; i < n; ++i) {
        const double d = in[i];
        std::memcpy(bytes + 8 * i, &d, 8);
      }
      return true;
    case DType::kBF16:
      for (size_t i = 0; i < n; ++i) {
        const uint16_t h = ToBf16(in[i]);
        std::memcpy(bytes + 2 * i, &h, 2);
      }
      return true;
    case DType::kF16:
      for (size_t i = 0; i < n; ++i) {
        const uint16_t h = ToFp16(in[i]);
        std::memcpy(bytes + 2 * i, &h, 2);
      }
      return true;
    default:
      return false;
  }
}

}  // namespace ckpt
