#include "engine_min/run_log.h"

namespace engine_min {

ckpt::Result<RunLog> RunLog::Open(const std::string& path, ckpt::Env* env) {
  if (!env) env = ckpt::Env::Default();
  CKPT_ASSIGN_OR_RETURN(std::unique_ptr<ckpt::WritableFile> file, env->NewAppendableFile(path),
                        "run log");
  return RunLog(path, std::move(file));
}

ckpt::Status RunLog::Append(std::string_view line) {
  std::string text(line);
  text += '\n';
  return file_->Append(text).WithContext("run log");
}

}  // namespace engine_min
