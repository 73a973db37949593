// Parsing of human counts and sizes used across the CLI.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "ckpt/status.h"

namespace ckpt {

// "350M", "2.851B", "7B", "2M", "1.5k", "350e6", "2851e6", "1000" -> count (K=1e3, M=1e6,
// B/G=1e9, T=1e12). Rejects negatives, non-integers after scaling, overflow.
Result<int64_t> ParseCount(std::string_view text);
// "5GB" (1e9), "2GiB" (2^30), "512MB", "64MiB", "100KB", "4096" -> bytes.
Result<uint64_t> ParseByteSize(std::string_view text);
// 1536 -> "1.50 KiB"
std::string FormatBytes(uint64_t bytes);
// printf into a std::string. glibc's %f rounds the exact binary value half-to-even, as Python's
// format() does, which is what makes estimate's DeepSpeed tables reproducible digit for digit.
__attribute__((format(printf, 1, 2))) std::string StrFormat(const char* fmt, ...);

}  // namespace ckpt
