#include "engine_min/nccl_comm.h"
#include "ckpt/cuda_status.h"

#include <cstring>
#include <string>

#ifdef ENGINE_MIN_HAVE_NCCL
#include <cuda_runtime.h>
#include <nccl.h>
#endif

namespace engine_min {

#ifndef ENGINE_MIN_HAVE_NCCL

int CudaDeviceCount() { return 0; }
bool NcclAvailable() { return false; }
ckpt::Result<NcclId> NcclNewUniqueId() {
  return ckpt::Unimplemented("engine_min was built without NCCL");
}
ckpt::Result<std::unique_ptr<DataParallelComm>> CreateNcclComm(const NcclId&, int, int, int) {
  return ckpt::Unimplemented("engine_min was built without NCCL");
}
ckpt::Result<std::unique_ptr<DataParallelComm>> CreateNcclCommOverMpi(MpiComm&) {
  return ckpt::Unimplemented("engine_min was built without NCCL (--comm nccl needs CUDA + NCCL)");
}

#else

static_assert(sizeof(ncclUniqueId) == sizeof(NcclId::bytes), "NCCL unique id size changed");

namespace {

using ckpt::CudaStatus;

ckpt::Status NcclStatus(ncclResult_t r, const std::string& what) {
  if (r == ncclSuccess) return ckpt::Status::Ok();
  return ckpt::IOError(what + ": " + ncclGetErrorString(r));
}

// Device memory, freed on destruction. Move-only.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer() {
    if (ptr_) cudaFree(ptr_);
  }
  ckpt::Status Reserve(size_t bytes) {
    if (bytes <= size_) return ckpt::Status::Ok();
    if (ptr_) cudaFree(ptr_);
    ptr_ = nullptr;
    size_ = 0;
    CKPT_RETURN_IF_ERROR(CudaStatus(cudaMalloc(&ptr_, bytes), "cudaMalloc"), "device buffer");
    size_ = bytes;
    return ckpt::Status::Ok();
  }
  void* get() const { return ptr_; }

 private:
  void* ptr_ = nullptr;
  size_t size_ = 0;
};

class NcclComm final : public DataParallelComm {
 public:
  static ckpt::Result<std::unique_ptr<DataParallelComm>> Create(const NcclId& id, int rank,
                                                                int world, int device) {
    std::unique_ptr<NcclComm> c(new NcclComm(rank, world, device));
    CKPT_RETURN_IF_ERROR(CudaStatus(cudaSetDevice(device), "cudaSetDevice"), "NCCL comm");
    CKPT_RETURN_IF_ERROR(CudaStatus(cudaStreamCreateWithFlags(&c->stream_, cudaStreamNonBlocking),
                                    "cudaStreamCreate"),
                         "NCCL comm");
    ncclUniqueId uid;
    std::memcpy(&uid, id.bytes.data(), sizeof(uid));
    CKPT_RETURN_IF_ERROR(
        NcclStatus(ncclCommInitRank(&c->comm_, world, uid, rank), "ncclCommInitRank"), "NCCL comm");
    return std::unique_ptr<DataParallelComm>(std::move(c));
  }

  ~NcclComm() override {
    if (comm_) ncclCommDestroy(comm_);
    if (stream_) cudaStreamDestroy(stream_);
  }

  int rank() const override { return rank_; }
  int world_size() const override { return world_; }
  std::string name() const override { return "nccl"; }

  ckpt::Status ReduceScatterSum(const float* in, float* out, size_t count) override {
    return ReduceScatter(in, out, count, sizeof(float), ncclFloat);
  }

  ckpt::Status AllGather(const void* in, void* out, size_t bytes) override {
    CKPT_RETURN_IF_ERROR(Prepare(bytes, bytes * world_), "all-gather");
    CKPT_RETURN_IF_ERROR(Upload(in, bytes), "all-gather");
    CKPT_RETURN_IF_ERROR(
        NcclStatus(ncclAllGather(send_.get(), recv_.get(), bytes, ncclUint8, comm_, stream_),
                   "ncclAllGather"),
        "all-gather");
    return Download(out, recv_.get(), bytes * world_).WithContext("all-gather");
  }

  ckpt::Status AllReduceSum(float* data, size_t count) override {
    return AllReduce(data, count, sizeof(float), ncclFloat);
  }

  ckpt::Status ReduceScatterSumInt64(const int64_t* in, int64_t* out, size_t count) override {
    return ReduceScatter(in, out, count, sizeof(int64_t), ncclInt64);
  }

  ckpt::Status AllReduceSumInt64(int64_t* data, size_t count) override {
    return AllReduce(data, count, sizeof(int64_t), ncclInt64);
  }

  ckpt::Status Broadcast(void* data, size_t bytes, int root) override {
    CKPT_RETURN_IF_ERROR(Prepare(bytes, 0), "broadcast");
    if (rank_ == root) CKPT_RETURN_IF_ERROR(Upload(data, bytes), "broadcast");
    CKPT_RETURN_IF_ERROR(
        NcclStatus(ncclBroadcast(send_.get(), send_.get(), bytes, ncclUint8, root, comm_, stream_),
                   "ncclBroadcast"),
        "broadcast");
    return Download(data, send_.get(), bytes).WithContext("broadcast");
  }

