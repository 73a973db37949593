// ckpt save / load / zstd measurements for tools/bench.sh, through the public ckpt API only.
//
//   ckpt_io save ROOT --ranks N --params P [--zero S] [--compress C] [--chunk-bytes B]
//                [--no-file-checksum] [--compress-threads T] [--reps R] [--drop-caches]
//   ckpt_io load ROOT [--reps R] [--drop-caches] [--no-verify]
//   ckpt_io zstd ROOT [--levels 1,3,9] [--max-mib M] [--chunk-bytes B]
//
// save: the state of every rank is generated first (ckpt::SynthParamTable, BuildPartition and
//   SynthValue, exactly the contents `ckpt synth` writes), then only ckpt::SaveCheckpoint is
//   timed, all ranks concurrently as threads on a ckpt::ThreadGroup (as `ckpt synth` and
//   `ckpt reshard` save). Each repetition writes a new tag; the previous one is removed
//   untimed, so the last tag stays for the load / export / reshard phases.
// load: one thread per rank, each with its own CheckpointReader, reads every dataset of its
//   rank file whole (ReadDataset: XXH3 of every dataset checked). Destination buffers are
//   allocated and touched before the clock starts, as in raw_io.
// zstd: compression ratio and single-thread throughput of the rank files' fp32 master
//   weights, exp_avg, exp_avg_sq and the bf16 rounding of the master weights (or a stored
//   `compute` dataset), per level, with and without HDF5-style byte shuffle, in chunks of
//   chunk-bytes (what the writer compresses one at a time).
//
// Prints one JSON object. Exit 2 on usage or any error.
#include <sys/resource.h>
#include <unistd.h>
#include <zstd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "ckpt/collective.h"
#include "ckpt/hash.h"
#include "ckpt/manifest.h"
#include "ckpt/reader.h"
#include "ckpt/synth.h"
#include "ckpt/writer.h"

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
  bool file_checksum = true, drop = false, verify = true;
  std::vector<int> levels = {1, 3, 9};
  int64_t max_mib = 64;
};

