// Private: one rank's HDF5 file — writing it (uncompressed data written with pwrite into
// regions HDF5 allocated, zstd through direct chunk writes, so that data, compression and
// checksums stay outside HDF5's global lock) and reading datasets or slices (uncompressed
// contiguous data read with pread; zstd chunks read with pread and decompressed on a pool of
// threads, outside HDF5; anything else through HDF5).
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ckpt/aligned_buffer.h"
#include "ckpt/env.h"
#include "ckpt/hash.h"
#include "ckpt/manifest.h"
#include "ckpt/status.h"
#include "ckpt/writer.h"

namespace ckpt::internal {

// The per-piece digests of one dataset's logical bytes (format 1.3): bytes arrive in order in
// any cut, each piece_bytes-long piece gets its own XXH3-64.
class PieceDigests {
 public:
  explicit PieceDigests(uint64_t piece_bytes) : piece_bytes_(piece_bytes) {}
  void Update(const void* data, size_t n);
  // The digests so far, the unfinished last piece included (the stream ends here).
  std::vector<std::string> Finish();

 private:
  uint64_t piece_bytes_;
  uint64_t filled_ = 0;  // bytes of the current piece hashed
  Xxh3Stream current_;
  std::vector<std::string> done_;
};

// Verified pieces kept for the next slice read (RankFile::ReadSliceVerified): the last
// `capacity` pieces that reads covered only partly, over all of a reader's files, least
// recently used first out. Memory: capacity × piece size, in I/O memory (AlignedBuffer: never
// zero-filled, and from 2 MiB up a mapping that goes back to the kernel when the cache goes)
// kept by its slot for the pieces that replace it. Not thread-safe.
class PieceCache {
 public:
  explicit PieceCache(size_t capacity) : capacity_(capacity) {}
  // The piece's bytes, or nullptr.
  const uint8_t* Find(const void* file, const std::string& dataset, uint64_t index);
  // Room for the piece's `bytes` (the least recently used entry's when full; std::bad_alloc
  // when it cannot be had); call Erase if it is not filled with verified bytes.
  uint8_t* Insert(const void* file, const std::string& dataset, uint64_t index, size_t bytes);
  void Erase(const void* file, const std::string& dataset, uint64_t index);

 private:
  struct Entry {
    const void* file = nullptr;  // nullptr: the slot holds no piece
    std::string dataset;
    uint64_t index = 0;
    uint64_t used = 0;
    AlignedBuffer bytes;
  };
  size_t capacity_;
  uint64_t clock_ = 0;
  std::vector<Entry> entries_;
};

// Ok when the digests computed from a dataset's bytes (`got`: the whole; `pieces`: per piece,
// may be null) match its record; otherwise DataLoss naming `label`, the dataset and the first
// damaged piece (what a slice read of it would report) or the whole-dataset mismatch.
Status CompareDigests(const std::string& label, const DatasetRecord& rec, const std::string& got,
                      const std::vector<std::string>* pieces);

// What a writer records: SaveOptions::piece_bytes rounded down to a multiple of 8, at least 8.
uint64_t EffectivePieceBytes(uint64_t requested);

// What the file says it is: a rank file of a checkpoint, or (with `root`) another file written
// the same way, the universal checkpoint's universal.h5 (ckpt/src/universal.cc).
struct RankFileHeader {
  int rank = 0;
  int world = 1;
  std::string tag;
  // When set: called with the new file (an hid_t) in place of writing a rank file's root
  // attributes, before any dataset is created; writes the file's own attributes and groups.
  std::function<Status(int64_t file)> root;
  // Superblock version 0 (HDF5 1.8's formats at most) and no modification times: the
  // universal layout's file, which h5py 2.x reads and whose bytes the same content fixes. Its
  // regions lie in creation order: no 4 KiB alignment, no small-data blocks (WriteStructure).
  bool portable = false;
};

struct RankFileWritten {
  std::vector<DatasetRecord> datasets;  // sizes and XXH3 of the logical bytes
  std::string file_xxh3;                // XXH3 of the whole file; empty without file_checksum
  uint64_t bytes = 0;                   // the file's size
  // The metadata seal (h5::SealFile): raw-data extents and the XXH3 of everything else.
  std::vector<std::pair<uint64_t, uint64_t>> data_extents;
  std::string metadata_xxh3;
};

// Creates `path` and writes every dataset in two phases: HDF5 writes the structure (uncompressed
// datasets get contiguous regions allocated at creation and never filled; compressed tensors are
// chunked and written through direct chunk writes), then the uncompressed bytes are written with
// pwrite outside HDF5 (through options.env), hashed piece by piece on the way. The caller fsyncs.
Result<RankFileWritten> WriteRankFile(const std::string& path, const RankFileHeader& header,
                                      const std::vector<DatasetSpec>& datasets,
                                      const SaveOptions& options);

// Phase 1 alone, through the file-access property list `fapl` (an hid_t), with no data needed
// (DatasetSpec::data may be null): what ckpt estimate uses, with a metadata-only driver, to
// predict a rank file's size exactly. Uncompressed only.
Status WriteRankFileStructure(const std::string& path, const RankFileHeader& header,
                              const std::vector<DatasetSpec>& datasets,
                              const SaveOptions& options, int64_t fapl);

// A rank file opened read-only. Errors name the file (`label`) and the dataset.
class RankFile {
 public:
  // Opens through Env::NewCheckpointFile and h5::OpenVerified with the manifest's record of the
  // file (size, seal or whole-file digest): corrupt HDF5 metadata, symbolic links and links
  // other than hard links are refused (DataLoss) before HDF5 reads them, and so are datasets
  // h5::CheckStorage refuses (external storage, virtual or compact layouts, unknown filters).
  // Offset reads go through env (nullptr: Env::Default()); HDF5 reads through its own driver.
  // `universal`: the file is a universal checkpoint's (sealed the same way; its root
  // attributes say 'ckpt-universal' and the universal layout's version).
  static Result<std::unique_ptr<RankFile>> Open(const std::string& path, std::string label,
                                                const FileRecord& record, Env* env = nullptr,
                                                bool universal = false);
  // Open in two steps, for a caller that verifies several files at once while libhdf5 (which
  // serialises its calls) parses one at a time (CheckCheckpoint): OpenUnparsed opens the file
  // and verifies its size and seal with offset reads only, no libhdf5 call (every method below
  // fails with FailedPrecondition until Parse); Parse has libhdf5 open the verified file and
  // checks what it says it is. Open is both.
  static Result<std::unique_ptr<RankFile>> OpenUnparsed(const std::string& path, std::string label,
                                                        const FileRecord& record,
                                                        Env* env = nullptr, bool universal = false);
  Status Parse();
  ~RankFile();
  // Checks the stored dtype and shape against the record (DataLoss when they differ).
  Status CheckShape(const DatasetRecord& rec) const;
  // The whole dataset; with `digest`, every byte read is also fed to it as it arrives.
  Status ReadAll(const DatasetRecord& rec, void* out, Xxh3Stream* digest = nullptr) const;
  // Elements [offset, offset + count) of a 1-D dataset, unverified. `sequential`: the caller
  // streams the dataset in chunk-aligned blocks, so the chunk cache is bypassed.
  Status ReadSlice(const DatasetRecord& rec, int64_t offset, int64_t count, void* out,
                   bool sequential = false) const;
  // Where element `offset` of a dataset stored as plain contiguous bytes lies in the file
  // (nullopt when it is stored otherwise: zstd chunks): a ReadSlice into memory at the same
  // place within a 4 KiB block is read straight from the disk into it (ReadLarge).
  Result<std::optional<uint64_t>> SliceFileOffset(const DatasetRecord& rec, int64_t offset) const;
  // The same, verified against the record's piece digests (rec.has_pieces() required): every
  // piece the range touches is read whole and hashed before any of its bytes are returned; a
  // piece the range covers only partly (at most one at each end) goes into `cache` (may be
  // null), so the next read that starts in it does not read it again. DataLoss naming the
  // file, the dataset and the piece on a mismatch. *bytes_read gets the bytes read from the
  // file.
  Status ReadSliceVerified(const DatasetRecord& rec, int64_t offset, int64_t count, void* out,
                           uint64_t* bytes_read, PieceCache* cache) const;
  // Reads the whole dataset in L2-sized blocks (zstd chunks: decompressed on threads, a few
  // chunks in memory) and checks it against the record's digest and,
  // when it has them, its piece digests (DataLoss naming the first damaged piece).
  Status VerifyDataset(const DatasetRecord& rec) const;

