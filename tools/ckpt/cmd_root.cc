// ckpt ls / inspect / check / gc: looking at a checkpoint root and keeping it clean.
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <optional>

#include "ckpt/deepspeed.h"
#include "ckpt/hash.h"
#include "ckpt/reader.h"
#include "ckpt/root.h"
#include "ckpt/units.h"
#include "command.h"
#include "convert/export.h"
#include "convert/universal.h"

namespace ckpt::cli {
namespace {

using nlohmann::json;

std::string Age(int64_t created_unix) {
  if (created_unix <= 0) return "?";
  const int64_t now = std::chrono::duration_cast<std::chrono::seconds>(
                          std::chrono::system_clock::now().time_since_epoch())
                          .count();
  const int64_t s = std::max<int64_t>(0, now - created_unix);
  char buf[32];
  if (s < 120) std::snprintf(buf, sizeof buf, "%llds", static_cast<long long>(s));
  else if (s < 7200) std::snprintf(buf, sizeof buf, "%lldm", static_cast<long long>(s / 60));
  else if (s < 172800) std::snprintf(buf, sizeof buf, "%lldh", static_cast<long long>(s / 3600));
  else std::snprintf(buf, sizeof buf, "%lldd", static_cast<long long>(s / 86400));
  return buf;
}

std::string ShapeText(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

struct LsArgs {
  std::string root;
  bool json = false;
};

std::function<int()> SetupLs(CLI::App& sub) {
  auto a = std::make_shared<LsArgs>();
  sub.add_option("ROOT", a->root, "checkpoint root")->required();
  sub.add_flag("--json", a->json, "machine-readable output");
  return [a] {
    auto listing = ListRoot(a->root);
    if (!listing.ok()) return ReportError("ls", listing.status(), a->json);
    if (a->json) {
      PrintJson(RootListingToJson(*listing));
      return 0;
    }
    std::printf("%-24s %12s %6s %12s %6s\n", "TAG", "STEP", "RANKS", "SIZE", "AGE");
    for (const auto& t : listing->tags) {
      if (!t.error.empty()) {
        std::printf("%-24s  unreadable: %s\n", t.tag.c_str(), t.error.c_str());
        continue;
      }
      std::printf("%-24s %12lld %6d %12s %6s%s\n", t.tag.c_str(),
                  static_cast<long long>(t.global_step), t.ranks, FormatBytes(t.bytes).c_str(),
                  Age(t.created_unix).c_str(),
                  !t.latest ? "" : listing->latest_inferred ? "  <- latest (inferred: no `latest` file; ckpt gc writes it)" : "  <- latest");
    }
    if (listing->tags.empty()) std::printf("(no committed tags)\n");
    if (!listing->temporary.empty()) {
      std::printf("\nleftover temporary directories (not checkpoints; `ckpt gc` removes them):\n");
      for (const auto& t : listing->temporary) std::printf("  %s\n", t.c_str());
    }
    return 0;
  };
}

struct InspectArgs {
  std::string path;
  std::string tag;
  bool json = false;
};

std::function<int()> SetupInspect(CLI::App& sub) {
  auto a = std::make_shared<InspectArgs>();
  sub.add_option("PATH", a->path, "checkpoint root (its latest tag) or a tag directory")
      ->required();
  sub.add_option("--tag", a->tag, "tag inside the root");
  sub.add_flag("--json", a->json, "machine-readable output");
  return [a] {
    // A DeepSpeed checkpoint reads through its own reader into the same manifest form.
    std::optional<DeepSpeedReader> ds;
    std::optional<CheckpointReader> reader;
    if (!DeepSpeedTagDir(a->path, a->tag).empty()) {
      auto r = DeepSpeedReader::Open(a->path, a->tag);
      if (!r.ok()) return ReportError("inspect", r.status(), a->json);
      ds.emplace(std::move(*r));
    } else {
      auto r = CheckpointReader::Open(a->path, a->tag, OpenOptions{});
      if (!r.ok()) return ReportError("inspect", r.status(), a->json);
      reader.emplace(std::move(*r));
    }
    const Manifest& m = ds ? ds->manifest() : reader->manifest();
    const std::string& dir = ds ? ds->dir() : reader->dir();
    if (a->json) {
      json out = InspectToJson(m, dir);
      if (ds) {
        const DeepSpeedInfo& i = ds->info();
        out["deepspeed"] = {{"ds_version", i.ds_version},
                            {"optimizer", i.optimizer},
                            {"model_dtype", i.model_dtype},
                            {"model_files", i.model_files},
                            {"optim_files", i.optim_files},
                            {"buffers", i.buffers},
                            {"group_partition", i.group_partition},
                            {"lr_scheduler", i.lr_scheduler},
                            {"checksums", false}};
      }
      PrintJson(out);
      return 0;
    }
    std::printf("tag            %s  (%s)\n", m.tag.c_str(), dir.c_str());
    if (ds) {
      const DeepSpeedInfo& i = ds->info();
      std::printf("format         DeepSpeed %s ZeRO checkpoint (%s, %s training); no checksums "
                  "(DeepSpeed records none)\n",
                  i.ds_version.c_str(), i.optimizer.c_str(), i.model_dtype.c_str());
      std::printf("files          %zu model-states + %zu optimizer file(s)\n",
                  i.model_files.size(), i.optim_files.size());
      if (!i.buffers.empty())
        std::printf("buffers        %zu (listed as frozen)\n", i.buffers.size());
      if (!i.lr_scheduler.is_null())
        std::printf("lr_scheduler   %s\n", i.lr_scheduler.dump().c_str());
    }
    if (!ds)
      std::printf("format         %s %d.%d, written by %s at %s\n", m.format.c_str(),
                  m.version_major, m.version_minor, m.writer.c_str(), m.created_utc.c_str());
    std::printf("counters       global_step %lld, micro_step %lld, skipped %lld, samples %lld, "
                "tokens %lld\n",
                static_cast<long long>(m.counters.global_step),
                static_cast<long long>(m.counters.micro_step),
                static_cast<long long>(m.counters.skipped_steps),
                static_cast<long long>(m.counters.samples_seen),
                static_cast<long long>(m.counters.tokens_seen));
    std::printf("topology       dp %d, tp %d, pp %d, ZeRO-%d (%s partition, alignment %lld)\n",
                m.topology.dp_world_size, m.topology.tp, m.topology.pp, m.topology.zero_stage,
                m.partition.scheme.c_str(), static_cast<long long>(m.partition.alignment));
    std::printf("optimizer      %s\n", m.optimizer.dump().c_str());
    uint64_t bytes = 0;
    std::string comp;
    for (const auto& f : m.files) {
      bytes += f.bytes;
      comp = f.compression;
    }
    if (!ds)
      std::printf("files          %zu rank files, %s, compression %s\n", m.files.size(),
                  FormatBytes(bytes).c_str(), comp.c_str());
    std::printf("parameters     %lld unique\n", static_cast<long long>(m.UniqueParamCount()));
    std::printf("  %-36s %-18s %-6s %12s  %s\n", "NAME", "SHAPE", "DTYPE", "NUMEL", "NOTE");
    for (const auto& p : m.params) {
      std::string note = p.frozen ? "frozen" : "";
      if (!p.tied_to.empty()) note = "tied to " + p.tied_to;
      if (p.trainable()) note = std::to_string(p.ranges.size()) + " owner range(s)";
      std::printf("  %-36s %-18s %-6s %12lld  %s\n", p.name.c_str(), ShapeText(p.shape).c_str(),
                  std::string(DTypeName(p.dtype)).c_str(), static_cast<long long>(p.numel),
                  note.c_str());
    }
    if (!m.client_state.empty()) std::printf("client_state   %s\n", m.client_state.dump().c_str());
    return 0;
  };
}

// A universal checkpoint (ckpt to-universal): its manifest, file size and, with deep, the file
// and every dataset checksum.
std::vector<Problem> CheckUniversal(const std::string& dir, bool deep) {
  std::vector<Problem> problems;
  auto reader = convert::UniversalReader::Open(dir);
  if (!reader.ok()) {
    problems.push_back({std::string(kManifestFile), "", reader.status().message()});
    return problems;
  }
  for (const auto& f : reader->manifest().files) {
    const std::string path = dir + "/" + f.path;
    auto size = Env::Default()->FileSize(path);
    if (!size.ok() || *size != f.bytes) {
      problems.push_back({f.path, "", size.ok() ? "size " + std::to_string(*size) +
                                                      " bytes, manifest records " +
                                                      std::to_string(f.bytes)
                                                : size.status().message()});
      continue;
    }
    if (!deep) continue;
    if (!f.xxh3.empty()) {
      auto h = Xxh3FileHex(path);
      if (!h.ok() || *h != f.xxh3)
        problems.push_back({f.path, "", h.ok() ? "file checksum mismatch (manifest " + f.xxh3 +
                                                     ", file " + *h + ")"
                                               : h.status().message()});
    }
    for (const auto& d : f.datasets) {
      Status s = reader->VerifyDataset(d.name);
      if (!s.ok()) problems.push_back({f.path, d.name, s.message()});
    }
  }
  return problems;
}

struct CheckArgs {
  std::string root;
  std::string tag;
  bool deep = false;
  bool json = false;
};

// A safetensors export (ckpt export-fp32): a file, or a directory with no checkpoint in it.
bool IsExportPath(const std::string& path) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec) &&
      (std::filesystem::exists(path + "/" + std::string(kManifestFile), ec) ||
       std::filesystem::exists(path + "/" + std::string(kLatestFile), ec)))
    return false;
  return convert::IsSafetensorsExport(path);
}

