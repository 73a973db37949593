// Sizes of a ckpt checkpoint before it is written: the bytes of every rank file (uncompressed,
// HDF5 metadata included), the manifest, the fp32 safetensors export and the universal layout,
// and the peak RAM of `ckpt export-fp32` and `ckpt reshard`.
//
// Rank files are sized exactly: the tensor payload from the partition (ckpt::BuildPartition,
// the same one engine_min and `ckpt synth` use), and the HDF5 metadata by replaying the
// writer's HDF5 calls against an in-memory driver that drops raw data (no data is written, no
// disk is touched; memory is the metadata only). The per-rank auxiliary datasets (RNG blobs,
// data position, scheduler JSON) have sizes the engine decides at run time; their defaults are
// engine_min's typical sizes and they can be given exactly. docs/estimate.md explains each
// figure. Not thread-safe with other HDF5 users in the process beyond what HDF5 allows.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "ckpt/dtype.h"
#include "ckpt/manifest.h"
#include "ckpt/status.h"
#include "estimate/param_count.h"

namespace ckpt::estimate {

// A dataset every rank writes besides its optimizer shard (names as in docs/format.md).
struct AuxDataset {
  std::string name;       // e.g. "rng/dropout", "data_position"
  std::string kind;       // "blob" | "json"
  std::string blob_kind;  // blobs only, e.g. "mt19937_64"
  uint64_t bytes = 0;
};

// engine_min's per-rank datasets, in its write order: rng/dropout and rng/shuffle
// (mt19937_64 text states, about 6.4 KB each), data_position and scheduler (JSON).
std::vector<AuxDataset> EngineMinAuxDatasets();

struct CheckpointConfig {
  ParamTable table;                    // parameters: names, shapes, dtypes, frozen, tied
  int64_t world = 1;                   // data-parallel ranks (one file each)
  int zero_stage = 0;                  // 0..3: decides the partition scheme
  int64_t alignment = kDefaultAlignment;
  std::optional<DType> compute_dtype;  // also store a "compute" shard in this dtype
  uint64_t chunk_bytes = 4u << 20;     // SaveOptions::chunk_bytes (compressed tensors only)
  std::string tag = "global_step0";    // stored in each file's "tag" attribute
  int64_t global_step = 0;             // recorded in the export's __metadata__
  uint64_t export_max_shard_bytes = 5000000000ull;  // export-fp32 --max-shard-size
  std::vector<AuxDataset> aux = EngineMinAuxDatasets();
  // Per-rank auxiliary datasets when known (from an existing checkpoint); ranks beyond it
  // use `aux`.
  std::vector<std::vector<AuxDataset>> aux_by_rank;
  // Write order on rank 0: engine_min writes the shard, the auxiliary datasets, then the
  // frozen tensors; `ckpt synth` writes the frozen tensors before the auxiliary ones.
  bool frozen_before_aux = false;
  // A rank without a shard (ZeRO-0 ranks > 0): engine_min writes no master/moment datasets,
  // `ckpt synth` writes them empty.
  bool empty_shard_datasets = false;
  // World size of the checkpoint a reshard would read (0: the same as `world`).
  int64_t source_world = 0;
};

// The configuration that reproduces an existing checkpoint: its parameter table, world size,
// ZeRO stage, alignment, tag, compute dataset and rank 0's auxiliary datasets with their
// recorded sizes (from manifest.json only). `path` is a root or a tag directory.
Result<CheckpointConfig> CheckpointConfigFromCheckpoint(const std::string& path,
                                                        const std::string& tag = "");

// A one-parameter table of `params` elements named "params" (for a bare model size).
ParamTable SingleTensorTable(int64_t params, DType dtype = DType::kF32);

struct RankFileEstimate {
  int rank = 0;
  int64_t shard_numel = 0;        // elements of master / exp_avg / exp_avg_sq
  uint64_t tensor_payload = 0;    // logical bytes of master + moments (+ compute) (+ frozen)
  uint64_t aux_payload = 0;       // logical bytes of the auxiliary datasets
  uint64_t stored_data = 0;       // data as stored (contiguous: equal to the logical bytes)
  uint64_t file_bytes = 0;        // the rank file's exact size on disk
  uint64_t overhead() const { return file_bytes - tensor_payload - aux_payload; }
};

struct CheckpointEstimate {
  int64_t world = 1;
  int zero_stage = 0;
  std::string partition_scheme;
  int64_t total_params = 0;          // tied aliases once
  int64_t trainable_params = 0;
  int64_t frozen_params = 0;
  std::vector<RankFileEstimate> ranks;
  uint64_t rank_files_bytes = 0;     // Σ file_bytes
  uint64_t tensor_payload = 0;       // Σ tensor_payload
  uint64_t manifest_bytes = 0;       // approximate (digits of counters and digests vary)
  uint64_t total_bytes = 0;          // rank files + manifest
  // `ckpt export-fp32` output: every safetensors file (exact: headers are built by
  // convert::BuildSafetensorsHeader with export's metadata) plus the index when sharded.
  uint64_t fp32_export_bytes = 0;
  int64_t fp32_export_files = 0;
  uint64_t universal_payload = 0;    // fp32 weight + exp_avg + exp_avg_sq, frozen weights once
  // universal.h5 from `ckpt to-universal`: the payload, every source rank's RNG / JSON datasets
  // and about 3 KiB of HDF5 metadata per parameter group (approximate, within 1% for models
  // of a few MB and up).
  uint64_t universal_bytes = 0;
  // `ckpt export-fp32`: 6 B × min(4 Mi, largest tensor) of streaming buffers, the largest
  // frozen tensor twice (raw and converted) and up to 16 MiB of HDF5 chunk cache per rank
  // file. Estimated from convert/src/export.cc, not measured.
  uint64_t export_peak_ram = 0;
  // `ckpt reshard` into this layout with its default --threads on a machine of at least 4
  // cores, K = min(world, 4) new ranks at a time, each written a window at a time
  // (convert/src/reshard.cc): K × (8 MiB window + 6 source pieces of 4 MiB + the largest
  // rank's aux) + the frozen tensors, whatever the model size; on top, each new rank's reader keeps up to 16 MiB of HDF5 chunk cache per source dataset
  // it reads (reshard_chunk_cache_max).
  uint64_t reshard_peak_ram = 0;
  uint64_t reshard_chunk_cache_max = 0;
  std::string largest_tensor;
};

// InvalidArgument: world < 1, stage outside 0..3, alignment < 1, chunk_bytes == 0, an empty
// or inconsistent parameter table (BuildPartition's checks). Internal if HDF5 fails.
Result<CheckpointEstimate> EstimateCheckpoint(const CheckpointConfig& config);

// Exact on-disk size of one uncompressed rank file holding `datasets` (in write order).
struct RankDataset {
  std::string name;
  std::string kind = "tensor";
  std::string blob_kind;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
};
Result<uint64_t> UncompressedRankFileBytes(const std::string& tag, int rank, int world,
                                           const std::vector<RankDataset>& datasets,
                                           uint64_t chunk_bytes);

std::string FormatCheckpointEstimate(const CheckpointEstimate& e);
nlohmann::json CheckpointEstimateToJson(const CheckpointEstimate& e);

}  // namespace ckpt::estimate
