// ckpt save / load / zstd measurements for tools/bench.sh, through the public ckpt API only.
//
//   ckpt_io save ROOT --ranks N --params P [--zero S] [--compress C] [--chunk-bytes B]
//                [--no-file-checksum] [--compress-threads T] [--reps R] [--drop-caches]
//                [--paired-raw DIR [--paired-variant NAME] [--null-variant NAME]]
//                [--paired-codec DIR]
//   ckpt_io load ROOT [--reps R] [--drop-caches] [--no-verify]
//                [--paired-raw DIR [--paired-variant NAME] [--null-variant NAME]]
//                [--paired-codec DIR [--chunk-bytes B]]
//   ckpt_io zstd ROOT [--levels 1,3,9] [--max-mib M] [--chunk-bytes B]
//   ckpt_io async ROOT --ranks N --params P [--zero S] [--reps R]
//   ckpt_io reshard-load ROOT --to M [--zero S] [--reps R] [--drop-caches] --paired-raw DIR
//
// save: the state of every rank is generated first (ckpt::SynthParamTable, BuildPartition and
//   SynthValue, exactly the contents `ckpt synth` writes), then only ckpt::SaveCheckpoint is
//   timed, all ranks concurrently as threads on a ckpt::ThreadGroup (as `ckpt synth` saves).
//   Each repetition writes a new tag; the previous one is removed untimed (and the cache
//   dropped) right before the clock starts, so the last tag stays for the load / export /
//   reshard phases.
// load: one thread per rank, each with its own CheckpointReader, reads every dataset of its
//   rank file whole (ReadDataset: XXH3 of every dataset checked). Destination buffers are
//   allocated and touched before the clock starts, as in raw_io. Each repetition records the
//   process's CPU seconds during the load (cpu_seconds, threads only) and during the codec
//   floor (codec_cpu_seconds): both are CPU-bound on a slow machine.
// reshard-load: the load a resumed run on M ranks (and ZeRO stage S, default the source's)
//   does, ckpt::LoadResharded, for every new rank concurrently as threads (each with its own
//   reader: only the slices it owns, every piece verified), paired with the floors: one raw
//   file per new rank holding exactly as many bytes as that rank owns (master and both
//   moments), written untimed, then read back by every read variant of raw_floor.h just
//   before each repetition; the ratio is to the best of them. LoadResharded returns its
//   shards in new memory, so each repetition also records fresh_memory_seconds: memory
//   allocated untouched, first touched (a fault per page, as for the vectors LoadResharded
//   fills) and then read into by the best variant, the floor of a load that returns new memory.
// --null-variant NAME (save and load, ranks as threads, with --paired-raw): the calibration
//   of the pairing. The timed side is not ckpt but one pass of that floor variant itself (a
//   write of the same in-memory bytes into the repetition's tag directory; a read of the
//   checkpoint's rank files), in the place, order and conditions of the ckpt run, paired with
//   the same floor passes. Its ratio is what the pairing gives a program that is the floor:
//   the least of several noisy floor passes against one pass is below 1 by itself.
// zstd: compression ratio and single-thread throughput of the rank files' fp32 master
//   weights, exp_avg, exp_avg_sq and the bf16 rounding of the master weights (or a stored
//   `compute` dataset), per level, with and without HDF5-style byte shuffle, in chunks of
//   chunk-bytes (what the writer compresses one at a time); per chunk the best of three timings.
//
// Prints one JSON object. Exit 2 on usage or any error.
#include <fcntl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zstd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "ckpt/aligned_buffer.h"
#include "ckpt/async_saver.h"
#include "ckpt/collective.h"
#include "ckpt/env.h"
#include "ckpt/hash.h"
#include "ckpt/load_resharded.h"
#include "ckpt/manifest.h"
#include "ckpt/reader.h"
#include "ckpt/synth.h"
#include "ckpt/units.h"
#include "ckpt/writer.h"
#include "raw_floor.h"

namespace {

using nlohmann::json;
using Clock = std::chrono::steady_clock;

[[noreturn]] void Die(const std::string& what) {
  std::fprintf(stderr, "ckpt_io: %s\n", what.c_str());
  std::exit(2);
}

double Since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// CPU seconds (user + system) of every thread of this process so far.
double CpuSeconds() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  auto sec = [](const timeval& t) { return static_cast<double>(t.tv_sec) + t.tv_usec * 1e-6; };
  return sec(ru.ru_utime) + sec(ru.ru_stime);
}

long MaxRssKiB() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  return ru.ru_maxrss;
}

// sync + drop the page cache; returns "ok" or why not.
std::string DropCaches() {
  sync();
  std::ofstream f("/proc/sys/vm/drop_caches");
  if (!f) return "cannot open /proc/sys/vm/drop_caches (not root?)";
  f << "3\n";
  f.flush();
  return f ? "ok" : "write to /proc/sys/vm/drop_caches failed";
}

uint64_t DirBytes(const std::string& dir) {
  uint64_t n = 0;
  for (auto& e : std::filesystem::recursive_directory_iterator(dir))
    if (e.is_regular_file()) n += e.file_size();
  return n;
}

struct Args {
  std::string op, root;
  int ranks = 4, zero = 2, reps = 1, compress_threads = 0;
  int64_t params = 0;
  std::string compress = "none";
  uint64_t chunk_bytes = 4u << 20;
  bool file_checksum = true, drop = false, verify = true, procs = false, heap_state = false;
  std::string paired_raw;  // directory for the paired raw write / read of the same bytes
  std::string paired_codec;  // directory for the paired codec floor (zstd saves and loads)
  std::string paired_variant;  // --paired-variant: only this floor variant (the run's best)
  std::string null_variant;    // --null-variant: time this floor variant instead of ckpt
  std::vector<int> levels = {1, 3, 9};
  int64_t max_mib = 64;
  int to = 0;  // reshard-load: the new world size
};

// The floor variant called `name` (--null-variant); exits naming the known ones otherwise.
raw_floor::Variant NamedVariant(bool write_pass, const std::string& name) {
  std::string known;
  for (const auto& v : write_pass ? raw_floor::WriteVariants() : raw_floor::ReadVariants()) {
    if (v.name == name) return v;
    known += " " + v.name;
  }
  Die("no " + std::string(write_pass ? "write" : "read") + " variant '" + name +
      "' (known:" + known + ")");
}

Args Parse(int argc, char** argv) {
  if (argc < 3) Die("usage: ckpt_io save|load|zstd|async|reshard-load ROOT [options]");
  Args a;
  a.zero = -1;  // save / async: 2; reshard-load: the source's
  a.op = argv[1];
  a.root = argv[2];
  for (int i = 3; i < argc; ++i) {
    const std::string k = argv[i];
    auto val = [&]() -> std::string {
      if (i + 1 >= argc) Die("missing value for " + k);
      return argv[++i];
    };
    if (k == "--ranks") a.ranks = std::stoi(val());
    else if (k == "--params") {
      auto n = ckpt::ParseCount(val());  // 2M, 1.5B, 350e6 or a plain count, as `ckpt synth`
      if (!n.ok()) Die("--params: " + n.status().ToString());
      a.params = *n;
    } else if (k == "--zero") a.zero = std::stoi(val());
    else if (k == "--to") a.to = std::stoi(val());
    else if (k == "--compress") a.compress = val();
    else if (k == "--chunk-bytes") a.chunk_bytes = static_cast<uint64_t>(std::stod(val()));
    else if (k == "--compress-threads") a.compress_threads = std::stoi(val());
    else if (k == "--reps") a.reps = std::stoi(val());
    else if (k == "--max-mib") a.max_mib = std::stoll(val());
    else if (k == "--no-file-checksum") a.file_checksum = false;
    else if (k == "--drop-caches") a.drop = true;
    else if (k == "--no-verify") a.verify = false;
    else if (k == "--procs") a.procs = true;
    else if (k == "--heap-state") a.heap_state = true;
    else if (k == "--paired-raw") a.paired_raw = val();
    else if (k == "--paired-codec") a.paired_codec = val();
    else if (k == "--paired-variant") a.paired_variant = val();
    else if (k == "--null-variant") a.null_variant = val();
    else if (k == "--levels") {
      a.levels.clear();
      std::string s = val();
      for (size_t p = 0; p < s.size();) {
        size_t q = s.find(',', p);
        if (q == std::string::npos) q = s.size();
        a.levels.push_back(std::stoi(s.substr(p, q - p)));
        p = q + 1;
      }
    } else Die("unknown option " + k);
  }
  if (a.reps < 1) a.reps = 1;
  if (a.zero < 0 && a.op != "reshard-load") a.zero = 2;
  if (!a.null_variant.empty() &&
      ((a.op != "save" && a.op != "load") || a.paired_raw.empty() || a.procs))
    Die("--null-variant goes with save or load, --paired-raw and ranks as threads");
  if (!a.null_variant.empty()) NamedVariant(a.op == "save", a.null_variant);  // exits if unknown
  return a;
}

