#include "ckpt/status.h"

#include <cstring>

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
  }
  return "Unknown";
}

std::string Status::ToString() const {
  if (ok()) return "OK";
  return std::string(StatusCodeName(code_)) + ": " + message_;
}

Status Status::WithContext(std::string_view context) const {
  if (ok() || context.empty()) return *this;
  return Status(code_, std::string(context) + ": " + message_);
}

Status ErrnoError(std::string_view context, int errnum) {
  return IOError(std::string(context) + ": " + std::strerror(errnum));
}

int ExitCodeFor(const Status& s) {
  if (s.ok()) return 0;
  if (s.code() == StatusCode::kDataLoss) return 1;
  return 2;
}

}  // namespace ckpt
