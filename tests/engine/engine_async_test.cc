// engine_min --async-save under mpirun (2 ranks): the run log and every committed checkpoint are
// the same bits as a run that saves synchronously, `ckpt verify-resume` passes on the async
// run, and a rank killed inside a background save leaves the previous tag as latest.
#include <catch2/catch.hpp>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "ckpt/root.h"
#include "engine_run.h"
#include "test_util.h"

namespace fs = std::filesystem;
using namespace ckpt::testing;

namespace {
const std::string kArgs =
    "train --model tiny --d-model 32 --layers 2 --context 8 --sample-max 24 --zero 1 "
    "--micro-batch 1 --seed 7 --save-every 1 --steps 4";
}  // namespace

TEST_CASE("--async-save: the same run log and checkpoints as synchronous saves", "[mpi]") {
  ScratchDir dir("engine-async");
  const std::string sync = dir / "sync", async = dir / "async";
  std::string log;
  REQUIRE(Engine(2, kArgs + " --ckpt-dir " + sync, dir / "sync.log", &log) == 0);
  REQUIRE(Engine(2, kArgs + " --async-save --ckpt-dir " + async, dir / "async.log", &log) == 0);
  INFO(log);
  CHECK(log.find("saving synchronously") == std::string::npos);  // the MPI library allows it
  CHECK(log.find("4 saves (async)") != std::string::npos);
  const auto a = Lines(sync + "/trainlog.jsonl"), b = Lines(async + "/trainlog.jsonl");
  REQUIRE(a.size() == 4);
  CHECK(a == b);
  for (int step = 1; step <= 4; ++step) {
    const std::string tag = "/global_step" + std::to_string(step);
    INFO(tag);
    REQUIRE(fs::exists(async + tag + "/manifest.json"));
    for (const auto& d : CompareCheckpoints(sync + tag, async + tag)) FAIL_CHECK("differs: " << d);
  }
  CHECK(ckpt::ReadLatest(async).value() == "global_step4");
  CHECK(RunCkpt("diff " + sync + " " + async).rc == 0);
  // Resume parity through fresh engine_min processes, on the async run's checkpoints.
  const CliResult verified =
      RunCkpt("verify-resume " + async + " --tag global_step2 --steps 2 --json");
  INFO(verified.err);
  REQUIRE(verified.rc == 0);
  const auto j = nlohmann::json::parse(verified.out);
  CHECK(j["verdict"] == "bitwise");
  CHECK(j["max_weight_gap"] == 0.0);
}

TEST_CASE("--async-save: a rank killed inside a background save leaves the previous tag", "[mpi]") {
  ScratchDir dir("engine-async-kill");
  const std::string root = dir / "run";
  std::string log;
  const int rc =
      Engine(2, kArgs + " --async-save --ckpt-dir " + root + " --test-kill-in-save 1:3",
             dir / "kill.log", &log);
  INFO(log);
  CHECK(rc != 0);
  CHECK(log.find("killing this rank inside the save") != std::string::npos);
  CHECK(ckpt::ReadLatest(root).value() == "global_step2");
  CHECK_FALSE(fs::exists(root + "/global_step3"));
  auto problems = ckpt::CheckCheckpoint(root + "/global_step2", /*deep=*/true);
  REQUIRE(problems.ok());
  CHECK(problems->empty());
}
