#include "ckpt/manifest.h"

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "ckpt/hash.h"
#include "ckpt/json.h"
#include "manifest_fast.h"

namespace ckpt {

using nlohmann::json;

std::string RankFileName(int rank) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "rank_%05d.h5", rank);
  return buf;
}

const ParamEntry* Manifest::FindParam(std::string_view name) const {
  for (const auto& p : params)
    if (p.name == name) return &p;
  return nullptr;
}

const FileRecord* Manifest::FileForRank(int rank) const {
  for (const auto& f : files)
    if (f.rank == rank) return &f;
  return nullptr;
}

const DatasetRecord* Manifest::FindDataset(int rank, std::string_view name) const {
  const FileRecord* f = FileForRank(rank);
  if (!f) return nullptr;
  for (const auto& d : f->datasets)
    if (d.name == name) return &d;
  return nullptr;
}

int64_t Manifest::UniqueParamCount() const {
  int64_t n = 0;
  for (const auto& p : params)
    if (p.tied_to.empty()) n += p.numel;
  return n;
}

// ---------------------------------------------------------------------------------------------
// JSON <-> Manifest

json FileRecordToJson(const FileRecord& f) {
  json ds = json::array();
  for (const auto& d : f.datasets) {
    json dj = {{"name", d.name},
               {"kind", d.kind},
               {"dtype", std::string(DTypeName(d.dtype))},
               {"shape", d.shape},
               {"bytes", d.bytes},
               {"xxh3", d.xxh3}};
    if (!d.blob_kind.empty()) dj["blob_kind"] = d.blob_kind;
    if (d.has_pieces()) {
      dj["piece_bytes"] = d.piece_bytes;
      dj["piece_xxh3"] = d.piece_xxh3;
    }
    ds.push_back(dj);
  }
  json out = {{"rank", f.rank},     {"path", f.path},
              {"bytes", f.bytes},   {"xxh3", f.xxh3},
              {"compression", f.compression}, {"datasets", ds}};
  if (!f.metadata_xxh3.empty()) {
    out["metadata_xxh3"] = f.metadata_xxh3;
    json extents = json::array();
    for (const auto& [offset, bytes] : f.data_extents) extents.push_back({offset, bytes});
    out["data_extents"] = extents;
  }
  return out;
}

json ManifestHeaderToJson(const Manifest& m) {
  json j;
  j["format"] = m.format;
  // Always this writer's version: the seal below follows its rule, whatever was read.
  j["format_version"] = std::to_string(kFormatMajor) + "." + std::to_string(kFormatMinor);
  j["writer"] = m.writer;
  j["kind"] = m.kind;
  j["tag"] = m.tag;
  j["created_unix"] = m.created_unix;
  j["created_utc"] = m.created_utc;
  j["counters"] = {{"global_step", m.counters.global_step},
                   {"micro_step", m.counters.micro_step},
                   {"skipped_steps", m.counters.skipped_steps},
                   {"samples_seen", m.counters.samples_seen},
                   {"tokens_seen", m.counters.tokens_seen}};
  j["topology"] = {{"dp_world_size", m.topology.dp_world_size},
                   {"tp", m.topology.tp},
                   {"pp", m.topology.pp},
                   {"zero_stage", m.topology.zero_stage}};
  j["optimizer"] = m.optimizer;
  j["dtypes"] = m.dtypes;
  j["partition"] = {{"scheme", m.partition.scheme},
                    {"alignment", m.partition.alignment},
                    {"shard_numel", m.partition.shard_numel}};
  j["client_state"] = m.client_state;
  j["engine_config"] = m.engine_config;
  if (!m.sets_latest) j["sets_latest"] = false;
  return j;
}

namespace {

// The manifest as JSON without its seal.
json ManifestDom(const Manifest& m) {
  json j = ManifestHeaderToJson(m);
  json params = json::array();
  for (const auto& p : m.params) {
    json ranges = json::array();
    for (const auto& r : p.ranges) {
      ranges.push_back(
          {{"rank", r.rank}, {"begin", r.begin}, {"end", r.end}, {"shard_offset", r.shard_offset}});
    }
    params.push_back({{"name", p.name},
                      {"shape", p.shape},
                      {"dtype", std::string(DTypeName(p.dtype))},
                      {"numel", p.numel},
                      {"frozen", p.frozen},
                      {"tied_to", p.tied_to.empty() ? json(nullptr) : json(p.tied_to)},
                      {"ranges", ranges}});
  }
  j["params"] = params;
  json files = json::array();
  for (const auto& f : m.files) files.push_back(FileRecordToJson(f));
  j["files"] = files;
  return j;
}

}  // namespace

json ManifestToJson(const Manifest& m) {
  json j = ManifestDom(m);
  // Self-checksum (format 1.1): XXH3 of the text with this value's 16 characters read as '0',
  // so an edit or a bit flip that still parses is caught.
  j["manifest_xxh3"] = std::string(kDigestPlaceholder);
  const std::string text = j.dump();
  j["manifest_xxh3"] = DigestHex(Xxh3(text.data(), text.size()));
  return j;
}

