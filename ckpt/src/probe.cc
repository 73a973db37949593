#include "ckpt/probe.h"

#include <linux/magic.h>
#include <signal.h>
#include <sys/vfs.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <memory>
#include <system_error>

#include "ckpt/collective.h"
#include "ckpt/env.h"
#include "ckpt/rank_threads.h"
#include "ckpt/state_source.h"
#include "ckpt/synth.h"
#include "ckpt/units.h"

namespace ckpt {

namespace fs = std::filesystem;

namespace {

constexpr uint64_t kMinBytes = 16u << 20;
// Room a save needs beyond its logical bytes: the manifest, HDF5's metadata, the rank files'
// alignment, and a margin so that the probe never fills a disk.
constexpr uint64_t kHeadroom = 64u << 20;

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

uint64_t TreeBytes(const std::string& root) {
  uint64_t total = 0;
  std::error_code ec;
  for (auto it = fs::recursive_directory_iterator(root, ec); !ec && it != fs::end(it);
       it.increment(ec)) {
    std::error_code size_ec;
    if (it->is_regular_file(size_ec)) {
      const uint64_t n = it->file_size(size_ec);
      if (!size_ec) total += n;
    }
  }
  return total;
}

// This host's name as it appears in the probe's directory names: letters, digits, '.' and '_'
// ('-' and anything else become '_'), at most 64 characters.
std::string HostTag() {
  char name[256] = {};
  if (gethostname(name, sizeof name - 1) != 0) return "host";
  std::string tag;
  for (const char* c = name; *c && tag.size() < 64; ++c)
    tag += std::isalnum(static_cast<unsigned char>(*c)) || *c == '.' ? *c : '_';
  return tag.empty() ? "host" : tag;
}

// The probe's directories are `parent`/.ckpt-probe-<host>-<pid>-XXXXXX: a probe stopped by a
// signal (or a crash) leaves its own, and the next probe on the same host removes it once no
// process of that id runs (another host's, or a live process's, are never touched).
std::string ProbePrefix() { return ".ckpt-probe-" + HostTag() + "-"; }

std::vector<std::string> RemoveStale(const std::string& parent) {
  std::vector<std::string> removed;
  const std::string prefix = ProbePrefix();
  std::error_code ec;
  for (auto it = fs::directory_iterator(parent, ec); !ec && it != fs::end(it); it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (name.rfind(prefix, 0) != 0) continue;
    const size_t dash = name.find('-', prefix.size());
    const std::string pid_text = name.substr(prefix.size(), dash - prefix.size());
    if (dash == std::string::npos || pid_text.empty() || pid_text.size() > 9 ||
        pid_text.find_first_not_of("0123456789") != std::string::npos)
      continue;
    const pid_t pid = static_cast<pid_t>(std::stol(pid_text));
    if (pid == getpid() || kill(pid, 0) == 0 || errno != ESRCH) continue;
    std::error_code rm;
    fs::remove_all(it->path(), rm);
    if (!rm) removed.push_back(it->path().string());
  }
  return removed;
}

// A fresh directory `parent`/.ckpt-probe-<host>-<pid>-XXXXXX, removed (with what the probe left
// in it) when the object goes.
class ProbeDir {
 public:
  static Result<std::unique_ptr<ProbeDir>> Create(const std::string& parent) {
    std::string pattern =
        (fs::path(parent) / (ProbePrefix() + std::to_string(getpid()) + "-XXXXXX")).string();
    if (mkdtemp(pattern.data()) == nullptr)
      return FailedPrecondition(
          parent + ": cannot create a directory in it for the probe: " + std::strerror(errno));
    return std::unique_ptr<ProbeDir>(new ProbeDir(std::move(pattern)));
  }
  ~ProbeDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }

