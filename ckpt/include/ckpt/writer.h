// Saving a checkpoint: every rank calls SaveCheckpoint collectively; the commit protocol
// (ckpt/src/writer.cc, numbered at the top of that file) makes the tag appear atomically.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "ckpt/collective.h"
#include "ckpt/env.h"
#include "ckpt/manifest.h"
#include "ckpt/status.h"

namespace ckpt {

struct Compression {
  enum class Kind { kNone, kZstd };
  Kind kind = Kind::kNone;
  int level = 1;  // "zstd" alone: level 1 (docs/performance.md: level 3 buys no ratio on
                  // optimizer state for about twice the CPU)
  bool shuffle = false;  // HDF5 byte-shuffle filter before zstd
  // "none", "zstd", "zstd:5", "zstd:1+shuffle" (the recommended setting).
  static Result<Compression> Parse(std::string_view text);
  std::string ToString() const;
};

// Writes bytes [offset, offset + length) of a dataset's logical bytes into `out` (see
// DatasetSpec::fill). A non-Ok status fails the save with it.
using DatasetFill = std::function<Status(uint64_t offset, size_t length, void* out)>;

// Where within a 4 KiB block a fill would have the window of `length` bytes at `offset` start
// in memory (its source's place: a read of 512 KiB or more there goes from the disk straight into
// the window, env.h ReadLarge); nullopt: anywhere (see DatasetSpec::fill_place).
using DatasetFillPlace = std::function<std::optional<uint64_t>(uint64_t offset, size_t length)>;

// SaveOptions::fill_window_bytes by default.
inline constexpr uint64_t kFillWindowBytes = 8u << 20;

// One dataset a rank writes. `data` points at numel × DTypeSize(dtype) logical little-endian
// bytes that stay valid for the duration of SaveCheckpoint.
struct DatasetSpec {
  std::string name;
  std::string kind = "tensor";  // "tensor" | "blob" | "json"
  std::string blob_kind;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  const void* data = nullptr;
  // Instead of `data` (which must then be null): the writer asks for the bytes a window at a
  // time, so they need never be in memory at once (`ckpt reshard`). Each byte is asked for
  // exactly once, in increasing offset order, in windows of at most
  // SaveOptions::fill_window_bytes whose offset and length are multiples of the element size
  // (a compressed dataset's windows also end at its chunks' ends), one call at a time: on the
  // thread that writes the rank's file, or (uncompressed) on a helper thread filling the next
  // window while the last one is written. The file is byte for byte what `data` holding the same
  // bytes writes, compressed or not. SaveCheckpoint and SaveRanks take it; AsyncSaver does not
  // (InvalidArgument).
  DatasetFill fill;
  // Optional, with `fill`: asked before each window of an uncompressed dataset; the window's
  // memory then starts at that place within a 4 KiB block (to-universal's windows read from
  // .pt records at any place). The bytes written are the same.
  DatasetFillPlace fill_place;
  // Optional, with `fill`: called on the thread that writes the file with each filled window,
  // before it is written and before the window is filled again, while a helper may be filling
  // the next one (to-universal: the source's checksum of what it read, off the reading
  // thread).
  std::function<void()> filled;

  static DatasetSpec Tensor(std::string name, DType dtype, std::vector<int64_t> shape,
                            const void* data);
  // A tensor whose bytes come from `fill`.
  static DatasetSpec Filled(std::string name, DType dtype, std::vector<int64_t> shape,
                            DatasetFill fill);
  // Opaque bytes (1-D uint8), e.g. an RNG state with blob_kind "mt19937_64".
  static DatasetSpec Blob(std::string name, std::string blob_kind, std::string_view bytes);
  // JSON text stored as 1-D uint8 with kind "json".
  static DatasetSpec Json(std::string name, std::string_view json_text);
};

struct RankContents {
  std::vector<DatasetSpec> datasets;
};

struct SaveOptions {
  Env* env = nullptr;              // nullptr: Env::Default()
  Compression compression;
  uint64_t chunk_bytes = 4u << 20; // HDF5 chunk size for tensors
  int keep_last = 0;               // > 0: after a successful commit keep only the newest K tags
  bool update_latest = true;
  bool file_checksum = true;       // XXH3 of each whole rank file (one read-back pass)
  int compress_threads = 0;        // 0: hardware concurrency / world size, at least 1
  // Format 1.3: every dataset's logical bytes are hashed in pieces of this many bytes (the
  // last one shorter), in the same pass as the dataset digest; slice reads verify the pieces
  // they touch. Rounded down to a multiple of 8 (every element size divides it), at least 8.
  uint64_t piece_bytes = kDefaultPieceBytes;
  // The most bytes asked of a DatasetSpec::fill at once (the writer holds two windows of
  // uncompressed fill datasets, the next one filled while one is written; a compressed one's
  // windows are its chunks'). Rounded down to a multiple of 8, at least 8.
  uint64_t fill_window_bytes = kFillWindowBytes;
  // How long rank 0 waits for the root lock while a `ckpt gc` (or another save) holds it
  // (RootLock::Acquire; gc yields to a waiting saver). Then FailedPrecondition.
  double lock_wait_seconds = 60;
  // Called once when the save starts waiting for the lock; nullptr: a line on stderr.
  std::function<void(const std::string&)> on_lock_wait;
};

// Collective over `comm`: every rank passes its own contents; `meta` must be the same on
// every rank (rank 0's is written; files[] is filled by the writer). Returns the same status
// on every rank. On failure the previous checkpoint and `latest` are untouched and the
// temporary directory is removed (or left for `ckpt gc` if the process dies).
// Errors: AlreadyExists (tag exists), FailedPrecondition (another saver holds the root),
// IOError naming the failed step and file, InvalidArgument (meta does not validate).
Status SaveCheckpoint(const std::string& root, const Manifest& meta,
                      const RankContents& mine, Collective& comm,
                      const SaveOptions& options = {});

// For executables, first thing in main(): stops HDF5 from installing its exit handler, which
// closes files still open at exit. After a failed H5Fclose (a full disk while HDF5 flushed its
// metadata) that handler retries the close on a half-released file and crashes, turning a clear
// ENOSPC error into SIGSEGV. ckpt closes every file it writes explicitly and reports the error,
// so nothing is lost by skipping it. No effect once HDF5 is initialised; a library embedding
// ckpt should leave the choice to its application.
void DisableHdf5ExitCleanup();

// For executables, first thing in main(): ignores SIGXFSZ. Past the file-size limit
// (`ulimit -f`) the kernel then fails the write with EFBIG, which a save reports as
// ResourceExhausted naming the file (and removes its temporary directory), instead of the
// signal killing the process without a word (exit 153) and leaving the directory behind.
void IgnoreFileSizeLimitSignal();

}  // namespace ckpt
