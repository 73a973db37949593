#include "estimate/transformer_memory.h"

#include "numeric.h"

namespace ckpt::estimate {
namespace {

using internal::CeilDiv;
using internal::CheckedAdd;
using internal::CheckedMul;
using internal::StrFormat;

std::string I(int64_t v) { return std::to_string(v); }

Status Positive(int64_t v, const char* name) {
  if (v < 1) return InvalidArgument(std::string(name) + " must be at least 1 (got " + I(v) + ")");
  return Status::Ok();
}

// Multiplies a chain of non-negative factors with overflow checks.
Result<int64_t> Product(std::initializer_list<int64_t> factors, const char* what) {
  int64_t out = 1;
  for (int64_t f : factors) {
    CKPT_ASSIGN_OR_RETURN(out, CheckedMul(out, f, what), what);
  }
  return out;
}

Result<int> ComputeBytes(DType dtype) {
  switch (dtype) {
    case DType::kF32: return 4;
    case DType::kBF16:
    case DType::kF16: return 2;
    default:
      return InvalidArgument("dtype " + std::string(DTypeName(dtype)) +
                             " is not a training dtype (use fp32, bf16 or fp16)");
  }
}

}  // namespace

Result<int64_t> TransformerParams(const TransformerShape& s) {
  CKPT_RETURN_IF_ERROR(Positive(s.layers, "layers"), "model shape");
  CKPT_RETURN_IF_ERROR(Positive(s.hidden, "hidden"), "model shape");
  CKPT_RETURN_IF_ERROR(Positive(s.vocab, "vocab"), "model shape");
  CKPT_RETURN_IF_ERROR(Positive(s.seq_len, "sequence length"), "model shape");
  const char* what = "parameter count";
  int64_t a = 0, b = 0, c = 0, sum = 0;
  CKPT_ASSIGN_OR_RETURN(a, Product({12, s.layers, s.hidden, s.hidden}, what), what);
  CKPT_ASSIGN_OR_RETURN(b, Product({13, s.layers, s.hidden}, what), what);
  CKPT_ASSIGN_OR_RETURN(c, Product({s.vocab + s.seq_len, s.hidden}, what), what);
  CKPT_ASSIGN_OR_RETURN(sum, CheckedAdd(a, b, what), what);
  CKPT_ASSIGN_OR_RETURN(sum, CheckedAdd(sum, c, what), what);
  return sum;
}

Result<Recompute> ParseRecompute(std::string_view t) {
  if (t == "none") return Recompute::kNone;
  if (t == "selective") return Recompute::kSelective;
  if (t == "full") return Recompute::kFull;
  return InvalidArgument("unknown recompute '" + std::string(t) +
                         "' (expected none, selective or full)");
}

Result<OptimizerKind> ParseOptimizer(std::string_view t) {
  if (t == "adam" || t == "adamw") return OptimizerKind::kAdam;
  if (t == "adam8bit") return OptimizerKind::kAdam8bit;
  return InvalidArgument("unknown optimizer '" + std::string(t) +
                         "' (expected adam or adam8bit)");
}

std::string_view RecomputeName(Recompute r) {
  switch (r) {
    case Recompute::kNone: return "none";
    case Recompute::kSelective: return "selective";
    case Recompute::kFull: return "full";
  }
  return "none";
}

std::string_view OptimizerName(OptimizerKind o) {
  return o == OptimizerKind::kAdam8bit ? "adam8bit" : "adam";
}

Result<int64_t> ActivationBytesPerLayer(const TransformerShape& shape, int64_t b, int64_t t,
                                        bool sp, Recompute recompute) {
  CKPT_RETURN_IF_ERROR(Positive(shape.seq_len, "sequence length"), "activations");
  CKPT_RETURN_IF_ERROR(Positive(shape.hidden, "hidden"), "activations");
  CKPT_RETURN_IF_ERROR(Positive(shape.heads, "heads"), "activations");
  CKPT_RETURN_IF_ERROR(Positive(b, "micro-batch"), "activations");
  CKPT_RETURN_IF_ERROR(Positive(t, "tensor parallel size"), "activations");
  const char* what = "activation bytes";
  int64_t sbh = 0, as2b = 0;
  CKPT_ASSIGN_OR_RETURN(sbh, Product({shape.seq_len, b, shape.hidden}, what), what);
  // 5as/h · sbh = 5·a·s²·b: the attention scores, softmax output and dropout mask.
  CKPT_ASSIGN_OR_RETURN(as2b, Product({5, shape.heads, shape.seq_len, shape.seq_len, b}, what),
                        what);
  int64_t sbh10 = 0, sbh24 = 0, sbh34 = 0;
  CKPT_ASSIGN_OR_RETURN(sbh10, CheckedMul(sbh, 10, what), what);
  CKPT_ASSIGN_OR_RETURN(sbh24, CheckedMul(sbh, 24, what), what);
  CKPT_ASSIGN_OR_RETURN(sbh34, CheckedMul(sbh, 34, what), what);
  switch (recompute) {
    case Recompute::kFull: {  // only each layer's input: 2sbh (split by t under SP)
      int64_t in = 0;
      CKPT_ASSIGN_OR_RETURN(in, CheckedMul(sbh, 2, what), what);
      return sp ? CeilDiv(in, t) : in;
    }
    case Recompute::kSelective:  // sbh(34/t) with SP, sbh(10 + 24/t) without
      return sp ? CeilDiv(sbh34, t) : sbh10 + CeilDiv(sbh24, t);
    case Recompute::kNone: {  // sbh(34/t + 5as/(ht)) with SP, sbh(10 + 24/t + 5as/(ht))
      int64_t split = 0;
      CKPT_ASSIGN_OR_RETURN(split, CheckedAdd(sp ? sbh34 : sbh24, as2b, what), what);
      return sp ? CeilDiv(split, t) : sbh10 + CeilDiv(split, t);
    }
  }
  return Internal("unknown recompute mode");
}

namespace {

Status CheckTrainConfig(const TrainConfig& c) {
  const TransformerShape& s = c.shape;
  CKPT_RETURN_IF_ERROR(Positive(s.layers, "layers"), "train");
  CKPT_RETURN_IF_ERROR(Positive(s.hidden, "hidden"), "train");
  CKPT_RETURN_IF_ERROR(Positive(s.heads, "heads"), "train");
  CKPT_RETURN_IF_ERROR(Positive(s.seq_len, "sequence length"), "train");
  CKPT_RETURN_IF_ERROR(Positive(c.micro_batch, "micro-batch"), "train");
  CKPT_RETURN_IF_ERROR(Positive(c.tp, "tensor parallel size"), "train");
  CKPT_RETURN_IF_ERROR(Positive(c.pp, "pipeline parallel size"), "train");
  CKPT_RETURN_IF_ERROR(Positive(c.dp, "data parallel size"), "train");
  if (c.zero_stage < 0 || c.zero_stage > 3) {
    return InvalidArgument("train: unknown ZeRO stage " + std::to_string(c.zero_stage) +
                           " (expected 0, 1, 2 or 3)");
  }
  if (s.hidden % s.heads != 0) {
    return InvalidArgument("train: heads (" + I(s.heads) + ") must divide hidden (" +
                           I(s.hidden) + ")");
  }
  if (s.heads % c.tp != 0) {
    return InvalidArgument("train: tensor parallel size (" + I(c.tp) + ") must divide heads (" +
                           I(s.heads) + ")");
  }
  if (s.layers % c.pp != 0) {
    return InvalidArgument("train: pipeline parallel size (" + I(c.pp) +
                           ") must divide layers (" + I(s.layers) + ")");
  }
  return Status::Ok();
}

// Weights, gradients and optimizer state of this GPU's share of the `params` parameters
// (each item partitioned from its ZeRO stage on), `wbytes` bytes per weight.
Status AddModelStateItems(const TrainConfig& c, int64_t params, int wbytes, bool mixed,
                          MemoryEstimate& e) {
  const int64_t mp = c.tp * c.pp;
  const int64_t local = CeilDiv(params, mp);     // this GPU's model-parallel part
  const int64_t sharded = CeilDiv(local, c.dp);  // its ZeRO share
  const std::string local_s = "ceil(P/(tp*pp)) = " + I(local);
  const std::string sharded_s = "ceil(P/(tp*pp*dp)) = " + I(sharded);
  const char* what = "training memory";

  const int64_t w_elems = c.zero_stage >= 3 ? sharded : local;
  const int64_t g_elems = c.zero_stage >= 2 ? sharded : local;
  const int64_t o_elems = c.zero_stage >= 1 ? sharded : local;
  // Adam keeps two moments (4 + 4 bytes; 1 + 1 for 8-bit Adam) and, in mixed precision, an
  // fp32 master copy (4 bytes).
  const int64_t moment_bytes = c.optimizer == OptimizerKind::kAdam8bit ? 2 : 8;
  const int64_t obytes = moment_bytes + (mixed ? 4 : 0);
  int64_t wb = 0, gb = 0, ob = 0;
  CKPT_ASSIGN_OR_RETURN(wb, CheckedMul(w_elems, wbytes, what), what);
  CKPT_ASSIGN_OR_RETURN(gb, CheckedMul(g_elems, wbytes, what), what);
  CKPT_ASSIGN_OR_RETURN(ob, CheckedMul(o_elems, obytes, what), what);
  e.items.push_back({"weights", wb,
                     (c.zero_stage >= 3 ? sharded_s : local_s) + " x " + I(wbytes) + " B (" +
                         std::string(DTypeName(c.dtype)) + ")"});
  e.items.push_back({"gradients", gb,
                     (c.zero_stage >= 2 ? sharded_s : local_s) + " x " + I(wbytes) + " B (" +
                         std::string(DTypeName(c.dtype)) + ")"});
  std::string obreak = c.optimizer == OptimizerKind::kAdam8bit ? "1+1 moments" : "4+4 moments";
  if (mixed) obreak = "4 master + " + obreak;
  e.items.push_back({"optimizer", ob,
                     (c.zero_stage >= 1 ? sharded_s : local_s) + " x " + I(obytes) + " B (" +
                         obreak + ")"});
  return Status::Ok();
}

// The activations of all layers with the formula that gave them.
Result<MemoryItem> ActivationItem(const TrainConfig& c, bool mixed) {
  const TransformerShape& s = c.shape;
  const char* what = "training memory";
  int64_t per_layer = 0;
  CKPT_ASSIGN_OR_RETURN(per_layer,
                        ActivationBytesPerLayer(s, c.micro_batch, c.tp, c.sequence_parallel,
                                                c.recompute),
                        "train");
  int64_t act = 0;
  // Under 1F1B the first pipeline stage holds L/pp layers for pp in-flight micro-batches:
  // L layers' worth of activations whatever pp is (Korthikanti §4.2.3).
  CKPT_ASSIGN_OR_RETURN(act, CheckedMul(per_layer, s.layers, what), what);
  std::string act_formula;
  const bool sp = c.sequence_parallel;
  switch (c.recompute) {
    case Recompute::kNone:
      act_formula = sp ? "L*sbh*(34/t + 5as/(ht))" : "L*sbh*(10 + 24/t + 5as/(ht))";
      break;
    case Recompute::kSelective:
      act_formula = sp ? "L*sbh*(34/t)" : "L*sbh*(10 + 24/t)";
      break;
    case Recompute::kFull:
      act_formula = sp ? "L*2sbh/t" : "L*2sbh";
      break;
  }
  act_formula += " = " + I(s.layers) + " x " + I(per_layer) + " B";
  if (!mixed) {
    // The constants count 2-byte activations; fp32 doubles them (the 1-byte masks too, so
    // this slightly over-counts).
    CKPT_ASSIGN_OR_RETURN(act, CheckedMul(act, 2, what), what);
    act_formula += " x 2 (fp32 activations)";
  }
  return MemoryItem{"activations", act, act_formula};
}

nlohmann::json TrainConfigJson(const TrainConfig& c) {
  const TransformerShape& s = c.shape;
  return {{"layers", s.layers},
          {"hidden", s.hidden},
          {"heads", s.heads},
          {"vocab", s.vocab},
          {"seq_len", s.seq_len},
          {"micro_batch", c.micro_batch},
          {"dtype", std::string(DTypeName(c.dtype))},
          {"tp", c.tp},
          {"pp", c.pp},
          {"dp", c.dp},
          {"sequence_parallel", c.sequence_parallel},
          {"recompute", std::string(RecomputeName(c.recompute))},
          {"zero_stage", c.zero_stage},
          {"optimizer", std::string(OptimizerName(c.optimizer))}};
}

}  // namespace

Result<MemoryEstimate> EstimateTraining(const TrainConfig& c) {
  CKPT_RETURN_IF_ERROR(CheckTrainConfig(c));
  int wbytes = 0;
  CKPT_ASSIGN_OR_RETURN(wbytes, ComputeBytes(c.dtype), "train");
  const bool mixed = c.dtype != DType::kF32;

  MemoryEstimate e;
  if (c.params) {
    if (*c.params < 1) return InvalidArgument("train: params must be at least 1");
    e.params = *c.params;
    e.params_from_shape = false;
  } else {
    CKPT_ASSIGN_OR_RETURN(e.params, TransformerParams(c.shape), "train");
  }
  CKPT_RETURN_IF_ERROR(AddModelStateItems(c, e.params, wbytes, mixed, e));
  CKPT_ASSIGN_OR_RETURN(MemoryItem activations, ActivationItem(c, mixed));
  e.items.push_back(std::move(activations));
  const char* what = "training memory";
  for (const MemoryItem& item : e.items) {
    CKPT_ASSIGN_OR_RETURN(e.total_bytes, CheckedAdd(e.total_bytes, item.bytes, what), what);
  }
  e.not_counted = {
      "temporary buffers and framework workspace (cuBLAS/cuDNN, fused-kernel scratch)",
      "communication buffers (NCCL, ZeRO reduce/all-gather buckets, ZeRO-3 gathered "
      "parameters and prefetch)",
      "allocator fragmentation and the CUDA context",
      "embedding/output-layer activations and the logits (about 4sbh/t*(1 + V/h) bytes, "
      "Korthikanti §4.3), and extra in-flight micro-batches of interleaved pipelines"};
  e.config = TrainConfigJson(c);
  return e;
}

Result<MemoryEstimate> EstimateInference(const InferConfig& c) {
  const TransformerShape& s = c.shape;
  CKPT_RETURN_IF_ERROR(Positive(s.layers, "layers"), "infer");
  CKPT_RETURN_IF_ERROR(Positive(s.hidden, "hidden"), "infer");
  CKPT_RETURN_IF_ERROR(Positive(s.heads, "heads"), "infer");
  CKPT_RETURN_IF_ERROR(Positive(c.batch, "batch"), "infer");
  CKPT_RETURN_IF_ERROR(Positive(c.context, "context"), "infer");
  CKPT_RETURN_IF_ERROR(Positive(c.tp, "tensor parallel size"), "infer");
  if (s.hidden % s.heads != 0) {
    return InvalidArgument("infer: heads (" + I(s.heads) + ") must divide hidden (" +
                           I(s.hidden) + ")");
  }
  const int64_t kv_heads = c.kv_heads == 0 ? s.heads : c.kv_heads;
  if (kv_heads < 1 || kv_heads > s.heads || s.heads % kv_heads != 0) {
    return InvalidArgument("infer: kv heads (" + I(kv_heads) + ") must divide heads (" +
                           I(s.heads) + ")");
  }
  const int wbytes = static_cast<int>(DTypeSize(c.dtype));
  const DType kv_dtype = c.kv_dtype.value_or(c.dtype);
  const int kvbytes = static_cast<int>(DTypeSize(kv_dtype));
  MemoryEstimate e;
  if (c.params) {
    if (*c.params < 1) return InvalidArgument("infer: params must be at least 1");
    e.params = *c.params;
    e.params_from_shape = false;
  } else {
    TransformerShape shape = s;
    if (shape.seq_len < 1) shape.seq_len = c.context;
    CKPT_ASSIGN_OR_RETURN(e.params, TransformerParams(shape), "infer");
  }
  const char* what = "inference memory";
  const int64_t local = CeilDiv(e.params, c.tp);
  int64_t wb = 0;
  CKPT_ASSIGN_OR_RETURN(wb, CheckedMul(local, wbytes, what), what);
  e.items.push_back({"weights", wb,
                     "ceil(P/tp) = " + I(local) + " x " + I(wbytes) + " B (" +
                         std::string(DTypeName(c.dtype)) + ")"});
  // Each GPU caches K and V for its ceil(kv_heads / tp) heads (replicated when tp > kv_heads).
  const int64_t head_dim = s.hidden / s.heads;
  const int64_t local_kv_heads = CeilDiv(kv_heads, c.tp);
  int64_t kv = 0;
  CKPT_ASSIGN_OR_RETURN(
      kv, Product({2, s.layers, c.batch, c.context, local_kv_heads, head_dim, kvbytes}, what),
      what);
  e.items.push_back({"kv_cache", kv,
                     "2*L*batch*context*ceil(kv_heads/tp)*(h/a)*bytes = 2 x " + I(s.layers) +
                         " x " + I(c.batch) + " x " + I(c.context) + " x " + I(local_kv_heads) +
                         " x " + I(head_dim) + " x " + I(kvbytes)});
  for (const MemoryItem& item : e.items) {
    CKPT_ASSIGN_OR_RETURN(e.total_bytes, CheckedAdd(e.total_bytes, item.bytes, what), what);
  }
  e.not_counted = {
      "activations of the forward pass and the logits (transient, reused per layer)",
      "framework workspace, communication buffers and the CUDA context",
      "allocator fragmentation and a paged KV cache's unused block tails"};
  e.config = {{"layers", s.layers},         {"hidden", s.hidden},
              {"heads", s.heads},           {"kv_heads", kv_heads},
              {"vocab", s.vocab},           {"batch", c.batch},
              {"context", c.context},       {"dtype", std::string(DTypeName(c.dtype))},
              {"kv_dtype", std::string(DTypeName(kv_dtype))}, {"tp", c.tp}};
  return e;
}

std::string FormatMemoryEstimate(const MemoryEstimate& e, std::string_view title) {
  std::string out(title);
  out += StrFormat("\nParameters: %lld (%s)\n", static_cast<long long>(e.params),
                   e.params_from_shape ? "from the shape: 12Lh^2 + 13Lh + (V+s)h" : "given");
  out += "  item        |              bytes |       GiB | formula\n";
  for (const MemoryItem& item : e.items) {
    out += StrFormat("  %-11s | %18lld | %9.2f | %s\n", item.name.c_str(),
                     static_cast<long long>(item.bytes),
                     static_cast<double>(item.bytes) / internal::kGiB, item.formula.c_str());
  }
  out += StrFormat("  %-11s | %18lld | %9.2f |\n", "total",
                   static_cast<long long>(e.total_bytes),
                   static_cast<double>(e.total_bytes) / internal::kGiB);
  out += "Not counted:\n";
  for (const std::string& n : e.not_counted) out += "  - " + n + "\n";
  return out;
}

nlohmann::json MemoryEstimateToJson(const MemoryEstimate& e) {
  nlohmann::json items = nlohmann::json::array();
  for (const MemoryItem& item : e.items) {
    items.push_back({{"name", item.name}, {"bytes", item.bytes}, {"formula", item.formula}});
  }
  return {{"params", e.params},
          {"params_from_shape", e.params_from_shape},
          {"config", e.config},
          {"items", items},
          {"total_bytes", e.total_bytes},
          {"not_counted", e.not_counted}};
}

}  // namespace ckpt::estimate
