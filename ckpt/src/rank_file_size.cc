#include "ckpt/rank_file_size.h"

#include <hdf5.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <memory>
#include <mutex>
#include <type_traits>
#include <unordered_map>

#include "ckpt/manifest.h"
#include "ckpt/writer.h"
#include "rank_file.h"

namespace ckpt {
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

H5FD_t* MetaOpen(const char*, unsigned flags, hid_t, haddr_t maxaddr) {
  // There is no existing file to open: HDF5 first probes without H5F_ACC_CREAT, and an
  // exclusive create must see that probe fail.
  if ((flags & H5F_ACC_CREAT) == 0) return nullptr;
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

}  // namespace

Result<uint64_t> UncompressedRankFileBytes(const RankFileIdentity& header,
                                           const std::vector<RankFileDatasetShape>& datasets,
                                           uint64_t chunk_bytes) {
  H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
  hid_t driver = MetaDriver();
  if (driver < 0) return Internal("replica: cannot register the metadata-only file driver");
  hid_t fapl = H5Pcreate(H5P_FILE_ACCESS);
  if (fapl < 0 || H5Pset_driver(fapl, driver, nullptr) < 0) {
    if (fapl >= 0) H5Pclose(fapl);
    return Internal("replica: cannot select the metadata-only file driver");
  }
  std::vector<DatasetSpec> specs;
  specs.reserve(datasets.size());
  for (const RankFileDatasetShape& d : datasets) {
    DatasetSpec s = DatasetSpec::Tensor(d.name, d.dtype, d.shape, nullptr);
    s.kind = d.kind;
    s.blob_kind = d.blob_kind;
    specs.push_back(std::move(s));
  }
  SaveOptions options;
  options.chunk_bytes = chunk_bytes;
  last_closed_eoa = 0;
  // The writer's own structure phase (the data phase only fills regions it allocated).
  internal::RankFileHeader file_header;
  file_header.rank = header.rank;
  file_header.world = header.world;
  file_header.tag = header.tag;
  Status s = internal::WriteRankFileStructure("ckpt-estimate-replica.h5", file_header, specs,
                                              options, fapl);
  H5Pclose(fapl);
  CKPT_RETURN_IF_ERROR(s, "replica");
  return static_cast<uint64_t>(last_closed_eoa);
}

}  // namespace ckpt
