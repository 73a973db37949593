#include "estimate/param_count.h"

#include <filesystem>
#include <map>
#include <optional>
#include <set>

#include <nlohmann/json.hpp>

#include "ckpt/json.h"
#include "ckpt/root.h"
#include "safetensors/safetensors.h"

namespace ckpt::estimate {
namespace {

namespace fs = std::filesystem;

std::string ModuleOf(const std::string& name) {
  size_t dot = name.rfind('.');
  return dot == std::string::npos ? std::string() : name.substr(0, dot);
}

// Adds `alias` -> `owner` when the owner is a tensor and the alias is not.
void AddAlias(const std::map<std::string, const ParamEntry*>& by_name, const std::string& alias,
              const std::string& owner, std::map<std::string, std::string>& aliases) {
  if (alias == owner || by_name.count(alias) != 0) return;
  if (by_name.count(owner) == 0) return;
  aliases.emplace(alias, owner);
}

// A JSON input (a parameter table, a safetensors index): read whole, but not past 256 MiB (an
// index of a 400B-parameter model is well under 1 MiB), so a wrong file is an error, not a
// read of whatever size it has.
Result<std::string> ReadJsonFile(Env* env, const std::string& path) {
  constexpr uint64_t kMaxJsonBytes = uint64_t{256} << 20;
  CKPT_ASSIGN_OR_RETURN(uint64_t size, env->FileSize(path), "");
  if (size > kMaxJsonBytes)
    return InvalidArgument(path + ": " + std::to_string(size) +
                           " bytes, more than a JSON parameter table or index holds (256 MiB)");
  return env->ReadFileToString(path);
}

}  // namespace

ParamCounts CountParams(const ParamTable& table) {
  ParamCounts c;
  std::map<std::string, int64_t> per_module;
  for (const ParamEntry& p : table.params) {
    ++c.tensors;
    per_module[ModuleOf(p.name)] += p.numel;
    if (!p.tied_to.empty()) {
      ++c.aliases;
      continue;
    }
    c.total_params += p.numel;
    if (p.frozen) c.frozen_params += p.numel;
  }
  bool first = true;
  for (const auto& [module, n] : per_module) {
    if (first || n > c.largest_layer_params) {
      c.largest_layer_params = n;
      c.largest_layer = module;
      first = false;
    }
  }
  return c;
}

Result<Manifest> ReadCheckpointManifest(const std::string& path, const std::string& tag,
                                        std::string* manifest_path, Env* env) {
  CKPT_ASSIGN_OR_RETURN(std::string dir, ResolveTagDir(path, tag, env));
  CKPT_ASSIGN_OR_RETURN(Manifest m, ReadTagManifest(dir, env));
  if (manifest_path) *manifest_path = dir + "/" + std::string(kManifestFile);
  return m;
}

Result<ParamTable> ParamTableFromCheckpoint(const std::string& path, const std::string& tag,
                                            Env* env) {
  std::string file;
  CKPT_ASSIGN_OR_RETURN(Manifest m, ReadCheckpointManifest(path, tag, &file, env));
  ParamTable t;
  t.source = file;
  t.params = std::move(m.params);
  for (ParamEntry& p : t.params) p.ranges.clear();
  return t;
}

Result<ParamTable> ParamTableFromJsonFile(const std::string& path, Env* env) {
  if (!env) env = Env::Default();
  CKPT_ASSIGN_OR_RETURN(std::string text, ReadJsonFile(env, path), "parameter table");
  CKPT_ASSIGN_OR_RETURN(nlohmann::json j, ParseJson(text, path), "");
  if (j.is_object() && j.contains("params")) j = nlohmann::json(j["params"]);
  if (!j.is_array() || j.empty()) {
    return InvalidArgument(path + ": expected a non-empty array of parameters (or \"params\")");
  }
  ParamTable t;
  t.source = path;
  std::set<std::string> names;
  for (size_t i = 0; i < j.size(); ++i) {
    const nlohmann::json& e = j[i];
    const std::string where = path + ": parameter " + std::to_string(i);
    if (!e.is_object() || !e.contains("name") || !e["name"].is_string() ||
        !e.contains("shape") || !e["shape"].is_array()) {
      return InvalidArgument(where + ": needs \"name\" (string) and \"shape\" (array)");
    }
    ParamEntry p;
    p.name = e["name"].get<std::string>();
    if (p.name.empty() || !names.insert(p.name).second) {
      return InvalidArgument(where + ": empty or duplicate name '" + Excerpt(p.name, 80) + "'");
    }
    int64_t numel = 1;
    for (const auto& d : e["shape"]) {
      if (!d.is_number_integer() || d.get<int64_t>() < 0 ||
          __builtin_mul_overflow(numel, d.get<int64_t>(), &numel)) {
        return InvalidArgument(where + " ('" + Excerpt(p.name, 80) +
                               "'): shape entries must be integers >= 0");
      }
      p.shape.push_back(d.get<int64_t>());
    }
    p.numel = numel;
    if (e.contains("dtype")) {
      auto dt = e["dtype"].is_string() ? DTypeFromName(e["dtype"].get<std::string>())
                                       : std::optional<DType>();
      if (!dt) return InvalidArgument(where + " ('" + Excerpt(p.name, 80) + "'): unknown dtype");
      p.dtype = *dt;
    }
    if (e.contains("frozen")) p.frozen = e["frozen"].is_boolean() && e["frozen"].get<bool>();
    if (e.contains("tied_to") && e["tied_to"].is_string()) {
      p.tied_to = e["tied_to"].get<std::string>();
    }
    t.params.push_back(std::move(p));
  }
  for (const ParamEntry& p : t.params) {
    if (!p.tied_to.empty() && names.count(p.tied_to) == 0) {
      return InvalidArgument(path + ": '" + Excerpt(p.name, 80) + "' is tied to unknown '" +
                             Excerpt(p.tied_to, 80) + "'");
    }
  }
  return t;
}

Result<ParamTable> ParamTableFromSafetensors(const std::string& path) {
  Env* env = Env::Default();
  std::error_code ec;
  if (!env->Exists(path)) return NotFound(path + ": no such file or directory");
  std::vector<std::string> files;
  std::map<std::string, std::string> metadata;
  ParamTable t;
  t.source = path;
  if (fs::is_directory(path, ec)) {
    const fs::path index = fs::path(path) / "model.safetensors.index.json";
    const fs::path single = fs::path(path) / "model.safetensors";
    if (env->Exists(index.string())) {
      CKPT_ASSIGN_OR_RETURN(std::string text, ReadJsonFile(env, index.string()), "");
      CKPT_ASSIGN_OR_RETURN(nlohmann::json j, ParseJson(text, index.string()), "");
      if (!j.is_object() || !j.contains("weight_map") || !j["weight_map"].is_object()) {
        return DataLoss(index.string() + ": not a safetensors index (no weight_map object)");
      }
      std::set<std::string> seen;
      for (const auto& [name, file] : j["weight_map"].items()) {
        if (!file.is_string()) {
          return DataLoss(index.string() + ": weight_map entry '" + Excerpt(name, 80) +
                          "' is not a file name");
        }
        const std::string f = file.get<std::string>();
        if (f.find('/') != std::string::npos || f == "..") {
          return DataLoss(index.string() + ": weight_map names a file outside the directory: '" +
                          Excerpt(f, 80) + "'");
        }
        if (seen.insert(f).second) files.push_back((fs::path(path) / f).string());
      }
      t.source = index.string();
      // export-fp32 also records the aliases in the index's metadata, as an object.
      if (j.contains("metadata") && j["metadata"].is_object()) {
        for (const auto& [k, v] : j["metadata"].items()) {
          if (v.is_object()) metadata.emplace("index:" + k, v.dump());
        }
      }
    } else if (env->Exists(single.string())) {
      files.push_back(single.string());
    } else {
      return NotFound(path + ": neither model.safetensors.index.json nor model.safetensors");
    }
  } else {
    files.push_back(path);
  }

  for (const std::string& f : files) {
    CKPT_ASSIGN_OR_RETURN(safetensors::SafetensorsHeader h, safetensors::ReadSafetensorsHeader(f),
                          f);
    for (const safetensors::SafetensorsTensor& st : h.tensors) {
      ParamEntry p;
      p.name = st.name;
      p.shape = st.shape;
      p.dtype = st.dtype;
      p.numel = st.numel();
      t.params.push_back(std::move(p));
    }
    for (const auto& [k, v] : h.metadata) metadata.emplace(k, v);
  }
  std::map<std::string, const ParamEntry*> by_name;
  for (const ParamEntry& p : t.params) {
    if (!by_name.emplace(p.name, &p).second) {
      return DataLoss(t.source + ": tensor '" + Excerpt(p.name, 80) +
                      "' appears in more than one file");
    }
  }
  std::map<std::string, std::string> aliases;
  for (const auto& [k, v] : metadata) {
    AddAlias(by_name, k, v, aliases);
    if (!v.empty() && v.front() == '{') {
      auto j = ParseJson(v, t.source);  // depth-bounded: a metadata value is free text
      if (j.ok() && j->is_object()) {
        for (const auto& [alias, owner] : j->items()) {
          if (owner.is_string()) AddAlias(by_name, alias, owner.get<std::string>(), aliases);
        }
      }
    }
  }
  std::vector<ParamEntry> alias_entries;
  for (const auto& [alias, owner] : aliases) {
    const ParamEntry* o = by_name.at(owner);
    ParamEntry p;
    p.name = alias;
    p.shape = o->shape;
    p.dtype = o->dtype;
    p.numel = o->numel;
    p.tied_to = owner;
    alias_entries.push_back(std::move(p));
  }
  for (ParamEntry& p : alias_entries) t.params.push_back(std::move(p));
  return t;
}

}  // namespace ckpt::estimate
