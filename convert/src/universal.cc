// The universal layout (docs/convert.md, "Universal layout"): writer and reader.
//
// Write protocol (ConvertToUniversal):
//  1. Open the source; refuse a non-empty OUT; create the staging directory next to OUT.
//  2. Write staging/universal.h5: every stored parameter's full-shape state, in table order,
//     read in 4 Mi-element pieces and hashed as it is written; then the scheduler, the data
//     position and every source rank's blob/json datasets.
//  3. Close the HDF5 file (errors from the final flush surface here), fsync it, hash it.
//  4. Finish the source verification: every source dataset read has matched its XXH3.
//  5. Write staging/manifest.json (temp name, fsync, rename).
//  6. Rename the staging directory to OUT and fsync the parent (output_dir.h).
#include "convert/universal.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <map>

#include "ckpt/hash.h"
#include "ckpt/progress.h"
#include "ckpt/root.h"
#include "ckpt/h5.h"
#include "h5_dataspace.h"
#include "convert/output_dir.h"
#include "state_source.h"

namespace ckpt::convert {
namespace {

constexpr int64_t kChunkElements = 1 << 22;
constexpr int64_t kVerifyChunkBytes = 8 << 20;

int64_t Numel(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string UtcNow(int64_t* unix_out) {
  std::time_t t = std::time(nullptr);
  *unix_out = static_cast<int64_t>(t);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

}  // namespace

std::string UniversalParamGroup(std::string_view param) {
  std::string out = "params/";
  for (char c : param) {
    if (c == '%')
      out += "%25";
    else if (c == '/')
      out += "%2F";
    else
      out += c;
  }
  return out;
}

std::string UniversalSourceGroup(int rank) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "source/rank_%05d", rank);
  return buf;
}

bool IsUniversal(const std::string& path, const std::string& tag, Env* env) {
  if (!env) env = Env::Default();
  auto dir = ResolveTagDir(path, tag, env);
  if (!dir.ok()) return false;
  auto text = env->ReadFileToString(*dir + "/" + std::string(kManifestFile));
  if (!text.ok()) return false;
  auto j = nlohmann::json::parse(*text, nullptr, /*allow_exceptions=*/false);
  return j.is_object() && j.value("kind", std::string()) == "universal";
}

// ---- reader -------------------------------------------------------------------------------

struct UniversalReader::Impl {
  Env* env = nullptr;
  std::string dir;
  std::string file_path;
  Manifest manifest;
  h5::Handle file;
  std::map<std::string, h5::Handle> datasets;
  uint64_t bytes_read = 0;

  std::string Label() const { return file_path; }

  Result<hid_t> Open(const std::string& name) {
    auto it = datasets.find(name);
    if (it != datasets.end()) return it->second.get();
    h5::Init();
    if (H5Lexists(file.get(), name.c_str(), H5P_DEFAULT) <= 0) {
      // H5Lexists fails on a missing intermediate group; either way it is absent.
      H5Eclear2(H5E_DEFAULT);
      return DataLoss(Label() + ": dataset /" + name + " is missing");
    }
    h5::Handle d = h5::Dataset(H5Dopen2(file.get(), name.c_str(), H5P_DEFAULT));
    if (!d.valid()) return DataLoss(Label() + ": dataset /" + name + ": " + h5::ErrorText());
    hid_t id = d.get();
    datasets.emplace(name, std::move(d));
    return id;
  }

