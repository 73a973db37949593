// What fuzz_rank_file, fuzz_resealed and fuzz_universal share: an HDF5 file of a one-file tag
// directory replaced by the input, its manifest rewritten the way a writer (or an attacker)
// would have recorded it, and the checkpoint read every way a user reads it.
#pragma once

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <string>
#include <vector>

#include "ckpt/env.h"
#include "ckpt/h5.h"  // h5::SealFile: a seed's seal, as its writer records it
#include "ckpt/manifest.h"
#include "ckpt/reader.h"
#include "ckpt/synth.h"
#include "ckpt/universal.h"
#include "fuzz_util.h"

namespace ckpt_fuzz {

// A one-rank synthetic checkpoint (`compression`: "none" or a zstd setting) written under
// `root`: several chunks and checksummed pieces per tensor. Its tag directory; aborts on
// failure. fuzz_rank_file's and fuzz_resealed's fixture, and how the rank_file seeds were made.
inline std::string WriteRankFixture(const std::string& root, const char* compression) {
  ckpt::SynthOptions o;
  o.ranks = 1;
  o.params = 300;
  o.zero_stage = 2;
  o.chunk_bytes = 256;  // several chunks per tensor
  o.piece_bytes = 64;   // several checksummed pieces per tensor (format 1.3)
  o.compression = ckpt::Compression::Parse(compression).value();
  auto tags = ckpt::WriteSynthetic(root, o);
  if (!tags.ok()) std::abort();
  return root + "/" + tags->front();
}

// The seeds in the rank-file corpus directory `dir`: every .h5 file but crash-* (inputs that
// crashed an earlier reader, kept to replay, not required to load).
inline std::vector<std::filesystem::path> RankSeeds(const std::string& dir) {
  std::vector<std::filesystem::path> seeds;
  for (const auto& e : std::filesystem::directory_iterator(dir))
    if (e.path().extension() == ".h5" && e.path().filename().string().rfind("crash-", 0) != 0)
      seeds.push_back(e.path());
  return seeds;
}

// Aborts, naming the harness and the seed, unless `run` reads every seed completely: proof that
// the harness's inputs reach the readers.
inline void RequireSeedsLoad(const char* harness, const std::vector<std::filesystem::path>& seeds,
                             bool (*run)(const uint8_t*, size_t)) {
  for (const auto& seed : seeds) {
    const std::vector<uint8_t> bytes = ReadFile(seed);
    if (!run(bytes.data(), bytes.size())) {
      std::fprintf(stderr, "%s: seed %s does not load through the harness\n", harness,
                   seed.c_str());
      std::abort();
    }
  }
}

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

// A harness's one-rank checkpoint (WriteRankFixture, uncompressed) in a fresh /tmp/<prefix>-*
// and the seals of the rank-file seeds in `seed_dir`, by size (what InstallSealed records).
struct RankFixture {
  std::string dir;                 // the tag directory
  ckpt::Manifest manifest;         // as written, for patching
  std::map<uint64_t, Seal> seals;  // seed file size -> its seal
};
inline RankFixture MakeRankFixture(const std::string& prefix, const std::string& seed_dir) {
  RankFixture fx;
  fx.dir = WriteRankFixture(TempDir(prefix) + "/root", "none");
  fx.manifest = ReadManifest(fx.dir);
  for (const auto& seed : RankSeeds(seed_dir)) {
    const uint64_t size = std::filesystem::file_size(seed);
    fx.seals[size] = SealOf(seed.string(), size);
  }
  if (fx.seals.empty()) std::abort();
  return fx;
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

// How far ReadRankCheckpoint got.
struct Reached {
  bool past_manifest = false;  // the reader opened the checkpoint
  bool past_seal = false;      // a dataset read was not refused before libhdf5 opened the file
};

// Reads the rank-file checkpoint in the tag directory `dir` every way a user does: checked
// (ckpt::CheckCheckpoint, deep), every dataset whole with its XXH3 (a resume), a middle range
// of every 1-D dataset verified by its pieces (a resharded load), every parameter whole. Every
// error and problem must be terminal-safe (else traps). True when everything read.
inline bool ReadRankCheckpoint(const std::string& dir, Reached* reached) {
  auto problems = ckpt::CheckCheckpoint(dir, /*deep=*/true);
  bool all_ok = problems.ok() && problems->empty();
  // Whatever the file holds reaches a message escaped or not at all.
  RequireTerminalSafe(problems.status());
  if (problems.ok())
    for (const auto& p : *problems)
      if (!TerminalSafe(p.file + p.dataset + p.what)) __builtin_trap();
  auto reader = ckpt::CheckpointReader::Open(dir);
  RequireTerminalSafe(reader.status());
  if (!reader.ok()) return false;
  reached->past_manifest = true;
  for (const auto& file : reader->manifest().files) {
    for (const auto& d : file.datasets) {
      auto bytes = reader->ReadDatasetBytes(file.rank, d.name);
      RequireTerminalSafe(bytes.status());
      all_ok = all_ok && bytes.ok();
      if (bytes.ok() || bytes.status().message().find("not opened") == std::string::npos)
        reached->past_seal = true;
    }
  }
  // Slice reads verify the pieces they touch (format 1.3): a middle range of every 1-D dataset.
  for (const auto& file : reader->manifest().files) {
    for (const auto& d : file.datasets) {
      if (d.shape.size() != 1 || d.shape[0] < 3) continue;
      std::vector<uint8_t> buf(d.bytes);
      const ckpt::Status slice =
          reader->ReadSlice(file.rank, d.name, 1, d.shape[0] - 2, buf.data());
      RequireTerminalSafe(slice);
      all_ok = slice.ok() && all_ok;
    }
  }
  for (const auto& p : reader->manifest().params) {
    auto full = reader->ReadParamFull(p.name);
    RequireTerminalSafe(full.status());
    all_ok = full.ok() && all_ok;
  }
  return all_ok;
}

// How far ReadUniversalCheckpoint got.
struct UniversalReached {
  bool opened = false;    // UniversalReader::Open accepted the directory
  bool verified = false;  // every dataset read whole and verified
};

// Reads the universal checkpoint in `dir` every way a user does: every parameter's every state
// whole and in a middle range (ReadParamRange: hyperslabs, no checksum), every dataset whole
// (ReadDatasetBytes, its XXH3) and verified in bounded memory (VerifyDataset), the two
// agreeing (else traps, as for a message that is not terminal-safe). True when everything read.
inline bool ReadUniversalCheckpoint(const std::string& dir, UniversalReached* reached) {
  auto reader = ckpt::UniversalReader::Open(dir);
  RequireTerminalSafe(reader.status());
  if (!reader.ok()) return false;
  reached->opened = true;
  bool all_ok = true;
  std::vector<float> buf;
  for (const ckpt::ParamEntry& p : reader->manifest().params) {
    if (p.numel < 0 || p.numel > (1 << 20)) continue;
    buf.assign(static_cast<size_t>(p.numel), 0.f);
    for (const char* state : {"master", "exp_avg", "exp_avg_sq"}) {
      if (p.frozen && std::strcmp(state, "master") != 0) continue;
      const ckpt::Status whole = reader->ReadParamRange(p.name, state, 0, p.numel, buf.data());
      RequireTerminalSafe(whole);
      all_ok = whole.ok() && all_ok;
      if (p.numel >= 3) {
        const ckpt::Status mid = reader->ReadParamRange(p.name, state, 1, p.numel - 1, buf.data());
        RequireTerminalSafe(mid);
        all_ok = mid.ok() && all_ok;
      }
    }
  }
  bool verified = true;
  for (const ckpt::DatasetRecord& d : reader->manifest().files[0].datasets) {
    auto bytes = reader->ReadDatasetBytes(d.name);
    RequireTerminalSafe(bytes.status());
    const ckpt::Status v = reader->VerifyDataset(d.name);
    RequireTerminalSafe(v);
    if (bytes.ok() != v.ok()) __builtin_trap();  // both check the same digest
    verified = verified && v.ok();
  }
  reached->verified = verified;
  return verified && all_ok;
}

}  // namespace ckpt_fuzz
