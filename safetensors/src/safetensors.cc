// safetensors reader and writers. The publish protocol is numbered in safetensors.h.
#include "safetensors/safetensors.h"

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

#include "ckpt/json.h"
#include "ckpt/hash.h"
#include "ckpt/manifest.h"

static_assert(std::endian::native == std::endian::little,
              "safetensors and ckpt store little-endian bytes; big-endian hosts are unsupported");

namespace ckpt::safetensors {
namespace {

constexpr uint64_t kMaxHeaderBytes = 100ull << 20;
constexpr size_t kDigestChars = 16;
constexpr uint64_t kVerifyBlockBytes = 4ull << 20;

Result<std::unique_ptr<RandomAccessFile>> OpenForRead(const std::string& path) {
  return Env::Default()->NewRandomAccessFile(path);
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

// 16 lower-case hex digits (DigestHex's form) -> value; nullopt otherwise.
std::optional<uint64_t> ParseDigest(std::string_view text) {
  if (text.size() != kDigestChars) return std::nullopt;
  uint64_t v = 0;
  for (char c : text) {
    int d;
    if (c >= '0' && c <= '9') d = c - '0';
    else if (c >= 'a' && c <= 'f') d = c - 'a' + 10;
    else return std::nullopt;
    v = (v << 4) | static_cast<uint64_t>(d);
  }
  return v;
}

// Offset in `text` of the value of the __metadata__ string entry `key` as the writer lays it
// out (compact JSON: "key":"value"). A bare '"' in compact JSON always delimits a string, and
// only a key with a string value is followed by ':"', so inside a valid header this needle can
// only be the metadata entry; nullopt when it is absent or occurs more than once.
std::optional<size_t> FindMetadataValue(std::string_view text, std::string_view key) {
  std::string needle;
  needle.reserve(key.size() + 4);
  needle.append("\"").append(key).append("\":\"");
  const size_t at = text.find(needle);
  if (at == std::string_view::npos || text.find(needle, at + 1) != std::string_view::npos)
    return std::nullopt;
  return at + needle.size();
}

// XXH3 of the 8-byte length + header text with the 16 characters at `digest_at` taken as '0'.
uint64_t HeaderDigest(const uint8_t len_bytes[8], std::string_view text, size_t digest_at) {
  static constexpr char kZeros[kDigestChars + 1] = "0000000000000000";
  Xxh3Stream h;
  h.Update(len_bytes, 8);
  h.Update(text.data(), digest_at);
  h.Update(kZeros, kDigestChars);
  h.Update(text.data() + digest_at + kDigestChars, text.size() - digest_at - kDigestChars);
  return h.Digest();
}

void EncodeLength(uint64_t n, uint8_t out[8]) {
  for (int i = 0; i < 8; ++i) out[i] = static_cast<uint8_t>(n >> (8 * i));
}

std::string ChecksumMismatch(uint64_t recorded, uint64_t computed) {
  return "checksum mismatch (recorded xxh3 " + DigestHex(recorded) + ", computed " +
         DigestHex(computed) + ")";
}

// Verifies the integrity record of a parsed header (tensors sorted by offset) and attaches
// each tensor's digest. `text` is the header exactly as stored.
Status VerifyIntegrityRecord(const std::string& path, const uint8_t len_bytes[8],
                             std::string_view text, SafetensorsHeader& h) {
  const auto tensors_it = h.metadata.find(std::string(kTensorDigestsKey));
  const auto header_it = h.metadata.find(std::string(kHeaderDigestKey));
  const bool has_tensors = tensors_it != h.metadata.end();
  const bool has_header = header_it != h.metadata.end();
  if (!has_tensors && !has_header) return Status::Ok();  // not written by ckpt: unverified
  if (!has_tensors || !has_header)
    return DataLoss(path + ": integrity record incomplete: __metadata__ has '" +
                    std::string(has_header ? kHeaderDigestKey : kTensorDigestsKey) +
                    "' but not '" +
                    std::string(has_header ? kTensorDigestsKey : kHeaderDigestKey) + "'");
  const auto recorded = ParseDigest(header_it->second);
  if (!recorded)
    return DataLoss(path + ": __metadata__ '" + std::string(kHeaderDigestKey) +
                    "' is not 16 hex digits");
  const auto at = FindMetadataValue(text, kHeaderDigestKey);
  if (!at || text.substr(*at, kDigestChars) != header_it->second)
    return DataLoss(path + ": header digest '" + std::string(kHeaderDigestKey) +
                    "' is not stored in the writer's layout (header rewritten or corrupted)");
  const uint64_t computed = HeaderDigest(len_bytes, text, *at);
  if (computed != *recorded)
    return DataLoss(path + ": header " + ChecksumMismatch(*recorded, computed) +
                    ": names, shapes, offsets or metadata were changed");
  // The header is exactly what the writer wrote; the digest list is still parsed defensively.
  const std::string& list = tensors_it->second;
  size_t pos = 0;
  for (size_t i = 0; i < h.tensors.size(); ++i) {
    if (i > 0) {
      if (pos >= list.size() || list[pos] != ' ')
        return DataLoss(path + ": '" + std::string(kTensorDigestsKey) + "' lists fewer digests (" +
                        std::to_string(i) + ") than the header has tensors (" +
                        std::to_string(h.tensors.size()) + ")");
      ++pos;
    }
    const auto d = ParseDigest(std::string_view(list).substr(pos, kDigestChars));
    if (!d)
      return DataLoss(path + ": '" + std::string(kTensorDigestsKey) + "' entry " +
                      std::to_string(i) + " is not 16 hex digits");
    h.tensors[i].xxh3 = *d;
    pos += kDigestChars;
  }
  if (pos != list.size())
    return DataLoss(path + ": '" + std::string(kTensorDigestsKey) +
                    "' lists more digests than the header has tensors (" +
                    std::to_string(h.tensors.size()) + ")");
  h.checksummed = true;
  return Status::Ok();
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
  CKPT_ASSIGN_OR_RETURN(std::unique_ptr<RandomAccessFile> file, OpenForRead(path), "safetensors");
  const uint64_t file_size = file->size();
  if (file_size < 8) return DataLoss(path + ": too short for a safetensors file");
  uint8_t len_bytes[8];
  CKPT_RETURN_IF_ERROR(file->Read(0, 8, len_bytes), "safetensors");
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | len_bytes[i];
  if (header_len > kMaxHeaderBytes)
    return DataLoss(path + ": header length " + std::to_string(header_len) +
                    " exceeds the 100 MiB cap");
  if (header_len > file_size - 8)
    return DataLoss(path + ": header length " + std::to_string(header_len) +
                    " runs past the end of the file (" + std::to_string(file_size) + " bytes)");
  std::string text(header_len, '\0');
  CKPT_RETURN_IF_ERROR(file->Read(8, header_len, text.data()), "safetensors");

  auto parsed = ParseJson(text, path + ": header");
  if (!parsed.ok()) return parsed.status();
  const nlohmann::json& j = *parsed;
  if (!j.is_object()) return DataLoss(path + ": header is not a JSON object");

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
          return DataLoss(path + ": __metadata__ value for '" + Excerpt(m.key(), 80) +
                          "' is not a string");
        h.metadata[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    if (key.empty()) return DataLoss(path + ": empty tensor name");
    // Names reach messages, manifests and terminals as they are (ckpt/status.h).
    if (!PrintableUtf8(key))
      return DataLoss(path + ": tensor name '" + Excerpt(key, 80) + "' is not printable UTF-8");
    const std::string where = path + ": tensor '" + key + "'";
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
    if (!dtype) return DataLoss(where + ": unsupported dtype " + Excerpt(dt->get<std::string>()));
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
  CKPT_RETURN_IF_ERROR(VerifyIntegrityRecord(path, len_bytes, text, h), "");
  return h;
}

Result<std::vector<uint8_t>> ReadSafetensorsTensor(const std::string& path,
                                                   const SafetensorsHeader& header,
                                                   const std::string& name) {
  const SafetensorsTensor* t = header.Find(name);
  if (!t) return NotFound(path + ": no tensor '" + name + "'");
  CKPT_ASSIGN_OR_RETURN(std::unique_ptr<RandomAccessFile> file, OpenForRead(path), "safetensors");
  std::vector<uint8_t> out(t->end - t->begin);
  CKPT_RETURN_IF_ERROR(
      file->Read(header.data_start + t->begin, out.size(), out.data()),
      "tensor '" + name + "'");
  if (t->xxh3) {
    const uint64_t computed = Xxh3(out.data(), out.size());
    if (computed != *t->xxh3)
      return DataLoss(path + ": tensor '" + name + "': " + ChecksumMismatch(*t->xxh3, computed));
  }
  return out;
}

Result<std::vector<SafetensorsMismatch>> VerifySafetensorsData(const std::string& path,
                                                               const SafetensorsHeader& header) {
  std::vector<SafetensorsMismatch> bad;
  CKPT_ASSIGN_OR_RETURN(std::unique_ptr<RandomAccessFile> file, OpenForRead(path), "safetensors");
  std::vector<uint8_t> block;
  for (const auto& t : header.tensors) {
    if (!t.xxh3) continue;
    Xxh3Stream h;
    for (uint64_t off = t.begin; off < t.end;) {
      const uint64_t n = std::min<uint64_t>(kVerifyBlockBytes, t.end - off);
      block.resize(static_cast<size_t>(n));
      CKPT_RETURN_IF_ERROR(file->Read(header.data_start + off, n, block.data()),
                           "tensor '" + t.name + "'");
      h.Update(block.data(), block.size());
      off += n;
    }
    if (h.Digest() != *t.xxh3) bad.push_back({t.name, ChecksumMismatch(*t.xxh3, h.Digest())});
  }
  return bad;
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
  nlohmann::json m = nlohmann::json::object();
  for (const auto& [k, v] : metadata) m[k] = v;
  // The integrity record, reserved at its final width (docs/convert.md "Integrity").
  std::string reserved;
  for (size_t i = 0; i < tensors.size(); ++i)
    reserved.append(i ? " " : "").append(kDigestChars, '0');
  m[std::string(kTensorDigestsKey)] = std::move(reserved);
  m[std::string(kHeaderDigestKey)] = std::string(kDigestChars, '0');
  j["__metadata__"] = std::move(m);
  std::set<std::string> seen;
  uint64_t offset = 0;
  for (const auto& t : tensors) {
    if (t.name.empty() || t.name == "__metadata__" || !PrintableUtf8(t.name))
      return InvalidArgument("invalid tensor name '" + Excerpt(t.name, 80) + "'");
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
  // The header must be UTF-8 for every safetensors reader: a metadata value made of bytes
  // that are not (a path) gets U+FFFD for each invalid byte instead of failing the write.
  std::string text = j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
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
  std::string header;        // as written at Create(), digests reserved as zeros
  size_t tensor_digests_at = 0;  // offsets in `header` of the two reserved values
  size_t header_digest_at = 0;
  Xxh3Stream hash;                // of the current tensor's bytes so far
  std::vector<uint64_t> digests;  // of the finished tensors
  size_t index = 0;  // tensor being written
  uint64_t written_in_tensor = 0;
  uint64_t total = 0;
  bool finished = false;
  bool failed = false;  // Finish() failed and removed the temporary file

  // Append (span: AppendTensors): the bytes leave in one AppendThrough, each tensor's share
  // hashed into its own digest on the way out.
  Status Write(const void* data, uint64_t bytes, bool span) {
    if (finished || failed) return FailedPrecondition(path + ": writer already finished");
    if (bytes == 0) return Status::Ok();
    if (index >= tensors.size()) return InvalidArgument(path + ": append past the last tensor");
    uint64_t room = sizes[index] - written_in_tensor;
    for (size_t k = index + 1; span && k < sizes.size(); ++k) room += sizes[k];
    if (bytes > room)
      return InvalidArgument(path + ": " + std::to_string(bytes) + " bytes overrun tensor '" +
                             tensors[span ? tensors.size() - 1 : index].name + "' (" +
                             std::to_string(room) + " left" + (span ? " in the file)" : ")"));
    const std::string first = tensors[index].name;
    // Hashed on the way out: each piece while the disk writes the ones before it (an export's
    // 45 MB piece hashed after its write left the disk idle for as long, issue 19).
    return file
        ->AppendThrough(std::string_view(static_cast<const char*>(data), bytes),
                        [this](const uint8_t* p, size_t n) {
                          while (n > 0) {
                            const size_t k = static_cast<size_t>(
                                std::min<uint64_t>(n, sizes[index] - written_in_tensor));
                            hash.Update(p, k);
                            written_in_tensor += k;
                            p += k;
                            n -= k;
                            SkipEmpty();
                          }
                        })
        .WithContext("write " + path + " tensor '" + first + "'");
  }

  void SkipEmpty() {
    while (index < tensors.size() && written_in_tensor == sizes[index]) {
      digests.push_back(hash.Digest());
      hash = Xxh3Stream();
      ++index;
      written_in_tensor = 0;
    }
  }

  // Overwrites the reserved header at offset 8 with the digests filled in (step 3).
  Status PatchHeader() {
    for (size_t i = 0; i < digests.size(); ++i)
      header.replace(tensor_digests_at + i * (kDigestChars + 1), kDigestChars,
                     DigestHex(digests[i]));
    uint8_t len_bytes[8];
    EncodeLength(header.size(), len_bytes);
    header.replace(header_digest_at, kDigestChars,
                   DigestHex(HeaderDigest(len_bytes, header, header_digest_at)));
    CKPT_RETURN_IF_ERROR(env->BeginExternalWrite(tmp), "");
    CKPT_ASSIGN_OR_RETURN(std::unique_ptr<RandomWriteFile> f, env->OpenRandomWriteFile(tmp),
                          "fill in the digests");
    CKPT_RETURN_IF_ERROR(f->Write(8, header), "write the header of " + tmp);
    return f->Close();
  }

  void RemoveTemporary() {
    if (file) {
      file->Close().IgnoreError();
      file.reset();
    }
    if (env->Exists(tmp)) env->RemoveFile(tmp).IgnoreError();
  }

  ~Impl() {
    if (!finished && !failed) RemoveTemporary();
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
  const auto tensor_at = FindMetadataValue(header, kTensorDigestsKey);
  const auto header_at = FindMetadataValue(header, kHeaderDigestKey);
  if (!tensor_at || !header_at)
    return Internal(path + ": the reserved integrity record is not where the writer expects it");
  impl->tensor_digests_at = *tensor_at;
  impl->header_digest_at = *header_at;
  for (const auto& t : tensors) impl->sizes.push_back(*ByteLength(t.shape, t.dtype));
  impl->tensors = std::move(tensors);
  impl->digests.reserve(impl->tensors.size());
  CKPT_ASSIGN_OR_RETURN(impl->file, impl->env->NewWritableFile(impl->tmp), "create " + path);
  uint8_t len_bytes[8];
  EncodeLength(header.size(), len_bytes);
  Status s = impl->file->Append(std::string_view(reinterpret_cast<char*>(len_bytes), 8));
  if (s.ok()) s = impl->file->Append(header);
  if (!s.ok()) return s.WithContext("write " + path);  // ~Impl removes the temporary file
  impl->total = 8 + header.size();
  for (uint64_t sz : impl->sizes) impl->total += sz;
  impl->header = std::move(header);
  impl->SkipEmpty();
  return SafetensorsWriter(std::move(impl));
}

std::optional<SafetensorsTensorSpec> SafetensorsWriter::current() const {
  if (impl_->index >= impl_->tensors.size()) return std::nullopt;
  return impl_->tensors[impl_->index];
}

uint64_t SafetensorsWriter::file_size() const { return impl_->total; }

Status SafetensorsWriter::Append(const void* data, uint64_t bytes) {
  return impl_->Write(data, bytes, /*span=*/false);
}

Status SafetensorsWriter::AppendTensors(const void* data, uint64_t bytes) {
  return impl_->Write(data, bytes, /*span=*/true);
}

Status SafetensorsWriter::Finish() {
  Impl& w = *impl_;
  if (w.finished) return Status::Ok();
  if (w.failed)
    return FailedPrecondition(w.path + ": an earlier Finish() failed; the file was not published");
  if (w.index < w.tensors.size())
    return FailedPrecondition(w.path + ": tensor '" + w.tensors[w.index].name +
                              "' is incomplete; the file was not published");
  // Steps 3-5; any failure removes the temporary file.
  Status s = w.file->Close();
  if (s.ok()) {
    w.file.reset();
    s = w.PatchHeader();
  }
  if (s.ok()) s = w.env->SyncFile(w.tmp);
  if (s.ok()) s = w.env->RenameFile(w.tmp, w.path);
  if (!s.ok()) {
    w.RemoveTemporary();
    w.failed = true;
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

}  // namespace ckpt::safetensors
