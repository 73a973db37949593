// The byte-level language model engine_min trains, with a hand-written forward and backward.
//
//   h0[n]   = sum_j pos[j] * embed[ctx[n, j]]        (ctx: the previous `context` bytes, 0-padded;
//                                                    pos: a fixed, frozen positional table)
//   a_l     = rms(h_l) W_l + b_l                     (W_l stored [d_in, d_out])
//   h_{l+1} = h_l + dropout_l(gelu(a_l))
//   logits  = rms(h_L) embed^T                       (output projection tied to the embedding)
// where rms(x) = x / sqrt(mean(x^2) + 1e-5) per token (parameter-free pre-norm; it keeps the
// 24-block small preset stable without adding parameters to the table).
//   loss    = sum_n (logsumexp(logits[n]) - logits[n, target[n]])
//
// Trainable parameters, in table (= flat buffer) order: embed.weight, then blocks.l.weight and
// blocks.l.bias for every block. pos.weight is frozen; lm_head.weight is a tied alias of
// embed.weight (one tensor, gradients from both uses summed).
//
// Every reduction runs in a fixed sequential order, so a forward/backward is bitwise
// reproducible; the float instantiation is what the engine runs, the double one is for the
// finite-difference gradient check.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ckpt/manifest.h"
#include "ckpt/status.h"

namespace engine_min {

struct ModelShape {
  int d_model = 128;
  int layers = 10;
  int context = 16;
  static constexpr int kVocab = 256;

  // "tiny" (~0.2M parameters, tests) or "small" (~25M, benchmarks).
  static ckpt::Result<ModelShape> Preset(const std::string& name);
  ckpt::Status Validate() const;
  int64_t TrainableNumel() const;
  int num_trainable() const { return 1 + 2 * layers; }
};

// Indices into the trainable list (flat-buffer order).
inline constexpr int kEmbedId = 0;
inline int WeightId(int layer) { return 1 + 2 * layer; }
inline int BiasId(int layer) { return 2 + 2 * layer; }

inline constexpr const char* kEmbedName = "embed.weight";
inline constexpr const char* kPosName = "pos.weight";
inline constexpr const char* kLmHeadName = "lm_head.weight";

// The parameter table as the checkpoint manifest lists it (no partition ranges yet):
// embed.weight, pos.weight (frozen), lm_head.weight (tied to embed.weight), blocks.*.
std::vector<ckpt::ParamEntry> ParamTable(const ModelShape& shape);
// Name and shape of trainable parameter `id`.
std::string TrainableName(int id);
std::vector<int64_t> TrainableShape(const ModelShape& shape, int id);
int64_t TrainableNumel(const ModelShape& shape, int id);

// The frozen positional table, a fixed function of the shape (values in [0.5, 1.5] / context).
std::vector<float> MakePositionalTable(const ModelShape& shape);
// Deterministic initial values of trainable parameter `id` (identical on every rank).
std::vector<float> InitTrainable(const ModelShape& shape, int id, uint64_t seed);

// One micro-batch: `tokens` predictions, each from `context` previous bytes.
struct TokenBatch {
  int64_t tokens = 0;
  std::vector<uint8_t> ctx;     // tokens × context, ctx[n * context + j] = byte t-1-j (0 pad)
  std::vector<uint8_t> target;  // tokens
};

// Dropout multipliers per block (0 or 1/(1-p)), layers × tokens × d_model; empty when p == 0.
struct DropoutMasks {
  std::vector<std::vector<float>> per_layer;
};

// Where the model reads its parameters and writes gradients. The engine implements it per ZeRO
// stage (ZeRO-3 gathers in Acquire and reduce-scatters in GradDone). The model calls it in the
// same order on every rank, so collective implementations stay matched.
template <typename T>
class ParamAccess {
 public:
  virtual ~ParamAccess() = default;
  // The full parameter values (valid until Release). Collective on ZeRO-3.
  virtual ckpt::Result<const T*> Acquire(int id) = 0;
  virtual ckpt::Status Release(int id) = 0;
  // The full-size gradient accumulator of `id`; the model adds into it.
  virtual ckpt::Result<T*> Grad(int id) = 0;
  // The model is done adding to Grad(id) for this micro-batch. Collective on ZeRO-3.
  virtual ckpt::Status GradDone(int id) = 0;
};

struct MicroResult {
  double loss_sum = 0;  // sum of per-token losses
  int64_t tokens = 0;
};

// Forward and backward of one micro-batch. Gradients are those of loss_sum × grad_scale
// (grad_scale = 1 / tokens of the global batch gives the token-weighted mean's gradient).
// `pos` is the frozen table; masks may be empty (no dropout).
template <typename T>
ckpt::Result<MicroResult> ForwardBackward(const ModelShape& shape, const T* pos,
                                          const TokenBatch& batch, const DropoutMasks& masks,
                                          double grad_scale, ParamAccess<T>& params);

// Forward only (loss_sum), for the finite-difference check and evaluation.
template <typename T>
ckpt::Result<MicroResult> Forward(const ModelShape& shape, const T* pos, const TokenBatch& batch,
                                  const DropoutMasks& masks, ParamAccess<T>& params);

}  // namespace engine_min
