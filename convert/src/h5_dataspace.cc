#include "h5_util.h"

#include <algorithm>
#include <cstring>

namespace ckpt::convert::h5 {

void Init() { H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr); }

namespace {
herr_t WalkInnermost(unsigned n, const H5E_error2_t* err, void* data) {
  auto* out = static_cast<std::string*>(data);
  if (n == 0 && err->desc) *out = err->desc;
  return 0;
}
}  // namespace

std::string ErrorText() {
  std::string out;
  H5Ewalk2(H5E_DEFAULT, H5E_WALK_DOWNWARD, WalkInnermost, &out);
  H5Eclear2(H5E_DEFAULT);
  return out.empty() ? std::string("HDF5 error") : out;
}

Status Handle::Close(const std::string& what) {
  if (id_ < 0) return Status::Ok();
  herr_t rc = closer_(id_);
  id_ = H5I_INVALID_HID;
  if (rc < 0) return IOError(what + ": " + ErrorText());
  return Status::Ok();
}

hid_t FileType(DType t) {
  switch (t) {
    case DType::kF32:
      return H5T_IEEE_F32LE;
    case DType::kF64:
      return H5T_IEEE_F64LE;
    case DType::kBF16:
    case DType::kF16:
    case DType::kU16:
      return H5T_STD_U16LE;
    case DType::kI64:
      return H5T_STD_I64LE;
    case DType::kI32:
      return H5T_STD_I32LE;
    case DType::kU8:
      return H5T_STD_U8LE;
  }
  return H5T_STD_U8LE;
}

hid_t MemType(DType t) {
  switch (t) {
    case DType::kF32:
      return H5T_NATIVE_FLOAT;
    case DType::kF64:
      return H5T_NATIVE_DOUBLE;
    case DType::kBF16:
    case DType::kF16:
    case DType::kU16:
      return H5T_NATIVE_UINT16;
    case DType::kI64:
      return H5T_NATIVE_INT64;
    case DType::kI32:
      return H5T_NATIVE_INT32;
    case DType::kU8:
      return H5T_NATIVE_UINT8;
  }
  return H5T_NATIVE_UINT8;
}

Status WriteStringAttr(hid_t obj, const char* name, const std::string& value) {
  Handle type = Type(H5Tcopy(H5T_C_S1));
  H5Tset_size(type.get(), std::max<size_t>(1, value.size()));
  H5Tset_strpad(type.get(), H5T_STR_NULLPAD);
  Handle space = Space(H5Screate(H5S_SCALAR));
  Handle attr = Attr(H5Acreate2(obj, name, type.get(), space.get(), H5P_DEFAULT, H5P_DEFAULT));
  if (!attr.valid()) return IOError(std::string("attribute ") + name + ": " + ErrorText());
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
    H5Tset_cset(mtype.get(), H5Tget_cset(ftype.get()));  // h5py writes UTF-8
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

}  // namespace ckpt::convert::h5