// One timed pass of the --null-variant over the floor's buffers: what ckpt's place in a
// repetition holds in a calibration run (Pass's clock: from its threads' start to the end).
double NullPass(const std::string& dir, const std::vector<raw_floor::AlignedBuffer>& files,
                bool write_pass, const raw_floor::Variant& v) {
  const raw_floor::PassResult r = raw_floor::Pass(dir, files, write_pass, v);
  if (!r.error.empty()) Die("null pass " + v.name + ": " + r.error);
  if (!r.seconds) Die("null pass " + v.name + ": the file system refuses it");
  return *r.seconds;
}

// ---------------------------------------------------------------------------------------------
// save

// The paired floors (--paired-raw DIR): before each timed ckpt repetition, the very same
// in-memory bytes are written or read back by every floor variant of tools/bench/raw_floor.h
// (buffered, sync_file_range, O_DIRECT with 4/16/64 MiB blocks), one thread and one file per
// rank, with the page cache dropped before each pass. Pairing each ckpt run with floor runs
// taken seconds before it cancels most of a shared machine's drift; the ratio to the best
// variant is reported per repetition, the old floor (buffered_4MiB) beside it.
using Pieces = std::vector<std::pair<uint8_t*, size_t>>;

// Each rank's pieces, copied once (untimed) into one page-aligned buffer: the floor's source.
std::vector<raw_floor::AlignedBuffer> FloorBuffers(const std::vector<Pieces>& ranks) {
  std::vector<raw_floor::AlignedBuffer> out;
  out.reserve(ranks.size());
  for (const auto& pieces : ranks) {
    size_t total = 0;
    for (const auto& p : pieces) total += p.second;
    out.emplace_back(total);
    size_t at = 0;
    for (const auto& [ptr, len] : pieces) {
      std::memcpy(out.back().data() + at, ptr, len);
      at += len;
    }
  }
  return out;
}

// Every variant once; {"best_seconds", "best_variant", "buffered_seconds", "variants": {name:
// seconds or null where unsupported}}.
json FloorPasses(const std::string& dir, const std::vector<raw_floor::AlignedBuffer>& files,
                 bool write_pass, bool drop, const std::string& only = "") {
  json variants = json::object();
  double best = -1, buffered = -1;
  std::string best_name;
  for (const auto& v : write_pass ? raw_floor::WriteVariants() : raw_floor::ReadVariants()) {
    if (!only.empty() && v.name != only) continue;
    if (write_pass) std::filesystem::remove_all(dir);
    std::filesystem::create_directories(dir);
    if (drop) DropCaches();
    const raw_floor::PassResult r = raw_floor::Pass(dir, files, write_pass, v);
    if (!r.error.empty()) Die("paired raw pass " + v.name + ": " + r.error);
    if (!r.seconds) {
      variants[v.name] = nullptr;
      continue;
    }
    variants[v.name] = *r.seconds;
    if (v.name == "buffered_4MiB") buffered = *r.seconds;
    if (best < 0 || *r.seconds < best) {
      best = *r.seconds;
      best_name = v.name;
    }
  }
  if (drop) DropCaches();
  return {{"best_seconds", best}, {"best_variant", best_name}, {"buffered_seconds", buffered},
          {"variants", variants}};
}

// Which side of a repetition its paired floor runs on: before the ckpt run on even
// repetitions, after it on odd ones. On the development VM the virtual disk sits on the host's
// page cache: a read of a file read seconds earlier comes partly from the host's memory, and a
// write right after 5 GiB of floor writes meets a host still flushing them. Alternating gives
// the ckpt run and its floor each side equally often; a pause of three seconds between them
// lets the host finish the previous run's writeback (docs/performance.md).
bool FloorAfter(int rep) { return rep % 2 == 1; }
void Settle() { std::this_thread::sleep_for(std::chrono::seconds(3)); }

// A repetition's record gets the floor beside it: raw_seconds is the best variant (the ratio
// the benchmark reports), raw_buffered_seconds the old floor, floor_order which ran first.
void AddFloor(json* rep, const json& floor, int rep_index) {
  (*rep)["floor_order"] = FloorAfter(rep_index) ? "ckpt first" : "floor first";
  (*rep)["raw_seconds"] = floor["best_seconds"];
  (*rep)["raw_best_variant"] = floor["best_variant"];
  (*rep)["raw_buffered_seconds"] = floor["buffered_seconds"];
  (*rep)["raw_variants"] = floor["variants"];
}

// ---------------------------------------------------------------------------------------------
// The codec floor (--paired-codec DIR, with a zstd --compress): what zstd itself does with the
// same bytes, at the same level and byte shuffle, with the same threads per rank as the ckpt
// run, plus the disk. Each rank's tensors are cut into chunk-bytes chunks and byte-shuffled
// (when the setting shuffles) once, untimed: the floor starts from bytes ready for zstd.
//   save: per rank, concurrently: zstd's own multithreaded streaming compression
//     (ZSTD_c_nbWorkers = threads; none for one thread; the context made and warmed up before
//     the clock) of those bytes, written as it comes in 4 MiB writes, then fsync.
//   load: per rank, concurrently, from a cold cache: the chunks compressed one frame each
//     (written untimed), the file read front to back with O_DIRECT into touched memory while
//     `threads` threads decompress each frame into the rank's buffer as soon as its bytes are
//     in (zstd decompresses a frame on one thread); no unshuffle, no hashing.
// Floor and ckpt alternate which runs first; each starts right after deleting its own last
// files and a cache drop, so both meet the same memory (the VM returns freed memory to its host
// within about a second; docs/performance.md) and the same discards of deleted blocks.
struct CodecRank {
  std::vector<uint8_t> input;              // chunked, shuffled when asked
  std::vector<std::pair<uint64_t, uint64_t>> frames;  // load floor: offset, size in the file
  std::vector<size_t> frame_bytes;         // decompressed size of each frame
  // The save floor's working memory, made before any clock starts (as the raw floors' buffers
  // are) and kept across repetitions: the compression context (warmed up by one untimed
  // compression) and the output buffer.
  std::unique_ptr<ZSTD_CCtx, size_t (*)(ZSTD_CCtx*)> cctx{nullptr, ZSTD_freeCCtx};
  std::vector<uint8_t> out;
};

void ShuffleChunk(const uint8_t* in, uint8_t* out, size_t nbytes, size_t elem);

CodecRank CodecInput(const std::vector<std::pair<const uint8_t*, std::pair<size_t, size_t>>>& ds,
                     const ckpt::Compression& comp, size_t chunk) {
  CodecRank c;
  for (const auto& [ptr, ne] : ds) {
    const auto [n, elem] = ne;
    const size_t at = c.input.size();
    c.input.resize(at + n);
    const size_t step = std::max(elem, chunk / elem * elem);
    for (size_t off = 0; off < n; off += step) {
      const size_t k = std::min(step, n - off);
      c.frame_bytes.push_back(k);
      if (comp.shuffle) ShuffleChunk(ptr + off, c.input.data() + at + off, k, elem);
      else std::memcpy(c.input.data() + at + off, ptr + off, k);
    }
  }
  return c;
}

int CodecThreads(int requested, int ranks) {
  if (requested > 0) return requested;
  return std::max(1, static_cast<int>(std::max(1u, std::thread::hardware_concurrency())) /
                         std::max(1, ranks));
}

// Save floor, set up (untimed): each rank's compression context, with the setting's level and
// threads, warmed up by compressing the rank's first 64 MiB (its workers and buffers are made
// then), and its 4 MiB output buffer touched.
void CodecSaveSetup(std::vector<CodecRank>& ranks, const ckpt::Compression& comp, int threads) {
  for (CodecRank& c : ranks) {
    c.cctx.reset(ZSTD_createCCtx());
    if (!c.cctx) Die("codec floor: no compression context");
    ZSTD_CCtx_setParameter(c.cctx.get(), ZSTD_c_compressionLevel, comp.level);
    if (threads > 1) ZSTD_CCtx_setParameter(c.cctx.get(), ZSTD_c_nbWorkers, threads);
    c.out.assign(4u << 20, 1);
    ZSTD_inBuffer in{c.input.data(), std::min<size_t>(c.input.size(), 64u << 20), 0};
    size_t left = 0;
    do {
      ZSTD_outBuffer out{c.out.data(), c.out.size(), 0};
      left = ZSTD_compressStream2(c.cctx.get(), &out, &in, ZSTD_e_end);
      if (ZSTD_isError(left)) Die(std::string("codec floor: ") + ZSTD_getErrorName(left));
    } while (left != 0);
  }
}

