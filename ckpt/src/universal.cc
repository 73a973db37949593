// The universal layout's reader and its file's writer (ckpt/universal.h; docs/convert.md,
// "Universal layout"). What goes into the file is convert's (convert/src/universal.cc).
#include "ckpt/universal.h"

#include <algorithm>
#include <cstdio>
#include <map>
#include <nlohmann/json.hpp>

#include "ckpt/h5.h"
#include "ckpt/hash.h"
#include "ckpt/json.h"
#include "ckpt/root.h"
#include "ckpt/shape.h"
#include "manifest_fast.h"
#include "rank_file.h"
#include "zstd_filter.h"

namespace ckpt {
namespace {

constexpr int64_t kVerifyChunkBytes = 8 << 20;

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
  auto text = ReadCheckpointFileToString(env, *dir + "/" + std::string(kManifestFile),
                                         kMaxManifestBytes);
  if (!text.ok()) return false;
  // Only the top-level "kind": by simdjson (manifest_fast.h), or by nlohmann keeping only that
  // member where simdjson refuses the text. Any other value, or no "kind" string, is not
  // universal: opening it as a sharded tag names what is wrong.
  if (std::optional<std::string> kind = internal::ManifestKind(*text)) return *kind == "universal";
  auto parsed = ParseJsonKeeping(*text, "manifest", [](int depth, const std::string& key) {
    return depth == 1 && key == "kind";
  });
  if (!parsed.ok() || !parsed->is_object()) return false;
  const auto kind = parsed->find("kind");
  return kind != parsed->end() && kind->is_string() && *kind == "universal";
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
    const h5::Handle dapl = h5::NoExternalLinks();
    if (H5Lexists(file.get(), name.c_str(), dapl.get()) <= 0) {
      // H5Lexists fails on a missing intermediate group; either way it is absent.
      H5Eclear2(H5E_DEFAULT);
      return DataLoss(Label() + ": dataset /" + name + " is missing");
    }
    h5::Handle d = h5::Dataset(H5Dopen2(file.get(), name.c_str(), dapl.get()));
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
    CKPT_RETURN_IF_ERROR(h5::SelectFlatRange(fspace.get(), shape, begin, end),
                         Label() + ": /" + name);
    const hsize_t n = static_cast<hsize_t>(end - begin);
    h5::Handle mspace = h5::Space(H5Screate_simple(1, &n, nullptr));
    // A zstd chunk must decompress to exactly a chunk's bytes (HDF5 copies a whole chunk out
    // of whatever the filter returns).
    const size_t chunk = h5::ChunkBytes(d);
    if (chunk == 0)
      return DataLoss(Label() + ": dataset /" + name + ": unreadable type or chunk size");
    h5::ExpectChunkBytes expect(chunk);
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
  CKPT_ASSIGN_OR_RETURN(impl->manifest, ReadTagManifest(impl->dir, impl->env));
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
  const FileRecord& rec = m.files[0];
  CKPT_ASSIGN_OR_RETURN(std::unique_ptr<RandomAccessFile> file,
                        impl->env->NewCheckpointFile(impl->file_path));
  CKPT_ASSIGN_OR_RETURN(impl->file,
                        h5::OpenVerified(*file, impl->file_path, impl->file_path, size,
                                         rec.data_extents, rec.metadata_xxh3, rec.xxh3));
  auto format = h5::ReadStringAttr(impl->file.get(), "format");
  if (!format.ok() || *format != kUniversalFormat) {
    H5Eclear2(H5E_DEFAULT);
    return DataLoss(impl->file_path + ": root attribute format is " +
                    (format.ok() ? "'" + Excerpt(*format, 64) + "'" : std::string("missing")) +
                    ", not '" + std::string(kUniversalFormat) + "'");
  }
  CKPT_ASSIGN_OR_RETURN(std::string version, h5::ReadStringAttr(impl->file.get(), "format_version"),
                        impl->file_path);
  int major = 0, minor = 0;
  if (std::sscanf(version.c_str(), "%d.%d", &major, &minor) != 2)
    return DataLoss(impl->file_path + ": bad format_version '" + Excerpt(version, 64) + "'");
  if (major > kUniversalMajor)
    return Unimplemented(impl->file_path + ": written by universal layout " + Excerpt(version, 64) +
                         ", this reader supports " + std::to_string(kUniversalMajor) +
                         ".x; upgrade ckpt to read it");
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
  if (!FloatsToF32(stored, raw.data(), raw.size() / DTypeSize(stored), out))
    return InvalidArgument("parameter '" + p->name + "' is not floating point");
  return Status::Ok();
}

Result<std::vector<uint8_t>> UniversalReader::ReadDatasetBytes(std::string_view name) const {
  CKPT_ASSIGN_OR_RETURN(const DatasetRecord* rec, impl_->Record(name), "");
  std::vector<uint8_t> out(rec->bytes);
  CKPT_RETURN_IF_ERROR(ReadDatasetInto(name, out.data(), out.size()), "");
  return out;
}

Status UniversalReader::ReadDatasetInto(std::string_view name, void* out, uint64_t bytes) const {
  CKPT_ASSIGN_OR_RETURN(const DatasetRecord* rec, impl_->Record(name), "");
  const int64_t n = Numel(rec->shape);
  if (static_cast<uint64_t>(n) * DTypeSize(rec->dtype) != rec->bytes)
    return DataLoss(impl_->dir + ": manifest record of /" + rec->name + " is inconsistent");
  if (bytes != rec->bytes)
    return DataLoss(impl_->Label() + ": dataset /" + rec->name + " has " +
                    std::to_string(rec->bytes) + " bytes, the parameter table says " +
                    std::to_string(bytes));
  CKPT_RETURN_IF_ERROR(impl_->ReadRange(rec->name, rec->shape, rec->dtype, 0, n, out), "");
  const std::string got = DigestHex(Xxh3(out, static_cast<size_t>(bytes)));
  if (!rec->xxh3.empty() && got != rec->xxh3)
    return DataLoss(impl_->Label() + ": dataset /" + rec->name + ": checksum mismatch (manifest " +
                    rec->xxh3 + ", data " + got + ")");
  return Status::Ok();
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

Result<FileRecord> WriteUniversalFile(const std::string& path,
                                      const UniversalFileContents& contents,
                                      const SaveOptions& options) {
  internal::RankFileHeader header;
  header.tag = contents.tag;
  header.portable = true;  // superblock 0 (docs/convert.md), the same bytes for the same content
  header.root = [&](int64_t id) -> Status {
    const hid_t f = static_cast<hid_t>(id);
    CKPT_RETURN_IF_ERROR(h5::WriteStringAttr(f, "format", std::string(kUniversalFormat)), "");
    CKPT_RETURN_IF_ERROR(h5::WriteStringAttr(f, "format_version",
                                             std::to_string(kUniversalMajor) + "." +
                                                 std::to_string(kUniversalMinor)),
                         "");
    CKPT_RETURN_IF_ERROR(h5::WriteStringAttr(f, "tag", contents.tag), "");
    CKPT_RETURN_IF_ERROR(h5::WriteIntAttr(f, "source_dp_world_size", contents.source_dp_world_size),
                         "");
    CKPT_RETURN_IF_ERROR(h5::WriteIntAttr(f, "source_zero_stage", contents.source_zero_stage), "");
    h5::Handle lcpl = h5::Plist(H5Pcreate(H5P_LINK_CREATE));
    H5Pset_create_intermediate_group(lcpl.get(), 1);
    h5::Handle gcpl = h5::Plist(H5Pcreate(H5P_GROUP_CREATE));
    H5Pset_obj_track_times(gcpl.get(), false);
    for (const auto& p : contents.params) {
      const std::string group = UniversalParamGroup(p.name);
      const std::string where = "parameter '" + p.name + "'";
      h5::Handle g = h5::Group(H5Gcreate2(f, group.c_str(), lcpl.get(), gcpl.get(), H5P_DEFAULT));
      if (!g.valid()) return IOError("create group /" + group + ": " + h5::ErrorText());
      CKPT_RETURN_IF_ERROR(h5::WriteStringAttr(g.get(), "name", p.name), where);
      CKPT_RETURN_IF_ERROR(h5::WriteIntAttr(g.get(), "frozen", p.frozen ? 1 : 0), where);
      CKPT_RETURN_IF_ERROR(h5::WriteStringAttr(g.get(), "dtype", std::string(DTypeName(p.dtype))),
                           where);
    }
    return Status::Ok();
  };
  SaveOptions so;
  so.env = options.env;
  so.fill_window_bytes = options.fill_window_bytes;
  so.piece_bytes = options.piece_bytes;
  CKPT_ASSIGN_OR_RETURN(internal::RankFileWritten w,
                        internal::WriteRankFile(path, header, contents.datasets, so), "");
  FileRecord fr;
  fr.rank = 0;
  fr.path = std::string(kUniversalFile);
  fr.bytes = w.bytes;
  fr.xxh3 = std::move(w.file_xxh3);
  fr.compression = "none";
  fr.datasets = std::move(w.datasets);
  fr.data_extents = std::move(w.data_extents);
  fr.metadata_xxh3 = std::move(w.metadata_xxh3);
  return fr;
}

}  // namespace ckpt
