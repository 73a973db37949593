#include "h5.h"

#include <zstd.h>

#include <mutex>

namespace ckpt::h5 {

namespace {

// The zstd filter as hdf5plugin implements it: each chunk is one zstd frame; cd_values[0] is
// the compression level when present.
size_t ZstdFilter(unsigned int flags, size_t cd_nelmts, const unsigned int cd_values[],
                  size_t nbytes, size_t* buf_size, void** buf) {
  if (flags & H5Z_FLAG_REVERSE) {
    unsigned long long size = ZSTD_getFrameContentSize(*buf, nbytes);
    if (size == ZSTD_CONTENTSIZE_ERROR || size == ZSTD_CONTENTSIZE_UNKNOWN) return 0;
    void* out = H5allocate_memory(static_cast<size_t>(size), false);
    if (!out) return 0;
    size_t got = ZSTD_decompress(out, static_cast<size_t>(size), *buf, nbytes);
    if (ZSTD_isError(got) || got != size) {
      H5free_memory(out);
      return 0;
    }
    H5free_memory(*buf);
    *buf = out;
    *buf_size = static_cast<size_t>(size);
    return got;
  }
  int level = cd_nelmts > 0 ? static_cast<int>(cd_values[0]) : 3;
  size_t cap = ZSTD_compressBound(nbytes);
  void* out = H5allocate_memory(cap, false);
  if (!out) return 0;
  size_t got = ZSTD_compress(out, cap, *buf, nbytes, level);
  if (ZSTD_isError(got)) {
    H5free_memory(out);
    return 0;
  }
  H5free_memory(*buf);
  *buf = out;
  *buf_size = cap;
  return got;
}

const H5Z_class2_t kZstdClass = {
    H5Z_CLASS_T_VERS, kZstdFilterId, 1, 1, "zstd", nullptr, nullptr, ZstdFilter,
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
    if (H5Zfilter_avail(kZstdFilterId) <= 0) H5Zregister(&kZstdClass);
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
  return msg.empty() ? "HDF5 error" : msg;
}

}  // namespace ckpt::h5
