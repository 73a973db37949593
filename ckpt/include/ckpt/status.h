// Status and Result<T>: errors as values with context (leveldb / tensorstore style).
//
// Every fallible function returns a Status or a Result<T>. Errors never abort. Each layer adds
// context with CKPT_RETURN_IF_ERROR(expr, "context"), so a message reads outermost first:
//   "load global_step12: rank_00001.h5: dataset /exp_avg: checksum mismatch (...)".
// The context is optional (CKPT_RETURN_IF_ERROR(expr)): add it once per layer, where the layer
// knows something the inner message does not say.
//
// Misuse is a broken invariant, not bad input, and is checked in every build (tensorstore's
// result.h): a Result built from an ok Status, or value() taken from an error, prints the
// status and aborts.
#pragma once

#include <new>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <variant>

namespace ckpt {

enum class StatusCode {
  kOk = 0,
  kInvalidArgument,   // bad usage or bad flag values (CLI exit 2)
  kNotFound,          // missing file, tag, dataset (CLI exit 2)
  kAlreadyExists,     // target exists and would be overwritten (CLI exit 2)
  kFailedPrecondition,  // e.g. another saver holds the root lock, topology mismatch (CLI exit 2)
  kDataLoss,          // checksum mismatch, truncation, corrupt structure (CLI exit 1)
  kIOError,           // errno-level failure (CLI exit 2)
  kUnimplemented,     // a newer major format version, an unknown dtype (CLI exit 2)
  kInternal,          // broken internal invariant (CLI exit 2)
  // Added later (values are only ever appended: statuses cross processes as numbers).
  kResourceExhausted,  // ENOSPC, EDQUOT, EFBIG: the disk, quota or file-size limit (CLI exit 2)
  kPermissionDenied,   // EACCES, EPERM (CLI exit 2)
};

std::string_view StatusCodeName(StatusCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status Ok() { return Status(); }
  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }
  // "DataLoss: rank_00001.h5: dataset /exp_avg: checksum mismatch".
  std::string ToString() const;
  // Returns a copy whose message is "context: message". No-op for ok(), and for a message
  // that begins with `context` and a '/' (it names a path inside the context already).
  Status WithContext(std::string_view context) const;
  // Marks a Status as intentionally unused.
  void IgnoreError() const {}

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

inline Status InvalidArgument(std::string m) { return {StatusCode::kInvalidArgument, std::move(m)}; }
inline Status NotFound(std::string m) { return {StatusCode::kNotFound, std::move(m)}; }
inline Status AlreadyExists(std::string m) { return {StatusCode::kAlreadyExists, std::move(m)}; }
inline Status FailedPrecondition(std::string m) {
  return {StatusCode::kFailedPrecondition, std::move(m)};
}
inline Status DataLoss(std::string m) { return {StatusCode::kDataLoss, std::move(m)}; }
inline Status IOError(std::string m) { return {StatusCode::kIOError, std::move(m)}; }
inline Status Unimplemented(std::string m) { return {StatusCode::kUnimplemented, std::move(m)}; }
inline Status Internal(std::string m) { return {StatusCode::kInternal, std::move(m)}; }
inline Status ResourceExhausted(std::string m) {
  return {StatusCode::kResourceExhausted, std::move(m)};
}
inline Status PermissionDenied(std::string m) {
  return {StatusCode::kPermissionDenied, std::move(m)};
}

// The one errno -> Status mapper (leveldb's PosixError): "context: strerror(errnum)" with the
// code the condition means everywhere: ENOENT/ENOTDIR NotFound, EEXIST AlreadyExists,
// ENOSPC/EDQUOT/EFBIG ResourceExhausted, EACCES/EPERM/EROFS PermissionDenied, anything else
// IOError.
Status PosixError(std::string_view context, int errnum);

// At most `max` bytes of untrusted file content for an error message: printable ASCII kept,
// everything else escaped (\n, \xNN), the length said when cut. A `latest` that is really
// /etc/passwd is never echoed whole, and a name from a hostile file never reaches a terminal
// raw.
std::string Excerpt(std::string_view bytes, size_t max = 40);
// Whether `s` is text a name or label from a file may be printed as: valid UTF-8 (no overlong
// forms, surrogates or code points past U+10FFFF) without control characters (C0, DEL, C1).
// Such strings go into safetensors headers, manifests (JSON) and terminals as they are; a
// file is free to hold any bytes, so readers refuse anything else rather than carry it there.
bool PrintableUtf8(std::string_view s);
// A string from a file for a message: as it is when it is PrintableUtf8 (a name in UTF-8 reads
// as itself), else escaped (Excerpt, at most `max` bytes). For strings a reader does not refuse
// outright (an HDF5 object's name, a safetensors __metadata__ value, libhdf5's own error text).
std::string Shown(std::string_view s, size_t max = 256);
// The same mapper under its older name.
inline Status ErrnoError(std::string_view context, int errnum) {
  return PosixError(context, errnum);
}

// CLI exit code for a status: 0 ok, 1 data loss (a check found corruption), 2 anything else.
int ExitCodeFor(const Status& s);

namespace internal {
// Prints "ckpt: <what>: <status>" on stderr and aborts: a Result was misused (always checked).
[[noreturn]] void DieOnResultMisuse(const char* what, const Status& status);
}  // namespace internal

template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::move(value)) {}  // NOLINT: implicit by design
  // status must be an error; an ok Status here is a bug and aborts.
  Result(Status status) : v_(std::move(status)) {  // NOLINT
    if (std::get<Status>(v_).ok())
      internal::DieOnResultMisuse("Result constructed from an ok Status", Status());
  }
  bool ok() const { return std::holds_alternative<T>(v_); }
  Status status() const { return ok() ? Status() : std::get<Status>(v_); }
  // The value; on an error this is a bug and aborts, printing the status.
  T& value() & {
    CheckHasValue();
    return std::get<T>(v_);
  }
  const T& value() const& {
    CheckHasValue();
    return std::get<T>(v_);
  }
  T&& value() && {
    CheckHasValue();
    return std::get<T>(std::move(v_));
  }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }

 private:
  void CheckHasValue() const {
    if (!ok()) internal::DieOnResultMisuse("value() of an error Result", std::get<Status>(v_));
  }
  std::variant<T, Status> v_;
};

