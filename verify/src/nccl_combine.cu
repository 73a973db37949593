// NCCL all-reduce of PassStats: sums and counts in one ncclSum over doubles and uint64s, the
// maxima in one ncclMax. Communicator, stream and device buffer are RAII members.
//
// libnccl is opened on first use (dlopen), not linked: it is a library of some 200 MB whose
// loading every `ckpt` command paid at start (about 4 ms of the 27 ms a command took to start
// on the development VM, issue 19), while only next-update with --gpus uses it. nccl.h gives
// the types.
#include "verify/nccl_combine.h"
#include "ckpt/cuda_status.h"
#include "ckpt/shared_library.h"

#ifdef CKPT_VERIFY_HAVE_NCCL

#include <cuda_runtime.h>
#include <nccl.h>

#include <cstring>

namespace ckpt::verify {
namespace {

struct NcclApi {
  decltype(&ncclGetErrorString) GetErrorString = nullptr;
  decltype(&ncclGetUniqueId) GetUniqueId = nullptr;
  decltype(&ncclCommInitRank) CommInitRank = nullptr;
  decltype(&ncclCommDestroy) CommDestroy = nullptr;
  decltype(&ncclGroupStart) GroupStart = nullptr;
  decltype(&ncclGroupEnd) GroupEnd = nullptr;
  decltype(&ncclAllReduce) AllReduce = nullptr;
};

// The library found at configure time (CKPT_NCCL_LIBRARY), else the loader's search for
// libnccl.so.2; opened once per process. Null, with *error set, when it cannot be opened or
// lacks a function.
const NcclApi* Nccl(std::string* error) {
  struct Loaded {
    NcclApi api;
    std::string error;  // empty: loaded
  };
  static const Loaded loaded = [] {
    Loaded l;
    auto lib = SharedLibrary::Open({CKPT_NCCL_LIBRARY, "libnccl.so.2"}, "NCCL");
    if (!lib.ok()) {
      l.error = lib.status().message();
      return l;
    }
    auto find = [&](const char* name, auto** fn) {
      if (Status s = lib->Find(name, fn); !s.ok() && l.error.empty()) l.error = s.message();
    };
    find("ncclGetErrorString", &l.api.GetErrorString);
    find("ncclGetUniqueId", &l.api.GetUniqueId);
    find("ncclCommInitRank", &l.api.CommInitRank);
    find("ncclCommDestroy", &l.api.CommDestroy);
    find("ncclGroupStart", &l.api.GroupStart);
    find("ncclGroupEnd", &l.api.GroupEnd);
    find("ncclAllReduce", &l.api.AllReduce);
    return l;
  }();
  if (!loaded.error.empty()) {
    if (error) *error = loaded.error;
    return nullptr;
  }
  return &loaded.api;
}

// The API, or FailedPrecondition naming why it could not be opened.
Result<const NcclApi*> NcclOrError() {
  std::string why;
  const NcclApi* api = Nccl(&why);
  if (!api) return FailedPrecondition("nccl combine: " + why);
  return api;
}

Status NcclStatus(ncclResult_t r, const char* what) {
  if (r == ncclSuccess) return Status::Ok();
  return Internal(std::string(what) + ": " + Nccl(nullptr)->GetErrorString(r));
}

// Doubles: 6 sums, 2 maxima; uint64: n and 2 counts.
struct Packed {
  double sums[6];
  double maxima[2];
  unsigned long long counts[3];
};

class NcclCombiner final : public NcclStatsCombiner {
 public:
  ~NcclCombiner() override {
    if (buffer_) cudaFree(buffer_);
    if (stream_) cudaStreamDestroy(stream_);
    if (comm_) nccl_->CommDestroy(comm_);
  }
  explicit NcclCombiner(const NcclApi* nccl) : nccl_(nccl) {}
  Status Init(const ncclUniqueId& id, int rank, int world, int device) {
    device_ = device;
    CKPT_RETURN_IF_ERROR(CudaStatus(cudaSetDevice(device), "cudaSetDevice"), "nccl combine");
    CKPT_RETURN_IF_ERROR(
        NcclStatus(nccl_->CommInitRank(&comm_, world, id, rank), "ncclCommInitRank"),
        "nccl combine");
    CKPT_RETURN_IF_ERROR(CudaStatus(cudaStreamCreate(&stream_), "cudaStreamCreate"),
                         "nccl combine");
    void* p = nullptr;
    CKPT_RETURN_IF_ERROR(CudaStatus(cudaMalloc(&p, sizeof(Packed)), "cudaMalloc"), "nccl combine");
    buffer_ = static_cast<Packed*>(p);
    return Status::Ok();
  }
  Status AllReduce(PassStats& s) override {
    Packed h{{s.sum_sq_full, s.sum_sq_update_full, s.weights_only.sum_sq_diff,
              s.weights_only.sum_sq_update, s.moments_dropped.sum_sq_diff,
              s.moments_dropped.sum_sq_update},
             {s.weights_only.max_abs, s.moments_dropped.max_abs},
             {s.n, s.weights_only.n_differ, s.moments_dropped.n_differ}};
    CKPT_RETURN_IF_ERROR(CudaStatus(cudaSetDevice(device_), "cudaSetDevice"), "nccl combine");
    CKPT_RETURN_IF_ERROR(
        CudaStatus(cudaMemcpyAsync(buffer_, &h, sizeof h, cudaMemcpyHostToDevice, stream_),
                   "cudaMemcpy"),
        "nccl combine");
    CKPT_RETURN_IF_ERROR(NcclStatus(nccl_->GroupStart(), "ncclGroupStart"), "nccl combine");
    CKPT_RETURN_IF_ERROR(NcclStatus(nccl_->AllReduce(buffer_->sums, buffer_->sums, 6, ncclFloat64,
                                                     ncclSum, comm_, stream_),
                                    "ncclAllReduce sums"),
                         "nccl combine");
    CKPT_RETURN_IF_ERROR(NcclStatus(nccl_->AllReduce(buffer_->maxima, buffer_->maxima, 2,
                                                     ncclFloat64, ncclMax, comm_, stream_),
                                    "ncclAllReduce maxima"),
                         "nccl combine");
    CKPT_RETURN_IF_ERROR(NcclStatus(nccl_->AllReduce(buffer_->counts, buffer_->counts, 3,
                                                     ncclUint64, ncclSum, comm_, stream_),
                                    "ncclAllReduce counts"),
                         "nccl combine");
    CKPT_RETURN_IF_ERROR(NcclStatus(nccl_->GroupEnd(), "ncclGroupEnd"), "nccl combine");
    CKPT_RETURN_IF_ERROR(
        CudaStatus(cudaMemcpyAsync(&h, buffer_, sizeof h, cudaMemcpyDeviceToHost, stream_),
                   "cudaMemcpy"),
        "nccl combine");
    CKPT_RETURN_IF_ERROR(CudaStatus(cudaStreamSynchronize(stream_), "cudaStreamSynchronize"),
                         "nccl combine");
    s.sum_sq_full = h.sums[0];
    s.sum_sq_update_full = h.sums[1];
    s.weights_only.sum_sq_diff = h.sums[2];
    s.weights_only.sum_sq_update = h.sums[3];
    s.moments_dropped.sum_sq_diff = h.sums[4];
    s.moments_dropped.sum_sq_update = h.sums[5];
    s.weights_only.max_abs = h.maxima[0];
    s.moments_dropped.max_abs = h.maxima[1];
    s.n = h.counts[0];
    s.weights_only.n_differ = h.counts[1];
    s.moments_dropped.n_differ = h.counts[2];
    return Status::Ok();
  }

