#include "h5.h"

#include "ckpt/writer.h"

#include "zstd_filter.h"

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

}  // namespace ckpt::h5

namespace ckpt {

void DisableHdf5ExitCleanup() { H5dont_atexit(); }

}  // namespace ckpt

namespace ckpt::h5 {

std::string ErrorText() {
  std::string msg;
  H5Ewalk2(H5E_DEFAULT, H5E_WALK_DOWNWARD, CollectMessage, &msg);
  H5Eclear2(H5E_DEFAULT);
  return msg.empty() ? "HDF5 error" : msg;
}

}  // namespace ckpt::h5
