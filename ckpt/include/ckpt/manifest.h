// manifest.json: what a committed checkpoint tag holds. docs/format.md is the normative spec;
// this header is its in-memory form. Parsing validates schema, version and the partition
// tiling before any data is trusted.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "ckpt/dtype.h"
#include "ckpt/status.h"

namespace ckpt {

inline constexpr std::string_view kFormatName = "ckpt";
inline constexpr int kFormatMajor = 1;
// 1.1: the param_owner partition scheme, and manifest_xxh3 over the file's bytes with its own
// value replaced by 16 '0' (any JSON writer can seal a manifest); 1.0 manifests keep verifying
// under 1.0's rule. 1.2: the HDF5 metadata seal of each rank file, `latest` with its global step
// and a checksum, manifest_xxh3 required (docs/format.md). 1.3: per-piece checksums of every
// dataset (DatasetRecord::piece_xxh3), so a slice read is verified without reading the whole
// dataset. Older files keep reading.
inline constexpr int kFormatMinor = 3;
// Default size of a checksummed piece of a dataset's logical bytes (format 1.3).
inline constexpr uint64_t kDefaultPieceBytes = 4u << 20;
inline constexpr std::string_view kDigestPlaceholder = "0000000000000000";
inline constexpr std::string_view kWriterVersion = "ckpt 0.1.0";
inline constexpr std::string_view kManifestFile = "manifest.json";
inline constexpr std::string_view kLatestFile = "latest";
inline constexpr std::string_view kTempPrefix = ".tmp-";
inline constexpr std::string_view kLockFile = ".lock";
// The largest manifest readers load (ReadCheckpointFileToString); a bigger one is DataLoss.
inline constexpr uint64_t kMaxManifestBytes = uint64_t{1} << 30;
// Default partition alignment in elements (64 bytes of fp32): every rank's share of the
// flat buffer, and every ZeRO-3 per-parameter share, is a multiple of it.
inline constexpr int64_t kDefaultAlignment = 16;

// Conventional dataset names in a rank file (docs/format.md, "Rank files").
inline constexpr std::string_view kMaster = "master";
inline constexpr std::string_view kExpAvg = "exp_avg";
inline constexpr std::string_view kExpAvgSq = "exp_avg_sq";
inline constexpr std::string_view kCompute = "compute";        // bf16/fp16 shard, optional
inline constexpr std::string_view kFrozenPrefix = "frozen/";   // + param name, rank 0 only
inline constexpr std::string_view kRngPrefix = "rng/";         // + generator name, blob
inline constexpr std::string_view kDataPosition = "data_position";  // json
inline constexpr std::string_view kScheduler = "scheduler";          // json

// "rank_00003.h5"
std::string RankFileName(int rank);

struct Counters {
  int64_t global_step = 0;
  int64_t micro_step = 0;
  int64_t skipped_steps = 0;
  int64_t samples_seen = 0;
  int64_t tokens_seen = 0;
};

struct Topology {
  int dp_world_size = 1;
  int tp = 1;
  int pp = 1;
  int zero_stage = 0;
};

// Parameter elements [begin, end) live in rank `rank`'s flat shard at
// [shard_offset, shard_offset + (end - begin)).
struct PartitionRange {
  int rank = 0;
  int64_t begin = 0;
  int64_t end = 0;
  int64_t shard_offset = 0;
};

struct ParamEntry {
  std::string name;
  std::vector<int64_t> shape;
  DType dtype = DType::kF32;  // the model's parameter dtype; trainable masters are fp32
  int64_t numel = 0;
  bool frozen = false;         // stored whole in rank 0's frozen/<name>, never partitioned
  std::string tied_to;         // non-empty: an alias of that parameter, stored once there
  std::vector<PartitionRange> ranges;  // trainable owners only; sorted by begin
  bool trainable() const { return !frozen && tied_to.empty(); }
};

// How the trainable parameters' flat buffer is split over ranks.
//  "replicated": ZeRO-0, rank 0 holds the whole buffer (other ranks hold none of it);
//  "flat":       ZeRO-1/2, parameters packed in table order, the total padded with zeros to a
//                multiple of alignment × world and split into equal contiguous shares;
//  "per_param":  ZeRO-3, each parameter split into world shares of
//                ceil(numel / world) rounded up to alignment; rank r's shard is the
//                concatenation of its shares in table order, zero-padded.
//  "param_owner": ZeRO-1 by whole parameters (torch ZeroRedundancyOptimizer): each trainable
//                parameter lives whole on one rank; a rank's shard is its parameters in table
//                order, each starting at a multiple of alignment (format 1.1).
struct Partition {
  std::string scheme = "flat";
  int64_t alignment = kDefaultAlignment;
  std::vector<int64_t> shard_numel;  // per rank: length of master / exp_avg / exp_avg_sq
};

struct DatasetRecord {
  std::string name;       // path inside the rank file without the leading '/'
  std::string kind = "tensor";  // "tensor" | "blob" | "json"
  std::string blob_kind;  // blobs: what the bytes are, e.g. "mt19937_64"
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  uint64_t bytes = 0;     // logical bytes (numel × dtype size)
  std::string xxh3;       // of the logical little-endian bytes
  // Since format 1.3: the logical bytes cut into pieces of piece_bytes (the last one shorter),
  // and the XXH3-64 of each piece, ceil(bytes / piece_bytes) of them. piece_bytes 0: none
  // recorded (an older file); slice reads then cannot be verified piece by piece.
  uint64_t piece_bytes = 0;
  std::vector<std::string> piece_xxh3;
  bool has_pieces() const { return piece_bytes > 0; }
  uint64_t piece_count() const { return piece_bytes ? (bytes + piece_bytes - 1) / piece_bytes : 0; }
};

struct FileRecord {
  int rank = 0;
  std::string path;       // relative to the tag directory
  uint64_t bytes = 0;     // file size on disk
  std::string xxh3;       // of the whole file; empty when the writer skipped it
  std::string compression;  // "none", "zstd:3", "zstd:3+shuffle"
  std::vector<DatasetRecord> datasets;
  // Since format 1.2, the HDF5 metadata seal (docs/format.md, "Metadata seal"): the file's
  // raw-data regions (uncompressed dataset storage and compressed chunks) as sorted, disjoint
  // {offset, bytes} pairs, and the XXH3-64 of every byte outside them, in file order. Readers
  // verify it before HDF5 parses the file. Empty in files written before 1.2.
  std::vector<std::pair<uint64_t, uint64_t>> data_extents;
  std::string metadata_xxh3;
};

struct Manifest {
  std::string format = std::string(kFormatName);
  int version_major = kFormatMajor;
  int version_minor = kFormatMinor;
  std::string writer = std::string(kWriterVersion);
  std::string kind = "sharded";  // "sharded" | "universal"
  std::string tag;
  int64_t created_unix = 0;
  std::string created_utc;       // ISO 8601
  Counters counters;
  Topology topology;
  nlohmann::json optimizer = nlohmann::json::object();  // {"type":"adamw","lr",...}
  nlohmann::json dtypes = nlohmann::json::object();     // {"master":"fp32",...}
  Partition partition;
  std::vector<ParamEntry> params;
  std::vector<FileRecord> files;  // one per rank, in rank order
  nlohmann::json client_state = nlohmann::json::object();
  nlohmann::json engine_config = nlohmann::json::object();
  // False when the save did not update `latest` (SaveOptions::update_latest); written only then
  // ("sets_latest": false, since 1.2), so readers never take such a tag for a newer `latest`.
  bool sets_latest = true;

