// Deterministic synthetic checkpoints, written through the public writer API with N ranks as
// threads. For demos, tests and benchmarks. Every value is a pure function of
// (seed, step, parameter index, state, element), independent of the partition, so a
// synthetic checkpoint resharded to any world size must hold the same values.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "ckpt/aligned_buffer.h"
#include "ckpt/env.h"
#include "ckpt/manifest.h"
#include "ckpt/writer.h"

namespace ckpt {

struct SynthOptions {
  int ranks = 2;
  int64_t params = 1'000'000;  // unique parameters, frozen included
  int zero_stage = 2;
  int tags = 1;                // tags written, global_step 100, 200, ...
  int64_t largest_tensor = 0;  // 0: a quarter of the trainable parameters
  uint64_t seed = 0;
  Compression compression;
  int keep_last = 0;
  uint64_t chunk_bytes = 4u << 20;
  uint64_t piece_bytes = kDefaultPieceBytes;  // SaveOptions::piece_bytes
  Env* env = nullptr;
  // Called after each rank file is written with its logical bytes (any thread).
  std::function<void(uint64_t)> on_bytes;
};

// The parameter table: embed.weight (the largest tensor), lm_head.weight tied to it,
// blocks.<i>.weight of decreasing size (the last one odd-sized) and, when params >= 64, a
// frozen bf16 pos_table.
std::vector<ParamEntry> SynthParamTable(int64_t params, int64_t largest_tensor);

// state: "master", "exp_avg", "exp_avg_sq" or "frozen".
float SynthValue(uint64_t seed, int64_t step, size_t param_index, std::string_view state,
                 int64_t element);

// The manifest of tag global_step<step> (files[] empty: the writer fills it).
Result<Manifest> SynthManifest(const SynthOptions& o, int64_t step);

// One rank's synthetic state, what SaveCheckpoint takes for it: the fp32 master and Adam
// moments in I/O memory (as a trainer's pinned host buffers are: the save writes them with
// O_DIRECT from where they lie), rank 0's frozen bf16 tensors, the RNG, data position and
// scheduler. contents' datasets point into the object, so it is neither copied nor moved.
struct SynthRankState {
  AlignedBuffer state[3];  // master, exp_avg, exp_avg_sq
  std::vector<std::vector<uint16_t>> frozen;
  std::string rng, data_pos, sched;
  RankContents contents;

  SynthRankState() = default;
  SynthRankState(const SynthRankState&) = delete;
  SynthRankState& operator=(const SynthRankState&) = delete;
};

// Fills `out` with rank `rank`'s state at meta's global step (meta from SynthManifest). With
// values false the master and moments are left zero, for a caller that fills them itself.
void FillSynthRank(const Manifest& meta, uint64_t seed, int rank, SynthRankState& out,
                   bool values = true);

// Writes the tags; returns their names.
Result<std::vector<std::string>> WriteSynthetic(const std::string& root, const SynthOptions& o);

}  // namespace ckpt