 private:
  explicit ProbeDir(std::string path) : path_(std::move(path)) {}
  std::string path_;
};

// Room for one save of `bytes` under `dir`, or why not.
Status CheckRoom(const std::string& dir, uint64_t bytes) {
  std::error_code ec;
  const fs::space_info space = fs::space(dir, ec);
  if (ec) return IOError(dir + ": cannot read its free space: " + ec.message());
  const uint64_t need = bytes + bytes / 16 + kHeadroom;
  if (space.available < need)
    return FailedPrecondition(dir + ": " + FormatBytes(space.available) +
                              " free, a save of the probe needs " + FormatBytes(need) +
                              " (a smaller --size needs less)");
  return Status::Ok();
}

// Whether `dir` is a file system in memory (tmpfs, ramfs): "" if so, else why not.
std::string NotInMemory(const std::string& dir) {
  struct statfs st {};
  if (statfs(dir.c_str(), &st) != 0) return dir + ": " + std::strerror(errno);
  if (st.f_type == TMPFS_MAGIC || st.f_type == RAMFS_MAGIC) return "";
  return dir + " is not a file system in memory (tmpfs or ramfs)";
}

// The rank states' master and moments from `source`: each state's trainable elements in its
// table's order, rank 0's shard first, until every shard is full or the source has no more
// (the rest stays zero).
Status FillFromSource(StateSource& source, const Manifest& meta,
                      std::vector<std::unique_ptr<SynthRankState>>& states,
                      const std::function<void(uint64_t)>& on_bytes) {
  constexpr int64_t kRead = 4 << 20;  // elements per read (16 MiB)
  const std::string_view names[3] = {kMaster, kExpAvg, kExpAvgSq};
  for (int s = 0; s < 3; ++s) {
    size_t rank = 0;
    int64_t at = 0;  // the next element of states[rank]'s state s
    auto next_room = [&] {
      while (rank < states.size() && at == meta.partition.shard_numel[rank]) {
        ++rank;
        at = 0;
      }
      return rank < states.size();
    };
    for (const auto& p : source.manifest().params) {
      if (!p.trainable()) continue;
      for (int64_t b = 0; b < p.numel && next_room();) {
        const int64_t n = std::min({p.numel - b, meta.partition.shard_numel[rank] - at, kRead});
        float* out = states[rank]->state[s].as<float>() + at;
        CKPT_RETURN_IF_ERROR(source.ReadParamRange(p.name, names[s], b, b + n, out),
                             p.name + " " + std::string(names[s]));
        if (on_bytes) on_bytes(static_cast<uint64_t>(n) * 4);
        b += n;
        at += n;
      }
      if (!next_room()) break;
    }
  }
  return Status::Ok();
}

nlohmann::json Seconds(const std::vector<double>& v, double median) {
  return {{"median", median},
          {"min", *std::min_element(v.begin(), v.end())},
          {"max", *std::max_element(v.begin(), v.end())},
          {"each", v}};
}

nlohmann::json SideJson(const ProbeSide& s, uint64_t bytes) {
  return {{"none_seconds", Seconds(s.none_seconds, s.NoneMedian())},
          {"compressed_seconds", Seconds(s.compressed_seconds, s.CompressedMedian())},
          {"none_bytes_per_s", static_cast<double>(bytes) / s.NoneMedian()},
          {"compressed_bytes_per_s", static_cast<double>(bytes) / s.CompressedMedian()},
          {"none_file_bytes", s.none_file_bytes},
          {"compressed_file_bytes", s.compressed_file_bytes},
          {"speedup", s.Speedup()}};
}

nlohmann::json RateOrNull(double x) { return x > 0 ? nlohmann::json(x) : nlohmann::json(); }

class Prober {
 public:
  Prober(const ProbeOptions& o, Manifest meta, std::vector<std::unique_ptr<SynthRankState>> states)
      : o_(o), meta_(std::move(meta)), states_(std::move(states)) {}

  // o.pairs alternating pairs under `work`: uncompressed first in even pairs.
  Status Run(const std::string& work, ProbeSide& side) {
    for (int p = 0; p < o_.pairs; ++p)
      for (int k = 0; k < 2; ++k) {
        const bool compressed = (p % 2 == 0) == (k == 1);
        CKPT_RETURN_IF_ERROR(SaveOnce(work, compressed, side));
      }
    return Status::Ok();
  }

