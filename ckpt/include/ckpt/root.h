// A checkpoint root: committed tags, the `latest` pointer, leftover temporary directories,
// the saver lock, retention and garbage collection.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "ckpt/env.h"
#include "ckpt/manifest.h"
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
  bool sets_latest = true;  // false: saved with SaveOptions::update_latest = false
  std::string error;  // non-empty when its manifest could not be read or names another tag
};

struct RootListing {
  std::string root;
  std::string latest;                  // empty when there is no latest pointer
  // `latest` resolved to the newest committed tag (ReadLatest): the file is missing, or it names
  // an older tag than one committed since (a save killed after its commit point).
  bool latest_inferred = false;
  std::vector<TagInfo> tags;           // committed tags, oldest global_step first
  std::vector<std::string> temporary;  // paths of leftover temporary directories
};

Result<RootListing> ListRoot(const std::string& root, Env* env = nullptr);
// `ckpt ls --json`: {"root", "latest" (null when none), "latest_inferred", "tags": [{"tag",
// "global_step", "ranks", "bytes", "latest", "path", "created_unix", "error" when unreadable}],
// "temporary"}.
nlohmann::json RootListingToJson(const RootListing& listing);
// The tag `latest` names. DataLoss when the file is corrupt (its checksum, since format 1.2),
// names a missing tag, or names a tag whose manifest records another global step. A save is
// committed when its tag directory is renamed into place (docs/format.md, "Commit point"), so
// when a committed tag newer than the one `latest` names exists (a save killed between its
// commit and the `latest` update), or the file is absent while committed tags exist, the
// result is the newest readable committed tag, with *inferred set; NotFound when there is none.
Result<std::string> ReadLatest(const std::string& root, Env* env = nullptr,
                               bool* inferred = nullptr);
// The content of a `latest` file naming `tag` at `global_step` (format 1.2): three lines,
// "<tag>", "step <global_step>", "xxh3 <XXH3-64 of the first two lines, newlines included>".
std::string LatestFileText(const std::string& tag, int64_t global_step);
// Resolves `path` (+ optional tag) to a tag directory: a directory with manifest.json is
// itself; otherwise a root, at `tag` or at `latest`.
Result<std::string> ResolveTagDir(const std::string& path, const std::string& tag = "",
                                  Env* env = nullptr);
// The tag directory of `tag`, which another process resolved from `path` (rank 0 of a load
// sends its tag's name; another node may mount the root elsewhere): `path` itself when it is a
// tag directory (opened as itself there too), else `tag` under the root `path`.
Result<std::string> ResolveAgreedTagDir(const std::string& path, const std::string& tag,
                                        Env* env = nullptr);
// The manifest of the tag directory `tag_dir` (any kind: sharded or universal), read through
// env and parsed (ParseManifest). Every reader opens a manifest here, so the same condition
// has the same code everywhere: no manifest.json is NotFound ("DIR/manifest.json is missing
// (not a committed checkpoint)", the CLI's exit 2: the input is not there); a manifest that
// does not parse or verify is DataLoss (exit 1); other read errors keep the Env's code.
Result<Manifest> ReadTagManifest(const std::string& tag_dir, Env* env = nullptr);
// Whether tag directories that are symbolic links may be read: false unless the environment
// sets CKPT_FOLLOW_SYMLINKS=1 (`ckpt --follow-symlinks` sets it). When false, a linked tag is
// listed with an error and refused by ResolveTagDir and ReadLatest (DataLoss). Files inside a
// tag (manifest, rank files, `latest`) are never followed through links.
bool FollowSymlinkedTags();
// A tag directory that is a symbolic link would have its files read from outside the root:
// refused (DataLoss, naming it and the way to allow it) unless FollowSymlinkedTags(). Every
// reader of a tag under a root asks this: ckpt's own (ResolveTagDir, ReadLatest) and
// DeepSpeed's (DeepSpeedReader::Open).
Status RefuseLinkedTag(Env* env, const std::string& dir);
// A directory path without trailing slashes ("a/b/" -> "a/b").
std::string TrimSlashes(std::string path);

// An exclusive advisory lock (Env::TryLockFile, flock) on ROOT/.lock, held by a saver or by
// gc. The kernel drops it when the process dies, so a crashed saver never blocks the next one.
class RootLock {
 public:
  // FailedPrecondition "ROOT/.lock is held by pid N (another save or gc); wait for it to
  // finish" when held elsewhere.
  static Result<RootLock> TryAcquire(const std::string& root, Env* env = nullptr);
  // For savers: as TryAcquire, but while a gc (or another save) holds the lock, waits for it,
  // polling, for at most wait_seconds; `on_wait` (if set) is called once, when the wait starts,
  // with a message naming the holder. While waiting the saver holds ROOT/.lock.waiting, which
  // gc checks between the tags it deletes and yields to (SaverWaiting). Past the wait:
  // FailedPrecondition as TryAcquire, saying how long it waited.
  static Result<RootLock> Acquire(const std::string& root, Env* env, double wait_seconds,
                                  const std::function<void(const std::string&)>& on_wait = {});
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
  // A saver started waiting for the root lock: gc stopped early, leaving the rest of the
  // retention to its next run, and released the lock.
  bool yielded = false;
};

// Deletes committed tags older than the newest `keep_last` (0: none), never the one `latest`
// resolves to nor the one the `latest` file names. Caller must hold the root lock. With dry_run, only the tags it would delete.
// `stop` (if set) is asked before each deletion; true ends the pass early (what was removed
// so far is returned).
Result<std::vector<std::string>> ApplyRetention(const std::string& root, int keep_last,
                                                Env* env = nullptr, bool dry_run = false,
                                                const std::function<bool()>& stop = {});
// Whether a saver is waiting for the root lock (RootLock::Acquire holds ROOT/.lock.waiting).
bool SaverWaiting(const std::string& root, Env* env = nullptr);
// Takes the root lock (FailedPrecondition while a saver holds it), removes temporary
// directories left by crashed saves, writes a missing or stale `latest` (see ReadLatest) and
// applies retention. With dry_run: the report of what it would do, without the lock and
// without changing anything.
Result<GcReport> CollectGarbage(const std::string& root, int keep_last, Env* env = nullptr,
                                bool dry_run = false);

struct RollbackReport {
  std::string tag;                 // what `latest` names now
  std::vector<std::string> moved;  // newer tags, each moved to ROOT/.rolled-back-<tag>-<nonce>
};

// A deliberate rollback to committed tag `tag` (`ckpt rollback`): takes the root lock, appends
// a JSON line recording it to ROOT/rollback.log, points `latest` at `tag`, then moves every
// newer committed tag aside to ROOT/.rolled-back-<tag>-<nonce>/ (kept; not a tag; gc leaves
// it), so the commit-point rule (ReadLatest) does not undo the rollback. A crash part-way is
// repaired by running it again. NotFound for an unknown tag; FailedPrecondition while a saver
// or gc holds the lock.
Result<RollbackReport> RollbackLatest(const std::string& root, const std::string& tag,
                                      Env* env = nullptr);

}  // namespace ckpt
