// Env: every file-system step of a save goes through this interface, so tests can fail the
// Nth write / fsync / rename / directory sync and simulate power loss (leveldb's Env +
// fault_injection_test). PosixEnv is the real one.
//
// HDF5 writes rank files itself (sec2 driver); such a file is announced with
// BeginExternalWrite(path) before HDF5 opens it and sealed with SyncFile(path) after it is
// closed, so a fault can be injected at those points too.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "ckpt/status.h"

namespace ckpt {

// A file being written. Not thread-safe. Close() is idempotent; the destructor closes quietly.
class WritableFile {
 public:
  virtual ~WritableFile() = default;
  virtual Status Append(std::string_view data) = 0;
  virtual Status Sync() = 0;   // fsync (data and metadata)
  virtual Status Close() = 0;
};

struct DirEntry {
  std::string name;
  bool is_dir = false;
};

class Env {
 public:
  virtual ~Env() = default;
  // The process-wide PosixEnv. Never null; not owned by the caller.
  static Env* Default();

  // Creates or truncates path.
  virtual Result<std::unique_ptr<WritableFile>> NewWritableFile(const std::string& path) = 0;
  // Announces that a library (HDF5) is about to create and write path by itself.
  virtual Status BeginExternalWrite(const std::string& path) = 0;
  // fsyncs an existing file by path (used after HDF5 closed it).
  virtual Status SyncFile(const std::string& path) = 0;
  virtual Status SyncDir(const std::string& path) = 0;
  virtual Status RenameFile(const std::string& from, const std::string& to) = 0;  // atomic
  virtual Status CreateDir(const std::string& path) = 0;  // fails if it exists
  virtual Status RemoveFile(const std::string& path) = 0;
  virtual Status RemoveDirRecursive(const std::string& path) = 0;
  virtual Result<std::string> ReadFileToString(const std::string& path) = 0;
  virtual Result<std::vector<DirEntry>> ListDir(const std::string& path) = 0;
  virtual bool Exists(const std::string& path) = 0;
  virtual Result<uint64_t> FileSize(const std::string& path) = 0;
};

// Writes data to path through a temporary name: tmp + fsync + rename + fsync(dir).
// A crash at any point leaves either the old file or the new one, never a mix.
Status WriteFileAtomic(Env* env, const std::string& path, std::string_view data);

// Fault injection and power-loss simulation for tests (leveldb's fault_injection_test).
// Counts every mutating step; with FailAt(n) the n-th step (1-based) of the selected kind
// fails with an IOError naming the step. DropUnsyncedData() then simulates a power cut:
// files never fsynced are truncated to their last synced size (or removed when created
// since), and renames not followed by a SyncDir of the target directory are undone.
class FaultInjectionEnv : public Env {
 public:
  enum class Op { kAny, kWrite, kSync, kRename, kSyncDir, kCreateDir };
  explicit FaultInjectionEnv(Env* base);
  ~FaultInjectionEnv() override;

  // Fails the n-th (1-based) operation of kind op; 0 disables.
  void FailAt(Op op, int n);
  // Number of operations of each kind seen so far (kAny: all).
  int Count(Op op) const;
  void ResetCounts();
  // Name of the step that failed, e.g. "fsync /root/.tmp-x/manifest.json"; empty if none.
  std::string failed_step() const;
  Status DropUnsyncedData();

  Result<std::unique_ptr<WritableFile>> NewWritableFile(const std::string& path) override;
  Status BeginExternalWrite(const std::string& path) override;
  Status SyncFile(const std::string& path) override;
  Status SyncDir(const std::string& path) override;
  Status RenameFile(const std::string& from, const std::string& to) override;
  Status CreateDir(const std::string& path) override;
  Status RemoveFile(const std::string& path) override;
  Status RemoveDirRecursive(const std::string& path) override;
  Result<std::string> ReadFileToString(const std::string& path) override;
  Result<std::vector<DirEntry>> ListDir(const std::string& path) override;
  bool Exists(const std::string& path) override;
  Result<uint64_t> FileSize(const std::string& path) override;

  struct Impl;  // opaque; public only so the file wrapper in fault_env.cc can name it

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace ckpt
