// ckpt check of any path (convert/check.h).
#include "convert/check.h"

#include <filesystem>

#include "ckpt/manifest.h"

namespace ckpt::convert {
namespace {

// A safetensors export (ckpt export-fp32): a file, or a directory with no checkpoint in it.
bool IsExportPath(const std::string& path) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec) &&
      (std::filesystem::exists(path + "/" + std::string(kManifestFile), ec) ||
       std::filesystem::exists(path + "/" + std::string(kLatestFile), ec)))
    return false;
  return IsSafetensorsExport(path);
}

}  // namespace

bool PathCheck::ok() const {
  return checkpoint ? checkpoint->problems.empty() : exported && exported->problems.empty();
}

bool PathCheck::tag_mismatch() const {
  return exported && !exported->problems.empty() &&
         exported->tag_mismatches == exported->problems.size();
}

Result<PathCheck> CheckPath(const std::string& path, const PathCheckOptions& options) {
  PathCheck c;
  c.path = path;
  c.options = options;
  if (IsExportPath(path)) {
    CheckExportOptions eo;
    eo.deep = options.deep;
    eo.expected_tag = options.tag;
    CKPT_ASSIGN_OR_RETURN(c.exported, CheckExport(path, eo), "");
    return c;
  }
  CKPT_ASSIGN_OR_RETURN(c.checkpoint,
                        CheckSource(path, options.tag, options.deep, options.env, options.progress),
                        "");
  return c;
}

nlohmann::json PathCheckToJson(const PathCheck& c) {
  if (c.checkpoint) return SourceCheckToJson(*c.checkpoint);
  const ExportCheck& e = *c.exported;
  nlohmann::json pj = nlohmann::json::array();
  for (const auto& p : e.problems)
    pj.push_back({{"file", p.file}, {"tensor", p.dataset}, {"what", p.what}});
  return {{"ok", c.ok()},
          {"verdict", c.ok() ? "ok" : c.tag_mismatch() ? "tag mismatch" : "corrupt"},
          {"dir", e.dir},
          {"kind", "safetensors"},
          {"files", e.files},
          {"checksummed", e.checksummed},
          {"deep", c.options.deep},
          {"problems", pj}};
}

std::string PathCheckToText(const PathCheck& c) {
  if (c.checkpoint) return SourceCheckToText(*c.checkpoint);
  const ExportCheck& e = *c.exported;
  std::string out;
  if (e.problems.empty()) {
    out += "ok: " + c.path + ", " + std::to_string(e.files.size()) + " safetensors file(s) (";
    out += !e.checksummed ? "structure only: no checksums recorded (another tool, or an export "
                            "written before ckpt recorded them)"
           : c.options.deep ? "headers and every tensor checksum"
                            : "headers and their checksums; --deep for tensor data";
    return out + ")\n";
  }
  if (c.tag_mismatch()) {
    out += "tag mismatch: the files are intact, but not an export of tag '" + c.options.tag +
           "'\n";
  } else {
    out += "CORRUPT: " + std::to_string(e.problems.size()) + " problem(s)\n";
  }
  for (const auto& p : e.problems)
    out += "  " + e.dir + "/" + p.file + (p.dataset.empty() ? "" : " tensor ") + p.dataset + ": " +
           p.what + "\n";
  return out;
}

}  // namespace ckpt::convert
