// The HDF5 conventions of ckpt-format files: RAII handles, one-time library setup (zstd filter
// 32015, quiet error stack), error text from HDF5's error stack, the HDF5 types of a ckpt dtype
// and scalar attributes. Public so that every library writing or reading a ckpt-format HDF5
// file (the rank files here, convert's universal layout) does it with the same code; including
// it needs HDF5's headers (<hdf5.h>), which the rest of ckpt's public headers do not.
#pragma once

#include <hdf5.h>

#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "ckpt/dtype.h"
#include "ckpt/env.h"
#include "ckpt/status.h"

namespace ckpt::h5 {

// Registered id of the zstd filter (same as hdf5plugin / HDF Group's registered filter list).
inline constexpr H5Z_filter_t kZstdFilterId = 32015;

// Registers the zstd filter and silences HDF5's automatic error printing for this thread.
// Idempotent and cheap; call at every entry point that may run on a new thread.
void Init();

// Skips HDF5's exit-time cleanup for the rest of the process (ckpt::DisableHdf5ExitCleanup in
// writer.h is the entry point executables call).
void DisableExitCleanup();

// The innermost message on HDF5's error stack for this thread, or "" if empty.
std::string ErrorText();

// Move-only owner of an hid_t; Close(fn) decides how it is released.
class Handle {
 public:
  using Closer = herr_t (*)(hid_t);
  Handle() = default;
  Handle(hid_t id, Closer closer) : id_(id), closer_(closer) {}
  Handle(Handle&& o) noexcept : id_(std::exchange(o.id_, H5I_INVALID_HID)), closer_(o.closer_) {}
  Handle& operator=(Handle&& o) noexcept {
    if (this != &o) {
      Reset();
      id_ = std::exchange(o.id_, H5I_INVALID_HID);
      closer_ = o.closer_;
    }
    return *this;
  }
  Handle(const Handle&) = delete;
  Handle& operator=(const Handle&) = delete;
  ~Handle() { Reset(); }
  hid_t get() const { return id_; }
  bool valid() const { return id_ >= 0; }
  // Closes now and reports failure (e.g. H5Fclose flushing to a full disk).
  Status Close(std::string_view what) {
    if (id_ < 0) return Status::Ok();
    const hid_t id = std::exchange(id_, H5I_INVALID_HID);
    if (closer_(id) >= 0) return Status::Ok();
    // A close that failed to flush (a full disk) can leave the file open inside HDF5, whose
    // exit-time cleanup may then fault: executables call DisableHdf5ExitCleanup (writer.h,
    // which calls DisableExitCleanup below),
    // and the writer reserves the file's space before writing data, so the data phase fails
    // first, outside HDF5.
    return IOError(std::string(what) + ": " + ErrorText());
  }

