// Per-GPU memory of a GPT-style transformer for training and inference: weights, gradients,
// optimizer state and activations (training), weights and KV cache (inference).
//
// Sources (docs/estimate.md gives every formula):
//  - weights / gradients / optimizer bytes per parameter and their division by TP, PP and
//    ZeRO over DP: the LLM GPU-memory notes of seed 004 and the ZeRO paper;
//  - activations per layer: Korthikanti et al., "Reducing Activation Recomputation in Large
//    Transformer Models" (2022), Table 2, one formula per recompute / parallelism case;
//  - the parameter count from the shape: Narayanan et al. (2021), 12Lh^2 + 13Lh + (V + s)h.
// Pure functions; thread-safe.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "ckpt/dtype.h"
#include "ckpt/status.h"

namespace ckpt::estimate {

struct TransformerShape {
  int64_t layers = 0;      // L
  int64_t hidden = 0;      // h
  int64_t heads = 0;       // a
  int64_t vocab = 0;       // V
  int64_t seq_len = 0;     // s (also the learned position table size)
};

// 12·L·h² + 13·L·h + (V + s)·h; InvalidArgument on overflow or a non-positive dimension.
Result<int64_t> TransformerParams(const TransformerShape& shape);

enum class Recompute { kNone, kSelective, kFull };
enum class OptimizerKind { kAdam, kAdam8bit };
Result<Recompute> ParseRecompute(std::string_view text);        // none|selective|full
Result<OptimizerKind> ParseOptimizer(std::string_view text);    // adam|adam8bit
std::string_view RecomputeName(Recompute r);
std::string_view OptimizerName(OptimizerKind o);

struct TrainConfig {
  TransformerShape shape;
  std::optional<int64_t> params;  // overrides the count derived from the shape
  int64_t micro_batch = 1;        // b
  DType dtype = DType::kBF16;     // weights and gradients; bf16/fp16 = mixed precision
  int64_t tp = 1;
  int64_t pp = 1;
  int64_t dp = 1;
  bool sequence_parallel = false;
  Recompute recompute = Recompute::kNone;
  int zero_stage = 0;  // 0..3, over the DP group
  OptimizerKind optimizer = OptimizerKind::kAdam;
};

struct MemoryItem {
  std::string name;     // "weights", "gradients", "optimizer", "activations"
  int64_t bytes = 0;
  std::string formula;  // how it was computed, with the numbers substituted
};

struct MemoryEstimate {
  int64_t params = 0;
  bool params_from_shape = true;
  std::vector<MemoryItem> items;
  int64_t total_bytes = 0;
  std::vector<std::string> not_counted;
  nlohmann::json config = nlohmann::json::object();
};

// Per-GPU training memory. InvalidArgument for non-positive sizes, a stage outside 0..3,
// heads not dividing hidden, tp not dividing heads, or a dtype other than fp32/bf16/fp16.
Result<MemoryEstimate> EstimateTraining(const TrainConfig& config);

// Korthikanti Table 2, bytes of activations one transformer layer stores for one micro-batch
// (16-bit activations, 1-byte dropout masks), rounded up to whole bytes.
Result<int64_t> ActivationBytesPerLayer(const TransformerShape& shape, int64_t micro_batch,
                                        int64_t tp, bool sequence_parallel,
                                        Recompute recompute);

struct InferConfig {
  TransformerShape shape;  // seq_len only sizes the position table of the derived count
  std::optional<int64_t> params;
  int64_t kv_heads = 0;    // 0: same as heads (multi-head attention); fewer: GQA / MQA
  int64_t batch = 1;
  int64_t context = 0;     // tokens cached per sequence (prompt + generated)
  DType dtype = DType::kBF16;
  std::optional<DType> kv_dtype;  // default: dtype
  int64_t tp = 1;
};

// Per-GPU inference memory: weights P/tp × bytes and the KV cache
// 2 · L · batch · context · (h · kv_heads / heads) · kv_bytes / tp.
Result<MemoryEstimate> EstimateInference(const InferConfig& config);

// Table: item | bytes | GiB | formula, a total line, and the "Not counted:" list.
std::string FormatMemoryEstimate(const MemoryEstimate& e, std::string_view title);
nlohmann::json MemoryEstimateToJson(const MemoryEstimate& e);

}  // namespace ckpt::estimate
