// Where `ckpt estimate` takes a parameter count from (estimate/param_source.h): by hand or from
// one live source, never both, never two; the same rule for the memory tables and checkpoint.
#include <unistd.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>

#include "estimate/param_source.h"

namespace est = ckpt::estimate;

TEST_CASE("counts come from flags or one live source", "[unit]") {
  est::ParamSource by_hand;
  by_hand.params = "7B";
  by_hand.largest_layer = "350M";
  auto s = est::ResolveModelSize(by_hand, /*need_largest=*/true);
  REQUIRE(s.ok());
  CHECK(s->total == 7000000000);
  CHECK(s->largest == 350000000);
  CHECK(s->source.empty());

  est::ParamSource none;
  CHECK(est::ResolveModelSize(none, false).status().message().find("--params is required") !=
        std::string::npos);
  est::ParamSource no_largest;
  no_largest.params = "7B";
  CHECK(est::ResolveModelSize(no_largest, false).ok());
  CHECK(est::ResolveModelSize(no_largest, true).status().code() ==
        ckpt::StatusCode::kInvalidArgument);

  // Two live sources: refused by the memory tables and by checkpoint, before any is read.
  est::ParamSource two;
  two.from_checkpoint = "/nonexistent/root";
  two.from_safetensors = "/nonexistent/model.safetensors";
  est::CheckpointRequest two_ckpt;
  two_ckpt.size = two;
  for (const ckpt::Status& st :
       {est::ResolveModelSize(two, false).status(), est::ResolveCheckpointConfig(two_ckpt).status()}) {
    CHECK(st.code() == ckpt::StatusCode::kInvalidArgument);
    CHECK(st.message().find("give one of --from-checkpoint, --from-safetensors, --param-table") !=
          std::string::npos);
  }
  // A count mixed with a live source.
  const std::string table = (std::filesystem::temp_directory_path() /
                             ("param-source-" + std::to_string(::getpid()) + ".json")).string();
  std::ofstream(table) << R"([{"name": "a.w", "shape": [3, 4]}, {"name": "b.w", "shape": [5]}])";
  est::ParamSource live;
  live.param_table = table;
  auto from_table = est::ResolveModelSize(live, true);
  REQUIRE(from_table.ok());
  CHECK(from_table->total == 17);
  CHECK(from_table->largest == 12);
  CHECK(from_table->source.find(table) != std::string::npos);
  est::ParamSource mixed = live;
  mixed.params = "1B";
  CHECK(est::ResolveModelSize(mixed, false).status().message().find("cannot be combined") !=
        std::string::npos);
  std::filesystem::remove(table);
  mixed = two;
  mixed.from_safetensors.clear();
  mixed.params = "1B";
  est::CheckpointRequest mixed_ckpt;
  mixed_ckpt.size = mixed;
  CHECK(est::ResolveCheckpointConfig(mixed_ckpt).status().message().find("cannot be combined") !=
        std::string::npos);
}

TEST_CASE("estimate checkpoint's configuration from --params and the layout flags", "[unit]") {
  est::CheckpointRequest r;
  r.size.params = "1M";
  r.ranks = 4;
  r.zero = 3;
  r.model_dtype = "bf16";
  r.chunk_bytes = "1MiB";
  auto c = est::ResolveCheckpointConfig(r);
  REQUIRE(c.ok());
  CHECK(c->world == 4);
  CHECK(c->zero_stage == 3);
  CHECK(c->chunk_bytes == (1u << 20));
  REQUIRE(c->table.params.size() == 1);
  CHECK(c->table.params[0].numel == 1000000);
  CHECK(c->table.params[0].dtype == ckpt::DType::kBF16);

  r.zero = 7;
  CHECK(est::ResolveCheckpointConfig(r).status().message().find("--zero") != std::string::npos);
  r.zero = 1;
  r.ranks = 0;
  CHECK(est::ResolveCheckpointConfig(r).status().message().find("--ranks") != std::string::npos);
  r.ranks = 1;
  r.model_dtype = "fp7";
  CHECK(est::ResolveCheckpointConfig(r).status().message().find("--model-dtype") !=
        std::string::npos);
}