namespace {

// JSON text as nlohmann's dump(indent) writes it (indent < 0: compact), written straight from
// the structs for the parameter table and the file records, which are most of a large
// manifest: building them as a DOM first took 100-300 ms for 4.5 MB (one std::map per range).
// Members must be written in nlohmann's order (its objects are std::maps: sorted keys);
// test_ckpt_format compares the text with ManifestToJson(m).dump(indent).
class JsonText {
 public:
  // Writes one value whose key (at `level`) is already in the text.
  JsonText(std::string* out, int indent, int level)
      : out_(*out), indent_(indent), level_(level), after_key_(true), first_{true} {}
  void BeginObject() { Open('{'); }
  void EndObject() { Close('}'); }
  void BeginArray() { Open('['); }
  void EndArray() { Close(']'); }
  void Key(std::string_view key) {
    Next();
    String(key);
    out_ += indent_ >= 0 ? ": " : ":";
    after_key_ = true;
  }
  void Int(int64_t v) { Scalar(std::to_string(v)); }
  void Uint(uint64_t v) { Scalar(std::to_string(v)); }
  void Bool(bool v) { Scalar(v ? "true" : "false"); }
  void Null() { Scalar("null"); }
  void Str(std::string_view s) {
    Element();
    String(s);
  }
  void Ints(const std::vector<int64_t>& v) {
    BeginArray();
    for (int64_t x : v) Int(x);
    EndArray();
  }
  // A key and its value: a signed integer as nlohmann writes an int64_t, an unsigned one as
  // it writes a uint64_t, a boolean, a shape, or a string.
  template <typename T>
  void Member(std::string_view key, const T& v) {
    Key(key);
    if constexpr (std::is_same_v<T, bool>) {
      Bool(v);
    } else if constexpr (std::is_integral_v<T> && std::is_signed_v<T>) {
      Int(v);
    } else if constexpr (std::is_integral_v<T>) {
      Uint(v);
    } else if constexpr (std::is_same_v<T, std::vector<int64_t>>) {
      Ints(v);
    } else {
      Str(v);
    }
  }

 private:
  // A value: after its key, or as the next element of an array.
  void Element() {
    if (after_key_) {
      after_key_ = false;
      return;
    }
    Next();
  }
  void Next() {
    if (!first_.back()) out_ += ',';
    first_.back() = false;
    if (indent_ >= 0) {
      out_ += '\n';
      out_.append(static_cast<size_t>(indent_ * level_), ' ');
    }
  }
  void Open(char c) {
    Element();
    out_ += c;
    first_.push_back(true);
    ++level_;
  }
  void Close(char c) {
    --level_;
    const bool empty = first_.back();
    first_.pop_back();
    if (!empty && indent_ >= 0) {
      out_ += '\n';
      out_.append(static_cast<size_t>(indent_ * level_), ' ');
    }
    out_ += c;
  }
  void Scalar(std::string_view text) {
    Element();
    out_ += text;
  }
  // Printable ASCII without quotes or backslashes as it is; anything else escaped by nlohmann
  // (which also refuses invalid UTF-8, as dump() does).
  void String(std::string_view s) {
    for (const char c : s) {
      if (c < 0x20 || c > 0x7e || c == '"' || c == '\\') {
        out_ += json(std::string(s)).dump();
        return;
      }
    }
    out_ += '"';
    out_ += s;
    out_ += '"';
  }

  std::string& out_;
  int indent_;
  int level_;
  bool after_key_;
  std::vector<bool> first_;
};

void WriteParams(JsonText& w, const std::vector<ParamEntry>& params) {
  w.BeginArray();
  for (const auto& p : params) {
    w.BeginObject();
    w.Member("dtype", DTypeName(p.dtype));
    w.Member("frozen", p.frozen);
    w.Member("name", p.name);
    w.Member("numel", p.numel);
    w.Key("ranges");
    w.BeginArray();
    for (const auto& r : p.ranges) {
      w.BeginObject();
      w.Member("begin", r.begin);
      w.Member("end", r.end);
      w.Member("rank", r.rank);
      w.Member("shard_offset", r.shard_offset);
      w.EndObject();
    }
    w.EndArray();
    w.Member("shape", p.shape);
    w.Key("tied_to");
    if (p.tied_to.empty()) {
      w.Null();
    } else {
      w.Str(p.tied_to);
    }
    w.EndObject();
  }
  w.EndArray();
}

void WriteFiles(JsonText& w, const std::vector<FileRecord>& files) {
  w.BeginArray();
  for (const auto& f : files) {
    w.BeginObject();
    w.Member("bytes", f.bytes);
    w.Member("compression", f.compression);
    const bool sealed = !f.metadata_xxh3.empty();
    if (sealed) {
      w.Key("data_extents");
      w.BeginArray();
      for (const auto& [offset, bytes] : f.data_extents) {
        w.BeginArray();
        w.Uint(offset);
        w.Uint(bytes);
        w.EndArray();
      }
      w.EndArray();
    }
    w.Key("datasets");
    w.BeginArray();
    for (const auto& d : f.datasets) {
      w.BeginObject();
      if (!d.blob_kind.empty()) {
        w.Member("blob_kind", d.blob_kind);
      }
      w.Member("bytes", d.bytes);
      w.Member("dtype", DTypeName(d.dtype));
      w.Member("kind", d.kind);
      w.Member("name", d.name);
      if (d.has_pieces()) {
        w.Member("piece_bytes", d.piece_bytes);
        w.Key("piece_xxh3");
        w.BeginArray();
        for (const auto& h : d.piece_xxh3) w.Str(h);
        w.EndArray();
      }
      w.Member("shape", d.shape);
      w.Member("xxh3", d.xxh3);
      w.EndObject();
    }
    w.EndArray();
    if (sealed) {
      w.Member("metadata_xxh3", f.metadata_xxh3);
    }
    w.Member("path", f.path);
    w.Member("rank", f.rank);
    w.Member("xxh3", f.xxh3);
    w.EndObject();
  }
  w.EndArray();
}

// ManifestToJson(m) without its seal, as text: the small members through nlohmann, the
// parameter table and the file records written directly into their places.
std::string UnsealedText(const Manifest& m, int indent) {
  json j = ManifestHeaderToJson(m);
  j["manifest_xxh3"] = std::string(kDigestPlaceholder);
  // Placeholders nothing else in the text can hold: control characters are escaped in JSON.
  const std::string params_mark = R"(\u0001params)", files_mark = R"(\u0001files)";
  j["params"] = std::string(1, '\x01') + "params";
  j["files"] = std::string(1, '\x01') + "files";
  const std::string base = j.dump(indent);
  // Where the string value "<mark>" stands, when the mark is nowhere else in the text (a
  // client string could hold one too); npos otherwise.
  auto value_at = [&](const std::string& mark) {
    const size_t at = base.find('"' + mark + '"');
    return at != std::string::npos && base.find(mark) == at + 1 &&
                   base.find(mark, at + 1 + mark.size()) == std::string::npos
               ? at
               : std::string::npos;
  };
  const size_t pa = value_at(params_mark), fa = value_at(files_mark);
  if (pa == std::string::npos || fa == std::string::npos) {
    json whole = ManifestDom(m);
    whole["manifest_xxh3"] = std::string(kDigestPlaceholder);
    return whole.dump(indent);
  }
  std::string params, files;
  JsonText pw(&params, indent, 1), fw(&files, indent, 1);
  WriteParams(pw, m.params);
  WriteFiles(fw, m.files);
  std::string text;
  text.reserve(base.size() + params.size() + files.size());
  // "files" sorts before "params".
  text.append(base, 0, fa);
  text += files;
  const size_t after_files = fa + files_mark.size() + 2;
  text.append(base, after_files, pa - after_files);
  text += params;
  text.append(base, pa + params_mark.size() + 2, std::string::npos);
  return text;
}

// The text with its manifest_xxh3 placeholder replaced by the XXH3 of the text.
std::string Sealed(std::string text) {
  const size_t at = FindManifestDigest(text);
  const std::string digest = DigestHex(Xxh3(text.data(), text.size()));
  text.replace(at, digest.size(), digest);
  return text;
}

}  // namespace

