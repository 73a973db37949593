// The `ckpt` CLI: exit codes (0 ok, 1 corruption or difference, 2 could not run) and the
// --json contracts of ls, inspect, check and diff.
#include <catch2/catch.hpp>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "ckpt/collective.h"
#include "ckpt/rank_threads.h"
#include "ckpt/synth.h"
#include "ckpt_test_helpers.h"
#include "test_util.h"

using namespace ckpt::testing;
using nlohmann::json;
namespace fs = std::filesystem;

namespace {

json Json(const CliResult& r) {
  auto j = json::parse(r.out, nullptr, false);
  INFO(r.out);
  REQUIRE_FALSE(j.is_discarded());
  return j;
}

}  // namespace

TEST_CASE("synth, ls, inspect, check, diff and gc through the CLI", "[io]") {
  ScratchDir d;
  const std::string root = d / "root";
  REQUIRE(
      RunCkpt("synth " + root + " --ranks 3 --params 20k --zero 3 --tags 2 --compress zstd:3").rc ==
      0);

  auto ls = Json(RunCkpt("ls " + root + " --json"));
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

  auto in = Json(RunCkpt("inspect " + root + " --json"));
  CHECK(in["tag"] == "global_step200");
  CHECK(in["format_version"] == "1.3");
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
  CHECK(RunCkpt("inspect " + root + "/global_step100 --json").rc == 0);

  auto ok = RunCkpt("check " + root + " --deep --json");
  CHECK(ok.rc == 0);
  CHECK(Json(ok)["ok"] == true);

  auto same = RunCkpt("diff " + root + " " + root + " --json");
  CHECK(same.rc == 0);
  CHECK(Json(same)["identical"] == true);
  auto other = RunCkpt("diff " + root + " " + root + "/global_step100 --json");
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
  auto bad = RunCkpt("check " + root + " --deep --json");
  CHECK(bad.rc == 1);
  auto bj = Json(bad);
  CHECK(bj["ok"] == false);
  REQUIRE_FALSE(bj["problems"].empty());
  CHECK(bj["problems"][0]["file"] == "rank_00002.h5");

  // A `latest` pointing nowhere is corruption too.
  Spit(root + "/latest", "global_step999\n");
  CHECK(RunCkpt("check " + root).rc == 1);
  Spit(root + "/latest", "global_step200\n");

  fs::create_directories(root + "/.tmp-global_step300-abc");
  CHECK(Json(RunCkpt("ls " + root + " --json"))["temporary"].size() == 1);
  auto gc = Json(RunCkpt("gc " + root + " --json"));
  CHECK(gc["removed_temporary"].size() == 1);
}

TEST_CASE("usage errors and missing input exit 2", "[io]") {
  ScratchDir d;
  CHECK(RunCkpt("").rc == 2);
  CHECK(RunCkpt("no-such-command").rc == 2);
  CHECK(RunCkpt("ls " + d.str() + "/missing").rc == 2);
  CHECK(RunCkpt("inspect " + d.str()).rc == 2);
  CHECK(RunCkpt("check " + d.str() + "/missing").rc == 2);
  CHECK(RunCkpt("synth " + d.str() + "/x --params -5").rc == 2);
  CHECK(RunCkpt("synth " + d.str() + "/x --compress lz9").rc == 2);
  CHECK(RunCkpt("synth " + d.str() + "/x --zero 7").rc == 2);
  auto err = RunCkpt("inspect " + d.str() + " --json");
  CHECK(err.rc == 2);
  CHECK(Json(err)["error"]["message"].get<std::string>().find(d.str()) != std::string::npos);
  CHECK(RunCkpt("--help").rc == 0);
  CHECK(RunCkpt("check --help").rc == 0);
}

TEST_CASE("a manifest from a newer major version is refused with exit 2", "[io]") {
  ScratchDir d;
  REQUIRE(RunCkpt("synth " + d.str() + " --ranks 1 --params 1000").rc == 0);
  const std::string mpath = d.str() + "/global_step100/manifest.json";
  auto j = json::parse(Slurp(mpath));
  j["format_version"] = "9.0";
  Spit(mpath, j.dump());
  auto r = RunCkpt("inspect " + d.str() + " --json");
  CHECK(r.rc == 2);
  CHECK_THAT(Json(r)["error"]["message"].get<std::string>(), Catch::Contains("9.0"));
}

