// engine_min --invariant under mpirun: a run is the same bits on every world size, ZeRO stage
// and micro-batch × grad-accum split of its global batch, straight or saved at step k, resharded
// (`ckpt to-universal` + `ckpt reshard --dp M --zero Z`) and resumed; dropout is on. The
// default mode, resharded the same way, diverges (the control that shows the check can fail);
// `ckpt verify-resume --dp M` says `bitwise` for the first and names the divergence of the
// second. The full matrix (world sizes 1-4 × ZeRO 0-3, every resume pair) is the hidden
// "[full]" case, run with `engine_invariant_test "[full]"` (docs/engine.md has its result).
#include <catch2/catch.hpp>
#include <algorithm>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "ckpt/reader.h"
#include "engine_run.h"
#include "test_util.h"

using namespace ckpt::testing;
namespace fs = std::filesystem;

namespace {

// Global batch 12 divides over 1, 2, 3 and 4 ranks. Dropout 0.1 (the default) stays on.
const std::string kInvariantModel =
    "--model tiny --d-model 32 --layers 2 --context 8 --sample-max 24 --global-batch 12 "
    "--seed 7 --warmup 2 --lr-decay-steps 4 --lr 3e-3 --grad-clip 0.5";
constexpr int kSteps = 4;
constexpr int kSaveAt = 2;

// One way to run the global batch of 12.
struct Layout {
  int ranks;
  int zero;
  int micro_batch;  // grad-accum = 12 / (micro_batch × ranks)
  std::string Flags() const {
    return " --zero " + std::to_string(zero) + " --micro-batch " + std::to_string(micro_batch) +
           " --grad-accum " + std::to_string(12 / (micro_batch * ranks));
  }
  std::string Name() const {
    return std::to_string(ranks) + " ranks ZeRO-" + std::to_string(zero) + " micro-batch " +
           std::to_string(micro_batch);
  }
};

// Trains `l` from scratch to `steps` under dir/name with `extra` flags; returns the root.
std::string Train(const ScratchDir& dir, const std::string& name, const Layout& l,
                  const std::string& mode, int steps, const std::string& extra) {
  const std::string root = dir / name;
  std::string log;
  const int rc = Engine(l.ranks,
                        "train " + kInvariantModel + mode + l.Flags() + " --steps " +
                            std::to_string(steps) + extra + " --ckpt-dir " + root,
                        dir / (name + ".log"), &log);
  INFO(log);
  REQUIRE(rc == 0);
  return root;
}

// The straight run of `l` to kSteps; returns its run-log lines.
std::vector<std::string> Straight(const ScratchDir& dir, const std::string& name, const Layout& l,
                                  const std::string& mode) {
  return Lines(Train(dir, name, l, mode, kSteps, " --no-final-save") + "/trainlog.jsonl");
}

// Trains `from` to kSaveAt and saves there; returns the root.
std::string SaveAtK(const ScratchDir& dir, const std::string& name, const Layout& from,
                    const std::string& mode) {
  return Train(dir, name, from, mode, kSaveAt, "");
}

// The checkpoint of `src` converted to the universal layout and resharded for `to`, resumed
// on to.ranks to kSteps; returns the source's run-log lines followed by the resumed ones.
std::vector<std::string> ReshardAndResume(const ScratchDir& dir, const std::string& src,
                                          const std::string& name, const Layout& to) {
  const std::string uni = dir / (name + "-universal"), root = dir / name;
  const CliResult converted = RunCkpt("to-universal " + src + " " + uni);
  INFO(converted.err);
  REQUIRE(converted.rc == 0);
  const CliResult resharded =
      RunCkpt("reshard " + uni + " " + root + " --dp " + std::to_string(to.ranks) + " --zero " +
              std::to_string(to.zero));
  INFO(resharded.err);
  REQUIRE(resharded.rc == 0);
  std::string log;
  const int rc = Engine(to.ranks,
                        "train --resume" + to.Flags() + " --steps " + std::to_string(kSteps) +
                            " --no-final-save --ckpt-dir " + root,
                        dir / (name + ".log"), &log);
  INFO(log);
  REQUIRE(rc == 0);
  std::vector<std::string> lines = Lines(src + "/trainlog.jsonl");
  for (const std::string& l : Lines(root + "/trainlog.jsonl")) lines.push_back(l);
  return lines;
}

// Every logged quantity (loss, grad_norm, lr, tokens, weight and moment digests) of every step.
void RequireSameTrajectory(const std::vector<std::string>& want,
                           const std::vector<std::string>& got) {
  REQUIRE(want.size() == static_cast<size_t>(kSteps));
  REQUIRE(got.size() == want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    INFO("step " << i + 1);
    CHECK(got[i] == want[i]);
  }
}

const std::string kInvariant = " --invariant";

}  // namespace

