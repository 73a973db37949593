// The commit point (docs/format.md): a save killed at any rename or fsync of the protocol,
// deterministically (strace -e inject=SYSCALL:signal=KILL:when=N), leaves a root that readers
// resolve to its newest committed tag, that `ckpt gc` repairs, and that a resume continues from
// — never the wedge where a tag is committed but `latest` names the previous one, the resume
// retrains that step and fails at its save with AlreadyExists forever (issue 20, item 8).
// Also the explicit rollback (`ckpt rollback`), which the repair must not undo.
#include <catch2/catch.hpp>

#include <cstdio>
#include <filesystem>
#include <string>
#include <regex>
#include <sstream>
#include <tuple>
#include <vector>

#include <nlohmann/json.hpp>

#include "ckpt/root.h"
#include "reliability_util.h"

namespace fs = std::filesystem;
using namespace ckpt;
using namespace ckpt::reliability;

namespace {

// Runs `cmd` under strace, SIGKILLing the process that makes the n-th call of `syscalls`.
int RunKilledAt(const std::string& cmd, const std::string& syscalls, int n) {
  return testing::RunShell("timeout -s KILL 120 strace -f -qq -o /dev/null -e trace=" + syscalls +
                           " -e inject=" + syscalls + ":signal=KILL:when=" + std::to_string(n) +
                           " " + cmd + " >/dev/null 2>&1");
}

// The newest committed tag of the root, by the listing's order (global step, then time).
std::string NewestTag(const std::string& root) {
  auto listing = ListRoot(root);
  REQUIRE(listing.ok());
  return listing->tags.empty() ? "" : listing->tags.back().tag;
}

nlohmann::json LsJson(const std::string& root) {
  std::string out;
  REQUIRE(RunCli("ls --json " + root, &out) == 0);
  return nlohmann::json::parse(out);
}

// After a kill: readers resolve the newest committed tag; gc rewrites `latest` to it and
// removes the temporaries; the tag checks deep.
void ExpectRepairable(const std::string& root, const std::string& where) {
  INFO(where);
  if (!fs::exists(root)) return;  // killed before the root existed
  const std::string newest = NewestTag(root);
  if (newest.empty()) return;
  CHECK(LsJson(root)["latest"] == newest);
  std::string out;
  CHECK(RunCli("gc " + root, &out) == 0);
  const auto ls = LsJson(root);
  CHECK(ls["latest"] == newest);
  CHECK(ls["latest_inferred"] == false);
  CHECK(ls["temporary"].empty());
  CHECK(Slurp(root + "/latest").rfind(newest + "\n", 0) == 0);
  CHECK(RunCli("check --deep " + root, &out) == 0);
}

}  // namespace

TEST_CASE("ckpt synth killed at every rename and fsync: repaired by readers and gc", "[io]") {
  if (!HaveStrace()) {
    WARN("SKIPPED: strace is not installed (tools/lib.sh installs it)");
    return;
  }
  testing::ScratchDir dir("ckpt-commit-point");
  const std::string synth = testing::CkptCommand("synth ");
  const std::string args = " --params 20k --ranks 2 --zero 2 --tags 3";
  // strace counts calls per thread, and synth saves each tag on fresh threads, so `when=N`
  // reaches every rename and fsync of the first save (rank 0's thread: manifest, tag = the
  // commit point, latest; every fsync). Later saves' points are the engine case below, where
  // each rank is one process.
  int cases = 0, stale = 0;
  for (const std::string syscalls : {"rename", "fsync"}) {
    for (int n = 1;; ++n) {
      const std::string root = dir / (syscalls + std::to_string(n));
      const int rc = RunKilledAt(synth + root + args, syscalls, n);
      if (rc == 0) break;  // fewer than n calls: the whole run passed
      ++cases;
      if (fs::exists(root + "/latest")) {
        // `latest` is a 1.2 pointer: its first line names the tag it pointed at when killed.
        const std::string text = Slurp(root + "/latest");
        if (text.substr(0, text.find('\n')) != NewestTag(root)) ++stale;
      }
      ExpectRepairable(root, syscalls + " #" + std::to_string(n));
      fs::remove_all(root);
    }
  }
  std::printf("ckpt synth: %d kills (every rename and fsync of the first save), %d left "
              "`latest` behind a committed tag, all repaired\n", cases, stale);
  CHECK(cases >= 10);
}

