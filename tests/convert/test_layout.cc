// The universal layout on awkward parameter tables: 3-D and scalar shapes (flat ranges become
// unions of hyperslabs), names with '/' and '%', an fp16 frozen table, ZeRO-0.
#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <functional>
#include <mutex>
#include <thread>

#include "ckpt/env.h"
#include "ckpt/reader.h"
#include "ckpt/root.h"
#include "ckpt/state_source.h"
#include "ckpt/writer.h"
#include "convert/export.h"
#include "convert/reshard.h"
#include "convert/universal.h"
#include "convert_test_util.h"
#include "safetensors/safetensors.h"
#include "test_util.h"

using namespace ckpt;
using namespace ckpt::convert;
using namespace ckpt::safetensors;

namespace {

float Value(size_t param, int state, int64_t e) {
  return static_cast<float>(param * 1000 + e) * (state == 0   ? 1.0f
                                                 : state == 1 ? 0.5f
                                                              : 0.25f) +
         0.125f;
}

std::vector<ParamEntry> Table() {
  auto p = [](std::string name, std::vector<int64_t> shape) {
    ParamEntry e;
    e.name = std::move(name);
    e.shape = std::move(shape);
    e.numel = 1;
    for (int64_t d : e.shape) e.numel *= d;
    return e;
  };
  std::vector<ParamEntry> t = {p("layers/0%attn.w", {3, 5, 7}), p("scale", {}), p("bias", {1}),
                               p("proj.w", {4, 33})};
  ParamEntry frozen = p("rope/table", {6, 4});
  frozen.frozen = true;
  frozen.dtype = DType::kF16;
  t.push_back(frozen);
  ParamEntry tied = p("proj_out.w", {4, 33});
  tied.tied_to = "proj.w";
  t.push_back(tied);
  return t;
}

Status WriteCheckpoint(const std::string& root, int world, int zero) {
  Manifest meta;
  meta.tag = "global_step5";
  meta.counters.global_step = 5;
  meta.topology.dp_world_size = world;
  meta.topology.zero_stage = zero;
  meta.params = Table();
  CKPT_ASSIGN_OR_RETURN(meta.partition, BuildPartition(meta.params, world, zero), "");
  ThreadGroup group(world);
  std::vector<Status> st(static_cast<size_t>(world));
  std::vector<uint16_t> frozen(24);
  for (int e = 0; e < 24; ++e) frozen[e] = FloatToFp16(0.25f * static_cast<float>(e) - 1.0f);
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      const size_t n = static_cast<size_t>(meta.partition.shard_numel[static_cast<size_t>(r)]);
      std::vector<float> s[3] = {std::vector<float>(n), std::vector<float>(n),
                                 std::vector<float>(n)};
      for (size_t pi = 0; pi < meta.params.size(); ++pi)
        for (const auto& rg : meta.params[pi].ranges)
          if (rg.rank == r)
            for (int k = 0; k < 3; ++k)
              for (int64_t e = rg.begin; e < rg.end; ++e)
                s[k][static_cast<size_t>(rg.shard_offset + e - rg.begin)] = Value(pi, k, e);
      RankContents c;
      const std::vector<int64_t> shape = {static_cast<int64_t>(n)};
      c.datasets.push_back(DatasetSpec::Tensor("master", DType::kF32, shape, s[0].data()));
      c.datasets.push_back(DatasetSpec::Tensor("exp_avg", DType::kF32, shape, s[1].data()));
      c.datasets.push_back(DatasetSpec::Tensor("exp_avg_sq", DType::kF32, shape, s[2].data()));
      if (r == 0)
        c.datasets.push_back(
            DatasetSpec::Tensor("frozen/rope/table", DType::kF16, {6, 4}, frozen.data()));
      const std::string pos = R"({"epoch": 0, "sample_offset": 40})";
      c.datasets.push_back(DatasetSpec::Json("data_position", pos));
      c.datasets.push_back(DatasetSpec::Json("scheduler", R"({"step": 5})"));
      const std::string rng = "rng-state-of-rank-" + std::to_string(r);
      c.datasets.push_back(DatasetSpec::Blob("rng/dropout", "test", rng));
      st[static_cast<size_t>(r)] = SaveCheckpoint(root, meta, c, group.ForRank(r));
    });
  }
  for (auto& t : threads) t.join();
  for (const auto& s : st) CKPT_RETURN_IF_ERROR(s, "save");
  return Status::Ok();
}

}  // namespace

