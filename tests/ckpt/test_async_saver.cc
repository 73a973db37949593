// AsyncSaver: snapshot isolation, failures in the background write, flat memory over many saves,
// commit order, and the destructor finishing a save in flight.
#include <catch2/catch.hpp>

#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <future>
#include <mutex>

#include "ckpt/async_saver.h"
#include "ckpt/reader.h"
#include "ckpt/root.h"
#include "ckpt_test_helpers.h"
#include "test_util.h"

using namespace ckpt;
using namespace ckpt::testing;

namespace {

// Runs fn(rank) on `world` threads, one per rank, and joins them.
template <typename Fn>
void ForEachRank(int world, Fn fn) {
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) threads.emplace_back([&fn, r] { fn(r); });
  for (auto& t : threads) t.join();
}

// Catch2's assertions are not thread-safe: rank threads record failed expectations here and the
// test's thread reports them after the join.
struct RankLog {
  std::vector<std::string> failures;
  void Expect(bool ok, const std::string& what) {
    if (!ok) failures.push_back(what);
  }
};
#define RANK_EXPECT(log, cond) (log).Expect((cond), #cond " (line " + std::to_string(__LINE__) + ")")

void CheckLogs(const std::vector<RankLog>& logs) {
  for (size_t r = 0; r < logs.size(); ++r) {
    INFO("rank " << r);
    CHECK(logs[r].failures == std::vector<std::string>{});
  }
}

// Each dataset's bytes as the caller handed them to Save.
std::map<std::string, std::vector<uint8_t>> BytesOf(const RankContents& c) {
  std::map<std::string, std::vector<uint8_t>> out;
  for (const auto& d : c.datasets) {
    size_t n = DTypeSize(d.dtype);
    for (int64_t dim : d.shape) n *= static_cast<size_t>(dim);
    const auto* p = static_cast<const uint8_t*>(d.data);
    out[d.name] = std::vector<uint8_t>(p, p + n);
  }
  return out;
}

// Every dataset of rank `rank` in the committed tag, read back through the reader.
std::map<std::string, std::vector<uint8_t>> Committed(const std::string& root,
                                                      const std::string& tag, int rank) {
  std::map<std::string, std::vector<uint8_t>> out;
  auto r = CheckpointReader::Open(root, tag);
  REQUIRE(r.ok());
  for (const auto& f : r->manifest().files)
    if (f.rank == rank)
      for (const auto& d : f.datasets) out[d.name] = r->ReadDatasetBytes(rank, d.name).value();
  return out;
}

// Overwrites every byte the caller's contents point at.
void Scribble(RankBuffers& b) {
  for (auto& s : b.state) std::fill(s.begin(), s.end(), -7.5f);
  std::fill(b.frozen.begin(), b.frozen.end(), 1e30f);
  std::fill(b.rng.begin(), b.rng.end(), '#');
  std::fill(b.data_pos.begin(), b.data_pos.end(), '#');
  std::fill(b.sched.begin(), b.sched.end(), '#');
}

// Holds the background write of a rank file until the test opens the gate.
class GateEnv final : public EnvWrapper {
 public:
  GateEnv() : EnvWrapper(nullptr), opened_(gate_.get_future().share()) {}
  void Open() { gate_.set_value(); }
  Status BeginExternalWrite(const std::string& path) override {
    opened_.wait();
    return EnvWrapper::BeginExternalWrite(path);
  }

 private:
  std::promise<void> gate_;
  std::shared_future<void> opened_;
};

// A full disk as the background write sees it: fsync of a rank file fails with ENOSPC.
class DiskFullEnv final : public EnvWrapper {
 public:
  DiskFullEnv() : EnvWrapper(nullptr) {}
  Status SyncFile(const std::string& path) override {
    if (path.size() > 3 && path.compare(path.size() - 3, 3, ".h5") == 0)
      return PosixError("fsync " + path, ENOSPC);
    return EnvWrapper::SyncFile(path);
  }
};

// Records the order of the protocol's visible steps: a rank file begun, a tag committed.
class RecordingEnv final : public EnvWrapper {
 public:
  RecordingEnv() : EnvWrapper(nullptr) {}
  Status BeginExternalWrite(const std::string& path) override {
    Add("write " + std::filesystem::path(path).parent_path().filename().string());
    return EnvWrapper::BeginExternalWrite(path);
  }
  Status RenameFile(const std::string& from, const std::string& to) override {
    const std::string name = std::filesystem::path(to).filename().string();
    if (name.rfind("global_step", 0) == 0) Add("commit " + name);
    return EnvWrapper::RenameFile(from, to);
  }
  std::vector<std::string> events() {
    std::lock_guard<std::mutex> lock(mu_);
    return events_;
  }

