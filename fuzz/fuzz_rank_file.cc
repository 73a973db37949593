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
#include "fuzz_sealed.h"
#include "fuzz_util.h"

#ifndef CKPT_FUZZ_SEED_DIR
#error "fuzz/build.sh defines CKPT_FUZZ_SEED_DIR (tests/fuzz/corpus/rank_file)"
#endif

namespace {

struct Counts {
  uint64_t inputs = 0, past_manifest = 0, past_seal = 0;
} counts;

const ckpt_fuzz::RankFixture& GetFixture() {
  static const ckpt_fuzz::RankFixture f =
      ckpt_fuzz::MakeRankFixture("fuzz-rank", CKPT_FUZZ_SEED_DIR);
  return f;
}

// Installs `data` as rank 0's file with a manifest recording it; reads everything.
// Returns true when every read succeeded.
bool RunOne(const uint8_t* data, size_t size) {
  const ckpt_fuzz::RankFixture& fx = GetFixture();
  ckpt_fuzz::InstallSealed(fx.dir, fx.manifest, fx.seals, data, size);  // rank_00000.h5

  ++counts.inputs;
  ckpt_fuzz::Reached reached;
  const bool all_ok = ckpt_fuzz::ReadRankCheckpoint(fx.dir, &reached);
  if (reached.past_manifest) ++counts.past_manifest;
  if (reached.past_seal) ++counts.past_seal;
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
      const std::string dir = ckpt_fuzz::WriteRankFixture(std::string(base) + "/root", c);
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
  ckpt_fuzz::RequireSeedsLoad("fuzz_rank_file", ckpt_fuzz::RankSeeds(CKPT_FUZZ_SEED_DIR), RunOne);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  RunOne(data, size);
  return 0;
}
