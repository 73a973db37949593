#include "estimate/checkpoint_size.h"

#include <algorithm>
#include <map>

#include "ckpt/shape.h"
#include "ckpt/writer.h"
#include "convert/reshard.h"
#include "safetensors/safetensors.h"
#include "numeric.h"
#include "ckpt/rank_file_size.h"

namespace ckpt::estimate {
namespace {

using internal::StrFormat;

// The manifest as the writer would serialise it, with placeholder digests and counters of
// typical width: close to, not exactly, the real size.
uint64_t ManifestBytes(const CheckpointConfig& c, const std::vector<ParamEntry>& params,
                       const Partition& partition,
                       const std::vector<std::vector<RankDataset>>& per_rank,
                       const std::vector<uint64_t>& file_bytes) {
  Manifest m;
  m.tag = c.tag;
  m.created_unix = 1764500000;
  m.created_utc = "2025-11-30T11:00:00Z";
  m.topology.dp_world_size = static_cast<int>(c.world);
  m.topology.zero_stage = c.zero_stage;
  m.optimizer = {{"type", "adamw"},      {"lr", 0.00029999999999999997},
                 {"base_lr", 0.0003},    {"beta1", 0.9},
                 {"beta2", 0.95},        {"eps", 1e-08},
                 {"weight_decay", 0.1},  {"grad_clip", 1.0},
                 {"step", 0}};
  m.dtypes = {{"master", "fp32"}, {"exp_avg", "fp32"}, {"exp_avg_sq", "fp32"}};
  m.partition = partition;
  m.params = params;
  for (size_t r = 0; r < per_rank.size(); ++r) {
    FileRecord f;
    f.rank = static_cast<int>(r);
    f.path = RankFileName(static_cast<int>(r));
    f.bytes = file_bytes[r];
    f.xxh3 = std::string(16, '0');
    f.compression = "none";
    for (const RankDataset& d : per_rank[r]) {
      DatasetRecord rec;
      rec.name = d.name;
      rec.kind = d.kind;
      rec.blob_kind = d.blob_kind;
      rec.dtype = d.dtype;
      rec.shape = d.shape;
      rec.bytes = Numel(d.shape) * DTypeSize(d.dtype);
      rec.xxh3 = std::string(16, '0');
      rec.piece_bytes = kDefaultPieceBytes;  // format 1.3: one digest per piece
      rec.piece_xxh3.assign(rec.piece_count(), std::string(16, '0'));
      f.datasets.push_back(std::move(rec));
    }
    m.files.push_back(std::move(f));
  }
  return SerializeManifest(m, 1).size();
}

}  // namespace

std::vector<AuxDataset> EngineMinAuxDatasets() {
  // mt19937_64's text state is 312 decimal words and an index: 6.4 KB on average.
  return {{"rng/dropout", "blob", "mt19937_64", 6370},
          {"rng/shuffle", "blob", "mt19937_64", 6370},
          {"data_position", "json", "", 120},
          {"scheduler", "json", "", 160}};
}

Result<CheckpointConfig> CheckpointConfigFromCheckpoint(const std::string& path,
                                                        const std::string& tag) {
  std::string file;
  CKPT_ASSIGN_OR_RETURN(Manifest m, ReadCheckpointManifest(path, tag, &file), "");
  ParamTable table;
  table.source = file;
  table.params = m.params;
  for (ParamEntry& p : table.params) p.ranges.clear();
  CheckpointConfig c;
  c.table = std::move(table);
  c.world = m.topology.dp_world_size;
  c.source_world = c.world;
  c.zero_stage = m.topology.zero_stage;
  c.alignment = m.partition.alignment;
  c.tag = m.tag;
  c.global_step = m.counters.global_step;
  c.aux.clear();
  for (const FileRecord& f : m.files) {
    std::vector<AuxDataset> aux;
    bool seen_aux = false;
    for (const DatasetRecord& d : f.datasets) {
      if (d.kind != "tensor") {
        aux.push_back({d.name, d.kind, d.blob_kind, d.bytes});
        seen_aux = true;
      } else if (d.name.rfind(kFrozenPrefix, 0) == 0 && f.rank == 0) {
        c.frozen_before_aux = !seen_aux;
      }
      if (d.name == kCompute) c.compute_dtype = d.dtype;
      if (d.name == kMaster && d.bytes == 0) c.empty_shard_datasets = true;
    }
    if (f.rank == 0) c.aux = aux;
    c.aux_by_rank.push_back(std::move(aux));
  }
  return c;
}

ParamTable SingleTensorTable(int64_t params, DType dtype) {
  ParamTable t;
  t.source = "--params";
  ParamEntry p;
  p.name = "params";
  p.shape = {params};
  p.numel = params;
  p.dtype = dtype;
  t.params.push_back(std::move(p));
  return t;
}

Result<uint64_t> UncompressedRankFileBytes(const std::string& tag, int rank, int world,
                                           const std::vector<RankDataset>& datasets,
                                           uint64_t chunk_bytes) {
  if (chunk_bytes == 0) return InvalidArgument("chunk bytes must be positive");
  std::vector<RankFileDatasetShape> replica;
  replica.reserve(datasets.size());
  for (const RankDataset& d : datasets) {
    replica.push_back({d.name, d.kind, d.blob_kind, d.dtype, d.shape});
  }
  return UncompressedRankFileBytes({tag, rank, world}, replica, chunk_bytes);
}

namespace {

Status CheckCheckpointConfig(const CheckpointConfig& c) {
  if (c.world < 1) {
    return InvalidArgument("checkpoint: world size must be at least 1 (got " +
                           std::to_string(c.world) + ")");
  }
  if (c.world > 1'000'000) return InvalidArgument("checkpoint: world size too large");
  if (c.zero_stage < 0 || c.zero_stage > 3) {
    return InvalidArgument("checkpoint: unknown ZeRO stage " + std::to_string(c.zero_stage) +
                           " (expected 0, 1, 2 or 3)");
  }
  if (c.chunk_bytes == 0) return InvalidArgument("checkpoint: chunk bytes must be positive");
  if (c.table.params.empty()) return InvalidArgument("checkpoint: empty parameter table");
  for (const ParamEntry& p : c.table.params) {
    if (p.numel < 0) return InvalidArgument("checkpoint: negative size for " + p.name);
  }
  return Status::Ok();
}

// The datasets of rank r's file in engine_min's write order: the shard, the auxiliary datasets,
// rank 0's frozen tensors (or frozen before auxiliary, as the checkpoint recorded).
std::vector<RankDataset> RankDatasets(const CheckpointConfig& c,
                                      const std::vector<ParamEntry>& params, int64_t r,
                                      int64_t shard) {
  std::vector<RankDataset> ds;
  if (shard > 0 || c.empty_shard_datasets) {
    for (std::string_view name : {kMaster, kExpAvg, kExpAvgSq}) {
      ds.push_back({std::string(name), "tensor", "", DType::kF32, {shard}});
    }
    if (c.compute_dtype) {
      ds.push_back({std::string(kCompute), "tensor", "", *c.compute_dtype, {shard}});
    }
  }
  auto add_aux = [&] {
    const auto& aux = static_cast<size_t>(r) < c.aux_by_rank.size()
                          ? c.aux_by_rank[static_cast<size_t>(r)]
                          : c.aux;
    for (const AuxDataset& a : aux) {
      ds.push_back({a.name, a.kind, a.blob_kind, DType::kU8, {static_cast<int64_t>(a.bytes)}});
    }
  };
  auto add_frozen = [&] {
    if (r != 0) return;
    for (const ParamEntry& p : params) {
      if (p.frozen && p.tied_to.empty()) {
        ds.push_back({std::string(kFrozenPrefix) + p.name, "tensor", "", p.dtype, p.shape});
      }
    }
  };
  if (c.frozen_before_aux) {
    add_frozen();
    add_aux();
  } else {
    add_aux();
    add_frozen();
  }
  return ds;
}

// Ranks with the same datasets have files of the same size (the rank number is an int64
// attribute of fixed width): the key of a layout, so each distinct one is replayed once.
std::string LayoutKey(const std::vector<RankDataset>& ds) {
  std::string key;
  for (const RankDataset& d : ds) {
    key += d.name + '\0' + d.kind + '\0' + d.blob_kind + '\0' + std::string(DTypeName(d.dtype));
    for (int64_t x : d.shape) key += ':' + std::to_string(x);
    key += '\n';
  }
  return key;
}

// Every rank file's datasets (into per_rank) and size (into e.ranks, e.rank_files_bytes,
// e.tensor_payload).
Status EstimateRankFiles(const CheckpointConfig& c, const std::vector<ParamEntry>& params,
                         const Partition& partition,
                         std::vector<std::vector<RankDataset>>& per_rank, CheckpointEstimate& e) {
  std::map<std::string, uint64_t> sizes_by_layout;
  for (int64_t r = 0; r < c.world; ++r) {
    RankFileEstimate re;
    re.rank = static_cast<int>(r);
    re.shard_numel = partition.shard_numel[static_cast<size_t>(r)];
    auto& ds = per_rank[static_cast<size_t>(r)];
    ds = RankDatasets(c, params, r, re.shard_numel);
    for (const RankDataset& d : ds) {
      const uint64_t logical = Numel(d.shape) * DTypeSize(d.dtype);
      // Uncompressed data is stored contiguously, byte for byte.
      const uint64_t stored = logical;
      if (d.kind == "tensor") {
        re.tensor_payload += logical;
      } else {
        re.aux_payload += logical;
      }
      re.stored_data += stored;
    }
    std::string key = LayoutKey(ds);
    auto cached = sizes_by_layout.find(key);
    if (cached != sizes_by_layout.end()) {
      re.file_bytes = cached->second;
    } else {
      CKPT_ASSIGN_OR_RETURN(re.file_bytes,
                            UncompressedRankFileBytes(c.tag, static_cast<int>(r),
                                                      static_cast<int>(c.world), ds,
                                                      c.chunk_bytes),
                            "checkpoint: rank " + std::to_string(r));
      sizes_by_layout.emplace(std::move(key), re.file_bytes);
    }
    e.rank_files_bytes += re.file_bytes;
    e.tensor_payload += re.tensor_payload;
    e.ranks.push_back(re);
  }
  return Status::Ok();
}

// The largest tensors the export holds in memory, as the peak-RAM estimates need them.
struct ExportLargest {
  uint64_t numel = 0;         // elements of the largest exported tensor
  uint64_t frozen_bytes = 0;  // stored + fp32 bytes of the largest frozen tensor
};

// The fp32 export (e.fp32_export_bytes, e.fp32_export_files, e.largest_tensor), planned as
// convert/src/export.cc plans it: owners in table order (aliases recorded in
// __metadata__["tied_weights"]), floating-point tensors as fp32, a new shard when the next
// tensor would overflow max_shard_bytes.
Result<ExportLargest> EstimateExport(const CheckpointConfig& c,
                                     const std::vector<ParamEntry>& params, CheckpointEstimate& e) {
  nlohmann::json tied = nlohmann::json::object();
  std::vector<std::vector<safetensors::SafetensorsTensorSpec>> files(1);
  std::vector<uint64_t> file_data(1, 0);
  ExportLargest largest;
  for (const ParamEntry& p : params) {
    if (!p.tied_to.empty()) {
      tied[p.name] = p.tied_to;
      continue;
    }
    const bool is_float = p.dtype == DType::kF32 || p.dtype == DType::kF64 ||
                          p.dtype == DType::kBF16 || p.dtype == DType::kF16;
    const DType out = is_float || !p.frozen ? DType::kF32 : p.dtype;
    const uint64_t bytes = static_cast<uint64_t>(p.numel) * DTypeSize(out);
    if (c.export_max_shard_bytes > 0 && !files.back().empty() &&
        file_data.back() + bytes > c.export_max_shard_bytes) {
      files.emplace_back();
      file_data.push_back(0);
    }
    files.back().push_back({p.name, out, p.shape});
    file_data.back() += bytes;
    if (static_cast<uint64_t>(p.numel) > largest.numel) {
      largest.numel = static_cast<uint64_t>(p.numel);
      e.largest_tensor = p.name;
    }
    if (p.frozen) {
      largest.frozen_bytes =
          std::max<uint64_t>(largest.frozen_bytes, static_cast<uint64_t>(p.numel) *
                                                       (DTypeSize(p.dtype) + DTypeSize(out)));
    }
  }
  std::map<std::string, std::string> metadata = {
      {"format", "pt"},
      {"ckpt_tag", c.tag},
      {"ckpt_global_step", std::to_string(c.global_step)},
      {"ckpt_dtype", "fp32"}};
  if (!tied.empty()) metadata["tied_weights"] = tied.dump();
  const bool sharded = files.size() > 1;
  nlohmann::json weight_map = nlohmann::json::object();
  uint64_t total_size = 0;
  for (size_t k = 0; k < files.size(); ++k) {
    CKPT_ASSIGN_OR_RETURN(std::string header,
                          safetensors::BuildSafetensorsHeader(files[k], metadata),
                          "checkpoint: export header");
    e.fp32_export_bytes += 8 + header.size() + file_data[k];
    total_size += file_data[k];
    const std::string name =
        sharded ? StrFormat("model-%05zu-of-%05zu.safetensors", k + 1, files.size())
                : std::string("model.safetensors");
    for (const auto& t : files[k]) weight_map[t.name] = name;
  }
  e.fp32_export_files = static_cast<int64_t>(files.size());
  if (sharded) {
    nlohmann::json index;
    index["metadata"] = {{"total_size", total_size}};
    if (!tied.empty()) index["metadata"]["tied_weights"] = tied;
    index["weight_map"] = weight_map;
    e.fp32_export_bytes += index.dump(2).size() + 1;
    ++e.fp32_export_files;
  }
  return largest;
}

// The universal checkpoint's size (e.universal_payload, e.universal_bytes).
void EstimateUniversal(const std::vector<ParamEntry>& params, CheckpointEstimate& e) {
  e.universal_payload = 3 * 4 * static_cast<uint64_t>(e.trainable_params) +
                        4 * static_cast<uint64_t>(e.frozen_params);
  uint64_t groups = 0;
  for (const ParamEntry& p : params) groups += p.tied_to.empty() ? 1 : 0;
  uint64_t aux_all = 0;
  for (const RankFileEstimate& r : e.ranks) aux_all += r.aux_payload;
  e.universal_bytes = e.universal_payload + aux_all + 3072 * groups + 4096;
}

// Peak memory of export-fp32 and reshard (e.export_peak_ram, e.reshard_peak_ram,
// e.reshard_chunk_cache_max).
void EstimatePeakRam(const CheckpointConfig& c, const std::vector<ParamEntry>& params,
                     const ExportLargest& largest, CheckpointEstimate& e) {
  uint64_t cache = 0;
  for (const RankFileEstimate& r : e.ranks) {
    cache += std::min<uint64_t>(16u << 20, static_cast<uint64_t>(r.shard_numel) * 4);
  }
  e.export_peak_ram =
      6 * std::min<uint64_t>(uint64_t{1} << 22, largest.numel) + largest.frozen_bytes + cache;
  // `threads` new ranks at a time, each written a window at a time from a reader whose piece
  // cache holds at most 6 source pieces; rank 0 holds the frozen tensors whole.
  const uint64_t threads = static_cast<uint64_t>(
      std::min<int64_t>(c.world, convert::kDefaultReshardThreads));
  uint64_t aux = 0;
  for (const RankFileEstimate& r : e.ranks) aux = std::max(aux, r.aux_payload);
  uint64_t prepared = threads * (kFillWindowBytes + 6 * kDefaultPieceBytes + aux);
  for (const ParamEntry& p : params) {
    if (p.frozen && p.tied_to.empty()) prepared += static_cast<uint64_t>(p.numel) * DTypeSize(p.dtype);
  }
  e.reshard_peak_ram = prepared;
  // Each new rank reads master, exp_avg and exp_avg_sq from the source files its range
  // overlaps: at most ceil(source / world) + 1 of them, each dataset's cache holding at most
  // 16 MiB or the whole source dataset.
  const int64_t source_world = c.source_world > 0 ? c.source_world : c.world;
  const uint64_t source_dataset =
      4 * (static_cast<uint64_t>(e.trainable_params) + static_cast<uint64_t>(source_world) - 1) /
      static_cast<uint64_t>(source_world);
  const uint64_t per_file = 3 * std::min<uint64_t>(16u << 20, source_dataset);
  const uint64_t files_read = static_cast<uint64_t>(std::min<int64_t>(
      source_world, (source_world + c.world - 1) / c.world + 1));
  e.reshard_chunk_cache_max = static_cast<uint64_t>(c.world) * files_read * per_file;
}

}  // namespace

Result<CheckpointEstimate> EstimateCheckpoint(const CheckpointConfig& c) {
  CKPT_RETURN_IF_ERROR(CheckCheckpointConfig(c));
  std::vector<ParamEntry> params = c.table.params;
  CKPT_ASSIGN_OR_RETURN(
      Partition partition,
      BuildPartition(params, static_cast<int>(c.world), c.zero_stage, c.alignment),
      "checkpoint: partition");

  CheckpointEstimate e;
  e.world = c.world;
  e.zero_stage = c.zero_stage;
  e.partition_scheme = partition.scheme;
  ParamCounts counts = CountParams(c.table);
  e.total_params = counts.total_params;
  e.frozen_params = counts.frozen_params;
  e.trainable_params = counts.total_params - counts.frozen_params;

  std::vector<std::vector<RankDataset>> per_rank(static_cast<size_t>(c.world));
  CKPT_RETURN_IF_ERROR(EstimateRankFiles(c, params, partition, per_rank, e));
  std::vector<uint64_t> sizes;
  for (const auto& re : e.ranks) sizes.push_back(re.file_bytes);
  e.manifest_bytes = ManifestBytes(c, params, partition, per_rank, sizes);
  e.total_bytes = e.rank_files_bytes + e.manifest_bytes;

  CKPT_ASSIGN_OR_RETURN(ExportLargest largest, EstimateExport(c, params, e));
  EstimateUniversal(params, e);
  EstimatePeakRam(c, params, largest, e);
  return e;
}

std::string FormatCheckpointEstimate(const CheckpointEstimate& e) {
  auto gib = [](uint64_t b) { return static_cast<double>(b) / internal::kGiB; };
  std::string out = StrFormat(
      "Uncompressed ckpt checkpoint: %lld params (%lld trainable, %lld frozen), %lld ranks, "
      "ZeRO-%d (%s partition)\n",
      static_cast<long long>(e.total_params), static_cast<long long>(e.trainable_params),
      static_cast<long long>(e.frozen_params), static_cast<long long>(e.world), e.zero_stage,
      e.partition_scheme.c_str());
  out += "  file           |  shard elems |   tensor bytes |    aux |  HDF5 overhead |     file bytes |       GiB\n";
  for (const RankFileEstimate& r : e.ranks) {
    out += StrFormat("  %-14s | %12lld | %14llu | %6llu | %14llu | %14llu | %9.3f\n",
                     RankFileName(r.rank).c_str(), static_cast<long long>(r.shard_numel),
                     static_cast<unsigned long long>(r.tensor_payload),
                     static_cast<unsigned long long>(r.aux_payload),
                     static_cast<unsigned long long>(r.overhead()),
                     static_cast<unsigned long long>(r.file_bytes), gib(r.file_bytes));
  }
  out += StrFormat("  %-14s | %12s | %14llu | %6s | %14s | %14llu | %9.3f\n", "rank files", "",
                   static_cast<unsigned long long>(e.tensor_payload), "", "",
                   static_cast<unsigned long long>(e.rank_files_bytes), gib(e.rank_files_bytes));
  out += StrFormat("  %-14s | %12s | %14s | %6s | %14s | %14llu | %9.3f  (approximate)\n",
                   "manifest.json", "", "", "", "",
                   static_cast<unsigned long long>(e.manifest_bytes), gib(e.manifest_bytes));
  out += StrFormat("  %-14s | %12s | %14s | %6s | %14s | %14llu | %9.3f\n", "total", "", "", "",
                   "", static_cast<unsigned long long>(e.total_bytes), gib(e.total_bytes));
  out += StrFormat("fp32 export (export-fp32): %llu bytes in %lld file(s) (%.3f GiB)\n",
                   static_cast<unsigned long long>(e.fp32_export_bytes),
                   static_cast<long long>(e.fp32_export_files), gib(e.fp32_export_bytes));
  out += StrFormat("universal layout (to-universal): about %llu bytes (%.3f GiB), %llu of them "
                   "tensors\n",
                   static_cast<unsigned long long>(e.universal_bytes), gib(e.universal_bytes),
                   static_cast<unsigned long long>(e.universal_payload));
  out += StrFormat("peak RAM, export-fp32: about %llu bytes (%.3f GiB): streaming buffers, "
                   "largest frozen tensor, HDF5 chunk caches\n",
                   static_cast<unsigned long long>(e.export_peak_ram), gib(e.export_peak_ram));
  out += StrFormat("peak RAM, reshard into this layout: about %llu bytes (%.3f GiB): up to 4 "
                   "new ranks at once, each a window and a piece cache at a time, and the "
                   "frozen tensors, plus up to %llu bytes (%.3f GiB) of HDF5 chunk cache\n",
                   static_cast<unsigned long long>(e.reshard_peak_ram), gib(e.reshard_peak_ram),
                   static_cast<unsigned long long>(e.reshard_chunk_cache_max),
                   gib(e.reshard_chunk_cache_max));
  out += "Not counted in RAM: the process itself (code, HDF5 library state), page cache.\n";
  return out;
}

nlohmann::json CheckpointEstimateToJson(const CheckpointEstimate& e) {
  nlohmann::json ranks = nlohmann::json::array();
  for (const RankFileEstimate& r : e.ranks) {
    ranks.push_back({{"rank", r.rank},
                     {"file", RankFileName(r.rank)},
                     {"shard_numel", r.shard_numel},
                     {"tensor_payload_bytes", r.tensor_payload},
                     {"aux_payload_bytes", r.aux_payload},
                     {"stored_data_bytes", r.stored_data},
                     {"overhead_bytes", r.overhead()},
                     {"file_bytes", r.file_bytes}});
  }
  return {{"world", e.world},
          {"zero_stage", e.zero_stage},
          {"partition_scheme", e.partition_scheme},
          {"total_params", e.total_params},
          {"trainable_params", e.trainable_params},
          {"frozen_params", e.frozen_params},
          {"ranks", ranks},
          {"rank_files_bytes", e.rank_files_bytes},
          {"tensor_payload_bytes", e.tensor_payload},
          {"manifest_bytes", e.manifest_bytes},
          {"total_bytes", e.total_bytes},
          {"fp32_export_bytes", e.fp32_export_bytes},
          {"fp32_export_files", e.fp32_export_files},
          {"universal_payload_bytes", e.universal_payload},
          {"universal_bytes", e.universal_bytes},
          {"export_fp32_peak_ram_bytes", e.export_peak_ram},
          {"reshard_peak_ram_bytes", e.reshard_peak_ram},
          {"reshard_chunk_cache_max_bytes", e.reshard_chunk_cache_max},
          {"largest_tensor", e.largest_tensor}};
}

}  // namespace ckpt::estimate
