// The raw I/O floor for tools/bench.sh: the same byte count as a checkpoint, split over the
// same number of files and threads, written with plain write(2) + fsync(2) and read back with
// read(2). No HDF5, no hashing: what the machine gives a program that only moves bytes.
//
//   raw_io write DIR --files N --bytes-per-file B [--block 4MiB]
//   raw_io read  DIR --files N [--block 4MiB]
//
// Each thread owns file DIR/raw_<i>.bin. Buffers are allocated and touched before the clock
// starts (a checkpoint's state is already in memory when a save begins; a loader's destination
// is allocated before it reads), so the time is the transfer alone. Prints one JSON object:
// {"op", "files", "bytes", "seconds", "gib_per_s", "maxrss_kib"}. Exit 2 on usage or I/O error.
#include <fcntl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

namespace {

[[noreturn]] void Die(const std::string& what) {
  std::fprintf(stderr, "raw_io: %s\n", what.c_str());
  std::exit(2);
}

uint64_t ParseBytes(const char* s) {
  char* end = nullptr;
  const double v = std::strtod(s, &end);
  std::string unit(end);
  double mult = 1;
  if (unit == "" || unit == "B") mult = 1;
  else if (unit == "KiB" || unit == "K") mult = 1024.0;
  else if (unit == "MiB" || unit == "M") mult = 1024.0 * 1024;
  else if (unit == "GiB" || unit == "G") mult = 1024.0 * 1024 * 1024;
  else Die(std::string("bad size '") + s + "'");
  return static_cast<uint64_t>(v * mult);
}

std::string FileName(const std::string& dir, int i) { return dir + "/raw_" + std::to_string(i) + ".bin"; }

long MaxRssKiB() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  return ru.ru_maxrss;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) Die("usage: raw_io write|read DIR --files N [--bytes-per-file B] [--block B]");
  const std::string op = argv[1], dir = argv[2];
  int files = 1;
  uint64_t per_file = 0, block = 4u << 20;
  for (int i = 3; i < argc; ++i) {
    const std::string a = argv[i];
    if (i + 1 >= argc) Die("missing value for " + a);
    if (a == "--files") files = std::atoi(argv[++i]);
    else if (a == "--bytes-per-file") per_file = ParseBytes(argv[++i]);
    else if (a == "--block") block = ParseBytes(argv[++i]);
    else Die("unknown option " + a);
  }
  if (files < 1 || block == 0) Die("--files and --block must be positive");
  if (op == "read") {
    struct stat st{};
    if (stat(FileName(dir, 0).c_str(), &st) != 0) Die("stat " + FileName(dir, 0) + ": " + std::strerror(errno));
    per_file = static_cast<uint64_t>(st.st_size);
  } else if (op != "write") {
    Die("op must be write or read");
  }
  if (per_file == 0) Die("--bytes-per-file must be positive");

  // One buffer per file: the source of the writes or the destination of the reads. Filled
  // with a non-constant pattern so no layer can shortcut zero pages.
  std::vector<std::vector<uint8_t>> buf(static_cast<size_t>(files));
  for (int f = 0; f < files; ++f) {
    auto& b = buf[static_cast<size_t>(f)];
    b.resize(per_file);
    auto* w = reinterpret_cast<uint32_t*>(b.data());
    uint32_t x = 2463534242u + static_cast<uint32_t>(f);
    for (size_t i = 0; i < per_file / 4; ++i) {
      x ^= x << 13; x ^= x >> 17; x ^= x << 5;
      w[i] = x;
    }
  }
  std::atomic<bool> failed{false};
  std::vector<std::string> errors(static_cast<size_t>(files));
  auto worker = [&](int f) {
    auto& b = buf[static_cast<size_t>(f)];
    const std::string path = FileName(dir, f);
    const bool wr = op == "write";
    const int fd = wr ? open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644)
                      : open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) { errors[f] = "open " + path + ": " + std::strerror(errno); failed = true; return; }
    uint64_t done = 0;
    while (done < per_file) {
      const size_t n = static_cast<size_t>(std::min<uint64_t>(block, per_file - done));
      const ssize_t got = wr ? write(fd, b.data() + done, n) : read(fd, b.data() + done, n);
      if (got < 0 && errno == EINTR) continue;
      if (got <= 0) { errors[f] = (wr ? "write " : "read ") + path + ": " + std::strerror(errno); failed = true; break; }
      done += static_cast<uint64_t>(got);
    }
    if (wr && !failed && fsync(fd) != 0) { errors[f] = "fsync " + path + ": " + std::strerror(errno); failed = true; }
    close(fd);
  };
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<std::thread> threads;
  for (int f = 0; f < files; ++f) threads.emplace_back(worker, f);
  for (auto& t : threads) t.join();
  if (op == "write") {
    // A checkpoint save also fsyncs its directory; so does the floor.
    const int dfd = open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd >= 0) { fsync(dfd); close(dfd); }
  }
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  for (auto& e : errors) if (!e.empty()) Die(e);
  // Keep the reads observable.
  uint64_t sum = 0;
  for (auto& b : buf) sum += b[b.size() / 2];
  const double total = static_cast<double>(per_file) * files;
  std::printf("{\"op\": \"%s\", \"files\": %d, \"bytes\": %.0f, \"block\": %llu, \"seconds\": %.6f, "
              "\"gib_per_s\": %.4f, \"maxrss_kib\": %ld, \"check\": %llu}\n",
              op.c_str(), files, total, static_cast<unsigned long long>(block), secs,
              total / secs / (1024.0 * 1024 * 1024), MaxRssKiB(), static_cast<unsigned long long>(sum));
  return 0;
}
