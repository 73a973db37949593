// Invariant mode's building blocks: Philox4x32-10 against Random123's known-answer vectors, the
// fixed-point gradient sums and the exact scalar sums against independent Python references
// (fractions.Fraction, math.fsum), and their independence from term order and rank split.
#include <algorithm>
#include <bit>
#include <catch2/catch.hpp>
#include <cfloat>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "engine_min/exact_sum.h"
#include "engine_min/random.h"
#include "test_util.h"

using namespace engine_min;

namespace {

bool HavePython() { return ckpt::testing::RunShell("/usr/bin/python3 -c 'import fractions'") == 0; }

std::string Hex(double x) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%a", x);
  return buf;
}

// Terms spread over the whole fixed-point range (2^-110 .. 2^9), both signs, with ties.
std::vector<float> WideTerms(size_t n, uint64_t seed) {
  std::mt19937_64 gen(seed);
  std::vector<float> t(n);
  for (size_t i = 0; i < n; ++i) {
    const int e = static_cast<int>(gen() % 120) - 110;
    const float mant = static_cast<float>(gen() % (1u << 24)) / float(1u << 23);
    t[i] = std::ldexp(mant, e) * ((gen() & 1) ? -1.0f : 1.0f);
  }
  t[0] = std::ldexp(1.0f, -97);        // exactly half a unit: rounds to 0 (even)
  t[1] = std::ldexp(3.0f, -97);        // one and a half units: rounds to 2
  t[2] = std::ldexp(1.0f, 9) * 1.99f;  // near the top of the range
  return t;
}

// Sums `terms` split over `ranks` "ranks" in a shuffled order, crossing the wire format.
FixedGrad SplitSum(const std::vector<float>& terms, int ranks, uint64_t seed) {
  std::vector<float> order = terms;
  std::shuffle(order.begin(), order.end(), std::mt19937_64(seed));
  std::vector<int64_t> wire_total(kWireLimbs, 0);
  for (int r = 0; r < ranks; ++r) {
    FixedGrad acc = 0;
    for (size_t i = r; i < order.size(); i += ranks) {
      float x = order[i];
      REQUIRE(AddFixedTerms(&x, &acc, 1) == 0);
      CHECK(x == 0.0f);  // the scratch is cleared
    }
    int64_t wire[kWireLimbs];
    FixedToWire(&acc, 1, wire);
    for (int k = 0; k < kWireLimbs; ++k) wire_total[k] += wire[k];
  }
  return WireToFixed(wire_total.data());
}

}  // namespace

TEST_CASE("Philox4x32-10 reproduces Random123's known-answer vectors", "[unit]") {
  // Random123 kat_vectors, philox4x32 with 10 rounds.
  CHECK(Philox4x32({0, 0, 0, 0}, {0, 0}) ==
        PhiloxCounter{0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8});
  CHECK(Philox4x32({0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff}, {0xffffffff, 0xffffffff}) ==
        PhiloxCounter{0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd});
  CHECK(Philox4x32({0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344}, {0xa4093822, 0x299f31d0}) ==
        PhiloxCounter{0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1});
}

TEST_CASE("fixed point: grid rounding, range and round trips", "[unit]") {
  FixedGrad v;
  REQUIRE(FloatToFixed(1.0f, &v));
  CHECK(v == (FixedGrad(1) << 96));
  REQUIRE(FloatToFixed(std::ldexp(1.0f, -97), &v));
  CHECK(v == 0);  // a tie rounds to even
  REQUIRE(FloatToFixed(std::ldexp(3.0f, -97), &v));
  CHECK(v == 2);
  REQUIRE(FloatToFixed(-std::ldexp(3.0f, -97), &v));
  CHECK(v == -2);
  REQUIRE(FloatToFixed(std::nextafter(1024.0f, 0.0f), &v));
  CHECK_FALSE(FloatToFixed(1024.0f, &v));
  CHECK_FALSE(FloatToFixed(-1024.0f, &v));
  CHECK_FALSE(FloatToFixed(INFINITY, &v));
  CHECK_FALSE(FloatToFixed(NAN, &v));
  // Every float on the grid (|x| >= 2^-73: its last bit is >= 2^-96) round-trips exactly.
  std::mt19937_64 gen(3);
  for (int i = 0; i < 100000; ++i) {
    const int e = static_cast<int>(gen() % 82) - 73;
    const float x = std::ldexp(1.0f + static_cast<float>(gen() % (1u << 23)) / float(1u << 23), e) *
                    ((gen() & 1) ? -1.0f : 1.0f);
    if (std::fabs(x) >= 1024.0f) continue;
    REQUIRE(FloatToFixed(x, &v));
    REQUIRE(std::bit_cast<uint32_t>(FixedToFloat(v)) == std::bit_cast<uint32_t>(x));
  }
  // Out-of-range terms are counted, not added.
  std::vector<float> terms = {1.0f, 2048.0f, NAN, -0.5f};
  std::vector<FixedGrad> acc(4, 0);
  CHECK(AddFixedTerms(terms.data(), acc.data(), 4) == 2);
  CHECK(acc[1] == 0);
  CHECK(FixedToFloat(acc[0]) == 1.0f);
  CHECK(FixedToFloat(acc[3]) == -0.5f);
}

