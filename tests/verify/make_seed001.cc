// Writes the seed-001 fixture once: a real ckpt checkpoint holding the ownership lab's state
// after its five updates, as 11 scalar parameters sharded over 4 ranks (ZeRO-1 flat layout,
// alignment 1), and the next gradient (0.4 for every parameter, seed 001's value at step 6).
//
//   build-verify/bin/verify_make_seed001 tests/data/seed001
//
// It refuses to overwrite an existing fixture: golden files are never regenerated silently.
#include <cstdio>
#include <filesystem>
#include <thread>
#include <vector>

#include "ckpt/collective.h"
#include "ckpt/manifest.h"
#include "ckpt/writer.h"
#include "safetensors/safetensors.h"
#include "seed001_lab.h"

int main(int argc, char** argv) {
  using namespace ckpt;
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s OUT_DIR\n", argv[0]);
    return 2;
  }
  const std::string out = argv[1];
  if (std::filesystem::exists(out + "/ckpt") ||
      std::filesystem::exists(out + "/grad_step6.safetensors")) {
    std::fprintf(stderr, "%s already holds the fixture; remove it deliberately to regenerate\n",
                 out.c_str());
    return 2;
  }
  const auto lab = testing::OwnershipLab();
  const int world = 4;
  Manifest meta;
  meta.tag = "global_step5";
  meta.counters.global_step = 5;
  meta.counters.micro_step = 5;
  meta.topology.dp_world_size = world;
  meta.topology.zero_stage = 1;
  meta.optimizer = {{"type", "adamw"}, {"lr", 0.01},          {"beta1", 0.9}, {"beta2", 0.999},
                    {"eps", 1e-8},     {"weight_decay", 0.0}, {"step", 5}};
  meta.dtypes = {{"master", "fp32"}, {"exp_avg", "fp32"}, {"exp_avg_sq", "fp32"}};
  meta.client_state = {{"source",
                        "seed 001 ownership lab: compare_owned_updates(11, 4, 5), "
                        "plain Adam lr 0.01 without weight decay"},
                       {"next_step", 6}};
  char name[32];
  for (size_t i = 0; i < lab.size(); ++i) {
    std::snprintf(name, sizeof name, "lab.p%02zu", i);
    ParamEntry p;
    p.name = name;
    p.shape = {1};
    p.numel = 1;
    meta.params.push_back(p);
  }
  auto partition = BuildPartition(meta.params, world, /*zero_stage=*/1, /*alignment=*/1);
  if (!partition.ok()) {
    std::fprintf(stderr, "%s\n", partition.status().ToString().c_str());
    return 1;
  }
  meta.partition = *partition;

  // Each rank's flat shards of the fp32-rounded lab state.
  std::vector<std::vector<float>> w(world), m(world), v(world);
  for (int r = 0; r < world; ++r) {
    const size_t n = static_cast<size_t>(meta.partition.shard_numel[r]);
    w[r].assign(n, 0.0f);
    m[r].assign(n, 0.0f);
    v[r].assign(n, 0.0f);
  }
  for (size_t i = 0; i < meta.params.size(); ++i) {
    for (const PartitionRange& pr : meta.params[i].ranges) {
      for (int64_t e = pr.begin; e < pr.end; ++e) {
        const size_t at = static_cast<size_t>(pr.shard_offset + (e - pr.begin));
        w[pr.rank][at] = static_cast<float>(lab[i].weight);
        m[pr.rank][at] = static_cast<float>(lab[i].first);
        v[pr.rank][at] = static_cast<float>(lab[i].second);
      }
    }
  }
  ThreadGroup group(world);
  std::vector<Status> results(world);
  std::vector<std::thread> threads;
  const std::string scheduler = R"({"type": "constant", "lr": 0.01})";
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      RankContents mine;
      const int64_t n = static_cast<int64_t>(w[r].size());
      mine.datasets.push_back(
          DatasetSpec::Tensor(std::string(kMaster), DType::kF32, {n}, w[r].data()));
      mine.datasets.push_back(
          DatasetSpec::Tensor(std::string(kExpAvg), DType::kF32, {n}, m[r].data()));
      mine.datasets.push_back(
          DatasetSpec::Tensor(std::string(kExpAvgSq), DType::kF32, {n}, v[r].data()));
      if (r == 0) mine.datasets.push_back(DatasetSpec::Json(std::string(kScheduler), scheduler));
      results[r] = SaveCheckpoint(out + "/ckpt", meta, mine, group.ForRank(r));
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < world; ++r) {
    if (!results[r].ok()) {
      std::fprintf(stderr, "rank %d: %s\n", r, results[r].ToString().c_str());
      return 1;
    }
  }
  std::vector<float> grad(lab.size(), 0.4f);
  std::vector<safetensors::SafetensorsTensorView> views;
  for (size_t i = 0; i < meta.params.size(); ++i) {
    views.push_back({{meta.params[i].name, DType::kF32, {1}}, &grad[i]});
  }
  Status s = safetensors::WriteSafetensors(out + "/grad_step6.safetensors", views,
                                           {{"source", "seed 001: next gradient 0.4 at step 6"}});
  if (!s.ok()) {
    std::fprintf(stderr, "%s\n", s.ToString().c_str());
    return 1;
  }
  std::printf("wrote %s/ckpt (tag global_step5) and %s/grad_step6.safetensors\n", out.c_str(),
              out.c_str());
  return 0;
}
