// ckpt next-update / verify / verify-resume on checkpoints written by the format library (no
// engine needed): the seed-001 fixture reproduces the seed's figures, random states match
// torch.optim.AdamW and an fp64 AdamW, and bad inputs get a clear message and exit code.
#include "verify/next_update.h"

#include <catch2/catch.hpp>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>

#include "ckpt/reader.h"
#include "safetensors/safetensors.h"
#include "seed001_lab.h"
#include "test_util.h"
#include "verify/nccl_combine.h"
#include "verify/resume.h"
#include "verify/trainlog.h"
#include "verify_test_util.h"

namespace {

using namespace ckpt;
using namespace ckpt::testing;
using namespace ckpt::verify;
namespace fs = std::filesystem;

const std::string kSeedDir = std::string(CKPT_SOURCE_DIR) + "/tests/data/seed001";

std::string Fixed8(double x) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.8f", x);
  return buf;
}

float ReadScalar(const std::string& file, const std::string& name) {
  auto h = safetensors::ReadSafetensorsHeader(file);
  REQUIRE(h.ok());
  auto t = safetensors::ReadSafetensorsTensorF32(file, *h, name);
  REQUIRE(t.ok());
  REQUIRE(t->size() == 1);
  return (*t)[0];
}

TEST_CASE("seed-001 fixture holds the ownership lab's state", "[io]") {
  auto reader = CheckpointReader::Open(kSeedDir + "/ckpt");
  REQUIRE(reader.ok());
  const auto lab = OwnershipLab();
  REQUIRE(lab.size() == 11);
  // The seed's own check of the lab: the first-step update of weight 1 with gradient 2.
  const LabState first = LabAdamStep({1.0, 0.0, 0.0}, 2.0, 1);
  CHECK(std::fabs(first.weight - (1.0 - 0.01 * 2.0 / (2.0 + 1e-8))) < 1e-12);
  for (size_t i = 0; i < lab.size(); ++i) {
    char name[32];
    std::snprintf(name, sizeof name, "lab.p%02zu", i);
    auto w = reader->ReadParamFull(name, "master");
    auto m = reader->ReadParamFull(name, "exp_avg");
    auto v = reader->ReadParamFull(name, "exp_avg_sq");
    REQUIRE((w.ok() && m.ok() && v.ok()));
    CHECK((*w)[0] == static_cast<float>(lab[i].weight));
    CHECK((*m)[0] == static_cast<float>(lab[i].first));
    CHECK((*v)[0] == static_cast<float>(lab[i].second));
  }
  CHECK(reader->manifest().counters.global_step == 5);
}

TEST_CASE("next-update reproduces seed 001's worked example", "[io]") {
  ScratchDir dir("verify-seed001");
  NextUpdateOptions o;
  o.root = kSeedDir + "/ckpt";
  o.grad_file = kSeedDir + "/grad_step6.safetensors";
  o.device = Device::kCpu;
  o.out_dir = dir / "out";
  auto r = RunNextUpdate(o);
  REQUIRE(r.ok());
  CHECK(r->hyper.step == 5);  // five updates applied; bias correction uses t = 6
  CHECK(r->hyper.lr == 0.01);
  CHECK(r->hyper.weight_decay == 0.0);
  CHECK_FALSE(r->matches_reference.has_value());
  REQUIRE(r->tensors.size() == 11);
  REQUIRE(r->tensors[0].name == "lab.p00");
  const float full = ReadScalar(dir / "out/full_state.safetensors", "lab.p00");
  const float dropped = ReadScalar(dir / "out/moments_dropped.safetensors", "lab.p00");
  const float fresh = ReadScalar(dir / "out/weights_only.safetensors", "lab.p00");
  CHECK(Fixed8(full) == "0.01977263");
  CHECK(Fixed8(dropped) == "0.01900607");
  CHECK(Fixed8(r->tensors[0].stats.moments_dropped.max_abs) == "0.00076656");
  // A fresh optimizer (t = 1) moves the weight by about lr: a different, larger gap.
  CHECK(std::fabs(double(fresh) - double(full)) > 0.001);
  CHECK(r->overall.moments_dropped.n_differ == 11);

  // The same through the CLI, as JSON.
  auto cli = RunCkpt("next-update " + o.root + " --grad " + o.grad_file + " --device cpu --json");
  INFO(cli.err);
  REQUIRE(cli.rc == 0);
  auto j = nlohmann::json::parse(cli.out);
  CHECK(j["device"] == "cpu");
  CHECK(j["hyper"]["step"] == 5);
  CHECK(j["hyper"]["lr"] == 0.01);
  CHECK(j["hyper"]["beta1"] == 0.9);
  CHECK(j["hyper"]["beta2"] == 0.999);
  CHECK(j["hyper"]["eps"] == 1e-8);
  CHECK(j["hyper"]["weight_decay"] == 0.0);
  CHECK(j["matches_reference"].is_null());
  CHECK(Fixed8(j["tensors"][0]["moments_dropped"]["max_abs"].get<double>()) == "0.00076656");
  CHECK(j["tensors"][0]["name"] == "lab.p00");
  for (const char* path : {"weights_only", "moments_dropped"}) {
    for (const char* field : {"max_abs", "rel_l2", "frac_differ"}) {
      CHECK(j["overall"][path][field].is_number());
    }
  }
  CHECK(j["overall"]["moments_dropped"]["frac_differ"] == 1.0);
}

