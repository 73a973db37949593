// The restricted unpickler (ckpt/torch_pickle.h). A stack machine over the opcodes of pickle
// protocols 0-5 (Python's Lib/pickletools.py documents them) in which every "call" is looked
// up in a fixed table: tensor rebuilds and plain containers are constructed, globals that run
// code are refused, anything else becomes an inert record. Every length is checked against the
// bytes that remain before anything is allocated.
#include "ckpt/torch_pickle.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <set>
#include <unordered_map>

#include "ckpt/shape.h"

namespace ckpt {
namespace {

using Kind = PyValue::Kind;

struct StorageType {
  std::string_view name;
  std::string_view dtype_name;
  std::optional<DType> dtype;
  size_t itemsize;
};

// torch.<X>Storage as torch.save names a typed storage's element type.
constexpr StorageType kStorageTypes[] = {
    {"FloatStorage", "fp32", DType::kF32, 4},     {"DoubleStorage", "fp64", DType::kF64, 8},
    {"HalfStorage", "fp16", DType::kF16, 2},      {"BFloat16Storage", "bf16", DType::kBF16, 2},
    {"LongStorage", "int64", DType::kI64, 8},     {"IntStorage", "int32", DType::kI32, 4},
    {"ShortStorage", "int16", std::nullopt, 2},   {"CharStorage", "int8", std::nullopt, 1},
    {"ByteStorage", "uint8", DType::kU8, 1},      {"BoolStorage", "bool", std::nullopt, 1},
    {"UntypedStorage", "uint8", DType::kU8, 1},   {"ComplexFloatStorage", "complex64", std::nullopt, 8},
    {"ComplexDoubleStorage", "complex128", std::nullopt, 16},
};

const StorageType* FindStorageType(std::string_view global) {
  // "torch.FloatStorage", "torch.storage.UntypedStorage", "torch.cuda.FloatStorage"
  const size_t dot = global.rfind('.');
  if (dot == std::string_view::npos || global.substr(0, 6) != "torch.") return nullptr;
  const std::string_view name = global.substr(dot + 1);
  for (const auto& t : kStorageTypes)
    if (t.name == name) return &t;
  return nullptr;
}

// Modules whose every global exists to run code, import, or touch the system.
constexpr std::string_view kRefusedModules[] = {
    "os", "posix", "nt", "posixpath", "ntpath", "subprocess", "sys", "importlib", "pickle",
    "_pickle", "marshal", "shutil", "socket", "runpy", "code", "codeop", "pty", "ctypes",
    "types", "functools", "operator", "io", "_io", "webbrowser", "multiprocessing",
    "threading", "_thread", "signal", "pdb", "inspect", "platform", "tempfile", "pathlib",
    "glob", "asyncio", "commands", "popen2", "timeit", "trace", "profile", "cProfile",
    "pydoc", "site", "zipimport", "gc", "resource", "fcntl", "mmap", "urllib", "http",
    "ftplib", "smtplib", "telnetlib", "xmlrpc", "dill", "cloudpickle", "numpy.testing",
    "torch.hub", "torch.jit", "torch.ops", "torch._ops", "torch.package", "torch.serialization",
    "torch.utils.cpp_extension", "torch.cuda"};

// builtins whose "call" is only a container constructor.
constexpr std::string_view kBuiltinContainers[] = {
    "set", "frozenset", "list", "dict", "tuple", "bytearray", "bytes", "object", "slice",
    "complex", "int", "float", "str", "bool", "range"};

// torch functions (lower-case names) that only rebuild data.
constexpr std::string_view kTorchData[] = {
    "torch._utils._rebuild_tensor", "torch._utils._rebuild_tensor_v2",
    "torch._utils._rebuild_parameter", "torch._utils._rebuild_parameter_with_state",
    "torch.device", "torch.Size", "torch.float32", "torch.float", "torch.float64",
    "torch.double", "torch.float16", "torch.half", "torch.bfloat16", "torch.int64",
    "torch.long", "torch.int32", "torch.int", "torch.int16", "torch.short", "torch.int8",
    "torch.uint8", "torch.bool", "torch.complex64", "torch.complex128"};

bool ModuleIn(std::string_view module, std::string_view root) {
  return module == root ||
         (module.size() > root.size() && module.substr(0, root.size()) == root &&
          module[root.size()] == '.');
}

// Empty when module.name may appear; otherwise why it is refused.
std::string RefusalFor(std::string_view module, std::string_view name) {
  const std::string full = std::string(module) + "." + std::string(name);
  if (module == "builtins" || module == "__builtin__" || module == "exceptions") {
    for (auto ok : kBuiltinContainers)
      if (name == ok) return "";
    // Python 3.11+ pickles an enum member as getattr(EnumClass, "member"); Call() accepts only
    // that form and yields an inert reference.
    if (name == "getattr") return "";
    return "a Python builtin that can run code";
  }
  for (auto m : kRefusedModules)
    if (ModuleIn(module, m)) return "a global from module '" + std::string(m) + "'";
  if (module == "copyreg" || module == "copy_reg")
    return name == "_reconstructor" ? "" : "a copyreg helper that calls functions";
  if (module == "_codecs") return name == "encode" ? "" : "a codec function";
  if (ModuleIn(module, "torch")) {
    for (auto ok : kTorchData)
      if (full == ok) return "";
    if (FindStorageType(full)) return "";
    // Classes (CamelCase) are recorded inertly; lower-case names are torch functions.
    if (!name.empty() && name[0] >= 'A' && name[0] <= 'Z') return "";
    return "a torch function other than the tensor rebuild helpers";
  }
  if (!name.empty() && (name.find("__") == 0)) return "a dunder attribute";
  return "";
}

bool CheckedMulAdd(int64_t a, int64_t b, int64_t c, int64_t* out) {
  // *out = a * b + c without overflow; all non-negative.
  if (a < 0 || b < 0 || c < 0) return false;
  if (b != 0 && a > (std::numeric_limits<int64_t>::max() - c) / b) return false;
  *out = a * b + c;
  return true;
}

}  // namespace

int64_t TorchTensorRef::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

bool TorchTensorRef::contiguous() const {
  int64_t expect = 1;
  for (size_t k = shape.size(); k-- > 0;) {
    if (shape[k] != 1 && stride[k] != expect) return false;
    expect *= shape[k];
  }
  return true;
}

const PyValue* PyValue::Get(std::string_view key) const {
  if (kind != Kind::kDict && kind != Kind::kObject) return nullptr;
  const PyValue* found = nullptr;  // the last value set for the key, as in Python
  for (const auto& [k, v] : entries)
    if (k && k->kind == Kind::kStr && k->s == key) found = v;
  return found;
}

std::optional<int64_t> PyValue::AsInt() const {
  switch (kind) {
    case Kind::kInt:
      return i;
    case Kind::kBool:
      return b ? 1 : 0;
    case Kind::kFloat:
      if (std::isfinite(f) && f == std::floor(f) && std::fabs(f) < 9.0e18)
        return static_cast<int64_t>(f);
      return std::nullopt;
    case Kind::kObject:  // an IntEnum member: Enum(value)
      if (!items.empty() && items[0] && items[0]->kind == Kind::kInt) return items[0]->i;
      return std::nullopt;
    default:
      return std::nullopt;
  }
}

std::optional<double> PyValue::AsDouble() const {
  if (kind == Kind::kFloat) return f;
  if (kind == Kind::kInt) return static_cast<double>(i);
  if (kind == Kind::kBool) return b ? 1.0 : 0.0;
  return std::nullopt;
}

class PickleParser {
 public:
  PickleParser(std::string_view data, std::string_view source, const PickleLimits& limits)
      : data_(data), source_(source), limits_(limits) {}