// Save floor: seconds for all ranks, compressed bytes written.
std::pair<double, uint64_t> CodecSaveFloor(const std::string& dir, std::vector<CodecRank>& ranks,
                                           const ckpt::Compression& comp, int threads) {
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  std::vector<uint64_t> out_bytes(ranks.size(), 0);
  std::vector<std::string> errors(ranks.size());
  const auto t0 = Clock::now();
  std::vector<std::thread> ts;
  for (size_t r = 0; r < ranks.size(); ++r)
    ts.emplace_back([&, r] {
      const std::string path = dir + "/codec_" + std::to_string(r) + ".zst";
      const int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      if (fd < 0) {
        errors[r] = "open " + path;
        return;
      }
      ZSTD_CCtx* cc = ranks[r].cctx.get();
      std::vector<uint8_t>& ob = ranks[r].out;
      ZSTD_inBuffer in{ranks[r].input.data(), ranks[r].input.size(), 0};
      size_t left = 0;
      do {
        ZSTD_outBuffer out{ob.data(), ob.size(), 0};
        left = ZSTD_compressStream2(cc, &out, &in, ZSTD_e_end);
        if (ZSTD_isError(left)) {
          errors[r] = ZSTD_getErrorName(left);
          break;
        }
        if (out.pos && write(fd, ob.data(), out.pos) != static_cast<ssize_t>(out.pos)) {
          errors[r] = "write " + path;
          break;
        }
        out_bytes[r] += out.pos;
      } while (left != 0);
      if (fsync(fd) != 0) errors[r] = "fsync " + path;
      close(fd);
    });
  for (auto& t : ts) t.join();
  const double secs = Since(t0);
  for (const auto& e : errors)
    if (!e.empty()) Die("codec floor: " + e);
  uint64_t total = 0;
  for (uint64_t b : out_bytes) total += b;
  return {secs, total};  // the files stay until the next floor (the caller deletes them)
}

// Load floor, set up: each rank's chunks as independent frames in DIR/codec_R.zst (untimed).
void CodecLoadSetup(const std::string& dir, std::vector<CodecRank>& ranks,
                    const ckpt::Compression& comp) {
  std::filesystem::create_directories(dir);
  for (size_t r = 0; r < ranks.size(); ++r) {
    CodecRank& c = ranks[r];
    std::vector<uint8_t> file;
    size_t at = 0;
    c.frames.clear();
    for (size_t k : c.frame_bytes) {
      const size_t base = file.size();
      file.resize(base + ZSTD_compressBound(k));
      const size_t got = ZSTD_compress(file.data() + base, file.size() - base,
                                       c.input.data() + at, k, comp.level);
      if (ZSTD_isError(got)) Die(std::string("codec floor: ") + ZSTD_getErrorName(got));
      file.resize(base + got);
      c.frames.emplace_back(base, got);
      at += k;
    }
    std::ofstream(dir + "/codec_" + std::to_string(r) + ".zst", std::ios::binary)
        .write(reinterpret_cast<const char*>(file.data()), static_cast<std::streamsize>(file.size()));
  }
  sync();
}

// Load floor: seconds for all ranks, every frame read and decompressed into `ranks[r].input`.
// Per rank, concurrently: one thread reads the rank's frame file front to back in 8 MiB blocks
// the way the raw read floor does (O_DIRECT where the file system takes it, into memory made
// and touched before the clock: raw_floor.h), while `threads` threads decompress each frame as
// soon as its bytes are in (zstd decompresses a frame on one thread); no unshuffle, no hashing.
double CodecLoadFloor(const std::string& dir, std::vector<CodecRank>& ranks, int threads) {
  std::vector<std::string> errors(ranks.size() * static_cast<size_t>(threads + 1));
  std::vector<raw_floor::AlignedBuffer> files;
  for (CodecRank& c : ranks) {
    uint64_t bytes = 0;
    for (const auto& f : c.frames) bytes = std::max<uint64_t>(bytes, f.first + f.second);
    files.emplace_back(static_cast<size_t>(bytes));
  }
  constexpr uint64_t kBlock = 8u << 20;
  const auto t0 = Clock::now();
  std::vector<std::thread> ts;
  for (size_t r = 0; r < ranks.size(); ++r)
    ts.emplace_back([&, r] {
      CodecRank& c = ranks[r];
      const raw_floor::AlignedBuffer& file = files[r];
      std::string* err = &errors[r * static_cast<size_t>(threads + 1)];
      const std::string path = dir + "/codec_" + std::to_string(r) + ".zst";
      std::mutex mu;
      std::condition_variable cv;
      uint64_t have = 0;  // bytes of the file read so far (under mu)
      bool failed = false;
      std::thread reader([&] {
        int fd = open(path.c_str(), O_RDONLY | O_DIRECT | O_CLOEXEC);
        if (fd < 0) fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);  // O_DIRECT refused
        const uint64_t size = file.size(), span = (size + 4095) / 4096 * 4096;
        for (uint64_t at = 0; fd >= 0 && at < span;) {
          const ssize_t got = pread(fd, file.data() + at, std::min(kBlock, span - at),
                                    static_cast<off_t>(at));
          if (got <= 0) break;
          at += static_cast<uint64_t>(got);
          std::lock_guard<std::mutex> lock(mu);
          have = std::min(at, size);
          cv.notify_all();
        }
        std::lock_guard<std::mutex> lock(mu);
        if (have < size) {
          *err = "read " + path;
          failed = true;
        }
        cv.notify_all();
        if (fd >= 0) close(fd);
      });
      std::vector<size_t> start(c.frame_bytes.size());
      for (size_t k = 1; k < start.size(); ++k) start[k] = start[k - 1] + c.frame_bytes[k - 1];
      std::atomic<size_t> next{0};
      std::vector<std::thread> workers;
      for (int w = 0; w < threads; ++w)
        workers.emplace_back([&, w] {
          ZSTD_DCtx* dc = ZSTD_createDCtx();
          for (size_t k; (k = next++) < c.frames.size();) {
            const auto [at, fsize] = c.frames[k];
            {
              std::unique_lock<std::mutex> lock(mu);
              cv.wait(lock, [&] { return failed || have >= at + fsize; });
              if (failed) break;
            }
            const size_t got = ZSTD_decompressDCtx(dc, c.input.data() + start[k], c.frame_bytes[k],
                                                   file.data() + at, fsize);
            if (ZSTD_isError(got) || got != c.frame_bytes[k]) {
              err[1 + w] = "decompress";
              break;
            }
          }
          ZSTD_freeDCtx(dc);
        });
      for (auto& t : workers) t.join();
      reader.join();
    });
  for (auto& t : ts) t.join();
  const double secs = Since(t0);
  for (const auto& e : errors)
    if (!e.empty()) Die("codec floor: " + e);
  return secs;
}

// A repetition's record gets the codec floor beside it.
void AddCodecFloor(json* rep, double secs, int threads, uint64_t bytes = 0) {
  (*rep)["codec_seconds"] = secs;
  (*rep)["codec_threads"] = threads;
  if (bytes) (*rep)["codec_file_bytes"] = bytes;
}

struct RankState {
  // master, exp_avg, exp_avg_sq: in I/O memory (ckpt::AlignedBuffer), as `ckpt synth` holds
  // them and as a trainer's pinned host buffers are, or with --heap-state in std::vector's.
  ckpt::AlignedBuffer io[3];
  std::vector<float> heap[3];
  float* state[3] = {};
  std::vector<uint16_t> frozen;
  std::string rng, data_pos, sched;
  ckpt::RankContents contents;
};

constexpr int64_t kStep = 100;

