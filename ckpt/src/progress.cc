#include "ckpt/progress.h"

#include <unistd.h>

#include <cstdio>

namespace ckpt {

bool Progress::StderrIsTty() { return isatty(STDERR_FILENO) == 1; }

Progress::Progress(std::string label, uint64_t total, bool enabled)
    : label_(std::move(label)), total_(total), active_(enabled && StderrIsTty()) {
  start_ = last_draw_ = std::chrono::steady_clock::now();
}

Progress::~Progress() { Finish(); }

void Progress::Add(uint64_t n) {
  done_ += n;
  if (!active_) return;
  std::lock_guard<std::mutex> lock(mu_);
  auto now = std::chrono::steady_clock::now();
  if (now - last_draw_ < std::chrono::milliseconds(100)) return;
  last_draw_ = now;
  Draw(false);
}

void Progress::Finish() {
  if (!active_) return;
  std::lock_guard<std::mutex> lock(mu_);
  if (finished_) return;
  finished_ = true;
  Draw(true);
  std::fputc('\n', stderr);
}

void Progress::Draw(bool final) {
  const uint64_t done = final ? total_ : std::min<uint64_t>(done_.load(), total_);
  const double frac = total_ ? static_cast<double>(done) / static_cast<double>(total_) : 1.0;
  const int width = 30;
  const int filled = static_cast<int>(frac * width);
  const double secs =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  std::string bar(static_cast<size_t>(filled), '#');
  bar.resize(width, '.');
  std::fprintf(stderr, "\r%s [%s] %5.1f%% %6.1fs", label_.c_str(), bar.c_str(), frac * 100.0,
               secs);
  std::fflush(stderr);
}

}  // namespace ckpt
