// Helpers for the ckpt suites: build small manifests and save them with N thread ranks.
#pragma once

#include <algorithm>
#include <atomic>
#include <fstream>
#include <functional>
#include <string>
#include <thread>

#include "ckpt/collective.h"
#include "ckpt/env.h"
#include "ckpt/manifest.h"
#include "ckpt/writer.h"
#include "test_util.h"

namespace ckpt::testing {

// Counts the bytes read through it, then forwards. Large reads (ReadLarge, Scan) take
// RandomAccessFile's defaults, which are Reads: counted too, never O_DIRECT.
class CountingFile final : public RandomAccessFile {
 public:
  CountingFile(std::unique_ptr<RandomAccessFile> f, std::atomic<uint64_t>* n)
      : f_(std::move(f)), n_(n) {}
  Status Read(uint64_t offset, size_t n, void* out) const override {
    *n_ += n;
    return f_->Read(offset, n, out);
  }
  uint64_t size() const override { return f_->size(); }

 private:
  std::unique_ptr<RandomAccessFile> f_;
  std::atomic<uint64_t>* n_;
};

// An Env whose checkpoint files (NewCheckpointFile) are the real ones wrapped by `wrap`, which
// also gets the path the file was opened by.
class WrappedFileEnv : public EnvWrapper {
 public:
  using Wrap = std::function<std::unique_ptr<RandomAccessFile>(std::unique_ptr<RandomAccessFile>,
                                                               const std::string& path)>;
  explicit WrappedFileEnv(Wrap wrap) : EnvWrapper(nullptr), wrap_(std::move(wrap)) {}
  Result<std::unique_ptr<RandomAccessFile>> NewCheckpointFile(const std::string& p) override {
    auto f = EnvWrapper::NewCheckpointFile(p);
    if (!f.ok()) return f;
    return wrap_(std::move(*f), p);
  }