  // check --deep's one pass over the file (issue 19): every byte of the file is read once, in
  // order, in large blocks, and fed to the file's XXH3; the bytes of each dataset stored as
  // plain contiguous bytes are fed to its digest and piece digests from the same buffer.
  // Datasets stored otherwise (zstd chunks) are then verified one by one (VerifyDataset:
  // their frames are read again and decompressed on threads).
  // `progress` gets the bytes consumed as they are. An error reading the file fails the call;
  // a damaged dataset is a DataLoss in `datasets`.
  struct WholeFileCheck {
    std::string file_xxh3;         // of bytes [0, size) of the file
    std::vector<Status> datasets;  // one per record passed in, in order
  };
  Result<WholeFileCheck> CheckWholeFile(const std::vector<DatasetRecord>& datasets,
                                        const std::function<void(uint64_t)>& progress) const;
  // The same in two steps, so that a caller can close the file's HDF5 state between them and
  // open the next file with it (CheckCheckpoint): PlanWholeFile asks HDF5 where each dataset
  // lies (and checks its shape); RunWholeFile reads the file, and goes back to HDF5 only for
  // the datasets the plan could not place (needs_hdf5).
  struct WholeFilePlan {
    struct Region {
      uint64_t begin, end;
      size_t index;  // into the records
    };
    std::vector<Region> regions;       // plain contiguous bytes, in file order
    std::vector<size_t> through_hdf5;  // verified through VerifyDataset
    std::vector<Status> early;         // per record: decided without reading (ok: not yet)
    bool needs_hdf5() const { return !through_hdf5.empty(); }
  };
  Result<WholeFilePlan> PlanWholeFile(const std::vector<DatasetRecord>& datasets) const;
  Result<WholeFileCheck> RunWholeFile(const std::vector<DatasetRecord>& datasets,
                                      const WholeFilePlan& plan,
                                      const std::function<void(uint64_t)>& progress) const;
  // Closes every HDF5 handle of the file, so that libhdf5 frees its per-file state (a metadata
  // cache of about 0.5 MiB, first-touched memory each time: the next file opened reuses it).
  // Afterwards only offset reads of datasets already placed work (RunWholeFile of a plan that
  // does not need HDF5); anything that needs HDF5 fails with FailedPrecondition.
  void CloseHdf5();

 private:
  RankFile() = default;
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ckpt::internal
