// ckpt._ckpt: the Python binding, thin over the C++ libraries (docs/python.md). Nothing here
// knows the on-disk format: saving goes through ckpt::SaveCheckpoint, reading through
// ckpt::CheckpointReader, safetensors through safetensors/safetensors.h.
//
// Arrays cross without a copy: numpy arrays (and anything with the buffer protocol) by their
// buffer, torch tensors by data_ptr() (CPU, contiguous; this also carries bf16, which numpy
// lacks). Errors become ckpt.CorruptionError (DataLoss) or ckpt.Error carrying the Status text;
// nothing aborts the interpreter. The GIL is released during I/O; a collective implemented in
// Python re-acquires it for each call.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "ckpt/async_saver.h"
#include "ckpt/collective.h"
#include "ckpt/dtype.h"
#include "ckpt/hash.h"
#include "ckpt/load_resharded.h"
#include "ckpt/manifest.h"
#include "ckpt/probe.h"
#include "ckpt/reader.h"
#include "ckpt/root.h"
#include "ckpt/state_source.h"
#include "ckpt/status.h"
#include "ckpt/writer.h"
#include "safetensors/safetensors.h"

namespace py = pybind11;
using nlohmann::json;

namespace ckpt::python {
namespace {

// A failed Status on its way to Python (translated in PYBIND11_MODULE below).
struct StatusError {
  Status status;
};

// Runs f() with the GIL released (f must not touch Python objects) and returns its result.
template <typename F>
auto WithoutGil(F&& f) {
  py::gil_scoped_release nogil;
  return f();
}

void ThrowIfError(const Status& s) {
  if (!s.ok()) throw StatusError{s};
}
template <typename T>
T ValueOrThrow(Result<T> r) {
  if (!r.ok()) throw StatusError{r.status()};
  return std::move(r).value();
}

py::object ToPython(const json& j) {
  return py::module_::import("json").attr("loads")(j.dump());
}
json FromPython(py::handle obj, const char* what) {
  const std::string text = py::str(py::module_::import("json").attr("dumps")(obj));
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) throw StatusError{InvalidArgument(std::string(what) + " is not JSON")};
  return j;
}

// A contiguous CPU array seen through its own memory. Holds the Python object (and, for a
// buffer, the Py_buffer view) so the pointer stays valid; destroy with the GIL held.
struct RawArray {
  void* data = nullptr;
  uint64_t bytes = 0;
  DType dtype = DType::kU8;
  std::vector<int64_t> shape;
  py::object owner;
  std::shared_ptr<py::buffer_info> view;
};

std::optional<DType> DTypeFromTorch(const std::string& name) {
  static const std::map<std::string, DType> kTorch = {
      {"torch.float32", DType::kF32}, {"torch.float64", DType::kF64},
      {"torch.bfloat16", DType::kBF16}, {"torch.float16", DType::kF16},
      {"torch.int64", DType::kI64},   {"torch.int32", DType::kI32},
      {"torch.uint8", DType::kU8}};
  auto it = kTorch.find(name);
  if (it == kTorch.end()) return std::nullopt;
  return it->second;
}

std::optional<DType> DTypeFromBufferFormat(const std::string& format, ssize_t itemsize) {
  std::string f = format;
  if (!f.empty() && (f[0] == '<' || f[0] == '=' || f[0] == '@')) f = f.substr(1);
  if (f == "f" && itemsize == 4) return DType::kF32;
  if (f == "d" && itemsize == 8) return DType::kF64;
  if (f == "e" && itemsize == 2) return DType::kF16;
  if ((f == "B" || f == "b") && itemsize == 1) return DType::kU8;
  if (f == "H" && itemsize == 2) return DType::kU16;
  if ((f == "i" || f == "l" || f == "q") && itemsize == 4) return DType::kI32;
  if ((f == "i" || f == "l" || f == "q") && itemsize == 8) return DType::kI64;
  return std::nullopt;
}

// `as_dtype` (a ckpt dtype name, or empty) reinterprets the elements: a uint16 array holding
// bf16 bit patterns is saved as "bf16". The element size must match.
RawArray ToRaw(py::handle obj, const std::string& what, bool writable,
               const std::string& as_dtype = "") {
  RawArray a;
  a.owner = py::reinterpret_borrow<py::object>(obj);
  if (py::hasattr(obj, "data_ptr") && py::hasattr(obj, "element_size") &&
      py::hasattr(obj, "is_contiguous")) {
    const std::string device = py::str(obj.attr("device").attr("type"));
    if (device != "cpu")
      throw StatusError{InvalidArgument(what + ": tensor is on " + device + ", expected cpu")};
    if (!obj.attr("is_contiguous")().cast<bool>())
      throw StatusError{InvalidArgument(what + ": tensor is not contiguous")};
    const std::string tname = py::str(obj.attr("dtype"));
    auto dt = DTypeFromTorch(tname);
    if (!dt) throw StatusError{InvalidArgument(what + ": unsupported dtype " + tname)};
    a.dtype = *dt;
    for (auto d : obj.attr("shape")) a.shape.push_back(d.cast<int64_t>());
    a.data = reinterpret_cast<void*>(obj.attr("data_ptr")().cast<uintptr_t>());
    a.bytes = obj.attr("numel")().cast<uint64_t>() * obj.attr("element_size")().cast<uint64_t>();
  } else if (PyObject_CheckBuffer(obj.ptr())) {
    auto info = std::make_shared<py::buffer_info>(
        py::reinterpret_borrow<py::buffer>(obj).request(writable));
    auto dt = DTypeFromBufferFormat(info->format, info->itemsize);
    if (!dt)
      throw StatusError{InvalidArgument(what + ": unsupported element format '" + info->format +
                                        "'")};
    // C-contiguous: each stride is the product of the later dimensions.
    ssize_t expect = info->itemsize;
    for (ssize_t d = info->ndim - 1; d >= 0; --d) {
      if (info->shape[d] > 1 && info->strides[d] != expect)
        throw StatusError{InvalidArgument(what + ": array is not C-contiguous")};
      expect *= info->shape[d];
    }
    a.dtype = *dt;
    for (ssize_t d : info->shape) a.shape.push_back(d);
    a.data = info->ptr;
    a.bytes = static_cast<uint64_t>(info->size) * static_cast<uint64_t>(info->itemsize);
    a.view = std::move(info);
  } else {
    throw StatusError{
        InvalidArgument(what + ": expected a numpy array, a torch tensor or a buffer")};
  }
  if (!as_dtype.empty()) {
    auto dt = DTypeFromName(as_dtype);
    if (!dt) throw StatusError{InvalidArgument(what + ": unknown dtype '" + as_dtype + "'")};
    if (DTypeSize(*dt) != DTypeSize(a.dtype))
      throw StatusError{InvalidArgument(what + ": cannot view " +
                                        std::string(DTypeName(a.dtype)) + " elements as " +
                                        as_dtype)};
    a.dtype = *dt;
  }
  return a;
}

// ckpt::Collective over a Python object with rank(), world_size(), barrier(), gather(bytes)
// -> list[bytes] (on rank 0; anything elsewhere) and broadcast(bytes) -> bytes. An exception
// raised by the object (a peer died, a timeout) becomes an IOError for the commit protocol.
class PyCollective final : public Collective {
 public:
  explicit PyCollective(py::object obj) : obj_(std::move(obj)) {
    rank_ = obj_.attr("rank")().cast<int>();
    world_ = obj_.attr("world_size")().cast<int>();
  }
  int rank() const override { return rank_; }
  int world_size() const override { return world_; }
  Status Barrier() override {
    py::gil_scoped_acquire gil;
    try {
      obj_.attr("barrier")();
      return Status::Ok();
    } catch (py::error_already_set& e) {
      return IOError(std::string("collective barrier: ") + e.what());
    }
  }
  Result<std::vector<std::string>> Gather(std::string_view payload) override {
    py::gil_scoped_acquire gil;
    try {
      py::object got = obj_.attr("gather")(py::bytes(payload.data(), payload.size()));
      std::vector<std::string> out;
      if (rank_ == 0) {
        for (auto item : got) out.push_back(item.cast<std::string>());
        if (static_cast<int>(out.size()) != world_)
          return Internal("collective gather returned " + std::to_string(out.size()) +
                          " payloads for " + std::to_string(world_) + " ranks");
      }
      return out;
    } catch (py::error_already_set& e) {
      return IOError(std::string("collective gather: ") + e.what());
    } catch (py::cast_error& e) {
      return Internal(std::string("collective gather: ") + e.what());
    }
  }
  Result<std::string> Broadcast(std::string_view payload) override {
    py::gil_scoped_acquire gil;
    try {
      return obj_.attr("broadcast")(py::bytes(payload.data(), payload.size())).cast<std::string>();
    } catch (py::error_already_set& e) {
      return IOError(std::string("collective broadcast: ") + e.what());
    } catch (py::cast_error& e) {
      return Internal(std::string("collective broadcast: ") + e.what());
    }
  }

