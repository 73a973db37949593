// Dataspaces of the universal layout: the space of a full-shape dataset and the selection of a
// flat element range in it, over the format library's HDF5 helpers (ckpt/h5.h).
#pragma once

#include <hdf5.h>

#include <cstdint>
#include <vector>

#include "ckpt/status.h"
#include "ckpt/h5.h"

namespace ckpt::convert {

// Dataspace of `shape` (scalar when shape is empty).
h5::Handle SpaceFor(const std::vector<int64_t>& shape);

// Selects the row-major flat elements [begin, end) of a dataset of `shape` in `space`, as a
// union of at most 2 × rank hyperslabs (elements stay in flat order).
Status SelectFlatRange(hid_t space, const std::vector<int64_t>& shape, int64_t begin, int64_t end);

}  // namespace ckpt::convert