// Issue 18, defect 7: format 1.1's manifest_xxh3 is defined over bytes any JSON writer can
// reproduce. A manifest re-written and sealed by Python's json (its own number formatting and
// indentation) verifies; one changed byte afterwards is caught; a 1.0 manifest (the seed-001
// fixture, sealed under 1.0's rule) still verifies.
TEST_CASE("a manifest sealed by Python's json verifies (format 1.1)", "[io]") {
  ScratchDir d;
  REQUIRE(RunCkpt("synth " + d.str() + " --ranks 2 --params 2000").rc == 0);
  const std::string tag = d.str() + "/global_step100";
  REQUIRE(RunShell("/usr/bin/python3 " + std::string(CKPT_SOURCE_DIR) +
                   "/tests/ckpt/seal_manifest.py " + tag + " > /dev/null") == 0);
  const std::string text = Slurp(tag + "/manifest.json");
  REQUIRE(text.find("1000000000000000.0") != std::string::npos);
  auto ok = RunCkpt("check " + d.str() + " --deep --json");
  INFO(ok.out);
  CHECK(ok.rc == 0);
  CHECK(RunCkpt("inspect " + d.str()).out.find("ckpt 1.1,") != std::string::npos);
  std::string edited = text;
  const size_t at = edited.find("1000000000000000.0");
  edited[at] = '2';
  Spit(tag + "/manifest.json", edited);
  auto bad = RunCkpt("check " + d.str() + " --json");
  CHECK(bad.rc == 1);
  CHECK(bad.out.find("manifest checksum mismatch") != std::string::npos);

  const std::string seed = std::string(CKPT_SOURCE_DIR) + "/tests/data/seed001/ckpt";
  CHECK(Slurp(seed + "/global_step5/manifest.json").find("\"format_version\": \"1.0\"") !=
        std::string::npos);
  CHECK(RunCkpt("check " + seed + " --deep").rc == 0);
  // inspect reports the version the file was written with, not the reader's.
  auto inspected = RunCkpt("inspect " + seed + " --json");
  REQUIRE(inspected.rc == 0);
  CHECK(nlohmann::json::parse(inspected.out)["format_version"] == "1.0");
}

// Issue 18, defect 3: paths are bytes. --json prints a path that is not valid UTF-8 losslessly
// (each invalid byte as \udcXX, Python's surrogateescape) instead of failing, and never after
// an output was published; usage errors honour --json too.
TEST_CASE("--json with a path that is not valid UTF-8 prints it losslessly", "[io]") {
  ScratchDir d;
  const std::string root = d / "run\xff\xfe";
  REQUIRE(RunCkpt("synth '" + root + "' --ranks 2 --params 2000").rc == 0);
  for (const std::string cmd : {"ls", "inspect", "check"}) {
    auto r = RunCkpt(cmd + " '" + root + "' --json");
    INFO(cmd << ": " << r.out);
    CHECK(r.rc == 0);
    CHECK(r.out.find("run\\udcff\\udcfe") != std::string::npos);
  }
  for (const std::string cmd : {"export-fp32", "to-universal", "reshard"}) {
    const std::string out = d / (cmd + "-out\xff");
    auto r =
        RunCkpt(cmd + " '" + root + "' '" + out + "' --json" + (cmd == "reshard" ? " --dp 1" : ""));
    INFO(cmd << ": " << r.out);
    CHECK(r.rc == 0);
    CHECK(fs::exists(out));
    CHECK(r.out.find("-out\\udcff") != std::string::npos);
  }
  // Lossless: Python's json + os.fsencode gives back the exact bytes.
  const std::string py =
      "/usr/bin/python3 -c \"import json, os, sys; j = json.load(sys.stdin); "
      "sys.exit(0 if os.fsencode(j['root']) == sys.argv[1].encode('utf-8', 'surrogateescape') "
      "and os.fsencode(j['root']).endswith(b'run\\\\xff\\\\xfe') else 1)\" '" + root + "'";
  CHECK(RunShell(CkptCommand("ls '" + root + "' --json") + " | " + py) == 0);
}