std::string SerializeManifest(const Manifest& m, int indent) {
  return Sealed(UnsealedText(m, indent) + "\n");
}

std::string ManifestJsonText(const Manifest& m) { return Sealed(UnsealedText(m, -1)); }

size_t FindManifestDigest(std::string_view text) {
  // A small scan of the JSON structure: strings (with escapes) and nesting depth, so only a
  // key of the top-level object counts.
  int depth = 0;
  bool expect_key = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (c == '{') {
      ++depth;
      expect_key = depth == 1;
    } else if (c == '}' || c == ']') {
      --depth;
    } else if (c == '[') {
      ++depth;
    } else if (c == ',') {
      expect_key = depth == 1;
    } else if (c == '"') {
      const size_t begin = i + 1;
      for (++i; i < text.size() && text[i] != '"'; ++i) {
        if (text[i] == '\\') ++i;
      }
      if (i >= text.size()) return std::string_view::npos;
      const bool is_key = expect_key;
      expect_key = false;
      if (!is_key || text.substr(begin, i - begin) != "manifest_xxh3") continue;
      size_t v = i + 1;
      while (v < text.size() && (text[v] == ' ' || text[v] == '\n' || text[v] == '\t' ||
                                 text[v] == '\r' || text[v] == ':'))
        ++v;
      if (v + 18 > text.size() || text[v] != '"' || text[v + 17] != '"')
        return std::string_view::npos;
      return v + 1;
    }
  }
  return std::string_view::npos;
}