TEST_CASE("invariant mode: straight runs on 1-4 ranks, every ZeRO stage, agree bitwise", "[mpi]") {
  ScratchDir dir("invariant-straight");
  const auto ref = Straight(dir, "ref", {1, 0, 12}, kInvariant);
  RequireSameTrajectory(ref, Straight(dir, "w2", {2, 1, 3}, kInvariant));
  RequireSameTrajectory(ref, Straight(dir, "w3", {3, 2, 2}, kInvariant));
  RequireSameTrajectory(ref, Straight(dir, "w4", {4, 3, 3}, kInvariant));
}

TEST_CASE("invariant mode: save, reshard to another world size or split, resume: bitwise",
          "[mpi]") {
  if (!HaveBinary("ckpt")) {
    WARN("skipped: build/bin/ckpt (to-universal, reshard) is not built");
    return;
  }
  ScratchDir dir("invariant-resume");
  const auto ref = Straight(dir, "ref", {4, 2, 3}, kInvariant);
  struct Case {
    Layout from, to;
  };
  const Case cases[] = {
      {{4, 2, 3}, {3, 2, 2}},   // the demo's 4 -> 3
      {{3, 3, 4}, {1, 0, 3}},   // 3 -> 1, ZeRO-3 -> ZeRO-0, grad-accum 1 -> 4
      {{1, 0, 12}, {4, 1, 1}},  // 1 -> 4, ZeRO-0 -> ZeRO-1, grad-accum 1 -> 3
      {{2, 1, 6}, {2, 3, 1}},   // same world size, another split (grad-accum 1 -> 6)
  };
  int i = 0;
  for (const Case& c : cases) {
    INFO(c.from.Name() << " -> " << c.to.Name());
    const std::string name = "case" + std::to_string(i++);
    const std::string src = SaveAtK(dir, name + "-src", c.from, kInvariant);
    RequireSameTrajectory(ref, ReshardAndResume(dir, src, name + "-dst", c.to));
  }
  // The mode is recorded in the checkpoint, survives the reshard, and the resume (which did
  // not repeat --invariant) ran in it: its output says so.
  for (const std::string& root : {dir / "case0-src", dir / "case0-dst"}) {
    auto reader = ckpt::CheckpointReader::Open(root);
    REQUIRE(reader.ok());
    CHECK(reader->manifest().engine_config.value("invariant", false));
  }
  CHECK(Slurp(dir / "case0-dst.log").find("invariant mode") != std::string::npos);
}

// Resumes the checkpoint in `src` directly on `to` (no conversion: Engine::Restore loads the
// old rank files resharded) with the run log written elsewhere and no save, and checks that
// nothing under `src` changed; returns the source's run-log lines followed by the resumed ones.
std::vector<std::string> ResumeDirectly(const ScratchDir& dir, const std::string& src,
                                        const std::string& name, const Layout& to,
                                        std::string* log = nullptr) {
  auto listing = [&]() {
    std::vector<std::string> names;
    for (const auto& e : fs::recursive_directory_iterator(src))
      names.push_back(e.path().string() + ":" +
                      (e.is_regular_file() ? std::to_string(fs::file_size(e.path())) : "d"));
    std::sort(names.begin(), names.end());
    return names;
  };
  const auto before = listing();
  const std::string trainlog = dir / (name + ".jsonl");
  std::string out;
  const int rc = Engine(to.ranks,
                        "train --resume" + to.Flags() + " --steps " + std::to_string(kSteps) +
                            " --no-final-save --save-every 0 --trainlog " + trainlog +
                            " --ckpt-dir " + src,
                        dir / (name + ".log"), &out);
  INFO(out);
  REQUIRE(rc == 0);
  CHECK(listing() == before);  // nothing written before the first save
  if (log) *log = out;
  std::vector<std::string> lines = Lines(src + "/trainlog.jsonl");
  for (const std::string& l : Lines(trainlog)) lines.push_back(l);
  return lines;
}

