// Predictions against real engine_min checkpoints (mpirun, 2 ranks, ZeRO 0-3): rank-file sizes
// within 1% from the parameter table alone (engine_min's typical RNG/JSON sizes), exact with
// the recorded auxiliary sizes, the tensor payload always exact; live counts from the
// checkpoint and from its fp32 safetensors export agree with the manifest.
#include <catch2/catch.hpp>

#include <cmath>
#include <filesystem>
#include <string>

#include <nlohmann/json.hpp>

#include "estimate/checkpoint_size.h"
#include "estimate/param_count.h"
#include "test_util.h"

namespace est = ckpt::estimate;
namespace fs = std::filesystem;
using ckpt::testing::BinDir;
using ckpt::testing::CliResult;
using ckpt::testing::HaveBinary;
using ckpt::testing::RunCkpt;
using ckpt::testing::RunShell;
using ckpt::testing::ScratchDir;

namespace {

bool HaveEngine() { return HaveBinary("engine_min") && HaveBinary("ckpt"); }

nlohmann::json EstimateJson(const std::string& args) {
  const CliResult r = RunCkpt("estimate " + args + " --json");
  INFO(args << ": " << r.err);
  REQUIRE(r.rc == 0);
  return nlohmann::json::parse(r.out);
}

}  // namespace

TEST_CASE("checkpoint sizes and live counts match engine_min checkpoints", "[mpi]") {
  REQUIRE(HaveEngine());
  for (int zero = 0; zero <= 3; ++zero) {
    ScratchDir dir("estimate-engine");
    const std::string run = dir / "run";
    const std::string cmd = "mpirun --allow-run-as-root --oversubscribe -n 2 " + BinDir() +
                            "/engine_min train --model tiny --zero " + std::to_string(zero) +
                            " --steps 2 --ckpt-dir " + run + " > " + dir / "train.log" + " 2>&1";
    const int rc = RunShell(cmd);
    INFO(ckpt::testing::Slurp(dir / "train.log"));
    REQUIRE(rc == 0);
    auto m = est::ReadCheckpointManifest(run, "");
    REQUIRE(m.ok());
    REQUIRE(m->files.size() == 2);

    // From the parameter table, world size and stage only, with engine_min's typical
    // auxiliary sizes: within 1% per rank file, tensor payload exact.
    auto recorded = est::CheckpointConfigFromCheckpoint(run);
    REQUIRE(recorded.ok());
    est::CheckpointConfig predicted;
    predicted.table = recorded->table;
    predicted.world = 2;
    predicted.zero_stage = zero;
    predicted.tag = m->tag;
    auto p = est::EstimateCheckpoint(predicted);
    REQUIRE(p.ok());
    // With the recorded auxiliary sizes: to the byte.
    auto exact = est::EstimateCheckpoint(*recorded);
    REQUIRE(exact.ok());
    for (const auto& f : m->files) {
      const uint64_t on_disk = fs::file_size(fs::path(run) / m->tag / f.path);
      uint64_t tensor_bytes = 0;
      for (const auto& d : f.datasets) {
        if (d.kind == "tensor") tensor_bytes += d.bytes;
      }
      const auto& pr = p->ranks[static_cast<size_t>(f.rank)];
      INFO("ZeRO-" << zero << " rank " << f.rank << ": predicted " << pr.file_bytes
                   << ", on disk " << on_disk);
      CHECK(pr.tensor_payload == tensor_bytes);
      CHECK(std::fabs(static_cast<double>(pr.file_bytes) - static_cast<double>(on_disk)) <=
            0.01 * static_cast<double>(on_disk));
      CHECK(exact->ranks[static_cast<size_t>(f.rank)].file_bytes == on_disk);
    }

    // The CLI reports the same exact sizes.
    auto cj = EstimateJson("checkpoint --from-checkpoint " + run);
    for (const auto& f : m->files) {
      CHECK(cj["ranks"][f.rank]["file_bytes"] == f.bytes);
    }

    // Live counts: the checkpoint and its fp32 export agree with the manifest.
    REQUIRE(RunCkpt("export-fp32 " + run + " " + dir / "export").rc == 0);
    auto from_ckpt = EstimateJson("zero3 --gpus-per-node 2 --from-checkpoint " + run);
    auto from_st = EstimateJson("zero3 --gpus-per-node 2 --from-safetensors " +
                                dir / "export/model.safetensors");
    CHECK(from_ckpt["total_params"] == m->UniqueParamCount());
    CHECK(from_st["total_params"] == m->UniqueParamCount());
    CHECK(from_st["largest_layer_params"] == from_ckpt["largest_layer_params"]);
    CHECK(from_ckpt["largest_layer_params"].get<int64_t>() > 0);
    CHECK(exact->fp32_export_bytes == fs::file_size(dir / "export/model.safetensors"));
  }
}