// `ckpt check EXPORT`: header digests always, tensor digests with --deep; --tag names the tag
// the export must be of.
int CheckExportCommand(const CheckArgs& a) {
  convert::CheckExportOptions opts;
  opts.deep = a.deep;
  opts.expected_tag = a.tag;
  auto found = convert::CheckExport(a.root, opts);
  if (!found.ok()) return ReportError("check", found.status(), a.json);
  const auto& problems = found->problems;
  // Intact files of another tag are a mismatch, not corruption.
  const bool tag_mismatch = !problems.empty() && found->tag_mismatches == problems.size();
  if (a.json) {
    json pj = json::array();
    for (const auto& p : problems)
      pj.push_back({{"file", p.file}, {"tensor", p.dataset}, {"what", p.what}});
    PrintJson({{"ok", problems.empty()},
               {"verdict", problems.empty() ? "ok" : tag_mismatch ? "tag mismatch" : "corrupt"},
               {"dir", found->dir},
               {"kind", "safetensors"},
               {"files", found->files},
               {"checksummed", found->checksummed},
               {"deep", a.deep},
               {"problems", pj}});
  } else if (problems.empty()) {
    std::printf("ok: %s, %zu safetensors file(s) (%s)\n", a.root.c_str(), found->files.size(),
                !found->checksummed
                    ? "structure only: no checksums recorded (another tool, or an export "
                      "written before ckpt recorded them)"
                    : a.deep ? "headers and every tensor checksum"
                             : "headers and their checksums; --deep for tensor data");
  } else {
    if (tag_mismatch) {
      std::printf("tag mismatch: the files are intact, but not an export of tag '%s'\n",
                  a.tag.c_str());
    } else {
      std::printf("CORRUPT: %zu problem(s)\n", problems.size());
    }
    for (const auto& p : problems) {
      std::printf("  %s/%s%s%s: %s\n", found->dir.c_str(), p.file.c_str(),
                  p.dataset.empty() ? "" : " tensor ", p.dataset.c_str(), p.what.c_str());
    }
  }
  return problems.empty() ? 0 : 1;
}