// Rank r's contents: exactly what `ckpt synth` writes for it.
void GenerateRank(const ckpt::Manifest& meta, int r, bool heap_state, RankState& rs) {
  const std::string_view names[3] = {ckpt::kMaster, ckpt::kExpAvg, ckpt::kExpAvgSq};
  const int64_t shard = meta.partition.shard_numel[static_cast<size_t>(r)];
  for (int s = 0; s < 3; ++s) {
    const size_t n = static_cast<size_t>(shard);
    if (heap_state) {
      rs.heap[s].assign(n, 0.0f);
      rs.state[s] = rs.heap[s].data();
    } else {
      rs.io[s] = ckpt::AlignedBuffer(n * sizeof(float));
      rs.state[s] = rs.io[s].as<float>();
      std::memset(rs.state[s], 0, n * sizeof(float));
    }
  }
  for (size_t pi = 0; pi < meta.params.size(); ++pi)
    for (const auto& rg : meta.params[pi].ranges) {
      if (rg.rank != r) continue;
      for (int s = 0; s < 3; ++s)
        for (int64_t e = rg.begin; e < rg.end; ++e)
          rs.state[s][static_cast<size_t>(rg.shard_offset + e - rg.begin)] =
              ckpt::SynthValue(0, kStep, pi, names[s], e);
    }
  for (int s = 0; s < 3; ++s)
    rs.contents.datasets.push_back(ckpt::DatasetSpec::Tensor(
        std::string(names[s]), ckpt::DType::kF32, {shard}, rs.state[s]));
  if (r == 0) {
    for (size_t pi = 0; pi < meta.params.size(); ++pi) {
      const auto& p = meta.params[pi];
      if (!p.frozen) continue;
      rs.frozen.resize(static_cast<size_t>(p.numel));
      for (int64_t e = 0; e < p.numel; ++e)
        rs.frozen[static_cast<size_t>(e)] =
            ckpt::FloatToBf16(ckpt::SynthValue(0, kStep, pi, "frozen", e));
      rs.contents.datasets.push_back(ckpt::DatasetSpec::Tensor(
          std::string(ckpt::kFrozenPrefix) + p.name, ckpt::DType::kBF16, p.shape,
          rs.frozen.data()));
    }
  }
  rs.rng = "bench-rng-state-" + std::to_string(r);
  rs.data_pos = json{{"epoch", 0}, {"sample_offset", kStep * 64}}.dump();
  rs.sched = json{{"kind", "constant"}, {"last_lr", 1e-4}, {"step", kStep}}.dump();
  rs.contents.datasets.push_back(ckpt::DatasetSpec::Blob("rng/dropout", "mt19937_64", rs.rng));
  rs.contents.datasets.push_back(
      ckpt::DatasetSpec::Json(std::string(ckpt::kDataPosition), rs.data_pos));
  rs.contents.datasets.push_back(ckpt::DatasetSpec::Json(std::string(ckpt::kScheduler), rs.sched));
}

uint64_t LogicalBytes(const RankState& rs) {
  uint64_t total = 0;
  for (auto& d : rs.contents.datasets) {
    uint64_t n = ckpt::DTypeSize(d.dtype);
    for (auto x : d.shape) n *= static_cast<uint64_t>(x);
    total += n;
  }
  return total;
}

// The collective between rank processes (--procs): payloads pass through files in a shared
// directory (write to a temporary name, rename), polled every 100 us. Only for the benchmark:
// a save makes a handful of collective calls, so the polling costs well under a millisecond.
class FileCollective final : public ckpt::Collective {
 public:
  FileCollective(std::string dir, int rank, int world)
      : dir_(std::move(dir)), rank_(rank), world_(world) {}
  int rank() const override { return rank_; }
  int world_size() const override { return world_; }
  ckpt::Status Barrier() override {
    auto g = Gather("");
    if (!g.ok()) return g.status();
    auto b = Broadcast("");
    return b.ok() ? ckpt::Status::Ok() : b.status();
  }
  ckpt::Result<std::vector<std::string>> Gather(std::string_view payload) override {
    const std::string base = dir_ + "/g" + std::to_string(++seq_) + ".";
    Put(base + std::to_string(rank_), payload);
    std::vector<std::string> out;
    if (rank_ == 0)
      for (int r = 0; r < world_; ++r) out.push_back(Take(base + std::to_string(r)));
    return out;
  }
  ckpt::Result<std::string> Broadcast(std::string_view payload) override {
    const std::string name = dir_ + "/b" + std::to_string(++seq_) + ".r";
    if (rank_ == 0) {
      for (int r = 1; r < world_; ++r) Put(name + std::to_string(r), payload);
      return std::string(payload);
    }
    return Take(name + std::to_string(rank_));
  }

