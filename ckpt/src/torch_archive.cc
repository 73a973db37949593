#include "torch_archive.h"

#include <zip.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <vector>

#include "ckpt/shared_library.h"

namespace ckpt {
namespace {

constexpr uint64_t kMaxPickleBytes = 256ull << 20;  // data.pkl of a checkpoint is kilobytes

// libzip, opened on first use (dlopen), not linked: it needs libcrypto, whose loading and
// relocation every process linking libzip paid at start (about 4 ms of ckpt --version's 14 on
// the development VM, issue 19), while only reading a PyTorch .pt file uses it. zip.h gives the
// types.
struct ZipApi {
  decltype(&zip_open) open = nullptr;
  decltype(&zip_discard) discard = nullptr;
  decltype(&zip_get_num_entries) get_num_entries = nullptr;
  decltype(&zip_get_name) get_name = nullptr;
  decltype(&zip_stat_init) stat_init = nullptr;
  decltype(&zip_stat_index) stat_index = nullptr;
  decltype(&zip_fopen_index) fopen_index = nullptr;
  decltype(&zip_fseek) fseek = nullptr;
  decltype(&zip_fread) fread = nullptr;
  decltype(&zip_fclose) fclose = nullptr;
  decltype(&zip_strerror) strerror = nullptr;
  decltype(&zip_file_strerror) file_strerror = nullptr;
  decltype(&zip_error_init_with_code) error_init_with_code = nullptr;
  decltype(&zip_error_strerror) error_strerror = nullptr;
  decltype(&zip_error_fini) error_fini = nullptr;
};

// The library by its SONAME (the loader's search), else the file found at configure time;
// opened once per process. FailedPrecondition naming both when neither opens, or the function
// libzip lacks.
Result<const ZipApi*> LoadZip() {
  struct Loaded {
    ZipApi api;
    std::string error;  // empty: loaded
  };
  static const Loaded loaded = [] {
    Loaded l;
    auto lib = SharedLibrary::Open({CKPT_LIBZIP_SONAME, CKPT_LIBZIP_PATH},
                                   "libzip (Debian package libzip4)");
    if (!lib.ok()) {
      l.error = lib.status().message();
      return l;
    }
    auto find = [&](const char* name, auto** fn) {
      if (Status s = lib->Find(name, fn); !s.ok() && l.error.empty()) l.error = s.message();
    };
    find("zip_open", &l.api.open);
    find("zip_discard", &l.api.discard);
    find("zip_get_num_entries", &l.api.get_num_entries);
    find("zip_get_name", &l.api.get_name);
    find("zip_stat_init", &l.api.stat_init);
    find("zip_stat_index", &l.api.stat_index);
    find("zip_fopen_index", &l.api.fopen_index);
    find("zip_fseek", &l.api.fseek);
    find("zip_fread", &l.api.fread);
    find("zip_fclose", &l.api.fclose);
    find("zip_strerror", &l.api.strerror);
    find("zip_file_strerror", &l.api.file_strerror);
    find("zip_error_init_with_code", &l.api.error_init_with_code);
    find("zip_error_strerror", &l.api.error_strerror);
    find("zip_error_fini", &l.api.error_fini);
    return l;
  }();
  if (!loaded.error.empty()) return FailedPrecondition(loaded.error);
  return &loaded.api;
}

// The API once LoadZip succeeded (every TorchFile exists only after it did).
const ZipApi& Zip() { return **LoadZip(); }

struct ZipCloser {
  void operator()(zip_t* z) const { Zip().discard(z); }
};
struct ZipFileCloser {
  void operator()(zip_file_t* f) const { Zip().fclose(f); }
};

std::string ZipErrorText(int code) {
  zip_error_t e;
  Zip().error_init_with_code(&e, code);
  std::string s = Zip().error_strerror(&e);
  Zip().error_fini(&e);
  return s;
}

}  // namespace

struct TorchFile::Impl {
  std::string path;
  std::unique_ptr<zip_t, ZipCloser> zip;
  std::string prefix;                       // "<name>/"
  std::map<std::string, zip_uint64_t> records;  // name below prefix -> index
  PickleDoc doc;
  uint64_t bytes_read = 0;

  Result<zip_uint64_t> Index(const std::string& name) const {
    auto it = records.find(name);
    if (it == records.end()) return DataLoss(path + ": archive has no record " + prefix + name);
    return it->second;
  }

