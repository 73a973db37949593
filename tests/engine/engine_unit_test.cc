// engine_min unit tests: the model's backward against finite differences, the AdamW step
// against an fp64 reference and torch.optim.AdamW, the global data order, batch settings,
// the LR schedule and RNG serialization.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <random>

#include "engine_min/config.h"
#include "engine_min/data.h"
#include "engine_min/engine.h"
#include "engine_min/model.h"
#include "engine_min/random.h"
#include "engine_min/run_log.h"
#include "engine_min/schedule.h"
#include "test_util.h"

using namespace engine_min;

namespace {

// Parameters held in plain vectors (what a single process without ZeRO would do).
template <typename T>
class VectorParams final : public ParamAccess<T> {
 public:
  explicit VectorParams(const ModelShape& shape) {
    for (int id = 0; id < shape.num_trainable(); ++id) {
      values.emplace_back(TrainableNumel(shape, id), T(0));
      grads.emplace_back(TrainableNumel(shape, id), T(0));
    }
  }
  ckpt::Result<const T*> Acquire(int id) override {
    ++acquired[id];
    return static_cast<const T*>(values[id].data());
  }
  ckpt::Status Release(int) override { return ckpt::Status::Ok(); }
  ckpt::Result<T*> Grad(int id) override { return grads[id].data(); }
  ckpt::Status GradDone(int id) override {
    ++done[id];
    return ckpt::Status::Ok();
  }
  std::vector<std::vector<T>> values, grads;
  std::map<int, int> acquired, done;
};

TokenBatch MakeBatch(const std::string& text, int context) {
  auto corpus = Corpus::FromBytes(text + text, 4, 6);
  REQUIRE(corpus.ok());
  TokenBatch b;
  corpus->AppendTokens(0, context, b);
  corpus->AppendTokens(1, context, b);
  corpus->AppendTokens(2, context, b);
  return b;
}

}  // namespace

TEST_CASE("model backward matches central finite differences (fp64, dropout on)", "[unit]") {
  ModelShape shape;
  shape.d_model = 6;
  shape.layers = 2;
  shape.context = 3;
  const TokenBatch batch = MakeBatch("the quick brown fox jumps over the lazy dog", shape.context);
  REQUIRE(batch.tokens >= 12);

  VectorParams<double> p(shape);
  std::mt19937_64 gen(99);
  for (int id = 0; id < shape.num_trainable(); ++id) {
    const std::vector<float> init = InitTrainable(shape, id, 5);
    for (size_t i = 0; i < init.size(); ++i) {
      // Non-trivial everywhere: biases away from zero, larger weights so GELU curves.
      p.values[id][i] = 3.0 * init[i] + 0.3 * (UniformDouble(gen) - 0.5);
    }
  }
  const std::vector<float> pos_f = MakePositionalTable(shape);
  const std::vector<double> pos(pos_f.begin(), pos_f.end());
  DropoutMasks masks;
  masks.per_layer.resize(shape.layers);
  for (auto& m : masks.per_layer) {
    m.resize(static_cast<size_t>(batch.tokens) * shape.d_model);
    for (float& x : m) x = UniformDouble(gen) < 0.25 ? 0.0f : 1.0f / 0.75f;
  }

  const double scale = 1.0 / static_cast<double>(batch.tokens);
  auto fb = ForwardBackward<double>(shape, pos.data(), batch, masks, scale, p);
  REQUIRE(fb.ok());
  CHECK(fb->tokens == batch.tokens);
  // The tied embedding is read twice (input and output) and its gradient finished once.
  CHECK(p.acquired[kEmbedId] == 2);
  CHECK(p.done[kEmbedId] == 1);

  auto loss_at = [&]() {
    auto r = Forward<double>(shape, pos.data(), batch, masks, p);
    REQUIRE(r.ok());
    return r->loss_sum * scale;
  };
  const double h = 1e-5;
  int checked = 0, nonzero = 0;
  double worst = 0;
  for (int id = 0; id < shape.num_trainable(); ++id) {
    for (size_t i = 0; i < p.values[id].size(); ++i) {
      const double an = p.grads[id][i];
      if (id == kEmbedId && an == 0.0 && (i % 7) != 0) continue;  // unused byte rows
      const double saved = p.values[id][i];
      p.values[id][i] = saved + h;
      const double up = loss_at();
      p.values[id][i] = saved - h;
      const double down = loss_at();
      p.values[id][i] = saved;
      const double fd = (up - down) / (2 * h);
      const double err = std::fabs(fd - an);
      worst = std::max(worst, err / (1e-6 + std::fabs(an)));
      INFO(TrainableName(id) << "[" << i << "]: analytic " << an << " finite difference " << fd);
      CHECK(err <= 1e-8 + 1e-5 * std::fabs(an));
      ++checked;
      if (std::fabs(an) > 1e-6) ++nonzero;
    }
  }
  INFO("worst scaled error " << worst);
  CHECK(checked > 200);
  CHECK(nonzero > 150);
}

