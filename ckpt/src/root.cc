#include "ckpt/root.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <optional>
#include <random>
#include <string_view>
#include <thread>

#include <nlohmann/json.hpp>

#include "ckpt/hash.h"
#include "ckpt/manifest.h"
#include "manifest_fast.h"

namespace ckpt {

namespace {

// Names ckpt writes are printable UTF-8 (ValidateManifest holds tags to it): a directory whose
// name is not (one unpacked from an archive, say) is neither a tag nor a temporary of ours,
// and is never printed.
bool IsTemporary(const std::string& name) {
  return name.rfind(kTempPrefix, 0) == 0 && PrintableUtf8(name);
}

std::string Trim(std::string s) {
  while (!s.empty() && (s.back() == '\n' || s.back() == '\r' || s.back() == ' ')) s.pop_back();
  return s;
}

bool ValidTagName(const std::string& tag) {
  return !tag.empty() && tag.find('/') == std::string::npos && tag[0] != '.' && tag.size() < 256 &&
         PrintableUtf8(tag);
}

// The largest `latest` file readers look at: a tag name (< 256) and two short lines.
constexpr size_t kMaxLatestBytes = 512;

// Reads tag_dir's manifest into *text (its memory kept for the next call): never through a
// link, never past kMaxManifestBytes (ReadCheckpointFileInto).
Status ReadManifestText(const std::string& tag_dir, Env* env, std::string* text) {
  const std::string mpath = tag_dir + "/" + std::string(kManifestFile);
  Status read = ReadCheckpointFileInto(env, mpath, kMaxManifestBytes, text);
  if (read.code() == StatusCode::kNotFound)
    return NotFound(mpath + " is missing (not a committed checkpoint)");
  return read;
}

// Committed tags (readable or not) and temporaries of `root`, tags oldest global_step first.
Status ListTags(const std::string& root, Env* env, RootListing* out) {
  CKPT_ASSIGN_OR_RETURN(std::vector<DirEntry> entries, env->ListDir(root), "");
  std::string text;  // each manifest in turn
  internal::KeepManifestParser keep;  // and one parser's memory for all of them
  for (const auto& e : entries) {
    if (!e.is_dir) continue;
    const std::string path = root + "/" + e.name;
    if (IsTemporary(e.name)) {
      out->temporary.push_back(path);
      continue;
    }
    // Never a tag: .rolled-back-* (ckpt rollback), a name ckpt would not write.
    if (e.name[0] == '.' || !PrintableUtf8(e.name)) continue;
    const std::string mpath = path + "/" + std::string(kManifestFile);
    if (!env->Exists(mpath)) continue;  // not ours
    TagInfo info;
    info.tag = e.name;
    info.path = path;
    if (Status linked = RefuseLinkedTag(env, path); !linked.ok()) {
      info.error = linked.message();
      out->tags.push_back(std::move(info));
      continue;
    }
    // Summaries, not whole manifests: this runs on every open of a root (ReadLatest), once
    // per tag, and a large model's manifest takes far longer to parse in full.
    Status read = ReadManifestText(path, env, &text);
    Result<ManifestSummary> m =
        read.ok() ? ParseManifestSummary(text, mpath) : Result<ManifestSummary>(std::move(read));
    if (m.ok() && m->tag != e.name) {
      // A tag directory copied or renamed by hand: never taken for the tag it claims to be.
      info.error = mpath + ": the manifest names tag '" + Excerpt(m->tag) +
                   "', not its directory's name";
    } else if (m.ok()) {
      info.global_step = m->global_step;
      info.ranks = m->dp_world_size;
      info.created_unix = m->created_unix;
      info.sets_latest = m->sets_latest;
      info.bytes = m->bytes;
    } else {
      info.error = m.status().message();
    }
    out->tags.push_back(std::move(info));
  }
  std::sort(out->tags.begin(), out->tags.end(), [](const TagInfo& a, const TagInfo& b) {
    if (a.global_step != b.global_step) return a.global_step < b.global_step;
    if (a.created_unix != b.created_unix) return a.created_unix < b.created_unix;
    return a.tag < b.tag;
  });
  std::sort(out->temporary.begin(), out->temporary.end());
  return Status::Ok();
}

// The newest readable committed tag whose save meant to become `latest`, or nullptr.
const TagInfo* NewestTag(const RootListing& listing) {
  for (auto it = listing.tags.rbegin(); it != listing.tags.rend(); ++it)
    if (it->error.empty() && it->sets_latest) return &*it;
  return nullptr;
}

struct LatestPointer {
  std::string tag;
  int64_t global_step = -1;  // -1: a pre-1.2 file (the tag name alone)
};

// Parses and verifies the `latest` file; NotFound when there is none.
Result<LatestPointer> ReadLatestFile(const std::string& root, Env* env) {
  const std::string path = root + "/" + std::string(kLatestFile);
  // Never through a link (`ln -s /etc/passwd latest` is refused unread) nor past 512 bytes.
  auto text = ReadCheckpointFileToString(env, path, kMaxLatestBytes);
  if (!text.ok()) {
    if (text.status().code() == StatusCode::kNotFound)
      return NotFound(root + " has no `latest` pointer (no committed checkpoint)");
    return text.status().WithContext("not a `latest` pointer");
  }
  LatestPointer p;
  const size_t first = text->find('\n');
  if (first == std::string::npos || first + 1 == text->size()) {
    p.tag = Trim(*text);  // format 1.0: the tag name alone
  } else {
    // Format 1.2: "<tag>\nstep <N>\nxxh3 <16 hex>\n".
    const size_t second = text->find('\n', first + 1);
    const std::string body = text->substr(0, second == std::string::npos ? 0 : second + 1);
    const std::string digest_line = second == std::string::npos ? "" : Trim(text->substr(second + 1));
    long long step = -1;
    char tail = 0;
    if (body.empty() || digest_line.size() != 21 || digest_line.rfind("xxh3 ", 0) != 0 ||
        std::sscanf(body.c_str() + first + 1, "step %lld%c", &step, &tail) != 2 || tail != '\n' ||
        step < 0)
      return DataLoss(path + ": malformed `latest` pointer ('" + Excerpt(*text) + "')");
    const std::string want = digest_line.substr(5);
    const std::string got = DigestHex(Xxh3(body.data(), body.size()));
    if (want != got)
      return DataLoss(path + ": checksum mismatch (recorded " + Excerpt(want) + ", content " +
                      got + "): the `latest` pointer is corrupt");
    p.tag = text->substr(0, first);
    p.global_step = step;
  }
  if (!ValidTagName(p.tag))
    return DataLoss(path + ": does not name a tag ('" + Excerpt(p.tag) + "')");
  if (!env->Exists(root + "/" + p.tag + "/" + std::string(kManifestFile)))
    return DataLoss(path + " names '" + Excerpt(p.tag, 80) + "', which is not a committed tag in " +
                    root);
  CKPT_RETURN_IF_ERROR(RefuseLinkedTag(env, root + "/" + p.tag), "");
  return p;
}

// What `latest` resolves to, given the file (or its absence) and the committed tags:
//  - no file: the newest committed tag (a first save killed between its commit, the rename of
//    step 6, and writing `latest`, step 7), NotFound when there is none;
//  - a file naming a tag at another global step than its manifest's: DataLoss;
//  - a committed tag newer than the one the file names: that save was killed after its commit
//    point and before step 7, so the newest tag is the latest (a deliberate rollback moves
//    newer tags aside first: `ckpt rollback`);
//  - otherwise the tag the file names.
Result<std::string> ResolveLatest(const std::string& root, const RootListing& listing,
                                  const Result<LatestPointer>& file, bool* inferred) {
  if (inferred) *inferred = false;
  if (!file.ok() && file.status().code() != StatusCode::kNotFound) return file.status();
  const TagInfo* newest = NewestTag(listing);
  if (!file.ok()) {
    if (!newest) return file.status();
    if (inferred) *inferred = true;
    return newest->tag;
  }
  const TagInfo* named = nullptr;
  for (const auto& t : listing.tags)
    if (t.tag == file->tag) named = &t;
  if (named && named->error.empty() && file->global_step >= 0 &&
      named->global_step != file->global_step)
    return DataLoss(root + "/" + std::string(kLatestFile) + " names '" + file->tag +
                    "' at step " + std::to_string(file->global_step) +
                    ", but its manifest records step " + std::to_string(named->global_step));
  // (A named tag whose manifest is unreadable is returned as it is: opening it reports why.)
  if (newest && named && named->error.empty() && newest->tag != file->tag &&
      newest->global_step > named->global_step) {
    if (inferred) *inferred = true;
    return newest->tag;
  }
  return file->tag;
}

}  // namespace

bool FollowSymlinkedTags() {
  const char* v = std::getenv("CKPT_FOLLOW_SYMLINKS");
  return v && std::string_view(v) == "1";
}

Status RefuseLinkedTag(Env* env, const std::string& dir) {
  if (!env->IsSymlink(dir) || FollowSymlinkedTags()) return Status::Ok();
  return DataLoss(dir +
                  " is a symbolic link: a tag directory is read only from inside its root "
                  "(set CKPT_FOLLOW_SYMLINKS=1, or pass `ckpt --follow-symlinks`, to "
                  "allow it)");
}

std::string LatestFileText(const std::string& tag, int64_t global_step) {
  const std::string body = tag + "\nstep " + std::to_string(global_step) + "\n";
  return body + "xxh3 " + DigestHex(Xxh3(body.data(), body.size())) + "\n";
}

Result<std::string> ReadLatest(const std::string& root, Env* env, bool* inferred) {
  if (!env) env = Env::Default();
  if (inferred) *inferred = false;
  auto file = ReadLatestFile(root, env);
  if (!file.ok() && file.status().code() != StatusCode::kNotFound) return file.status();
  RootListing listing;
  if (!env->Exists(root) || !ListTags(root, env, &listing).ok()) {
    if (!file.ok()) return file.status();
    return file->tag;
  }
  return ResolveLatest(root, listing, file, inferred);
}

Result<Manifest> ReadTagManifest(const std::string& tag_dir, Env* env) {
  if (!env) env = Env::Default();
  std::string text;
  CKPT_RETURN_IF_ERROR(ReadManifestText(tag_dir, env, &text), "");
  return ParseManifest(text, tag_dir + "/" + std::string(kManifestFile));
}

namespace {

bool IsTagDir(const std::string& path, Env* env) {
  return env->Exists(path + "/" + std::string(kManifestFile));
}

}  // namespace

Result<std::string> ResolveAgreedTagDir(const std::string& path, const std::string& tag,
                                        Env* env) {
  if (!env) env = Env::Default();
  if (IsTagDir(path, env)) return path;
  return ResolveTagDir(path, tag, env);
}

Result<std::string> ResolveTagDir(const std::string& path, const std::string& tag, Env* env) {
  if (!env) env = Env::Default();
  if (!env->Exists(path)) return NotFound(path + ": no such file or directory");
  if (!tag.empty()) {
    if (!ValidTagName(tag)) return InvalidArgument("invalid tag '" + Excerpt(tag, 80) + "'");
    const std::string dir = path + "/" + tag;
    if (!env->Exists(dir)) return NotFound(path + " has no tag '" + tag + "'");
    CKPT_RETURN_IF_ERROR(RefuseLinkedTag(env, dir), "");
    return dir;
  }
  if (IsTagDir(path, env)) return path;
  auto latest = ReadLatest(path, env);
  if (latest.ok()) return path + "/" + *latest;
  if (latest.status().code() != StatusCode::kNotFound) return latest.status();
  return NotFound(path + " is neither a checkpoint root (no `latest`) nor a tag directory (no " +
                  std::string(kManifestFile) + ")");
}

Result<RootListing> ListRoot(const std::string& root, Env* env) {
  if (!env) env = Env::Default();
  RootListing out;
  out.root = root;
  CKPT_RETURN_IF_ERROR(ListTags(root, env, &out), "");
  auto latest = ResolveLatest(root, out, ReadLatestFile(root, env), &out.latest_inferred);
  if (latest.ok()) out.latest = *latest;
  for (auto& t : out.tags) t.latest = t.tag == out.latest;
  return out;
}

// ---------------------------------------------------------------------------------------------

Result<RootLock> RootLock::TryAcquire(const std::string& root, Env* env) {
  if (!env) env = Env::Default();
  auto lock = env->TryLockFile(root + "/" + std::string(kLockFile));
  if (!lock.ok()) {
    if (lock.status().code() != StatusCode::kFailedPrecondition) return lock.status();
    return FailedPrecondition(lock.status().message() +
                              " (another save or gc); wait for it to finish");
  }
  return RootLock(std::move(lock).value());
}

Result<RootLock> RootLock::Acquire(const std::string& root, Env* env, double wait_seconds,
                                   const std::function<void(const std::string&)>& on_wait) {
  if (!env) env = Env::Default();
  const auto start = std::chrono::steady_clock::now();
  std::unique_ptr<FileLock> waiting;  // held while waiting: gc yields to it
  for (bool first = true;; first = false) {
    auto lock = TryAcquire(root, env);
    if (lock.ok() || lock.status().code() != StatusCode::kFailedPrecondition) return lock;
    const double waited =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (waited >= wait_seconds) {
      return FailedPrecondition(lock.status().message() + " (waited " +
                                std::to_string(static_cast<int>(waited)) + " s)");
    }
    if (first && on_wait) on_wait("waiting for " + lock.status().message());
    if (!waiting) {
      auto w = env->TryLockFile(root + "/" + std::string(kLockFile) + ".waiting");
      if (w.ok()) waiting = std::move(w).value();
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

bool SaverWaiting(const std::string& root, Env* env) {
  if (!env) env = Env::Default();
  auto w = env->TryLockFile(root + "/" + std::string(kLockFile) + ".waiting");
  return !w.ok() && w.status().code() == StatusCode::kFailedPrecondition;
}

RootLock::RootLock(std::unique_ptr<FileLock> lock) : lock_(std::move(lock)) {}
RootLock::RootLock(RootLock&&) noexcept = default;
RootLock& RootLock::operator=(RootLock&&) noexcept = default;
RootLock::~RootLock() = default;

Result<std::vector<std::string>> ApplyRetention(const std::string& root, int keep_last, Env* env,
                                                bool dry_run, const std::function<bool()>& stop) {
  if (!env) env = Env::Default();
  std::vector<std::string> removed;
  if (keep_last <= 0) return removed;
  CKPT_ASSIGN_OR_RETURN(RootListing listing, ListRoot(root, env), "");
  // Neither the tag `latest` resolves to nor the one the file names (older, when a newer
  // committed tag overrides it): deleting the named one would leave the file dangling.
  auto file = ReadLatestFile(root, env);
  const std::string named = file.ok() ? file->tag : "";
  const int n = static_cast<int>(listing.tags.size());
  std::random_device rd;
  for (int i = 0; i < n - keep_last; ++i) {
    const TagInfo& t = listing.tags[static_cast<size_t>(i)];
    if (t.latest || t.tag == named) continue;
    if (stop && stop()) break;
    if (dry_run) {
      removed.push_back(t.tag);
      continue;
    }
    // Rename first so a crash mid-delete leaves a temporary directory, never a broken tag.
    const std::string doomed =
        root + "/" + std::string(kTempPrefix) + "deleting-" + t.tag + "-" + std::to_string(rd());
    CKPT_RETURN_IF_ERROR(env->RenameFile(t.path, doomed), "retire " + t.tag);
    CKPT_RETURN_IF_ERROR(env->SyncDir(root), "retire " + t.tag);
    CKPT_RETURN_IF_ERROR(env->RemoveDirRecursive(doomed), "retire " + t.tag);
    removed.push_back(t.tag);
  }
  return removed;
}

Result<GcReport> CollectGarbage(const std::string& root, int keep_last, Env* env, bool dry_run) {
  if (!env) env = Env::Default();
  if (!env->Exists(root)) return NotFound(root + ": no such directory");
  std::optional<RootLock> lock;
  if (!dry_run) {
    CKPT_ASSIGN_OR_RETURN(RootLock held, RootLock::TryAcquire(root, env), "gc " + root);
    lock.emplace(std::move(held));
  }
  GcReport report;
  CKPT_ASSIGN_OR_RETURN(std::vector<DirEntry> entries, env->ListDir(root), "");
  for (const auto& e : entries) {
    if (!dry_run && SaverWaiting(root, env)) {
      report.yielded = true;
      break;
    }
    const std::string path = root + "/" + e.name;
    // Temporary directories of crashed saves, and temp files of an interrupted `latest` update.
    if (IsTemporary(e.name) ||
        (!e.is_dir && e.name.rfind(std::string(kLatestFile) + ".tmp-", 0) == 0)) {
      if (!dry_run) {
        CKPT_RETURN_IF_ERROR(e.is_dir ? env->RemoveDirRecursive(path) : env->RemoveFile(path),
                             "gc");
      }
      report.removed_temporary.push_back(path);
    }
  }
  if (!report.removed_temporary.empty() && !dry_run) CKPT_RETURN_IF_ERROR(env->SyncDir(root), "gc");
  // A save killed between committing its tag and writing `latest`: write the pointer readers
  // already infer.
  CKPT_ASSIGN_OR_RETURN(RootListing listing, ListRoot(root, env), "gc");
  if (listing.latest_inferred) {
    int64_t step = 0;
    for (const auto& t : listing.tags)
      if (t.tag == listing.latest) step = t.global_step;
    if (!dry_run) {
      CKPT_RETURN_IF_ERROR(WriteFileAtomic(env, root + "/" + std::string(kLatestFile),
                                           LatestFileText(listing.latest, step)),
                           "gc: restore `latest`");
    }
    report.restored_latest = listing.latest;
  }
  // gc yields to a saver waiting for the lock: it stops between deletions (the rest is left
  // for its next run) and releases the lock, so periodic gc never makes a save fail.
  auto saver_waiting = [&] {
    if (dry_run || !SaverWaiting(root, env)) return false;
    report.yielded = true;
    return true;
  };
  CKPT_ASSIGN_OR_RETURN(report.removed_tags,
                        ApplyRetention(root, keep_last, env, dry_run, saver_waiting), "gc");
  return report;
}

nlohmann::json RootListingToJson(const RootListing& listing) {
  nlohmann::json tags = nlohmann::json::array();
  for (const auto& t : listing.tags) {
    nlohmann::json tj = {{"tag", t.tag},     {"global_step", t.global_step}, {"ranks", t.ranks},
                         {"bytes", t.bytes}, {"latest", t.latest},           {"path", t.path},
                         {"created_unix", t.created_unix}};
    if (!t.error.empty()) tj["error"] = t.error;
    tags.push_back(std::move(tj));
  }
  return {{"root", listing.root},
          {"latest", listing.latest.empty() ? nlohmann::json(nullptr) : nlohmann::json(listing.latest)},
          {"latest_inferred", listing.latest_inferred},
          {"tags", std::move(tags)},
          {"temporary", listing.temporary}};
}

std::string TrimSlashes(std::string path) {
  while (path.size() > 1 && path.back() == '/') path.pop_back();
  return path;
}

Result<RollbackReport> RollbackLatest(const std::string& root, const std::string& tag,
                                      Env* env) {
  if (!env) env = Env::Default();
  if (!env->Exists(root)) return NotFound(root + ": no such directory");
  CKPT_ASSIGN_OR_RETURN(RootLock lock, RootLock::TryAcquire(root, env), "rollback " + root);
  CKPT_ASSIGN_OR_RETURN(RootListing listing, ListRoot(root, env), "rollback");
  const TagInfo* target = nullptr;
  for (const auto& t : listing.tags)
    if (t.tag == tag) target = &t;
  if (!target) return NotFound(root + " has no committed tag '" + Excerpt(tag) + "'");
  if (!target->error.empty()) return DataLoss(target->error);
  // The listing checked a summary of its manifest; the tag rolled back to is read whole.
  CKPT_RETURN_IF_ERROR(ReadTagManifest(target->path, env).status(), "rollback");
  RollbackReport report;
  report.tag = tag;
  std::vector<const TagInfo*> newer;
  for (auto it = listing.tags.rbegin(); it != listing.tags.rend() && &*it != target; ++it)
    newer.push_back(&*it);
  // 1. The record, first: a rollback is never silent, even one a crash interrupts.
  const std::string log_path = root + "/rollback.log";
  std::string log;
  if (env->Exists(log_path)) {
    CKPT_ASSIGN_OR_RETURN(log, env->ReadFileToString(log_path), "");
  }
  int64_t now = 0;
  {
    nlohmann::json moved = nlohmann::json::array();
    for (const TagInfo* t : newer) moved.push_back(t->tag);
    now = static_cast<int64_t>(::time(nullptr));
    log += nlohmann::json{{"unix_time", now}, {"from", listing.latest}, {"to", tag},
                          {"moved_aside", moved}}.dump() + "\n";
  }
  CKPT_RETURN_IF_ERROR(WriteFileAtomic(env, log_path, log), "rollback: record");
  // 2. `latest`, then 3. the newer tags aside (a crash between leaves them committed, and
  // readers resolve the newest again until the rollback is rerun).
  CKPT_RETURN_IF_ERROR(WriteFileAtomic(env, root + "/" + std::string(kLatestFile),
                                       LatestFileText(tag, target->global_step)),
                       "rollback: write `latest`");
  std::random_device rd;
  for (const TagInfo* t : newer) {
    const std::string aside = root + "/.rolled-back-" + t->tag + "-" + std::to_string(now) + "-" +
                              std::to_string(rd());
    CKPT_RETURN_IF_ERROR(env->RenameFile(t->path, aside), "rollback: move " + t->tag + " aside");
    report.moved.push_back(aside);
  }
  if (!newer.empty()) CKPT_RETURN_IF_ERROR(env->SyncDir(root), "rollback");
  return report;
}

}  // namespace ckpt