TEST_CASE("CLI rough edges: help COMMAND, did-you-mean, usage errors as JSON, defaults shown",
          "[io]") {
  auto help = RunCkpt("help check");
  CHECK(help.rc == 0);
  CHECK(help.out.find("--deep") != std::string::npos);
  auto typo = RunCkpt("chek run --json");
  CHECK(typo.rc == 2);
  CHECK(Json(typo)["error"]["message"].get<std::string>().find("did you mean 'check'?") !=
        std::string::npos);
  auto usage = RunCkpt("check --json");
  CHECK(usage.rc == 2);
  CHECK(Json(usage)["error"]["code"] == "InvalidArgument");
  CHECK(Json(usage)["error"]["message"].get<std::string>().find("ROOT is required") !=
        std::string::npos);
  for (const std::string cmd : {"next-update", "verify-resume", "verify", "check", "ls", "gc",
                                "export-fp32", "to-universal"}) {
    auto h = RunCkpt(cmd + " --help");
    INFO(h.out);
    CHECK(h.rc == 0);
    CHECK(h.out.find("ROOT") != std::string::npos);
    CHECK(h.out.find("[OPTIONS] root") == std::string::npos);
    CHECK(h.out.find("[root]") == std::string::npos);
  }
  CHECK(RunCkpt("export-fp32 --help").out.find("--dtype TEXT=fp32") != std::string::npos);
}

TEST_CASE("gc --keep-last --dry-run says what it would delete and deletes nothing", "[io]") {
  ScratchDir d;
  REQUIRE(RunCkpt("synth " + d.str() + " --ranks 1 --params 1000 --tags 3").rc == 0);
  auto dry = Json(RunCkpt("gc " + d.str() + " --keep-last 1 --dry-run --json"));
  CHECK(dry["dry_run"] == true);
  CHECK(dry["removed_tags"] == json({"global_step100", "global_step200"}));
  CHECK(fs::exists(d.str() + "/global_step100/manifest.json"));
  CHECK(fs::exists(d.str() + "/global_step200/manifest.json"));
  auto real = Json(RunCkpt("gc " + d.str() + " --keep-last 1 --json"));
  CHECK(real["removed_tags"] == json({"global_step100", "global_step200"}));
  CHECK(!fs::exists(d.str() + "/global_step100"));
}

TEST_CASE("check --deep: progress on a TTY only; a problem names its file once", "[io]") {
  ScratchDir d;
  REQUIRE(RunCkpt("synth " + d.str() + " --ranks 2 --params 200k").rc == 0);
  // A pseudo-terminal (script(1)): the bar is drawn on stderr; piped or --json it is not.
  const std::string tty = d / "tty.txt";
  const std::string cmd = CkptCommand("check " + d.str() + " --deep");
  REQUIRE(RunShell("script -qec '" + cmd + "' /dev/null > " + tty + " 2>&1") == 0);
  CHECK(Slurp(tty).find("check --deep [##############################] 100.0%") !=
        std::string::npos);
  REQUIRE(RunShell("script -qec '" + cmd + " --json' /dev/null > " + tty + " 2>&1") == 0);
  CHECK(Slurp(tty).find("check --deep [") == std::string::npos);
  CHECK(RunCkpt("check " + d.str() + " --deep").out.find("check --deep [") == std::string::npos);

  // Flip a byte inside rank 1's master values: the problem's text does not repeat the file.
  const std::string rank1 = d.str() + "/global_step100/rank_00001.h5";
  std::string bytes = Slurp(rank1);
  bytes[bytes.size() * 3 / 4] ^= 0x20;
  Spit(rank1, bytes);
  auto r = RunCkpt("check " + d.str() + " --deep --json");
  CHECK(r.rc == 1);
  auto j = Json(r);
  REQUIRE(!j["problems"].empty());
  bool dataset_problem = false;
  for (const auto& p : j["problems"]) {
    INFO(p.dump());
    CHECK(p["what"].get<std::string>().find("rank_00001.h5") == std::string::npos);
    if (!p["dataset"].get<std::string>().empty()) dataset_problem = true;
  }
  CHECK(dataset_problem);
}

