// safetensors: reader and streaming writer following the published format exactly:
//   8-byte little-endian u64 N | N bytes of JSON header (UTF-8, padded with spaces so the data
//   starts 8-byte aligned) | contiguous tensor data.
// Header: {"__metadata__": {str: str}, name: {"dtype": "F32", "shape": [..],
//          "data_offsets": [begin, end]}} with offsets relative to the data start.
// The reader caps the header size (100 MiB), requires offsets that tile the data with no
// gap or overlap and dtype × shape = byte length; errors name the file.
//
// Integrity record (ckpt's addition, in __metadata__, so every safetensors reader still loads
// the file; docs/convert.md "Integrity"):
//   "ckpt_tensor_xxh3": XXH3-64 of each tensor's bytes, 16 lower-case hex digits, in data-offset
//                       order, separated by single spaces ("" when there are no tensors);
//   "ckpt_header_xxh3": XXH3-64 of the 8-byte length followed by the N header bytes exactly as
//                       stored, with this value's own 16 digits replaced by '0' characters.
// Both are fixed-width, so the writer reserves them (zeros) in the header, hashes each tensor
// while its bytes stream through Append() and patches the header in place before publishing;
// the data is never read back. The header digest covers names, dtypes, shapes, offsets, the
// other metadata and the tensor digests, so a renamed tensor or an edited digest is caught.
// Readers verify the header digest whenever the record is present (a file with only one of
// the two keys is DataLoss) and a tensor's digest whenever they read the whole tensor; files
// without the record (other tools, exports written before it existed) load unverified.
//
// Writers publish through a temporary name in the destination directory:
//   1. create "<dir>/.tmp-<name>", write the 8-byte length and the padded header with the
//      digests reserved as zeros;
//   2. append each tensor's bytes in header order (the streaming writer checks the count and
//      hashes them);
//   3. close the file; announce an external write (Env::BeginExternalWrite), write the header
//      with the digests filled in over the reserved one (pwrite at offset 8, same length);
//   4. fsync the file (Env::SyncFile);
//   5. rename it to "<dir>/<name>", fsync <dir>.
// A crash before step 5 leaves only the ".tmp-" file, never a file under the final name.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "ckpt/dtype.h"
#include "ckpt/env.h"
#include "ckpt/status.h"

