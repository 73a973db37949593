// ckpt probe DIR: should the checkpoints under DIR be compressed? (ckpt/probe.h)
#include <algorithm>
#include <cstdio>

#include "ckpt/probe.h"
#include "ckpt/progress.h"
#include "ckpt/units.h"
#include "command.h"

namespace ckpt::cli {
namespace {

constexpr const char* kCommand = "probe";
constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

struct ProbeArgs {
  std::string dir;
  std::string size = "1GiB";
  int ranks = 4;
  std::string compress = "zstd:1+shuffle";
  int pairs = 3;
  std::string memory_dir = "/dev/shm";
  std::string from;
  bool json = false;
};

void PrintRow(const char* place, const std::string& setting, const std::vector<double>& secs,
              double median, uint64_t bytes, uint64_t stored) {
  char range[64];
  std::snprintf(range, sizeof range, "%.3f (%.3f-%.3f)", median,
                *std::min_element(secs.begin(), secs.end()),
                *std::max_element(secs.begin(), secs.end()));
  std::printf("  %-7s %-16s %-26s %6.2f   %s\n", place, setting.c_str(), range,
              static_cast<double>(bytes) / median / kGiB, FormatBytes(stored).c_str());
}

int Run(const ProbeArgs& a) {
  auto size = ParseByteSize(a.size);
  if (!size.ok()) return ReportError(kCommand, size.status().WithContext("--size"), a.json);
  auto comp = Compression::Parse(a.compress);
  if (!comp.ok()) return ReportError(kCommand, comp.status().WithContext("--compress"), a.json);
  ProbeOptions o;
  o.bytes = *size;
  o.ranks = a.ranks;
  o.compression = *comp;
  o.pairs = a.pairs;
  o.memory_dir = a.memory_dir;
  o.from = a.from;
  // The saves, and the reads of --from (its master and moments, once).
  const int places = a.memory_dir.empty() ? 1 : 2;
  const uint64_t units = 2 * static_cast<uint64_t>(a.pairs * places) + (a.from.empty() ? 0 : 1);
  Progress progress("probe", *size * units, !a.json);
  o.on_bytes = [&](uint64_t n) { progress.Add(n); };
  auto r = ProbeCompression(a.dir, o);
  progress.Finish();
  if (!r.ok()) return ReportError(kCommand, r.status(), a.json);
  const std::string setting = r->compression.ToString();
  const double crossover = r->CrossoverBytesPerSecond();
  const double ceiling = r->CeilingBytesPerSecond();
  if (a.json) {
    PrintJson(ProbeReportToJson(*r));
    return 0;
  }
  for (const auto& stale : r->removed_stale)
    std::printf("removed %s, left by an interrupted probe\n", stale.c_str());
  const std::string what = r->from.empty() ? "synthetic fp32 master and moments"
                                           : "fp32 master and moments of " + r->from;
  std::printf(
      "probe of %s: %s of Adam state (%s) per save, %d rank(s) as threads, %d "
      "alternating pair(s)\n",
      r->dir.c_str(), FormatBytes(r->bytes).c_str(), what.c_str(), r->ranks, r->pairs);
  std::printf("  %-7s %-16s %-26s %6s   %s\n", "place", "compression", "seconds: median (range)",
              "GiB/s", "stored");
  auto rows = [&](const char* place, const ProbeSide& s) {
    PrintRow(place, "none", s.none_seconds, s.NoneMedian(), r->bytes, s.none_file_bytes);
    PrintRow(place, setting, s.compressed_seconds, s.CompressedMedian(), r->bytes,
             s.compressed_file_bytes);
  };
  rows("disk", r->disk);
  if (r->memory_ran) rows("memory", r->memory);
  if (r->o_direct_refused)
    std::printf("the file system refused O_DIRECT: the saves' data went through the page cache\n");
  const double speedup = r->disk.Speedup();
  const char* close = speedup > 0.95 && speedup < 1.05 ? " (within 5 %: about even)" : "";
  if (r->CompressHere())
    std::printf("here: compress (--compress %s): the save was %.2fx faster%s and %.2fx smaller\n",
                setting.c_str(), speedup, close, r->CompressionRatio());
  else
    std::printf(
        "here: do not compress: the uncompressed save was %.2fx faster%s; %s stores "
        "%.2fx less\n",
        1 / speedup, close, setting.c_str(), r->CompressionRatio());
  const std::string no_memory = "no save with no disk to wait for: " + r->memory_note;
  if (crossover > 0)
    std::printf(
        "rule: compression pays where an uncompressed save writes slower than the "
        "compressed one ran here: below about %.2f GiB/s; %s\n",
        crossover / kGiB,
        ceiling > 0 ? StrFormat("with no disk to wait for (%s) it ran at %.2f GiB/s",
                                r->memory_dir.c_str(), ceiling / kGiB)
                          .c_str()
                    : no_memory.c_str());
  else
    std::printf("rule: here the disk is the limit (the uncompressed save wrote %.2f GiB/s); %s\n",
                static_cast<double>(r->bytes) / r->disk.NoneMedian() / kGiB,
                ceiling > 0 ? StrFormat("on a faster disk compression stops paying somewhere below "
                                        "%.2f GiB/s, its rate with no disk to wait for (%s)",
                                        ceiling / kGiB, r->memory_dir.c_str())
                                  .c_str()
                            : no_memory.c_str());
  return 0;
}

std::function<int()> SetupProbe(CLI::App& sub) {
  auto a = std::make_shared<ProbeArgs>();
  sub.add_option("DIR", a->dir, "directory the checkpoints will be written under")->required();
  sub.add_option("--size", a->size, "logical bytes per save: 1GiB, 256MiB (at least 16 MiB)")
      ->capture_default_str();
  sub.add_option("--ranks", a->ranks, "ranks (threads) per save")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  sub.add_option("--compress", a->compress,
                 "the compression weighed against none: zstd[:L][+shuffle]")
      ->capture_default_str();
  sub.add_option("--pairs", a->pairs, "alternating pairs of saves per place")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  sub.add_option("--memory-dir", a->memory_dir,
                 "file system in memory for the saves with no disk ('': none)")
      ->capture_default_str();
  sub.add_option("--from", a->from,
                 "a checkpoint (ckpt, universal or DeepSpeed) whose master and moments the saves "
                 "carry instead of synthetic values (the first --size of them)");
  sub.add_flag("--json", a->json, "machine-readable output");
  return [a] { return Run(*a); };
}

}  // namespace

CKPT_REGISTER_COMMAND(probe, kCommand,
                      "measure whether compression makes saves under DIR faster, and the disk "
                      "rate below which it pays on this machine",
                      SetupProbe);

}  // namespace ckpt::cli
