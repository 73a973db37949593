// The universal layout's writer, `ckpt to-universal` (docs/convert.md, "Universal layout"); the
// reader is the format library's (ckpt/universal.h).
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
#include <map>

#include "ckpt/shape.h"
#include "ckpt/h5.h"
#include "ckpt/hash.h"
#include "ckpt/progress.h"
#include "ckpt/root.h"
#include "ckpt/state_source.h"
#include "ckpt/universal.h"
#include "ckpt/utc_time.h"
#include "convert/output_dir.h"

namespace ckpt::convert {
namespace {

constexpr int64_t kChunkElements = 1 << 22;

}  // namespace

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
    h5::Handle space = h5::SpaceFor(shape);
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
    CKPT_RETURN_IF_ERROR(h5::SelectFlatRange(fspace.get(), shape, begin, end), "/" + name);
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
      CKPT_ASSIGN_OR_RETURN(auto raw, src.ReadFrozenBytes(p.name));  // names the parameter
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
        CKPT_RETURN_IF_ERROR(src.ReadParamRange(p.name, state, b, e, buf.data()));
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
  SourceOptions so;
  so.tag = opts.tag;
  so.env = env;
  so.stream_verify = true;
  CKPT_ASSIGN_OR_RETURN(auto src, OpenStateSource(src_path, so), "");
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
  CKPT_RETURN_IF_ERROR(h5::SealFile(env, path, fr.bytes, &fr.data_extents, &fr.metadata_xxh3));
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
