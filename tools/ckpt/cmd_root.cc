// ckpt ls / inspect / check / gc: looking at a checkpoint root and keeping it clean.
#include <chrono>
#include <cstdio>

#include "ckpt/root.h"
#include "ckpt/state_source.h"
#include "ckpt/units.h"
#include "command.h"
#include "convert/check.h"

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
                  !t.latest ? "" : listing->latest_inferred ? "  <- latest (inferred: a save committed it and did not write `latest`; ckpt gc writes it)" : "  <- latest");
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
  sub.add_option("PATH", a->path,
                 "checkpoint root (its latest tag), a tag directory, a universal directory or a "
                 "DeepSpeed checkpoint")
      ->required();
  sub.add_option("--tag", a->tag, "tag inside the root");
  sub.add_flag("--json", a->json, "machine-readable output");
  return [a] {
    SourceOptions o;
    o.tag = a->tag;
    o.check_files = false;  // the tables only: a damaged rank file is `ckpt check`'s to report
    auto source = OpenStateSource(a->path, o);
    if (!source.ok()) return ReportError("inspect", source.status(), a->json);
    if (a->json)
      PrintJson(InspectSourceToJson(**source));
    else
      std::fputs(InspectSourceToText(**source).c_str(), stdout);
    return 0;
  };
}

struct CheckArgs {
  std::string root;
  std::string tag;
  bool deep = false;
  bool json = false;
};

std::function<int()> SetupCheck(CLI::App& sub) {
  auto a = std::make_shared<CheckArgs>();
  sub.add_option("ROOT", a->root,
                 "checkpoint root (checks latest), a tag directory, a universal directory, a "
                 "DeepSpeed checkpoint, or a safetensors export (file or directory)")
      ->required();
  sub.add_option("--tag", a->tag, "tag inside the root; for an export, the tag it must be of");
  sub.add_flag("--deep", a->deep, "verify every file, dataset and tensor checksum");
  sub.add_flag("--json", a->json, "machine-readable output");
  return [a] {
    convert::PathCheckOptions o;
    o.tag = a->tag;
    o.deep = a->deep;
    o.progress = !a->json;
    auto found = convert::CheckPath(a->root, o);
    if (!found.ok()) return ReportError("check", found.status(), a->json);
    if (a->json)
      PrintJson(convert::PathCheckToJson(*found));
    else
      std::fputs(convert::PathCheckToText(*found).c_str(), stdout);
    return found->ok() ? 0 : 1;
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
                 {"yielded", report->yielded},
                 {"dry_run", a->dry_run}});
    } else {
      const char* did = a->dry_run ? "would remove" : "removed";
      if (!report->restored_latest.empty())
        std::printf("%s latest -> %s (a save had committed it but not written latest)\n",
                    a->dry_run ? "would restore" : "restored", report->restored_latest.c_str());
      for (const auto& p : report->removed_temporary) std::printf("%s temporary %s\n", did, p.c_str());
      for (const auto& t : report->removed_tags) std::printf("%s tag %s\n", did, t.c_str());
      if (report->yielded)
        std::printf("stopped early: a save is waiting for the root lock (the rest is left for "
                    "the next gc)\n");
      else if (report->removed_temporary.empty() && report->removed_tags.empty() &&
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
