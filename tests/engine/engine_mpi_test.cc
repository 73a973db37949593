// engine_min end to end under mpirun: straight vs save + fresh processes + resume, bitwise, for
// ZeRO 0-3 × DP 1, 2, 4 × grad-accum 1, 4; the RNG (and every other component) being restored;
// a rank dying mid-save; refusals that leave the disk alone; `grad`; and the loss falling.
#include <catch2/catch.hpp>
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "ckpt/reader.h"
#include "ckpt/root.h"
#include "safetensors/safetensors.h"
#include "engine_run.h"
#include "test_util.h"

namespace fs = std::filesystem;
using namespace ckpt::testing;

namespace {

// Small enough that the whole matrix runs in a couple of minutes on 2 cores.
const std::string kModel = "--model tiny --d-model 32 --layers 2 --context 8 --sample-max 24";

nlohmann::json J(const std::string& line) { return nlohmann::json::parse(line); }

void StraightVsResume(int zero, int dp, int accum) {
  ScratchDir dir("engine-resume");
  const std::string common = kModel + " --zero " + std::to_string(zero) +
                             " --micro-batch 1 --grad-accum " + std::to_string(accum) +
                             " --seed 7 --warmup 2";
  const std::string a = dir / "straight", b = dir / "resumed";
  INFO("ZeRO-" << zero << " dp " << dp << " grad-accum " << accum);
  std::string log;
  // Straight: 4 steps. Split: 2 steps + final save, then fresh processes resume for 2 more.
  REQUIRE(Engine(dp, "train " + common + " --steps 4 --ckpt-dir " + a, dir / "a.log", &log) == 0);
  INFO(log);
  // The first launch stops at step 2 of the same 4-step schedule, like a preempted job.
  REQUIRE(Engine(dp, "train " + common + " --steps 2 --lr-decay-steps 4 --ckpt-dir " + b,
                 dir / "b1.log", &log) == 0);
  REQUIRE(Engine(dp, "train --resume --steps 4 --ckpt-dir " + b, dir / "b2.log", &log) == 0);
  const auto la = Lines(a + "/trainlog.jsonl"), lb = Lines(b + "/trainlog.jsonl");
  REQUIRE(la.size() == 4);
  REQUIRE(lb.size() == 4);
  for (size_t i = 0; i < 4; ++i) {
    INFO("trainlog line " << i + 1);
    CHECK(la[i] == lb[i]);
  }
  CHECK(J(la[3])["step"] == 4);
  const auto diffs = CompareCheckpoints(a, b);
  for (const auto& d : diffs) FAIL_CHECK("final checkpoints differ: " << d);
  if (HaveBinary("ckpt")) {
    const CliResult diff = RunCkpt("diff " + a + " " + b);
    INFO(diff.out << diff.err);
    CHECK(diff.rc == 0);
  }
}

}  // namespace

TEST_CASE("straight vs resume is bitwise identical: ZeRO-0", "[mpi][slow]") {
  for (int dp : {1, 2, 4})
    for (int accum : {1, 4}) StraightVsResume(0, dp, accum);
}
TEST_CASE("straight vs resume is bitwise identical: ZeRO-1", "[mpi][slow]") {
  for (int dp : {1, 2, 4})
    for (int accum : {1, 4}) StraightVsResume(1, dp, accum);
}
TEST_CASE("straight vs resume is bitwise identical: ZeRO-2", "[mpi][slow]") {
  for (int dp : {1, 2, 4})
    for (int accum : {1, 4}) StraightVsResume(2, dp, accum);
}
TEST_CASE("straight vs resume is bitwise identical: ZeRO-3", "[mpi][slow]") {
  for (int dp : {1, 2, 4})
    for (int accum : {1, 4}) StraightVsResume(3, dp, accum);
}

