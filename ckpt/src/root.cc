#include "ckpt/root.h"

#include <algorithm>
#include <optional>
#include <random>

#include "ckpt/manifest.h"

namespace ckpt {

namespace {

bool IsTemporary(const std::string& name) { return name.rfind(kTempPrefix, 0) == 0; }

std::string Trim(std::string s) {
  while (!s.empty() && (s.back() == '\n' || s.back() == '\r' || s.back() == ' ')) s.pop_back();
  return s;
}

bool ValidTagName(const std::string& tag) {
  return !tag.empty() && tag.find('/') == std::string::npos && tag[0] != '.' && tag.size() < 256;
}

// Committed tags (readable or not) and temporaries of `root`, tags oldest global_step first.
Status ListTags(const std::string& root, Env* env, RootListing* out) {
  CKPT_ASSIGN_OR_RETURN(std::vector<DirEntry> entries, env->ListDir(root), "");
  for (const auto& e : entries) {
    if (!e.is_dir) continue;
    const std::string path = root + "/" + e.name;
    if (IsTemporary(e.name)) {
      out->temporary.push_back(path);
      continue;
    }
    const std::string mpath = path + "/" + std::string(kManifestFile);
    if (!env->Exists(mpath)) continue;  // not ours
    TagInfo info;
    info.tag = e.name;
    info.path = path;
    auto text = env->ReadFileToString(mpath);
    auto m = text.ok() ? ParseManifest(*text, mpath) : Result<Manifest>(text.status());
    if (m.ok()) {
      info.global_step = m->counters.global_step;
      info.ranks = m->topology.dp_world_size;
      info.created_unix = m->created_unix;
      for (const auto& f : m->files) info.bytes += f.bytes;
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

// The newest readable committed tag, or "" when there is none.
std::string NewestTag(const RootListing& listing) {
  for (auto it = listing.tags.rbegin(); it != listing.tags.rend(); ++it)
    if (it->error.empty()) return it->tag;
  return "";
}

// The tag the `latest` file names; NotFound when there is no file.
Result<std::string> ReadLatestFile(const std::string& root, Env* env) {
  const std::string path = root + "/" + std::string(kLatestFile);
  auto text = env->ReadFileToString(path);
  if (!text.ok()) {
    if (text.status().code() == StatusCode::kNotFound)
      return NotFound(root + " has no `latest` pointer (no committed checkpoint)");
    return text.status();
  }
  const std::string tag = Trim(*text);
  if (!ValidTagName(tag)) return DataLoss(path + ": does not name a tag ('" + tag + "')");
  if (!env->Exists(root + "/" + tag + "/" + std::string(kManifestFile)))
    return DataLoss(path + " names '" + tag + "', which is not a committed tag in " + root);
  return tag;
}

// No `latest` file (`missing` says so): a save killed after committing its tag (the rename,
// step 6 of the protocol) and before writing `latest` (step 7) leaves a complete, durable tag,
// and the newest one is what `latest` would have named. Only the first save into a root can
// leave this state.
Result<std::string> InferLatest(const RootListing& listing, const Status& missing,
                                bool* inferred) {
  const std::string newest = NewestTag(listing);
  if (newest.empty()) return missing;
  if (inferred) *inferred = true;
  return newest;
}

}  // namespace

Result<std::string> ReadLatest(const std::string& root, Env* env, bool* inferred) {
  if (!env) env = Env::Default();
  if (inferred) *inferred = false;
  auto latest = ReadLatestFile(root, env);
  if (latest.ok() || latest.status().code() != StatusCode::kNotFound) return latest;
  RootListing listing;
  if (!env->Exists(root) || !ListTags(root, env, &listing).ok()) return latest.status();
  return InferLatest(listing, latest.status(), inferred);
}

Result<std::string> ResolveTagDir(const std::string& path, const std::string& tag, Env* env) {
  if (!env) env = Env::Default();
  if (!env->Exists(path)) return NotFound(path + ": no such file or directory");
  if (!tag.empty()) {
    if (!ValidTagName(tag)) return InvalidArgument("invalid tag '" + tag + "'");
    const std::string dir = path + "/" + tag;
    if (!env->Exists(dir)) return NotFound(path + " has no tag '" + tag + "'");
    return dir;
  }
  if (env->Exists(path + "/" + std::string(kManifestFile))) return path;
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
  auto latest = ReadLatestFile(root, env);
  if (!latest.ok() && latest.status().code() == StatusCode::kNotFound)
    latest = InferLatest(out, latest.status(), &out.latest_inferred);
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

RootLock::RootLock(std::unique_ptr<FileLock> lock) : lock_(std::move(lock)) {}
RootLock::RootLock(RootLock&&) noexcept = default;
RootLock& RootLock::operator=(RootLock&&) noexcept = default;
RootLock::~RootLock() = default;

Result<std::vector<std::string>> ApplyRetention(const std::string& root, int keep_last, Env* env,
                                                bool dry_run) {
  if (!env) env = Env::Default();
  std::vector<std::string> removed;
  if (keep_last <= 0) return removed;
  CKPT_ASSIGN_OR_RETURN(RootListing listing, ListRoot(root, env), "");
  const int n = static_cast<int>(listing.tags.size());
  std::random_device rd;
  for (int i = 0; i < n - keep_last; ++i) {
    const TagInfo& t = listing.tags[static_cast<size_t>(i)];
    if (t.latest) continue;
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
  // A save killed between committing its tag and writing `latest` (only possible for the
  // first save into a root): write the pointer readers already infer.
  bool inferred = false;
  auto latest = ReadLatest(root, env, &inferred);
  if (latest.ok() && inferred && dry_run) {
    report.restored_latest = *latest;
  } else if (latest.ok() && inferred) {
    CKPT_RETURN_IF_ERROR(
        WriteFileAtomic(env, root + "/" + std::string(kLatestFile), *latest + "\n"),
        "gc: restore `latest`");
    report.restored_latest = *latest;
  }
  CKPT_ASSIGN_OR_RETURN(report.removed_tags, ApplyRetention(root, keep_last, env, dry_run), "gc");
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

}  // namespace ckpt
