// The engine: fp32 master weights and AdamW moments partitioned by ZeRO stage, a bf16 compute
// copy, fp32 gradient accumulation, global-norm clipping, a warmup + cosine schedule, and
// checkpoint save/restore through ckpt.
//
// Ownership follows ckpt::BuildPartition (docs/format.md), so a checkpoint's partition is the
// engine's memory layout:
//   ZeRO-0  every rank holds everything; gradients are all-reduced and every rank applies the
//           same update. In the checkpoint rank 0 holds the whole flat buffer.
//   ZeRO-1  rank r owns share r of the padded flat buffer (master, exp_avg, exp_avg_sq); the
//           accumulated gradient is reduce-scattered at the boundary, each rank updates its
//           share, and the bf16 compute weights are all-gathered.
//   ZeRO-2  as 1, but the gradient is reduce-scattered after every micro-batch and a rank keeps
//           only its owned share between micro-batches.
//   ZeRO-3  as 2 with per-parameter shares; the bf16 compute weights stay partitioned and each
//           block's parameters are all-gathered for its forward and again for its backward and
//           released right after; each parameter's gradient is reduce-scattered as soon as the
//           backward is done with it.
// Every cross-rank sum runs in rank order, so a run is bitwise reproducible.
//
// Invariant mode (config.invariant, docs/engine.md "Invariant mode") runs the model one sample
// at a time with dropout drawn from Philox keyed by (seed, global step, sample's position in
// the global batch, layer, element), adds each sample's gradient exactly in fixed point
// (exact_sum.h), reduces with integer collectives and rounds to fp32 once; loss and norm are
// exact sums too. The trajectory is then the same bits for every world size, ZeRO stage and
// micro-batch × grad-accum split of the global batch.
//
// All public methods are collective: every rank calls them in the same order. Not
// thread-safe.
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "ckpt/async_saver.h"
#include "ckpt/load_resharded.h"
#include "ckpt/manifest.h"
#include "ckpt/reader.h"
#include "ckpt/status.h"
#include "ckpt/writer.h"
#include "engine_min/comm.h"
#include "engine_min/config.h"
#include "engine_min/data.h"
#include "engine_min/exact_sum.h"
#include "engine_min/model.h"
#include "engine_min/schedule.h"

namespace engine_min {

struct StepStats {
  int64_t step = 0;      // global_step after the update
  double loss = 0;       // token-weighted mean over the global batch
  double grad_norm = 0;  // global L2 norm before clipping
  double lr = 0;         // rate used by this update
  int64_t tokens = 0;    // tokens in the global batch
  // XXH3 of the full fp32 master weights / moments after the update (rank 0 only; empty
  // elsewhere or when digests are off).
  std::string weights_xxh3, exp_avg_xxh3, exp_avg_sq_xxh3;
};

// The optimizer update the engine applies to a shard: ckpt::AdamWUpdate (ckpt/adamw.h, the rule
// verify replays) with the run's betas, eps and weight decay, rate `lr`, and `step` updates
// already applied.
void ApplyAdamW(const EngineConfig& config, double lr, int64_t step, float* w, float* m, float* v,
                const float* g, size_t n);

// Refuses (FailedPrecondition) a checkpoint that is not a sharded training checkpoint or was
// written with tensor or pipeline parallelism. Another data-parallel size or ZeRO stage is
// fine: Restore loads it resharded. Reads nothing but the manifest.
ckpt::Status CheckResumeTopology(const ckpt::Manifest& m, const std::string& where, int world,
                                 int zero_stage);

// One line of trainlog.jsonl (docs/architecture.md).
std::string TrainlogLine(const StepStats& s);

// Test hook for the crash test: rank `rank` raises SIGKILL inside the save at `step`, after its
// rank file is on disk and before the commit; with `stall`, it sleeps there instead (a hung
// rank, for --collective-timeout).
struct KillInSave {
  int rank = -1;
  int64_t step = -1;
  bool stall = false;
};

class Engine {
 public:
  // `mpi` carries control traffic (save, restore, gathers of the run log); `dp` carries the
  // gradient and parameter collectives (MPI or NCCL). Both must outlive the engine.
  static ckpt::Result<std::unique_ptr<Engine>> Create(const EngineConfig& config,
                                                      const Corpus& corpus, MpiComm& mpi,
                                                      DataParallelComm& dp);