  // Reads flat elements [begin, end) of dataset `name` (shape, element type dtype) as raw
  // stored bytes into out.
  Status ReadRange(const std::string& name, const std::vector<int64_t>& shape, DType dtype,
                   int64_t begin, int64_t end, void* out) {
    if (end <= begin) return Status::Ok();
    CKPT_ASSIGN_OR_RETURN(hid_t d, Open(name), "");
    h5::Handle fspace = h5::Space(H5Dget_space(d));
    const int nd = H5Sget_simple_extent_ndims(fspace.get());
    std::vector<hsize_t> dims(static_cast<size_t>(std::max(nd, 0)));
    if (nd < 0 || H5Sget_simple_extent_dims(fspace.get(), dims.data(), nullptr) < 0)
      return DataLoss(Label() + ": dataset /" + name + ": " + h5::ErrorText());
    if (std::vector<int64_t>(dims.begin(), dims.end()) != shape)
      return DataLoss(Label() + ": dataset /" + name + " has another shape than the manifest");
    h5::Handle ftype = h5::Type(H5Dget_type(d));
    if (H5Tget_size(ftype.get()) != DTypeSize(dtype))
      return DataLoss(Label() + ": dataset /" + name + " has another element size than its dtype " +
                      std::string(DTypeName(dtype)));
    CKPT_RETURN_IF_ERROR(SelectFlatRange(fspace.get(), shape, begin, end),
                         Label() + ": /" + name);
    const hsize_t n = static_cast<hsize_t>(end - begin);
    h5::Handle mspace = h5::Space(H5Screate_simple(1, &n, nullptr));
    if (H5Dread(d, h5::MemType(dtype), mspace.get(), fspace.get(), H5P_DEFAULT, out) < 0)
      return DataLoss(Label() + ": read /" + name + ": " + h5::ErrorText());
    bytes_read += n * DTypeSize(dtype);
    return Status::Ok();
  }

