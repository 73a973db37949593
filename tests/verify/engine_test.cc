// The verifier on real engine_min runs (mpirun, 2 ranks): resume parity is bitwise for ZeRO
// 0-3, every ablation of moments, step, rng (dropout on) and data diverges, rng does not
// matter with dropout off, next-update with the engine's gradient replays the original run's
// next weights bitwise, and a doctored run log is caught.
#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "test_util.h"
#include "verify_test_util.h"

namespace {

using namespace ckpt::testing;
using nlohmann::json;
namespace fs = std::filesystem;

bool HaveEngine() { return HaveBinary("engine_min") && HaveBinary("ckpt"); }

// Trains `steps` steps, saving every `save_every`, into dir/run.
void Train(const ScratchDir& dir, int zero, int steps, int save_every,
           const std::string& extra = "") {
  const std::string cmd = "mpirun --allow-run-as-root --oversubscribe -n 2 " + BinDir() +
                          "/engine_min train --model tiny --zero " + std::to_string(zero) +
                          " --steps " + std::to_string(steps) + " --save-every " +
                          std::to_string(save_every) + " --ckpt-dir " + dir / "run" + " " + extra +
                          " > " + dir / "train.log" + " 2>&1";
  const int rc = RunShell(cmd);
  INFO(Slurp(dir / "train.log"));
  REQUIRE(rc == 0);
}

TEST_CASE("resume parity is bitwise for ZeRO 0-3", "[mpi][slow]") {
  REQUIRE(HaveEngine());
  for (int zero = 0; zero <= 3; ++zero) {
    ScratchDir dir("verify-parity");
    Train(dir, zero, 4, 2);
    auto cli = RunCkpt("verify-resume " + dir / "run" + " --tag global_step2 --steps 2 --json");
    INFO("ZeRO-" << zero << ": " << cli.out << cli.err);
    CHECK(cli.rc == 0);
    auto j = json::parse(cli.out);
    CHECK(j["verdict"] == "bitwise");
    CHECK(j["steps"] == 2);
    CHECK(j["first_divergence"].is_null());
    CHECK(j["ablations"].empty());
    CHECK(j["zero_stage"] == zero);
    // The original run saved global_step4 too: the resumed final weights equal it exactly.
    CHECK(j["max_weight_gap"] == 0.0);
    // The original checkpoint is untouched (the resumed runs used hard links in scratch).
    CHECK(fs::exists(dir / "run/global_step2/manifest.json"));
    CHECK(Slurp(dir / "run/latest").find("global_step4") != std::string::npos);
  }
}

TEST_CASE("ablations of moments, step, rng and data diverge; rng does not matter without dropout",
          "[mpi][slow]") {
  REQUIRE(HaveEngine());
  {
    ScratchDir dir("verify-ablate");
    Train(dir, 2, 5, 2, "--dropout 0.1");
    auto cli = RunCkpt("verify-resume " + dir / "run" +
                       " --tag global_step2 --steps 3 "
                       "--ablate all --json");
    INFO(cli.out << cli.err);
    CHECK(cli.rc == 0);  // the plain resume is bitwise; ablations don't change the status
    auto j = json::parse(cli.out);
    CHECK(j["verdict"] == "bitwise");
    CHECK(j["max_weight_gap"] == 0.0);  // against the original's own final save at step 5
    REQUIRE(j["ablations"].size() == 5);
    for (const auto& a : j["ablations"]) {
      INFO(a.dump());
      if (a["component"] == "scheduler") continue;  // checked below: depends on the schedule
      CHECK(a["matters"] == true);
      CHECK(a["diverges_at_step"] == 3);
      CHECK(a["max_weight_gap"].get<double>() > 0);
    }
    // Mid-warmup a fresh scheduler restarts the rate: it matters here too.
    CHECK(j["ablations"][4]["component"] == "scheduler");
    CHECK(j["ablations"][4]["matters"] == true);
    CHECK(j["ablations"][4]["first_divergence"]["quantity"] == "lr");
  }
  {
    ScratchDir dir("verify-ablate-nodrop");
    Train(dir, 1, 3, 2, "--dropout 0");
    auto cli = RunCkpt("verify-resume " + dir / "run" +
                       " --tag global_step2 --steps 1 "
                       "--ablate rng,moments --json");
    INFO(cli.out << cli.err);
    CHECK(cli.rc == 0);
    auto j = json::parse(cli.out);
    REQUIRE(j["ablations"].size() == 2);
    CHECK(j["ablations"][0]["component"] == "rng");
    CHECK(j["ablations"][0]["matters"] == false);
    CHECK(j["ablations"][0]["diverges_at_step"].is_null());
    CHECK(j["ablations"][0]["max_weight_gap"] == 0.0);
    CHECK(j["ablations"][0]["note"].get<std::string>().find("no effect") != std::string::npos);
    CHECK(j["ablations"][1]["matters"] == true);
    // The table form names both.
    auto text =
        RunCkpt("verify-resume " + dir / "run" + " --tag global_step2 --steps 1 --ablate rng");
    CHECK(text.out.find("never (no effect)") != std::string::npos);
  }
}

TEST_CASE("next-update with the engine gradient replays the original next weights bitwise",
          "[mpi][slow]") {
  REQUIRE(HaveEngine());
  ScratchDir dir("verify-engine-next");
  Train(dir, 3, 3, 2);
  auto cli = RunCkpt("next-update " + dir / "run" +
                     " --tag global_step2 --device cpu --json --out " + dir / "out");
  INFO(cli.out << cli.err);
  REQUIRE(cli.rc == 0);
  auto j = json::parse(cli.out);
  CHECK(j["matches_reference"] == true);
  CHECK(j["reference"]["exp_avg_match"] == true);
  CHECK(j["reference"]["exp_avg_sq_match"] == true);
  CHECK(j["hyper"]["step"] == 2);
  CHECK(j["hyper"]["lr"].get<double>() == Approx(j["reference"]["logged_lr"].get<double>()));
  CHECK(j["overall"]["weights_only"]["max_abs"].get<double>() > 0);
  CHECK(j["overall"]["weights_only"]["frac_differ"].get<double>() > 0.5);
  CHECK(j["overall"]["moments_dropped"]["max_abs"].get<double>() > 0);
  CHECK(fs::exists(dir / "out/full_state.safetensors"));

  // The CI bundle on the same checkpoint, with JUnit.
  auto ci = RunCkpt("verify " + dir / "run" + " --tag global_step2 --device cpu --junit " +
                    dir / "junit.xml");
  INFO(ci.out << ci.err);
  CHECK(ci.rc == 0);
  const std::string junit = Slurp(dir / "junit.xml");
  CHECK(junit.find("failures=\"0\" errors=\"0\" skipped=\"0\"") != std::string::npos);

  // A run log that disagrees with the checkpoint is caught, at the right step and quantity.
  std::string log = Slurp(dir / "run/trainlog.jsonl");
  auto lines = json::array();
  std::ofstream doctored(dir / "doctored.jsonl");
  std::istringstream in(log);
  for (std::string line; std::getline(in, line);) {
    auto e = json::parse(line);
    if (e["step"] == 3) e["weights_xxh3"] = "0123456789abcdef";
    doctored << e.dump() << "\n";
  }
  doctored.close();
  auto bad = RunCkpt("verify-resume " + dir / "run" +
                     " --tag global_step2 --steps 1 --json "
                     "--reference " +
                     dir / "doctored.jsonl");
  CHECK(bad.rc == 1);
  auto b = json::parse(bad.out);
  CHECK(b["verdict"] == "diverged");
  CHECK(b["first_divergence"]["step"] == 3);
  CHECK(b["first_divergence"]["quantity"] == "weights_xxh3");
  auto nu = RunCkpt("next-update " + dir / "run" +
                    " --tag global_step2 --device cpu --json "
                    "--reference " +
                    dir / "doctored.jsonl");
  CHECK(nu.rc == 1);
  CHECK(json::parse(nu.out)["matches_reference"] == false);
}

}  // namespace
