// export-fp32 / to-universal / reshard through the CLI: an independent Python reconstruction
// agrees bitwise with the export and the universal file; bad inputs give clear errors, the
// documented exit codes and nothing in OUT; injected file-system faults publish nothing.
#include <catch2/catch.hpp>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>

#include "ckpt/reader.h"
#include "convert/export.h"
#include "convert/output_dir.h"
#include "convert/reshard.h"
#include "convert/universal.h"
#include "convert_test_util.h"
#include "safetensors/safetensors.h"
#include "test_util.h"

using namespace ckpt;
using namespace ckpt::convert;
using namespace ckpt::safetensors;
using ckpt::testing::CliResult;
using ckpt::testing::RunCkpt;
using ckpt::testing::RunShell;
using ckpt::testing::Slurp;

namespace {

std::string Python() {
  return "/usr/bin/python3 " + std::string(CKPT_SOURCE_DIR) + "/tests/convert/check_export.py";
}

}  // namespace

TEST_CASE("export equals an independent h5py reconstruction, bitwise", "[io]") {
  testing::ScratchDir dir("exp");
  for (int zero : {1, 3}) {
    const std::string src = dir / ("src" + std::to_string(zero));
    REQUIRE(testing::MakeSynthetic(src, 3, zero, 300000, 70001).ok());
    const std::string tag = src + "/global_step100";
    const std::string s = std::to_string(zero);
    REQUIRE(RunCkpt("export-fp32 " + src + " " + dir / ("e32_" + s) + " --json").rc == 0);
    REQUIRE(RunCkpt("export-fp32 " + src + " " + dir / ("ebf_" + s) +
                    " --dtype bf16 --max-shard-size 200KB --tied metadata --json")
                .rc == 0);
    REQUIRE(RunCkpt("export-fp32 " + src + " " + dir / ("ef16_" + s) +
                    " --dtype fp16 --exclude-frozen --json")
                .rc == 0);
    REQUIRE(RunCkpt("to-universal " + src + " " + dir / ("u_" + s) + " --json").rc == 0);
    CHECK(RunShell(Python() + " " + tag + " " + dir / ("e32_" + s) + " --universal " +
                   dir / ("u_" + s)) == 0);
    CHECK(RunShell(Python() + " " + tag + " " + dir / ("ebf_" + s) + " --dtype bf16 --tied metadata") ==
          0);
    CHECK(RunShell(Python() + " " + tag + " " + dir / ("ef16_" + s) +
                   " --dtype fp16 --exclude-frozen") == 0);
    CHECK(std::filesystem::exists(dir / ("ebf_" + s) + "/model.safetensors.index.json"));
    CHECK(std::filesystem::exists(dir / ("ebf_" + s) + "/model-00001-of-00004.safetensors"));
    // Export from the universal checkpoint gives the same file.
    REQUIRE(RunCkpt("export-fp32 " + dir / ("u_" + s) + " " + dir / ("eu_" + s) + " --json").rc ==
            0);
    CHECK(Slurp(dir / ("eu_" + s) + "/model.safetensors") ==
          Slurp(dir / ("e32_" + s) + "/model.safetensors"));
  }
  // The checker can fail: flip one data byte of an export.
  const std::string victim = dir / "e32_1/model.safetensors";
  std::string bytes = Slurp(victim);
  bytes[bytes.size() - 5] ^= 0x10;
  std::filesystem::permissions(victim, std::filesystem::perms::owner_write,
                               std::filesystem::perm_options::add);
  std::ofstream(victim, std::ios::binary | std::ios::trunc) << bytes;
  CHECK(RunShell(Python() + " " + dir / "src1/global_step100" + " " + dir / "e32_1 2>/dev/null") ==
        1);
}