TEST_CASE("next-update matches torch.optim.AdamW and fp64 within 1e-6", "[io][torch]") {
  if (!fs::exists("/usr/bin/python3") ||
      RunShell("/usr/bin/python3 -c 'import torch, numpy' > /dev/null 2>&1") != 0) {
    WARN("skipped: /usr/bin/python3 with torch and numpy is not installed");
    return;
  }
  for (auto [world, stage] : {std::pair{3, 3}, std::pair{2, 1}, std::pair{1, 0}}) {
    ScratchDir dir("verify-torch");
    const RandomState s = MakeRandomState(1000 + world * 10 + stage, 6 + stage);
    REQUIRE(WriteStateCheckpoint(dir / "ckpt", s, world, stage).ok());
    for (const char* k : {"w", "m", "v", "g"}) {
      REQUIRE(WriteStateTensors(dir / (std::string(k) + ".safetensors"), s, k).ok());
    }
    auto cli = RunCkpt("next-update " + dir / "ckpt" + " --grad " + dir / "g.safetensors" +
                       " --device cpu --out " + dir / "out");
    INFO(cli.err);
    REQUIRE(cli.rc == 0);
    char args[256];
    std::snprintf(args, sizeof args, " %.17g %.17g %.17g %.17g %.17g %lld", s.hyper.lr,
                  s.hyper.beta1, s.hyper.beta2, s.hyper.eps, s.hyper.weight_decay,
                  static_cast<long long>(s.hyper.step));
    const std::string log = dir / "torch.log";
    const int rc = RunShell("/usr/bin/python3 " + std::string(CKPT_SOURCE_DIR) +
                            "/tests/verify/torch_adamw_check.py " + dir.str() + " " + dir / "out" +
                            args + " > " + log + " 2>&1");
    INFO("world " << world << " ZeRO-" << stage << ": " << Slurp(log));
    CHECK(rc == 0);
  }
}

TEST_CASE("weights-only gap is positive on a trained state", "[io]") {
  ScratchDir dir("verify-gap");
  const RandomState s = MakeRandomState(7, 20);
  REQUIRE(WriteStateCheckpoint(dir / "ckpt", s, 2, 2).ok());
  REQUIRE(WriteStateTensors(dir / "g.safetensors", s).ok());
  NextUpdateOptions o;
  o.root = dir / "ckpt";
  o.grad_file = dir / "g.safetensors";
  o.device = Device::kCpu;
  auto r = RunNextUpdate(o);
  REQUIRE(r.ok());
  const PathReport wo = MakePathReport(r->overall, r->overall.weights_only);
  const PathReport md = MakePathReport(r->overall, r->overall.moments_dropped);
  CHECK(wo.max_abs > 0);
  CHECK(wo.rel_l2 > 0);
  CHECK(wo.frac_differ > 0.5);
  CHECK(md.max_abs > 0);
  CHECK(wo.update_norm_full > 0);
  CHECK(r->tensors.size() == s.params.size());
}

