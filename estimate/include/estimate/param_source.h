// Where a model's parameter count comes from, the rules `ckpt estimate` applies to its flags:
// a count given by hand (--params, --largest-layer-params) or one live source (a checkpoint,
// a safetensors export or a JSON parameter table; estimate/param_count.h), never both and
// never two live sources, so a report never silently combines sources (docs/estimate.md).
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "ckpt/dtype.h"
#include "ckpt/status.h"
#include "estimate/checkpoint_size.h"
#include "estimate/param_count.h"

namespace ckpt::estimate {

// A count flag's value (ParseCount's syntax) and a dtype flag's (bf16, fp16, fp32, ...);
// InvalidArgument naming `flag` and the text.
Result<int64_t> ParseCountFlag(const std::string& text, const char* flag);
Result<DType> ParseDTypeFlag(const std::string& text, const char* flag);

// The size flags as typed; an empty string is a flag not given. Counts take ParseCount's
// syntax (2851e6, 2.851B, 7B, 350M, 1000).
struct ParamSource {
  std::string params;            // --params
  std::string largest_layer;     // --largest-layer-params
  std::string from_checkpoint;   // root or tag directory
  std::string tag;               // with from_checkpoint; empty: latest
  std::string from_safetensors;  // a file, or a directory with model.safetensors.index.json
  std::string param_table;       // a JSON parameter table or a manifest.json
};

// The table of the one live source given, or nullopt when none is. InvalidArgument when
// more than one is given; NotFound / DataLoss from the reader, with the flag as context.
Result<std::optional<ParamTable>> LoadParamTable(const ParamSource& source);

// The total and largest-layer counts for the memory tables (estimate zero2/zero3/states).
struct ModelSize {
  int64_t total = 0;
  std::optional<int64_t> largest;
  std::string source;  // the live source read; empty: the counts were given by hand
};
// InvalidArgument: a count mixed with a live source, neither given, a malformed count, or no
// largest layer when `need_largest` (ZeRO-3) and no live source gives one.
Result<ModelSize> ResolveModelSize(const ParamSource& source, bool need_largest);

// `ckpt estimate checkpoint`'s flags as typed (defaults as shown in its --help).
struct CheckpointRequest {
  ParamSource size;
  int64_t ranks = 0;  // 0: the checkpoint's (with from_checkpoint)
  int zero = -1;      // -1: the checkpoint's (with from_checkpoint)
  std::string model_dtype = "fp32";
  std::string compute_dtype;  // empty: no compute shard
  int64_t alignment = kDefaultAlignment;
  std::string chunk_bytes = "4MiB";
};
// The configuration to estimate: an existing checkpoint's own layout, aux datasets and tag
// (from_checkpoint; the other flags, when given, change what they name), a live table, or one
// tensor of --params elements of model_dtype. InvalidArgument names the flag at fault.
Result<CheckpointConfig> ResolveCheckpointConfig(const CheckpointRequest& request);

}  // namespace ckpt::estimate
