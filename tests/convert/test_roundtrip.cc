// Round trips N -> universal -> M -> universal -> N are bitwise identical, the universal
// checkpoint holds exactly the values the synthetic generator wrote, and each resharded rank
// reads only what it owns.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cstdio>
#include <cstring>

#include "ckpt/load_resharded.h"
#include "ckpt/hash.h"
#include "ckpt/reader.h"
#include "convert/reshard.h"
#include "convert/universal.h"
#include "convert_test_util.h"
#include "test_util.h"

using namespace ckpt;
using namespace ckpt::convert;

namespace {

// Every dataset of two universal checkpoints except the per-source-rank provenance, which
// legitimately differs when the intermediate world size differs.
void CompareUniversal(const std::string& a_dir, const std::string& b_dir) {
  auto a = UniversalReader::Open(a_dir);
  auto b = UniversalReader::Open(b_dir);
  REQUIRE(a.ok());
  REQUIRE(b.ok());
  const Manifest& ma = a->manifest();
  const Manifest& mb = b->manifest();
  CHECK(ma.tag == mb.tag);
  CHECK(ma.counters.global_step == mb.counters.global_step);
  CHECK(ma.counters.micro_step == mb.counters.micro_step);
  CHECK(ma.counters.samples_seen == mb.counters.samples_seen);
  CHECK(ma.counters.tokens_seen == mb.counters.tokens_seen);
  CHECK(ma.optimizer == mb.optimizer);
  CHECK(ma.client_state == mb.client_state);
  REQUIRE(ma.params.size() == mb.params.size());
  for (size_t i = 0; i < ma.params.size(); ++i) {
    CHECK(ma.params[i].name == mb.params[i].name);
    CHECK(ma.params[i].shape == mb.params[i].shape);
    CHECK(ma.params[i].frozen == mb.params[i].frozen);
    CHECK(ma.params[i].tied_to == mb.params[i].tied_to);
  }
  int compared = 0;
  for (const auto& rec : ma.files[0].datasets) {
    if (rec.name.rfind("source/", 0) == 0) continue;
    const DatasetRecord* other = mb.FindDataset(0, rec.name);
    INFO(rec.name);
    REQUIRE(other != nullptr);
    CHECK(other->shape == rec.shape);
    CHECK(other->dtype == rec.dtype);
    auto x = a->ReadDatasetBytes(rec.name);
    auto y = b->ReadDatasetBytes(rec.name);
    REQUIRE(x.ok());
    REQUIRE(y.ok());
    CHECK(*x == *y);
    ++compared;
  }
  CHECK(compared > 3);
}

// The rank files of two sharded checkpoints with the same topology, dataset by dataset.
void CompareSharded(const std::string& a_root, const std::string& b_root, bool expect_rng) {
  auto a = CheckpointReader::Open(a_root);
  auto b = CheckpointReader::Open(b_root);
  REQUIRE(a.ok());
  REQUIRE(b.ok());
  const Manifest& ma = a->manifest();
  const Manifest& mb = b->manifest();
  REQUIRE(ma.topology.dp_world_size == mb.topology.dp_world_size);
  CHECK(ma.topology.zero_stage == mb.topology.zero_stage);
  CHECK(ma.partition.shard_numel == mb.partition.shard_numel);
  for (const auto& f : ma.files) {
    for (const auto& rec : f.datasets) {
      INFO("rank " << f.rank << " " << rec.name);
      const bool rng = rec.name.rfind("rng/", 0) == 0;
      const DatasetRecord* other = mb.FindDataset(f.rank, rec.name);
      if (rng && !expect_rng) {
        CHECK(other == nullptr);
        continue;
      }
      REQUIRE(other != nullptr);
      auto x = a->ReadDatasetBytes(f.rank, rec.name);
      auto y = b->ReadDatasetBytes(f.rank, rec.name);
      REQUIRE(x.ok());
      REQUIRE(y.ok());
      CHECK(*x == *y);
    }
  }
}

}  // namespace

