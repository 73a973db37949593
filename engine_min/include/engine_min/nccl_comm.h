// The NCCL data-parallel backend: the same DataParallelComm collectives run by NCCL on a CUDA
// device. Buffers stay host memory at the interface (the engine computes on the CPU); each
// call stages them through device buffers owned by the communicator. Compiled only when CUDA
// and NCCL are found (ENGINE_MIN_HAVE_NCCL); without them every function returns
// Unimplemented. NCCL's reduction order is fixed for a fixed communicator and message size,
// so runs repeat bit for bit on the same devices, but the bits differ from MpiComm's.
#pragma once

#include <array>
#include <memory>

#include "ckpt/status.h"
#include "engine_min/comm.h"

namespace engine_min {

// ncclUniqueId's bytes (NCCL_UNIQUE_ID_BYTES), so this header needs no NCCL or CUDA headers.
struct NcclId {
  std::array<char, 128> bytes{};
};

// Number of usable CUDA devices; 0 without CUDA, a driver or a device (the sticky CUDA error
// of a failed probe is cleared).
int CudaDeviceCount();
bool NcclAvailable();  // built with NCCL

ckpt::Result<NcclId> NcclNewUniqueId();
// One rank of a `world`-rank NCCL communicator on CUDA device `device`. Collective: all
// ranks must call it concurrently with the same id (different threads or processes).
ckpt::Result<std::unique_ptr<DataParallelComm>> CreateNcclComm(const NcclId& id, int rank,
                                                               int world, int device);
// Bootstraps over MPI: rank 0 makes the id and broadcasts it; rank r uses device
// r % CudaDeviceCount().
ckpt::Result<std::unique_ptr<DataParallelComm>> CreateNcclCommOverMpi(MpiComm& mpi);

}  // namespace engine_min