TEST_CASE("universal and reshard handle N-d, scalar, escaped names, fp16 frozen", "[io]") {
  for (int zero : {0, 1, 3}) {
    testing::ScratchDir dir("layout");
    INFO("ZeRO-" << zero);
    REQUIRE(WriteCheckpoint(dir / "src", 2, zero).ok());
    auto u = ConvertToUniversal(dir / "src", dir / "uni");
    REQUIRE(u.ok());
    auto ur = UniversalReader::Open(dir / "uni");
    REQUIRE(ur.ok());
    const Manifest& m = ur->manifest();
    const DatasetRecord* rec = m.FindDataset(0, "params/layers%2F0%25attn.w/exp_avg");
    REQUIRE(rec != nullptr);
    CHECK(rec->shape == std::vector<int64_t>{3, 5, 7});
    const DatasetRecord* scalar = m.FindDataset(0, "params/scale/master");
    REQUIRE(scalar != nullptr);
    CHECK(scalar->shape.empty());
    const DatasetRecord* fr = m.FindDataset(0, "params/rope%2Ftable/master");
    REQUIRE(fr != nullptr);
    CHECK(fr->dtype == DType::kF16);
    // Every sub-range of the 3-D parameter, so the hyperslab unions cover all alignments.
    for (int64_t b = 0; b < 105; b += 4) {
      for (int64_t e = b + 1; e <= 105; e += 9) {
        std::vector<float> got(static_cast<size_t>(e - b));
        REQUIRE(ur->ReadParamRange("layers/0%attn.w", "exp_avg_sq", b, e, got.data()).ok());
        for (int64_t i = b; i < e; ++i) REQUIRE(got[static_cast<size_t>(i - b)] == Value(0, 2, i));
      }
    }
    float s = 0;
    REQUIRE(ur->ReadParamRange("scale", "master", 0, 1, &s).ok());
    CHECK(s == Value(1, 0, 0));
    std::vector<float> t(24);
    REQUIRE(ur->ReadParamRange("rope/table", "master", 0, 24, t.data()).ok());
    CHECK(t[5] == 0.25f);
    CHECK(ur->ReadParamRange("rope/table", "exp_avg", 0, 24, t.data()).code() ==
          StatusCode::kInvalidArgument);
    CHECK(ur->ReadParamRange("scale", "master", 0, 2, &s).code() == StatusCode::kInvalidArgument);

    for (int target_zero : {0, 2, 3}) {
      ReshardOptions o;
      o.dp = 3;
      o.zero_stage = target_zero;
      const std::string out = dir / ("r" + std::to_string(target_zero));
      auto r = Reshard(dir / "uni", out, o);
      REQUIRE(r.ok());
      auto a = CheckpointReader::Open(dir / "src");
      auto b = CheckpointReader::Open(out);
      REQUIRE(a.ok());
      REQUIRE(b.ok());
      for (const auto& p : a->manifest().params) {
        for (const char* state : {"master", "exp_avg", "exp_avg_sq"}) {
          if (!p.trainable() && std::string(state) != "master") continue;
          auto x = a->ReadParamFull(p.name, state);
          auto y = b->ReadParamFull(p.name, state);
          REQUIRE(x.ok());
          REQUIRE(y.ok());
          CHECK(*x == *y);
        }
      }
      auto fa = a->ReadDatasetBytes(0, "frozen/rope/table");
      auto fb = b->ReadDatasetBytes(0, "frozen/rope/table");
      REQUIRE(fa.ok());
      REQUIRE(fb.ok());
      CHECK(*fa == *fb);
      for (const auto& s : r->ranks) CHECK(s.within_bound());
    }

    auto ex = ExportFp32(dir / "src", dir / "exp");
    REQUIRE(ex.ok());
    auto h = ReadSafetensorsHeader(dir / "exp/model.safetensors");
    REQUIRE(h.ok());
    REQUIRE(h->Find("layers/0%attn.w") != nullptr);
    CHECK(h->Find("layers/0%attn.w")->shape == std::vector<int64_t>{3, 5, 7});
    REQUIRE(h->Find("scale") != nullptr);
    CHECK(h->Find("scale")->shape.empty());
    auto v = ReadSafetensorsTensorF32(dir / "exp/model.safetensors", *h, "rope/table");
    REQUIRE(v.ok());
    CHECK((*v)[7] == 0.75f);
    CHECK(h->metadata.at("tied_weights") == R"({"proj_out.w":"proj.w"})");
  }
}

