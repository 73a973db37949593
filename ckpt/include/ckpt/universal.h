// Reading the universal checkpoint: a topology-free copy of the full training state
// (docs/convert.md, "Universal layout", is the normative spec; `ckpt to-universal`,
// convert/universal.h, writes it). A directory holding
//   manifest.json   the ckpt Manifest with kind "universal" (params table without ranges,
//                   counters, optimizer, client_state, engine_config; topology and partition of
//                   the source kept for reference) listing one file, universal.h5, with the
//                   XXH3 of every dataset and of the whole file;
//   universal.h5    /params/<name>/{master,exp_avg,exp_avg_sq}: full-shape fp32 (frozen
//                   parameters: master only, in their stored dtype), /scheduler, /data_position,
//                   /source/rank_<r>/...: every blob and json dataset of each source rank (RNG
//                   states, data positions) kept for provenance.
// Most callers read it through ckpt/state_source.h, which opens every kind of checkpoint.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "ckpt/env.h"
#include "ckpt/manifest.h"
#include "ckpt/status.h"

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
  // Streams a dataset in bounded memory and checks its XXH3 (DataLoss on mismatch).
  Status VerifyDataset(std::string_view name) const;
  // Data bytes read so far.
  uint64_t bytes_read() const;

 private:
  struct Impl;
  explicit UniversalReader(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// True when `path` (a directory, or a root whose `latest`/`tag` names one) holds a universal
// manifest.
bool IsUniversal(const std::string& path, const std::string& tag = "", Env* env = nullptr);

}  // namespace ckpt