 private:
  py::object obj_;
  int rank_ = 0;
  int world_ = 1;
};

std::vector<int64_t> Ints(const json& j, const char* what) {
  if (!j.is_array()) throw StatusError{InvalidArgument(std::string(what) + " is not a list")};
  std::vector<int64_t> out;
  for (const auto& x : j) out.push_back(x.get<int64_t>());
  return out;
}

// The parameter table of the Python API: [{"name", "shape", "dtype"?, "frozen"?, "tied_to"?,
// "ranges"?}] (the manifest's own field names).
std::vector<ParamEntry> ParamsFromJson(const json& params) {
  if (!params.is_array()) throw StatusError{InvalidArgument("params is not a list")};
  std::vector<ParamEntry> out;
  for (const auto& pj : params) {
    ParamEntry p;
    p.name = pj.at("name").get<std::string>();
    p.shape = Ints(pj.at("shape"), "shape");
    p.numel = 1;
    for (int64_t d : p.shape) p.numel *= d;
    if (pj.contains("dtype")) {
      auto dt = DTypeFromName(pj["dtype"].get<std::string>());
      if (!dt) throw StatusError{InvalidArgument("parameter " + p.name + ": unknown dtype")};
      p.dtype = *dt;
    }
    p.frozen = pj.value("frozen", false);
    if (pj.contains("tied_to") && pj["tied_to"].is_string()) p.tied_to = pj["tied_to"];
    if (pj.contains("ranges")) {
      for (const auto& rj : pj["ranges"]) {
        p.ranges.push_back({rj.at("rank").get<int>(), rj.at("begin").get<int64_t>(),
                            rj.at("end").get<int64_t>(), rj.at("shard_offset").get<int64_t>()});
      }
    }
    out.push_back(std::move(p));
  }
  return out;
}

// plan(params, world, zero_stage=None, owners=None, alignment=16) -> {"partition", "params"}.
py::object Plan(py::handle params, int world, py::object zero_stage, py::object owners,
                int64_t alignment) {
  Manifest m;  // the manifest's own JSON form of the table and partition
  m.params = ParamsFromJson(FromPython(params, "params"));
  if (!owners.is_none()) {
    m.partition = ValueOrThrow(
        BuildOwnerPartition(m.params, world, owners.cast<std::vector<int>>(), alignment));
  } else {
    m.partition = ValueOrThrow(BuildPartition(
        m.params, world, zero_stage.is_none() ? 0 : zero_stage.cast<int>(), alignment));
  }
  json j = ManifestToJson(m);
  return ToPython({{"partition", j["partition"]}, {"params", j["params"]}});
}

// A float32 numpy array owning `v` (no copy).
py::array_t<float> FloatArray(std::vector<float> v) {
  auto heap = std::make_unique<std::vector<float>>(std::move(v));
  std::vector<float>* raw = heap.get();
  py::capsule owner(heap.release(), [](void* p) { delete static_cast<std::vector<float>*>(p); });
  return py::array_t<float>({static_cast<py::ssize_t>(raw->size())}, {sizeof(float)}, raw->data(),
                            owner);
}

// load_resharded(path, world, zero_stage, rank, tag="") -> dict: rank `rank`'s state for
// `world` ranks with ZeRO `zero_stage`, read from the checkpoint at `path` as it was saved
// (ckpt::LoadResharded; docs/python.md).
py::object LoadReshardedPy(const std::string& path, int world, int zero_stage, int rank,
                           const std::string& tag) {
  ReshardedRank loaded;
  Manifest target_json;
  WithoutGil([&] {
    SourceOptions so;
    so.tag = tag;
    so.check_files = false;
    auto src = OpenStateSource(path, so);
    if (!src.ok()) throw StatusError{src.status()};
    auto target = PlanReshard((*src)->manifest(), world, zero_stage);
    if (!target.ok()) throw StatusError{target.status()};
    src->reset();
    LoadReshardOptions o;
    o.source.tag = tag;
    o.optimizer_type.clear();
    auto r = LoadResharded(path, *target, rank, o);
    if (!r.ok()) throw StatusError{r.status()};
    loaded = std::move(*r);
    target_json.params = target->params;
    target_json.partition = target->partition;
    return 0;
  });
  json j = ManifestToJson(target_json);
  py::dict out;
  out["rank"] = rank;
  out["world"] = world;
  out["zero_stage"] = zero_stage;
  out["partition"] = ToPython(j["partition"]);
  out["params"] = ToPython(j["params"]);
  out["master"] = FloatArray(std::move(loaded.master));
  out["exp_avg"] = FloatArray(std::move(loaded.exp_avg));
  out["exp_avg_sq"] = FloatArray(std::move(loaded.exp_avg_sq));
  py::dict frozen, extras;
  for (auto& [name, bytes] : loaded.frozen)
    frozen[py::str(name)] = py::bytes(reinterpret_cast<const char*>(bytes.data()), bytes.size());
  for (auto& [ex, bytes] : loaded.extras)
    extras[py::str(ex.name)] = py::bytes(reinterpret_cast<const char*>(bytes.data()), bytes.size());
  out["frozen"] = frozen;
  out["extras"] = extras;
  const ReadAccounting& a = loaded.accounting;
  out["accounting"] = ToPython({{"bytes_read", a.bytes_read},
                                {"bytes_owned", a.bytes_owned},
                                {"slices", a.slices},
                                {"piece_bytes", a.piece_bytes},
                                {"small_bytes", a.small_bytes},
                                {"ratio", a.ratio()}});
  return out;
}

// The manifest a saver passes (rank 0's is written; files[], format and times are the writer's).
Manifest ManifestDraft(const json& j) {
  Manifest m;
  try {
    m.tag = j.at("tag").get<std::string>();
    const json c = j.value("counters", json::object());
    m.counters.global_step = c.value("global_step", int64_t{0});
    m.counters.micro_step = c.value("micro_step", int64_t{0});
    m.counters.skipped_steps = c.value("skipped_steps", int64_t{0});
    m.counters.samples_seen = c.value("samples_seen", int64_t{0});
    m.counters.tokens_seen = c.value("tokens_seen", int64_t{0});
    const json t = j.at("topology");
    m.topology.dp_world_size = t.at("dp_world_size").get<int>();
    m.topology.tp = t.value("tp", 1);
    m.topology.pp = t.value("pp", 1);
    m.topology.zero_stage = t.at("zero_stage").get<int>();
    m.optimizer = j.value("optimizer", json::object());
    m.dtypes = j.value("dtypes", json::object());
    const json p = j.at("partition");
    m.partition.scheme = p.at("scheme").get<std::string>();
    m.partition.alignment = p.value("alignment", kDefaultAlignment);
    m.partition.shard_numel = Ints(p.at("shard_numel"), "partition.shard_numel");
    m.params = ParamsFromJson(j.at("params"));
    m.client_state = j.value("client_state", json::object());
    m.engine_config = j.value("engine_config", json::object());
  } catch (const json::exception& e) {
    throw StatusError{InvalidArgument(std::string("manifest: ") + e.what())};
  }
  ThrowIfError(ValidateManifest(m).WithContext("manifest"));
  return m;
}

// One rank's save request from Python: datasets is a list of (name, kind, value, extra): kind
// "tensor" (value an array, extra a dtype override or ""), "blob" (value bytes, extra its
// blob_kind) or "json" (value the JSON text). The specs point into arrays and texts.
struct ShardRequest {
  Manifest meta;
  SaveOptions options;
  RankContents mine;
  std::vector<RawArray> arrays;
  std::vector<std::string> texts;
};

std::unique_ptr<ShardRequest> ParseShard(py::handle manifest, py::list datasets,
                                         const std::string& compression, int keep_last) {
  auto req = std::make_unique<ShardRequest>();
  req->meta = ManifestDraft(FromPython(manifest, "manifest"));
  req->options.compression = ValueOrThrow(Compression::Parse(compression));
  req->options.keep_last = keep_last;
  req->arrays.reserve(datasets.size());
  req->texts.reserve(datasets.size());
  for (auto item : datasets) {
    auto t = item.cast<py::tuple>();
    const std::string name = t[0].cast<std::string>();
    const std::string kind = t[1].cast<std::string>();
    if (kind == "tensor") {
      req->arrays.push_back(ToRaw(t[2], "dataset " + name, false, t[3].cast<std::string>()));
      const RawArray& a = req->arrays.back();
      req->mine.datasets.push_back(DatasetSpec::Tensor(name, a.dtype, a.shape, a.data));
    } else if (kind == "blob") {
      req->texts.push_back(t[2].cast<std::string>());
      req->mine.datasets.push_back(
          DatasetSpec::Blob(name, t[3].cast<std::string>(), req->texts.back()));
    } else if (kind == "json") {
      req->texts.push_back(t[2].cast<std::string>());
      req->mine.datasets.push_back(DatasetSpec::Json(name, req->texts.back()));
    } else {
      throw StatusError{InvalidArgument("dataset " + name + ": unknown kind '" + kind + "'")};
    }
  }
  return req;
}

// save_shard(root, manifest, datasets, collective, compression, keep_last).
void SaveShard(const std::string& root, py::handle manifest, py::list datasets,
               py::object collective, const std::string& compression, int keep_last) {
  auto req = ParseShard(manifest, datasets, compression, keep_last);
  PyCollective comm(std::move(collective));
  Status s;
  {
    py::gil_scoped_release nogil;
    s = SaveCheckpoint(root, req->meta, req->mine, comm, req->options);
  }
  ThrowIfError(s);
}

// ckpt::AsyncSaver for Python. The background thread calls the collective object with the GIL
// taken (PyCollective), so everything here that waits for it releases the GIL first. The
// collective stays referenced until its save has finished.
class AsyncShardSaver {
 public:
  AsyncShardSaver() : saver_(std::make_unique<AsyncSaver>()) {}
  ~AsyncShardSaver() {
    {
      py::gil_scoped_release nogil;
      saver_.reset();  // finishes the save in flight
    }
  }