// `ckpt check DS_ROOT`: DeepSpeed records no checksums of its own, so the check is the layout
// (DeepSpeedReader::Open), every zip record's CRC-32 and every tensor read through the
// parameter table; --deep adds nothing.
int CheckDeepSpeedCommand(const CheckArgs& a) {
  std::vector<Problem> problems;
  std::string dir = DeepSpeedTagDir(a.root, a.tag);
  auto reader = DeepSpeedReader::Open(a.root, a.tag);
  if (!reader.ok()) {
    if (reader.status().code() != StatusCode::kDataLoss)
      return ReportError("check", reader.status(), a.json);
    problems.push_back({"", "", reader.status().message()});
  } else {
    auto found = reader->Check();
    if (!found.ok()) return ReportError("check", found.status(), a.json);
    problems = std::move(*found);
  }
  const char* kNote =
      "DeepSpeed stores no checksums: checked the layout, every zip record's CRC-32 and that "
      "every tensor reads";
  if (a.json) {
    json pj = json::array();
    for (const auto& p : problems)
      pj.push_back({{"file", p.file}, {"dataset", p.dataset}, {"what", p.what}});
    PrintJson({{"ok", problems.empty()},
               {"dir", dir},
               {"kind", "deepspeed"},
               {"checksums", false},
               {"note", kNote},
               {"deep", a.deep},
               {"problems", pj}});
  } else if (problems.empty()) {
    std::printf("ok: %s (%s)\n", dir.c_str(), kNote);
  } else {
    std::printf("CORRUPT: %zu problem(s)\n", problems.size());
    for (const auto& p : problems)
      std::printf("  %s%s%s: %s\n", p.file.c_str(), p.dataset.empty() ? "" : " parameter ",
                  p.dataset.c_str(), p.what.c_str());
  }
  return problems.empty() ? 0 : 1;
}

