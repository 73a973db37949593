// safetensors: reader and streaming writer following the published format exactly:
//   8-byte little-endian u64 N | N bytes of JSON header (UTF-8, padded with spaces so the data
//   starts 8-byte aligned) | contiguous tensor data.
// Header: {"__metadata__": {str: str}, name: {"dtype": "F32", "shape": [..],
//          "data_offsets": [begin, end]}} with offsets relative to the data start.
// The reader caps the header size (100 MiB), requires offsets that tile the data with no
// gap or overlap and dtype × shape = byte length; errors name the file.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
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

}  // namespace ckpt::convert