TEST_CASE("float and double forward agree and the float backward is deterministic", "[unit]") {
  ModelShape shape;
  shape.d_model = 16;
  shape.layers = 2;
  shape.context = 4;
  const TokenBatch batch = MakeBatch("deterministic arithmetic for every run", shape.context);
  VectorParams<float> pf(shape), pf2(shape);
  VectorParams<double> pd(shape);
  for (int id = 0; id < shape.num_trainable(); ++id) {
    const std::vector<float> init = InitTrainable(shape, id, 11);
    pf.values[id] = init;
    pf2.values[id] = init;
    pd.values[id].assign(init.begin(), init.end());
  }
  const std::vector<float> pos = MakePositionalTable(shape);
  const std::vector<double> posd(pos.begin(), pos.end());
  auto a = ForwardBackward<float>(shape, pos.data(), batch, {}, 0.01, pf);
  auto b = ForwardBackward<float>(shape, pos.data(), batch, {}, 0.01, pf2);
  auto c = Forward<double>(shape, posd.data(), batch, {}, pd);
  REQUIRE((a.ok() && b.ok() && c.ok()));
  CHECK(a->loss_sum == b->loss_sum);
  CHECK(pf.grads == pf2.grads);
  CHECK(std::fabs(a->loss_sum - c->loss_sum) <= 1e-5 * std::fabs(c->loss_sum));
  // Initial loss of the byte model is near ln(256) per token.
  CHECK(std::fabs(c->loss_sum / batch.tokens - std::log(256.0)) < 0.5);
}

namespace {

// torch.optim.AdamW's documented algorithm in fp64.
void AdamWReference(double lr, double b1, double b2, double eps, double wd, int64_t step, double& w,
                    double& m, double& v, double g) {
  const double t = static_cast<double>(step + 1);
  w *= 1 - lr * wd;
  m = b1 * m + (1 - b1) * g;
  v = b2 * v + (1 - b2) * g * g;
  const double mhat = m / (1 - std::pow(b1, t));
  const double vhat = v / (1 - std::pow(b2, t));
  w -= lr * mhat / (std::sqrt(vhat) + eps);
}

struct AdamWCase {
  EngineConfig config;
  std::vector<double> lrs;
  std::vector<float> w0, m0, v0;
  std::vector<std::vector<float>> grads;
  int64_t step0 = 0;
};

AdamWCase MakeAdamWCase() {
  AdamWCase c;
  c.config.beta1 = 0.9;
  c.config.beta2 = 0.95;
  c.config.eps = 1e-8;
  c.config.weight_decay = 0.1;
  c.step0 = 3;  // resumed state: three updates already applied
  c.lrs = {1e-3, 8e-4, 5e-4, 3e-4, 1e-4};
  std::mt19937_64 gen(2024);
  const int n = 4096;
  for (int i = 0; i < n; ++i) {
    c.w0.push_back(static_cast<float>(NormalDouble(gen)));
    c.m0.push_back(static_cast<float>(0.01 * NormalDouble(gen)));
    c.v0.push_back(static_cast<float>(1e-4 * UniformDouble(gen)));
  }
  for (size_t s = 0; s < c.lrs.size(); ++s) {
    std::vector<float> g(n);
    for (float& x : g) x = static_cast<float>(0.05 * NormalDouble(gen));
    c.grads.push_back(std::move(g));
  }
  return c;
}

// Tensor-relative error: max |a - b| / max |b| (the max norm of the difference relative to the
// reference's). Element-wise ratios would measure only float cancellation in entries near 0.
double MaxRel(const std::vector<float>& a, const std::vector<double>& b) {
  double diff = 0, scale = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    diff = std::max(diff, std::fabs(a[i] - b[i]));
    scale = std::max(scale, std::fabs(b[i]));
  }
  return diff / scale;
}

}  // namespace