  // Reads [offset, offset + n) of record `idx` into out.
  Status ReadAt(zip_uint64_t idx, uint64_t offset, uint64_t n, void* out) {
    std::unique_ptr<zip_file_t, ZipFileCloser> f(Zip().fopen_index(zip.get(), idx, 0));
    if (!f) return DataLoss(path + ": cannot open record: " + Zip().strerror(zip.get()));
    if (offset > 0) {
      if (Zip().fseek(f.get(), static_cast<zip_int64_t>(offset), SEEK_SET) != 0) {
        // Compressed records cannot seek: read up to the offset.
        f.reset(Zip().fopen_index(zip.get(), idx, 0));
        if (!f) return DataLoss(path + ": cannot open record: " + Zip().strerror(zip.get()));
        std::vector<char> skip(1 << 16);
        uint64_t left = offset;
        while (left > 0) {
          const zip_int64_t got =
              Zip().fread(f.get(), skip.data(), std::min<uint64_t>(left, skip.size()));
          if (got <= 0) return DataLoss(path + ": record ends early");
          left -= static_cast<uint64_t>(got);
        }
      }
    }
    auto* dst = static_cast<char*>(out);
    uint64_t done = 0;
    while (done < n) {
      const zip_int64_t got = Zip().fread(f.get(), dst + done, n - done);
      if (got < 0) return DataLoss(path + ": reading a record: " + Zip().file_strerror(f.get()));
      if (got == 0) return DataLoss(path + ": record ends early (truncated archive)");
      done += static_cast<uint64_t>(got);
    }
    bytes_read += n;
    return Status::Ok();
  }