std::function<int()> SetupCheck(CLI::App& sub) {
  auto a = std::make_shared<CheckArgs>();
  sub.add_option("ROOT", a->root,
                 "checkpoint root (checks latest), a tag directory, a universal directory, or a "
                 "safetensors export (file or directory)")
      ->required();
  sub.add_option("--tag", a->tag, "tag inside the root; for an export, the tag it must be of");
  sub.add_flag("--deep", a->deep, "verify every file, dataset and tensor checksum");
  sub.add_flag("--json", a->json, "machine-readable output");
  return [a] {
    if (IsExportPath(a->root)) return CheckExportCommand(*a);
    if (!DeepSpeedTagDir(a->root, a->tag).empty()) return CheckDeepSpeedCommand(*a);
    std::vector<Problem> problems;
    auto dir = ResolveTagDir(a->root, a->tag);
    if (!dir.ok()) {
      if (dir.status().code() != StatusCode::kDataLoss)
        return ReportError("check", dir.status(), a->json);
      problems.push_back({std::string(kLatestFile), "", dir.status().message()});
    } else if (convert::IsUniversal(*dir)) {
      problems = CheckUniversal(*dir, a->deep);
    } else {
      auto found = CheckCheckpoint(*dir, a->deep, nullptr, /*progress=*/!a->json);
      if (!found.ok()) return ReportError("check", found.status(), a->json);
      problems = std::move(*found);
    }
    if (a->json) {
      PrintJson(CheckReportToJson(problems, dir.ok() ? *dir : std::string(), a->deep));
    } else if (problems.empty()) {
      std::printf("ok: %s (%s)\n", dir->c_str(), a->deep ? "structure, sizes and every checksum"
                                                          : "structure and sizes; --deep for checksums");
    } else {
      std::printf("CORRUPT: %zu problem(s)\n", problems.size());
      for (const auto& p : problems) {
        std::printf("  %s%s%s: %s\n", p.file.c_str(), p.dataset.empty() ? "" : " /",
                    p.dataset.c_str(), p.what.c_str());
      }
    }
    return problems.empty() ? 0 : 1;
  };
}

struct GcArgs {
  std::string root;
  int keep_last = 0;
  bool dry_run = false;
  bool json = false;
};

std::function<int()> SetupGc(CLI::App& sub) {
  auto a = std::make_shared<GcArgs>();
  sub.add_option("ROOT", a->root, "checkpoint root")->required();
  sub.add_option("--keep-last", a->keep_last, "also delete all but the newest K tags (never latest)")
      ->check(CLI::NonNegativeNumber);
  sub.add_flag("--dry-run", a->dry_run, "say what would be removed, change nothing");
  sub.add_flag("--json", a->json, "machine-readable output");
  return [a] {
    auto report = CollectGarbage(a->root, a->keep_last, nullptr, a->dry_run);
    if (!report.ok()) return ReportError("gc", report.status(), a->json);
    if (a->json) {
      PrintJson({{"removed_temporary", report->removed_temporary},
                 {"removed_tags", report->removed_tags},
                 {"restored_latest", report->restored_latest.empty()
                                         ? json(nullptr)
                                         : json(report->restored_latest)},
                 {"dry_run", a->dry_run}});
    } else {
      const char* did = a->dry_run ? "would remove" : "removed";
      if (!report->restored_latest.empty())
        std::printf("%s latest -> %s (a save had committed it but not written latest)\n",
                    a->dry_run ? "would restore" : "restored", report->restored_latest.c_str());
      for (const auto& p : report->removed_temporary) std::printf("%s temporary %s\n", did, p.c_str());
      for (const auto& t : report->removed_tags) std::printf("%s tag %s\n", did, t.c_str());
      if (report->removed_temporary.empty() && report->removed_tags.empty() &&
          report->restored_latest.empty())
        std::printf("nothing to remove\n");
    }
    return 0;
  };
}

}  // namespace

CKPT_REGISTER_COMMAND(ls, "ls", "list committed tags, the latest pointer and leftover temporaries",
                      SetupLs);
CKPT_REGISTER_COMMAND(inspect, "inspect", "summarize a checkpoint's manifest", SetupInspect);
CKPT_REGISTER_COMMAND(check, "check",
                      "check structure and sizes; --deep verifies every checksum (exit 1 on "
                      "corruption)",
                      SetupCheck);
CKPT_REGISTER_COMMAND(gc, "gc",
                      "remove temporary directories left by crashed saves; --keep-last K also "
                      "old tags (--dry-run: only say what would go)",
                      SetupGc);

}  // namespace ckpt::cli
