#include "estimate/param_source.h"

#include <utility>

#include "ckpt/units.h"

namespace ckpt::estimate {
namespace {

int LiveSources(const ParamSource& s) {
  return !s.from_checkpoint.empty() + !s.from_safetensors.empty() + !s.param_table.empty();
}

Status CheckOneLiveSource(const ParamSource& s) {
  if (LiveSources(s) > 1) {
    return InvalidArgument("give one of --from-checkpoint, --from-safetensors, --param-table");
  }
  return Status::Ok();
}

Status ParamsRequired() {
  return InvalidArgument("--params is required (or --from-checkpoint / --from-safetensors)");
}

// The --ranks / --zero / --alignment / --compute-dtype / --chunk-bytes flags over `c`.
Status ApplyLayoutFlags(const CheckpointRequest& f, bool from_ckpt, CheckpointConfig& c) {
  if (f.ranks != 0 || !from_ckpt) {
    if (f.ranks < 1) {
      return InvalidArgument("--ranks must be at least 1 (got " + std::to_string(f.ranks) + ")");
    }
    // Another world size: every rank gets rank 0's auxiliary datasets.
    if (from_ckpt && f.ranks != c.world) c.aux_by_rank.clear();
    c.world = f.ranks;
  }
  if (f.zero != -1 || !from_ckpt) {
    if (f.zero < 0 || f.zero > 3) {
      return InvalidArgument("--zero: unknown ZeRO stage " + std::to_string(f.zero) +
                             " (expected 0, 1, 2 or 3)");
    }
    c.zero_stage = f.zero;
  }
  if (!from_ckpt || f.alignment != kDefaultAlignment) c.alignment = f.alignment;
  if (!f.compute_dtype.empty()) {
    CKPT_ASSIGN_OR_RETURN(c.compute_dtype, ParseDTypeFlag(f.compute_dtype, "--compute-dtype"));
  }
  auto chunk = ParseByteSize(f.chunk_bytes);
  if (!chunk.ok()) return chunk.status().WithContext("--chunk-bytes");
  c.chunk_bytes = *chunk;
  return Status::Ok();
}

}  // namespace

Result<int64_t> ParseCountFlag(const std::string& text, const char* flag) {
  auto r = ParseCount(text);
  if (!r.ok()) return r.status().WithContext(std::string(flag) + " '" + text + "'");
  return *r;
}

Result<DType> ParseDTypeFlag(const std::string& text, const char* flag) {
  auto d = DTypeFromName(text);
  if (!d) return InvalidArgument(std::string(flag) + ": unknown dtype '" + text + "'");
  return *d;
}

Result<std::optional<ParamTable>> LoadParamTable(const ParamSource& f) {
  CKPT_RETURN_IF_ERROR(CheckOneLiveSource(f));
  if (!f.param_table.empty()) {
    CKPT_ASSIGN_OR_RETURN(ParamTable t, ParamTableFromJsonFile(f.param_table), "--param-table");
    return std::optional<ParamTable>(std::move(t));
  }
  if (!f.from_checkpoint.empty()) {
    CKPT_ASSIGN_OR_RETURN(ParamTable t, ParamTableFromCheckpoint(f.from_checkpoint, f.tag),
                          "--from-checkpoint");
    return std::optional<ParamTable>(std::move(t));
  }
  if (!f.from_safetensors.empty()) {
    CKPT_ASSIGN_OR_RETURN(ParamTable t, ParamTableFromSafetensors(f.from_safetensors),
                          "--from-safetensors");
    return std::optional<ParamTable>(std::move(t));
  }
  return std::optional<ParamTable>();
}

Result<ModelSize> ResolveModelSize(const ParamSource& f, bool need_largest) {
  CKPT_ASSIGN_OR_RETURN(std::optional<ParamTable> table, LoadParamTable(f));
  ModelSize s;
  if (table) {
    if (!f.params.empty() || !f.largest_layer.empty()) {
      return InvalidArgument("--params/--largest-layer-params cannot be combined with a live "
                             "count (--from-checkpoint, --from-safetensors, --param-table)");
    }
    const ParamCounts c = CountParams(*table);
    s.total = c.total_params;
    s.largest = c.largest_layer_params;
    s.source = table->source;
    return s;
  }
  if (f.params.empty()) return ParamsRequired();
  CKPT_ASSIGN_OR_RETURN(s.total, ParseCountFlag(f.params, "--params"));
  if (!f.largest_layer.empty()) {
    CKPT_ASSIGN_OR_RETURN(s.largest, ParseCountFlag(f.largest_layer, "--largest-layer-params"));
  } else if (need_largest) {
    return InvalidArgument("zero3 needs --largest-layer-params (or a live count)");
  }
  return s;
}

Result<CheckpointConfig> ResolveCheckpointConfig(const CheckpointRequest& f) {
  const ParamSource& src = f.size;
  const bool from_ckpt = !src.from_checkpoint.empty();
  if (!src.params.empty() && LiveSources(src) > 0) {
    return InvalidArgument("--params cannot be combined with a parameter table "
                           "(--from-checkpoint, --from-safetensors)");
  }
  CKPT_RETURN_IF_ERROR(CheckOneLiveSource(src));
  CheckpointConfig c;
  if (from_ckpt) {
    // The checkpoint's own layout, aux datasets and tag: flags below change what they name.
    auto cc = CheckpointConfigFromCheckpoint(src.from_checkpoint, src.tag);
    if (!cc.ok()) return cc.status().WithContext("--from-checkpoint");
    c = std::move(*cc);
  } else if (LiveSources(src) > 0) {
    auto t = LoadParamTable(src);
    if (!t.ok()) return t.status();
    c.table = std::move(t->value());
  } else {
    if (src.params.empty()) return ParamsRequired();
    CKPT_ASSIGN_OR_RETURN(const int64_t params, ParseCountFlag(src.params, "--params"));
    if (params < 1) return InvalidArgument("--params must be at least 1");
    CKPT_ASSIGN_OR_RETURN(const DType dtype, ParseDTypeFlag(f.model_dtype, "--model-dtype"));
    c.table = SingleTensorTable(params, dtype);
  }
  CKPT_RETURN_IF_ERROR(ApplyLayoutFlags(f, from_ckpt, c));
  return c;
}

}  // namespace ckpt::estimate
