#include "engine_min/model.h"

#include <algorithm>
#include <cmath>
#include <random>

#include "engine_min/random.h"

namespace engine_min {

ckpt::Result<ModelShape> ModelShape::Preset(const std::string& name) {
  ModelShape s;
  if (name == "tiny") {
    s.d_model = 128;
    s.layers = 10;
    s.context = 16;
  } else if (name == "small") {
    s.d_model = 1024;
    s.layers = 24;
    s.context = 32;
  } else {
    return ckpt::InvalidArgument("unknown --model '" + name + "' (expected tiny or small)");
  }
  return s;
}

ckpt::Status ModelShape::Validate() const {
  if (d_model < 1 || d_model > 16384) return ckpt::InvalidArgument("--d-model must be in 1..16384");
  if (layers < 0 || layers > 1024) return ckpt::InvalidArgument("--layers must be in 0..1024");
  if (context < 1 || context > 4096) return ckpt::InvalidArgument("--context must be in 1..4096");
  return ckpt::Status::Ok();
}

int64_t TrainableNumel(const ModelShape& shape, int id) {
  const int64_t d = shape.d_model;
  if (id == kEmbedId) return ModelShape::kVocab * d;
  return (id % 2 == 1) ? d * d : d;
}

int64_t ModelShape::TrainableNumel() const {
  int64_t n = 0;
  for (int id = 0; id < num_trainable(); ++id) n += engine_min::TrainableNumel(*this, id);
  return n;
}

std::string TrainableName(int id) {
  if (id == kEmbedId) return kEmbedName;
  const int layer = (id - 1) / 2;
  return "blocks." + std::to_string(layer) + ((id % 2 == 1) ? ".weight" : ".bias");
}

std::vector<int64_t> TrainableShape(const ModelShape& shape, int id) {
  const int64_t d = shape.d_model;
  if (id == kEmbedId) return {ModelShape::kVocab, d};
  if (id % 2 == 1) return {d, d};
  return {d};
}

std::vector<ckpt::ParamEntry> ParamTable(const ModelShape& shape) {
  std::vector<ckpt::ParamEntry> table;
  auto add = [&](std::string name, std::vector<int64_t> dims, bool frozen, std::string tied) {
    ckpt::ParamEntry e;
    e.name = std::move(name);
    e.shape = std::move(dims);
    e.dtype = ckpt::DType::kF32;
    e.numel = 1;
    for (int64_t x : e.shape) e.numel *= x;
    e.frozen = frozen;
    e.tied_to = std::move(tied);
    table.push_back(std::move(e));
  };
  add(kEmbedName, TrainableShape(shape, kEmbedId), false, "");
  add(kPosName, {shape.context, shape.d_model}, true, "");
  add(kLmHeadName, TrainableShape(shape, kEmbedId), false, kEmbedName);
  for (int l = 0; l < shape.layers; ++l) {
    add(TrainableName(WeightId(l)), TrainableShape(shape, WeightId(l)), false, "");
    add(TrainableName(BiasId(l)), TrainableShape(shape, BiasId(l)), false, "");
  }
  return table;
}

std::vector<float> MakePositionalTable(const ModelShape& shape) {
  // Fixed (not seeded by the run) so the frozen tensor is the same in every run of a shape.
  std::mt19937_64 gen(0x706f735f7461626cULL);
  std::vector<float> pos(static_cast<size_t>(shape.context) * shape.d_model);
  const double inv_k = 1.0 / shape.context;
  for (float& x : pos) x = static_cast<float>((0.5 + UniformDouble(gen)) * inv_k);
  return pos;
}

std::vector<float> InitTrainable(const ModelShape& shape, int id, uint64_t seed) {
  std::mt19937_64 gen(MixSeed(seed, 0x696e6974ULL, static_cast<uint64_t>(id), 0));
  std::vector<float> w(static_cast<size_t>(TrainableNumel(shape, id)));
  double stddev = 0;
  if (id == kEmbedId) {
    stddev = 0.5 / std::sqrt(static_cast<double>(shape.d_model));
  } else if (id % 2 == 1) {
    stddev = 1.0 / std::sqrt(static_cast<double>(shape.d_model) * std::max(1, shape.layers));
  } else {
    return w;  // biases start at zero
  }
  for (float& x : w) x = static_cast<float>(stddev * NormalDouble(gen));
  return w;
}

namespace {

constexpr int kRowTile = 16;

// y[n, :] += sum_k x[n, k] * m[k, :] for n < rows; x is rows × kdim, m is kdim × cols.
// The k-sum of every output element runs in increasing k: the tiling over rows only changes
// which elements are computed together, never an element's operation order.
template <typename T>
void AddRowsTimesMatrix(const T* x, int64_t rows, int64_t kdim, const T* m, int64_t cols, T* y) {
  for (int64_t n0 = 0; n0 < rows; n0 += kRowTile) {
    const int64_t n1 = std::min(rows, n0 + kRowTile);
    for (int64_t k = 0; k < kdim; ++k) {
      const T* mrow = m + k * cols;
      for (int64_t n = n0; n < n1; ++n) {
        const T a = x[n * kdim + k];
        T* yrow = y + n * cols;
        for (int64_t c = 0; c < cols; ++c) yrow[c] += a * mrow[c];
      }
    }
  }
}

// g[k, :] += sum_n x[n, k] * y[n, :]; x is rows × kdim, y is rows × cols. Sums over n in order.
template <typename T>
void AddOuterProducts(const T* x, int64_t rows, int64_t kdim, const T* y, int64_t cols, T* g) {
  for (int64_t k = 0; k < kdim; ++k) {
    T* grow = g + k * cols;
    for (int64_t n = 0; n < rows; ++n) {
      const T a = x[n * kdim + k];
      const T* yrow = y + n * cols;
      for (int64_t c = 0; c < cols; ++c) grow[c] += a * yrow[c];
    }
  }
}

template <typename T>
std::vector<T> Transpose(const T* m, int64_t rows, int64_t cols) {
  std::vector<T> t(static_cast<size_t>(rows * cols));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) t[c * rows + r] = m[r * cols + c];
  return t;
}

constexpr double kGeluC = 0.7978845608028654;  // sqrt(2 / pi)
constexpr double kGeluA = 0.044715;

template <typename T>
T Gelu(T x) {
  const T u = T(kGeluC) * (x + T(kGeluA) * x * x * x);
  return T(0.5) * x * (T(1) + std::tanh(u));
}

template <typename T>
T GeluGrad(T x) {
  const T u = T(kGeluC) * (x + T(kGeluA) * x * x * x);
  const T t = std::tanh(u);
  return T(0.5) * (T(1) + t) +
         T(0.5) * x * (T(1) - t * t) * T(kGeluC) * (T(1) + T(3 * kGeluA) * x * x);
}

constexpr double kRmsEps = 1e-5;

// y[n] = x[n] / sqrt(mean(x[n]^2) + eps) per row; inv_r[n] = 1 / sqrt(...).
template <typename T>
void RmsNormRows(const T* x, int64_t rows, int64_t d, T* y, T* inv_r) {
  for (int64_t n = 0; n < rows; ++n) {
    const T* xr = x + n * d;
    T ss = T(0);
    for (int64_t c = 0; c < d; ++c) ss += xr[c] * xr[c];
    const T inv = T(1) / std::sqrt(ss / T(d) + T(kRmsEps));
    inv_r[n] = inv;
    T* yr = y + n * d;
    for (int64_t c = 0; c < d; ++c) yr[c] = xr[c] * inv;
  }
}

// dx[n] += (dy[n] - y[n] * (dy[n] . y[n]) / d) * inv_r[n], the RMS norm's backward.
template <typename T>
void AddRmsNormGrad(const T* y, const T* inv_r, const T* dy, int64_t rows, int64_t d, T* dx) {
  for (int64_t n = 0; n < rows; ++n) {
    const T* yr = y + n * d;
    const T* dyr = dy + n * d;
    T dot = T(0);
    for (int64_t c = 0; c < d; ++c) dot += dyr[c] * yr[c];
    const T mean = dot / T(d);
    T* dxr = dx + n * d;
    for (int64_t c = 0; c < d; ++c) dxr[c] += (dyr[c] - yr[c] * mean) * inv_r[n];
  }
}

// What the forward pass keeps for the backward: each block's normalized input and 1/rms, its
// pre-activation, and (at index L) the final normalized state.
template <typename T>
struct Activations {
  explicit Activations(int layers) : normed(layers + 1), inv_rms(layers + 1), a(layers) {}
  std::vector<std::vector<T>> normed, inv_rms, a;
};

// Embedding, the L residual blocks (dropout where masks are given) and the final RMS norm.
template <typename T>
ckpt::Status ForwardBlocks(const ModelShape& shape, const T* pos, const TokenBatch& batch,
                           const DropoutMasks& masks, ParamAccess<T>& params, Activations<T>& act) {
  const int64_t d = shape.d_model;
  const int64_t K = shape.context;
  const int64_t N = batch.tokens;
  const int L = shape.layers;
  const bool dropout = !masks.per_layer.empty();
  const size_t nd = static_cast<size_t>(N * d);
  std::vector<T> h(nd, T(0));
  {
    CKPT_ASSIGN_OR_RETURN(const T* embed, params.Acquire(kEmbedId), "embedding");
    for (int64_t n = 0; n < N; ++n) {
      for (int64_t j = 0; j < K; ++j) {
        const T* e = embed + static_cast<int64_t>(batch.ctx[n * K + j]) * d;
        const T* p = pos + j * d;
        T* out = h.data() + n * d;
        for (int64_t c = 0; c < d; ++c) out[c] += p[c] * e[c];
      }
    }
    CKPT_RETURN_IF_ERROR(params.Release(kEmbedId), "embedding");
  }

  for (int l = 0; l < L; ++l) {
    CKPT_ASSIGN_OR_RETURN(const T* w, params.Acquire(WeightId(l)), "block weight");
    CKPT_ASSIGN_OR_RETURN(const T* b, params.Acquire(BiasId(l)), "block bias");
    act.normed[l].resize(nd);
    act.inv_rms[l].resize(static_cast<size_t>(N));
    RmsNormRows(h.data(), N, d, act.normed[l].data(), act.inv_rms[l].data());
    act.a[l].assign(nd, T(0));
    T* al = act.a[l].data();
    for (int64_t n = 0; n < N; ++n) std::copy(b, b + d, al + n * d);
    AddRowsTimesMatrix(act.normed[l].data(), N, d, w, d, al);
    const float* mask = dropout ? masks.per_layer[l].data() : nullptr;
    for (size_t i = 0; i < nd; ++i) {
      T g = Gelu(al[i]);
      if (mask) g = g * T(mask[i]);
      h[i] = h[i] + g;
    }
    CKPT_RETURN_IF_ERROR(params.Release(BiasId(l)), "block bias");
    CKPT_RETURN_IF_ERROR(params.Release(WeightId(l)), "block weight");
  }
  act.normed[L].resize(nd);
  act.inv_rms[L].resize(static_cast<size_t>(N));
  RmsNormRows(h.data(), N, d, act.normed[L].data(), act.inv_rms[L].data());
  return ckpt::Status::Ok();
}

// The tied output projection and the cross-entropy loss (into result). With backward, the
// output projection's weight gradient and dL/dh of the last block's output (into dh, nd zeros
// on entry), each loss term scaled by grad_scale.
template <typename T>
ckpt::Status OutputLoss(const ModelShape& shape, const TokenBatch& batch, double grad_scale,
                        bool backward, ParamAccess<T>& params, const Activations<T>& act,
                        MicroResult& result, std::vector<T>& dh) {
  const int64_t d = shape.d_model;
  const int64_t V = ModelShape::kVocab;
  const int64_t N = batch.tokens;
  const int L = shape.layers;
  const size_t nd = static_cast<size_t>(N * d);
  CKPT_ASSIGN_OR_RETURN(const T* embed, params.Acquire(kEmbedId), "output projection");
  const std::vector<T> embed_t = Transpose(embed, V, d);  // d × V
  std::vector<T> logits(static_cast<size_t>(N * V), T(0));
  AddRowsTimesMatrix(act.normed[L].data(), N, d, embed_t.data(), V, logits.data());
  const T scale = T(grad_scale);
  for (int64_t n = 0; n < N; ++n) {
    T* z = logits.data() + n * V;
    T zmax = z[0];
    for (int64_t v = 1; v < V; ++v) zmax = std::max(zmax, z[v]);
    T sum = T(0);
    for (int64_t v = 0; v < V; ++v) sum += std::exp(z[v] - zmax);
    const T lse = zmax + std::log(sum);
    const int t = batch.target[n];
    result.loss_sum += static_cast<double>(lse - z[t]);
    if (backward) {
      // z becomes dL/dz = (softmax - onehot) * scale.
      for (int64_t v = 0; v < V; ++v) z[v] = std::exp(z[v] - zmax) / sum * scale;
      z[t] -= scale;
    }
  }
  if (backward) {
    CKPT_ASSIGN_OR_RETURN(T * dembed, params.Grad(kEmbedId), "output projection grad");
    AddOuterProducts(logits.data(), N, V, act.normed[L].data(), d, dembed);
    std::vector<T> dnormed(nd, T(0));
    AddRowsTimesMatrix(logits.data(), N, V, embed, d, dnormed.data());
    AddRmsNormGrad(act.normed[L].data(), act.inv_rms[L].data(), dnormed.data(), N, d, dh.data());
  }
  CKPT_RETURN_IF_ERROR(params.Release(kEmbedId), "output projection");
  return ckpt::Status::Ok();
}

// The blocks' and the embedding's gradients from dh (dL/dh of the last block's output),
// last block first; each block's activations are freed once used.
template <typename T>
ckpt::Status BackwardBlocks(const ModelShape& shape, const T* pos, const TokenBatch& batch,
                            const DropoutMasks& masks, ParamAccess<T>& params, Activations<T>& act,
                            std::vector<T>& dh) {
  const int64_t d = shape.d_model;
  const int64_t K = shape.context;
  const int64_t N = batch.tokens;
  const int L = shape.layers;
  const bool dropout = !masks.per_layer.empty();
  const size_t nd = static_cast<size_t>(N * d);
  std::vector<T> da(nd), dnormed(nd);
  for (int l = L - 1; l >= 0; --l) {
    CKPT_ASSIGN_OR_RETURN(const T* w, params.Acquire(WeightId(l)), "block weight");
    CKPT_ASSIGN_OR_RETURN(const T* b, params.Acquire(BiasId(l)), "block bias");
    (void)b;
    const T* al = act.a[l].data();
    const float* mask = dropout ? masks.per_layer[l].data() : nullptr;
    for (size_t i = 0; i < nd; ++i) {
      T g = dh[i];
      if (mask) g = g * T(mask[i]);
      da[i] = g * GeluGrad(al[i]);
    }
    CKPT_ASSIGN_OR_RETURN(T * dw, params.Grad(WeightId(l)), "block weight grad");
    AddOuterProducts(act.normed[l].data(), N, d, da.data(), d, dw);
    CKPT_ASSIGN_OR_RETURN(T * db, params.Grad(BiasId(l)), "block bias grad");
    for (int64_t n = 0; n < N; ++n) {
      const T* row = da.data() + n * d;
      for (int64_t c = 0; c < d; ++c) db[c] += row[c];
    }
    // dh_l = dh_{l+1} (residual) + rmsnorm'(da W^T).
    const std::vector<T> w_t = Transpose(w, d, d);
    std::fill(dnormed.begin(), dnormed.end(), T(0));
    AddRowsTimesMatrix(da.data(), N, d, w_t.data(), d, dnormed.data());
    AddRmsNormGrad(act.normed[l].data(), act.inv_rms[l].data(), dnormed.data(), N, d, dh.data());
    CKPT_RETURN_IF_ERROR(params.GradDone(WeightId(l)), "block weight grad");
    CKPT_RETURN_IF_ERROR(params.GradDone(BiasId(l)), "block bias grad");
    CKPT_RETURN_IF_ERROR(params.Release(BiasId(l)), "block bias");
    CKPT_RETURN_IF_ERROR(params.Release(WeightId(l)), "block weight");
    std::vector<T>().swap(act.normed[l + 1]);
    std::vector<T>().swap(act.a[l]);
  }

  CKPT_ASSIGN_OR_RETURN(T * dembed, params.Grad(kEmbedId), "embedding grad");
  for (int64_t n = 0; n < N; ++n) {
    const T* g = dh.data() + n * d;
    for (int64_t j = 0; j < K; ++j) {
      T* out = dembed + static_cast<int64_t>(batch.ctx[n * K + j]) * d;
      const T* p = pos + j * d;
      for (int64_t c = 0; c < d; ++c) out[c] += p[c] * g[c];
    }
  }
  CKPT_RETURN_IF_ERROR(params.GradDone(kEmbedId), "embedding grad");
  return ckpt::Status::Ok();
}

// One micro-batch: the forward pass and the loss, and with backward the gradients.
template <typename T>
ckpt::Result<MicroResult> MicroBatchPass(const ModelShape& shape, const T* pos,
                                         const TokenBatch& batch, const DropoutMasks& masks,
                                         double grad_scale, bool backward, ParamAccess<T>& params) {
  const int64_t N = batch.tokens;
  const int L = shape.layers;
  if (static_cast<int64_t>(batch.ctx.size()) != N * shape.context ||
      static_cast<int64_t>(batch.target.size()) != N) {
    return ckpt::Internal("token batch has inconsistent sizes");
  }
  if (!masks.per_layer.empty() && static_cast<int>(masks.per_layer.size()) != L) {
    return ckpt::Internal("dropout masks do not match the layer count");
  }
  Activations<T> act(L);
  CKPT_RETURN_IF_ERROR(ForwardBlocks(shape, pos, batch, masks, params, act));
  MicroResult result;
  result.tokens = N;
  std::vector<T> dh(backward ? static_cast<size_t>(N * shape.d_model) : 0, T(0));
  CKPT_RETURN_IF_ERROR(OutputLoss(shape, batch, grad_scale, backward, params, act, result, dh));
  if (!backward) return result;
  CKPT_RETURN_IF_ERROR(BackwardBlocks(shape, pos, batch, masks, params, act, dh));
  return result;
}

}  // namespace

