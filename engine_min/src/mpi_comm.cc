#include <algorithm>
#include <chrono>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <thread>

#include "engine_min/comm.h"

namespace engine_min {

ckpt::Status MpiStatus(int rc, std::string_view what) {
  if (rc == MPI_SUCCESS) return ckpt::Status::Ok();
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, text, &len);
  return ckpt::IOError(std::string(what) + ": " + std::string(text, static_cast<size_t>(len)));
}

#define ENGINE_MPI(call, what)                            \
  do {                                                    \
    ::ckpt::Status engine_mpi_ = MpiStatus((call), what); \
    if (!engine_mpi_.ok()) return engine_mpi_;            \
  } while (0)

namespace {
ckpt::Status CheckCount(size_t count, std::string_view what) {
  if (count > static_cast<size_t>(INT_MAX)) {
    return ckpt::InvalidArgument(std::string(what) + ": " + std::to_string(count) +
                                 " elements exceed one MPI message");
  }
  return ckpt::Status::Ok();
}
}  // namespace

ckpt::Result<MpiSession> MpiSession::Init(int* argc, char*** argv) {
  // MPI_THREAD_MULTIPLE for --async-save, whose background thread commits over its own
  // communicator while training goes on; the level provided is checked there
  // (Engine::EnableAsyncSave), so a library without it still runs synchronous saves.
  int provided = MPI_THREAD_SINGLE;
  int rc = MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided);
  if (rc != MPI_SUCCESS) return MpiStatus(rc, "MPI_Init_thread");
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  return MpiSession();
}

MpiSession::~MpiSession() {
  if (active_) MPI_Finalize();
}

void MpiSession::Abort(int code) {
  MPI_Abort(MPI_COMM_WORLD, code);
  std::_Exit(code);
}

ckpt::Result<std::unique_ptr<MpiComm>> MpiComm::Create(MPI_Comm comm) {
  MPI_Comm dup;
  int rc = MPI_Comm_dup(comm, &dup);
  if (rc != MPI_SUCCESS) return MpiStatus(rc, "MPI_Comm_dup");
  MPI_Comm_set_errhandler(dup, MPI_ERRORS_RETURN);
  int rank = 0, world = 1;
  MPI_Comm_rank(dup, &rank);
  MPI_Comm_size(dup, &world);
  return std::unique_ptr<MpiComm>(new MpiComm(dup, rank, world));
}

MpiComm::~MpiComm() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Comm_free(&comm_);
}

ckpt::Status MpiComm::ReduceScatterSum(const float* in, float* out, size_t count) {
  if (auto s = CheckCount(count, "reduce-scatter"); !s.ok()) return s;
  if (world_ == 1) {
    std::memcpy(out, in, count * sizeof(float));
    return ckpt::Status::Ok();
  }
  // Every rank's chunk for me, then a sum in rank order 0..N-1.
  scratch_.resize(count * static_cast<size_t>(world_));
  ENGINE_MPI(MPI_Alltoall(in, static_cast<int>(count), MPI_FLOAT, scratch_.data(),
                          static_cast<int>(count), MPI_FLOAT, comm_),
             "reduce-scatter (MPI_Alltoall)");
  std::memcpy(out, scratch_.data(), count * sizeof(float));
  for (int r = 1; r < world_; ++r) {
    const float* src = scratch_.data() + static_cast<size_t>(r) * count;
    for (size_t i = 0; i < count; ++i) out[i] += src[i];
  }
  return ckpt::Status::Ok();
}

ckpt::Status MpiComm::AllGather(const void* in, void* out, size_t bytes) {
  if (auto s = CheckCount(bytes, "all-gather"); !s.ok()) return s;
  if (world_ == 1) {
    std::memcpy(out, in, bytes);
    return ckpt::Status::Ok();
  }
  ENGINE_MPI(MPI_Allgather(in, static_cast<int>(bytes), MPI_BYTE, out, static_cast<int>(bytes),
                           MPI_BYTE, comm_),
             "MPI_Allgather");
  return ckpt::Status::Ok();
}