 private:
  void Reset() {
    if (id_ >= 0 && closer_) closer_(id_);
    id_ = H5I_INVALID_HID;
  }
  hid_t id_ = H5I_INVALID_HID;
  Closer closer_ = nullptr;
};

inline Handle File(hid_t id) { return Handle(id, H5Fclose); }
inline Handle Dataset(hid_t id) { return Handle(id, H5Dclose); }
inline Handle Space(hid_t id) { return Handle(id, H5Sclose); }
inline Handle Type(hid_t id) { return Handle(id, H5Tclose); }
inline Handle Plist(hid_t id) { return Handle(id, H5Pclose); }
inline Handle Attr(hid_t id) { return Handle(id, H5Aclose); }
inline Handle Group(hid_t id) { return Handle(id, H5Gclose); }

// File (little-endian) and memory types of a ckpt dtype; bf16/fp16 are stored as uint16. Both
// are HDF5's predefined types: never close them.
hid_t FileType(DType t);
hid_t MemType(DType t);

// Scalar attributes of a file, group or dataset. Strings are written fixed-length, null-padded
// ASCII (docs/format.md). IOError naming the attribute on failure.
Status WriteStringAttr(hid_t obj, const char* name, const std::string& value);
Status WriteIntAttr(hid_t obj, const char* name, int64_t value);
// Reads a string attribute of any HDF5 string type: fixed-length, or variable-length in its
// own character set (h5py writes UTF-8). NotFound when absent; DataLoss when it is not a
// string or cannot be read.
Result<std::string> ReadStringAttr(hid_t obj, const char* name);

// Dataspaces of full-shape datasets (the universal layout: its reader here, its writer in
// convert). The space of `shape` (scalar when shape is empty).
Handle SpaceFor(const std::vector<int64_t>& shape);
// Selects the row-major flat elements [begin, end) of a dataset of `shape` in `space`, as a
// union of at most 2 × rank hyperslabs (elements stay in flat order).
Status SelectFlatRange(hid_t space, const std::vector<int64_t>& shape, int64_t begin, int64_t end);

// ---- Untrusted files (docs/format.md, "Metadata seal") -------------------------------------
// libhdf5 is not hardened against corrupt metadata (a flipped bit in an object header can
// crash it), so no byte of a file's HDF5 structure reaches it unverified, and HDF5 features
// that reach outside the file are refused before any data is read. A sealed file can still be
// hostile (whoever writes the manifest can seal anything): with a probe set (SetHdf5Probe,
// reader.h) a process of its own walks each file through libhdf5 first (ProbeStructure).

using Extents = std::vector<std::pair<uint64_t, uint64_t>>;  // {offset, bytes}, sorted

// The seal of an HDF5 file this process just wrote (trusted): its raw-data regions
// (contiguous dataset storage and stored chunks), sorted and merged where adjacent, and the
// XXH3-64 hex digest of every other byte of its `bytes` bytes, in file order (read via env).
// SealFile reopens the closed file for the first; a writer that still has it open takes them
// with DataExtents and, once every byte is written, MetadataDigest (WriteRankFile: no second
// H5Fopen under the library's lock at the end of a save).
Status SealFile(Env* env, const std::string& path, uint64_t bytes, Extents* extents,
                std::string* xxh3);
// The raw-data regions of the open file `file` (every dataset's, as SealFile records them);
// `label` names it in errors. Raw data never moves once allocated, so they hold after close.
Result<Extents> DataExtents(hid_t file, const std::string& label);
// Reads exactly n bytes at offset into out.
using ReadAtFn = std::function<Status(uint64_t offset, size_t n, void* out)>;
// The seal's digest: XXH3-64 hex of the bytes of [0, bytes) outside `extents`, in file order.
Result<std::string> MetadataDigest(const ReadAtFn& read, uint64_t bytes, const Extents& extents,
                                   const std::string& label);

// Opens the HDF5 file at `path` read-only for reading untrusted content, `label` naming it in
// errors. `file` is the same file, already opened through Env::NewCheckpointFile (which refused
// a symbolic link or anything but a regular file):
//  1. its size must be `bytes`;
//  2. verifies the seal (`metadata_xxh3` over everything outside `extents`) or, for files
//     written before the seal, the whole-file XXH3 `file_xxh3` when there is one, before
//     libhdf5 parses a byte (DataLoss "...: not opened" on mismatch);
//  3. after H5Fopen, refuses every link that is not a hard link (soft, external, user-defined)
//     and every dataset CheckStorage refuses, whether or not the caller will read it.
// With neither digest (legacy files written without checksums) step 2 is skipped.
Result<Handle> OpenVerified(const RandomAccessFile& file, const std::string& path,
                            const std::string& label, uint64_t bytes, const Extents& extents,
                            const std::string& metadata_xxh3, const std::string& file_xxh3);

// OpenVerified in two steps, for a caller that verifies several files at once while libhdf5
// (which serialises its calls) parses one at a time: VerifySeal is steps 1 and 2 (offset reads
// through `file` and XXH3, no libhdf5 call); OpenSealed is step 3, for a file VerifySeal passed.
Status VerifySeal(const RandomAccessFile& file, const std::string& label, uint64_t bytes,
                  const Extents& extents, const std::string& metadata_xxh3,
                  const std::string& file_xxh3);
Result<Handle> OpenSealed(const std::string& path, const std::string& label);
// With a probe program set (ckpt::SetHdf5Probe, reader.h): has it open and walk the file at
// `path` in a process of its own, DataLoss when libhdf5 crashed or hung there; Ok without a
// probe, or when the probe walked this file (same inode, size, modification time) before;
// a file a probe hung on is refused again without another wait.
// OpenSealed calls it first; a caller that verifies files in parallel before parsing them one
// at a time (VerifySeal, then OpenSealed under a lock) calls it with VerifySeal, so that the
// probes run in parallel too.
Status ProbeStructure(const std::string& path, const std::string& label);
// Probes several files ahead, for a caller that opens many (`check`, export): with a probe
// set, up to `processes` probe processes (0: one per core, up to 8) start at once, each
// walking its share of `paths` one file after another (up to 256 files a process, then
// another) and saying so after each, so a process start is paid per share rather than per
// file. ProbeStructure of one of these files waits for the batch's word on it. A file a
// probe crashed on is left to ProbeStructure, which probes it alone (so a
// file is refused only for what libhdf5 does with it alone, as before batches), and the share
// goes on with the next file in a new process; a file a probe hung on is refused (each file has
// the probe's `seconds` from the word before it), and not waited for again; all of a share's
// files are left to ProbeStructure when its probe exits on its own (a `ckpt` of another
// version walks one file). Without a probe, or for fewer than two files, it does nothing.
// The destructor stops the probes still running (their files are left to ProbeStructure).
class ProbeBatch {
 public:
  explicit ProbeBatch(const std::vector<std::string>& paths, int processes = 0);
  ~ProbeBatch();
  ProbeBatch(const ProbeBatch&) = delete;
  ProbeBatch& operator=(const ProbeBatch&) = delete;

 private:
  struct Share;
  void Walk(Share& share, const std::string& program, double seconds);
  void Resolve(Share& share, size_t from, size_t to, const std::string* refusal,
               bool walked = false);
  std::mutex mu_;  // stop_ and each share's running probe
  bool stop_ = false;
  std::vector<Share> shares_;
  std::vector<std::thread> threads_;
};
// Forgets which files the probe walked, so the next ProbeStructure of each runs the probe
// again: for a harness that rewrites one file in place faster than its modification time
// moves (fuzz/fuzz_resealed.cc).
void ForgetProbedFiles();

// Refuses, before its data is read, a dataset whose storage the format does not define:
// external storage, a virtual or compact layout, a filter other than shuffle and zstd (an
// unknown filter would make HDF5 search and load plugins), shuffle without zstd (its chunks
// would reach HDF5 at whatever length the file claims), elements not stored (an unwritten
// chunk, an unallocated contiguous dataset: HDF5 reads them as the fill value). DataLoss
// naming `where`.
Status CheckStorage(hid_t dset, const std::string& where);

// A dataset-access (or link-access) property list on which external links never resolve.
Handle NoExternalLinks(hid_t plist_class = H5P_DATASET_ACCESS);

}  // namespace ckpt::h5