// ckpt/state_source.h: a sharded checkpoint and its universal copy read alike through the one
// interface (kind decided by OpenStateSource, aliases, frozen conversion, hyper-parameters, the
// same errors), and Verify's shares together check every dataset.
TEST_CASE("one StateSource interface over a sharded checkpoint and its universal copy", "[io]") {
  testing::ScratchDir dir("source");
  REQUIRE(WriteCheckpoint(dir / "src", 3, 3).ok());
  REQUIRE(ConvertToUniversal(dir / "src", dir / "uni").ok());
  auto s = OpenStateSource(dir / "src");
  auto u = OpenStateSource(dir / "uni");
  REQUIRE(s.ok());
  REQUIRE(u.ok());
  CHECK((*s)->kind() == SourceKind::kSharded);
  CHECK((*u)->kind() == SourceKind::kUniversal);
  CHECK((*s)->deepspeed() == nullptr);
  CHECK((*u)->source_ranks() == 3);
  for (StateSource* src : {s->get(), u->get()}) {
    INFO(SourceKindName(src->kind()));
    std::vector<float> got(132);
    REQUIRE(src->ReadParamRange("proj_out.w", "exp_avg", 0, 132, got.data()).ok());
    CHECK(got[131] == Value(3, 1, 131));  // the alias reads its owner, proj.w
    REQUIRE(src->ReadParamRange("rope/table", "master", 4, 8, got.data()).ok());
    CHECK(got[1] == 0.25f);  // fp16 frozen, converted
    // A frozen parameter's stored bytes into the caller's memory: ReadFrozenBytes' bytes; a
    // buffer of another size is refused, nothing crashes.
    auto stored = src->ReadFrozenBytes("rope/table");
    REQUIRE(stored.ok());
    std::vector<uint8_t> into(stored->size(), 0xee);
    REQUIRE(src->ReadFrozenInto("rope/table", into.data(), into.size()).ok());
    CHECK(into == *stored);
    CHECK_FALSE(src->ReadFrozenInto("rope/table", into.data(), into.size() - 2).ok());
    CHECK_FALSE(src->ReadFrozenInto("bias", into.data(), into.size()).ok());  // not frozen
    CHECK(src->ReadParamRange("rope/table", "exp_avg", 0, 1, got.data()).code() ==
          StatusCode::kInvalidArgument);
    CHECK(src->ReadParamRange("nope", "master", 0, 1, got.data()).code() ==
          StatusCode::kNotFound);
    CHECK(src->ReadParamRange("bias", "momentum", 0, 1, got.data()).code() ==
          StatusCode::kInvalidArgument);
    CHECK(src->ReadParamRange("bias", "master", 0, 2, got.data()).code() ==
          StatusCode::kInvalidArgument);
    std::string from;
    auto h = src->OptimizerHyper(&from);
    REQUIRE(h.ok());
    CHECK(h->step == 5);  // scheduler.step: the manifest records no optimizer step
    CHECK(from.find("scheduler.step") != std::string::npos);
  }

  // `ckpt check --deep` of the universal copy reads its file once: the file's digest and every
  // dataset's come from one scan (counted by the large-read statistics; HDF5's own reads and
  // the seal check's small reads are not).
  {
    const DirectReadStats before = GetDirectReadStats();
    auto checked = CheckSource(dir / "uni", "", /*deep=*/true);
    REQUIRE(checked.ok());
    CHECK(checked->problems.empty());
    const DirectReadStats after = GetDirectReadStats();
    CHECK((after.direct_bytes - before.direct_bytes) +
              (after.buffered_bytes - before.buffered_bytes) ==
          std::filesystem::file_size(dir / "uni/universal.h5"));
  }

  // Flip one byte of rank 2's exp_avg_sq values: exactly one of three shares finds it.
  const std::string rank2 = dir / "src/global_step5/rank_00002.h5";
  std::vector<float> first(2);
  {
    auto r = CheckpointReader::Open(dir / "src");
    REQUIRE(r.ok());
    REQUIRE(r->ReadSlice(2, "exp_avg_sq", 0, 2, first.data()).ok());
  }
  s->reset();
  std::string bytes = testing::Slurp(rank2);
  const auto at = bytes.find(std::string(reinterpret_cast<const char*>(first.data()), 8));
  REQUIRE(at != std::string::npos);
  bytes[at] ^= 0x01;
  testing::Spit(rank2, bytes);
  int failed = 0;
  for (int part = 0; part < 3; ++part) {
    auto src = OpenStateSource(dir / "src");
    REQUIRE(src.ok());
    Status st = (*src)->Verify({"master", "exp_avg", "exp_avg_sq"}, part, 3);
    if (!st.ok()) {
      ++failed;
      CHECK(st.code() == StatusCode::kDataLoss);
      CHECK(st.message().find("exp_avg_sq") != std::string::npos);
    }
  }
  CHECK(failed == 1);
}

