// The commit protocol under injected faults, power loss, concurrent savers and retention.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <thread>
#include <tuple>
#include <vector>

#include "ckpt/reader.h"
#include "ckpt/root.h"
#include "ckpt/save_ranks.h"
#include "ckpt_test_helpers.h"
#include "test_util.h"

using namespace ckpt;
using namespace ckpt::testing;
namespace fs = std::filesystem;

namespace {

// Everything a reader sees in a tag, as bytes, for bitwise comparisons.
std::map<std::string, std::vector<uint8_t>> Snapshot(const std::string& root) {
  std::map<std::string, std::vector<uint8_t>> out;
  auto r = CheckpointReader::Open(root);
  REQUIRE(r.ok());
  for (const auto& f : r->manifest().files)
    for (const auto& d : f.datasets)
      out[std::to_string(f.rank) + "/" + d.name] = r->ReadDatasetBytes(f.rank, d.name).value();
  out["manifest"] = {r->tag().begin(), r->tag().end()};
  return out;
}

}  // namespace

TEST_CASE("a fault at any step of the commit leaves the previous checkpoint intact", "[io]") {
  const int world = 2;
  // Count the steps of one clean save.
  int total = 0;
  {
    ScratchDir d;
    REQUIRE(SaveWithThreads(d.str(), SmallModel("global_step1", world, 2)).ok());
    FaultInjectionEnv env(Env::Default());
    SaveOptions o;
    o.env = &env;
    REQUIRE(SaveWithThreads(d.str(), SmallModel("global_step2", world, 2), o).ok());
    total = env.Count(FaultInjectionEnv::Op::kAny);
  }
  REQUIRE(total >= 10);  // mkdir, syncs, two rank files, manifest, renames, latest
  const bool power_loss = GENERATE(false, true);
  for (int n = 1; n <= total; ++n) {
    DYNAMIC_SECTION("fail step " << n << (power_loss ? " + power loss" : "")) {
      ScratchDir d;
      REQUIRE(SaveWithThreads(d.str(), SmallModel("global_step1", world, 2)).ok());
      const auto before = Snapshot(d.str());
      FaultInjectionEnv env(Env::Default());
      env.FailAt(FaultInjectionEnv::Op::kAny, n);
      SaveOptions o;
      o.env = &env;
      Status s = SaveWithThreads(d.str(), SmallModel("global_step2", world, 2), o, 1);
      INFO("step " << n << ": " << env.failed_step() << " -> " << s.ToString());
      if (!s.ok()) {
        CHECK_FALSE(env.failed_step().empty());
        // The error names the failed step.
        CHECK_THAT(s.message(), Catch::Contains(env.failed_step()));
      }
      if (power_loss) REQUIRE(env.DropUnsyncedData().ok());
      // `latest` always names a loadable, healthy checkpoint.
      auto latest = ReadLatest(d.str());
      REQUIRE(latest.ok());
      auto probs = CheckCheckpoint(d / *latest, true);
      REQUIRE(probs.ok());
      CHECK(probs->empty());
      if (*latest == "global_step1") {
        CHECK(Snapshot(d.str()) == before);
      } else {
        // `latest` moved only because the new tag was fully committed before it.
        CHECK(*latest == "global_step2");
        CHECK(fs::exists(d / "global_step2/manifest.json"));
      }
      // No temporary directory is ever listed as a tag; gc cleans them up.
      auto listing = ListRoot(d.str());
      REQUIRE(listing.ok());
      for (const auto& t : listing->tags) CHECK(t.tag.rfind(".tmp", 0) != 0);
      REQUIRE(CollectGarbage(d.str(), 0).ok());
      CHECK(ListRoot(d.str())->temporary.empty());
    }
  }
}