  const ParamEntry* FindParam(std::string_view name) const;
  const FileRecord* FileForRank(int rank) const;
  const DatasetRecord* FindDataset(int rank, std::string_view name) const;
  // Sum of trainable + frozen numel (tied aliases counted once, at their owner).
  int64_t UniqueParamCount() const;
};

// The manifest as JSON, sealed for its compact dump() text: manifest_xxh3 is right for
// ManifestToJson(m).dump() (format 1.1 rule; use SerializeManifest for a file).
nlohmann::json ManifestToJson(const Manifest& m);
// The manifest file's text: dump(indent) + "\n", sealed (manifest_xxh3 = XXH3-64 of these bytes
// with the digest's 16 characters read as '0').
std::string SerializeManifest(const Manifest& m, int indent = 1);
// ManifestToJson's members other than "params", "files" and "manifest_xxh3" (the small ones,
// for reports such as InspectToJson).
nlohmann::json ManifestHeaderToJson(const Manifest& m);
// ManifestToJson(m).dump(), written without building the DOM (the parameter table and file
// records go straight from the structs to text): the compact, sealed JSON of the manifest.
std::string ManifestJsonText(const Manifest& m);
// Where the 16 characters of the top-level "manifest_xxh3" string value start in a manifest's
// text; std::string::npos when there is no such member or its value is not a 16-character
// string. Members of nested objects with that name are not it.
size_t FindManifestDigest(std::string_view text);
// One entry of manifest "files" (also what a rank reports to rank 0 during a save).
nlohmann::json FileRecordToJson(const FileRecord& f);
Result<FileRecord> FileRecordFromJson(const nlohmann::json& j, std::string_view source);
// Parses and validates (ValidateManifest). `source` names the file in error messages.
// A newer major version is refused: "written by format 2.0, this reader supports 1.x".
// Verifies manifest_xxh3 when present: over `text` (format >= 1.1) or, for 1.0, over the
// compact dump of the parsed object without the field. DataLoss on a mismatch.
Result<Manifest> ParseManifest(std::string_view text, std::string_view source);
// How this process's manifest parses went (issue 19), counted by ParseManifest and
// ParseManifestSummary: `fast` manifests were read by simdjson straight into the structs (a
// sealed manifest of format 1.1 or later as ckpt writes it, several times faster than a DOM),
// `full` went through nlohmann's DOM (format 1.0, unsealed, or anything the fast path leaves to
// it, every error included). The full parse is the reference; both give the same Manifest.
struct ManifestParseStats {
  uint64_t fast = 0;
  uint64_t full = 0;
};
ManifestParseStats GetManifestParseStats();
// What listing a root needs of a tag's manifest (ListRoot, ReadLatest, retention).
struct ManifestSummary {
  std::string tag;
  int64_t global_step = 0;
  int64_t created_unix = 0;
  int dp_world_size = 0;
  uint64_t bytes = 0;  // the rank files' sizes added up (saturating)
  bool sets_latest = true;
};
// ParseManifest's checks of the bytes (valid JSON, nesting, the manifest_xxh3 seal) and of the
// summarized fields, without building or validating the parameter table and the datasets: a
// large manifest is summarized several times faster than parsed. A manifest of format 1.0, an
// unsealed 1.1 one, or one whose summarized fields are missing, mistyped or inconsistent (the
// file count of a sharded checkpoint) goes through ParseManifest, so its error is
// ParseManifest's. A sealed manifest whose other fields are invalid is summarized; opening the
// tag reports what is wrong with it.
Result<ManifestSummary> ParseManifestSummary(std::string_view text, std::string_view source);
ManifestSummary SummarizeManifest(const Manifest& m);
// As ParseManifest on an already parsed object; the checksum is verified for format 1.0 only
// (the 1.1 rule needs the file's bytes).
Result<Manifest> ManifestFromJson(const nlohmann::json& j, std::string_view source);
// Checks names unique, numel = prod(shape), tied_to targets, ranges tile every trainable
// parameter exactly (no gap, no overlap), shard slices in bounds and disjoint per rank,
// one file per rank, dataset sizes = dtype × shape.
Status ValidateManifest(const Manifest& m);

// Fills params[i].ranges and returns the partition for `world` ranks and ZeRO `zero_stage`
// (0 replicated, 1-2 flat, 3 per_param). Frozen and tied parameters get no ranges.
// Errors: world < 1, stage outside 0..3, alignment < 1.
Result<Partition> BuildPartition(std::vector<ParamEntry>& params, int world, int zero_stage,
                                 int64_t alignment = kDefaultAlignment);
// The "param_owner" partition: trainable params[i] lives whole on rank owners[i] (entries of
// frozen and tied parameters are ignored). InvalidArgument: owners.size() != params.size(), an
// owner outside [0, world), world < 1, alignment < 1.
Result<Partition> BuildOwnerPartition(std::vector<ParamEntry>& params, int world,
                                      const std::vector<int>& owners,
                                      int64_t alignment = kDefaultAlignment);

}  // namespace ckpt