 private:
  static void Put(const std::string& path, std::string_view data) {
    {
      std::ofstream f(path + ".tmp", std::ios::binary);
      f.write(data.data(), static_cast<std::streamsize>(data.size()));
    }
    std::filesystem::rename(path + ".tmp", path);
  }
  static std::string Take(const std::string& path) {
    while (!std::filesystem::exists(path)) usleep(100);
    std::ifstream f(path, std::ios::binary);
    std::string s((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    std::filesystem::remove(path);
    return s;
  }
  std::string dir_;
  int rank_, world_;
  uint64_t seq_ = 0;
};

// The manifest of the synthetic state (`ckpt synth`'s table) for save and async.
ckpt::Manifest BenchManifest(const Args& a) {
  if (a.params < 1) Die(a.op + " needs --params");
  ckpt::SynthOptions so;
  so.ranks = a.ranks;
  so.params = a.params;
  so.zero_stage = a.zero;
  auto meta = ckpt::SynthManifest(so, kStep);
  if (!meta.ok()) Die(meta.status().ToString());
  meta->engine_config = {{"generator", "tools/bench/ckpt_io"}};
  return *std::move(meta);
}

// The paired write floor's buffers: each rank's dataset bytes, concatenated (FloorBuffers).
std::vector<raw_floor::AlignedBuffer> SaveFloorBuffers(const std::vector<RankState>& ranks) {
  std::vector<Pieces> pieces(ranks.size());
  for (size_t r = 0; r < ranks.size(); ++r)
    for (const auto& d : ranks[r].contents.datasets) {
      uint64_t n = ckpt::DTypeSize(d.dtype);
      for (auto x : d.shape) n *= static_cast<uint64_t>(x);
      pieces[r].push_back({static_cast<uint8_t*>(const_cast<void*>(d.data)), n});
    }
  return FloorBuffers(pieces);
}

int Save(const Args& a) {
  auto comp = ckpt::Compression::Parse(a.compress);
  if (!comp.ok()) Die(comp.status().ToString());
  ckpt::Manifest meta = BenchManifest(a);
  ckpt::SaveOptions so;
  so.compression = *comp;
  so.chunk_bytes = a.chunk_bytes;
  so.file_checksum = a.file_checksum;
  so.compress_threads = a.compress_threads;

  json reps = json::array();
  std::string drop_status = a.drop ? "" : "not requested";
  std::string prev_tag;
  uint64_t logical = 0;
  double gen_secs = 0;
  long rss_before = 0, rank_rss = 0;
  // Right before a timed save: the last repetition's checkpoint deleted and the cache dropped,
  // as each raw floor pass (FloorPasses) and each codec floor deletes its own last files and
  // drops the cache right before it runs: the two sides of a pair start alike (until
  // 2026-12-04 only the save did; a floor variant timed in the save's place, --null-variant,
  // scored 0.74-0.89 then). On the development VM that matters twice over: the
  // root file system discards freed blocks (`mount -o discard`) in the seconds after a delete,
  // and the VM hands freed memory back to its host within about a second, after which
  // touching it again costs host page faults (docs/performance.md, 2026-12-02 09:40): a side
  // that ran right after a drop of the other side's files, while the other ran after a
  // settle, was up to 1.7x faster for that alone.
  auto between_reps = [&](int rep) {
    if (!prev_tag.empty()) std::filesystem::remove_all(a.root + "/" + prev_tag);
    if (a.drop) drop_status = DropCaches();
    prev_tag = "bench" + std::to_string(rep);
  };
  if (!a.procs) {
    // Ranks as threads of this process on a ckpt::ThreadGroup (as `ckpt synth` and reshard).
    std::vector<RankState> ranks(static_cast<size_t>(a.ranks));
    const auto tg = Clock::now();
    {
      std::vector<std::thread> gen;
      for (int r = 0; r < a.ranks; ++r)
        gen.emplace_back(
            [&, r] { GenerateRank(meta, r, a.heap_state, ranks[static_cast<size_t>(r)]); });
      for (auto& t : gen) t.join();
    }
    gen_secs = Since(tg);
    for (auto& rs : ranks) logical += LogicalBytes(rs);
    rss_before = MaxRssKiB();
    std::vector<raw_floor::AlignedBuffer> floor_bufs;
    if (!a.paired_raw.empty()) floor_bufs = SaveFloorBuffers(ranks);
    const bool codec = !a.paired_codec.empty() && comp->kind == ckpt::Compression::Kind::kZstd;
    const int codec_threads = CodecThreads(a.compress_threads, a.ranks);
    std::vector<CodecRank> codec_ranks;
    if (codec)
      for (const auto& rs : ranks) {
        std::vector<std::pair<const uint8_t*, std::pair<size_t, size_t>>> ds;
        for (const auto& d : rs.contents.datasets) {
          uint64_t n = ckpt::DTypeSize(d.dtype);
          for (auto x : d.shape) n *= static_cast<uint64_t>(x);
          if (d.kind == "tensor" && !d.shape.empty() && n > 0)
            ds.push_back({static_cast<const uint8_t*>(d.data), {n, ckpt::DTypeSize(d.dtype)}});
        }
        codec_ranks.push_back(CodecInput(ds, *comp, a.chunk_bytes));
      }
    if (codec) CodecSaveSetup(codec_ranks, *comp, codec_threads);
    for (int rep = 0; rep < a.reps; ++rep) {
      json floor;
      // The floor's files stay until its next pass deletes them right before writing
      // (FloorPasses), as the save's previous checkpoint is deleted right before the save.
      auto run_floor = [&] {
        floor = FloorPasses(a.paired_raw, floor_bufs, true, a.drop, a.paired_variant);
        Settle();
      };
      if (!a.paired_raw.empty() && !FloorAfter(rep)) run_floor();
      // The codec floor alternates with the save as the raw floor does, and each side starts
      // the same way (between_reps): its own last files deleted, the cache dropped.
      std::pair<double, uint64_t> codec_floor;
      auto run_codec = [&] {
        std::filesystem::remove_all(a.paired_codec);
        if (a.drop) DropCaches();
        codec_floor = CodecSaveFloor(a.paired_codec, codec_ranks, *comp, codec_threads);
      };
      if (codec && !FloorAfter(rep)) run_codec();
      between_reps(rep);
      meta.tag = prev_tag;
      double secs = 0;
      if (!a.null_variant.empty()) {
        const std::string dir = a.root + "/" + meta.tag;
        std::filesystem::create_directories(dir);
        secs = NullPass(dir, floor_bufs, true, NamedVariant(true, a.null_variant));
      } else {
        ckpt::ThreadGroup group(a.ranks);
        std::vector<ckpt::Status> results(static_cast<size_t>(a.ranks));
        const auto t0 = Clock::now();
        std::vector<std::thread> threads;
        for (int r = 0; r < a.ranks; ++r)
          threads.emplace_back([&, r] {
            results[static_cast<size_t>(r)] = ckpt::SaveCheckpoint(
                a.root, meta, ranks[static_cast<size_t>(r)].contents, group.ForRank(r), so);
          });
        for (auto& t : threads) t.join();
        secs = Since(t0);
        if (!results[0].ok()) Die("save: " + results[0].ToString());
      }
      if (!a.paired_raw.empty() && FloorAfter(rep)) {
        Settle();
        run_floor();
      }
      if (codec && FloorAfter(rep)) run_codec();
      reps.push_back({{"seconds", secs}, {"file_bytes", DirBytes(a.root + "/" + meta.tag)}});
      if (!floor.is_null()) AddFloor(&reps.back(), floor, rep);
      if (codec) {
        AddCodecFloor(&reps.back(), codec_floor.first, codec_threads, codec_floor.second);
        reps.back()["codec_order"] = FloorAfter(rep) ? "ckpt first" : "floor first";
      }
    }
    if (codec) std::filesystem::remove_all(a.paired_codec);
  } else {
    // One process per rank, as under mpirun (no HDF5 library lock shared between ranks). The
    // parent starts the clock when every rank has its state and releases them together.
    char tmpl[] = "/dev/shm/ckpt_io_coll_XXXXXX";
    if (!mkdtemp(tmpl)) Die("mkdtemp");
    const std::string coll_dir = tmpl;
    // The paired floor: the parent generates every rank's bytes once, untimed (as the threads
    // do above), and writes them with every floor variant before each repetition.
    std::vector<raw_floor::AlignedBuffer> floor_bufs;
    if (!a.paired_raw.empty()) {
      std::vector<RankState> all(static_cast<size_t>(a.ranks));
      for (int r = 0; r < a.ranks; ++r)
        GenerateRank(meta, r, a.heap_state, all[static_cast<size_t>(r)]);
      floor_bufs = SaveFloorBuffers(all);
    }
    int ready[2], go[2], done[2];
    if (pipe(ready) != 0 || pipe(go) != 0 || pipe(done) != 0) Die("pipe");
    std::vector<pid_t> kids;
    const auto tg = Clock::now();
    for (int r = 0; r < a.ranks; ++r) {
      const pid_t pid = fork();
      if (pid < 0) Die("fork");
      if (pid != 0) {
        kids.push_back(pid);
        continue;
      }
      close(ready[0]);
      close(go[1]);
      close(done[0]);
      RankState rs;
      GenerateRank(meta, r, a.heap_state, rs);
      FileCollective coll(coll_dir, r, a.ranks);
      for (int rep = 0; rep < a.reps; ++rep) {
        char c = 'r';
        if (write(ready[1], &c, 1) != 1 || read(go[0], &c, 1) != 1) _exit(3);
        meta.tag = "bench" + std::to_string(rep);
        ckpt::Status s = ckpt::SaveCheckpoint(a.root, meta, rs.contents, coll, so);
        if (!s.ok()) {
          std::fprintf(stderr, "ckpt_io: save rank %d: %s\n", r, s.ToString().c_str());
          _exit(1);
        }
        c = 'd';
        if (write(done[1], &c, 1) != 1) _exit(3);
      }
      _exit(0);
    }
    close(ready[1]);
    close(go[0]);
    close(done[1]);
    auto collect = [&](int fd) {
      for (int got = 0; got < a.ranks;) {
        char c;
        const ssize_t n = read(fd, &c, 1);
        if (n <= 0) Die("a rank process died (see its message above)");
        ++got;
      }
    };
    for (int rep = 0; rep < a.reps; ++rep) {
      collect(ready[0]);
      if (rep == 0) gen_secs = Since(tg);
      json floor;
      auto run_floor = [&] {  // as the threads' above
        floor = FloorPasses(a.paired_raw, floor_bufs, true, a.drop, a.paired_variant);
        Settle();
      };
      if (!floor_bufs.empty() && !FloorAfter(rep)) run_floor();
      between_reps(rep);
      const std::string tokens(static_cast<size_t>(a.ranks), 'g');
      const auto t0 = Clock::now();
      if (write(go[1], tokens.data(), tokens.size()) != static_cast<ssize_t>(tokens.size()))
        Die("pipe write");
      collect(done[0]);
      const double secs = Since(t0);
      if (!floor_bufs.empty() && FloorAfter(rep)) {
        Settle();
        run_floor();
      }
      reps.push_back({{"seconds", secs}, {"file_bytes", DirBytes(a.root + "/" + prev_tag)}});
      if (!floor.is_null()) AddFloor(&reps.back(), floor, rep);
    }
    for (pid_t k : kids) {
      int st = 0;
      rusage ru{};
      wait4(k, &st, 0, &ru);
      rank_rss = std::max(rank_rss, ru.ru_maxrss);
      if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) Die("a rank process failed");
    }
    std::filesystem::remove_all(coll_dir);
    auto rd = ckpt::CheckpointReader::Open(a.root);
    if (!rd.ok()) Die(rd.status().ToString());
    for (const auto& f : rd->manifest().files)
      for (const auto& d : f.datasets) logical += d.bytes;
  }
  if (!a.paired_raw.empty()) std::filesystem::remove_all(a.paired_raw);
  // How the large writes went (O_DIRECT from staging or pwrite; env.h), over every repetition
  // of this process (the rank processes of --procs report nothing here).
  const ckpt::DirectWriteStats io = ckpt::GetDirectWriteStats();
  json out = {{"op", "save"},
              {"null_variant", a.null_variant},
              {"ranks", a.ranks},
              {"heap_state", a.heap_state},
              {"direct_write", {{"direct_bytes", io.direct_bytes},
                                {"in_place_bytes", io.in_place_bytes},
                                {"buffered_bytes", io.buffered_bytes},
                                {"refused_files", io.refused}}},
              {"procs", a.procs},
              {"params", a.params},
              {"compress", comp->ToString()},
              {"chunk_bytes", a.chunk_bytes},
              {"file_checksum", a.file_checksum},
              {"compress_threads", a.compress_threads},
              {"logical_bytes", logical},
              {"generate_seconds", gen_secs},
              {"reps", reps},
              {"tag", prev_tag},
              {"drop_caches", drop_status},
              {"maxrss_kib_before", rss_before},
              {"maxrss_kib", MaxRssKiB()},
              {"rank_maxrss_kib", rank_rss}};
  std::printf("%s\n", out.dump().c_str());
  return 0;
}

// ---------------------------------------------------------------------------------------------
// async: per repetition and rank (all ranks at once, as threads on a ThreadGroup): a memcpy of
// the rank's bytes into a buffer allocated and touched beforehand, then AsyncSaver::Save (the
// training stall) and Wait (Save to committed: the async persist), then a synchronous
// SaveCheckpoint of the same contents. Repetition 0 also allocates and first touches the
// saver's staging; the steady state is repetitions 1 and later.
int Async(const Args& a) {
  ckpt::Manifest meta = BenchManifest(a);
  std::vector<RankState> ranks(static_cast<size_t>(a.ranks));
  {
    std::vector<std::thread> gen;
    for (int r = 0; r < a.ranks; ++r)
      gen.emplace_back(
          [&, r] { GenerateRank(meta, r, a.heap_state, ranks[static_cast<size_t>(r)]); });
    for (auto& t : gen) t.join();
  }
  uint64_t logical = 0;
  for (auto& rs : ranks) logical += LogicalBytes(rs);
  ckpt::ThreadGroup group(a.ranks);
  std::vector<std::unique_ptr<ckpt::AsyncSaver>> savers;
  std::vector<std::vector<uint8_t>> copies;
  for (auto& rs : ranks) {
    savers.push_back(std::make_unique<ckpt::AsyncSaver>());
    copies.emplace_back(LogicalBytes(rs), 1);  // touched: no page faults inside the timing
  }
  struct Times {
    double memcpy_s = 0, stall_s = 0, copy_s = 0, persist_s = 0, sync_s = 0;
  };
  json reps = json::array();
  for (int rep = 0; rep < a.reps; ++rep) {
    std::vector<Times> t(static_cast<size_t>(a.ranks));
    std::vector<ckpt::Status> st(static_cast<size_t>(a.ranks) * 2);
    auto run = [&](auto body) {
      std::vector<std::thread> threads;
      for (int r = 0; r < a.ranks; ++r) threads.emplace_back([&, r] { body(r); });
      for (auto& th : threads) th.join();
    };
    run([&](int r) {
      const RankState& rs = ranks[static_cast<size_t>(r)];
      uint8_t* dst = copies[static_cast<size_t>(r)].data();
      const auto t0 = Clock::now();
      for (const auto& d : rs.contents.datasets) {
        uint64_t n = ckpt::DTypeSize(d.dtype);
        for (auto x : d.shape) n *= static_cast<uint64_t>(x);
        std::memcpy(dst, d.data, n);
        dst += n;
      }
      t[static_cast<size_t>(r)].memcpy_s = Since(t0);
    });
    run([&](int r) {
      ckpt::Manifest m = meta;
      m.tag = "async" + std::to_string(rep);
      ckpt::AsyncSaver& saver = *savers[static_cast<size_t>(r)];
      const auto t0 = Clock::now();
      ckpt::Status s =
          saver.Save(a.root, m, ranks[static_cast<size_t>(r)].contents, group.ForRank(r));
      t[static_cast<size_t>(r)].stall_s = Since(t0);
      t[static_cast<size_t>(r)].copy_s = saver.stats().last_stage_seconds;
      if (s.ok()) s = saver.Wait();
      t[static_cast<size_t>(r)].persist_s = Since(t0);
      st[static_cast<size_t>(r)] = s;
    });
    run([&](int r) {
      ckpt::Manifest m = meta;
      m.tag = "sync" + std::to_string(rep);
      const auto t0 = Clock::now();
      st[static_cast<size_t>(a.ranks + r)] =
          ckpt::SaveCheckpoint(a.root, m, ranks[static_cast<size_t>(r)].contents, group.ForRank(r));
      t[static_cast<size_t>(r)].sync_s = Since(t0);
    });
    for (const auto& s : st)
      if (!s.ok()) Die("async: " + s.ToString());
    Times worst;  // the slowest rank decides when training can go on / the tag is committed
    for (const auto& x : t) {
      worst.memcpy_s = std::max(worst.memcpy_s, x.memcpy_s);
      worst.stall_s = std::max(worst.stall_s, x.stall_s);
      worst.copy_s = std::max(worst.copy_s, x.copy_s);
      worst.persist_s = std::max(worst.persist_s, x.persist_s);
      worst.sync_s = std::max(worst.sync_s, x.sync_s);
    }
    reps.push_back({{"memcpy_seconds", worst.memcpy_s},
                    {"stall_seconds", worst.stall_s},
                    {"stage_seconds", worst.copy_s},
                    {"persist_seconds", worst.persist_s},
                    {"sync_seconds", worst.sync_s}});
    std::filesystem::remove_all(a.root + "/async" + std::to_string(rep));
    std::filesystem::remove_all(a.root + "/sync" + std::to_string(rep));
  }
  const ckpt::AsyncSaverStats stats = savers[0]->stats();
  json out = {{"op", "async"},
              {"ranks", a.ranks},
              {"params", a.params},
              {"logical_bytes", logical},
              {"reps", reps},
              {"staging_bytes_rank0", stats.host_staging_bytes},
              {"staging_allocations_rank0", stats.staging_allocations},
              {"maxrss_kib", MaxRssKiB()}};
  std::printf("%s\n", out.dump().c_str());
  return 0;
}

// ---------------------------------------------------------------------------------------------
// load

int Load(const Args& a) {
  auto probe = ckpt::CheckpointReader::Open(a.root);
  if (!probe.ok()) Die(probe.status().ToString());
  const ckpt::Manifest man = probe->manifest();
  const int world = static_cast<int>(man.files.size());
  // Destination buffers, allocated and touched untimed, page-aligned as a loader allocates
  // them (the Python Reader does; a dataset then reads straight into them, env.h).
  std::vector<std::vector<raw_floor::AlignedBuffer>> bufs(static_cast<size_t>(world));
  uint64_t logical = 0;
  for (int r = 0; r < world; ++r)
    for (const auto& d : man.files[static_cast<size_t>(r)].datasets) {
      if (!a.procs) bufs[static_cast<size_t>(r)].emplace_back(d.bytes);
      logical += d.bytes;
    }
  const long rss_before = MaxRssKiB();
  json reps = json::array();
  std::string drop_status = a.drop ? "" : "not requested";
  const bool paired = !a.paired_raw.empty();
  std::vector<raw_floor::AlignedBuffer> floor_bufs;  // the floor reads each rank's bytes here
  if (paired) {
    for (int r = 0; r < world; ++r) {
      uint64_t n = 0;
      for (const auto& d : man.files[static_cast<size_t>(r)].datasets) n += d.bytes;
      floor_bufs.emplace_back(n);
    }
    std::filesystem::create_directories(a.paired_raw);
    // The floor reads the checkpoint's own rank files (hard links, as raw_io names them), the
    // logical byte count of each rank from its start: the same bytes on the same blocks as the
    // load right after. Separate copies read by four variants in a row were served from the
    // host's cache of this VM's virtual disk at 6.8 GiB/s, twice its rate for the rank files.
    for (int r = 0; r < world; ++r) {
      std::error_code ec;
      std::filesystem::create_hard_link(probe->dir() + "/" + man.files[static_cast<size_t>(r)].path,
                                        raw_floor::FileName(a.paired_raw, static_cast<size_t>(r)), ec);
      if (ec) Die("paired raw files: " + ec.message());
    }
  }
  // The codec floor: the same logical bytes (read once, untimed) as zstd frames.
  auto comp = ckpt::Compression::Parse(man.files.empty() ? "none" : man.files[0].compression);
  const bool codec = !a.paired_codec.empty() && !a.procs && comp.ok() &&
                     comp->kind == ckpt::Compression::Kind::kZstd;
  const int codec_threads = CodecThreads(0, world);
  std::vector<CodecRank> codec_ranks;
  if (codec) {
    for (int r = 0; r < world; ++r) {
      std::vector<std::pair<const uint8_t*, std::pair<size_t, size_t>>> ds;
      const auto& recs = man.files[static_cast<size_t>(r)].datasets;
      for (size_t i = 0; i < recs.size(); ++i) {
        auto& b = bufs[static_cast<size_t>(r)][i];
        ckpt::Status s = probe->ReadDataset(r, recs[i].name, b.data(), b.size());
        if (!s.ok()) Die(s.ToString());
        if (recs[i].kind == "tensor" && !recs[i].shape.empty() && recs[i].bytes > 0)
          ds.push_back({b.data(), {b.size(), ckpt::DTypeSize(recs[i].dtype)}});
      }
      codec_ranks.push_back(CodecInput(ds, *comp, a.chunk_bytes));
    }
    CodecLoadSetup(a.paired_codec, codec_ranks, *comp);
  }
  for (int rep = 0; rep < a.reps; ++rep) {
    if (a.drop) drop_status = DropCaches();
    json floor;
    if (paired && !FloorAfter(rep)) {
      floor = FloorPasses(a.paired_raw, floor_bufs, false, a.drop, a.paired_variant);
      Settle();
    }
    // The codec floor alternates with the load, and each side starts the same way: right
    // after a cache drop.
    double codec_secs = 0, codec_cpu = 0;
    auto run_codec = [&] {
      if (a.drop) DropCaches();
      const double cpu0 = CpuSeconds();
      codec_secs = CodecLoadFloor(a.paired_codec, codec_ranks, codec_threads);
      codec_cpu = CpuSeconds() - cpu0;
    };
    if (codec && !FloorAfter(rep)) run_codec();
    if (codec && a.drop) DropCaches();
    std::vector<ckpt::Status> results(static_cast<size_t>(world));
    auto rank_load = [&](int r) -> ckpt::Status {
      ckpt::OpenOptions oo;
      oo.verify_checksums = a.verify;
      auto rd = ckpt::CheckpointReader::Open(a.root, "", oo);
      if (!rd.ok()) return rd.status();
      const auto& ds = rd->manifest().files[static_cast<size_t>(r)].datasets;
      for (size_t i = 0; i < ds.size(); ++i) {
        auto& b = bufs[static_cast<size_t>(r)][i];
        ckpt::Status s = rd->ReadDataset(r, ds[i].name, b.data(), b.size());
        if (!s.ok()) return s;
      }
      return ckpt::Status::Ok();
    };
    double secs = 0, cpu = -1;
    long child_rss = 0;
    if (a.procs) {
      // One process per rank, as an MPI job runs them: no shared HDF5 library lock. The
      // clock starts when every rank has its destination buffers and stops when every rank
      // has read its datasets (not when the processes have exited), as the save's does.
      int ready[2], go[2], done[2];
      if (pipe(ready) != 0 || pipe(go) != 0 || pipe(done) != 0) Die("pipe");
      std::vector<pid_t> kids;
      for (int r = 0; r < world; ++r) {
        const pid_t pid = fork();
        if (pid < 0) Die("fork");
        if (pid == 0) {
          close(ready[0]);
          close(go[1]);
          close(done[0]);
          // This rank's destination buffers, touched before the clock starts (forked pages
          // would otherwise be copied on write during the timed reads).
          for (const auto& d : man.files[static_cast<size_t>(r)].datasets)
            bufs[static_cast<size_t>(r)].emplace_back(d.bytes);
          char c = 'r';
          if (write(ready[1], &c, 1) != 1 || read(go[0], &c, 1) != 1) _exit(3);
          ckpt::Status s = rank_load(r);
          if (!s.ok()) std::fprintf(stderr, "ckpt_io: load rank %d: %s\n", r, s.ToString().c_str());
          c = 'd';
          if (s.ok() && write(done[1], &c, 1) != 1) _exit(3);
          _exit(s.ok() ? 0 : 1);
        }
        kids.push_back(pid);
      }
      close(ready[1]);
      close(go[0]);
      close(done[1]);
      auto collect = [&](int fd) {
        for (int got = 0; got < world; ++got) {
          char c;
          if (read(fd, &c, 1) != 1) return false;  // a rank process died (its message above)
        }
        return true;
      };
      bool all_done = collect(ready[0]);
      const auto t0 = Clock::now();
      const std::string tokens(static_cast<size_t>(world), 'g');
      if (all_done &&
          write(go[1], tokens.data(), tokens.size()) != static_cast<ssize_t>(tokens.size()))
        Die("pipe write");
      close(go[1]);
      all_done = all_done && collect(done[0]);
      secs = Since(t0);
      close(ready[0]);
      close(done[0]);
      int failed = all_done ? 0 : 1;
      for (pid_t k : kids) {
        int st = 0;
        rusage ru{};
        wait4(k, &st, 0, &ru);
        child_rss = std::max(child_rss, ru.ru_maxrss);
        if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) ++failed;
      }
      if (failed) Die("load: " + std::to_string(failed) + " rank process(es) failed");
    } else if (!a.null_variant.empty()) {
      secs = NullPass(a.paired_raw, floor_bufs, false, NamedVariant(false, a.null_variant));
    } else {
      const double cpu0 = CpuSeconds();
      const auto t0 = Clock::now();
      std::vector<std::thread> threads;
      for (int r = 0; r < world; ++r)
        threads.emplace_back([&, r] { results[static_cast<size_t>(r)] = rank_load(r); });
      for (auto& t : threads) t.join();
      secs = Since(t0);
      cpu = CpuSeconds() - cpu0;
    }
    for (auto& s : results)
      if (!s.ok()) Die("load: " + s.ToString());
    if (paired && FloorAfter(rep)) {
      Settle();
      floor = FloorPasses(a.paired_raw, floor_bufs, false, a.drop, a.paired_variant);
    }
    if (codec && FloorAfter(rep)) run_codec();
    reps.push_back({{"seconds", secs}, {"rank_maxrss_kib", child_rss}});
    if (cpu >= 0) reps.back()["cpu_seconds"] = cpu;
    if (!floor.is_null()) AddFloor(&reps.back(), floor, rep);
    if (codec) {
      AddCodecFloor(&reps.back(), codec_secs, codec_threads);
      reps.back()["codec_cpu_seconds"] = codec_cpu;
      reps.back()["codec_order"] = FloorAfter(rep) ? "ckpt first" : "floor first";
    }
  }
  if (paired) std::filesystem::remove_all(a.paired_raw);
  if (codec) std::filesystem::remove_all(a.paired_codec);
  // How the large reads went (O_DIRECT or the page cache; env.h), over every repetition of
  // this process (the rank processes of --procs report nothing here).
  const ckpt::DirectReadStats io = ckpt::GetDirectReadStats();
  json out = {{"op", "load"},       {"ranks", world},         {"verify", a.verify}, {"procs", a.procs},
              {"null_variant", a.null_variant},
              {"direct_read", {{"direct_bytes", io.direct_bytes},
                               {"buffered_bytes", io.buffered_bytes},
                               {"cached_ranges", io.cached_ranges},
                               {"refused_files", io.refused},
                               {"direct_into_caller_bytes", io.direct_into_caller_bytes}}},
              {"logical_bytes", logical}, {"file_bytes", DirBytes(probe->dir())},
              {"reps", reps},       {"drop_caches", drop_status},
              {"maxrss_kib_before", rss_before}, {"maxrss_kib", MaxRssKiB()}};
  std::printf("%s\n", out.dump().c_str());
  return 0;
}