namespace {

// Thrown inside ManifestFromJson only, turned into a DataLoss status at its edge.
struct SchemaError {
  std::string what;
};

const json& Field(const json& j, const char* key, const std::string& where) {
  if (!j.is_object()) throw SchemaError{where + " is not an object"};
  auto it = j.find(key);
  if (it == j.end()) throw SchemaError{where + ": missing field '" + key + "'"};
  return *it;
}

int64_t Int(const json& j, const char* key, const std::string& where) {
  const json& v = Field(j, key, where);
  if (!v.is_number_integer()) throw SchemaError{where + "." + key + " is not an integer"};
  return v.get<int64_t>();
}

std::string Str(const json& j, const char* key, const std::string& where) {
  const json& v = Field(j, key, where);
  if (!v.is_string()) throw SchemaError{where + "." + key + " is not a string"};
  return v.get<std::string>();
}

bool Bool(const json& j, const char* key, const std::string& where) {
  const json& v = Field(j, key, where);
  if (!v.is_boolean()) throw SchemaError{where + "." + key + " is not a boolean"};
  return v.get<bool>();
}

std::vector<int64_t> Shape(const json& j, const char* key, const std::string& where) {
  const json& v = Field(j, key, where);
  if (!v.is_array()) throw SchemaError{where + "." + key + " is not an array"};
  std::vector<int64_t> out;
  for (const auto& d : v) {
    if (!d.is_number_integer() || d.get<int64_t>() < 0)
      throw SchemaError{where + "." + key + " has a negative or non-integer dimension"};
    out.push_back(d.get<int64_t>());
  }
  return out;
}

DType Dtype(const json& j, const char* key, const std::string& where) {
  std::string name = Str(j, key, where);
  auto t = DTypeFromName(name);
  if (!t) throw SchemaError{where + "." + key + ": unknown dtype '" + Excerpt(name, 80) + "'"};
  return *t;
}

int Int32(const json& j, const char* key, const std::string& where) {
  int64_t v = Int(j, key, where);
  if (v < std::numeric_limits<int>::min() || v > std::numeric_limits<int>::max())
    throw SchemaError{where + "." + key + " is out of range"};
  return static_cast<int>(v);
}

FileRecord ParseFileRecord(const json& fj, const std::string& where) {
  FileRecord f;
  f.rank = Int32(fj, "rank", where);
  f.path = Str(fj, "path", where);
  int64_t bytes = Int(fj, "bytes", where);
  if (bytes < 0) throw SchemaError{where + ".bytes is negative"};
  f.bytes = static_cast<uint64_t>(bytes);
  f.xxh3 = Str(fj, "xxh3", where);
  f.compression = Str(fj, "compression", where);
  const json& ds = Field(fj, "datasets", where);
  if (!ds.is_array()) throw SchemaError{where + ".datasets is not an array"};
  for (size_t k = 0; k < ds.size(); ++k) {
    const json& dj = ds[k];
    const std::string dw = where + ".datasets[" + std::to_string(k) + "]";
    DatasetRecord d;
    d.name = Str(dj, "name", dw);
    d.kind = Str(dj, "kind", dw);
    if (dj.contains("blob_kind")) d.blob_kind = Str(dj, "blob_kind", dw);
    d.dtype = Dtype(dj, "dtype", dw);
    d.shape = Shape(dj, "shape", dw);
    int64_t db = Int(dj, "bytes", dw);
    if (db < 0) throw SchemaError{dw + ".bytes is negative"};
    d.bytes = static_cast<uint64_t>(db);
    d.xxh3 = Str(dj, "xxh3", dw);
    if (dj.contains("piece_bytes")) {
      const int64_t pb = Int(dj, "piece_bytes", dw);
      if (pb <= 0) throw SchemaError{dw + ".piece_bytes must be positive"};
      d.piece_bytes = static_cast<uint64_t>(pb);
      const json& pj = Field(dj, "piece_xxh3", dw);
      if (!pj.is_array()) throw SchemaError{dw + ".piece_xxh3 is not an array"};
      for (const auto& h : pj) {
        if (!h.is_string() || h.get_ref<const std::string&>().size() != 16)
          throw SchemaError{dw + ".piece_xxh3: each entry is a 16-digit hex string"};
        d.piece_xxh3.push_back(h.get<std::string>());
      }
    }
    f.datasets.push_back(std::move(d));
  }
  if (fj.contains("metadata_xxh3")) {
    f.metadata_xxh3 = Str(fj, "metadata_xxh3", where);
    if (f.metadata_xxh3.empty()) throw SchemaError{where + ".metadata_xxh3 is empty"};
    const json& ex = Field(fj, "data_extents", where);
    if (!ex.is_array()) throw SchemaError{where + ".data_extents is not an array"};
    for (const auto& e : ex) {
      if (!e.is_array() || e.size() != 2 || !e[0].is_number_unsigned() ||
          !e[1].is_number_unsigned())
        throw SchemaError{where + ".data_extents: each entry is [offset, bytes]"};
      f.data_extents.emplace_back(e[0].get<uint64_t>(), e[1].get<uint64_t>());
    }
  }
  return f;
}

json ObjectOr(const json& j, const char* key) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return json::object();
  return *it;
}

// What both parsers' results go through: the rank-file count and ValidateManifest.
Result<Manifest> CheckParsed(Manifest m, std::string_view source) {
  const std::string src(source);
  if (m.kind == "sharded" && static_cast<int>(m.files.size()) != m.topology.dp_world_size) {
    return DataLoss(src + ": " + std::to_string(m.files.size()) +
                    " rank files listed for dp_world_size " +
                    std::to_string(m.topology.dp_world_size));
  }
  Status v = ValidateManifest(m);
  if (!v.ok()) return DataLoss(src + ": " + v.message());
  return m;
}

}  // namespace