TEST_CASE("a run repeats bit for bit, and ZeRO stages agree when they sum alike", "[mpi]") {
  // grad-accum 1 and no clipping: every stage sums each gradient element over ranks in rank
  // order once per step, so all four must produce the same weights and moments bit for bit.
  ScratchDir dir("engine-stages");
  const std::string common = kModel + " --micro-batch 2 --grad-accum 1 --grad-clip 0 --steps 3";
  std::vector<std::vector<std::string>> logs;
  for (int zero : {0, 1, 2, 3}) {
    const std::string d = dir / ("z" + std::to_string(zero));
    REQUIRE(Engine(2,
                   "train " + common + " --zero " + std::to_string(zero) +
                       " --no-final-save --ckpt-dir " + d,
                   dir / "log") == 0);
    logs.push_back(Lines(d + "/trainlog.jsonl"));
    REQUIRE(logs.back().size() == 3);
  }
  for (int zero = 1; zero <= 3; ++zero) {
    for (size_t i = 0; i < 3; ++i) {
      INFO("ZeRO-" << zero << " vs ZeRO-0, step " << i + 1);
      const auto x = J(logs[0][i]), y = J(logs[zero][i]);
      CHECK(x["loss"] == y["loss"]);
      CHECK(x["weights_xxh3"] == y["weights_xxh3"]);
      CHECK(x["exp_avg_xxh3"] == y["exp_avg_xxh3"]);
      CHECK(x["exp_avg_sq_xxh3"] == y["exp_avg_sq_xxh3"]);
    }
  }
  // The same configuration again: identical log.
  const std::string again = dir / "again";
  REQUIRE(Engine(2, "train " + common + " --zero 3 --no-final-save --ckpt-dir " + again,
                 dir / "log") == 0);
  CHECK(Lines(again + "/trainlog.jsonl") == logs[3]);
}

TEST_CASE("the same global batch over other DP x grad-accum gives the same loss", "[mpi]") {
  // What a reshard relies on: the samples of a step do not depend on the topology.
  ScratchDir dir("engine-dp");
  const std::string common = kModel + " --dropout 0 --global-batch 8 --steps 3 --no-final-save";
  struct Topo {
    int dp;
    int micro;
  } topos[] = {{1, 2}, {2, 1}, {4, 2}};
  std::vector<std::vector<std::string>> logs;
  for (const auto& t : topos) {
    const std::string d = dir / ("dp" + std::to_string(t.dp));
    REQUIRE(Engine(t.dp,
                   "train " + common + " --zero 1 --micro-batch " + std::to_string(t.micro) +
                       " --ckpt-dir " + d,
                   dir / "log") == 0);
    logs.push_back(Lines(d + "/trainlog.jsonl"));
    REQUIRE(logs.back().size() == 3);
  }
  for (size_t t = 1; t < logs.size(); ++t) {
    for (size_t i = 0; i < 3; ++i) {
      const double x = J(logs[0][i])["loss"], y = J(logs[t][i])["loss"];
      INFO("topology " << t << " step " << i + 1 << ": " << x << " vs " << y);
      CHECK(std::fabs(x - y) <= 1e-5 * std::fabs(x));
      CHECK(J(logs[0][i])["tokens"] == J(logs[t][i])["tokens"]);
    }
  }
}

TEST_CASE("resuming without restoring a component diverges", "[mpi]") {
  // Dropout on (the preset default), so the dropout generator's state matters.
  ScratchDir dir("engine-ablate");
  const std::string common = kModel + " --zero 2 --micro-batch 1 --grad-accum 2 --warmup 4";
  const std::string straight = dir / "straight";
  REQUIRE(Engine(2, "train " + common + " --steps 3 --ckpt-dir " + straight, dir / "log") == 0);
  const auto ref = Lines(straight + "/trainlog.jsonl");
  REQUIRE(ref.size() == 3);
  const std::string base = dir / "base";
  REQUIRE(Engine(2, "train " + common + " --steps 2 --lr-decay-steps 3 --ckpt-dir " + base,
                 dir / "log") == 0);

  // Control: a faithful resume reproduces step 3 exactly.
  {
    const std::string log = dir / "faithful.jsonl";
    REQUIRE(
        Engine(2,
               "train --resume --steps 3 --no-final-save --ckpt-dir " + base + " --trainlog " + log,
               dir / "log") == 0);
    const auto l = Lines(log);
    REQUIRE(l.size() == 1);
    CHECK(l[0] == ref[2]);
  }
  for (std::string component : {"rng", "moments", "data", "scheduler", "step"}) {
    INFO("--reset-on-resume " << component);
    const std::string log = dir / (component + ".jsonl");
    REQUIRE(Engine(2,
                   "train --resume --steps 3 --no-final-save --reset-on-resume " + component +
                       " --ckpt-dir " + base + " --trainlog " + log,
                   dir / "log") == 0);
    const auto l = Lines(log);
    REQUIRE(!l.empty());
    const auto got = J(l[0]), want = J(ref[2]);
    CHECK(got["weights_xxh3"] != want["weights_xxh3"]);
    if (component == "rng" || component == "data") CHECK(got["loss"] != want["loss"]);
    if (component == "scheduler") CHECK(got["lr"] != want["lr"]);
  }
  // The checkpoint the ablations started from is untouched.
  CHECK(Lines(base + "/trainlog.jsonl").size() == 2);
  auto latest = ckpt::ReadLatest(base);
  REQUIRE(latest.ok());
  CHECK(*latest == "global_step2");
}