TEST_CASE("bad inputs: clear messages and documented exit codes", "[io]") {
  ScratchDir dir("verify-bad");
  const RandomState s = MakeRandomState(3);
  REQUIRE(WriteStateCheckpoint(dir / "ckpt", s, 2, 1).ok());
  const std::string root = dir / "ckpt";

  SECTION("gradient with a wrong name") {
    RandomState t = s;
    t.params[1].name = "block0.attn.wieght";
    REQUIRE(WriteStateTensors(dir / "g.safetensors", t).ok());
    auto cli = RunCkpt("next-update " + root + " --grad " + dir / "g.safetensors");
    CHECK(cli.rc == 2);
    CHECK(cli.err.find("missing tensor 'block0.attn.weight'") != std::string::npos);
    CHECK(cli.err.find("'block0.attn.wieght' is not a parameter") != std::string::npos);
  }
  SECTION("gradient with a wrong shape") {
    RandomState t = s;
    t.params[0].shape = {8, 37};
    REQUIRE(WriteStateTensors(dir / "g.safetensors", t).ok());
    auto cli = RunCkpt("next-update " + root + " --grad " + dir / "g.safetensors" + " --json");
    CHECK(cli.rc == 2);
    CHECK(cli.err.find("'embed.weight' has shape [8,37], the checkpoint's parameter is [37,8]") !=
          std::string::npos);
    auto j = nlohmann::json::parse(cli.out);
    CHECK(j["error"]["code"] == "InvalidArgument");
  }
  SECTION("no gradient for a checkpoint engine_min did not write") {
    auto cli = RunCkpt("next-update " + root);
    CHECK(cli.rc == 2);
    CHECK(cli.err.find("pass --grad") != std::string::npos);
  }
  SECTION("missing gradient file") {
    auto cli = RunCkpt("next-update " + root + " --grad " + dir / "nope.safetensors");
    CHECK(cli.rc == 2);
    CHECK(cli.err.find("nope.safetensors") != std::string::npos);
  }
  SECTION("corrupt optimizer state is data loss (exit 1)") {
    REQUIRE(WriteStateTensors(dir / "g.safetensors", s).ok());
    // Flip one byte inside rank 1's exp_avg values: find them by their bytes.
    auto reader = CheckpointReader::Open(root);
    REQUIRE(reader.ok());
    auto exp_avg = reader->ReadDatasetBytes(1, "exp_avg");
    REQUIRE(exp_avg.ok());
    const std::string needle(reinterpret_cast<const char*>(exp_avg->data()) + 8, 32);
    REQUIRE(FlipByteAfter(root + "/global_step7/rank_00001.h5", needle, 3, 0x40) >= 1);
    auto cli = RunCkpt("next-update " + root + " --grad " + dir / "g.safetensors");
    CHECK(cli.rc == 1);
    CHECK(cli.err.find("exp_avg") != std::string::npos);
    auto ci = RunCkpt("verify " + root + " --junit " + dir / "junit.xml");
    CHECK(ci.rc == 1);
    const std::string junit = Slurp(dir / "junit.xml");
    CHECK(junit.find("<failure") != std::string::npos);
    CHECK(junit.find("name=\"deep_check\"") != std::string::npos);
  }
  SECTION("next-update --out is staged: a non-empty OUT is refused, a failure leaves nothing") {
    REQUIRE(WriteStateTensors(dir / "g.safetensors", s).ok());
    fs::create_directories(dir / "busy");
    std::ofstream(dir / "busy/keep.txt") << "mine";
    auto busy = RunCkpt("next-update " + root + " --grad " + dir / "g.safetensors" + " --out " +
                        dir / "busy");
    CHECK(busy.rc == 2);
    CHECK(busy.err.find("is not empty") != std::string::npos);
    CHECK(Slurp(dir / "busy/keep.txt") == "mine");
    CHECK(std::distance(fs::directory_iterator(dir / "busy"), fs::directory_iterator()) == 1);

    // A rank file the pass would read nothing from (ZeRO-0: rank 1 holds no optimizer
    // state) truncated: data loss (exit 1) as for check/export/reshard, and no OUT at all.
    ScratchDir z("verify-zero0");
    REQUIRE(WriteStateCheckpoint(z / "ckpt", s, 2, 0).ok());
    const std::string rank1 = z / "ckpt/global_step7/rank_00001.h5";
    fs::resize_file(rank1, fs::file_size(rank1) / 2);
    auto trunc = RunCkpt("next-update " + z / "ckpt" + " --grad " + dir / "g.safetensors" +
                         " --out " + dir / "fresh");
    CHECK(trunc.rc == 1);
    CHECK(trunc.err.find("rank_00001.h5 has") != std::string::npos);
    CHECK(!fs::exists(dir / "fresh"));
    for (const auto& e : fs::directory_iterator(dir.path())) {
      CHECK(e.path().filename().string().rfind(".tmp-", 0) != 0);
    }
    auto check = RunCkpt("check " + z / "ckpt");
    CHECK(check.rc == 1);

    auto ok = RunCkpt("next-update " + root + " --grad " + dir / "g.safetensors" + " --out " +
                      dir / "fresh");
    CHECK(ok.rc == 0);
    CHECK(fs::exists(dir / "fresh/full_state.safetensors"));
    CHECK(fs::exists(dir / "fresh/weights_only.safetensors"));
    CHECK(fs::exists(dir / "fresh/moments_dropped.safetensors"));
  }
  SECTION("a checkpoint with another writer's engine_config: pass --grad, nothing launched") {
    auto synth = RunCkpt("synth " + dir / "synth" + " --ranks 2 --params 2k");
    REQUIRE(synth.rc == 0);
    for (const std::string cmd : {"next-update ", "verify-resume "}) {
      auto cli = RunCkpt(cmd + dir / "synth" + " --steps 1");
      if (cmd == "next-update ") cli = RunCkpt(cmd + dir / "synth");
      INFO(cmd << cli.err);
      CHECK(cli.rc == 2);
      CHECK(cli.err.find("this checkpoint has no engine config") != std::string::npos);
      CHECK(cli.err.find("mpirun") == std::string::npos);
      CHECK(cli.err.find("engine_min grad exited") == std::string::npos);
    }
    auto ci = RunCkpt("verify " + dir / "synth" + " --json");
    CHECK(ci.rc == 0);
    auto j = nlohmann::json::parse(ci.out);
    CHECK(j["cases"][1]["message"].get<std::string>().find("no engine config") !=
          std::string::npos);
    CHECK(j["cases"][2]["message"] == "skipped: this checkpoint has no engine config: pass --grad");
  }
  SECTION("verify-resume on a corrupt checkpoint is a finding (exit 1), nothing launched") {
    ScratchDir eng("verify-corrupt");
    REQUIRE(WriteStateCheckpoint(eng / "ckpt", s, 2, 1, {{"model", "tiny"}, {"global_batch", 8}})
                .ok());
    std::ofstream(eng / "ckpt/trainlog.jsonl")
        << R"({"step": 8, "loss": 1.5, "grad_norm": 0.5, "lr": 0.001, "tokens": 64, "weights_xxh3": "0000000000000001", "exp_avg_xxh3": "0000000000000002", "exp_avg_sq_xxh3": "0000000000000003"})"
        << "\n";
    const std::string file = eng / "ckpt/global_step7/rank_00001.h5";
    std::string bytes = Slurp(file);
    bytes[bytes.size() - 9] ^= 0x40;
    Spit(file, bytes);
    auto cli = RunCkpt("verify-resume " + eng / "ckpt" + " --steps 1 --json");
    INFO(cli.err);
    CHECK(cli.rc == 1);
    CHECK(cli.err.find("is corrupt") != std::string::npos);
    CHECK(nlohmann::json::parse(cli.out)["error"]["code"] == "DataLoss");
  }
  SECTION("verify-resume needs an engine checkpoint and a reference log") {
    auto cli = RunCkpt("verify-resume " + root + " --steps 1");
    CHECK(cli.rc == 2);
    CHECK(cli.err.find("this checkpoint has no engine config") != std::string::npos);
    ScratchDir eng("verify-noref");
    REQUIRE(WriteStateCheckpoint(eng / "ckpt", s, 2, 1, {{"model", "tiny"}, {"global_batch", 8}})
                .ok());
    auto noref = RunCkpt("verify-resume " + eng / "ckpt" + " --steps 1 --json");
    CHECK(noref.rc == 2);
    CHECK(noref.err.find("trainlog.jsonl not found") != std::string::npos);
    CHECK(nlohmann::json::parse(noref.out)["error"]["code"] == "NotFound");
    std::ofstream(eng / "ckpt/trainlog.jsonl")
        << R"({"step": 8, "loss": 1.5, "grad_norm": 0.5, "lr": 0.001, "tokens": 64, "weights_xxh3": "0000000000000001", "exp_avg_xxh3": "0000000000000002", "exp_avg_sq_xxh3": "0000000000000003"})"
        << "\n";
    auto short_log = RunCkpt("verify-resume " + eng / "ckpt" + " --steps 3");
    CHECK(short_log.rc == 2);
    // Without --tag: no tag is followed by 3 logged steps; the message names what would work.
    CHECK(short_log.err.find("is followed by 3 logged step(s)") != std::string::npos);
    CHECK(short_log.err.find("tags that would work: global_step7 (--steps <= 1)") !=
          std::string::npos);
    auto short_tag = RunCkpt("verify-resume " + eng / "ckpt" + " --tag global_step7 --steps 3");
    CHECK(short_tag.rc == 2);
    CHECK(short_tag.err.find("no entry for step 9") != std::string::npos);
    CHECK(short_tag.err.find("choose --steps <= 1") != std::string::npos);
    auto bad_ablate = RunCkpt("verify-resume " + eng / "ckpt" + " --steps 1 --ablate weights");
    CHECK(bad_ablate.rc == 2);
    CHECK(bad_ablate.err.find("unknown component 'weights'") != std::string::npos);
  }
  SECTION("corrupt optimizer state is data loss in a split run too (exit 1)") {
    REQUIRE(WriteStateTensors(dir / "g.safetensors", s).ok());
    auto reader = CheckpointReader::Open(root);
    REQUIRE(reader.ok());
    auto master = reader->ReadDatasetBytes(0, "master");
    REQUIRE(master.ok());
    const std::string needle(reinterpret_cast<const char*>(master->data()) + 8, 32);
    REQUIRE(FlipByteAfter(root + "/global_step7/rank_00000.h5", needle, 5, 0x10) >= 1);
    auto cli = RunCkpt("next-update " + root + " --grad " + dir / "g.safetensors" +
                       " --device cpu --procs 2 --json");
    CHECK(cli.rc == 1);
    CHECK(cli.err.find("worker") != std::string::npos);
    CHECK(cli.err.find("rank_00000.h5") != std::string::npos);
    CHECK(nlohmann::json::parse(cli.out)["error"]["code"] == "DataLoss");
  }
  SECTION("process counts: --gpus is for CUDA, --procs for the CPU") {
    REQUIRE(WriteStateTensors(dir / "g.safetensors", s).ok());
    const std::string grad = " --grad " + dir / "g.safetensors";
    auto gpus_on_cpu = RunCkpt("next-update " + root + grad + " --device cpu --gpus 2");
    CHECK(gpus_on_cpu.rc == 2);
    CHECK(gpus_on_cpu.err.find("--gpus needs --device cuda") != std::string::npos);
    auto procs_on_cuda = RunCkpt("next-update " + root + grad + " --device cuda --procs 2");
    CHECK(procs_on_cuda.rc == 2);
    auto zero = RunCkpt("next-update " + root + grad + " --device cpu --procs 0");
    CHECK(zero.rc == 2);
    if (CudaDeviceCount() == 0) {
      auto no_gpu = RunCkpt("next-update " + root + grad + " --device cuda --gpus 2");
      CHECK(no_gpu.rc == 2);
    }
  }
  SECTION("split workers run next_update_worker, not ckpt with hidden flags") {
    auto hidden = RunCkpt("next-update " + root + " --worker-rank 0 --worker-world 1");
    CHECK(hidden.rc == 2);
    CHECK(hidden.err.find("--worker-rank") != std::string::npos);
    const std::string worker = BinDir() + "/next_update_worker";
    CHECK(RunShell(worker + " > /dev/null 2>&1") == 2);
    // A directory without a job: the error is published where the launcher looks for it.
    CHECK(RunShell(worker + " " + dir.str() + " 0 2> " + dir / "worker.err") == 2);
    CHECK(Slurp(dir / "worker.err").find("no split next-update job") != std::string::npos);
    CHECK(Slurp(dir / "rank0.error").find("no split next-update job") != std::string::npos);
  }
  SECTION("unknown device") {
    auto cli = RunCkpt("next-update " + root + " --device tpu");
    CHECK(cli.rc == 2);
  }
  SECTION("missing checkpoint") {
    auto cli = RunCkpt("next-update " + dir / "nowhere" + " --grad x");
    CHECK(cli.rc == 2);
  }
}