TEST_CASE("export and to-universal of random layouts equal the h5py reconstruction", "[io]") {
  // Random worlds, ZeRO stages, model sizes (a few parameters to 7M, so tensors span several of
  // export's 8 MiB pieces and ranks' partitions cut them anywhere), largest tensors, compression
  // and export options, each checked bitwise by the independent reconstruction, fp32 exports
  // against to-universal's file too.
  testing::ScratchDir dir("expr");
  std::mt19937_64 rng(20261206);
  auto uniform = [&](int64_t lo, int64_t hi) {
    return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
  };
  int sharded = 0, multi_piece = 0, compressed = 0;
  for (int c = 0; c < 7; ++c) {
    const int world = static_cast<int>(uniform(1, 5));
    const int zero = static_cast<int>(uniform(0, 3));
    const int64_t params = uniform(0, 2) == 0 ? uniform(3, 200000) : uniform(2000000, 7000000);
    const int64_t largest = uniform(0, 1) ? uniform(1, params) : std::max<int64_t>(1, params / 2);
    const std::string compress = uniform(0, 3) == 0 ? "zstd:1+shuffle" : "none";
    const char* dtypes[] = {"fp32", "fp32", "bf16", "fp16"};
    const std::string dtype = dtypes[uniform(0, 3)];
    const std::string tied = uniform(0, 1) ? "copy" : "metadata";
    const bool exclude_frozen = uniform(0, 3) == 0;
    const int64_t shard = uniform(0, 2) == 0 ? uniform(100000, 20000000) : 0;
    const std::string src = dir / ("src" + std::to_string(c));
    const std::string out = dir / ("out" + std::to_string(c));
    INFO("case " << c << ": world " << world << ", ZeRO-" << zero << ", params " << params
                 << ", largest " << largest << ", " << compress << ", --dtype " << dtype
                 << " --tied " << tied << (exclude_frozen ? " --exclude-frozen" : "")
                 << " --max-shard-size " << shard);
    REQUIRE(testing::MakeSynthetic(src, world, zero, params, largest, compress).ok());
    std::string opts = " --dtype " + dtype + " --tied " + tied +
                       (exclude_frozen ? " --exclude-frozen" : "") + " --max-shard-size " +
                       std::to_string(shard);
    const CliResult e = RunCkpt("export-fp32 " + src + " " + out + opts + " --json");
    INFO(e.out << e.err);
    REQUIRE(e.rc == 0);
    std::string check = Python() + " " + src + "/global_step100 " + out + " --dtype " + dtype +
                        " --tied " + tied + (exclude_frozen ? " --exclude-frozen" : "");
    if (dtype == "fp32" && !exclude_frozen) {
      const std::string uni = dir / ("uni" + std::to_string(c));
      REQUIRE(RunCkpt("to-universal " + src + " " + uni + " --json").rc == 0);
      check += " --universal " + uni;
    }
    CHECK(RunShell(check) == 0);
    sharded += std::filesystem::exists(out + "/model.safetensors.index.json");
    multi_piece += largest * 4 > (16 << 20);
    compressed += compress != "none";
    std::filesystem::remove_all(src);
  }
  // What the cases reached (the seed is fixed: a change of the mix shows here).
  CHECK(sharded > 0);
  CHECK(multi_piece > 0);
  CHECK(compressed > 0);
}

TEST_CASE("export writes fp32 pieces from where they were read, the same bytes", "[io]") {
  testing::ScratchDir dir("exp_place");
  const std::string src = dir / "src";
  // A 24 MB tensor and smaller ones: every piece of 8 MiB or more can leave in place.
  REQUIRE(testing::MakeSynthetic(src, 2, 2, 12'000'000, 6'000'000).ok());
  ExportOptions o;
  const DirectWriteStats before = GetDirectWriteStats();
  const DirectReadStats read_before = GetDirectReadStats();
  {
    testing::DirectIoMode on("on");  // O_DIRECT reads although the source is in the page cache
    REQUIRE(ExportFp32(src, dir / "a", o).ok());
  }
  const DirectWriteStats after = GetDirectWriteStats();
  const DirectReadStats read_after = GetDirectReadStats();
  {
    testing::DirectIoMode off("off");  // through the page cache, from the same pieces
    REQUIRE(ExportFp32(src, dir / "b", o).ok());
  }
  CHECK(Slurp(dir / "a/model.safetensors") == Slurp(dir / "b/model.safetensors"));
  if (after.refused == before.refused && read_after.refused == read_before.refused) {
    // Every piece of the 24 MB tensor (its last one is 7.2 MB: 1 MiB is enough from where it
    // lies), less the unaligned ends of its pieces, and no byte through staging.
    CHECK(after.in_place_bytes - before.in_place_bytes >= 23'900'000u);
    CHECK(after.in_place_bytes - before.in_place_bytes == after.direct_bytes - before.direct_bytes);
    // Each piece was read at its place in the rank file's 4 KiB blocks, straight from the disk
    // into the export's slot (StateSource::ReadShift), not through the reader's bounce buffers.
    CHECK(read_after.direct_into_caller_bytes - read_before.direct_into_caller_bytes >=
          23'900'000u);
  } else {
    WARN("O_DIRECT refused on " << dir.str() << ": written through the page cache");
  }
}

