// Env: the whole OS edge of the format library. Every file-system call of a save, a load, a
// check or gc goes through this interface (sequential and random-access reads, offset writes,
// the root lock, the hashing reads, directory creation), so tests can fail the Nth write /
// fsync / rename / directory sync, simulate power loss, or observe any call (leveldb's Env +
// fault_injection_test). PosixEnv is the real one; EnvWrapper forwards everything to another
// Env so a test Env overrides only the calls it cares about.
//
// Errors come from one errno mapper (PosixError in status.h): a missing file is NotFound, a full
// disk ResourceExhausted, a refused permission PermissionDenied, wherever it happens.
//
// HDF5 writes rank files itself (sec2 driver); such a file is announced with
// BeginExternalWrite(path) before HDF5 opens it and sealed with SyncFile(path) after it is
// closed, so a fault can be injected at those points too.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "ckpt/status.h"

namespace ckpt {

// A file being written. Not thread-safe. Close() is idempotent; the destructor closes quietly.
class WritableFile {
 public:
  // Called with each consecutive piece of an AppendThrough, in order.
  using PieceFn = std::function<void(const uint8_t* p, size_t n)>;
  static constexpr size_t kAppendPiece = 1u << 20;

  virtual ~WritableFile() = default;
  virtual Status Append(std::string_view data) = 0;
  // Append that hands `data` to `before` (may be empty) in consecutive pieces of at most
  // kAppendPiece bytes, in order, each before it is written: the caller hashes the bytes while
  // the disk takes the ones before them (PosixEnv's large appends, which leave with O_DIRECT
  // several requests at a time). The default hands a piece over, then appends it. Bytes that
  // leave with O_DIRECT from where they lie (I/O memory, DirectWriteStats::in_place_bytes) are
  // handed over while they are written, each in order and before the call returns.
  virtual Status AppendThrough(std::string_view data, const PieceFn& before);
  virtual Status Sync() = 0;   // fsync (data and metadata)
  virtual Status Close() = 0;
};

// A file read at offsets (pread). Thread-safe: concurrent calls are allowed.
class RandomAccessFile {
 public:
  // Called with consecutive parts of a large read, in order, each exactly once: `offset` is
  // the part's file offset, [data, data + n) its bytes, valid only during the call. An error
  // returned ends the read with that error.
  using PartFn = std::function<Status(uint64_t offset, const uint8_t* data, size_t n)>;

  virtual ~RandomAccessFile() = default;
  // Reads exactly n bytes at offset into out. The file ending first is DataLoss naming the file
  // and the offset; an OS error is PosixError.
  virtual Status Read(uint64_t offset, size_t n, void* out) const = 0;
  // The file's size when it was opened.
  virtual uint64_t size() const = 0;
  // A hint that [offset, offset + n) will be read soon: the file system may start reading it
  // now, alongside other hinted ranges (PosixEnv: posix_fadvise WILLNEED). No effect on what
  // any read returns; by default nothing.
  virtual void WillNeed(uint64_t offset, uint64_t n) const {}

