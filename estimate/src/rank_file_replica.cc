#include "rank_file_replica.h"

#include <hdf5.h>
#include <sys/mman.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <memory>
#include <mutex>
#include <type_traits>
#include <unordered_map>

#include "ckpt/manifest.h"

namespace ckpt::estimate::internal {
namespace {

// ---- a virtual file driver: metadata in memory pages, raw data dropped ----------------------

constexpr size_t kPage = 4096;

using PageMap = std::unordered_map<uint64_t, std::unique_ptr<std::array<uint8_t, kPage>>>;

// Standard layout with the public part first: HDF5 casts between H5FD_t* and the driver's
// struct. HDF5's C driver interface hands the object across by pointer, so MetaOpen allocates
// it (and its page map) and MetaClose, which HDF5 always calls, frees both: the one place this
// code owns through raw pointers.
struct MetaFile {
  H5FD_t pub;
  haddr_t eoa;
  haddr_t eof;
  PageMap* pages;
};
static_assert(std::is_standard_layout_v<MetaFile>);

MetaFile* Self(H5FD_t* f) { return reinterpret_cast<MetaFile*>(f); }
const MetaFile* Self(const H5FD_t* f) { return reinterpret_cast<const MetaFile*>(f); }

H5FD_t* MetaOpen(const char*, unsigned, hid_t, haddr_t maxaddr) {
  if (maxaddr == 0 || maxaddr == HADDR_UNDEF) maxaddr = static_cast<haddr_t>(1) << 62;
  auto* f = new MetaFile();  // value-initialised: pub zeroed, as HDF5 expects
  f->pub.maxaddr = maxaddr;
  f->pages = new PageMap();
  return &f->pub;
}

// The end-of-allocation address when the last file closed: the library has released its
// aggregators and truncated by then, so it is what sec2 leaves as the file size.
thread_local haddr_t last_closed_eoa = 0;

herr_t MetaClose(H5FD_t* f) {
  last_closed_eoa = Self(f)->eoa;
  delete Self(f)->pages;
  delete Self(f);
  return 0;
}

// The same feature set as sec2 (the writer's driver), so the library allocates, aggregates
// and accumulates exactly as it does for the real file.
herr_t MetaQuery(const H5FD_t*, unsigned long* flags) {
  if (flags) {
    *flags = H5FD_FEAT_AGGREGATE_METADATA | H5FD_FEAT_ACCUMULATE_METADATA |
             H5FD_FEAT_DATA_SIEVE | H5FD_FEAT_AGGREGATE_SMALLDATA;
  }
  return 0;
}

haddr_t MetaGetEoa(const H5FD_t* f, H5FD_mem_t) { return Self(f)->eoa; }
herr_t MetaSetEoa(H5FD_t* f, H5FD_mem_t, haddr_t addr) {
  Self(f)->eoa = addr;
  return 0;
}
haddr_t MetaGetEof(const H5FD_t* f, H5FD_mem_t) { return Self(f)->eof; }

herr_t MetaRead(H5FD_t* f, H5FD_mem_t, hid_t, haddr_t addr, size_t size, void* buf) {
  auto* out = static_cast<uint8_t*>(buf);
  MetaFile* m = Self(f);
  while (size > 0) {
    const uint64_t page = addr / kPage;
    const size_t off = static_cast<size_t>(addr % kPage);
    const size_t n = std::min(size, kPage - off);
    auto it = m->pages->find(page);
    if (it == m->pages->end()) {
      std::memset(out, 0, n);
    } else {
      std::memcpy(out, it->second->data() + off, n);
    }
    out += n;
    addr += n;
    size -= n;
  }
  return 0;
}

herr_t MetaWrite(H5FD_t* f, H5FD_mem_t type, hid_t, haddr_t addr, size_t size,
                 const void* buf) {
  MetaFile* m = Self(f);
  m->eof = std::max<haddr_t>(m->eof, addr + size);
  if (type == H5FD_MEM_DRAW) return 0;  // raw data: only its extent matters
  const auto* in = static_cast<const uint8_t*>(buf);
  while (size > 0) {
    const uint64_t page = addr / kPage;
    const size_t off = static_cast<size_t>(addr % kPage);
    const size_t n = std::min(size, kPage - off);
    auto& slot = (*m->pages)[page];
    if (!slot) {
      slot = std::make_unique<std::array<uint8_t, kPage>>();
      slot->fill(0);
    }
    std::memcpy(slot->data() + off, in, n);
    in += n;
    addr += n;
    size -= n;
  }
  return 0;
}

herr_t MetaTruncate(H5FD_t* f, hid_t, hbool_t) {
  Self(f)->eof = Self(f)->eoa;
  return 0;
}

const H5FD_class_t kMetaClass = {
    "ckpt_estimate_meta",  // name
    static_cast<haddr_t>(1) << 62,  // maxaddr
    H5F_CLOSE_WEAK,        // fc_degree
    nullptr,               // terminate
    nullptr, nullptr, nullptr,  // sb_size, sb_encode, sb_decode
    0, nullptr, nullptr, nullptr,  // fapl
    0, nullptr, nullptr,   // dxpl
    MetaOpen, MetaClose,
    nullptr,               // cmp
    MetaQuery,
    nullptr,               // get_type_map
    nullptr, nullptr,      // alloc, free
    MetaGetEoa, MetaSetEoa, MetaGetEof,
    nullptr,               // get_handle
    MetaRead, MetaWrite,
    nullptr,               // flush
    MetaTruncate,
    nullptr, nullptr,      // lock, unlock
    H5FD_FLMAP_DICHOTOMY};

hid_t MetaDriver() {
  static std::once_flag once;
  static hid_t id = H5I_INVALID_HID;
  std::call_once(once, [] { id = H5FDregister(&kMetaClass); });
  return id;
}

// ---- RAII ---------------------------------------------------------------------------------

class H5Id {
 public:
  H5Id(hid_t id, herr_t (*close)(hid_t)) : id_(id), close_(close) {}
  H5Id(const H5Id&) = delete;
  H5Id& operator=(const H5Id&) = delete;
  ~H5Id() {
    if (id_ >= 0) close_(id_);
  }
  hid_t get() const { return id_; }
  bool valid() const { return id_ >= 0; }
  herr_t Close() {
    herr_t rc = id_ >= 0 ? close_(id_) : 0;
    id_ = H5I_INVALID_HID;
    return rc;
  }