TEST_CASE("invariant mode: --resume on another world size or stage loads directly: bitwise",
          "[mpi]") {
  ScratchDir dir("invariant-direct");
  const auto ref = Straight(dir, "ref", {4, 2, 3}, kInvariant);
  struct Case {
    Layout from, to;
  };
  const Case cases[] = {
      {{4, 2, 3}, {3, 2, 2}},   // 4 -> 3
      {{3, 3, 4}, {1, 0, 3}},   // 3 -> 1, ZeRO-3 -> ZeRO-0
      {{1, 0, 12}, {4, 1, 1}},  // 1 -> 4, ZeRO-0 -> ZeRO-1
      {{2, 1, 6}, {2, 3, 1}},   // same world size, ZeRO-1 -> ZeRO-3
      {{2, 3, 6}, {4, 2, 3}},   // 2 -> 4, ZeRO-3 -> ZeRO-2
      {{4, 0, 3}, {2, 1, 6}},   // 4 -> 2, ZeRO-0 (rank 0 holds all state) -> ZeRO-1
      {{1, 1, 12}, {3, 3, 4}},  // 1 -> 3, ZeRO-1 -> ZeRO-3
      {{3, 0, 4}, {2, 2, 6}},   // 3 -> 2, ZeRO-0 -> ZeRO-2
  };
  // Every world size 1-4 and every stage 0-3 is both a source and a target, growing and
  // shrinking; the library test (test_ckpt_reshard_load) covers every pair bitwise, and the
  // hidden "[full]" case below every pair through engine_min.
  int i = 0;
  for (const Case& c : cases) {
    INFO(c.from.Name() << " -> " << c.to.Name());
    const std::string name = "case" + std::to_string(i++);
    const std::string src = SaveAtK(dir, name + "-src", c.from, kInvariant);
    std::string log;
    RequireSameTrajectory(ref, ResumeDirectly(dir, src, name + "-resume", c.to, &log));
    CHECK(log.find("resharded at load") != std::string::npos);
  }
  const std::string src = dir / "case0-src";
  auto reader = ckpt::CheckpointReader::Open(src);
  REQUIRE(reader.ok());
  const std::string resume_flags =
      "train --resume --zero 3 --micro-batch 6 --grad-accum 1 --steps 4 --no-final-save "
      "--ckpt-dir " + src + " --trainlog ";
  // A rank file that is a symbolic link (to its copy outside the checkpoint): the new rank that
  // reads it refuses it unread (O_NOFOLLOW) and the job fails (issue 20, item 6).
  {
    const std::string linked = reader->dir() + "/rank_00001.h5";
    const std::string outside = dir / "outside.h5";
    fs::rename(linked, outside);
    fs::create_symlink(outside, linked);
    std::string log;
    const int rc = Engine(2, resume_flags + (dir / "linked.jsonl"), dir / "linked.log", &log);
    INFO(log);
    CHECK(rc != 0);
    CHECK(log.find("rank_00001.h5 is a symbolic link") != std::string::npos);
    fs::remove(linked);
    fs::rename(outside, linked);
  }
  // A flipped byte in a piece a new rank reads: that rank names it and the job fails.
  auto bytes = reader->ReadDatasetBytes(3, "exp_avg");
  REQUIRE(bytes.ok());
  const std::string needle(reinterpret_cast<const char*>(bytes->data()) + 64, 32);
  REQUIRE(ckpt::testing::FlipByteAfter(reader->dir() + "/rank_00003.h5", needle, 5, 0x20) >= 1);
  std::string log;
  const int rc = Engine(2, resume_flags + (dir / "corrupt.jsonl"), dir / "corrupt.log", &log);
  INFO(log);
  CHECK(rc != 0);
  CHECK(log.find("rank_00003.h5: dataset /exp_avg: checksum mismatch in piece 0 of 1") !=
        std::string::npos);
}

TEST_CASE("default mode: a direct resume on 3 ranks is the `ckpt reshard` resume, bit for bit",
          "[mpi]") {
  if (!HaveBinary("ckpt")) {
    WARN("skipped: build/bin/ckpt (to-universal, reshard) is not built");
    return;
  }
  // Same generators for the new ranks (seeded from seed, global_step, rank), same data
  // position, same state: the two ways to change the world size are one trajectory.
  ScratchDir dir("default-direct");
  const std::string src = SaveAtK(dir, "src", {4, 2, 3}, "");
  const auto via_reshard = ReshardAndResume(dir, src, "dst", {3, 2, 2});
  const auto direct = ResumeDirectly(dir, src, "direct", {3, 2, 2});
  REQUIRE(direct.size() == static_cast<size_t>(kSteps));
  CHECK(direct == via_reshard);
}