namespace ckpt::safetensors {

// The __metadata__ keys of the integrity record (reserved: writers set them, replacing any
// value a caller passes).
inline constexpr std::string_view kTensorDigestsKey = "ckpt_tensor_xxh3";
inline constexpr std::string_view kHeaderDigestKey = "ckpt_header_xxh3";

struct SafetensorsTensor {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  uint64_t begin = 0;  // data_offsets, relative to the data section
  uint64_t end = 0;
  std::optional<uint64_t> xxh3;  // recorded digest of the tensor's bytes; nullopt: none recorded
  int64_t numel() const;
};

struct SafetensorsHeader {
  std::map<std::string, std::string> metadata;
  std::vector<SafetensorsTensor> tensors;  // in data-offset order
  uint64_t data_start = 0;                 // absolute file offset of the data section
  uint64_t file_size = 0;
  // The file carries the integrity record and its header digest matched; every tensor then
  // has an xxh3.
  bool checksummed = false;
  const SafetensorsTensor* Find(const std::string& name) const;
};

// Parses and validates the header of `path` (reads only the header) and, when the integrity
// record is present, verifies the header digest. NotFound when the file does not exist;
// DataLoss naming the file for a malformed header, a digest mismatch or an incomplete record.
Result<SafetensorsHeader> ReadSafetensorsHeader(const std::string& path);
// Reads one tensor's raw bytes and checks them against its recorded digest when there is one
// (DataLoss naming the file and the tensor on a mismatch). NotFound for an unknown name.
Result<std::vector<uint8_t>> ReadSafetensorsTensor(const std::string& path,
                                                   const SafetensorsHeader& header,
                                                   const std::string& name);
// One tensor as fp32 (converting BF16/F16/F64), verified like ReadSafetensorsTensor.
Result<std::vector<float>> ReadSafetensorsTensorF32(const std::string& path,
                                                    const SafetensorsHeader& header,
                                                    const std::string& name);

// A tensor whose bytes do not match the digest recorded for it.
struct SafetensorsMismatch {
  std::string tensor;
  std::string what;  // "checksum mismatch (recorded X, computed Y)"
};
// Reads the data section once, in blocks of at most 4 MiB (bounded memory), and compares every
// tensor that has a recorded digest. Returns the mismatching tensors (empty: all match, or
// nothing is recorded); an error Status when the file cannot be read or is shorter than the
// header says (DataLoss).
Result<std::vector<SafetensorsMismatch>> VerifySafetensorsData(const std::string& path,
                                                               const SafetensorsHeader& header);

// A tensor to write: name, dtype and shape (data_offsets are computed by the writer).
struct SafetensorsTensorSpec {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
};

// A tensor whose bytes are in memory: numel(shape) × DTypeSize(dtype) little-endian bytes at
// `data`, valid for the duration of the call.
struct SafetensorsTensorView {
  SafetensorsTensorSpec spec;
  const void* data = nullptr;
};

// Serializes the header JSON (without the 8-byte length), padded with spaces to a multiple of
// 8 bytes, with offsets assigned in the order of `tensors` and the integrity record reserved
// (all-zero digests): exactly the bytes and length a writer stores before it fills in the
// digests. InvalidArgument on an empty, duplicate or "__metadata__" name, an unknown dtype, a
// negative dimension or size overflow.
Result<std::string> BuildSafetensorsHeader(const std::vector<SafetensorsTensorSpec>& tensors,
                                           const std::map<std::string, std::string>& metadata);

// Writes a complete file in one call through the temporary-name protocol above. On failure
// the temporary file is removed and nothing exists under `path` that was not there before.
// env == nullptr: Env::Default().
Status WriteSafetensors(const std::string& path, const std::vector<SafetensorsTensorView>& tensors,
                        const std::map<std::string, std::string>& metadata, Env* env = nullptr);

// Streaming writer: the header (every tensor's name, dtype and shape) is fixed and written
// at Create(); the tensors' bytes are then appended in header order, each in one or more
// Append() calls, so only the piece being written needs to be in memory (each piece is hashed
// as it passes). Finish() checks that every byte was written, fills in the integrity record
// and publishes the file. Destroying a writer that did not finish
// removes its temporary file. Not thread-safe; move-only.
class SafetensorsWriter {
 public:
  static Result<SafetensorsWriter> Create(const std::string& path,
                                          std::vector<SafetensorsTensorSpec> tensors,
                                          const std::map<std::string, std::string>& metadata,
                                          Env* env = nullptr);
  SafetensorsWriter(SafetensorsWriter&&) noexcept;
  SafetensorsWriter& operator=(SafetensorsWriter&&) noexcept;
  ~SafetensorsWriter();

  // Appends the next bytes of the current tensor (pieces may not straddle two tensors).
  // InvalidArgument when `bytes` overruns the current tensor; IOError from the file system.
  Status Append(const void* data, uint64_t bytes);
  // The same for bytes that run on into the tensors after the current one (in header order):
  // a run of small tensors leaves in one write. InvalidArgument when `bytes` overruns the last
  // tensor.
  Status AppendTensors(const void* data, uint64_t bytes);
  // The tensor that the next Append() belongs to; nullopt when all bytes are written.
  std::optional<SafetensorsTensorSpec> current() const;
  // Total file size once finished (8 + header + data).
  uint64_t file_size() const;
  // Steps 3-5 of the protocol above: close, patch the header's digests, fsync, rename to the
  // final path, fsync the directory. FailedPrecondition if some tensor bytes are missing or an
  // earlier Finish() failed (the temporary file is then already removed).
  Status Finish();

 private:
  struct Impl;
  explicit SafetensorsWriter(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace ckpt::safetensors
