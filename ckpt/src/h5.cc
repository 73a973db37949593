#include "ckpt/h5.h"


#include "zstd_filter.h"

#include <algorithm>
#include <cstring>
#include <mutex>

namespace ckpt::h5 {

namespace {

const H5Z_class2_t kZstdClass = {
    H5Z_CLASS_T_VERS, kZstdFilterId, 1, 1, "zstd", nullptr, nullptr, ZstdFilterCallback,
};

herr_t CollectMessage(unsigned n, const H5E_error2_t* err, void* data) {
  auto* out = static_cast<std::string*>(data);
  if (err->desc && *err->desc) *out = err->desc;  // keep the innermost (last walked)
  (void)n;
  return 0;
}

}  // namespace

void Init() {
  static std::once_flag once;
  std::call_once(once, [] {
    // Register unconditionally: asking H5Zfilter_avail first makes HDF5 search and dlopen
    // every plugin in its plugin directory (~20 ms per process, measured with strace).
    H5Zregister(&kZstdClass);
  });
  thread_local bool quiet = false;
  if (!quiet) {
    H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
    quiet = true;
  }
}

std::string ErrorText() {
  std::string msg;
  H5Ewalk2(H5E_DEFAULT, H5E_WALK_DOWNWARD, CollectMessage, &msg);
  H5Eclear2(H5E_DEFAULT);
  return msg.empty() ? "HDF5 error" : Shown(msg);  // it may quote a name from the file
}

namespace {

// The file (little-endian) and memory types of each dtype, in one table.
struct Types {
  hid_t file;
  hid_t mem;
};

Types TypesOf(DType t) {
  switch (t) {
    case DType::kF32:
      return {H5T_IEEE_F32LE, H5T_NATIVE_FLOAT};
    case DType::kF64:
      return {H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE};
    case DType::kBF16:
    case DType::kF16:
    case DType::kU16:
      return {H5T_STD_U16LE, H5T_NATIVE_UINT16};
    case DType::kI64:
      return {H5T_STD_I64LE, H5T_NATIVE_INT64};
    case DType::kI32:
      return {H5T_STD_I32LE, H5T_NATIVE_INT32};
    case DType::kU8:
      break;
  }
  return {H5T_STD_U8LE, H5T_NATIVE_UINT8};
}

}  // namespace

hid_t FileType(DType t) { return TypesOf(t).file; }
hid_t MemType(DType t) { return TypesOf(t).mem; }

Status WriteStringAttr(hid_t obj, const char* name, const std::string& value) {
  Handle type = Type(H5Tcopy(H5T_C_S1));
  H5Tset_size(type.get(), std::max<size_t>(1, value.size()));
  H5Tset_strpad(type.get(), H5T_STR_NULLPAD);
  Handle space = Space(H5Screate(H5S_SCALAR));
  Handle attr = Attr(H5Acreate2(obj, name, type.get(), space.get(), H5P_DEFAULT, H5P_DEFAULT));
  if (!attr.valid()) return IOError(std::string("attribute ") + name + ": " + ErrorText());
  // HDF5 has no zero-size string type: "" is stored as one NUL byte.
  std::string padded = value.empty() ? std::string(1, '\0') : value;
  if (H5Awrite(attr.get(), type.get(), padded.data()) < 0)
    return IOError(std::string("attribute ") + name + ": " + ErrorText());
  return Status::Ok();
}

Status WriteIntAttr(hid_t obj, const char* name, int64_t value) {
  Handle space = Space(H5Screate(H5S_SCALAR));
  Handle attr = Attr(H5Acreate2(obj, name, H5T_STD_I64LE, space.get(), H5P_DEFAULT, H5P_DEFAULT));
  if (!attr.valid() || H5Awrite(attr.get(), H5T_NATIVE_INT64, &value) < 0)
    return IOError(std::string("attribute ") + name + ": " + ErrorText());
  return Status::Ok();
}

Result<std::string> ReadStringAttr(hid_t obj, const char* name) {
  if (H5Aexists(obj, name) <= 0) return NotFound(std::string("attribute ") + name + " missing");
  Handle attr = Attr(H5Aopen(obj, name, H5P_DEFAULT));
  if (!attr.valid()) return DataLoss(std::string("attribute ") + name + ": " + ErrorText());
  Handle ftype = Type(H5Aget_type(attr.get()));
  if (H5Tget_class(ftype.get()) != H5T_STRING)
    return DataLoss(std::string("attribute ") + name + " is not a string");
  if (H5Tis_variable_str(ftype.get()) > 0) {
    Handle mtype = Type(H5Tcopy(H5T_C_S1));
    H5Tset_size(mtype.get(), H5T_VARIABLE);
    // HDF5 converts no string between character sets: read in the attribute's own.
    H5Tset_cset(mtype.get(), H5Tget_cset(ftype.get()));
    char* p = nullptr;
    if (H5Aread(attr.get(), mtype.get(), &p) < 0 || p == nullptr)
      return DataLoss(std::string("attribute ") + name + ": " + ErrorText());
    std::string out(p);
    H5free_memory(p);
    return out;
  }
  const size_t n = H5Tget_size(ftype.get());
  std::string buf(n, '\0');
  if (H5Aread(attr.get(), ftype.get(), buf.data()) < 0)
    return DataLoss(std::string("attribute ") + name + ": " + ErrorText());
  buf.resize(std::strlen(buf.c_str()));
  return buf;
}

void DisableExitCleanup() { H5dont_atexit(); }

Handle SpaceFor(const std::vector<int64_t>& shape) {
  if (shape.empty()) return Space(H5Screate(H5S_SCALAR));
  std::vector<hsize_t> dims(shape.begin(), shape.end());
  return Space(H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr));
}

Status SelectFlatRange(hid_t space, const std::vector<int64_t>& shape, int64_t begin, int64_t end) {
  const size_t nd = shape.size();
  if (nd == 0) {
    if (!(begin == 0 && end == 1)) return Internal("scalar range must be [0, 1)");
    if (H5Sselect_all(space) < 0) return Internal("select: " + ErrorText());
    return Status::Ok();
  }
  std::vector<int64_t> stride(nd, 1);
  for (size_t k = nd - 1; k > 0; --k) stride[k - 1] = stride[k] * shape[k];
  std::vector<hsize_t> start(nd), count(nd);
  bool first = true;
  int64_t b = begin;
  while (b < end) {
    // The coarsest dimension whose step is aligned at b and fits before end; the innermost
    // (stride 1) always does.
    size_t k = nd - 1;
    for (size_t j = 0; j < nd; ++j) {
      if (b % stride[j] == 0 && b + stride[j] <= end) {
        k = j;
        break;
      }
    }
    const int64_t idx = (b / stride[k]) % shape[k];
    const int64_t n = std::min((end - b) / stride[k], shape[k] - idx);
    for (size_t i = 0; i < nd; ++i) {
      start[i] = static_cast<hsize_t>((b / stride[i]) % shape[i]);
      count[i] = i < k ? 1 : (i == k ? static_cast<hsize_t>(n) : static_cast<hsize_t>(shape[i]));
    }
    if (H5Sselect_hyperslab(space, first ? H5S_SELECT_SET : H5S_SELECT_OR, start.data(), nullptr,
                            count.data(), nullptr) < 0)
      return Internal("select hyperslab: " + ErrorText());
    first = false;
    b += n * stride[k];
  }
  if (first && H5Sselect_none(space) < 0) return Internal("select none: " + ErrorText());
  return Status::Ok();
}

}  // namespace ckpt::h5
