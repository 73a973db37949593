#include "engine_min/engine.h"

#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <map>
#include <thread>

#include "ckpt/adamw.h"
#include "ckpt/dtype.h"
#include "ckpt/env.h"
#include "ckpt/hash.h"
#include "ckpt/json.h"
#include "ckpt/load_resharded.h"
#include "ckpt/shape.h"
#include "ckpt/utc_time.h"
#include "engine_min/random.h"

namespace engine_min {

namespace {

constexpr uint64_t kDropoutStream = 0x64726f706f7574ULL;
constexpr const char* kRngDropout = "rng/dropout";
constexpr const char* kRngShuffle = "rng/shuffle";

std::mt19937_64 FreshDropoutRng(uint64_t seed, int rank) {
  return std::mt19937_64(MixSeed(seed, kDropoutStream, static_cast<uint64_t>(rank), 0));
}

// A rank file without rng/dropout (a resharded checkpoint's new rank): seeded from
// (seed, global_step, rank), as docs/architecture.md specifies.
std::mt19937_64 SeededDropoutRng(uint64_t seed, int64_t global_step, int rank) {
  return std::mt19937_64(MixSeed(seed, kDropoutStream, static_cast<uint64_t>(rank),
                                 static_cast<uint64_t>(global_step) + 1));
}

std::string FormatDouble(double x) {
  if (!std::isfinite(x)) return "null";
  char buf[40];
  std::snprintf(buf, sizeof(buf), "%.17g", x);
  return buf;
}

std::string Digest(const std::vector<float>& v) {
  return ckpt::DigestHex(ckpt::Xxh3(v.data(), v.size() * sizeof(float)));
}

// Forwards to the real Env and kills this process (SIGKILL, no clean-up of any kind) when the
// save seals this rank's file: the file is complete, the commit has not happened.
class KillingEnv final : public ckpt::EnvWrapper {
 public:
  KillingEnv(ckpt::Env* base, bool stall) : EnvWrapper(base), stall_(stall) {}
  ckpt::Status SyncFile(const std::string& p) override {
    ckpt::Status s = EnvWrapper::SyncFile(p);
    if (p.size() >= 3 && p.compare(p.size() - 3, 3, ".h5") == 0) {
      std::fprintf(stderr, "engine_min: test hook: %s this rank inside the save\n",
                   stall_ ? "stalling" : "killing");
      std::fflush(stderr);
      if (stall_) std::this_thread::sleep_for(std::chrono::hours(1));
      std::raise(SIGKILL);
    }
    return s;
  }

 private:
  bool stall_;
};

// A checkpoint collective that timed out (--collective-timeout) leaves the ranks at different
// points of the save protocol and the communicator unusable: no ordinary exit is possible
// (MPI_Finalize would wait for the stuck rank), so the job aborts with the error. Nothing was
// committed: the previous checkpoint stays `latest`.
ckpt::Status AbortIfTimedOut(const MpiCollective& collective, ckpt::Status s) {
  if (s.ok() || !collective.timed_out()) return s;
  std::fprintf(stderr, "engine_min: error: %s; aborting the job\n", s.ToString().c_str());
  std::fflush(stderr);
  MpiSession::Abort(2);
}

}  // namespace

void ApplyAdamW(const EngineConfig& config, double lr, int64_t step, float* w, float* m, float* v,
                const float* g, size_t n) {
  ckpt::AdamWHyper hyper;
  hyper.lr = lr;
  hyper.beta1 = config.beta1;
  hyper.beta2 = config.beta2;
  hyper.eps = config.eps;
  hyper.weight_decay = config.weight_decay;
  hyper.step = step;
  ckpt::AdamWUpdate(hyper, w, m, v, g, n);
}

ckpt::Status CheckResumeTopology(const ckpt::Manifest& m, const std::string& where, int world,
                                 int zero_stage) {
  if (m.kind != "sharded") {
    return ckpt::FailedPrecondition(where + " is a '" + m.kind +
                                    "' checkpoint, not a sharded training checkpoint; convert it "
                                    "with `ckpt reshard` first (nothing on disk was changed)");
  }
  if (m.topology.tp != 1 || m.topology.pp != 1) {
    return ckpt::FailedPrecondition(
        where + " was saved by " + std::to_string(m.topology.dp_world_size) +
        " data-parallel ranks with ZeRO-" + std::to_string(m.topology.zero_stage) + " (tp " +
        std::to_string(m.topology.tp) + ", pp " + std::to_string(m.topology.pp) +
        "); this run has " + std::to_string(world) + " ranks with ZeRO-" +
        std::to_string(zero_stage) + " and no tensor or pipeline parallelism (nothing on disk "
        "was changed)");
  }
  return ckpt::Status::Ok();
}

std::string TrainlogLine(const StepStats& s) {
  std::string line =
      "{\"step\": " + std::to_string(s.step) + ", \"loss\": " + FormatDouble(s.loss) +
      ", \"grad_norm\": " + FormatDouble(s.grad_norm) + ", \"lr\": " + FormatDouble(s.lr) +
      ", \"tokens\": " + std::to_string(s.tokens);
  line += ", \"weights_xxh3\": \"" + s.weights_xxh3 + "\", \"exp_avg_xxh3\": \"" + s.exp_avg_xxh3 +
          "\", \"exp_avg_sq_xxh3\": \"" + s.exp_avg_sq_xxh3 + "\"}";
  return line;
}

// ZeRO-0..2: every rank holds the full bf16 compute copy and a full local gradient.
class Engine::ReplicatedAccess final : public ParamAccess<float> {
 public:
  explicit ReplicatedAccess(Engine& e) : e_(e) {}
  ckpt::Result<const float*> Acquire(int id) override {
    return static_cast<const float*>(e_.compute_full_.data() + e_.flat_offset_[id]);
  }
  ckpt::Status Release(int) override { return ckpt::Status::Ok(); }
  ckpt::Result<float*> Grad(int id) override { return e_.grad_full_.data() + e_.flat_offset_[id]; }
  ckpt::Status GradDone(int) override { return ckpt::Status::Ok(); }

 private:
  Engine& e_;
};

// ZeRO-3: parameters are all-gathered from the bf16 shards on Acquire and dropped on Release;
// a parameter's gradient lives in a full-size buffer only until GradDone reduce-scatters it
// into the owned share.
class Engine::PartitionedAccess final : public ParamAccess<float> {
 public:
  explicit PartitionedAccess(Engine& e) : e_(e) {}

