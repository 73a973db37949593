#include "ckpt/reader.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <exception>
#include <filesystem>
#include <mutex>
#include <optional>
#include <thread>

#include "ckpt/h5.h"
#include "ckpt/hash.h"
#include "ckpt/json.h"
#include "ckpt/progress.h"
#include "ckpt/root.h"
#include "rank_file.h"

namespace ckpt {

struct CheckpointReader::Impl {
  Env* env = nullptr;
  OpenOptions options;
  std::string dir;
  Manifest manifest;
  // Each rank's file, opened at its first use (or by OpenAhead on another thread): both tables
  // are sized by Open, each slot changes under files_mu; a file is opened outside it, `opening`
  // marking the rank meanwhile.
  mutable std::mutex files_mu;
  mutable std::condition_variable files_cv;
  mutable std::vector<std::unique_ptr<internal::RankFile>> files;
  mutable std::vector<bool> opening;
  mutable uint64_t bytes_read = 0;
  // Edge pieces of verified slice reads: two per state of a resharded load's interleaved
  // master / exp_avg / exp_avg_sq reads, whatever the number of files (memory: 6 pieces).
  mutable internal::PieceCache pieces{6};

  std::string Label(int rank) const {
    const FileRecord* f = manifest.FileForRank(rank);
    return f ? f->path : RankFileName(rank);
  }

  Result<const DatasetRecord*> Record(int rank, std::string_view name) const {
    if (!manifest.FileForRank(rank))
      return NotFound(manifest.tag + ": no rank " + std::to_string(rank) + " (dp_world_size " +
                      std::to_string(manifest.topology.dp_world_size) + ")");
    const DatasetRecord* d = manifest.FindDataset(rank, name);
    if (!d) return NotFound(Label(rank) + ": no dataset '" + std::string(name) + "' in the manifest");
    return d;
  }

  Status CheckFile(const FileRecord& f) const {
    const std::string path = dir + "/" + f.path;
    if (!env->Exists(path)) return DataLoss(path + " is missing (the manifest lists it)");
    CKPT_ASSIGN_OR_RETURN(uint64_t size, env->FileSize(path), "");
    if (size != f.bytes)
      return DataLoss(path + " has " + std::to_string(size) + " bytes, the manifest records " +
                      std::to_string(f.bytes) + " (truncated or replaced)");
    return Status::Ok();
  }

