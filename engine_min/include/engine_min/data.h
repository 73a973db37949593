// Training data: a byte corpus cut into samples of varying length, and the global sample
// order (one seeded shuffle per epoch, identical on every rank).
//
// The order is global on purpose: the global batch of optimizer step t is a fixed run of
// samples of that order, split over ranks and micro-steps afterwards. A run with another
// data-parallel size × grad-accum and the same global batch sees the same samples, and the
// saved position (epoch, sample_offset) means the same thing on every rank and every
// topology, so it survives a reshard.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "ckpt/env.h"
#include "ckpt/status.h"
#include "engine_min/model.h"

namespace engine_min {

struct Sample {
  int64_t begin = 0;   // byte offset in the corpus
  int64_t length = 0;  // bytes, each one a predicted token
};

class Corpus {
 public:
  // Reads `path` and cuts it into samples with lengths uniform in [min_len, max_len] drawn
  // from a generator with a fixed seed (the cut depends only on the corpus and the lengths).
  // The file is read through env (nullptr: ckpt::Env::Default()).
  static ckpt::Result<Corpus> Load(const std::string& path, int min_len, int max_len,
                                   ckpt::Env* env = nullptr);
  // For tests: an in-memory corpus.
  static ckpt::Result<Corpus> FromBytes(std::string bytes, int min_len, int max_len);

  const std::vector<Sample>& samples() const { return samples_; }
  const std::string& bytes() const { return bytes_; }
  const std::string& digest() const { return digest_; }  // XXH3 of the bytes

  // Appends the tokens of sample `id` to `batch` (contexts 0-padded before the sample start).
  void AppendTokens(int64_t id, int context, TokenBatch& batch) const;

 private:
  std::string bytes_;
  std::vector<Sample> samples_;
  std::string digest_;
};

// Where the loader is: sample `sample_offset` of epoch `epoch`'s order.
struct DataPosition {
  int64_t epoch = 0;
  int64_t sample_offset = 0;
  nlohmann::json ToJson(int64_t samples_per_epoch) const;
  static ckpt::Result<DataPosition> FromJson(const nlohmann::json& j);
};

// The epoch permutations. The shuffle generator's saved state is its state at the start of
// the current epoch, so a restore can redraw the current epoch's permutation.
class GlobalOrder {
 public:
  GlobalOrder(int64_t num_samples, std::mt19937_64 epoch_start_rng, DataPosition position);
  // The fresh-start generator of a seed (what --reset-on-resume rng restores).
  static std::mt19937_64 FreshShuffleRng(uint64_t seed);
  // Reconstructs the epoch-start generator of `epoch` from the seed by replaying the
  // permutations before it (used when a rank file carries no rng/shuffle).
  static std::mt19937_64 ShuffleRngAtEpoch(uint64_t seed, int64_t num_samples, int64_t epoch);

  // The next `count` sample ids, crossing epoch boundaries as needed.
  std::vector<int64_t> Next(int64_t count);

  const DataPosition& position() const { return position_; }
  const std::mt19937_64& epoch_start_rng() const { return epoch_start_rng_; }
  int64_t num_samples() const { return num_samples_; }

 private:
  void DrawPermutation();
  int64_t num_samples_;
  std::mt19937_64 epoch_start_rng_;
  std::mt19937_64 rng_;
  DataPosition position_;
  std::vector<int64_t> perm_;
};

}  // namespace engine_min