  // Large sequential reads (a dataset, a slice of one, a whole file), with the errors of Read.
  // ReadLarge fills out and calls on_filled (may be empty) with each consecutive part of out
  // once it holds the file's bytes, so a caller hashes them while they are in cache. Scan hands
  // consecutive parts of the range to `consume` from the file's own buffers (no copy into the
  // caller's memory). By default both run Read in blocks of kLargeReadBlock bytes; PosixEnv
  // may read with O_DIRECT ahead of the caller instead (see DirectReadStats), and ReadLarge
  // reads straight into `out` when out and offset share their position within a 4 KiB block
  // (the writer aligns large datasets to 4 KiB: give it 4 KiB-aligned memory).
  static constexpr size_t kLargeReadBlock = 4u << 20;
  virtual Status ReadLarge(uint64_t offset, uint64_t n, void* out,
                           const PartFn& on_filled) const;
  virtual Status Scan(uint64_t offset, uint64_t n, const PartFn& consume) const;
};

// How PosixEnv's large reads went in this process (issue 19). A large read of an uncached range
// on a file system that allows it bypasses the page cache: O_DIRECT reads into aligned 8 MiB
// buffers, a helper thread keeping the disk busy while the caller copies and hashes the
// previous buffer (from 8 MiB; from 512 KiB straight into a caller's memory that shares the
// data's place in its 4 KiB block). Decided per read at run time: a range already in the page cache
// (every page of it: counted with cachestat(2) where the kernel has it, Linux 6.5, else probed
// at three bytes with preadv2(RWF_NOWAIT)) or a file system that refuses O_DIRECT (tmpfs, some
// network file systems) is read with plain pread. CKPT_DIRECT_IO=off never uses O_DIRECT, =on skips
// the page-cache probe; unset or "auto" decides as above.
struct DirectReadStats {
  uint64_t direct_bytes = 0;    // bytes delivered by O_DIRECT reads
  uint64_t buffered_bytes = 0;  // bytes of large reads delivered by pread
  uint64_t cached_ranges = 0;   // large reads read buffered because the range was cached
  uint64_t refused = 0;         // files whose file system refused O_DIRECT
  // Of direct_bytes, those read straight into the caller's memory (ReadLarge into a buffer at
  // the same position within a 4 KiB block as the data in the file; no bounce buffer).
  uint64_t direct_into_caller_bytes = 0;
};
DirectReadStats GetDirectReadStats();

// How PosixEnv's large writes went in this process (issue 19): appends of 8 MiB or more to a
// new WritableFile (an export's tensor pieces; 1 MiB from I/O memory at the place its file
// offset takes in a 4 KiB block) and the rank files' uncompressed data
// (RandomWriteFile::WriteThrough, ranges with 512 KiB or more of whole 4 KiB blocks) leave
// through aligned staging memory with O_DIRECT, two requests in flight, where the file system
// allows it. A rank file's data that lies in I/O memory (IsIoMemory, aligned_buffer.h) at its
// offset's place in a 4 KiB block leaves with O_DIRECT from where it is. The unaligned head
// and tail of each range, a file system that refuses O_DIRECT, and CKPT_DIRECT_IO=off use
// pwrite (the page cache).
struct DirectWriteStats {
  uint64_t direct_bytes = 0;    // bytes written with O_DIRECT
  uint64_t in_place_bytes = 0;  // of direct_bytes, those written from the caller's memory
  uint64_t buffered_bytes = 0;  // bytes of WriteThrough calls and large appends written with pwrite
  uint64_t refused = 0;         // files whose file system refused O_DIRECT writes
};
DirectWriteStats GetDirectWriteStats();

// An existing file written at offsets: the rank file's uncompressed regions, which HDF5
// allocated. Not thread-safe. Close() is idempotent; the destructor closes quietly.
class RandomWriteFile {
 public:
  // Called with each consecutive piece of a WriteThrough range just before it goes out.
  using PieceFn = std::function<void(const uint8_t* p, size_t n)>;
  static constexpr size_t kWritePiece = 1u << 20;

  virtual ~RandomWriteFile() = default;
  virtual Status Write(uint64_t offset, std::string_view data) = 0;
  // Writes `data` at `offset`, handing each consecutive piece of at most kWritePiece bytes to
  // `before` (may be empty) in order just before it is written (the writer hashes it while it
  // is in cache), or while it is written where it leaves from where it lies (as AppendThrough).
  // The default writes piece by piece through Write and starts each piece's writeback.
  // PosixEnv moves the 4 KiB-aligned middle of a range with O_DIRECT (DirectWriteStats): from
  // where it lies, before the call returns, when it lies in I/O memory; else copied into
  // staging buffers, whose writes may still be going out when the call returns (the next
  // range is hashed and copied meanwhile). Read, Write, Size, Sync and Close wait for them, and
  // the error of any comes back from a later call: once WriteThrough returns, `data` may be
  // reused at once. Durable only after Sync().
  virtual Status WriteThrough(uint64_t offset, std::string_view data, const PieceFn& before);
  // Reads back exactly n bytes at offset (DataLoss when the file ends first).
  virtual Status Read(uint64_t offset, size_t n, void* out) = 0;
  virtual Result<uint64_t> Size() = 0;
  // Reserves [0, size) on disk now (fallocate), so a full disk fails here and not midway.
  // File systems without fallocate skip the reservation (OK).
  virtual Status Reserve(uint64_t size) = 0;
  // Starts writeback of a written range (a hint, as RocksDB's bytes_per_sync); errors surface
  // at Sync().
  virtual void StartWriteback(uint64_t offset, uint64_t n) = 0;
  virtual Status Sync() = 0;  // fsync (data and metadata)
  virtual Status Close() = 0;
};

// An exclusive advisory lock on a file (flock); released when this is destroyed, and by the
// kernel when the process dies.
class FileLock {
 public:
  virtual ~FileLock() = default;
};

struct DirEntry {
  std::string name;
  bool is_dir = false;  // a directory, or a symbolic link to one (Env::IsSymlink tells)
};

class Env {
 public:
  virtual ~Env() = default;
  // The process-wide PosixEnv. Never null; not owned by the caller. Thread-safe.
  static Env* Default();

