#include "convert/output_dir.h"

#include <filesystem>
#include <random>

#include "ckpt/manifest.h"
#include "ckpt/root.h"

namespace ckpt::convert {

Result<StagedOutput> StagedOutput::Begin(const std::string& out_arg, Env* env) {
  if (out_arg.empty()) return InvalidArgument("output directory is empty");
  const std::string out = TrimSlashes(out_arg);
  std::error_code ec;
  const std::filesystem::path p(out);
  if (std::filesystem::exists(p, ec)) {
    if (!std::filesystem::is_directory(p, ec))
      return AlreadyExists(out + " exists and is not a directory");
    if (!std::filesystem::is_empty(p, ec))
      return AlreadyExists(out + " exists and is not empty; refusing to overwrite it");
  }
  std::filesystem::path parent = p.has_parent_path() ? p.parent_path() : std::filesystem::path(".");
  // Missing parents are created through the Env, each one's entry made durable.
  CKPT_RETURN_IF_ERROR(env->CreateDirs(parent.string()), "create " + parent.string());
  std::random_device rd;
  const std::string staging =
      (parent / (std::string(kTempPrefix) + p.filename().string() + "-" + std::to_string(rd())))
          .string();
  // Its entry in the parent is made durable by Commit (the rename, then fsync of the parent):
  // a staging directory lost in a crash before then lost nothing published.
  CKPT_RETURN_IF_ERROR(env->CreateDir(staging), "create staging directory");
  return StagedOutput(env, out, parent.string(), staging);
}

StagedOutput::StagedOutput(StagedOutput&& o) noexcept
    : env_(o.env_),
      out_(std::move(o.out_)),
      parent_(std::move(o.parent_)),
      staging_(std::move(o.staging_)),
      committed_(o.committed_) {
  o.committed_ = true;  // the moved-from object owns nothing
}

StagedOutput::~StagedOutput() {
  if (!committed_ && !staging_.empty() && env_->Exists(staging_))
    env_->RemoveDirRecursive(staging_).IgnoreError();
}

Status StagedOutput::Commit() {
  if (committed_) return FailedPrecondition("output already committed");
  CKPT_RETURN_IF_ERROR(env_->SyncDir(staging_), "fsync " + staging_);
  // rename(2) replaces OUT only if it is an empty directory, so a directory that someone
  // filled since Begin() is never clobbered (ENOTEMPTY).
  CKPT_RETURN_IF_ERROR(env_->RenameFile(staging_, out_), "publish " + out_);
  committed_ = true;
  Status s = env_->SyncDir(parent_);
  if (!s.ok()) {
    // Not durable: the command fails, so OUT goes back to its staging name (and with this
    // object) rather than stay behind a failed command.
    if (env_->RenameFile(out_, staging_).ok()) committed_ = false;
    return s.WithContext("fsync " + parent_);
  }
  return Status::Ok();
}

}  // namespace ckpt::convert