 private:
  void Add(std::string e) {
    std::lock_guard<std::mutex> lock(mu_);
    events_.push_back(std::move(e));
  }
  std::mutex mu_;
  std::vector<std::string> events_;
};

uint64_t ResidentBytes() {
  std::ifstream statm("/proc/self/statm");
  uint64_t size = 0, resident = 0;
  statm >> size >> resident;
  return resident * static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
}

}  // namespace

TEST_CASE("async save: what commits is the state at the call, whatever the caller does next",
          "[io]") {
  ScratchDir d;
  const int world = 2;
  const Manifest m = SmallModel("global_step12", world, 2);
  ThreadGroup saver_group(world);
  std::vector<RankLog> logs(world);
  std::vector<std::map<std::string, std::vector<uint8_t>>> at_call(world);
  ForEachRank(world, [&](int r) {
    RankLog& log = logs[static_cast<size_t>(r)];
    RankBuffers b;
    FillRank(m, r, b);
    at_call[static_cast<size_t>(r)] = BytesOf(b.contents);
    GateEnv gate;
    SaveOptions o;
    o.env = &gate;
    AsyncSaver saver;
    Status s = saver.Save(d.str(), m, b.contents, saver_group.ForRank(r), o);
    log.Expect(s.ok(), "Save: " + s.ToString());
    // The background thread has not written a byte yet: every buffer changes first.
    Scribble(b);
    RANK_EXPECT(log, BytesOf(b.contents) != at_call[static_cast<size_t>(r)]);
    gate.Open();
    s = saver.Wait();
    log.Expect(s.ok(), "Wait: " + s.ToString());
    RANK_EXPECT(log, saver.stats().last_staged_bytes > 0);
  });
  CheckLogs(logs);
  CHECK(ReadLatest(d.str()).value() == "global_step12");
  for (int r = 0; r < world; ++r) CHECK(Committed(d.str(), "global_step12", r) == at_call[r]);
}

TEST_CASE("async save: a full disk in the background keeps the previous checkpoint and says so",
          "[io]") {
  ScratchDir d;
  const int world = 2;
  ThreadGroup saver_group(world);
  std::vector<RankLog> logs(world);
  std::vector<std::map<std::string, std::vector<uint8_t>>> step1(world);
  std::vector<std::string> wait_error(world), save_error(world);
  ForEachRank(world, [&](int r) {
    RankLog& log = logs[static_cast<size_t>(r)];
    AsyncSaver saver;
    Collective& comm = saver_group.ForRank(r);
    auto save = [&](int64_t step, Env* env) {
      Manifest m = SmallModel("global_step" + std::to_string(step), world, 2);
      RankBuffers b;
      FillRank(m, r, b, static_cast<int>(step));
      if (step == 1) step1[static_cast<size_t>(r)] = BytesOf(b.contents);
      SaveOptions o;
      o.env = env;
      return saver.Save(d.str(), m, b.contents, comm, o);  // b dies here: staged already
    };
    DiskFullEnv full;
    RANK_EXPECT(log, save(1, nullptr).ok());
    RANK_EXPECT(log, saver.Wait().ok());
    const int64_t allocations = saver.stats().staging_allocations;
    RANK_EXPECT(log, allocations == 1);

    // Reported by Wait(), naming the file and the cause.
    RANK_EXPECT(log, save(2, &full).ok());
    Status s = saver.Wait();
    RANK_EXPECT(log, s.code() == StatusCode::kResourceExhausted);
    wait_error[static_cast<size_t>(r)] = s.message();
    RANK_EXPECT(log, saver.Wait().ok());  // reported once

    // Reported by the next Save(), which then starts nothing; the one after goes through.
    RANK_EXPECT(log, save(3, &full).ok());
    s = save(4, nullptr);
    RANK_EXPECT(log, s.code() == StatusCode::kResourceExhausted);
    save_error[static_cast<size_t>(r)] = s.message();
    RANK_EXPECT(log, save(4, nullptr).ok());
    RANK_EXPECT(log, saver.Wait().ok());
    RANK_EXPECT(log, saver.stats().staging_allocations == allocations);  // the same memory
  });
  CheckLogs(logs);
  for (int r = 0; r < world; ++r) {
    CHECK_THAT(wait_error[r], Catch::Contains("global_step2") && Catch::Contains("rank_") &&
                                  Catch::Contains(".h5") && Catch::Contains(std::strerror(ENOSPC)));
    CHECK_THAT(save_error[r], Catch::StartsWith("previous async save: ") &&
                                  Catch::Contains("global_step3") && Catch::Contains(".h5") &&
                                  Catch::Contains(std::strerror(ENOSPC)));
  }
  auto listing = ListRoot(d.str());
  REQUIRE(listing.ok());
  std::vector<std::string> tags;
  for (const auto& t : listing->tags) tags.push_back(t.tag);
  CHECK(tags == std::vector<std::string>{"global_step1", "global_step4"});
  CHECK(listing->temporary.empty());
  CHECK(ReadLatest(d.str()).value() == "global_step4");
  for (int r = 0; r < world; ++r) CHECK(Committed(d.str(), "global_step1", r) == step1[r]);
}

