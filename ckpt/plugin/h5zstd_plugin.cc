// HDF5 dynamic filter plugin for zstd (filter id 32015), so that h5py, h5dump and other HDF5
// programs read compressed ckpt rank files: HDF5_PLUGIN_PATH=<build>/lib/hdf5-plugins.
// Debian's hdf5plugin package ships no zstd filter; this one is ours.
#include <H5PLextern.h>

#include "../src/zstd_filter.h"

namespace {
const H5Z_class2_t kZstdPluginClass = {
    H5Z_CLASS_T_VERS, 32015, 1, 1, "zstd", nullptr, nullptr, ckpt::h5::ZstdFilterCallback,
};
}  // namespace

extern "C" {
H5PL_type_t H5PLget_plugin_type(void) { return H5PL_TYPE_FILTER; }
const void* H5PLget_plugin_info(void) { return &kZstdPluginClass; }
}