  Result<PickleDoc> Run() {
    while (true) {
      if (pos_ >= data_.size()) return Fail("ends without STOP");
      const size_t at = pos_;
      const uint8_t op = static_cast<uint8_t>(data_[pos_++]);
      Status s = Step(op);
      if (!s.ok()) return s.WithContext(source_ + ": pickle opcode 0x" + Hex(op) + " at byte " +
                                        std::to_string(at));
      if (done_) break;
    }
    return std::move(doc_);
  }

 private:
  static std::string Hex(uint8_t b) {
    const char* d = "0123456789abcdef";
    return {d[b >> 4], d[b & 15]};
  }
  Status Fail(std::string what) const { return DataLoss(source_ + ": pickle " + what); }
  static Status Bad(std::string what) { return DataLoss(std::move(what)); }

  Result<PyValue*> New(Kind k) {
    if (doc_.arena_.size() >= limits_.max_values) return Bad("more values than the limit");
    doc_.arena_.push_back(std::make_unique<PyValue>());
    doc_.arena_.back()->kind = k;
    return doc_.arena_.back().get();
  }

  // Container copies (constructors over an existing sequence, BUILD states) can repeat one
  // large memoized value many times; they draw on a budget of max_values × 4 slots.
  Status Charge(size_t n) {
    copied_ += n;
    if (copied_ > limits_.max_values * 4) return Bad("containers copied beyond the limit");
    return Status::Ok();
  }

  Status Push(Result<PyValue*> v) {
    if (!v.ok()) return v.status();
    stack_.push_back(*v);
    return Status::Ok();
  }

  Result<PyValue*> Pop() {
    if (stack_.size() <= Floor()) return Bad("stack underflow");
    PyValue* v = stack_.back();
    stack_.pop_back();
    return v;
  }
  size_t Floor() const { return marks_.empty() ? 0 : marks_.back(); }

  Result<std::vector<PyValue*>> PopMark() {
    if (marks_.empty()) return Bad("no MARK on the stack");
    const size_t m = marks_.back();
    marks_.pop_back();
    std::vector<PyValue*> items(stack_.begin() + static_cast<std::ptrdiff_t>(m), stack_.end());
    stack_.resize(m);
    return items;
  }

  Result<std::string_view> Take(uint64_t n) {
    if (n > data_.size() - pos_) return Bad("truncated: needs " + std::to_string(n) + " bytes");
    std::string_view s = data_.substr(pos_, static_cast<size_t>(n));
    pos_ += static_cast<size_t>(n);
    return s;
  }
  Result<uint64_t> Uint(int bytes) {
    CKPT_ASSIGN_OR_RETURN(auto s, Take(static_cast<uint64_t>(bytes)), "");
    uint64_t v = 0;
    for (int k = bytes - 1; k >= 0; --k) v = (v << 8) | static_cast<uint8_t>(s[static_cast<size_t>(k)]);
    return v;
  }
  Result<std::string_view> Line() {
    const size_t nl = data_.find('\n', pos_);
    if (nl == std::string_view::npos) return Bad("truncated: line without newline");
    std::string_view s = data_.substr(pos_, nl - pos_);
    pos_ = nl + 1;
    return s;
  }

