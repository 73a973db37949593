// libFuzzer target: ckpt::ParseManifest and ckpt::ParseManifestSummary on arbitrary bytes.
// Properties beyond "no crash, no sanitizer report":
//  - a manifest that parses must survive ManifestToJson -> ParseManifest;
//  - the summary (what listing a root reads) of a manifest that parses succeeds and equals the
//    summary of the parsed manifest; where the whole parse fails, the summary may succeed only
//    on what it does not check (the parameter table, the datasets), never on a bad seal;
//  - a manifest that parses, by simdjson's fast path or not, is the manifest nlohmann's DOM
//    alone (the full parse, ManifestFromJson) builds from the same text;
//  - ManifestJsonText (written without a DOM) is byte for byte ManifestToJson(m).dump().
// Most mutations of a sealed manifest break its seal, which both parsers refuse first; so each
// input that has a top-level manifest_xxh3 is also run re-sealed, as a writer would seal it,
// and reaches the schema checks. The counts ("fuzz_manifest: N inputs, R re-sealed, P parsed
// whole, F by the fast path, S summarized") go to stderr; tools/fuzz.sh requires inputs parsed
// by the fast path.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>

#include "ckpt/hash.h"
#include "ckpt/json.h"
#include "fuzz_util.h"
#include "ckpt/manifest.h"

namespace {

struct Counts {
  unsigned long long inputs = 0, resealed = 0, parsed = 0, fast = 0, summarized = 0;
} counts;

void CheckOne(std::string_view text) {
  const uint64_t fast_before = ckpt::GetManifestParseStats().fast;
  auto m = ckpt::ParseManifest(text, "fuzz/manifest.json");
  const bool fast = ckpt::GetManifestParseStats().fast != fast_before;
  auto s = ckpt::ParseManifestSummary(text, "fuzz/manifest.json");
  if (s.ok()) ++counts.summarized;
  // Whatever the manifest holds reaches a message escaped or not at all.
  ckpt_fuzz::RequireTerminalSafe(m.status());
  ckpt_fuzz::RequireTerminalSafe(s.status());
  if (!m.ok()) {
    // A seal mismatch or invalid JSON is refused by both.
    const std::string why = m.status().message();
    if (s.ok() && (why.find("checksum mismatch") != std::string::npos ||
                   why.find("not valid JSON") != std::string::npos ||
                   why.find("nested deeper") != std::string::npos))
      __builtin_trap();
    return;
  }
  ++counts.parsed;
  if (fast) ++counts.fast;
  // Whichever parser read it, the manifest is the one nlohmann's DOM alone builds.
  auto j = ckpt::ParseJson(text, "fuzz/manifest.json");
  if (!j.ok()) __builtin_trap();
  auto full = ckpt::ManifestFromJson(*j, "fuzz/manifest.json");
  if (!full.ok() || full->version_major != m->version_major ||
      full->version_minor != m->version_minor ||
      ckpt::ManifestToJson(*full).dump() != ckpt::ManifestToJson(*m).dump())
    __builtin_trap();
  if (!s.ok()) __builtin_trap();  // the summary accepts every manifest the parser accepts
  const ckpt::ManifestSummary want = ckpt::SummarizeManifest(*m);
  if (s->tag != want.tag || s->global_step != want.global_step ||
      s->created_unix != want.created_unix || s->dp_world_size != want.dp_world_size ||
      s->bytes != want.bytes || s->sets_latest != want.sets_latest)
    __builtin_trap();
  const std::string again = ckpt::ManifestToJson(*m).dump();
  if (ckpt::ManifestJsonText(*m) != again) __builtin_trap();  // the writer without the DOM
  auto m2 = ckpt::ParseManifest(again, "fuzz/manifest.json (re-serialized)");
  if (!m2.ok()) __builtin_trap();  // a valid manifest must re-serialize to a valid one
  if (m2->params.size() != m->params.size() || m2->files.size() != m->files.size())
    __builtin_trap();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string text(reinterpret_cast<const char*>(data), size);
  ++counts.inputs;
  CheckOne(text);
  const size_t at = ckpt::FindManifestDigest(text);
  if (at != std::string::npos) {
    text.replace(at, ckpt::kDigestPlaceholder.size(), ckpt::kDigestPlaceholder);
    const std::string digest = ckpt::DigestHex(ckpt::Xxh3(text.data(), text.size()));
    text.replace(at, digest.size(), digest);
    ++counts.resealed;
    CheckOne(text);
  }
  if ((counts.inputs & (counts.inputs - 1)) == 0)
    std::fprintf(stderr,
                 "fuzz_manifest: %llu inputs, %llu re-sealed, %llu parsed whole, %llu by the "
                 "fast path, %llu summarized\n",
                 counts.inputs, counts.resealed, counts.parsed, counts.fast, counts.summarized);
  return 0;
}
