// ckpt reshard.
//
// Protocol:
//  1. Validate the request (dp >= 1, zero 0..3), open the source, and (verify_source) stream
//     every master / exp_avg / exp_avg_sq dataset of the source once against its XXH3, so
//     the bytes the new ranks are about to copy are known good.
//  2. Build the new manifest: the source's parameter table repartitioned with
//     ckpt::BuildPartition for the new world size and stage; topology and engine_config
//     updated; counters, optimizer, client_state kept.
//  3. Prepare the new ranks a few at a time (ReshardOptions::threads, ckpt::SaveRanks hands
//     them out in order): a ckpt::ReshardedShardReader (what ckpt::LoadResharded, the load a
//     resumed run on the new topology does, is built on) opens the source for the rank; rank
//     0 gets the frozen parameters; every rank data_position and scheduler, the RNG blobs
//     when the world size is unchanged, and a `reshard` json dataset recording what was done.
//  4. Write: the rank's master and moments are DatasetSpec::fill datasets, which the rank-file
//     writer pulls a window (ReshardOptions::window_bytes) at a time, in order, hashing and
//     writing each as it comes (ckpt::SaveRanks, the ckpt commit protocol, which writes the
//     tag and `latest` after the last rank). Each window reads only the source slices it
//     covers, each verified by the pieces it touches (or, for a source without piece
//     digests, each dataset it reads from whole, once), so even without step 1's pass no
//     unverified byte is copied (the next window is read while one is written). Peak memory
//     is `threads` × (two windows + the reader's piece cache), whatever the model size and however
//     many new ranks there are; the files are byte for byte those a whole shard in memory would
//     give. A failing rank stops the ranks not yet started; nothing is committed.
//  5. Rename the staging directory to OUT (output_dir.h).
#include "convert/reshard.h"

#include <algorithm>
#include <nlohmann/json.hpp>
#include <thread>

#include "ckpt/deepspeed.h"
#include "ckpt/load_resharded.h"
#include "ckpt/manifest.h"
#include "ckpt/progress.h"
#include "ckpt/save_ranks.h"
#include "ckpt/state_source.h"
#include "ckpt/writer.h"
#include "convert/output_dir.h"