  void Save(const std::string& root, py::handle manifest, py::list datasets,
            py::object collective, const std::string& compression, int keep_last) {
    auto req = ParseShard(manifest, datasets, compression, keep_last);
    ThrowIfError(Finish().WithContext("previous async save"));
    comm_ = std::make_unique<PyCollective>(std::move(collective));
    Status s;
    {
      py::gil_scoped_release nogil;
      s = saver_->Save(root, req->meta, req->mine, *comm_, req->options);
    }
    ThrowIfError(s);
  }
  // Raises the finished save's error, once.
  void Wait() { ThrowIfError(Finish()); }
  // Whether no save is persisting (a finished save's error is kept for wait()).
  bool Done() {
    if (finished_) return true;
    finished_ = saver_->Poll();
    return finished_.has_value();
  }

 private:
  Status Finish() {
    Status s;
    if (finished_) {
      s = *finished_;
    } else {
      py::gil_scoped_release nogil;
      s = saver_->Wait();
    }
    finished_.reset();
    return s;
  }
  std::unique_ptr<PyCollective> comm_;
  std::unique_ptr<AsyncSaver> saver_;  // after comm_: destroyed first
  std::optional<Status> finished_;
};

// A CheckpointReader shared by Python threads: one call at a time, without the GIL.
class Reader {
  std::unique_ptr<CheckpointReader> reader_;
  std::mutex mu_;