// ---------------------------------------------------------------------------------------------
// zstd study

void ShuffleChunk(const uint8_t* in, uint8_t* out, size_t nbytes, size_t elem) {
  const size_t n = nbytes / elem;
  for (size_t j = 0; j < elem; ++j)
    for (size_t i = 0; i < n; ++i) out[j * n + i] = in[i * elem + j];
  std::memcpy(out + n * elem, in + n * elem, nbytes - n * elem);
}

// Variants per level: 0 no shuffle, 1 shuffle, 2.. "split": shuffled, only the top `planes`
// byte planes (sign and exponent bytes, the most significant) compressed, the low mantissa
// planes stored as they are (they are close to random: zstd spends time on them for nothing).
struct StudyVariant {
  std::string name;
  bool shuffle;
  size_t top_planes;  // 0: compress every plane
};

json Study(const std::vector<uint8_t>& data, size_t elem, const Args& a) {
  json rows = json::array();
  const size_t chunk = static_cast<size_t>(a.chunk_bytes);
  std::vector<uint8_t> shuffled(data.size());
  for (size_t off = 0; off < data.size(); off += chunk) {
    const size_t n = std::min(chunk, data.size() - off);
    ShuffleChunk(data.data() + off, shuffled.data() + off, n, elem);
  }
  std::vector<StudyVariant> variants = {{"none", false, 0}, {"shuffle", true, 0}};
  if (elem >= 2) variants.push_back({"split: top " + std::to_string(elem / 2) + " planes", true, elem / 2});
  if (elem >= 4) variants.push_back({"split: top plane", true, 1});
  std::vector<uint8_t> dst(ZSTD_compressBound(chunk)), back(chunk), unsh(chunk);
  for (int level : a.levels) {
    for (const StudyVariant& v : variants) {
      const std::vector<uint8_t>& src = v.shuffle ? shuffled : data;
      ZSTD_CCtx* cctx = ZSTD_createCCtx();
      ZSTD_DCtx* dctx = ZSTD_createDCtx();
      uint64_t comp_bytes = 0;
      double ct = 0, dt = 0;
      // Per chunk, the best of three timings: a shared machine preempts single runs.
      for (size_t off = 0; off < src.size(); off += chunk) {
        const size_t n = std::min(chunk, src.size() - off);
        // The compressed part of the chunk: all of it, or its top planes (whole elements only).
        size_t skip = 0;
        if (v.top_planes && n % elem == 0) skip = n / elem * (elem - v.top_planes);
        const size_t m = n - skip;
        double best_c = 1e30, best_d = 1e30;
        size_t got = 0;
        for (int t = 0; t < 3; ++t) {
          auto t0 = Clock::now();
          got = ZSTD_compressCCtx(cctx, dst.data(), dst.size(), src.data() + off + skip, m, level);
          if (v.shuffle) ShuffleChunk(data.data() + off, unsh.data(), n, elem);  // the shuffle's own cost
          best_c = std::min(best_c, Since(t0));
          if (ZSTD_isError(got)) Die(std::string("zstd: ") + ZSTD_getErrorName(got));
          t0 = Clock::now();
          size_t dn = ZSTD_decompressDCtx(dctx, back.data() + skip, m, dst.data(), got);
          if (skip) std::memcpy(back.data(), src.data() + off, skip);  // the stored planes
          if (v.shuffle && n % elem == 0) ShuffleChunk(back.data(), unsh.data(), n, n / elem);  // unshuffle
          best_d = std::min(best_d, Since(t0));
          if (ZSTD_isError(dn) || dn != m || std::memcmp(back.data(), src.data() + off, n) != 0)
            Die("zstd round trip failed");
        }
        comp_bytes += got + skip;
        ct += best_c;
        dt += best_d;
      }
      ZSTD_freeCCtx(cctx);
      ZSTD_freeDCtx(dctx);
      const double mib = static_cast<double>(src.size()) / 1048576.0;
      rows.push_back({{"level", level},
                      {"shuffle", v.shuffle},
                      {"variant", v.name},
                      {"ratio", static_cast<double>(src.size()) / static_cast<double>(comp_bytes)},
                      {"compress_mib_per_s", mib / ct},
                      {"decompress_mib_per_s", mib / dt}});
    }
  }
  return rows;
}

