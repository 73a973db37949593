// Helpers of the engine_min [mpi] suites: launching build/bin/engine_min under mpirun and
// reading its run logs.
#pragma once

#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "test_util.h"

namespace ckpt::testing {

inline std::string Mpirun(int n) {
  return "timeout 300 mpirun --allow-run-as-root --oversubscribe --bind-to none -n " +
         std::to_string(n) + " " + BinDir() + "/engine_min ";
}

inline std::string Slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// Runs engine_min with n ranks; returns the exit code, output in *log.
inline int Engine(int n, const std::string& args, const std::string& log_path,
                  std::string* log = nullptr) {
  const int rc = RunShell(Mpirun(n) + args + " > " + log_path + " 2>&1");
  if (log) *log = Slurp(log_path);
  return rc;
}

// The non-empty lines of a file (a run log).
inline std::vector<std::string> Lines(const std::string& path) {
  std::vector<std::string> out;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) {
    if (!line.empty()) out.push_back(line);
  }
  return out;
}

}  // namespace ckpt::testing
