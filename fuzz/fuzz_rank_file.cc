// libFuzzer target: the rank-file reader. A one-rank synthetic checkpoint is written once at
// start-up; each input replaces its rank_00000.h5 and the manifest is rewritten to match the way
// a writer would have recorded it (SerializeManifest, so `manifest_xxh3` is recomputed and the
// input gets past the manifest): the input's size, no whole-file checksum, and the metadata
// seal (docs/format.md) of the committed seed file of the same size, as the seeds'
// writer recorded it. Inputs that change a seed's HDF5 metadata are therefore refused by the
// seal before libhdf5 parses them, as in a real checkpoint; inputs that change only raw data
// (contiguous regions, compressed chunks) reach HDF5, the zstd filter and our readers. Then the
// checkpoint is checked (ckpt::CheckCheckpoint, deep) and read the way a resume does (every
// dataset whole, with its XXH3; every parameter) and the way a resharded load does (a slice of
// every 1-D dataset, verified by its pieces). Any outcome but a crash or a sanitizer
// report is fine: corrupt input must come back as an error value.
//
// The harness asserts that it reaches the reader: the seeds themselves must load completely
// (checked at start-up), and it prints, at every power of two, how many inputs got past the
// manifest and past the seal ("fuzz_rank_file: N inputs, M past the manifest, K past the
// metadata seal"), which tools/fuzz.sh requires to be non-zero.
//
// CKPT_FUZZ_WRITE_SEEDS=DIR writes the fixture's rank file (uncompressed and zstd) into DIR
// and exits: how tests/fuzz/corpus/rank_file/none.h5 and zstd.h5 were made
// (`CKPT_FUZZ_WRITE_SEEDS=tests/fuzz/corpus/rank_file build-fuzz/bin/fuzz_rank_file`).
// none_chunked_legacy.h5 is an uncompressed file from before the contiguous layout (chunked
// tensors), which readers still accept. crash-*.h5 are inputs that crashed an earlier reader.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <string>
#include <vector>

#include "ckpt/env.h"
#include "ckpt/manifest.h"
#include "ckpt/reader.h"
#include "ckpt/synth.h"
#include "fuzz_sealed.h"
#include "fuzz_util.h"

#ifndef CKPT_FUZZ_SEED_DIR
#error "fuzz/build.sh defines CKPT_FUZZ_SEED_DIR (tests/fuzz/corpus/rank_file)"
#endif