TEST_CASE("a first save that fails after committing its tag still resumes from it", "[io]") {
  // Count the first save's steps, then fail each step from the tag's rename on: the tag is
  // committed but `latest` may not exist. Readers infer the newest committed tag; gc writes
  // the pointer.
  int total = 0;
  {
    ScratchDir d;
    FaultInjectionEnv env(Env::Default());
    SaveOptions o;
    o.env = &env;
    REQUIRE(SaveWithThreads(d.str(), SmallModel("global_step1", 2, 2), o).ok());
    total = env.Count(FaultInjectionEnv::Op::kAny);
  }
  int inferred_cases = 0;
  for (int n = 1; n <= total; ++n) {
    ScratchDir d;
    FaultInjectionEnv env(Env::Default());
    env.FailAt(FaultInjectionEnv::Op::kAny, n);
    SaveOptions o;
    o.env = &env;
    Status s = SaveWithThreads(d.str(), SmallModel("global_step1", 2, 2), o);
    INFO("step " << n << ": " << env.failed_step() << " -> " << s.ToString());
    if (!fs::exists(d / "global_step1/manifest.json")) {
      CHECK_FALSE(s.ok());
      CHECK(ReadLatest(d.str()).status().code() == StatusCode::kNotFound);
      continue;
    }
    if (fs::exists(d / "latest")) continue;
    ++inferred_cases;
    bool inferred = false;
    auto latest = ReadLatest(d.str(), nullptr, &inferred);
    REQUIRE(latest.ok());
    CHECK(*latest == "global_step1");
    CHECK(inferred);
    auto listing = ListRoot(d.str());
    REQUIRE(listing.ok());
    CHECK(listing->latest == "global_step1");
    CHECK(listing->latest_inferred);
    CHECK(CheckpointReader::Open(d.str()).ok());
    auto gc = CollectGarbage(d.str(), 0);
    REQUIRE(gc.ok());
    CHECK(gc->restored_latest == "global_step1");
    CHECK(Slurp(d / "latest") == LatestFileText("global_step1", 12));
    CHECK_FALSE(ListRoot(d.str())->latest_inferred);
  }
  CHECK(inferred_cases >= 2);  // at least: the rename's fsync of ROOT, writing `latest`
}

TEST_CASE("a second saver on the same root gets a clear error", "[io]") {
  ScratchDir d;
  REQUIRE(SaveWithThreads(d.str(), SmallModel("global_step1", 2, 1)).ok());
  auto lock = RootLock::TryAcquire(d.str());
  REQUIRE(lock.ok());
  Status s = SaveWithThreads(d.str(), SmallModel("global_step2", 2, 1));
  CHECK(s.code() == StatusCode::kFailedPrecondition);
  CHECK_THAT(s.message(), Catch::Contains(".lock"));
  auto gc = CollectGarbage(d.str(), 0);
  CHECK(gc.status().code() == StatusCode::kFailedPrecondition);
  CHECK(*ReadLatest(d.str()) == "global_step1");
  CHECK_FALSE(fs::exists(d / "global_step2"));
}

TEST_CASE("an existing tag is never overwritten", "[io]") {
  ScratchDir d;
  REQUIRE(SaveWithThreads(d.str(), SmallModel("global_step1", 2, 3)).ok());
  const auto before = Snapshot(d.str());
  Status s = SaveWithThreads(d.str(), SmallModel("global_step1", 2, 3), {}, 5);
  CHECK(s.code() == StatusCode::kAlreadyExists);
  CHECK(Snapshot(d.str()) == before);
  CHECK(ListRoot(d.str())->temporary.empty());
}

TEST_CASE("a rank that fails its write aborts the commit on every rank", "[io]") {
  ScratchDir d;
  REQUIRE(SaveWithThreads(d.str(), SmallModel("global_step1", 3, 2)).ok());
  Manifest m = SmallModel("global_step2", 3, 2);
  ThreadGroup group(3);
  std::vector<RankBuffers> bufs(3);
  std::vector<Status> st(3);
  std::vector<std::thread> threads;
  for (int r = 0; r < 3; ++r) {
    threads.emplace_back([&, r] {
      FillRank(m, r, bufs[static_cast<size_t>(r)]);
      if (r == 2) bufs[2].contents.datasets[0].shape = {-1};  // rank 2 hands over bad input
      st[static_cast<size_t>(r)] = SaveCheckpoint(d.str(), m, bufs[static_cast<size_t>(r)].contents,
                                                  group.ForRank(r));
    });
  }
  for (auto& t : threads) t.join();
  for (const auto& s : st) {
    CHECK_FALSE(s.ok());
    CHECK_THAT(s.message(), Catch::Contains("rank 2"));
  }
  CHECK(*ReadLatest(d.str()) == "global_step1");
  CHECK_FALSE(fs::exists(d / "global_step2"));
  CHECK(ListRoot(d.str())->temporary.empty());
}