  Status PushInt(int64_t v) {
    CKPT_ASSIGN_OR_RETURN(PyValue * p, New(Kind::kInt), "");
    p->i = v;
    stack_.push_back(p);
    return Status::Ok();
  }
  Status PushStr(Kind k, std::string_view s) {
    CKPT_ASSIGN_OR_RETURN(PyValue * p, New(k), "");
    p->s.assign(s);
    stack_.push_back(p);
    return Status::Ok();
  }
  Status PushTextInt(std::string_view t) {
    if (!t.empty() && t.back() == 'L') t.remove_suffix(1);
    if (t == "00") return PushBool(false);
    if (t == "01") return PushBool(true);
    if (t.empty() || t.size() > 40) return Bad("bad integer text");
    errno = 0;
    char* end = nullptr;
    const std::string text(t);
    const long long v = std::strtoll(text.c_str(), &end, 10);
    if (end != text.c_str() + text.size()) return Bad("bad integer text");
    if (errno == ERANGE) return PushStr(Kind::kBigInt, t);
    return PushInt(v);
  }
  Status PushBool(bool b) {
    CKPT_ASSIGN_OR_RETURN(PyValue * p, New(Kind::kBool), "");
    p->b = b;
    stack_.push_back(p);
    return Status::Ok();
  }
  Status PushLong(std::string_view bytes) {
    // Two's complement little-endian.
    if (bytes.empty()) return PushInt(0);
    const bool neg = static_cast<uint8_t>(bytes.back()) & 0x80;
    size_t n = bytes.size();
    // Drop redundant sign-extension bytes.
    while (n > 1 && static_cast<uint8_t>(bytes[n - 1]) == (neg ? 0xff : 0x00) &&
           ((static_cast<uint8_t>(bytes[n - 2]) & 0x80) != 0) == neg)
      --n;
    if (n > 8) {
      std::string hex = "0x";
      for (size_t k = bytes.size(); k-- > 0;) hex += Hex(static_cast<uint8_t>(bytes[k]));
      return PushStr(Kind::kBigInt, hex);
    }
    uint64_t u = neg ? ~uint64_t{0} : 0;
    for (size_t k = 0; k < n; ++k) {
      u &= ~(uint64_t{0xff} << (8 * k));
      u |= uint64_t{static_cast<uint8_t>(bytes[k])} << (8 * k);
    }
    int64_t v;
    std::memcpy(&v, &u, 8);
    return PushInt(v);
  }

  // DataLoss naming module.name when RefusalFor refuses it (a global or getattr's member).
  static Status Allowed(const std::string& module, const std::string& name) {
    const std::string why = RefusalFor(module, name);
    if (why.empty()) return Status::Ok();
    return Bad("refers to " + Excerpt(module, 80) + "." + Excerpt(name, 80) + " (" + why +
               "); ckpt never runs code from a checkpoint, so the file is refused");
  }

  Status Global(std::string module, std::string name) {
    CKPT_RETURN_IF_ERROR(Allowed(module, name), "");
    return PushStr(Kind::kGlobal, module + "." + name);
  }

  // module.name(*args) without running anything.
  Result<PyValue*> Call(PyValue* callable, std::vector<PyValue*> args) {
    if (!callable || callable->kind != Kind::kGlobal)
      return Bad("calls a value that is not a class or allowed function");
    const std::string& g = callable->s;
    if (g == "torch._utils._rebuild_tensor_v2" || g == "torch._utils._rebuild_tensor")
      return RebuildTensor(args);
    if (g == "torch._utils._rebuild_parameter" || g == "torch._utils._rebuild_parameter_with_state") {
      if (args.empty() || !args[0] || args[0]->kind != Kind::kTensor)
        return Bad(Excerpt(g, 120) + " without a tensor");
      return args[0];
    }
    if (g == "collections.OrderedDict" || g == "builtins.dict" || g == "__builtin__.dict") {
      CKPT_ASSIGN_OR_RETURN(PyValue * d, New(Kind::kDict), "");
      if (!args.empty() && args[0] && args[0]->is_sequence()) {
        CKPT_RETURN_IF_ERROR(Charge(args[0]->items.size()), "");
        for (PyValue* pair : args[0]->items) {
          if (!pair || !pair->is_sequence() || pair->items.size() != 2)
            return Bad(Excerpt(g, 120) + " with an item that is not a pair");
          d->entries.emplace_back(pair->items[0], pair->items[1]);
        }
      }
      return d;
    }
    if (g == "builtins.set" || g == "__builtin__.set" || g == "builtins.frozenset" ||
        g == "__builtin__.frozenset" || g == "builtins.list" || g == "__builtin__.list" ||
        g == "builtins.tuple" || g == "__builtin__.tuple" || g == "torch.Size") {
      const Kind k = g.find("set") != std::string::npos ? Kind::kSet
                     : g.find("list") != std::string::npos ? Kind::kList
                                                           : Kind::kTuple;
      CKPT_ASSIGN_OR_RETURN(PyValue * c, New(k), "");
      if (!args.empty() && args[0] &&
          (args[0]->is_sequence() || args[0]->kind == Kind::kSet)) {
        CKPT_RETURN_IF_ERROR(Charge(args[0]->items.size()), "");
        c->items = args[0]->items;
      }
      return c;
    }
    if (g == "_codecs.encode" || g == "builtins.bytes" || g == "__builtin__.bytes" ||
        g == "builtins.bytearray" || g == "__builtin__.bytearray") {
      CKPT_ASSIGN_OR_RETURN(PyValue * b, New(Kind::kBytes), "");
      if (!args.empty() && args[0] && args[0]->kind == Kind::kStr) {
        // protocol 2 writes bytes as encode(latin-1 text): code points 0..255 -> bytes.
        CKPT_RETURN_IF_ERROR(Latin1(args[0]->s, &b->s), g);
      } else if (!args.empty() && args[0] && args[0]->kind == Kind::kBytes) {
        b->s = args[0]->s;
      }
      return b;
    }
    if (g == "builtins.getattr" || g == "__builtin__.getattr") {
      // getattr(<a global>, "name"): an inert reference to the attribute, nothing is looked up.
      if (args.size() != 2 || !args[0] || args[0]->kind != Kind::kGlobal || !args[1] ||
          !args[1]->is_str() || args[1]->s.empty() || args[1]->s.find('.') != std::string::npos)
        return Bad("getattr is only read as getattr(<class>, \"<member>\") (an enum member)");
      CKPT_RETURN_IF_ERROR(Allowed(args[0]->s, args[1]->s), "");
      CKPT_ASSIGN_OR_RETURN(PyValue * a, New(Kind::kGlobal), "");
      a->s = args[0]->s + "." + args[1]->s;
      return a;
    }
    if (g == "copyreg._reconstructor" || g == "copy_reg._reconstructor") {
      // _reconstructor(cls, base, state): an instance of cls.
      if (args.empty() || !args[0] || args[0]->kind != Kind::kGlobal)
        return Bad("copyreg._reconstructor without a class");
      CKPT_ASSIGN_OR_RETURN(PyValue * o, New(Kind::kObject), "");
      o->s = args[0]->s;
      return o;
    }
    CKPT_ASSIGN_OR_RETURN(PyValue * o, New(Kind::kObject), "");
    o->s = g;
    o->items = std::move(args);
    return o;
  }