int Zstd(const Args& a) {
  auto rd = ckpt::CheckpointReader::Open(a.root);
  if (!rd.ok()) Die(rd.status().ToString());
  const auto& man = rd->manifest();
  const uint64_t cap = static_cast<uint64_t>(a.max_mib) << 20;
  std::map<std::string, std::vector<uint8_t>> states;
  std::map<std::string, size_t> elem;
  for (const auto& f : man.files)
    for (const auto& d : f.datasets) {
      std::string key;
      if (d.name == ckpt::kMaster || d.name == ckpt::kExpAvg || d.name == ckpt::kExpAvgSq)
        key = d.name + " (fp32)";
      else if (d.name == "compute")
        key = "compute (" + std::string(ckpt::DTypeName(d.dtype)) + ")";
      else
        continue;
      auto& v = states[key];
      if (v.size() >= cap || d.bytes == 0) continue;
      auto bytes = rd->ReadDatasetBytes(f.rank, d.name);
      if (!bytes.ok()) Die(bytes.status().ToString());
      v.insert(v.end(), bytes->begin(), bytes->begin() + std::min<uint64_t>(bytes->size(), cap - v.size()));
      elem[key] = ckpt::DTypeSize(d.dtype);
    }
  // bf16 weights: the master weights rounded as a bf16 training step holds them.
  if (!states.count("compute (bf16)") && states.count("master (fp32)")) {
    const auto& m = states["master (fp32)"];
    std::vector<uint8_t> b(m.size() / 2);
    for (size_t i = 0; i < m.size() / 4; ++i) {
      float f;
      std::memcpy(&f, m.data() + 4 * i, 4);
      const uint16_t h = ckpt::FloatToBf16(f);
      std::memcpy(b.data() + 2 * i, &h, 2);
    }
    states["bf16 weights (master rounded)"] = std::move(b);
    elem["bf16 weights (master rounded)"] = 2;
  }
  json out = {{"op", "zstd"}, {"root", a.root}, {"tag", rd->tag()},
              {"chunk_bytes", a.chunk_bytes}, {"states", json::object()}};
  for (auto& [name, data] : states) {
    if (data.empty()) continue;
    out["states"][name] = {{"bytes", data.size()}, {"rows", Study(data, elem[name], a)}};
  }
  std::printf("%s\n", out.dump().c_str());
  return 0;
}