TEST_CASE("SaveRanks: one process writes every rank a few at a time, same checkpoint", "[io]") {
  const int world = 5;
  ScratchDir a, b;
  const Manifest m = SmallModel("global_step1", world, 2);
  REQUIRE(SaveWithThreads(a.str(), m).ok());
  std::mutex mu;
  int live = 0, most = 0;
  std::vector<int> order;
  Status s = SaveRanks(b.str(), m, 2, [&](int r, const WriteRankFn& write) -> Status {
    {
      std::lock_guard<std::mutex> l(mu);
      most = std::max(most, ++live);
      order.push_back(r);
    }
    Status st;
    {
      RankBuffers buf;  // the rank's contents exist only in here
      FillRank(m, r, buf);
      st = write(buf.contents);
    }
    std::lock_guard<std::mutex> l(mu);
    --live;
    return st;
  });
  REQUIRE(s.ok());
  CHECK(most <= 2);  // never more ranks in memory than threads
  std::sort(order.begin(), order.end());
  CHECK(order == std::vector<int>{0, 1, 2, 3, 4});
  CHECK(*ReadLatest(b.str()) == "global_step1");
  auto probs = CheckCheckpoint(b / "global_step1", true);
  REQUIRE(probs.ok());
  CHECK(probs->empty());
  auto sa = Snapshot(a.str()), sb = Snapshot(b.str());
  CHECK(sa == sb);
  CHECK(ListRoot(b.str())->temporary.empty());
}

TEST_CASE("SaveRanks: a failing rank commits nothing and stops the ranks not started", "[io]") {
  ScratchDir d;
  REQUIRE(SaveWithThreads(d.str(), SmallModel("global_step1", 4, 1)).ok());
  const Manifest m = SmallModel("global_step2", 4, 1);
  const bool in_write = GENERATE(false, true);
  std::vector<int> started;
  Status s = SaveRanks(d.str(), m, 1, [&](int r, const WriteRankFn& write) -> Status {
    started.push_back(r);
    RankBuffers buf;
    FillRank(m, r, buf);
    if (r == 1 && !in_write) return DataLoss("rank_00000.h5: piece 3 damaged");
    if (r == 1) buf.contents.datasets[0].shape = {-1};  // bad input: the write fails
    return write(buf.contents);
  });
  INFO(s.ToString());
  CHECK_FALSE(s.ok());
  CHECK(s.code() == (in_write ? StatusCode::kInvalidArgument : StatusCode::kDataLoss));
  if (in_write) CHECK_THAT(s.message(), Catch::Contains("rank 1"));
  CHECK(started == std::vector<int>{0, 1});
  CHECK(*ReadLatest(d.str()) == "global_step1");
  CHECK_FALSE(fs::exists(d / "global_step2"));
  CHECK(ListRoot(d.str())->temporary.empty());
  // The lock was released: the next save goes through.
  CHECK(SaveRanks(d.str(), m, 3, [&](int r, const WriteRankFn& write) {
          RankBuffers buf;
          FillRank(m, r, buf);
          return write(buf.contents);
        }).ok());
  // A producer that never writes its rank fails the save (Internal), nothing committed.
  Status none = SaveRanks(d.str(), SmallModel("global_step3", 2, 1), 2,
                          [](int, const WriteRankFn&) { return Status::Ok(); });
  CHECK(none.code() == StatusCode::kInternal);
  CHECK_FALSE(fs::exists(d / "global_step3"));
  CHECK(ListRoot(d.str())->temporary.empty());
}

