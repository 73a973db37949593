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

// JSON text for a terminal or a pipe (the CLI's --json, the JSON fields inspect and diff
// print): never throws, whatever bytes a string holds (a command must not fail after it has
// published its output). Valid UTF-8 is kept as it is but for the control characters (C0, DEL
// and C1: U+0000-U+001F, U+007F-U+009F), escaped \u00XX, so no string a file holds can drive a
// terminal (an ESC or a C1 CSI); each byte that is not part of valid UTF-8 is escaped \udcXX
// (XX its value), Python's "surrogateescape" (PEP 383): json.loads then os.fsencode() gives
// back the exact bytes. indent < 0: one line, as nlohmann's dump(); else dump(indent)'s layout.
std::string JsonText(const nlohmann::json& j, int indent = -1);

}  // namespace ckpt
