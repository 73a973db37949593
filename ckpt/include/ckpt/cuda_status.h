// CudaStatus: the one conversion of a CUDA runtime error into a Status, for the CUDA-built
// parts (engine_min's NCCL collective, verify's CUDA passes). Header-only so that the format
// library itself neither includes nor links CUDA; include it only from CUDA-enabled targets.
#pragma once

#include <cuda_runtime_api.h>

#include <string>
#include <string_view>

#include "ckpt/status.h"

namespace ckpt {

// cudaSuccess -> OK. Otherwise clears the error so later calls start clean (a sticky error,
// which poisons the context, stays) and returns Internal "what: cudaErrorName (description)":
// a CUDA failure is the machine's or ours, never the checkpoint's.
inline Status CudaStatus(cudaError_t err, std::string_view what) {
  if (err == cudaSuccess) return Status::Ok();
  cudaGetLastError();
  return Internal(std::string(what) + ": " + cudaGetErrorName(err) + " (" +
                  cudaGetErrorString(err) + ")");
}

}  // namespace ckpt
