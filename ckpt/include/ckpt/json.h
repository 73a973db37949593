// Parsing untrusted JSON (manifests, JSON datasets, safetensors headers) with bounded nesting.
// nlohmann's parser itself is iterative, but dump() (the manifest checksum), comparison and
// destruction recurse per level, so a 100000-deep array in a manifest overflowed the stack.
#pragma once

#include <functional>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "ckpt/status.h"

namespace ckpt {

// Deeper than any JSON ckpt writes (a manifest is 5 levels deep) or a user's client_state
// plausibly needs, far shallower than what exhausts a thread's stack.
inline constexpr int kMaxJsonDepth = 128;

// Parses `text`; DataLoss "<source>: not valid JSON" or "<source>: JSON nested deeper than
// <max_depth> levels" (more than max_depth arrays/objects inside each other; refused while
// parsing, before any recursive walk). Thread-safe.
Result<nlohmann::json> ParseJson(std::string_view text, std::string_view source,
                                 int max_depth = kMaxJsonDepth);

// Whether a member is kept: `depth` is that of the object holding `key` (1: the top object).
using JsonKeyFilter = std::function<bool(int depth, const std::string& key)>;

// ParseJson that stores only the members `keep` accepts (with everything inside them): the
// whole text is still checked as JSON and for depth, but a dropped member's value is never
// built. For reading a few fields of a large document.
Result<nlohmann::json> ParseJsonKeeping(std::string_view text, std::string_view source,
                                        const JsonKeyFilter& keep, int max_depth = kMaxJsonDepth);

}  // namespace ckpt