 private:
  Status SaveOnce(const std::string& work, bool compressed, ProbeSide& side) {
    const std::string root = work + "/" + std::to_string(++saves_);
    SaveOptions so;
    so.compression = compressed ? o_.compression : Compression{};
    ThreadGroup group(static_cast<int>(states_.size()));
    const auto t0 = std::chrono::steady_clock::now();
    const std::vector<Status> results = RunOnThreads(
        static_cast<int>(states_.size()),
        [&](int rank) -> Status {
          const auto& mine = *states_[static_cast<size_t>(rank)];
          Status saved = SaveCheckpoint(root, meta_, mine.contents, group.ForRank(rank), so);
          if (saved.ok() && o_.on_bytes)
            o_.on_bytes(
                static_cast<uint64_t>(meta_.partition.shard_numel[static_cast<size_t>(rank)]) * 12);
          return saved;
        },
        &group);
    const double secs =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    for (size_t r = 0; r < results.size(); ++r)
      CKPT_RETURN_IF_ERROR(results[r], "probe save under " + work + ", rank " + std::to_string(r));
    // The committed tag's files (rank files, manifest): not the root's lock, which holds the
    // saver's pid (one byte more or less from one process to the next).
    const uint64_t stored = TreeBytes(root + "/" + meta_.tag);
    std::error_code ec;
    fs::remove_all(root, ec);
    if (ec) return IOError(root + ": cannot remove the probe's save: " + ec.message());
    (compressed ? side.compressed_seconds : side.none_seconds).push_back(secs);
    (compressed ? side.compressed_file_bytes : side.none_file_bytes) = stored;
    return Status::Ok();
  }

  const ProbeOptions& o_;
  const Manifest meta_;
  const std::vector<std::unique_ptr<SynthRankState>> states_;
  int saves_ = 0;
};

}  // namespace

double ProbeSide::NoneMedian() const { return Median(none_seconds); }
double ProbeSide::CompressedMedian() const { return Median(compressed_seconds); }
double ProbeSide::Speedup() const {
  const double c = CompressedMedian();
  return c > 0 ? NoneMedian() / c : 0;
}

double ProbeReport::CompressionRatio() const {
  return disk.compressed_file_bytes ? static_cast<double>(disk.none_file_bytes) /
                                          static_cast<double>(disk.compressed_file_bytes)
                                    : 0;
}

bool ProbeReport::CompressHere() const { return disk.Speedup() > 1; }

double ProbeReport::CrossoverBytesPerSecond() const {
  const double c = disk.CompressedMedian();
  return !CompressHere() && c > 0 ? static_cast<double>(bytes) / c : 0;
}

double ProbeReport::CeilingBytesPerSecond() const {
  const double c = memory.CompressedMedian();
  return memory_ran && c > 0 ? static_cast<double>(bytes) / c : 0;
}

nlohmann::json ProbeReportToJson(const ProbeReport& r) {
  const std::string setting = r.compression.ToString();
  return {{"dir", r.dir},
          {"from", r.from.empty() ? nlohmann::json() : nlohmann::json(r.from)},
          {"bytes", r.bytes},
          {"ranks", r.ranks},
          {"pairs", r.pairs},
          {"compress", setting},
          {"disk", SideJson(r.disk, r.bytes)},
          {"memory", r.memory_ran ? SideJson(r.memory, r.bytes) : nlohmann::json()},
          {"memory_dir", r.memory_dir},
          {"memory_note", r.memory_note},
          {"compression_ratio", r.CompressionRatio()},
          {"direct_bytes", r.direct_bytes},
          {"o_direct_refused", r.o_direct_refused},
          {"recommended", r.CompressHere() ? setting : "none"},
          {"crossover_bytes_per_s", RateOrNull(r.CrossoverBytesPerSecond())},
          {"ceiling_bytes_per_s", RateOrNull(r.CeilingBytesPerSecond())},
          {"removed_stale", r.removed_stale}};
}