  static Status Latin1(const std::string& utf8, std::string* out) {
    for (size_t k = 0; k < utf8.size();) {
      const uint8_t c = static_cast<uint8_t>(utf8[k]);
      if (c < 0x80) {
        out->push_back(static_cast<char>(c));
        k += 1;
      } else if ((c & 0xe0) == 0xc0 && k + 1 < utf8.size()) {
        const uint32_t cp = ((c & 0x1fu) << 6) | (static_cast<uint8_t>(utf8[k + 1]) & 0x3fu);
        if (cp > 0xff) return Bad("latin-1 text with a code point above 255");
        out->push_back(static_cast<char>(cp));
        k += 2;
      } else {
        return Bad("latin-1 text with a code point above 255");
      }
    }
    return Status::Ok();
  }

  static Result<std::vector<int64_t>> Ints(const PyValue* v, const char* what) {
    if (!v || !v->is_sequence()) return Bad(std::string("tensor ") + what + " is not a tuple");
    std::vector<int64_t> out;
    for (const PyValue* e : v->items) {
      if (!e || e->kind != Kind::kInt || e->i < 0)
        return Bad(std::string("tensor ") + what + " holds a value that is not a size");
      out.push_back(e->i);
    }
    return out;
  }

  Result<PyValue*> RebuildTensor(const std::vector<PyValue*>& args) {
    if (args.size() < 4) return Bad("tensor rebuild with fewer than 4 arguments");
    const PyValue* storage = args[0];
    if (!storage || storage->kind != Kind::kStorage) return Bad("tensor rebuild without a storage");
    if (!args[1] || args[1]->kind != Kind::kInt || args[1]->i < 0)
      return Bad("tensor storage offset is not a non-negative int");
    CKPT_ASSIGN_OR_RETURN(auto shape, Ints(args[2], "size"), "");
    CKPT_ASSIGN_OR_RETURN(auto stride, Ints(args[3], "stride"), "");
    if (shape.size() != stride.size()) return Bad("tensor size and stride differ in rank");
    if (static_cast<int>(shape.size()) > limits_.max_dims) return Bad("tensor rank over the limit");
    TorchTensorRef t = doc_.tensors_[static_cast<size_t>(storage->tensor)];
    t.offset = args[1]->i;
    t.shape = std::move(shape);
    t.stride = std::move(stride);
    // The view must fit: offset + sum((size_k - 1) * stride_k) < storage numel.
    int64_t numel = 1;
    bool empty = false;
    for (int64_t d : t.shape) {
      if (d == 0) empty = true;
      if (!CheckedMulAdd(numel, d, 0, &numel)) return Bad("tensor numel overflows");
    }
    if (!empty) {
      int64_t last = t.offset;
      for (size_t k = 0; k < t.shape.size(); ++k)
        if (!CheckedMulAdd(t.shape[k] - 1, t.stride[k], last, &last))
          return Bad("tensor extent overflows");
      if (last >= t.storage_numel)
        return Bad("tensor view (offset " + std::to_string(t.offset) + ", shape " +
                   ShapeText(t.shape) + ") needs element " + std::to_string(last) +
                   " of storage '" + Excerpt(t.key, 40) + "', which holds " +
                   std::to_string(t.storage_numel));
    }
    CKPT_ASSIGN_OR_RETURN(PyValue * v, New(Kind::kTensor), "");
    v->tensor = static_cast<int>(doc_.tensors_.size());
    doc_.tensors_.push_back(std::move(t));
    return v;
  }

