// A restricted reader for the pickle inside a PyTorch `.pt` zip archive (torch.save, protocol
// 2; protocols 0-5 parse too). It never executes anything: no Python, no import, no call.
//  - Tensors are rebuilt from their persistent storage ids and torch._utils._rebuild_tensor_v2
//    (and _rebuild_tensor, _rebuild_parameter): a TensorRef naming the archive record, dtype,
//    storage offset, shape and strides. No tensor data is read here (see TorchArchive).
//  - Plain containers are built: dict, list, tuple, set, frozenset, collections.OrderedDict,
//    torch.Size, bytes (also protocol 2's _codecs.encode(str, "latin1") form).
//  - Any other global becomes an inert record of its module and name; calling it (REDUCE,
//    NEWOBJ, OBJ, INST) makes an inert object holding the arguments, and BUILD stores the state
//    in it. So DeepSpeed's LossScaler, argparse.Namespace or an enum read as data.
//  - Globals that exist to run code (builtins.eval/exec/getattr/__import__, os.*, posix.*,
//    subprocess.*, sys.*, importlib.*, pickle.*, shutil.*, socket.*, torch functions other
//    than the rebuild helpers, ...) are refused: DataLoss naming the source and the global.
// docs/deepspeed.md, "Reading .pt files without executing them", is the description.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "ckpt/dtype.h"
#include "ckpt/status.h"

namespace ckpt {

// A tensor as the pickle describes it: elements [offset, ...) of storage record `key`
// (archive entry "<prefix>/data/<key>") viewed with `shape` and `stride` (in elements).
struct TorchTensorRef {
  std::string key;
  std::string dtype_name;        // "fp32", "bf16", "int8", "bool", ...
  std::optional<DType> dtype;    // when ckpt has the type
  size_t itemsize = 0;
  int64_t storage_numel = 0;     // as the persistent id states it
  int64_t offset = 0;
  std::vector<int64_t> shape;
  std::vector<int64_t> stride;
  int64_t numel() const;
  bool contiguous() const;  // row-major with no gaps
};

struct PyValue {
  enum class Kind : uint8_t {
    kNone, kBool, kInt, kBigInt, kFloat, kStr, kBytes,
    kList, kTuple, kDict, kSet,
    kGlobal,   // an inert reference to module.name (not called)
    kObject,   // an inert instance: module.name called with args, state from BUILD
    kTensor,
    kStorage,  // a persistent storage id, before _rebuild_tensor_v2 uses it
  };
  Kind kind = Kind::kNone;
  bool b = false;
  int64_t i = 0;
  double f = 0;
  std::string s;                     // str, bytes, big int (decimal text); global: "module.name"
  std::vector<PyValue*> items;       // list, tuple, set; object: the call's arguments
  std::vector<std::pair<PyValue*, PyValue*>> entries;  // dict in insertion order; object: state
  PyValue* state = nullptr;          // object: a non-dict BUILD state
  int tensor = -1;                   // tensor / storage: index into PickleDoc::tensors()

  bool is_none() const { return kind == Kind::kNone; }
  bool is_str() const { return kind == Kind::kStr; }
  bool is_sequence() const { return kind == Kind::kList || kind == Kind::kTuple; }
  bool is_dict() const { return kind == Kind::kDict; }
  // Dict entry with a str key (objects: their BUILD state dict), or nullptr.
  const PyValue* Get(std::string_view key) const;
  // int, bool, an int-valued float, or an int enum (an object whose first argument is an int).
  std::optional<int64_t> AsInt() const;
  std::optional<double> AsDouble() const;  // int, float or bool
};

// Owns every value of one parsed pickle; values point at each other (the memo may share them,
// and a container may even hold itself), so walking code must bound its depth.
class PickleDoc {
 public:
  PickleDoc() = default;
  PickleDoc(PickleDoc&&) noexcept = default;
  PickleDoc& operator=(PickleDoc&&) noexcept = default;

  const PyValue& root() const { return *root_; }
  const std::vector<TorchTensorRef>& tensors() const { return tensors_; }

 private:
  friend class PickleParser;
  std::vector<std::unique_ptr<PyValue>> arena_;
  std::vector<TorchTensorRef> tensors_;
  PyValue* root_ = nullptr;
};

struct PickleLimits {
  size_t max_values = 1u << 24;  // values created (each opcode makes at most one)
  int max_dims = 64;             // tensor rank
};

// Parses `data` (a data.pkl record). `source` names the file in errors. DataLoss for a
// malformed pickle, a refused global, an unsupported opcode (extension codes, out-of-band
// buffers), a tensor whose view does not fit its storage, or a storage size overflow.
Result<PickleDoc> ParsePickle(std::string_view data, std::string_view source,
                              const PickleLimits& limits = {});

// A JSON rendering for reports and for carrying small state (scheduler, client state) into
// ckpt manifests: containers as arrays/objects (non-str dict keys as their JSON text), tensors
// as {"tensor": {"dtype", "shape"}}, bytes as {"bytes": size}, inert objects as
// {"class": "module.name", "args": [...], "state": ...}. Depth beyond max_depth becomes "...".
nlohmann::json PyToJson(const PickleDoc& doc, const PyValue& v, int max_depth = 16);

}  // namespace ckpt