  Result<const DatasetRecord*> Record(std::string_view name) const {
    const DatasetRecord* rec = manifest.FindDataset(0, name);
    if (!rec) return NotFound(dir + ": the manifest lists no dataset '" + std::string(name) + "'");
    return rec;
  }
};

UniversalReader::UniversalReader(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
UniversalReader::UniversalReader(UniversalReader&&) noexcept = default;
UniversalReader& UniversalReader::operator=(UniversalReader&&) noexcept = default;
UniversalReader::~UniversalReader() = default;

Result<UniversalReader> UniversalReader::Open(const std::string& dir_arg, Env* env) {
  auto impl = std::make_unique<Impl>();
  impl->env = env ? env : Env::Default();
  impl->dir = TrimSlashes(dir_arg);
  const std::string mpath = impl->dir + "/" + std::string(kManifestFile);
  auto text = impl->env->ReadFileToString(mpath);
  if (!text.ok()) {
    if (text.status().code() == StatusCode::kNotFound)
      return NotFound(mpath + " is missing (not a checkpoint)");
    return text.status();
  }
  CKPT_ASSIGN_OR_RETURN(impl->manifest, ParseManifest(*text, mpath), "");
  const Manifest& m = impl->manifest;
  if (m.kind != "universal")
    return FailedPrecondition(impl->dir + " is a " + m.kind + " checkpoint, not universal");
  if (m.files.size() != 1 || m.files[0].path != kUniversalFile)
    return DataLoss(mpath + ": a universal manifest lists exactly one file, " +
                    std::string(kUniversalFile));
  impl->file_path = impl->dir + "/" + std::string(kUniversalFile);
  if (!impl->env->Exists(impl->file_path))
    return DataLoss(impl->file_path + " is missing (manifest lists it)");
  CKPT_ASSIGN_OR_RETURN(uint64_t size, impl->env->FileSize(impl->file_path), impl->file_path);
  if (m.files[0].bytes != 0 && size != m.files[0].bytes)
    return DataLoss(impl->file_path + " has " + std::to_string(size) +
                    " bytes, the manifest records " + std::to_string(m.files[0].bytes) +
                    " (truncated or replaced)");
  h5::Init();
  impl->file = h5::File(H5Fopen(impl->file_path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT));
  if (!impl->file.valid())
    return DataLoss(impl->file_path + ": not a readable HDF5 file: " + h5::ErrorText());
  auto format = h5::ReadStringAttr(impl->file.get(), "format");
  if (!format.ok() || *format != kUniversalFormat)
    return DataLoss(impl->file_path + ": root attribute format is not '" +
                    std::string(kUniversalFormat) + "'");
  CKPT_ASSIGN_OR_RETURN(std::string version, h5::ReadStringAttr(impl->file.get(), "format_version"),
                        impl->file_path);
  int major = 0, minor = 0;
  if (std::sscanf(version.c_str(), "%d.%d", &major, &minor) != 2)
    return DataLoss(impl->file_path + ": bad format_version '" + version + "'");
  if (major > kUniversalMajor)
    return Unimplemented(impl->file_path + ": written by universal layout " + version +
                         ", this reader supports " + std::to_string(kUniversalMajor) + ".x");
  return UniversalReader(std::move(impl));
}

const Manifest& UniversalReader::manifest() const { return impl_->manifest; }
const std::string& UniversalReader::dir() const { return impl_->dir; }
int UniversalReader::source_ranks() const { return impl_->manifest.topology.dp_world_size; }
uint64_t UniversalReader::bytes_read() const { return impl_->bytes_read; }

Status UniversalReader::ReadParamRange(std::string_view param, std::string_view state,
                                       int64_t begin, int64_t end, float* out) const {
  const Manifest& m = impl_->manifest;
  const ParamEntry* p = m.FindParam(param);
  if (!p) return NotFound(impl_->dir + ": no parameter '" + std::string(param) + "'");
  if (!p->tied_to.empty()) p = m.FindParam(p->tied_to);
  if (!p)
    return DataLoss(impl_->dir + ": '" + std::string(param) + "' is tied to a missing parameter");
  if (state != kMaster && state != kExpAvg && state != kExpAvgSq)
    return InvalidArgument("unknown state '" + std::string(state) + "'");
  if (p->frozen && state != kMaster)
    return InvalidArgument("frozen parameter '" + p->name + "' has no " + std::string(state));
  if (begin < 0 || end > p->numel || begin > end)
    return InvalidArgument("range [" + std::to_string(begin) + ", " + std::to_string(end) +
                           ") outside parameter '" + p->name + "'");
  const std::string name = UniversalParamGroup(p->name) + "/" + std::string(state);
  const DType stored = p->frozen ? p->dtype : DType::kF32;
  if (stored == DType::kF32) return impl_->ReadRange(name, p->shape, stored, begin, end, out);
  std::vector<uint8_t> raw(static_cast<size_t>(end - begin) * DTypeSize(stored));
  CKPT_RETURN_IF_ERROR(impl_->ReadRange(name, p->shape, stored, begin, end, raw.data()), "");
  for (int64_t i = 0; i < end - begin; ++i) {
    const uint8_t* q = raw.data() + static_cast<size_t>(i) * DTypeSize(stored);
    if (stored == DType::kF64) {
      double d;
      std::memcpy(&d, q, 8);
      out[i] = static_cast<float>(d);
    } else if (stored == DType::kBF16 || stored == DType::kF16) {
      uint16_t h;
      std::memcpy(&h, q, 2);
      out[i] = stored == DType::kBF16 ? Bf16ToFloat(h) : Fp16ToFloat(h);
    } else {
      return InvalidArgument("parameter '" + p->name + "' is not floating point");
    }
  }
  return Status::Ok();
}

Result<std::vector<uint8_t>> UniversalReader::ReadDatasetBytes(std::string_view name) const {
  CKPT_ASSIGN_OR_RETURN(const DatasetRecord* rec, impl_->Record(name), "");
  const int64_t n = Numel(rec->shape);
  if (static_cast<uint64_t>(n) * DTypeSize(rec->dtype) != rec->bytes)
    return DataLoss(impl_->dir + ": manifest record of /" + rec->name + " is inconsistent");
  std::vector<uint8_t> out(rec->bytes);
  CKPT_RETURN_IF_ERROR(impl_->ReadRange(rec->name, rec->shape, rec->dtype, 0, n, out.data()), "");
  const std::string got = DigestHex(Xxh3(out.data(), out.size()));
  if (!rec->xxh3.empty() && got != rec->xxh3)
    return DataLoss(impl_->Label() + ": dataset /" + rec->name + ": checksum mismatch (manifest " +
                    rec->xxh3 + ", data " + got + ")");
  return out;
}

Status UniversalReader::VerifyDataset(std::string_view name) const {
  CKPT_ASSIGN_OR_RETURN(const DatasetRecord* rec, impl_->Record(name), "");
  const int64_t n = Numel(rec->shape);
  const size_t es = DTypeSize(rec->dtype);
  const int64_t step = std::max<int64_t>(1, kVerifyChunkBytes / static_cast<int64_t>(es));
  std::vector<uint8_t> buf;
  Xxh3Stream h;
  for (int64_t b = 0; b < n; b += step) {
    const int64_t e = std::min(n, b + step);
    buf.resize(static_cast<size_t>(e - b) * es);
    CKPT_RETURN_IF_ERROR(impl_->ReadRange(rec->name, rec->shape, rec->dtype, b, e, buf.data()), "");
    h.Update(buf.data(), buf.size());
  }
  if (!rec->xxh3.empty() && h.HexDigest() != rec->xxh3)
    return DataLoss(impl_->Label() + ": dataset /" + rec->name + ": checksum mismatch (manifest " +
                    rec->xxh3 + ", data " + h.HexDigest() + ")");
  return Status::Ok();
}

// ---- writer -------------------------------------------------------------------------------

namespace {

class UniversalWriter {
 public:
  explicit UniversalWriter(hid_t file) : file_(file) {
    lcpl_ = h5::Plist(H5Pcreate(H5P_LINK_CREATE));
    H5Pset_create_intermediate_group(lcpl_.get(), 1);
    dcpl_ = h5::Plist(H5Pcreate(H5P_DATASET_CREATE));
    H5Pset_obj_track_times(dcpl_.get(), false);  // same content, same bytes
    gcpl_ = h5::Plist(H5Pcreate(H5P_GROUP_CREATE));
    H5Pset_obj_track_times(gcpl_.get(), false);
  }

  Result<h5::Handle> CreateGroup(const std::string& name) {
    h5::Handle g =
        h5::Group(H5Gcreate2(file_, name.c_str(), lcpl_.get(), gcpl_.get(), H5P_DEFAULT));
    if (!g.valid()) return IOError("create group /" + name + ": " + h5::ErrorText());
    return g;
  }

  // Creates dataset `name` and returns its handle; the record is appended by Finish*.
  Result<h5::Handle> CreateDataset(const std::string& name, DType dtype,
                                   const std::vector<int64_t>& shape, const std::string& kind,
                                   const std::string& blob_kind) {
    h5::Handle space = SpaceFor(shape);
    h5::Handle d = h5::Dataset(H5Dcreate2(file_, name.c_str(), h5::FileType(dtype), space.get(),
                                          lcpl_.get(), dcpl_.get(), H5P_DEFAULT));
    if (!d.valid()) return IOError("create dataset /" + name + ": " + h5::ErrorText());
    CKPT_RETURN_IF_ERROR(h5::WriteStringAttr(d.get(), "dtype", std::string(DTypeName(dtype))),
                         "/" + name);
    CKPT_RETURN_IF_ERROR(h5::WriteStringAttr(d.get(), "kind", kind), "/" + name);
    if (!blob_kind.empty())
      CKPT_RETURN_IF_ERROR(h5::WriteStringAttr(d.get(), "blob_kind", blob_kind), "/" + name);
    return d;
  }

  Status WriteRange(hid_t d, const std::string& name, const std::vector<int64_t>& shape,
                    DType dtype, int64_t begin, int64_t end, const void* data) {
    if (end <= begin) return Status::Ok();
    h5::Handle fspace = h5::Space(H5Dget_space(d));
    CKPT_RETURN_IF_ERROR(SelectFlatRange(fspace.get(), shape, begin, end), "/" + name);
    const hsize_t n = static_cast<hsize_t>(end - begin);
    h5::Handle mspace = h5::Space(H5Screate_simple(1, &n, nullptr));
    if (H5Dwrite(d, h5::MemType(dtype), mspace.get(), fspace.get(), H5P_DEFAULT, data) < 0)
      return IOError("write /" + name + ": " + h5::ErrorText());
    return Status::Ok();
  }

  // A whole dataset from memory.
  Status WriteWhole(const std::string& name, DType dtype, const std::vector<int64_t>& shape,
                    const std::string& kind, const std::string& blob_kind,
                    const std::vector<uint8_t>& bytes) {
    CKPT_ASSIGN_OR_RETURN(h5::Handle d, CreateDataset(name, dtype, shape, kind, blob_kind), "");
    CKPT_RETURN_IF_ERROR(WriteRange(d.get(), name, shape, dtype, 0, Numel(shape), bytes.data()),
                         "");
    CKPT_RETURN_IF_ERROR(d.Close("close /" + name), "");
    AddRecord(name, dtype, shape, kind, blob_kind, DigestHex(Xxh3(bytes.data(), bytes.size())));
    return Status::Ok();
  }

  void AddRecord(const std::string& name, DType dtype, const std::vector<int64_t>& shape,
                 const std::string& kind, const std::string& blob_kind, std::string xxh3) {
    DatasetRecord r;
    r.name = name;
    r.kind = kind;
    r.blob_kind = blob_kind;
    r.dtype = dtype;
    r.shape = shape;
    r.bytes = static_cast<uint64_t>(Numel(shape)) * DTypeSize(dtype);
    r.xxh3 = std::move(xxh3);
    records_.push_back(std::move(r));
  }

  std::vector<DatasetRecord>& records() { return records_; }

 private:
  hid_t file_;
  h5::Handle lcpl_, dcpl_, gcpl_;
  std::vector<DatasetRecord> records_;
};

Status WriteUniversalFile(StateSource& src, const std::string& path, ToUniversalReport& report,
                          bool progress_on, std::vector<DatasetRecord>* records) {
  const Manifest& m = src.manifest();
  h5::Init();
  h5::Handle fapl = h5::Plist(H5Pcreate(H5P_FILE_ACCESS));
  H5Pset_libver_bounds(fapl.get(), H5F_LIBVER_EARLIEST, H5F_LIBVER_V18);
  h5::Handle file = h5::File(H5Fcreate(path.c_str(), H5F_ACC_EXCL, H5P_DEFAULT, fapl.get()));
  if (!file.valid()) return IOError("create " + path + ": " + h5::ErrorText());
  const hid_t f = file.get();
  CKPT_RETURN_IF_ERROR(h5::WriteStringAttr(f, "format", std::string(kUniversalFormat)), path);
  CKPT_RETURN_IF_ERROR(
      h5::WriteStringAttr(f, "format_version",
                          std::to_string(kUniversalMajor) + "." + std::to_string(kUniversalMinor)),
      path);
  CKPT_RETURN_IF_ERROR(h5::WriteStringAttr(f, "tag", m.tag), path);
  CKPT_RETURN_IF_ERROR(h5::WriteIntAttr(f, "source_dp_world_size", src.source_ranks()), path);
  CKPT_RETURN_IF_ERROR(h5::WriteIntAttr(f, "source_zero_stage", m.topology.zero_stage), path);

  uint64_t total = 0;
  for (const auto& p : m.params) {
    if (!p.tied_to.empty()) continue;
    total += p.frozen ? static_cast<uint64_t>(p.numel) * DTypeSize(p.dtype)
                      : static_cast<uint64_t>(p.numel) * 12;
  }
  Progress progress("to-universal", total, progress_on);
  UniversalWriter w(f);
  std::vector<float> buf;
  for (const auto& p : m.params) {
    if (!p.tied_to.empty()) continue;
    const std::string group = UniversalParamGroup(p.name);
    const std::string where = "parameter '" + p.name + "'";
    CKPT_ASSIGN_OR_RETURN(h5::Handle g, w.CreateGroup(group), where);
    CKPT_RETURN_IF_ERROR(h5::WriteStringAttr(g.get(), "name", p.name), where);
    CKPT_RETURN_IF_ERROR(h5::WriteIntAttr(g.get(), "frozen", p.frozen ? 1 : 0), where);
    CKPT_RETURN_IF_ERROR(h5::WriteStringAttr(g.get(), "dtype", std::string(DTypeName(p.dtype))),
                         where);
    if (p.frozen) {
      CKPT_ASSIGN_OR_RETURN(auto raw, src.ReadFrozenBytes(p), where);
      if (raw.size() != static_cast<uint64_t>(p.numel) * DTypeSize(p.dtype))
        return DataLoss(where + ": frozen dataset size does not match the parameter table");
      CKPT_RETURN_IF_ERROR(
          w.WriteWhole(group + "/" + std::string(kMaster), p.dtype, p.shape, "tensor", "", raw),
          where);
      progress.Add(raw.size());
      ++report.params_written;
      continue;
    }
    for (std::string_view state : {kMaster, kExpAvg, kExpAvgSq}) {
      const std::string name = group + "/" + std::string(state);
      CKPT_ASSIGN_OR_RETURN(h5::Handle d, w.CreateDataset(name, DType::kF32, p.shape, "tensor", ""),
                            where);
      Xxh3Stream h;
      for (int64_t b = 0; b < p.numel; b += kChunkElements) {
        const int64_t e = std::min(p.numel, b + kChunkElements);
        buf.resize(static_cast<size_t>(e - b));
        CKPT_RETURN_IF_ERROR(src.ReadParamRange(p, state, b, e, buf.data()), where);
        CKPT_RETURN_IF_ERROR(w.WriteRange(d.get(), name, p.shape, DType::kF32, b, e, buf.data()),
                             path);
        h.Update(buf.data(), buf.size() * 4);
        progress.Add(static_cast<uint64_t>(e - b) * 4);
      }
      CKPT_RETURN_IF_ERROR(d.Close("close /" + name), path);
      w.AddRecord(name, DType::kF32, p.shape, "tensor", "", h.HexDigest());
    }
    ++report.params_written;
  }
  // Scheduler and data position: rank 0's (engine_min keeps both global), then every source
  // rank's blob and json datasets unchanged, for provenance.
  for (const auto& ex : src.RankExtras(0)) {
    if (ex.name != kScheduler && ex.name != kDataPosition) continue;
    CKPT_ASSIGN_OR_RETURN(auto bytes, src.ReadRankExtra(0, ex), ex.name);
    CKPT_RETURN_IF_ERROR(w.WriteWhole(ex.name, ex.record.dtype, ex.record.shape, ex.record.kind,
                                      ex.record.blob_kind, bytes),
                         path);
  }
  for (int r = 0; r < src.source_ranks(); ++r) {
    for (const auto& ex : src.RankExtras(r)) {
      CKPT_ASSIGN_OR_RETURN(auto bytes, src.ReadRankExtra(r, ex),
                            "source rank " + std::to_string(r));
      CKPT_RETURN_IF_ERROR(
          w.WriteWhole(UniversalSourceGroup(r) + "/" + ex.name, ex.record.dtype, ex.record.shape,
                       ex.record.kind, ex.record.blob_kind, bytes),
          path);
    }
  }
  CKPT_RETURN_IF_ERROR(file.Close("close " + path), "");
  progress.Finish();
  *records = std::move(w.records());
  return Status::Ok();
}

}  // namespace

Result<ToUniversalReport> ConvertToUniversal(const std::string& src_path, const std::string& out,
                                             const ToUniversalOptions& opts) {
  Env* env = opts.env ? opts.env : Env::Default();
  CKPT_ASSIGN_OR_RETURN(auto src, OpenStateSource(src_path, opts.tag, /*stream_verify=*/true, env),
                        "");
  ToUniversalReport report;
  report.source_dir = src->dir();
  report.out = out;
  report.tag = src->manifest().tag;
  report.source_ranks = src->source_ranks();
  report.skipped = src->UnusedTensors();

  CKPT_ASSIGN_OR_RETURN(StagedOutput staged, StagedOutput::Begin(out, env), "");
  const std::string path = staged.staging() + "/" + std::string(kUniversalFile);
  CKPT_RETURN_IF_ERROR(env->BeginExternalWrite(path), "");
  std::vector<DatasetRecord> records;
  CKPT_RETURN_IF_ERROR(WriteUniversalFile(*src, path, report, opts.progress, &records), "");
  CKPT_RETURN_IF_ERROR(env->SyncFile(path), "fsync " + path);
  CKPT_RETURN_IF_ERROR(
      src->FinishVerification({std::string(kMaster), std::string(kExpAvg), std::string(kExpAvgSq)}),
      src->dir());
  report.bytes_read = src->bytes_read();

  Manifest m = src->manifest();
  m.kind = "universal";
  for (auto& p : m.params) p.ranges.clear();
  FileRecord fr;
  fr.rank = 0;
  fr.path = std::string(kUniversalFile);
  CKPT_ASSIGN_OR_RETURN(fr.bytes, env->FileSize(path), path);
  CKPT_ASSIGN_OR_RETURN(fr.xxh3, Xxh3FileHex(path), path);
  fr.compression = "none";
  fr.datasets = std::move(records);
  m.files = {std::move(fr)};
  m.created_utc = UtcNow(&m.created_unix);
  m.format = std::string(kFormatName);
  m.version_major = kFormatMajor;
  m.version_minor = kFormatMinor;
  m.writer = std::string(kWriterVersion);
  CKPT_RETURN_IF_ERROR(ValidateManifest(m), "universal manifest");
  report.file_bytes = m.files[0].bytes;
  CKPT_RETURN_IF_ERROR(WriteFileAtomic(env, staged.staging() + "/" + std::string(kManifestFile),
                                       SerializeManifest(m, 2)),
                       "write manifest");
  CKPT_RETURN_IF_ERROR(staged.Commit(), "");
  return report;
}

}  // namespace ckpt::convert