// A state whose largest tensor is split inside (SplitElements cuts at multiples of 4096).
RandomState SplitState() {
  RandomState s = MakeRandomState(77);
  std::mt19937 rng(78);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  RandomParam big;
  big.name = "block1.mlp.weight";
  big.shape = {3, 4100};
  for (int i = 0; i < 3 * 4100; ++i) {
    big.w.push_back(0.5f * normal(rng));
    big.m.push_back(0.01f * normal(rng));
    const float sq = 0.01f * normal(rng);
    big.v.push_back(sq * sq + 1e-6f);
    big.g.push_back(0.02f * normal(rng));
  }
  s.params.insert(s.params.begin() + 2, std::move(big));
  return s;
}

// The reference run log is read through ckpt::Env: an injected read failure is a clean error
// that names the file (an I/O error, exit 2), not "not found" and not an empty log.
TEST_CASE("the run log is read through a fault-injecting Env", "[io]") {
  ScratchDir dir("verify-trainlog-fault");
  const std::string log = dir / "trainlog.jsonl";
  Spit(log, R"({"step": 3, "loss": 1.5, "grad_norm": 0.5, "weights_xxh3": "0000000000000001"})"
            "\n");
  REQUIRE(ReadTrainlog(log).ok());
  REQUIRE(ReadTrainlog(log)->count(3) == 1);
  FaultInjectionEnv env(nullptr);
  env.FailAt(FaultInjectionEnv::Op::kRead, 1);
  auto failed = ReadTrainlog(log, &env);
  REQUIRE_FALSE(failed.ok());
  CHECK(failed.status().code() == StatusCode::kIOError);
  CHECK(failed.status().message() == "reference run log: injected fault at read " + log);
  CHECK(ExitCodeFor(failed.status()) == 2);
}

