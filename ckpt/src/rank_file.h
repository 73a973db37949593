// Private: one rank's HDF5 file — writing it (chunked, zstd via direct chunk writes so that
// compression and checksums run outside HDF5's global lock) and reading datasets or slices.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "ckpt/manifest.h"
#include "ckpt/status.h"
#include "ckpt/writer.h"

namespace ckpt::internal {

struct RankFileHeader {
  int rank = 0;
  int world = 1;
  std::string tag;
};

// Creates `path` and writes every dataset; returns their records (sizes, XXH3 of the logical
// bytes). The caller fsyncs and checksums the file.
Result<std::vector<DatasetRecord>> WriteRankFile(const std::string& path,
                                                 const RankFileHeader& header,
                                                 const std::vector<DatasetSpec>& datasets,
                                                 const SaveOptions& options);

// A rank file opened read-only. Errors name the file (`label`) and the dataset.
class RankFile {
 public:
  static Result<std::unique_ptr<RankFile>> Open(const std::string& path, std::string label);
  ~RankFile();
  // Checks the stored dtype and shape against the record (DataLoss when they differ).
  Status CheckShape(const DatasetRecord& rec) const;
  Status ReadAll(const DatasetRecord& rec, void* out) const;
  // Elements [offset, offset + count) of a 1-D dataset. `sequential`: the caller streams the
  // dataset in chunk-aligned blocks, so the chunk cache is bypassed.
  Status ReadSlice(const DatasetRecord& rec, int64_t offset, int64_t count, void* out,
                   bool sequential = false) const;

 private:
  RankFile() = default;
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ckpt::internal