  // Creates or truncates path.
  virtual Result<std::unique_ptr<WritableFile>> NewWritableFile(const std::string& path) = 0;
  // Opens path for appending, creating it when missing (a run log).
  virtual Result<std::unique_ptr<WritableFile>> NewAppendableFile(const std::string& path) = 0;
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
  // Whether path itself is a symbolic link (lstat; false when it does not exist).
  virtual bool IsSymlink(const std::string& path) = 0;
  virtual Result<uint64_t> FileSize(const std::string& path) = 0;

  // Opens path for reads at offsets.
  virtual Result<std::unique_ptr<RandomAccessFile>> NewRandomAccessFile(
      const std::string& path) = 0;
  // As NewRandomAccessFile, for a file inside a checkpoint (a rank file): a symbolic link as the
  // last path component is refused (O_NOFOLLOW) with DataLoss "<path> is a symbolic link ...",
  // as is anything but a regular file, and the open never blocks (a FIFO planted in a root).
  virtual Result<std::unique_ptr<RandomAccessFile>> NewCheckpointFile(
      const std::string& path) = 0;
  // Opens the existing file path for writes at offsets (no truncation).
  virtual Result<std::unique_ptr<RandomWriteFile>> OpenRandomWriteFile(
      const std::string& path) = 0;
  // Creates path if needed and takes an exclusive lock on it without waiting; on success the
  // file holds this process's pid. Held elsewhere: FailedPrecondition
  // "<path> is held by pid N" (N as the holder wrote it, "unknown" if it wrote nothing).
  virtual Result<std::unique_ptr<FileLock>> TryLockFile(const std::string& path) = 0;
  // Creates path and every missing parent, fsyncing the parent of each directory it creates
  // (a new directory is durable only once its parent's entry is). OK when path is a directory.
  virtual Status CreateDirs(const std::string& path) = 0;
};

// Reads a small file inside a checkpoint (a manifest, `latest`) whole, through
// env->NewCheckpointFile: a symbolic link or anything but a regular file is refused (DataLoss
// naming it), so a link planted in a checkpoint never makes a reader open a file outside it;
// a file over max_bytes is DataLoss naming its size, never read into memory.
Result<std::string> ReadCheckpointFileToString(Env* env, const std::string& path,
                                               uint64_t max_bytes);
// The same into *out, whose memory is kept for the next call: reading many manifests one after
// another touches and zero-fills fresh memory once, not once per file.
Status ReadCheckpointFileInto(Env* env, const std::string& path, uint64_t max_bytes,
                              std::string* out);

// Forwards every call to target() (leveldb's EnvWrapper): a test or hooking Env derives from it
// and overrides only what it changes. Does not own the target.
class EnvWrapper : public Env {
 public:
  // nullptr: Env::Default().
  explicit EnvWrapper(Env* target) : target_(target ? target : Env::Default()) {}
  Env* target() const { return target_; }

