// Should the checkpoints under a directory be compressed? Measured where they will be written,
// not reasoned (issue 19, item 5): `ckpt probe DIR`.
//
// Compression pays where the disk writes slower than the cores compress. Both sides depend on
// the machine: a 2-core VM saved zstd:1+shuffle at about 0.6 GiB/s and a 16-core machine at
// 2 GiB/s (docs/performance.md), so no one rate is right everywhere. The probe saves ckpt
// synth's Adam state (fp32 master, exp_avg, exp_avg_sq) under DIR, uncompressed and compressed
// in alternating pairs, with ranks as threads as `ckpt synth` saves, and says which was faster
// on this disk. Where compression lost, the compressed save's rate here estimates the disk rate
// below which it pays (on the development VM's disk throttled to chosen rates the crossover lay
// at an uncompressed save rate of about 0.55-0.59 GiB/s, and the estimate came within about a
// quarter of it, above or below). Where a memory file system has room (/dev/shm by default) the
// probe also saves both ways there, with no disk to wait for: the compressed save's rate there
// is the most any disk could make compression pay at on this machine.
#pragma once

#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "ckpt/status.h"
#include "ckpt/writer.h"

namespace ckpt {

struct ProbeOptions {
  uint64_t bytes = 1ull << 30;  // logical bytes per save (master and moments), at least 16 MiB
  int ranks = 4;
  // The compression weighed against none (zstd:1+shuffle by default).
  Compression compression = {Compression::Kind::kZstd, 1, true};
  int pairs = 3;  // alternating pairs per place
  // A file system in memory for the saves with no disk to wait for; empty: none.
  std::string memory_dir = "/dev/shm";
  // A checkpoint (ckpt, universal or DeepSpeed; root or tag directory) whose fp32 master and
  // Adam moments the saves carry instead of synthetic values, so that the compression ratio is
  // that of the user's own state: the first `bytes` of them (all of them when fewer), read
  // once before the saves, verified as a load verifies. Empty: ckpt synth's values.
  std::string from;
  // Called with the logical bytes of each rank's save once it is written, and of each read of
  // `from` (any thread): progress.
  std::function<void(uint64_t)> on_bytes;
};

// The saves of one place (the disk under DIR, or the memory file system).
struct ProbeSide {
  std::vector<double> none_seconds;        // per uncompressed save, in the order run
  std::vector<double> compressed_seconds;  // per compressed save
  uint64_t none_file_bytes = 0;  // the bytes of the last save's files (rank files, manifest)
  uint64_t compressed_file_bytes = 0;
  double NoneMedian() const;
  double CompressedMedian() const;
  // The uncompressed save's median over the compressed one's: above 1, compressing was faster.
  double Speedup() const;
};

struct ProbeReport {
  std::string dir;
  std::string from;    // the tag directory whose state the saves carried; "": synthetic
  uint64_t bytes = 0;  // logical bytes per save
  int ranks = 0;
  int pairs = 0;
  Compression compression;
  ProbeSide disk;
  // Whether the memory saves ran, and where (memory_dir); when not, why not.
  bool memory_ran = false;
  std::string memory_dir;
  std::string memory_note;
  ProbeSide memory;
  uint64_t direct_bytes = 0;  // of the disk saves' data, bytes written with O_DIRECT
  // Directories an interrupted probe on this host left (its process gone), removed first.
  std::vector<std::string> removed_stale;
  uint64_t o_direct_refused = 0;

  // Logical bytes over the stored bytes of a compressed save.
  double CompressionRatio() const;
  // Whether compressing was faster on the disk (median against median).
  bool CompressHere() const;
  // Where compression lost here: the compressed save's rate on this disk (logical bytes per
  // second), the estimate of the disk rate (as an uncompressed save measures it) below which
  // compression pays. 0 where compression won: the disk was the compressed save's limit.
  double CrossoverBytesPerSecond() const;
  // The compressed save's rate with no disk (0 when memory_ran is false): no disk faster than
  // it makes compression pay on this machine.
  double CeilingBytesPerSecond() const;
};

// Runs the probe: the saves go to a fresh directory DIR/.ckpt-probe-<host>-<pid>-XXXXXX (and one
// under memory_dir), each save removed after it is timed; both directories are removed before
// returning, on failure too. A probe killed by a signal leaves its directory; the next probe on
// the same host removes it once no process of that id runs (removed_stale). Nothing else under
// DIR is touched. Errors: NotFound or
// FailedPrecondition naming DIR (missing, not a directory, not writable, too little free
// space), InvalidArgument for the options (or a `from` checkpoint holding less than 16 MiB of
// Adam state), the `from` checkpoint's own errors (DataLoss for damaged data), and a failed
// save's own error.
Result<ProbeReport> ProbeCompression(const std::string& dir, const ProbeOptions& options);

// `ckpt probe --json` (and Python's ckpt.probe): {"dir", "from" (null: synthetic), "bytes",
// "ranks", "pairs", "compress", "disk" and "memory" (null when it did not run): {"none_seconds",
// "compressed_seconds": {"median", "min", "max", "each"}, "none_bytes_per_s",
// "compressed_bytes_per_s", "none_file_bytes", "compressed_file_bytes", "speedup"},
// "memory_dir", "memory_note", "compression_ratio", "direct_bytes", "o_direct_refused",
// "recommended" ("none" or the compression), "crossover_bytes_per_s" and "ceiling_bytes_per_s"
// (null where not measured), "removed_stale": [paths]}.
nlohmann::json ProbeReportToJson(const ProbeReport& report);

}  // namespace ckpt
