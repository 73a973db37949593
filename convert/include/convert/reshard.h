// `ckpt reshard`: a sharded checkpoint for another data-parallel world size (and optionally
// another ZeRO stage), from a sharded or a universal checkpoint (docs/convert.md, "Reshard").
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "ckpt/env.h"
#include "ckpt/state_source.h"
#include "ckpt/status.h"
#include "ckpt/writer.h"

namespace ckpt::convert {

inline constexpr int kDefaultReshardThreads = 4;

struct ReshardOptions {
  std::string tag;            // source tag; empty: `latest` (or the directory itself)
  int dp = 0;                 // new world size, >= 1
  int zero_stage = -1;        // -1: the source's
  std::string compression;    // empty: the source's (rank 0's file)
  // Stream every source dataset once and check its XXH3 first. Without it every byte copied
  // is still verified as it is read (LoadResharded: by its pieces, or for a source without
  // piece digests by one whole pass over each dataset a new rank reads from).
  bool verify_source = true;
  uint64_t piece_bytes = kDefaultPieceBytes;  // of the output (SaveOptions::piece_bytes)
  // Bytes of a new rank's state read and written at once (SaveOptions::fill_window_bytes).
  uint64_t window_bytes = kFillWindowBytes;
  // New ranks prepared and written at once. Each is read and written a window
  // (window_bytes) at a time, so peak memory is about this many windows and source
  // piece caches, whatever the model size. 0: min(dp, hardware threads, kDefaultReshardThreads).
  int threads = 0;
  Env* env = nullptr;         // nullptr: Env::Default()
  bool progress = false;
  // Called with each warning about resuming the output (before anything is written); the
  // warnings are also in ReshardReport::warnings.
  std::function<void(const std::string&)> on_warning;
};

struct RankReadStats {
  int rank = 0;
  uint64_t bytes_read = 0;   // source data bytes this new rank read
  uint64_t bytes_owned = 0;  // bytes of source state it holds (no padding)
  uint64_t slices = 0;       // source slices of optimizer state it read
  uint64_t piece_bytes = 0;  // the source's largest piece (0: none recorded)
  uint64_t windows = 0;      // windows its shard was read and written in (all three states)
  double ratio() const { return bytes_owned ? double(bytes_read) / double(bytes_owned) : 1.0; }
  // The read bound of issue 15: bytes_read <= 1.05 x bytes_owned + one piece per slice edge.
  bool within_bound() const {
    return static_cast<double>(bytes_read) <=
           1.05 * static_cast<double>(bytes_owned) + 2.0 * double(slices) * double(piece_bytes);
  }
};

struct ReshardReport {
  std::string source_dir;
  std::string out;
  std::string tag;
  SourceKind source_kind = SourceKind::kSharded;
  int source_dp = 0;
  int source_zero = 0;
  int dp = 0;
  int zero_stage = 0;
  int threads = 1;            // new ranks prepared and written at once
  bool rng_copied = false;    // M == N: each rank's rng/* copied; otherwise omitted
  uint64_t verify_bytes = 0;  // bytes read by the up-front verification
  std::vector<RankReadStats> ranks;
  double max_ratio() const;
  std::vector<std::string> skipped;  // source datasets not carried over
  // What a resume of the output will do differently (e.g. another micro-batch), found before
  // anything was written.
  std::vector<std::string> warnings;
};

// Writes a normal checkpoint root at `out` (must not exist or be empty) holding the source's
// tag for opts.dp ranks: partition by ckpt::BuildPartition; opts.threads new ranks at a time
// are written (ckpt::SaveRanks) a window at a time, each window read from only the source
// slices it covers (ckpt::ReshardedShardReader), so memory grows neither with the number of
// new ranks nor with the model. The files are those a whole-shard write would give, byte for
// byte. Frozen parameters go to rank
// 0; data_position and scheduler are copied; RNG blobs are copied when the world size is
// unchanged and omitted otherwise (engine_min seeds a missing generator from seed,
// global_step and rank), which every new rank file records in its `reshard` json dataset.
// engine_config's dp_world_size / zero (and grad_accum, when the global batch divides) are
// updated. Errors: InvalidArgument (dp < 1, zero outside 0..3), source errors, AlreadyExists.
Result<ReshardReport> Reshard(const std::string& src, const std::string& out,
                              const ReshardOptions& opts);

struct ImportReport {
  ReshardReport reshard;
  std::string ds_version;
  int64_t global_step = 0;
  size_t params = 0;  // entries of the parameter table
};

// `ckpt import-deepspeed`: a normal ckpt checkpoint with the DeepSpeed checkpoint's world size
// and ZeRO stage (Reshard fed by the DeepSpeed source; opts.dp and opts.zero_stage are ignored,
// and there are no checksums to verify first). NotFound when `src` is not a DeepSpeed
// checkpoint.
Result<ImportReport> ImportDeepSpeed(const std::string& src, const std::string& out,
                                     ReshardOptions opts);

}  // namespace ckpt::convert