TEST_CASE("universal holds the generator's exact values with shapes", "[io]") {
  testing::ScratchDir dir("rt");
  for (int zero : {1, 2, 3}) {
    const std::string src = dir / ("src" + std::to_string(zero));
    const std::string uni = dir / ("uni" + std::to_string(zero));
    REQUIRE(testing::MakeSynthetic(src, 3, zero).ok());
    auto rep = ConvertToUniversal(src, uni);
    REQUIRE(rep.ok());
    auto u = UniversalReader::Open(uni);
    REQUIRE(u.ok());
    const Manifest& m = u->manifest();
    CHECK(m.kind == "universal");
    CHECK(m.topology.dp_world_size == 3);
    CHECK(m.topology.zero_stage == zero);
    bool saw_frozen = false, saw_tied = false;
    for (size_t pi = 0; pi < m.params.size(); ++pi) {
      const ParamEntry& p = m.params[pi];
      CHECK(p.ranges.empty());
      if (!p.tied_to.empty()) {
        saw_tied = true;
        CHECK(m.FindDataset(0, UniversalParamGroup(p.name) + "/master") == nullptr);
        continue;
      }
      const DatasetRecord* rec = m.FindDataset(0, UniversalParamGroup(p.name) + "/master");
      REQUIRE(rec != nullptr);
      CHECK(rec->shape == p.shape);
      std::vector<float> got(static_cast<size_t>(p.numel));
      if (p.frozen) {
        saw_frozen = true;
        CHECK(rec->dtype == DType::kBF16);
        REQUIRE(u->ReadParamRange(p.name, "master", 0, p.numel, got.data()).ok());
        for (int64_t e = 0; e < p.numel; ++e)
          REQUIRE(got[e] == Bf16ToFloat(FloatToBf16(SynthValue(7, 100, pi, "frozen", e))));
        continue;
      }
      for (const char* state : {"master", "exp_avg", "exp_avg_sq"}) {
        REQUIRE(u->ReadParamRange(p.name, state, 0, p.numel, got.data()).ok());
        for (int64_t e = 0; e < p.numel; ++e) {
          const float want = SynthValue(7, 100, pi, state, e);
          REQUIRE(std::memcmp(&got[e], &want, 4) == 0);
        }
      }
      // A range that crosses rows of a 2-D parameter (several hyperslabs).
      if (p.shape.size() == 2 && p.numel > 200) {
        std::vector<float> part(150);
        REQUIRE(u->ReadParamRange(p.name, "exp_avg", 37, 187, part.data()).ok());
        for (int64_t e = 37; e < 187; ++e)
          CHECK(part[e - 37] == SynthValue(7, 100, pi, "exp_avg", e));
      }
    }
    CHECK(saw_frozen);
    CHECK(saw_tied);
    // Provenance: every source rank's RNG blob and data position.
    for (int r = 0; r < 3; ++r) {
      CHECK(m.FindDataset(0, UniversalSourceGroup(r) + "/rng/dropout") != nullptr);
      CHECK(m.FindDataset(0, UniversalSourceGroup(r) + "/data_position") != nullptr);
    }
    CHECK(m.FindDataset(0, "scheduler") != nullptr);
  }
}

