// The one-process-per-device split of `ckpt next-update` (next_update_split.cc), called by the
// single-process path (next_update.cc).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "ckpt/hash.h"
#include "ckpt/state_source.h"
#include "safetensors/safetensors.h"
#include "verify/next_update.h"

namespace ckpt::verify {

// Where path results go, in trainable-parameter order: the digests of path (a)'s weights and
// moments, and with --out the three result files.
struct ResultSinks {
  Xxh3Stream weights, exp_avg, exp_avg_sq;
  std::optional<safetensors::SafetensorsWriter> full, weights_only, moments_dropped;
};

// One process's share of one tensor: elements [begin, end) of trainable parameter `tensor`
// (its index among the trainable parameters, in table order).
struct SplitPiece {
  size_t tensor = 0;
  int64_t begin = 0;
  int64_t end = 0;
};
// Split points inside a tensor fall on multiples of this many elements (a multiple of the
// CPU pass's block), so each piece runs the same blocks as the whole tensor would.
inline constexpr int64_t kSplitAlign = 4096;
// Splits the trainable elements, concatenated in table order, into `world` contiguous ranges
// of about equal size (some may be empty); pieces[r] lists rank r's in order.
std::vector<std::vector<SplitPiece>> SplitElements(const std::vector<int64_t>& numels, int world);

// Runs the pass in `workers` child processes of this program (`ckpt next-update --worker-*`),
// one per GPU (device kCuda; statistics combined with NCCL) or per CPU process (kCpu; combined
// here), and fills r.tensors, r.overall and the sinks exactly as the single-process loop does.
// The children read the checkpoint and `grad_path` themselves. Errors of a child come back
// with its status code and message.
Status RunSplitPass(const NextUpdateOptions& o, StateSource& source,
                    const std::string& grad_path, Device device, int workers, ResultSinks& sinks,
                    NextUpdateReport& r);

}  // namespace ckpt::verify