Args Parse(int argc, char** argv) {
  if (argc < 3) Die("usage: ckpt_io save|load|zstd ROOT [options]");
  Args a;
  a.op = argv[1];
  a.root = argv[2];
  for (int i = 3; i < argc; ++i) {
    const std::string k = argv[i];
    auto val = [&]() -> std::string {
      if (i + 1 >= argc) Die("missing value for " + k);
      return argv[++i];
    };
    if (k == "--ranks") a.ranks = std::stoi(val());
    else if (k == "--params") a.params = static_cast<int64_t>(std::stod(val()));
    else if (k == "--zero") a.zero = std::stoi(val());
    else if (k == "--compress") a.compress = val();
    else if (k == "--chunk-bytes") a.chunk_bytes = static_cast<uint64_t>(std::stod(val()));
    else if (k == "--compress-threads") a.compress_threads = std::stoi(val());
    else if (k == "--reps") a.reps = std::stoi(val());
    else if (k == "--max-mib") a.max_mib = std::stoll(val());
    else if (k == "--no-file-checksum") a.file_checksum = false;
    else if (k == "--drop-caches") a.drop = true;
    else if (k == "--no-verify") a.verify = false;
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
  return a;
}

// ---------------------------------------------------------------------------------------------
// save

struct RankState {
  std::vector<float> state[3];
  std::vector<uint16_t> frozen;
  std::string rng, data_pos, sched;
  ckpt::RankContents contents;
};

int Save(const Args& a) {
  if (a.params < 1) Die("save needs --params");
  auto comp = ckpt::Compression::Parse(a.compress);
  if (!comp.ok()) Die(comp.status().ToString());
  const int64_t step = 100;
  ckpt::Manifest meta;
  meta.counters = {step, step, 0, step * 64, step * 64 * 128};
  meta.topology.dp_world_size = a.ranks;
  meta.topology.zero_stage = a.zero;
  meta.optimizer = {{"type", "adamw"}, {"lr", 1e-4},  {"beta1", 0.9},
                    {"beta2", 0.999},  {"eps", 1e-8}, {"weight_decay", 0.01}};
  meta.dtypes = {{"master", "fp32"}, {"exp_avg", "fp32"}, {"exp_avg_sq", "fp32"}};
  meta.params = ckpt::SynthParamTable(a.params, 0);
  auto part = ckpt::BuildPartition(meta.params, a.ranks, a.zero);
  if (!part.ok()) Die(part.status().ToString());
  meta.partition = *part;
  meta.client_state = {{"synthetic", true}, {"seed", 0}};
  meta.engine_config = {{"generator", "tools/bench/ckpt_io"}};

  // Generate every rank's state (untimed), two threads per core's worth at most.
  const std::string_view names[3] = {ckpt::kMaster, ckpt::kExpAvg, ckpt::kExpAvgSq};
  std::vector<RankState> ranks(static_cast<size_t>(a.ranks));
  const auto tg = Clock::now();
  {
    std::vector<std::thread> gen;
    for (int r = 0; r < a.ranks; ++r) {
      gen.emplace_back([&, r] {
        auto& rs = ranks[static_cast<size_t>(r)];
        const int64_t shard = meta.partition.shard_numel[static_cast<size_t>(r)];
        for (int s = 0; s < 3; ++s) rs.state[s].assign(static_cast<size_t>(shard), 0.0f);
        for (size_t pi = 0; pi < meta.params.size(); ++pi)
          for (const auto& rg : meta.params[pi].ranges) {
            if (rg.rank != r) continue;
            for (int s = 0; s < 3; ++s)
              for (int64_t e = rg.begin; e < rg.end; ++e)
                rs.state[s][static_cast<size_t>(rg.shard_offset + e - rg.begin)] =
                    ckpt::SynthValue(0, step, pi, names[s], e);
          }
        for (int s = 0; s < 3; ++s)
          rs.contents.datasets.push_back(ckpt::DatasetSpec::Tensor(
              std::string(names[s]), ckpt::DType::kF32, {shard}, rs.state[s].data()));
        if (r == 0) {
          for (size_t pi = 0; pi < meta.params.size(); ++pi) {
            const auto& p = meta.params[pi];
            if (!p.frozen) continue;
            rs.frozen.resize(static_cast<size_t>(p.numel));
            for (int64_t e = 0; e < p.numel; ++e)
              rs.frozen[static_cast<size_t>(e)] =
                  ckpt::FloatToBf16(ckpt::SynthValue(0, step, pi, "frozen", e));
            rs.contents.datasets.push_back(ckpt::DatasetSpec::Tensor(
                std::string(ckpt::kFrozenPrefix) + p.name, ckpt::DType::kBF16, p.shape,
                rs.frozen.data()));
          }
        }
        rs.rng = "bench-rng-state-" + std::to_string(r);
        rs.data_pos = json{{"epoch", 0}, {"sample_offset", step * 64}}.dump();
        rs.sched = json{{"kind", "constant"}, {"last_lr", 1e-4}, {"step", step}}.dump();
        rs.contents.datasets.push_back(ckpt::DatasetSpec::Blob("rng/dropout", "mt19937_64", rs.rng));
        rs.contents.datasets.push_back(
            ckpt::DatasetSpec::Json(std::string(ckpt::kDataPosition), rs.data_pos));
        rs.contents.datasets.push_back(
            ckpt::DatasetSpec::Json(std::string(ckpt::kScheduler), rs.sched));
      });
    }
    for (auto& t : gen) t.join();
  }
  const double gen_secs = Since(tg);
  uint64_t logical = 0;
  for (auto& rs : ranks)
    for (auto& d : rs.contents.datasets) {
      uint64_t n = ckpt::DTypeSize(d.dtype);
      for (auto x : d.shape) n *= static_cast<uint64_t>(x);
      logical += n;
    }
  const long rss_before = MaxRssKiB();

  json reps = json::array();
  std::string drop_status = a.drop ? "" : "not requested";
  std::string prev_tag;
  for (int rep = 0; rep < a.reps; ++rep) {
    if (!prev_tag.empty()) std::filesystem::remove_all(a.root + "/" + prev_tag);
    if (a.drop) drop_status = DropCaches();
    meta.tag = "bench" + std::to_string(rep);
    ckpt::SaveOptions so;
    so.compression = *comp;
    so.chunk_bytes = a.chunk_bytes;
    so.file_checksum = a.file_checksum;
    so.compress_threads = a.compress_threads;
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
    const double secs = Since(t0);
    if (!results[0].ok()) Die("save: " + results[0].ToString());
    const uint64_t file_bytes = DirBytes(a.root + "/" + meta.tag);
    reps.push_back({{"seconds", secs}, {"file_bytes", file_bytes}});
    prev_tag = meta.tag;
  }
  json out = {{"op", "save"},
              {"ranks", a.ranks},
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
  // Destination buffers, allocated and touched untimed.
  std::vector<std::vector<std::vector<uint8_t>>> bufs(static_cast<size_t>(world));
  uint64_t logical = 0;
  for (int r = 0; r < world; ++r)
    for (const auto& d : man.files[static_cast<size_t>(r)].datasets) {
      bufs[static_cast<size_t>(r)].emplace_back(d.bytes, uint8_t{1});
      logical += d.bytes;
    }
  const long rss_before = MaxRssKiB();
  json reps = json::array();
  std::string drop_status = a.drop ? "" : "not requested";
  for (int rep = 0; rep < a.reps; ++rep) {
    if (a.drop) drop_status = DropCaches();
    std::vector<ckpt::Status> results(static_cast<size_t>(world));
    const auto t0 = Clock::now();
    std::vector<std::thread> threads;
    for (int r = 0; r < world; ++r)
      threads.emplace_back([&, r] {
        ckpt::OpenOptions oo;
        oo.verify_checksums = a.verify;
        auto rd = ckpt::CheckpointReader::Open(a.root, "", oo);
        if (!rd.ok()) { results[static_cast<size_t>(r)] = rd.status(); return; }
        const auto& ds = rd->manifest().files[static_cast<size_t>(r)].datasets;
        for (size_t i = 0; i < ds.size(); ++i) {
          auto& b = bufs[static_cast<size_t>(r)][i];
          ckpt::Status s = rd->ReadDataset(r, ds[i].name, b.data(), b.size());
          if (!s.ok()) { results[static_cast<size_t>(r)] = s; return; }
        }
      });
    for (auto& t : threads) t.join();
    const double secs = Since(t0);
    for (auto& s : results)
      if (!s.ok()) Die("load: " + s.ToString());
    reps.push_back({{"seconds", secs}});
  }
  json out = {{"op", "load"},       {"ranks", world},         {"verify", a.verify},
              {"logical_bytes", logical}, {"file_bytes", DirBytes(probe->dir())},
              {"reps", reps},       {"drop_caches", drop_status},
              {"maxrss_kib_before", rss_before}, {"maxrss_kib", MaxRssKiB()}};
  std::printf("%s\n", out.dump().c_str());
  return 0;
}

// ---------------------------------------------------------------------------------------------
// zstd study

void ByteShuffle(const uint8_t* in, uint8_t* out, size_t nbytes, size_t elem) {
  const size_t n = nbytes / elem;
  for (size_t j = 0; j < elem; ++j)
    for (size_t i = 0; i < n; ++i) out[j * n + i] = in[i * elem + j];
  std::memcpy(out + n * elem, in + n * elem, nbytes - n * elem);
}

json Study(const std::vector<uint8_t>& data, size_t elem, const Args& a) {
  json rows = json::array();
  const size_t chunk = static_cast<size_t>(a.chunk_bytes);
  std::vector<uint8_t> shuffled(data.size());
  for (size_t off = 0; off < data.size(); off += chunk) {
    const size_t n = std::min(chunk, data.size() - off);
    ByteShuffle(data.data() + off, shuffled.data() + off, n, elem);
  }
  std::vector<uint8_t> dst(ZSTD_compressBound(chunk)), back(chunk), unsh(chunk);
  for (int level : a.levels) {
    for (int sh = 0; sh < 2; ++sh) {
      const std::vector<uint8_t>& src = sh ? shuffled : data;
      ZSTD_CCtx* cctx = ZSTD_createCCtx();
      ZSTD_DCtx* dctx = ZSTD_createDCtx();
      uint64_t comp_bytes = 0;
      double ct = 0, dt = 0;
      for (size_t off = 0; off < src.size(); off += chunk) {
        const size_t n = std::min(chunk, src.size() - off);
        auto t0 = Clock::now();
        size_t got = ZSTD_compressCCtx(cctx, dst.data(), dst.size(), src.data() + off, n, level);
        if (sh) ByteShuffle(src.data() + off, unsh.data(), n, elem);  // the shuffle's own cost
        ct += Since(t0);
        if (ZSTD_isError(got)) Die(std::string("zstd: ") + ZSTD_getErrorName(got));
        comp_bytes += got;
        t0 = Clock::now();
        size_t dn = ZSTD_decompressDCtx(dctx, back.data(), n, dst.data(), got);
        if (sh && n % elem == 0) ByteShuffle(back.data(), unsh.data(), n, n / elem);  // unshuffle
        dt += Since(t0);
        if (ZSTD_isError(dn) || dn != n ||
            std::memcmp(back.data(), src.data() + off, n) != 0)
          Die("zstd round trip failed");
      }
      ZSTD_freeCCtx(cctx);
      ZSTD_freeDCtx(dctx);
      const double mib = static_cast<double>(src.size()) / 1048576.0;
      rows.push_back({{"level", level},
                      {"shuffle", sh == 1},
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

}  // namespace

int main(int argc, char** argv) {
  const Args a = Parse(argc, argv);
  if (a.op == "save") return Save(a);
  if (a.op == "load") return Load(a);
  if (a.op == "zstd") return Zstd(a);
  Die("op must be save, load or zstd");
}