TEST_CASE("engine AdamW step matches an fp64 reference to 1e-6 relative", "[unit]") {
  AdamWCase c = MakeAdamWCase();
  std::vector<float> w = c.w0, m = c.m0, v = c.v0;
  std::vector<double> wd(w.begin(), w.end()), md(m.begin(), m.end()), vd(v.begin(), v.end());
  for (size_t s = 0; s < c.lrs.size(); ++s) {
    ApplyAdamW(c.config, c.lrs[s], c.step0 + static_cast<int64_t>(s), w.data(), m.data(), v.data(),
               c.grads[s].data(), w.size());
    for (size_t i = 0; i < w.size(); ++i) {
      AdamWReference(c.lrs[s], c.config.beta1, c.config.beta2, c.config.eps, c.config.weight_decay,
                     c.step0 + static_cast<int64_t>(s), wd[i], md[i], vd[i], c.grads[s][i]);
    }
  }
  CHECK(MaxRel(w, wd) <= 1e-6);
  CHECK(MaxRel(m, md) <= 1e-6);
  CHECK(MaxRel(v, vd) <= 1e-6);
  // The update moved the weights by far more than the tolerance.
  CHECK(MaxRel(w, std::vector<double>(c.w0.begin(), c.w0.end())) > 1e-4);
}

