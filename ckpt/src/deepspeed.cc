// DeepSpeed ZeRO checkpoints (ckpt/deepspeed.h; docs/deepspeed.md is the description).
//
// Open:
//  1. Resolve the tag directory and list it: the model-states file(s) and one optimizer file
//     per data-parallel rank ("[bf16_|fp16_]zero_pp_rank_<r>_mp_rank_00_optim_states.pt");
//     ranks must run 0..W-1 with none missing, and mp_rank 00 only.
//  2. Open every file (zip consistency, restricted pickle, storages that fit their views).
//  3. Read the layout from the pickles: stage, partition_count (= W on every rank), the fp32
//     flat partitions per group, the base optimizer's state and param_groups, param_shapes,
//     frozen parameters, buffers and shared parameters, counters and the scheduler.
//  4. Map every trainable parameter onto (rank, offset in that rank's concatenated groups)
//     the way zero_to_fp32 reconstructs it, and check that every piece lies inside the saved
//     partitions, before any caller reads data.
#include "ckpt/deepspeed.h"

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <string_view>

#include "ckpt/progress.h"
#include "ckpt/root.h"
#include "ckpt/run_ahead.h"
#include "ckpt/shape.h"
#include "torch_archive.h"

namespace ckpt {
namespace {

using Kind = PyValue::Kind;

// deepspeed/runtime/zero/config.py ZeroStageEnum: pickled as ZeroStageEnum(value) before
// Python 3.11 (an object whose argument is the int) and as getattr(ZeroStageEnum, "name") since.
std::optional<int64_t> ZeroStageOf(const PyValue* v) {
  if (!v) return std::nullopt;
  if (auto i = v->AsInt()) return i;
  static const std::string kEnum = "deepspeed.runtime.zero.config.ZeroStageEnum.";
  if (v->kind == Kind::kGlobal && v->s.rfind(kEnum, 0) == 0) {
    const std::string name = v->s.substr(kEnum.size());
    if (name == "disabled") return 0;
    if (name == "optimizer_states") return 1;
    if (name == "gradients") return 2;
    if (name == "weights" || name == "max_stage") return 3;
  }
  return std::nullopt;
}

struct OptimFileName {
  int rank = -1;
  std::string prefix;
};

// "[bf16_|fp16_]zero_pp_rank_<r>_mp_rank_<m>_optim_states.pt" -> rank; mp rank in *mp.
std::optional<OptimFileName> ParseOptimName(const std::string& name, int* mp) {
  static const std::string kMid = "zero_pp_rank_", kSuffix = "_optim_states.pt";
  std::string prefix;
  std::string s = name;
  for (const char* p : {"bf16_", "fp16_"})
    if (s.rfind(p, 0) == 0) {
      prefix = p;
      s = s.substr(prefix.size());
    }
  if (s.rfind(kMid, 0) != 0 || s.size() <= kMid.size() + kSuffix.size() ||
      s.compare(s.size() - kSuffix.size(), kSuffix.size(), kSuffix) != 0)
    return std::nullopt;
  s = s.substr(kMid.size(), s.size() - kMid.size() - kSuffix.size());  // "<r>_mp_rank_<m>"
  const size_t mid = s.find("_mp_rank_");
  if (mid == std::string::npos || mid == 0 || mid > 9) return std::nullopt;
  const std::string r = s.substr(0, mid), m = s.substr(mid + 9);
  if (m.empty() || m.size() > 9) return std::nullopt;
  for (char c : r + m)
    if (!std::isdigit(static_cast<unsigned char>(c))) return std::nullopt;
  *mp = std::stoi(m);
  return OptimFileName{std::stoi(r), prefix};
}

bool IsModelStates(const std::string& name) {
  static const std::string kSuffix = "_model_states.pt";
  return name.size() > kSuffix.size() &&
         name.compare(name.size() - kSuffix.size(), kSuffix.size(), kSuffix) == 0;
}

std::string TrimWs(std::string s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.pop_back();
  size_t b = 0;
  while (b < s.size() && std::isspace(static_cast<unsigned char>(s[b]))) ++b;
  return s.substr(b);
}

// Whether a directory entry could be a file DeepSpeed writes into a tag directory. A name that
// is not printable UTF-8 (a terminal escape in a name unpacked from an archive) is never one:
// DeepSpeed names its files from digits and ASCII words, and such a name would otherwise reach
// a message as it is.
bool MayBeDeepSpeedFile(const DirEntry& e) {
  int mp = 0;
  return !e.is_dir && PrintableUtf8(e.name) &&
         (IsModelStates(e.name) || ParseOptimName(e.name, &mp));
}

// Whether `dir` holds a file DeepSpeed writes into a tag directory: a model-states file or an
// optimizer-states file (one without the other is a damaged DeepSpeed checkpoint, which
// DeepSpeedReader::Open then reports naming the missing file, not "no checkpoint here").
bool HasDeepSpeedFiles(Env* env, const std::string& dir) {
  auto list = env->ListDir(dir);
  if (!list.ok()) return false;
  for (const auto& e : *list) {
    if (MayBeDeepSpeedFile(e)) return true;
  }
  return false;
}

// A shape from torch.Size (a tuple of ints) or a list.
Result<std::vector<int64_t>> ShapeOf(const PyValue* v, const std::string& what) {
  if (!v || !(v->is_sequence() || v->kind == Kind::kObject))
    return DataLoss(what + " is not a shape");
  std::vector<int64_t> out;
  const auto& items = v->kind == Kind::kObject && !v->items.empty() && v->items[0]
                          ? v->items[0]->items
                          : v->items;
  for (const PyValue* e : items) {
    if (!e || e->kind != Kind::kInt || e->i < 0) return DataLoss(what + " is not a shape");
    out.push_back(e->i);
  }
  if (out.size() > 64) return DataLoss(what + " has too many dimensions");
  int64_t n = 1;
  for (int64_t d : out) {
    if (d != 0 && n > (int64_t{1} << 50) / d) return DataLoss(what + " is too large");
    n *= d;
  }
  return out;
}

const PyValue* Tensor(const PyValue* v) {
  return v && v->kind == Kind::kTensor ? v : nullptr;
}

// A tensor read as data may hold no more elements than its storage: only a view whose
// elements repeat (a zero or overlapping stride) does, and every reader sizes its memory and
// its output by the view, so a few stored bytes would fill any amount of both. DeepSpeed's
// partitions and frozen fragments never repeat (DataLoss); a module entry (a buffer, a ZeRO-1
// frozen weight) could be an expanded tensor of the user's, which ckpt does not read
// (Unimplemented).
Status NoRepeats(const TorchFile& f, const TorchTensorRef& t, const std::string& what,
                 bool saved_by_deepspeed) {
  if (t.numel() <= t.storage_numel) return Status::Ok();
  const std::string msg = f.path() + ": " + what + " is a view of " + std::to_string(t.numel()) +
                          " elements over a storage of " + std::to_string(t.storage_numel) +
                          " (its elements repeat)";
  if (saved_by_deepspeed) return DataLoss(msg);
  return Unimplemented(msg + "; ckpt reads tensors whose elements do not repeat");
}

// Ordered (str key, value) entries of a dict, or an error naming `what`.
Result<const PyValue*> Dict(const PyValue* v, const std::string& what) {
  if (!v || !v->is_dict()) return DataLoss(what + " is not a dict");
  return v;
}

}  // namespace

std::string DeepSpeedTagDir(const std::string& path, const std::string& tag, Env* env) {
  if (!env) env = Env::Default();
  if (!tag.empty()) {
    const std::string dir = path + "/" + tag;
    return HasDeepSpeedFiles(env, dir) ? dir : "";
  }
  if (HasDeepSpeedFiles(env, path)) return path;
  auto latest = ReadCheckpointFileToString(env, path + "/latest", 4096);
  if (!latest.ok()) return "";
  const std::string t = TrimWs(*latest);
  if (t.empty() || t.find('/') != std::string::npos || t == ".." || !PrintableUtf8(t)) return "";
  const std::string dir = path + "/" + t;
  return HasDeepSpeedFiles(env, dir) ? dir : "";
}

namespace {

// Opens dir/<name> for every name, on threads of their own (up to 16), each file's result by
// its name: an open reads the archive's directory and every record's local header (libzip's
// ZIP_CHECKCONS) and parses the pickle, a few hundred small reads of a cold file that one
// thread paid file after file (issue 19). With `then`, the thread that opened a file runs
// then(i, file) right after, its status put in (*then_status)[names[i]].
std::map<std::string, Result<TorchFile>> OpenTorchFiles(
    const std::string& dir, const std::vector<std::string>& names, Env* env,
    const std::function<Status(size_t i, TorchFile& f)>& then = nullptr,
    std::map<std::string, Status>* then_status = nullptr) {
  std::vector<std::optional<TorchFile>> files(names.size());
  std::vector<Status> after(names.size(), Status::Ok());
  const std::vector<Status> opened = ForEachOnThreads(names.size(), 16, [&](size_t i) {
    CKPT_ASSIGN_OR_RETURN(TorchFile f, TorchFile::Open(dir + "/" + names[i], env), "");
    files[i].emplace(std::move(f));
    if (then) after[i] = then(i, *files[i]);
    return Status::Ok();
  });
  if (then && then_status)
    for (size_t i = 0; i < names.size(); ++i)
      if (opened[i].ok()) then_status->emplace(names[i], std::move(after[i]));
  std::map<std::string, Result<TorchFile>> out;
  for (size_t i = 0; i < names.size(); ++i)
    out.emplace(names[i], opened[i].ok() ? Result<TorchFile>(std::move(*files[i]))
                                         : Result<TorchFile>(opened[i]));
  return out;
}

// Takes the opened files `names` from `opened` in order: the first that failed is the error.
Result<std::vector<TorchFile>> TakeOpened(std::map<std::string, Result<TorchFile>>& opened,
                                          const std::vector<std::string>& names) {
  std::vector<TorchFile> out;
  out.reserve(names.size());
  for (const auto& n : names) {
    auto it = opened.find(n);
    if (it == opened.end()) return Internal(n + ": not opened");
    CKPT_RETURN_IF_ERROR(it->second.status(), "");
    out.push_back(std::move(*it->second));
  }
  return out;
}

}  // namespace

struct DeepSpeedReader::Impl {
  std::string dir;
  Manifest manifest;
  DeepSpeedInfo info;
  std::vector<TorchFile> optim;  // per rank
  std::vector<TorchFile> model;  // ZeRO-3: per rank; else one
  int world = 1;
  int stage = 0;
  // Per rank: each group's master / exp_avg / exp_avg_sq tensor and its base offset in the
  // rank's concatenated stream.
  struct GroupTensors {
    int64_t base = 0;
    int64_t length = 0;  // elements of the stream this group spans on every rank
    const TorchTensorRef* master = nullptr;
    const TorchTensorRef* exp_avg = nullptr;
    const TorchTensorRef* exp_avg_sq = nullptr;
    // The tensor of `state` (kMaster, kExpAvg, kExpAvgSq); nullptr for another name, or for a
    // moment the optimizer has not written yet.
    const TorchTensorRef* Of(std::string_view state) const {
      return state == kMaster     ? master
             : state == kExpAvg   ? exp_avg
             : state == kExpAvgSq ? exp_avg_sq
                                  : nullptr;
    }
  };
  std::vector<std::vector<GroupTensors>> groups;  // [rank][group]
  struct FrozenSource {
    // Pieces concatenated in order, then the first numel elements used.
    std::vector<std::pair<int, const TorchTensorRef*>> pieces;  // (model file index, tensor)
  };
  std::map<std::string, FrozenSource> frozen;
  std::vector<float> zeros;
  // OpenOptions::check_records: each opened file's VerifyRecords, by file name.
  bool records_checked = false;
  std::map<std::string, Status> record_checks;

