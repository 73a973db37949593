// The universal layout's contents, `ckpt to-universal` (docs/convert.md, "Universal layout");
// the format library writes the file (ckpt::WriteUniversalFile) and reads it
// (ckpt/universal.h).
//
// Write protocol (ConvertToUniversal):
//  1. Open the source; refuse a non-empty OUT; create the staging directory next to OUT.
//  2. Write staging/universal.h5 (ckpt::WriteUniversalFile): HDF5 writes the structure (the
//     root attributes, a group per stored parameter, every dataset with its region
//     allocated); then every stored parameter's full-shape states in table order, read from
//     the source a window at a time while the window before is written past the page cache,
//     then the scheduler, the data position and every source rank's blob/json datasets. Each
//     dataset's digest, the file's digest and its metadata seal are taken on the way.
//  3. fsync universal.h5.
//  4. Finish the source verification: every source dataset read has matched its XXH3.
//  5. Write staging/manifest.json (temp name, fsync, rename).
//  6. Rename the staging directory to OUT and fsync the parent (output_dir.h).
#include "convert/universal.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "ckpt/aligned_buffer.h"
#include "ckpt/progress.h"
#include "ckpt/root.h"
#include "ckpt/state_source.h"
#include "ckpt/universal.h"
#include "ckpt/utc_time.h"
#include "convert/output_dir.h"

