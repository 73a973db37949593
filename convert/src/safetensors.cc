// safetensors reader and writers. The publish protocol is numbered in safetensors.h.
#include "convert/safetensors.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>
#include <random>
#include <set>

#include "ckpt/manifest.h"

static_assert(std::endian::native == std::endian::little,
              "safetensors and ckpt store little-endian bytes; big-endian hosts are unsupported");

namespace ckpt::convert {
namespace {

constexpr uint64_t kMaxHeaderBytes = 100ull << 20;

// A read-only file descriptor, closed on destruction.
class ReadFd {
 public:
  explicit ReadFd(int fd) : fd_(fd) {}
  ReadFd(ReadFd&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}
  ReadFd& operator=(ReadFd&&) = delete;
  ~ReadFd() {
    if (fd_ >= 0) ::close(fd_);
  }
  int get() const { return fd_; }

 private:
  int fd_;
};

Result<ReadFd> OpenForRead(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    int e = errno;
    if (e == ENOENT) return NotFound(path + ": no such file");
    return ErrnoError(path, e);
  }
  return ReadFd(fd);
}

// Reads exactly n bytes at offset; DataLoss when the file ends first.
Status PreadFull(int fd, const std::string& path, uint64_t offset, void* out, uint64_t n) {
  auto* p = static_cast<uint8_t*>(out);
  while (n > 0) {
    size_t want = static_cast<size_t>(std::min<uint64_t>(n, 1u << 30));
    ssize_t got = ::pread(fd, p, want, static_cast<off_t>(offset));
    if (got < 0) {
      if (errno == EINTR) continue;
      return ErrnoError(path + ": read", errno);
    }
    if (got == 0) return DataLoss(path + ": file ends early (truncated?)");
    p += got;
    offset += static_cast<uint64_t>(got);
    n -= static_cast<uint64_t>(got);
  }
  return Status::Ok();
}

// numel × size with overflow checks; nullopt on overflow or a negative dimension.
std::optional<uint64_t> ByteLength(const std::vector<int64_t>& shape, DType dtype) {
  uint64_t n = 1;
  for (int64_t d : shape) {
    if (d < 0) return std::nullopt;
    if (d != 0 && n > std::numeric_limits<uint64_t>::max() / static_cast<uint64_t>(d))
      return std::nullopt;
    n *= static_cast<uint64_t>(d);
  }
  const uint64_t size = DTypeSize(dtype);
  if (n > std::numeric_limits<uint64_t>::max() / size) return std::nullopt;
  return n * size;
}

std::string DirName(const std::string& path) {
  auto slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

std::string BaseName(const std::string& path) {
  auto slash = path.find_last_of('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

std::string TempPathFor(const std::string& path) {
  std::random_device rd;
  std::string dir = DirName(path);
  return (dir == "." && path.find('/') == std::string::npos ? std::string() : dir + "/") +
         std::string(kTempPrefix) + BaseName(path) + "-" + std::to_string(rd());
}

}  // namespace

int64_t SafetensorsTensor::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

const SafetensorsTensor* SafetensorsHeader::Find(const std::string& name) const {
  for (const auto& t : tensors)
    if (t.name == name) return &t;
  return nullptr;
}

Result<SafetensorsHeader> ReadSafetensorsHeader(const std::string& path) {
  CKPT_ASSIGN_OR_RETURN(ReadFd fd, OpenForRead(path), "safetensors");
  struct stat st;
  if (::fstat(fd.get(), &st) != 0) return ErrnoError(path + ": stat", errno);
  const uint64_t file_size = static_cast<uint64_t>(st.st_size);
  if (file_size < 8) return DataLoss(path + ": too short for a safetensors file");
  uint8_t len_bytes[8];
  CKPT_RETURN_IF_ERROR(PreadFull(fd.get(), path, 0, len_bytes, 8), "safetensors");
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | len_bytes[i];
  if (header_len > kMaxHeaderBytes)
    return DataLoss(path + ": header length " + std::to_string(header_len) +
                    " exceeds the 100 MiB cap");
  if (header_len > file_size - 8)
    return DataLoss(path + ": header length " + std::to_string(header_len) +
                    " runs past the end of the file (" + std::to_string(file_size) + " bytes)");
  std::string text(header_len, '\0');
  CKPT_RETURN_IF_ERROR(PreadFull(fd.get(), path, 8, text.data(), header_len), "safetensors");

  nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return DataLoss(path + ": header is not a JSON object");

  SafetensorsHeader h;
  h.data_start = 8 + header_len;
  h.file_size = file_size;
  for (auto it = j.begin(); it != j.end(); ++it) {
    const std::string& key = it.key();
    const nlohmann::json& v = it.value();
    if (key == "__metadata__") {
      if (!v.is_object()) return DataLoss(path + ": __metadata__ is not an object");
      for (auto m = v.begin(); m != v.end(); ++m) {
        if (!m.value().is_string())
          return DataLoss(path + ": __metadata__ value for '" + m.key() + "' is not a string");
        h.metadata[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    const std::string where = path + ": tensor '" + key + "'";
    if (key.empty()) return DataLoss(path + ": empty tensor name");
    if (!v.is_object()) return DataLoss(where + ": entry is not an object");
    auto dt = v.find("dtype");
    auto sh = v.find("shape");
    auto off = v.find("data_offsets");
    if (dt == v.end() || !dt->is_string()) return DataLoss(where + ": missing dtype");
    if (sh == v.end() || !sh->is_array()) return DataLoss(where + ": missing shape");
    if (off == v.end() || !off->is_array() || off->size() != 2)
      return DataLoss(where + ": data_offsets must be [begin, end]");
    SafetensorsTensor t;
    t.name = key;
    auto dtype = DTypeFromSafetensorsName(dt->get<std::string>());
    if (!dtype) return DataLoss(where + ": unsupported dtype " + dt->get<std::string>());
    t.dtype = *dtype;
    for (const auto& d : *sh) {
      if (!d.is_number_integer() || d.get<int64_t>() < 0)
        return DataLoss(where + ": shape entries must be non-negative integers");
      t.shape.push_back(d.get<int64_t>());
    }
    for (int k = 0; k < 2; ++k) {
      if (!(*off)[k].is_number_unsigned() &&
          !((*off)[k].is_number_integer() && (*off)[k].get<int64_t>() >= 0))
        return DataLoss(where + ": data_offsets must be non-negative integers");
    }
    t.begin = (*off)[0].get<uint64_t>();
    t.end = (*off)[1].get<uint64_t>();
    if (t.end < t.begin) return DataLoss(where + ": data_offsets end before begin");
    auto len = ByteLength(t.shape, t.dtype);
    if (!len) return DataLoss(where + ": shape overflows");
    if (*len != t.end - t.begin)
      return DataLoss(where + ": dtype × shape is " + std::to_string(*len) +
                      " bytes but data_offsets span " + std::to_string(t.end - t.begin));
    h.tensors.push_back(std::move(t));
  }
  std::sort(h.tensors.begin(), h.tensors.end(), [](const auto& a, const auto& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  uint64_t cursor = 0;
  for (const auto& t : h.tensors) {
    if (t.begin != cursor)
      return DataLoss(path + ": tensor '" + t.name + "' starts at " + std::to_string(t.begin) +
                      ", expected " + std::to_string(cursor) +
                      (t.begin < cursor ? " (overlap)" : " (gap)"));
    cursor = t.end;
  }
  const uint64_t data_len = file_size - h.data_start;
  if (cursor != data_len)
    return DataLoss(path + ": tensors cover " + std::to_string(cursor) +
                    " data bytes but the file holds " + std::to_string(data_len) +
                    (cursor < data_len ? " (trailing bytes)" : " (truncated)"));
  return h;
}

Result<std::vector<uint8_t>> ReadSafetensorsTensor(const std::string& path,
                                                   const SafetensorsHeader& header,
                                                   const std::string& name) {
  const SafetensorsTensor* t = header.Find(name);
  if (!t) return NotFound(path + ": no tensor '" + name + "'");
  CKPT_ASSIGN_OR_RETURN(ReadFd fd, OpenForRead(path), "safetensors");
  std::vector<uint8_t> out(t->end - t->begin);
  CKPT_RETURN_IF_ERROR(
      PreadFull(fd.get(), path, header.data_start + t->begin, out.data(), out.size()),
      "tensor '" + name + "'");
  return out;
}

Result<std::vector<float>> ReadSafetensorsTensorF32(const std::string& path,
                                                    const SafetensorsHeader& header,
                                                    const std::string& name) {
  const SafetensorsTensor* t = header.Find(name);
  if (!t) return NotFound(path + ": no tensor '" + name + "'");
  if (t->dtype != DType::kF32 && t->dtype != DType::kBF16 && t->dtype != DType::kF16 &&
      t->dtype != DType::kF64)
    return InvalidArgument(path + ": tensor '" + name + "' has dtype " +
                           std::string(SafetensorsDTypeName(t->dtype)) +
                           ", not a floating-point type");
  CKPT_ASSIGN_OR_RETURN(auto raw, ReadSafetensorsTensor(path, header, name), "");
  const size_t n = raw.size() / DTypeSize(t->dtype);
  std::vector<float> out(n);
  FloatsToF32(t->dtype, raw.data(), n, out.data());  // a float dtype, checked above
  return out;
}

Result<std::string> BuildSafetensorsHeader(const std::vector<SafetensorsTensorSpec>& tensors,
                                           const std::map<std::string, std::string>& metadata) {
  nlohmann::json j = nlohmann::json::object();
  if (!metadata.empty()) {
    nlohmann::json m = nlohmann::json::object();
    for (const auto& [k, v] : metadata) m[k] = v;
    j["__metadata__"] = std::move(m);
  }
  std::set<std::string> seen;
  uint64_t offset = 0;
  for (const auto& t : tensors) {
    if (t.name.empty() || t.name == "__metadata__")
      return InvalidArgument("invalid tensor name '" + t.name + "'");
    if (!seen.insert(t.name).second)
      return InvalidArgument("duplicate tensor name '" + t.name + "'");
    auto len = ByteLength(t.shape, t.dtype);
    if (!len) return InvalidArgument("tensor '" + t.name + "': bad or overflowing shape");
    if (offset > std::numeric_limits<uint64_t>::max() - *len)
      return InvalidArgument("tensor '" + t.name + "': total size overflows");
    j[t.name] = {{"dtype", std::string(SafetensorsDTypeName(t.dtype))},
                 {"shape", t.shape},
                 {"data_offsets", {offset, offset + *len}}};
    offset += *len;
  }
  std::string text = j.dump();
  // Pad with spaces so the data section starts at an 8-byte aligned file offset.
  text.append((8 - text.size() % 8) % 8, ' ');
  if (text.size() > kMaxHeaderBytes)
    return InvalidArgument("safetensors header of " + std::to_string(text.size()) +
                           " bytes exceeds the 100 MiB cap");
  return text;
}

// ---- streaming writer -------------------------------------------------------------------

struct SafetensorsWriter::Impl {
  Env* env = nullptr;
  std::string path;
  std::string tmp;
  std::unique_ptr<WritableFile> file;
  std::vector<SafetensorsTensorSpec> tensors;
  std::vector<uint64_t> sizes;
  size_t index = 0;  // tensor being written
  uint64_t written_in_tensor = 0;
  uint64_t total = 0;
  bool finished = false;

  void SkipEmpty() {
    while (index < tensors.size() && written_in_tensor == sizes[index]) {
      ++index;
      written_in_tensor = 0;
    }
  }

  ~Impl() {
    if (!finished && file) {
      file->Close().IgnoreError();
      file.reset();
      if (env->Exists(tmp)) env->RemoveFile(tmp).IgnoreError();
    }
  }
};

SafetensorsWriter::SafetensorsWriter(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
SafetensorsWriter::SafetensorsWriter(SafetensorsWriter&&) noexcept = default;
SafetensorsWriter& SafetensorsWriter::operator=(SafetensorsWriter&&) noexcept = default;
SafetensorsWriter::~SafetensorsWriter() = default;

Result<SafetensorsWriter> SafetensorsWriter::Create(
    const std::string& path, std::vector<SafetensorsTensorSpec> tensors,
    const std::map<std::string, std::string>& metadata, Env* env) {
  CKPT_ASSIGN_OR_RETURN(std::string header, BuildSafetensorsHeader(tensors, metadata), path);
  auto impl = std::make_unique<Impl>();
  impl->env = env ? env : Env::Default();
  impl->path = path;
  impl->tmp = TempPathFor(path);
  for (const auto& t : tensors) impl->sizes.push_back(*ByteLength(t.shape, t.dtype));
  impl->tensors = std::move(tensors);
  CKPT_ASSIGN_OR_RETURN(impl->file, impl->env->NewWritableFile(impl->tmp), "create " + path);
  uint8_t len_bytes[8];
  uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) len_bytes[i] = static_cast<uint8_t>(n >> (8 * i));
  Status s = impl->file->Append(std::string_view(reinterpret_cast<char*>(len_bytes), 8));
  if (s.ok()) s = impl->file->Append(header);
  if (!s.ok()) return s.WithContext("write " + path);  // ~Impl removes the temporary file
  impl->total = 8 + header.size();
  for (uint64_t sz : impl->sizes) impl->total += sz;
  impl->SkipEmpty();
  return SafetensorsWriter(std::move(impl));
}

std::optional<SafetensorsTensorSpec> SafetensorsWriter::current() const {
  if (impl_->index >= impl_->tensors.size()) return std::nullopt;
  return impl_->tensors[impl_->index];
}

uint64_t SafetensorsWriter::file_size() const { return impl_->total; }

Status SafetensorsWriter::Append(const void* data, uint64_t bytes) {
  Impl& w = *impl_;
  if (w.finished) return FailedPrecondition(w.path + ": writer already finished");
  if (bytes == 0) return Status::Ok();
  if (w.index >= w.tensors.size()) return InvalidArgument(w.path + ": append past the last tensor");
  if (bytes > w.sizes[w.index] - w.written_in_tensor)
    return InvalidArgument(w.path + ": " + std::to_string(bytes) + " bytes overrun tensor '" +
                           w.tensors[w.index].name + "' (" +
                           std::to_string(w.sizes[w.index] - w.written_in_tensor) + " left)");
  CKPT_RETURN_IF_ERROR(w.file->Append(std::string_view(static_cast<const char*>(data), bytes)),
                       "write " + w.path + " tensor '" + w.tensors[w.index].name + "'");
  w.written_in_tensor += bytes;
  w.SkipEmpty();
  return Status::Ok();
}

Status SafetensorsWriter::Finish() {
  Impl& w = *impl_;
  if (w.finished) return Status::Ok();
  if (w.index < w.tensors.size())
    return FailedPrecondition(w.path + ": tensor '" + w.tensors[w.index].name +
                              "' is incomplete; the file was not published");
  CKPT_RETURN_IF_ERROR(w.file->Sync(), "fsync " + w.tmp);
  CKPT_RETURN_IF_ERROR(w.file->Close(), "close " + w.tmp);
  w.file.reset();
  Status s = w.env->RenameFile(w.tmp, w.path);
  if (!s.ok()) {
    w.env->RemoveFile(w.tmp).IgnoreError();
    w.finished = true;
    return s.WithContext("publish " + w.path);
  }
  w.finished = true;
  CKPT_RETURN_IF_ERROR(w.env->SyncDir(DirName(w.path)), "fsync directory of " + w.path);
  return Status::Ok();
}

Status WriteSafetensors(const std::string& path, const std::vector<SafetensorsTensorView>& tensors,
                        const std::map<std::string, std::string>& metadata, Env* env) {
  std::vector<SafetensorsTensorSpec> specs;
  specs.reserve(tensors.size());
  for (const auto& t : tensors) specs.push_back(t.spec);
  CKPT_ASSIGN_OR_RETURN(auto writer,
                        SafetensorsWriter::Create(path, std::move(specs), metadata, env), "");
  for (const auto& t : tensors) {
    const uint64_t len = *ByteLength(t.spec.shape, t.spec.dtype);
    if (len > 0 && t.data == nullptr)
      return InvalidArgument(path + ": tensor '" + t.spec.name + "' has no data");
    CKPT_RETURN_IF_ERROR(writer.Append(t.data, len), "");
  }
  return writer.Finish();
}

}  // namespace ckpt::convert