  Result<PyValue*> PersistentStorage(const PyValue* pid) {
    // ('storage', torch.<X>Storage, key, location, numel)
    if (!pid || pid->kind != Kind::kTuple || pid->items.size() != 5 || !pid->items[0] ||
        pid->items[0]->kind != Kind::kStr || pid->items[0]->s != "storage")
      return Bad("persistent id is not a torch storage record");
    const PyValue* type = pid->items[1];
    const PyValue* key = pid->items[2];
    const PyValue* numel = pid->items[4];
    if (!type || type->kind != Kind::kGlobal) return Bad("storage type is not a global");
    const StorageType* st = FindStorageType(type->s);
    if (!st) return Bad("unknown storage type " + Excerpt(type->s, 80));
    if (!key || key->kind != Kind::kStr || key->s.empty() || key->s.size() > 64 ||
        key->s.find('/') != std::string::npos || key->s.find("..") != std::string::npos)
      return Bad("storage key is not a record name");
    if (!numel || numel->kind != Kind::kInt || numel->i < 0)
      return Bad("storage size is not a non-negative int");
    int64_t bytes;
    if (!CheckedMulAdd(numel->i, static_cast<int64_t>(st->itemsize), 0, &bytes))
      return Bad("storage size overflows");
    TorchTensorRef t;
    t.key = key->s;
    t.dtype_name = std::string(st->dtype_name);
    t.dtype = st->dtype;
    t.itemsize = st->itemsize;
    t.storage_numel = numel->i;
    CKPT_ASSIGN_OR_RETURN(PyValue * v, New(Kind::kStorage), "");
    v->tensor = static_cast<int>(doc_.tensors_.size());
    doc_.tensors_.push_back(std::move(t));
    return v;
  }

  Status SetItems(PyValue* target, const std::vector<PyValue*>& kv) {
    if (kv.size() % 2) return Bad("SETITEMS with an odd number of values");
    if (!target || (target->kind != Kind::kDict && target->kind != Kind::kObject))
      return Bad("SETITEM on a value that is not a dict");
    // Appended in order; a repeated key is resolved by readers (PyValue::Get takes the last
    // value, as Python's dict would hold), which keeps SETITEMS linear.
    CKPT_RETURN_IF_ERROR(Charge(kv.size() / 2), "");
    for (size_t k = 0; k < kv.size(); k += 2) target->entries.emplace_back(kv[k], kv[k + 1]);
    return Status::Ok();
  }

  Status Append(PyValue* target, const std::vector<PyValue*>& items) {
    CKPT_RETURN_IF_ERROR(Charge(items.size()), "");
    if (!target || (target->kind != Kind::kList && target->kind != Kind::kSet &&
                    target->kind != Kind::kObject))
      return Bad("APPEND to a value that is not a list");
    target->items.insert(target->items.end(), items.begin(), items.end());
    return Status::Ok();
  }

  Status Build(PyValue* target, PyValue* state) {
    if (!target) return Bad("BUILD without an object");
    if (target->kind != Kind::kObject) return Status::Ok();  // e.g. tensor attributes: ignored
    // state, or (state, slotstate)
    if (state && state->kind == Kind::kTuple && state->items.size() == 2) {
      for (const PyValue* part : state->items)
        if (part && part->is_dict()) CKPT_RETURN_IF_ERROR(Charge(part->entries.size()), "");
      if (state->items[0] && state->items[0]->is_dict())
        target->entries = state->items[0]->entries;
      if (state->items[1] && state->items[1]->is_dict())
        target->entries.insert(target->entries.end(), state->items[1]->entries.begin(),
                               state->items[1]->entries.end());
      return Status::Ok();
    }
    if (state && state->is_dict()) {
      CKPT_RETURN_IF_ERROR(Charge(state->entries.size()), "");
      target->entries = state->entries;
    }
    else
      target->state = state;
    return Status::Ok();
  }

  Result<PyValue*> Memo(uint64_t idx) {
    auto it = memo_.find(idx);
    if (it == memo_.end()) return Bad("memo entry " + std::to_string(idx) + " was never stored");
    return it->second;
  }
  Status Put(uint64_t idx) {
    if (stack_.empty()) return Bad("PUT on an empty stack");
    if (memo_.size() >= limits_.max_values) return Bad("memo over the limit");
    memo_[idx] = stack_.back();
    return Status::Ok();
  }

