// libFuzzer target: ckpt::ParseManifest on arbitrary bytes. Property beyond "no crash, no
// sanitizer report": a manifest that parses must survive ManifestToJson -> ParseManifest.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "ckpt/manifest.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view text(reinterpret_cast<const char*>(data), size);
  auto m = ckpt::ParseManifest(text, "fuzz/manifest.json");
  if (!m.ok()) return 0;
  const std::string again = ckpt::ManifestToJson(*m).dump();
  auto m2 = ckpt::ParseManifest(again, "fuzz/manifest.json (re-serialized)");
  if (!m2.ok()) __builtin_trap();  // a valid manifest must re-serialize to a valid one
  if (m2->params.size() != m->params.size() || m2->files.size() != m->files.size())
    __builtin_trap();
  return 0;
}