TEST_CASE("export: names, shapes, tied metadata, frozen handling, no moments read", "[io]") {
  testing::ScratchDir dir("exp");
  const std::string src = dir / "src";
  REQUIRE(testing::MakeSynthetic(src, 2, 2, 20000, 4000).ok());
  auto rep = ExportFp32(src, dir / "out");
  REQUIRE(rep.ok());
  REQUIRE(rep->files.size() == 1);
  CHECK(rep->tied.at("lm_head.weight") == "embed.weight");
  const std::string path = dir / "out/model.safetensors";
  auto h = ReadSafetensorsHeader(path);
  REQUIRE(h.ok());
  CHECK(h->metadata.at("format") == "pt");
  CHECK(h->metadata.at("tied_weights") == R"({"lm_head.weight":"embed.weight"})");
  // Default TiedExport::kMetadata: the alias is only named.
  CHECK(h->Find("lm_head.weight") == nullptr);
  // kCopy: the alias is a tensor of its own with the owner's values.
  ExportOptions copy;
  copy.tied = TiedExport::kCopy;
  auto rep_copy = ExportFp32(src, dir / "out_copy", copy);
  REQUIRE(rep_copy.ok());
  const std::string copy_path = dir / "out_copy/model.safetensors";
  auto h_copy = ReadSafetensorsHeader(copy_path);
  REQUIRE(h_copy.ok());
  REQUIRE(h_copy->Find("lm_head.weight") != nullptr);
  CHECK(ReadSafetensorsTensorF32(copy_path, *h_copy, "lm_head.weight").value() ==
        ReadSafetensorsTensorF32(copy_path, *h_copy, "embed.weight").value());
  CHECK(h_copy->metadata.at("tied_weights") == R"({"lm_head.weight":"embed.weight"})");
  auto rd = CheckpointReader::Open(src);
  REQUIRE(rd.ok());
  const Manifest& m = rd->manifest();
  uint64_t master_bytes = 0;
  for (const auto& f : m.files)
    for (const auto& d : f.datasets)
      if (d.name == "master" || d.name.rfind("frozen/", 0) == 0) master_bytes += d.bytes;
  // Only master (+ frozen) bytes: the moments would triple it.
  CHECK(rep->bytes_read <= master_bytes);
  CHECK(rep->bytes_read * 10 >= master_bytes * 9);
  for (size_t pi = 0; pi < m.params.size(); ++pi) {
    const ParamEntry& p = m.params[pi];
    if (!p.tied_to.empty()) continue;
    const SafetensorsTensor* t = h->Find(p.name);
    REQUIRE(t != nullptr);
    CHECK(t->shape == p.shape);
    CHECK(t->dtype == DType::kF32);  // frozen bf16 converted to the requested dtype
    auto v = ReadSafetensorsTensorF32(path, *h, p.name);
    REQUIRE(v.ok());
    for (int64_t e = 0; e < p.numel; ++e) {
      const float want = p.frozen ? Bf16ToFloat(FloatToBf16(SynthValue(7, 100, pi, "frozen", e)))
                                  : SynthValue(7, 100, pi, "master", e);
      REQUIRE((*v)[static_cast<size_t>(e)] == want);
    }
  }
  ExportOptions ex;
  ex.exclude_frozen = true;
  ex.dtype = DType::kBF16;
  auto rep2 = ExportFp32(src, dir / "out2", ex);
  REQUIRE(rep2.ok());
  auto h2 = ReadSafetensorsHeader(dir / "out2/model.safetensors");
  REQUIRE(h2.ok());
  CHECK(h2->Find("pos_table") == nullptr);
  CHECK(h2->Find("embed.weight")->dtype == DType::kBF16);
  CHECK(rep2->excluded == std::vector<std::string>{"pos_table"});
}