// Issue 15: reshard reads and writes a new rank's state a window at a time (windows smaller
// and larger than the source's 256-byte pieces, so windows cut pieces and parameters). What
// it writes is what a whole-shard load returns, so the files are those the whole-shard
// writer gave (the writer's fill and data paths write the same bytes: test_commit.cc).
TEST_CASE("reshard writes each new rank window by window: the bytes LoadResharded loads", "[io]") {
  const std::string comp = GENERATE("none", "zstd:1+shuffle");
  testing::ScratchDir dir("win");
  const std::string src = dir / "src";
  REQUIRE(testing::MakeSynthetic(src, 3, 2).ok());
  auto source = CheckpointReader::Open(src);
  REQUIRE(source.ok());
  for (uint64_t window : {200, 1000}) {
    INFO(comp << ", windows of " << window << " bytes");
    ReshardOptions o;
    o.dp = 2;
    o.zero_stage = 3;
    o.compression = comp;
    o.piece_bytes = 256;
    o.window_bytes = window;
    const std::string out = dir / ("w" + std::to_string(window));
    auto r = Reshard(src, out, o);
    REQUIRE(r.ok());
    auto target = PlanReshard(source->manifest(), 2, 3);
    REQUIRE(target.ok());
    auto written = CheckpointReader::Open(out);
    REQUIRE(written.ok());
    for (int j = 0; j < 2; ++j) {
      const RankReadStats& s = r->ranks[static_cast<size_t>(j)];
      CHECK(s.windows > 3);
      CHECK(s.within_bound());
      auto loaded = LoadResharded(src, *target, j);
      REQUIRE(loaded.ok());
      for (auto [state, vec] : {std::pair{kMaster, &loaded->master},
                                std::pair{kExpAvg, &loaded->exp_avg},
                                std::pair{kExpAvgSq, &loaded->exp_avg_sq}}) {
        auto bytes = written->ReadDatasetBytes(j, state);
        REQUIRE(bytes.ok());
        REQUIRE(bytes->size() == vec->size() * 4);
        CHECK(std::memcmp(bytes->data(), vec->data(), bytes->size()) == 0);
        const DatasetRecord* rec = written->manifest().FindDataset(j, state);
        REQUIRE(rec != nullptr);
        CHECK(rec->xxh3 == DigestHex(Xxh3(vec->data(), vec->size() * 4)));
      }
    }
    auto probs = CheckCheckpoint(written->dir(), /*deep=*/true);
    REQUIRE(probs.ok());
    CHECK(probs->empty());
  }
}

TEST_CASE("N -> universal -> M -> universal -> N is bitwise identical", "[io][slow]") {
  int combos = 0;
  double max_ratio = 0;
  for (int zero : {1, 2, 3}) {
    for (int n = 1; n <= 4; ++n) {
      testing::ScratchDir dir("rt");
      const std::string src = dir / "src";
      REQUIRE(testing::MakeSynthetic(src, n, zero).ok());
      const std::string u1 = dir / "u1";
      REQUIRE(ConvertToUniversal(src, u1).ok());
      for (int m = 1; m <= 4; ++m) {
        INFO("ZeRO-" << zero << " N=" << n << " M=" << m);
        const std::string sfx = std::to_string(m);
        ReshardOptions to_m;
        to_m.dp = m;
        to_m.piece_bytes = 256;
        auto r1 = Reshard(u1, dir / ("m" + sfx), to_m);
        REQUIRE(r1.ok());
        CHECK(r1->zero_stage == zero);
        CHECK(r1->rng_copied == (m == n));
        for (const auto& s : r1->ranks) {
          CHECK(s.bytes_owned > 0);
          CHECK(s.within_bound());
          max_ratio = std::max(max_ratio, s.ratio());
        }
        REQUIRE(ConvertToUniversal(dir / ("m" + sfx), dir / ("u2_" + sfx)).ok());
        CompareUniversal(u1, dir / ("u2_" + sfx));
        ReshardOptions to_n;
        to_n.dp = n;
        to_n.piece_bytes = 256;
        auto r2 = Reshard(dir / ("u2_" + sfx), dir / ("n" + sfx), to_n);
        REQUIRE(r2.ok());
        CompareSharded(src, dir / ("n" + sfx), /*expect_rng=*/m == n);
        // Straight sharded -> sharded as well.
        auto direct = Reshard(dir / ("m" + sfx), dir / ("d" + sfx), to_n);
        REQUIRE(direct.ok());
        for (const auto& s : direct->ranks) CHECK(s.within_bound());
        max_ratio = std::max(max_ratio, direct->max_ratio());
        CompareSharded(src, dir / ("d" + sfx), /*expect_rng=*/m == n);
        ++combos;
      }
    }
  }
  CHECK(combos == 48);
  std::printf("48 round trips; largest bytes read / bytes owned of any new rank: %.6f\n",
              max_ratio);
}

