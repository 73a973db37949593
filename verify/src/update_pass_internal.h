// Private entry points of the next-update pass implementations.
#pragma once

#include <memory>
#include <string>

#include "verify/update_pass.h"

namespace ckpt::verify {

Result<PassBench> BenchCpuPass(uint64_t input_bytes, int reps);

#ifdef CKPT_VERIFY_HAVE_CUDA
// Defined in update_pass_cuda.cu.
int CudaDeviceCountImpl(std::string* why);
Status SelectCudaDeviceImpl(int device);
Result<std::unique_ptr<UpdatePass>> MakeCudaPass();
Result<PassBench> BenchCudaPass(uint64_t input_bytes, int reps);
#endif

}  // namespace ckpt::verify
