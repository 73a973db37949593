// Hand-checked cases of the training / inference formulas (seed 004; Korthikanti et al. 2022,
// Table 2). Shape: GPT-3 175B (L=96, h=12288, a=96, s=2048, V=50257), b=1, t=8, where
// sbh = 2048 * 12288 = 25165824 and 5as/(ht) = 5*96*2048/(12288*8) = 10 exactly.
#include <catch2/catch.hpp>

#include "estimate/transformer_memory.h"

namespace est = ckpt::estimate;

namespace {

const est::TransformerShape kGpt3{96, 12288, 96, 50257, 2048};
constexpr int64_t kSbh = 2048LL * 12288;

int64_t PerLayer(int64_t t, bool sp, est::Recompute r, const est::TransformerShape& s = kGpt3) {
  auto v = est::ActivationBytesPerLayer(s, 1, t, sp, r);
  REQUIRE(v.ok());
  return *v;
}

const est::MemoryItem& Item(const est::MemoryEstimate& e, const std::string& name) {
  for (const auto& i : e.items) {
    if (i.name == name) return i;
  }
  FAIL("no item " << name);
  return e.items.front();
}

}  // namespace

TEST_CASE("parameter count from the shape: 12Lh^2 + 13Lh + (V+s)h", "[unit]") {
  auto p = est::TransformerParams(kGpt3);
  REQUIRE(p.ok());
  CHECK(*p == 174604234752);  // "175B"
  CHECK(!est::TransformerParams({0, 12288, 96, 50257, 2048}).ok());
}

TEST_CASE("activation bytes per layer follow Korthikanti Table 2 in every case", "[unit]") {
  using R = est::Recompute;
  // No parallelism: sbh(34 + 5as/h) = sbh(34 + 80).
  CHECK(PerLayer(1, false, R::kNone) == kSbh * 114);
  // Tensor parallel baseline: sbh(10 + 24/t + 5as/(ht)) = sbh(10 + 3 + 10).
  CHECK(PerLayer(8, false, R::kNone) == kSbh * 23);
  // Tensor + sequence parallel: sbh(34/t + 5as/(ht)) = sbh(4.25 + 10).
  CHECK(PerLayer(8, true, R::kNone) == kSbh * 57 / 4);
  // Selective recomputation + TP: sbh(10 + 24/t).
  CHECK(PerLayer(8, false, R::kSelective) == kSbh * 13);
  // Selective recomputation + TP + SP: sbh(34/t).
  CHECK(PerLayer(8, true, R::kSelective) == kSbh * 34 / 8);
  // Full recomputation: 2sbh (the layer input only); split by t under SP.
  CHECK(PerLayer(8, false, R::kFull) == 2 * kSbh);
  CHECK(PerLayer(8, true, R::kFull) == 2 * kSbh / 8);
  // t = 1 collapses the TP formulas to the unparallelised ones.
  CHECK(PerLayer(1, false, R::kSelective) == kSbh * 34);
  CHECK(PerLayer(1, true, R::kNone) == PerLayer(1, false, R::kNone));
  // Sizes not divisible by t round up to whole bytes: s=3, b=1, h=2, a=1, t=2:
  // 10*6 + ceil((24*6 + 5*1*9*1) / 2) = 60 + ceil(189 / 2) = 155.
  CHECK(PerLayer(2, false, R::kNone, {1, 2, 1, 10, 3}) == 155);
}

