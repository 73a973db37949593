// Data-parallel communication for the engine: the collectives ZeRO needs (reduce-scatter,
// all-gather, all-reduce, broadcast) behind one interface, with an MPI implementation (CPU,
// the default) and an NCCL one (nccl_comm.h, compiled when CUDA and NCCL are found).
//
// MpiComm reduces in a fixed rank order (each owner sums the contributions of ranks 0..N-1 in
// that order), so its results are bitwise reproducible from run to run whatever algorithm the
// MPI library would have picked for MPI_Reduce_scatter.
#pragma once

#include <mpi.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "ckpt/collective.h"
#include "ckpt/status.h"

namespace engine_min {

// All calls are collective over the group, with equal arguments on every rank. Buffers are
// host memory. Not thread-safe.
class DataParallelComm {
 public:
  virtual ~DataParallelComm() = default;
  virtual int rank() const = 0;
  virtual int world_size() const = 0;
  virtual std::string name() const = 0;
  // in: world × count floats (chunk r goes to rank r); out: count floats, the element-wise
  // sum over ranks of this rank's chunk.
  virtual ckpt::Status ReduceScatterSum(const float* in, float* out, size_t count) = 0;
  // in: `bytes` from every rank; out: world × bytes, rank r's at r × bytes.
  virtual ckpt::Status AllGather(const void* in, void* out, size_t bytes) = 0;
  // data: count floats, replaced by the element-wise sum over ranks.
  virtual ckpt::Status AllReduceSum(float* data, size_t count) = 0;
  virtual ckpt::Status Broadcast(void* data, size_t bytes, int root) = 0;
  // Integer versions of ReduceScatterSum and AllReduceSum, for invariant mode's fixed-point
  // gradients (engine_min/exact_sum.h). Integer addition is associative, so the result is the
  // same bits whatever order or algorithm the library uses. The caller keeps the sums within
  // int64 (signed overflow is not detected).
  virtual ckpt::Status ReduceScatterSumInt64(const int64_t* in, int64_t* out, size_t count) = 0;
  virtual ckpt::Status AllReduceSumInt64(int64_t* data, size_t count) = 0;
};

// Owns MPI_Init_thread/MPI_Finalize for the process (one per process). Asks for
// MPI_THREAD_MULTIPLE (async saves); MPI_Query_thread tells what the library provided.
class MpiSession {
 public:
  static ckpt::Result<MpiSession> Init(int* argc, char*** argv);
  MpiSession(MpiSession&& other) noexcept : active_(other.active_) { other.active_ = false; }
  MpiSession& operator=(MpiSession&&) = delete;
  ~MpiSession();
  // Ends the whole job (every rank) with `code`; used when a rank-local failure would
  // otherwise leave the other ranks blocked in a collective.
  [[noreturn]] static void Abort(int code);

 private:
  MpiSession() = default;
  bool active_ = true;
};

// Converts an MPI return code (MPI_ERRORS_RETURN is set on the communicators we use).
ckpt::Status MpiStatus(int rc, std::string_view what);

class MpiComm final : public DataParallelComm {
 public:
  // Duplicates `comm` (so its traffic cannot mix with anyone else's) and sets
  // MPI_ERRORS_RETURN on the duplicate.
  static ckpt::Result<std::unique_ptr<MpiComm>> Create(MPI_Comm comm);
  ~MpiComm() override;
  MpiComm(const MpiComm&) = delete;
  MpiComm& operator=(const MpiComm&) = delete;

  int rank() const override { return rank_; }
  int world_size() const override { return world_; }
  std::string name() const override { return "mpi"; }
  ckpt::Status ReduceScatterSum(const float* in, float* out, size_t count) override;
  ckpt::Status AllGather(const void* in, void* out, size_t bytes) override;
  ckpt::Status AllReduceSum(float* data, size_t count) override;
  ckpt::Status Broadcast(void* data, size_t bytes, int root) override;
  ckpt::Status ReduceScatterSumInt64(const int64_t* in, int64_t* out, size_t count) override;
  ckpt::Status AllReduceSumInt64(int64_t* data, size_t count) override;

  // Doubles from every rank summed in rank order (identical result on every rank).
  ckpt::Result<double> SumDoubles(double mine);
  ckpt::Result<std::vector<double>> AllGatherDoubles(double mine);
  // Variable-size gather of raw bytes to rank 0 (others get an empty vector).
  ckpt::Result<std::vector<std::string>> GatherBytes(std::string_view mine);
  MPI_Comm comm() const { return comm_; }

 private:
  MpiComm(MPI_Comm comm, int rank, int world) : comm_(comm), rank_(rank), world_(world) {}
  MPI_Comm comm_;
  int rank_;
  int world_;
  std::vector<float> scratch_;
};

// ckpt::Collective over MPI, for ckpt::SaveCheckpoint. For a background save (AsyncSaver),
// give it an MpiComm of its own (MpiComm::Create duplicates the communicator) in a process
// with MPI_THREAD_MULTIPLE: collective.h, "Collectives and background saves".
//
// timeout_seconds > 0: each collective call gives up after that long (a rank stopped, hung or
// dead) with IOError "... timed out after N s ...", so the save fails cleanly and the previous
// checkpoint stays `latest`; the communicator is then unusable and the job must abort (the
// engine does). The calls are non-blocking MPI operations polled until done.
class MpiCollective final : public ckpt::Collective {
 public:
  explicit MpiCollective(MpiComm& comm, double timeout_seconds = 0)
      : comm_(comm), timeout_seconds_(timeout_seconds) {}
  int rank() const override { return comm_.rank(); }
  int world_size() const override { return comm_.world_size(); }
  ckpt::Status Barrier() override;
  ckpt::Result<std::vector<std::string>> Gather(std::string_view payload) override;
  ckpt::Result<std::string> Broadcast(std::string_view payload) override;
  // Whether a call gave up at the timeout (the communicator is then unusable).
  bool timed_out() const { return timed_out_.load(); }

 private:
  // Completes `request` (MPI_Wait, or MPI_Test polling up to the timeout).
  ckpt::Status Complete(MPI_Request* request, std::string_view what) const;

  MpiComm& comm_;
  double timeout_seconds_ = 0;
  mutable std::atomic<bool> timed_out_{false};
};

}  // namespace engine_min
