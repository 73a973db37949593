// Saving a checkpoint.
//
// Commit protocol (SaveCheckpoint). Every step that touches the file system goes through Env,
// so tests can fail each one and simulate power loss between them.
//  1. Rank 0 creates ROOT if needed (fsyncing the parent of each directory it creates),
//     validates the manifest, takes ROOT/.lock (flock: a second saver fails here with
//     FailedPrecondition), refuses a tag that already exists, creates ROOT/.tmp-<tag>-<nonce>/
//     and fsyncs ROOT. It broadcasts the temporary path, or its error, to every rank.
//  2. Every rank writes rank_<r>.h5 into the temporary directory: HDF5 writes the structure
//     (and zstd chunks, compressed outside its global lock), then the uncompressed bytes go in
//     with pwrite, each piece hashed into its dataset's XXH3 and (file_checksum) the file's XXH3
//     just before it is written: one pass over the data (ckpt/src/rank_file.cc).
//  3. Every rank fsyncs its file.
//  4. Every rank sends its FileRecord, or its error, to rank 0 (Gather).
//  5. Rank 0: if any rank failed, it removes the temporary directory and broadcasts the failure.
//     Otherwise it writes manifest.json in the temporary directory (temp name, fsync, rename)
//     and fsyncs that directory.
//  6. Rank 0 renames the temporary directory to ROOT/<tag> and fsyncs ROOT. The tag is now
//     committed: it is complete on disk, with every byte accounted for in its manifest.
//  7. Rank 0 replaces ROOT/latest (temp name, fsync, rename, fsync ROOT). `latest` therefore
//     only ever names a committed tag.
//  8. Rank 0 applies retention (keep_last: older tags are first renamed to temporary names,
//     then deleted), releases the lock and broadcasts the outcome, which every rank returns.
// A crash anywhere leaves the previous tags and `latest` untouched; at worst a .tmp-* directory
// remains, which `ckpt gc` removes (never while a live saver holds the lock).
#include "ckpt/writer.h"

#include <chrono>
#include <csignal>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <mutex>
#include <random>
#include <thread>

#include "ckpt/h5.h"
#include "ckpt/hash.h"
#include "ckpt/rank_threads.h"
#include "ckpt/root.h"
#include "ckpt/save_ranks.h"
#include "ckpt/utc_time.h"
#include "rank_file.h"

