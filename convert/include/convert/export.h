// `ckpt export-fp32`: the model's weights as safetensors, streamed one tensor at a time from
// the master-weight datasets (docs/convert.md, "Export").
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "ckpt/dtype.h"
#include "ckpt/env.h"
#include "ckpt/reader.h"
#include "ckpt/status.h"

namespace ckpt::convert {

// How a tied alias (tied_to in the parameter table) is exported. safetensors has no shared
// storage: kCopy writes the alias as its own tensor (the owner's values), so
// load_state_dict(strict=True) finds every key, as DeepSpeed's zero_to_fp32 restores shared
// parameters; kMetadata (the default) stores the owner once and names the alias only in
// tied_weights: the export reads every master value once and its size is the unique parameters
// (what `ckpt estimate` predicts); loaders re-tie (transformers' tie_weights). Both record
// tied_weights. docs/convert.md says why and when to pass --tied copy.
enum class TiedExport { kCopy, kMetadata };

struct ExportOptions {
  std::string tag;                           // empty: `latest` (or the directory itself)
  DType dtype = DType::kF32;                 // fp32, bf16 or fp16: every floating-point tensor
  uint64_t max_shard_bytes = 5000000000ull;  // 0: a single file whatever the size
  bool exclude_frozen = false;
  TiedExport tied = TiedExport::kMetadata;
  Env* env = nullptr;                  // nullptr: Env::Default()
  bool progress = false;               // progress bar on a TTY
  uint64_t chunk_elements = 1u << 24;  // most elements read per piece (memory bound)
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
  std::map<std::string, std::string> tied;  // alias -> owner (recorded; stored per TiedExport)
  bool tied_copied = false;                 // the aliases are tensors of their own (kCopy)
  std::vector<std::string> excluded;        // frozen parameters left out (and their aliases)
};

// Exports the checkpoint at `src` (root + tag/latest, tag directory, or universal directory)
// into directory `out` (must not exist or be empty): model.safetensors, or
// model-0000k-of-0000n.safetensors shards + model.safetensors.index.json when the tensors
// exceed max_shard_bytes. Reads only master weights (never the moments) and checks their XXH3
// while streaming. The next pieces are read on a helper thread while the last one is written
// (up to two pieces ahead); a piece (one tensor's part, or a run of small tensors) is at most
// chunk_elements and at most 2 Mi - 1 Ki elements, and peak memory is about
// 3 × piece × (4 + output dtype size) bytes + 64 MiB of I/O buffers, plus twice
// the largest frozen tensor (its stored and converted copies; nothing is read ahead while it is
// written). The directory appears atomically only when everything succeeded.
Result<ExportReport> ExportFp32(const std::string& src, const std::string& out,
                                const ExportOptions& opts = {});

// ---- checking an export (`ckpt check EXPORT`) ------------------------------------------------

struct CheckExportOptions {
  bool deep = false;         // also stream every tensor's bytes against its recorded XXH3
  std::string expected_tag;  // non-empty: every file must record __metadata__["ckpt_tag"] = this
};

struct ExportCheck {
  std::string dir;                 // the export directory (a lone file: its directory)
  std::vector<std::string> files;  // safetensors files checked, relative to dir
  bool checksummed = true;         // every file read carries the integrity record
  std::vector<Problem> problems;   // file (relative to dir), tensor name or "", what
  // How many of `problems` are only "export of tag X, expected Y" (CheckExportOptions::
  // expected_tag): when all are, the files are intact exports of another tag.
  size_t tag_mismatches = 0;
};

// True when `path` is a regular file named *.safetensors, or a directory holding model.safetensors,
// model.safetensors.index.json or a model-*-of-*.safetensors shard (what export-fp32 writes).
bool IsSafetensorsExport(const std::string& path);

// Checks a safetensors export: a single file, or a directory as export-fp32 writes it. Every
// file's header is parsed and its header digest verified (safetensors.h); a sharded directory's
// index must parse and list exactly the tensors of the shards it names, no listed shard may be
// missing and no other shard present, total_size must match, and all files must agree on
// ckpt_tag, ckpt_global_step, ckpt_dtype and tied_weights. With `deep` every tensor's bytes are
// streamed (bounded memory) and compared with their digest. Files without the integrity record
// are checked structurally and reported through `checksummed = false`. Returns the problems
// found (empty = healthy); an error Status only when the check cannot run (NotFound: `path`
// does not exist or holds no export).
Result<ExportCheck> CheckExport(const std::string& path, const CheckExportOptions& opts = {});

}  // namespace ckpt::convert