  // Stream verification (StreamVerify): a running CRC-32 per storage record read.
  struct CrcStream {
    uint64_t cursor = 0;  // the record's bytes [0, cursor) are in `crc`
    uint32_t crc = 0;
    bool started = false;
    // Read out of order or not as its bytes, or compressed (a gap would be decompressed from
    // the record's start): VerifyStates reads it whole.
    bool broken = false;
  };
  // A read whose CRC HashReadBytes computes (defer).
  struct PendingCrc {
    CrcStream* stream;  // a node of `streams`: never moves
    const void* bytes;
    size_t n;
  };
  bool stream_verify = false;
  bool defer = false;
  bool verify_first_read = false;  // VerifyOnFirstRead
  // (rank, storage key) of the records read whole and checked (verify_first_read).
  std::set<std::pair<int, std::string>> verified;
  // (rank, storage key) of the records read with stream_verify.
  std::map<std::pair<int, std::string>, CrcStream> streams;
  std::mutex queue_mu;             // guards pending
  std::mutex hash_mu;              // held while a thread computes pending CRCs or a gap's
  std::deque<PendingCrc> pending;  // in read order

  // Under hash_mu: the pending reads' CRCs, in order.
  void CrcPendingLocked() {
    std::deque<PendingCrc> todo;
    {
      std::lock_guard<std::mutex> lock(queue_mu);
      todo.swap(pending);
    }
    for (const auto& p : todo) p.stream->crc = ZipCrc32(p.stream->crc, p.bytes, p.n);
  }

  // Rank r's record of t read up to byte `target` into s (the gap before a read, or the tail).
  Status CrcUpTo(int r, const TorchTensorRef& t, CrcStream& s, uint64_t target) {
    if (s.cursor >= target) return Status::Ok();
    // The reads before the gap go first, and no other thread computes meanwhile.
    std::unique_lock<std::mutex> hashing(hash_mu, std::defer_lock);
    if (defer) {
      hashing.lock();
      CrcPendingLocked();
    }
    CKPT_RETURN_IF_ERROR(optim[static_cast<size_t>(r)].CrcStorageBytes(t, s.cursor, target, &s.crc),
                         "");
    s.cursor = target;
    return Status::Ok();
  }

  // Elements [first, first + count) of t, just read into `bytes` from rank r's file, join the
  // record's stream when they continue it.
  Status StreamRead(int r, const TorchTensorRef& t, int64_t first, int64_t count,
                    const void* bytes) {
    CrcStream& s = streams[{r, t.key}];
    if (!s.started) {
      s.started = true;
      CKPT_ASSIGN_OR_RETURN(const TorchFile::StorageRecord rec,
                            optim[static_cast<size_t>(r)].Storage(t), "");
      s.broken = !rec.stored;
    }
    if (s.broken) return Status::Ok();
    const uint64_t at = static_cast<uint64_t>(t.offset + first) * t.itemsize;
    const size_t n = static_cast<size_t>(count) * t.itemsize;
    if (t.dtype != DType::kF32 || !t.contiguous() || at < s.cursor) {
      s.broken = true;  // `bytes` are not the record's, or came before
      return Status::Ok();
    }
    CKPT_RETURN_IF_ERROR(CrcUpTo(r, t, s, at), "");
    if (defer) {
      std::lock_guard<std::mutex> lock(queue_mu);
      pending.push_back({&s, bytes, n});
    } else {
      s.crc = ZipCrc32(s.crc, bytes, n);
    }
    s.cursor = at + n;
    return Status::Ok();
  }

  const ParamEntry* Owner(std::string_view name) const {
    const ParamEntry* p = manifest.FindParam(name);
    if (p && !p->tied_to.empty()) p = manifest.FindParam(p->tied_to);
    return p;
  }