ckpt::Status MpiComm::AllReduceSum(float* data, size_t count) {
  if (world_ == 1) return ckpt::Status::Ok();
  // Fixed-order reduce-scatter over equal padded chunks, then an all-gather of the sums.
  const size_t chunk = (count + world_ - 1) / world_;
  std::vector<float> padded(chunk * world_, 0.0f);
  std::memcpy(padded.data(), data, count * sizeof(float));
  std::vector<float> mine(chunk);
  CKPT_RETURN_IF_ERROR(ReduceScatterSum(padded.data(), mine.data(), chunk), "all-reduce");
  CKPT_RETURN_IF_ERROR(AllGather(mine.data(), padded.data(), chunk * sizeof(float)), "all-reduce");
  std::memcpy(data, padded.data(), count * sizeof(float));
  return ckpt::Status::Ok();
}

ckpt::Status MpiComm::ReduceScatterSumInt64(const int64_t* in, int64_t* out, size_t count) {
  if (auto s = CheckCount(count, "reduce-scatter"); !s.ok()) return s;
  if (world_ == 1) {
    std::memcpy(out, in, count * sizeof(int64_t));
    return ckpt::Status::Ok();
  }
  ENGINE_MPI(
      MPI_Reduce_scatter_block(in, out, static_cast<int>(count), MPI_INT64_T, MPI_SUM, comm_),
      "MPI_Reduce_scatter_block");
  return ckpt::Status::Ok();
}

ckpt::Status MpiComm::AllReduceSumInt64(int64_t* data, size_t count) {
  if (auto s = CheckCount(count, "all-reduce"); !s.ok()) return s;
  if (world_ == 1) return ckpt::Status::Ok();
  ENGINE_MPI(
      MPI_Allreduce(MPI_IN_PLACE, data, static_cast<int>(count), MPI_INT64_T, MPI_SUM, comm_),
      "MPI_Allreduce");
  return ckpt::Status::Ok();
}

ckpt::Status MpiComm::Broadcast(void* data, size_t bytes, int root) {
  if (auto s = CheckCount(bytes, "broadcast"); !s.ok()) return s;
  if (world_ == 1) return ckpt::Status::Ok();
  ENGINE_MPI(MPI_Bcast(data, static_cast<int>(bytes), MPI_BYTE, root, comm_), "MPI_Bcast");
  return ckpt::Status::Ok();
}

ckpt::Result<std::vector<double>> MpiComm::AllGatherDoubles(double mine) {
  std::vector<double> all(static_cast<size_t>(world_));
  ENGINE_MPI(MPI_Allgather(&mine, 1, MPI_DOUBLE, all.data(), 1, MPI_DOUBLE, comm_),
             "MPI_Allgather");
  return all;
}

ckpt::Result<double> MpiComm::SumDoubles(double mine) {
  CKPT_ASSIGN_OR_RETURN(std::vector<double> all, AllGatherDoubles(mine), "sum");
  double sum = 0;
  for (double x : all) sum += x;
  return sum;
}

ckpt::Result<std::vector<std::string>> MpiComm::GatherBytes(std::string_view mine) {
  if (auto s = CheckCount(mine.size(), "gather"); !s.ok()) return s;
  int my_size = static_cast<int>(mine.size());
  std::vector<int> sizes(rank_ == 0 ? world_ : 0);
  ENGINE_MPI(MPI_Gather(&my_size, 1, MPI_INT, sizes.data(), 1, MPI_INT, 0, comm_),
             "MPI_Gather (sizes)");
  std::vector<int> displs;
  std::vector<char> all;
  if (rank_ == 0) {
    displs.resize(world_);
    int64_t total = 0;
    for (int r = 0; r < world_; ++r) {
      displs[r] = static_cast<int>(total);
      total += sizes[r];
    }
    if (auto s = CheckCount(static_cast<size_t>(total), "gather"); !s.ok()) return s;
    all.resize(static_cast<size_t>(total));
  }
  ENGINE_MPI(MPI_Gatherv(mine.data(), my_size, MPI_BYTE, all.data(), sizes.data(), displs.data(),
                         MPI_BYTE, 0, comm_),
             "MPI_Gatherv");
  std::vector<std::string> out;
  if (rank_ == 0) {
    for (int r = 0; r < world_; ++r) out.emplace_back(all.data() + displs[r], sizes[r]);
  }
  return out;
}

