// The raw I/O floors for tools/bench.sh (tools/bench/raw_floor.h says what each one is): the
// same byte count as a checkpoint, split over the same number of files and threads, moved by
// one of the floor's variants. No HDF5, no hashing: what the machine gives a program that only
// moves bytes.
//
//   raw_io write DIR --files N --bytes-per-file B [--variant NAME]
//   raw_io read  DIR --files N [--bytes-per-file B] [--variant NAME]
//                                      (each file read whole, or its first B bytes)
//   raw_io copy SRC_DIR DEST_DIR --files N --bytes-per-file B [--variant NAME]
//                                      (the first B bytes of each SRC_DIR/raw_<i>.bin, in order,
//                                      into DEST_DIR/raw_0.bin: the copy floor of export-fp32)
//   raw_io variants write|read|copy   (the variant names, one per line)
//   raw_io touch BYTES                 (what first-touching memory costs here, below)
//
// The default variant is buffered_4MiB (write(2) / read(2) in 4 MiB blocks, the old floor).
// Buffers are allocated and touched before the clock starts (a checkpoint's state is already
// in memory when a save begins; a loader's destination is allocated before it reads), so the
// time is the transfer alone. Prints one JSON object: {"op", "variant", "files", "bytes",
// "seconds", "gib_per_s", "maxrss_kib"}, or {"op", "variant", "unsupported": true} where the
// file system refuses the variant (O_DIRECT on tmpfs). Exit 2 on usage or I/O error.
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "raw_floor.h"

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

// Touches `bytes` of fresh anonymous memory (4 KiB pages, or 2 MiB pages asked for with
// MADV_HUGEPAGE) and returns GiB/s; the mapping is unmapped after.
double TouchRate(size_t bytes, bool huge) {
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) Die("mmap: " + std::string(std::strerror(errno)));
  madvise(p, bytes, huge ? MADV_HUGEPAGE : MADV_NOHUGEPAGE);
  const auto t0 = std::chrono::steady_clock::now();
  std::memset(p, 1, bytes);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  munmap(p, bytes);
  return static_cast<double>(bytes) / s / (1024.0 * 1024 * 1024);
}

long MaxRssKiB() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  return ru.ru_maxrss;
}

// The options every pass takes: --files N, --bytes-per-file B, --variant NAME, from argv[first].
struct PassOptions {
  int files = 1;
  uint64_t per_file = 0;
  std::string variant;
};

PassOptions ParsePassOptions(int argc, char** argv, int first, std::string default_variant) {
  PassOptions o;
  o.variant = std::move(default_variant);
  for (int i = first; i < argc; ++i) {
    const std::string a = argv[i];
    if (i + 1 >= argc) Die("missing value for " + a);
    if (a == "--files")
      o.files = std::atoi(argv[++i]);
    else if (a == "--bytes-per-file")
      o.per_file = ParseBytes(argv[++i]);
    else if (a == "--variant")
      o.variant = argv[++i];
    else
      Die("unknown option " + a);
  }
  if (o.files < 1) Die("--files must be positive");
  return o;
}

