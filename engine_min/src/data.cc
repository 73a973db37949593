#include "engine_min/data.h"

#include <numeric>

#include "ckpt/hash.h"
#include "engine_min/random.h"

namespace engine_min {

ckpt::Result<Corpus> Corpus::Load(const std::string& path, int min_len, int max_len,
                                  ckpt::Env* env) {
  if (!env) env = ckpt::Env::Default();
  CKPT_ASSIGN_OR_RETURN(std::string bytes, env->ReadFileToString(path), "corpus");
  auto corpus = FromBytes(std::move(bytes), min_len, max_len);
  if (!corpus.ok()) return corpus.status().WithContext("corpus " + path);
  return corpus;
}

ckpt::Result<Corpus> Corpus::FromBytes(std::string bytes, int min_len, int max_len) {
  if (min_len < 2 || max_len < min_len) {
    return ckpt::InvalidArgument("sample lengths must satisfy 2 <= min <= max");
  }
  if (static_cast<int64_t>(bytes.size()) < 2 * static_cast<int64_t>(max_len)) {
    return ckpt::InvalidArgument("corpus has " + std::to_string(bytes.size()) +
                                 " bytes, too few for samples of up to " + std::to_string(max_len));
  }
  Corpus c;
  c.bytes_ = std::move(bytes);
  c.digest_ = ckpt::DigestHex(ckpt::Xxh3(c.bytes_.data(), c.bytes_.size()));
  std::mt19937_64 gen(MixSeed(0x636f72707573ULL, static_cast<uint64_t>(min_len),
                              static_cast<uint64_t>(max_len), 0));
  const int64_t size = static_cast<int64_t>(c.bytes_.size());
  int64_t pos = 0;
  while (pos < size) {
    int64_t len = min_len + static_cast<int64_t>(UniformBelow(gen, max_len - min_len + 1));
    if (pos + len > size) len = size - pos;
    if (len < 2) break;
    c.samples_.push_back({pos, len});
    pos += len;
  }
  return c;
}

void Corpus::AppendTokens(int64_t id, int context, TokenBatch& batch) const {
  const Sample& s = samples_[static_cast<size_t>(id)];
  const auto* data = reinterpret_cast<const uint8_t*>(bytes_.data()) + s.begin;
  for (int64_t t = 0; t < s.length; ++t) {
    for (int j = 0; j < context; ++j) {
      const int64_t src = t - 1 - j;
      batch.ctx.push_back(src >= 0 ? data[src] : 0);
    }
    batch.target.push_back(data[t]);
  }
  batch.tokens += s.length;
}

nlohmann::json DataPosition::ToJson(int64_t samples_per_epoch) const {
  return {{"epoch", epoch},
          {"sample_offset", sample_offset},
          {"samples_per_epoch", samples_per_epoch},
          {"order", "global"}};
}

ckpt::Result<DataPosition> DataPosition::FromJson(const nlohmann::json& j) {
  if (!j.is_object() || !j.contains("epoch") || !j.contains("sample_offset") ||
      !j["epoch"].is_number_integer() || !j["sample_offset"].is_number_integer()) {
    return ckpt::DataLoss("data_position must be {\"epoch\": int, \"sample_offset\": int}");
  }
  DataPosition p;
  p.epoch = j["epoch"].get<int64_t>();
  p.sample_offset = j["sample_offset"].get<int64_t>();
  if (p.epoch < 0 || p.sample_offset < 0) return ckpt::DataLoss("data_position is negative");
  return p;
}

GlobalOrder::GlobalOrder(int64_t num_samples, std::mt19937_64 epoch_start_rng,
                         DataPosition position)
    : num_samples_(num_samples), epoch_start_rng_(epoch_start_rng), position_(position) {
  DrawPermutation();
}

std::mt19937_64 GlobalOrder::FreshShuffleRng(uint64_t seed) {
  return std::mt19937_64(MixSeed(seed, 0x73687566666c65ULL, 0, 0));
}

std::mt19937_64 GlobalOrder::ShuffleRngAtEpoch(uint64_t seed, int64_t num_samples, int64_t epoch) {
  GlobalOrder order(num_samples, FreshShuffleRng(seed), DataPosition{});
  // The move into epoch e happens when its first sample is taken.
  for (int64_t e = 0; e < epoch; ++e) {
    order.Next(e == 0 ? num_samples : num_samples - 1);
    order.Next(1);
  }
  return order.epoch_start_rng();
}

void GlobalOrder::DrawPermutation() {
  rng_ = epoch_start_rng_;
  perm_.resize(static_cast<size_t>(num_samples_));
  std::iota(perm_.begin(), perm_.end(), int64_t{0});
  for (int64_t i = num_samples_ - 1; i > 0; --i) {
    const int64_t j = static_cast<int64_t>(UniformBelow(rng_, static_cast<uint64_t>(i + 1)));
    std::swap(perm_[i], perm_[j]);
  }
}

std::vector<int64_t> GlobalOrder::Next(int64_t count) {
  std::vector<int64_t> ids;
  ids.reserve(static_cast<size_t>(count));
  while (count > 0) {
    if (position_.sample_offset >= num_samples_) {
      // Next epoch: the generator continues from where this epoch's shuffle left it.
      epoch_start_rng_ = rng_;
      ++position_.epoch;
      position_.sample_offset = 0;
      DrawPermutation();
    }
    ids.push_back(perm_[static_cast<size_t>(position_.sample_offset)]);
    ++position_.sample_offset;
    --count;
  }
  return ids;
}

}  // namespace engine_min
