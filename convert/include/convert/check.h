// `ckpt check PATH`: whatever PATH holds that ckpt can check, a checkpoint of any kind
// (ckpt::CheckSource: a ckpt root or tag, a universal directory, a DeepSpeed checkpoint) or a
// safetensors export (CheckExport), decided here and not by the caller.
#pragma once

#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "ckpt/env.h"
#include "ckpt/state_source.h"
#include "ckpt/status.h"
#include "convert/export.h"

namespace ckpt::convert {

struct PathCheckOptions {
  std::string tag;        // a checkpoint's tag; for an export, the tag it must be of
  bool deep = false;      // every checksum (DeepSpeed: nothing more to check)
  bool progress = false;  // a progress bar on a TTY over what a deep check reads
  Env* env = nullptr;     // nullptr: Env::Default()
};

struct PathCheck {
  std::string path;
  PathCheckOptions options;
  std::optional<SourceCheck> checkpoint;  // set when PATH is a checkpoint
  std::optional<ExportCheck> exported;    // set when PATH is a safetensors export
  bool ok() const;
  // Intact files of an export of another tag than options.tag: a mismatch, not corruption.
  bool tag_mismatch() const;
};

// A safetensors export is a file, or a directory with no checkpoint in it (IsSafetensorsExport);
// anything else is opened as a checkpoint. Problems found are in the report; an error status
// only when the check cannot run (NotFound: nothing there).
Result<PathCheck> CheckPath(const std::string& path, const PathCheckOptions& options);

// `ckpt check --json`: a checkpoint's SourceCheckToJson; an export's {"ok", "verdict" ("ok",
// "tag mismatch", "corrupt"), "dir", "kind": "safetensors", "files", "checksummed", "deep",
// "problems": [{"file", "tensor", "what"}]}.
nlohmann::json PathCheckToJson(const PathCheck& check);
// The text `ckpt check` prints.
std::string PathCheckToText(const PathCheck& check);

}  // namespace ckpt::convert
