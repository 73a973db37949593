// ckpt export-fp32, to-universal, reshard: the convert layer's commands (docs/convert.md).
#include <cstdio>
#include <memory>

#include "ckpt/units.h"
#include "command.h"
#include "convert/export.h"
#include "convert/reshard.h"
#include "convert/universal.h"

namespace ckpt::cli {
namespace {

using nlohmann::json;
using namespace ckpt::convert;

// ---- export-fp32 ----------------------------------------------------------------------------

struct ExportArgs {
  std::string src, out, tag;
  std::string dtype = "fp32";
  std::string max_shard = "5GB";
  bool exclude_frozen = false;
  std::string tied = "metadata";
  bool json = false;
};

std::function<int()> SetupExport(CLI::App& sub) {
  auto a = std::make_shared<ExportArgs>();
  sub.add_option("ROOT", a->src,
                 "checkpoint root, tag directory, universal directory or DeepSpeed checkpoint")
      ->required();
  sub.add_option("OUT", a->out, "output directory (must not exist or be empty)")->required();
  sub.add_option("--tag", a->tag, "tag inside ROOT (default: latest)");
  sub.add_option("--dtype", a->dtype, "fp32 | bf16 | fp16 (every floating-point tensor)")
      ->capture_default_str();
  sub.add_option("--max-shard-size", a->max_shard,
                 "largest safetensors file before sharding: 5GB, 500MB, 2GiB; 0: never shard");
  sub.add_flag("--exclude-frozen", a->exclude_frozen, "leave frozen parameters out");
  sub.add_option("--tied", a->tied,
                 "copy: a tied alias is a tensor of its own (load_state_dict(strict=True) "
                 "works); metadata: stored once, the alias only named in tied_weights")
      ->check(CLI::IsMember({"copy", "metadata"}))
      ->capture_default_str();
  sub.add_flag("--json", a->json, "machine-readable output");
  return [a] {
    ExportOptions o;
    o.tied = a->tied == "copy" ? TiedExport::kCopy : TiedExport::kMetadata;
    o.tag = a->tag;
    auto dt = DTypeFromName(a->dtype);
    if (!dt || (*dt != DType::kF32 && *dt != DType::kBF16 && *dt != DType::kF16))
      return ReportError(
          "export-fp32",
          InvalidArgument("--dtype must be fp32, bf16 or fp16, not '" + a->dtype + "'"), a->json);
    o.dtype = *dt;
    auto shard = ParseByteSize(a->max_shard);
    if (!shard.ok())
      return ReportError("export-fp32", shard.status().WithContext("--max-shard-size"), a->json);
    o.max_shard_bytes = *shard;
    o.exclude_frozen = a->exclude_frozen;
    o.progress = !a->json;
    auto r = ExportFp32(a->src, a->out, o);
    if (!r.ok()) return ReportError("export-fp32", r.status(), a->json);
    if (a->json) {
      json files = json::array();
      for (const auto& f : r->files)
        files.push_back({{"name", f.name}, {"bytes", f.bytes}, {"tensors", f.tensors.size()}});
      PrintJson({{"source", r->source_dir},
                 {"out", r->out},
                 {"tag", r->tag},
                 {"global_step", r->global_step},
                 {"dtype", a->dtype},
                 {"tensors", r->tensors},
                 {"total_size", r->total_size},
                 {"largest_tensor_bytes", r->largest_tensor_bytes},
                 {"bytes_read", r->bytes_read},
                 {"files", files},
                 {"tied", r->tied},
                 {"tied_mode", a->tied},
                 {"excluded", r->excluded}});
    } else {
      std::printf("exported %lld tensors (%s, %s) from %s to %s\n",
                  static_cast<long long>(r->tensors), FormatBytes(r->total_size).c_str(),
                  a->dtype.c_str(), r->source_dir.c_str(), r->out.c_str());
      for (const auto& f : r->files)
        std::printf("  %s  %zu tensors  %s\n", f.name.c_str(), f.tensors.size(),
                    FormatBytes(f.bytes).c_str());
      for (const auto& [alias, owner] : r->tied)
        std::printf("  tied: %s -> %s (%s, recorded in __metadata__)\n", alias.c_str(),
                    owner.c_str(), r->tied_copied ? "written as its own copy" : "stored once");
      for (const auto& e : r->excluded) std::printf("  excluded (frozen): %s\n", e.c_str());
      std::printf("read %s of master weights (moments never read)\n",
                  FormatBytes(r->bytes_read).c_str());
    }
    return 0;
  };
}

// ---- to-universal ---------------------------------------------------------------------------

struct UniversalArgs {
  std::string src, out, tag;
  bool json = false;
};

std::function<int()> SetupToUniversal(CLI::App& sub) {
  auto a = std::make_shared<UniversalArgs>();
  sub.add_option("ROOT", a->src,
                 "checkpoint root, tag directory, universal directory or DeepSpeed checkpoint")
      ->required();
  sub.add_option("OUT", a->out, "output directory (must not exist or be empty)")->required();
  sub.add_option("--tag", a->tag, "tag inside ROOT (default: latest)");
  sub.add_flag("--json", a->json, "machine-readable output");
  return [a] {
    ToUniversalOptions o;
    o.tag = a->tag;
    o.progress = !a->json;
    auto r = ConvertToUniversal(a->src, a->out, o);
    if (!r.ok()) return ReportError("to-universal", r.status(), a->json);
    if (a->json) {
      PrintJson({{"source", r->source_dir},
                 {"out", r->out},
                 {"tag", r->tag},
                 {"source_ranks", r->source_ranks},
                 {"params", r->params_written},
                 {"bytes_read", r->bytes_read},
                 {"file_bytes", r->file_bytes},
                 {"skipped", r->skipped}});
    } else {
      std::printf("wrote universal checkpoint %s (tag %s, %lld parameters, %s) from %d rank(s)\n",
                  r->out.c_str(), r->tag.c_str(), static_cast<long long>(r->params_written),
                  FormatBytes(r->file_bytes).c_str(), r->source_ranks);
      for (const auto& s : r->skipped) std::printf("  not carried over: %s\n", s.c_str());
    }
    return 0;
  };
}

// ---- reshard --------------------------------------------------------------------------------

struct ReshardArgs {
  std::string src, out, tag, compress;
  int dp = 0;
  int zero = -1;
  int threads = 0;
  bool no_verify = false;
  bool json = false;
};

std::function<int()> SetupReshard(CLI::App& sub) {
  auto a = std::make_shared<ReshardArgs>();
  sub.add_option("SRC", a->src,
                 "checkpoint root, tag directory, universal directory or DeepSpeed checkpoint")
      ->required();
  sub.add_option("OUT", a->out, "new checkpoint root (must not exist or be empty)")->required();
  sub.add_option("--dp", a->dp, "new data-parallel world size (>= 1)")->required();
  sub.add_option("--zero", a->zero, "ZeRO stage of the output (default: the source's)");
  sub.add_option("--tag", a->tag, "tag inside SRC (default: latest)");
  sub.add_option("--compress", a->compress,
                 "none | zstd[:LEVEL][+shuffle] (default: the source's)");
  sub.add_option("--threads", a->threads,
                 "new ranks prepared and written at once; peak memory is about this many new "
                 "ranks' shards (default: min(dp, cores, " +
                     std::to_string(kDefaultReshardThreads) + "))")
      ->check(CLI::PositiveNumber);
  sub.add_flag("--no-verify", a->no_verify,
               "skip the up-front XXH3 pass over the source's optimizer state (every slice "
               "copied is still verified as it is read)");
  sub.add_flag("--json", a->json, "machine-readable output");
  return [a] {
    ReshardOptions o;
    o.tag = a->tag;
    o.dp = a->dp;
    o.zero_stage = a->zero;
    o.compression = a->compress;
    o.threads = a->threads;
    o.verify_source = !a->no_verify;
    o.progress = !a->json;
    o.on_warning = [](const std::string& w) {
      std::fprintf(stderr, "ckpt reshard: warning: %s\n", w.c_str());
    };
    auto r = Reshard(a->src, a->out, o);
    if (!r.ok()) return ReportError("reshard", r.status(), a->json);
    if (a->json) {
      json ranks = json::array();
      for (const auto& s : r->ranks)
        ranks.push_back({{"rank", s.rank},
                         {"bytes_read", s.bytes_read},
                         {"bytes_owned", s.bytes_owned},
                         {"ratio", s.ratio()},
                         {"windows", s.windows}});
      PrintJson({{"source", r->source_dir},
                 {"source_kind", std::string(SourceKindName(r->source_kind))},
                 {"out", r->out},
                 {"tag", r->tag},
                 {"source_dp", r->source_dp},
                 {"source_zero", r->source_zero},
                 {"dp", r->dp},
                 {"zero", r->zero_stage},
                 {"threads", r->threads},
                 {"rng", r->rng_copied ? "copied" : "omitted"},
                 {"verify_bytes", r->verify_bytes},
                 {"ranks", ranks},
                 {"max_ratio", r->max_ratio()},
                 {"skipped", r->skipped},
                 {"warnings", r->warnings}});
    } else {
      std::printf("resharded %s (%s, %d rank(s), ZeRO-%d) -> %s/%s (%d rank(s), ZeRO-%d)\n",
                  r->source_dir.c_str(), std::string(SourceKindName(r->source_kind)).c_str(),
                  r->source_dp, r->source_zero, r->out.c_str(), r->tag.c_str(), r->dp,
                  r->zero_stage);
      for (const auto& s : r->ranks)
        std::printf("  rank %d: read %s for %s owned (ratio %.4f)\n", s.rank,
                    FormatBytes(s.bytes_read).c_str(), FormatBytes(s.bytes_owned).c_str(),
                    s.ratio());
      std::printf("RNG: %s\n", r->rng_copied
                                   ? "copied (same world size)"
                                   : "omitted (engine_min seeds from seed, global_step, rank)");
      if (r->verify_bytes)
        std::printf("source verified: %s checked against XXH3\n",
                    FormatBytes(r->verify_bytes).c_str());
      for (const auto& s : r->skipped) std::printf("  not carried over: %s\n", s.c_str());
    }
    return 0;
  };
}

// ---- import-deepspeed -----------------------------------------------------------------------

struct ImportArgs {
  std::string src, out, tag, compress;
  bool json = false;
};

std::function<int()> SetupImportDeepSpeed(CLI::App& sub) {
  auto a = std::make_shared<ImportArgs>();
  sub.add_option("DS_ROOT", a->src, "DeepSpeed checkpoint root (with latest) or tag directory")
      ->required();
  sub.add_option("OUT", a->out, "new ckpt root (must not exist or be empty)")->required();
  sub.add_option("--tag", a->tag, "tag inside DS_ROOT (default: latest)");
  sub.add_option("--compress", a->compress, "none | zstd[:LEVEL][+shuffle] (default none)");
  sub.add_flag("--json", a->json, "machine-readable output");
  return [a] {
    ReshardOptions o;
    o.tag = a->tag;
    o.compression = a->compress;
    o.progress = !a->json;
    auto imported = ImportDeepSpeed(a->src, a->out, o);
    if (!imported.ok()) return ReportError("import-deepspeed", imported.status(), a->json);
    const ReshardReport& r = imported->reshard;
    if (a->json) {
      PrintJson({{"source", r.source_dir},
                 {"out", r.out},
                 {"tag", r.tag},
                 {"dp", r.dp},
                 {"zero", r.zero_stage},
                 {"global_step", imported->global_step},
                 {"params", imported->params},
                 {"ds_version", imported->ds_version},
                 {"not_carried", r.skipped}});
    } else {
      std::printf("imported DeepSpeed %s checkpoint %s (%d rank(s), ZeRO-%d, step %lld) -> %s/%s\n",
                  imported->ds_version.c_str(), r.source_dir.c_str(), r.dp, r.zero_stage,
                  static_cast<long long>(imported->global_step), r.out.c_str(), r.tag.c_str());
      for (const auto& s : r.skipped) std::printf("  not carried over: %s\n", s.c_str());
    }
    return 0;
  };
}

}  // namespace

CKPT_REGISTER_COMMAND(import_deepspeed, "import-deepspeed",
                      "convert a DeepSpeed ZeRO checkpoint into a ckpt checkpoint (no pickle code "
                      "is run)",
                      SetupImportDeepSpeed);
CKPT_REGISTER_COMMAND(export_fp32, "export-fp32",
                      "export the model weights to safetensors (streaming, bounded memory)",
                      SetupExport);
CKPT_REGISTER_COMMAND(to_universal, "to-universal",
                      "convert a checkpoint to the topology-free universal layout",
                      SetupToUniversal);
CKPT_REGISTER_COMMAND(reshard, "reshard",
                      "write a checkpoint for another data-parallel world size / ZeRO stage",
                      SetupReshard);

}  // namespace ckpt::cli