 private:
  hid_t id_;
  herr_t (*close_)(hid_t);
};

// A read-only view of `bytes` zeros that costs no memory until touched (and reads never
// allocate: they map the shared zero page).
class ZeroBuffer {
 public:
  explicit ZeroBuffer(size_t bytes) : size_(std::max<size_t>(bytes, 1)) {
    ptr_ = mmap(nullptr, size_, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (ptr_ == MAP_FAILED) ptr_ = nullptr;
  }
  ~ZeroBuffer() {
    if (ptr_) munmap(ptr_, size_);
  }
  ZeroBuffer(const ZeroBuffer&) = delete;
  ZeroBuffer& operator=(const ZeroBuffer&) = delete;
  const void* data() const { return ptr_; }

 private:
  size_t size_;
  void* ptr_ = nullptr;
};

hid_t FileType(DType t) {
  switch (t) {
    case DType::kF32: return H5T_IEEE_F32LE;
    case DType::kF64: return H5T_IEEE_F64LE;
    case DType::kBF16:
    case DType::kF16:
    case DType::kU16: return H5T_STD_U16LE;
    case DType::kI64: return H5T_STD_I64LE;
    case DType::kI32: return H5T_STD_I32LE;
    case DType::kU8: return H5T_STD_U8LE;
  }
  return H5T_STD_U8LE;
}

hid_t MemType(DType t) {
  switch (t) {
    case DType::kF32: return H5T_NATIVE_FLOAT;
    case DType::kF64: return H5T_NATIVE_DOUBLE;
    case DType::kBF16:
    case DType::kF16:
    case DType::kU16: return H5T_NATIVE_UINT16;
    case DType::kI64: return H5T_NATIVE_INT64;
    case DType::kI32: return H5T_NATIVE_INT32;
    case DType::kU8: return H5T_NATIVE_UINT8;
  }
  return H5T_NATIVE_UINT8;
}

bool StringAttr(hid_t obj, const char* name, const std::string& value) {
  H5Id type(H5Tcopy(H5T_C_S1), H5Tclose);
  H5Tset_size(type.get(), std::max<size_t>(1, value.size()));
  H5Tset_strpad(type.get(), H5T_STR_NULLPAD);
  H5Id space(H5Screate(H5S_SCALAR), H5Sclose);
  H5Id attr(H5Acreate2(obj, name, type.get(), space.get(), H5P_DEFAULT, H5P_DEFAULT), H5Aclose);
  if (!attr.valid()) return false;
  std::string padded = value.empty() ? std::string(1, '\0') : value;
  return H5Awrite(attr.get(), type.get(), padded.data()) >= 0;
}

bool IntAttr(hid_t obj, const char* name, int64_t value) {
  H5Id space(H5Screate(H5S_SCALAR), H5Sclose);
  H5Id attr(H5Acreate2(obj, name, H5T_STD_I64LE, space.get(), H5P_DEFAULT, H5P_DEFAULT),
            H5Aclose);
  return attr.valid() && H5Awrite(attr.get(), H5T_NATIVE_INT64, &value) >= 0;
}

Status WriteOne(hid_t file, const ReplicaDataset& d, uint64_t chunk_bytes) {
  const size_t elem = DTypeSize(d.dtype);
  int64_t numel = 1;
  for (int64_t x : d.shape) {
    if (x < 0 || __builtin_mul_overflow(numel, x, &numel)) {
      return InvalidArgument("dataset " + d.name + ": bad shape");
    }
  }
  const bool chunked = d.kind == "tensor" && !d.shape.empty() && numel > 0;
  std::vector<hsize_t> dims(d.shape.begin(), d.shape.end());
  H5Id space(d.shape.empty() ? H5Screate(H5S_SCALAR)
                             : H5Screate_simple(static_cast<int>(dims.size()), dims.data(),
                                                nullptr),
             H5Sclose);
  H5Id dcpl(H5Pcreate(H5P_DATASET_CREATE), H5Pclose);
  if (chunked) {
    const int64_t inner = numel / d.shape[0];
    const int64_t chunk_elems = std::max<int64_t>(1, static_cast<int64_t>(chunk_bytes / elem));
    const int64_t rows = std::clamp<int64_t>(chunk_elems / std::max<int64_t>(inner, 1), 1,
                                             d.shape[0]);
    std::vector<hsize_t> cdims = dims;
    cdims[0] = static_cast<hsize_t>(rows);
    H5Pset_chunk(dcpl.get(), static_cast<int>(cdims.size()), cdims.data());
  }
  H5Id lcpl(H5Pcreate(H5P_LINK_CREATE), H5Pclose);
  H5Pset_create_intermediate_group(lcpl.get(), 1);
  H5Id dset(H5Dcreate2(file, d.name.c_str(), FileType(d.dtype), space.get(), lcpl.get(),
                       dcpl.get(), H5P_DEFAULT),
            H5Dclose);
  if (!dset.valid()) return Internal("replica: cannot create dataset " + d.name);
  if (!StringAttr(dset.get(), "dtype", std::string(DTypeName(d.dtype))) ||
      !StringAttr(dset.get(), "kind", d.kind) ||
      (!d.blob_kind.empty() && !StringAttr(dset.get(), "blob_kind", d.blob_kind))) {
    return Internal("replica: cannot write attributes of " + d.name);
  }
  if (numel == 0) return Status::Ok();
  if (!chunked) {
    // Contiguous blobs and JSON: small; one write, as the writer does.
    ZeroBuffer zeros(static_cast<size_t>(numel) * elem);
    if (zeros.data() == nullptr) return Internal("replica: cannot map a zero buffer");
    if (H5Dwrite(dset.get(), MemType(d.dtype), H5S_ALL, H5S_ALL, H5P_DEFAULT, zeros.data()) <
        0) {
      return Internal("replica: cannot write dataset " + d.name);
    }
    return Status::Ok();
  }
  // Chunked tensors: the writer's single H5Dwrite allocates and indexes the chunks in order,
  // full size (edge chunks included). Direct chunk writes in the same order make the same
  // allocations and B-tree insertions without HDF5 touching the data, which the driver drops.
  const int64_t inner = numel / d.shape[0];
  const int64_t chunk_elems = std::max<int64_t>(1, static_cast<int64_t>(chunk_bytes / elem));
  const int64_t rows =
      std::clamp<int64_t>(chunk_elems / std::max<int64_t>(inner, 1), 1, d.shape[0]);
  const size_t one_chunk = static_cast<size_t>(rows * inner) * elem;
  ZeroBuffer zeros(one_chunk);
  if (zeros.data() == nullptr) return Internal("replica: cannot map a zero buffer");
  std::vector<hsize_t> offset(d.shape.size(), 0);
  for (int64_t row0 = 0; row0 < d.shape[0]; row0 += rows) {
    offset[0] = static_cast<hsize_t>(row0);
    if (H5Dwrite_chunk(dset.get(), H5P_DEFAULT, 0, offset.data(), one_chunk, zeros.data()) < 0) {
      return Internal("replica: cannot write a chunk of " + d.name);
    }
  }
  return Status::Ok();
}

}  // namespace

Result<uint64_t> ReplicaRankFileBytes(const ReplicaHeader& header,
                                      const std::vector<ReplicaDataset>& datasets,
                                      uint64_t chunk_bytes) {
  H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
  hid_t driver = MetaDriver();
  if (driver < 0) return Internal("replica: cannot register the metadata-only file driver");
  H5Id fapl(H5Pcreate(H5P_FILE_ACCESS), H5Pclose);
  if (H5Pset_driver(fapl.get(), driver, nullptr) < 0) {
    return Internal("replica: cannot select the metadata-only file driver");
  }
  H5Id file(H5Fcreate("ckpt-estimate-replica.h5", H5F_ACC_TRUNC, H5P_DEFAULT, fapl.get()),
            H5Fclose);
  if (!file.valid()) return Internal("replica: cannot create the in-memory file");
  if (!StringAttr(file.get(), "format", std::string(kFormatName)) ||
      !StringAttr(file.get(), "format_version",
                  std::to_string(kFormatMajor) + "." + std::to_string(kFormatMinor)) ||
      !StringAttr(file.get(), "tag", header.tag) || !IntAttr(file.get(), "rank", header.rank) ||
      !IntAttr(file.get(), "dp_world_size", header.world)) {
    return Internal("replica: cannot write file attributes");
  }
  for (const ReplicaDataset& d : datasets) {
    CKPT_RETURN_IF_ERROR(WriteOne(file.get(), d, chunk_bytes), "replica");
  }
  last_closed_eoa = 0;
  if (file.Close() < 0) return Internal("replica: close failed");
  const haddr_t eoa = last_closed_eoa;
  return static_cast<uint64_t>(eoa);
}

}  // namespace ckpt::estimate::internal
