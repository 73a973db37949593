#include "ckpt/synth.h"

#include <algorithm>
#include <random>
#include <sstream>

#include "ckpt/aligned_buffer.h"
#include "ckpt/rank_threads.h"

namespace ckpt {

namespace {

uint64_t SplitMix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

uint64_t StateId(std::string_view state) {
  if (state == kMaster) return 1;
  if (state == kExpAvg) return 2;
  if (state == kExpAvgSq) return 3;
  return 4;
}

std::vector<int64_t> ShapeFor(int64_t n) {
  if (n >= 64 && n % 64 == 0) return {n / 64, 64};
  return {n};
}

}  // namespace

float SynthValue(uint64_t seed, int64_t step, size_t param_index, std::string_view state,
                 int64_t element) {
  const uint64_t key = SplitMix(seed * 0x100000001b3ull ^ static_cast<uint64_t>(step) * 0x9e37ull ^
                                (static_cast<uint64_t>(param_index) << 40) ^ (StateId(state) << 56));
  const uint64_t h = SplitMix(key ^ static_cast<uint64_t>(element));
  const float u = static_cast<float>(h >> 40) * (1.0f / 16777216.0f);  // [0, 1)
  switch (StateId(state)) {
    case 1: return (u * 2.0f - 1.0f) * 0.05f;
    case 2: return (u * 2.0f - 1.0f) * 1e-3f;
    case 3: return u * 1e-6f;
    default: return (u * 2.0f - 1.0f) * 0.5f;
  }
}

std::vector<ParamEntry> SynthParamTable(int64_t params, int64_t largest_tensor) {
  std::vector<ParamEntry> out;
  const int64_t frozen = params >= 64 ? std::min<int64_t>(4096, params / 64) : 0;
  const int64_t trainable = params - frozen;
  int64_t largest = largest_tensor > 0 ? std::min(largest_tensor, trainable)
                                       : std::max<int64_t>(1, trainable / 4);
  auto add = [&](std::string name, int64_t n) {
    ParamEntry p;
    p.name = std::move(name);
    p.shape = ShapeFor(n);
    p.numel = n;
    out.push_back(std::move(p));
  };
  add("embed.weight", largest);
  ParamEntry tied = out[0];
  tied.name = "lm_head.weight";
  tied.tied_to = "embed.weight";
  out.push_back(tied);
  int64_t left = trainable - largest;
  // Blocks of half the largest tensor (at most ~4096 of them, never larger than it); the last
  // one takes the remainder.
  const int64_t block =
      std::min(largest, std::max<int64_t>(1, std::max(largest / 2, left / 4096 + 1)));
  for (int i = 0; left > 0; ++i) {
    const int64_t n = std::min(block, left);
    add("blocks." + std::to_string(i) + ".weight", n);
    left -= n;
  }
  if (frozen > 0) {
    ParamEntry p;
    p.name = "pos_table";
    p.shape = ShapeFor(frozen);
    p.numel = frozen;
    p.dtype = DType::kBF16;
    p.frozen = true;
    out.push_back(std::move(p));
  }
  return out;
}

Result<Manifest> SynthManifest(const SynthOptions& o, int64_t step) {
  if (o.ranks < 1) return InvalidArgument("--ranks must be at least 1");
  if (o.params < 1) return InvalidArgument("--params must be at least 1");
  Manifest meta;
  meta.tag = "global_step" + std::to_string(step);
  meta.counters = {step, step, 0, step * 64, step * 64 * 128};
  meta.topology.dp_world_size = o.ranks;
  meta.topology.zero_stage = o.zero_stage;
  meta.optimizer = {{"type", "adamw"}, {"lr", 1e-4},  {"beta1", 0.9},
                    {"beta2", 0.999},  {"eps", 1e-8}, {"weight_decay", 0.01}};
  meta.dtypes = {{"master", "fp32"}, {"exp_avg", "fp32"}, {"exp_avg_sq", "fp32"}};
  meta.params = SynthParamTable(o.params, o.largest_tensor);
  CKPT_ASSIGN_OR_RETURN(meta.partition, BuildPartition(meta.params, o.ranks, o.zero_stage),
                        "synth");
  meta.client_state = {{"synthetic", true}, {"seed", o.seed}};
  meta.engine_config = {{"generator", "ckpt synth"}};
  return meta;
}

void FillSynthRank(const Manifest& meta, uint64_t seed, int rank, SynthRankState& out,
                   bool values) {
  const int64_t step = meta.counters.global_step;
  const int64_t shard = meta.partition.shard_numel[static_cast<size_t>(rank)];
  const std::string_view names[3] = {kMaster, kExpAvg, kExpAvgSq};
  float* state[3];
  for (int s = 0; s < 3; ++s) {
    out.state[s] = AlignedBuffer(static_cast<size_t>(shard) * sizeof(float));
    state[s] = out.state[s].as<float>();
    std::fill_n(state[s], shard, 0.0f);
  }
  for (size_t pi = 0; values && pi < meta.params.size(); ++pi) {
    for (const auto& r : meta.params[pi].ranges) {
      if (r.rank != rank) continue;
      for (int s = 0; s < 3; ++s)
        for (int64_t e = r.begin; e < r.end; ++e)
          state[s][static_cast<size_t>(r.shard_offset + e - r.begin)] =
              SynthValue(seed, step, pi, names[s], e);
    }
  }
  out.contents = RankContents{};
  for (int s = 0; s < 3; ++s)
    out.contents.datasets.push_back(
        DatasetSpec::Tensor(std::string(names[s]), DType::kF32, {shard}, state[s]));
  out.frozen.clear();
  if (rank == 0) {
    for (size_t pi = 0; pi < meta.params.size(); ++pi)
      if (meta.params[pi].frozen) out.frozen.emplace_back();
    size_t f = 0;
    for (size_t pi = 0; pi < meta.params.size(); ++pi) {
      const auto& p = meta.params[pi];
      if (!p.frozen) continue;
      auto& table = out.frozen[f++];
      table.resize(static_cast<size_t>(p.numel));
      for (int64_t e = 0; e < p.numel; ++e)
        table[static_cast<size_t>(e)] = FloatToBf16(SynthValue(seed, step, pi, "frozen", e));
      out.contents.datasets.push_back(DatasetSpec::Tensor(std::string(kFrozenPrefix) + p.name,
                                                          DType::kBF16, p.shape, table.data()));
    }
  }
  std::mt19937_64 gen(seed * 1000003ull + static_cast<uint64_t>(rank) * 7919ull +
                      static_cast<uint64_t>(step));
  std::ostringstream rng;
  rng << gen;
  out.rng = rng.str();
  out.data_pos = nlohmann::json{{"epoch", 0}, {"sample_offset", step * 64}}.dump();
  out.sched = nlohmann::json{{"kind", "constant"}, {"last_lr", 1e-4}, {"step", step}}.dump();
  out.contents.datasets.push_back(DatasetSpec::Blob("rng/dropout", "mt19937_64", out.rng));
  out.contents.datasets.push_back(DatasetSpec::Json(std::string(kDataPosition), out.data_pos));
  out.contents.datasets.push_back(DatasetSpec::Json(std::string(kScheduler), out.sched));
}

Result<std::vector<std::string>> WriteSynthetic(const std::string& root, const SynthOptions& o) {
  if (o.tags < 1) return InvalidArgument("--tags must be at least 1");
  std::vector<std::string> tags;
  for (int t = 0; t < o.tags; ++t) {
    CKPT_ASSIGN_OR_RETURN(const Manifest meta, SynthManifest(o, 100 * (t + 1)), "synth");
    ThreadGroup group(o.ranks);
    auto rank_body = [&](int rank) -> Status {
      SynthRankState mine;
      FillSynthRank(meta, o.seed, rank, mine);
      SaveOptions so;
      so.env = o.env;
      so.compression = o.compression;
      so.keep_last = o.keep_last;
      so.chunk_bytes = o.chunk_bytes;
      so.piece_bytes = o.piece_bytes;
      Status saved = SaveCheckpoint(root, meta, mine.contents, group.ForRank(rank), so);
      if (o.on_bytes)
        o.on_bytes(static_cast<uint64_t>(meta.partition.shard_numel[static_cast<size_t>(rank)]) *
                   12);
      return saved;
    };
    // A rank thread that runs out of memory (or cannot start) fails cleanly and aborts the
    // group, so the other ranks stop waiting for it.
    const std::vector<Status> results = RunOnThreads(o.ranks, rank_body, &group);
    for (int r = 0; r < o.ranks; ++r)
      CKPT_RETURN_IF_ERROR(results[static_cast<size_t>(r)], "synth rank " + std::to_string(r));
    tags.push_back(meta.tag);
  }
  return tags;
}

}  // namespace ckpt