// "out of memory (...)" naming the limit an allocation just met: the process's ulimit -v or -d
// with its size when one is set, else the machine's memory. One text for every tool.
std::string OutOfMemoryText();

// Runs f (returning a Status or a Result<T>); a failed allocation (std::bad_alloc) comes back
// as ResourceExhausted "<what>: out of memory ...". For the bodies of worker threads, where an
// escaping exception would abort the whole process (exit 134, its staging left behind).
template <typename F>
auto OutOfMemoryAsStatus(std::string_view what, F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const std::bad_alloc&) {
    return ResourceExhausted(std::string(what) + ": " + OutOfMemoryText());
  }
}

}  // namespace ckpt

#define CKPT_CONCAT_INNER_(a, b) a##b
#define CKPT_CONCAT_(a, b) CKPT_CONCAT_INNER_(a, b)

// CKPT_RETURN_IF_ERROR(expr[, "context"]): returns expr's Status, with context added when given.
// expr may be a Status or a Result<T>.
#define CKPT_RETURN_IF_ERROR(expr, ...)                                        \
  do {                                                                         \
    auto&& ckpt_status_or_ = (expr);                                           \
    if (!ckpt_status_or_.ok())                                                 \
      return ::ckpt::internal::StatusOf(ckpt_status_or_)                       \
          .WithContext(::ckpt::internal::ContextOf(__VA_ARGS__));              \
  } while (0)

// CKPT_ASSIGN_OR_RETURN(lhs, result_expr[, "context"]).
#define CKPT_ASSIGN_OR_RETURN(lhs, rexpr, ...)                                 \
  auto CKPT_CONCAT_(ckpt_result_, __LINE__) = (rexpr);                         \
  if (!CKPT_CONCAT_(ckpt_result_, __LINE__).ok())                              \
    return CKPT_CONCAT_(ckpt_result_, __LINE__).status().WithContext(          \
        ::ckpt::internal::ContextOf(__VA_ARGS__));                             \
  lhs = std::move(CKPT_CONCAT_(ckpt_result_, __LINE__)).value()

namespace ckpt::internal {
inline Status StatusOf(const Status& s) { return s; }
template <typename T>
Status StatusOf(const Result<T>& r) { return r.status(); }
// The optional context argument of the macros above.
inline std::string_view ContextOf() { return {}; }
inline std::string_view ContextOf(std::string_view context) { return context; }
}  // namespace ckpt::internal
