// What fuzz_rank_file and fuzz_universal share: an HDF5 file of a one-file tag directory
// replaced by the input, its manifest rewritten the way a writer would have recorded it.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <map>
#include <string>

#include "ckpt/env.h"
#include "ckpt/h5.h"  // h5::SealFile: a seed's seal, as its writer records it
#include "ckpt/manifest.h"
#include "fuzz_util.h"

namespace ckpt_fuzz {

// The metadata seal of an HDF5 file (docs/format.md).
struct Seal {
  ckpt::h5::Extents extents;
  std::string xxh3;
};

// The seal of the `size`-byte file at `path`, as its writer recorded it; aborts when it cannot
// be taken (the harness would fuzz nothing).
inline Seal SealOf(const std::string& path, uint64_t size) {
  Seal seal;
  if (!ckpt::h5::SealFile(ckpt::Env::Default(), path, size, &seal.extents, &seal.xxh3).ok())
    std::abort();
  return seal;
}

// dir/manifest.json, parsed; aborts when it does not parse.
inline ckpt::Manifest ReadManifest(const std::string& dir) {
  std::ifstream in(dir + "/manifest.json");
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  auto m = ckpt::ParseManifest(text, "fixture");
  if (!m.ok()) std::abort();
  return *m;
}

// Installs data[0, size) as the file of `fixture`'s first record in the tag directory `dir`,
// and a manifest recording it (SerializeManifest, so `manifest_xxh3` is recomputed and the
// input gets past the manifest): the input's size, no whole-file checksum, and the metadata
// seal of the seed of the same size in `seals` (size -> seal). Inputs that change a seed's
// HDF5 metadata are therefore refused by the seal before libhdf5 parses them; inputs that
// change only raw data reach HDF5 and the readers.
inline void InstallSealed(const std::string& dir, const ckpt::Manifest& fixture,
                          const std::map<uint64_t, Seal>& seals, const uint8_t* data,
                          size_t size) {
  ckpt::Manifest m = fixture;
  ckpt::FileRecord& f = m.files[0];
  WriteFile(dir + "/" + f.path, data, size);
  f.bytes = size;
  f.xxh3 = "";
  auto seal = seals.find(size);
  f.data_extents = seal != seals.end() ? seal->second.extents : ckpt::h5::Extents{};
  f.metadata_xxh3 = seal != seals.end() ? seal->second.xxh3 : "0000000000000000";
  std::ofstream(dir + "/manifest.json", std::ios::trunc) << ckpt::SerializeManifest(m);
}

}  // namespace ckpt_fuzz
