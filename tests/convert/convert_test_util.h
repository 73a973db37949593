// Helpers shared by the convert tests: synthetic checkpoints and dataset comparison.
#pragma once

#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "ckpt/reader.h"
#include "ckpt/synth.h"

namespace ckpt::testing {

// A small synthetic checkpoint (tied embedding, bf16 frozen table, odd-sized last block) at
// root/global_step100.
inline Status MakeSynthetic(const std::string& root, int ranks, int zero, int64_t params = 5000,
                            int64_t largest = 1100, const std::string& compress = "none") {
  SynthOptions o;
  o.ranks = ranks;
  o.zero_stage = zero;
  o.params = params;
  o.largest_tensor = largest;
  o.seed = 7;
  o.piece_bytes = 256;  // many pieces per dataset, so slice reads verify partial ranges
  auto c = Compression::Parse(compress);
  if (!c.ok()) return c.status();
  o.compression = *c;
  auto tags = WriteSynthetic(root, o);
  return tags.ok() ? Status::Ok() : tags.status();
}

// Files and directories directly in `dir` whose names start with ".tmp-".
inline int CountTemp(const std::string& dir) {
  int n = 0;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec))
    if (e.path().filename().string().rfind(".tmp-", 0) == 0) ++n;
  return n;
}

// Rewrites a manifest after a test edited its JSON: validates it (its stale self-checksum is not
// checked here) and writes it back with a fresh one (ckpt::SerializeManifest).
inline Status RewriteManifest(const std::string& path, nlohmann::json j) {
  auto m = ManifestFromJson(j, path);
  if (!m.ok()) return m.status();
  return WriteFileAtomic(Env::Default(), path, SerializeManifest(*m, 2));
}

inline bool EmptyOrMissing(const std::string& dir) {
  std::error_code ec;
  return !std::filesystem::exists(dir, ec) || std::filesystem::is_empty(dir, ec);
}

}  // namespace ckpt::testing
