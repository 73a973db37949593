// XXH3-64 digests (libxxhash), the checksum of every dataset and file in a checkpoint.
// Digests are written as 16 lower-case hex digits of the 64-bit value ("%016llx").
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "ckpt/status.h"

namespace ckpt {

class Env;

uint64_t Xxh3(const void* data, size_t size);
std::string DigestHex(uint64_t digest);

// XXH3-64 hex digest of a whole file, read through env (nullptr: Env::Default()) in 4 MiB
// blocks (bounded memory). Opened as a file inside a checkpoint (Env::NewCheckpointFile): a
// symbolic link is refused (DataLoss naming it), never hashed through.
Result<std::string> Xxh3FileHex(const std::string& path, Env* env = nullptr);

// Streaming XXH3-64 over a sequence of Update() calls; equal to Xxh3 of the concatenation.
// Not thread-safe; move-only.
class Xxh3Stream {
 public:
  Xxh3Stream();
  ~Xxh3Stream();
  Xxh3Stream(Xxh3Stream&&) noexcept;
  Xxh3Stream& operator=(Xxh3Stream&&) noexcept;
  void Update(const void* data, size_t size);
  uint64_t Digest() const;
  std::string HexDigest() const { return DigestHex(Digest()); }

 private:
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace ckpt