TEST_CASE("fixed-point sums do not depend on order or rank split and match Fraction", "[unit]") {
  const std::vector<float> terms = WideTerms(4000, 11);
  const FixedGrad s1 = SplitSum(terms, 1, 1);
  CHECK(SplitSum(terms, 2, 2) == s1);
  CHECK(SplitSum(terms, 3, 3) == s1);
  CHECK(SplitSum(terms, 7, 4) == s1);
  // A negative sum crosses the wire too.
  std::vector<float> negated = terms;
  for (float& x : negated) x = -x;
  CHECK(SplitSum(negated, 4, 5) == -s1);
  const float got = FixedToFloat(s1);
  // Reference: each term rounded to the 2^-96 grid (Python's round: ties to even), summed as
  // a Fraction, rounded to the nearest fp32 (ties to even) by hand.
  if (!HavePython()) {
    WARN("skipped the Fraction reference: /usr/bin/python3 is not available");
    return;
  }
  ckpt::testing::ScratchDir dir("invariant-fixed");
  {
    std::ofstream out(dir / "terms.txt");
    for (float x : terms) out << Hex(x) << "\n";
  }
  {
    std::ofstream py(dir / "ref.py");
    py << "import sys\n"
          "from fractions import Fraction as F\n"
          "u = F(1, 2**96)\n"
          "s = sum(round(F(float.fromhex(l)) / u) for l in open(sys.argv[1])) * u\n"
          "neg = s < 0; s = abs(s)\n"
          "e = 0\n"
          "while s >= 2**(e + 1): e += 1\n"
          "while s < 2**e: e -= 1\n"
          "q = round(s / F(2)**(e - 23)) * F(2)**(e - 23)  # 24 bits: float(q) is exact\n"
          "print(('-' if neg else '') + float(q).hex())\n";
  }
  REQUIRE(ckpt::testing::RunShell("/usr/bin/python3 " + (dir / "ref.py") + " " +
                                  (dir / "terms.txt") + " > " + (dir / "out.txt")) == 0);
  std::ifstream in(dir / "out.txt");
  std::string line;
  std::getline(in, line);
  INFO("python: " << line);
  const double want = std::strtod(line.c_str(), nullptr);
  CHECK(static_cast<double>(got) == want);
}

TEST_CASE("exact scalar sums match math.fsum and merge across ranks", "[unit]") {
  std::mt19937_64 gen(5);
  std::vector<double> xs;
  for (int i = 0; i < 3000; ++i) {
    const int e = static_cast<int>(gen() % 2000) - 1000;
    xs.push_back(std::ldexp(static_cast<double>(gen() >> 11) / 9007199254740992.0, e) *
                 ((gen() & 1) ? -1.0 : 1.0));
  }
  // Cancellation that a floating-point sum gets wrong, subnormals, and the extremes.
  for (double x : {1e300, -1e300, 1.0, 1e-300, 4.9e-324, -2.5e-320, 0.1, 0.2, -0.3}) {
    xs.push_back(x);
  }
  ExactSum whole;
  for (double x : xs) whole.Add(x);
  // Three "ranks" in shuffled orders, merged through their digits.
  std::vector<double> order = xs;
  std::shuffle(order.begin(), order.end(), gen);
  std::vector<int64_t> merged(ExactSum::kDigitsSize, 0);
  for (int r = 0; r < 3; ++r) {
    ExactSum part;
    for (size_t i = r; i < order.size(); i += 3) part.Add(order[i]);
    const std::vector<int64_t> d = part.Digits();
    for (size_t k = 0; k < d.size(); ++k) merged[k] += d[k];
  }
  const double got = whole.ToDouble();
  CHECK(std::bit_cast<uint64_t>(ExactSum::FromDigits(merged).ToDouble()) ==
        std::bit_cast<uint64_t>(got));
  ExactSum tiny;
  tiny.Add(4.9e-324);
  tiny.Add(4.9e-324);
  CHECK(tiny.ToDouble() == 2 * 4.9e-324);
  // An intermediate sum beyond the double range is no problem (math.fsum would overflow).
  ExactSum big;
  for (double x : {DBL_MAX, DBL_MAX, -DBL_MAX}) big.Add(x);
  CHECK(big.ToDouble() == DBL_MAX);
  ExactSum bad;
  bad.Add(1.0);
  bad.Add(INFINITY);
  CHECK(std::isnan(bad.ToDouble()));

  if (!HavePython()) {
    WARN("skipped the math.fsum reference: /usr/bin/python3 is not available");
    return;
  }
  ckpt::testing::ScratchDir dir("invariant-fsum");
  {
    std::ofstream out(dir / "xs.txt");
    for (double x : xs) out << Hex(x) << "\n";
  }
  REQUIRE(ckpt::testing::RunShell(
              "/usr/bin/python3 -c \"import math,sys; "
              "print(math.fsum(float.fromhex(l) for l in open(sys.argv[1])).hex())\" " +
              (dir / "xs.txt") + " > " + (dir / "out.txt")) == 0);
  std::ifstream in(dir / "out.txt");
  std::string line;
  std::getline(in, line);
  INFO("math.fsum: " << line << ", ExactSum: " << Hex(got));
  CHECK(std::strtod(line.c_str(), nullptr) == got);
}