  // Fresh start: seeded initialization, identical on every rank.
  ckpt::Status InitFresh();
  // Checks that `reader`'s checkpoint holds this run's model and optimizer
  // (FailedPrecondition otherwise, before anything is read), then restores every rank's state.
  // A checkpoint of another world size or ZeRO stage is loaded resharded
  // (ckpt::LoadResharded: each rank reads the slices it owns, verified; nothing is written);
  // its new ranks get fresh generators seeded from (seed, global_step, rank). `reset` names
  // components to reset afterwards: moments, step, rng, data, scheduler.
  ckpt::Status Restore(const ckpt::CheckpointReader& reader, const std::set<std::string>& reset);
  // What the last resharded Restore read on this rank (zero otherwise; ZeRO-0: rank 0 only).
  const ckpt::ReadAccounting& last_load() const { return last_load_; }

  // DeepSpeed's managed accumulation: ForwardBackward then Step after every micro-batch; the
  // optimizer update happens inside the Step that closes the accumulation window, which then
  // returns the step's statistics (std::nullopt before the boundary). BeginGlobalBatch must
  // be called before the window's first micro-batch with the global batch's token count (every
  // token's gradient is scaled by its inverse: the token-weighted mean over the global batch).
  void BeginGlobalBatch(int64_t global_tokens);
  ckpt::Result<MicroResult> ForwardBackward(const TokenBatch& batch);
  ckpt::Result<std::optional<StepStats>> Step(bool digests);

  // One full optimizer step on the next global batch of the data order.
  ckpt::Result<StepStats> TrainStep(bool digests = true);

  // The gradient the next optimizer step would apply (accumulated over the next global batch,
  // reduced, clipped), full-shape per trainable parameter, on rank 0 (empty elsewhere).
  // Advances nothing that is saved; the engine must not be used for training afterwards.
  ckpt::Result<std::vector<std::vector<float>>> NextGradient(double* grad_norm = nullptr);

  // Collective save of the current state as tag "global_step<N>" under `root`. With async
  // saves enabled it returns once the state is copied (or with the previous background save's
  // error, starting nothing); the write and commit go on in the background.
  ckpt::Status Save(const std::string& root, const nlohmann::json& client_state,
                    const KillInSave& kill = {});
  // --async-save (collective): later saves go through a ckpt::AsyncSaver whose background
  // thread commits over a communicator of its own (MPI_Comm_dup of `mpi`). Needs the MPI
  // library to provide MPI_THREAD_MULTIPLE; otherwise FailedPrecondition naming the level it
  // provides, on every rank, and saves stay synchronous.
  ckpt::Status EnableAsyncSave();
  // The checkpoint collectives give up after this long (MpiCollective); 0: wait forever.
  void SetCollectiveTimeout(double seconds) { collective_timeout_ = seconds; }
  // Waits for the background save, if any, and returns its status (OK when saves are
  // synchronous). Call before exiting: the destructor also waits, but drops the result.
  ckpt::Status WaitForSave();
  bool async_save() const { return saver_ != nullptr; }

  std::string TagForStep() const { return "global_step" + std::to_string(counters_.global_step); }
  const ckpt::Counters& counters() const { return counters_; }
  const EngineConfig& config() const { return config_; }
  const std::vector<ckpt::ParamEntry>& params() const { return params_; }
  const ckpt::Partition& partition() const { return partition_; }
  int rank() const { return rank_; }
  // Full fp32 master weights in flat (table) order, on rank 0 (empty elsewhere).
  ckpt::Result<std::vector<float>> GatherFullMaster();