  Result<std::unique_ptr<WritableFile>> NewWritableFile(const std::string& path) override {
    return target_->NewWritableFile(path);
  }
  Result<std::unique_ptr<WritableFile>> NewAppendableFile(const std::string& path) override {
    return target_->NewAppendableFile(path);
  }
  Status BeginExternalWrite(const std::string& path) override {
    return target_->BeginExternalWrite(path);
  }
  Status SyncFile(const std::string& path) override { return target_->SyncFile(path); }
  Status SyncDir(const std::string& path) override { return target_->SyncDir(path); }
  Status RenameFile(const std::string& from, const std::string& to) override {
    return target_->RenameFile(from, to);
  }
  Status CreateDir(const std::string& path) override { return target_->CreateDir(path); }
  Status RemoveFile(const std::string& path) override { return target_->RemoveFile(path); }
  Status RemoveDirRecursive(const std::string& path) override {
    return target_->RemoveDirRecursive(path);
  }
  Result<std::string> ReadFileToString(const std::string& path) override {
    return target_->ReadFileToString(path);
  }
  Result<std::vector<DirEntry>> ListDir(const std::string& path) override {
    return target_->ListDir(path);
  }
  bool Exists(const std::string& path) override { return target_->Exists(path); }
  bool IsSymlink(const std::string& path) override { return target_->IsSymlink(path); }
  Result<uint64_t> FileSize(const std::string& path) override { return target_->FileSize(path); }
  Result<std::unique_ptr<RandomAccessFile>> NewRandomAccessFile(
      const std::string& path) override {
    return target_->NewRandomAccessFile(path);
  }
  Result<std::unique_ptr<RandomAccessFile>> NewCheckpointFile(const std::string& path) override {
    return target_->NewCheckpointFile(path);
  }
  Result<std::unique_ptr<RandomWriteFile>> OpenRandomWriteFile(const std::string& path) override {
    return target_->OpenRandomWriteFile(path);
  }
  Result<std::unique_ptr<FileLock>> TryLockFile(const std::string& path) override {
    return target_->TryLockFile(path);
  }
  Status CreateDirs(const std::string& path) override { return target_->CreateDirs(path); }

 private:
  Env* target_;
};

// Writes data to path through a temporary name: tmp + fsync + rename + fsync(dir).
// A crash at any point leaves either the old file or the new one, never a mix.
Status WriteFileAtomic(Env* env, const std::string& path, std::string_view data);

// Fault injection and power-loss simulation for tests (leveldb's fault_injection_test).
// Counts every step; with FailAt(n) the n-th step (1-based) of the selected kind fails with an
// IOError naming the step. Mutating steps (writes, offset writes and reservations, fsyncs,
// renames, directory creation, taking a lock) are counted under their kind and kAny; reads
// (kRead: reading a whole file, opening one for offset reads, each offset read) only under
// kRead, so FailAt(kAny, n) means "the n-th mutating step". DropUnsyncedData()
// then simulates a power cut: files never fsynced are truncated to their last synced size (or
// removed when created since), and renames not followed by a SyncDir of the target directory
// are undone.
class FaultInjectionEnv : public EnvWrapper {
 public:
  enum class Op { kAny, kWrite, kSync, kRename, kSyncDir, kCreateDir, kRead, kLock };
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
  // Opening is a kWrite step, each Append a kWrite, Sync a kSync. A file it creates is
  // unsynced until its fsync; data appended to an existing file is not dropped by
  // DropUnsyncedData.
  Result<std::unique_ptr<WritableFile>> NewAppendableFile(const std::string& path) override;
  Status BeginExternalWrite(const std::string& path) override;
  Status SyncFile(const std::string& path) override;
  Status SyncDir(const std::string& path) override;
  Status RenameFile(const std::string& from, const std::string& to) override;
  Status CreateDir(const std::string& path) override;
  Status CreateDirs(const std::string& path) override;
  Result<std::string> ReadFileToString(const std::string& path) override;
  Result<std::unique_ptr<RandomAccessFile>> NewRandomAccessFile(
      const std::string& path) override;
  Result<std::unique_ptr<RandomAccessFile>> NewCheckpointFile(const std::string& path) override;
  Result<std::unique_ptr<RandomWriteFile>> OpenRandomWriteFile(const std::string& path) override;
  Result<std::unique_ptr<FileLock>> TryLockFile(const std::string& path) override;

  struct Impl;  // opaque; public only so the file wrapper in fault_env.cc can name it

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace ckpt
