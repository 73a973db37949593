// The hyper-parameters of the next update, shared by the single-process pass
// (next_update.cc) and the workers of a split run (next_update_split.cc).
#pragma once

#include <string>

#include "ckpt/adamw.h"
#include "ckpt/reader.h"
#include "ckpt/status.h"

namespace ckpt::verify {

// The hyper-parameters of the next update (docs/verify.md, "The hyper-parameters"); `source`
// (may be null) receives where lr and step came from. Unimplemented: not AdamW, or optimizer
// groups with different settings; DataLoss: values out of range or an unreadable scheduler.
Result<AdamWHyper> ResolveHyper(const CheckpointReader& reader, std::string* source);

}  // namespace ckpt::verify
