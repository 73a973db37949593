// libFuzzer target: rank files sealed again as an attacker would, behind the HDF5 probe. The
// metadata seal refuses a file whose HDF5 structure differs from what its manifest records,
// so fuzz_rank_file's changed structures never reach libhdf5; but whoever hands over a
// checkpoint writes its manifest too, and can seal any structure. Here each input replaces
// rank_00000.h5 of the same one-rank synthetic checkpoint as fuzz_rank_file's and is handled
// as a reader handles a hostile file: the probe (this executable, `__h5-probe FILE`, set as
// the CLI sets itself) walks it in a process of its own first; only a file it walked is then
// sealed in this process (h5::SealFile: libhdf5 opens it here) and recorded in the manifest
// with its own seal, and the checkpoint read every way fuzz_rank_file reads it (with the probe
// set, as the CLI runs). A crash or sanitizer report in this process is a finding: libhdf5
// failed here on a structure the probe walked (the probe's walk misses what a reader does).
// A probe that crashes, hangs (5 s here) or fails refuses the input: that is the probe
// working, counted.
//
// The harness asserts that it reaches the readers: the seeds must load completely (checked at
// start-up), and it prints, at every power of two, how many inputs the probe refused (and of
// those, how many crashed it), how many it walked, how many of those carried a structure no
// seed has and were read past the seal ("fuzz_resealed: N inputs, R refused by the probe (C
// crashed it), W walked, S changed structures read"): tools/fuzz.sh requires S to be non-zero.
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

namespace {

struct Counts {
  unsigned long long inputs = 0, refused = 0, crashed = 0, walked = 0, changed_read = 0;
} counts;

const ckpt_fuzz::RankFixture& GetFixture() {
  static const ckpt_fuzz::RankFixture f =
      ckpt_fuzz::MakeRankFixture("fuzz-resealed", CKPT_FUZZ_SEED_DIR);
  return f;
}

// Installs `data` as rank 0's file, probed, then sealed as it is; reads everything. True when
// every read succeeded.
bool RunOne(const uint8_t* data, size_t size) {
  const ckpt_fuzz::RankFixture& fx = GetFixture();
  const ckpt::FileRecord& record = fx.manifest.files[0];
  const std::string path = fx.dir + "/" + record.path;
  ckpt_fuzz::WriteFile(path, data, size);
  ++counts.inputs;
  bool all_ok = false;
  // The input is rewritten in place, faster than its modification time may move.
  ckpt::h5::ForgetProbedFiles();
  const ckpt::Status probed = ckpt::h5::ProbeStructure(path, record.path);
  ckpt_fuzz::RequireTerminalSafe(probed);
  if (!probed.ok()) {
    ++counts.refused;
    if (probed.message().find("libhdf5 crashed") != std::string::npos) ++counts.crashed;
  } else {
    ++counts.walked;
    ckpt::Manifest m = fx.manifest;
    ckpt::FileRecord& f = m.files[0];
    f.bytes = size;
    f.xxh3 = "";
    // Sealed here, as its writer (or an attacker) seals a file: libhdf5 opens it in this
    // process for the first time, after the probe walked it.
    if (ckpt::h5::SealFile(ckpt::Env::Default(), path, size, &f.data_extents, &f.metadata_xxh3)
            .ok()) {
      const auto seed = fx.seals.find(size);
      const bool changed = seed == fx.seals.end() || seed->second.xxh3 != f.metadata_xxh3 ||
                           seed->second.extents != f.data_extents;
      std::ofstream(fx.dir + "/manifest.json", std::ios::trunc) << ckpt::SerializeManifest(m);
      ckpt_fuzz::Reached reached;
      all_ok = ckpt_fuzz::ReadRankCheckpoint(fx.dir, &reached);
      if (changed && reached.past_seal) ++counts.changed_read;
    }
  }
  if ((counts.inputs & (counts.inputs - 1)) == 0)
    std::fprintf(stderr,
                 "fuzz_resealed: %llu inputs, %llu refused by the probe (%llu crashed it), %llu "
                 "walked, %llu changed structures read\n",
                 counts.inputs, counts.refused, counts.crashed, counts.walked, counts.changed_read);
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
  // probe, the seal and the rank-file reader.
  ckpt_fuzz::RequireSeedsLoad("fuzz_resealed", ckpt_fuzz::RankSeeds(CKPT_FUZZ_SEED_DIR), RunOne);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  RunOne(data, size);
  return 0;
}