TEST_CASE("a rank killed mid-save leaves the previous checkpoint as latest", "[mpi]") {
  ScratchDir dir("engine-kill");
  const std::string root = dir / "run";
  const std::string args = "train " + kModel + " --zero 1 --micro-batch 1 --save-every 2 --steps 4";
  std::string log;
  const int rc =
      Engine(2, args + " --ckpt-dir " + root + " --test-kill-in-save 1:4", dir / "kill.log", &log);
  INFO(log);
  CHECK(rc != 0);
  CHECK(log.find("killing this rank inside the save") != std::string::npos);
  auto latest = ckpt::ReadLatest(root);
  REQUIRE(latest.ok());
  CHECK(*latest == "global_step2");
  CHECK(!fs::exists(root + "/global_step4"));
  auto problems = ckpt::CheckCheckpoint(root + "/global_step2", /*deep=*/true);
  REQUIRE(problems.ok());
  CHECK(problems->empty());
  // Fresh processes resume from it and finish the run, matching an uninterrupted one.
  REQUIRE(Engine(2, "train --resume --ckpt-dir " + root, dir / "resume.log", &log) == 0);
  latest = ckpt::ReadLatest(root);
  REQUIRE(latest.ok());
  CHECK(*latest == "global_step4");
  const std::string clean = dir / "clean";
  REQUIRE(Engine(2, args + " --ckpt-dir " + clean, dir / "clean.log") == 0);
  const auto lines = Lines(root + "/trainlog.jsonl");
  REQUIRE(lines.size() >= 4);
  CHECK(lines.back() == Lines(clean + "/trainlog.jsonl").back());
  for (const auto& d : CompareCheckpoints(root, clean)) FAIL_CHECK("differs: " << d);
}

TEST_CASE("inconsistent batch settings are rejected with a clear message", "[mpi]") {
  ScratchDir dir("engine-batch");
  std::string log;
  const int rc = Engine(2,
                        "train " + kModel +
                            " --micro-batch 2 --grad-accum 2 --global-batch 6 "
                            "--ckpt-dir " +
                            (dir / "run"),
                        dir / "log", &log);
  INFO(log);
  CHECK(rc == 2);
  CHECK(log.find("inconsistent batch settings: global batch 6 != micro-batch 2 x grad-accum 2 "
                 "x 2 data-parallel ranks = 8") != std::string::npos);
  CHECK(!fs::exists(dir / "run"));
}

TEST_CASE("an indivisible batch or a model mismatch on resume is refused and changes nothing",
          "[mpi]") {
  ScratchDir dir("engine-topo");
  const std::string root = dir / "run";
  REQUIRE(Engine(2, "train " + kModel + " --zero 1 --micro-batch 1 --steps 2 --ckpt-dir " + root,
                 dir / "log") == 0);
  auto listing = [&]() {
    std::vector<std::string> names;
    for (const auto& e : fs::recursive_directory_iterator(root)) {
      names.push_back(e.path().string() + ":" +
                      (e.is_regular_file() ? std::to_string(fs::file_size(e.path())) : "d"));
    }
    std::sort(names.begin(), names.end());
    return names;
  };
  const auto before = listing();
  const std::string trainlog = Slurp(root + "/trainlog.jsonl");
  struct Case {
    int n;
    std::string flags;
    std::string expect;
  } cases[] = {
      // Another world size or stage resumes directly (engine_invariant_test); a world size
      // that cannot split the global batch of 2 cannot.
      {3, "", "3 data-parallel ranks cannot split it"},
      {2, " --d-model 48", "model shape differs"},
  };
  for (const auto& c : cases) {
    std::string log;
    const int rc = Engine(c.n, "train --resume --steps 4 --ckpt-dir " + root + c.flags,
                          dir / "refused.log", &log);
    INFO("-n " << c.n << c.flags << ": " << log);
    CHECK(rc == 2);
    CHECK(log.find(c.expect) != std::string::npos);
    CHECK(log.find("nothing on disk was changed") != std::string::npos);
  }
  CHECK(listing() == before);
  CHECK(Slurp(root + "/trainlog.jsonl") == trainlog);
}