namespace ckpt::convert {
namespace {

// universal.h5's contents for ckpt::WriteUniversalFile, which writes them as a rank file is
// written: every stored parameter's states as `fill` datasets, read from the source a window
// at a time as the writer asks for them (in table order, the order the source stores them:
// its stream verification hashes each read as it passes), the window after it read while it
// is written; a frozen parameter read whole when the writer reaches it; then the scheduler,
// the data position and every source rank's blob/json datasets (WriteUniversal adds those).
// `frozen` holds the frozen parameter being written: sized for the largest, allocated on first
// use and kept (a fresh vector for each cost to-universal of a LoRA checkpoint more than its
// reads on the development VM: docs/performance.md, 2026-12-05 17:00).
UniversalFileContents UniversalContents(StateSource& src, Progress& progress,
                                        ToUniversalReport& report, AlignedBuffer& frozen) {
  const Manifest& m = src.manifest();
  uint64_t largest_frozen = 0;
  for (const auto& p : m.params)
    if (p.frozen && p.tied_to.empty())
      largest_frozen =
          std::max(largest_frozen, static_cast<uint64_t>(p.numel) * DTypeSize(p.dtype));
  UniversalFileContents c;
  c.tag = m.tag;
  c.source_dp_world_size = src.source_ranks();
  c.source_zero_stage = m.topology.zero_stage;
  for (const auto& p : m.params) {
    if (!p.tied_to.empty()) continue;
    c.params.push_back({p.name, p.frozen, p.dtype});
    const std::string group = UniversalParamGroup(p.name);
    ++report.params_written;
    if (p.frozen) {
      const uint64_t bytes = static_cast<uint64_t>(p.numel) * DTypeSize(p.dtype);
      // Read whole at its first window (ReadFrozenInto checks it whole): the largest frozen
      // tensor is the only one in memory.
      c.datasets.push_back(DatasetSpec::Filled(
          group + "/" + std::string(kMaster), p.dtype, p.shape,
          [&src, &progress, &held = frozen, largest_frozen, name = p.name, bytes,
           place = uint64_t{0}](uint64_t at, size_t n, void* out) mutable -> Status {
            if (at == 0) {
              // At its record's place within a 4 KiB block: read straight into `held`.
              place = src.FrozenReadShift(name).value_or(0);
              if (held.size() == 0) held = AlignedBuffer(largest_frozen + AlignedBuffer::kAlign);
              if (held.size() < place + bytes)
                return Internal("frozen buffer smaller than a tensor");
              CKPT_RETURN_IF_ERROR(src.ReadFrozenInto(name, held.data() + place, bytes));
            }
            if (at + n > bytes) return Internal("frozen window outside the tensor");
            std::memcpy(out, held.data() + place + at, n);
            progress.Add(n);
            return Status::Ok();
          }));
      continue;
    }
    for (std::string_view state : {kMaster, kExpAvg, kExpAvgSq}) {
      c.datasets.push_back(DatasetSpec::Filled(
          group + "/" + std::string(state), DType::kF32, p.shape,
          [&src, &progress, name = p.name, state](uint64_t at, size_t n, void* out) -> Status {
            CKPT_RETURN_IF_ERROR(src.ReadParamRange(name, state, static_cast<int64_t>(at / 4),
                                                    static_cast<int64_t>((at + n) / 4),
                                                    static_cast<float*>(out)));
            progress.Add(n);
            return Status::Ok();
          }));
      // Each window where its bytes lie in the source's file within a 4 KiB block: read from
      // the disk straight into it (the bench's DeepSpeed checkpoint: 1 MiB tensors, each read
      // through the page cache before).
      c.datasets.back().fill_place = [&src, name = p.name, state](uint64_t at, size_t n) {
        return src.ReadShift(name, state, static_cast<int64_t>(at / 4),
                             static_cast<int64_t>((at + n) / 4));
      };
      // The source's checksum of the window's bytes (SourceOptions::defer_stream_hashes) on
      // the writing thread, while the helper reads the next window.
      c.datasets.back().filled = [&src] { src.HashReadBytes(); };
    }
  }
  return c;
}

// A small dataset from memory (the scheduler, the data position, a source rank's blob).
DatasetSpec Small(std::string name, const RankExtra& ex, const std::vector<uint8_t>& bytes) {
  DatasetSpec d;
  d.name = std::move(name);
  d.kind = ex.record.kind;
  d.blob_kind = ex.record.blob_kind;
  d.dtype = ex.record.dtype;
  d.shape = ex.record.shape;
  d.data = bytes.data();
  return d;
}

Result<FileRecord> WriteUniversal(StateSource& src, const std::string& path, Env* env,
                                  ToUniversalReport& report, bool progress_on) {
  const Manifest& m = src.manifest();
  uint64_t total = 0;
  for (const auto& p : m.params) {
    if (!p.tied_to.empty()) continue;
    total += p.frozen ? static_cast<uint64_t>(p.numel) * DTypeSize(p.dtype)
                      : static_cast<uint64_t>(p.numel) * 12;
  }
  Progress progress("to-universal", total, progress_on);
  AlignedBuffer frozen;
  UniversalFileContents c = UniversalContents(src, progress, report, frozen);
  // Scheduler and data position: rank 0's (engine_min keeps both global), then every source
  // rank's blob and json datasets unchanged, for provenance.
  struct Extra {
    std::string name;  // in universal.h5
    int rank;
    RankExtra ex;
    std::string context;  // of a failed read
  };
  std::vector<Extra> extras;
  for (const auto& ex : src.RankExtras(0))
    if (ex.name == kScheduler || ex.name == kDataPosition)
      extras.push_back({ex.name, 0, ex, ex.name});
  for (int r = 0; r < src.source_ranks(); ++r)
    for (const auto& ex : src.RankExtras(r))
      extras.push_back(
          {UniversalSourceGroup(r) + "/" + ex.name, r, ex, "source rank " + std::to_string(r)});
  std::vector<std::vector<uint8_t>> held;
  held.reserve(extras.size());  // DatasetSpec points into these
  for (const auto& e : extras) {
    CKPT_ASSIGN_OR_RETURN(auto bytes, src.ReadRankExtra(e.rank, e.ex), e.context);
    held.push_back(std::move(bytes));
    c.datasets.push_back(Small(e.name, e.ex, held.back()));
  }
  SaveOptions so;
  so.env = env;
  CKPT_ASSIGN_OR_RETURN(FileRecord fr, WriteUniversalFile(path, c, so), "");
  progress.Finish();
  return fr;
}

}  // namespace

Result<ToUniversalReport> ConvertToUniversal(const std::string& src_path, const std::string& out,
                                             const ToUniversalOptions& opts) {
  Env* env = opts.env ? opts.env : Env::Default();
  SourceOptions so;
  so.tag = opts.tag;
  so.env = env;
  so.stream_verify = true;
  so.defer_stream_hashes = true;  // by each window's `filled`, on the writing thread
  so.probe_all = true;
  CKPT_ASSIGN_OR_RETURN(auto src, OpenStateSource(src_path, so), "");
  ToUniversalReport report;
  report.source_dir = src->dir();
  report.out = out;
  report.tag = src->manifest().tag;
  report.source_ranks = src->source_ranks();
  report.skipped = src->UnusedTensors();

  CKPT_ASSIGN_OR_RETURN(StagedOutput staged, StagedOutput::Begin(out, env), "");
  const std::string path = staged.staging() + "/" + std::string(kUniversalFile);
  CKPT_RETURN_IF_ERROR(env->BeginExternalWrite(path), "");
  CKPT_ASSIGN_OR_RETURN(FileRecord fr, WriteUniversal(*src, path, env, report, opts.progress), "");
  CKPT_RETURN_IF_ERROR(env->SyncFile(path), "fsync " + path);
  CKPT_RETURN_IF_ERROR(
      src->FinishVerification({std::string(kMaster), std::string(kExpAvg), std::string(kExpAvgSq)}),
      src->dir());
  report.bytes_read = src->bytes_read();

  Manifest m = src->manifest();
  m.kind = "universal";
  for (auto& p : m.params) p.ranges.clear();
  m.files = {std::move(fr)};
  m.created_utc = UtcNow(&m.created_unix);
  m.format = std::string(kFormatName);
  m.version_major = kFormatMajor;
  m.version_minor = kFormatMinor;
  m.writer = std::string(kWriterVersion);
  CKPT_RETURN_IF_ERROR(ValidateManifest(m), "universal manifest");
  report.file_bytes = m.files[0].bytes;
  CKPT_RETURN_IF_ERROR(WriteFileAtomic(env, staged.staging() + "/" + std::string(kManifestFile),
                                       SerializeManifest(m, 2)),
                       "write manifest");
  CKPT_RETURN_IF_ERROR(staged.Commit(), "");
  return report;
}

}  // namespace ckpt::convert
