// Reading the universal checkpoint: a topology-free copy of the full training state
// (docs/convert.md, "Universal layout", is the normative spec; `ckpt to-universal`,
// convert/universal.h, writes it with WriteUniversalFile below). A directory holding
//   manifest.json   the ckpt Manifest with kind "universal" (params table without ranges,
//                   counters, optimizer, client_state, engine_config; topology and partition of
//                   the source kept for reference) listing one file, universal.h5, with the
//                   XXH3 of every dataset and of the whole file;
//   universal.h5    /params/<name>/{master,exp_avg,exp_avg_sq}: full-shape fp32 (frozen
//                   parameters: master only, in their stored dtype), /scheduler, /data_position,
//                   /source/rank_<r>/...: every blob and json dataset of each source rank (RNG
//                   states, data positions) kept for provenance.
// Most callers read it through ckpt/state_source.h, which opens every kind of checkpoint.
// WriteUniversalFile writes universal.h5 for `ckpt to-universal` (convert/universal.h).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "ckpt/env.h"
#include "ckpt/manifest.h"
#include "ckpt/status.h"
#include "ckpt/writer.h"

namespace ckpt {

inline constexpr std::string_view kUniversalFile = "universal.h5";
inline constexpr std::string_view kUniversalFormat = "ckpt-universal";
inline constexpr int kUniversalMajor = 1;
inline constexpr int kUniversalMinor = 0;

// HDF5 group of a parameter: "params/" + name with '%' -> "%25" and '/' -> "%2F".
std::string UniversalParamGroup(std::string_view param);
// "source/rank_00003"
std::string UniversalSourceGroup(int rank);

// Reads a universal checkpoint. Not thread-safe (keeps the HDF5 file open); movable.
class UniversalReader {
 public:
  // `dir` holds manifest.json and universal.h5. NotFound, DataLoss (bad manifest, a missing or
  // resized universal.h5), Unimplemented (newer universal or format major version),
  // FailedPrecondition (not universal).
  static Result<UniversalReader> Open(const std::string& dir, Env* env = nullptr);
  UniversalReader(UniversalReader&&) noexcept;
  UniversalReader& operator=(UniversalReader&&) noexcept;
  ~UniversalReader();

  const Manifest& manifest() const;
  const std::string& dir() const;
  int source_ranks() const;  // the source's dp_world_size

  // Elements [begin, end) (row-major) of `param`'s `state` (master, exp_avg, exp_avg_sq) as
  // fp32 by hyperslab reads. Aliases read their owner; frozen parameters have only master
  // (converted from the stored dtype). No checksum (partial read).
  Status ReadParamRange(std::string_view param, std::string_view state, int64_t begin, int64_t end,
                        float* out) const;
  // A whole dataset's logical bytes, its XXH3 checked against the manifest. `name` as listed in
  // the manifest, e.g. "scheduler", "params/w/master", "source/rank_00000/rng/dropout".
  Result<std::vector<uint8_t>> ReadDatasetBytes(std::string_view name) const;
  // The same into the caller's memory: `bytes` must be the dataset's (else DataLoss).
  Status ReadDatasetInto(std::string_view name, void* out, uint64_t bytes) const;
  // Streams a dataset in bounded memory and checks its XXH3 (DataLoss on mismatch).
  Status VerifyDataset(std::string_view name) const;
  // Data bytes read so far.
  uint64_t bytes_read() const;

 private:
  struct Impl;
  explicit UniversalReader(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// What universal.h5 holds, for WriteUniversalFile: the root attributes, one group per stored
// parameter (with its attributes), and every dataset in the order they are created, which is
// the order of their bytes in the file.
struct UniversalFileContents {
  std::string tag;
  int source_dp_world_size = 1;
  int source_zero_stage = 0;
  struct Param {
    std::string name;
    bool frozen = false;
    DType dtype = DType::kF32;
  };
  std::vector<Param> params;          // /params/<g> groups, created first, in this order
  std::vector<DatasetSpec> datasets;  // names as in the manifest; `data` or `fill`
};

// Writes universal.h5 at `path` as a rank file is written (ckpt/writer.h): HDF5 writes the
// structure with every dataset's region allocated, each region after the one created before it
// (no alignment gaps for later small datasets to fill), then the bytes go out past HDF5 in that
// order, each `fill` window read on a helper thread while the one before it is written; every
// dataset's digest and piece digests, the whole file's XXH3 and its metadata seal are taken on
// the way, so nothing is read back. Returns the manifest's record of the file (path
// "universal.h5", rank 0, compression "none"). The caller fsyncs. Of `options`, env,
// fill_window_bytes and piece_bytes are used.
Result<FileRecord> WriteUniversalFile(const std::string& path,
                                      const UniversalFileContents& contents,
                                      const SaveOptions& options);

// True when `path` (a directory, or a root whose `latest`/`tag` names one) holds a universal
// manifest.
bool IsUniversal(const std::string& path, const std::string& tag = "", Env* env = nullptr);

}  // namespace ckpt