TEST_CASE("bad inputs: clear errors, documented exit codes, nothing in OUT", "[io]") {
  testing::ScratchDir dir("bad");
  const std::string src = dir / "src";
  REQUIRE(testing::MakeSynthetic(src, 3, 2).ok());
  const std::string tag = src + "/global_step100";
  const std::string outs = dir / "outs";
  std::filesystem::create_directories(outs);
  auto nothing_left = [&](const std::string& out) {
    CHECK(testing::EmptyOrMissing(out));
    CHECK(testing::CountTemp(outs) == 0);
  };
  auto all_three = [&](const std::string& source, int want_rc, const std::string& want_text) {
    const std::string commands[] = {
        "export-fp32 " + source + " " + outs + "/e",
        "to-universal " + source + " " + outs + "/u",
        "reshard " + source + " " + outs + "/r --dp 2",
    };
    for (const auto& c : commands) {
      INFO(c);
      const CliResult r = RunCkpt(c);
      CHECK(r.rc == want_rc);
      INFO(r.err);
      CHECK(r.err.find(want_text) != std::string::npos);
    }
    nothing_left(outs + "/e");
    nothing_left(outs + "/u");
    nothing_left(outs + "/r");
  };

  SECTION("--dp 0 and a bad --zero are usage errors") {
    const CliResult dp0 = RunCkpt("reshard " + src + " " + outs + "/r --dp 0");
    CHECK(dp0.rc == 2);
    CHECK(dp0.err.find("--dp must be at least 1") != std::string::npos);
    CHECK(RunCkpt("reshard " + src + " " + outs + "/r --dp 2 --zero 5").rc == 2);
    CHECK(RunCkpt("export-fp32 " + src + " " + outs + "/e --dtype int8").rc == 2);
    nothing_left(outs + "/r");
  }
  SECTION("missing source") { all_three(dir / "nope", 2, "no such file"); }
  SECTION("non-empty OUT is refused and untouched") {
    std::filesystem::create_directories(outs + "/full");
    std::ofstream(outs + "/full/keep.txt") << "mine";
    for (const std::string c : {"export-fp32 ", "to-universal "}) {
      const CliResult r = RunCkpt(c + src + " " + outs + "/full");
      CHECK(r.rc == 2);
      CHECK(r.err.find("not empty") != std::string::npos);
    }
    CHECK(RunCkpt("reshard " + src + " " + outs + "/full --dp 2").rc == 2);
    CHECK(Slurp(outs + "/full/keep.txt") == "mine");
    CHECK(std::distance(std::filesystem::directory_iterator(outs + "/full"),
                        std::filesystem::directory_iterator()) == 1);
    CHECK(testing::CountTemp(outs) == 0);
    // An existing empty directory is fine.
    std::filesystem::create_directories(outs + "/empty");
    CHECK(RunCkpt("export-fp32 " + src + " " + outs + "/empty --json").rc == 0);
    CHECK(std::filesystem::exists(outs + "/empty/model.safetensors"));
  }
  SECTION("missing rank file") {
    std::filesystem::remove(tag + "/rank_00001.h5");
    all_three(src, 1, "rank_00001.h5 is missing");
  }
  SECTION("truncated rank file") {
    std::filesystem::resize_file(tag + "/rank_00002.h5",
                                 std::filesystem::file_size(tag + "/rank_00002.h5") / 2);
    all_three(src, 1, "rank_00002.h5 has");
  }
  SECTION("flipped value inside a rank file") {
    // Same size, valid HDF5, one master element changed: only the checksum can tell.
    REQUIRE(RunShell("/usr/bin/python3 -c \"import h5py; f=h5py.File('" + tag +
                     "/rank_00001.h5','r+'); d=f['master']; d[3]=d[3]+1.0; f.close()\"") == 0);
    if (std::filesystem::file_size(tag + "/rank_00001.h5") ==
        CheckpointReader::Open(src)->manifest().files[1].bytes) {
      all_three(src, 1, "checksum mismatch");
    } else {
      all_three(src, 1, "rank_00001.h5 has");
    }
  }
  SECTION("unknown format version") {
    const std::string mpath = tag + "/manifest.json";
    auto j = nlohmann::json::parse(Slurp(mpath));
    j["format_version"] = "9.0";
    std::ofstream(mpath, std::ios::trunc) << j.dump(2);
    all_three(src, 2, "9.0");
  }
  SECTION("unknown universal layout version") {
    REQUIRE(ConvertToUniversal(src, dir / "uni").ok());
    REQUIRE(RunShell("/usr/bin/python3 -c \"import h5py; f=h5py.File('" + dir / "uni" +
                     "/universal.h5','r+'); f.attrs['format_version']='9.0'; f.close()\"") == 0);
    // The file changed: refresh the recorded size and drop its digests (as a writer without
    // checksums would record it) so only the version is wrong.
    const std::string mpath = dir / "uni/manifest.json";
    auto j = nlohmann::json::parse(Slurp(mpath));
    j["files"][0]["bytes"] = std::filesystem::file_size(dir / "uni/universal.h5");
    j["files"][0]["xxh3"] = "";
    j["files"][0].erase("metadata_xxh3");
    j["files"][0].erase("data_extents");
    REQUIRE(testing::RewriteManifest(mpath, j).ok());
    const CliResult r = RunCkpt("reshard " + dir / "uni" + " " + outs + "/r --dp 2");
    CHECK(r.rc == 2);
    CHECK(r.err.find("universal layout 9.0") != std::string::npos);
    nothing_left(outs + "/r");
  }
}

