// ckpt estimate zero2|zero3|states|train|infer|checkpoint: memory and checkpoint-size
// estimates (docs/estimate.md). Pure arithmetic except the live counts (--from-checkpoint,
// --from-safetensors, --param-table), which read manifests, safetensors headers and JSON only.
#include <iostream>
#include <memory>
#include <optional>
#include <string>

#include "ckpt/dtype.h"
#include "command.h"
#include "estimate/checkpoint_size.h"
#include "estimate/param_count.h"
#include "estimate/param_source.h"
#include "estimate/transformer_memory.h"
#include "estimate/zero_memory.h"

namespace ckpt::cli {
namespace {

namespace est = ckpt::estimate;

constexpr std::string_view kCommand = "estimate";

void AddSizeFlags(CLI::App* app, est::ParamSource& f, bool largest_layer) {
  app->add_option("--params,-p", f.params,
                  "total parameters: 2851e6, 2.851B, 7B, 350M, 1000");
  if (largest_layer) {
    app->add_option("--largest-layer-params", f.largest_layer,
                    "parameters of the largest layer (module), same syntax");
  }
  app->add_option("--from-checkpoint", f.from_checkpoint,
                  "count parameters from a ckpt checkpoint (root or tag directory)");
  app->add_option("--tag", f.tag, "tag to read with --from-checkpoint (default: latest)");
  app->add_option("--from-safetensors", f.from_safetensors,
                  "count parameters from a safetensors file or a directory with "
                  "model.safetensors.index.json");
  app->add_option("--param-table", f.param_table,
                  "parameters from a JSON file: [{\"name\", \"shape\", \"dtype\", \"frozen\", "
                  "\"tied_to\"}] or a manifest.json");
}

struct ZeroFlags {
  est::ParamSource size;
  int64_t gpus_per_node = 1;
  int64_t nodes = 1;
  double buffer_factor = 1.5;
  std::string formula = "current";
};

int RunZero(int stage, const ZeroFlags& f, bool json) {
  auto sizes = est::ResolveModelSize(f.size, stage == 3);
  if (!sizes.ok()) return ReportError(kCommand, sizes.status(), json);
  auto formula = est::ParseZeroFormula(f.formula);
  if (!formula.ok()) return ReportError(kCommand, formula.status(), json);
  est::ClusterShape cluster{f.gpus_per_node, f.nodes, f.buffer_factor};
  Result<est::ZeroEstimate> e =
      stage == 2 ? est::EstimateZero2(sizes->total, cluster, *formula)
                 : est::EstimateZero3(sizes->total, sizes->largest.value_or(0), cluster);
  if (!e.ok()) return ReportError(kCommand, e.status(), json);
  if (stage == 2 && sizes->largest) e->largest_layer_params = sizes->largest;
  if (json) {
    nlohmann::json j = est::ZeroEstimateToJson(*e);
    j["source"] = sizes->source.empty() ? nlohmann::json("flags") : nlohmann::json(sizes->source);
    PrintJson(j);
    return 0;
  }
  std::cout << est::FormatZeroTable(*e);
  std::cout << "\nGB = 2^30 bytes. DeepSpeed "
            << (stage == 3 ? "stage3.py estimate_zero3_model_states_mem_needs"
                           : "stage_1_and_2.py estimate_zero2_model_states_mem_needs")
            << ", formula: "
            << (stage == 3 ? std::string("unchanged since DeepSpeed PR #965")
                           : std::string(est::ZeroFormulaName(*formula)) +
                                 (*formula == est::ZeroFormula::kLegacy
                                      ? " (before DeepSpeed PR #5099: GPU 4P + 16P/gpus)"
                                      : " (DeepSpeed PR #5099 and later: GPU 2P + 18P/gpus)"))
            << ".\n";
  if (!sizes->source.empty()) std::cout << "Counts from " << sizes->source << ".\n";
  return 0;
}

struct StatesFlags {
  est::ParamSource size;
  int64_t ranks = 0;
  int64_t param_bytes = 2;
  int64_t grad_bytes = 2;
  int64_t optim_bytes = 12;
};

int RunStates(const StatesFlags& f, bool json) {
  auto sizes = est::ResolveModelSize(f.size, false);
  if (!sizes.ok()) return ReportError(kCommand, sizes.status(), json);
  auto t = est::EstimateStates(sizes->total, f.ranks, f.param_bytes, f.grad_bytes,
                               f.optim_bytes);
  if (!t.ok()) return ReportError(kCommand, t.status(), json);
  if (json) {
    nlohmann::json j = est::StatesTableToJson(*t);
    j["source"] = sizes->source.empty() ? nlohmann::json("flags") : nlohmann::json(sizes->source);
    PrintJson(j);
  } else {
    std::cout << est::FormatStatesTable(*t);
  }
  return 0;
}

struct ShapeFlags {
  int64_t layers = 0;
  int64_t hidden = 0;
  int64_t heads = 0;
  int64_t vocab = 0;
  int64_t seq_len = 0;
  std::string params;
  std::string dtype = "bf16";
  int64_t tp = 1;
};

void AddShapeFlags(CLI::App* app, ShapeFlags& f) {
  app->add_option("--layers", f.layers, "transformer layers L")->required();
  app->add_option("--hidden", f.hidden, "hidden size h")->required();
  app->add_option("--heads", f.heads, "attention heads a")->required();
  app->add_option("--vocab", f.vocab, "vocabulary size V (for the parameter count)");
  app->add_option("--params,-p", f.params,
                  "parameter count (default: 12Lh^2 + 13Lh + (V+s)h from the shape)");
  app->add_option("--dtype", f.dtype, "weights dtype: bf16, fp16 or fp32")->capture_default_str();
  app->add_option("--tp", f.tp, "tensor parallel size")->capture_default_str();
}

Result<std::optional<int64_t>> OptionalCount(const std::string& text, const char* flag) {
  if (text.empty()) return std::optional<int64_t>();
  CKPT_ASSIGN_OR_RETURN(int64_t v, est::ParseCountFlag(text, flag));
  return std::optional<int64_t>(v);
}

struct TrainFlags {
  ShapeFlags shape;
  int64_t micro_batch = 1;
  int64_t pp = 1;
  int64_t dp = 1;
  bool sequence_parallel = false;
  std::string recompute = "none";
  int zero = 0;
  std::string optimizer = "adam";
};

int RunTrain(const TrainFlags& f, bool json) {
  est::TrainConfig c;
  c.shape = {f.shape.layers, f.shape.hidden, f.shape.heads, f.shape.vocab, f.shape.seq_len};
  auto params = OptionalCount(f.shape.params, "--params");
  if (!params.ok()) return ReportError(kCommand, params.status(), json);
  c.params = *params;
  if (!c.params && f.shape.vocab < 1) {
    return ReportError(kCommand, InvalidArgument("train needs --vocab or --params"), json);
  }
  auto dtype = est::ParseDTypeFlag(f.shape.dtype, "--dtype");
  if (!dtype.ok()) return ReportError(kCommand, dtype.status(), json);
  c.dtype = *dtype;
  c.micro_batch = f.micro_batch;
  c.tp = f.shape.tp;
  c.pp = f.pp;
  c.dp = f.dp;
  c.sequence_parallel = f.sequence_parallel;
  auto rc = est::ParseRecompute(f.recompute);
  if (!rc.ok()) return ReportError(kCommand, rc.status(), json);
  c.recompute = *rc;
  c.zero_stage = f.zero;
  auto opt = est::ParseOptimizer(f.optimizer);
  if (!opt.ok()) return ReportError(kCommand, opt.status(), json);
  c.optimizer = *opt;
  auto e = est::EstimateTraining(c);
  if (!e.ok()) return ReportError(kCommand, e.status(), json);
  if (json) {
    PrintJson(est::MemoryEstimateToJson(*e));
    return 0;
  }
  std::string title =
      "Per-GPU training memory: L=" + std::to_string(c.shape.layers) +
      " h=" + std::to_string(c.shape.hidden) + " a=" + std::to_string(c.shape.heads) +
      " s=" + std::to_string(c.shape.seq_len) + " b=" + std::to_string(c.micro_batch) + ", " +
      std::string(DTypeName(c.dtype)) + ", TP " + std::to_string(c.tp) +
      (c.sequence_parallel ? " + SP" : "") + ", PP " + std::to_string(c.pp) + ", DP " +
      std::to_string(c.dp) + ", ZeRO-" + std::to_string(c.zero_stage) + ", recompute " +
      std::string(est::RecomputeName(c.recompute)) + ", " +
      std::string(est::OptimizerName(c.optimizer));
  std::cout << est::FormatMemoryEstimate(*e, title);
  return 0;
}

struct InferFlags {
  ShapeFlags shape;
  int64_t kv_heads = 0;
  int64_t batch = 1;
  int64_t context = 0;
  std::string kv_dtype;
};

int RunInfer(const InferFlags& f, bool json) {
  est::InferConfig c;
  c.shape = {f.shape.layers, f.shape.hidden, f.shape.heads, f.shape.vocab, f.shape.seq_len};
  auto params = OptionalCount(f.shape.params, "--params");
  if (!params.ok()) return ReportError(kCommand, params.status(), json);
  c.params = *params;
  if (!c.params && f.shape.vocab < 1) {
    return ReportError(kCommand, InvalidArgument("infer needs --vocab or --params"), json);
  }
  auto dtype = est::ParseDTypeFlag(f.shape.dtype, "--dtype");
  if (!dtype.ok()) return ReportError(kCommand, dtype.status(), json);
  c.dtype = *dtype;
  if (!f.kv_dtype.empty()) {
    auto kv = est::ParseDTypeFlag(f.kv_dtype, "--kv-dtype");
    if (!kv.ok()) return ReportError(kCommand, kv.status(), json);
    c.kv_dtype = *kv;
  }
  c.kv_heads = f.kv_heads;
  c.batch = f.batch;
  c.context = f.context;
  c.tp = f.shape.tp;
  auto e = est::EstimateInference(c);
  if (!e.ok()) return ReportError(kCommand, e.status(), json);
  if (json) {
    PrintJson(est::MemoryEstimateToJson(*e));
    return 0;
  }
  std::string title = "Per-GPU inference memory: L=" + std::to_string(c.shape.layers) +
                      " h=" + std::to_string(c.shape.hidden) +
                      " a=" + std::to_string(c.shape.heads) + ", batch " +
                      std::to_string(c.batch) + " x context " + std::to_string(c.context) +
                      ", " + std::string(DTypeName(c.dtype)) + ", TP " + std::to_string(c.tp);
  std::cout << est::FormatMemoryEstimate(*e, title);
  return 0;
}

int RunCheckpoint(const est::CheckpointRequest& f, bool json) {
  auto c = est::ResolveCheckpointConfig(f);
  if (!c.ok()) return ReportError(kCommand, c.status(), json);
  auto e = est::EstimateCheckpoint(*c);
  if (!e.ok()) return ReportError(kCommand, e.status(), json);
  if (json) {
    PrintJson(est::CheckpointEstimateToJson(*e));
  } else {
    std::cout << est::FormatCheckpointEstimate(*e);
  }
  return 0;
}

std::function<int()> Setup(CLI::App& sub) {
  sub.require_subcommand(1);
  auto json = std::make_shared<bool>(false);
  sub.add_flag("--json", *json, "print JSON instead of tables");

  auto zero2 = std::make_shared<ZeroFlags>();
  auto zero3 = std::make_shared<ZeroFlags>();
  CLI::App* z2 = sub.add_subcommand(
      "zero2", "DeepSpeed estimate_zero2_model_states_mem_needs_all_cold, per CPU and per GPU");
  CLI::App* z3 = sub.add_subcommand(
      "zero3", "DeepSpeed estimate_zero3_model_states_mem_needs_all_cold, per CPU and per GPU");
  for (auto [app, flags] : {std::pair{z2, zero2}, std::pair{z3, zero3}}) {
    AddSizeFlags(app, flags->size, true);
    app->add_option("--gpus-per-node", flags->gpus_per_node, "GPUs per node")
        ->capture_default_str();
    app->add_option("--nodes", flags->nodes, "nodes")->capture_default_str();
    app->add_option("--buffer-factor", flags->buffer_factor,
                    "DeepSpeed's additional_buffer_factor for host memory")
        ->capture_default_str();
    app->add_flag("--json", *json, "print JSON instead of the table");
  }
  z2->add_option("--formula", zero2->formula,
                 "current (DeepSpeed PR #5099 and later) or legacy (before it)")
      ->capture_default_str();

  auto states = std::make_shared<StatesFlags>();
  CLI::App* st = sub.add_subcommand(
      "states", "per-rank persistent state for DP, ZeRO-1, ZeRO-2, ZeRO-3 (exact bytes)");
  AddSizeFlags(st, states->size, false);
  st->add_option("--ranks,-n", states->ranks, "data-parallel ranks N")->required();
  st->add_option("--param-bytes", states->param_bytes, "bytes per compute weight")
      ->capture_default_str();
  st->add_option("--grad-bytes", states->grad_bytes, "bytes per gradient")->capture_default_str();
  st->add_option("--optim-bytes", states->optim_bytes,
                 "bytes per parameter of optimizer state incl. the fp32 master")
      ->capture_default_str();
  st->add_flag("--json", *json, "print JSON instead of the table");

  auto train = std::make_shared<TrainFlags>();
  CLI::App* tr = sub.add_subcommand(
      "train", "per-GPU training memory of a transformer (weights, grads, optimizer, activations)");
  AddShapeFlags(tr, train->shape);
  tr->add_option("--seq-len,-s", train->shape.seq_len, "sequence length s")->required();
  tr->add_option("--micro-batch,-b", train->micro_batch, "micro-batch size b")
      ->capture_default_str();
  tr->add_option("--pp", train->pp, "pipeline parallel size")->capture_default_str();
  tr->add_option("--dp", train->dp, "data parallel size (ZeRO shards over it)")
      ->capture_default_str();
  tr->add_flag("--sequence-parallel", train->sequence_parallel,
               "Megatron sequence parallelism (with --tp)");
  tr->add_option("--recompute", train->recompute, "none, selective or full")
      ->capture_default_str();
  tr->add_option("--zero", train->zero, "ZeRO stage 0-3")->capture_default_str();
  tr->add_option("--optimizer", train->optimizer, "adam or adam8bit")->capture_default_str();
  tr->add_flag("--json", *json, "print JSON instead of the table");

  auto infer = std::make_shared<InferFlags>();
  CLI::App* in = sub.add_subcommand("infer", "per-GPU inference memory: weights + KV cache");
  AddShapeFlags(in, infer->shape);
  in->add_option("--kv-heads", infer->kv_heads, "key/value heads (GQA/MQA; default: heads)");
  in->add_option("--batch", infer->batch, "sequences in the batch")->capture_default_str();
  in->add_option("--context", infer->context, "tokens cached per sequence")->required();
  in->add_option("--kv-dtype", infer->kv_dtype, "KV cache dtype (default: --dtype)");
  in->add_flag("--json", *json, "print JSON instead of the table");

  auto ckpt_flags = std::make_shared<est::CheckpointRequest>();
  CLI::App* ck = sub.add_subcommand(
      "checkpoint", "bytes of an uncompressed ckpt checkpoint per rank file and in total, the "
                    "fp32 export and universal sizes, and the RAM of export-fp32 and reshard");
  AddSizeFlags(ck, ckpt_flags->size, false);
  ck->add_option("--ranks,-n", ckpt_flags->ranks,
                 "data-parallel world size (default with --from-checkpoint: its own)");
  ck->add_option("--zero", ckpt_flags->zero,
                 "ZeRO stage 0-3 (default with --from-checkpoint: its own)");
  ck->add_option("--model-dtype", ckpt_flags->model_dtype,
                 "dtype of the parameters (with --params)")
      ->capture_default_str();
  ck->add_option("--compute-dtype", ckpt_flags->compute_dtype,
                 "also store a bf16/fp16 compute shard per rank");
  ck->add_option("--alignment", ckpt_flags->alignment, "partition alignment in elements")
      ->capture_default_str();
  ck->add_option("--chunk-bytes", ckpt_flags->chunk_bytes, "HDF5 chunk size (SaveOptions)")
      ->capture_default_str();
  ck->add_flag("--json", *json, "print JSON instead of the table");

  return [=]() -> int {
    if (z2->parsed()) return RunZero(2, *zero2, *json);
    if (z3->parsed()) return RunZero(3, *zero3, *json);
    if (st->parsed()) return RunStates(*states, *json);
    if (tr->parsed()) return RunTrain(*train, *json);
    if (in->parsed()) return RunInfer(*infer, *json);
    if (ck->parsed()) return RunCheckpoint(*ckpt_flags, *json);
    return ReportError(kCommand, InvalidArgument("expected a sub-command"), *json);
  };
}

}  // namespace

CKPT_REGISTER_COMMAND(estimate, "estimate",
                      "memory (DeepSpeed ZeRO-2/3 tables, training, inference) and "
                      "checkpoint-size estimates",
                      Setup);

}  // namespace ckpt::cli