  // f() (a Status or a Result) with the GIL released and this reader locked.
  template <typename F>
  auto Locked(F&& f) {
    return WithoutGil([&] {
      std::lock_guard<std::mutex> lock(mu_);
      return f();
    });
  }

 public:
  Reader(const std::string& path, const std::string& tag, bool verify_checksums) {
    OpenOptions o;
    o.verify_checksums = verify_checksums;
    auto r = WithoutGil([&] { return CheckpointReader::Open(path, tag, o); });
    reader_ = std::make_unique<CheckpointReader>(ValueOrThrow(std::move(r)));
  }
  // The manifest's compact JSON written straight from the structs (no DOM: a ZeRO-3 manifest
  // holds a record per parameter and rank), read by Python's json.
  py::object Manifest() const {
    return py::module_::import("json").attr("loads")(ManifestJsonText(reader_->manifest()));
  }
  std::string Dir() const { return reader_->dir(); }
  std::string Tag() const { return reader_->tag(); }

  void ReadDatasetInto(int rank, const std::string& name, py::handle out) {
    RawArray a = ToRaw(out, "out", true);
    const DatasetRecord* d = reader_->manifest().FindDataset(rank, name);
    if (d && d->dtype != a.dtype && DTypeSize(d->dtype) != DTypeSize(a.dtype))
      throw StatusError{InvalidArgument("out: dataset " + name + " is " +
                                        std::string(DTypeName(d->dtype)))};
    ThrowIfError(Locked([&] { return reader_->ReadDataset(rank, name, a.data, a.bytes); }));
  }
  py::bytes ReadDatasetBytes(int rank, const std::string& name) {
    auto r = ValueOrThrow(Locked([&] { return reader_->ReadDatasetBytes(rank, name); }));
    return py::bytes(reinterpret_cast<const char*>(r.data()), r.size());
  }
  py::bytes ReadBlob(int rank, const std::string& name) {
    return py::bytes(ValueOrThrow(Locked([&] { return reader_->ReadBlob(rank, name); })));
  }
  py::object ReadJson(int rank, const std::string& name) {
    return ToPython(ValueOrThrow(Locked([&] { return reader_->ReadJson(rank, name); })));
  }
  void ReadParamRangeInto(const std::string& param, const std::string& state, int64_t begin,
                          int64_t end, py::handle out) {
    RawArray a = ToRaw(out, "out", true);
    if (a.dtype != DType::kF32)
      throw StatusError{InvalidArgument("out: parameter ranges read as fp32")};
    if (end < begin || a.bytes != static_cast<uint64_t>(end - begin) * 4)
      throw StatusError{InvalidArgument("out holds " + std::to_string(a.bytes / 4) +
                                        " floats for the range [" + std::to_string(begin) + ", " +
                                        std::to_string(end) + ")")};
    ThrowIfError(Locked([&] {
      return reader_->ReadParamRange(param, state, begin, end, static_cast<float*>(a.data));
    }));
  }
  void VerifyDataset(int rank, const std::string& name) {
    ThrowIfError(Locked([&] { return reader_->VerifyDataset(rank, name); }));
  }

};

py::object Ls(const std::string& root) {
  return ToPython(RootListingToJson(ValueOrThrow(WithoutGil([&] { return ListRoot(root); }))));
}

py::object Inspect(const std::string& path, const std::string& tag) {
  auto r = WithoutGil([&] { return CheckpointReader::Open(path, tag); });
  return ToPython(InspectToJson(ValueOrThrow(std::move(r))));
}

// The tag directory of `tag`, which rank 0 resolved from `path` (ResolveAgreedTagDir).
std::string AgreedTagDir(const std::string& path, const std::string& tag) {
  return ValueOrThrow(ResolveAgreedTagDir(path, tag));
}

// A checkpoint's problems as a dict (`ckpt check --json`); an unreadable `latest` is a problem,
// anything else that stops the check is raised.
py::object Check(const std::string& path, const std::string& tag, bool deep) {
  std::vector<Problem> problems;
  std::string dir;
  Status s;
  {
    py::gil_scoped_release nogil;
    auto resolved = ResolveTagDir(path, tag);
    if (!resolved.ok()) {
      if (resolved.status().code() == StatusCode::kDataLoss)
        problems.push_back({std::string(kLatestFile), "", resolved.status().message()});
      else
        s = resolved.status();
    } else {
      dir = *resolved;
      auto found = CheckCheckpoint(dir, deep);
      if (found.ok()) problems = std::move(*found);
      else s = found.status();
    }
  }
  ThrowIfError(s);
  return ToPython(CheckReportToJson(problems, dir, deep));
}

// ckpt.probe: `ckpt probe DIR --json` as a dict (ckpt/probe.h). Takes seconds to minutes (it
// saves 4 x pairs x size bytes), without the GIL.
py::object Probe(const std::string& dir, uint64_t size, int ranks, const std::string& compression,
                 int pairs, const std::string& memory_dir, const std::string& from_checkpoint) {
  ProbeOptions o;
  o.bytes = size;
  o.ranks = ranks;
  o.compression = ValueOrThrow(Compression::Parse(compression));
  o.pairs = pairs;
  o.memory_dir = memory_dir;
  o.from = from_checkpoint;
  auto r = WithoutGil([&] { return ProbeCompression(dir, o); });
  return ToPython(ProbeReportToJson(ValueOrThrow(std::move(r))));
}

std::string Xxh3Of(py::handle buffer) {
  RawArray a = ToRaw(buffer, "xxh3 input", false);
  py::gil_scoped_release nogil;
  return DigestHex(Xxh3(a.data, a.bytes));
}

class PyXxh3 {
 public:
  void Update(py::handle buffer) {
    RawArray a = ToRaw(buffer, "xxh3 input", false);
    py::gil_scoped_release nogil;
    stream_.Update(a.data, a.bytes);
  }
  std::string HexDigest() const { return stream_.HexDigest(); }