// SourceOptions::defer_stream_hashes (export-fp32's reads): the hashing of ordered reads is left
// to HashReadBytes(), which another thread runs while the reads go on. The digests still cover
// every byte in order, the gaps between reads included (hashed from the file), and they are of
// the bytes where the caller holds them when HashReadBytes() runs: hence the caller's promise
// to keep them unchanged until then.
TEST_CASE("deferred stream hashes: on another thread, in order, gaps included", "[io]") {
  testing::ScratchDir dir("defer");
  REQUIRE(WriteCheckpoint(dir / "src", 3, 2).ok());
  SourceOptions so;
  so.stream_verify = true;
  so.defer_stream_hashes = true;
  // Every trainable parameter's master in table order, each in two halves, into memory kept
  // until verification; with skip_bias one parameter is left out (a gap in its rank's stream).
  auto read_all = [](StateSource& src, std::vector<std::vector<float>>& kept, bool skip_bias,
                     const std::function<void()>& after_read = nullptr) -> Status {
    kept.reserve(src.manifest().params.size() * 2);
    for (const auto& p : src.manifest().params) {
      if (!p.trainable() || (skip_bias && p.name == "bias")) continue;
      const int64_t mid = p.numel / 2;
      for (auto [b, e] : {std::pair<int64_t, int64_t>{0, mid}, {mid, p.numel}}) {
        if (b == e) continue;
        kept.emplace_back(static_cast<size_t>(e - b));
        CKPT_RETURN_IF_ERROR(src.ReadParamRange(p.name, "master", b, e, kept.back().data()), "");
        if (after_read) after_read();
      }
    }
    return Status::Ok();
  };
  // The other thread calls HashReadBytes() in a loop; after every second read this one waits
  // until it has begun a call since, so some reads are hashed there and others overlap it.
  auto read_hashing_aside = [&](StateSource& src) -> Status {
    std::atomic<bool> done{false};
    std::atomic<int> calls{0};
    std::thread hasher([&] {
      while (!done) {
        ++calls;
        src.HashReadBytes();
        std::this_thread::yield();
      }
    });
    std::vector<std::vector<float>> kept;
    int reads = 0;
    Status st = read_all(src, kept, /*skip_bias=*/true, [&] {
      if (++reads % 2 != 0) return;
      const int seen = calls;
      while (calls == seen) std::this_thread::yield();
    });
    done = true;
    hasher.join();
    CHECK(reads >= 4);
    CKPT_RETURN_IF_ERROR(st, "");
    return src.FinishVerification({"master"});
  };

  SECTION("another thread hashes while this one reads") {
    for (int round = 0; round < 20; ++round) {
      auto src = OpenStateSource(dir / "src", so);
      REQUIRE(src.ok());
      REQUIRE(read_hashing_aside(**src).ok());
    }
  }
  SECTION("the bytes are hashed where they lie when HashReadBytes runs") {
    for (bool defer : {true, false}) {
      INFO("defer_stream_hashes " << defer);
      SourceOptions o = so;
      o.defer_stream_hashes = defer;
      auto src = OpenStateSource(dir / "src", o);
      REQUIRE(src.ok());
      std::vector<std::vector<float>> kept;
      REQUIRE(read_all(**src, kept, /*skip_bias=*/false).ok());
      kept[0][0] += 1.0f;  // the caller breaks its promise: only a deferred hash sees it
      Status st = (*src)->FinishVerification({"master"});
      if (defer) {
        CHECK(st.code() == StatusCode::kDataLoss);
        CHECK(st.message().find("master") != std::string::npos);
      } else {
        CHECK(st.ok());
      }
    }
  }
  SECTION("a value flipped in a rank file is found") {
    const std::string rank1 = dir / "src/global_step5/rank_00001.h5";
    std::vector<float> first(2);
    {
      auto r = CheckpointReader::Open(dir / "src");
      REQUIRE(r.ok());
      REQUIRE(r->ReadSlice(1, "master", 0, 2, first.data()).ok());
    }
    std::string bytes = testing::Slurp(rank1);
    const auto at = bytes.find(std::string(reinterpret_cast<const char*>(first.data()), 8));
    REQUIRE(at != std::string::npos);
    bytes[at] ^= 0x01;
    testing::Spit(rank1, bytes);
    auto src = OpenStateSource(dir / "src", so);
    REQUIRE(src.ok());
    Status st = read_hashing_aside(**src);
    CHECK(st.code() == StatusCode::kDataLoss);
    CHECK(st.message().find("rank_00001.h5") != std::string::npos);
  }
}