namespace ckpt::convert {
namespace {

constexpr std::string_view kReshardDataset = "reshard";

struct PreparedRank {
  std::unique_ptr<ReshardedShardReader> reader;
  ReshardedRank small;             // frozen parameters and small state (no shard vectors)
  std::vector<std::string> texts;  // backing storage for json / blob datasets
  RankContents contents;
  RankReadStats stats;
};

Status PrepareRank(const std::string& src_path, const ReshardOptions& opts, Env* env,
                   const ReshardTarget& target, const nlohmann::json& note, Progress& progress,
                   PreparedRank& out) {
  const int j = out.stats.rank;
  // The reads a resumed run does (ckpt/load_resharded.h): only the slices this rank owns,
  // each verified by its pieces; a source without piece digests was checked whole in step 1,
  // or (--no-verify) each dataset this rank reads from is checked whole once.
  LoadReshardOptions lo;
  lo.source.tag = opts.tag;
  lo.source.env = env;
  lo.optimizer_type.clear();  // a converter copies whatever moments the source holds
  lo.source_verified = opts.verify_source;  // step 1 checked every dataset whole
  CKPT_ASSIGN_OR_RETURN(out.reader, ReshardedShardReader::Open(src_path, target, j, lo), "");
  CKPT_RETURN_IF_ERROR(out.reader->ReadSmallState(&out.small), "");
  auto& ds = out.contents.datasets;
  const std::vector<int64_t> shape = {out.reader->shard_numel()};
  for (std::string_view state : {kMaster, kExpAvg, kExpAvgSq}) {
    ReshardedShardReader* reader = out.reader.get();
    ds.push_back(DatasetSpec::Filled(
        std::string(state), DType::kF32, shape,
        [reader, state, &progress](uint64_t offset, size_t length, void* to) -> Status {
          const uint64_t owned = reader->accounting().bytes_owned;
          CKPT_RETURN_IF_ERROR(reader->ReadShard(state, static_cast<int64_t>(offset / 4),
                                                 static_cast<int64_t>(length / 4),
                                                 static_cast<float*>(to)),
                               "");
          progress.Add(reader->accounting().bytes_owned - owned);
          return Status::Ok();
        }));
  }
  for (auto& [name, raw] : out.small.frozen) {
    const ParamEntry* p = nullptr;
    for (const auto& q : target.params)
      if (q.name == name) p = &q;
    ds.push_back(
        DatasetSpec::Tensor(std::string(kFrozenPrefix) + name, p->dtype, p->shape, raw.data()));
  }
  // Reserve first: DatasetSpec keeps raw pointers into these strings.
  out.texts.reserve(out.small.extras.size() + 1);
  for (auto& [ex, bytes] : out.small.extras) {
    out.texts.emplace_back(bytes.begin(), bytes.end());
    if (ex.record.kind == "json")
      ds.push_back(DatasetSpec::Json(ex.name, out.texts.back()));
    else
      ds.push_back(DatasetSpec::Blob(ex.name, ex.record.blob_kind, out.texts.back()));
  }
  out.texts.push_back(note.dump());
  ds.push_back(DatasetSpec::Json(std::string(kReshardDataset), out.texts.back()));
  return Status::Ok();
}

// What the rank read, once its file is written.
void FinishStats(const ReadAccounting& a, RankReadStats& stats) {
  stats.bytes_owned = a.bytes_owned + a.small_bytes;
  stats.bytes_read = a.bytes_read + a.small_bytes;
  stats.slices = a.slices;
  stats.piece_bytes = a.piece_bytes;
  stats.windows = a.reads;
}

int ReshardThreads(const ReshardOptions& opts) {
  if (opts.threads > 0) return std::min(opts.threads, opts.dp);
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  return std::max(1, std::min({opts.dp, cores, kDefaultReshardThreads}));
}

}  // namespace

double ReshardReport::max_ratio() const {
  double r = 0;
  for (const auto& s : ranks) r = std::max(r, s.ratio());
  return r;
}

Result<ReshardReport> Reshard(const std::string& src_path, const std::string& out,
                              const ReshardOptions& opts) {
  if (opts.dp < 1)
    return InvalidArgument("--dp must be at least 1 (got " + std::to_string(opts.dp) + ")");
  if (opts.zero_stage < -1 || opts.zero_stage > 3)
    return InvalidArgument("--zero must be 0, 1, 2 or 3 (got " + std::to_string(opts.zero_stage) +
                           ")");
  Env* env = opts.env ? opts.env : Env::Default();
  SourceOptions so;
  so.tag = opts.tag;
  so.env = env;
  so.probe_all = true;
  CKPT_ASSIGN_OR_RETURN(auto src, OpenStateSource(src_path, so), "");
  const Manifest& sm = src->manifest();
  ReshardReport report;
  report.source_dir = src->dir();
  report.out = out;
  report.tag = sm.tag;
  report.source_kind = src->kind();
  report.source_dp = src->source_ranks();
  report.source_zero = sm.topology.zero_stage;
  report.dp = opts.dp;
  report.zero_stage = opts.zero_stage >= 0 ? opts.zero_stage : sm.topology.zero_stage;
  report.rng_copied = opts.dp == report.source_dp;
  report.skipped = src->UnusedTensors();

  // 1. Verify the source once.
  if (opts.verify_source) {
    CKPT_RETURN_IF_ERROR(src->FinishVerification(
                             {std::string(kMaster), std::string(kExpAvg), std::string(kExpAvgSq)}),
                         src->dir());
    report.verify_bytes = src->bytes_read();
  }

  // 2. The new manifest.
  Manifest m = sm;
  m.kind = "sharded";
  m.files.clear();
  for (auto& p : m.params) p.ranges.clear();
  CKPT_ASSIGN_OR_RETURN(
      m.partition, BuildPartition(m.params, opts.dp, report.zero_stage, sm.partition.alignment),
      "partition");
  m.topology.dp_world_size = opts.dp;
  m.topology.zero_stage = report.zero_stage;
  if (m.engine_config.is_object()) {
    auto& ec = m.engine_config;
    if (ec.contains("dp_world_size")) ec["dp_world_size"] = opts.dp;
    if (ec.contains("zero")) ec["zero"] = report.zero_stage;
    if (ec.contains("zero_stage")) ec["zero_stage"] = report.zero_stage;
    // engine_min keeps the global batch on resume and splits it evenly over the ranks: a world
    // size that does not divide it could not resume, so it is refused before anything is
    // written (the run would otherwise fail only at its first step).
    if (ec.contains("global_batch") && ec["global_batch"].is_number_integer()) {
      const int64_t gb = ec["global_batch"].get<int64_t>();
      if (gb > 0 && gb % opts.dp != 0) {
        std::string divisors;
        for (int64_t d = 1; d <= gb; ++d) {
          if (gb % d == 0) divisors += (divisors.empty() ? "" : ", ") + std::to_string(d);
        }
        return InvalidArgument("--dp " + std::to_string(opts.dp) + ": the checkpoint's global batch " +
                               std::to_string(gb) + " (engine_config) is not divisible by " +
                               std::to_string(opts.dp) +
                               " data-parallel ranks, so engine_min could not resume it; --dp "
                               "must divide it (" + divisors + ")");
      }
    }
    // Keep the global batch: grad_accum = global_batch / (micro_batch × dp) when it divides.
    if (ec.contains("global_batch") && ec.contains("micro_batch") && ec.contains("grad_accum") &&
        ec["global_batch"].is_number_integer() && ec["micro_batch"].is_number_integer()) {
      const int64_t gb = ec["global_batch"].get<int64_t>();
      const int64_t mb = ec["micro_batch"].get<int64_t>();
      if (mb > 0 && gb % (mb * opts.dp) == 0) {
        ec["grad_accum"] = gb / (mb * opts.dp);
      } else if (mb > 0 && gb > 0) {
        report.warnings.push_back(
            "micro-batch " + std::to_string(mb) + " x " + std::to_string(opts.dp) +
            " ranks does not divide the global batch " + std::to_string(gb) +
            ": engine_min will resume with micro-batch 1 and grad-accum " +
            std::to_string(gb / opts.dp) + " unless --micro-batch / --grad-accum say otherwise");
      }
    }
  }
  if (report.zero_stage == 0 && opts.dp > 1)
    report.warnings.push_back("ZeRO-0 on " + std::to_string(opts.dp) +
                              " ranks: rank 0 holds all optimizer state (the other rank files "
                              "hold none)");
  if (opts.on_warning)
    for (const auto& w : report.warnings) opts.on_warning(w);
  CKPT_RETURN_IF_ERROR(ValidateManifest(m), "resharded manifest");
  ReshardTarget target;
  target.world = opts.dp;
  target.zero_stage = report.zero_stage;
  target.params = m.params;
  target.partition = m.partition;

  std::string comp_text = opts.compression;
  if (comp_text.empty() && src->kind() != SourceKind::kUniversal && !sm.files.empty())
    comp_text = sm.files[0].compression;
  CKPT_ASSIGN_OR_RETURN(Compression comp, Compression::Parse(comp_text), "compression");

  nlohmann::json note = {
      {"source_tag", sm.tag},
      {"source_kind", sm.kind},
      {"source_dp_world_size", report.source_dp},
      {"source_zero_stage", report.source_zero},
      {"dp_world_size", opts.dp},
      {"zero_stage", report.zero_stage},
      {"rng", report.rng_copied
                  ? "copied from the same source rank"
                  : "omitted: the world size changed; each rank seeds its generators from "
                    "(seed, global_step, rank)"},
      {"data_position", report.rng_copied ? "copied from the same source rank"
                                          : "copied from source rank 0 (global)"},
  };

  CKPT_ASSIGN_OR_RETURN(StagedOutput staged, StagedOutput::Begin(out, env), "");

  // 3-4. Prepare and write the new ranks a few at a time, each a window at a time.
  const int threads = ReshardThreads(opts);
  report.threads = threads;
  report.ranks.resize(static_cast<size_t>(opts.dp));
  uint64_t total = 0;
  for (const auto& p : m.params)
    if (p.trainable()) total += static_cast<uint64_t>(p.numel) * 12;
  Progress progress("reshard", total, opts.progress);
  SaveOptions save;
  save.env = env;
  save.compression = comp;
  save.piece_bytes = opts.piece_bytes;
  save.fill_window_bytes = opts.window_bytes;
  const Status saved = SaveRanks(
      staged.staging(), m, threads,
      [&](int j, const WriteRankFn& write) -> Status {
        PreparedRank r;
        r.stats.rank = j;
        CKPT_RETURN_IF_ERROR(PrepareRank(src_path, opts, env, target, note, progress, r),
                             "new rank " + std::to_string(j));
        CKPT_RETURN_IF_ERROR(write(r.contents), "save");
        FinishStats(r.reader->accounting(), r.stats);
        report.ranks[static_cast<size_t>(j)] = r.stats;
        return Status::Ok();
      },
      save);
  progress.Finish();
  CKPT_RETURN_IF_ERROR(saved, "");

  // 5. Publish.
  CKPT_RETURN_IF_ERROR(staged.Commit(), "");
  return report;
}

Result<ImportReport> ImportDeepSpeed(const std::string& src_path, const std::string& out,
                                     ReshardOptions opts) {
  SourceOptions so;
  so.tag = opts.tag;
  so.env = opts.env;
  CKPT_ASSIGN_OR_RETURN(auto src, OpenStateSource(src_path, so), "");
  if (src->kind() != SourceKind::kDeepSpeed)
    return NotFound(src_path + (opts.tag.empty() ? "" : "/" + opts.tag) +
                    ": not a DeepSpeed checkpoint (no *_model_states.pt, or no `latest` naming a "
                    "directory with one)");
  ImportReport r;
  r.ds_version = src->deepspeed()->ds_version;
  r.global_step = src->manifest().counters.global_step;
  r.params = src->manifest().params.size();
  opts.dp = src->manifest().topology.dp_world_size;
  opts.zero_stage = src->manifest().topology.zero_stage;
  opts.verify_source = false;  // DeepSpeed stores no checksums to verify against
  src.reset();
  CKPT_ASSIGN_OR_RETURN(r.reshard, Reshard(src_path, out, opts), "");
  return r;
}

}  // namespace ckpt::convert