TEST_CASE("a failed file-system step never publishes OUT", "[io]") {
  testing::ScratchDir dir("fault");
  const std::string src = dir / "src";
  REQUIRE(testing::MakeSynthetic(src, 2, 3, 20000, 4000).ok());
  for (FaultInjectionEnv::Op op :
       {FaultInjectionEnv::Op::kWrite, FaultInjectionEnv::Op::kSync, FaultInjectionEnv::Op::kRename,
        FaultInjectionEnv::Op::kSyncDir}) {
    for (int n = 1; n <= 3; ++n) {
      FaultInjectionEnv env(Env::Default());
      env.FailAt(op, n);
      ExportOptions eo;
      eo.env = &env;
      eo.max_shard_bytes = 30000;  // several files, several renames
      auto e = ExportFp32(src, dir / "e", eo);
      INFO("export fails at op " << static_cast<int>(op) << " #" << n);
      if (!e.ok()) {
        CHECK(testing::EmptyOrMissing(dir / "e"));
        CHECK(testing::CountTemp(dir.str()) == 0);
      } else {
        // The fault hit after the publishing rename (final directory fsync): complete output.
        CHECK(std::filesystem::exists(dir / "e/model.safetensors.index.json"));
        std::filesystem::remove_all(dir / "e");
      }
      FaultInjectionEnv env2(Env::Default());
      env2.FailAt(op, n);
      ToUniversalOptions uo;
      uo.env = &env2;
      auto u = ConvertToUniversal(src, dir / "u", uo);
      if (!u.ok()) {
        CHECK(testing::EmptyOrMissing(dir / "u"));
        CHECK(testing::CountTemp(dir.str()) == 0);
      } else {
        std::filesystem::remove_all(dir / "u");
      }
      FaultInjectionEnv env3(Env::Default());
      env3.FailAt(op, n);
      ReshardOptions ro;
      ro.dp = 3;
      ro.env = &env3;
      auto r = Reshard(src, dir / "r", ro);
      if (!r.ok()) {
        CHECK(testing::EmptyOrMissing(dir / "r"));
        CHECK(testing::CountTemp(dir.str()) == 0);
      } else {
        std::filesystem::remove_all(dir / "r");
      }
    }
  }
}