TEST_CASE("reshard changes the ZeRO stage and updates topology and engine_config", "[io]") {
  testing::ScratchDir dir("rt");
  const std::string src = dir / "src";
  REQUIRE(testing::MakeSynthetic(src, 2, 1, 5000, 1100, "zstd:3").ok());
  ReshardOptions o;
  o.dp = 3;
  o.zero_stage = 3;
  auto r = Reshard(src, dir / "out", o);
  REQUIRE(r.ok());
  auto rd = CheckpointReader::Open(dir / "out");
  REQUIRE(rd.ok());
  const Manifest& m = rd->manifest();
  CHECK(m.kind == "sharded");
  CHECK(m.topology.dp_world_size == 3);
  CHECK(m.topology.zero_stage == 3);
  CHECK(m.partition.scheme == "per_param");
  CHECK(m.files[0].compression == "zstd:3");
  CHECK(!m.engine_config.contains("dp_world_size"));  // synth's engine_config has none
  auto note = rd->ReadJson(1, "reshard");
  REQUIRE(note.ok());
  CHECK((*note)["source_dp_world_size"] == 2);
  CHECK((*note)["rng"].get<std::string>().rfind("omitted", 0) == 0);
  CHECK(m.FindDataset(1, "rng/dropout") == nullptr);
  CHECK(m.FindDataset(2, "data_position") != nullptr);
  CHECK(m.FindDataset(0, "frozen/pos_table") != nullptr);
  auto problems = CheckCheckpoint(rd->dir(), /*deep=*/true);
  REQUIRE(problems.ok());
  CHECK(problems->empty());
  // Values survive a stage change: compare every parameter in full.
  auto a = CheckpointReader::Open(src);
  REQUIRE(a.ok());
  for (const auto& p : m.params) {
    for (const char* state : {"master", "exp_avg", "exp_avg_sq"}) {
      if (!p.trainable() && std::string(state) != "master") continue;
      auto x = a->ReadParamFull(p.name, state);
      auto y = rd->ReadParamFull(p.name, state);
      REQUIRE(x.ok());
      REQUIRE(y.ok());
      CHECK(*x == *y);
    }
  }
}

TEST_CASE("reshard updates an engine_min engine_config", "[io]") {
  testing::ScratchDir dir("rt");
  const std::string src = dir / "src";
  REQUIRE(testing::MakeSynthetic(src, 4, 2).ok());
  // Rewrite the manifest as engine_min would have saved it.
  const std::string mpath = dir / "src/global_step100/manifest.json";
  auto text = Env::Default()->ReadFileToString(mpath);
  REQUIRE(text.ok());
  auto j = nlohmann::json::parse(*text);
  j["engine_config"] = {{"zero", 2},       {"dp_world_size", 4}, {"micro_batch", 2},
                        {"grad_accum", 1}, {"global_batch", 8},  {"seed", 5}};
  REQUIRE(testing::RewriteManifest(mpath, j).ok());
  ReshardOptions o;
  o.dp = 2;
  REQUIRE(Reshard(src, dir / "out", o).ok());
  auto rd = CheckpointReader::Open(dir / "out");
  REQUIRE(rd.ok());
  const auto& ec = rd->manifest().engine_config;
  CHECK(ec["dp_world_size"] == 2);
  CHECK(ec["zero"] == 2);
  CHECK(ec["grad_accum"] == 2);
  CHECK(ec["global_batch"] == 8);
  CHECK(ec["seed"] == 5);
}