TEST_CASE("engine_min killed at every rename and fsync of a save: the resume continues",
          "[io][mpi]") {
  if (!HaveStrace()) {
    WARN("SKIPPED: strace is not installed (tools/lib.sh installs it)");
    return;
  }
  testing::ScratchDir dir("ckpt-commit-engine");
  const std::string train = "mpirun -n 2 " + testing::BinDir() +
                            "/engine_min train --model tiny --zero 2 --save-every 1 --ckpt-dir ";
  // Step 1's save runs whole; the kill lands in step 2's save, in rank 0's process (strace
  // counts per process): its 3 renames (calls 4-6: manifest, tag, latest) and its 7 fsyncs
  // (calls 8-14: rank file, manifest, directories, latest). Rank 1 fsyncs once per save.
  int cases = 0, stale = 0;
  for (const auto& [syscalls, first, last] :
       {std::tuple<std::string, int, int>{"rename", 4, 6}, {"fsync", 8, 14}}) {
    for (int n = first; n <= last; ++n) {
      const std::string root = dir / (syscalls + std::to_string(n));
      const std::string where = syscalls + " #" + std::to_string(n);
      INFO(where);
      CHECK(RunKilledAt(train + root + " --steps 2", syscalls, n) != 0);
      ++cases;
      REQUIRE(fs::exists(root + "/global_step1/manifest.json"));
      if (fs::exists(root + "/global_step2/manifest.json") &&
          Slurp(root + "/latest").rfind("global_step1\n", 0) == 0)
        ++stale;  // the wedge of issue 20: committed, `latest` one behind
      // The resume starts from the newest committed tag and its saves succeed.
      const std::string log = dir / "resume.log";
      const int rc = testing::RunShell("timeout -s KILL 120 " + train + root +
                                       " --steps 3 --resume >" + log + " 2>&1");
      INFO(Slurp(log));
      CHECK(rc == 0);
      CHECK(NewestTag(root) == "global_step3");
      CHECK(Slurp(root + "/latest").rfind("global_step3\n", 0) == 0);
      std::string out;
      CHECK(RunCli("gc " + root, &out) == 0);
      CHECK(RunCli("check --deep " + root, &out) == 0);
      fs::remove_all(root);
    }
  }
  std::printf("engine_min: %d kills in a save (every rename and fsync of rank 0), %d left "
              "`latest` behind a committed tag, every resume continued\n", cases, stale);
  CHECK(cases == 10);
  CHECK(stale >= 1);
}

TEST_CASE("ckpt rollback: recorded, and not undone by the commit-point repair", "[io]") {
  testing::ScratchDir dir("ckpt-rollback");
  const std::string root = dir / "root";
  WriteSmallRoot(root, 1, 2, "none", 3, 300);
  std::string out;
  REQUIRE(RunCli("rollback " + root + " --to global_step100 --json", &out) == 0);
  auto j = nlohmann::json::parse(out);
  CHECK(j["latest"] == "global_step100");
  CHECK(j["moved_aside"].size() == 2);
  auto ls = LsJson(root);
  CHECK(ls["latest"] == "global_step100");
  CHECK(ls["latest_inferred"] == false);
  CHECK(ls["tags"].size() == 1);
  REQUIRE(RunCli("gc " + root, &out) == 0);
  CHECK(LsJson(root)["latest"] == "global_step100");
  const std::string log = Slurp(root + "/rollback.log");
  auto rec = nlohmann::json::parse(log.substr(0, log.find('\n')));
  CHECK(rec["from"] == "global_step300");
  CHECK(rec["to"] == "global_step100");
  // The moved tags are kept, outside the tag namespace, and gc leaves them.
  int aside = 0;
  for (const auto& e : fs::directory_iterator(root))
    if (e.path().filename().string().rfind(".rolled-back-", 0) == 0) ++aside;
  CHECK(aside == 2);
  CHECK(RunCli("rollback " + root + " --to global_step999", &out) == 2);
}

namespace {

// Directories `cmd` created (successful mkdir/mkdirat) whose parent it did not fsync afterwards,
// from an strace -y trace (fds print with their paths). Empty when every new entry is durable.
std::vector<std::string> CreatedWithoutParentSync(const std::string& cmd, int* created) {
  testing::ScratchDir tmp("ckpt-mkdir-trace");
  const std::string trace = tmp / "trace.txt";
  REQUIRE(testing::RunShell("ASAN_OPTIONS=\"${ASAN_OPTIONS:-}:detect_leaks=0\" timeout -s KILL "
                            "120 strace -f -qq -y -o " + trace +
                            " -e trace=mkdir,mkdirat,fsync,fdatasync " + cmd +
                            " >/dev/null 2>&1") == 0);
  const std::regex mkdir_re(R"re(mkdir(?:at)?\((?:AT_FDCWD, )?"([^"]+)".*\) = 0)re");
  const std::regex sync_re(R"re(f(?:data)?sync\(\d+<([^>]+)>\) = 0)re");
  std::vector<std::string> pending;  // created, parent not yet synced
  *created = 0;
  std::istringstream lines(Slurp(trace));
  std::string line;
  std::smatch m;
  while (std::getline(lines, line)) {
    if (std::regex_search(line, m, mkdir_re)) {
      ++*created;
      pending.push_back(fs::absolute(m[1].str()).lexically_normal().string());
    } else if (std::regex_search(line, m, sync_re)) {
      const fs::path synced = fs::path(m[1].str()).lexically_normal();
      std::erase_if(pending, [&](const std::string& p) {
        return fs::path(p).parent_path() == synced;
      });
    }
  }
  return pending;
}

}  // namespace

TEST_CASE("a new root's and a new output's directories are made durable (parent fsynced)",
          "[io]") {
  if (!HaveStrace()) {
    WARN("SKIPPED: strace is not installed (tools/lib.sh installs it)");
    return;
  }
  testing::ScratchDir dir("ckpt-durable-mkdir");
  const std::string cli = testing::BinDir() + "/ckpt ";
  const std::string root = dir / "new/a/root";
  int created = 0;
  // synth: the root and its missing parents, the staging directory, the tag (a rename).
  CHECK(CreatedWithoutParentSync(cli + "synth " + root + " --params 3k --ranks 2", &created) ==
        std::vector<std::string>{});
  CHECK(created >= 4);  // new, new/a, new/a/root and the save's temporary directory
  // A converter's output under missing parents.
  CHECK(CreatedWithoutParentSync(cli + "export-fp32 " + root + " " + (dir / "out/b/export"),
                                 &created) == std::vector<std::string>{});
  CHECK(created >= 3);  // out, out/b and the staging directory
}
