#include "engine_min/exact_sum.h"

#include <bit>
#include <cmath>
#include <cstring>

namespace engine_min {

namespace {

using U128 = unsigned __int128;

int HighestBit(U128 u) {  // u != 0
  const uint64_t hi = static_cast<uint64_t>(u >> 64);
  if (hi != 0) return 127 - std::countl_zero(hi);
  return 63 - std::countl_zero(static_cast<uint64_t>(u));
}

// u >> shift rounded to nearest, ties to even; `sticky`: nonzero bits below u were dropped
// earlier (they break ties upward).
U128 ShiftRoundEven(U128 u, int shift, bool sticky) {
  if (shift <= 0) return u;
  if (shift >= 128) return 0;
  const U128 q = u >> shift;
  const U128 rem = u & ((U128(1) << shift) - 1);
  const U128 half = U128(1) << (shift - 1);
  const bool up = rem > half || (rem == half && (sticky || (q & 1) != 0));
  return q + (up ? 1 : 0);
}

}  // namespace

bool FloatToFixed(float x, FixedGrad* out) {
  *out = 0;
  const uint32_t bits = std::bit_cast<uint32_t>(x);
  const int biased = static_cast<int>((bits >> 23) & 0xff);
  const uint32_t frac = bits & 0x7fffff;
  // |x| < 2^10 <=> biased exponent < 127 + 10; this also rejects infinities and NaN.
  if (biased >= 127 + kFixedTermExp) return false;
  // x = mant × 2^(exp2), exp2 = biased - 150 (normal) or -149 (subnormal).
  const uint32_t mant = biased == 0 ? frac : (frac | 0x800000u);
  const int shift = (biased == 0 ? 1 : biased) - 150 + kFixedFracBits;
  U128 mag;
  if (shift >= 0) {
    mag = U128(mant) << shift;  // shift <= 82: below 2^106
  } else {
    mag = ShiftRoundEven(U128(mant), -shift, false);
  }
  const FixedGrad v = static_cast<FixedGrad>(mag);
  *out = (bits >> 31) ? -v : v;
  return true;
}

float FixedToFloat(FixedGrad v) {
  if (v == 0) return 0.0f;
  const bool negative = v < 0;
  const U128 mag = negative ? U128(0) - static_cast<U128>(v) : static_cast<U128>(v);
  const int top = HighestBit(mag);
  const int shift = top > 23 ? top - 23 : 0;
  const U128 q = ShiftRoundEven(mag, shift, false);  // <= 2^24: exact in fp32
  const float f = std::ldexp(static_cast<float>(static_cast<uint32_t>(q)), shift - kFixedFracBits);
  return negative ? -f : f;
}

int64_t AddFixedTerms(float* terms, FixedGrad* acc, size_t n) {
  int64_t out_of_range = 0;
  for (size_t i = 0; i < n; ++i) {
    if (terms[i] == 0.0f) continue;
    FixedGrad v;
    if (FloatToFixed(terms[i], &v)) {
      acc[i] += v;
    } else {
      ++out_of_range;
    }
    terms[i] = 0.0f;
  }
  return out_of_range;
}

void FixedToWire(const FixedGrad* v, size_t n, int64_t* wire) {
  constexpr U128 kMask = (U128(1) << kWireLimbBits) - 1;
  for (size_t i = 0; i < n; ++i) {
    const U128 u = static_cast<U128>(v[i]);  // two's complement bits
    wire[3 * i] = static_cast<int64_t>(u & kMask);
    wire[3 * i + 1] = static_cast<int64_t>((u >> kWireLimbBits) & kMask);
    // Arithmetic shift: the top limb carries the sign (|v| < 2^127, so it fits in 42 bits).
    wire[3 * i + 2] = static_cast<int64_t>(v[i] >> (2 * kWireLimbBits));
  }
}

FixedGrad WireToFixed(const int64_t* wire) {
  // Multiplications, not shifts, so negative limbs need no special case; every partial sum of
  // ranks is a valid FixedGrad within the documented bounds, so none of this overflows.
  return FixedGrad(wire[0]) + FixedGrad(wire[1]) * (FixedGrad(1) << kWireLimbBits) +
         FixedGrad(wire[2]) * (FixedGrad(1) << (2 * kWireLimbBits));
}

ExactSum::ExactSum() : digit_(kNumDigits, 0) {}

void ExactSum::Add(double x) {
  if (x == 0.0) return;
  if (!std::isfinite(x)) {
    ++nonfinite_;
    return;
  }
  const uint64_t bits = std::bit_cast<uint64_t>(x);
  const int biased = static_cast<int>((bits >> 52) & 0x7ff);
  const uint64_t frac = bits & ((uint64_t(1) << 52) - 1);
  const uint64_t mant = biased == 0 ? frac : (frac | (uint64_t(1) << 52));
  // x = mant × 2^(pos - 1074), pos = bit position of mant's lowest bit in the accumulator.
  const int pos = biased == 0 ? 0 : biased - 1;
  const int d = pos / kDigitBits;
  const U128 t = U128(mant) << (pos % kDigitBits);  // below 2^84: three digits
  const int64_t piece[3] = {static_cast<int64_t>(t & 0xffffffffu),
                            static_cast<int64_t>((t >> 32) & 0xffffffffu),
                            static_cast<int64_t>(t >> 64)};
  const bool negative = (bits >> 63) != 0;
  for (int k = 0; k < 3; ++k) digit_[d + k] += negative ? -piece[k] : piece[k];
  // Each add moves a digit by less than 2^32; int64 digits absorb 2^30 adds safely.
  if (++pending_ >= (int64_t(1) << 30)) Normalize();
}

void ExactSum::Normalize() {
  // Floor carries: digits 0..n-2 end in [0, 2^32); the top digit keeps the sign.
  for (int i = 0; i + 1 < kNumDigits; ++i) {
    const int64_t carry = digit_[i] >> kDigitBits;  // arithmetic: floor division
    digit_[i] -= carry * (int64_t(1) << kDigitBits);
    digit_[i + 1] += carry;
  }
  pending_ = 0;
}

std::vector<int64_t> ExactSum::Digits() const {
  ExactSum n = *this;
  n.Normalize();  // every digit below 2^32 in magnitude: 2^20 ranks' sums fit in int64
  std::vector<int64_t> out = n.digit_;
  out.push_back(nonfinite_);
  return out;
}

ExactSum ExactSum::FromDigits(const std::vector<int64_t>& digits) {
  ExactSum s;
  std::copy(digits.begin(), digits.begin() + kNumDigits, s.digit_.begin());
  s.nonfinite_ = digits[kNumDigits];
  s.Normalize();
  return s;
}

double ExactSum::ToDouble() const {
  if (nonfinite_ > 0) return std::nan("");
  ExactSum n = *this;
  n.Normalize();
  bool negative = n.digit_[kNumDigits - 1] < 0;
  if (negative) {
    for (int64_t& d : n.digit_) d = -d;
    n.Normalize();
  }
  int h = kNumDigits - 1;
  while (h >= 0 && n.digit_[h] == 0) --h;
  if (h < 0) return 0.0;
  // The top three digits (96 bits, the leading one nonzero) and whether anything lies below.
  auto digit = [&](int i) { return i >= 0 ? static_cast<uint64_t>(n.digit_[i]) : uint64_t(0); };
  const U128 window = (U128(digit(h)) << 64) | (U128(digit(h - 1)) << 32) | U128(digit(h - 2));
  bool sticky = false;
  for (int i = 0; i < h - 2; ++i) sticky = sticky || n.digit_[i] != 0;
  const int base = kDigitBits * (h - 2) - 1074;  // exponent of the window's lowest bit
  const int top = HighestBit(window);
  // Keep 53 significant bits, fewer where the result is subnormal (its last bit is 2^-1074).
  int shift = top > 52 ? top - 52 : 0;
  if (base + shift < -1074) shift = -1074 - base;
  const U128 q = ShiftRoundEven(window, shift, sticky);  // <= 2^53: exact in a double
  const double r = std::ldexp(static_cast<double>(static_cast<uint64_t>(q)), base + shift);
  return negative ? -r : r;
}

}  // namespace engine_min
