#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <vector>

#include "ckpt/dtype.h"
#include "ckpt/units.h"
#include "ckpt/writer.h"

using namespace ckpt;

TEST_CASE("ParseCount accepts the documented spellings", "[unit]") {
  CHECK(*ParseCount("2M") == 2'000'000);
  CHECK(*ParseCount("1.5B") == 1'500'000'000);
  CHECK(*ParseCount("350e6") == 350'000'000);
  CHECK(*ParseCount("2851e6") == 2'851'000'000);
  CHECK(*ParseCount("2.851B") == 2'851'000'000);
  CHECK(*ParseCount("7B") == 7'000'000'000);
  CHECK(*ParseCount("1000") == 1000);
  CHECK_FALSE(ParseCount("-5").ok());
  CHECK_FALSE(ParseCount("1.5").ok());
  CHECK_FALSE(ParseCount("12X").ok());
  CHECK_FALSE(ParseCount("").ok());
  CHECK_FALSE(ParseCount("1e30").ok());
}

TEST_CASE("ParseByteSize distinguishes GB and GiB", "[unit]") {
  CHECK(*ParseByteSize("5GB") == 5'000'000'000ull);
  CHECK(*ParseByteSize("2GiB") == 2ull << 30);
  CHECK(*ParseByteSize("64MiB") == 64ull << 20);
  CHECK(*ParseByteSize("4096") == 4096);
  CHECK_FALSE(ParseByteSize("5 parsecs").ok());
  CHECK_FALSE(ParseByteSize("-1GB").ok());
}

TEST_CASE("Compression::Parse", "[unit]") {
  CHECK(Compression::Parse("none")->kind == Compression::Kind::kNone);
  auto z = Compression::Parse("zstd:7+shuffle");
  REQUIRE(z.ok());
  CHECK(z->kind == Compression::Kind::kZstd);
  CHECK(z->level == 7);
  CHECK(z->shuffle);
  CHECK(z->ToString() == "zstd:7+shuffle");
  CHECK(Compression::Parse("zstd")->level == 1);
  CHECK_FALSE(Compression::Parse("gzip").ok());
  CHECK_FALSE(Compression::Parse("zstd:99").ok());
  CHECK_FALSE(Compression::Parse("zstd:x").ok());
}

TEST_CASE("bf16 and fp16 conversions round to nearest even", "[unit]") {
  CHECK(FloatToBf16(1.0f) == 0x3f80);
  CHECK(Bf16ToFloat(0x3f80) == 1.0f);
  // 1 + 2^-8 is exactly half-way between two bf16 values: ties to even (down).
  CHECK(FloatToBf16(1.0f + std::ldexp(1.0f, -8)) == 0x3f80);
  // 1 + 3 * 2^-8 ties up to the even neighbour.
  CHECK(FloatToBf16(1.0f + 3 * std::ldexp(1.0f, -8)) == 0x3f82);
  CHECK(std::isnan(Bf16ToFloat(FloatToBf16(NAN))));
  CHECK(FloatToFp16(1.0f) == 0x3c00);
  CHECK(FloatToFp16(65504.0f) == 0x7bff);
  CHECK(FloatToFp16(70000.0f) == 0x7c00);
  CHECK(FloatToFp16(std::ldexp(1.0f, -24)) == 0x0001);  // smallest subnormal
  CHECK(Fp16ToFloat(0x0001) == std::ldexp(1.0f, -24));
  CHECK(Fp16ToFloat(0xc000) == -2.0f);
  for (float f : {0.1f, -3.75f, 1e-3f, 12345.0f}) {
    CHECK(std::fabs(Fp16ToFloat(FloatToFp16(f)) - f) <= std::fabs(f) * 1e-3f);
  }
}

TEST_CASE("bulk conversions give every element the one-element conversion's bits", "[unit]") {
  // Every 16-bit pattern (all bf16 / fp16 values: zeros, subnormals, infinities, NaNs) to fp32,
  // and fp32 values around every rounding case back, for each dtype the bulk loops handle.
  std::vector<uint16_t> halves(1u << 16);
  for (size_t i = 0; i < halves.size(); ++i) halves[i] = static_cast<uint16_t>(i);
  std::vector<float> wide(halves.size());
  for (DType t : {DType::kBF16, DType::kF16}) {
    INFO(DTypeName(t));
    REQUIRE(FloatsToF32(t, halves.data(), halves.size(), wide.data()));
    size_t same = 0;
    for (size_t i = 0; i < halves.size(); ++i) {
      const float one = t == DType::kBF16 ? Bf16ToFloat(halves[i]) : Fp16ToFloat(halves[i]);
      same += std::memcmp(&one, &wide[i], 4) == 0;
    }
    CHECK(same == halves.size());
    // A run that starts off any vector's alignment and ends with a partial vector (the SIMD
    // loop's body and its tail), into memory off the 16-byte alignment too.
    std::vector<float> part(40, -1.0f);
    REQUIRE(FloatsToF32(t, halves.data() + 3, 29, part.data() + 1));
    CHECK(std::memcmp(part.data() + 1, wide.data() + 3, 29 * 4) == 0);
    CHECK(part[0] == -1.0f);
    CHECK(part[30] == -1.0f);
  }
  std::vector<float> values;
  for (uint32_t bits = 0; bits < 0xffffffffu - 0x00a3d709u; bits += 0x00a3d709u) {
    for (uint32_t d : {0u, 1u, 0x7fffu, 0x8000u, 0x8001u, 0xfffu, 0x1000u, 0x1001u}) {
      float f;
      const uint32_t b = bits + d;
      std::memcpy(&f, &b, 4);
      values.push_back(f);
    }
  }
  for (float f : {0.0f, -0.0f, INFINITY, -INFINITY, NAN, 65504.0f, 65520.0f, 1e-8f})
    values.push_back(f);
  std::vector<uint16_t> narrow(values.size());
  for (DType t : {DType::kBF16, DType::kF16}) {
    INFO(DTypeName(t));
    REQUIRE(F32ToFloats(t, values.data(), values.size(), narrow.data()));
    size_t same = 0;
    for (size_t i = 0; i < values.size(); ++i)
      same += narrow[i] == (t == DType::kBF16 ? FloatToBf16(values[i]) : FloatToFp16(values[i]));
    CHECK(same == values.size());
  }
  std::vector<double> doubles(values.size());
  REQUIRE(F32ToFloats(DType::kF64, values.data(), values.size(), doubles.data()));
  std::vector<float> back(values.size());
  REQUIRE(FloatsToF32(DType::kF64, doubles.data(), doubles.size(), back.data()));
  CHECK(std::memcmp(back.data(), values.data(), values.size() * 4) == 0);
  REQUIRE(F32ToFloats(DType::kF32, values.data(), values.size(), back.data()));
  CHECK(std::memcmp(back.data(), values.data(), values.size() * 4) == 0);
  // Not floating point: nothing written.
  std::vector<int32_t> ints(4, 7);
  CHECK_FALSE(F32ToFloats(DType::kI32, values.data(), ints.size(), ints.data()));
  CHECK_FALSE(FloatsToF32(DType::kI32, ints.data(), ints.size(), back.data()));
  CHECK(ints == std::vector<int32_t>(4, 7));
}