 private:
  Xxh3Stream stream_;
};

// write_safetensors(path, [(name, array)], metadata): the converter's writer with its
// integrity record.
void WriteSafetensorsFile(const std::string& path, py::list tensors,
                          const std::map<std::string, std::string>& metadata) {
  std::vector<RawArray> arrays;
  std::vector<safetensors::SafetensorsTensorView> views;
  for (auto item : tensors) {
    auto t = item.cast<py::tuple>();
    const std::string name = t[0].cast<std::string>();
    arrays.push_back(ToRaw(t[1], "tensor " + name, false));
    views.push_back({{name, arrays.back().dtype, arrays.back().shape}, arrays.back().data});
  }
  Status s;
  {
    py::gil_scoped_release nogil;
    s = safetensors::WriteSafetensors(path, views, metadata);
  }
  ThrowIfError(s);
}

// read_safetensors(path) -> ({name: (dtype name, shape, bytes)}, metadata), every tensor
// verified against its recorded digest when the file carries the integrity record.
py::tuple ReadSafetensorsFile(const std::string& path) {
  std::vector<std::pair<safetensors::SafetensorsTensor, std::vector<uint8_t>>> loaded;
  std::map<std::string, std::string> metadata;
  Status s;
  {
    py::gil_scoped_release nogil;
    auto header = safetensors::ReadSafetensorsHeader(path);
    if (!header.ok()) {
      s = header.status();
    } else {
      metadata = header->metadata;
      for (const auto& t : header->tensors) {
        auto bytes = safetensors::ReadSafetensorsTensor(path, *header, t.name);
        if (!bytes.ok()) {
          s = bytes.status();
          break;
        }
        loaded.emplace_back(t, std::move(*bytes));
      }
    }
  }
  ThrowIfError(s);
  py::dict out;
  for (const auto& [t, bytes] : loaded) {
    out[py::str(t.name)] =
        py::make_tuple(std::string(DTypeName(t.dtype)), t.shape,
                       py::bytes(reinterpret_cast<const char*>(bytes.data()), bytes.size()));
  }
  return py::make_tuple(out, metadata);
}

}  // namespace
}  // namespace ckpt::python

