// A progress bar on stderr, drawn only when stderr is a TTY and the command is not in --json
// mode. Thread-safe Add().
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <mutex>
#include <string>

namespace ckpt {

class Progress {
 public:
  // enabled && isatty(stderr) decides whether anything is drawn.
  Progress(std::string label, uint64_t total, bool enabled);
  ~Progress();
  void Add(uint64_t n);
  void Finish();
  static bool StderrIsTty();

 private:
  void Draw(bool final);
  std::string label_;
  uint64_t total_;
  bool active_;
  std::atomic<uint64_t> done_{0};
  std::mutex mu_;
  std::chrono::steady_clock::time_point start_, last_draw_;
  bool finished_ = false;
};

}  // namespace ckpt
