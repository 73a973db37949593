// libFuzzer target: safetensors::ReadSafetensorsHeader on arbitrary file contents, then every
// tensor read through ReadSafetensorsTensor / ReadSafetensorsTensorF32 and the whole data
// section through VerifySafetensorsData. Properties: an accepted header's tensors lie inside the
// file; a tensor read fails only as DataLoss on a recorded digest that does not match, and
// exactly the tensors VerifySafetensorsData reports fail that way.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <set>
#include <string>

#include "fuzz_util.h"
#include "safetensors/safetensors.h"

namespace {

const std::string& FuzzFile() {
  static const std::string path = ckpt_fuzz::TempDir("fuzz-safetensors") + "/input.safetensors";
  return path;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string& path = FuzzFile();
  ckpt_fuzz::WriteFile(path, data, size);
  auto header = ckpt::safetensors::ReadSafetensorsHeader(path);
  ckpt_fuzz::RequireTerminalSafe(header.status());  // the header's bytes escaped, if quoted
  if (!header.ok()) return 0;
  if (header->data_start > size || header->file_size != size) __builtin_trap();
  auto mismatches = ckpt::safetensors::VerifySafetensorsData(path, *header);
  if (!mismatches.ok()) __builtin_trap();  // the header said the bytes are there
  std::set<std::string> bad;
  for (const auto& m : *mismatches) {
    if (!ckpt_fuzz::TerminalSafe(m.tensor + m.what)) __builtin_trap();
    bad.insert(m.tensor);
  }
  for (const auto& t : header->tensors) {
    if (t.end < t.begin || header->data_start + t.end > size) __builtin_trap();
    if (header->checksummed != t.xxh3.has_value()) __builtin_trap();
    auto raw = ckpt::safetensors::ReadSafetensorsTensor(path, *header, t.name);
    ckpt_fuzz::RequireTerminalSafe(raw.status());
    if (bad.count(t.name)) {
      if (raw.ok() || raw.status().code() != ckpt::StatusCode::kDataLoss) __builtin_trap();
      continue;
    }
    if (!raw.ok() || raw->size() != t.end - t.begin) __builtin_trap();
    auto f32 = ckpt::safetensors::ReadSafetensorsTensorF32(path, *header, t.name);
    ckpt_fuzz::RequireTerminalSafe(f32.status());
    (void)f32;  // integer dtypes are refused: an error value, not a crash
  }
  return 0;
}