Result<Manifest> ManifestFromJson(const json& j, std::string_view source) {
  const std::string src(source);
  Manifest m;
  try {
    m.format = Str(j, "format", "manifest");
    if (m.format != kFormatName)
      return DataLoss(src + ": not a ckpt manifest (format '" + Excerpt(m.format, 80) + "')");
    std::string version = Str(j, "format_version", "manifest");
    int major = 0, minor = 0;
    if (std::sscanf(version.c_str(), "%d.%d", &major, &minor) != 2 || major < 0 || minor < 0)
      return DataLoss(src + ": malformed format_version '" + Excerpt(version, 80) + "'");
    if (major > kFormatMajor) {
      return Unimplemented(src + ": written by format version " + Excerpt(version, 80) +
                           ", this reader supports " + std::to_string(kFormatMajor) +
                           ".x; upgrade ckpt to read it");
    }
    m.version_major = major;
    m.version_minor = minor;
    // The 1.0 self-checksum (the compact dump without the field) is checked once the version
    // is known to be ours; 1.1's is over the file's bytes (ParseManifest).
    if (j.contains("manifest_xxh3") && major == 1 && minor == 0) {
      json rest = j;
      rest.erase("manifest_xxh3");
      const std::string text = rest.dump();
      const std::string want = j["manifest_xxh3"].is_string() ? j["manifest_xxh3"].get<std::string>() : "";
      const std::string got = DigestHex(Xxh3(text.data(), text.size()));
      if (want != got)
        return DataLoss(src + ": manifest checksum mismatch (recorded " + want + ", content " + got +
                        "): the manifest was edited or corrupted");
    } else if (!j.contains("manifest_xxh3") && minor >= 2) {
      return DataLoss(src + ": no manifest_xxh3 (every manifest of format 1.2 and later has one): "
                      "the manifest was edited or corrupted");
    }
    m.writer = Str(j, "writer", "manifest");
    m.kind = Str(j, "kind", "manifest");
    m.tag = Str(j, "tag", "manifest");
    m.created_unix = Int(j, "created_unix", "manifest");
    m.created_utc = Str(j, "created_utc", "manifest");
    const json& c = Field(j, "counters", "manifest");
    m.counters.global_step = Int(c, "global_step", "counters");
    m.counters.micro_step = Int(c, "micro_step", "counters");
    m.counters.skipped_steps = Int(c, "skipped_steps", "counters");
    m.counters.samples_seen = Int(c, "samples_seen", "counters");
    m.counters.tokens_seen = Int(c, "tokens_seen", "counters");
    const json& t = Field(j, "topology", "manifest");
    m.topology.dp_world_size = Int32(t, "dp_world_size", "topology");
    m.topology.tp = Int32(t, "tp", "topology");
    m.topology.pp = Int32(t, "pp", "topology");
    m.topology.zero_stage = Int32(t, "zero_stage", "topology");
    m.optimizer = ObjectOr(j, "optimizer");
    m.dtypes = ObjectOr(j, "dtypes");
    const json& part = Field(j, "partition", "manifest");
    m.partition.scheme = Str(part, "scheme", "partition");
    m.partition.alignment = Int(part, "alignment", "partition");
    m.partition.shard_numel = Shape(part, "shard_numel", "partition");
    const json& params = Field(j, "params", "manifest");
    if (!params.is_array()) throw SchemaError{"params is not an array"};
    for (size_t i = 0; i < params.size(); ++i) {
      const json& pj = params[i];
      const std::string where = "params[" + std::to_string(i) + "]";
      ParamEntry p;
      p.name = Str(pj, "name", where);
      p.shape = Shape(pj, "shape", where);
      p.dtype = Dtype(pj, "dtype", where);
      p.numel = Int(pj, "numel", where);
      p.frozen = Bool(pj, "frozen", where);
      const json& tied = Field(pj, "tied_to", where);
      if (tied.is_string()) p.tied_to = tied.get<std::string>();
      else if (!tied.is_null()) throw SchemaError{where + ".tied_to is neither null nor a string"};
      const json& ranges = Field(pj, "ranges", where);
      if (!ranges.is_array()) throw SchemaError{where + ".ranges is not an array"};
      for (const auto& rj : ranges) {
        PartitionRange r;
        r.rank = Int32(rj, "rank", where + ".ranges");
        r.begin = Int(rj, "begin", where + ".ranges");
        r.end = Int(rj, "end", where + ".ranges");
        r.shard_offset = Int(rj, "shard_offset", where + ".ranges");
        p.ranges.push_back(r);
      }
      m.params.push_back(std::move(p));
    }
    const json& files = Field(j, "files", "manifest");
    if (!files.is_array()) throw SchemaError{"files is not an array"};
    for (size_t i = 0; i < files.size(); ++i)
      m.files.push_back(ParseFileRecord(files[i], "files[" + std::to_string(i) + "]"));
    m.client_state = ObjectOr(j, "client_state");
    m.engine_config = ObjectOr(j, "engine_config");
    if (j.contains("sets_latest")) m.sets_latest = Bool(j, "sets_latest", "manifest");
  } catch (const SchemaError& e) {
    return DataLoss(src + ": " + e.what);
  } catch (const json::exception& e) {
    return DataLoss(src + ": " + e.what());
  }
  return CheckParsed(std::move(m), source);
}

Result<FileRecord> FileRecordFromJson(const json& j, std::string_view source) {
  try {
    return ParseFileRecord(j, std::string(source));
  } catch (const SchemaError& e) {
    return DataLoss(e.what);
  } catch (const json::exception& e) {
    return DataLoss(std::string(source) + ": " + e.what());
  }
}

namespace {

// Format 1.1 and later minors of this major: the checksum over the bytes, before the schema
// checks, so an edited or corrupted manifest is reported as such. (A newer major, or 1.0, is
// ManifestFromJson's: refused, or verified under 1.0's rule.) *sealed: whether the rule applied.
Status VerifyByteSeal(const json& j, std::string_view text, std::string_view source, bool* sealed) {
  int major = -1, minor = -1;
  *sealed = j.is_object() && j.contains("manifest_xxh3") && j.contains("format_version") &&
            j["format_version"].is_string() &&
            std::sscanf(j["format_version"].get_ref<const std::string&>().c_str(), "%d.%d", &major,
                        &minor) == 2 &&
            major == kFormatMajor && minor >= 1;
  if (!*sealed) return Status::Ok();
  return internal::VerifyManifestBytes(text, source);
}

std::atomic<uint64_t> g_fast_parses{0}, g_full_parses{0};

// internal::ParseManifestFast, counted.
std::optional<Manifest> ParseFast(std::string_view text) {
  std::optional<Manifest> m = internal::ParseManifestFast(text);
  if (m) g_fast_parses.fetch_add(1, std::memory_order_relaxed);
  return m;
}

}  // namespace

ManifestParseStats GetManifestParseStats() {
  ManifestParseStats s;
  s.fast = g_fast_parses.load();
  s.full = g_full_parses.load();
  return s;
}

Result<Manifest> ParseManifest(std::string_view text, std::string_view source) {
  // A sealed manifest as ckpt writes it: simdjson, straight into the structs (manifest_fast.h).
  // Anything else, or anything wrong, is parsed again below, which names the problem.
  if (std::optional<Manifest> m = ParseFast(text)) return CheckParsed(std::move(*m), source);
  g_full_parses.fetch_add(1, std::memory_order_relaxed);
  CKPT_ASSIGN_OR_RETURN(json j, ParseJson(text, source));
  bool sealed = false;
  CKPT_RETURN_IF_ERROR(VerifyByteSeal(j, text, source, &sealed), "");
  return ManifestFromJson(j, source);
}

ManifestSummary SummarizeManifest(const Manifest& m) {
  ManifestSummary s;
  s.tag = m.tag;
  s.global_step = m.counters.global_step;
  s.created_unix = m.created_unix;
  s.dp_world_size = m.topology.dp_world_size;
  s.sets_latest = m.sets_latest;
  for (const auto& f : m.files) s.bytes = internal::AddSaturating(s.bytes, f.bytes);
  return s;
}