TEST_CASE("next-update split over processes gives the single-process report", "[io]") {
  ScratchDir dir("verify-split");
  const RandomState s = SplitState();
  REQUIRE(WriteStateCheckpoint(dir / "ckpt", s, 3, 3).ok());
  REQUIRE(WriteStateTensors(dir / "g.safetensors", s).ok());
  const std::string base = "next-update " + dir / "ckpt" + " --grad " + dir / "g.safetensors" +
                           " --device cpu --json --reference " + dir / "trainlog.jsonl";
  // The reference log: path (a)'s digest from an --out-less single run, for step 8.
  std::ofstream(dir / "trainlog.jsonl")
      << R"({"step": 8, "loss": 1, "grad_norm": 1, "lr": 0.003, "tokens": 1, "weights_xxh3": "0"})"
      << "\n";
  auto first = RunCkpt(base);
  INFO(first.err);
  REQUIRE(first.rc == 1);  // the made-up digest does not match
  const std::string digest = nlohmann::json::parse(first.out)["digests"]["weights_xxh3"];
  std::ofstream(dir / "trainlog.jsonl", std::ios::trunc)
      << R"({"step": 8, "loss": 1, "grad_norm": 1, "lr": 0.003, "tokens": 1, "weights_xxh3": ")"
      << digest << "\"}\n";

  auto single = RunCkpt(base + " --out " + dir / "out1");
  INFO(single.err);
  REQUIRE(single.rc == 0);
  const nlohmann::json a = nlohmann::json::parse(single.out);
  CHECK(a["matches_reference"] == true);
  CHECK(a["processes"] == 1);
  for (int procs : {2, 3, 5}) {
    const std::string out = dir / ("out" + std::to_string(procs));
    auto split = RunCkpt(base + " --procs " + std::to_string(procs) + " --out " + out);
    INFO("--procs " << procs << ": " << split.err);
    REQUIRE(split.rc == 0);
    const nlohmann::json b = nlohmann::json::parse(split.out);
    CHECK(b["processes"] == procs);
    CHECK(b["matches_reference"] == true);
    CHECK(b["digests"] == a["digests"]);
    CHECK(b["elements"] == a["elements"]);
    CHECK(b["hyper"] == a["hyper"]);
    for (const char* f :
         {"full_state.safetensors", "weights_only.safetensors", "moments_dropped.safetensors"}) {
      CHECK(Slurp(dir / ("out1/" + std::string(f))) == Slurp(out + "/" + f));
    }
    // Max and counts exactly; sums of squares are added in another order: 1e-12 relative.
    auto same_path = [](const nlohmann::json& x, const nlohmann::json& y) {
      CHECK(x["max_abs"] == y["max_abs"]);
      CHECK(x["n_differ"] == y["n_differ"]);
      CHECK(x["frac_differ"] == y["frac_differ"]);
      for (const char* k : {"rel_l2", "rel_update", "update_norm", "update_norm_full"}) {
        const double u = x[k].get<double>(), v = y[k].get<double>();
        INFO(k << " " << u << " vs " << v);
        CHECK(std::fabs(u - v) <= 1e-12 * std::fabs(u));
      }
    };
    REQUIRE(b["tensors"].size() == a["tensors"].size());
    for (size_t t = 0; t < a["tensors"].size(); ++t) {
      INFO("tensor " << a["tensors"][t]["name"]);
      CHECK(b["tensors"][t]["name"] == a["tensors"][t]["name"]);
      same_path(a["tensors"][t]["weights_only"], b["tensors"][t]["weights_only"]);
      same_path(a["tensors"][t]["moments_dropped"], b["tensors"][t]["moments_dropped"]);
    }
    same_path(a["overall"]["weights_only"], b["overall"]["weights_only"]);
    same_path(a["overall"]["moments_dropped"], b["overall"]["moments_dropped"]);
  }
}