TEST_CASE("async save: a failed save leaves the previous tag as latest and loadable", "[io]") {
  ScratchDir d;
  AsyncSaver saver;
  SingleCollective comm;
  Manifest m1 = SmallModel("global_step1", 1, 1);
  RankBuffers b1;
  FillRank(m1, 0, b1);
  REQUIRE(saver.Save(d.str(), m1, b1.contents, comm).ok());
  REQUIRE(saver.Wait().ok());
  // Fail the commit itself (the rename of the temporary directory to its tag).
  FaultInjectionEnv env(Env::Default());
  env.FailAt(FaultInjectionEnv::Op::kRename, 2);
  SaveOptions o;
  o.env = &env;
  Manifest m2 = SmallModel("global_step2", 1, 1);
  RankBuffers b2;
  FillRank(m2, 0, b2, 2);
  REQUIRE(saver.Save(d.str(), m2, b2.contents, comm, o).ok());
  Status s = saver.Wait();
  REQUIRE_FALSE(s.ok());
  CHECK_THAT(s.message(), Catch::Contains(env.failed_step()));
  CHECK(ReadLatest(d.str()).value() == "global_step1");
  CHECK(Committed(d.str(), "", 0) == BytesOf(b1.contents));
  CHECK(ListRoot(d.str())->temporary.empty());
}

TEST_CASE("async save: 200 saves keep the resident memory flat and the staging allocated once",
          "[io]") {
  ScratchDir d;
  AsyncSaver saver;
  SingleCollective comm;
  SaveOptions o;
  o.keep_last = 2;
  o.file_checksum = false;
  const int64_t n = 96 * 1024;  // 3 x 384 KiB of optimizer state per save
  std::vector<float> state[3];
  for (auto& s : state) s.assign(static_cast<size_t>(n), 0.5f);
  uint64_t warm = 0;
  for (int step = 1; step <= 200; ++step) {
    Manifest m;
    m.tag = "global_step" + std::to_string(step);
    m.counters.global_step = step;
    m.topology.dp_world_size = 1;
    m.topology.zero_stage = 1;
    ParamEntry p;
    p.name = "w";
    p.shape = {n};
    p.numel = n;
    m.params.push_back(p);
    m.partition = BuildPartition(m.params, 1, 1).value();
    RankContents c;
    const char* names[3] = {"master", "exp_avg", "exp_avg_sq"};
    for (int s = 0; s < 3; ++s) {
      state[s][static_cast<size_t>(step % n)] = static_cast<float>(step);
      c.datasets.push_back(DatasetSpec::Tensor(names[s], DType::kF32, {n}, state[s].data()));
    }
    const std::string pos = "{\"step\": " + std::to_string(step) + "}";
    c.datasets.push_back(DatasetSpec::Json("data_position", pos));
    Status s = saver.Save(d.str(), m, c, comm, o);
    REQUIRE(s.ok());
    if (step == 20) {
      REQUIRE(saver.Wait().ok());
      warm = ResidentBytes();
    }
  }
  REQUIRE(saver.Wait().ok());
  const uint64_t end = ResidentBytes();
  const AsyncSaverStats st = saver.stats();
  INFO("RSS after 20 saves " << warm << " B, after 200 " << end << " B");
#if defined(__SANITIZE_ADDRESS__)
  // ASan's quarantine keeps freed memory resident (HDF5's per-save allocations), so the RSS
  // says nothing here; LeakSanitizer reports a leaked staging block at exit instead.
  (void)end;
#else
  // A leaked staging block per save would add 200 x 1.1 MiB; allocator noise is far below 4 MiB.
  CHECK(end < warm + (4u << 20));
#endif
  CHECK(st.staging_allocations == 1);
  CHECK(st.saves_started == 200);
  CHECK(st.host_staging_bytes >= 3 * n * sizeof(float));
  CHECK(st.host_staging_bytes % 4096 == 0);
  CHECK(ReadLatest(d.str()).value() == "global_step200");
  auto r = CheckpointReader::Open(d.str());
  REQUIRE(r.ok());
  std::vector<float> back(static_cast<size_t>(n));
  REQUIRE(r->ReadDataset(0, "exp_avg", back.data(), back.size() * sizeof(float)).ok());
  CHECK(back == state[1]);
}

