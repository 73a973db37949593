// Random numbers with fully specified bits: std::mt19937_64 (its output sequence is fixed by
// the C++ standard) plus our own mappings to uniform, normal and bounded integers, because the
// standard distributions are implementation-defined. Generator state is saved as the
// standard's text serialization (blob_kind "mt19937_64").
#pragma once

#include <array>
#include <cstdint>
#include <random>
#include <string>
#include <string_view>

#include "ckpt/status.h"

namespace engine_min {

inline constexpr std::string_view kMt19937BlobKind = "mt19937_64";

// SplitMix64 over the inputs: a well-mixed 64-bit seed from (seed, stream, a, b).
uint64_t MixSeed(uint64_t seed, uint64_t stream, uint64_t a, uint64_t b);

// [0, 1) with 53 random bits.
double UniformDouble(std::mt19937_64& gen);
// Standard normal (Box-Muller, consumes two draws).
double NormalDouble(std::mt19937_64& gen);
// Uniform in [0, bound) by rejection (no modulo bias); bound > 0.
uint64_t UniformBelow(std::mt19937_64& gen, uint64_t bound);

// Philox4x32-10 (Salmon et al., SC'11; the generator behind cuRAND's and JAX's counter-based
// streams): a keyed bijection of a 128-bit counter, so draw number `counter` under `key` is
// computed directly, with no state to save, restore or advance. Bit-exact with Random123's
// philox4x32_R(10, ctr, key) (its known-answer vectors are in the unit test).
using PhiloxCounter = std::array<uint32_t, 4>;
using PhiloxKey = std::array<uint32_t, 2>;
PhiloxCounter Philox4x32(PhiloxCounter counter, PhiloxKey key);

std::string SerializeRng(const std::mt19937_64& gen);
// DataLoss when the text is not a valid mt19937_64 state.
ckpt::Result<std::mt19937_64> ParseRng(std::string_view text);

}  // namespace engine_min