  Status Step(uint8_t op) {
    switch (op) {
      case 0x80: {  // PROTO
        CKPT_ASSIGN_OR_RETURN(uint64_t v, Uint(1), "");
        if (v > 5) return Bad("protocol " + std::to_string(v) + " is newer than 5");
        return Status::Ok();
      }
      case 0x95: {  // FRAME
        CKPT_ASSIGN_OR_RETURN(uint64_t n, Uint(8), "");
        (void)n;
        return Status::Ok();
      }
      case '.': {  // STOP
        CKPT_ASSIGN_OR_RETURN(PyValue * v, Pop(), "");
        doc_.root_ = v;
        done_ = true;
        return Status::Ok();
      }
      case '(':
        if (marks_.size() >= limits_.max_values) return Bad("too many marks");
        marks_.push_back(stack_.size());
        return Status::Ok();
      case '0': {  // POP
        if (stack_.size() > Floor()) {
          stack_.pop_back();
          return Status::Ok();
        }
        CKPT_ASSIGN_OR_RETURN(auto discard, PopMark(), "");
        (void)discard;
        return Status::Ok();
      }
      case '1': {  // POP_MARK
        CKPT_ASSIGN_OR_RETURN(auto discard, PopMark(), "");
        (void)discard;
        return Status::Ok();
      }
      case '2':  // DUP
        if (stack_.size() <= Floor()) return Bad("DUP on an empty stack");
        stack_.push_back(stack_.back());
        return Status::Ok();
      case 'I': {
        CKPT_ASSIGN_OR_RETURN(auto t, Line(), "");
        return PushTextInt(t);
      }
      case 'J': {
        CKPT_ASSIGN_OR_RETURN(uint64_t v, Uint(4), "");
        return PushInt(static_cast<int32_t>(static_cast<uint32_t>(v)));
      }
      case 'K': {
        CKPT_ASSIGN_OR_RETURN(uint64_t v, Uint(1), "");
        return PushInt(static_cast<int64_t>(v));
      }
      case 'M': {
        CKPT_ASSIGN_OR_RETURN(uint64_t v, Uint(2), "");
        return PushInt(static_cast<int64_t>(v));
      }
      case 'L': {
        CKPT_ASSIGN_OR_RETURN(auto t, Line(), "");
        return PushTextInt(t);
      }
      case 0x8a: {  // LONG1
        CKPT_ASSIGN_OR_RETURN(uint64_t n, Uint(1), "");
        CKPT_ASSIGN_OR_RETURN(auto b, Take(n), "");
        return PushLong(b);
      }
      case 0x8b: {  // LONG4
        CKPT_ASSIGN_OR_RETURN(uint64_t n, Uint(4), "");
        if (n & 0x80000000u) return Bad("LONG4 with a negative length");
        CKPT_ASSIGN_OR_RETURN(auto b, Take(n), "");
        return PushLong(b);
      }
      case 'N':
        return Push(New(Kind::kNone));
      case 0x88:
        return PushBool(true);
      case 0x89:
        return PushBool(false);
      case 'F': {
        CKPT_ASSIGN_OR_RETURN(auto t, Line(), "");
        const std::string text(t);
        char* end = nullptr;
        const double d = std::strtod(text.c_str(), &end);
        if (text.empty() || end != text.c_str() + text.size()) return Bad("bad float text");
        CKPT_ASSIGN_OR_RETURN(PyValue * p, New(Kind::kFloat), "");
        p->f = d;
        stack_.push_back(p);
        return Status::Ok();
      }
      case 'G': {  // BINFLOAT, big-endian
        CKPT_ASSIGN_OR_RETURN(auto b, Take(8), "");
        uint64_t u = 0;
        for (char c : b) u = (u << 8) | static_cast<uint8_t>(c);
        CKPT_ASSIGN_OR_RETURN(PyValue * p, New(Kind::kFloat), "");
        std::memcpy(&p->f, &u, 8);
        stack_.push_back(p);
        return Status::Ok();
      }
      case 'S': {  // STRING: a quoted repr
        CKPT_ASSIGN_OR_RETURN(auto t, Line(), "");
        if (t.size() < 2 || (t.front() != '\'' && t.front() != '"') || t.back() != t.front())
          return Bad("STRING without quotes");
        return PushStr(Kind::kStr, t.substr(1, t.size() - 2));
      }
      case 'V': {
        CKPT_ASSIGN_OR_RETURN(auto t, Line(), "");
        return PushStr(Kind::kStr, t);
      }
      case 'T':
      case 'X':
      case 'B': {  // 4-byte length
        CKPT_ASSIGN_OR_RETURN(uint64_t n, Uint(4), "");
        CKPT_ASSIGN_OR_RETURN(auto s, Take(n), "");
        return PushStr(op == 'B' ? Kind::kBytes : Kind::kStr, s);
      }
      case 'U':
      case 0x8c:
      case 'C': {  // 1-byte length
        CKPT_ASSIGN_OR_RETURN(uint64_t n, Uint(1), "");
        CKPT_ASSIGN_OR_RETURN(auto s, Take(n), "");
        return PushStr(op == 'C' ? Kind::kBytes : Kind::kStr, s);
      }
      case 0x8d:
      case 0x8e:
      case 0x96: {  // 8-byte length: BINUNICODE8, BINBYTES8, BYTEARRAY8
        CKPT_ASSIGN_OR_RETURN(uint64_t n, Uint(8), "");
        CKPT_ASSIGN_OR_RETURN(auto s, Take(n), "");
        return PushStr(op == 0x8d ? Kind::kStr : Kind::kBytes, s);
      }
      case ']':
        return Push(New(Kind::kList));
      case ')':
        return Push(New(Kind::kTuple));
      case '}':
        return Push(New(Kind::kDict));
      case 0x8f:
        return Push(New(Kind::kSet));
      case 'a': {
        CKPT_ASSIGN_OR_RETURN(PyValue * v, Pop(), "");
        if (stack_.size() <= Floor()) return Bad("APPEND without a list");
        return Append(stack_.back(), {v});
      }
      case 'e':
      case 0x90: {  // APPENDS, ADDITEMS
        CKPT_ASSIGN_OR_RETURN(auto items, PopMark(), "");
        if (stack_.size() <= Floor()) return Bad("APPENDS without a list");
        return Append(stack_.back(), items);
      }
      case 'l':
      case 't':
      case 0x91: {  // LIST, TUPLE, FROZENSET
        CKPT_ASSIGN_OR_RETURN(auto items, PopMark(), "");
        CKPT_ASSIGN_OR_RETURN(PyValue * c,
                              New(op == 'l' ? Kind::kList : op == 't' ? Kind::kTuple : Kind::kSet),
                              "");
        c->items = std::move(items);
        stack_.push_back(c);
        return Status::Ok();
      }
      case 0x85:
      case 0x86:
      case 0x87: {  // TUPLE1..3
        const size_t n = op - 0x84;
        if (stack_.size() < Floor() + n) return Bad("TUPLE" + std::to_string(n) + " underflow");
        CKPT_ASSIGN_OR_RETURN(PyValue * c, New(Kind::kTuple), "");
        c->items.assign(stack_.end() - static_cast<std::ptrdiff_t>(n), stack_.end());
        stack_.resize(stack_.size() - n);
        stack_.push_back(c);
        return Status::Ok();
      }
      case 'd': {
        CKPT_ASSIGN_OR_RETURN(auto items, PopMark(), "");
        CKPT_ASSIGN_OR_RETURN(PyValue * d, New(Kind::kDict), "");
        CKPT_RETURN_IF_ERROR(SetItems(d, items), "");
        stack_.push_back(d);
        return Status::Ok();
      }
      case 's': {
        CKPT_ASSIGN_OR_RETURN(PyValue * v, Pop(), "");
        CKPT_ASSIGN_OR_RETURN(PyValue * k, Pop(), "");
        if (stack_.size() <= Floor()) return Bad("SETITEM without a dict");
        return SetItems(stack_.back(), {k, v});
      }
      case 'u': {
        CKPT_ASSIGN_OR_RETURN(auto items, PopMark(), "");
        if (stack_.size() <= Floor()) return Bad("SETITEMS without a dict");
        return SetItems(stack_.back(), items);
      }
      case 'g': {
        CKPT_ASSIGN_OR_RETURN(auto t, Line(), "");
        const std::string text(t);
        char* end = nullptr;
        const unsigned long long idx = std::strtoull(text.c_str(), &end, 10);
        if (text.empty() || end != text.c_str() + text.size()) return Bad("bad GET index");
        return Push(Memo(idx));
      }
      case 'h': {
        CKPT_ASSIGN_OR_RETURN(uint64_t idx, Uint(1), "");
        return Push(Memo(idx));
      }
      case 'j': {
        CKPT_ASSIGN_OR_RETURN(uint64_t idx, Uint(4), "");
        return Push(Memo(idx));
      }
      case 'p': {
        CKPT_ASSIGN_OR_RETURN(auto t, Line(), "");
        const std::string text(t);
        char* end = nullptr;
        const unsigned long long idx = std::strtoull(text.c_str(), &end, 10);
        if (text.empty() || end != text.c_str() + text.size()) return Bad("bad PUT index");
        return Put(idx);
      }
      case 'q': {
        CKPT_ASSIGN_OR_RETURN(uint64_t idx, Uint(1), "");
        return Put(idx);
      }
      case 'r': {
        CKPT_ASSIGN_OR_RETURN(uint64_t idx, Uint(4), "");
        return Put(idx);
      }
      case 0x94:  // MEMOIZE
        return Put(memo_.size());
      case 'c': {
        CKPT_ASSIGN_OR_RETURN(auto module, Line(), "");
        CKPT_ASSIGN_OR_RETURN(auto name, Line(), "");
        return Global(std::string(module), std::string(name));
      }
      case 0x93: {  // STACK_GLOBAL
        CKPT_ASSIGN_OR_RETURN(PyValue * name, Pop(), "");
        CKPT_ASSIGN_OR_RETURN(PyValue * module, Pop(), "");
        if (!name->is_str() || !module->is_str()) return Bad("STACK_GLOBAL of non-strings");
        return Global(module->s, name->s);
      }
      case 'R': {  // REDUCE
        CKPT_ASSIGN_OR_RETURN(PyValue * args, Pop(), "");
        CKPT_ASSIGN_OR_RETURN(PyValue * fn, Pop(), "");
        if (args->kind != Kind::kTuple) return Bad("REDUCE arguments are not a tuple");
        return Push(Call(fn, args->items));
      }
      case 0x81: {  // NEWOBJ: cls.__new__(cls, *args)
        CKPT_ASSIGN_OR_RETURN(PyValue * args, Pop(), "");
        CKPT_ASSIGN_OR_RETURN(PyValue * cls, Pop(), "");
        if (args->kind != Kind::kTuple) return Bad("NEWOBJ arguments are not a tuple");
        return Push(Call(cls, args->items));
      }
      case 0x92: {  // NEWOBJ_EX
        CKPT_ASSIGN_OR_RETURN(PyValue * kwargs, Pop(), "");
        CKPT_ASSIGN_OR_RETURN(PyValue * args, Pop(), "");
        CKPT_ASSIGN_OR_RETURN(PyValue * cls, Pop(), "");
        if (args->kind != Kind::kTuple || !kwargs->is_dict())
          return Bad("NEWOBJ_EX arguments are not a tuple and a dict");
        return Push(Call(cls, args->items));
      }
      case 'i': {  // INST module name: mark-delimited args
        CKPT_ASSIGN_OR_RETURN(auto module, Line(), "");
        CKPT_ASSIGN_OR_RETURN(auto name, Line(), "");
        CKPT_ASSIGN_OR_RETURN(auto args, PopMark(), "");
        CKPT_RETURN_IF_ERROR(Global(std::string(module), std::string(name)), "");
        PyValue* cls = stack_.back();
        stack_.pop_back();
        return Push(Call(cls, std::move(args)));
      }
      case 'o': {  // OBJ: mark, cls, args...
        CKPT_ASSIGN_OR_RETURN(auto items, PopMark(), "");
        if (items.empty()) return Bad("OBJ without a class");
        PyValue* cls = items.front();
        items.erase(items.begin());
        return Push(Call(cls, std::move(items)));
      }
      case 'b': {  // BUILD
        CKPT_ASSIGN_OR_RETURN(PyValue * state, Pop(), "");
        if (stack_.size() <= Floor()) return Bad("BUILD without an object");
        return Build(stack_.back(), state);
      }
      case 'P':
        return Bad("text persistent ids are not torch storages");
      case 'Q': {  // BINPERSID
        CKPT_ASSIGN_OR_RETURN(PyValue * pid, Pop(), "");
        return Push(PersistentStorage(pid));
      }
      case 0x82:
      case 0x83:
      case 0x84:
        return Bad("extension registry codes are not supported");
      case 0x97:
      case 0x98:
        return Bad("out-of-band buffers are not supported");
      default:
        return Bad("unknown opcode");
    }
  }

