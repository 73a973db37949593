// Helpers for the verify suite: a random optimizer state written as a real checkpoint (any
// world size and ZeRO stage) and the matching gradient file.
#pragma once

#include <cstdio>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "ckpt/adamw.h"
#include "ckpt/collective.h"
#include "ckpt/manifest.h"
#include "ckpt/writer.h"
#include "safetensors/safetensors.h"
#include "test_util.h"

namespace ckpt::testing {

struct RandomParam {
  std::string name;
  std::vector<int64_t> shape;
  std::vector<float> w, m, v, g;  // full tensors
};

struct RandomState {
  AdamWHyper hyper;
  std::vector<RandomParam> params;  // trainable, table order
};

inline RandomState MakeRandomState(uint32_t seed, int64_t step = 7) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  RandomState s;
  s.hyper.lr = 3e-3;
  s.hyper.beta1 = 0.9;
  s.hyper.beta2 = 0.95;
  s.hyper.eps = 1e-8;
  s.hyper.weight_decay = 0.1;
  s.hyper.step = step;
  const std::vector<std::pair<std::string, std::vector<int64_t>>> shapes = {
      {"embed.weight", {37, 8}},      {"block0.attn.weight", {8, 24}}, {"block0.attn.bias", {24}},
      {"block0.mlp.weight", {8, 33}}, {"final_norm.scale", {8}},       {"tiny", {3}}};
  for (const auto& [name, shape] : shapes) {
    RandomParam p;
    p.name = name;
    p.shape = shape;
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    for (int64_t i = 0; i < n; ++i) {
      p.w.push_back(0.5f * normal(rng));
      p.m.push_back(0.01f * normal(rng));
      const float sq = 0.01f * normal(rng);
      p.v.push_back(sq * sq + 1e-6f);
      p.g.push_back(0.02f * normal(rng));
    }
    s.params.push_back(std::move(p));
  }
  return s;
}

// Saves `state` under root (tag "global_step<step>") with `world` ranks at `zero_stage`.
// engine_config, when non-empty, marks the checkpoint as engine_min's.
inline Status WriteStateCheckpoint(const std::string& root, const RandomState& state, int world,
                                   int zero_stage,
                                   const nlohmann::json& engine_config = nlohmann::json::object()) {
  Manifest meta;
  meta.tag = "global_step" + std::to_string(state.hyper.step);
  meta.counters.global_step = state.hyper.step;
  meta.topology.dp_world_size = world;
  meta.topology.zero_stage = zero_stage;
  meta.optimizer = {{"type", "adamw"},
                    {"lr", state.hyper.lr},
                    {"beta1", state.hyper.beta1},
                    {"beta2", state.hyper.beta2},
                    {"eps", state.hyper.eps},
                    {"weight_decay", state.hyper.weight_decay},
                    {"step", state.hyper.step}};
  meta.engine_config = engine_config;
  for (const auto& p : state.params) {
    ParamEntry e;
    e.name = p.name;
    e.shape = p.shape;
    e.numel = static_cast<int64_t>(p.w.size());
    meta.params.push_back(e);
  }
  auto partition = BuildPartition(meta.params, world, zero_stage);
  if (!partition.ok()) return partition.status();
  meta.partition = *partition;
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
        w[pr.rank][at] = state.params[i].w[e];
        m[pr.rank][at] = state.params[i].m[e];
        v[pr.rank][at] = state.params[i].v[e];
      }
    }
  }
  ThreadGroup group(world);
  std::vector<Status> results(world);
  std::vector<std::thread> threads;
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
      results[r] = SaveCheckpoint(root, meta, mine, group.ForRank(r));
    });
  }
  for (auto& t : threads) t.join();
  for (const Status& s : results) {
    if (!s.ok()) return s;
  }
  return Status::Ok();
}

// The gradient file; `which` selects the tensor set: "g" gradients (or "w", "m", "v").
inline Status WriteStateTensors(const std::string& path, const RandomState& state,
                                const std::string& which = "g") {
  std::vector<safetensors::SafetensorsTensorView> views;
  for (const auto& p : state.params) {
    const std::vector<float>& x = which == "w"   ? p.w
                                  : which == "m" ? p.m
                                  : which == "v" ? p.v
                                                 : p.g;
    views.push_back({{p.name, DType::kF32, p.shape}, x.data()});
  }
  return safetensors::WriteSafetensors(path, views, {});
}

}  // namespace ckpt::testing
