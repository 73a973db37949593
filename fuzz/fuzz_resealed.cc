// libFuzzer target: rank files and universal files sealed again as an attacker would, behind
// the HDF5 probe. The metadata seal refuses a file whose HDF5 structure differs from what its
// manifest records, so fuzz_rank_file's and fuzz_universal's changed structures never reach
// libhdf5; but whoever hands over a checkpoint writes its manifest too, and can seal any
// structure. Here each input replaces rank_00000.h5 of the same one-rank synthetic checkpoint
// as fuzz_rank_file's, and universal.h5 of a copy of fuzz_universal's fixture (a hard link to
// the same file), and is handled as a reader handles a hostile file: the probe (this
// executable, `__h5-probe FILE`, set as the CLI sets itself) walks it in a process of its own
// first; only a file it walked is then sealed in this process (h5::SealFile: libhdf5 opens it
// here), recorded in both manifests with its own seal, and read every way fuzz_rank_file and
// fuzz_universal read their checkpoints (with the probe set, as the CLI runs). A crash or
// sanitizer report in this process is a finding: libhdf5 failed here on a structure the probe
// walked (the probe's walk misses what a reader does). A probe that crashes, hangs (5 s here)
// or fails refuses the input: that is the probe working, counted.
//
// The harness asserts that it reaches the readers: the seeds (the rank-file corpus and the
// universal fixture's file) must load completely (checked at start-up), and it prints, at
// every power of two, how many inputs the probe refused (and of those, how many crashed it),
// how many it walked, how many of those carried a structure no seed has and were read past the
// seal, and how many opened as a universal checkpoint ("fuzz_resealed: N inputs, R refused by
// the probe (C crashed it), W walked, S changed structures read (U universal)"): tools/fuzz.sh
// requires S to be non-zero.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "ckpt/env.h"
#include "ckpt/h5.h"
#include "ckpt/manifest.h"
#include "ckpt/reader.h"
#include "fuzz_sealed.h"
#include "fuzz_util.h"

#ifndef CKPT_FUZZ_SEED_DIR
#error "fuzz/build.sh defines CKPT_FUZZ_SEED_DIR (tests/fuzz/corpus/rank_file)"
#endif
#ifndef CKPT_FUZZ_UNIVERSAL_FIXTURE
#error "fuzz/build.sh defines CKPT_FUZZ_UNIVERSAL_FIXTURE (tests/fuzz/universal_fixture)"
#endif

