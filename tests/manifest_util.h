// Test helpers that edit a checkpoint as a writer (or an attacker) would and seal its manifest
// again, so that the edit reaches the checks behind the manifest's checksum instead of being
// refused by it. One copy for every suite (tests/ is on every test's include path).
#pragma once

#include <catch2/catch.hpp>

#include <filesystem>
#include <map>
#include <string>

#include <nlohmann/json.hpp>

#include "ckpt/hash.h"
#include "ckpt/manifest.h"
#include "test_util.h"

namespace ckpt::testing {

// A manifest's text with its manifest_xxh3 recomputed over the bytes as they are, those 16
// characters read as '0' (also for edits nlohmann cannot make: duplicate keys, a byte-order
// mark, a "-0").
inline std::string Resealed(std::string text) {
  const size_t at = FindManifestDigest(text);
  REQUIRE(at != std::string::npos);
  text.replace(at, kDigestPlaceholder.size(), kDigestPlaceholder);
  const std::string digest = DigestHex(Xxh3(text.data(), text.size()));
  text.replace(at, digest.size(), digest);
  return text;
}

// An edited manifest's JSON, sealed as format 1.1 and later seal it, whatever it holds (a
// manifest ckpt's own types would refuse to represent too).
inline std::string SealedText(nlohmann::json j) {
  j["manifest_xxh3"] = std::string(kDigestPlaceholder);
  return Resealed(j.dump(1) + "\n");
}

// After file `index` of the manifest in `dir` (a tag or universal directory) was edited in
// place: records the file's size and whole-file XXH3, and for each dataset named in `digests`
// the XXH3 of the bytes it now reads; drops the metadata seal (as files before format 1.2 have
// none) and seals the manifest again. The edit is then judged by the checks behind the seals.
inline void ResealFile(const std::string& dir, size_t index,
                       const std::map<std::string, std::string>& digests = {}) {
  auto m = ParseManifest(Slurp(dir + "/manifest.json"), dir);
  REQUIRE(m.ok());
  REQUIRE(index < m->files.size());
  FileRecord& f = m->files[index];
  const std::string path = dir + "/" + f.path;
  f.bytes = std::filesystem::file_size(path);
  auto whole = Xxh3FileHex(path);
  REQUIRE(whole.ok());
  f.xxh3 = *whole;
  f.data_extents.clear();
  f.metadata_xxh3.clear();
  for (auto& d : f.datasets) {
    auto it = digests.find(d.name);
    if (it != digests.end()) d.xxh3 = DigestHex(Xxh3(it->second.data(), it->second.size()));
  }
  Spit(dir + "/manifest.json", SerializeManifest(*m));
}

}  // namespace ckpt::testing