// Issue 15: `reshard --no-verify` copied corrupt source bytes and wrote a checkpoint whose own
// checksums were computed over them, so `check --deep` on the output said ok.
TEST_CASE("reshard --no-verify still verifies every piece it copies", "[io]") {
  testing::ScratchDir dir("rt-noverify");
  const std::string src = dir / "src";
  REQUIRE(testing::MakeSynthetic(src, 2, 1).ok());
  auto rd = CheckpointReader::Open(src);
  REQUIRE(rd.ok());
  const std::string tag_dir = rd->dir();
  // Flip a byte of rank 1's exp_avg on disk: find 32 of its bytes in the (uncompressed) file.
  auto bytes = rd->ReadDatasetBytes(1, "exp_avg");
  REQUIRE(bytes.ok());
  REQUIRE(bytes->size() > 1100);
  const std::string needle(reinterpret_cast<const char*>(bytes->data()) + 1000, 32);
  REQUIRE(testing::FlipByteAfter(tag_dir + "/rank_00001.h5", needle, 3, 0x08) == 1);
  for (int dp : {1, 3}) {
    INFO("--dp " << dp);
    ReshardOptions o;
    o.dp = dp;
    o.verify_source = false;
    const std::string out = dir / ("out" + std::to_string(dp));
    auto r = Reshard(src, out, o);
    REQUIRE(!r.ok());
    INFO(r.status().ToString());
    CHECK(r.status().code() == StatusCode::kDataLoss);
    CHECK(r.status().message().find("rank_00001.h5: dataset /exp_avg: checksum mismatch in piece " +
                                    std::to_string(1000 / 256) + " of") != std::string::npos);
    CHECK(testing::EmptyOrMissing(out));
  }
  // The CLI: exit 1 (corruption found), nothing written.
  const std::string out = dir / "cli";
  CHECK(testing::RunShell(testing::BinDir() + "/ckpt reshard " + src + " " + out +
                          " --dp 3 --no-verify --json > " + (dir / "cli.json") + " 2>&1") == 1);
  CHECK(testing::EmptyOrMissing(out));
}

TEST_CASE("reshard warns before writing when the resumed run cannot keep its micro-batch", "[io]") {
  testing::ScratchDir dir("rt-warn");
  const std::string src = dir / "src";
  REQUIRE(testing::MakeSynthetic(src, 2, 1).ok());
  auto rd = CheckpointReader::Open(src);
  REQUIRE(rd.ok());
  nlohmann::json j = ManifestToJson(rd->manifest());
  j["engine_config"] = {{"global_batch", 12}, {"micro_batch", 2}, {"grad_accum", 3},
                        {"dp_world_size", 2}, {"zero", 1}};
  REQUIRE(testing::RewriteManifest(rd->dir() + "/manifest.json", j).ok());
  std::vector<std::string> warned;
  ReshardOptions o;
  o.dp = 4;
  o.zero_stage = 0;
  o.on_warning = [&](const std::string& w) {
    // Called before anything is written.
    CHECK(testing::EmptyOrMissing(dir / "out"));
    warned.push_back(w);
  };
  auto r = Reshard(src, dir / "out", o);
  REQUIRE(r.ok());
  CHECK(r->warnings == warned);
  REQUIRE(warned.size() == 2);
  CHECK(warned[0].find("micro-batch 2 x 4 ranks does not divide the global batch 12") !=
        std::string::npos);
  CHECK(warned[1].find("ZeRO-0 on 4 ranks") != std::string::npos);
  o.dp = 2;
  o.zero_stage = 3;
  o.on_warning = nullptr;
  auto quiet = Reshard(src, dir / "out2", o);
  REQUIRE(quiet.ok());
  CHECK(quiet->warnings.empty());
  // An indivisible global batch is refused, as before.
  o.dp = 5;
  CHECK(Reshard(src, dir / "out5", o).status().code() == StatusCode::kInvalidArgument);
}