// SourceOptions::open_ahead: the first read of a rank's file starts opening the next rank's on
// another thread (CheckpointReader::OpenAhead); the reads then find it open.
TEST_CASE("open_ahead opens the next rank's file on another thread", "[io]") {
  testing::ScratchDir dir("ahead");
  REQUIRE(WriteCheckpoint(dir / "src", 3, 2).ok());
  // Records which thread opened each rank file.
  class RecordingEnv : public EnvWrapper {
   public:
    RecordingEnv() : EnvWrapper(nullptr) {}
    Result<std::unique_ptr<RandomAccessFile>> NewCheckpointFile(const std::string& path) override {
      {
        std::lock_guard<std::mutex> lock(mu_);
        opened_.emplace_back(std::filesystem::path(path).filename().string(),
                             std::this_thread::get_id());
      }
      return EnvWrapper::NewCheckpointFile(path);
    }
    bool OpenedElsewhere(const std::string& name) {
      std::lock_guard<std::mutex> lock(mu_);
      for (const auto& [n, id] : opened_)
        if (n == name && id != std::this_thread::get_id()) return true;
      return false;
    }

   private:
    std::mutex mu_;
    std::vector<std::pair<std::string, std::thread::id>> opened_;
  };
  for (bool ahead : {true, false}) {
    INFO("open_ahead " << ahead);
    RecordingEnv env;
    SourceOptions so;
    so.env = &env;
    so.stream_verify = true;
    so.open_ahead = ahead;
    auto src = OpenStateSource(dir / "src", so);
    REQUIRE(src.ok());
    const Manifest& m = (*src)->manifest();
    for (int r = 0; r < 3; ++r) {
      // Rank r's share of every trainable parameter, in shard order.
      for (const auto& p : m.params) {
        if (!p.trainable()) continue;
        for (const auto& rg : p.ranges) {
          if (rg.rank != r) continue;
          std::vector<float> got(static_cast<size_t>(rg.end - rg.begin));
          REQUIRE((*src)->ReadParamRange(p.name, "master", rg.begin, rg.end, got.data()).ok());
          CHECK(got[0] == Value(static_cast<size_t>(&p - m.params.data()), 0, rg.begin));
        }
      }
      if (r == 2) break;
      const std::string next = RankFileName(r + 1);
      if (ahead) {
        for (int waited = 0; waited < 1000 && !env.OpenedElsewhere(next); ++waited)
          std::this_thread::sleep_for(std::chrono::milliseconds(10));
      }
      CHECK(env.OpenedElsewhere(next) == ahead);
    }
    CHECK((*src)->FinishVerification({"master"}).ok());
  }
}

// The same condition gets the same code in every reader: a tag or universal directory without
// manifest.json is NotFound (the CLI's exit 2: the input is not there), through either reader
// and the estimator's manifest read, with the same message.
TEST_CASE("a missing manifest is NotFound in every reader", "[io]") {
  testing::ScratchDir dir("no-manifest");
  REQUIRE(testing::MakeSynthetic(dir / "src", 2, 1).ok());
  REQUIRE(ConvertToUniversal(dir / "src", dir / "uni").ok());
  std::filesystem::remove(dir / "src/global_step100/manifest.json");
  std::filesystem::remove(dir / "uni/manifest.json");
  const std::string want = "manifest.json is missing (not a committed checkpoint)";
  auto sharded = CheckpointReader::Open(dir / "src", "global_step100");
  REQUIRE_FALSE(sharded.ok());
  CHECK(sharded.status().code() == StatusCode::kNotFound);
  CHECK(sharded.status().message().find(want) != std::string::npos);
  auto universal = UniversalReader::Open(dir / "uni");
  REQUIRE_FALSE(universal.ok());
  CHECK(universal.status().code() == StatusCode::kNotFound);
  CHECK(universal.status().message().find(want) != std::string::npos);
  auto manifest = ReadTagManifest(dir / "src/global_step100");
  CHECK(manifest.status().code() == StatusCode::kNotFound);
  const testing::CliResult cli = testing::RunCkpt("check " + dir / "src" + " --tag global_step100");
  CHECK(cli.rc == 2);
  CHECK(cli.err.find("global_step100") != std::string::npos);
  CHECK(cli.err.find("manifest.json") != std::string::npos);
}