TEST_CASE("`engine_min grad` writes the clipped gradient the next step applies", "[mpi]") {
  ScratchDir dir("engine-grad");
  const std::string root = dir / "run";
  // A small clip so that clipping is active.
  REQUIRE(Engine(2,
                 "train " + kModel +
                     " --zero 3 --micro-batch 1 --grad-accum 2 --grad-clip "
                     "0.05 --save-every 2 --steps 3 --ckpt-dir " +
                     root,
                 dir / "log") == 0);
  const auto lines = Lines(root + "/trainlog.jsonl");
  REQUIRE(lines.size() == 3);
  const std::string out = dir / "g.safetensors";
  std::string log;
  REQUIRE(Engine(2, "grad --ckpt-dir " + root + " --resume-tag global_step2 --out " + out,
                 dir / "grad.log", &log) == 0);
  INFO(log);
  auto header = ckpt::safetensors::ReadSafetensorsHeader(out);
  REQUIRE(header.ok());
  // Step 3's norm in the run log is the norm of exactly this gradient before clipping.
  const double logged = J(lines[2])["grad_norm"];
  const double meta = std::stod(header->metadata.at("grad_norm_before_clip"));
  CHECK(meta == logged);
  REQUIRE(logged > 0.05);
  auto reader = ckpt::CheckpointReader::Open(root, "global_step2");
  REQUIRE(reader.ok());
  double sumsq = 0;
  size_t tensors = 0;
  for (const auto& p : reader->manifest().params) {
    if (!p.trainable()) {
      CHECK(header->Find(p.name) == nullptr);
      continue;
    }
    const auto* t = header->Find(p.name);
    REQUIRE(t != nullptr);
    CHECK(t->shape == p.shape);
    auto g = ckpt::safetensors::ReadSafetensorsTensorF32(out, *header, p.name);
    REQUIRE(g.ok());
    for (float x : *g) sumsq += static_cast<double>(x) * x;
    ++tensors;
  }
  CHECK(tensors == 5);
  CHECK(std::sqrt(sumsq) == Approx(0.05).epsilon(1e-4));
  // grad changed nothing on disk.
  CHECK(Lines(root + "/trainlog.jsonl") == lines);
  CHECK(*ckpt::ReadLatest(root) == "global_step3");
}

TEST_CASE("client state and engine config are saved; settings come back on resume", "[mpi]") {
  ScratchDir dir("engine-state");
  const std::string root = dir / "run";
  REQUIRE(Engine(2,
                 "train " + kModel +
                     " --zero 2 --micro-batch 2 --lr 0.002 --steps 2 "
                     "--client-state run=alpha --client-state note=x --ckpt-dir " +
                     root,
                 dir / "log") == 0);
  auto r = ckpt::CheckpointReader::Open(root);
  REQUIRE(r.ok());
  const auto& m = r->manifest();
  CHECK(m.client_state["run"] == "alpha");
  CHECK(m.engine_config["lr"] == 0.002);
  CHECK(m.engine_config["zero"] == 2);
  CHECK(m.engine_config["global_batch"] == 4);
  CHECK(m.optimizer["type"] == "adamw");
  CHECK(m.counters.global_step == 2);
  CHECK(m.counters.micro_step == 2);
  CHECK(m.counters.samples_seen == 8);
  CHECK(m.FindDataset(1, "rng/dropout") != nullptr);
  CHECK(m.FindDataset(1, "rng/shuffle")->blob_kind == "mt19937_64");
  CHECK(m.FindDataset(0, "frozen/pos.weight") != nullptr);
  auto pos = r->ReadJson(1, "data_position");
  REQUIRE(pos.ok());
  CHECK((*pos)["sample_offset"] == 8);
  // Resume with grad-accum 2 (same global batch): allowed; the client state carries over.
  REQUIRE(Engine(2,
                 "train --resume --micro-batch 1 --grad-accum 2 --steps 3 --client-state "
                 "note=y --ckpt-dir " +
                     root,
                 dir / "log") == 0);
  auto r2 = ckpt::CheckpointReader::Open(root);
  REQUIRE(r2.ok());
  CHECK(r2->manifest().client_state["run"] == "alpha");
  CHECK(r2->manifest().client_state["note"] == "y");
  CHECK(r2->manifest().engine_config["lr"] == 0.002);
  CHECK(r2->manifest().engine_config["grad_accum"] == 2);
}

TEST_CASE("training the tiny model for a few hundred steps lowers the loss", "[mpi][slow]") {
  ScratchDir dir("engine-loss");
  const std::string root = dir / "run";
  std::string log;
  REQUIRE(Engine(2,
                 "train --model tiny --zero 2 --micro-batch 2 --steps 200 --lr 3e-3 "
                 "--warmup 20 --no-final-save --ckpt-dir " +
                     root,
                 dir / "log", &log) == 0);
  const auto lines = Lines(root + "/trainlog.jsonl");
  REQUIRE(lines.size() == 200);
  // Step 1 is near the untrained ~ln(256) = 5.55 nats per byte; the mean of the last 20 steps
  // must be at least 35% lower (it reaches ~3.2).
  const double first = J(lines[0])["loss"].get<double>();
  double last = 0;
  for (int i = 180; i < 200; ++i) last += J(lines[i])["loss"].get<double>() / 20;
  INFO("loss of step 1: " << first << ", mean of steps 181-200: " << last);
  CHECK(first > 5.0);
  CHECK(last < 0.65 * first);
}

