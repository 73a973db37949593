// Reading a committed checkpoint. Opening validates the manifest before any data is read;
// nothing on disk is ever modified by a reader.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "ckpt/env.h"
#include "ckpt/manifest.h"
#include "ckpt/status.h"

namespace ckpt {

struct OpenOptions {
  Env* env = nullptr;            // nullptr: Env::Default()
  bool verify_checksums = true;  // whole-dataset reads check their XXH3
};

// Not thread-safe (it caches open HDF5 handles), except OpenAhead; movable.
class CheckpointReader {
 public:
  // `path` is a checkpoint root (opens `tag`, or what `latest` names when tag is empty) or a
  // tag directory (it holds manifest.json). Errors: NotFound, DataLoss (bad manifest),
  // Unimplemented (newer major version).
  static Result<CheckpointReader> Open(const std::string& path, const std::string& tag = "",
                                       OpenOptions options = {});
  CheckpointReader(CheckpointReader&&) noexcept;
  CheckpointReader& operator=(CheckpointReader&&) noexcept;
  ~CheckpointReader();

  const Manifest& manifest() const;
  const std::string& dir() const;  // the tag directory
  const std::string& tag() const;

  // The whole dataset into out (out_bytes must equal its logical byte size). Verifies its
  // XXH3 when verify_checksums. DataLoss on mismatch or an unreadable file.
  Status ReadDataset(int rank, std::string_view name, void* out, uint64_t out_bytes) const;
  Result<std::vector<uint8_t>> ReadDatasetBytes(int rank, std::string_view name) const;
  // Blob or json dataset as a string / parsed JSON.
  Result<std::string> ReadBlob(int rank, std::string_view name) const;
  Result<nlohmann::json> ReadJson(int rank, std::string_view name) const;
  // Elements [offset, offset + count) of a 1-D dataset. When verify_checksums and the dataset
  // records piece digests (format 1.3), every piece the range touches is read whole and
  // checked (at most one partly wanted piece at each end; the reader keeps the last six such
  // pieces for the next reads): DataLoss naming the file, dataset and piece. Without piece digests
  // (files before 1.3) the slice is not checked: verify the dataset (VerifyDataset) instead.
  Status ReadSlice(int rank, std::string_view name, int64_t offset, int64_t count,
                   void* out) const;
  // The same without any check: for a caller that hashes the whole dataset itself
  // (StateSource's stream_verify), so pieces are not read and hashed twice.
  Status ReadSliceUnverified(int rank, std::string_view name, int64_t offset, int64_t count,
                             void* out) const;
  // Where element `offset` of a 1-D dataset lies in its rank file when the dataset is stored
  // as plain contiguous bytes (nullopt when compressed): a slice read into memory at the same
  // place within a 4 KiB block goes from the disk straight into it (O_DIRECT, no bounce buffer
  // and no copy), where other memory gets the bytes through a buffer.
  Result<std::optional<uint64_t>> SliceFileOffset(int rank, std::string_view name,
                                                  int64_t offset) const;
  // Elements [begin, end) of a trainable parameter's `state` (kMaster, kExpAvg, kExpAvgSq) as
  // fp32, gathered from the owning ranks with hyperslab reads. A tied alias reads its owner.
  Status ReadParamRange(std::string_view param, std::string_view state, int64_t begin,
                        int64_t end, float* out) const;
  // The whole parameter as fp32: trainable from the shards, frozen from rank 0's
  // frozen/<name> (converted from its stored dtype), aliases from their owner.
  Result<std::vector<float>> ReadParamFull(std::string_view param,
                                           std::string_view state = "master") const;
  // Streams a dataset in bounded memory (1 MiB blocks) and checks its XXH3 and, when recorded,
  // each piece's against the manifest. DataLoss naming the file and dataset (and the first
  // damaged piece) on mismatch.
  Status VerifyDataset(int rank, std::string_view name) const;
  // Every rank file the manifest lists exists with its recorded size: what every command that
  // opens a checkpoint checks before it writes anything (a truncated file it would not read is
  // still a damaged checkpoint). DataLoss naming the file.
  Status CheckFiles() const;
  // Opens rank `rank`'s file now if it is not open (its size checked, its seal and HDF5
  // structure read), so that its first read does not wait for that. The one call that may run
  // on another thread while this reader reads other ranks' files (a source reading the ranks
  // in order opens the next one ahead). A failure leaves the file to be opened by its first
  // read, which reports it.
  Status OpenAhead(int rank) const;
  // Data bytes read from rank files so far, whole pieces included (read accounting).
  uint64_t bytes_read() const;

 private:
  struct Impl;
  explicit CheckpointReader(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// `ckpt inspect --json`: the manifest's summary (tag, dir, format_version, writer, counters,
// topology, optimizer, dtypes, partition, params without ranges, total_params, bytes,
// client_state, engine_config).
nlohmann::json InspectToJson(const CheckpointReader& reader);
// The same for any manifest (a DeepSpeed checkpoint's, ckpt/deepspeed.h) read from `dir`.
nlohmann::json InspectToJson(const Manifest& m, const std::string& dir);

struct Problem {
  std::string file;     // relative to the tag directory, e.g. "rank_00001.h5"
  std::string dataset;  // empty when the problem is the file itself
  std::string what;
};

// Checks a tag directory: manifest parses and validates, every rank file exists with the
// recorded size, opens as HDF5 and has every dataset with the recorded dtype and shape;
// with `deep`, every file and dataset checksum. Returns the problems (empty = healthy);
// an error status only when the check itself cannot run. `progress`: a progress bar on a TTY
// (ckpt/progress.h) over the bytes a deep check reads.
// `ckpt check --json` of a checkpoint: {"ok", "dir" (null when unresolved), "deep",
// "problems": [{"file", "dataset", "what"}]}.
nlohmann::json CheckReportToJson(const std::vector<Problem>& problems, const std::string& dir,
                                 bool deep);
Result<std::vector<Problem>> CheckCheckpoint(const std::string& tag_dir, bool deep,
                                             Env* env = nullptr, bool progress = false);

// ---- HDF5 structure parsed in a process of its own (docs/reliability.md, "Hostile files") ---
// The metadata seal proves that a rank or universal file is the one its manifest describes,
// not that the manifest is honest: whoever hands over a hostile checkpoint can seal it again
// (or leave its files unsealed, as files before format 1.2 are), and crafted HDF5 metadata
// can crash libhdf5. With a probe program set, every HDF5 file a reader opens is first opened
// and walked by `PROGRAM __h5-probe FILE` in a process of its own (every link, object,
// attribute, dataset layout, chunk index, and the data of small datasets, as the readers use
// them); a probe that dies by a signal, or is still running after `seconds`, refuses the file
// (DataLoss "...: libhdf5 crashed reading its HDF5 structure (in a probe process) ...; not
// opened") before this process hands libhdf5 a byte of it. A file the probe walked is not
// probed again while its inode, size and modification time are unchanged. The CLI and
// engine_min set themselves as the probe; the Python module sets the `ckpt` executable beside
// the package when there is one. Empty (the default for a library): no probe.
void SetHdf5Probe(std::string program, double seconds = 300);
// For executables, first thing in main(): when argv is `PROGRAM __h5-probe FILE`, walks FILE,
// says so on stdout and ends the process (whether or not libhdf5 reported an error, which the
// reader then reports itself: only a crash or a hang is the probe's finding); otherwise sets
// this executable (/proc/self/exe, which still names it once its file is replaced) as the
// probe.
void ServeHdf5Probe(int argc, char** argv);

}  // namespace ckpt
