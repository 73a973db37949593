#include "ckpt/utc_time.h"

#include <ctime>

namespace ckpt {

std::string UtcNow(int64_t* unix_seconds) {
  const std::time_t t = std::time(nullptr);
  if (unix_seconds != nullptr) *unix_seconds = static_cast<int64_t>(t);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

}  // namespace ckpt
