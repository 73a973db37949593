#include "engine_min/random.h"

#include <cmath>
#include <sstream>

namespace engine_min {

namespace {
uint64_t SplitMix(uint64_t& x) {
  uint64_t z = (x += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}
}  // namespace

uint64_t MixSeed(uint64_t seed, uint64_t stream, uint64_t a, uint64_t b) {
  uint64_t x = seed;
  uint64_t h = SplitMix(x);
  for (uint64_t v : {stream, a, b}) {
    x ^= v + 0x632be59bd9b4e019ULL + (h << 6) + (h >> 2);
    h ^= SplitMix(x);
  }
  return h;
}

double UniformDouble(std::mt19937_64& gen) {
  return static_cast<double>(gen() >> 11) * (1.0 / 9007199254740992.0);
}

double NormalDouble(std::mt19937_64& gen) {
  const double u1 = 1.0 - UniformDouble(gen);  // (0, 1]
  const double u2 = UniformDouble(gen);
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
}

uint64_t UniformBelow(std::mt19937_64& gen, uint64_t bound) {
  // Accept draws below the largest multiple of bound.
  const uint64_t limit = UINT64_MAX - (UINT64_MAX % bound);
  uint64_t x;
  do {
    x = gen();
  } while (x >= limit);
  return x % bound;
}

PhiloxCounter Philox4x32(PhiloxCounter c, PhiloxKey k) {
  constexpr uint32_t kM0 = 0xD2511F53u, kM1 = 0xCD9E8D57u;  // round multipliers
  constexpr uint32_t kW0 = 0x9E3779B9u, kW1 = 0xBB67AE85u;  // Weyl key increments
  for (int round = 0; round < 10; ++round) {
    if (round > 0) {
      k[0] += kW0;
      k[1] += kW1;
    }
    const uint64_t p0 = static_cast<uint64_t>(kM0) * c[0];
    const uint64_t p1 = static_cast<uint64_t>(kM1) * c[2];
    const uint32_t hi0 = static_cast<uint32_t>(p0 >> 32), lo0 = static_cast<uint32_t>(p0);
    const uint32_t hi1 = static_cast<uint32_t>(p1 >> 32), lo1 = static_cast<uint32_t>(p1);
    c = {hi1 ^ c[1] ^ k[0], lo1, hi0 ^ c[3] ^ k[1], lo0};
  }
  return c;
}

std::string SerializeRng(const std::mt19937_64& gen) {
  std::ostringstream out;
  out << gen;
  return out.str();
}

ckpt::Result<std::mt19937_64> ParseRng(std::string_view text) {
  std::istringstream in{std::string(text)};
  std::mt19937_64 gen;
  in >> gen;
  if (in.fail()) return ckpt::DataLoss("not a valid mt19937_64 state");
  std::string rest;
  in >> rest;
  if (!rest.empty()) return ckpt::DataLoss("trailing bytes after an mt19937_64 state");
  return gen;
}

}  // namespace engine_min