// Issue 13 (one read interface) and issue 18 (rough edges): inspect and diff open what check,
// export-fp32 and reshard open, a universal directory included; diff draws progress on a TTY
// only, like check --deep.
TEST_CASE("inspect and diff read a universal directory; diff progress on a TTY only", "[io]") {
  ScratchDir d;
  const std::string root = d / "run", uni = d / "uni", other = d / "other";
  REQUIRE(RunCkpt("synth " + root + " --ranks 2 --zero 3 --params 200k").rc == 0);
  REQUIRE(RunCkpt("to-universal " + root + " " + uni).rc == 0);
  auto info = RunCkpt("inspect " + uni + " --json");
  REQUIRE(info.rc == 0);
  CHECK(Json(info)["kind"] == "universal");
  CHECK(Json(info)["total_params"] == Json(RunCkpt("inspect " + root + " --json"))["total_params"]);
  auto text = RunCkpt("inspect " + uni);
  CHECK(text.rc == 0);
  CHECK(text.out.find("universal layout") != std::string::npos);

  // The universal copy holds the same state: weights, moments, counters, per-rank datasets.
  auto same = RunCkpt("diff " + root + " " + uni + " --json");
  CHECK(same.rc == 0);
  CHECK(Json(same)["identical"] == true);
  CHECK(RunCkpt("diff " + uni + " " + root).out == "identical\n");
  // Another run differs in its values, found through the universal reader too.
  REQUIRE(RunCkpt("synth " + other + " --ranks 1 --params 200k --seed 9").rc == 0);
  auto differ = RunCkpt("diff " + uni + " " + other + " --json");
  CHECK(differ.rc == 1);
  bool master = false;
  const json found = Json(differ);
  for (const auto& x : found["differences"])
    if (x["what"].get<std::string>().rfind("master ", 0) == 0 && x["max_abs"].is_number())
      master = true;
  CHECK(master);

  const std::string tty = d / "tty.txt";
  const std::string cmd = CkptCommand("diff " + root + " " + uni);
  REQUIRE(RunShell("script -qec '" + cmd + "' /dev/null > " + tty + " 2>&1") == 0);
  CHECK(Slurp(tty).find("diff [##############################] 100.0%") != std::string::npos);
  REQUIRE(RunShell("script -qec '" + cmd + " --json' /dev/null > " + tty + " 2>&1") == 0);
  CHECK(Slurp(tty).find("diff [") == std::string::npos);
  CHECK(RunCkpt("diff " + root + " " + uni).out.find("diff [") == std::string::npos);
}

TEST_CASE("probe: saves under DIR both ways, says which was faster, leaves DIR as it was", "[io]") {
  ScratchDir d;
  const std::string dir = d / "disk";
  fs::create_directories(dir);
  {
    std::ofstream keep(dir + "/keep.txt");
    keep << "the user's file";
  }
  auto r = RunCkpt("probe " + dir + " --size 16MiB --ranks 2 --pairs 2 --json");
  INFO(r.err);
  REQUIRE(r.rc == 0);
  auto j = Json(r);
  CHECK(j["dir"] == dir);
  CHECK(j["ranks"] == 2);
  CHECK(j["pairs"] == 2);
  CHECK(j["compress"] == "zstd:1+shuffle");
  // The saves were real: every logical byte was stored by the uncompressed save, fewer by the
  // compressed one, two of each.
  const auto bytes = j["bytes"].get<uint64_t>();
  CHECK(bytes >= (15u << 20));
  CHECK(bytes <= (16u << 20));
  for (const char* k : {"none_seconds", "compressed_seconds"}) {
    CHECK(j["disk"][k]["each"].size() == 2);
    CHECK(j["disk"][k]["median"].get<double>() > 0);
  }
  const auto none_stored = j["disk"]["none_file_bytes"].get<uint64_t>();
  const auto comp_stored = j["disk"]["compressed_file_bytes"].get<uint64_t>();
  CHECK(none_stored >= bytes);
  CHECK(comp_stored > 0);
  CHECK(comp_stored < none_stored);
  CHECK(j["compression_ratio"].get<double>() ==
        Approx(static_cast<double>(none_stored) / static_cast<double>(comp_stored)));
  // The verdict follows the medians.
  const double speedup = j["disk"]["speedup"].get<double>();
  CHECK(speedup == Approx(j["disk"]["none_seconds"]["median"].get<double>() /
                          j["disk"]["compressed_seconds"]["median"].get<double>()));
  CHECK(j["recommended"] == (speedup > 1 ? "zstd:1+shuffle" : "none"));
  // The rule: where compression lost, the compressed save's own rate on this disk.
  if (speedup > 1)
    CHECK(j["crossover_bytes_per_s"].is_null());
  else
    CHECK(j["crossover_bytes_per_s"].get<double>() ==
          Approx(static_cast<double>(bytes) /
                 j["disk"]["compressed_seconds"]["median"].get<double>()));
  // Memory: ran where /dev/shm is a tmpfs with room, else says why not.
  if (j["memory"].is_null()) {
    CHECK_FALSE(j["memory_note"].get<std::string>().empty());
    CHECK(j["ceiling_bytes_per_s"].is_null());
  } else {
    CHECK(j["memory"]["compressed_seconds"]["each"].size() == 2);
    CHECK(j["memory"]["none_file_bytes"].get<uint64_t>() == none_stored);
    CHECK(j["ceiling_bytes_per_s"].get<double>() ==
          Approx(static_cast<double>(bytes) /
                 j["memory"]["compressed_seconds"]["median"].get<double>()));
  }
  // Nothing left behind, the user's file untouched.
  std::vector<std::string> left;
  for (const auto& e : fs::directory_iterator(dir)) left.push_back(e.path().filename().string());
  CHECK(left == std::vector<std::string>{"keep.txt"});
  std::error_code ec;
  for (const auto& e : fs::directory_iterator("/dev/shm", ec))
    CHECK(e.path().filename().string().rfind(".ckpt-probe-", 0) != 0);

  // No saves without a disk when asked, or where the directory is not in memory.
  auto off =
      Json(RunCkpt("probe " + dir + " --size 16MiB --ranks 1 --pairs 1 --memory-dir '' --json"));
  CHECK(off["memory"].is_null());
  CHECK(off["memory_note"].get<std::string>().find("not asked") != std::string::npos);
  auto text = RunCkpt("probe " + dir + " --size 16MiB --ranks 1 --pairs 1 --memory-dir " + dir);
  REQUIRE(text.rc == 0);
  CHECK(text.out.find("is not a file system in memory") != std::string::npos);
  CHECK(text.out.find("here: ") != std::string::npos);
  CHECK(text.out.find("rule: ") != std::string::npos);
  CHECK(text.out.find("no save with no disk to wait for: " + dir + " is not a file system") !=
        std::string::npos);
  CHECK(text.err.empty());  // no progress when stderr is not a TTY
}

