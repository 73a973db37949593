#include "zstd_filter.h"

#include <zstd.h>

namespace ckpt::h5 {

namespace {
thread_local size_t expected_chunk_bytes = 0;  // 0: no expectation (h5py through the plugin)
}  // namespace

ExpectChunkBytes::ExpectChunkBytes(size_t bytes) : previous_(expected_chunk_bytes) {
  expected_chunk_bytes = bytes;
}
ExpectChunkBytes::~ExpectChunkBytes() { expected_chunk_bytes = previous_; }

// Raw handles, not h5::Handle: this file is also built alone into the HDF5 plugin
// (ckpt/CMakeLists.txt, ckpt_h5zstd), which links none of the library's other sources.
size_t ChunkBytes(hid_t dset) {
  const hid_t dcpl = H5Dget_create_plist(dset);
  const hid_t type = H5Dget_type(dset);
  size_t n = type >= 0 ? H5Tget_size(type) : 0;
  if (dcpl >= 0 && H5Pget_layout(dcpl) == H5D_CHUNKED) {
    hsize_t dims[H5S_MAX_RANK] = {0};
    const int nd = H5Pget_chunk(dcpl, H5S_MAX_RANK, dims);
    if (nd < 1) n = 0;
    for (int i = 0; i < nd && n > 0; ++i)
      if (__builtin_mul_overflow(n, static_cast<size_t>(dims[i]), &n)) n = 0;
  }
  if (type >= 0) H5Tclose(type);
  if (dcpl >= 0) H5Pclose(dcpl);
  H5Eclear2(H5E_DEFAULT);
  return n;
}

size_t ZstdFilterCallback(unsigned int flags, size_t cd_nelmts, const unsigned int cd_values[],
                          size_t nbytes, size_t* buf_size, void** buf) {
  if (flags & H5Z_FLAG_REVERSE) {
    const unsigned long long size = ZSTD_getFrameContentSize(*buf, nbytes);
    if (size == ZSTD_CONTENTSIZE_ERROR || size == ZSTD_CONTENTSIZE_UNKNOWN) return 0;
    if (expected_chunk_bytes != 0 && size != expected_chunk_bytes) return 0;
    void* out = H5allocate_memory(static_cast<size_t>(size), false);
    if (!out) return 0;
    const size_t got = ZSTD_decompress(out, static_cast<size_t>(size), *buf, nbytes);
    if (ZSTD_isError(got) || got != size) {
      H5free_memory(out);
      return 0;
    }
    H5free_memory(*buf);
    *buf = out;
    *buf_size = static_cast<size_t>(size);
    return got;
  }
  const int level = cd_nelmts > 0 ? static_cast<int>(cd_values[0]) : 3;
  const size_t cap = ZSTD_compressBound(nbytes);
  void* out = H5allocate_memory(cap, false);
  if (!out) return 0;
  const size_t got = ZSTD_compress(out, cap, *buf, nbytes, level);
  if (ZSTD_isError(got)) {
    H5free_memory(out);
    return 0;
  }
  H5free_memory(*buf);
  *buf = out;
  *buf_size = cap;
  return got;
}

}  // namespace ckpt::h5
