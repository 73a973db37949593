// Loading a checkpoint on another topology — another data-parallel world size or ZeRO stage —
// straight from its rank files, with no conversion pass and nothing written (issue 15).
//
// A new rank computes its partition (ckpt::BuildPartition, ReshardTarget), then LoadResharded
// reads only the source slices it owns, each verified: a format 1.3 dataset by the pieces the
// slice touches (at most one partly wanted piece at each end of a slice), an older dataset by
// one whole-dataset pass the first time the rank reads from it. Memory: the rank's own shard
// plus one piece per source dataset it reads. What it read is reported (ReadAccounting).
//
// engine_min's `train --resume` uses it when the run's world size or stage differs from the
// checkpoint's. `ckpt reshard` reads the same way a window at a time (ReshardedShardReader,
// which LoadResharded is built on), so its memory does not grow with the model.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "ckpt/manifest.h"
#include "ckpt/state_source.h"
#include "ckpt/status.h"

namespace ckpt {

// The topology to load for: the parameter table with the new ranges, and the partition.
struct ReshardTarget {
  int world = 1;
  int zero_stage = 0;
  std::vector<ParamEntry> params;  // the model's table in model order, ranges for `world`
  Partition partition;
};

// The source's parameter table partitioned for `world` ranks and ZeRO `zero_stage` (the
// source's alignment). InvalidArgument: world < 1, stage outside 0..3.
Result<ReshardTarget> PlanReshard(const Manifest& source, int world, int zero_stage);

// What one new rank read.
struct ReadAccounting {
  uint64_t bytes_owned = 0;  // bytes of master + both moments the rank holds (no padding)
  uint64_t bytes_read = 0;   // bytes read from the source for them, whole pieces and
                             // whole-dataset verification passes included
  uint64_t slices = 0;       // source slices read (each has two edges)
  uint64_t reads = 0;        // range reads of the shard: 3 for a whole load (one per state),
                             // one per window for a windowed one
  uint64_t piece_bytes = 0;  // largest piece of the source datasets (0: none recorded)
  uint64_t small_bytes = 0;  // frozen parameters and small state (RNG, data position, ...)
  // bytes_read / bytes_owned (1 when the rank owns nothing).
  double ratio() const {
    return bytes_owned ? static_cast<double>(bytes_read) / static_cast<double>(bytes_owned) : 1.0;
  }
};

// One new rank's state.
struct ReshardedRank {
  int rank = 0;
  // target.partition.shard_numel[rank] elements each, in the new rank's shard layout; padding
  // is zero.
  std::vector<float> master, exp_avg, exp_avg_sq;
  // Rank 0 only: every frozen parameter's stored bytes (its dtype and shape), by name.
  std::vector<std::pair<std::string, std::vector<uint8_t>>> frozen;
  // The blob and json datasets this rank gets. Same world size: the same source rank's, RNG
  // included. Another world size: source rank 0's, without `rng/*` (a new rank seeds its
  // generators from seed, global_step and rank; engine_min's data position and scheduler are
  // global). A dataset named "reshard" (a previous `ckpt reshard`'s record) is not carried.
  std::vector<std::pair<RankExtra, std::vector<uint8_t>>> extras;
  ReadAccounting accounting;
};

struct LoadReshardOptions {
  SourceOptions source;            // tag, env (stream_verify and verify_reads are set here)
  // The caller has already checked every source dataset whole (StateSource::
  // FinishVerification): datasets without piece digests are then not checked again. Pieces
  // are checked whenever they are recorded.
  bool source_verified = false;
  bool frozen = true;              // rank 0 reads the frozen parameters
  bool extras = true;              // read the small state
  // The optimizer this run uses: a source whose manifest names another optimizer type is
  // refused (FailedPrecondition). Empty: not checked.
  std::string optimizer_type = "adamw";
};

// Loads rank `rank` of `target` from the checkpoint at `source_path` (a ckpt root or tag
// directory, or a universal directory). Checks first, reading only the manifest: the target's
// table has the source's parameters (same names in the same order, shapes, frozen and tied
// flags) and the source's optimizer is `options.optimizer_type`: FailedPrecondition naming the
// first difference otherwise. DataLoss naming the file, dataset and piece for damaged data;
// InvalidArgument for a rank outside the target.
Result<ReshardedRank> LoadResharded(const std::string& source_path, const ReshardTarget& target,
                                    int rank, const LoadReshardOptions& options = {});

// One new rank's shard read a range at a time, with LoadResharded's checks, verification and
// accounting: what a caller that writes the shard out in windows uses (`ckpt reshard`), so that
// only a window of it is ever in memory. Not thread-safe (it holds an open source); one per
// thread.
class ReshardedShardReader {
 public:
  // Opens the source for rank `rank` of `target` and checks it as LoadResharded does (the same
  // errors). ReadAccounting::slices and piece_bytes are known from here on.
  static Result<std::unique_ptr<ReshardedShardReader>> Open(const std::string& source_path,
                                                            const ReshardTarget& target, int rank,
                                                            const LoadReshardOptions& options = {});
  ~ReshardedShardReader();

  // Elements in each state of the rank's shard (target.partition.shard_numel[rank]).
  int64_t shard_numel() const;
  // Elements [offset, offset + count) of the shard's `state` (kMaster, kExpAvg, kExpAvgSq) into
  // `out`, padding zero: the source slices the range covers, verified as LoadResharded's.
  // Ranges of one state read in increasing order read each source piece once (a piece cut by a
  // range's end is kept for the next range; the source keeps at most 6). InvalidArgument for a
  // range outside the shard or an unknown state; DataLoss naming the file, dataset and piece.
  Status ReadShard(std::string_view state, int64_t offset, int64_t count, float* out);
  // The frozen parameters (rank 0, options.frozen) and small state (options.extras) into
  // out->frozen and out->extras, as LoadResharded (accounting().small_bytes grows).
  Status ReadSmallState(ReshardedRank* out);
  // What was read so far.
  const ReadAccounting& accounting() const;

 private:
  ReshardedShardReader() = default;
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// The same checks alone (what a caller runs on every rank before any collective work).
Status CheckReshardable(const Manifest& source, const ReshardTarget& target,
                        const std::string& optimizer_type, const std::string& where);

}  // namespace ckpt
