// Live parameter counts from real files instead of flags: a ckpt checkpoint (its manifest's
// parameter table) or a safetensors export (one file, or a directory with
// model.safetensors.index.json). Only headers and manifests are read, never tensor data.
//
// Counting follows DeepSpeed's estimate_*_all_live: total = every parameter once (a tied
// alias shares its owner's storage and is not counted again; frozen parameters count);
// largest layer = the largest sum of parameters registered directly in one module, where a
// parameter's module is its name up to the last '.', and an alias counts in the module that
// registers it (PyTorch lists a tied weight in both modules' parameters(recurse=False)).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ckpt/env.h"
#include "ckpt/manifest.h"
#include "ckpt/status.h"

namespace ckpt::estimate {

struct ParamTable {
  std::string source;              // what was read, for messages and the report
  std::vector<ParamEntry> params;  // name, shape, dtype, numel, frozen, tied_to (no ranges)
};

struct ParamCounts {
  int64_t total_params = 0;          // tied aliases once
  int64_t largest_layer_params = 0;
  std::string largest_layer;         // module name ("" = the root module)
  int64_t tensors = 0;               // entries, aliases included
  int64_t aliases = 0;
  int64_t frozen_params = 0;
};

ParamCounts CountParams(const ParamTable& table);

// manifest.json of a committed checkpoint, parsed and validated; `path` is a root (its
// `latest`, or `tag`) or a tag directory. `manifest_path` receives the file read. Read through
// env (nullptr: Env::Default()); a missing manifest is NotFound (ckpt::ReadTagManifest).
Result<Manifest> ReadCheckpointManifest(const std::string& path, const std::string& tag,
                                        std::string* manifest_path = nullptr, Env* env = nullptr);

// The parameter table of a committed checkpoint: `path` is a root (its `latest`, or `tag`) or
// a tag directory. Reads and validates manifest.json only. NotFound / DataLoss naming the file.
Result<ParamTable> ParamTableFromCheckpoint(const std::string& path, const std::string& tag = "",
                                            Env* env = nullptr);

// A parameter table written by hand or by a script: a JSON file holding either an array of
// {"name", "shape": [..], "dtype"?: "fp32", "frozen"?: false, "tied_to"?: ""} objects or an
// object with such an array under "params" (a ckpt manifest.json qualifies).
// InvalidArgument / DataLoss naming the file and entry. Read through env (nullptr:
// Env::Default()).
Result<ParamTable> ParamTableFromJsonFile(const std::string& path, Env* env = nullptr);

// The parameter table of a safetensors export: a .safetensors file, or a directory holding
// model.safetensors.index.json (every file its weight_map names) or a single
// model.safetensors. Tied aliases are read from __metadata__ in either convention:
//   {"<alias>": "<owner>"} where the owner is a tensor and the alias is not, or
//   {"<any key>": "{\"<alias>\": \"<owner>\", ...}"} (a JSON object serialised in a string).
// NotFound for a missing path, DataLoss for a malformed header or index, naming the file.
Result<ParamTable> ParamTableFromSafetensors(const std::string& path);

}  // namespace ckpt::estimate
