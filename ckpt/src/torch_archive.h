// A PyTorch `.pt` file (torch.save's zip archive) opened with libzip: its pickle parsed by the
// restricted reader (ckpt/torch_pickle.h) and its tensors read lazily, element ranges at a
// time, straight from the stored records. Private to the format library.
//
// Layout (torch/serialization.py, _save): every record lives under one top-level directory
// "<name>/": data.pkl (the pickle), data/<key> (one record per storage, little-endian, stored
// uncompressed), version, and optionally byteorder ("little").
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "ckpt/env.h"
#include "ckpt/status.h"
#include "ckpt/torch_pickle.h"

namespace ckpt {

// Not thread-safe (one libzip handle); movable.
class TorchFile {
 public:
  // Opens `path`, checks the archive's consistency (libzip ZIP_CHECKCONS), parses data.pkl
  // and checks that every tensor's storage record exists and holds at least the storage's
  // bytes. DataLoss naming `path` for a damaged archive or pickle; NotFound when missing. The
  // file is read through `env` (nullptr: Env::Default()) as a file inside a checkpoint
  // (NewCheckpointFile: a symbolic link is refused), a tensor's storage with ReadLarge.
  static Result<TorchFile> Open(const std::string& path, Env* env = nullptr);
  TorchFile(TorchFile&&) noexcept;
  TorchFile& operator=(TorchFile&&) noexcept;
  ~TorchFile();

  const std::string& path() const;
  uint64_t file_size() const;  // when it was opened
  const PickleDoc& doc() const;
  const PyValue& root() const { return doc().root(); }
  const TorchTensorRef& tensor(const PyValue& v) const;  // v.kind must be kTensor

  // Elements [first, first + count) of tensor `t` (row-major order of its view) as raw
  // little-endian bytes of its dtype into out (count × itemsize bytes). Contiguous views read
  // only those bytes; strided views read the span they cover.
  Status ReadElements(const TorchTensorRef& t, int64_t first, int64_t count, void* out);
  // The same converted to fp32 (floating dtypes only).
  Status ReadFloats(const TorchTensorRef& t, int64_t first, int64_t count, float* out);
  // Where element `first` of tensor `t` lies in the file: for a contiguous tensor whose storage
  // record is stored uncompressed (as torch.save writes them); nullopt otherwise. libzip does
  // not tell where a record's data starts: it is learned once per record from where libzip
  // reads the record's first byte, and checked against that byte. A caller places its buffer
  // at this offset's position within a 4 KiB block so that ReadElements of 4 MiB or more goes
  // straight into it with O_DIRECT (StateSource::ReadShift).
  std::optional<uint64_t> ElementFileOffset(const TorchTensorRef& t, int64_t first);
  // Reads every record to its end and checks its CRC-32: the records stored uncompressed (every
  // one torch.save writes) from where they lie, in file order, neighbours read together in one
  // range (RandomAccessFile::Scan: the local headers between them read with them), each CRC
  // computed here; any other through libzip, which checks it. DataLoss naming the file and the
  // record on a mismatch. `on_bytes` (may be empty) gets the bytes read as they are read.
  Status VerifyRecords(const std::function<void(uint64_t)>& on_bytes = {});
  // Tensor t's storage record: its size, the CRC-32 the archive records for its bytes, and
  // whether it is stored as it is (as torch.save writes every storage): only then can a range
  // inside it be read without decompressing from its start.
  struct StorageRecord {
    uint64_t size = 0;
    uint32_t crc = 0;
    bool stored = false;
  };
  Result<StorageRecord> Storage(const TorchTensorRef& t);
  // Reads bytes [from, to) of tensor t's storage record and continues `*crc` over them (a
  // stream's gap or tail: DeepSpeedReader's stream verification).
  Status CrcStorageBytes(const TorchTensorRef& t, uint64_t from, uint64_t to, uint32_t* crc);
  // DataLoss naming the file and the record ("CRC error (the archive records X, the bytes give
  // Y)") when `crc`, computed over the whole of t's storage record, is not the archive's.
  Status CompareStorageCrc(const TorchTensorRef& t, uint32_t crc);
  // VerifyRecords for t's storage record alone.
  Status VerifyStorage(const TorchTensorRef& t);
  // ReadElements, and the CRC-32 of t's whole storage record checked: a contiguous view of a
  // stored record has its elements read once and CRC'd where they land, the rest of the record
  // read around them; any other is checked whole first (VerifyStorage).
  Status ReadElementsChecked(const TorchTensorRef& t, int64_t first, int64_t count, void* out);
  uint64_t bytes_read() const;
  // Of the bytes VerifyRecords read, those read from where they lie (not through libzip).
  uint64_t scanned_bytes() const;

 private:
  struct Impl;
  explicit TorchFile(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// The zip format's CRC-32 (libdeflate's) of `n` more bytes after `crc` (0 to begin).
uint32_t ZipCrc32(uint32_t crc, const void* bytes, size_t n);

}  // namespace ckpt