  std::string_view data_;
  std::string source_;
  PickleLimits limits_;
  size_t pos_ = 0;
  bool done_ = false;
  std::vector<PyValue*> stack_;
  std::vector<size_t> marks_;
  std::unordered_map<uint64_t, PyValue*> memo_;
  size_t copied_ = 0;
  PickleDoc doc_;
};

Result<PickleDoc> ParsePickle(std::string_view data, std::string_view source,
                              const PickleLimits& limits) {
  PickleParser p(data, source, limits);
  return p.Run();
}

namespace {

// Invalid UTF-8 replaced, so the JSON stays valid whatever the pickle held.
std::string Utf8Safe(const std::string& s) {
  using nlohmann::json;
  return json::parse(json(s).dump(-1, ' ', false, json::error_handler_t::replace))
      .get<std::string>();
}

// Values rendered per call: a container may hold itself many times over, so depth alone does
// not bound the work.
constexpr int kMaxJsonNodes = 100000;

nlohmann::json ToJson(const PickleDoc& doc, const PyValue* v, int depth, int max_depth,
                      int* budget) {
  using nlohmann::json;
  if (!v) return nullptr;
  if (depth > max_depth || --*budget < 0) return "...";
  switch (v->kind) {
    case Kind::kNone:
      return nullptr;
    case Kind::kBool:
      return v->b;
    case Kind::kInt:
      return v->i;
    case Kind::kBigInt:
      return Utf8Safe(v->s);
    case Kind::kFloat:
      if (!std::isfinite(v->f)) return std::isnan(v->f) ? "nan" : (v->f > 0 ? "inf" : "-inf");
      return v->f;
    case Kind::kStr:
      return Utf8Safe(v->s);
    case Kind::kBytes:
      return {{"bytes", v->s.size()}};
    case Kind::kList:
    case Kind::kTuple:
    case Kind::kSet: {
      json a = json::array();
      for (const PyValue* e : v->items) a.push_back(ToJson(doc, e, depth + 1, max_depth, budget));
      return a;
    }
    case Kind::kDict: {
      json o = json::object();
      for (const auto& [k, val] : v->entries) {
        std::string key;
        if (k && k->kind == Kind::kStr)
          key = Utf8Safe(k->s);
        else
          key = ToJson(doc, k, depth + 1, max_depth, budget).dump();
        o[key] = ToJson(doc, val, depth + 1, max_depth, budget);
      }
      return o;
    }
    case Kind::kGlobal:
      return {{"global", Utf8Safe(v->s)}};
    case Kind::kObject: {
      json o = {{"class", Utf8Safe(v->s)}};
      if (!v->items.empty()) {
        json a = json::array();
        for (const PyValue* e : v->items) a.push_back(ToJson(doc, e, depth + 1, max_depth, budget));
        o["args"] = a;
      }
      if (!v->entries.empty()) {
        json s = json::object();
        for (const auto& [k, val] : v->entries)
          s[k && k->kind == Kind::kStr ? Utf8Safe(k->s)
                                       : ToJson(doc, k, depth + 1, max_depth, budget).dump()] =
              ToJson(doc, val, depth + 1, max_depth, budget);
        o["state"] = s;
      } else if (v->state) {
        o["state"] = ToJson(doc, v->state, depth + 1, max_depth, budget);
      }
      return o;
    }
    case Kind::kTensor:
    case Kind::kStorage: {
      const TorchTensorRef& t = doc.tensors()[static_cast<size_t>(v->tensor)];
      return {{v->kind == Kind::kTensor ? "tensor" : "storage",
               {{"dtype", t.dtype_name}, {"shape", t.shape}}}};
    }
  }
  return nullptr;
}

}  // namespace

nlohmann::json PyToJson(const PickleDoc& doc, const PyValue& v, int max_depth) {
  int budget = kMaxJsonNodes;
  return ToJson(doc, &v, 0, max_depth, &budget);
}

}  // namespace ckpt
