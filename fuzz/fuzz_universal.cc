// libFuzzer target: the universal-layout reader (ckpt::UniversalReader), which reads
// universal.h5 through the same seal, link and storage checks as a rank file but its own
// reads. The universal tag directory tests/fuzz/universal_fixture/ (`ckpt to-universal` of
// `ckpt synth R --ranks 2 --params 300 --zero 2`) is copied at start-up; each input replaces
// its universal.h5 and the manifest is rewritten to match the way a writer would have recorded
// it (SerializeManifest, so `manifest_xxh3` is recomputed): the input's size, no whole-file
// checksum, and the metadata seal of the seed of the same size. Inputs that change a seed's
// HDF5 metadata are refused by the seal before libhdf5 parses them; inputs that change only
// raw data reach HDF5 and the reader. Then every parameter's every state is read whole and in
// a middle range (ReadParamRange: hyperslabs, no checksum), every dataset whole
// (ReadDatasetBytes, its XXH3) and in bounded memory (VerifyDataset). Any outcome but a crash,
// a sanitizer report or a message that prints the input's bytes raw (ckpt_fuzz::TerminalSafe)
// is fine; a dataset whose bytes changed must not read back as verified.
//
// The harness asserts that it reaches the reader: the seed must load completely (checked at
// start-up), and it prints, at every power of two, how many inputs got past the metadata seal,
// how many of those differ from the seed, and how many read every dataset verified
// ("fuzz_universal: N inputs, K past the metadata seal, C of them changed, V read whole"):
// tools/fuzz.sh requires C to be non-zero (the seed alone passes; a changed file past the seal
// shows mutations reach HDF5 and the reads).
#include <cstddef>
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
#include "ckpt/manifest.h"
#include "ckpt/universal.h"
#include "fuzz_sealed.h"
#include "fuzz_util.h"

#ifndef CKPT_FUZZ_UNIVERSAL_FIXTURE
#error "fuzz/build.sh defines CKPT_FUZZ_UNIVERSAL_FIXTURE (tests/fuzz/universal_fixture)"
#endif

namespace {

struct Fixture {
  std::string dir;                 // the copied tag directory
  ckpt::Manifest manifest;         // as the fixture records it, for patching
  std::map<uint64_t, ckpt_fuzz::Seal> seals;  // seed file size -> its seal
  std::vector<uint8_t> seed;       // the fixture's universal.h5
};

struct Counts {
  unsigned long long inputs = 0, past_seal = 0, changed = 0, read_whole = 0;
} counts;

const Fixture& GetFixture() {
  static const Fixture f = [] {
    Fixture fx;
    fx.dir = ckpt_fuzz::TempDir("fuzz-universal") + "/tag";
    std::filesystem::copy(CKPT_FUZZ_UNIVERSAL_FIXTURE, fx.dir);
    fx.manifest = ckpt_fuzz::ReadManifest(fx.dir);
    if (fx.manifest.kind != "universal" || fx.manifest.files.size() != 1) std::abort();
    const std::string seed = fx.dir + "/universal.h5";
    fx.seed = ckpt_fuzz::ReadFile(seed);
    const ckpt_fuzz::Seal seal = ckpt_fuzz::SealOf(seed, fx.seed.size());
    if (seal.xxh3 != fx.manifest.files[0].metadata_xxh3) std::abort();  // the writer's seal
    fx.seals[fx.seed.size()] = seal;
    return fx;
  }();
  return f;
}

// Installs `data` as universal.h5 with a manifest recording it; reads everything. True when
// every read succeeded.
bool RunOne(const uint8_t* data, size_t size) {
  const Fixture& fx = GetFixture();
  ckpt_fuzz::InstallSealed(fx.dir, fx.manifest, fx.seals, data, size);  // universal.h5

  ++counts.inputs;
  ckpt_fuzz::UniversalReached reached;
  const bool all_ok = ckpt_fuzz::ReadUniversalCheckpoint(fx.dir, &reached);
  if (reached.opened) {
    ++counts.past_seal;
    if (size != fx.seed.size() || std::memcmp(data, fx.seed.data(), size) != 0) ++counts.changed;
  }
  if (reached.verified) {
    ++counts.read_whole;
    // Every dataset verified: the input may differ from the seed only outside the datasets'
    // bytes (HDF5's free space, padding). Equal sizes keep the seal; the data regions are
    // what the datasets hold, so their bytes must be the seed's.
    if (size == fx.seed.size())
      for (const auto& [at, n] : fx.seals.at(size).extents)
        if (at + n <= size && std::memcmp(data + at, fx.seed.data() + at, n) != 0) __builtin_trap();
  }
  if ((counts.inputs & (counts.inputs - 1)) == 0)
    std::fprintf(stderr,
                 "fuzz_universal: %llu inputs, %llu past the metadata seal, %llu of them changed, "
                 "%llu read whole\n",
                 counts.inputs, counts.past_seal, counts.changed, counts.read_whole);
  // A harness that stops reaching the reader is broken, not lucky.
  if (counts.inputs == 4096 && counts.past_seal == 0) __builtin_trap();
  return all_ok;
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  const Fixture& fx = GetFixture();
  // The seed must load completely through the patched manifest: proof that inputs reach the
  // reader.
  if (!RunOne(fx.seed.data(), fx.seed.size())) {
    std::fprintf(stderr, "fuzz_universal: the fixture does not load through the harness\n");
    std::abort();
  }
  counts = Counts{};  // the reports count the fuzzer's inputs only
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  RunOne(data, size);
  return 0;
}