namespace ckpt {

using nlohmann::json;

Result<Compression> Compression::Parse(std::string_view text) {
  Compression c;
  std::string s(text);
  if (s.empty() || s == "none") return c;
  const std::string shuffle_suffix = "+shuffle";
  if (s.size() > shuffle_suffix.size() &&
      s.compare(s.size() - shuffle_suffix.size(), shuffle_suffix.size(), shuffle_suffix) == 0) {
    c.shuffle = true;
    s.resize(s.size() - shuffle_suffix.size());
  }
  if (s.rfind("zstd", 0) != 0)
    return InvalidArgument("compression '" + std::string(text) +
                           "': expected none, zstd, zstd:LEVEL or zstd:LEVEL+shuffle");
  c.kind = Kind::kZstd;
  if (s.size() > 4) {
    if (s[4] != ':')
      return InvalidArgument("compression '" + std::string(text) + "': expected zstd:LEVEL");
    try {
      size_t used = 0;
      c.level = std::stoi(s.substr(5), &used);
      if (used != s.size() - 5) throw std::invalid_argument("trailing");
    } catch (const std::exception&) {
      return InvalidArgument("compression '" + std::string(text) + "': bad zstd level");
    }
    if (c.level < 1 || c.level > 22)
      return InvalidArgument("compression '" + std::string(text) + "': zstd level must be 1..22");
  }
  return c;
}

std::string Compression::ToString() const {
  if (kind == Kind::kNone) return "none";
  return "zstd:" + std::to_string(level) + (shuffle ? "+shuffle" : "");
}

DatasetSpec DatasetSpec::Tensor(std::string name, DType dtype, std::vector<int64_t> shape,
                                const void* data) {
  DatasetSpec s;
  s.name = std::move(name);
  s.dtype = dtype;
  s.shape = std::move(shape);
  s.data = data;
  return s;
}

DatasetSpec DatasetSpec::Filled(std::string name, DType dtype, std::vector<int64_t> shape,
                                DatasetFill fill) {
  DatasetSpec s = Tensor(std::move(name), dtype, std::move(shape), nullptr);
  s.fill = std::move(fill);
  return s;
}

DatasetSpec DatasetSpec::Blob(std::string name, std::string blob_kind, std::string_view bytes) {
  DatasetSpec s;
  s.name = std::move(name);
  s.kind = "blob";
  s.blob_kind = std::move(blob_kind);
  s.dtype = DType::kU8;
  s.shape = {static_cast<int64_t>(bytes.size())};
  s.data = bytes.data();
  return s;
}

DatasetSpec DatasetSpec::Json(std::string name, std::string_view json_text) {
  DatasetSpec s = Blob(std::move(name), "", json_text);
  s.kind = "json";
  return s;
}

namespace {

// The ranks' messages as text. Paths are bytes and need not be UTF-8: messages carry the
// staging directory by its name inside ROOT (which every rank knows), and an error text with
// such bytes gets U+FFFD instead of making dump() throw.
std::string WireText(const json& j) {
  return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

json StatusToJson(const Status& s) {
  return {{"code", static_cast<int>(s.code())}, {"message", s.message()}};
}

Status StatusFromJson(const json& j) {
  if (!j.is_object() || !j.contains("code")) return Internal("malformed status from a peer");
  const int code = j["code"].get<int>();
  if (code == 0) return Status::Ok();
  return Status(static_cast<StatusCode>(code), j.value("message", ""));
}

std::string Nonce() {
  std::random_device rd;
  char buf[24];
  std::snprintf(buf, sizeof buf, "%08x%08x", rd(), rd());
  return buf;
}

// Steps 2-3 on one rank.
Result<FileRecord> WriteMyFile(const std::string& tmp_dir, const Manifest& meta,
                               const RankContents& mine, int rank, int world, Env* env,
                               const SaveOptions& options) {
  FileRecord rec;
  rec.rank = rank;
  rec.path = RankFileName(rank);
  rec.compression = options.compression.ToString();
  const std::string path = tmp_dir + "/" + rec.path;
  CKPT_RETURN_IF_ERROR(env->BeginExternalWrite(path), "");
  internal::RankFileHeader header;
  header.rank = rank;
  header.world = world;
  header.tag = meta.tag;
  CKPT_ASSIGN_OR_RETURN(internal::RankFileWritten written,
                        internal::WriteRankFile(path, header, mine.datasets, options), "");
  CKPT_RETURN_IF_ERROR(env->SyncFile(path), "");
  CKPT_ASSIGN_OR_RETURN(rec.bytes, env->FileSize(path), "");
  if (rec.bytes != written.bytes)
    return Internal(path + ": " + std::to_string(rec.bytes) + " bytes on disk after writing " +
                    std::to_string(written.bytes));
  rec.datasets = std::move(written.datasets);
  rec.xxh3 = std::move(written.file_xxh3);
  rec.data_extents = std::move(written.data_extents);
  rec.metadata_xxh3 = std::move(written.metadata_xxh3);
  return rec;
}

struct Prepared {
  std::string tmp_dir;
};

// Step 1 on rank 0.
Result<Prepared> Prepare(const std::string& root, const Manifest& meta, Env* env) {
  CKPT_RETURN_IF_ERROR(ValidateManifest(meta), "manifest for tag '" + meta.tag + "'");
  const std::string target = root + "/" + meta.tag;
  if (env->Exists(target))
    return AlreadyExists(target + " already exists; a committed tag is never overwritten");
  Prepared p;
  p.tmp_dir = root + "/" + std::string(kTempPrefix) + meta.tag + "-" + Nonce();
  CKPT_RETURN_IF_ERROR(env->CreateDir(p.tmp_dir), "");
  CKPT_RETURN_IF_ERROR(env->SyncDir(root), "");
  return p;
}

// Steps 5-8 on rank 0, after every rank wrote its file.
Status Commit(const std::string& root, const std::string& tmp_dir, Manifest meta,
              std::vector<FileRecord> files, Env* env, const SaveOptions& options) {
  meta.files = std::move(files);
  meta.created_utc = UtcNow(&meta.created_unix);
  meta.format = std::string(kFormatName);
  meta.version_major = kFormatMajor;
  meta.version_minor = kFormatMinor;
  meta.writer = std::string(kWriterVersion);
  meta.sets_latest = options.update_latest;
  CKPT_RETURN_IF_ERROR(ValidateManifest(meta), "manifest");
  const std::string text = SerializeManifest(meta, 1);
  CKPT_RETURN_IF_ERROR(WriteFileAtomic(env, tmp_dir + "/" + std::string(kManifestFile), text),
                       "write manifest");
  const std::string target = root + "/" + meta.tag;
  if (env->Exists(target)) return AlreadyExists(target + " appeared during the save");
  CKPT_RETURN_IF_ERROR(env->RenameFile(tmp_dir, target), "commit tag");
  CKPT_RETURN_IF_ERROR(env->SyncDir(root), "commit tag");
  if (options.update_latest) {
    CKPT_RETURN_IF_ERROR(
        WriteFileAtomic(env, root + "/" + std::string(kLatestFile),
                        LatestFileText(meta.tag, meta.counters.global_step)),
        "tag '" + meta.tag + "' is committed but `latest` was not updated");
  }
  if (options.keep_last > 0) {
    auto removed = ApplyRetention(root, options.keep_last, env);
    if (!removed.ok()) return removed.status().WithContext("retention after commit");
  }
  return Status::Ok();
}

// Step 1's lock: a save waits (bounded, told once) while a gc or another save holds it.
Result<RootLock> AcquireForSave(const std::string& root, Env* env, const SaveOptions& options,
                                const std::string& what) {
  auto on_wait = options.on_lock_wait ? options.on_lock_wait : [&](const std::string& msg) {
    std::fprintf(stderr, "ckpt: %s: %s\n", what.c_str(), msg.c_str());
  };
  return RootLock::Acquire(root, env, options.lock_wait_seconds, on_wait);
}

}  // namespace

Status SaveRanks(const std::string& root, const Manifest& meta, int threads,
                 const ProduceRankFn& produce, const SaveOptions& options_in) {
  SaveOptions options = options_in;
  Env* env = options.env ? options.env : Env::Default();
  const int world = meta.topology.dp_world_size;
  const std::string what = "save " + root + "/" + meta.tag;
  if (world < 1) return InvalidArgument(what + ": dp_world_size " + std::to_string(world));
  threads = std::clamp(threads, 1, world);
  if (options.compress_threads <= 0)
    options.compress_threads =
        std::max(1, static_cast<int>(std::max(1u, std::thread::hardware_concurrency())) / threads);

  // Step 1.
  CKPT_RETURN_IF_ERROR(env->CreateDirs(root), what + ": create checkpoint root " + root);
  CKPT_ASSIGN_OR_RETURN(RootLock lock, AcquireForSave(root, env, options, what), what);
  CKPT_ASSIGN_OR_RETURN(Prepared prepared, Prepare(root, meta, env), what);
  const std::string& tmp_dir = prepared.tmp_dir;

  // Steps 2-3, rank after rank on `threads` threads; a rank's contents live only inside its
  // produce() call.
  std::vector<Result<FileRecord>> records(static_cast<size_t>(world),
                                          Internal("rank not written"));
  std::mutex mu;
  int next = 0;
  bool failed = false;
  auto worker = [&] {
    for (;;) {
      int r;
      {
        std::lock_guard<std::mutex> l(mu);
        if (failed || next == world) return;
        r = next++;
      }
      Result<FileRecord>& rec = records[static_cast<size_t>(r)];
      bool written = false;
      // A failed allocation (building or writing the rank) is this rank's error.
      const Status s = OutOfMemoryAsStatus("rank " + std::to_string(r), [&] {
        return produce(r, [&](const RankContents& contents) -> Status {
          if (written) return Internal("rank " + std::to_string(r) + " written twice");
          written = true;
          rec = WriteMyFile(tmp_dir, meta, contents, r, world, env, options);
          return rec.status().WithContext("rank " + std::to_string(r));
        });
      });
      if (!s.ok()) {
        rec = s;
      } else if (!written) {
        rec = Internal("rank " + std::to_string(r) + ": no contents were written");
      }
      if (!rec.ok()) {
        std::lock_guard<std::mutex> l(mu);
        failed = true;
      }
    }
  };
  // Ranks share nothing until the commit, so workers that cannot start (at a thread limit)
  // leave their ranks to those that did, and this thread then takes whatever rank is left
  // (all of them when no thread could start). A failure outside a rank fails the save, never
  // the process.
  const std::vector<Status> workers = RunOnThreads(threads, [&](int) {
    worker();
    return Status::Ok();
  });
  const Status inline_worker = OutOfMemoryAsStatus("save", [&] {
    worker();
    return Status::Ok();
  });

  // Steps 5-8.
  Status s = [&]() -> Status {
    CKPT_RETURN_IF_ERROR(inline_worker, "");
    bool all_written = true;
    for (const auto& rec : records) all_written = all_written && rec.ok();
    // A worker's own failure matters only when a rank was left unwritten by it (a worker that
    // could not start left nothing: its ranks were written by the others).
    if (!all_written)
      for (const Status& w : workers) CKPT_RETURN_IF_ERROR(w, "");
    std::vector<FileRecord> files;
    for (auto& rec : records) {
      CKPT_RETURN_IF_ERROR(rec.status(), "");
      files.push_back(std::move(rec).value());
    }
    return Commit(root, tmp_dir, meta, std::move(files), env, options);
  }();
  if (!s.ok() && env->Exists(tmp_dir)) env->RemoveDirRecursive(tmp_dir).IgnoreError();
  return s.WithContext(what);
}

Status SaveCheckpoint(const std::string& root, const Manifest& meta, const RankContents& mine,
                      Collective& comm, const SaveOptions& options_in) {
  SaveOptions options = options_in;
  Env* env = options.env ? options.env : Env::Default();
  const int rank = comm.rank();
  const int world = comm.world_size();
  const std::string what = "save " + root + "/" + meta.tag;

  // Step 1.
  std::optional<RootLock> lock;
  std::string prepare_msg;
  std::string created_tmp;  // rank 0: the temporary directory it created
  if (rank == 0) {
    Status s = [&]() -> Status {
      if (meta.topology.dp_world_size != world)
        return InvalidArgument("manifest dp_world_size " +
                               std::to_string(meta.topology.dp_world_size) +
                               " != collective world size " + std::to_string(world));
      CKPT_RETURN_IF_ERROR(env->CreateDirs(root), "create checkpoint root " + root);
      CKPT_ASSIGN_OR_RETURN(RootLock l, AcquireForSave(root, env, options, what));
      lock.emplace(std::move(l));
      CKPT_ASSIGN_OR_RETURN(Prepared p, Prepare(root, meta, env), "");
      created_tmp = p.tmp_dir;
      const std::string tmp_name = std::filesystem::path(p.tmp_dir).filename().string();
      prepare_msg = WireText(json{{"status", StatusToJson(Status::Ok())}, {"tmp", tmp_name}});
      return Status::Ok();
    }();
    if (!s.ok()) prepare_msg = WireText(json{{"status", StatusToJson(s)}, {"tmp", ""}});
  }
  auto broadcast = comm.Broadcast(prepare_msg);
  if (!broadcast.ok()) {
    if (!created_tmp.empty()) env->RemoveDirRecursive(created_tmp).IgnoreError();
    return broadcast.status().WithContext(what);
  }
  const std::string prepared = std::move(broadcast).value();
  json pj = json::parse(prepared, nullptr, false);
  if (pj.is_discarded()) return Internal(what + ": malformed broadcast");
  CKPT_RETURN_IF_ERROR(StatusFromJson(pj["status"]), what);
  const std::string tmp_dir = root + "/" + pj["tmp"].get<std::string>();

  // Steps 2-4.
  auto mine_rec = OutOfMemoryAsStatus("write " + RankFileName(rank), [&] {
    return WriteMyFile(tmp_dir, meta, mine, rank, world, env, options);
  });
  json report;
  if (mine_rec.ok()) {
    report = {{"status", StatusToJson(Status::Ok())}, {"file", FileRecordToJson(*mine_rec)}};
  } else {
    report = {{"status", StatusToJson(mine_rec.status().WithContext("rank " + std::to_string(rank)))}};
  }
  auto gathered = comm.Gather(WireText(report));
  if (!gathered.ok()) {
    // The group broke (a rank died or aborted): nothing will commit this directory.
    if (rank == 0 && env->Exists(tmp_dir)) env->RemoveDirRecursive(tmp_dir).IgnoreError();
    return gathered.status().WithContext(what);
  }
  std::vector<std::string> reports = std::move(gathered).value();

  // Steps 5-8.
  std::string outcome;
  if (rank == 0) {
    Status s = [&]() -> Status {
      std::vector<FileRecord> files;
      for (const auto& r : reports) {
        json rj = json::parse(r, nullptr, false);
        if (rj.is_discarded()) return Internal("malformed report from a rank");
        CKPT_RETURN_IF_ERROR(StatusFromJson(rj["status"]), "");
        CKPT_ASSIGN_OR_RETURN(FileRecord f, FileRecordFromJson(rj["file"], "rank report"), "");
        files.push_back(std::move(f));
      }
      return Commit(root, tmp_dir, meta, std::move(files), env, options);
    }();
    if (!s.ok() && env->Exists(tmp_dir)) env->RemoveDirRecursive(tmp_dir).IgnoreError();
    outcome = WireText(StatusToJson(s));
    lock.reset();
  }
  CKPT_ASSIGN_OR_RETURN(std::string final_status, comm.Broadcast(outcome), what);
  json fj = json::parse(final_status, nullptr, false);
  if (fj.is_discarded()) return Internal(what + ": malformed outcome");
  CKPT_RETURN_IF_ERROR(StatusFromJson(fj), what);
  return Status::Ok();
}

void DisableHdf5ExitCleanup() { h5::DisableExitCleanup(); }

void IgnoreFileSizeLimitSignal() { std::signal(SIGXFSZ, SIG_IGN); }

}  // namespace ckpt