Result<ManifestSummary> ParseManifestSummary(std::string_view text, std::string_view source) {
  // A sealed manifest as ckpt writes it: simdjson parses it in a tenth of the time nlohmann
  // takes to lex it, and the summarized fields are read from its tape (manifest_fast.h);
  // anything else as before.
  if (std::optional<ManifestSummary> s = internal::SummarizeManifestFast(text)) {
    g_fast_parses.fetch_add(1, std::memory_order_relaxed);
    return *s;
  }
  // Only these members are built; "params" (most of a large manifest) and the files' dataset
  // records are parsed as JSON and dropped.
  static const std::set<std::string, std::less<>> kKept = {
      "format",       "format_version", "manifest_xxh3", "kind",  "tag",
      "created_unix", "counters",       "topology",      "files", "sets_latest"};
  CKPT_ASSIGN_OR_RETURN(json j,
                        ParseJsonKeeping(text, source, [](int depth, const std::string& key) {
                          if (depth == 1) return kKept.count(key) > 0;
                          if (depth == 2) return true;  // the members of counters and topology
                          return key == "bytes";        // of each files[] entry
                        }));
  bool sealed = false;
  CKPT_RETURN_IF_ERROR(VerifyByteSeal(j, text, source, &sealed), "");
  const auto whole = [&]() -> Result<ManifestSummary> {
    CKPT_ASSIGN_OR_RETURN(Manifest m, ParseManifest(text, source), "");
    return SummarizeManifest(m);
  };
  // 1.0 is sealed over the compact dump of the whole object; an unsealed or foreign document
  // gets ParseManifest's verdict.
  if (!sealed) return whole();
  g_full_parses.fetch_add(1, std::memory_order_relaxed);
  try {
    if (Str(j, "format", "manifest") != kFormatName) return whole();
    ManifestSummary s;
    s.tag = Str(j, "tag", "manifest");
    s.created_unix = Int(j, "created_unix", "manifest");
    s.global_step = Int(Field(j, "counters", "manifest"), "global_step", "counters");
    s.dp_world_size = Int32(Field(j, "topology", "manifest"), "dp_world_size", "topology");
    if (j.contains("sets_latest")) s.sets_latest = Bool(j, "sets_latest", "manifest");
    const std::string kind = Str(j, "kind", "manifest");
    const json& files = Field(j, "files", "manifest");
    if (!files.is_array() || s.dp_world_size < 1 || (kind != "sharded" && kind != "universal") ||
        (kind == "sharded" && files.size() != static_cast<size_t>(s.dp_world_size)))
      return whole();
    for (const auto& f : files) {
      const int64_t b = Int(f, "bytes", "files[]");
      if (b < 0) return whole();
      s.bytes = internal::AddSaturating(s.bytes, static_cast<uint64_t>(b));
    }
    return s;
  } catch (const SchemaError&) {
    return whole();
  } catch (const json::exception&) {
    return whole();
  }
}

// ---------------------------------------------------------------------------------------------
// Validation

namespace {

bool MulOverflows(int64_t a, int64_t b, int64_t* out) {
  return __builtin_mul_overflow(a, b, out);
}

}  // namespace

