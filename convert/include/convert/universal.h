// `ckpt to-universal`: writes a universal checkpoint, the topology-free copy of the full training
// state that ckpt/universal.h describes and reads (docs/convert.md, "Universal layout", is the
// normative spec).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ckpt/env.h"
#include "ckpt/status.h"
#include "ckpt/universal.h"

namespace ckpt::convert {

struct ToUniversalOptions {
  std::string tag;        // empty: what `latest` names (or the directory itself)
  Env* env = nullptr;     // nullptr: Env::Default()
  bool progress = false;  // progress bar on a TTY
};

struct ToUniversalReport {
  std::string source_dir;  // the tag directory read
  std::string out;
  std::string tag;
  int source_ranks = 0;
  int64_t params_written = 0;        // parameter groups
  uint64_t bytes_read = 0;           // data bytes read from the source
  uint64_t file_bytes = 0;           // size of universal.h5
  std::vector<std::string> skipped;  // source datasets not carried over (e.g. compute copies)
};

// Converts the checkpoint at `src` (a root, with opts.tag or `latest`, or a tag directory; a
// universal checkpoint is accepted too) into a universal checkpoint at `out`, which must not
// exist or be empty. Reads each source dataset once, in order, and checks its XXH3 while
// streaming; memory is bounded by a 4 Mi-element buffer. Output appears atomically
// (convert/output_dir.h). Errors: NotFound / Unimplemented / DataLoss from the source,
// AlreadyExists for a non-empty `out`, IOError from the file system.
Result<ToUniversalReport> ConvertToUniversal(const std::string& src, const std::string& out,
                                             const ToUniversalOptions& opts = {});

}  // namespace ckpt::convert
