// `ckpt inspect` and `ckpt check` of any checkpoint kind (ckpt/state_source.h): what they find
// and how it is printed, so the CLI only parses flags and prints.
#include <cstdio>

#include "ckpt/deepspeed.h"
#include "ckpt/json.h"
#include "ckpt/progress.h"
#include "ckpt/root.h"
#include "ckpt/shape.h"
#include "ckpt/state_source.h"
#include "ckpt/units.h"
#include "ckpt/universal.h"
#include "rank_file.h"

namespace ckpt {
namespace {

constexpr const char* kDeepSpeedNote =
    "DeepSpeed stores no checksums: checked the layout, every zip record's CRC-32 and that "
    "every tensor reads";

// A universal checkpoint: its manifest, file size and, with deep, the file and every dataset
// checksum.
std::vector<Problem> CheckUniversal(const std::string& dir, bool deep, Env* env, bool progress) {
  std::vector<Problem> problems;
  auto reader = UniversalReader::Open(dir, env);
  if (!reader.ok()) {
    problems.push_back({std::string(kManifestFile), "", reader.status().message()});
    return problems;
  }
  uint64_t total = 0;
  for (const auto& f : reader->manifest().files) total += f.bytes;
  Progress bar("check --deep", total, progress && deep);
  for (const auto& f : reader->manifest().files) {
    const std::string path = dir + "/" + f.path;
    auto size = env->FileSize(path);
    if (!size.ok() || *size != f.bytes) {
      problems.push_back({f.path, "", size.ok() ? "size " + std::to_string(*size) +
                                                      " bytes, manifest records " +
                                                      std::to_string(f.bytes)
                                                : size.status().message()});
      continue;
    }
    if (!deep) continue;
    // One pass over the file, as a sharded checkpoint's check: the file digest and every
    // dataset's from the same bytes (the file is sealed as a rank file is; RankFile verifies
    // the seal before HDF5 parses anything).
    auto rf = internal::RankFile::Open(path, f.path, f, env, /*universal=*/true);
    if (!rf.ok()) {
      problems.push_back({f.path, "", rf.status().message()});
      continue;
    }
    auto checked = (*rf)->CheckWholeFile(f.datasets, [&](uint64_t n) { bar.Add(n); });
    if (!checked.ok()) {
      problems.push_back({f.path, "", checked.status().message()});
      continue;
    }
    if (!f.xxh3.empty() && checked->file_xxh3 != f.xxh3)
      problems.push_back({f.path, "", "file checksum mismatch (manifest " + f.xxh3 + ", file " +
                                          checked->file_xxh3 + ")"});
    for (size_t i = 0; i < f.datasets.size(); ++i)
      if (!checked->datasets[i].ok())
        problems.push_back({f.path, f.datasets[i].name, checked->datasets[i].message()});
  }
  bar.Finish();
  return problems;
}

// DeepSpeed records no checksums of its own, so the check is the layout (DeepSpeedReader::Open)
// and every zip record's CRC-32, each byte read once, each file as soon as it is open
// (DeepSpeedReader::OpenOptions::check_records, reported by DeepSpeedReader::Check).
Result<std::vector<Problem>> CheckDeepSpeed(const std::string& path, const std::string& tag,
                                            Env* env, bool progress) {
  DeepSpeedReader::OpenOptions options;
  options.check_records = true;  // each file read as soon as it is open
  options.progress = progress;
  auto reader = DeepSpeedReader::Open(path, tag, env, options);
  if (!reader.ok()) {
    if (reader.status().code() != StatusCode::kDataLoss) return reader.status();
    return std::vector<Problem>{{"", "", reader.status().message()}};
  }
  return reader->Check();
}

}  // namespace

nlohmann::json InspectSourceToJson(const StateSource& source) {
  nlohmann::json out = InspectToJson(source.manifest(), source.dir());
  if (const DeepSpeedInfo* i = source.deepspeed()) {
    out["deepspeed"] = {{"ds_version", i->ds_version},
                        {"optimizer", i->optimizer},
                        {"model_dtype", i->model_dtype},
                        {"model_files", i->model_files},
                        {"optim_files", i->optim_files},
                        {"buffers", i->buffers},
                        {"group_partition", i->group_partition},
                        {"lr_scheduler", i->lr_scheduler},
                        {"checksums", false}};
  }
  return out;
}

std::string InspectSourceToText(const StateSource& source) {
  const Manifest& m = source.manifest();
  const DeepSpeedInfo* ds = source.deepspeed();
  std::string out;
  out += StrFormat("tag            %s  (%s)\n", m.tag.c_str(), source.dir().c_str());
  if (ds) {
    out += StrFormat(
        "format         DeepSpeed %s ZeRO checkpoint (%s, %s training); no checksums "
        "(DeepSpeed records none)\n",
        ds->ds_version.c_str(), ds->optimizer.c_str(), ds->model_dtype.c_str());
    out += StrFormat("files          %zu model-states + %zu optimizer file(s)\n",
                     ds->model_files.size(), ds->optim_files.size());
    if (!ds->buffers.empty())
      out += StrFormat("buffers        %zu (listed as frozen)\n", ds->buffers.size());
    if (!ds->lr_scheduler.is_null())
      out += StrFormat("lr_scheduler   %s\n", JsonText(ds->lr_scheduler).c_str());
  } else {
    out += StrFormat("format         %s %d.%d%s, written by %s at %s\n", m.format.c_str(),
                     m.version_major, m.version_minor,
                     source.kind() == SourceKind::kUniversal ? " (universal layout)" : "",
                     m.writer.c_str(), m.created_utc.c_str());
  }
  out += StrFormat(
      "counters       global_step %lld, micro_step %lld, skipped %lld, samples %lld, "
      "tokens %lld\n",
      static_cast<long long>(m.counters.global_step), static_cast<long long>(m.counters.micro_step),
      static_cast<long long>(m.counters.skipped_steps),
      static_cast<long long>(m.counters.samples_seen),
      static_cast<long long>(m.counters.tokens_seen));
  out += StrFormat("topology       dp %d, tp %d, pp %d, ZeRO-%d (%s partition, alignment %lld)%s\n",
                   m.topology.dp_world_size, m.topology.tp, m.topology.pp, m.topology.zero_stage,
                   m.partition.scheme.c_str(), static_cast<long long>(m.partition.alignment),
                   source.kind() == SourceKind::kUniversal ? " of the source" : "");
  out += StrFormat("optimizer      %s\n", JsonText(m.optimizer).c_str());
  if (!ds) {
    uint64_t bytes = 0;
    std::string comp;
    for (const auto& f : m.files) {
      bytes += f.bytes;
      comp = f.compression;
    }
    out += StrFormat("files          %zu %s, %s, compression %s\n", m.files.size(),
                     source.kind() == SourceKind::kUniversal ? "universal file(s)" : "rank files",
                     FormatBytes(bytes).c_str(), comp.c_str());
  }
  out += StrFormat("parameters     %lld unique\n", static_cast<long long>(m.UniqueParamCount()));
  out += StrFormat("  %-36s %-18s %-6s %12s  %s\n", "NAME", "SHAPE", "DTYPE", "NUMEL", "NOTE");
  for (const auto& p : m.params) {
    std::string note = p.frozen ? "frozen" : "";
    if (!p.tied_to.empty()) note = "tied to " + p.tied_to;
    if (p.trainable() && !p.ranges.empty())
      note = std::to_string(p.ranges.size()) + " owner range(s)";
    out += StrFormat("  %-36s %-18s %-6s %12lld  %s\n", p.name.c_str(), ShapeText(p.shape).c_str(),
                     std::string(DTypeName(p.dtype)).c_str(), static_cast<long long>(p.numel),
                     note.c_str());
  }
  if (!m.client_state.empty())
    out += StrFormat("client_state   %s\n", JsonText(m.client_state).c_str());
  return out;
}

Result<SourceCheck> CheckSource(const std::string& path, const std::string& tag, bool deep,
                                Env* env, bool progress) {
  if (!env) env = Env::Default();
  SourceCheck c;
  c.deep = deep;
  if (std::string ds = DeepSpeedTagDir(path, tag, env); !ds.empty()) {
    c.kind = SourceKind::kDeepSpeed;
    c.dir = ds;
    CKPT_ASSIGN_OR_RETURN(c.problems, CheckDeepSpeed(path, tag, env, progress), "");
    return c;
  }
  auto dir = ResolveTagDir(path, tag, env);
  if (!dir.ok()) {
    if (dir.status().code() != StatusCode::kDataLoss) return dir.status();
    c.problems.push_back({std::string(kLatestFile), "", dir.status().message()});
    return c;
  }
  c.dir = *dir;
  if (IsUniversal(*dir, "", env)) {
    c.kind = SourceKind::kUniversal;
    c.problems = CheckUniversal(*dir, deep, env, progress);
    return c;
  }
  CKPT_ASSIGN_OR_RETURN(c.problems, CheckCheckpoint(*dir, deep, env, progress), "");
  return c;
}

nlohmann::json SourceCheckToJson(const SourceCheck& c) {
  nlohmann::json j = CheckReportToJson(c.problems, c.dir, c.deep);
  if (c.kind == SourceKind::kDeepSpeed) {
    j["kind"] = std::string(SourceKindName(c.kind));
    j["checksums"] = false;
    j["note"] = kDeepSpeedNote;
  }
  return j;
}

std::string SourceCheckToText(const SourceCheck& c) {
  std::string out;
  if (c.problems.empty()) {
    const char* what = c.kind == SourceKind::kDeepSpeed
                           ? kDeepSpeedNote
                           : c.deep ? "structure, sizes and every checksum"
                                    : "structure and sizes; --deep for checksums";
    out += StrFormat("ok: %s (%s)\n", c.dir.c_str(), what);
    return out;
  }
  out += StrFormat("CORRUPT: %zu problem(s)\n", c.problems.size());
  const char* sep = c.kind == SourceKind::kDeepSpeed ? " parameter " : " /";
  for (const auto& p : c.problems) {
    if (p.file.empty() && p.dataset.empty()) {  // the message names the file (a layout problem)
      out += StrFormat("  %s\n", p.what.c_str());
      continue;
    }
    out += StrFormat("  %s%s%s: %s\n", p.file.c_str(), p.dataset.empty() ? "" : sep,
                     p.dataset.c_str(), p.what.c_str());
  }
  return out;
}

}  // namespace ckpt
