// ckpt synth: a deterministic synthetic multi-rank checkpoint (ranks as threads).
#include <chrono>
#include <cstdio>

#include "ckpt/progress.h"
#include "ckpt/synth.h"
#include "ckpt/units.h"
#include "command.h"

namespace ckpt::cli {
namespace {

struct SynthArgs {
  std::string root;
  int ranks = 4;
  std::string params = "2M";
  int zero = 2;
  int tags = 1;
  std::string compress = "none";
  std::string largest = "0";
  uint64_t seed = 0;
  int keep_last = 0;
  bool json = false;
};

std::function<int()> SetupSynth(CLI::App& sub) {
  auto a = std::make_shared<SynthArgs>();
  sub.add_option("ROOT", a->root, "checkpoint root to write into")->required();
  sub.add_option("--ranks", a->ranks, "data-parallel ranks (threads)")->check(CLI::PositiveNumber);
  sub.add_option("--params", a->params, "unique parameters: 2M, 1.5B, 350e6");
  sub.add_option("--zero", a->zero, "ZeRO stage 0..3")->check(CLI::Range(0, 3));
  sub.add_option("--tags", a->tags, "number of tags (global_step100, 200, ...)")
      ->check(CLI::PositiveNumber);
  sub.add_option("--compress", a->compress, "none | zstd[:LEVEL][+shuffle]");
  sub.add_option("--largest-tensor", a->largest, "elements of the largest tensor (default P/4)");
  sub.add_option("--seed", a->seed, "value seed");
  sub.add_option("--keep-last", a->keep_last, "retention: keep the newest K tags");
  sub.add_flag("--json", a->json, "machine-readable output");
  return [a] {
    auto params = ParseCount(a->params);
    if (!params.ok()) return ReportError("synth", params.status().WithContext("--params"), a->json);
    auto largest = ParseCount(a->largest);
    if (!largest.ok())
      return ReportError("synth", largest.status().WithContext("--largest-tensor"), a->json);
    auto comp = Compression::Parse(a->compress);
    if (!comp.ok()) return ReportError("synth", comp.status(), a->json);
    SynthOptions o;
    o.ranks = a->ranks;
    o.params = *params;
    o.zero_stage = a->zero;
    o.tags = a->tags;
    o.largest_tensor = *largest;
    o.seed = a->seed;
    o.compression = *comp;
    o.keep_last = a->keep_last;
    Progress progress("synth", static_cast<uint64_t>(*params) * 12 * static_cast<uint64_t>(a->tags),
                      !a->json);
    o.on_bytes = [&](uint64_t n) { progress.Add(n); };
    const auto t0 = std::chrono::steady_clock::now();
    auto tags = WriteSynthetic(a->root, o);
    progress.Finish();
    if (!tags.ok()) return ReportError("synth", tags.status(), a->json);
    const double secs =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (a->json) {
      PrintJson({{"root", a->root}, {"tags", *tags}, {"seconds", secs}});
    } else {
      for (const auto& t : *tags) std::printf("wrote %s/%s\n", a->root.c_str(), t.c_str());
      std::printf("%d rank(s), %s parameters, ZeRO-%d, compression %s, %.2fs\n", a->ranks,
                  a->params.c_str(), a->zero, comp->ToString().c_str(), secs);
    }
    return 0;
  };
}

}  // namespace

CKPT_REGISTER_COMMAND(synth, "synth", "write a deterministic synthetic multi-rank checkpoint",
                      SetupSynth);

}  // namespace ckpt::cli
