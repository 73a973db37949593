// Private HDF5 helpers for the universal layout: RAII handles, string attributes and the
// selection of a flat element range in a row-major dataset. (ckpt's own helpers are private
// to the format library, so convert keeps this small set.)
#pragma once

#include <hdf5.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "ckpt/dtype.h"
#include "ckpt/status.h"

namespace ckpt::convert::h5 {

// Silences HDF5's automatic error printing for the calling thread. Cheap; call at entry points.
void Init();
// The innermost message on HDF5's error stack for this thread, or "" if empty.
std::string ErrorText();

// Move-only owner of an hid_t.
class Handle {
 public:
  using Closer = herr_t (*)(hid_t);
  Handle() = default;
  Handle(hid_t id, Closer closer) : id_(id), closer_(closer) {}
  Handle(Handle&& o) noexcept : id_(std::exchange(o.id_, H5I_INVALID_HID)), closer_(o.closer_) {}
  Handle& operator=(Handle&& o) noexcept {
    if (this != &o) {
      Reset();
      id_ = std::exchange(o.id_, H5I_INVALID_HID);
      closer_ = o.closer_;
    }
    return *this;
  }
  Handle(const Handle&) = delete;
  Handle& operator=(const Handle&) = delete;
  ~Handle() { Reset(); }
  hid_t get() const { return id_; }
  bool valid() const { return id_ >= 0; }
  // Closes now and reports failure (H5Fclose flushes, so a full disk shows up here).
  Status Close(const std::string& what);

 private:
  void Reset() {
    if (id_ >= 0 && closer_) closer_(id_);
    id_ = H5I_INVALID_HID;
  }
  hid_t id_ = H5I_INVALID_HID;
  Closer closer_ = nullptr;
};

inline Handle File(hid_t id) { return Handle(id, H5Fclose); }
inline Handle Dataset(hid_t id) { return Handle(id, H5Dclose); }
inline Handle Space(hid_t id) { return Handle(id, H5Sclose); }
inline Handle Type(hid_t id) { return Handle(id, H5Tclose); }
inline Handle Plist(hid_t id) { return Handle(id, H5Pclose); }
inline Handle Attr(hid_t id) { return Handle(id, H5Aclose); }
inline Handle Group(hid_t id) { return Handle(id, H5Gclose); }

// File (little-endian) and memory types of a ckpt dtype; bf16/fp16 are stored as uint16.
hid_t FileType(DType t);
hid_t MemType(DType t);

Status WriteStringAttr(hid_t obj, const char* name, const std::string& value);
Status WriteIntAttr(hid_t obj, const char* name, int64_t value);
// NotFound when absent.
Result<std::string> ReadStringAttr(hid_t obj, const char* name);

// Dataspace of `shape` (scalar when shape is empty).
Handle SpaceFor(const std::vector<int64_t>& shape);

// Selects the row-major flat elements [begin, end) of a dataset of `shape` in `space`, as a
// union of at most 2 × rank hyperslabs (elements stay in flat order).
Status SelectFlatRange(hid_t space, const std::vector<int64_t>& shape, int64_t begin, int64_t end);

}  // namespace ckpt::convert::h5