template <typename T>
ckpt::Result<MicroResult> ForwardBackward(const ModelShape& shape, const T* pos,
                                          const TokenBatch& batch, const DropoutMasks& masks,
                                          double grad_scale, ParamAccess<T>& params) {
  return MicroBatchPass<T>(shape, pos, batch, masks, grad_scale, true, params);
}

template <typename T>
ckpt::Result<MicroResult> Forward(const ModelShape& shape, const T* pos, const TokenBatch& batch,
                                  const DropoutMasks& masks, ParamAccess<T>& params) {
  return MicroBatchPass<T>(shape, pos, batch, masks, 0.0, false, params);
}

template ckpt::Result<MicroResult> ForwardBackward<float>(const ModelShape&, const float*,
                                                          const TokenBatch&, const DropoutMasks&,
                                                          double, ParamAccess<float>&);
template ckpt::Result<MicroResult> ForwardBackward<double>(const ModelShape&, const double*,
                                                           const TokenBatch&, const DropoutMasks&,
                                                           double, ParamAccess<double>&);
template ckpt::Result<MicroResult> Forward<float>(const ModelShape&, const float*,
                                                  const TokenBatch&, const DropoutMasks&,
                                                  ParamAccess<float>&);
template ckpt::Result<MicroResult> Forward<double>(const ModelShape&, const double*,
                                                   const TokenBatch&, const DropoutMasks&,
                                                   ParamAccess<double>&);

}  // namespace engine_min