// raw_io copy SRC_DIR DEST_DIR --files N --bytes-per-file B [--variant NAME]: prints {"op":
// "copy", "variant", "files", "bytes", "block", "inflight", "seconds", "gib_per_s",
// "maxrss_kib"} (bytes counted once: what was read, which is what was written).
int Copy(int argc, char** argv) {
  if (argc < 4) Die("usage: raw_io copy SRC_DIR DEST_DIR --files N --bytes-per-file B");
  const std::string src = argv[2], dest_dir = argv[3];
  // DEST/raw_0.bin is created empty first: in SRC it would be the first source itself.
  std::error_code ec;
  if (std::filesystem::equivalent(src, dest_dir, ec)) Die("copy: SRC_DIR and DEST_DIR are one");
  const PassOptions o = ParsePassOptions(argc, argv, 4, "direct_16MiB_x2");
  const int files = o.files;
  const uint64_t per_file = o.per_file;
  const std::string& variant = o.variant;
  if (per_file == 0) Die("--bytes-per-file must be positive");
  const auto variants = raw_floor::CopyVariants();
  const raw_floor::CopyVariant* v = nullptr;
  for (const auto& x : variants)
    if (x.name == variant) v = &x;
  if (!v) Die("unknown copy variant '" + variant + "' (raw_io variants copy)");
  std::vector<std::string> sources;
  std::vector<uint64_t> bytes;
  double total = 0;
  for (int f = 0; f < files; ++f) {
    sources.push_back(raw_floor::FileName(src, static_cast<size_t>(f)));
    struct stat st {};
    if (stat(sources.back().c_str(), &st) != 0)
      Die("stat " + sources.back() + ": " + std::strerror(errno));
    const uint64_t n = std::min<uint64_t>(per_file, static_cast<uint64_t>(st.st_size));
    bytes.push_back(n / raw_floor::kAlign * raw_floor::kAlign);
    total += static_cast<double>(bytes.back());
  }
  const raw_floor::PassResult r =
      raw_floor::CopyPass(sources, bytes, raw_floor::FileName(dest_dir, 0), dest_dir, *v);
  if (!r.error.empty()) Die(r.error);
  if (!r.seconds) {
    std::printf("{\"op\": \"copy\", \"variant\": \"%s\", \"unsupported\": true}\n",
                v->name.c_str());
    return 0;
  }
  std::printf(
      "{\"op\": \"copy\", \"variant\": \"%s\", \"files\": %d, \"bytes\": %.0f, "
      "\"block\": %zu, \"inflight\": %d, \"seconds\": %.6f, \"gib_per_s\": %.4f, "
      "\"maxrss_kib\": %ld}\n",
      v->name.c_str(), files, total, v->block, v->inflight, *r.seconds,
      total / *r.seconds / (1024.0 * 1024 * 1024), MaxRssKiB());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3)
    Die("usage: raw_io write|read DIR --files N [--bytes-per-file B] [--variant NAME] | "
        "raw_io copy SRC_DIR DEST_DIR --files N --bytes-per-file B [--variant NAME] | "
        "raw_io variants write|read|copy | raw_io touch BYTES");
  const std::string op = argv[1];
  if (op == "touch") {
    // A process's working memory is touched inside its timed work, the floors' buffers before
    // it. On a VM whose host reclaims the guest's free memory (free page reporting), memory
    // freed a moment ago is still backed by the host and memory freed a while ago is not; the
    // bench records both rates beside its figures (docs/performance.md).
    const size_t n = ParseBytes(argv[2]);
    const double small = TouchRate(n, false), huge = TouchRate(n, true);
    const double huge_again = TouchRate(n, true);  // just freed: reused at once
    std::this_thread::sleep_for(std::chrono::seconds(3));
    const double huge_later = TouchRate(n, true);
    std::printf(
        "{\"op\": \"touch\", \"bytes\": %zu, \"small_pages_gib_per_s\": %.3f, "
        "\"huge_pages_gib_per_s\": %.3f, \"huge_pages_reused_at_once_gib_per_s\": %.3f, "
        "\"huge_pages_reused_after_3s_gib_per_s\": %.3f}\n",
        n, small, huge, huge_again, huge_later);
    return 0;
  }
  if (op == "variants") {
    const std::string which = argv[2];
    if (which == "copy") {
      for (const auto& v : raw_floor::CopyVariants()) std::printf("%s\n", v.name.c_str());
      return 0;
    }
    if (which != "write" && which != "read") Die("variants: write, read or copy");
    for (const auto& v : which == "write" ? raw_floor::WriteVariants() : raw_floor::ReadVariants())
      std::printf("%s\n", v.name.c_str());
    return 0;
  }
  if (op == "copy") return Copy(argc, argv);
  const std::string dir = argv[2];
  const PassOptions o = ParsePassOptions(argc, argv, 3, "buffered_4MiB");
  const int files = o.files;
  const uint64_t per_file = o.per_file;
  const std::string& variant = o.variant;
  const bool write_pass = op == "write";
  // A read moves each file's own size (they may differ: rank files), or its first per_file
  // bytes; a write, per_file each.
  std::vector<uint64_t> sizes(static_cast<size_t>(files), per_file);
  if (op == "read") {
    for (int f = 0; f < files; ++f) {
      struct stat st{};
      const std::string path = raw_floor::FileName(dir, static_cast<size_t>(f));
      if (stat(path.c_str(), &st) != 0) Die("stat " + path + ": " + std::strerror(errno));
      sizes[static_cast<size_t>(f)] = static_cast<uint64_t>(st.st_size);
      if (per_file > 0)
        sizes[static_cast<size_t>(f)] = std::min(per_file, sizes[static_cast<size_t>(f)]);
    }
  } else if (!write_pass) {
    Die("op must be write, read or variants");
  } else if (per_file == 0) {
    Die("--bytes-per-file must be positive");
  }
  const auto variants = write_pass ? raw_floor::WriteVariants() : raw_floor::ReadVariants();
  const raw_floor::Variant* v = nullptr;
  for (const auto& x : variants)
    if (x.name == variant) v = &x;
  if (!v) Die("unknown " + op + " variant '" + variant + "' (raw_io variants " + op + ")");

  // One buffer per file: the source of the writes or the destination of the reads, filled
  // with a non-constant pattern so no layer can shortcut zero pages.
  std::vector<raw_floor::AlignedBuffer> buf;
  buf.reserve(static_cast<size_t>(files));
  for (int f = 0; f < files; ++f) {
    buf.emplace_back(sizes[static_cast<size_t>(f)]);
    auto* w = reinterpret_cast<uint32_t*>(buf.back().data());
    uint32_t x = 2463534242u + static_cast<uint32_t>(f);
    for (size_t i = 0; i < buf.back().size() / 4; ++i) {
      x ^= x << 13; x ^= x >> 17; x ^= x << 5;
      w[i] = x;
    }
  }
  const raw_floor::PassResult r = raw_floor::Pass(dir, buf, write_pass, *v);
  if (!r.error.empty()) Die(r.error);
  if (!r.seconds) {
    std::printf("{\"op\": \"%s\", \"variant\": \"%s\", \"unsupported\": true}\n", op.c_str(),
                v->name.c_str());
    return 0;
  }
  // Keep the reads observable.
  uint64_t sum = 0;
  for (auto& b : buf) sum += b.data()[b.size() / 2];
  double total = 0;
  for (uint64_t n : sizes) total += static_cast<double>(n);
  std::printf("{\"op\": \"%s\", \"variant\": \"%s\", \"files\": %d, \"bytes\": %.0f, "
              "\"block\": %zu, \"seconds\": %.6f, \"gib_per_s\": %.4f, \"maxrss_kib\": %ld, "
              "\"check\": %llu}\n",
              op.c_str(), v->name.c_str(), files, total, v->block, *r.seconds,
              total / *r.seconds / (1024.0 * 1024 * 1024), MaxRssKiB(),
              static_cast<unsigned long long>(sum));
  return 0;
}
