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

// While one is alive, the calling thread's reads through the filter accept only frames that
// decompress to exactly `bytes` (the dataset's chunk size; after shuffle too, which keeps the
// size). HDF5 takes a filter's output length on trust and copies a whole chunk out of it, so a
// corrupt frame announcing fewer bytes made H5Dread read past the buffer (the heap overflow
// fuzz_rank_file found); a larger one is refused before it is allocated.
class ExpectChunkBytes {
 public:
  explicit ExpectChunkBytes(size_t bytes);
  ~ExpectChunkBytes();
  ExpectChunkBytes(const ExpectChunkBytes&) = delete;
  ExpectChunkBytes& operator=(const ExpectChunkBytes&) = delete;

 private:
  size_t previous_;
};

// The bytes of one chunk of the open dataset `dset` (its element size when it is not chunked),
// what a reader through the filter sets ExpectChunkBytes to; 0 when the dataset's type or chunk
// dimensions cannot be read or their product overflows.
size_t ChunkBytes(hid_t dset);

}  // namespace ckpt::h5
