// The time a manifest records as created_utc / created_unix (docs/format.md).
#pragma once

#include <cstdint>
#include <string>

namespace ckpt {

// Now, as "YYYY-MM-DDTHH:MM:SSZ" (UTC, whole seconds); `unix_seconds` (may be null) receives
// the same instant as seconds since the epoch. Thread-safe.
std::string UtcNow(int64_t* unix_seconds);

}  // namespace ckpt