TEST_CASE("export cuts a piece at a rank boundary where the rest of it is large", "[io]") {
  testing::ScratchDir dir("exp_cut");
  const std::string src = dir / "src";
  // ZeRO-2 over two ranks: the 4 M-element tensor's elements are split between the ranks.
  REQUIRE(testing::MakeSynthetic(src, 2, 2, 4'000'000, 4'000'000).ok());
  auto reader = CheckpointReader::Open(src);
  REQUIRE(reader.ok());
  const ParamEntry* split = nullptr;
  for (const auto& p : reader->manifest().params)
    if (p.ranges.size() == 2) split = &p;
  REQUIRE(split != nullptr);
  const int64_t boundary = split->ranges[0].end;
  // Pieces of 1000 elements less than the boundary: the second piece starts 1000 elements
  // before it and would end far past it, its rank-1 part (about 8 MB) not in place.
  ExportOptions o;
  o.chunk_elements = boundary - 1000;
  REQUIRE(split->numel - boundary >= (int64_t{1} << 20) + 1000);
  REQUIRE(split->numel >= 2 * (boundary - 1000));
  const DirectReadStats before = GetDirectReadStats();
  {
    testing::DirectIoMode on("on");
    REQUIRE(ExportFp32(src, dir / "a", o).ok());
  }
  const DirectReadStats after = GetDirectReadStats();
  REQUIRE(ExportFp32(src, dir / "b", ExportOptions()).ok());
  CHECK(Slurp(dir / "a/model.safetensors") == Slurp(dir / "b/model.safetensors"));
  if (after.refused == before.refused) {
    // Both large parts went from the disk straight into the slots: [0, boundary - 1000) and
    // [boundary, 2 * (boundary - 1000)), less at most a block at the ends of each; the
    // 1000-element piece before the boundary and the tensor's short tail are read otherwise.
    // (Without the cut only the first part: about 8 MB.)
    const uint64_t in_place = after.direct_into_caller_bytes - before.direct_into_caller_bytes;
    CHECK(in_place + 4 * 4096 >= 4 * static_cast<uint64_t>(2 * boundary - 3000));
    CHECK(after.buffered_bytes - before.buffered_bytes < (1u << 20));
  } else {
    WARN("O_DIRECT refused on " << dir.str());
  }
}

TEST_CASE("an output whose publishing fsync fails goes back to staging and away", "[io]") {
  testing::ScratchDir dir("staged");
  // Begin creates the staging directory without an fsync of the parent; Commit fsyncs the
  // staging directory (#1), renames it to OUT, fsyncs the parent (#2).
  for (int n = 1; n <= 2; ++n) {
    FaultInjectionEnv env(Env::Default());
    env.FailAt(FaultInjectionEnv::Op::kSyncDir, n);
    {
      auto staged = StagedOutput::Begin(dir / "out", &env);
      REQUIRE(staged.ok());
      REQUIRE(WriteFileAtomic(Env::Default(), staged->staging() + "/f", "x").ok());
      Status s = staged->Commit();
      INFO("fsync #" << n << ": " << s.ToString());
      CHECK(s.code() == StatusCode::kIOError);
    }
    CHECK(testing::EmptyOrMissing(dir / "out"));
    CHECK(testing::CountTemp(dir.str()) == 0);
  }
  auto staged = StagedOutput::Begin(dir / "out", Env::Default());
  REQUIRE(staged.ok());
  REQUIRE(staged->Commit().ok());
  CHECK(std::filesystem::is_directory(dir / "out"));
}