ckpt::Status MpiCollective::Complete(MPI_Request* request, std::string_view what) const {
  if (timeout_seconds_ <= 0) {
    ENGINE_MPI(MPI_Wait(request, MPI_STATUS_IGNORE), what);
    return ckpt::Status::Ok();
  }
  using Clock = std::chrono::steady_clock;
  const auto deadline = Clock::now() + std::chrono::duration<double>(timeout_seconds_);
  auto pause = std::chrono::microseconds(20);
  for (;;) {
    int done = 0;
    ENGINE_MPI(MPI_Test(request, &done, MPI_STATUS_IGNORE), what);
    if (done) return ckpt::Status::Ok();
    if (Clock::now() >= deadline) {
      timed_out_ = true;
      return ckpt::IOError(std::string(what) + " timed out after " +
                           std::to_string(static_cast<int>(timeout_seconds_)) +
                           " s (--collective-timeout): another rank is stopped, hung or dead");
    }
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::microseconds(10000));
  }
}

ckpt::Status MpiCollective::Barrier() {
  MPI_Request req;
  ENGINE_MPI(MPI_Ibarrier(comm_.comm(), &req), "MPI_Ibarrier");
  return Complete(&req, "checkpoint barrier");
}

ckpt::Result<std::vector<std::string>> MpiCollective::Gather(std::string_view payload) {
  if (auto s = CheckCount(payload.size(), "gather"); !s.ok()) return s;
  const int rank = comm_.rank(), world = comm_.world_size();
  int my_size = static_cast<int>(payload.size());
  std::vector<int> sizes(rank == 0 ? world : 0);
  MPI_Request req;
  ENGINE_MPI(MPI_Igather(&my_size, 1, MPI_INT, sizes.data(), 1, MPI_INT, 0, comm_.comm(), &req),
             "MPI_Igather (sizes)");
  CKPT_RETURN_IF_ERROR(Complete(&req, "checkpoint gather (sizes)"));
  std::vector<int> displs;
  std::vector<char> all;
  if (rank == 0) {
    displs.resize(static_cast<size_t>(world));
    int64_t total = 0;
    for (int r = 0; r < world; ++r) {
      displs[static_cast<size_t>(r)] = static_cast<int>(total);
      total += sizes[static_cast<size_t>(r)];
    }
    if (auto s = CheckCount(static_cast<size_t>(total), "gather"); !s.ok()) return s;
    all.resize(static_cast<size_t>(total));
  }
  ENGINE_MPI(MPI_Igatherv(payload.data(), my_size, MPI_BYTE, all.data(), sizes.data(),
                          displs.data(), MPI_BYTE, 0, comm_.comm(), &req),
             "MPI_Igatherv");
  CKPT_RETURN_IF_ERROR(Complete(&req, "checkpoint gather"));
  std::vector<std::string> out;
  if (rank == 0) {
    for (int r = 0; r < world; ++r)
      out.emplace_back(all.data() + displs[static_cast<size_t>(r)], sizes[static_cast<size_t>(r)]);
  }
  return out;
}

ckpt::Result<std::string> MpiCollective::Broadcast(std::string_view payload) {
  uint64_t size = comm_.rank() == 0 ? payload.size() : 0;
  MPI_Request req;
  ENGINE_MPI(MPI_Ibcast(&size, sizeof(size), MPI_BYTE, 0, comm_.comm(), &req), "MPI_Ibcast");
  CKPT_RETURN_IF_ERROR(Complete(&req, "checkpoint broadcast (size)"));
  if (auto s = CheckCount(static_cast<size_t>(size), "broadcast"); !s.ok()) return s;
  std::string out(static_cast<size_t>(size), '\0');
  if (comm_.rank() == 0) out.assign(payload);
  ENGINE_MPI(MPI_Ibcast(out.data(), static_cast<int>(out.size()), MPI_BYTE, 0, comm_.comm(), &req),
             "MPI_Ibcast");
  CKPT_RETURN_IF_ERROR(Complete(&req, "checkpoint broadcast"));
  return out;
}

}  // namespace engine_min