TEST_CASE("async save: staging grows only when a save needs more", "[io][unit]") {
  ScratchDir d;
  AsyncSaver saver;
  SingleCollective comm;
  auto save = [&](int step, int64_t n) {
    Manifest m;
    m.tag = "global_step" + std::to_string(step);
    m.topology.dp_world_size = 1;
    ParamEntry p;
    p.name = "w";
    p.shape = {n};
    p.numel = n;
    m.params.push_back(p);
    m.partition = BuildPartition(m.params, 1, 0).value();
    const int64_t shard = m.partition.shard_numel[0];  // n, padded to the alignment
    std::vector<float> w(static_cast<size_t>(shard), static_cast<float>(step));
    RankContents c;
    for (const char* name : {"master", "exp_avg", "exp_avg_sq"})
      c.datasets.push_back(DatasetSpec::Tensor(name, DType::kF32, {shard}, w.data()));
    REQUIRE(saver.Save(d.str(), m, c, comm).ok());
    const Status s = saver.Wait();
    INFO(s.ToString());
    REQUIRE(s.ok());
    return saver.stats();
  };
  CHECK(save(1, 1000).staging_allocations == 1);
  const AsyncSaverStats big = save(2, 100000);
  CHECK(big.staging_allocations == 2);
  CHECK(big.host_staging_bytes >= 3 * 400000);
  const AsyncSaverStats small = save(3, 10);
  CHECK(small.staging_allocations == 2);
  CHECK(small.host_staging_bytes == big.host_staging_bytes);
  CHECK(small.pinned_staging_bytes == 0);  // host sources never use page-locked memory
}

TEST_CASE("async save: back-to-back saves commit in call order; the destructor finishes one",
          "[io]") {
  ScratchDir d;
  const int world = 2;
  ThreadGroup saver_group(world);
  RecordingEnv rec;
  std::vector<RankLog> logs(world);
  ForEachRank(world, [&](int r) {
    SaveOptions o;
    o.env = &rec;
    AsyncSaver saver;
    for (int step = 1; step <= 3; ++step) {
      Manifest m = SmallModel("global_step" + std::to_string(step), world, 2);
      RankBuffers b;
      FillRank(m, r, b, step);
      Status s = saver.Save(d.str(), m, b.contents, saver_group.ForRank(r), o);
      logs[static_cast<size_t>(r)].Expect(s.ok(), s.ToString());
    }
    // No Wait(): the destructor finishes the third save.
  });
  CheckLogs(logs);
  std::vector<std::string> order;
  for (const std::string& e : rec.events())
    if (order.empty() || order.back() != e) order.push_back(e);  // one entry per step
  // Each save's files are begun only after the previous tag committed.
  std::vector<std::string> expected;
  for (int step = 1; step <= 3; ++step) {
    expected.push_back("write .tmp-global_step" + std::to_string(step));
    expected.push_back("commit global_step" + std::to_string(step));
  }
  REQUIRE(order.size() == expected.size());
  for (size_t i = 0; i < order.size(); ++i) CHECK_THAT(order[i], Catch::StartsWith(expected[i]));
  CHECK(ReadLatest(d.str()).value() == "global_step3");
  for (int r = 0; r < world; ++r) {
    Manifest m = SmallModel("global_step3", world, 2);
    RankBuffers b;
    FillRank(m, r, b, 3);
    CHECK(Committed(d.str(), "global_step3", r) == BytesOf(b.contents));
  }
}