TEST_CASE("engine AdamW step matches torch.optim.AdamW to 1e-6 relative", "[unit][torch]") {
  if (ckpt::testing::RunShell("/usr/bin/python3 -c 'import torch, numpy' >/dev/null 2>&1") != 0) {
    WARN("skipped: /usr/bin/python3 with torch and numpy is not available");
    return;
  }
  AdamWCase c = MakeAdamWCase();
  ckpt::testing::ScratchDir dir("engine-adamw");
  auto write = [&](const std::string& name, const std::vector<float>& x) {
    std::ofstream out(dir / name, std::ios::binary);
    out.write(reinterpret_cast<const char*>(x.data()), x.size() * sizeof(float));
  };
  write("w.f32", c.w0);
  write("m.f32", c.m0);
  write("v.f32", c.v0);
  std::vector<float> all_grads;
  for (const auto& g : c.grads) all_grads.insert(all_grads.end(), g.begin(), g.end());
  write("g.f32", all_grads);
  {
    std::ofstream py(dir / "adamw.py");
    py << "import sys, numpy as np, torch\n"
          "d = sys.argv[1]\n"
          "ld = lambda n: torch.from_numpy(np.fromfile(d + '/' + n, dtype=np.float32))\n"
          "w, m, v, g = ld('w.f32'), ld('m.f32'), ld('v.f32'), ld('g.f32')\n"
          "p = torch.nn.Parameter(w.clone())\n"
          "lrs = [float(x) for x in sys.argv[2].split(',')]\n"
          "opt = torch.optim.AdamW([p], lr=lrs[0], betas=(0.9, 0.95), eps=1e-8,\n"
          "                        weight_decay=0.1, foreach=False)\n"
          "opt.state[p] = {'step': torch.tensor(3.0), 'exp_avg': m.clone(),\n"
          "                'exp_avg_sq': v.clone()}\n"
          "n = w.numel()\n"
          "for s, lr in enumerate(lrs):\n"
          "    opt.param_groups[0]['lr'] = lr\n"
          "    p.grad = g[s * n:(s + 1) * n].clone()\n"
          "    opt.step()\n"
          "st = opt.state[p]\n"
          "p.detach().numpy().tofile(d + '/w_out.f32')\n"
          "st['exp_avg'].numpy().tofile(d + '/m_out.f32')\n"
          "st['exp_avg_sq'].numpy().tofile(d + '/v_out.f32')\n";
  }
  std::string lrs;
  for (double lr : c.lrs) lrs += (lrs.empty() ? "" : ",") + std::to_string(lr);
  REQUIRE(ckpt::testing::RunShell("/usr/bin/python3 " + (dir / "adamw.py") + " " + dir.str() + " " +
                                  lrs) == 0);
  auto read = [&](const std::string& name) {
    std::ifstream in(dir / name, std::ios::binary);
    std::vector<float> x(c.w0.size());
    in.read(reinterpret_cast<char*>(x.data()), x.size() * sizeof(float));
    REQUIRE(in.gcount() == static_cast<std::streamsize>(x.size() * sizeof(float)));
    return std::vector<double>(x.begin(), x.end());
  };
  const std::vector<double> tw = read("w_out.f32"), tm = read("m_out.f32"), tv = read("v_out.f32");

  std::vector<float> w = c.w0, m = c.m0, v = c.v0;
  for (size_t s = 0; s < c.lrs.size(); ++s) {
    ApplyAdamW(c.config, std::stod(std::to_string(c.lrs[s])), c.step0 + static_cast<int64_t>(s),
               w.data(), m.data(), v.data(), c.grads[s].data(), w.size());
  }
  const double rw = MaxRel(w, tw), rm = MaxRel(m, tm), rv = MaxRel(v, tv);
  INFO("max relative difference: weights " << rw << " exp_avg " << rm << " exp_avg_sq " << rv);
  CHECK(rw <= 1e-6);
  CHECK(rm <= 1e-6);
  CHECK(rv <= 1e-6);
}

TEST_CASE("global order: permutations, epochs and restore from the saved state", "[unit]") {
  const int64_t n = 37;
  GlobalOrder order(n, GlobalOrder::FreshShuffleRng(5), DataPosition{});
  std::vector<int64_t> first = order.Next(n);
  std::vector<int64_t> sorted = first;
  std::sort(sorted.begin(), sorted.end());
  for (int64_t i = 0; i < n; ++i) REQUIRE(sorted[i] == i);
  std::vector<int64_t> identity(n);
  std::iota(identity.begin(), identity.end(), 0);
  CHECK(first != identity);

  // Walk into epoch 2, then restore from what a checkpoint holds and continue identically.
  order.Next(n + 10);
  REQUIRE(order.position().epoch == 2);
  REQUIRE(order.position().sample_offset == 10);
  const std::string saved_rng = SerializeRng(order.epoch_start_rng());
  const DataPosition saved_pos = order.position();
  const std::vector<int64_t> expect = order.Next(50);

  auto rng = ParseRng(saved_rng);
  REQUIRE(rng.ok());
  GlobalOrder restored(n, *rng, saved_pos);
  CHECK(restored.Next(50) == expect);
  // Without the blob the epoch-start generator is replayed from the seed.
  GlobalOrder replayed(n, GlobalOrder::ShuffleRngAtEpoch(5, n, 2), saved_pos);
  CHECK(replayed.Next(50) == expect);
  // Another seed gives another order.
  GlobalOrder other(n, GlobalOrder::FreshShuffleRng(6), DataPosition{});
  CHECK(other.Next(n) != first);

  CHECK(!ParseRng("not a generator").ok());
  auto json = saved_pos.ToJson(n);
  auto back = DataPosition::FromJson(json);
  REQUIRE(back.ok());
  CHECK(back->epoch == 2);
  CHECK(back->sample_offset == 10);
  CHECK(!DataPosition::FromJson(nlohmann::json{{"epoch", -1}, {"sample_offset", 0}}).ok());
}

