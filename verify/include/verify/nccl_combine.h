// Combining next-update statistics across GPUs: one process (or thread) per GPU runs the pass
// over its share of the elements, then an NCCL all-reduce adds the sums and counts and takes
// the maxima, so every rank holds the statistics of the whole tensor set.
// Built when NCCL is found (CKPT_VERIFY_HAVE_NCCL); otherwise every call is Unimplemented.
#pragma once

#include <memory>
#include <string>

#include "ckpt/status.h"
#include "verify/update_pass.h"

namespace ckpt::verify {

// True when this build has the NCCL combiner.
bool HaveNcclCombine();

// One rank's NCCL communicator on one GPU. Move-only through unique_ptr; not thread-safe.
class NcclStatsCombiner {
 public:
  // The out-of-band id rank 0 creates and hands to every rank (bytes, ncclUniqueId).
  static Result<std::string> NewUniqueId();
  // Collective: every rank of `world` calls it with the same id. `device` is the CUDA device
  // this rank uses. Internal with NCCL's message on failure.
  static Result<std::unique_ptr<NcclStatsCombiner>> Create(const std::string& unique_id, int rank,
                                                           int world, int device);
  virtual ~NcclStatsCombiner() = default;
  // Collective: replaces `stats` by the combination of every rank's.
  virtual Status AllReduce(PassStats& stats) = 0;
};

}  // namespace ckpt::verify
