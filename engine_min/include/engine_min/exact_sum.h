// Exact, order-independent sums for invariant mode (docs/engine.md, "Invariant mode").
//
// A floating-point sum depends on the order of its terms; an integer sum does not. Invariant
// mode therefore adds in integers and rounds to floating point once, at the end:
//
// - Gradient elements: FixedGrad, a signed 128-bit fixed point with kFixedFracBits = 96
//   fraction bits (one unit = 2^-96). Each term (one sample's fp32 gradient of one element) is
//   rounded to that grid once, ties to even, and must satisfy |term| < 2^kFixedTermExp = 2^10;
//   a global batch may add at most 2^kFixedMaxTermsLog2 = 2^20 terms per element. Then every
//   partial or total sum stays below 2^(10+20) = 2^30 in magnitude, i.e. below 2^126 units:
//   no int128 overflow is possible. A term outside the range (or not finite) is not added but
//   counted; the engine reduces the count over ranks and fails the step with a clear error
//   rather than continue with a wrong gradient. Terms below 2^-97 in magnitude round to 0.
//   FixedToFloat rounds a sum to the nearest fp32 (ties to even); every result is a normal
//   fp32 (|sum| >= 2^-96 > 2^-126 unless zero), so that single rounding is the only one.
// - Wire format: a FixedGrad crosses ranks as kWireLimbs = 3 int64 limbs of 43 bits (the top
//   one signed), so a plain int64 sum (MPI_INT64_T / ncclInt64) of up to 2^20 ranks cannot
//   overflow a limb; carries are resolved when the limbs are decoded.
// - Scalars (the loss, the squared gradient norm): ExactSum, a Kulisch-style accumulator
//   covering every finite double (2^-1074 .. 2^1024 with 64 bits of headroom) in radix-2^32
//   digits held in int64. Adding a double is exact; digits of several ranks add as integers;
//   ToDouble rounds once to the nearest double (ties to even).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace engine_min {

using FixedGrad = __int128;
inline constexpr int kFixedFracBits = 96;
inline constexpr int kFixedTermExp = 10;
inline constexpr int kFixedMaxTermsLog2 = 20;

// x rounded to the nearest multiple of 2^-96, in units of 2^-96. False (and *out = 0) when x
// is not finite or |x| >= 2^10.
bool FloatToFixed(float x, FixedGrad* out);
// The fp32 nearest to v × 2^-96 (ties to even).
float FixedToFloat(FixedGrad v);

// acc[i] += FloatToFixed(terms[i]) and terms[i] = 0, for i < n. Returns the number of terms
// that were out of range (and not added).
int64_t AddFixedTerms(float* terms, FixedGrad* acc, size_t n);

inline constexpr int kWireLimbs = 3;
inline constexpr int kWireLimbBits = 43;
// wire[3i .. 3i+2] = the limbs of v[i].
void FixedToWire(const FixedGrad* v, size_t n, int64_t* wire);
// The value of limbs wire[0..2] (each possibly the sum of several ranks' limbs).
FixedGrad WireToFixed(const int64_t* wire);

class ExactSum {
 public:
  ExactSum();
  void Add(double x);  // exact; NaN or infinity make the result NaN
  // Digits for an integer all-reduce: the sum of several accumulators' Digits() (element-wise
  // int64 addition, up to 2^20 of them) is the Digits() of the sum of all their terms.
  std::vector<int64_t> Digits() const;
  static ExactSum FromDigits(const std::vector<int64_t>& digits);
  // The exact sum rounded to the nearest double (ties to even); NaN if a term was not finite.
  double ToDouble() const;

  static constexpr int kDigitBits = 32;
  static constexpr int kNumDigits = 68;               // 2176 bits: 2^-1074 .. 2^1102
  static constexpr int kDigitsSize = kNumDigits + 1;  // + the count of non-finite terms

 private:
  void Normalize();
  std::vector<int64_t> digit_;  // value = sum digit_[i] × 2^(32 i - 1074)
  int64_t nonfinite_ = 0;
  int64_t pending_ = 0;  // adds since the last Normalize
};

}  // namespace engine_min
