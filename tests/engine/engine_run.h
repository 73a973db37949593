// Helpers of the engine_min [mpi] suites: launching build/bin/engine_min under mpirun and
// reading its run logs.
#pragma once

#include <fstream>
#include <string>
#include <vector>

#include "ckpt/reader.h"
#include "test_util.h"

namespace ckpt::testing {

inline std::string Mpirun(int n) {
  return "timeout 300 mpirun --allow-run-as-root --oversubscribe --bind-to none -n " +
         std::to_string(n) + " " + BinDir() + "/engine_min ";
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

// Every dataset of every rank file, the counters and the optimizer record of the latest tags
// of two roots (or of two tag directories), bitwise; returns the differences.
inline std::vector<std::string> CompareCheckpoints(const std::string& a, const std::string& b) {
  std::vector<std::string> diffs;
  auto ra = ckpt::CheckpointReader::Open(a);
  auto rb = ckpt::CheckpointReader::Open(b);
  if (!ra.ok() || !rb.ok())
    return {"cannot open: " + ra.status().ToString() + " / " + rb.status().ToString()};
  const ckpt::Manifest& ma = ra->manifest();
  const ckpt::Manifest& mb = rb->manifest();
  if (ma.tag != mb.tag) diffs.push_back("tag " + ma.tag + " vs " + mb.tag);
  if (ma.counters.global_step != mb.counters.global_step ||
      ma.counters.micro_step != mb.counters.micro_step ||
      ma.counters.samples_seen != mb.counters.samples_seen ||
      ma.counters.tokens_seen != mb.counters.tokens_seen) {
    diffs.push_back("counters");
  }
  if (ma.optimizer != mb.optimizer) diffs.push_back("optimizer");
  if (ma.files.size() != mb.files.size()) return {"rank count"};
  for (const auto& f : ma.files) {
    for (const auto& d : f.datasets) {
      auto x = ra->ReadDatasetBytes(f.rank, d.name);
      auto y = rb->ReadDatasetBytes(f.rank, d.name);
      if (!x.ok() || !y.ok() || *x != *y) {
        diffs.push_back("rank " + std::to_string(f.rank) + " " + d.name);
      }
    }
  }
  return diffs;
}

}  // namespace ckpt::testing
