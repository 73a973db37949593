#include "ckpt/load_resharded.h"

#include <algorithm>

#include "ckpt/aligned_buffer.h"
#include "ckpt/shape.h"

namespace ckpt {
namespace {

constexpr std::string_view kReshardRecord = "reshard";  // `ckpt reshard`'s own json dataset

std::string Describe(const ParamEntry& p) {
  std::string s = p.name + " " + ShapeText(p.shape, ",");
  if (p.frozen) s += " (frozen)";
  if (!p.tied_to.empty()) s += " (tied to " + p.tied_to + ")";
  return s;
}

}  // namespace

Result<ReshardTarget> PlanReshard(const Manifest& source, int world, int zero_stage) {
  if (world < 1) return InvalidArgument("world size must be at least 1 (got " + std::to_string(world) + ")");
  if (zero_stage < 0 || zero_stage > 3)
    return InvalidArgument("ZeRO stage must be 0, 1, 2 or 3 (got " + std::to_string(zero_stage) + ")");
  ReshardTarget t;
  t.world = world;
  t.zero_stage = zero_stage;
  t.params = source.params;
  for (auto& p : t.params) p.ranges.clear();
  CKPT_ASSIGN_OR_RETURN(t.partition,
                        BuildPartition(t.params, world, zero_stage, source.partition.alignment),
                        "partition");
  return t;
}

Status CheckReshardable(const Manifest& source, const ReshardTarget& target,
                        const std::string& optimizer_type, const std::string& where) {
  if (source.topology.tp != 1 || source.topology.pp != 1)
    return FailedPrecondition(where + " was saved with tensor parallel " +
                              std::to_string(source.topology.tp) + " and pipeline parallel " +
                              std::to_string(source.topology.pp) +
                              "; only data-parallel checkpoints are resharded");
  if (source.params.size() != target.params.size())
    return FailedPrecondition("model shape differs: " + where + " has " +
                              std::to_string(source.params.size()) +
                              " parameters, this model has " +
                              std::to_string(target.params.size()));
  for (size_t i = 0; i < source.params.size(); ++i) {
    const ParamEntry& a = source.params[i];
    const ParamEntry& b = target.params[i];
    if (a.name != b.name || a.shape != b.shape || a.frozen != b.frozen || a.tied_to != b.tied_to)
      return FailedPrecondition("model shape differs: " + where + " has " + Describe(a) +
                                ", this model has " + Describe(b) + " (parameter " +
                                std::to_string(i) + ")");
  }
  if (!optimizer_type.empty() && source.optimizer.is_object() &&
      source.optimizer.contains("type") && source.optimizer["type"].is_string()) {
    const std::string type = source.optimizer["type"].get<std::string>();
    const bool same = type == optimizer_type ||
                      (optimizer_type == "adamw" && type == "adam");  // same two moments
    if (!same)
      return FailedPrecondition("optimizer differs: " + where + " holds '" + Excerpt(type, 64) +
                                "' state, this run uses '" + optimizer_type + "'");
  }
  if (static_cast<int>(target.partition.shard_numel.size()) != target.world)
    return InvalidArgument("reshard target: " + std::to_string(target.partition.shard_numel.size()) +
                           " shard lengths for world size " + std::to_string(target.world));
  return Status::Ok();
}

struct ReshardedShardReader::Impl {
  // One range of a parameter the rank owns: elements [begin, end) at `shard_offset`.
  struct Owned {
    std::string param;
    int64_t begin = 0, end = 0, shard_offset = 0;
  };
  std::unique_ptr<StateSource> src;
  int rank = 0;
  int world = 1;
  int64_t numel = 0;
  std::vector<Owned> owned;         // by shard_offset
  std::vector<std::string> frozen;  // frozen parameters stored whole (not tied aliases)
  LoadReshardOptions options;
  ReadAccounting acc;
};

ReshardedShardReader::~ReshardedShardReader() = default;

Result<std::unique_ptr<ReshardedShardReader>> ReshardedShardReader::Open(
    const std::string& source_path, const ReshardTarget& target, int rank,
    const LoadReshardOptions& options) {
  if (rank < 0 || rank >= target.world)
    return InvalidArgument("rank " + std::to_string(rank) + " outside the target's world size " +
                           std::to_string(target.world));
  SourceOptions so = options.source;
  so.stream_verify = false;
  so.verify_reads = !options.source_verified;
  std::unique_ptr<ReshardedShardReader> reader(new ReshardedShardReader());
  reader->impl_ = std::make_unique<Impl>();
  Impl& I = *reader->impl_;
  CKPT_ASSIGN_OR_RETURN(I.src, OpenStateSource(source_path, so), "");
  const Manifest& sm = I.src->manifest();
  CKPT_RETURN_IF_ERROR(CheckReshardable(sm, target, options.optimizer_type, I.src->dir()), "");
  I.rank = rank;
  I.world = target.world;
  I.options = options;
  I.numel = target.partition.shard_numel[static_cast<size_t>(rank)];
  for (const auto& f : sm.files)
    for (const auto& d : f.datasets) I.acc.piece_bytes = std::max(I.acc.piece_bytes, d.piece_bytes);
  for (size_t i = 0; i < target.params.size(); ++i) {
    const ParamEntry& p = target.params[i];
    if (p.frozen && p.tied_to.empty()) I.frozen.push_back(p.name);
    if (!p.trainable()) continue;
    const ParamEntry& sp = sm.params[i];
    for (const auto& r : p.ranges) {
      if (r.rank != rank || r.end <= r.begin) continue;
      if (r.shard_offset < 0 || r.shard_offset + (r.end - r.begin) > I.numel)
        return InvalidArgument("reshard target: parameter '" + p.name +
                               "' range lies outside rank " + std::to_string(rank) + "'s shard");
      I.owned.push_back({p.name, r.begin, r.end, r.shard_offset});
      // Three states, each one slice per source range the range overlaps.
      if (sp.ranges.empty()) {
        I.acc.slices += 3;
      } else {
        for (const auto& s : sp.ranges)
          if (std::max(s.begin, r.begin) < std::min(s.end, r.end)) I.acc.slices += 3;
      }
    }
  }
  std::sort(I.owned.begin(), I.owned.end(),
            [](const Impl::Owned& a, const Impl::Owned& b) { return a.shard_offset < b.shard_offset; });
  return reader;
}

int64_t ReshardedShardReader::shard_numel() const { return impl_->numel; }

const ReadAccounting& ReshardedShardReader::accounting() const { return impl_->acc; }

Status ReshardedShardReader::ReadShard(std::string_view state, int64_t offset, int64_t count,
                                       float* out) {
  Impl& I = *impl_;
  if (state != kMaster && state != kExpAvg && state != kExpAvgSq)
    return InvalidArgument("unknown state '" + std::string(state) + "'");
  if (offset < 0 || count < 0 || offset > I.numel - count)
    return InvalidArgument("new rank " + std::to_string(I.rank) + ": range [" +
                           std::to_string(offset) + ", " + std::to_string(offset + count) +
                           ") outside its shard of " + std::to_string(I.numel) + " elements");
  const int64_t end = offset + count;
  const uint64_t before = I.src->bytes_read();
  // The first owned range that ends after `offset`.
  auto it = std::partition_point(I.owned.begin(), I.owned.end(), [&](const Impl::Owned& o) {
    return o.shard_offset + (o.end - o.begin) <= offset;
  });
  int64_t cursor = offset;  // elements before it are written
  for (; it != I.owned.end() && it->shard_offset < end; ++it) {
    const int64_t lo = std::max(offset, it->shard_offset);
    const int64_t hi = std::min(end, it->shard_offset + (it->end - it->begin));
    std::fill(out + (cursor - offset), out + (lo - offset), 0.0f);
    CKPT_RETURN_IF_ERROR(
        I.src->ReadParamRange(it->param, state, it->begin + (lo - it->shard_offset),
                              it->begin + (hi - it->shard_offset), out + (lo - offset)),
        "new rank " + std::to_string(I.rank) + " of " + std::to_string(I.world) +
            ": parameter '" + it->param + "'");
    I.acc.bytes_owned += static_cast<uint64_t>(hi - lo) * sizeof(float);
    cursor = hi;
  }
  std::fill(out + (cursor - offset), out + count, 0.0f);
  I.acc.bytes_read += I.src->bytes_read() - before;
  ++I.acc.reads;
  return Status::Ok();
}

Status ReshardedShardReader::ReadSmallState(ReshardedRank* out) {
  Impl& I = *impl_;
  if (I.options.frozen && I.rank == 0) {
    for (const std::string& name : I.frozen) {
      CKPT_ASSIGN_OR_RETURN(auto raw, I.src->ReadFrozenBytes(name),
                            "frozen parameter '" + name + "'");
      I.acc.small_bytes += raw.size();
      out->frozen.emplace_back(name, std::move(raw));
    }
  }
  if (I.options.extras) {
    const bool same_world = I.world == I.src->source_ranks();
    const int from = same_world ? I.rank : 0;
    if (from < I.src->source_ranks()) {
      for (const RankExtra& ex : I.src->RankExtras(from)) {
        if (ex.name == kReshardRecord) continue;
        if (!same_world && ex.name.rfind(kRngPrefix, 0) == 0) continue;
        CKPT_ASSIGN_OR_RETURN(auto bytes, I.src->ReadRankExtra(from, ex),
                              "source rank " + std::to_string(from) + " dataset " + ex.name);
        I.acc.small_bytes += bytes.size();
        out->extras.emplace_back(ex, std::move(bytes));
      }
    }
  }
  return Status::Ok();
}

Result<ReshardedRank> LoadResharded(const std::string& source_path, const ReshardTarget& target,
                                    int rank, const LoadReshardOptions& options) {
  CKPT_ASSIGN_OR_RETURN(std::unique_ptr<ReshardedShardReader> reader,
                        ReshardedShardReader::Open(source_path, target, rank, options), "");
  ReshardedRank out;
  out.rank = rank;
  const auto n = static_cast<size_t>(reader->shard_numel());
  for (auto [state, dst] : {std::pair{kMaster, &out.master}, std::pair{kExpAvg, &out.exp_avg},
                            std::pair{kExpAvgSq, &out.exp_avg_sq}}) {
    dst->reserve(n);
    AdviseHugePages(dst->data(), n * sizeof(float));  // before the zero fill's first touch
    dst->resize(n);
    CKPT_RETURN_IF_ERROR(reader->ReadShard(state, 0, static_cast<int64_t>(n), dst->data()), "");
  }
  CKPT_RETURN_IF_ERROR(reader->ReadSmallState(&out), "");
  out.accounting = reader->accounting();
  return out;
}

}  // namespace ckpt
