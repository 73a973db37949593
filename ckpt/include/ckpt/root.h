// A checkpoint root: committed tags, the `latest` pointer, leftover temporary directories,
// the saver lock, retention and garbage collection.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "ckpt/env.h"
#include "ckpt/status.h"

namespace ckpt {

struct TagInfo {
  std::string tag;
  std::string path;
  int64_t global_step = -1;
  int ranks = 0;
  uint64_t bytes = 0;
  int64_t created_unix = 0;
  bool latest = false;
  std::string error;  // non-empty when its manifest could not be read
};

struct RootListing {
  std::string root;
  std::string latest;                  // empty when there is no latest pointer
  bool latest_inferred = false;        // no `latest` file: the newest committed tag (ReadLatest)
  std::vector<TagInfo> tags;           // committed tags, oldest global_step first
  std::vector<std::string> temporary;  // paths of leftover temporary directories
};

Result<RootListing> ListRoot(const std::string& root, Env* env = nullptr);
// `ckpt ls --json`: {"root", "latest" (null when none), "latest_inferred", "tags": [{"tag",
// "global_step", "ranks", "bytes", "latest", "path", "created_unix", "error" when unreadable}],
// "temporary"}.
nlohmann::json RootListingToJson(const RootListing& listing);
// The tag `latest` names; DataLoss when it names a missing tag. When the file is absent but the
// root holds committed tags (a first save killed between committing its tag and writing
// `latest`), the newest readable committed tag, with *inferred set; NotFound when there is none.
Result<std::string> ReadLatest(const std::string& root, Env* env = nullptr,
                               bool* inferred = nullptr);
// Resolves `path` (+ optional tag) to a tag directory: a directory with manifest.json is
// itself; otherwise a root, at `tag` or at `latest`.
Result<std::string> ResolveTagDir(const std::string& path, const std::string& tag = "",
                                  Env* env = nullptr);
// A directory path without trailing slashes ("a/b/" -> "a/b").
std::string TrimSlashes(std::string path);

// An exclusive advisory lock (Env::TryLockFile, flock) on ROOT/.lock, held by a saver or by
// gc. The kernel drops it when the process dies, so a crashed saver never blocks the next one.
class RootLock {
 public:
  // FailedPrecondition "ROOT/.lock is held by pid N (another save or gc); wait for it to
  // finish" when held elsewhere.
  static Result<RootLock> TryAcquire(const std::string& root, Env* env = nullptr);
  RootLock(RootLock&&) noexcept;
  RootLock& operator=(RootLock&&) noexcept;
  ~RootLock();

 private:
  explicit RootLock(std::unique_ptr<FileLock> lock);
  std::unique_ptr<FileLock> lock_;
};

struct GcReport {
  std::vector<std::string> removed_temporary;
  std::vector<std::string> removed_tags;
  std::string restored_latest;  // non-empty: `latest` was missing and now names this tag
};

// Deletes committed tags older than the newest `keep_last` (0: none), never the one `latest`
// names. Caller must hold the root lock. With dry_run, only the tags it would delete.
Result<std::vector<std::string>> ApplyRetention(const std::string& root, int keep_last,
                                                Env* env = nullptr, bool dry_run = false);
// Takes the root lock (FailedPrecondition while a saver holds it), removes temporary
// directories left by crashed saves, writes a missing `latest` (see ReadLatest) and applies
// retention. With dry_run: the report of what it would do, without the lock and without
// changing anything.
Result<GcReport> CollectGarbage(const std::string& root, int keep_last, Env* env = nullptr,
                                bool dry_run = false);

}  // namespace ckpt