namespace {

struct Counts {
  unsigned long long inputs = 0, refused = 0, crashed = 0, walked = 0, changed_read = 0,
                     universal = 0;
} counts;

// The rank-file fixture of fuzz_rank_file, and beside it a copy of the universal fixture whose
// universal.h5 is a hard link to the rank file: each input is both, probed once.
struct Fixture {
  ckpt_fuzz::RankFixture rank;
  std::string rank_file;  // the input's path in the tag directory
  std::string universal;  // the universal directory
  ckpt::Manifest universal_manifest;
  ckpt_fuzz::Seal universal_seal;  // the universal seed's, to tell a changed structure
};

const Fixture& GetFixture() {
  static const Fixture f = [] {
    Fixture fx;
    fx.rank = ckpt_fuzz::MakeRankFixture("fuzz-resealed", CKPT_FUZZ_SEED_DIR);
    fx.rank_file = fx.rank.dir + "/" + fx.rank.manifest.files[0].path;
    fx.universal = std::filesystem::path(fx.rank.dir).parent_path().parent_path() / "universal";
    std::filesystem::copy(CKPT_FUZZ_UNIVERSAL_FIXTURE, fx.universal);
    fx.universal_manifest = ckpt_fuzz::ReadManifest(fx.universal);
    const std::string file = fx.universal + "/" + fx.universal_manifest.files[0].path;
    fx.universal_seal = ckpt_fuzz::SealOf(file, std::filesystem::file_size(file));
    std::filesystem::remove(file);
    std::filesystem::create_hard_link(fx.rank_file, file);
    return fx;
  }();
  return f;
}

// `m` with its first file recorded as `size` bytes sealed by `seal`, written to dir/manifest.json.
void WriteManifest(const std::string& dir, ckpt::Manifest m, uint64_t size,
                   const ckpt_fuzz::Seal& seal) {
  ckpt::FileRecord& f = m.files[0];
  f.bytes = size;
  f.xxh3 = "";
  f.data_extents = seal.extents;
  f.metadata_xxh3 = seal.xxh3;
  std::ofstream(dir + "/manifest.json", std::ios::trunc) << ckpt::SerializeManifest(m);
}

// Seals the walked input as its writer (or an attacker) seals a file (libhdf5 opens it in this
// process for the first time, after the probe walked it), records it in both manifests and
// reads both checkpoints. True when every read of either succeeded.
bool ReadBoth(const Fixture& fx, size_t size) {
  ckpt_fuzz::Seal seal;
  if (!ckpt::h5::SealFile(ckpt::Env::Default(), fx.rank_file, size, &seal.extents, &seal.xxh3)
           .ok())
    return false;
  WriteManifest(fx.rank.dir, fx.rank.manifest, size, seal);
  WriteManifest(fx.universal, fx.universal_manifest, size, seal);
  const auto seed = fx.rank.seals.find(size);
  const bool changed = seed == fx.rank.seals.end() || seed->second.xxh3 != seal.xxh3 ||
                       seed->second.extents != seal.extents;
  ckpt_fuzz::Reached rank;
  const bool rank_ok = ckpt_fuzz::ReadRankCheckpoint(fx.rank.dir, &rank);
  ckpt_fuzz::UniversalReached universal;
  const bool universal_ok = ckpt_fuzz::ReadUniversalCheckpoint(fx.universal, &universal);
  if (universal.opened) ++counts.universal;
  const bool universal_changed =
      seal.xxh3 != fx.universal_seal.xxh3 || seal.extents != fx.universal_seal.extents;
  if ((changed && rank.past_seal) || (universal_changed && universal.opened))
    ++counts.changed_read;
  return rank_ok || universal_ok;
}

// Installs `data` as rank 0's file (and universal.h5), probed, then sealed as it is; reads
// both checkpoints. True when every read of either succeeded.
bool RunOne(const uint8_t* data, size_t size) {
  const Fixture& fx = GetFixture();
  ckpt_fuzz::WriteFile(fx.rank_file, data, size);
  ++counts.inputs;
  bool all_ok = false;
  // The input is rewritten in place, faster than its modification time may move.
  ckpt::h5::ForgetProbedFiles();
  const ckpt::Status probed = ckpt::h5::ProbeStructure(fx.rank_file, "rank_00000.h5");
  ckpt_fuzz::RequireTerminalSafe(probed);
  if (!probed.ok()) {
    ++counts.refused;
    if (probed.message().find("libhdf5 crashed") != std::string::npos) ++counts.crashed;
  } else {
    ++counts.walked;
    all_ok = ReadBoth(fx, size);
  }
  if ((counts.inputs & (counts.inputs - 1)) == 0)
    std::fprintf(stderr,
                 "fuzz_resealed: %llu inputs, %llu refused by the probe (%llu crashed it), %llu "
                 "walked, %llu changed structures read (%llu universal)\n",
                 counts.inputs, counts.refused, counts.crashed, counts.walked, counts.changed_read,
                 counts.universal);
  return all_ok;
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int* argc, char*** argv) {
  // `fuzz_resealed __h5-probe FILE` is the probe: it walks FILE and exits here.
  ckpt::ServeHdf5Probe(*argc, *argv);
  ckpt::SetHdf5Probe("/proc/self/exe", /*seconds=*/5);  // under libFuzzer's 10 s per input
  // The probe dies by the signal, as the CLI's does, rather than exiting 1 from ASan's handler:
  // a crash in it is counted as one. (Read by the probes at their start, not by this process.)
  const char* asan = std::getenv("ASAN_OPTIONS");
  const std::string options = std::string(asan ? asan : "") + (asan && *asan ? ":" : "") +
                              "handle_segv=0:handle_sigbus=0:handle_sigfpe=0:handle_abort=0";
  setenv("ASAN_OPTIONS", options.c_str(), 1);
  GetFixture();
  // Every seed must load completely, sealed by this harness: proof that inputs reach the
  // probe, the seal and the rank-file reader, and the universal fixture's file the universal
  // reader.
  ckpt_fuzz::RequireSeedsLoad("fuzz_resealed", ckpt_fuzz::RankSeeds(CKPT_FUZZ_SEED_DIR), RunOne);
  ckpt_fuzz::RequireSeedsLoad("fuzz_resealed",
                              {std::filesystem::path(CKPT_FUZZ_UNIVERSAL_FIXTURE) / "universal.h5"},
                              RunOne);
  counts = Counts{};  // the reports count the fuzzer's inputs only
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  RunOne(data, size);
  return 0;
}