Result<ProbeReport> ProbeCompression(const std::string& dir, const ProbeOptions& o) {
  if (o.bytes < kMinBytes) return InvalidArgument("--size must be at least 16 MiB");
  if (o.ranks < 1) return InvalidArgument("--ranks must be at least 1");
  if (o.pairs < 1) return InvalidArgument("--pairs must be at least 1");
  if (o.compression.kind == Compression::Kind::kNone)
    return InvalidArgument("--compress must name a compression to weigh against none");
  std::error_code ec;
  if (!fs::exists(dir, ec)) return NotFound(dir + ": no such directory");
  if (!fs::is_directory(dir, ec)) return FailedPrecondition(dir + ": not a directory");

  // The saves' parameters: the first o.bytes / 12 (three fp32 states each), or all of the
  // `from` checkpoint's when it holds fewer.
  std::unique_ptr<StateSource> source;
  int64_t params = static_cast<int64_t>(o.bytes / 12);
  if (!o.from.empty()) {
    SourceOptions src_options;
    src_options.verify_reads = true;
    CKPT_ASSIGN_OR_RETURN(source, OpenStateSource(o.from, src_options), "--from");
    int64_t held = 0;
    for (const auto& p : source->manifest().params)
      if (p.trainable()) held += p.numel;
    if (held < params) {
      if (static_cast<uint64_t>(held) * 12 < kMinBytes)
        return InvalidArgument(source->dir() + ": holds " +
                               FormatBytes(static_cast<uint64_t>(held) * 12) +
                               " of fp32 master and Adam moments; the probe needs at least 16 MiB");
      params = held;
    }
  }
  CKPT_RETURN_IF_ERROR(CheckRoom(dir, static_cast<uint64_t>(params) * 12));

  SynthOptions so;
  so.ranks = o.ranks;
  so.params = params;
  CKPT_ASSIGN_OR_RETURN(Manifest meta, SynthManifest(so, 100), "probe");
  std::vector<std::unique_ptr<SynthRankState>> states(static_cast<size_t>(o.ranks));
  for (auto& s : states) s = std::make_unique<SynthRankState>();
  const std::vector<Status> filled = RunOnThreads(o.ranks, [&](int rank) -> Status {
    FillSynthRank(meta, so.seed, rank, *states[static_cast<size_t>(rank)], source == nullptr);
    return Status::Ok();
  });
  for (const auto& s : filled) CKPT_RETURN_IF_ERROR(s, "probe: generating the state");
  if (source) CKPT_RETURN_IF_ERROR(FillFromSource(*source, meta, states, o.on_bytes), "--from");

  ProbeReport report;
  report.dir = dir;
  if (source) report.from = source->dir();
  report.ranks = o.ranks;
  report.pairs = o.pairs;
  report.compression = o.compression;
  for (const auto& s : states)
    for (const auto& d : s->contents.datasets) {
      uint64_t n = d.kind == "tensor" ? DTypeSize(d.dtype) : 0;
      for (auto x : d.shape) n *= static_cast<uint64_t>(x);
      report.bytes += n;
    }
  Prober prober(o, std::move(meta), std::move(states));

  {
    report.removed_stale = RemoveStale(dir);
    CKPT_ASSIGN_OR_RETURN(auto work, ProbeDir::Create(dir));
    const DirectWriteStats before = GetDirectWriteStats();
    CKPT_RETURN_IF_ERROR(prober.Run(work->path(), report.disk));
    const DirectWriteStats after = GetDirectWriteStats();
    report.direct_bytes = after.direct_bytes - before.direct_bytes;
    report.o_direct_refused = after.refused - before.refused;
  }

  report.memory_dir = o.memory_dir;
  if (o.memory_dir.empty()) {
    report.memory_note = "not asked for (--memory-dir '')";
  } else if (!fs::is_directory(o.memory_dir, ec)) {
    report.memory_note = o.memory_dir + ": no such directory";
  } else if (std::string why = NotInMemory(o.memory_dir); !why.empty()) {
    report.memory_note = why;
  } else if (Status room = CheckRoom(o.memory_dir, report.bytes); !room.ok()) {
    report.memory_note = room.message();
  } else {
    for (auto& stale : RemoveStale(o.memory_dir)) report.removed_stale.push_back(std::move(stale));
    CKPT_ASSIGN_OR_RETURN(auto work, ProbeDir::Create(o.memory_dir));
    CKPT_RETURN_IF_ERROR(prober.Run(work->path(), report.memory));
    report.memory_ran = true;
  }
  return report;
}

}  // namespace ckpt