TEST_CASE("a checkpoint resharded 4 -> 2 ranks resumes the same sample stream", "[mpi]") {
  // Exercises the restore paths for rank files without rng/* (ckpt reshard omits them): the
  // shuffle generator is replayed from the seed and the global data position is reused.
  if (!HaveBinary("ckpt")) {
    WARN("skipped: build/bin/ckpt (ckpt reshard) is not built");
    return;
  }
  ScratchDir dir("engine-reshard");
  const std::string a = dir / "a", b = dir / "b";
  REQUIRE(Engine(4,
                 "train " + kModel +
                     " --dropout 0 --zero 1 --global-batch 8 --micro-batch 2 "
                     "--steps 4 --save-every 2 --ckpt-dir " +
                     a,
                 dir / "a.log") == 0);
  std::string log;
  REQUIRE(RunCkpt("reshard " + a + " " + b + " --dp 2 --zero 3 --tag global_step2").rc == 0);
  REQUIRE(Engine(2, "train --resume --zero 3 --steps 4 --ckpt-dir " + b, dir / "b.log", &log) == 0);
  INFO(log);
  const auto la = Lines(a + "/trainlog.jsonl"), lb = Lines(b + "/trainlog.jsonl");
  REQUIRE(la.size() == 4);
  REQUIRE(lb.size() == 2);
  for (size_t i = 0; i < 2; ++i) {
    const auto x = J(la[2 + i]), y = J(lb[i]);
    INFO("step " << 3 + i << ": " << x["loss"] << " vs " << y["loss"]);
    CHECK(y["step"] == x["step"]);
    CHECK(y["tokens"] == x["tokens"]);
    CHECK(y["lr"] == x["lr"]);
    CHECK(std::fabs(x["loss"].get<double>() - y["loss"].get<double>()) <=
          1e-5 * std::fabs(x["loss"].get<double>()));
  }
}

// Issue 18: training into a root that holds a run, without --resume, silently rewound it
// (latest 30 -> 5, a second sequence appended to the run log).
TEST_CASE("train without --resume into an existing root is refused unless --overwrite", "[mpi]") {
  ScratchDir dir("engine-rewind");
  const std::string root = dir / "run";
  const std::string train = "train " + kModel + " --zero 1 --micro-batch 1 --save-every 2 ";
  REQUIRE(Engine(2, train + "--steps 4 --ckpt-dir " + root, dir / "a.log") == 0);
  auto snapshot = [&]() {
    std::vector<std::string> names;
    for (const auto& e : fs::recursive_directory_iterator(root)) {
      names.push_back(e.path().string() + ":" +
                      (e.is_regular_file() ? Slurp(e.path().string()) : "d"));
    }
    std::sort(names.begin(), names.end());
    return names;
  };
  const auto before = snapshot();
  std::string log;
  CHECK(Engine(2, train + "--steps 2 --ckpt-dir " + root, dir / "b.log", &log) == 2);
  CHECK(log.find("already holds committed checkpoints (latest global_step4)") !=
        std::string::npos);
  CHECK(log.find("--overwrite") != std::string::npos);
  CHECK(snapshot() == before);

  // Resuming from an older tag whose saves would move latest back: refused too.
  CHECK(Engine(2, "train --resume --resume-tag global_step2 --steps 4 --ckpt-dir " + root,
               dir / "c.log", &log) == 2);
  CHECK(log.find("would move latest back") != std::string::npos);
  CHECK(snapshot() == before);
  // Not saving is fine (what verify-style replays of an old tag do).
  CHECK(Engine(2,
               "train --resume --resume-tag global_step2 --steps 3 --save-every 0 "
               "--no-final-save --trainlog " + dir / "replay.jsonl" + " --ckpt-dir " + root,
               dir / "d.log", &log) == 0);
  CHECK(ckpt::ReadLatest(root).value() == "global_step4");

  // --overwrite: an explicit new run; the old tags and run log are gone, latest is the new one.
  REQUIRE(Engine(2, train + "--steps 2 --overwrite --ckpt-dir " + root, dir / "e.log", &log) == 0);
  CHECK(ckpt::ReadLatest(root).value() == "global_step2");
  CHECK(!fs::exists(root + "/global_step4"));
  CHECK(Lines(root + "/trainlog.jsonl").size() == 2);
}