// Issue 15: `ckpt reshard` writes a new rank's shard from DatasetSpec::fill, a window at a
// time. The files must be byte for byte those that `data` holding the same bytes writes
// (uncompressed: the windowed data pass; zstd: chunks asked for in order), and the fill is asked
// for every byte once, in order, in windows of at most kFillWindowBytes.
TEST_CASE("SaveRanks: fill datasets write the files that data writes, a window at a time",
          "[io]") {
  const Manifest m = SmallModel("global_step1", 2, 2);
  // A dataset of several windows, not a multiple of one, nor of a 4 MiB chunk.
  std::vector<float> big(5'000'003);
  for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<float>(i % 977) * 0.25f;
  for (const char* comp : {"none", "zstd:1+shuffle"}) {
    INFO(comp);
    SaveOptions o;
    o.compression = Compression::Parse(comp).value();
    o.piece_bytes = 1 << 20;
    ScratchDir a, b;
    // `filled` (rank 0's compute/big): once per window, on the thread that writes the file,
    // with the window's bytes still there (the next fill of its memory comes after).
    std::mutex mu;
    std::vector<std::tuple<const uint8_t*, uint64_t, size_t>> filled_windows;  // out, off, n
    size_t filled_calls = 0;
    auto save = [&](const std::string& root, bool fill, uint64_t* asked, size_t* windows) {
      return SaveRanks(root, m, 2, [&](int r, const WriteRankFn& write) -> Status {
        const std::thread::id writer = std::this_thread::get_id();
        RankBuffers buf;
        FillRank(m, r, buf);
        buf.contents.datasets.push_back(
            DatasetSpec::Tensor("compute/big", DType::kF32, {static_cast<int64_t>(big.size())},
                                big.data()));
        if (!fill) return write(buf.contents);
        uint64_t next = 0;  // the fill must be asked in order, every byte once
        Status order;
        for (DatasetSpec& d : buf.contents.datasets) {
          if (d.kind != "tensor" || d.name.rfind("frozen/", 0) == 0) continue;
          const auto* bytes = static_cast<const uint8_t*>(d.data);
          d = DatasetSpec::Filled(d.name, d.dtype, d.shape,
                                  [&, bytes, name = d.name](uint64_t off, size_t n, void* out) {
                                    if (name == "compute/big" && r == 0) {
                                      if (off != next || n > kFillWindowBytes || n % 4 != 0)
                                        order = Internal("window out of order");
                                      next = off + n;
                                      ++*windows;
                                      std::lock_guard<std::mutex> lock(mu);
                                      filled_windows.emplace_back(
                                          static_cast<const uint8_t*>(out), off, n);
                                    }
                                    // Uncompressed, the window starts where fill_place
                                    // asked (a compressed one's chunks ignore it).
                                    if (name == "compute/big" &&
                                        o.compression.kind == Compression::Kind::kNone &&
                                        reinterpret_cast<uintptr_t>(out) % 4096 !=
                                            (off / 4) % 1000 * 4)
                                      order = Internal("window not where fill_place asked");
                                    std::memcpy(out, bytes + off, n);
                                    return Status::Ok();
                                  });
          // A different place within a 4 KiB block for each window: the bytes written must not
          // change.
          d.fill_place = [](uint64_t off, size_t) -> std::optional<uint64_t> {
            return (off / 4) % 1000 * 4;
          };
          if (d.name == "compute/big" && r == 0)
            d.filled = [&, bytes, writer] {
              std::lock_guard<std::mutex> lock(mu);
              if (std::this_thread::get_id() != writer)
                order = Internal("filled called off the writing thread");
              if (filled_calls >= filled_windows.size()) {
                order = Internal("filled called before its window was filled");
                return;
              }
              const auto [out, off, n] = filled_windows[filled_calls++];
              if (std::memcmp(out, bytes + off, n) != 0)
                order = Internal("window refilled before filled was called");
            };
        }
        Status st = write(buf.contents);
        if (r == 0) *asked = next;
        return st.ok() ? order : st;
      }, o);
    };
    uint64_t asked = 0;
    size_t windows = 0;
    REQUIRE(save(a.str(), false, &asked, &windows).ok());
    REQUIRE(save(b.str(), true, &asked, &windows).ok());
    CHECK(asked == big.size() * 4);
    CHECK(windows >= 3);  // 20 MB in windows of at most 8 MiB
    CHECK(filled_calls == windows);
    auto ra = CheckpointReader::Open(a.str()), rb = CheckpointReader::Open(b.str());
    REQUIRE(ra.ok());
    REQUIRE(rb.ok());
    for (int r = 0; r < 2; ++r) {
      const std::string name = RankFileName(r);
      // The same layout and the same bytes in every data extent; the HDF5 metadata between
      // them differs only by the object headers' modification times (HDF5 records the second
      // each dataset was created: two saves of the same data are not byte-identical anyway).
      const FileRecord* fa = ra->manifest().FileForRank(r);
      const FileRecord* fb = rb->manifest().FileForRank(r);
      REQUIRE((fa && fb));
      CHECK(fa->bytes == fb->bytes);
      REQUIRE(fa->data_extents == fb->data_extents);
      const std::string fa_bytes = Slurp(a / ("global_step1/" + name));
      const std::string fb_bytes = Slurp(b / ("global_step1/" + name));
      for (const auto& [off, len] : fa->data_extents)
        CHECK(fa_bytes.compare(off, len, fb_bytes, off, len) == 0);
      REQUIRE(fa->datasets.size() == fb->datasets.size());
      for (size_t i = 0; i < fa->datasets.size(); ++i) {
        CHECK(fa->datasets[i].xxh3 == fb->datasets[i].xxh3);
        CHECK(fa->datasets[i].piece_xxh3 == fb->datasets[i].piece_xxh3);
      }
    }
    auto probs = CheckCheckpoint(b / "global_step1", true);
    REQUIRE(probs.ok());
    CHECK(probs->empty());
  }
  // A failing fill fails the save with its error, naming the dataset; nothing is committed.
  ScratchDir d;
  Status s = SaveRanks(d.str(), m, 1, [&](int r, const WriteRankFn& write) -> Status {
    RankBuffers buf;
    FillRank(m, r, buf);
    buf.contents.datasets[1] =
        DatasetSpec::Filled("exp_avg", DType::kF32, buf.contents.datasets[1].shape,
                            [](uint64_t, size_t, void*) { return DataLoss("piece 3 damaged"); });
    return write(buf.contents);
  });
  CHECK(s.code() == StatusCode::kDataLoss);
  CHECK_THAT(s.message(), Catch::Contains("dataset /exp_avg") && Catch::Contains("piece 3"));
  CHECK_FALSE(fs::exists(d / "global_step1"));
  CHECK(ListRoot(d.str())->temporary.empty());
}

