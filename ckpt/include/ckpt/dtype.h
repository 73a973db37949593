// Element types stored in checkpoints, their on-disk names, and bf16/fp16 conversions.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

namespace ckpt {

// Values are only ever added. On disk a dtype is its name (manifest, HDF5 attribute "dtype").
enum class DType : uint8_t { kF32, kF64, kBF16, kF16, kI64, kI32, kU8, kU16 };

std::string_view DTypeName(DType t);            // "fp32", "fp64", "bf16", "fp16", "int64", ...
std::optional<DType> DTypeFromName(std::string_view name);  // also accepts "float32", "bfloat16"
size_t DTypeSize(DType t);
// safetensors dtype tag: "F32", "BF16", "F16", "F64", "I64", "I32", "U8", "U16".
std::string_view SafetensorsDTypeName(DType t);
std::optional<DType> DTypeFromSafetensorsName(std::string_view name);

// Round-to-nearest-even fp32 -> bf16 (NaN stays NaN, quiet). Bitwise identical to torch's
// float32.to(bfloat16).
uint16_t FloatToBf16(float f);
float Bf16ToFloat(uint16_t h);
// IEEE binary16, round-to-nearest-even, overflow to inf.
uint16_t FloatToFp16(float f);
float Fp16ToFloat(uint16_t h);

// Converts n little-endian elements of a floating-point dtype (fp32, fp64, bf16, fp16) to fp32.
// Returns false (and writes nothing) for a non-float dtype.
bool FloatsToF32(DType t, const void* raw, size_t n, float* out);
// The other way: n fp32 values to little-endian elements of floating-point dtype t (the
// conversions above, element by element, in one loop per dtype). False (nothing written) for
// a non-float dtype.
bool F32ToFloats(DType t, const float* in, size_t n, void* out);

}  // namespace ckpt
