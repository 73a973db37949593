#include "verify/trainlog.h"

#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <sstream>

extern char** environ;

namespace ckpt::verify {

Result<std::map<int64_t, TrainlogEntry>> ReadTrainlog(const std::string& path, Env* env) {
  if (!env) env = Env::Default();
  auto text = env->ReadFileToString(path);
  if (!text.ok()) {
    if (text.status().code() == StatusCode::kNotFound) {
      return NotFound("reference run log " + path +
                      " not found (engine_min writes ROOT/trainlog.jsonl; pass --reference)");
    }
    return text.status().WithContext("reference run log");
  }
  std::map<int64_t, TrainlogEntry> entries;
  std::istringstream in(*text);
  std::string line;
  int line_no = 0;
  while (std::getline(in, line)) {
    ++line_no;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const std::string where = path + ":" + std::to_string(line_no);
    nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded() || !j.is_object()) return DataLoss(where + ": not a JSON object");
    TrainlogEntry e;
    try {
      e.step = j.at("step").get<int64_t>();
      e.loss = j.at("loss").get<double>();
      e.grad_norm = j.at("grad_norm").get<double>();
      e.lr = j.value("lr", 0.0);
      e.tokens = j.value("tokens", int64_t{0});
      e.weights_xxh3 = j.at("weights_xxh3").get<std::string>();
      e.exp_avg_xxh3 = j.value("exp_avg_xxh3", std::string());
      e.exp_avg_sq_xxh3 = j.value("exp_avg_sq_xxh3", std::string());
    } catch (const nlohmann::json::exception& ex) {
      return DataLoss(where + ": not a run-log entry (" + ex.what() + ")");
    }
    entries[e.step] = std::move(e);
  }
  return entries;
}

bool HasEngineConfig(const nlohmann::json& engine_config) {
  return engine_config.is_object() && engine_config.contains("global_batch");
}

std::string NoEngineConfigMessage(const std::string& tag_dir, const std::string& what) {
  return tag_dir + ": this checkpoint has no engine config (engine_min did not write it), so " +
         what;
}

std::string EngineBinDir(const std::string& bin_dir) {
  if (!bin_dir.empty()) return bin_dir;
  if (const char* d = std::getenv("CKPT_BIN_DIR"); d && *d) return d;
  std::error_code ec;
  auto exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (ec) return ".";
  return exe.parent_path().string();
}

Result<pid_t> SpawnLogged(const std::vector<std::string>& argv, const std::string& log_path,
                          bool append) {
  if (argv.empty()) return InvalidArgument("SpawnLogged: empty command");
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, log_path.c_str(),
                                   O_WRONLY | O_CREAT | (append ? O_APPEND : O_TRUNC), 0644);
  posix_spawn_file_actions_adddup2(&actions, STDOUT_FILENO, STDERR_FILENO);
  posix_spawn_file_actions_addopen(&actions, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  pid_t pid = 0;
  const int rc = posix_spawnp(&pid, args[0], &actions, nullptr, args.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  if (rc != 0) {
    return NotFound("cannot start " + argv[0] + ": " + std::strerror(rc));
  }
  return pid;
}

Result<int> RunProcess(const std::vector<std::string>& argv, const std::string& log_path) {
  CKPT_ASSIGN_OR_RETURN(const pid_t pid, SpawnLogged(argv, log_path), "");
  int status = 0;
  while (waitpid(pid, &status, 0) < 0) {
    if (errno != EINTR) return ErrnoError("waitpid " + argv[0], errno);
  }
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return 255;
}

std::string TailOfFile(const std::string& path, size_t max_bytes) {
  auto text = Env::Default()->ReadFileToString(path);
  if (!text.ok()) return "";
  std::string s = std::move(*text);
  if (s.size() > max_bytes) s = "..." + s.substr(s.size() - max_bytes);
  return s;
}

std::vector<std::string> EngineCommand(const std::string& bin_dir, int ranks,
                                       const std::vector<std::string>& args) {
  std::vector<std::string> cmd = {"mpirun", "--allow-run-as-root", "--oversubscribe",
                                  "-n",     std::to_string(ranks), bin_dir + "/engine_min"};
  cmd.insert(cmd.end(), args.begin(), args.end());
  return cmd;
}

}  // namespace ckpt::verify
