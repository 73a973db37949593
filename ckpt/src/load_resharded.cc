#include "ckpt/load_resharded.h"

#include <algorithm>

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
      return FailedPrecondition("optimizer differs: " + where + " holds '" + type +
                                "' state, this run uses '" + optimizer_type + "'");
  }
  if (static_cast<int>(target.partition.shard_numel.size()) != target.world)
    return InvalidArgument("reshard target: " + std::to_string(target.partition.shard_numel.size()) +
                           " shard lengths for world size " + std::to_string(target.world));
  return Status::Ok();
}

Result<ReshardedRank> LoadResharded(const std::string& source_path, const ReshardTarget& target,
                                    int rank, const LoadReshardOptions& options) {
  if (rank < 0 || rank >= target.world)
    return InvalidArgument("rank " + std::to_string(rank) + " outside the target's world size " +
                           std::to_string(target.world));
  SourceOptions so = options.source;
  so.stream_verify = false;
  so.verify_reads = !options.source_verified;
  CKPT_ASSIGN_OR_RETURN(std::unique_ptr<StateSource> src, OpenStateSource(source_path, so), "");
  const Manifest& sm = src->manifest();
  CKPT_RETURN_IF_ERROR(CheckReshardable(sm, target, options.optimizer_type, src->dir()), "");

  ReshardedRank out;
  out.rank = rank;
  ReadAccounting& acc = out.accounting;
  for (const auto& f : sm.files)
    for (const auto& d : f.datasets) acc.piece_bytes = std::max(acc.piece_bytes, d.piece_bytes);
  const size_t n = static_cast<size_t>(target.partition.shard_numel[static_cast<size_t>(rank)]);
  out.master.assign(n, 0.0f);
  out.exp_avg.assign(n, 0.0f);
  out.exp_avg_sq.assign(n, 0.0f);
  const uint64_t before = src->bytes_read();
  for (size_t i = 0; i < target.params.size(); ++i) {
    const ParamEntry& p = target.params[i];
    if (!p.trainable()) continue;
    const ParamEntry& sp = sm.params[i];
    for (const auto& r : p.ranges) {
      if (r.rank != rank || r.end <= r.begin) continue;
      if (r.shard_offset < 0 || static_cast<size_t>(r.shard_offset + (r.end - r.begin)) > n)
        return InvalidArgument("reshard target: parameter '" + p.name +
                               "' range lies outside rank " + std::to_string(rank) + "'s shard");
      const std::string where = "new rank " + std::to_string(rank) + " of " +
                                std::to_string(target.world) + ": parameter '" + p.name + "'";
      for (auto [state, dst] : {std::pair{kMaster, &out.master}, std::pair{kExpAvg, &out.exp_avg},
                                std::pair{kExpAvgSq, &out.exp_avg_sq}}) {
        CKPT_RETURN_IF_ERROR(
            src->ReadParamRange(p.name, state, r.begin, r.end, dst->data() + r.shard_offset),
            where);
      }
      acc.bytes_owned += static_cast<uint64_t>(r.end - r.begin) * 3 * sizeof(float);
      if (sp.ranges.empty()) {
        acc.slices += 3;
      } else {
        for (const auto& s : sp.ranges)
          if (std::max(s.begin, r.begin) < std::min(s.end, r.end)) acc.slices += 3;
      }
    }
  }
  acc.bytes_read = src->bytes_read() - before;

  if (options.frozen && rank == 0) {
    for (const auto& p : target.params) {
      if (!p.frozen || !p.tied_to.empty()) continue;
      CKPT_ASSIGN_OR_RETURN(auto raw, src->ReadFrozenBytes(p.name),
                            "frozen parameter '" + p.name + "'");
      acc.small_bytes += raw.size();
      out.frozen.emplace_back(p.name, std::move(raw));
    }
  }
  if (options.extras) {
    const bool same_world = target.world == src->source_ranks();
    const int from = same_world ? rank : 0;
    if (from < src->source_ranks()) {
      for (const RankExtra& ex : src->RankExtras(from)) {
        if (ex.name == kReshardRecord) continue;
        if (!same_world && ex.name.rfind(kRngPrefix, 0) == 0) continue;
        CKPT_ASSIGN_OR_RETURN(auto bytes, src->ReadRankExtra(from, ex),
                              "source rank " + std::to_string(from) + " dataset " + ex.name);
        acc.small_bytes += bytes.size();
        out.extras.emplace_back(ex, std::move(bytes));
      }
    }
  }
  return out;
}

}  // namespace ckpt
