// `ckpt verify` for CI: the checks a pipeline runs on a freshly written checkpoint, each a
// JUnit test case: deep integrity check, one-step resume parity (engine_min checkpoints) and
// the next-update summary.
#pragma once

#include <string>
#include <vector>

#include "ckpt/status.h"
#include "verify/update_pass.h"

namespace ckpt::verify {

struct CiOptions {
  std::string root;
  std::string tag;
  std::string grad_file;  // next-update gradient for non-engine checkpoints (optional)
  std::string reference;  // run log; empty: ROOT/trainlog.jsonl
  std::string bin_dir;
  Device device = Device::kAuto;
  std::string launch;  // resume parity through the user's trainer (ResumeOptions::launch)
};

struct CiCase {
  std::string name;
  enum class Outcome { kPassed, kFailed, kSkipped, kError } outcome = Outcome::kPassed;
  std::string message;  // why it failed or was skipped; a one-line summary when it passed
  std::string details;  // the full report
  double seconds = 0;
};

struct CiReport {
  std::string target;
  std::string tag_note;  // how the tag was chosen when none was given (ChooseTagToVerify)
  std::vector<CiCase> cases;
  // 0 when every case passed or was skipped, 1 when one failed, 2 when one could not run.
  int ExitCode() const;
};

// Never fails as a whole: every problem is a case's outcome.
CiReport RunCiVerify(const CiOptions& options);
std::string CiToJUnit(const CiReport& report);
std::string CiToText(const CiReport& report);

}  // namespace ckpt::verify