 private:
  class ReplicatedAccess;
  class PartitionedAccess;
  class SampleGradAccess;
  struct ExactTotals {
    double loss_sum = 0;  // exact sum of the global batch's token losses, rounded once
    double norm = 0;      // global L2 norm before clipping, from an exact sum of squares
  };
  Engine(const EngineConfig& config, const Corpus& corpus, MpiComm& mpi, DataParallelComm& dp);
  ckpt::Status BuildLayout();
  ckpt::Status RefreshComputeWeights();
  // Reduces (per stage) and clips the accumulated gradient into grad_owned_; returns the
  // norm before clipping.
  ckpt::Result<double> ReduceAndClip();
  // Multiplies g by torch's clip coefficient when the norm exceeds --grad-clip.
  void ClipGradient(double norm, std::vector<float>& g) const;
  // Micro-step `a` of this rank on the global batch `ids` (TrainStep, NextGradient).
  ckpt::Status RunMicroStep(const std::vector<int64_t>& ids, const std::vector<TokenBatch>& micro,
                            int64_t a);
  // Invariant mode: micro-step `a` one sample at a time into the fixed-point accumulators.
  ckpt::Status ForwardBackwardSamples(const std::vector<int64_t>& ids, int64_t a);
  // Invariant mode: the dropout masks of the sample at `position` of this step's global batch.
  DropoutMasks SampleMasks(int64_t tokens, int64_t position) const;
  // Invariant mode: `in` holds world × count fixed-point sums (chunk r for rank r); adds the
  // exact sum over ranks of this rank's chunk into `owned`.
  ckpt::Status ReduceScatterFixed(const FixedGrad* in, int64_t count, FixedGrad* owned);
  // Invariant mode: reduces the fixed-point gradient, rounds it to fp32 once (into
  // grad_full_ / grad_owned_ as ReduceAndClip leaves them), reduces loss and norm exactly and
  // clips. FailedPrecondition on every rank when a term was out of the fixed-point range.
  ckpt::Result<ExactTotals> ReduceExactAndClip();
  ckpt::Result<std::vector<float>> GatherFull(const std::vector<float>& shard);
  DropoutMasks DrawMasks(int64_t tokens);
  std::vector<TokenBatch> MyMicroBatches(const std::vector<int64_t>& global_ids) const;
  ckpt::Status ResetComponents(const std::set<std::string>& reset);

  EngineConfig config_;
  const Corpus& corpus_;
  MpiComm& mpi_;
  DataParallelComm& dp_;
  int rank_;
  int world_;
  int stage_;

  ckpt::ReadAccounting last_load_;
  std::vector<ckpt::ParamEntry> params_;  // manifest table, with ranges
  ckpt::Partition partition_;
  std::vector<int64_t> flat_offset_;   // per trainable id, unpadded flat offset
  std::vector<int64_t> numel_;         // per trainable id
  int64_t flat_numel_ = 0;             // unpadded
  int64_t shard_numel_ = 0;            // this rank's state length (ZeRO-0: flat_numel_)
  std::vector<int64_t> share_numel_;   // ZeRO-3: per-parameter share (every rank the same)
  std::vector<int64_t> share_offset_;  // ZeRO-3: offset of that share in a rank's shard

  std::vector<float> master_, exp_avg_, exp_avg_sq_;
  std::vector<float> grad_owned_;        // ZeRO-1..3: reduced gradient of the owned shard
  std::vector<float> grad_full_;         // ZeRO-0..2: this rank's unreduced full gradient
  std::vector<float> compute_full_;      // ZeRO-0..2: bf16-rounded weights as float
  std::vector<uint16_t> compute_shard_;  // ZeRO-3: bf16 compute shard
  std::vector<float> pos_;               // frozen
  std::vector<FixedGrad> fixed_full_;    // invariant, ZeRO-0..2: this rank's unreduced sums
  std::vector<FixedGrad> fixed_owned_;   // invariant, ZeRO-1..3: reduced sums of the owned shard

  ckpt::Counters counters_;
  WarmupCosine schedule_;
  std::mt19937_64 dropout_rng_;
  std::unique_ptr<GlobalOrder> order_;

  // Accumulation window.
  int64_t window_tokens_ = 0;
  int64_t window_micro_ = 0;
  double window_loss_sum_ = 0;
  ExactSum window_loss_exact_;       // invariant mode
  int64_t window_out_of_range_ = 0;  // invariant mode: terms outside the fixed-point range

  // Async saves (EnableAsyncSave). Declared last so the saver, which uses the others until its
  // save in flight finishes, is destroyed first.
  double collective_timeout_ = 0;
  std::unique_ptr<ckpt::Env> kill_env_;  // the test hook's Env; a background save uses it
  std::unique_ptr<MpiComm> save_comm_;
  std::unique_ptr<MpiCollective> save_collective_;
  std::unique_ptr<ckpt::AsyncSaver> saver_;
};

}  // namespace engine_min