TEST_CASE("default mode resharded the same way diverges (the control)", "[mpi]") {
  if (!HaveBinary("ckpt")) {
    WARN("skipped: build/bin/ckpt (to-universal, reshard) is not built");
    return;
  }
  ScratchDir dir("invariant-control");
  const auto ref = Straight(dir, "ref", {4, 2, 3}, "");
  const std::string src = SaveAtK(dir, "src", {4, 2, 3}, "");
  const auto got = ReshardAndResume(dir, src, "dst", {3, 2, 2});
  REQUIRE(got.size() == ref.size());
  CHECK(got[0] == ref[0]);
  CHECK(got[1] == ref[1]);
  CHECK(got[2] != ref[2]);  // dropout masks and summation order both differ
}

TEST_CASE("verify-resume --dp: bitwise for an invariant run, the divergence for a default one",
          "[mpi]") {
  if (!HaveBinary("ckpt")) {
    WARN("skipped: build/bin/ckpt is not built");
    return;
  }
  ScratchDir dir("invariant-verify");
  for (const std::string& mode : {kInvariant, std::string()}) {
    const std::string root = Train(dir, mode.empty() ? "default" : "invariant", {4, 2, 3}, mode,
                                   kSteps, " --save-every " + std::to_string(kSaveAt));
    const CliResult verified = RunCkpt("verify-resume " + root + " --tag global_step" +
                                       std::to_string(kSaveAt) + " --steps 2 --dp 3 --json");
    const int rc = verified.rc;
    INFO(verified.out << verified.err);
    const auto j = nlohmann::json::parse(verified.out);
    CHECK(j["ranks"] == 3);
    CHECK(j["source_ranks"] == 4);
    if (mode.empty()) {
      CHECK(rc == 1);
      CHECK(j["verdict"] == "diverged");
      CHECK(j["first_divergence"]["step"] == kSaveAt + 1);
    } else {
      CHECK(rc == 0);
      CHECK(j["verdict"] == "bitwise");
      CHECK(j["steps_compared"] == 2);
    }
  }
}

TEST_CASE("invariant mode, the full matrix: 1-4 ranks x ZeRO 0-3, every resume pair",
          "[mpi][.][full]") {
  REQUIRE(HaveBinary("ckpt"));
  ScratchDir dir("invariant-full");
  const auto ref = Straight(dir, "ref", {1, 0, 12}, kInvariant);
  // Straight: every world size × stage (micro-batch 1: grad-accum 12 / ranks).
  for (int ranks = 1; ranks <= 4; ++ranks) {
    for (int zero = 0; zero <= 3; ++zero) {
      const Layout l{ranks, zero, 1};
      INFO("straight " << l.Name());
      RequireSameTrajectory(
          ref, Straight(dir, "s" + std::to_string(ranks) + std::to_string(zero), l, kInvariant));
    }
  }
  // Resume: from every world size × stage (saved with grad-accum 1) to every world size, the
  // stage rotated, micro-batch 1.
  for (int ranks = 1; ranks <= 4; ++ranks) {
    for (int zero = 0; zero <= 3; ++zero) {
      const Layout from{ranks, zero, 12 / ranks};
      const std::string src =
          SaveAtK(dir, "src" + std::to_string(ranks) + std::to_string(zero), from, kInvariant);
      for (int to_ranks = 1; to_ranks <= 4; ++to_ranks) {
        const Layout to{to_ranks, (zero + to_ranks) % 4, 1};
        INFO(from.Name() << " -> " << to.Name());
        RequireSameTrajectory(
            ref, ReshardAndResume(dir, src,
                                  "dst" + std::to_string(ranks) + std::to_string(zero) +
                                      std::to_string(to_ranks),
                                  to));
      }
    }
  }
}

TEST_CASE("invariant mode: direct resumes, the full matrix of 1-4 ranks x ZeRO 0-3 each way",
          "[mpi][.][full]") {
  ScratchDir dir("invariant-direct-full");
  const auto ref = Straight(dir, "ref", {1, 0, 12}, kInvariant);
  for (int ranks = 1; ranks <= 4; ++ranks) {
    for (int zero = 0; zero <= 3; ++zero) {
      const Layout from{ranks, zero, 12 / ranks};
      const std::string name = "src" + std::to_string(ranks) + std::to_string(zero);
      const std::string src = SaveAtK(dir, name, from, kInvariant);
      for (int to_ranks = 1; to_ranks <= 4; ++to_ranks) {
        for (int to_zero = 0; to_zero <= 3; ++to_zero) {
          if (to_ranks == ranks && to_zero == zero) continue;  // not a reshard
          const Layout to{to_ranks, to_zero, 1};
          INFO(from.Name() << " -> " << to.Name());
          RequireSameTrajectory(ref, ResumeDirectly(dir, src,
                                                    name + "-" + std::to_string(to_ranks) +
                                                        std::to_string(to_zero),
                                                    to));
        }
      }
    }
  }
}