PYBIND11_MODULE(_ckpt, m) {
  using namespace ckpt::python;
  m.doc() = "ckpt: the C++ checkpoint library, bound thinly (docs/python.md)";
  static py::exception<StatusError> error(m, "Error");
  static py::exception<StatusError> corruption(m, "CorruptionError", error.ptr());
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const StatusError& e) {
      const bool data_loss = e.status.code() == ckpt::StatusCode::kDataLoss;
      py::object type = data_loss ? py::object(corruption) : py::object(error);
      py::object exc = type(e.status.ToString());
      exc.attr("code") = std::string(ckpt::StatusCodeName(e.status.code()));
      exc.attr("exit_code") = ckpt::ExitCodeFor(e.status);
      PyErr_SetObject(type.ptr(), exc.ptr());
    }
  });

  m.def("plan", &Plan, py::arg("params"), py::arg("world"), py::arg("zero_stage") = py::none(),
        py::arg("owners") = py::none(), py::arg("alignment") = ckpt::kDefaultAlignment);
  m.def("save_shard", &SaveShard, py::arg("root"), py::arg("manifest"), py::arg("datasets"),
        py::arg("collective"), py::arg("compression") = "none", py::arg("keep_last") = 0);
  py::class_<AsyncShardSaver>(m, "AsyncShardSaver")
      .def(py::init<>())
      .def("save", &AsyncShardSaver::Save, py::arg("root"), py::arg("manifest"),
           py::arg("datasets"), py::arg("collective"), py::arg("compression") = "none",
           py::arg("keep_last") = 0)
      .def("wait", &AsyncShardSaver::Wait)
      .def("done", &AsyncShardSaver::Done);
  py::class_<Reader>(m, "Reader")
      .def(py::init<const std::string&, const std::string&, bool>(), py::arg("path"),
           py::arg("tag") = "", py::arg("verify_checksums") = true)
      .def_property_readonly("manifest", &Reader::Manifest)
      .def_property_readonly("dir", &Reader::Dir)
      .def_property_readonly("tag", &Reader::Tag)
      .def("read_dataset_into", &Reader::ReadDatasetInto)
      .def("read_dataset_bytes", &Reader::ReadDatasetBytes)
      .def("read_blob", &Reader::ReadBlob)
      .def("read_json", &Reader::ReadJson)
      .def("read_param_range_into", &Reader::ReadParamRangeInto)
      .def("verify_dataset", &Reader::VerifyDataset);
  m.def("load_resharded", &LoadReshardedPy, py::arg("path"), py::arg("world"),
        py::arg("zero_stage"), py::arg("rank"), py::arg("tag") = "");
  m.def("set_hdf5_probe", &ckpt::SetHdf5Probe, py::arg("program"), py::arg("seconds") = 300.0,
        "Every HDF5 file a reader opens is first walked by `program __h5-probe FILE...` in a "
        "process of its own (check walks several files a process); a crash or hang there "
        "refuses the file (\"\": no probe).");
  m.def("ls", &Ls, py::arg("root"));
  m.def("inspect", &Inspect, py::arg("path"), py::arg("tag") = "");
  m.def("check", &Check, py::arg("path"), py::arg("tag") = "", py::arg("deep") = false);
  m.def("agreed_tag_dir", &AgreedTagDir, py::arg("path"), py::arg("tag"));
  m.def("probe", &Probe, py::arg("dir"), py::kw_only(), py::arg("size") = uint64_t{1} << 30,
        py::arg("ranks") = 4, py::arg("compression") = "zstd:1+shuffle", py::arg("pairs") = 3,
        py::arg("memory_dir") = "/dev/shm", py::arg("from_checkpoint") = "");
  m.def("xxh3", &Xxh3Of);
  py::class_<PyXxh3>(m, "Xxh3")
      .def(py::init<>())
      .def("update", &PyXxh3::Update)
      .def("hexdigest", &PyXxh3::HexDigest);
  m.def("write_safetensors", &WriteSafetensorsFile, py::arg("path"), py::arg("tensors"),
        py::arg("metadata") = std::map<std::string, std::string>{});
  m.def("read_safetensors", &ReadSafetensorsFile, py::arg("path"));
}