TEST_CASE("probe: removes what an interrupted probe on this host left, nothing else", "[io]") {
  ScratchDir d;
  char host[256] = {};
  REQUIRE(gethostname(host, sizeof host - 1) == 0);
  std::string tag;
  for (const char* c = host; *c && tag.size() < 64; ++c)
    tag += std::isalnum(static_cast<unsigned char>(*c)) || *c == '.' ? *c : '_';
  // A process id no process has (above the kernel's pid_max), one that runs (ours: the test
  // process, not the probe's), and another host's.
  std::string pid_max = Slurp("/proc/sys/kernel/pid_max");
  const long dead = std::stol(pid_max) + 1;
  const std::string stale = ".ckpt-probe-" + tag + "-" + std::to_string(dead) + "-AbC123";
  const std::string live = ".ckpt-probe-" + tag + "-" + std::to_string(getpid()) + "-AbC123";
  const std::string other = ".ckpt-probe-otherhost-" + std::to_string(dead) + "-AbC123";
  for (const auto& name : {stale, live, other}) {
    fs::create_directories(d / name + "/1");
    Spit(d / name + "/1/rank_00000.h5", "left behind");
  }
  auto r = RunCkpt("probe " + d.str() + " --size 16MiB --ranks 1 --pairs 1 --memory-dir '' --json");
  INFO(r.err);
  REQUIRE(r.rc == 0);
  auto j = Json(r);
  CHECK(j["removed_stale"] == json::array({d / stale}));
  CHECK_FALSE(fs::exists(d / stale));
  CHECK(fs::exists(d / live + "/1/rank_00000.h5"));
  CHECK(fs::exists(d / other + "/1/rank_00000.h5"));
  std::vector<std::string> left;
  for (const auto& e : fs::directory_iterator(d.str()))
    left.push_back(e.path().filename().string());
  std::sort(left.begin(), left.end());
  std::vector<std::string> want{live, other};
  std::sort(want.begin(), want.end());
  CHECK(left == want);
}

