#include "ckpt/status.h"

#include <sys/resource.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <tuple>

namespace ckpt {

std::string_view StatusCodeName(StatusCode code) {
  switch (code) {
    case StatusCode::kOk: return "OK";
    case StatusCode::kInvalidArgument: return "InvalidArgument";
    case StatusCode::kNotFound: return "NotFound";
    case StatusCode::kAlreadyExists: return "AlreadyExists";
    case StatusCode::kFailedPrecondition: return "FailedPrecondition";
    case StatusCode::kDataLoss: return "DataLoss";
    case StatusCode::kIOError: return "IOError";
    case StatusCode::kUnimplemented: return "Unimplemented";
    case StatusCode::kInternal: return "Internal";
    case StatusCode::kResourceExhausted: return "ResourceExhausted";
    case StatusCode::kPermissionDenied: return "PermissionDenied";
  }
  return "Unknown";
}

std::string Status::ToString() const {
  if (ok()) return "OK";
  return std::string(StatusCodeName(code_)) + ": " + message_;
}

Status Status::WithContext(std::string_view context) const {
  if (ok() || context.empty()) return *this;
  // A message that already names a path inside the context (a directory) says it.
  if (message_.size() > context.size() && message_.compare(0, context.size(), context) == 0 &&
      message_[context.size()] == '/')
    return *this;
  return Status(code_, std::string(context) + ": " + message_);
}

std::string OutOfMemoryText() {
  // Which limit the failed allocation met: a finite address-space (ulimit -v) or data-segment
  // (ulimit -d) limit of this process is named with its size; without one, the machine's memory.
  auto limit = [](int resource) -> rlim_t {
    rlimit r{};
    return ::getrlimit(resource, &r) == 0 ? r.rlim_cur : RLIM_INFINITY;
  };
  std::string limits;
  for (const auto& [resource, flag, what] :
       {std::tuple{RLIMIT_AS, "-v", "address-space"}, std::tuple{RLIMIT_DATA, "-d", "data-segment"}}) {
    const rlim_t v = limit(resource);
    if (v == RLIM_INFINITY) continue;
    if (!limits.empty()) limits += " and ";
    limits += std::string("the process's ") + what + " limit (ulimit " + flag + " " +
              std::to_string(static_cast<unsigned long long>(v) / 1024) + " KiB)";
  }
  if (!limits.empty()) return "out of memory (an allocation failed under " + limits + ")";
  const long pages = ::sysconf(_SC_AVPHYS_PAGES), page = ::sysconf(_SC_PAGESIZE);
  std::string text = "out of memory (an allocation failed: the machine's memory";
  if (pages > 0 && page > 0)
    text += ", " + std::to_string(static_cast<long long>(pages) * page / (1024 * 1024)) +
            " MiB free now";
  return text + ")";
}

std::string Excerpt(std::string_view bytes, size_t max) {
  std::string out;
  for (size_t i = 0; i < bytes.size() && i < max; ++i) {
    const unsigned char c = static_cast<unsigned char>(bytes[i]);
    if (c == '\n') {
      out += "\\n";
    } else if (c >= 0x20 && c < 0x7f && c != '\\' && c != '\'') {
      out += static_cast<char>(c);
    } else {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", c);
      out += buf;
    }
  }
  if (bytes.size() > max) out += "... (" + std::to_string(bytes.size()) + " bytes)";
  return out;
}

bool PrintableUtf8(std::string_view s) {
  for (size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c < 0x80) {
      if (c < 0x20 || c == 0x7f) return false;
      ++i;
      continue;
    }
    size_t n;
    uint32_t cp, least;
    if ((c & 0xe0) == 0xc0) {
      n = 1, cp = c & 0x1fu, least = 0x80;
    } else if ((c & 0xf0) == 0xe0) {
      n = 2, cp = c & 0x0fu, least = 0x800;
    } else if ((c & 0xf8) == 0xf0) {
      n = 3, cp = c & 0x07u, least = 0x10000;
    } else {
      return false;
    }
    if (s.size() - i <= n) return false;
    for (size_t k = 1; k <= n; ++k) {
      const auto d = static_cast<unsigned char>(s[i + k]);
      if ((d & 0xc0) != 0x80) return false;
      cp = (cp << 6) | (d & 0x3fu);
    }
    if (cp < least || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff) || cp < 0xa0) return false;
    i += n + 1;
  }
  return true;
}

std::string Shown(std::string_view s, size_t max) {
  return PrintableUtf8(s) ? std::string(s) : Excerpt(s, max);
}

Status PosixError(std::string_view context, int errnum) {
  std::string m = std::string(context) + ": " + std::strerror(errnum);
  switch (errnum) {
    case ENOENT:
    case ENOTDIR: return NotFound(std::move(m));
    case EEXIST: return AlreadyExists(std::move(m));
    case ENOSPC:
    case EDQUOT:
    case EFBIG: return ResourceExhausted(std::move(m));
    case EACCES:
    case EPERM:
    case EROFS: return PermissionDenied(std::move(m));
    default: return IOError(std::move(m));
  }
}

namespace internal {
void DieOnResultMisuse(const char* what, const Status& status) {
  std::fprintf(stderr, "ckpt: fatal: %s: %s\n", what, status.ToString().c_str());
  std::fflush(stderr);
  std::abort();
}
}  // namespace internal

int ExitCodeFor(const Status& s) {
  if (s.ok()) return 0;
  if (s.code() == StatusCode::kDataLoss) return 1;
  return 2;
}

}  // namespace ckpt