  // Elements [offset, offset + count) of rank r's stream of `state` (callers checked that the
  // range lies inside it).
  Status ReadStream(int r, std::string_view state, int64_t offset, int64_t count, float* out) {
    for (const auto& g : groups[static_cast<size_t>(r)]) {
      const int64_t lo = std::max(offset, g.base);
      int64_t hi = std::min(offset + count, g.base + g.length);
      if (lo >= hi) continue;
      const TorchTensorRef* t = g.Of(state);  // callers checked the state's name
      float* dst = out + (lo - offset);
      const int64_t first = lo - g.base;
      if (!t) {  // the optimizer has not stepped yet: moments are zero
        std::fill(dst, dst + (hi - lo), 0.0f);
        continue;
      }
      // The group's padding past its saved master weights (DeepSpeedZeroOptimizer strips it
      // when it saves): zeros in every state, as DeepSpeed pads and as Adam leaves them.
      const int64_t saved = g.base + g.master->numel();
      if (hi > saved) {
        const int64_t from = std::max(lo, saved);
        std::fill(out + (from - offset), out + (hi - offset), 0.0f);
        hi = from;
        if (lo >= hi) continue;
      }
      if (first + (hi - lo) > t->numel())
        return DataLoss(info.optim_files[static_cast<size_t>(r)] + ": " + std::string(state) +
                        " partition holds " + std::to_string(t->numel()) +
                        " elements, a parameter needs element " + std::to_string(first + (hi - lo) - 1));
      if (verify_first_read && verified.insert({r, t->key}).second) {
        const Status whole = optim[static_cast<size_t>(r)].VerifyStorage(*t);
        if (!whole.ok()) {
          verified.erase({r, t->key});
          return whole;
        }
      }
      CKPT_RETURN_IF_ERROR(optim[static_cast<size_t>(r)].ReadFloats(*t, first, hi - lo, dst),
                           "");
      if (stream_verify) CKPT_RETURN_IF_ERROR(StreamRead(r, *t, first, hi - lo, dst), "");
    }
    return Status::Ok();
  }
};

DeepSpeedReader::DeepSpeedReader(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
DeepSpeedReader::DeepSpeedReader(DeepSpeedReader&&) noexcept = default;
DeepSpeedReader& DeepSpeedReader::operator=(DeepSpeedReader&&) noexcept = default;
DeepSpeedReader::~DeepSpeedReader() = default;

const Manifest& DeepSpeedReader::manifest() const { return impl_->manifest; }
const DeepSpeedInfo& DeepSpeedReader::info() const { return impl_->info; }
const std::string& DeepSpeedReader::dir() const { return impl_->dir; }
uint64_t DeepSpeedReader::bytes_read() const {
  uint64_t n = 0;
  for (const auto& f : impl_->optim) n += f.bytes_read();
  for (const auto& f : impl_->model) n += f.bytes_read();
  return n;
}

namespace {

// A scalar tensor's or number's value.
Result<double> ScalarOf(TorchFile& f, const PyValue* v, const std::string& what) {
  if (!v) return DataLoss(f.path() + ": " + what + " missing");
  if (auto d = v->AsDouble()) return *d;
  if (v->kind == Kind::kTensor) {
    const TorchTensorRef& t = f.tensor(*v);
    if (t.numel() != 1) return DataLoss(f.path() + ": " + what + " is not a scalar");
    if (t.dtype == DType::kI64) {
      int64_t x;
      CKPT_RETURN_IF_ERROR(f.ReadElements(t, 0, 1, &x), what);
      return static_cast<double>(x);
    }
    float x;
    CKPT_RETURN_IF_ERROR(f.ReadFloats(t, 0, 1, &x), what);
    return static_cast<double>(x);
  }
  return DataLoss(f.path() + ": " + what + " is not a number");
}


}  // namespace

Result<DeepSpeedReader> DeepSpeedReader::Open(const std::string& path, const std::string& tag,
                                              Env* env) {
  return Open(path, tag, env, OpenOptions{});
}

Result<DeepSpeedReader> DeepSpeedReader::Open(const std::string& path, const std::string& tag,
                                              Env* env, const OpenOptions& options) {
  if (!env) env = Env::Default();
  auto impl = std::make_unique<Impl>();
  Impl& I = *impl;
  // 1. Files.
  I.dir = DeepSpeedTagDir(path, tag, env);
  if (I.dir.empty()) {
    if (!env->Exists(path)) return NotFound(path + ": no such file or directory");
    if (!tag.empty())
      return NotFound(path + "/" + tag + ": no DeepSpeed model- or optimizer-states file");
    if (!env->Exists(path + "/latest"))
      return NotFound(
          path +
          ": no *_model_states.pt or *_optim_states.pt here and no `latest` file (pass --tag)");
    // A `latest` that cannot be read (a symbolic link, an I/O error) says why.
    auto latest = ReadCheckpointFileToString(env, path + "/latest", 4096);
    if (!latest.ok()) return latest.status();
    if (const std::string t = TrimWs(*latest); !PrintableUtf8(t))
      return DataLoss(path + "/latest: names '" + Excerpt(t, 64) +
                      "', not a tag DeepSpeed writes (a control character or invalid UTF-8)");
    return NotFound(
        path + ": `latest` names a directory without DeepSpeed model- or optimizer-states files");
  }
  // A tag directory under the root (named by `latest` or --tag) that is a symbolic link would
  // have every file read from outside the root, as ckpt's own roots refuse.
  if (I.dir != path) CKPT_RETURN_IF_ERROR(RefuseLinkedTag(env, I.dir), "");
  CKPT_ASSIGN_OR_RETURN(auto entries, env->ListDir(I.dir), I.dir);
  std::map<int, std::string> optim_names;
  std::map<int, std::string> z3_models;
  std::string prefix;
  bool have_prefix = false;
  for (const auto& e : entries) {
    if (!PrintableUtf8(e.name)) continue;  // never DeepSpeed's (MayBeDeepSpeedFile)
    if (e.is_dir) {
      if (e.name == "offloaded_tensors")
        return Unimplemented(I.dir + ": NVMe-offloaded optimizer state (offloaded_tensors/) is not read");
      continue;
    }
    if (e.name.rfind("expp_rank_", 0) == 0 || e.name.rfind("layer_", 0) == 0)
      return Unimplemented(I.dir + "/" + e.name +
                           ": mixture-of-experts and pipeline-parallel checkpoints are not read");
    int mp = 0;
    if (auto o = ParseOptimName(e.name, &mp)) {
      if (mp != 0)
        return Unimplemented(I.dir + "/" + e.name +
                             ": tensor-parallel checkpoints (mp_rank > 00) are not read");
      if (have_prefix && o->prefix != prefix)
        return DataLoss(I.dir + ": optimizer files with different prefixes ('" + prefix +
                        "', '" + o->prefix + "')");
      prefix = o->prefix;
      have_prefix = true;
      if (optim_names.count(o->rank))
        return DataLoss(I.dir + ": two optimizer files for rank " + std::to_string(o->rank));
      optim_names[o->rank] = e.name;
      continue;
    }
    if (IsModelStates(e.name)) {
      if (e.name == "mp_rank_00_model_states.pt") {
        z3_models[-1] = e.name;
      } else if (e.name.rfind("zero_pp_rank_", 0) == 0) {
        int zmp = 0;
        const std::string as_optim =
            e.name.substr(0, e.name.size() - std::string("_model_states.pt").size()) +
            "_optim_states.pt";
        auto o = ParseOptimName(as_optim, &zmp);
        if (!o || zmp != 0)
          return Unimplemented(I.dir + "/" + e.name + ": unexpected model-states file");
        z3_models[o->rank] = e.name;
      } else {
        return Unimplemented(I.dir + "/" + e.name +
                             ": tensor-parallel checkpoints (mp_rank > 00) are not read");
      }
    }
  }
  if (optim_names.empty())
    return DataLoss(I.dir + ": no *_optim_states.pt files (a ZeRO checkpoint has one per rank)");
  const int files = static_cast<int>(optim_names.size());
  for (int r = 0; r < files; ++r) {
    if (!optim_names.count(r)) {
      return DataLoss(I.dir + "/" + prefix + "zero_pp_rank_" + std::to_string(r) +
                      "_mp_rank_00_optim_states.pt is missing (found " + std::to_string(files) +
                      " optimizer files, highest rank " +
                      std::to_string(optim_names.rbegin()->first) + ")");
    }
  }
  I.world = files;
  I.info.model_dtype = prefix == "bf16_" ? "bf16" : prefix == "fp16_" ? "fp16" : "fp32";
  for (const auto& [r, n] : optim_names) I.info.optim_files.push_back(n);

  // 2. Open and parse every file the listing holds at once, the model files with the
  // optimizer files (which of them are used depends on the stage the first optimizer file
  // names; a failed open counts only for a file that is used).
  std::vector<std::string> listed = I.info.optim_files;
  for (const auto& [r, n] : z3_models) listed.push_back(n);
  std::map<std::string, Result<TorchFile>> opened;
  if (options.check_records) {
    // Each file's records checked as soon as it is open: the optimizer files' reads began only
    // once every file was open (the model file of a LoRA checkpoint, its frozen base in a few
    // hundred records, opens last) and the table was built (docs/performance.md).
    uint64_t total = 0;
    for (const auto& n : listed)
      if (auto size = env->FileSize(I.dir + "/" + n); size.ok()) total += *size;
    Progress bar("check", total, options.progress);
    opened = OpenTorchFiles(
        I.dir, listed, env,
        [&](size_t, TorchFile& f) { return f.VerifyRecords([&](uint64_t n) { bar.Add(n); }); },
        &I.record_checks);
    bar.Finish();
    I.records_checked = true;
  } else {
    opened = OpenTorchFiles(I.dir, listed, env);
  }
  CKPT_ASSIGN_OR_RETURN(I.optim, TakeOpened(opened, I.info.optim_files), "");
  const PyValue* osd0 = nullptr;
  {
    const PyValue& root = I.optim[0].root();
    osd0 = root.Get("optimizer_state_dict");
    if (!osd0 || !osd0->is_dict())
      return DataLoss(I.optim[0].path() + ": no optimizer_state_dict (not a ZeRO optimizer file)");
  }
  // Stage: the optimizer's zero_stage (an int enum), else ds_config, else BF16_Optimizer (1).
  const PyValue* ds_config = I.optim[0].root().Get("ds_config");
  int stage = -1;
  if (auto v = ZeroStageOf(osd0->Get("zero_stage"))) stage = static_cast<int>(*v);
  const bool bf16_optimizer = stage < 0;
  if (stage < 0 && ds_config && ds_config->is_dict()) {
    if (const PyValue* zo = ds_config->Get("zero_optimization"))
      if (const PyValue* st = zo->Get("stage"))
        if (auto v = st->AsInt()) stage = static_cast<int>(*v);
  }
  if (stage < 0) stage = 1;
  if (stage < 1 || stage > 3)
    return DataLoss(I.optim[0].path() + ": zero_stage " + std::to_string(stage) +
                    " (a ZeRO checkpoint has stage 1, 2 or 3)");
  I.stage = stage;
  I.info.optimizer = stage == 3 ? "DeepSpeedZeroOptimizer_Stage3"
                     : bf16_optimizer ? "BF16_Optimizer"
                                      : "DeepSpeedZeroOptimizer";
  // Any bytes a pickle holds; reported (inspect, import's summary, JSON) escaped like every
  // other string from the file, never raw: a control byte would reach the terminal and
  // invalid UTF-8 makes nlohmann's dump() throw.
  if (const PyValue* v = I.optim[0].root().Get("ds_version"); v && v->is_str())
    I.info.ds_version = Excerpt(v->s, 64);

  // Model files.
  if (stage == 3) {
    for (int r = 0; r < files; ++r) {
      auto it = z3_models.find(r);
      if (it == z3_models.end())
        return DataLoss(I.dir + "/zero_pp_rank_" + std::to_string(r) +
                        "_mp_rank_00_model_states.pt is missing (ZeRO-3 writes one per rank)");
      I.info.model_files.push_back(it->second);
    }
  } else {
    if (!z3_models.count(-1))
      return DataLoss(I.dir + "/mp_rank_00_model_states.pt is missing");
    I.info.model_files.push_back(z3_models[-1]);
  }
  CKPT_ASSIGN_OR_RETURN(I.model, TakeOpened(opened, I.info.model_files), "");
  TorchFile& m0 = I.model[0];
  const PyValue& ms = m0.root();
  if (!ms.is_dict() || !ms.Get("buffer_names"))
    return DataLoss(m0.path() + ": no buffer_names (not a DeepSpeed model-states file)");

  // 3. Per-rank optimizer layout.
  const std::string fp32_key = stage == 3 ? "fp32_flat_groups" : "single_partition_of_fp32_groups";
  const std::string base_key = stage == 3 ? "optimizer_state_dict" : "base_optimizer_state";
  size_t ngroups = 0;
  std::vector<const PyValue*> param_groups_json;
  std::optional<double> step;
  I.groups.resize(static_cast<size_t>(files));
  std::vector<std::vector<int64_t>> paddings(static_cast<size_t>(files));
  for (int r = 0; r < files; ++r) {
    TorchFile& f = I.optim[static_cast<size_t>(r)];
    const PyValue* osd = f.root().Get("optimizer_state_dict");
    if (!osd || !osd->is_dict()) return DataLoss(f.path() + ": no optimizer_state_dict");
    int rs = -1;
    if (auto v = ZeroStageOf(osd->Get("zero_stage"))) rs = static_cast<int>(*v);
    if ((rs < 0 ? -1 : rs) != (bf16_optimizer ? -1 : stage))
      return DataLoss(f.path() + ": zero_stage differs from rank 0's");
    // partition_count: an int (ZeRO-3) or one per group (ZeRO-1/2).
    const PyValue* pc = osd->Get("partition_count");
    int64_t count = -1;
    if (pc && pc->AsInt()) count = *pc->AsInt();
    if (pc && pc->is_sequence())
      for (const PyValue* e : pc->items)
        if (e && e->AsInt()) count = std::max(count, *e->AsInt());
    if (count > files && count <= (1 << 20))
      return DataLoss(I.dir + "/" + prefix + "zero_pp_rank_" + std::to_string(files) +
                      "_mp_rank_00_optim_states.pt is missing: " + f.path() +
                      " records partition_count " + std::to_string(count) + ", found " +
                      std::to_string(files) + " optimizer file(s)");
    if (count != files)
      return DataLoss(f.path() + ": partition_count " + std::to_string(count) + " but " +
                      std::to_string(files) + " optimizer files in " + I.dir +
                      " (mismatched partition counts: an overwritten or incomplete checkpoint?)");
    const PyValue* flat = osd->Get(fp32_key);
    if (!flat || !flat->is_sequence() || flat->items.empty())
      return DataLoss(f.path() + ": no " + fp32_key);
    if (r == 0) ngroups = flat->items.size();
    if (flat->items.size() != ngroups)
      return DataLoss(f.path() + ": " + std::to_string(flat->items.size()) +
                      " optimizer groups, rank 0 has " + std::to_string(ngroups));
    if (stage < 3) {
      const PyValue* gp = osd->Get("group_paddings");
      if (!gp || !gp->is_sequence() || gp->items.size() != ngroups)
        return DataLoss(f.path() + ": group_paddings missing or not one per group");
      for (const PyValue* e : gp->items) {
        auto v = e ? e->AsInt() : std::nullopt;
        if (!v || *v < 0) return DataLoss(f.path() + ": group_paddings is not a list of sizes");
        paddings[static_cast<size_t>(r)].push_back(*v);
      }
    }
    // Base optimizer: torch state_dict {state: {id: {...}}, param_groups: [{..., params: [id]}]},
    // or (elastic) a list of per-group states.
    const PyValue* base = osd->Get(base_key);
    if (!base) return DataLoss(f.path() + ": no " + base_key);
    std::vector<const PyValue*> group_state(ngroups, nullptr);
    if (base->is_sequence()) {
      I.info.elastic = true;
      if (base->items.size() != ngroups)
        return DataLoss(f.path() + ": " + base_key + " is not one state per group");
      for (size_t g = 0; g < ngroups; ++g) group_state[g] = base->items[g];
      if (const PyValue* s = osd->Get("base_optimizer_state_step")) {
        CKPT_ASSIGN_OR_RETURN(double v, ScalarOf(f, s, "base_optimizer_state_step"), "");
        step = v;
      }
    } else {
      CKPT_ASSIGN_OR_RETURN(const PyValue* b, Dict(base, f.path() + ": " + base_key), "");
      const PyValue* state = b->Get("state");
      const PyValue* pgs = b->Get("param_groups");
      if (!state || !state->is_dict() || !pgs || !pgs->is_sequence() ||
          pgs->items.size() != ngroups)
        return DataLoss(f.path() + ": " + base_key +
                        " is not a torch optimizer state_dict with one param group per group");
      if (r == 0) param_groups_json.assign(pgs->items.begin(), pgs->items.end());
      for (size_t g = 0; g < ngroups; ++g) {
        const PyValue* pg = pgs->items[g];
        const PyValue* ids = pg && pg->is_dict() ? pg->Get("params") : nullptr;
        if (!ids || !ids->is_sequence() || ids->items.size() != 1 || !ids->items[0] ||
            !ids->items[0]->AsInt())
          return DataLoss(f.path() + ": param group " + std::to_string(g) +
                          " does not hold one flat parameter");
        const int64_t id = *ids->items[0]->AsInt();
        for (const auto& [k, v] : state->entries)
          if (k && k->AsInt() && *k->AsInt() == id) group_state[g] = v;
      }
    }
    int64_t base_off = 0;
    for (size_t g = 0; g < ngroups; ++g) {
      Impl::GroupTensors gt;
      const PyValue* w = Tensor(flat->items[g]);
      if (!w) return DataLoss(f.path() + ": " + fp32_key + "[" + std::to_string(g) + "] is not a tensor");
      gt.master = &f.tensor(*w);
      CKPT_RETURN_IF_ERROR(NoRepeats(f, *gt.master, fp32_key + "[" + std::to_string(g) + "]", true),
                           "");
      if (gt.master->dtype != DType::kF32)
        return DataLoss(f.path() + ": " + fp32_key + " holds " + gt.master->dtype_name +
                        ", not fp32 master weights");
      if (gt.master->shape.size() != 1)
        return DataLoss(f.path() + ": " + fp32_key + " is not flat");
      if (const PyValue* st = group_state[g]; st && st->is_dict()) {
        const PyValue* m = Tensor(st->Get("exp_avg"));
        const PyValue* v = Tensor(st->Get("exp_avg_sq"));
        if (!m || !v)
          return DataLoss(f.path() + ": optimizer state of group " + std::to_string(g) +
                          " has no exp_avg / exp_avg_sq tensors (not Adam)");
        gt.exp_avg = &f.tensor(*m);
        gt.exp_avg_sq = &f.tensor(*v);
        CKPT_RETURN_IF_ERROR(
            NoRepeats(f, *gt.exp_avg, "exp_avg of group " + std::to_string(g), true), "");
        CKPT_RETURN_IF_ERROR(
            NoRepeats(f, *gt.exp_avg_sq, "exp_avg_sq of group " + std::to_string(g), true), "");
        for (const TorchTensorRef* t : {gt.exp_avg, gt.exp_avg_sq})
          if (!t->dtype || (*t->dtype != DType::kF32 && *t->dtype != DType::kBF16 &&
                            *t->dtype != DType::kF16))
            return DataLoss(f.path() + ": optimizer moments of " + t->dtype_name);
        if (const PyValue* s = st->Get("step")) {
          CKPT_ASSIGN_OR_RETURN(double v2, ScalarOf(f, s, "optimizer step"), "");
          if (step && *step != v2 && !I.info.elastic)
            return DataLoss(f.path() + ": optimizer groups disagree on step (" +
                            std::to_string(*step) + " vs " + std::to_string(v2) + ")");
          if (!step) step = v2;
        }
      }
      // Stream length of the group: ZeRO-1/2 the padded partition (saved length + padding
      // for DeepSpeedZeroOptimizer, which strips it; BF16_Optimizer keeps it); ZeRO-3 the
      // saved flat group.
      gt.length = gt.master->numel();
      if (stage < 3 && !bf16_optimizer) {
        // DeepSpeed pads only the last rank's partition, by less than a partition (it strips
        // the padding from what it saves, and rank 0's partition is whole): a padding beyond
        // rank 0's saved partition (and a little slack for a model smaller than DeepSpeed's
        // alignment) is a damaged or hostile file, and would size inspect's partitions and
        // the group offsets (summed in int64) by a number no byte backs.
        constexpr int64_t kSlack = int64_t{1} << 16;
        const int64_t padding = paddings[static_cast<size_t>(r)][g];
        const int64_t partition =
            std::max(gt.master->numel(), r == 0 ? int64_t{0} : I.groups[0][g].master->numel());
        if (padding > partition + kSlack)
          return DataLoss(f.path() + ": group_paddings claims " + std::to_string(padding) +
                          " elements of padding for group " + std::to_string(g) +
                          ", more than a partition of its group holds (" +
                          std::to_string(partition) + ")");
        gt.length += padding;
      }
      gt.base = base_off;
      base_off += gt.length;
      I.groups[static_cast<size_t>(r)].push_back(gt);
    }
  }
  // Every rank's group g spans the same length (the partition size).
  for (size_t g = 0; g < ngroups; ++g) {
    const int64_t len = I.groups[0][g].length;
    for (int r = 1; r < files; ++r)
      if (I.groups[static_cast<size_t>(r)][g].length != len)
        return DataLoss(I.optim[static_cast<size_t>(r)].path() + ": group " + std::to_string(g) +
                        " partition has " +
                        std::to_string(I.groups[static_cast<size_t>(r)][g].length) +
                        " elements, rank 0's has " + std::to_string(len));
    I.info.group_partition.push_back(len);
  }

  // 4. The parameter table.
  Manifest& M = I.manifest;
  M.kind = std::string(kDeepSpeedKind);
  M.writer = "DeepSpeed " + I.info.ds_version;
  {
    const std::string d = I.dir;
    const size_t slash = d.find_last_of('/');
    M.tag = slash == std::string::npos ? d : d.substr(slash + 1);
  }
  M.topology.dp_world_size = files;
  M.topology.zero_stage = stage;
  const PyValue* shapes = ms.Get("param_shapes");
  if (!shapes || !shapes->is_sequence())
    return DataLoss(m0.path() + ": no param_shapes (saved without a ZeRO optimizer?)");
  if (stage < 3 && shapes->items.size() != ngroups)
    return DataLoss(m0.path() + ": param_shapes has " + std::to_string(shapes->items.size()) +
                    " groups, the optimizer files " + std::to_string(ngroups));
  const PyValue* module = ms.Get("module");
  const std::string model_dtype_name = I.info.model_dtype;
  const DType model_dtype = *DTypeFromName(model_dtype_name);
  auto check_name = [&](const std::string& name, const char* what) -> Status {
    if (PrintableUtf8(name)) return Status::Ok();
    return DataLoss(m0.path() + ": " + what + " '" + Excerpt(name, 80) +
                    "' is not printable UTF-8 (DeepSpeed writes module paths); refused");
  };
  std::vector<ParamEntry> trainable;
  int64_t z3_offset = 0;  // ZeRO-3: offset in every rank's stream
  for (size_t g = 0; g < shapes->items.size(); ++g) {
    const PyValue* gs = shapes->items[g];
    if (!gs || !gs->is_dict()) return DataLoss(m0.path() + ": param_shapes entry is not a dict");
    int64_t off = 0;  // ZeRO-1/2: offset in group g's flat buffer
    const int64_t part = stage < 3 ? I.groups[0][g].length : 0;
    if (stage < 3 && part <= 0 && !gs->entries.empty())
      return DataLoss(I.optim[0].path() + ": optimizer group " + std::to_string(g) +
                      " has an empty partition but param_shapes lists parameters for it");
    for (const auto& [k, v] : gs->entries) {
      if (!k || !k->is_str()) return DataLoss(m0.path() + ": param_shapes key is not a name");
      CKPT_RETURN_IF_ERROR(check_name(k->s, "parameter name"));
      ParamEntry p;
      p.name = k->s;
      CKPT_ASSIGN_OR_RETURN(p.shape, ShapeOf(v, m0.path() + ": shape of '" + p.name + "'"), "");
      p.numel = Numel(p.shape);
      p.dtype = DType::kF32;  // ckpt records trainable parameters by their fp32 masters
      if (stage < 3) {
        // zero_to_fp32: group g's partitions concatenated, parameters packed in order.
        int64_t b = 0;
        while (b < p.numel) {
          const int64_t pos = off + b;
          const int r = static_cast<int>(pos / part);
          if (r >= files)
            return DataLoss(m0.path() + ": parameter '" + p.name + "' extends past group " +
                            std::to_string(g) + "'s " + std::to_string(files) + " partitions of " +
                            std::to_string(part) + " elements");
          const int64_t in = pos % part;
          const int64_t n = std::min(p.numel - b, part - in);
          p.ranges.push_back({r, b, b + n, I.groups[static_cast<size_t>(r)][g].base + in});
          b += n;
        }
        off += p.numel;
      } else {
        // zero_to_fp32 (stage 3): each parameter split into W shares of ceil(numel / W).
        const int64_t ps = (p.numel + files - 1) / files;
        for (int r = 0; r < files; ++r) {
          const int64_t b = std::min(p.numel, r * ps), e = std::min(p.numel, (r + 1) * ps);
          if (b < e) p.ranges.push_back({r, b, e, z3_offset});
        }
        z3_offset += ps;
      }
      trainable.push_back(std::move(p));
    }
    if (stage < 3) {
      // zero_to_fp32's sanity check: what the parameters use fits the padded group.
      if (off > part * files)
        return DataLoss(m0.path() + ": group " + std::to_string(g) + " parameters need " +
                        std::to_string(off) + " elements, the partitions hold " +
                        std::to_string(part * files));
    }
  }
  if (stage == 3) {
    int64_t total = 0;
    for (const auto& gt : I.groups[0]) total += gt.length;
    if (z3_offset != total)
      return DataLoss(I.optim[0].path() + ": fp32_flat_groups hold " + std::to_string(total) +
                      " elements per rank, param_shapes need " + std::to_string(z3_offset));
  }
  // Every range must lie inside the saved data (stripped padding is never referenced).
  for (const auto& p : trainable)
    for (const auto& rg : p.ranges)
      for (const auto& gt : I.groups[static_cast<size_t>(rg.rank)]) {
        const int64_t lo = std::max(rg.shard_offset, gt.base);
        const int64_t hi = std::min(rg.shard_offset + (rg.end - rg.begin), gt.base + gt.length);
        if (lo >= hi) continue;
        for (const TorchTensorRef* t : {gt.master, gt.exp_avg, gt.exp_avg_sq})
          if (t && hi - gt.base > t->numel())
            return DataLoss(I.optim[static_cast<size_t>(rg.rank)].path() + ": parameter '" +
                            p.name + "' needs element " + std::to_string(hi - gt.base - 1) +
                            " of a partition that holds " + std::to_string(t->numel()));
      }
  std::set<std::string> known;
  for (const auto& p : trainable) known.insert(p.name);

  // Buffers.
  const PyValue* bn = ms.Get("buffer_names");
  if (bn && bn->is_sequence())
    for (const PyValue* e : bn->items) {
      if (!e || !e->is_str()) continue;
      CKPT_RETURN_IF_ERROR(check_name(e->s, "buffer name"));
      I.info.buffers.push_back(e->s);
    }
  // Shared parameters: {alias: owner}.
  std::map<std::string, std::string> shared;
  if (const PyValue* sp = ms.Get("shared_params"); sp && sp->is_dict())
    for (const auto& [k, v] : sp->entries) {
      if (!k || !k->is_str() || !v || !v->is_str()) continue;
      CKPT_RETURN_IF_ERROR(check_name(k->s, "shared parameter name"));
      CKPT_RETURN_IF_ERROR(check_name(v->s, "shared parameter name"));
      shared[k->s] = v->s;
    }

  std::vector<ParamEntry> frozen;
  auto add_frozen = [&](const std::string& name, std::vector<int64_t> shape,
                        Impl::FrozenSource src, DType dt) {
    ParamEntry p;
    p.name = name;
    p.shape = std::move(shape);
    p.numel = Numel(p.shape);
    p.dtype = dt;
    p.frozen = true;
    I.frozen[name] = std::move(src);
    known.insert(name);
    frozen.push_back(std::move(p));
  };
  auto dtype_of = [&](const TorchTensorRef& t, const std::string& file) -> Result<DType> {
    if (!t.dtype) return Unimplemented(file + ": tensor of " + t.dtype_name + " (no ckpt dtype)");
    return *t.dtype;
  };
  // Frozen parameters: frozen_param_shapes + fragments (stage 2 and 3), else (stage 1) the
  // module's entries that are neither trainable, buffers nor aliases.
  const PyValue* fshapes = ms.Get("frozen_param_shapes");
  if (fshapes && fshapes->is_dict()) {
    for (const auto& [k, v] : fshapes->entries) {
      if (!k || !k->is_str()) return DataLoss(m0.path() + ": frozen_param_shapes key is not a name");
      CKPT_RETURN_IF_ERROR(check_name(k->s, "frozen parameter name"));
      CKPT_ASSIGN_OR_RETURN(auto shape, ShapeOf(v, m0.path() + ": frozen shape of '" + k->s + "'"),
                            "");
      Impl::FrozenSource src;
      std::optional<DType> dt;
      int64_t have = 0;
      for (size_t fi = 0; fi < (stage == 3 ? I.model.size() : 1); ++fi) {
        const PyValue* frags = I.model[fi].root().Get("frozen_param_fragments");
        const PyValue* t = frags ? Tensor(frags->Get(k->s)) : nullptr;
        if (!t)
          return DataLoss(I.model[fi].path() + ": frozen parameter '" + k->s +
                          "' has no fragment");
        const TorchTensorRef& ref = I.model[fi].tensor(*t);
        CKPT_RETURN_IF_ERROR(NoRepeats(I.model[fi], ref, "frozen fragment of '" + k->s + "'", true),
                             "");
        CKPT_ASSIGN_OR_RETURN(DType d, dtype_of(ref, I.model[fi].path()), "");
        if (dt && *dt != d)
          return DataLoss(I.model[fi].path() + ": fragments of '" + k->s + "' differ in dtype");
        dt = d;
        src.pieces.emplace_back(static_cast<int>(fi), &ref);
        have += ref.numel();
      }
      if (have < Numel(shape))
        return DataLoss(m0.path() + ": frozen parameter '" + k->s + "' fragments hold " +
                        std::to_string(have) + " elements, its shape needs " +
                        std::to_string(Numel(shape)));
      add_frozen(k->s, std::move(shape), std::move(src), dt.value_or(model_dtype));
    }
  }
  const std::set<std::string> buffer_set(I.info.buffers.begin(), I.info.buffers.end());
  if (module && module->is_dict()) {
    for (const auto& [k, v] : module->entries) {
      if (!k || !k->is_str() || known.count(k->s) || shared.count(k->s)) continue;
      const PyValue* t = Tensor(v);
      if (!t) continue;
      CKPT_RETURN_IF_ERROR(check_name(k->s, "module entry name"));
      const TorchTensorRef& ref = m0.tensor(*t);
      const bool is_buffer = buffer_set.count(k->s) > 0;
      // ZeRO-3 keeps partitioned parameters as empty placeholders in `module`.
      if (!is_buffer && (stage == 3 || ref.numel() == 0)) continue;
      CKPT_RETURN_IF_ERROR(NoRepeats(m0, ref, "module entry '" + k->s + "'", false), "");
      CKPT_ASSIGN_OR_RETURN(DType d, dtype_of(ref, m0.path()), "");
      Impl::FrozenSource src;
      src.pieces.emplace_back(0, &ref);
      add_frozen(k->s, ref.shape, std::move(src), d);
    }
  }
  for (const auto& b : I.info.buffers)
    if (!known.count(b)) return DataLoss(m0.path() + ": buffer '" + b + "' is not in module");

  // Order: the module's order where it names the parameter, then the rest.
  std::vector<ParamEntry> all;
  std::map<std::string, ParamEntry> pool;
  for (auto& p : trainable) pool.emplace(p.name, std::move(p));
  for (auto& p : frozen) pool.emplace(p.name, std::move(p));
  for (const auto& [alias, owner] : shared) {
    auto it = pool.find(owner);
    if (it == pool.end()) continue;  // zero_to_fp32 drops an alias of an unknown owner too
    if (pool.count(alias)) return DataLoss(m0.path() + ": shared parameter '" + alias + "' is also stored");
    ParamEntry a;
    a.name = alias;
    a.shape = it->second.shape;
    a.numel = it->second.numel;
    a.dtype = it->second.dtype;
    a.frozen = it->second.frozen;
    a.tied_to = owner;
    pool.emplace(alias, std::move(a));
  }
  if (module && module->is_dict())
    for (const auto& [k, v] : module->entries)
      if (k && k->is_str())
        if (auto it = pool.find(k->s); it != pool.end()) {
          all.push_back(std::move(it->second));
          pool.erase(it);
        }
  for (const auto* list : {&trainable, &frozen})
    for (const auto& p : *list)
      if (auto it = pool.find(p.name); it != pool.end()) {
        all.push_back(std::move(it->second));
        pool.erase(it);
      }
  for (auto& [n, p] : pool) all.push_back(std::move(p));
  M.params = std::move(all);

  M.partition.scheme = stage == 3 ? "deepspeed_per_param" : "deepspeed_flat";
  M.partition.alignment = kDefaultAlignment;
  {
    int64_t shard = 0;
    for (const auto& gt : I.groups[0]) shard += gt.length;
    M.partition.shard_numel.assign(static_cast<size_t>(files), shard);
  }

  // Counters, optimizer, scheduler, client state.
  auto int_of = [&](const char* key) -> int64_t {
    const PyValue* v = ms.Get(key);
    return v && v->AsInt() ? *v->AsInt() : 0;
  };
  M.counters.global_step = int_of("global_steps");
  M.counters.skipped_steps = int_of("skipped_steps");
  M.counters.samples_seen = int_of("global_samples");
  if (const PyValue* dpw = ms.Get("dp_world_size"); dpw && dpw->AsInt() && *dpw->AsInt() != files)
    return DataLoss(m0.path() + ": dp_world_size " + std::to_string(*dpw->AsInt()) + " but " +
                    std::to_string(files) + " optimizer files");
  if (const PyValue* mpw = ms.Get("mp_world_size"); mpw && mpw->AsInt() && *mpw->AsInt() != 1)
    return Unimplemented(m0.path() + ": tensor-parallel checkpoint (mp_world_size " +
                         std::to_string(*mpw->AsInt()) + ")");
  nlohmann::json opt = nlohmann::json::object();
  std::string type = "unknown";
  const PyValue* cfg = ms.Get("ds_config");
  if (cfg && cfg->is_dict()) {
    if (const PyValue* o = cfg->Get("optimizer"); o && o->is_dict())
      if (const PyValue* t = o->Get("type"); t && t->is_str()) {
        std::string lower;
        for (char c : t->s) lower += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
        bool adam_w_mode = true;
        if (const PyValue* ps = o->Get("params"); ps && ps->is_dict())
          if (const PyValue* aw = ps->Get("adam_w_mode"); aw && aw->AsInt())
            adam_w_mode = *aw->AsInt() != 0;
        type = lower == "adamw" || (lower == "adam" && adam_w_mode) ? "adamw" : lower;
      }
  }
  opt["type"] = type;
  nlohmann::json groups_json = nlohmann::json::array();
  for (const PyValue* pg : param_groups_json) {
    nlohmann::json gj = nlohmann::json::object();
    for (const char* key : {"lr", "eps", "weight_decay"})
      if (const PyValue* v = pg->Get(key); v && v->AsDouble()) gj[key] = *v->AsDouble();
    if (const PyValue* b = pg->Get("betas"); b && b->is_sequence() && b->items.size() == 2 &&
                                             b->items[0]->AsDouble() && b->items[1]->AsDouble()) {
      gj["beta1"] = *b->items[0]->AsDouble();
      gj["beta2"] = *b->items[1]->AsDouble();
    }
    groups_json.push_back(gj);
  }
  if (!groups_json.empty()) {
    for (const char* key : {"lr", "beta1", "beta2", "eps", "weight_decay"})
      if (groups_json[0].contains(key)) opt[key] = groups_json[0][key];
    bool same = true;
    for (const auto& gj : groups_json) same = same && gj == groups_json[0];
    if (!same) opt["param_groups"] = groups_json;  // next-update refuses mixed groups
  }
  opt["step"] = step ? static_cast<int64_t>(*step) : 0;
  M.optimizer = opt;
  M.dtypes = {{"master", "fp32"}, {"exp_avg", "fp32"}, {"exp_avg_sq", "fp32"},
              {"compute", model_dtype_name}};
  if (cfg) M.engine_config = PyToJson(m0.doc(), *cfg);
  if (const PyValue* sch = ms.Get("lr_scheduler"); sch && !sch->is_none())
    I.info.lr_scheduler = PyToJson(m0.doc(), *sch);
  // Client state: what engine.save_checkpoint(client_state=...) merged into the model states.
  static const std::set<std::string> kEngineKeys = {
      "module", "buffer_names", "optimizer", "param_shapes", "frozen_param_shapes",
      "shared_params", "frozen_param_fragments", "lr_scheduler", "data_sampler", "random_ltd",
      "sparse_tensor_module_names", "skipped_steps", "global_steps", "global_samples",
      "dp_world_size", "mp_world_size", "ds_config", "ds_version",
      "checkpoint_parallel_dimensions", "universal_checkpoint_info"};
  nlohmann::json client = nlohmann::json::object();
  for (const auto& [k, v] : ms.entries) {
    if (!k || !k->is_str() || kEngineKeys.count(k->s) || !v) continue;
    CKPT_RETURN_IF_ERROR(check_name(k->s, "client state key"));
    client[k->s] = PyToJson(m0.doc(), *v);
  }
  M.client_state = client;
  M.files.clear();
  for (int r = 0; r < files; ++r) {
    FileRecord fr;
    fr.rank = r;
    fr.path = I.info.optim_files[static_cast<size_t>(r)];
    auto size = env->FileSize(I.dir + "/" + fr.path);
    fr.bytes = size.ok() ? *size : 0;
    fr.compression = "none";
    M.files.push_back(std::move(fr));
  }
  I.zeros.clear();
  return DeepSpeedReader(std::move(impl));
}

Status DeepSpeedReader::ReadParamRange(std::string_view param, std::string_view state,
                                       int64_t begin, int64_t end, float* out) {
  Impl& I = *impl_;
  const ParamEntry* p = I.Owner(param);
  if (!p) return InvalidArgument("no parameter '" + std::string(param) + "' in " + I.dir);
  if (begin < 0 || end > p->numel || begin > end)
    return InvalidArgument("range outside parameter '" + p->name + "'");
  if (state != kMaster && state != kExpAvg && state != kExpAvgSq)
    return InvalidArgument("unknown state '" + std::string(state) + "'");
  if (p->frozen) {
    if (state != kMaster)
      return InvalidArgument("frozen parameter '" + p->name + "' has no " + std::string(state));
    CKPT_ASSIGN_OR_RETURN(auto raw, ReadFrozenBytes(p->name), "");
    const size_t es = DTypeSize(p->dtype);
    if (!FloatsToF32(p->dtype, raw.data() + static_cast<size_t>(begin) * es,
                     static_cast<size_t>(end - begin), out))
      return InvalidArgument("frozen parameter '" + p->name + "' is not floating point");
    return Status::Ok();
  }
  for (const auto& r : p->ranges) {
    const int64_t lo = std::max(begin, r.begin), hi = std::min(end, r.end);
    if (lo >= hi) continue;
    CKPT_RETURN_IF_ERROR(
        I.ReadStream(r.rank, state, r.shard_offset + (lo - r.begin), hi - lo, out + (lo - begin)),
        "parameter '" + p->name + "'");
  }
  return Status::Ok();
}

Status DeepSpeedReader::ReadPartition(int r, std::string_view state, int64_t offset, int64_t count,
                                      float* out) {
  Impl& I = *impl_;
  if (r < 0 || static_cast<size_t>(r) >= I.groups.size())
    return InvalidArgument(I.dir + ": no rank " + std::to_string(r));
  if (state != kMaster && state != kExpAvg && state != kExpAvgSq)
    return InvalidArgument("unknown state '" + std::string(state) + "'");
  const auto& groups = I.groups[static_cast<size_t>(r)];
  const int64_t length = groups.empty() ? 0 : groups.back().base + groups.back().length;
  if (offset < 0 || count < 0 || offset > length || count > length - offset)
    return InvalidArgument(I.info.optim_files[static_cast<size_t>(r)] + ": " +
                           std::to_string(count) + " elements from element " +
                           std::to_string(offset) + " run outside rank " + std::to_string(r) +
                           "'s partition of " + std::to_string(length));
  return I.ReadStream(r, state, offset, count, out);
}

std::optional<uint64_t> DeepSpeedReader::PartitionFileOffset(int r, std::string_view state,
                                                             int64_t offset) {
  Impl& I = *impl_;
  if (r < 0 || static_cast<size_t>(r) >= I.groups.size()) return std::nullopt;
  for (const auto& g : I.groups[static_cast<size_t>(r)]) {
    if (offset < g.base || offset >= g.base + g.length) continue;
    const TorchTensorRef* t = g.Of(state);
    // Padding past the saved elements lies nowhere in the file.
    if (!t || t->dtype != DType::kF32 || offset - g.base >= t->numel()) return std::nullopt;
    return I.optim[static_cast<size_t>(r)].ElementFileOffset(*t, offset - g.base);
  }
  return std::nullopt;
}

std::optional<uint64_t> DeepSpeedReader::FrozenFileOffset(std::string_view param) {
  Impl& I = *impl_;
  const ParamEntry* p = I.Owner(param);
  if (!p || !p->frozen) return std::nullopt;
  auto it = I.frozen.find(p->name);
  if (it == I.frozen.end() || it->second.pieces.empty()) return std::nullopt;
  const auto& [fi, t] = it->second.pieces.front();
  if (t->numel() < p->numel || t->itemsize != DTypeSize(p->dtype)) return std::nullopt;
  return I.model[static_cast<size_t>(fi)].ElementFileOffset(*t, 0);
}

Result<std::vector<uint8_t>> DeepSpeedReader::ReadFrozenBytes(std::string_view param) {
  const ParamEntry* p = impl_->Owner(param);
  if (!p || !p->frozen) return InvalidArgument("'" + std::string(param) + "' is not frozen");
  std::vector<uint8_t> out(static_cast<size_t>(p->numel) * DTypeSize(p->dtype));
  CKPT_RETURN_IF_ERROR(ReadFrozenInto(param, out.data(), out.size()), "");
  return out;
}

Status DeepSpeedReader::ReadFrozenInto(std::string_view param, void* out, uint64_t bytes) {
  Impl& I = *impl_;
  const ParamEntry* p = I.Owner(param);
  if (!p || !p->frozen) return InvalidArgument("'" + std::string(param) + "' is not frozen");
  auto it = I.frozen.find(p->name);
  if (it == I.frozen.end()) return Internal("frozen parameter without a source");
  const size_t es = DTypeSize(p->dtype);
  if (bytes != static_cast<uint64_t>(p->numel) * es)
    return InvalidArgument("frozen parameter '" + p->name + "' has " +
                           std::to_string(static_cast<uint64_t>(p->numel) * es) + " bytes, not " +
                           std::to_string(bytes));
  auto* dst = static_cast<uint8_t*>(out);
  int64_t have = 0;
  for (const auto& [fi, t] : it->second.pieces) {
    if (have >= p->numel) break;
    const int64_t n = std::min(t->numel(), p->numel - have);
    if (t->itemsize != es) return DataLoss(I.model[static_cast<size_t>(fi)].path() + ": dtype of '" + p->name + "' changed");
    CKPT_RETURN_IF_ERROR(I.model[static_cast<size_t>(fi)].ReadElementsChecked(
                             *t, 0, n, dst + static_cast<size_t>(have) * es),
                         "frozen parameter '" + p->name + "'");
    have += n;
  }
  if (have != p->numel) return DataLoss(I.dir + ": frozen parameter '" + p->name + "' is short");
  return Status::Ok();
}

void DeepSpeedReader::StreamVerify(bool defer) {
  impl_->stream_verify = true;
  impl_->defer = defer;
}

void DeepSpeedReader::VerifyOnFirstRead() { impl_->verify_first_read = true; }

void DeepSpeedReader::HashReadBytes() {
  Impl& I = *impl_;
  if (!I.defer) return;
  std::lock_guard<std::mutex> hashing(I.hash_mu);
  I.CrcPendingLocked();
}

Status DeepSpeedReader::VerifyStates(const std::vector<std::string>& states, int part, int parts) {
  Impl& I = *impl_;
  HashReadBytes();
  std::set<std::pair<int, std::string>> seen;  // a storage two tensors share is checked once
  int index = 0;
  for (int r = 0; r < static_cast<int>(I.groups.size()); ++r) {
    TorchFile& f = I.optim[static_cast<size_t>(r)];
    for (const auto& state : states) {
      for (const auto& g : I.groups[static_cast<size_t>(r)]) {
        const TorchTensorRef* t = g.Of(state);
        if (!t || !seen.insert({r, t->key}).second) continue;
        if (index++ % parts != part) continue;
        auto it = I.streams.find({r, t->key});
        if (it == I.streams.end() || it->second.broken) {
          CKPT_RETURN_IF_ERROR(f.VerifyStorage(*t), "");
          continue;
        }
        CKPT_ASSIGN_OR_RETURN(const TorchFile::StorageRecord rec, f.Storage(*t), "");
        CKPT_RETURN_IF_ERROR(I.CrcUpTo(r, *t, it->second, rec.size), "");
        CKPT_RETURN_IF_ERROR(f.CompareStorageCrc(*t, it->second.crc), "");
      }
    }
  }
  I.streams.clear();
  return Status::Ok();
}

Result<std::vector<Problem>> DeepSpeedReader::Check(bool progress) {
  Impl& I = *impl_;
  // Every record of every file read to its end and its CRC-32 checked, the files in parallel
  // (one thread each, up to 16, as check --deep reads rank files: more requests in flight and
  // the CRCs spread over the cores; a TorchFile is used by one thread at a time). Problems are
  // reported in file order: the optimizer files, then the model files.
  std::vector<std::pair<TorchFile*, const std::string*>> files;
  for (size_t r = 0; r < I.optim.size(); ++r)
    files.emplace_back(&I.optim[r], &I.info.optim_files[r]);
  for (size_t k = 0; k < I.model.size(); ++k)
    files.emplace_back(&I.model[k], &I.info.model_files[k]);
  std::vector<Status> verified;
  if (I.records_checked) {
    for (const auto& [f, name] : files) {
      auto it = I.record_checks.find(*name);
      verified.push_back(it != I.record_checks.end()
                             ? it->second
                             : Internal(*name + ": records not checked at open"));
    }
  } else {
    uint64_t total = 0;
    for (const auto& [f, name] : files) total += f->file_size();
    Progress bar("check", total, progress);
    verified = ForEachOnThreads(files.size(), 16, [&](size_t i) {
      return files[i].first->VerifyRecords([&](uint64_t n) { bar.Add(n); });
    });
    bar.Finish();
  }
  std::vector<Problem> problems;
  for (size_t i = 0; i < files.size(); ++i)
    if (!verified[i].ok()) problems.push_back({*files[i].second, "", verified[i].message()});
  // Nothing is read a second time. Open checked that every range of the parameter table lies
  // inside its partition's tensors, that every tensor's view fits its storage record and that
  // every frozen parameter's fragments hold its elements in one dtype; the CRC pass has just
  // checked every record's bytes. Reading them again through the table, as check did until
  // 2026-12-05, read the trainable parameters' bytes twice (until 04:30) and the frozen ones
  // twice (until 17:00: the base model of a LoRA checkpoint, docs/performance.md).
  return problems;
}

}  // namespace ckpt
