// `ckpt export-fp32`: the model's weights as safetensors, streamed one tensor at a time from
// the master-weight datasets (docs/convert.md, "Export").
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "ckpt/dtype.h"
#include "ckpt/env.h"
#include "ckpt/status.h"

namespace ckpt::convert {

struct ExportOptions {
  std::string tag;                           // empty: `latest` (or the directory itself)
  DType dtype = DType::kF32;                 // fp32, bf16 or fp16: every floating-point tensor
  uint64_t max_shard_bytes = 5000000000ull;  // 0: a single file whatever the size
  bool exclude_frozen = false;
  Env* env = nullptr;                  // nullptr: Env::Default()
  bool progress = false;               // progress bar on a TTY
  uint64_t chunk_elements = 1u << 22;  // elements read per hyperslab (memory bound)
};

struct ExportedFile {
  std::string name;    // "model.safetensors", "model-00001-of-00002..."
  uint64_t bytes = 0;  // file size
  std::vector<std::string> tensors;
};

struct ExportReport {
  std::string source_dir;
  std::string out;
  std::string tag;
  int64_t global_step = 0;
  std::vector<ExportedFile> files;
  int64_t tensors = 0;
  uint64_t total_size = 0;                  // tensor bytes (the index's total_size)
  uint64_t largest_tensor_bytes = 0;        // largest exported tensor, fp32 bytes
  uint64_t bytes_read = 0;                  // data bytes read from the checkpoint
  std::map<std::string, std::string> tied;  // alias -> owner (recorded, not stored)
  std::vector<std::string> excluded;        // frozen parameters left out (and their aliases)
};

// Exports the checkpoint at `src` (root + tag/latest, tag directory, or universal directory)
// into directory `out` (must not exist or be empty): model.safetensors, or
// model-0000k-of-0000n.safetensors shards + model.safetensors.index.json when the tensors
// exceed max_shard_bytes. Reads only master weights (never the moments) and checks their XXH3
// while streaming; peak memory is about chunk_elements × 6 bytes plus the largest frozen
// tensor. The directory appears atomically only when everything succeeded.
Result<ExportReport> ExportFp32(const std::string& src, const std::string& out,
                                const ExportOptions& opts = {});

}  // namespace ckpt::convert