TEST_CASE("corpus samples tile the text with varying lengths", "[unit]") {
  auto corpus = Corpus::Load(DefaultCorpusPath(), 8, 48);
  REQUIRE(corpus.ok());
  const auto& s = corpus->samples();
  REQUIRE(s.size() > 1000);
  int64_t pos = 0, shortest = 1 << 30, longest = 0;
  for (const auto& x : s) {
    REQUIRE(x.begin == pos);
    pos += x.length;
    shortest = std::min(shortest, x.length);
    longest = std::max(longest, x.length);
  }
  CHECK(pos <= static_cast<int64_t>(corpus->bytes().size()));
  CHECK(longest == 48);
  CHECK(shortest <= 9);
  TokenBatch b;
  corpus->AppendTokens(1, 4, b);
  REQUIRE(b.tokens == s[1].length);
  CHECK(b.ctx[0] == 0);  // first byte of a sample has no context
  CHECK(b.ctx[4] == static_cast<uint8_t>(corpus->bytes()[s[1].begin]));
  CHECK(b.target[0] == static_cast<uint8_t>(corpus->bytes()[s[1].begin]));
}

TEST_CASE("batch settings: derived, checked, and kept on resume", "[unit]") {
  using nlohmann::json;
  auto c = ResolveConfig(json{{"micro_batch", 2}, {"grad_accum", 3}}, json(), 4);
  REQUIRE(c.ok());
  CHECK(c->global_batch == 24);
  c = ResolveConfig(json{{"global_batch", 16}, {"micro_batch", 2}}, json(), 4);
  REQUIRE(c.ok());
  CHECK(c->grad_accum == 2);
  c = ResolveConfig(json{{"global_batch", 16}, {"grad_accum", 4}}, json(), 2);
  REQUIRE(c.ok());
  CHECK(c->micro_batch == 2);

  auto bad =
      ResolveConfig(json{{"global_batch", 6}, {"micro_batch", 2}, {"grad_accum", 2}}, json(), 2);
  REQUIRE(!bad.ok());
  CHECK(bad.status().code() == ckpt::StatusCode::kInvalidArgument);
  CHECK(bad.status().message().find("inconsistent batch settings") != std::string::npos);
  CHECK(!ResolveConfig(json{{"global_batch", 10}, {"micro_batch", 4}}, json(), 1).ok());

  // Resume: the checkpoint's global batch stays; grad-accum follows the new world size.
  auto fresh = ResolveConfig(json{{"micro_batch", 1}, {"grad_accum", 2}}, json(), 4);
  REQUIRE(fresh.ok());
  const json saved = fresh->ToJson();
  auto resumed = ResolveConfig(json::object(), saved, 2);
  REQUIRE(resumed.ok());
  CHECK(resumed->global_batch == 8);
  CHECK(resumed->micro_batch == 1);
  CHECK(resumed->grad_accum == 4);
  auto changed = ResolveConfig(json{{"global_batch", 4}}, saved, 4);
  REQUIRE(!changed.ok());
  CHECK(changed.status().message().find("keeps its global batch") != std::string::npos);
  // Settings not given come from the checkpoint; given ones win.
  auto lr = ResolveConfig(json{{"lr", 0.5}}, saved, 4);
  REQUIRE(lr.ok());
  CHECK(lr->lr == 0.5);
  CHECK(lr->seed == fresh->seed);
  CHECK(!ResolveConfig(json{{"zero", 4}}, json(), 1).ok());
  CHECK(!ResolveConfig(json{{"model", "huge"}}, json(), 1).ok());
}