TEST_CASE("probe: a missing directory, too little room and bad options exit 2", "[io]") {
  ScratchDir d;
  auto missing = RunCkpt("probe " + (d / "nope") + " --json");
  CHECK(missing.rc == 2);
  CHECK(missing.err.find(d / "nope") != std::string::npos);
  CHECK(missing.err.find("no such directory") != std::string::npos);
  const std::string file = d / "file";
  std::ofstream(file) << "x";
  CHECK(RunCkpt("probe " + file).rc == 2);
  auto big = RunCkpt("probe " + d.str() + " --size 1000000TiB");
  CHECK(big.rc == 2);
  CHECK(big.err.find("free, a save of the probe needs") != std::string::npos);
  CHECK(RunCkpt("probe " + d.str() + " --size 1MiB").rc == 2);
  CHECK(RunCkpt("probe " + d.str() + " --compress none").rc == 2);
  CHECK(RunCkpt("probe " + d.str() + " --compress lz9").rc == 2);
  CHECK(RunCkpt("probe " + d.str() + " --pairs 0").rc == 2);
  std::vector<std::string> left;
  for (const auto& e : fs::directory_iterator(d.str()))
    left.push_back(e.path().filename().string());
  CHECK(left == std::vector<std::string>{"file"});
}

TEST_CASE("probe --from: the saves carry the checkpoint's own master and moments", "[io]") {
  ScratchDir d;
  const std::string dir = d / "disk";
  fs::create_directories(dir);
  // A checkpoint of 2M parameters whose master and moments are all zero: compressed, its saves
  // shrink far more than synthetic values (1.2x) ever do.
  const std::string zeros = d / "zeros";
  ckpt::SynthOptions so;
  so.ranks = 2;
  so.params = 2'000'000;
  auto meta = ckpt::SynthManifest(so, 100);
  REQUIRE(meta.ok());
  ckpt::ThreadGroup group(2);
  const auto saved = ckpt::RunOnThreads(
      2,
      [&](int rank) {
        ckpt::SynthRankState state;
        ckpt::FillSynthRank(*meta, 0, rank, state, /*values=*/false);
        return ckpt::SaveCheckpoint(zeros, *meta, state.contents, group.ForRank(rank));
      },
      &group);
  for (const auto& s : saved) REQUIRE(s.ok());

  auto r =
      RunCkpt("probe " + dir + " --from " + zeros + " --size 16MiB --ranks 2 --pairs 1 --json");
  INFO(r.err);
  REQUIRE(r.rc == 0);
  auto j = Json(r);
  CHECK(j["from"] == zeros + "/global_step100");
  CHECK(j["bytes"].get<uint64_t>() >= (15u << 20));
  CHECK(j["compression_ratio"].get<double>() > 20);
  // Synthetic values, for contrast.
  auto synth = Json(RunCkpt("probe " + dir + " --size 16MiB --ranks 2 --pairs 1 --json"));
  CHECK(synth["from"].is_null());
  CHECK(synth["compression_ratio"].get<double>() < 2);

  // A checkpoint smaller than --size gives all it holds: 2M parameters of 12 bytes.
  auto all = Json(RunCkpt("probe " + dir + " --from " + zeros + " --size 1GiB --pairs 1 --json"));
  CHECK(all["bytes"].get<uint64_t>() <= 24'000'000);
  CHECK(all["bytes"].get<uint64_t>() >= 23'000'000);

  // Too small a checkpoint, a damaged one (exit 1: its data is read verified) and none at all.
  const std::string small = d / "small";
  REQUIRE(RunCkpt("synth " + small + " --ranks 2 --params 100k").rc == 0);
  auto tiny = RunCkpt("probe " + dir + " --from " + small);
  CHECK(tiny.rc == 2);
  CHECK(tiny.err.find("the probe needs at least 16 MiB") != std::string::npos);
  const std::string bad = d / "bad";
  REQUIRE(RunCkpt("synth " + bad + " --ranks 2 --params 2M").rc == 0);
  const std::string victim = bad + "/global_step100/rank_00000.h5";
  std::string bytes = Slurp(victim);
  bytes[bytes.size() / 2] ^= 0x5a;
  Spit(victim, bytes);
  auto damaged = RunCkpt("probe " + dir + " --from " + bad + " --size 16MiB --pairs 1");
  CHECK(damaged.rc == 1);
  CHECK(damaged.err.find("rank_00000.h5") != std::string::npos);
  CHECK(RunCkpt("probe " + dir + " --from " + (d / "nothing")).rc == 2);
  CHECK(fs::is_empty(dir));
}
