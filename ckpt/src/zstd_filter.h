// Private: the HDF5 zstd filter callback (registered filter id 32015). The library registers
// it in-process (h5.cc); plugin/h5zstd_plugin.cc exports it as an HDF5 plugin so h5py and
// the HDF5 tools read compressed ckpt files with HDF5_PLUGIN_PATH=build/lib/hdf5-plugins.
#pragma once

#include <hdf5.h>

namespace ckpt::h5 {

// Each chunk is one zstd frame holding its content size; cd_values[0] is the level when
// present. Same on-disk form as hdf5plugin's Zstd filter.
size_t ZstdFilterCallback(unsigned int flags, size_t cd_nelmts, const unsigned int cd_values[],
                          size_t nbytes, size_t* buf_size, void** buf);

}  // namespace ckpt::h5