  Result<uint64_t> Size(zip_uint64_t idx) const {
    zip_stat_t st;
    Zip().stat_init(&st);
    if (Zip().stat_index(zip.get(), idx, 0, &st) != 0 || !(st.valid & ZIP_STAT_SIZE))
      return DataLoss(path + ": cannot stat a record: " + Zip().strerror(zip.get()));
    return static_cast<uint64_t>(st.size);
  }
};

TorchFile::TorchFile(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
TorchFile::TorchFile(TorchFile&&) noexcept = default;
TorchFile& TorchFile::operator=(TorchFile&&) noexcept = default;
TorchFile::~TorchFile() = default;

const std::string& TorchFile::path() const { return impl_->path; }
const PickleDoc& TorchFile::doc() const { return impl_->doc; }
uint64_t TorchFile::bytes_read() const { return impl_->bytes_read; }
const TorchTensorRef& TorchFile::tensor(const PyValue& v) const {
  return impl_->doc.tensors()[static_cast<size_t>(v.tensor)];
}

Result<TorchFile> TorchFile::Open(const std::string& path) {
  CKPT_RETURN_IF_ERROR(LoadZip().status(), path);
  auto impl = std::make_unique<Impl>();
  impl->path = path;
  int err = 0;
  impl->zip.reset(Zip().open(path.c_str(), ZIP_RDONLY | ZIP_CHECKCONS, &err));
  if (!impl->zip) {
    if (err == ZIP_ER_NOENT || err == ZIP_ER_OPEN) {
      if (err == ZIP_ER_NOENT) return NotFound(path + ": no such file");
      return IOError(path + ": cannot open: " + ZipErrorText(err));
    }
    return DataLoss(path + ": not a readable PyTorch zip archive (" + ZipErrorText(err) +
                    "; truncated or damaged?)");
  }
  const zip_int64_t n = Zip().get_num_entries(impl->zip.get(), 0);
  if (n <= 0) return DataLoss(path + ": empty archive");
  for (zip_int64_t i = 0; i < n; ++i) {
    const char* name = Zip().get_name(impl->zip.get(), static_cast<zip_uint64_t>(i), 0);
    if (!name) return DataLoss(path + ": unreadable record name");
    std::string s(name);
    const size_t slash = s.find('/');
    if (slash == std::string::npos) return DataLoss(path + ": record '" + s + "' outside a directory");
    const std::string prefix = s.substr(0, slash + 1);
    if (impl->prefix.empty()) impl->prefix = prefix;
    if (prefix != impl->prefix)
      return DataLoss(path + ": records under two top-level directories ('" + impl->prefix +
                      "', '" + prefix + "')");
    impl->records[s.substr(slash + 1)] = static_cast<zip_uint64_t>(i);
  }
  if (auto it = impl->records.find("byteorder"); it != impl->records.end()) {
    CKPT_ASSIGN_OR_RETURN(uint64_t size, impl->Size(it->second), path);
    if (size > 16) return DataLoss(path + ": byteorder record too large");
    std::string order(size, '\0');
    CKPT_RETURN_IF_ERROR(impl->ReadAt(it->second, 0, size, order.data()), "");
    if (order != "little")
      return Unimplemented(path + ": tensors stored " + order + "-endian; only little is read");
  }
  CKPT_ASSIGN_OR_RETURN(zip_uint64_t pkl, impl->Index("data.pkl"), "");
  CKPT_ASSIGN_OR_RETURN(uint64_t pkl_size, impl->Size(pkl), "");
  if (pkl_size > kMaxPickleBytes)
    return DataLoss(path + ": data.pkl is " + std::to_string(pkl_size) + " bytes (limit " +
                    std::to_string(kMaxPickleBytes) + ")");
  std::string pickle(pkl_size, '\0');
  CKPT_RETURN_IF_ERROR(impl->ReadAt(pkl, 0, pkl_size, pickle.data()), "");
  impl->bytes_read = 0;  // count tensor data only
  CKPT_ASSIGN_OR_RETURN(impl->doc, ParsePickle(pickle, path), "");
  for (const auto& t : impl->doc.tensors()) {
    CKPT_ASSIGN_OR_RETURN(zip_uint64_t idx, impl->Index("data/" + t.key), "");
    CKPT_ASSIGN_OR_RETURN(uint64_t size, impl->Size(idx), "");
    const uint64_t need = static_cast<uint64_t>(t.storage_numel) * t.itemsize;
    if (size < need)
      return DataLoss(path + ": storage record data/" + t.key + " holds " + std::to_string(size) +
                      " bytes, the pickle says " + std::to_string(t.storage_numel) + " " +
                      t.dtype_name + " elements (" + std::to_string(need) + " bytes)");
  }
  return TorchFile(std::move(impl));
}

Status TorchFile::ReadElements(const TorchTensorRef& t, int64_t first, int64_t count, void* out) {
  if (first < 0 || count < 0 || first + count > t.numel())
    return InvalidArgument(impl_->path + ": element range outside tensor");
  if (count == 0) return Status::Ok();
  CKPT_ASSIGN_OR_RETURN(zip_uint64_t idx, impl_->Index("data/" + t.key), "");
  const uint64_t is = t.itemsize;
  if (t.contiguous())
    return impl_->ReadAt(idx, static_cast<uint64_t>(t.offset + first) * is,
                         static_cast<uint64_t>(count) * is, out);
  // Strided: read the span the view covers (checked at parse time to fit the storage), gather.
  int64_t hi = t.offset;
  for (size_t k = 0; k < t.shape.size(); ++k) hi += (t.shape[k] - 1) * t.stride[k];
  std::vector<char> span(static_cast<size_t>(hi - t.offset + 1) * is);
  CKPT_RETURN_IF_ERROR(
      impl_->ReadAt(idx, static_cast<uint64_t>(t.offset) * is, span.size(), span.data()), "");
  auto* dst = static_cast<char*>(out);
  std::vector<int64_t> pos(t.shape.size(), 0);
  // Position of element `first` in row-major order.
  int64_t rem = first;
  for (size_t k = t.shape.size(); k-- > 0;) {
    pos[k] = rem % t.shape[k];
    rem /= t.shape[k];
  }
  for (int64_t e = 0; e < count; ++e) {
    int64_t at = 0;
    for (size_t k = 0; k < pos.size(); ++k) at += pos[k] * t.stride[k];
    std::memcpy(dst + static_cast<size_t>(e) * is, span.data() + static_cast<size_t>(at) * is, is);
    for (size_t k = pos.size(); k-- > 0;) {
      if (++pos[k] < t.shape[k]) break;
      pos[k] = 0;
    }
  }
  return Status::Ok();
}

Status TorchFile::ReadFloats(const TorchTensorRef& t, int64_t first, int64_t count, float* out) {
  if (!t.dtype || (*t.dtype != DType::kF32 && *t.dtype != DType::kF64 &&
                   *t.dtype != DType::kBF16 && *t.dtype != DType::kF16))
    return DataLoss(impl_->path + ": tensor of " + t.dtype_name + " where floats were expected");
  if (*t.dtype == DType::kF32) return ReadElements(t, first, count, out);
  std::vector<char> raw(static_cast<size_t>(count) * t.itemsize);
  CKPT_RETURN_IF_ERROR(ReadElements(t, first, count, raw.data()), "");
  FloatsToF32(*t.dtype, raw.data(), static_cast<size_t>(count), out);
  return Status::Ok();
}

Status TorchFile::VerifyRecords() {
  std::vector<char> buf(1 << 20);
  for (const auto& [name, idx] : impl_->records) {
    std::unique_ptr<zip_file_t, ZipFileCloser> f(Zip().fopen_index(impl_->zip.get(), idx, 0));
    if (!f)
      return DataLoss(impl_->path + ": record " + name + ": " + Zip().strerror(impl_->zip.get()));
    while (true) {
      const zip_int64_t got = Zip().fread(f.get(), buf.data(), buf.size());
      if (got < 0)
        return DataLoss(impl_->path + ": record " + impl_->prefix + name + ": " +
                        Zip().file_strerror(f.get()));
      if (got == 0) break;
      impl_->bytes_read += static_cast<uint64_t>(got);
    }
  }
  return Status::Ok();
}

}  // namespace ckpt
