// The `ckpt` CLI: exit codes (0 ok, 1 corruption or difference, 2 could not run) and the
// --json contracts of ls, inspect, check and diff.
#include <catch2/catch.hpp>

#include <array>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "ckpt_test_helpers.h"
#include "test_util.h"

using namespace ckpt::testing;
using nlohmann::json;
namespace fs = std::filesystem;

namespace {

struct Run {
  int rc;
  std::string out;
};

Run Ckpt(const std::string& args) {
  const std::string cmd = BinDir() + "/ckpt " + args + " 2>/dev/null";
  FILE* p = popen(cmd.c_str(), "r");
  std::string out;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), p)) > 0) out.append(buf.data(), n);
  int status = pclose(p);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

json Json(const Run& r) {
  auto j = json::parse(r.out, nullptr, false);
  INFO(r.out);
  REQUIRE_FALSE(j.is_discarded());
  return j;
}

}  // namespace

TEST_CASE("synth, ls, inspect, check, diff and gc through the CLI", "[io]") {
  ScratchDir d;
  const std::string root = d / "root";
  REQUIRE(Ckpt("synth " + root + " --ranks 3 --params 20k --zero 3 --tags 2 --compress zstd:3").rc == 0);

  auto ls = Json(Ckpt("ls " + root + " --json"));
  CHECK(ls["root"] == root);
  CHECK(ls["latest"] == "global_step200");
  REQUIRE(ls["tags"].size() == 2);
  CHECK(ls["tags"][0]["tag"] == "global_step100");
  CHECK(ls["tags"][0]["global_step"] == 100);
  CHECK(ls["tags"][0]["ranks"] == 3);
  CHECK(ls["tags"][0]["bytes"].get<uint64_t>() > 0);
  CHECK(ls["tags"][0]["latest"] == false);
  CHECK(ls["tags"][1]["latest"] == true);
  CHECK(ls["temporary"].empty());

  auto in = Json(Ckpt("inspect " + root + " --json"));
  CHECK(in["tag"] == "global_step200");
  CHECK(in["format_version"] == "1.0");
  CHECK(in["global_step"] == 200);
  CHECK(in["dp_world_size"] == 3);
  CHECK(in["zero_stage"] == 3);
  CHECK(in["optimizer"]["type"] == "adamw");
  bool saw_tied = false, saw_frozen = false;
  for (const auto& p : in["params"]) {
    for (const char* k : {"name", "shape", "dtype", "numel", "frozen", "tied_to"}) CHECK(p.contains(k));
    if (!p["tied_to"].is_null()) saw_tied = true;
    if (p["frozen"] == true) saw_frozen = true;
  }
  CHECK(saw_tied);
  CHECK(saw_frozen);
  CHECK(Ckpt("inspect " + root + "/global_step100 --json").rc == 0);

  auto ok = Ckpt("check " + root + " --deep --json");
  CHECK(ok.rc == 0);
  CHECK(Json(ok)["ok"] == true);

  auto same = Ckpt("diff " + root + " " + root + " --json");
  CHECK(same.rc == 0);
  CHECK(Json(same)["identical"] == true);
  auto other = Ckpt("diff " + root + " " + root + "/global_step100 --json");
  CHECK(other.rc == 1);
  auto dj = Json(other);
  CHECK(dj["identical"] == false);
  REQUIRE_FALSE(dj["differences"].empty());
  for (const auto& x : dj["differences"]) {
    CHECK(x.contains("what"));
    CHECK(x.contains("max_abs"));
    CHECK(x.contains("max_rel"));
  }

  // Corrupt one rank file: check exits 1 and names it.
  const std::string victim = root + "/global_step200/rank_00002.h5";
  std::string bytes = Slurp(victim);
  bytes[bytes.size() - 100] ^= 0x5a;
  Spit(victim, bytes);
  auto bad = Ckpt("check " + root + " --deep --json");
  CHECK(bad.rc == 1);
  auto bj = Json(bad);
  CHECK(bj["ok"] == false);
  REQUIRE_FALSE(bj["problems"].empty());
  CHECK(bj["problems"][0]["file"] == "rank_00002.h5");

  // A `latest` pointing nowhere is corruption too.
  Spit(root + "/latest", "global_step999\n");
  CHECK(Ckpt("check " + root).rc == 1);
  Spit(root + "/latest", "global_step200\n");

  fs::create_directories(root + "/.tmp-global_step300-abc");
  CHECK(Json(Ckpt("ls " + root + " --json"))["temporary"].size() == 1);
  auto gc = Json(Ckpt("gc " + root + " --json"));
  CHECK(gc["removed_temporary"].size() == 1);
}

TEST_CASE("usage errors and missing input exit 2", "[io]") {
  ScratchDir d;
  CHECK(Ckpt("").rc == 2);
  CHECK(Ckpt("no-such-command").rc == 2);
  CHECK(Ckpt("ls " + d.str() + "/missing").rc == 2);
  CHECK(Ckpt("inspect " + d.str()).rc == 2);
  CHECK(Ckpt("check " + d.str() + "/missing").rc == 2);
  CHECK(Ckpt("synth " + d.str() + "/x --params -5").rc == 2);
  CHECK(Ckpt("synth " + d.str() + "/x --compress lz9").rc == 2);
  CHECK(Ckpt("synth " + d.str() + "/x --zero 7").rc == 2);
  auto err = Ckpt("inspect " + d.str() + " --json");
  CHECK(err.rc == 2);
  CHECK(Json(err)["error"]["message"].get<std::string>().find(d.str()) != std::string::npos);
  CHECK(Ckpt("--help").rc == 0);
  CHECK(Ckpt("check --help").rc == 0);
}

TEST_CASE("a manifest from a newer major version is refused with exit 2", "[io]") {
  ScratchDir d;
  REQUIRE(Ckpt("synth " + d.str() + " --ranks 1 --params 1000").rc == 0);
  const std::string mpath = d.str() + "/global_step100/manifest.json";
  auto j = json::parse(Slurp(mpath));
  j["format_version"] = "9.0";
  Spit(mpath, j.dump());
  auto r = Ckpt("inspect " + d.str() + " --json");
  CHECK(r.rc == 2);
  CHECK_THAT(Json(r)["error"]["message"].get<std::string>(), Catch::Contains("9.0"));
}
