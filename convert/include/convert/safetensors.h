// safetensors: reader and streaming writer following the published format exactly:
//   8-byte little-endian u64 N | N bytes of JSON header (UTF-8, padded with spaces so the data
//   starts 8-byte aligned) | contiguous tensor data.
// Header: {"__metadata__": {str: str}, name: {"dtype": "F32", "shape": [..],
//          "data_offsets": [begin, end]}} with offsets relative to the data start.
// The reader caps the header size (100 MiB), requires offsets that tile the data with no
// gap or overlap and dtype × shape = byte length; errors name the file.
//
// Writers publish through a temporary name in the destination directory:
//   1. create "<dir>/.tmp-<name>", write the 8-byte length and the padded header;
//   2. append each tensor's bytes in header order (the streaming writer checks the count);
//   3. fsync the file, close it;
//   4. rename it to "<dir>/<name>", fsync <dir>.
// A crash before step 4 leaves only the ".tmp-" file, never a file under the final name.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ckpt/dtype.h"
#include "ckpt/env.h"
#include "ckpt/status.h"

namespace ckpt::convert {

struct SafetensorsTensor {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  uint64_t begin = 0;  // data_offsets, relative to the data section
  uint64_t end = 0;
  int64_t numel() const;
};

struct SafetensorsHeader {
  std::map<std::string, std::string> metadata;
  std::vector<SafetensorsTensor> tensors;  // in data-offset order
  uint64_t data_start = 0;                 // absolute file offset of the data section
  uint64_t file_size = 0;
  const SafetensorsTensor* Find(const std::string& name) const;
};

// Parses and validates the header of `path` (reads only the header).
Result<SafetensorsHeader> ReadSafetensorsHeader(const std::string& path);
// Reads one tensor's raw bytes.
Result<std::vector<uint8_t>> ReadSafetensorsTensor(const std::string& path,
                                                   const SafetensorsHeader& header,
                                                   const std::string& name);
// One tensor as fp32 (converting BF16/F16/F64).
Result<std::vector<float>> ReadSafetensorsTensorF32(const std::string& path,
                                                    const SafetensorsHeader& header,
                                                    const std::string& name);

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
// 8 bytes, with offsets assigned in the order of `tensors`. InvalidArgument on an empty,
// duplicate or "__metadata__" name, an unknown dtype, a negative dimension or size overflow.
Result<std::string> BuildSafetensorsHeader(const std::vector<SafetensorsTensorSpec>& tensors,
                                           const std::map<std::string, std::string>& metadata);

// Writes a complete file in one call through the temporary-name protocol above. On failure
// the temporary file is removed and nothing exists under `path` that was not there before.
// env == nullptr: Env::Default().
Status WriteSafetensors(const std::string& path, const std::vector<SafetensorsTensorView>& tensors,
                        const std::map<std::string, std::string>& metadata, Env* env = nullptr);

// Streaming writer: the header (every tensor's name, dtype and shape) is fixed and written
// at Create(); the tensors' bytes are then appended in header order, each in one or more
// Append() calls, so only the piece being written needs to be in memory. Finish() checks that
// every byte was written and publishes the file. Destroying a writer that did not finish
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
  // The tensor that the next Append() belongs to; nullopt when all bytes are written.
  std::optional<SafetensorsTensorSpec> current() const;
  // Total file size once finished (8 + header + data).
  uint64_t file_size() const;
  // fsync, close, rename to the final path, fsync the directory. FailedPrecondition if some
  // tensor bytes are missing.
  Status Finish();

 private:
  struct Impl;
  explicit SafetensorsWriter(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace ckpt::convert