namespace {

struct Fixture {
  std::string dir;                    // the tag directory
  ckpt::Manifest manifest;            // as written, for patching
  std::map<uint64_t, ckpt_fuzz::Seal> seals;  // seed file size -> its seal
};

struct Counts {
  uint64_t inputs = 0, past_manifest = 0, past_seal = 0;
} counts;

std::string WriteRoot(const std::string& root, const char* compression) {
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

const Fixture& GetFixture() {
  static const Fixture f = [] {
    const std::string base = ckpt_fuzz::TempDir("fuzz-rank");
    Fixture fx;
    fx.dir = WriteRoot(base + "/root", "none");
    fx.manifest = ckpt_fuzz::ReadManifest(fx.dir);
    for (const auto& e : std::filesystem::directory_iterator(CKPT_FUZZ_SEED_DIR)) {
      if (e.path().extension() != ".h5" || e.path().filename().string().rfind("crash-", 0) == 0)
        continue;
      const uint64_t size = std::filesystem::file_size(e.path());
      fx.seals[size] = ckpt_fuzz::SealOf(e.path().string(), size);
    }
    if (fx.seals.empty()) std::abort();
    return fx;
  }();
  return f;
}

// Installs `data` as rank 0's file with a manifest recording it; reads everything.
// Returns true when every read succeeded.
bool RunOne(const uint8_t* data, size_t size) {
  const Fixture& fx = GetFixture();
  ckpt_fuzz::InstallSealed(fx.dir, fx.manifest, fx.seals, data, size);  // rank_00000.h5

  ++counts.inputs;
  auto problems = ckpt::CheckCheckpoint(fx.dir, /*deep=*/true);
  bool all_ok = problems.ok() && problems->empty();
  // Whatever the file holds reaches a message escaped or not at all.
  ckpt_fuzz::RequireTerminalSafe(problems.status());
  if (problems.ok())
    for (const auto& p : *problems)
      if (!ckpt_fuzz::TerminalSafe(p.file + p.dataset + p.what)) __builtin_trap();
  auto reader = ckpt::CheckpointReader::Open(fx.dir);
  ckpt_fuzz::RequireTerminalSafe(reader.status());
  if (reader.ok()) {
    ++counts.past_manifest;
    bool past_seal = false;
    for (const auto& file : reader->manifest().files) {
      for (const auto& d : file.datasets) {
        auto bytes = reader->ReadDatasetBytes(file.rank, d.name);
        ckpt_fuzz::RequireTerminalSafe(bytes.status());
        all_ok = all_ok && bytes.ok();
        if (bytes.ok() || bytes.status().message().find("not opened") == std::string::npos)
          past_seal = true;
      }
    }
    if (past_seal) ++counts.past_seal;
    // Slice reads verify the pieces they touch (format 1.3): a middle range of every 1-D
    // dataset.
    for (const auto& file : reader->manifest().files) {
      for (const auto& d : file.datasets) {
        if (d.shape.size() != 1 || d.shape[0] < 3) continue;
        std::vector<uint8_t> buf(d.bytes);
        const ckpt::Status slice =
            reader->ReadSlice(file.rank, d.name, 1, d.shape[0] - 2, buf.data());
        ckpt_fuzz::RequireTerminalSafe(slice);
        all_ok = slice.ok() && all_ok;
      }
    }
    for (const auto& p : reader->manifest().params) {
      auto full = reader->ReadParamFull(p.name);
      ckpt_fuzz::RequireTerminalSafe(full.status());
      all_ok = full.ok() && all_ok;
    }
  } else {
    all_ok = false;
  }
  if ((counts.inputs & (counts.inputs - 1)) == 0)
    std::fprintf(stderr, "fuzz_rank_file: %llu inputs, %llu past the manifest, %llu past the "
                 "metadata seal\n", static_cast<unsigned long long>(counts.inputs),
                 static_cast<unsigned long long>(counts.past_manifest),
                 static_cast<unsigned long long>(counts.past_seal));
  // A harness that stops reaching the reader is broken, not lucky.
  if (counts.inputs == 4096 && counts.past_seal == 0) __builtin_trap();
  return all_ok;
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  if (const char* out = std::getenv("CKPT_FUZZ_WRITE_SEEDS")) {
    std::filesystem::create_directories(out);
    for (const char* c : {"none", "zstd:1"}) {
      char tmpl[] = "/tmp/fuzz-seed-XXXXXX";
      const char* base = mkdtemp(tmpl);
      if (!base) std::abort();
      const std::string dir = WriteRoot(std::string(base) + "/root", c);
      std::filesystem::copy_file(dir + "/rank_00000.h5",
                                 std::string(out) + "/" + (c[0] == 'n' ? "none" : "zstd") + ".h5",
                                 std::filesystem::copy_options::overwrite_existing);
      std::filesystem::remove_all(base);
    }
    std::exit(0);
  }
  GetFixture();
  // Every seed must load completely through the patched manifest: proof that inputs reach the
  // rank-file reader and HDF5.
  for (const auto& e : std::filesystem::directory_iterator(CKPT_FUZZ_SEED_DIR)) {
    if (e.path().extension() != ".h5" || e.path().filename().string().rfind("crash-", 0) == 0)
      continue;
    const std::vector<uint8_t> bytes = ckpt_fuzz::ReadFile(e.path());
    if (!RunOne(bytes.data(), bytes.size())) {
      std::fprintf(stderr, "fuzz_rank_file: seed %s does not load through the harness\n",
                   e.path().c_str());
      std::abort();
    }
  }
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  RunOne(data, size);
  return 0;
}
