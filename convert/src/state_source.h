// One read interface over a sharded checkpoint (CheckpointReader) and a universal one
// (UniversalReader), so export, to-universal and reshard read either.
//
// Streaming verification: a source opened with stream_verify hashes what it reads. Reads of a
// dataset that arrive in increasing offset order (export and to-universal read parameters in
// table order, which is shard order for every partition scheme) are hashed as they pass, with
// the padding between them read and hashed too; FinishVerification() reads the remaining tail
// and compares each digest with the manifest, and streams every dataset that was read out of
// order or not at all. So each byte is read once and still checked.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "ckpt/env.h"
#include "ckpt/manifest.h"
#include "ckpt/status.h"

namespace ckpt::convert {

// A blob or json dataset of one source rank (RNG state, data position, scheduler, ...).
struct RankExtra {
  std::string name;      // name in the rank file, e.g. "rng/dropout", "data_position"
  DatasetRecord record;  // as listed in the manifest (record.name is the source path)
};

class StateSource {
 public:
  virtual ~StateSource() = default;
  virtual const Manifest& manifest() const = 0;
  virtual const std::string& dir() const = 0;
  virtual bool universal() const = 0;
  // Ranks of the topology that wrote the per-rank state.
  virtual int source_ranks() const = 0;

  // fp32 elements [begin, end) of a trainable parameter's state, or of a frozen parameter's
  // master (converted from its stored dtype). `p` must be from manifest().params.
  virtual Status ReadParamRange(const ParamEntry& p, std::string_view state, int64_t begin,
                                int64_t end, float* out) = 0;
  // A frozen parameter's stored bytes (dtype p.dtype, shape p.shape), checksum-verified.
  virtual Result<std::vector<uint8_t>> ReadFrozenBytes(const ParamEntry& p) = 0;
  // Blob and json datasets of source rank r.
  virtual std::vector<RankExtra> RankExtras(int r) const = 0;
  virtual Result<std::vector<uint8_t>> ReadRankExtra(int r, const RankExtra& extra) = 0;
  // Tensor datasets of the source that no reader of parameter state uses (e.g. "compute").
  virtual std::vector<std::string> UnusedTensors() const = 0;
  // Checks the XXH3 of every dataset holding `states` of trainable parameters (see above).
  virtual Status FinishVerification(const std::vector<std::string>& states) = 0;
  virtual uint64_t bytes_read() const = 0;
};

// Opens `path` (root + tag or `latest`, or a tag directory) as sharded or universal.
Result<std::unique_ptr<StateSource>> OpenStateSource(const std::string& path,
                                                     const std::string& tag, bool stream_verify,
                                                     Env* env);

}  // namespace ckpt::convert
