#include "ckpt/hash.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <vector>

#define XXH_INLINE_ALL
#include <xxhash.h>

namespace ckpt {

uint64_t Xxh3(const void* data, size_t size) { return XXH3_64bits(data, size); }

std::string DigestHex(uint64_t digest) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(digest));
  return buf;
}

struct Xxh3Stream::State {
  XXH3_state_t s;
};

Xxh3Stream::Xxh3Stream() : state_(std::make_unique<State>()) { XXH3_64bits_reset(&state_->s); }
Xxh3Stream::~Xxh3Stream() = default;
Xxh3Stream::Xxh3Stream(Xxh3Stream&&) noexcept = default;
Xxh3Stream& Xxh3Stream::operator=(Xxh3Stream&&) noexcept = default;

void Xxh3Stream::Update(const void* data, size_t size) {
  if (size > 0) XXH3_64bits_update(&state_->s, data, size);
}
uint64_t Xxh3Stream::Digest() const { return XXH3_64bits_digest(&state_->s); }

Result<std::string> Xxh3FileHex(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return ErrnoError("open " + path, errno);
  Xxh3Stream h;
  std::vector<char> buf(4u << 20);
  for (;;) {
    ssize_t n = ::read(fd, buf.data(), buf.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      int err = errno;
      ::close(fd);
      return ErrnoError("read " + path, err);
    }
    if (n == 0) break;
    h.Update(buf.data(), static_cast<size_t>(n));
  }
  ::close(fd);
  return h.HexDigest();
}

}  // namespace ckpt