int ReshardLoad(const Args& a) {
  if (a.paired_raw.empty()) Die("reshard-load needs --paired-raw DIR");
  auto probe = ckpt::CheckpointReader::Open(a.root);
  if (!probe.ok()) Die(probe.status().ToString());
  const ckpt::Manifest& man = probe->manifest();
  const int zero = a.zero >= 0 ? a.zero : man.topology.zero_stage;
  auto target = ckpt::PlanReshard(man, a.to, zero);
  if (!target.ok()) Die(target.status().ToString());
  const int world = a.to;
  // The floor's bytes: per new rank, as many bytes as it owns (its shard without padding).
  std::vector<uint64_t> owned(static_cast<size_t>(world), 0);
  for (const auto& p : target->params) {
    if (!p.trainable()) continue;
    for (const auto& r : p.ranges)
      owned[static_cast<size_t>(r.rank)] += static_cast<uint64_t>(r.end - r.begin) * 12;
  }
  std::vector<raw_floor::AlignedBuffer> floor_bufs;
  uint64_t owned_total = 0;
  for (int j = 0; j < world; ++j) {
    floor_bufs.emplace_back(owned[static_cast<size_t>(j)]);  // touched, untimed
    owned_total += owned[static_cast<size_t>(j)];
  }
  std::filesystem::create_directories(a.paired_raw);
  // The floor's files, written untimed.
  const raw_floor::PassResult w =
      raw_floor::Pass(a.paired_raw, floor_bufs, true, raw_floor::WriteVariants()[0]);
  if (!w.error.empty()) Die("paired raw pass: " + w.error);
  json reps = json::array(), ranks = json::array();
  std::string drop_status = a.drop ? "" : "not requested";
  for (int rep = 0; rep < a.reps; ++rep) {
    if (a.drop) drop_status = DropCaches();
    const json floor = FloorPasses(a.paired_raw, floor_bufs, false, a.drop);
    // The fresh-memory floor: memory allocated untouched (huge pages asked for, as
    // AllocateIoMemory does), first touched by a memset on one thread per new rank (timed),
    // then read into by the best variant: the first touch of every page, as LoadResharded pays
    // it for the vectors it returns. Reading straight into the untouched memory (the kernel
    // faulting it in) took 0.73-1.03 s on this VM where the touch and the read took less. A
    // first touch costs more in memory the process has not had before than in memory it has
    // just freed (the same pass took 0.16 s and 0.96 s), so it runs before the ckpt run on even
    // repetitions and after it, once the shards are freed, on odd ones (FloorAfter). Not part
    // of the best floor.
    auto fresh_floor = [&]() -> json {
      if (floor["best_seconds"].get<double>() <= 0) return nullptr;
      std::vector<raw_floor::AlignedBuffer> mem;
      for (int j = 0; j < world; ++j) mem.emplace_back(owned[static_cast<size_t>(j)], false);
      if (a.drop) DropCaches();
      const auto t_touch = Clock::now();
      {
        std::vector<std::thread> touch;
        for (auto& m : mem) touch.emplace_back([&m] { std::memset(m.data(), 0, m.size()); });
        for (auto& t : touch) t.join();
      }
      const double touched = Since(t_touch);
      const json f =
          FloorPasses(a.paired_raw, mem, false, a.drop, floor["best_variant"].get<std::string>());
      if (f["best_seconds"].get<double>() <= 0) return nullptr;
      return touched + f["best_seconds"].get<double>();
    };
    json fresh = FloorAfter(rep) ? json(nullptr) : fresh_floor();
    std::vector<ckpt::Result<ckpt::ReshardedRank>> got;
    for (int j = 0; j < world; ++j) got.emplace_back(ckpt::Internal("not run"));
    const auto t0 = Clock::now();
    std::vector<std::thread> threads;
    for (int j = 0; j < world; ++j)
      threads.emplace_back([&, j] {
        got[static_cast<size_t>(j)] = ckpt::LoadResharded(a.root, *target, j);
      });
    for (auto& t : threads) t.join();
    const double secs = Since(t0);
    uint64_t read = 0;
    ranks = json::array();
    for (int j = 0; j < world; ++j) {
      auto& g = got[static_cast<size_t>(j)];
      if (!g.ok()) Die("new rank " + std::to_string(j) + ": " + g.status().ToString());
      const ckpt::ReadAccounting& acc = g->accounting;
      read += acc.bytes_read;
      ranks.push_back({{"rank", j}, {"bytes_owned", acc.bytes_owned},
                       {"bytes_read", acc.bytes_read}, {"slices", acc.slices},
                       {"piece_bytes", acc.piece_bytes}, {"ratio", acc.ratio()}});
    }
    got.clear();  // the shards freed before an odd repetition's fresh-memory floor
    if (FloorAfter(rep)) fresh = fresh_floor();
    reps.push_back({{"seconds", secs}, {"bytes_read", read}, {"fresh_memory_seconds", fresh}});
    AddFloor(&reps.back(), floor, 0);  // always before: a reshard reads a part of each file
  }
  std::filesystem::remove_all(a.paired_raw);
  json out = {{"op", "reshard-load"}, {"from", man.topology.dp_world_size}, {"to", world},
              {"from_zero", man.topology.zero_stage}, {"zero", zero},
              {"logical_bytes", owned_total}, {"reps", reps}, {"ranks", ranks},
              {"drop_caches", drop_status}, {"maxrss_kib", MaxRssKiB()}};
  std::printf("%s\n", out.dump().c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const Args a = Parse(argc, argv);
  if (a.op == "save") return Save(a);
  if (a.op == "load") return Load(a);
  if (a.op == "zstd") return Zstd(a);
  if (a.op == "async") return Async(a);
  if (a.op == "reshard-load") return ReshardLoad(a);
  Die("op must be save, load, zstd, async or reshard-load");
}
