// Asynchronous save: Save() snapshots this rank's contents into staging memory the saver owns
// and returns; a background thread then runs SaveCheckpoint on the snapshot (the same files,
// commit protocol and checksums as a synchronous save: the format does not change). Training
// stalls only for the copy.
//
// Ordering: one save persists at a time. Save() first waits for the previous save to finish, so
// tags commit in call order and `latest` only moves forward. There is no fail-fast variant: the
// ranks of a group could disagree on whether the previous save is done, and a rank that skipped
// the save would leave the others blocked in its collective.
//
// Failures: the background save's Status (an I/O error naming the step and the file, a full
// disk, another saver holding the root) is kept until the next Wait(), Poll() or Save() returns
// it. The commit protocol leaves the previous checkpoint as `latest` whatever happens, and
// SaveCheckpoint returns the same status on every rank, so every rank learns of a failure at
// the same call.
//
// Process exit: the destructor finishes the save in flight (the result is dropped: call Wait()
// first to learn it). A process killed or _exit()ed during the persist leaves either the new tag
// committed or the previous `latest` untouched, with at most a .tmp-* directory for `ckpt gc`
// (docs/reliability.md) — never a half-committed tag. Do not call exit() while a save is in
// flight: static destructors (HDF5's among them) would run under the background thread.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "ckpt/collective.h"
#include "ckpt/manifest.h"
#include "ckpt/status.h"
#include "ckpt/writer.h"

namespace ckpt {

namespace internal {
class StagingBuffer;
}

// Figures of the saver, for benchmarks and tests.
struct AsyncSaverStats {
  int64_t saves_started = 0;
  uint64_t last_staged_bytes = 0;   // bytes copied by the last Save()
  double last_stage_seconds = 0;    // time the last Save() spent copying (the training stall)
  double last_persist_seconds = 0;  // time the last finished background save took
  uint64_t host_staging_bytes = 0;  // staging memory held: plain 4 KiB-aligned host memory
  uint64_t pinned_staging_bytes = 0;  // page-locked (cudaHostAlloc) for device sources
  int64_t staging_allocations = 0;  // times the staging memory was (re)allocated
};

// One per rank. Save/Wait/Poll are called from one thread (the training loop); the saver is not
// meant to be shared between threads.
//
// The Collective passed to Save() is used by the background thread while the caller goes on
// (collective.h, "Collectives and background saves"): it must be one that nothing else uses
// while a save is in flight — a separate ThreadGroup, or an MPI collective over its own
// duplicated communicator with MPI_THREAD_MULTIPLE. It, and options.env, must stay valid until
// the save finishes (Wait() returns).
class AsyncSaver {
 public:
  // In a CUDA build, asks CUDA once per process whether a GPU is usable (so the first save's
  // stall does not include it). Allocates nothing; no thread yet.
  AsyncSaver();
  // Waits for the save in flight, if any (its result is dropped), then stops the thread.
  ~AsyncSaver();
  AsyncSaver(const AsyncSaver&) = delete;
  AsyncSaver& operator=(const AsyncSaver&) = delete;

  // Waits for the previous save; if it failed, returns its error (with the context "previous
  // async save") and starts nothing. Otherwise copies every dataset's bytes into staging memory
  // (allocated on first use, reused, grown only when this save needs more; device sources go
  // through page-locked memory and a cudaMemcpy when CUDA is built), copies `meta`, hands the
  // snapshot to the background thread and returns OK. The caller may overwrite or free its
  // buffers as soon as this returns. Device data is copied on CUDA's legacy default stream:
  // kernels on other streams that write the tensors must be synchronized first.
  // Errors before the handover (a dataset with a negative dimension or a size that overflows,
  // out of memory) are returned here and start nothing; this rank then must not expect the
  // others to commit, exactly as with a synchronous SaveCheckpoint that fails its validation.
  Status Save(const std::string& root, const Manifest& meta, const RankContents& contents,
              Collective& collective, const SaveOptions& options = {});

  // Blocks until no save is in flight and returns the result of the last save not yet reported
  // (OK when there was none). Each result is reported once.
  Status Wait();

  // Does not block: nullopt while a save is persisting, otherwise what Wait() would return.
  std::optional<Status> Poll();

  AsyncSaverStats stats() const;

 private:
  struct Job;
  void Run();
  Status TakeResultLocked();

  std::unique_ptr<internal::StagingBuffer> host_;
  std::unique_ptr<internal::StagingBuffer> pinned_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::unique_ptr<Job> job_;  // the snapshot handed to the thread; null when idle
  bool busy_ = false;         // a job is queued or persisting
  bool stop_ = false;
  std::optional<Status> result_;  // the finished save's status, until reported
  AsyncSaverStats stats_;
  std::thread thread_;  // started by the first Save
};

}  // namespace ckpt
