// Exact size of an uncompressed ckpt rank file without writing its data (what ckpt estimate
// predicts checkpoint sizes with).
//
// The rank file's HDF5 metadata (object headers, attributes, group heaps and the allocator's
// block tails) depends only on the datasets' names, dtypes and shapes, not on their values.
// The writer builds an uncompressed rank file in two phases: HDF5 writes the structure, with
// each dataset's contiguous region allocated but not filled, then the data goes into those
// regions (ckpt/src/rank_file.cc). UncompressedRankFileBytes runs the writer's own structure
// phase (WriteRankFileStructure in ckpt/src/rank_file.h) against a virtual file driver that keeps metadata in
// memory, and reads the end-of-allocation address at close, which is the file's size on disk;
// memory stays at the metadata size whatever the model size.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ckpt/dtype.h"
#include "ckpt/status.h"

namespace ckpt {

struct RankFileDatasetShape {
  std::string name;
  std::string kind = "tensor";  // "tensor" | "blob" | "json"
  std::string blob_kind;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
};

struct RankFileIdentity {
  std::string tag;
  int rank = 0;
  int world = 1;
};

// Thread-safe only as far as HDF5 is (Debian's build serialises calls).
Result<uint64_t> UncompressedRankFileBytes(const RankFileIdentity& header,
                                           const std::vector<RankFileDatasetShape>& datasets,
                                           uint64_t chunk_bytes);

}  // namespace ckpt
