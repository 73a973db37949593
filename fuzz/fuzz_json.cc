// libFuzzer target: ckpt::ParseJson, the bounded-depth parser every untrusted JSON goes through
// (manifests, JSON datasets, safetensors headers). Properties beyond "no crash, no sanitizer
// report": whatever parses is no deeper than kMaxJsonDepth, and its dump() (what the manifest
// checksum walks, recursively) re-parses to the same value. The seeds include a manifest with
// a 100000-deep array appended, which overflowed the stack before the limit.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "ckpt/json.h"
#include "fuzz_util.h"

namespace {

int Depth(const nlohmann::json& j, int limit) {
  if (limit < 0 || !j.is_structured()) return 0;
  int deepest = 0;
  for (const auto& v : j) {
    const int d = Depth(v, limit - 1);
    if (d > deepest) deepest = d;
  }
  return deepest + 1;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  auto j = ckpt::ParseJson(text, "fuzz");
  ckpt_fuzz::RequireTerminalSafe(j.status());
  if (!j.ok()) return 0;
  // The terminal's JSON printer: one printable line whatever the strings hold, the same value.
  const std::string shown = ckpt::JsonText(*j);
  if (!ckpt_fuzz::TerminalSafe(shown) || shown.find('\n') != std::string::npos) __builtin_trap();
  auto back = ckpt::ParseJson(shown, "fuzz (JsonText)");
  if (!back.ok() || *back != *j) __builtin_trap();
  // Depth counts nested arrays and objects: at most kMaxJsonDepth levels are accepted.
  if (Depth(*j, ckpt::kMaxJsonDepth + 1) > ckpt::kMaxJsonDepth) __builtin_trap();
  const std::string again = j->dump();
  auto j2 = ckpt::ParseJson(again, "fuzz (re-serialized)");
  if (!j2.ok() || *j2 != *j) __builtin_trap();
  return 0;
}