TEST_CASE("keep_last deletes older tags only after a successful commit", "[io]") {
  ScratchDir d;
  SaveOptions o;
  o.keep_last = 2;
  for (int step = 1; step <= 4; ++step) {
    Manifest m = SmallModel("global_step" + std::to_string(step), 1, 0);
    m.counters.global_step = step;
    REQUIRE(SaveWithThreads(d.str(), m, o).ok());
  }
  auto listing = ListRoot(d.str());
  REQUIRE(listing->tags.size() == 2);
  CHECK(listing->tags[0].tag == "global_step3");
  CHECK(listing->tags[1].tag == "global_step4");
  CHECK(listing->tags[1].latest);
  // A failed save deletes nothing.
  FaultInjectionEnv env(Env::Default());
  env.FailAt(FaultInjectionEnv::Op::kRename, 2);  // the tag rename
  o.env = &env;
  Manifest m = SmallModel("global_step5", 1, 0);
  m.counters.global_step = 5;
  CHECK_FALSE(SaveWithThreads(d.str(), m, o).ok());
  CHECK(ListRoot(d.str())->tags.size() == 2);
  CHECK(*ReadLatest(d.str()) == "global_step4");
}

TEST_CASE("gc removes leftovers of crashed saves and applies retention", "[io]") {
  ScratchDir d;
  for (int step = 1; step <= 3; ++step) {
    Manifest m = SmallModel("global_step" + std::to_string(step), 1, 1);
    m.counters.global_step = step;
    REQUIRE(SaveWithThreads(d.str(), m).ok());
  }
  fs::create_directories(d / ".tmp-global_step4-deadbeef");
  Spit(d / ".tmp-global_step4-deadbeef/rank_00000.h5", "partial");
  Spit(d / "latest.tmp-123", "global_step4\n");
  auto listing = ListRoot(d.str());
  CHECK(listing->temporary.size() == 1);
  CHECK(listing->tags.size() == 3);
  auto gc = CollectGarbage(d.str(), 1);
  REQUIRE(gc.ok());
  CHECK(gc->removed_temporary.size() == 2);
  CHECK(gc->removed_tags == std::vector<std::string>{"global_step1", "global_step2"});
  CHECK(ListRoot(d.str())->tags.size() == 1);
  CHECK(*ReadLatest(d.str()) == "global_step3");
}

TEST_CASE("a reader never modifies the checkpoint", "[io]") {
  ScratchDir d;
  REQUIRE(SaveWithThreads(d.str(), SmallModel("global_step1", 2, 2)).ok());
  std::map<std::string, std::string> before;
  for (auto& e : fs::recursive_directory_iterator(d.path()))
    if (e.is_regular_file()) before[e.path().string()] = Slurp(e.path().string());
  (void)Snapshot(d.str());
  REQUIRE(CheckCheckpoint(d / "global_step1", true)->empty());
  std::map<std::string, std::string> after;
  for (auto& e : fs::recursive_directory_iterator(d.path()))
    if (e.is_regular_file()) after[e.path().string()] = Slurp(e.path().string());
  CHECK(before == after);
}