  Result<internal::RankFile*> File(int rank) const {
    const auto i = static_cast<size_t>(rank);
    {
      std::unique_lock<std::mutex> lock(files_mu);
      if (i >= files.size()) return NotFound("no rank file " + std::to_string(rank));
      files_cv.wait(lock, [&] { return !opening[i]; });
      if (files[i]) return files[i].get();
      opening[i] = true;
    }
    // However the open ends (an error, an exception), the rank is no longer being opened.
    std::unique_ptr<internal::RankFile> file;
    struct Done {
      const Impl* impl;
      size_t i;
      std::unique_ptr<internal::RankFile>* file;
      ~Done() {
        std::lock_guard<std::mutex> lock(impl->files_mu);
        impl->opening[i] = false;
        if (*file) impl->files[i] = std::move(*file);
        impl->files_cv.notify_all();
      }
    };
    internal::RankFile* opened_file = nullptr;
    {
      Done done{this, i, &file};
      const FileRecord* f = manifest.FileForRank(rank);
      CKPT_RETURN_IF_ERROR(CheckFile(*f), "");
      CKPT_ASSIGN_OR_RETURN(file, internal::RankFile::Open(dir + "/" + f->path, f->path, *f, env));
      opened_file = file.get();
    }
    return opened_file;
  }
};

CheckpointReader::CheckpointReader(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
CheckpointReader::CheckpointReader(CheckpointReader&&) noexcept = default;
CheckpointReader& CheckpointReader::operator=(CheckpointReader&&) noexcept = default;
CheckpointReader::~CheckpointReader() = default;

Result<CheckpointReader> CheckpointReader::Open(const std::string& path, const std::string& tag,
                                                OpenOptions options) {
  auto impl = std::make_unique<Impl>();
  impl->env = options.env ? options.env : Env::Default();
  impl->options = options;
  CKPT_ASSIGN_OR_RETURN(impl->dir, ResolveTagDir(path, tag, impl->env), "");
  CKPT_ASSIGN_OR_RETURN(impl->manifest, ReadTagManifest(impl->dir, impl->env));
  if (impl->manifest.kind != "sharded")
    return InvalidArgument(impl->dir + " is a " + impl->manifest.kind +
                           " checkpoint; open it with the convert tools");
  impl->files.resize(impl->manifest.files.size());
  impl->opening.resize(impl->manifest.files.size());
  return CheckpointReader(std::move(impl));
}

const Manifest& CheckpointReader::manifest() const { return impl_->manifest; }
const std::string& CheckpointReader::dir() const { return impl_->dir; }
const std::string& CheckpointReader::tag() const { return impl_->manifest.tag; }

Status CheckpointReader::CheckFiles() const {
  for (const FileRecord& f : impl_->manifest.files) CKPT_RETURN_IF_ERROR(impl_->CheckFile(f), "");
  return Status::Ok();
}
Status CheckpointReader::OpenAhead(int rank) const {
  if (!impl_->manifest.FileForRank(rank)) return NotFound("no rank " + std::to_string(rank));
  return impl_->File(rank).status();
}
uint64_t CheckpointReader::bytes_read() const { return impl_->bytes_read; }

Status CheckpointReader::ReadDataset(int rank, std::string_view name, void* out,
                                     uint64_t out_bytes) const {
  CKPT_ASSIGN_OR_RETURN(const DatasetRecord* rec, impl_->Record(rank, name), "");
  if (out_bytes != rec->bytes)
    return InvalidArgument(impl_->Label(rank) + ": dataset /" + rec->name + " holds " +
                           std::to_string(rec->bytes) + " bytes, caller expects " +
                           std::to_string(out_bytes));
  CKPT_ASSIGN_OR_RETURN(internal::RankFile * f, impl_->File(rank), "");
  std::optional<Xxh3Stream> digest;
  if (impl_->options.verify_checksums) digest.emplace();
  CKPT_RETURN_IF_ERROR(f->ReadAll(*rec, out, digest ? &*digest : nullptr), "");
  impl_->bytes_read += rec->bytes;
  if (digest) {
    const std::string got = digest->HexDigest();
    if (got != rec->xxh3)
      return DataLoss(impl_->Label(rank) + ": dataset /" + rec->name +
                      ": checksum mismatch (manifest " + rec->xxh3 + ", data " + got + ")");
  }
  return Status::Ok();
}

Result<std::vector<uint8_t>> CheckpointReader::ReadDatasetBytes(int rank,
                                                                std::string_view name) const {
  CKPT_ASSIGN_OR_RETURN(const DatasetRecord* rec, impl_->Record(rank, name), "");
  std::vector<uint8_t> out(rec->bytes);
  CKPT_RETURN_IF_ERROR(ReadDataset(rank, name, out.data(), out.size()), "");
  return out;
}

Result<std::string> CheckpointReader::ReadBlob(int rank, std::string_view name) const {
  CKPT_ASSIGN_OR_RETURN(std::vector<uint8_t> bytes, ReadDatasetBytes(rank, name), "");
  return std::string(bytes.begin(), bytes.end());
}

Result<nlohmann::json> CheckpointReader::ReadJson(int rank, std::string_view name) const {
  CKPT_ASSIGN_OR_RETURN(std::string text, ReadBlob(rank, name), "");
  return ParseJson(text, impl_->Label(rank) + ": dataset /" + std::string(name));
}

Status CheckpointReader::ReadSlice(int rank, std::string_view name, int64_t offset, int64_t count,
                                   void* out) const {
  CKPT_ASSIGN_OR_RETURN(const DatasetRecord* rec, impl_->Record(rank, name), "");
  CKPT_ASSIGN_OR_RETURN(internal::RankFile * f, impl_->File(rank), "");
  if (impl_->options.verify_checksums && rec->has_pieces())
    return f->ReadSliceVerified(*rec, offset, count, out, &impl_->bytes_read, &impl_->pieces);
  return ReadSliceUnverified(rank, name, offset, count, out);
}

Status CheckpointReader::ReadSliceUnverified(int rank, std::string_view name, int64_t offset,
                                             int64_t count, void* out) const {
  CKPT_ASSIGN_OR_RETURN(const DatasetRecord* rec, impl_->Record(rank, name), "");
  CKPT_ASSIGN_OR_RETURN(internal::RankFile * f, impl_->File(rank), "");
  CKPT_RETURN_IF_ERROR(f->ReadSlice(*rec, offset, count, out), "");
  impl_->bytes_read += static_cast<uint64_t>(count) * DTypeSize(rec->dtype);
  return Status::Ok();
}

Result<std::optional<uint64_t>> CheckpointReader::SliceFileOffset(int rank, std::string_view name,
                                                                  int64_t offset) const {
  CKPT_ASSIGN_OR_RETURN(const DatasetRecord* rec, impl_->Record(rank, name), "");
  CKPT_ASSIGN_OR_RETURN(internal::RankFile * f, impl_->File(rank), "");
  return f->SliceFileOffset(*rec, offset);
}

Status CheckpointReader::VerifyDataset(int rank, std::string_view name) const {
  CKPT_ASSIGN_OR_RETURN(const DatasetRecord* rec, impl_->Record(rank, name), "");
  CKPT_ASSIGN_OR_RETURN(internal::RankFile * f, impl_->File(rank), "");
  impl_->bytes_read += rec->bytes;
  return f->VerifyDataset(*rec);
}

Status CheckpointReader::ReadParamRange(std::string_view param, std::string_view state,
                                        int64_t begin, int64_t end, float* out) const {
  const ParamEntry* p = impl_->manifest.FindParam(param);
  if (!p) return NotFound(impl_->manifest.tag + ": no parameter '" + std::string(param) + "'");
  if (!p->tied_to.empty()) p = impl_->manifest.FindParam(p->tied_to);
  if (p->frozen)
    return InvalidArgument("parameter '" + p->name + "' is frozen: it has no partitioned state");
  if (state != kMaster && state != kExpAvg && state != kExpAvgSq)
    return InvalidArgument("unknown state '" + std::string(state) + "'");
  if (begin < 0 || end > p->numel || begin > end)
    return InvalidArgument("parameter '" + p->name + "': range [" + std::to_string(begin) + ", " +
                           std::to_string(end) + ") outside [0, " + std::to_string(p->numel) + ")");
  for (const auto& r : p->ranges) {
    const int64_t lo = std::max(begin, r.begin), hi = std::min(end, r.end);
    if (lo >= hi) continue;
    CKPT_RETURN_IF_ERROR(ReadSlice(r.rank, state, r.shard_offset + (lo - r.begin), hi - lo,
                                   out + (lo - begin)),
                         "parameter '" + p->name + "'");
  }
  return Status::Ok();
}

Result<std::vector<float>> CheckpointReader::ReadParamFull(std::string_view param,
                                                           std::string_view state) const {
  const ParamEntry* p = impl_->manifest.FindParam(param);
  if (!p) return NotFound(impl_->manifest.tag + ": no parameter '" + std::string(param) + "'");
  if (!p->tied_to.empty()) p = impl_->manifest.FindParam(p->tied_to);
  std::vector<float> out(static_cast<size_t>(p->numel));
  if (!p->frozen) {
    CKPT_RETURN_IF_ERROR(ReadParamRange(p->name, state, 0, p->numel, out.data()), "");
    return out;
  }
  if (state != kMaster)
    return InvalidArgument("parameter '" + p->name + "' is frozen: it has no optimizer state");
  const std::string name = std::string(kFrozenPrefix) + p->name;
  CKPT_ASSIGN_OR_RETURN(std::vector<uint8_t> raw, ReadDatasetBytes(0, name), "");
  if (!FloatsToF32(p->dtype, raw.data(), out.size(), out.data()))
    return InvalidArgument("parameter '" + p->name + "': dtype " +
                           std::string(DTypeName(p->dtype)) + " is not a float type");
  return out;
}

// ---------------------------------------------------------------------------------------------


namespace {

// A problem names its file and dataset in fields of their own; its text does not repeat them
// ("rank_00001.h5 /exp_avg: checksum mismatch", not "... /exp_avg: rank_00001.h5: dataset
// /exp_avg: checksum mismatch").
std::string ProblemText(std::string what, const std::string& file, const std::string& dataset) {
  std::vector<std::string> prefixes = {file + ": "};
  if (!dataset.empty()) prefixes.insert(prefixes.end(), {"dataset /" + dataset + ": ", dataset + ": "});
  for (const std::string& prefix : prefixes) {
    if (what.rfind(prefix, 0) == 0) what.erase(0, prefix.size());
  }
  return what;
}

}  // namespace

Result<std::vector<Problem>> CheckCheckpoint(const std::string& tag_dir, bool deep, Env* env,
                                             bool progress) {
  if (!env) env = Env::Default();
  std::vector<Problem> problems;
  OpenOptions opts;
  opts.env = env;
  auto reader = CheckpointReader::Open(tag_dir, "", opts);
  if (!reader.ok()) {
    if (reader.status().code() == StatusCode::kNotFound) return reader.status();
    problems.push_back({std::string(kManifestFile), "", reader.status().message()});
    return problems;
  }
  const Manifest& m = reader->manifest();
  std::string dir_name = reader->dir();
  while (dir_name.size() > 1 && dir_name.back() == '/') dir_name.pop_back();
  dir_name = std::filesystem::path(dir_name).filename().string();
  if (dir_name != m.tag)
    problems.push_back({std::string(kManifestFile), "",
                        "the manifest names tag '" + m.tag + "', not its directory's name '" +
                            dir_name + "' (a copied or renamed tag directory)"});
  uint64_t total = 0;
  for (const auto& f : m.files) total += f.bytes;
  Progress bar("check --deep", total, progress && deep);
  // Each file is checked on its own (in parallel: more requests in flight, and the hashing
  // spread over the cores); the problems are reported in file order. The HDF5 part of each
  // file (having libhdf5 parse it, placing its datasets, closing its HDF5 handles unless the
  // pass needs them) runs one file at a time: libhdf5 serialises its calls anyway, and a file
  // whose HDF5 state is freed before the next is opened lends it its metadata cache (about 0.5
  // MiB that H5Fopen calloc's; first-touched memory costs the development VM ~24 us a page). A
  // shallow check of four files took 34.3 -> 27.1 ms, check --deep 0.221 -> 0.211 s (issue 19).
  // With --deep, the seals of the first round of files (one per thread; a seal is a few small
  // reads outside the datasets and no libhdf5 call) are all verified, in parallel and outside
  // the lock, before any file's data pass begins: a small read of a cold file queued behind
  // another file's 8 MiB reads waited 27-39 ms on the development VM, three such reads in each
  // open, and each file's data pass began that much after the one before it (issue 19,
  // docs/performance.md).
  static std::mutex open_mu;  // process-wide: concurrent checks share libhdf5 too
  std::vector<std::vector<Problem>> found(m.files.size());
  std::vector<std::unique_ptr<internal::RankFile>> sealed(m.files.size());
  // One thread per file up to 16: the pass is I/O-bound (4 MiB per thread in memory); the
  // raw read floor uses one thread per file too.
  const size_t workers = std::min<size_t>(m.files.size(), 16);
  // With --deep the first `workers` files are sealed first, in parallel; any other file is
  // opened whole by the thread that checks it, under the lock, as a shallow check opens every
  // file (it reads no data, so no seal read can wait behind a large one).
  const size_t seal_first = deep ? workers : 0;
  // Whether file i, at `path`, is there at the size the manifest records (else its problem is
  // recorded).
  auto present = [&](size_t i, const std::string& path) {
    const FileRecord& f = m.files[i];
    if (!env->Exists(path)) {
      found[i].push_back({f.path, "", "file is missing"});
      return false;
    }
    auto size = env->FileSize(path);
    if (!size.ok() || *size != f.bytes) {
      found[i].push_back({f.path, "",
                          "size " + (size.ok() ? std::to_string(*size) : std::string("unknown")) +
                              " bytes, manifest records " + std::to_string(f.bytes)});
      return false;
    }
    return true;
  };
  // Opens file i, verifying its size and HDF5 metadata (the seal, or the whole-file digest of
  // files before 1.2) before libhdf5 parses it: with `parse` the whole open, else the
  // verification alone (RankFile::OpenUnparsed). Null when a problem was recorded.
  auto open_file = [&](size_t i, bool parse) -> std::unique_ptr<internal::RankFile> {
    const FileRecord& f = m.files[i];
    const std::string path = reader->dir() + "/" + f.path;
    if (!present(i, path)) return nullptr;
    auto rf = parse ? internal::RankFile::Open(path, f.path, f, env)
                    : internal::RankFile::OpenUnparsed(path, f.path, f, env);
    if (!rf.ok()) {
      found[i].push_back({f.path, "", ProblemText(rf.status().message(), f.path, "")});
      return nullptr;
    }
    return std::move(*rf);
  };
  auto seal_file = [&](size_t i) { sealed[i] = open_file(i, /*parse=*/false); };
  auto check_file = [&](size_t i) {
    const FileRecord& f = m.files[i];
    std::vector<Problem>* out = &found[i];
    std::unique_ptr<internal::RankFile> unparsed;
    if (i >= seal_first && deep) {
      // A file after the first round: its seal (and probe) outside the lock too, beside the
      // other files' data passes. Under the lock its small reads, queued behind those passes'
      // 8 MiB reads, held up every other file's HDF5 open: 64 files of 16 MiB kept 3.5 reads
      // in flight (issue 19, docs/performance.md, 2026-12-07 20:15).
      unparsed = open_file(i, /*parse=*/false);
      if (!unparsed) return;  // its problem is recorded
    } else if (i >= seal_first) {
      // Its HDF5 probe (when one is set) outside the lock, beside the other files'; the open
      // under the lock then finds the file walked (a refusal it reports itself).
      const std::string path = reader->dir() + "/" + f.path;
      if (env->Exists(path)) (void)h5::ProbeStructure(path, f.path);
    }
    std::unique_lock<std::mutex> hdf5_lock(open_mu);
    // Declared after the lock: a file that keeps its HDF5 handles closes them before the lock
    // is released, so that the next file opened reuses its metadata cache.
    std::unique_ptr<internal::RankFile> rf = i < seal_first ? std::move(sealed[i])
                                             : unparsed     ? std::move(unparsed)
                                                            : open_file(i, /*parse=*/true);
    if (!rf) return;  // its problem is recorded
    if (Status parsed = rf->Parse(); !parsed.ok()) {
      out->push_back({f.path, "", ProblemText(parsed.message(), f.path, "")});
      return;
    }
    if (!deep) {
      for (const auto& d : f.datasets) {
        Status s = rf->CheckShape(d);
        if (!s.ok()) out->push_back({f.path, d.name, ProblemText(s.message(), f.path, d.name)});
      }
      return;
    }
    auto plan = rf->PlanWholeFile(f.datasets);
    if (!plan.ok()) {
      out->push_back({f.path, "", ProblemText(plan.status().message(), f.path, "")});
      return;
    }
    if (!plan->needs_hdf5()) rf->CloseHdf5();
    hdf5_lock.unlock();
    // One pass over the file: its digest and every dataset's from the same bytes.
    auto checked = rf->RunWholeFile(f.datasets, *plan, [&](uint64_t n) { bar.Add(n); });
    if (!checked.ok()) {
      out->push_back({f.path, "", ProblemText(checked.status().message(), f.path, "")});
      return;
    }
    if (!f.xxh3.empty() && checked->file_xxh3 != f.xxh3)
      out->push_back({f.path, "", "file checksum mismatch (manifest " + f.xxh3 + ", file " +
                                      checked->file_xxh3 + ")"});
    for (size_t d = 0; d < f.datasets.size(); ++d) {
      const Status& s = checked->datasets[d];
      const std::string& name = f.datasets[d].name;
      if (!s.ok()) out->push_back({f.path, name, ProblemText(s.message(), f.path, name)});
    }
  };
  // (`step` a lambda, not a std::function: constructing one allocates, and a worker's first
  // allocation made before it holds the lock gives it an arena of its own at once, where one
  // made after can take over the arena of a worker that has finished, with its last file's
  // freed and already-touched HDF5 memory: a shallow check of four files took 4 ms longer.)
  auto guarded = [&](size_t i, const auto& step) {
    try {
      step(i);
    } catch (const std::bad_alloc&) {
      sealed[i].reset();
      found[i].push_back({m.files[i].path, "", "out of memory while checking the file"});
    }
  };
  // Any thread that started takes part in the first seals, so the wait for them ends however
  // many started.
  std::atomic<size_t> next_seal{0}, next{0};
  std::mutex sealed_mu;
  std::condition_variable sealed_cv;
  size_t sealed_count = 0;  // under sealed_mu
  auto worker = [&] {
    for (size_t i = next_seal++; i < seal_first; i = next_seal++) {
      guarded(i, seal_file);
      std::lock_guard<std::mutex> lock(sealed_mu);
      if (++sealed_count == seal_first) sealed_cv.notify_all();
    }
    {
      std::unique_lock<std::mutex> lock(sealed_mu);
      sealed_cv.wait(lock, [&] { return sealed_count == seal_first; });
    }
    for (size_t i = next++; i < m.files.size(); i = next++) guarded(i, check_file);
  };
  // The files' HDF5 probes (with a probe set: ckpt::SetHdf5Probe) in one process per core
  // (up to 8), each walking several files, instead of one process per file: a process start
  // is most of a probe's cost (docs/reliability.md, "Hostile files"). Each file's open waits
  // for its word.
  std::vector<std::string> paths;
  for (const FileRecord& f : m.files) paths.push_back(reader->dir() + "/" + f.path);
  h5::ProbeBatch probes(paths);
  if (workers <= 1) {
    worker();
  } else {
    std::vector<std::thread> threads;
    try {
      for (size_t t = 0; t < workers; ++t) threads.emplace_back(worker);
    } catch (const std::exception&) {
      // Fewer threads than asked (a thread limit, or no memory for one): those that started
      // do all the files.
    }
    if (threads.empty()) worker();
    for (auto& t : threads) t.join();
  }
  for (auto& v : found) problems.insert(problems.end(), v.begin(), v.end());
  bar.Finish();
  return problems;
}

nlohmann::json InspectToJson(const CheckpointReader& reader) {
  return InspectToJson(reader.manifest(), reader.dir());
}

nlohmann::json InspectToJson(const Manifest& m, const std::string& dir) {
  using nlohmann::json;
  json params = json::array();
  for (const auto& p : m.params) {
    params.push_back({{"name", p.name},
                      {"shape", p.shape},
                      {"dtype", std::string(DTypeName(p.dtype))},
                      {"numel", p.numel},
                      {"frozen", p.frozen},
                      {"tied_to", p.tied_to.empty() ? json(nullptr) : json(p.tied_to)}});
  }
  uint64_t bytes = 0;
  for (const auto& f : m.files) bytes += f.bytes;
  const json full = ManifestHeaderToJson(m);
  return {{"tag", m.tag},
          {"dir", dir},
          {"kind", m.kind},
          // The version the file was written with, not this reader's.
          {"format_version",
           std::to_string(m.version_major) + "." + std::to_string(m.version_minor)},
          {"writer", m.writer},
          {"created_utc", m.created_utc},
          {"global_step", m.counters.global_step},
          {"counters", full["counters"]},
          {"dp_world_size", m.topology.dp_world_size},
          {"zero_stage", m.topology.zero_stage},
          {"topology", full["topology"]},
          {"optimizer", m.optimizer},
          {"dtypes", m.dtypes},
          {"partition", full["partition"]},
          {"params", params},
          {"total_params", m.UniqueParamCount()},
          {"bytes", bytes},
          {"client_state", m.client_state},
          {"engine_config", m.engine_config}};
}

nlohmann::json CheckReportToJson(const std::vector<Problem>& problems, const std::string& dir,
                                 bool deep) {
  nlohmann::json pj = nlohmann::json::array();
  for (const auto& p : problems)
    pj.push_back({{"file", p.file}, {"dataset", p.dataset}, {"what", p.what}});
  return {{"ok", problems.empty()},
          {"dir", dir.empty() ? nlohmann::json(nullptr) : nlohmann::json(dir)},
          {"deep", deep},
          {"problems", std::move(pj)}};
}

}  // namespace ckpt