TEST_CASE("next-update split over GPUs (NCCL) gives the one-GPU report", "[io][cuda]") {
  std::string why;
  const int gpus = CudaDeviceCount(&why);
  if (gpus < 2 || !HaveNcclCombine()) {
    WARN("[cuda] skipped: needs two GPUs and NCCL ("
         << (gpus == 0 ? why : std::to_string(gpus) + " GPU(s)")
         << (HaveNcclCombine() ? "" : ", built without NCCL") << ")");
    return;
  }
  ScratchDir dir("verify-split-gpu");
  const RandomState s = SplitState();
  REQUIRE(WriteStateCheckpoint(dir / "ckpt", s, 2, 2).ok());
  REQUIRE(WriteStateTensors(dir / "g.safetensors", s).ok());
  const std::string base =
      "next-update " + dir / "ckpt" + " --grad " + dir / "g.safetensors" + " --device cuda --json";
  auto one = RunCkpt(base + " --gpus 1 --out " + dir / "one");
  INFO(one.err);
  REQUIRE(one.rc == 0);
  auto all = RunCkpt(base + " --gpus " + std::to_string(gpus) + " --out " + dir / "all");
  INFO(all.err);
  REQUIRE(all.rc == 0);
  const nlohmann::json a = nlohmann::json::parse(one.out), b = nlohmann::json::parse(all.out);
  CHECK(b["processes"] == gpus);
  CHECK(b["devices"].size() == static_cast<size_t>(gpus));
  CHECK(b["digests"] == a["digests"]);
  CHECK(Slurp(dir / "one/full_state.safetensors") == Slurp(dir / "all/full_state.safetensors"));
  for (const char* path : {"weights_only", "moments_dropped"}) {
    CHECK(b["overall"][path]["max_abs"] == a["overall"][path]["max_abs"]);
    CHECK(b["overall"][path]["n_differ"] == a["overall"][path]["n_differ"]);
    const double x = a["overall"][path]["rel_l2"], y = b["overall"][path]["rel_l2"];
    CHECK(std::fabs(x - y) <= 1e-12 * std::fabs(x));
  }
}