TEST_CASE("training memory: weights, gradients, optimizer, activations", "[unit]") {
  est::TrainConfig c;
  c.shape = kGpt3;
  c.tp = 8;
  c.pp = 8;
  c.dp = 4;
  c.sequence_parallel = true;
  c.recompute = est::Recompute::kSelective;
  c.zero_stage = 1;
  auto e = est::EstimateTraining(c);
  REQUIRE(e.ok());
  const int64_t p = 174604234752;
  const int64_t local = (p + 63) / 64;  // ceil(P / (tp*pp)) = 2728191168
  CHECK(local == 2728191168);
  CHECK(Item(*e, "weights").bytes == local * 2);        // bf16
  CHECK(Item(*e, "gradients").bytes == local * 2);      // not sharded before ZeRO-2
  CHECK(Item(*e, "optimizer").bytes == local / 4 * 12); // ZeRO-1: /dp, 4 master + 4 + 4
  CHECK(Item(*e, "activations").bytes == 96 * (kSbh * 34 / 8));
  CHECK(e->total_bytes == local * 4 + local / 4 * 12 + 96 * (kSbh * 34 / 8));

  c.zero_stage = 3;
  c.optimizer = est::OptimizerKind::kAdam8bit;
  auto z3 = est::EstimateTraining(c);
  REQUIRE(z3.ok());
  CHECK(Item(*z3, "weights").bytes == local / 4 * 2);
  CHECK(Item(*z3, "gradients").bytes == local / 4 * 2);
  CHECK(Item(*z3, "optimizer").bytes == local / 4 * 6);  // 4 master + 1 + 1

  // fp32 training: no master copy (8 bytes of Adam moments), 4-byte weights and gradients,
  // activations doubled.
  est::TrainConfig f;
  f.shape = {2, 64, 4, 100, 16};
  f.params = 1000;
  f.dtype = ckpt::DType::kF32;
  auto fp = est::EstimateTraining(f);
  REQUIRE(fp.ok());
  CHECK(Item(*fp, "weights").bytes == 4000);
  CHECK(Item(*fp, "gradients").bytes == 4000);
  CHECK(Item(*fp, "optimizer").bytes == 8000);
  // sbh(34 + 5as/h) per layer = 16*64*34 + 5*4*16*16 = 34816 + 5120; x2 layers x2 bytes.
  CHECK(Item(*fp, "activations").bytes == 2 * 2 * (34816 + 5120));
  CHECK(!fp->not_counted.empty());
}

TEST_CASE("training memory refuses bad input", "[unit]") {
  est::TrainConfig c;
  c.shape = kGpt3;
  c.zero_stage = 4;
  CHECK(!est::EstimateTraining(c).ok());
  c.zero_stage = 0;
  c.tp = 7;  // does not divide 96 heads
  CHECK(!est::EstimateTraining(c).ok());
  c.tp = 1;
  c.dp = 0;
  CHECK(!est::EstimateTraining(c).ok());
  c.dp = 1;
  c.dtype = ckpt::DType::kI32;
  CHECK(!est::EstimateTraining(c).ok());
  CHECK(!est::ParseRecompute("some").ok());
  CHECK(!est::ParseOptimizer("sgd").ok());
}

TEST_CASE("inference memory: weights and KV cache", "[unit]") {
  // A 7B-class shape: L=32, h=4096, a=32; GQA with 8 KV heads, batch 1, 4096 tokens, bf16:
  // KV = 2 * 32 * 1 * 4096 * 8 * 128 * 2 = 512 MiB; full MHA is 4x that.
  est::InferConfig c;
  c.shape = {32, 4096, 32, 32000, 4096};
  c.params = 7000000000;
  c.kv_heads = 8;
  c.context = 4096;
  auto e = est::EstimateInference(c);
  REQUIRE(e.ok());
  CHECK(Item(*e, "weights").bytes == 14000000000);
  CHECK(Item(*e, "kv_cache").bytes == 536870912);
  c.kv_heads = 0;
  c.batch = 2;
  c.tp = 2;
  auto mha = est::EstimateInference(c);
  REQUIRE(mha.ok());
  CHECK(Item(*mha, "weights").bytes == 7000000000);
  CHECK(Item(*mha, "kv_cache").bytes == 2LL * 32 * 2 * 4096 * 16 * 128 * 2);
  c.kv_heads = 5;  // does not divide 32
  CHECK(!est::EstimateInference(c).ok());
}
