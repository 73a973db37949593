// The output directory of export-fp32, to-universal, reshard and next-update --out appears
// whole or not at all.
//
// Protocol:
//  1. OUT must not exist or must be an empty directory (AlreadyExists otherwise: nothing is
//     ever overwritten). Missing parent directories are created.
//  2. A staging directory <parent>/.tmp-<basename(OUT)>-<nonce>/ is created next to OUT (same
//     file system, so step 4 is a rename); its entry becomes durable with step 4's fsync of
//     the parent (an fsync here cost 6 ms of a 0.4 s export, and a staging directory lost in a
//     crash loses nothing published).
//  3. The command writes every file inside the staging directory (each one itself through a
//     temporary name + fsync + rename, so no half-written file has a final name).
//  4. Commit(): fsync the staging directory, rename it to OUT (rename(2) atomically replaces
//     an empty directory), fsync the parent (when that fails, OUT is renamed back and removed
//     with the staging directory: the command failed).
//  5. A StagedOutput destroyed without Commit() removes its staging directory. A process
//     killed before step 4 leaves only <parent>/.tmp-*, never a file inside OUT.
#pragma once

#include <string>

#include "ckpt/env.h"
#include "ckpt/status.h"

namespace ckpt::convert {

class StagedOutput {
 public:
  static Result<StagedOutput> Begin(const std::string& out, Env* env);
  StagedOutput(StagedOutput&&) noexcept;
  StagedOutput& operator=(StagedOutput&&) = delete;
  ~StagedOutput();

  const std::string& staging() const { return staging_; }  // write files here
  const std::string& out() const { return out_; }
  Status Commit();

 private:
  StagedOutput(Env* env, std::string out, std::string parent, std::string staging)
      : env_(env), out_(std::move(out)), parent_(std::move(parent)), staging_(std::move(staging)) {}
  Env* env_;
  std::string out_;
  std::string parent_;
  std::string staging_;
  bool committed_ = false;
};

}  // namespace ckpt::convert