TEST_CASE("ckpt verify passes a healthy checkpoint and writes JUnit", "[io]") {
  ScratchDir dir("verify-ci");
  const RandomState s = MakeRandomState(5);
  REQUIRE(WriteStateCheckpoint(dir / "ckpt", s, 2, 3).ok());
  REQUIRE(WriteStateTensors(dir / "g.safetensors", s).ok());
  auto cli = RunCkpt("verify " + dir / "ckpt" + " --grad " + dir / "g.safetensors" + " --junit " +
                     dir / "junit.xml --json");
  INFO(cli.out << cli.err);
  CHECK(cli.rc == 0);
  auto j = nlohmann::json::parse(cli.out);
  CHECK(j["ok"] == true);
  REQUIRE(j["cases"].size() == 3);
  CHECK(j["cases"][0]["outcome"] == "passed");
  CHECK(j["cases"][1]["outcome"] == "skipped");  // not an engine checkpoint: nothing to relaunch
  CHECK(j["cases"][2]["outcome"] == "passed");
  const std::string junit = Slurp(dir / "junit.xml");
  CHECK(junit.find("<testsuite name=\"ckpt verify\" tests=\"3\" failures=\"0\"") !=
        std::string::npos);
  CHECK(junit.find("<skipped") != std::string::npos);
}

}  // namespace
