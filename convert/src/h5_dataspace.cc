#include "h5_dataspace.h"

#include <algorithm>

namespace ckpt::convert {

h5::Handle SpaceFor(const std::vector<int64_t>& shape) {
  if (shape.empty()) return h5::Space(H5Screate(H5S_SCALAR));
  std::vector<hsize_t> dims(shape.begin(), shape.end());
  return h5::Space(H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr));
}

Status SelectFlatRange(hid_t space, const std::vector<int64_t>& shape, int64_t begin, int64_t end) {
  const size_t nd = shape.size();
  if (nd == 0) {
    if (!(begin == 0 && end == 1)) return Internal("scalar range must be [0, 1)");
    if (H5Sselect_all(space) < 0) return Internal("select: " + h5::ErrorText());
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
      return Internal("select hyperslab: " + h5::ErrorText());
    first = false;
    b += n * stride[k];
  }
  if (first && H5Sselect_none(space) < 0) return Internal("select none: " + h5::ErrorText());
  return Status::Ok();
}

}  // namespace ckpt::convert