TEST_CASE("warmup + cosine schedule and its saved state", "[unit]") {
  WarmupCosine s(1e-3, 1e-4, 10, 110);
  CHECK(s.LrAt(0) == Approx(1e-4));
  CHECK(s.LrAt(9) == Approx(1e-3));
  CHECK(s.LrAt(10) == Approx(1e-3));
  CHECK(s.LrAt(60) == Approx(5.5e-4));
  CHECK(s.LrAt(110) == Approx(1e-4));
  CHECK(s.LrAt(500) == Approx(1e-4));
  for (int i = 0; i < 37; ++i) s.Advance();
  WarmupCosine r(1e-3, 1e-4, 10, 5);
  REQUIRE(r.RestoreFrom(s.ToJson()).ok());
  CHECK(r.step() == 37);
  CHECK(r.CurrentLr() == s.CurrentLr());
  CHECK(!r.RestoreFrom(nlohmann::json{{"type", "linear"}}).ok());
}

TEST_CASE("parameter table: tied head, frozen table, trainable order", "[unit]") {
  auto tiny = ModelShape::Preset("tiny");
  REQUIRE(tiny.ok());
  CHECK(tiny->TrainableNumel() > 150000);
  CHECK(tiny->TrainableNumel() < 250000);
  auto small = ModelShape::Preset("small");
  REQUIRE(small.ok());
  CHECK(small->TrainableNumel() > 20000000);
  CHECK(small->TrainableNumel() < 30000000);
  const auto table = ParamTable(*tiny);
  REQUIRE(table.size() == 3 + 2 * static_cast<size_t>(tiny->layers));
  CHECK(table[0].name == kEmbedName);
  CHECK(table[1].frozen);
  CHECK(table[2].tied_to == kEmbedName);
  CHECK(table[2].shape == table[0].shape);
  int64_t trainable = 0;
  for (const auto& p : table) trainable += p.trainable() ? p.numel : 0;
  CHECK(trainable == tiny->TrainableNumel());
}

// The run log and the corpus are read and written through ckpt::Env: an injected failure is a
// clean error naming the file, and the log keeps what was written before it.
TEST_CASE("run log and corpus I/O reach a fault-injecting Env", "[unit]") {
  using Op = ckpt::FaultInjectionEnv::Op;
  ckpt::testing::ScratchDir dir("engine-runlog");
  const std::string path = dir / "trainlog.jsonl";
  {
    auto log = RunLog::Open(path);
    REQUIRE(log.ok());
    REQUIRE(log->Append("{\"step\": 1}").ok());
  }
  {
    ckpt::FaultInjectionEnv env(nullptr);
    env.FailAt(Op::kWrite, 1);  // opening the log
    auto log = RunLog::Open(path, &env);
    REQUIRE_FALSE(log.ok());
    CHECK(log.status().message().find(path) != std::string::npos);
    CHECK(env.failed_step() == "open for appending " + path);
  }
  {
    ckpt::FaultInjectionEnv env(nullptr);
    env.FailAt(Op::kWrite, 2);  // the first line
    auto log = RunLog::Open(path, &env);
    REQUIRE(log.ok());
    const ckpt::Status s = log->Append("{\"step\": 2}");
    REQUIRE_FALSE(s.ok());
    CHECK(s.ToString().find("run log: injected fault at write " + path) != std::string::npos);
    REQUIRE(log->Append("{\"step\": 2}").ok());  // the next write goes through
  }
  CHECK(ckpt::testing::Slurp(path) == "{\"step\": 1}\n{\"step\": 2}\n");

  ckpt::FaultInjectionEnv env(nullptr);
  env.FailAt(Op::kRead, 1);
  auto corpus = Corpus::Load(DefaultCorpusPath(), 8, 48, &env);
  REQUIRE_FALSE(corpus.ok());
  CHECK(corpus.status().message().find("corpus: injected fault at read " + DefaultCorpusPath()) !=
        std::string::npos);
}
