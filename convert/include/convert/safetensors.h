// The safetensors reader and writers live in their own library below convert
// (safetensors/safetensors.h, target ckpt_safetensors); their names stay visible as
// ckpt::convert::* for the converters and their callers.
#pragma once

#include "safetensors/safetensors.h"

namespace ckpt::convert {
using namespace ::ckpt::safetensors;  // NOLINT: the converters' vocabulary
}  // namespace ckpt::convert