// Context is added once per layer: the source names the parameter it failed to read, the
// converters do not name it again ("parameter 'x': parameter 'x': ..." before).
TEST_CASE("a failed read names the parameter once", "[io]") {
  testing::ScratchDir dir("fault-read");
  const std::string src = dir / "src";
  REQUIRE(testing::MakeSynthetic(src, 2, 3, 20000, 4000).ok());
  auto occurrences = [](const std::string& text, const std::string& what) {
    int n = 0;
    for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
    return n;
  };
  int named = 0;
  for (int n = 1; n <= 40; ++n) {
    std::vector<Status> failures;
    {
      FaultInjectionEnv env(Env::Default());
      env.FailAt(FaultInjectionEnv::Op::kRead, n);
      ExportOptions eo;
      eo.env = &env;
      auto e = ExportFp32(src, dir / ("e" + std::to_string(n)), eo);
      if (!e.ok()) failures.push_back(e.status());
    }
    {
      FaultInjectionEnv env(Env::Default());
      env.FailAt(FaultInjectionEnv::Op::kRead, n);
      ToUniversalOptions uo;
      uo.env = &env;
      auto u = ConvertToUniversal(src, dir / ("u" + std::to_string(n)), uo);
      if (!u.ok()) failures.push_back(u.status());
    }
    for (const Status& st : failures) {
      const std::string text = st.ToString();
      INFO("read #" << n << ": " << text);
      CHECK(occurrences(text, "parameter '") <= 1);
      if (occurrences(text, "parameter '") == 1) ++named;
    }
  }
  CHECK(named > 0);  // some fault landed inside a parameter read
}

TEST_CASE("ckpt check verifies an export: headers always, tensor data with --deep", "[io]") {
  testing::ScratchDir dir("check-exp");
  const std::string src = dir / "src";
  REQUIRE(testing::MakeSynthetic(src, 2, 2, 20000, 4000).ok());
  REQUIRE(RunCkpt("export-fp32 " + src + " " + dir / "one").rc == 0);
  REQUIRE(RunCkpt("export-fp32 " + src + " " + dir / "many --max-shard-size 30000").rc == 0);
  CliResult checked;  // the latest check's result
  auto check = [&](const std::string& args) {
    checked = RunCkpt("check " + args);
    return checked.rc;
  };
  CHECK(check(dir / "one --deep") == 0);
  CHECK(check(dir / "many --deep") == 0);
  CHECK(check(dir / "one/model.safetensors") == 0);
  REQUIRE(check(dir / "many --deep --json") == 0);
  auto j = nlohmann::json::parse(checked.out);
  CHECK(j["ok"] == true);
  CHECK(j["kind"] == "safetensors");
  CHECK(j["checksummed"] == true);
  CHECK(j["files"].size() >= 2);
  auto h = ReadSafetensorsHeader(dir / "one/model.safetensors");
  REQUIRE(h.ok());
  CHECK(check(dir / ("one --deep --tag " + h->metadata.at("ckpt_tag"))) == 0);
  CHECK(check(dir / "one --tag global_step1") == 1);
  CHECK((checked.out + checked.err).find("expected 'global_step1'") != std::string::npos);

  // A flipped data byte: the headers still verify, --deep names the file and the tensor.
  const SafetensorsTensor& last = h->tensors.back();
  {
    std::fstream f(dir / "one/model.safetensors", std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(static_cast<std::streamoff>(h->data_start + last.begin));
    char c = 0;
    f.get(c);
    f.seekp(static_cast<std::streamoff>(h->data_start + last.begin));
    f.put(static_cast<char>(c ^ 0x10));
  }
  CHECK(check(dir / "one") == 0);
  CHECK(check(dir / "one --deep") == 1);
  CHECK((checked.out + checked.err)
            .find("model.safetensors tensor " + last.name + ": checksum mismatch") !=
        std::string::npos);
  // A missing shard, and nothing to check.
  const std::string first_shard = j["files"][0].get<std::string>();
  std::filesystem::remove(dir / ("many/" + first_shard));
  CHECK(check(dir / "many") == 1);
  CHECK((checked.out + checked.err).find(first_shard) != std::string::npos);
  CHECK(check(dir / "missing") == 2);
  std::filesystem::create_directories(dir / "empty");
  CHECK(check(dir / "empty") == 2);
}