 private:
  NcclComm(int rank, int world, int device) : rank_(rank), world_(world), device_(device) {}

  ckpt::Status ReduceScatter(const void* in, void* out, size_t count, size_t elem,
                             ncclDataType_t type) {
    const size_t in_bytes = count * world_ * elem;
    CKPT_RETURN_IF_ERROR(Prepare(in_bytes, count * elem), "reduce-scatter");
    CKPT_RETURN_IF_ERROR(Upload(in, in_bytes), "reduce-scatter");
    CKPT_RETURN_IF_ERROR(NcclStatus(ncclReduceScatter(send_.get(), recv_.get(), count, type,
                                                      ncclSum, comm_, stream_),
                                    "ncclReduceScatter"),
                         "reduce-scatter");
    return Download(out, recv_.get(), count * elem).WithContext("reduce-scatter");
  }

  ckpt::Status AllReduce(void* data, size_t count, size_t elem, ncclDataType_t type) {
    const size_t bytes = count * elem;
    CKPT_RETURN_IF_ERROR(Prepare(bytes, 0), "all-reduce");
    CKPT_RETURN_IF_ERROR(Upload(data, bytes), "all-reduce");
    CKPT_RETURN_IF_ERROR(
        NcclStatus(ncclAllReduce(send_.get(), send_.get(), count, type, ncclSum, comm_, stream_),
                   "ncclAllReduce"),
        "all-reduce");
    return Download(data, send_.get(), bytes).WithContext("all-reduce");
  }

  ckpt::Status Prepare(size_t send_bytes, size_t recv_bytes) {
    CKPT_RETURN_IF_ERROR(CudaStatus(cudaSetDevice(device_), "cudaSetDevice"), "NCCL device");
    CKPT_RETURN_IF_ERROR(send_.Reserve(std::max<size_t>(send_bytes, 1)), "send buffer");
    CKPT_RETURN_IF_ERROR(recv_.Reserve(std::max<size_t>(recv_bytes, 1)), "receive buffer");
    return ckpt::Status::Ok();
  }
  ckpt::Status Upload(const void* host, size_t bytes) {
    return CudaStatus(cudaMemcpyAsync(send_.get(), host, bytes, cudaMemcpyHostToDevice, stream_),
                      "cudaMemcpy host to device");
  }
  ckpt::Status Download(void* host, const void* dev, size_t bytes) {
    CKPT_RETURN_IF_ERROR(
        CudaStatus(cudaMemcpyAsync(host, dev, bytes, cudaMemcpyDeviceToHost, stream_),
                   "cudaMemcpy device to host"),
        "NCCL staging");
    return CudaStatus(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
  }

  int rank_;
  int world_;
  int device_;
  ncclComm_t comm_ = nullptr;
  cudaStream_t stream_ = nullptr;
  DeviceBuffer send_, recv_;
};

}  // namespace

int CudaDeviceCount() {
  int n = 0;
  const cudaError_t err = cudaGetDeviceCount(&n);
  if (err != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return n;
}

bool NcclAvailable() { return true; }

ckpt::Result<NcclId> NcclNewUniqueId() {
  ncclUniqueId uid;
  CKPT_RETURN_IF_ERROR(NcclStatus(ncclGetUniqueId(&uid), "ncclGetUniqueId"), "NCCL");
  NcclId id;
  std::memcpy(id.bytes.data(), &uid, sizeof(uid));
  return id;
}

ckpt::Result<std::unique_ptr<DataParallelComm>> CreateNcclComm(const NcclId& id, int rank,
                                                               int world, int device) {
  return NcclComm::Create(id, rank, world, device);
}

ckpt::Result<std::unique_ptr<DataParallelComm>> CreateNcclCommOverMpi(MpiComm& mpi) {
  const int devices = CudaDeviceCount();
  // Every rank must agree before anyone calls into NCCL, or the others would block.
  CKPT_ASSIGN_OR_RETURN(const double fewest, mpi.SumDoubles(devices > 0 ? 0.0 : 1.0), "NCCL");
  if (fewest > 0) return ckpt::FailedPrecondition("--comm nccl: a rank sees no CUDA device");
  NcclId id;
  ckpt::Status made = ckpt::Status::Ok();
  if (mpi.rank() == 0) {
    auto r = NcclNewUniqueId();
    if (r.ok())
      id = *r;
    else
      made = r.status();
  }
  int failed = made.ok() ? 0 : 1;
  CKPT_RETURN_IF_ERROR(mpi.Broadcast(&failed, sizeof(failed), 0), "NCCL id");
  if (failed) return made.ok() ? ckpt::IOError("rank 0 could not create the NCCL id") : made;
  CKPT_RETURN_IF_ERROR(mpi.Broadcast(id.bytes.data(), id.bytes.size(), 0), "NCCL id");
  return CreateNcclComm(id, mpi.rank(), mpi.world_size(), mpi.rank() % devices);
}

#endif

}  // namespace engine_min