 private:
  Wrap wrap_;
};

// A model with a 2-D weight, an odd-sized bias, a tied alias and a frozen fp32 table.
inline Manifest SmallModel(const std::string& tag, int world, int zero) {
  Manifest m;
  m.tag = tag;
  m.counters = {12, 48, 1, 384, 49152};
  m.topology.dp_world_size = world;
  m.topology.zero_stage = zero;
  m.optimizer = {{"type", "adamw"}, {"lr", 3e-4}, {"beta1", 0.9}, {"beta2", 0.95},
                 {"eps", 1e-8},     {"weight_decay", 0.1}};
  m.dtypes = {{"master", "fp32"}};
  m.client_state = {{"note", "hello"}, {"nested", {{"a", 1}, {"b", {1, 2, 3}}}}};
  m.engine_config = {{"model", "tiny"}};
  auto add = [&](std::string name, std::vector<int64_t> shape, bool frozen = false,
                 std::string tied = "") {
    ParamEntry p;
    p.name = std::move(name);
    p.shape = std::move(shape);
    p.numel = 1;
    for (auto d : p.shape) p.numel *= d;
    p.frozen = frozen;
    p.tied_to = std::move(tied);
    m.params.push_back(p);
  };
  add("embed.weight", {37, 8});
  add("block.bias", {13});
  add("lm_head.weight", {37, 8}, false, "embed.weight");
  add("pos_table", {5, 8}, true);
  m.partition = BuildPartition(m.params, world, zero).value();
  return m;
}

// Value of element e of parameter p's state s (0 master, 1 exp_avg, 2 exp_avg_sq).
inline float Val(int p, int s, int64_t e, int salt = 0) {
  return static_cast<float>(p * 1000 + s * 100000 + e) * 0.001f + static_cast<float>(salt);
}

struct RankBuffers {
  std::vector<float> state[3];
  std::vector<float> frozen;
  std::string rng;
  std::string data_pos;
  std::string sched;
  RankContents contents;
};

// Fills rank r's shard from Val() so any partition holds the same logical values.
inline void FillRank(const Manifest& m, int rank, RankBuffers& b, int salt = 0) {
  const int64_t shard = m.partition.shard_numel[static_cast<size_t>(rank)];
  const char* names[3] = {"master", "exp_avg", "exp_avg_sq"};
  for (int s = 0; s < 3; ++s) b.state[s].assign(static_cast<size_t>(shard), 0.0f);
  for (size_t pi = 0; pi < m.params.size(); ++pi)
    for (const auto& r : m.params[pi].ranges)
      if (r.rank == rank)
        for (int s = 0; s < 3; ++s)
          for (int64_t e = r.begin; e < r.end; ++e)
            b.state[s][static_cast<size_t>(r.shard_offset + e - r.begin)] =
                Val(static_cast<int>(pi), s, e, salt);
  for (int s = 0; s < 3; ++s)
    b.contents.datasets.push_back(DatasetSpec::Tensor(names[s], DType::kF32, {shard}, b.state[s].data()));
  if (rank == 0) {
    for (size_t pi = 0; pi < m.params.size(); ++pi) {
      if (!m.params[pi].frozen) continue;
      b.frozen.resize(static_cast<size_t>(m.params[pi].numel));
      for (int64_t e = 0; e < m.params[pi].numel; ++e)
        b.frozen[static_cast<size_t>(e)] = Val(static_cast<int>(pi), 0, e, salt);
      b.contents.datasets.push_back(DatasetSpec::Tensor("frozen/" + m.params[pi].name, DType::kF32,
                                                        m.params[pi].shape, b.frozen.data()));
    }
  }
  b.rng = "mt19937_64 state of rank " + std::to_string(rank) + " salt " + std::to_string(salt);
  b.data_pos = "{\"epoch\": 1, \"sample_offset\": " + std::to_string(384 + salt) + "}";
  b.sched = "{\"last_lr\": 0.0003, \"step\": 12}";
  b.contents.datasets.push_back(DatasetSpec::Blob("rng/dropout", "mt19937_64", b.rng));
  b.contents.datasets.push_back(DatasetSpec::Json("data_position", b.data_pos));
  b.contents.datasets.push_back(DatasetSpec::Json("scheduler", b.sched));
}

// Saves `m` with world = m.topology.dp_world_size thread ranks; returns rank 0's status.
inline Status SaveWithThreads(const std::string& root, const Manifest& m, SaveOptions opts = {},
                              int salt = 0) {
  const int world = m.topology.dp_world_size;
  ThreadGroup group(world);
  std::vector<RankBuffers> bufs(static_cast<size_t>(world));
  std::vector<Status> st(static_cast<size_t>(world));
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      FillRank(m, r, bufs[static_cast<size_t>(r)], salt);
      st[static_cast<size_t>(r)] =
          SaveCheckpoint(root, m, bufs[static_cast<size_t>(r)].contents, group.ForRank(r), opts);
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 1; r < world; ++r) {
    if (st[static_cast<size_t>(r)].code() != st[0].code())
      return Internal("ranks disagree on the save outcome: " + st[0].ToString() + " vs " +
                      st[static_cast<size_t>(r)].ToString());
  }
  return st[0];
}

// The independent reader of tests/ckpt/h5py_crosscheck.py: /usr/bin/python3 with h5py, numpy
// and zstandard.
inline bool HaveH5pyCrosscheck() {
  return RunShell("/usr/bin/python3 -c 'import h5py, numpy, zstandard' 2>/dev/null") == 0;
}

// Writes `bytes` as what h5py_crosscheck.py must read for dataset `name` of rank `rank`:
// EXPECT_DIR/<rank>__<name, '/' -> '@'>.
inline void WriteExpected(const std::string& expect_dir, int rank, const std::string& name,
                          const std::string& bytes) {
  std::string file = std::to_string(rank) + "__" + name;
  std::replace(file.begin(), file.end(), '/', '@');
  Spit(expect_dir + "/" + file, bytes);
}

// Runs h5py_crosscheck.py over the tag directory `tag_dir` against the files of `expect_dir`
// (WriteExpected), with the ckpt_h5zstd plugin on HDF5_PLUGIN_PATH; its exit code.
inline int RunH5pyCrosscheck(const std::string& tag_dir, const std::string& expect_dir) {
  return RunShell("HDF5_PLUGIN_PATH=" + std::string(CKPT_BINARY_DIR) +
                  "/lib/hdf5-plugins /usr/bin/python3 " + std::string(CKPT_SOURCE_DIR) +
                  "/tests/ckpt/h5py_crosscheck.py " + tag_dir + " " + expect_dir);
}

}  // namespace ckpt::testing