  ckpt::Result<const float*> Acquire(int id) override {
    const int64_t share = e_.share_numel_[id];
    std::vector<uint16_t> gathered(static_cast<size_t>(share * e_.world_));
    CKPT_RETURN_IF_ERROR(e_.dp_.AllGather(e_.compute_shard_.data() + e_.share_offset_[id],
                                          gathered.data(), share * sizeof(uint16_t)),
                         "all-gather " + TrainableName(id));
    std::vector<float>& full = live_[id];
    full.resize(static_cast<size_t>(e_.numel_[id]));
    for (int64_t i = 0; i < e_.numel_[id]; ++i) full[i] = ckpt::Bf16ToFloat(gathered[i]);
    return static_cast<const float*>(full.data());
  }
  ckpt::Status Release(int id) override {
    live_.erase(id);
    return ckpt::Status::Ok();
  }
  ckpt::Result<float*> Grad(int id) override {
    auto it = grads_.find(id);
    if (it == grads_.end()) {
      it = grads_.emplace(id, std::vector<float>(static_cast<size_t>(e_.numel_[id]), 0.0f)).first;
    }
    return it->second.data();
  }
  ckpt::Status GradDone(int id) override {
    auto it = grads_.find(id);
    if (it == grads_.end()) return ckpt::Internal("GradDone without a gradient");
    const int64_t share = e_.share_numel_[id];
    std::vector<float> padded(static_cast<size_t>(share * e_.world_), 0.0f);
    std::copy(it->second.begin(), it->second.end(), padded.begin());
    grads_.erase(it);
    std::vector<float> mine(static_cast<size_t>(share));
    CKPT_RETURN_IF_ERROR(e_.dp_.ReduceScatterSum(padded.data(), mine.data(), share),
                         "reduce-scatter " + TrainableName(id));
    float* owned = e_.grad_owned_.data() + e_.share_offset_[id];
    for (int64_t i = 0; i < share; ++i) owned[i] += mine[i];
    return ckpt::Status::Ok();
  }

 private:
  Engine& e_;
  std::map<int, std::vector<float>> live_;
  std::map<int, std::vector<float>> grads_;
};

// Invariant mode: the model runs one sample at a time. Weights come from the stage's own access;
// each parameter's gradient of the sample is added to the fixed-point sums (and its float
// scratch zeroed) as soon as the backward is done with it. ZeRO-3 reduce-scatters that
// parameter's sums right away and keeps only the owned share, as the default mode does.
class Engine::SampleGradAccess final : public ParamAccess<float> {
 public:
  SampleGradAccess(Engine& e, ParamAccess<float>& weights) : e_(e), weights_(weights) {}
  ckpt::Result<const float*> Acquire(int id) override { return weights_.Acquire(id); }
  ckpt::Status Release(int id) override { return weights_.Release(id); }
  ckpt::Result<float*> Grad(int id) override {
    if (e_.stage_ <= 2) return e_.grad_full_.data() + e_.flat_offset_[id];
    auto it = grads_.find(id);
    if (it == grads_.end()) {
      it = grads_.emplace(id, std::vector<float>(static_cast<size_t>(e_.numel_[id]), 0.0f)).first;
    }
    return it->second.data();
  }
  ckpt::Status GradDone(int id) override {
    const size_t n = static_cast<size_t>(e_.numel_[id]);
    if (e_.stage_ <= 2) {
      const int64_t off = e_.flat_offset_[id];
      e_.window_out_of_range_ +=
          AddFixedTerms(e_.grad_full_.data() + off, e_.fixed_full_.data() + off, n);
      return ckpt::Status::Ok();
    }
    auto it = grads_.find(id);
    if (it == grads_.end()) return ckpt::Internal("GradDone without a gradient");
    const int64_t share = e_.share_numel_[id];
    std::vector<FixedGrad> padded(static_cast<size_t>(share * e_.world_), 0);
    e_.window_out_of_range_ += AddFixedTerms(it->second.data(), padded.data(), n);
    grads_.erase(it);
    return e_
        .ReduceScatterFixed(padded.data(), share, e_.fixed_owned_.data() + e_.share_offset_[id])
        .WithContext("reduce-scatter " + TrainableName(id));
  }

