#include "manifest_fast.h"

#include <simdjson.h>

#include <algorithm>
#include <cstdio>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "ckpt/hash.h"

namespace ckpt::internal {
namespace {

using simdjson::dom::array;
using simdjson::dom::element;
using simdjson::dom::object;

// Half of ParseJson's limit (kMaxJsonDepth): whatever simdjson accepts, nlohmann accepts too.
constexpr size_t kMaxDepth = 64;

// The last member named `key`, as nlohmann keeps the last of duplicate keys.
bool Last(const object& o, std::string_view key, element* out) {
  bool found = false;
  for (const auto field : o) {
    if (field.key == key) {
      *out = field.value;
      found = true;
    }
  }
  return found;
}

bool Has(const object& o, std::string_view key) {
  element unused;
  return Last(o, key, &unused);
}

bool Obj(const object& o, std::string_view key, object* out) {
  element e;
  return Last(o, key, &e) && e.get_object().get(*out) == simdjson::SUCCESS;
}

bool Arr(const object& o, std::string_view key, array* out) {
  element e;
  return Last(o, key, &e) && e.get_array().get(*out) == simdjson::SUCCESS;
}

bool Str(const object& o, std::string_view key, std::string* out) {
  element e;
  std::string_view s;
  if (!Last(o, key, &e) || e.get_string().get(s) != simdjson::SUCCESS) return false;
  out->assign(s);
  return true;
}

// An integer as the full parse's Int takes it: any JSON integer that fits int64 (larger
// unsigned ones, which nlohmann would wrap, are left to it).
bool Int(const element& e, int64_t* out) { return e.get_int64().get(*out) == simdjson::SUCCESS; }

bool Int(const object& o, std::string_view key, int64_t* out) {
  element e;
  return Last(o, key, &e) && Int(e, out);
}

bool Int32(const object& o, std::string_view key, int* out) {
  int64_t v = 0;
  if (!Int(o, key, &v) || v < std::numeric_limits<int>::min() ||
      v > std::numeric_limits<int>::max())
    return false;
  *out = static_cast<int>(v);
  return true;
}

bool Bool(const object& o, std::string_view key, bool* out) {
  element e;
  return Last(o, key, &e) && e.get_bool().get(*out) == simdjson::SUCCESS;
}

bool Shape(const object& o, std::string_view key, std::vector<int64_t>* out) {
  array a;
  if (!Arr(o, key, &a)) return false;
  out->clear();
  out->reserve(a.size());
  for (const element d : a) {
    int64_t v = 0;
    if (!Int(d, &v) || v < 0) return false;
    out->push_back(v);
  }
  return true;
}

bool Dtype(const object& o, std::string_view key, DType* out) {
  std::string name;
  if (!Str(o, key, &name)) return false;
  const auto t = DTypeFromName(name);
  if (!t) return false;
  *out = *t;
  return true;
}

// A free-form member (optimizer, client_state, ...) as nlohmann's parse stores it: objects keep
// the last of duplicate keys, non-negative integers are unsigned (a "-0" too; see the header).
nlohmann::json ToJson(const element& e) {
  switch (e.type()) {
    case simdjson::dom::element_type::OBJECT: {
      nlohmann::json j = nlohmann::json::object();
      for (const auto field : object(e)) j[std::string(field.key)] = ToJson(field.value);
      return j;
    }
    case simdjson::dom::element_type::ARRAY: {
      nlohmann::json j = nlohmann::json::array();
      for (const element v : array(e)) j.push_back(ToJson(v));
      return j;
    }
    case simdjson::dom::element_type::STRING:
      return std::string(std::string_view(e));
    case simdjson::dom::element_type::INT64: {
      const int64_t v = int64_t(e);
      if (v >= 0) return static_cast<uint64_t>(v);
      return v;
    }
    case simdjson::dom::element_type::UINT64:
      return uint64_t(e);
    case simdjson::dom::element_type::DOUBLE:
      return double(e);
    case simdjson::dom::element_type::BOOL:
      return bool(e);
    case simdjson::dom::element_type::NULL_VALUE:
      return nullptr;
  }
  return nullptr;
}

// ManifestFromJson's ObjectOr: {} when missing or null, the value (of any type) otherwise.
nlohmann::json ObjectOr(const object& o, std::string_view key) {
  element e;
  if (!Last(o, key, &e) || e.is_null()) return nlohmann::json::object();
  return ToJson(e);
}

bool Range(const element& e, PartitionRange* r) {
  object o;
  return e.get_object().get(o) == simdjson::SUCCESS && Int32(o, "rank", &r->rank) &&
         Int(o, "begin", &r->begin) && Int(o, "end", &r->end) &&
         Int(o, "shard_offset", &r->shard_offset);
}

bool Param(const element& e, ParamEntry* p) {
  object o;
  if (e.get_object().get(o) != simdjson::SUCCESS || !Str(o, "name", &p->name) ||
      !Shape(o, "shape", &p->shape) || !Dtype(o, "dtype", &p->dtype) ||
      !Int(o, "numel", &p->numel) || !Bool(o, "frozen", &p->frozen))
    return false;
  element tied;
  if (!Last(o, "tied_to", &tied)) return false;
  if (tied.is_string()) {
    p->tied_to.assign(std::string_view(tied));
  } else if (!tied.is_null()) {
    return false;
  }
  array ranges;
  if (!Arr(o, "ranges", &ranges)) return false;
  p->ranges.resize(ranges.size());
  size_t i = 0;
  for (const element r : ranges)
    if (!Range(r, &p->ranges[i++])) return false;
  return true;
}

bool NonNegative(const object& o, std::string_view key, uint64_t* out) {
  int64_t v = 0;
  if (!Int(o, key, &v) || v < 0) return false;
  *out = static_cast<uint64_t>(v);
  return true;
}

bool Dataset(const element& e, DatasetRecord* d) {
  object o;
  if (e.get_object().get(o) != simdjson::SUCCESS || !Str(o, "name", &d->name) ||
      !Str(o, "kind", &d->kind) || (Has(o, "blob_kind") && !Str(o, "blob_kind", &d->blob_kind)) ||
      !Dtype(o, "dtype", &d->dtype) || !Shape(o, "shape", &d->shape) ||
      !NonNegative(o, "bytes", &d->bytes) || !Str(o, "xxh3", &d->xxh3))
    return false;
  if (!Has(o, "piece_bytes")) return true;
  int64_t pb = 0;
  array pieces;
  if (!Int(o, "piece_bytes", &pb) || pb <= 0 || !Arr(o, "piece_xxh3", &pieces)) return false;
  d->piece_bytes = static_cast<uint64_t>(pb);
  d->piece_xxh3.reserve(pieces.size());
  for (const element h : pieces) {
    std::string_view s;
    if (h.get_string().get(s) != simdjson::SUCCESS || s.size() != 16) return false;
    d->piece_xxh3.emplace_back(s);
  }
  return true;
}

bool File(const element& e, FileRecord* f) {
  object o;
  array datasets;
  if (e.get_object().get(o) != simdjson::SUCCESS || !Int32(o, "rank", &f->rank) ||
      !Str(o, "path", &f->path) || !NonNegative(o, "bytes", &f->bytes) ||
      !Str(o, "xxh3", &f->xxh3) || !Str(o, "compression", &f->compression) ||
      !Arr(o, "datasets", &datasets))
    return false;
  f->datasets.resize(datasets.size());
  size_t i = 0;
  for (const element d : datasets)
    if (!Dataset(d, &f->datasets[i++])) return false;
  if (!Has(o, "metadata_xxh3")) return true;
  array extents;
  if (!Str(o, "metadata_xxh3", &f->metadata_xxh3) || f->metadata_xxh3.empty() ||
      !Arr(o, "data_extents", &extents))
    return false;
  f->data_extents.reserve(extents.size());
  for (const element x : extents) {
    array pair;
    int64_t offset = 0, bytes = 0;
    // The full parse wants unsigned integers, which a "-0" is not to nlohmann; simdjson reads
    // it as 0. No writer records a zero offset (the superblock is there) or a zero length, so
    // zeros are left to the full parse.
    if (x.get_array().get(pair) != simdjson::SUCCESS || pair.size() != 2 ||
        !Int(pair.at(0).value_unsafe(), &offset) || !Int(pair.at(1).value_unsafe(), &bytes) ||
        offset <= 0 || bytes <= 0)
      return false;
    f->data_extents.emplace_back(static_cast<uint64_t>(offset), static_cast<uint64_t>(bytes));
  }
  return true;
}

// A parser and the padded copy of the text it reads.
struct Workspace {
  simdjson::dom::parser parser;
  std::string padded;
};

thread_local Workspace* t_kept = nullptr;  // KeepManifestParser's

}  // namespace

KeepManifestParser::KeepManifestParser() {
  if (t_kept != nullptr) return;
  t_kept = new Workspace;
  owner_ = true;
}

KeepManifestParser::~KeepManifestParser() {
  if (!owner_) return;
  delete t_kept;
  t_kept = nullptr;
}

Status VerifyManifestBytes(std::string_view text, std::string_view source) {
  const size_t at = FindManifestDigest(text);
  if (at == std::string_view::npos) {
    return DataLoss(std::string(source) +
                    ": manifest_xxh3 is not a 16-character string member of the top object");
  }
  // The bytes with the digest read as '0's, hashed in place (a large manifest is not copied).
  const std::string want(text.substr(at, kDigestPlaceholder.size()));
  Xxh3Stream h;
  h.Update(text.data(), at);
  h.Update(kDigestPlaceholder.data(), kDigestPlaceholder.size());
  const size_t rest = at + kDigestPlaceholder.size();
  h.Update(text.data() + rest, text.size() - rest);
  const std::string got = h.HexDigest();
  if (want != got) {
    return DataLoss(std::string(source) + ": manifest checksum mismatch (recorded " + want +
                    ", content " + got + "): the manifest was edited or corrupted");
  }
  return Status::Ok();
}

namespace {

// Parses `text` with w's parser; false when simdjson refuses it. The document lives in w.
bool ParseText(std::string_view text, Workspace& w, element* doc) {
  if (w.parser.capacity() < text.size() || w.parser.max_depth() != kMaxDepth) {
    if (w.parser.allocate(text.size(), kMaxDepth) != simdjson::SUCCESS) return false;
  }
  // simdjson reads up to SIMDJSON_PADDING bytes past the end (zeros, not a longer manifest's
  // bytes left from the last parse).
  w.padded.resize(text.size() + simdjson::SIMDJSON_PADDING);
  std::copy(text.begin(), text.end(), w.padded.begin());
  std::fill(w.padded.begin() + static_cast<std::ptrdiff_t>(text.size()), w.padded.end(), '\0');
  return w.parser.parse(w.padded.data(), text.size(), /*realloc_if_needed=*/false).get(*doc) ==
         simdjson::SUCCESS;
}

}  // namespace

std::optional<std::string> ManifestKind(std::string_view text) {
  std::optional<Workspace> own;
  Workspace& w = t_kept != nullptr ? *t_kept : own.emplace();
  element doc;
  if (!ParseText(text, w, &doc)) return std::nullopt;
  object top;
  std::string kind;
  if (doc.get_object().get(top) != simdjson::SUCCESS || !Str(top, "kind", &kind)) return "";
  return kind;
}

namespace {

// Parses `text` into w and checks what both fast paths need first: a ckpt manifest of this
// major version, 1.1 or later, sealed (the rule of VerifyByteSeal in manifest.cc) and its seal
// matching the bytes. The seal first: bytes that do not match it are never parsed here.
bool ParseSealed(std::string_view text, Workspace& w, object* top, int* major, int* minor) {
  element doc;
  std::string format, version;
  if (!VerifyManifestBytes(text, "").ok() || !ParseText(text, w, &doc) ||
      doc.get_object().get(*top) != simdjson::SUCCESS || !Str(*top, "format", &format) ||
      format != kFormatName || !Str(*top, "format_version", &version))
    return false;
  return std::sscanf(version.c_str(), "%d.%d", major, minor) == 2 && *major == kFormatMajor &&
         *minor >= 1 && Has(*top, "manifest_xxh3");
}

}  // namespace

uint64_t AddSaturating(uint64_t a, uint64_t b) {
  uint64_t sum = 0;
  return __builtin_add_overflow(a, b, &sum) ? std::numeric_limits<uint64_t>::max() : sum;
}

std::optional<ManifestSummary> SummarizeManifestFast(std::string_view text) {
  std::optional<Workspace> own;
  Workspace& w = t_kept != nullptr ? *t_kept : own.emplace();
  object top, counters, topology;
  array files;
  int major = 0, minor = 0;
  ManifestSummary s;
  std::string kind;
  if (!ParseSealed(text, w, &top, &major, &minor) || !Str(top, "tag", &s.tag) ||
      !Int(top, "created_unix", &s.created_unix) || !Obj(top, "counters", &counters) ||
      !Int(counters, "global_step", &s.global_step) || !Obj(top, "topology", &topology) ||
      !Int32(topology, "dp_world_size", &s.dp_world_size) ||
      (Has(top, "sets_latest") && !Bool(top, "sets_latest", &s.sets_latest)) ||
      !Str(top, "kind", &kind) || !Arr(top, "files", &files) || s.dp_world_size < 1 ||
      (kind != "sharded" && kind != "universal") ||
      (kind == "sharded" && files.size() != static_cast<size_t>(s.dp_world_size)))
    return std::nullopt;
  for (const element f : files) {
    object file;
    uint64_t bytes = 0;
    if (f.get_object().get(file) != simdjson::SUCCESS || !NonNegative(file, "bytes", &bytes))
      return std::nullopt;
    s.bytes = AddSaturating(s.bytes, bytes);
  }
  return s;
}

std::optional<Manifest> ParseManifestFast(std::string_view text) {
  std::optional<Workspace> own;
  Workspace& w = t_kept != nullptr ? *t_kept : own.emplace();
  object top;
  Manifest m;
  if (!ParseSealed(text, w, &top, &m.version_major, &m.version_minor)) return std::nullopt;
  object counters, topology, partition;
  array params, files;
  if (!Str(top, "writer", &m.writer) || !Str(top, "kind", &m.kind) || !Str(top, "tag", &m.tag) ||
      !Int(top, "created_unix", &m.created_unix) || !Str(top, "created_utc", &m.created_utc) ||
      !Obj(top, "counters", &counters) || !Int(counters, "global_step", &m.counters.global_step) ||
      !Int(counters, "micro_step", &m.counters.micro_step) ||
      !Int(counters, "skipped_steps", &m.counters.skipped_steps) ||
      !Int(counters, "samples_seen", &m.counters.samples_seen) ||
      !Int(counters, "tokens_seen", &m.counters.tokens_seen) || !Obj(top, "topology", &topology) ||
      !Int32(topology, "dp_world_size", &m.topology.dp_world_size) ||
      !Int32(topology, "tp", &m.topology.tp) || !Int32(topology, "pp", &m.topology.pp) ||
      !Int32(topology, "zero_stage", &m.topology.zero_stage) ||
      !Obj(top, "partition", &partition) || !Str(partition, "scheme", &m.partition.scheme) ||
      !Int(partition, "alignment", &m.partition.alignment) ||
      !Shape(partition, "shard_numel", &m.partition.shard_numel) || !Arr(top, "params", &params) ||
      !Arr(top, "files", &files) ||
      (Has(top, "sets_latest") && !Bool(top, "sets_latest", &m.sets_latest)))
    return std::nullopt;
  m.params.resize(params.size());
  size_t i = 0;
  for (const element p : params)
    if (!Param(p, &m.params[i++])) return std::nullopt;
  m.files.resize(files.size());
  i = 0;
  for (const element f : files)
    if (!File(f, &m.files[i++])) return std::nullopt;
  m.optimizer = ObjectOr(top, "optimizer");
  m.dtypes = ObjectOr(top, "dtypes");
  m.client_state = ObjectOr(top, "client_state");
  m.engine_config = ObjectOr(top, "engine_config");
  return m;
}

}  // namespace ckpt::internal