Status ValidateManifest(const Manifest& m) {
  const int world = m.topology.dp_world_size;
  if (world < 1) return InvalidArgument("dp_world_size " + std::to_string(world) + " < 1");
  if (m.topology.zero_stage < 0 || m.topology.zero_stage > 3)
    return InvalidArgument("zero_stage " + std::to_string(m.topology.zero_stage) + " not in 0..3");
  // Strings inspect and messages print, as a file's bytes or a writer's caller gave them:
  // printable UTF-8 only (a JSON string may hold "\u001b", and anyone can compute a seal).
  if (m.tag.empty() || m.tag.find('/') != std::string::npos || m.tag[0] == '.' ||
      !PrintableUtf8(m.tag))
    return InvalidArgument("invalid tag '" + Excerpt(m.tag, 80) + "'");
  for (const auto& [what, text] : {std::pair<const char*, const std::string&>{"writer", m.writer},
                                   {"created_utc", m.created_utc}})
    if (!PrintableUtf8(text))
      return InvalidArgument(std::string(what) + " '" + Excerpt(text, 80) +
                             "' is not printable UTF-8");
  for (const auto& f : m.files) {
    std::vector<const std::string*> texts = {&f.path, &f.compression};
    for (const auto& d : f.datasets) texts.insert(texts.end(), {&d.name, &d.kind, &d.blob_kind});
    for (const std::string* text : texts)
      if (!PrintableUtf8(*text))
        return InvalidArgument("file record string '" + Excerpt(*text, 80) +
                               "' is not printable UTF-8");
  }
  const bool sharded = m.kind == "sharded";
  if (!sharded && m.kind != "universal")
    return InvalidArgument("unknown kind '" + Excerpt(m.kind, 80) + "'");
  if (sharded) {
    if (m.partition.scheme != "replicated" && m.partition.scheme != "flat" &&
        m.partition.scheme != "per_param" && m.partition.scheme != "param_owner")
      return InvalidArgument("unknown partition scheme '" + Excerpt(m.partition.scheme, 80) + "'");
    if (m.partition.alignment < 1) return InvalidArgument("partition alignment < 1");
    if (static_cast<int>(m.partition.shard_numel.size()) != world)
      return InvalidArgument("partition.shard_numel has " +
                             std::to_string(m.partition.shard_numel.size()) + " entries for " +
                             std::to_string(world) + " ranks");
  }
  std::map<std::string, const ParamEntry*> by_name;
  for (const auto& p : m.params) {
    if (p.name.empty()) return InvalidArgument("a parameter has an empty name");
    for (const std::string* name : {&p.name, &p.tied_to})
      if (!PrintableUtf8(*name))
        return InvalidArgument("parameter name '" + Excerpt(*name, 80) +
                               "' is not printable UTF-8");
    if (!by_name.emplace(p.name, &p).second)
      return InvalidArgument("parameter '" + p.name + "' appears twice");
    int64_t n = 1;
    for (int64_t d : p.shape) {
      if (d < 0 || MulOverflows(n, d, &n))
        return InvalidArgument("parameter '" + p.name + "': shape overflows");
    }
    if (n != p.numel)
      return InvalidArgument("parameter '" + p.name + "': numel " + std::to_string(p.numel) +
                             " != product of shape " + std::to_string(n));
  }
  // Per rank: occupied shard intervals, to reject overlaps between parameters.
  std::vector<std::vector<std::pair<int64_t, int64_t>>> used(static_cast<size_t>(world));
  for (const auto& p : m.params) {
    if (!p.tied_to.empty()) {
      auto it = by_name.find(p.tied_to);
      if (it == by_name.end())
        return InvalidArgument("parameter '" + p.name + "' is tied to unknown '" + p.tied_to + "'");
      if (!it->second->tied_to.empty())
        return InvalidArgument("parameter '" + p.name + "' is tied to an alias '" + p.tied_to + "'");
      if (it->second->numel != p.numel)
        return InvalidArgument("parameter '" + p.name + "' is tied to '" + p.tied_to +
                               "' of a different size");
      if (!p.ranges.empty())
        return InvalidArgument("tied parameter '" + p.name + "' must not own storage");
      continue;
    }
    if (p.frozen) {
      if (!p.ranges.empty())
        return InvalidArgument("frozen parameter '" + p.name + "' must not be partitioned");
      continue;
    }
    if (!sharded) continue;
    if (p.dtype != DType::kF32)
      return InvalidArgument("trainable parameter '" + p.name + "' must have fp32 masters");
    if (m.partition.scheme == "param_owner" && p.ranges.size() > 1)
      return InvalidArgument("parameter '" + p.name +
                             "' spans several ranks under the param_owner scheme");
    std::vector<PartitionRange> ranges = p.ranges;
    std::sort(ranges.begin(), ranges.end(),
              [](const PartitionRange& a, const PartitionRange& b) { return a.begin < b.begin; });
    int64_t expect = 0;
    for (const auto& r : ranges) {
      const std::string where = "parameter '" + p.name + "' range [" + std::to_string(r.begin) +
                                ", " + std::to_string(r.end) + ") on rank " + std::to_string(r.rank);
      if (r.rank < 0 || r.rank >= world) return InvalidArgument(where + ": rank out of range");
      if (r.begin >= r.end) return InvalidArgument(where + ": empty or reversed");
      if (r.begin < expect) return InvalidArgument(where + ": overlaps the previous range");
      if (r.begin > expect)
        return InvalidArgument("parameter '" + p.name + "': elements [" + std::to_string(expect) +
                               ", " + std::to_string(r.begin) + ") are owned by no rank");
      const int64_t len = r.end - r.begin;
      int64_t shard_end;
      if (r.shard_offset < 0 || __builtin_add_overflow(r.shard_offset, len, &shard_end) ||
          shard_end > m.partition.shard_numel[static_cast<size_t>(r.rank)])
        return InvalidArgument(where + ": shard slice outside the rank's shard");
      used[static_cast<size_t>(r.rank)].push_back({r.shard_offset, shard_end});
      expect = r.end;
    }
    if (expect != p.numel)
      return InvalidArgument("parameter '" + p.name + "': elements [" + std::to_string(expect) +
                             ", " + std::to_string(p.numel) + ") are owned by no rank");
  }
  for (int r = 0; r < world && sharded; ++r) {
    auto& iv = used[static_cast<size_t>(r)];
    std::sort(iv.begin(), iv.end());
    for (size_t i = 1; i < iv.size(); ++i) {
      if (iv[i].first < iv[i - 1].second)
        return InvalidArgument("rank " + std::to_string(r) +
                               ": two parameters share shard elements at offset " +
                               std::to_string(iv[i].first));
    }
  }
  // The metadata seal's extents: sorted, disjoint, inside the file.
  for (const auto& f : m.files) {
    uint64_t end = 0;
    for (const auto& [offset, bytes] : f.data_extents) {
      uint64_t e;
      if (offset < end || bytes == 0 || __builtin_add_overflow(offset, bytes, &e) || e > f.bytes)
        return InvalidArgument(f.path + ": data_extents are not sorted, disjoint extents inside "
                               "the file's " + std::to_string(f.bytes) + " bytes");
      end = e;
    }
  }
  // Files and datasets (absent while a writer is still building the manifest).
  if (!m.files.empty() && sharded) {
    std::set<int> ranks;
    for (const auto& f : m.files) {
      if (f.rank < 0 || f.rank >= world || !ranks.insert(f.rank).second)
        return InvalidArgument("file list: rank " + std::to_string(f.rank) +
                               " is out of range or listed twice");
      if (f.path != RankFileName(f.rank))
        return InvalidArgument("file for rank " + std::to_string(f.rank) + " is named '" + f.path +
                               "', expected '" + RankFileName(f.rank) + "'");
      std::set<std::string> names;
      for (const auto& d : f.datasets) {
        if (!names.insert(d.name).second)
          return InvalidArgument(f.path + ": dataset '" + d.name + "' listed twice");
        int64_t n = 1;
        for (int64_t dim : d.shape)
          if (dim < 0 || MulOverflows(n, dim, &n))
            return InvalidArgument(f.path + ": dataset '" + d.name + "' shape overflows");
        uint64_t expect = static_cast<uint64_t>(n) * DTypeSize(d.dtype);
        if (d.bytes != expect)
          return InvalidArgument(f.path + ": dataset '" + d.name + "' records " +
                                 std::to_string(d.bytes) + " bytes, dtype × shape is " +
                                 std::to_string(expect));
        if (d.has_pieces() && (d.piece_bytes % DTypeSize(d.dtype) != 0 ||
                               d.piece_xxh3.size() != d.piece_count()))
          return InvalidArgument(f.path + ": dataset '" + d.name + "': piece_bytes " +
                                 std::to_string(d.piece_bytes) + " with " +
                                 std::to_string(d.piece_xxh3.size()) +
                                 " piece digests (expected a multiple of the element size and " +
                                 std::to_string(d.piece_count()) + " digests)");
      }
      const int64_t shard = m.partition.shard_numel[static_cast<size_t>(f.rank)];
      for (std::string_view state : {kMaster, kExpAvg, kExpAvgSq}) {
        const DatasetRecord* d = nullptr;
        for (const auto& x : f.datasets)
          if (x.name == state) d = &x;
        if (shard > 0 && d == nullptr)
          return InvalidArgument(f.path + ": dataset '" + std::string(state) + "' is missing");
        if (d && (d->dtype != DType::kF32 || d->shape.size() != 1 || d->shape[0] != shard))
          return InvalidArgument(f.path + ": dataset '" + std::string(state) +
                                 "' must be fp32 of length " + std::to_string(shard));
      }
    }
    for (const auto& p : m.params) {
      if (!p.frozen || !p.tied_to.empty()) continue;
      const DatasetRecord* d = m.FindDataset(0, std::string(kFrozenPrefix) + p.name);
      if (!d) return InvalidArgument("frozen parameter '" + p.name + "' has no dataset in rank 0");
      int64_t n = 1;
      for (int64_t dim : d->shape) n *= dim;
      if (n != p.numel || d->dtype != p.dtype)
        return InvalidArgument("frozen parameter '" + p.name + "': stored dtype/shape differs");
    }
  }
  return Status::Ok();
}