 private:
  const NcclApi* nccl_;
  int device_ = 0;
  ncclComm_t comm_ = nullptr;
  cudaStream_t stream_ = nullptr;
  Packed* buffer_ = nullptr;
};

}  // namespace

bool HaveNcclCombine() { return Nccl(nullptr) != nullptr; }

Result<std::string> NcclStatsCombiner::NewUniqueId() {
  CKPT_ASSIGN_OR_RETURN(const NcclApi* nccl, NcclOrError(), "");
  ncclUniqueId id;
  CKPT_RETURN_IF_ERROR(NcclStatus(nccl->GetUniqueId(&id), "ncclGetUniqueId"), "nccl combine");
  return std::string(reinterpret_cast<const char*>(&id), sizeof id);
}

Result<std::unique_ptr<NcclStatsCombiner>> NcclStatsCombiner::Create(const std::string& unique_id,
                                                                     int rank, int world,
                                                                     int device) {
  ncclUniqueId id;
  if (unique_id.size() != sizeof id) return InvalidArgument("nccl combine: malformed unique id");
  std::memcpy(&id, unique_id.data(), sizeof id);
  CKPT_ASSIGN_OR_RETURN(const NcclApi* nccl, NcclOrError(), "");
  auto c = std::make_unique<NcclCombiner>(nccl);
  CKPT_RETURN_IF_ERROR(c->Init(id, rank, world, device), "rank " + std::to_string(rank));
  return std::unique_ptr<NcclStatsCombiner>(std::move(c));
}

}  // namespace ckpt::verify

#endif  // CKPT_VERIFY_HAVE_NCCL
