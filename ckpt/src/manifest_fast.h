// The manifest parser's fast path (issue 19: what a load pays before its first byte). Private to
// the format library (manifest.cc).
//
// A ZeRO-3 manifest holds a record per parameter and rank: 4.5 MB for 4884 parameters over 8
// ranks, where nlohmann's DOM took 70 ms to parse, convert and free (140 ms in a fresh process),
// paid by every rank process of a load. simdjson parses the same bytes in 3 ms and the records
// are read from its tape straight into the structs.
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "ckpt/manifest.h"
#include "ckpt/status.h"

namespace ckpt::internal {

// The manifest of `text` as ManifestFromJson builds it (before the rank-file count and
// ValidateManifest, which the caller applies to both paths), for the common case only: a
// sealed manifest of this major version (1.1 or later, its manifest_xxh3 matching the bytes)
// that simdjson parses within 64 levels and whose every field has the type and range the full
// parse wants. nullopt for anything else; the caller's nlohmann path then decides, so an
// error's message is always the full parse's.
//
// Where the two JSON parsers could differ they give way: simdjson refuses what nlohmann would
// read as a float (integers past 64 bits) and a byte-order mark, both left to nlohmann. One
// difference is let through, in the free-form members (optimizer, dtypes, client_state,
// engine_config): a "-0" is stored as an unsigned 0, where nlohmann keeps a signed 0 (the same
// value, compared and written the same).
std::optional<Manifest> ParseManifestFast(std::string_view text);

// ParseManifestSummary's summary of `text` from the fields it needs alone (the whole text still
// parsed as JSON, the seal checked), under the same conditions as ParseManifestFast; nullopt for
// anything else, which the caller's nlohmann path then summarizes or refuses.
std::optional<ManifestSummary> SummarizeManifestFast(std::string_view text);

// a + b, or the largest uint64_t when that overflows (a summary's total bytes).
uint64_t AddSaturating(uint64_t a, uint64_t b);

// The string value of the top-level "kind" of a manifest's text ("" when the text is not an
// object or its "kind" is missing or not a string); nullopt when simdjson refuses the text (the
// caller asks nlohmann, which reads a byte-order mark and integers past 64 bits).
std::optional<std::string> ManifestKind(std::string_view text);

// While one lives, this thread's ParseManifestFast calls share one simdjson parser and one
// padded copy of the text, and keep their memory, instead of allocating (and faulting in) both
// for each manifest: ListTags reads every tag's manifest of a root. Nests; not copyable.
class KeepManifestParser {
 public:
  KeepManifestParser();
  ~KeepManifestParser();
  KeepManifestParser(const KeepManifestParser&) = delete;
  KeepManifestParser& operator=(const KeepManifestParser&) = delete;

 private:
  bool owner_ = false;
};

// Whether the manifest_xxh3 of `text` matches its bytes (the top-level digest read as '0's).
// DataLoss naming `source` otherwise.
Status VerifyManifestBytes(std::string_view text, std::string_view source);

}  // namespace ckpt::internal