// ---------------------------------------------------------------------------------------------
// Partitioning

Result<Partition> BuildOwnerPartition(std::vector<ParamEntry>& params, int world,
                                      const std::vector<int>& owners, int64_t alignment) {
  if (world < 1) return InvalidArgument("world size must be at least 1, got " + std::to_string(world));
  if (alignment < 1) return InvalidArgument("alignment must be at least 1");
  if (owners.size() != params.size())
    return InvalidArgument(std::to_string(owners.size()) + " owners for " +
                           std::to_string(params.size()) + " parameters");
  Partition part;
  part.scheme = "param_owner";
  part.alignment = alignment;
  part.shard_numel.assign(static_cast<size_t>(world), 0);
  for (size_t i = 0; i < params.size(); ++i) {
    ParamEntry& p = params[i];
    p.ranges.clear();
    if (!p.trainable() || p.numel == 0) continue;
    const int owner = owners[i];
    if (owner < 0 || owner >= world)
      return InvalidArgument("parameter '" + p.name + "': owner rank " + std::to_string(owner) +
                             " outside [0, " + std::to_string(world) + ")");
    int64_t& used = part.shard_numel[static_cast<size_t>(owner)];
    p.ranges.push_back({owner, 0, p.numel, used});
    used += (p.numel + alignment - 1) / alignment * alignment;
  }
  return part;
}

Result<Partition> BuildPartition(std::vector<ParamEntry>& params, int world, int zero_stage,
                                 int64_t alignment) {
  if (world < 1) return InvalidArgument("world size must be at least 1, got " + std::to_string(world));
  if (zero_stage < 0 || zero_stage > 3)
    return InvalidArgument("ZeRO stage must be 0..3, got " + std::to_string(zero_stage));
  if (alignment < 1) return InvalidArgument("alignment must be at least 1");
  auto round_up = [](int64_t x, int64_t a) { return (x + a - 1) / a * a; };
  Partition part;
  part.alignment = alignment;
  part.shard_numel.assign(static_cast<size_t>(world), 0);
  for (auto& p : params) p.ranges.clear();

  if (zero_stage == 0) {
    part.scheme = "replicated";
    int64_t offset = 0;
    for (auto& p : params) {
      if (!p.trainable() || p.numel == 0) continue;
      p.ranges.push_back({0, 0, p.numel, offset});
      offset += p.numel;
    }
    part.shard_numel[0] = round_up(offset, alignment);
    return part;
  }
  if (zero_stage <= 2) {
    part.scheme = "flat";
    int64_t total = 0;
    for (const auto& p : params)
      if (p.trainable()) total += p.numel;
    const int64_t padded = round_up(std::max<int64_t>(total, 1), alignment * world);
    const int64_t share = padded / world;
    part.shard_numel.assign(static_cast<size_t>(world), share);
    int64_t flat = 0;
    for (auto& p : params) {
      if (!p.trainable()) continue;
      int64_t begin = 0;
      while (begin < p.numel) {
        const int64_t pos = flat + begin;
        const int rank = static_cast<int>(pos / share);
        const int64_t rank_end = static_cast<int64_t>(rank + 1) * share;
        const int64_t end = std::min(p.numel, begin + (rank_end - pos));
        p.ranges.push_back({rank, begin, end, pos - static_cast<int64_t>(rank) * share});
        begin = end;
      }
      flat += p.numel;
    }
    return part;
  }
  part.scheme = "per_param";
  int64_t offset = 0;
  for (auto& p : params) {
    if (!p.trainable()) continue;
    const int64_t share = round_up((p.numel + world - 1) / world, alignment);
    for (int r = 0; r < world; ++r) {
      const int64_t begin = std::min(p.numel, share * r);
      const int64_t end = std::min(p.numel, share * (r + 1));
      if (begin < end) p.ranges.push_back({r, begin, end, offset});
    }
    offset += share;
  }
  part.shard_numel.assign(static_cast<size_t>(world), offset);
  return part;
}

}  // namespace ckpt