 private:
  Engine& e_;
  ParamAccess<float>& weights_;
  std::map<int, std::vector<float>> grads_;
};

Engine::Engine(const EngineConfig& config, const Corpus& corpus, MpiComm& mpi, DataParallelComm& dp)
    : config_(config),
      corpus_(corpus),
      mpi_(mpi),
      dp_(dp),
      rank_(mpi.rank()),
      world_(mpi.world_size()),
      stage_(config.zero_stage),
      schedule_(config.lr, config.min_lr, config.warmup, config.DecaySteps()) {}

ckpt::Result<std::unique_ptr<Engine>> Engine::Create(const EngineConfig& config,
                                                     const Corpus& corpus, MpiComm& mpi,
                                                     DataParallelComm& dp) {
  if (dp.world_size() != mpi.world_size() || dp.rank() != mpi.rank()) {
    return ckpt::InvalidArgument("the data-parallel and MPI groups differ");
  }
  if (config.dp_world_size != mpi.world_size()) {
    return ckpt::InvalidArgument("configuration is for " + std::to_string(config.dp_world_size) +
                                 " ranks, the job has " + std::to_string(mpi.world_size()));
  }
  std::unique_ptr<Engine> e(new Engine(config, corpus, mpi, dp));
  CKPT_RETURN_IF_ERROR(e->BuildLayout(), "layout");
  return e;
}

ckpt::Status Engine::BuildLayout() {
  params_ = ParamTable(config_.shape);
  CKPT_ASSIGN_OR_RETURN(partition_, ckpt::BuildPartition(params_, world_, stage_), "partition");
  const int n_train = config_.shape.num_trainable();
  flat_offset_.assign(n_train, 0);
  numel_.assign(n_train, 0);
  std::vector<const ckpt::ParamEntry*> entries(n_train, nullptr);
  int64_t off = 0;
  for (int id = 0; id < n_train; ++id) {
    const std::string name = TrainableName(id);
    for (const auto& p : params_) {
      if (p.name == name) entries[id] = &p;
    }
    if (!entries[id] || !entries[id]->trainable()) {
      return ckpt::Internal("parameter table lacks trainable " + name);
    }
    flat_offset_[id] = off;
    numel_[id] = entries[id]->numel;
    off += numel_[id];
  }
  flat_numel_ = off;
  if (static_cast<int>(partition_.shard_numel.size()) != world_) {
    return ckpt::Internal("partition has " + std::to_string(partition_.shard_numel.size()) +
                          " shards for " + std::to_string(world_) + " ranks");
  }

  // The engine's collectives assume that concatenating the shards in rank order gives the
  // padded flat buffer (ZeRO-1/2) or, per parameter, the padded parameter (ZeRO-3). Check
  // that BuildPartition's ranges say exactly that.
  auto layout_error = [&](const std::string& what) {
    return ckpt::Internal("partition (" + partition_.scheme +
                          ") is not the layout the engine "
                          "expects: " +
                          what);
  };
  if (stage_ == 0) {
    shard_numel_ = flat_numel_;
    for (int id = 0; id < n_train; ++id) {
      for (const auto& r : entries[id]->ranges) {
        if (r.rank != 0 || r.shard_offset != flat_offset_[id] + r.begin) {
          return layout_error(entries[id]->name + " not at its flat offset on rank 0");
        }
      }
    }
  } else if (stage_ <= 2) {
    shard_numel_ = partition_.shard_numel[rank_];
    for (int64_t s : partition_.shard_numel) {
      if (s != shard_numel_) return layout_error("unequal shards");
    }
    if (shard_numel_ * world_ < flat_numel_) return layout_error("shards too small");
    for (int id = 0; id < n_train; ++id) {
      for (const auto& r : entries[id]->ranges) {
        if (r.rank * shard_numel_ + r.shard_offset != flat_offset_[id] + r.begin) {
          return layout_error(entries[id]->name + " not contiguous in rank order");
        }
      }
    }
  } else {
    share_numel_.assign(n_train, 0);
    share_offset_.assign(n_train, 0);
    int64_t shard = 0;
    const int64_t align = partition_.alignment;
    for (int id = 0; id < n_train; ++id) {
      const int64_t per_rank = (numel_[id] + world_ - 1) / world_;
      share_numel_[id] = (per_rank + align - 1) / align * align;
      share_offset_[id] = shard;
      shard += share_numel_[id];
      for (const auto& r : entries[id]->ranges) {
        if (r.begin != r.rank * share_numel_[id] || r.shard_offset != share_offset_[id]) {
          return layout_error(entries[id]->name + " shares not in rank order");
        }
      }
    }
    shard_numel_ = shard;
    for (int64_t s : partition_.shard_numel) {
      if (s != shard_numel_) return layout_error("shard length differs from the shares' sum");
    }
  }

  master_.assign(shard_numel_, 0.0f);
  exp_avg_.assign(shard_numel_, 0.0f);
  exp_avg_sq_.assign(shard_numel_, 0.0f);
  if (stage_ >= 1) grad_owned_.assign(shard_numel_, 0.0f);
  if (stage_ <= 2) {
    grad_full_.assign(stage_ == 0 ? flat_numel_ : shard_numel_ * world_, 0.0f);
    compute_full_.assign(flat_numel_, 0.0f);
  } else {
    compute_shard_.assign(shard_numel_, 0);
  }
  if (config_.invariant) {
    if (stage_ <= 2) fixed_full_.assign(grad_full_.size(), 0);
    if (stage_ >= 1) fixed_owned_.assign(shard_numel_, 0);
  }
  pos_ = MakePositionalTable(config_.shape);
  return ckpt::Status::Ok();
}

ckpt::Status Engine::InitFresh() {
  // Every rank draws the full initialization and keeps its part.
  for (int id = 0; id < config_.shape.num_trainable(); ++id) {
    const std::vector<float> w = InitTrainable(config_.shape, id, config_.seed);
    if (stage_ == 0) {
      std::copy(w.begin(), w.end(), master_.begin() + flat_offset_[id]);
    } else if (stage_ <= 2) {
      const int64_t lo = rank_ * shard_numel_;
      const int64_t hi = lo + shard_numel_;
      for (int64_t i = 0; i < numel_[id]; ++i) {
        const int64_t g = flat_offset_[id] + i;
        if (g >= lo && g < hi) master_[g - lo] = w[i];
      }
    } else {
      const int64_t lo = rank_ * share_numel_[id];
      const int64_t hi = std::min(numel_[id], lo + share_numel_[id]);
      for (int64_t i = lo; i < hi; ++i) master_[share_offset_[id] + (i - lo)] = w[i];
    }
  }
  counters_ = ckpt::Counters{};
  schedule_ = WarmupCosine(config_.lr, config_.min_lr, config_.warmup, config_.DecaySteps());
  dropout_rng_ = FreshDropoutRng(config_.seed, rank_);
  order_ =
      std::make_unique<GlobalOrder>(static_cast<int64_t>(corpus_.samples().size()),
                                    GlobalOrder::FreshShuffleRng(config_.seed), DataPosition{});
  return RefreshComputeWeights();
}

ckpt::Status Engine::RefreshComputeWeights() {
  if (stage_ == 0) {
    for (int64_t i = 0; i < flat_numel_; ++i) {
      compute_full_[i] = ckpt::Bf16ToFloat(ckpt::FloatToBf16(master_[i]));
    }
  } else if (stage_ <= 2) {
    std::vector<uint16_t> mine(shard_numel_);
    for (int64_t i = 0; i < shard_numel_; ++i) mine[i] = ckpt::FloatToBf16(master_[i]);
    std::vector<uint16_t> all(static_cast<size_t>(shard_numel_ * world_));
    CKPT_RETURN_IF_ERROR(dp_.AllGather(mine.data(), all.data(), shard_numel_ * sizeof(uint16_t)),
                         "all-gather compute weights");
    for (int64_t i = 0; i < flat_numel_; ++i) compute_full_[i] = ckpt::Bf16ToFloat(all[i]);
  } else {
    for (int64_t i = 0; i < shard_numel_; ++i) compute_shard_[i] = ckpt::FloatToBf16(master_[i]);
  }
  return ckpt::Status::Ok();
}

DropoutMasks Engine::DrawMasks(int64_t tokens) {
  DropoutMasks masks;
  const double p = config_.dropout;
  if (p <= 0.0) return masks;
  const float keep_scale = static_cast<float>(1.0 / (1.0 - p));
  const size_t n = static_cast<size_t>(tokens) * config_.shape.d_model;
  masks.per_layer.resize(config_.shape.layers);
  for (auto& m : masks.per_layer) {
    m.resize(n);
    for (size_t i = 0; i < n; ++i) m[i] = UniformDouble(dropout_rng_) < p ? 0.0f : keep_scale;
  }
  return masks;
}

DropoutMasks Engine::SampleMasks(int64_t tokens, int64_t position) const {
  DropoutMasks masks;
  const double p = config_.dropout;
  if (p <= 0.0) return masks;
  const float keep_scale = static_cast<float>(1.0 / (1.0 - p));
  // An element is dropped when its 32-bit draw is below p × 2^32 (p to within 2^-32).
  const uint32_t threshold = static_cast<uint32_t>(std::ldexp(p, 32));
  const PhiloxKey key = {static_cast<uint32_t>(config_.seed),
                         static_cast<uint32_t>(config_.seed >> 32)};
  // ResolveConfig bounds step (< 2^32), position (< 2^20) and elements / 4 (< 2^32).
  const uint32_t step = static_cast<uint32_t>(counters_.global_step);
  const size_t n = static_cast<size_t>(tokens) * config_.shape.d_model;
  masks.per_layer.resize(config_.shape.layers);
  for (int l = 0; l < config_.shape.layers; ++l) {
    std::vector<float>& m = masks.per_layer[l];
    m.resize(n);
    for (size_t block = 0; block * 4 < n; ++block) {
      const PhiloxCounter draw = Philox4x32({static_cast<uint32_t>(block), static_cast<uint32_t>(l),
                                             static_cast<uint32_t>(position), step},
                                            key);
      for (size_t j = 0; j < 4 && block * 4 + j < n; ++j) {
        m[block * 4 + j] = draw[j] < threshold ? 0.0f : keep_scale;
      }
    }
  }
  return masks;
}

std::vector<TokenBatch> Engine::MyMicroBatches(const std::vector<int64_t>& ids) const {
  // Micro-step a of rank r takes the micro_batch samples at (a × world + r) × micro_batch.
  std::vector<TokenBatch> out(static_cast<size_t>(config_.grad_accum));
  for (int64_t a = 0; a < config_.grad_accum; ++a) {
    const int64_t start = (a * world_ + rank_) * config_.micro_batch;
    for (int64_t i = 0; i < config_.micro_batch; ++i) {
      corpus_.AppendTokens(ids[start + i], config_.shape.context, out[a]);
    }
  }
  return out;
}

void Engine::BeginGlobalBatch(int64_t global_tokens) {
  window_tokens_ = global_tokens;
  window_micro_ = 0;
  window_loss_sum_ = 0;
  window_loss_exact_ = ExactSum();
  window_out_of_range_ = 0;
}

ckpt::Result<MicroResult> Engine::ForwardBackward(const TokenBatch& batch) {
  if (window_tokens_ <= 0) return ckpt::Internal("ForwardBackward before BeginGlobalBatch");
  if (config_.invariant) {
    return ckpt::FailedPrecondition(
        "invariant mode runs the model per sample: train with TrainStep, not ForwardBackward");
  }
  const DropoutMasks masks = DrawMasks(batch.tokens);
  const double scale = 1.0 / static_cast<double>(window_tokens_);
  ckpt::Result<MicroResult> r = ckpt::Internal("unreachable");
  if (stage_ <= 2) {
    ReplicatedAccess access(*this);
    r = engine_min::ForwardBackward<float>(config_.shape, pos_.data(), batch, masks, scale, access);
  } else {
    PartitionedAccess access(*this);
    r = engine_min::ForwardBackward<float>(config_.shape, pos_.data(), batch, masks, scale, access);
  }
  if (!r.ok()) return r.status().WithContext("forward/backward");
  window_loss_sum_ += r->loss_sum;
  if (stage_ == 2) {
    // Reduce-scatter this micro-batch's gradient now; keep only the owned share.
    std::vector<float> mine(shard_numel_);
    CKPT_RETURN_IF_ERROR(dp_.ReduceScatterSum(grad_full_.data(), mine.data(), shard_numel_),
                         "reduce-scatter gradients");
    for (int64_t i = 0; i < shard_numel_; ++i) grad_owned_[i] += mine[i];
    std::fill(grad_full_.begin(), grad_full_.end(), 0.0f);
  }
  return r;
}

ckpt::Status Engine::ForwardBackwardSamples(const std::vector<int64_t>& ids, int64_t a) {
  if (window_tokens_ <= 0) return ckpt::Internal("ForwardBackwardSamples before BeginGlobalBatch");
  const double scale = 1.0 / static_cast<double>(window_tokens_);
  // The same samples as MyMicroBatches; `position` (in the global batch) keys the dropout.
  const int64_t start = (a * world_ + rank_) * config_.micro_batch;
  for (int64_t position = start; position < start + config_.micro_batch; ++position) {
    TokenBatch batch;
    corpus_.AppendTokens(ids[static_cast<size_t>(position)], config_.shape.context, batch);
    const DropoutMasks masks = SampleMasks(batch.tokens, position);
    ckpt::Result<MicroResult> r = ckpt::Internal("unreachable");
    if (stage_ <= 2) {
      ReplicatedAccess weights(*this);
      SampleGradAccess access(*this, weights);
      r = engine_min::ForwardBackward<float>(config_.shape, pos_.data(), batch, masks, scale,
                                             access);
    } else {
      PartitionedAccess weights(*this);
      SampleGradAccess access(*this, weights);
      r = engine_min::ForwardBackward<float>(config_.shape, pos_.data(), batch, masks, scale,
                                             access);
    }
    if (!r.ok()) {
      return r.status().WithContext("forward/backward of sample " + std::to_string(position) +
                                    " of the global batch");
    }
    window_loss_exact_.Add(r->loss_sum);
  }
  if (stage_ == 2) {
    // Reduce-scatter this micro-step's sums now; keep only the owned share.
    CKPT_RETURN_IF_ERROR(ReduceScatterFixed(fixed_full_.data(), shard_numel_, fixed_owned_.data()),
                         "reduce-scatter gradients");
    std::fill(fixed_full_.begin(), fixed_full_.end(), 0);
  }
  return ckpt::Status::Ok();
}

ckpt::Status Engine::ReduceScatterFixed(const FixedGrad* in, int64_t count, FixedGrad* owned) {
  const size_t n = static_cast<size_t>(count);
  std::vector<int64_t> wire(n * world_ * kWireLimbs);
  FixedToWire(in, n * world_, wire.data());
  std::vector<int64_t> mine(n * kWireLimbs);
  CKPT_RETURN_IF_ERROR(dp_.ReduceScatterSumInt64(wire.data(), mine.data(), mine.size()),
                       "integer reduce-scatter");
  for (size_t i = 0; i < n; ++i) owned[i] += WireToFixed(mine.data() + kWireLimbs * i);
  return ckpt::Status::Ok();
}

ckpt::Result<Engine::ExactTotals> Engine::ReduceExactAndClip() {
  std::vector<float>* g = &grad_owned_;
  if (stage_ == 0) {
    std::vector<int64_t> wire(fixed_full_.size() * kWireLimbs);
    FixedToWire(fixed_full_.data(), fixed_full_.size(), wire.data());
    CKPT_RETURN_IF_ERROR(dp_.AllReduceSumInt64(wire.data(), wire.size()),
                         "integer all-reduce gradients");
    for (size_t i = 0; i < fixed_full_.size(); ++i) {
      grad_full_[i] = FixedToFloat(WireToFixed(wire.data() + kWireLimbs * i));
    }
    std::fill(fixed_full_.begin(), fixed_full_.end(), 0);
    g = &grad_full_;
  } else {
    if (stage_ == 1) {
      CKPT_RETURN_IF_ERROR(
          ReduceScatterFixed(fixed_full_.data(), shard_numel_, fixed_owned_.data()),
          "reduce-scatter gradients");
      std::fill(fixed_full_.begin(), fixed_full_.end(), 0);
    }
    for (int64_t i = 0; i < shard_numel_; ++i) grad_owned_[i] = FixedToFloat(fixed_owned_[i]);
    std::fill(fixed_owned_.begin(), fixed_owned_.end(), 0);
  }
  // One integer all-reduce for the scalars: the loss, the out-of-range count and the sum of
  // squares (ZeRO-0: every rank holds the whole gradient, so rank 0 alone contributes it).
  ExactSum sumsq;
  if (stage_ != 0 || rank_ == 0) {
    for (float x : *g) sumsq.Add(static_cast<double>(x) * x);  // exact: 48-bit products
  }
  std::vector<int64_t> scalars = window_loss_exact_.Digits();
  scalars.push_back(window_out_of_range_);
  const std::vector<int64_t> sq = sumsq.Digits();
  scalars.insert(scalars.end(), sq.begin(), sq.end());
  CKPT_RETURN_IF_ERROR(mpi_.AllReduceSumInt64(scalars.data(), scalars.size()),
                       "loss and gradient norm");
  const auto loss_end = scalars.begin() + ExactSum::kDigitsSize;
  const int64_t out_of_range = *loss_end;
  if (out_of_range > 0) {
    return ckpt::FailedPrecondition(
        "invariant mode: " + std::to_string(out_of_range) +
        " per-sample gradient element(s) of this step are not finite or >= 2^" +
        std::to_string(kFixedTermExp) +
        " in magnitude, outside the fixed-point range (docs/engine.md, \"Invariant mode\"); "
        "the run stops rather than apply a wrong gradient");
  }
  ExactTotals totals;
  totals.loss_sum = ExactSum::FromDigits({scalars.begin(), loss_end}).ToDouble();
  totals.norm = std::sqrt(ExactSum::FromDigits({loss_end + 1, scalars.end()}).ToDouble());
  ClipGradient(totals.norm, *g);
  return totals;
}

void Engine::ClipGradient(double norm, std::vector<float>& g) const {
  if (config_.grad_clip > 0) {
    // torch.nn.utils.clip_grad_norm_: coef = max_norm / (norm + 1e-6), applied when < 1.
    const double coef = config_.grad_clip / (norm + 1e-6);
    if (coef < 1.0) {
      const float c = static_cast<float>(coef);
      for (float& x : g) x *= c;
    }
  }
}

ckpt::Result<double> Engine::ReduceAndClip() {
  double sumsq = 0;
  std::vector<float>* g = &grad_owned_;
  if (stage_ == 0) {
    CKPT_RETURN_IF_ERROR(dp_.AllReduceSum(grad_full_.data(), grad_full_.size()),
                         "all-reduce gradients");
    g = &grad_full_;
    for (float x : *g) sumsq += static_cast<double>(x) * x;
  } else {
    if (stage_ == 1) {
      CKPT_RETURN_IF_ERROR(
          dp_.ReduceScatterSum(grad_full_.data(), grad_owned_.data(), shard_numel_),
          "reduce-scatter gradients");
      std::fill(grad_full_.begin(), grad_full_.end(), 0.0f);
    }
    double mine = 0;
    for (float x : grad_owned_) mine += static_cast<double>(x) * x;
    CKPT_ASSIGN_OR_RETURN(sumsq, mpi_.SumDoubles(mine), "gradient norm");
  }
  const double norm = std::sqrt(sumsq);
  ClipGradient(norm, *g);
  return norm;
}

ckpt::Result<std::optional<StepStats>> Engine::Step(bool digests) {
  ++counters_.micro_step;
  ++window_micro_;
  if (window_micro_ < config_.grad_accum) return std::optional<StepStats>();

  StepStats stats;
  stats.tokens = window_tokens_;
  if (config_.invariant) {
    CKPT_ASSIGN_OR_RETURN(const ExactTotals totals, ReduceExactAndClip(), "gradients");
    stats.loss = totals.loss_sum / static_cast<double>(window_tokens_);
    stats.grad_norm = totals.norm;
  } else {
    CKPT_ASSIGN_OR_RETURN(const double loss_sum, mpi_.SumDoubles(window_loss_sum_), "loss");
    stats.loss = loss_sum / static_cast<double>(window_tokens_);
    CKPT_ASSIGN_OR_RETURN(stats.grad_norm, ReduceAndClip(), "gradients");
  }
  stats.lr = schedule_.CurrentLr();

  std::vector<float>& g = stage_ == 0 ? grad_full_ : grad_owned_;
  ApplyAdamW(config_, stats.lr, counters_.global_step, master_.data(), exp_avg_.data(),
             exp_avg_sq_.data(), g.data(), static_cast<size_t>(shard_numel_));
  std::fill(g.begin(), g.end(), 0.0f);
  CKPT_RETURN_IF_ERROR(RefreshComputeWeights(), "after the update");

  ++counters_.global_step;
  counters_.samples_seen += config_.global_batch;
  counters_.tokens_seen += window_tokens_;
  schedule_.Advance();
  stats.step = counters_.global_step;
  window_micro_ = 0;
  window_tokens_ = 0;
  window_loss_sum_ = 0;

  if (digests) {
    CKPT_ASSIGN_OR_RETURN(std::vector<float> w, GatherFull(master_), "digest weights");
    CKPT_ASSIGN_OR_RETURN(std::vector<float> m, GatherFull(exp_avg_), "digest exp_avg");
    CKPT_ASSIGN_OR_RETURN(std::vector<float> v, GatherFull(exp_avg_sq_), "digest exp_avg_sq");
    if (rank_ == 0) {
      stats.weights_xxh3 = Digest(w);
      stats.exp_avg_xxh3 = Digest(m);
      stats.exp_avg_sq_xxh3 = Digest(v);
    }
  }
  return std::optional<StepStats>(stats);
}

ckpt::Result<StepStats> Engine::TrainStep(bool digests) {
  const std::vector<int64_t> ids = order_->Next(config_.global_batch);
  int64_t tokens = 0;
  for (int64_t id : ids) tokens += corpus_.samples()[static_cast<size_t>(id)].length;
  BeginGlobalBatch(tokens);
  const std::vector<TokenBatch> micro =
      config_.invariant ? std::vector<TokenBatch>() : MyMicroBatches(ids);
  for (int64_t a = 0; a < config_.grad_accum; ++a) {
    CKPT_RETURN_IF_ERROR(RunMicroStep(ids, micro, a),
                         "step " + std::to_string(counters_.global_step + 1));
    CKPT_ASSIGN_OR_RETURN(std::optional<StepStats> stats, Step(digests),
                          "step " + std::to_string(counters_.global_step + 1));
    if (stats) return *stats;
  }
  return ckpt::Internal("accumulation window did not close");
}

ckpt::Status Engine::RunMicroStep(const std::vector<int64_t>& ids,
                                  const std::vector<TokenBatch>& micro, int64_t a) {
  if (config_.invariant) return ForwardBackwardSamples(ids, a);
  return ForwardBackward(micro[static_cast<size_t>(a)]).status();
}

ckpt::Result<std::vector<std::vector<float>>> Engine::NextGradient(double* grad_norm) {
  const std::vector<int64_t> ids = order_->Next(config_.global_batch);
  int64_t tokens = 0;
  for (int64_t id : ids) tokens += corpus_.samples()[static_cast<size_t>(id)].length;
  BeginGlobalBatch(tokens);
  const std::vector<TokenBatch> micro =
      config_.invariant ? std::vector<TokenBatch>() : MyMicroBatches(ids);
  for (int64_t a = 0; a < config_.grad_accum; ++a) {
    CKPT_RETURN_IF_ERROR(RunMicroStep(ids, micro, a), "next gradient");
  }
  double norm = 0;
  if (config_.invariant) {
    CKPT_ASSIGN_OR_RETURN(const ExactTotals totals, ReduceExactAndClip(), "next gradient");
    norm = totals.norm;
  } else {
    CKPT_ASSIGN_OR_RETURN(norm, ReduceAndClip(), "next gradient");
  }
  if (grad_norm) *grad_norm = norm;
  std::vector<float> full;
  if (stage_ == 0) {
    if (rank_ == 0) full.assign(grad_full_.begin(), grad_full_.begin() + flat_numel_);
  } else {
    CKPT_ASSIGN_OR_RETURN(full, GatherFull(grad_owned_), "gather gradient");
  }
  std::vector<std::vector<float>> out;
  if (rank_ == 0) {
    for (int id = 0; id < config_.shape.num_trainable(); ++id) {
      out.emplace_back(full.begin() + flat_offset_[id],
                       full.begin() + flat_offset_[id] + numel_[id]);
    }
  }
  return out;
}

ckpt::Result<std::vector<float>> Engine::GatherFull(const std::vector<float>& shard) {
  if (stage_ == 0) {
    if (rank_ != 0) return std::vector<float>();
    return std::vector<float>(shard.begin(), shard.begin() + flat_numel_);
  }
  CKPT_ASSIGN_OR_RETURN(
      std::vector<std::string> parts,
      mpi_.GatherBytes(std::string_view(reinterpret_cast<const char*>(shard.data()),
                                        shard.size() * sizeof(float))),
      "gather to rank 0");
  std::vector<float> full;
  if (rank_ != 0) return full;
  full.resize(flat_numel_);
  auto part = [&](int r) { return reinterpret_cast<const float*>(parts[r].data()); };
  if (stage_ <= 2) {
    for (int64_t i = 0; i < flat_numel_; ++i) {
      full[i] = part(static_cast<int>(i / shard_numel_))[i % shard_numel_];
    }
  } else {
    for (int id = 0; id < config_.shape.num_trainable(); ++id) {
      for (int r = 0; r < world_; ++r) {
        const int64_t lo = r * share_numel_[id];
        const int64_t hi = std::min(numel_[id], lo + share_numel_[id]);
        for (int64_t i = lo; i < hi; ++i) {
          full[flat_offset_[id] + i] = part(r)[share_offset_[id] + (i - lo)];
        }
      }
    }
  }
  return full;
}

ckpt::Result<std::vector<float>> Engine::GatherFullMaster() { return GatherFull(master_); }

ckpt::Status Engine::Save(const std::string& root, const nlohmann::json& client_state,
                          const KillInSave& kill) {
  ckpt::Manifest meta;
  meta.tag = TagForStep();
  meta.created_utc = ckpt::UtcNow(&meta.created_unix);
  meta.counters = counters_;
  meta.topology.dp_world_size = world_;
  meta.topology.zero_stage = stage_;
  meta.optimizer = {{"type", "adamw"},
                    {"lr", schedule_.CurrentLr()},
                    {"base_lr", config_.lr},
                    {"beta1", config_.beta1},
                    {"beta2", config_.beta2},
                    {"eps", config_.eps},
                    {"weight_decay", config_.weight_decay},
                    {"grad_clip", config_.grad_clip},
                    {"step", counters_.global_step}};
  meta.dtypes = {{"master", "fp32"},  {"exp_avg", "fp32"},    {"exp_avg_sq", "fp32"},
                 {"compute", "bf16"}, {"grad_accum", "fp32"}, {"frozen", "fp32"}};
  meta.partition = partition_;
  meta.params = params_;
  meta.client_state = client_state;
  meta.engine_config = config_.ToJson();
  meta.engine_config["corpus_xxh3"] = corpus_.digest();
  meta.engine_config["corpus_samples"] = corpus_.samples().size();

  // This rank's contents. Every pointer stays valid until SaveCheckpoint returns (or, async,
  // until the saver has copied them).
  const int64_t ckpt_len = partition_.shard_numel[rank_];
  std::vector<float> padded_m, padded_v, padded_w;
  const float* w = master_.data();
  const float* m = exp_avg_.data();
  const float* v = exp_avg_sq_.data();
  if (stage_ == 0 && ckpt_len != shard_numel_) {
    // Replicated: rank 0 holds the whole (possibly padded) buffer, the others none of it.
    auto pad = [&](const std::vector<float>& src, std::vector<float>& dst) {
      dst.assign(static_cast<size_t>(ckpt_len), 0.0f);
      std::copy(src.begin(), src.begin() + std::min<int64_t>(ckpt_len, flat_numel_), dst.begin());
      return dst.data();
    };
    w = pad(master_, padded_w);
    m = pad(exp_avg_, padded_m);
    v = pad(exp_avg_sq_, padded_v);
  }
  ckpt::RankContents mine;
  if (ckpt_len > 0) {
    mine.datasets.push_back(
        ckpt::DatasetSpec::Tensor(std::string(ckpt::kMaster), ckpt::DType::kF32, {ckpt_len}, w));
    mine.datasets.push_back(
        ckpt::DatasetSpec::Tensor(std::string(ckpt::kExpAvg), ckpt::DType::kF32, {ckpt_len}, m));
    mine.datasets.push_back(
        ckpt::DatasetSpec::Tensor(std::string(ckpt::kExpAvgSq), ckpt::DType::kF32, {ckpt_len}, v));
  }
  const std::string dropout_state = SerializeRng(dropout_rng_);
  const std::string shuffle_state = SerializeRng(order_->epoch_start_rng());
  const std::string position =
      order_->position().ToJson(static_cast<int64_t>(corpus_.samples().size())).dump();
  const std::string scheduler = schedule_.ToJson().dump();
  if (!config_.invariant) {
    // Invariant mode's dropout stream is stateless (Philox keyed by the seed and the step,
    // both in the manifest), so there is no generator to save.
    mine.datasets.push_back(
        ckpt::DatasetSpec::Blob(kRngDropout, std::string(kMt19937BlobKind), dropout_state));
  }
  mine.datasets.push_back(
      ckpt::DatasetSpec::Blob(kRngShuffle, std::string(kMt19937BlobKind), shuffle_state));
  mine.datasets.push_back(ckpt::DatasetSpec::Json(std::string(ckpt::kDataPosition), position));
  mine.datasets.push_back(ckpt::DatasetSpec::Json(std::string(ckpt::kScheduler), scheduler));
  if (rank_ == 0) {
    mine.datasets.push_back(
        ckpt::DatasetSpec::Tensor(std::string(ckpt::kFrozenPrefix) + kPosName, ckpt::DType::kF32,
                                  {config_.shape.context, config_.shape.d_model}, pos_.data()));
  }

  ckpt::SaveOptions options;
  CKPT_ASSIGN_OR_RETURN(options.compression, ckpt::Compression::Parse(config_.compress),
                        "--compress");
  options.keep_last = config_.keep_last;
  if (kill.rank == rank_ && kill.step == counters_.global_step) {
    if (!kill_env_) kill_env_ = std::make_unique<KillingEnv>(ckpt::Env::Default(), kill.stall);
    options.env = kill_env_.get();
  }
  if (saver_) {
    // (A background save that failed earlier reports here: its collective may have timed out.)
    return AbortIfTimedOut(*save_collective_,
                           saver_->Save(root, meta, mine, *save_collective_, options)
                               .WithContext("save " + meta.tag));
  }
  MpiCollective collective(mpi_, collective_timeout_);
  return AbortIfTimedOut(collective, ckpt::SaveCheckpoint(root, meta, mine, collective, options)
                                         .WithContext("save " + meta.tag));
}

ckpt::Status Engine::EnableAsyncSave() {
  if (saver_) return ckpt::Status::Ok();
  int level = MPI_THREAD_SINGLE;
  CKPT_RETURN_IF_ERROR(MpiStatus(MPI_Query_thread(&level), "MPI_Query_thread"));
  if (level < MPI_THREAD_MULTIPLE) {
    const char* names[] = {"MPI_THREAD_SINGLE", "MPI_THREAD_FUNNELED", "MPI_THREAD_SERIALIZED"};
    const bool known = level >= MPI_THREAD_SINGLE && level <= MPI_THREAD_SERIALIZED;
    return ckpt::FailedPrecondition(
        std::string("async save needs MPI_THREAD_MULTIPLE; the MPI library provides ") +
        (known ? names[level - MPI_THREAD_SINGLE] : "an unknown level"));
  }
  CKPT_ASSIGN_OR_RETURN(save_comm_, MpiComm::Create(mpi_.comm()), "async save communicator");
  save_collective_ = std::make_unique<MpiCollective>(*save_comm_, collective_timeout_);
  saver_ = std::make_unique<ckpt::AsyncSaver>();
  return ckpt::Status::Ok();
}

ckpt::Status Engine::WaitForSave() {
  return saver_ ? AbortIfTimedOut(*save_collective_, saver_->Wait()) : ckpt::Status::Ok();
}

ckpt::Status Engine::Restore(const ckpt::CheckpointReader& reader,
                             const std::set<std::string>& reset) {
  const ckpt::Manifest& m = reader.manifest();
  const std::string where = reader.dir();
  CKPT_RETURN_IF_ERROR(CheckResumeTopology(m, where, world_, stage_), "resume");
  const bool resharding =
      m.topology.dp_world_size != world_ || m.topology.zero_stage != stage_;
  const std::string hint = " (nothing on disk was changed)";
  // Same model: the same table, names, shapes, frozen and tied flags (and, on the same
  // topology, the same layout).
  ckpt::ReshardTarget target;
  target.world = world_;
  target.zero_stage = stage_;
  target.params = params_;
  target.partition = partition_;
  if (ckpt::Status s = ckpt::CheckReshardable(m, target, "adamw", where); !s.ok())
    return ckpt::Status(s.code(), s.message() + hint);
  if (!resharding) {
    for (size_t i = 0; i < params_.size(); ++i) {
      const auto& a = m.params[i];
      const auto& b = params_[i];
      if (!b.trainable()) continue;
      bool same = a.ranges.size() == b.ranges.size();
      for (size_t k = 0; same && k < a.ranges.size(); ++k) {
        same = a.ranges[k].rank == b.ranges[k].rank && a.ranges[k].begin == b.ranges[k].begin &&
               a.ranges[k].end == b.ranges[k].end &&
               a.ranges[k].shard_offset == b.ranges[k].shard_offset;
      }
      if (!same) {
        return ckpt::FailedPrecondition(where + " partitions " + a.name +
                                        " differently from this run" + hint);
      }
    }
    if (m.partition.shard_numel != partition_.shard_numel) {
      return ckpt::FailedPrecondition(where + " has shard lengths that differ from this run's" +
                                      hint);
    }
  }
  const int64_t n_samples = static_cast<int64_t>(corpus_.samples().size());
  if (m.engine_config.contains("corpus_xxh3") &&
      m.engine_config["corpus_xxh3"] != corpus_.digest()) {
    return ckpt::FailedPrecondition(where + " was trained on another corpus (xxh3 " +
                                    ckpt::JsonText(m.engine_config["corpus_xxh3"]) + ", this one " +
                                    corpus_.digest() + ")");
  }

  // Optimizer state. Same topology: each rank reads its own shard (ZeRO-0's lives in rank 0's
  // file). Another world size or stage: each rank loads the slices its new partition owns from
  // the old rank files (ckpt::LoadResharded, verified piece by piece); nothing is converted or
  // written. ZeRO-0: rank 0 reads, then broadcasts.
  if (resharding) {
    std::vector<float>* states[] = {&master_, &exp_avg_, &exp_avg_sq_};
    std::optional<ckpt::ReshardedRank> loaded;
    if (stage_ != 0 || rank_ == 0) {
      ckpt::LoadReshardOptions lo;
      lo.frozen = false;
      lo.extras = false;
      CKPT_ASSIGN_OR_RETURN(loaded, ckpt::LoadResharded(where, target, rank_, lo),
                            "resume on " + std::to_string(world_) + " ranks with ZeRO-" +
                                std::to_string(stage_) + " from " +
                                std::to_string(m.topology.dp_world_size) + " with ZeRO-" +
                                std::to_string(m.topology.zero_stage));
      last_load_ = loaded->accounting;
    }
    std::vector<float>* from[] = {nullptr, nullptr, nullptr};
    if (loaded) from[0] = &loaded->master, from[1] = &loaded->exp_avg, from[2] = &loaded->exp_avg_sq;
    for (int k = 0; k < 3; ++k) {
      if (stage_ == 0) {
        std::vector<float> buf(static_cast<size_t>(partition_.shard_numel[0]));
        if (rank_ == 0) buf = std::move(*from[k]);
        CKPT_RETURN_IF_ERROR(mpi_.Broadcast(buf.data(), buf.size() * sizeof(float), 0),
                             "restore");
        std::copy(buf.begin(), buf.begin() + flat_numel_, states[k]->begin());
      } else {
        if (from[k]->size() != states[k]->size())
          return ckpt::Internal("resharded shard has the wrong length");
        *states[k] = std::move(*from[k]);
      }
    }
  } else {
    const int64_t ckpt_len = partition_.shard_numel[rank_];
    auto read_state = [&](std::string_view name, std::vector<float>& dst) -> ckpt::Status {
      if (stage_ == 0) {
        std::vector<float> buf(static_cast<size_t>(partition_.shard_numel[0]));
        if (rank_ == 0) {
          CKPT_RETURN_IF_ERROR(
              reader.ReadDataset(0, name, buf.data(), buf.size() * sizeof(float)),
              std::string(name));
        }
        CKPT_RETURN_IF_ERROR(mpi_.Broadcast(buf.data(), buf.size() * sizeof(float), 0),
                             std::string(name));
        std::copy(buf.begin(), buf.begin() + flat_numel_, dst.begin());
        return ckpt::Status::Ok();
      }
      return reader.ReadDataset(rank_, name, dst.data(), ckpt_len * sizeof(float))
          .WithContext(std::string(name));
    };
    CKPT_RETURN_IF_ERROR(read_state(ckpt::kMaster, master_), "restore");
    CKPT_RETURN_IF_ERROR(read_state(ckpt::kExpAvg, exp_avg_), "restore");
    CKPT_RETURN_IF_ERROR(read_state(ckpt::kExpAvgSq, exp_avg_sq_), "restore");
  }

  // Frozen table from rank 0's frozen/<name>, broadcast.
  {
    std::vector<float> pos(pos_.size());
    if (rank_ == 0) {
      CKPT_ASSIGN_OR_RETURN(pos, reader.ReadParamFull(kPosName), "restore frozen");
      if (pos.size() != pos_.size()) return ckpt::DataLoss("frozen pos.weight has the wrong size");
    }
    CKPT_RETURN_IF_ERROR(mpi_.Broadcast(pos.data(), pos.size() * sizeof(float), 0),
                         "restore frozen");
    pos_ = std::move(pos);
  }

  counters_ = m.counters;
  auto has = [&](int rank, std::string_view name) { return m.FindDataset(rank, name) != nullptr; };
  // Per-rank generator; a rank file without one gets a deterministic fresh generator.
  // Invariant mode's dropout is stateless; its generator below is never drawn from.
  // A new world size gets no generator states (as `ckpt reshard` writes none): fresh
  // deterministic ones, and the shuffle generator replayed from the seed (it is global).
  const bool same_world = m.topology.dp_world_size == world_;
  if (!config_.invariant && same_world && has(rank_, kRngDropout)) {
    CKPT_ASSIGN_OR_RETURN(std::string blob, reader.ReadBlob(rank_, kRngDropout), "restore");
    CKPT_ASSIGN_OR_RETURN(dropout_rng_, ParseRng(blob), "restore rng/dropout");
  } else {
    dropout_rng_ = SeededDropoutRng(config_.seed, counters_.global_step, rank_);
  }
  // Global data position and scheduler: identical on every rank; rank 0's when ours lacks it.
  const int info_rank = has(rank_, ckpt::kDataPosition) ? rank_ : 0;
  CKPT_ASSIGN_OR_RETURN(nlohmann::json pos_json, reader.ReadJson(info_rank, ckpt::kDataPosition),
                        "restore");
  CKPT_ASSIGN_OR_RETURN(DataPosition position, DataPosition::FromJson(pos_json), "restore");
  if (pos_json.contains("samples_per_epoch") && pos_json["samples_per_epoch"] != n_samples) {
    return ckpt::FailedPrecondition(
        where + " counts " + ckpt::JsonText(pos_json["samples_per_epoch"]) +
        " samples per epoch, this corpus cut has " + std::to_string(n_samples));
  }
  std::mt19937_64 shuffle;
  if (same_world && has(rank_, kRngShuffle)) {
    CKPT_ASSIGN_OR_RETURN(std::string blob, reader.ReadBlob(rank_, kRngShuffle), "restore");
    CKPT_ASSIGN_OR_RETURN(shuffle, ParseRng(blob), "restore rng/shuffle");
  } else {
    // The epoch-start generator is a function of (seed, epoch): replay it.
    shuffle = GlobalOrder::ShuffleRngAtEpoch(config_.seed, n_samples, position.epoch);
  }
  order_ = std::make_unique<GlobalOrder>(n_samples, shuffle, position);
  schedule_ = WarmupCosine(config_.lr, config_.min_lr, config_.warmup, config_.DecaySteps());
  const int sched_rank = has(rank_, ckpt::kScheduler) ? rank_ : 0;
  if (has(sched_rank, ckpt::kScheduler)) {
    CKPT_ASSIGN_OR_RETURN(nlohmann::json sj, reader.ReadJson(sched_rank, ckpt::kScheduler),
                          "restore");
    CKPT_RETURN_IF_ERROR(schedule_.RestoreFrom(sj), "restore scheduler");
  } else {
    schedule_.set_step(counters_.global_step);
  }
  CKPT_RETURN_IF_ERROR(ResetComponents(reset), "reset-on-resume");
  return RefreshComputeWeights();
}

ckpt::Status Engine::ResetComponents(const std::set<std::string>& reset) {
  const int64_t n_samples = static_cast<int64_t>(corpus_.samples().size());
  if (reset.count("moments")) {
    std::fill(exp_avg_.begin(), exp_avg_.end(), 0.0f);
    std::fill(exp_avg_sq_.begin(), exp_avg_sq_.end(), 0.0f);
  }
  if (reset.count("step")) counters_ = ckpt::Counters{};
  if (reset.count("rng")) {
    dropout_rng_ = FreshDropoutRng(config_.seed, rank_);
    order_ = std::make_unique<GlobalOrder>(n_samples, GlobalOrder::FreshShuffleRng(config_.seed),
                                           order_->position());
  }
  if (reset.count("data")) {
    order_ = std::make_unique<GlobalOrder>(n_samples, GlobalOrder::FreshShuffleRng(config_.seed),
                                           DataPosition{});
  }
  if (reset.count("scheduler")) {
    schedule_ = WarmupCosine(config_.lr, config_.min_lr, config_.warmup, config_.DecaySteps());
  }
  return ckpt::Status::Ok();
}

}  // namespace engine_min
