// Round trips, partition tiling, manifest validation and corruption detection.
#include <catch2/catch.hpp>

#include <cstring>
#include <filesystem>

#include "ckpt/hash.h"
#include "ckpt/json.h"
#include "ckpt/reader.h"
#include "ckpt/root.h"
#include "ckpt/synth.h"
#include "ckpt_test_helpers.h"
#include "manifest_util.h"
#include "test_util.h"

using namespace ckpt;
using namespace ckpt::testing;
namespace fs = std::filesystem;

TEST_CASE("every dtype, shape and kind round-trips bitwise", "[io]") {
  auto comp = GENERATE(as<std::string>{}, "none", "zstd:3", "zstd:1+shuffle");
  ScratchDir dir;
  Manifest m;
  m.tag = "all_dtypes";
  m.topology.dp_world_size = 1;
  m.partition = BuildPartition(m.params, 1, 0).value();
  std::vector<float> f32(1000);
  std::vector<double> f64(77);
  std::vector<uint16_t> u16(300);
  std::vector<int64_t> i64(33);
  std::vector<int32_t> i32(10);
  std::vector<uint8_t> u8(999);
  for (size_t i = 0; i < f32.size(); ++i) f32[i] = std::sin(static_cast<float>(i)) * 1e3f;
  f32[5] = -0.0f;
  f32[6] = std::numeric_limits<float>::infinity();
  for (size_t i = 0; i < f64.size(); ++i) f64[i] = 1.0 / (static_cast<double>(i) + 0.5);
  for (size_t i = 0; i < u16.size(); ++i) u16[i] = FloatToBf16(static_cast<float>(i) * 0.37f);
  for (size_t i = 0; i < i64.size(); ++i) i64[i] = static_cast<int64_t>(i) * -123456789012ll;
  for (size_t i = 0; i < i32.size(); ++i) i32[i] = static_cast<int32_t>(i) * 7 - 30;
  for (size_t i = 0; i < u8.size(); ++i) u8[i] = static_cast<uint8_t>(i * 13);
  const double scalar = 2.5;
  RankContents c;
  c.datasets.push_back(DatasetSpec::Tensor("t/f32_2d", DType::kF32, {40, 25}, f32.data()));
  c.datasets.push_back(DatasetSpec::Tensor("t/f64", DType::kF64, {77}, f64.data()));
  c.datasets.push_back(DatasetSpec::Tensor("t/bf16", DType::kBF16, {3, 10, 10}, u16.data()));
  c.datasets.push_back(DatasetSpec::Tensor("t/fp16", DType::kF16, {300}, u16.data()));
  c.datasets.push_back(DatasetSpec::Tensor("t/u16", DType::kU16, {300}, u16.data()));
  c.datasets.push_back(DatasetSpec::Tensor("t/i64", DType::kI64, {33}, i64.data()));
  c.datasets.push_back(DatasetSpec::Tensor("t/i32", DType::kI32, {10}, i32.data()));
  c.datasets.push_back(DatasetSpec::Tensor("t/u8", DType::kU8, {999}, u8.data()));
  c.datasets.push_back(DatasetSpec::Tensor("t/scalar", DType::kF64, {}, &scalar));
  c.datasets.push_back(DatasetSpec::Tensor("t/empty", DType::kF32, {0}, nullptr));
  const std::string blob("\0\1binary\xff", 10);  // must outlive the save (DatasetSpec points at it)
  c.datasets.push_back(DatasetSpec::Blob("rng/gen", "mt19937_64", blob));
  c.datasets.push_back(DatasetSpec::Json("data_position", R"({"epoch": 3})"));
  std::vector<float> empty_state;
  for (auto s : {"master", "exp_avg", "exp_avg_sq"})
    c.datasets.push_back(DatasetSpec::Tensor(s, DType::kF32, {0}, nullptr));
  SaveOptions opts;
  opts.compression = Compression::Parse(comp).value();
  opts.chunk_bytes = 256;  // many chunks, including a partial edge chunk
  SingleCollective one;
  REQUIRE(SaveCheckpoint(dir.str(), m, c, one, opts).ok());
  auto r = CheckpointReader::Open(dir.str());
  REQUIRE(r.ok());
  for (const auto& spec : c.datasets) {
    auto got = r->ReadDatasetBytes(0, spec.name);
    REQUIRE(got.ok());
    int64_t n = 1;
    for (auto d : spec.shape) n *= d;
    const size_t bytes = static_cast<size_t>(n) * DTypeSize(spec.dtype);
    REQUIRE(got->size() == bytes);
    if (bytes) CHECK(std::memcmp(got->data(), spec.data, bytes) == 0);
    const DatasetRecord* rec = r->manifest().FindDataset(0, spec.name);
    REQUIRE(rec);
    CHECK(rec->shape == spec.shape);
    CHECK(rec->dtype == spec.dtype);
    CHECK(rec->kind == spec.kind);
  }
  CHECK(r->ReadBlob(0, "rng/gen")->size() == 10);
  CHECK((*r->ReadJson(0, "data_position"))["epoch"] == 3);
  CHECK(r->manifest().files[0].compression == opts.compression.ToString());
  auto probs = CheckCheckpoint(r->dir(), true);
  REQUIRE(probs.ok());
  CHECK(probs->empty());
}

TEST_CASE("manifest fields round-trip", "[io]") {
  ScratchDir dir;
  Manifest m = SmallModel("global_step12", 3, 2);
  REQUIRE(SaveWithThreads(dir.str(), m).ok());
  auto r = CheckpointReader::Open(dir.str());
  REQUIRE(r.ok());
  const Manifest& got = r->manifest();
  CHECK(got.tag == "global_step12");
  CHECK(got.counters.global_step == 12);
  CHECK(got.counters.micro_step == 48);
  CHECK(got.counters.skipped_steps == 1);
  CHECK(got.counters.samples_seen == 384);
  CHECK(got.counters.tokens_seen == 49152);
  CHECK(got.topology.dp_world_size == 3);
  CHECK(got.topology.zero_stage == 2);
  CHECK(got.optimizer == m.optimizer);
  CHECK(got.client_state == m.client_state);
  CHECK(got.engine_config == m.engine_config);
  CHECK(got.version_major == kFormatMajor);
  CHECK(got.created_unix > 0);
  REQUIRE(got.params.size() == m.params.size());
  for (size_t i = 0; i < m.params.size(); ++i) {
    CHECK(got.params[i].name == m.params[i].name);
    CHECK(got.params[i].shape == m.params[i].shape);
    CHECK(got.params[i].frozen == m.params[i].frozen);
    CHECK(got.params[i].tied_to == m.params[i].tied_to);
    CHECK(got.params[i].ranges.size() == m.params[i].ranges.size());
  }
  CHECK(*ReadLatest(dir.str()) == "global_step12");
}

TEST_CASE("every partition scheme tiles and reads back the logical tensors", "[io]") {
  const int world = GENERATE(1, 2, 3, 4);
  const int zero = GENERATE(0, 1, 2, 3);
  ScratchDir dir;
  Manifest m = SmallModel("t", world, zero);
  REQUIRE(ValidateManifest(m).ok());
  REQUIRE(SaveWithThreads(dir.str(), m).ok());
  auto r = CheckpointReader::Open(dir.str());
  REQUIRE(r.ok());
  const char* states[3] = {"master", "exp_avg", "exp_avg_sq"};
  for (size_t pi = 0; pi < m.params.size(); ++pi) {
    const auto& p = m.params[pi];
    if (!p.tied_to.empty()) {
      CHECK(*r->ReadParamFull(p.name) == *r->ReadParamFull(p.tied_to));
      continue;
    }
    for (int s = 0; s < (p.frozen ? 1 : 3); ++s) {
      auto v = r->ReadParamFull(p.name, states[s]);
      REQUIRE(v.ok());
      for (int64_t e = 0; e < p.numel; ++e)
        REQUIRE(v->at(static_cast<size_t>(e)) == Val(static_cast<int>(pi), s, e));
    }
    if (!p.frozen) {  // a middle slice crossing rank boundaries
      std::vector<float> part(static_cast<size_t>(p.numel - 2));
      REQUIRE(r->ReadParamRange(p.name, "master", 1, p.numel - 1, part.data()).ok());
      CHECK(part.front() == Val(static_cast<int>(pi), 0, 1));
      CHECK(part.back() == Val(static_cast<int>(pi), 0, p.numel - 2));
    }
  }
  if (zero == 0) {
    for (int rk = 1; rk < world; ++rk) CHECK(m.partition.shard_numel[static_cast<size_t>(rk)] == 0);
  } else {
    for (auto n : m.partition.shard_numel) {
      CHECK(n == m.partition.shard_numel[0]);
      CHECK(n % m.partition.alignment == 0);
    }
  }
}

TEST_CASE("ranges that do not tile a tensor are rejected", "[unit]") {
  Manifest m = SmallModel("t", 2, 2);
  REQUIRE(ValidateManifest(m).ok());
  SECTION("gap") {
    m.params[0].ranges.back().end -= 1;
    auto s = ValidateManifest(m);
    REQUIRE_FALSE(s.ok());
    CHECK_THAT(s.message(), Catch::Contains("owned by no rank"));
  }
  SECTION("overlap") {
    m.params[0].ranges.push_back(m.params[0].ranges.front());
    CHECK_THAT(ValidateManifest(m).message(), Catch::Contains("overlaps"));
  }
  SECTION("shard slice out of bounds") {
    m.params[1].ranges.back().shard_offset = m.partition.shard_numel[1];
    CHECK_THAT(ValidateManifest(m).message(), Catch::Contains("outside the rank's shard"));
  }
  SECTION("two parameters share shard elements") {
    m.params[1].ranges = {{0, 0, m.params[1].numel, 0}};
    CHECK_FALSE(ValidateManifest(m).ok());
  }
  SECTION("rank out of range") {
    m.params[1].ranges.back().rank = 7;
    CHECK_THAT(ValidateManifest(m).message(), Catch::Contains("rank out of range"));
  }
  SECTION("numel disagrees with shape") {
    m.params[1].numel += 1;
    CHECK_THAT(ValidateManifest(m).message(), Catch::Contains("product of shape"));
  }
  SECTION("tied to a missing parameter") {
    m.params[2].tied_to = "nope";
    CHECK_THAT(ValidateManifest(m).message(), Catch::Contains("unknown"));
  }
}

TEST_CASE("param_owner partition: whole parameters on their owners, format 1.1", "[unit]") {
  Manifest m = SmallModel("t", 2, 1);
  std::vector<int> owners(m.params.size(), 0);
  for (size_t i = 0; i < owners.size(); ++i) owners[i] = static_cast<int>(i % 2 == 0 ? 1 : 0);
  m.partition = BuildOwnerPartition(m.params, 2, owners).value();
  CHECK(m.partition.scheme == "param_owner");
  REQUIRE(ValidateManifest(m).ok());
  int64_t used[2] = {0, 0};
  for (size_t i = 0; i < m.params.size(); ++i) {
    const ParamEntry& p = m.params[i];
    if (!p.trainable()) continue;
    REQUIRE(p.ranges.size() == 1);
    CHECK(p.ranges[0].rank == owners[i]);
    CHECK(p.ranges[0].begin == 0);
    CHECK(p.ranges[0].end == p.numel);
    CHECK(p.ranges[0].shard_offset == used[owners[i]]);
    used[owners[i]] += (p.numel + 15) / 16 * 16;
  }
  CHECK(m.partition.shard_numel == std::vector<int64_t>{used[0], used[1]});
  SECTION("a parameter split over ranks is not param_owner") {
    ParamEntry& p = m.params[0];
    const int64_t half = p.numel / 2;
    PartitionRange whole = p.ranges[0];
    p.ranges = {{whole.rank, 0, half, whole.shard_offset},
                {whole.rank, half, p.numel, whole.shard_offset + half}};
    CHECK_THAT(ValidateManifest(m).message(), Catch::Contains("spans several ranks"));
  }
  SECTION("bad owners are refused") {
    owners[0] = 2;
    CHECK_FALSE(BuildOwnerPartition(m.params, 2, owners).ok());
    owners.pop_back();
    CHECK_FALSE(BuildOwnerPartition(m.params, 2, owners).ok());
  }
}

TEST_CASE("manifest parsing refuses bad input with a clear message", "[unit]") {
  Manifest m = SmallModel("t", 1, 1);
  nlohmann::json j = ManifestToJson(m);
  SECTION("any edited value breaks the manifest's self-checksum") {
    // Format 1.1: the checksum is over the text (ManifestToJson is sealed for its dump()). This
    // manifest lists no files, so unedited it fails validation, not the checksum.
    CHECK_THAT(ParseManifest(j.dump(), "m.json").status().message(),
               !Catch::Contains("checksum"));
    j["counters"]["global_step"] = 13;
    auto r = ParseManifest(j.dump(), "m.json");
    CHECK(r.status().code() == StatusCode::kDataLoss);
    CHECK_THAT(r.status().message(), Catch::Contains("checksum"));
    // Any layout of the same object verifies only with its own seal.
    const std::string pretty = SerializeManifest(m, 4);
    CHECK_THAT(ParseManifest(pretty, "m.json").status().message(), !Catch::Contains("checksum"));
    std::string edited = pretty;
    edited.replace(edited.find("\"global_step\": 12"), 17, "\"global_step\": 13");
    CHECK(ParseManifest(edited, "m.json").status().code() == StatusCode::kDataLoss);
  }
  // The sections below edit fields on purpose, as a writer without the checksum would (1.0:
  // since 1.1 the checksum is required).
  SECTION("a 1.1 manifest without its checksum") {
    j.erase("manifest_xxh3");
    auto r = ManifestFromJson(j, "m.json");
    CHECK(r.status().code() == StatusCode::kDataLoss);
    CHECK_THAT(r.status().message(), Catch::Contains("no manifest_xxh3"));
  }
  j.erase("manifest_xxh3");
  j["format_version"] = "1.0";
  j["files"] = nlohmann::json::array();
  j["kind"] = "universal";  // files not required for this unit check
  REQUIRE(ManifestFromJson(j, "m.json").ok());
  SECTION("newer major version") {
    j["format_version"] = "2.0";
    auto r = ManifestFromJson(j, "m.json");
    REQUIRE_FALSE(r.ok());
    CHECK(r.status().code() == StatusCode::kUnimplemented);
    CHECK_THAT(r.status().message(), Catch::Contains("2.0") && Catch::Contains("1.x"));
  }
  SECTION("newer minor version is fine") {
    j["format_version"] = "1.7";
    const std::string text = j.dump();  // since 1.1 a manifest carries its checksum
    j["manifest_xxh3"] = DigestHex(Xxh3(text.data(), text.size()));
    CHECK(ManifestFromJson(j, "m.json").ok());
  }
  SECTION("missing field") {
    j["counters"].erase("global_step");
    CHECK_THAT(ManifestFromJson(j, "m.json").status().message(), Catch::Contains("global_step"));
  }
  SECTION("wrong type") {
    j["topology"]["zero_stage"] = "two";
    CHECK(ManifestFromJson(j, "m.json").status().code() == StatusCode::kDataLoss);
  }
  SECTION("not JSON") {
    auto r = ParseManifest("{not json", "m.json");
    CHECK(r.status().code() == StatusCode::kDataLoss);
    CHECK_THAT(r.status().message(), Catch::Contains("m.json"));
  }
  SECTION("foreign format") {
    j["format"] = "torch";
    CHECK_FALSE(ManifestFromJson(j, "m.json").ok());
  }
  SECTION("a control character in a string inspect or a message prints, refused and escaped") {
    // JSON carries any control character ("\u001b"): a tag, writer, time or parameter name
    // holding a terminal escape (C0) or a C1 CSI would drive the terminal that prints it.
    const std::string esc = "x\x1b[31mred";
    const std::string csi = std::string("x\xc2\x9b") + "31mred";
    auto refused = [&](nlohmann::json edited, const char* what) {
      auto r = ManifestFromJson(edited, "m.json");
      INFO(what);
      REQUIRE_FALSE(r.ok());
      CHECK(r.status().code() == StatusCode::kDataLoss);
      CHECK(r.status().message().find('\x1b') == std::string::npos);
      CHECK(r.status().message().find("\xc2\x9b") == std::string::npos);
      CHECK_THAT(r.status().message(), Catch::Contains("\\x1b") || Catch::Contains("\\xc2\\x9b"));
    };
    for (const std::string& bad : {esc, csi}) {
      nlohmann::json e = j;
      e["tag"] = bad;
      refused(e, "tag");
      e = j;
      e["writer"] = bad;
      refused(e, "writer");
      e = j;
      e["created_utc"] = bad;
      refused(e, "created_utc");
      e = j;
      e["params"][0]["name"] = bad;
      refused(e, "name");
      e = j;
      e["params"][1]["tied_to"] = bad;
      refused(e, "tied_to");
    }
    // A file record's path and a dataset's name and kinds likewise (ValidateManifest, as a
    // writer and every reader apply it).
    for (int what = 0; what < 3; ++what) {
      Manifest bad = SmallModel("t", 1, 1);
      FileRecord f;
      f.rank = 0;
      f.path = what == 0 ? esc : RankFileName(0);
      f.compression = "none";
      DatasetRecord d;
      d.name = what == 1 ? esc : "master";
      d.kind = what == 2 ? csi : "tensor";
      f.datasets.push_back(d);
      bad.files.push_back(f);
      const Status v = ValidateManifest(bad);
      INFO(what << ": " << v.message());
      CHECK(v.code() == StatusCode::kInvalidArgument);
      CHECK_THAT(v.message(), Catch::Contains("not printable"));
      CHECK(v.message().find('\x1b') == std::string::npos);
    }
    // Printable UTF-8 beyond ASCII is a name like any other.
    nlohmann::json e = j;
    e["writer"] = "ckpt \xc3\xbc";
    CHECK(ManifestFromJson(e, "m.json").ok());
  }
}

namespace {
// Expects a deep check to report exactly the named file (and dataset, when given).
void ExpectDetected(const std::string& tag_dir, const std::string& file, const std::string& ds = "") {
  auto probs = CheckCheckpoint(tag_dir, true);
  REQUIRE(probs.ok());
  REQUIRE_FALSE(probs->empty());
  bool named = false;
  for (const auto& p : *probs) {
    INFO(p.file << " /" << p.dataset << ": " << p.what);
    if (p.file == file && (ds.empty() || p.dataset == ds)) named = true;
  }
  CHECK(named);
}
}  // namespace

TEST_CASE("corruption is detected and named", "[io]") {
  const bool zstd = GENERATE(false, true);
  ScratchDir dir;
  Manifest m = SmallModel("global_step12", 2, 1);
  SaveOptions opts;
  if (zstd) opts.compression = Compression::Parse("zstd:3").value();
  REQUIRE(SaveWithThreads(dir.str(), m, opts).ok());
  const std::string tag = dir / "global_step12";
  const std::string rank1 = tag + "/rank_00001.h5";
  REQUIRE(CheckCheckpoint(tag, true)->empty());

  SECTION("a flipped byte inside a dataset") {
    // Find the master data: flip a byte of the stored float values of rank 1.
    std::string bytes = Slurp(rank1);
    std::vector<float> master(static_cast<size_t>(m.partition.shard_numel[1]));
    {
      // Closed before the corruption: HDF5 shares an open file's caches between handles.
      auto r = CheckpointReader::Open(tag);
      REQUIRE(r->ReadDataset(1, "master", master.data(), master.size() * 4).ok());
    }
    size_t pos = std::string::npos;
    if (!zstd) pos = bytes.find(std::string(reinterpret_cast<const char*>(master.data()) + 8, 8));
    if (pos == std::string::npos) pos = bytes.size() - 40;  // compressed: flip near the end
    bytes[pos] = static_cast<char>(bytes[pos] ^ 0x10);
    Spit(rank1, bytes);
    ExpectDetected(tag, "rank_00001.h5");
    auto fresh = CheckpointReader::Open(tag);
    REQUIRE(fresh.ok());
    std::vector<float> again(master.size());
    auto s = fresh->ReadDataset(1, "master", again.data(), again.size() * 4);
    if (!zstd) {
      CHECK(s.code() == StatusCode::kDataLoss);
      CHECK_THAT(s.message(), Catch::Contains("rank_00001.h5") && Catch::Contains("master"));
    }
  }
  SECTION("a truncated rank file") {
    std::string bytes = Slurp(rank1);
    Spit(rank1, bytes.substr(0, bytes.size() / 2));
    ExpectDetected(tag, "rank_00001.h5");
    auto r = CheckpointReader::Open(tag);
    REQUIRE(r.ok());
    std::vector<float> buf(static_cast<size_t>(m.partition.shard_numel[1]));
    auto s = r->ReadDataset(1, "master", buf.data(), buf.size() * 4);
    CHECK(s.code() == StatusCode::kDataLoss);
    CHECK_THAT(s.message(), Catch::Contains("rank_00001.h5"));
  }
  SECTION("a missing rank file") {
    fs::remove(rank1);
    ExpectDetected(tag, "rank_00001.h5");
  }
  SECTION("an edited manifest: a recorded checksum") {
    std::string text = Slurp(tag + "/manifest.json");
    auto j = nlohmann::json::parse(text);
    j["files"][0]["datasets"][0]["xxh3"] = "0000000000000000";
    Spit(tag + "/manifest.json", j.dump());
    ExpectDetected(tag, "manifest.json");  // the manifest's own checksum
    j.erase("manifest_xxh3");  // a 1.0 writer without the self-checksum: the data check names it
    j["format_version"] = "1.0";
    Spit(tag + "/manifest.json", j.dump());
    ExpectDetected(tag, "rank_00000.h5", j["files"][0]["datasets"][0]["name"]);
  }
  SECTION("an edited manifest: a counter") {
    auto j = nlohmann::json::parse(Slurp(tag + "/manifest.json"));
    j["counters"]["global_step"] = 13;
    Spit(tag + "/manifest.json", j.dump());
    ExpectDetected(tag, "manifest.json");
  }
  SECTION("a rank file from a newer format version is refused") {
    const std::string cmd = "/usr/bin/python3 -c \"import h5py,sys; f=h5py.File(sys.argv[1],'r+'); "
                            "f.attrs['format_version']=b'2.0'\" " + rank1;
    REQUIRE(RunShell(cmd) == 0);
    // Keep the manifest consistent with the rewritten file, as a newer writer would.
    auto j = nlohmann::json::parse(Slurp(tag + "/manifest.json"));
    j["files"][1]["bytes"] = fs::file_size(rank1);
    j["files"][1]["xxh3"] = "";  // no digests at all: the file is opened unverified
    j["files"][1].erase("metadata_xxh3");
    j["files"][1].erase("data_extents");
    j.erase("manifest_xxh3");
    j["format_version"] = "1.0";
    Spit(tag + "/manifest.json", j.dump());
    auto r = CheckpointReader::Open(tag);
    REQUIRE(r.ok());
    std::vector<float> buf(static_cast<size_t>(m.partition.shard_numel[1]));
    auto s = r->ReadDataset(1, "master", buf.data(), buf.size() * 4);
    CHECK(s.code() == StatusCode::kUnimplemented);
    CHECK_THAT(s.message(), Catch::Contains("rank_00001.h5") && Catch::Contains("2.0"));
  }
  SECTION("an edited manifest: shape") {
    auto j = nlohmann::json::parse(Slurp(tag + "/manifest.json"));
    j["params"][0]["shape"] = {38, 8};
    Spit(tag + "/manifest.json", j.dump());
    ExpectDetected(tag, "manifest.json");
    CHECK(CheckpointReader::Open(tag).status().code() == StatusCode::kDataLoss);
  }
  SECTION("a rank file from another tag") {
    ScratchDir other;
    REQUIRE(SaveWithThreads(other.str(), m, opts, /*salt=*/1).ok());
    fs::copy_file(other / "global_step12/rank_00001.h5", rank1, fs::copy_options::overwrite_existing);
    ExpectDetected(tag, "rank_00001.h5");
  }
}

TEST_CASE("check --deep names each damaged file of more than its first round", "[io]") {
  // 20 rank files: the first 16 are sealed before any data pass, the rest each by the thread
  // that checks it, outside libhdf5's lock (issue 19). Damage in either round is named, in
  // file order, and no other file is.
  ScratchDir dir;
  Manifest m = SmallModel("global_step12", 20, 1);
  REQUIRE(SaveWithThreads(dir.str(), m).ok());
  const std::string tag = dir / "global_step12";
  REQUIRE(CheckCheckpoint(tag, true)->empty());
  auto file = [&](int r) {
    return tag + "/rank_000" + (r < 10 ? "0" : "") + std::to_string(r) + ".h5";
  };
  auto flip = [&](int r, size_t at) {
    std::string bytes = Slurp(file(r));
    REQUIRE(at < bytes.size());
    bytes[at] = static_cast<char>(bytes[at] ^ 0x10);
    Spit(file(r), bytes);
  };
  const auto extents = CheckpointReader::Open(tag)->manifest().files;
  flip(3, extents[3].data_extents.front().first + 8);    // data, first round
  flip(17, 0);                                           // HDF5 metadata (the superblock)
  flip(19, extents[19].data_extents.front().first + 8);  // data
  {
    std::string bytes = Slurp(file(18));
    Spit(file(18), bytes.substr(0, bytes.size() - 100));  // truncated
  }
  auto probs = CheckCheckpoint(tag, true);
  REQUIRE(probs.ok());
  std::vector<std::string> named;
  for (const auto& p : *probs) {
    INFO(p.file << " /" << p.dataset << ": " << p.what);
    if (named.empty() || named.back() != p.file) named.push_back(p.file);
  }
  CHECK(named == std::vector<std::string>{"rank_00003.h5", "rank_00017.h5", "rank_00018.h5",
                                          "rank_00019.h5"});
  for (const auto& p : *probs) {
    if (p.file == "rank_00017.h5")
      CHECK_THAT(p.what, Catch::Contains("metadata checksum mismatch"));
    if (p.file == "rank_00018.h5") CHECK_THAT(p.what, Catch::Contains("manifest records"));
    if (p.file == "rank_00019.h5") CHECK_THAT(p.what, Catch::Contains("checksum mismatch"));
  }
}

TEST_CASE("synthetic checkpoints hold partition-independent values", "[io]") {
  ScratchDir a, b;
  SynthOptions o;
  o.params = 5000;
  o.ranks = 4;
  o.zero_stage = 3;
  REQUIRE(WriteSynthetic(a.str(), o).ok());
  o.ranks = 3;
  o.zero_stage = 1;
  REQUIRE(WriteSynthetic(b.str(), o).ok());
  auto ra = CheckpointReader::Open(a.str());
  auto rb = CheckpointReader::Open(b.str());
  REQUIRE(ra.ok());
  REQUIRE(rb.ok());
  CHECK(ra->manifest().UniqueParamCount() == 5000);
  for (const auto& p : ra->manifest().params) {
    CHECK(*ra->ReadParamFull(p.name) == *rb->ReadParamFull(p.name));
  }
}

namespace {

void CheckSameSummary(const ManifestSummary& a, const ManifestSummary& b) {
  CHECK(a.tag == b.tag);
  CHECK(a.global_step == b.global_step);
  CHECK(a.created_unix == b.created_unix);
  CHECK(a.dp_world_size == b.dp_world_size);
  CHECK(a.bytes == b.bytes);
  CHECK(a.sets_latest == b.sets_latest);
}

}  // namespace

// ListRoot and ReadLatest (every open of a root) summarize each tag's manifest instead of
// parsing it whole: same answers, same refusals of corrupt or malformed manifests.
TEST_CASE("a manifest summary agrees with the whole parse", "[io]") {
  ScratchDir d;
  Manifest m7 = SmallModel("global_step7", 3, 3);
  m7.counters.global_step = 7;
  REQUIRE(SaveWithThreads(d.str(), m7).ok());
  Manifest m8 = SmallModel("global_step8", 2, 1);
  m8.counters.global_step = 8;
  SaveOptions no_latest;
  no_latest.update_latest = false;
  REQUIRE(SaveWithThreads(d.str(), m8, no_latest).ok());

  for (const std::string tag : {"global_step7", "global_step8"}) {
    INFO(tag);
    const std::string text = Slurp(d / (tag + "/manifest.json"));
    const uint64_t fast = GetManifestParseStats().fast;
    auto s = ParseManifestSummary(text, "m.json");
    CHECK(GetManifestParseStats().fast == fast + 1);  // read from simdjson's tape
    auto whole = ParseManifest(text, "m.json");
    REQUIRE(s.ok());
    REQUIRE(whole.ok());
    CheckSameSummary(*s, SummarizeManifest(*whole));
    uint64_t on_disk = 0;  // independently: the rank files' sizes
    for (const auto& f : whole->files) on_disk += fs::file_size(d / (tag + "/" + f.path));
    CHECK(s->bytes == on_disk);
    CHECK(s->sets_latest == (tag == "global_step7"));
  }

  const std::string text = Slurp(d / "global_step7/manifest.json");
  const nlohmann::json j = nlohmann::json::parse(text);
  // Refused exactly as the whole parse refuses: same message.
  auto same_refusal = [](const std::string& bad, const std::string& needle) {
    auto s = ParseManifestSummary(bad, "m.json");
    auto whole = ParseManifest(bad, "m.json");
    REQUIRE_FALSE(whole.ok());
    REQUIRE_FALSE(s.ok());
    CHECK(s.status().code() == whole.status().code());
    CHECK(s.status().message() == whole.status().message());
    CHECK_THAT(s.status().message(), Catch::Contains(needle));
  };
  SECTION("a changed byte in the parameter table: the seal") {
    std::string bad = text;
    const size_t at = bad.find("\"numel\": ");
    REQUIRE(at != std::string::npos);
    bad[at + 9] = bad[at + 9] == '9' ? '8' : '9';
    same_refusal(bad, "manifest checksum mismatch");
  }
  SECTION("summarized fields missing, mistyped or inconsistent") {
    nlohmann::json e = j;
    e["counters"]["global_step"] = "7";
    same_refusal(SealedText(e), "counters.global_step is not an integer");
    e = j;
    e.erase("tag");
    same_refusal(SealedText(e), "missing field 'tag'");
    e = j;
    e["files"].erase(e["files"].size() - 1);
    same_refusal(SealedText(e), "2 rank files listed for dp_world_size 3");
    e = j;
    e["files"][1]["bytes"] = -1;
    same_refusal(SealedText(e), "bytes is negative");
    e = j;
    e["format"] = "torch";
    same_refusal(SealedText(e), "not a ckpt manifest");
    e = j;
    e.erase("manifest_xxh3");  // 1.2 and later: required
    same_refusal(e.dump(1), "no manifest_xxh3");
  }
  SECTION("nesting too deep inside a member the summary drops") {
    nlohmann::json e = j;
    nlohmann::json deep = nlohmann::json::array();
    for (int i = 0; i < 200; ++i) deep = nlohmann::json::array({deep});
    e["params"][0]["extra"] = deep;
    same_refusal(SealedText(e), "nested deeper than");
    std::string broken = text;
    broken.insert(broken.find("\"params\": [") + 11, "{");
    same_refusal(broken, "not valid JSON");
  }
  SECTION("format 1.0 (sealed over its compact dump) goes through the whole parse") {
    const std::string seed = std::string(CKPT_SOURCE_DIR) + "/tests/data/seed001/ckpt";
    const std::string old = Slurp(seed + "/global_step5/manifest.json");
    REQUIRE(old.find("\"format_version\": \"1.0\"") != std::string::npos);
    auto s = ParseManifestSummary(old, "m.json");
    auto whole = ParseManifest(old, "m.json");
    REQUIRE(s.ok());
    REQUIRE(whole.ok());
    CheckSameSummary(*s, SummarizeManifest(*whole));
    std::string edited = old;  // (this 1.0 file has no manifest_xxh3: the field's type fails)
    edited.replace(edited.find("\"global_step\": 5"), 16, "\"global_step\": \"5\"");
    same_refusal(edited, "counters.global_step is not an integer");
  }
  SECTION("a sealed manifest whose parameter table is invalid: listed, refused when opened") {
    // What the summary does not check: a writer's own bug, sealed. The listing shows the tag;
    // opening it, or rolling back to it, says what is wrong, and nothing is changed.
    nlohmann::json e = j;
    e["params"][0]["numel"] = e["params"][0]["numel"].get<int64_t>() + 1;
    Spit(d / "global_step7/manifest.json", SealedText(e));
    REQUIRE(ParseManifestSummary(SealedText(e), "m.json").ok());
    auto listing = ListRoot(d.str());
    REQUIRE(listing.ok());
    REQUIRE(listing->tags.size() == 2);
    CHECK(listing->tags[0].tag == "global_step7");
    CHECK(listing->tags[0].error.empty());
    CHECK(listing->latest == "global_step7");  // global_step8 did not set latest
    auto r = CheckpointReader::Open(d.str());
    REQUIRE_FALSE(r.ok());
    CHECK_THAT(r.status().message(),
               Catch::Contains("global_step7/manifest.json") && Catch::Contains("numel"));
    auto rb = RollbackLatest(d.str(), "global_step7");
    REQUIRE_FALSE(rb.ok());
    CHECK_THAT(rb.status().message(), Catch::Contains("numel"));
    CHECK(fs::exists(d / "global_step8/manifest.json"));
    CHECK(*ReadLatest(d.str()) == "global_step7");
  }
}

namespace {

// ParseManifest against the full parse alone (nlohmann's DOM, which it falls back to): the same
// manifest, or the same error. Returns how many of the two parses took the fast path (0 or 1).
uint64_t SameAsFullParse(const std::string& text) {
  const ManifestParseStats before = GetManifestParseStats();
  auto got = ParseManifest(text, "m.json");
  const uint64_t fast = GetManifestParseStats().fast - before.fast;
  auto j = ParseJson(text, "m.json");
  auto want = j.ok() ? ManifestFromJson(*j, "m.json") : Result<Manifest>(j.status());
  REQUIRE(got.ok() == want.ok());
  if (!got.ok()) {
    CHECK(got.status().message() == want.status().message());
    return fast;
  }
  CHECK(got->version_major == want->version_major);
  CHECK(got->version_minor == want->version_minor);
  CHECK(ManifestToJson(*got).dump() == ManifestToJson(*want).dump());
  CHECK(got->client_state == want->client_state);
  return fast;
}

}  // namespace

// ParseManifest reads a sealed manifest as ckpt writes it with simdjson, straight into the
// structs (issue 19: a ZeRO-3 manifest is megabytes); everything else, and every error, goes
// through nlohmann's DOM. Both give the same Manifest.
TEST_CASE("the fast manifest parse gives the full parse's manifest and leaves the rest to it",
          "[io]") {
  ScratchDir d;
  int step = 0;
  for (int zero : {0, 1, 2, 3}) {
    for (int world : {1, 3}) {
      Manifest m = SmallModel("global_step" + std::to_string(++step), world, zero);
      m.counters.global_step = step;
      m.client_state = nlohmann::json::parse(R"({"lr_history": [0.001, 2.5e-4, -1, 0, 1e300],
          "big": 18446744073709551615, "neg": -9223372036854775808, "none": null,
          "unicode": "d\u00e9j\u00e0 \ud83d\ude00", "empty": {}, "deep": [[[{"a": [true, false]}]]]})");
      SaveOptions o;
      if (zero == 2) o.compression = Compression::Parse("zstd:1+shuffle").value();
      REQUIRE(SaveWithThreads(d.str(), m, o).ok());
      INFO("zero " << zero << " world " << world);
      CHECK(SameAsFullParse(Slurp(d / (m.tag + "/manifest.json"))) == 1);
    }
  }
  const std::string text = Slurp(d / "global_step8/manifest.json");  // ZeRO-3, 3 ranks
  const nlohmann::json j = nlohmann::json::parse(text);

  SECTION("what both parsers read alike, the fast path reads") {
    nlohmann::json e = j;
    e["params"][0]["unknown"] = {{"x", 1}};
    e["files"][1]["datasets"][0]["unknown"] = "y";
    e["optimizer"] = 5;     // not an object: kept as it is
    e["dtypes"] = nullptr;  // null: {}
    e.erase("engine_config");
    CHECK(SameAsFullParse(SealedText(e)) == 1);
    // Duplicate keys: the last one counts, as nlohmann keeps it.
    std::string dup = SealedText(j);
    const size_t numel = dup.find("\"numel\":");
    REQUIRE(numel != std::string::npos);
    dup.insert(numel, "\"numel\": \"not this one\",\n");
    const size_t tag = dup.find("\"tag\":");
    dup.insert(tag, "\"tag\": 7,\n");
    dup.insert(dup.find("\"client_state\": {") + 17, "\"lr_history\": 1,");
    CHECK(SameAsFullParse(Resealed(dup)) == 1);
    // And the fast path's refusal of a damaged table is the full parse's message.
    e = j;
    e["params"][0]["numel"] = e["params"][0]["numel"].get<int64_t>() + 1;
    CHECK(SameAsFullParse(SealedText(e)) == 1);
    CHECK_THAT(ParseManifest(SealedText(e), "m.json").status().message(), Catch::Contains("numel"));
  }
  SECTION("what only nlohmann reads, or reads differently, goes to the full parse") {
    std::string bom = "\xef\xbb\xbf" + text;  // a byte-order mark: simdjson refuses it
    CHECK(SameAsFullParse(Resealed(bom)) == 0);
    nlohmann::json e = j;
    e["client_state"]["huge"] = 1e300;
    std::string bigint = SealedText(e);  // past 64 bits: a float to nlohmann, refused by simdjson
    bigint.replace(bigint.find("1e+300"), 6, "123456789012345678901234567890");
    CHECK(SameAsFullParse(Resealed(bigint)) == 0);
    e = j;
    e["counters"]["global_step"] = uint64_t{1} << 63;  // nlohmann would wrap it
    CHECK(SameAsFullParse(SealedText(e)) == 0);
    // "-0" in data_extents: no unsigned integer to nlohmann, 0 to simdjson.
    std::string minus0 = SealedText(j);
    const size_t ex = minus0.find("\"data_extents\": [");
    REQUIRE(ex != std::string::npos);
    const size_t first = minus0.find_first_of("0123456789", ex);
    const size_t end = minus0.find_first_not_of("0123456789", first);
    minus0.replace(first, end - first, "-0");
    CHECK(SameAsFullParse(Resealed(minus0)) == 0);
    CHECK_THAT(ParseManifest(Resealed(minus0), "m.json").status().message(),
               Catch::Contains("data_extents"));
    // Deeper than the fast path's 64 levels, within the full parse's 128.
    e = j;
    nlohmann::json deep = nlohmann::json::array();
    for (int i = 0; i < 80; ++i) deep = nlohmann::json::array({deep});
    e["client_state"]["deep"] = deep;
    CHECK(SameAsFullParse(SealedText(e)) == 0);
    // An unsealed 1.1, a damaged seal, a mistyped field: refused by the full parse.
    e = j;
    e["format_version"] = "1.1";
    e.erase("manifest_xxh3");
    CHECK(SameAsFullParse(e.dump(1)) == 0);
    std::string damaged = text;
    damaged[damaged.find("\"numel\": ") + 9] ^= 1;
    const uint64_t fast = GetManifestParseStats().fast;
    CHECK_THAT(ParseManifest(damaged, "m.json").status().message(),
               Catch::Contains("manifest checksum mismatch"));
    CHECK(GetManifestParseStats().fast == fast);
    e = j;
    e["params"][1]["ranges"][0]["begin"] = 1.0;
    CHECK(SameAsFullParse(SealedText(e)) == 0);
    CHECK_FALSE(ParseManifest(SealedText(e), "m.json").ok());
  }
  SECTION("format 1.0 goes to the full parse") {
    const std::string seed = std::string(CKPT_SOURCE_DIR) + "/tests/data/seed001/ckpt";
    CHECK(SameAsFullParse(Slurp(seed + "/global_step5/manifest.json")) == 0);
  }
}

// What the ranks of a load open after rank 0 sent them its tag's name (ckpt.torch.load,
// engine_min train --resume): that tag under their own root, or the tag directory given itself.
TEST_CASE("the agreed tag directory: a tag under the root, or the tag directory itself", "[io]") {
  ScratchDir d;
  for (int step : {1, 2}) {
    Manifest m = SmallModel("global_step" + std::to_string(step), 1, 0);
    m.counters.global_step = step;
    REQUIRE(SaveWithThreads(d.str(), m).ok());
  }
  auto under_root = ResolveAgreedTagDir(d.str(), "global_step1");  // not latest: as named
  REQUIRE(under_root.ok());
  CHECK(*under_root == d / "global_step1");
  const std::string tag_dir = d / "global_step2";
  auto itself = ResolveAgreedTagDir(tag_dir, "global_step2");
  REQUIRE(itself.ok());
  CHECK(*itself == tag_dir);
  CHECK(ResolveAgreedTagDir(d.str(), "global_step3").status().code() == StatusCode::kNotFound);
  CHECK(ResolveAgreedTagDir(d.str(), "../global_step1").status().code() ==
        StatusCode::kInvalidArgument);
  CHECK(ResolveAgreedTagDir(d / "nowhere", "global_step1").status().code() ==
        StatusCode::kNotFound);
}

namespace {

// How SerializeManifest wrote a manifest until 2026-12-05: nlohmann's DOM, dumped and sealed.
std::string SerializedByDom(const Manifest& m, int indent) {
  return Resealed(ManifestToJson(m).dump(indent) + "\n");
}

}  // namespace

// The parameter table and the file records are written straight from the structs (a DOM of a
// large manifest took 100-300 ms to build): the text is byte for byte the DOM's.
TEST_CASE("manifests are written byte for byte as nlohmann's DOM writes them", "[io]") {
  ScratchDir d;
  Manifest m = SmallModel("global_step3", 3, 3);
  // UTF-8 and characters JSON escapes (a name holds no control character: ValidateManifest).
  m.params[1].name = std::string("emb\xc3\xa9") + "d \"quoted\" back\\slash";
  m.client_state["note"] = "d\xc3\xa9j\xc3\xa0 \x01 vu";
  SaveOptions o;
  o.compression = Compression::Parse("zstd:1+shuffle").value();
  o.update_latest = false;  // "sets_latest": false
  REQUIRE(SaveWithThreads(d.str(), m, o).ok());
  auto r = CheckpointReader::Open(d / "global_step3");
  REQUIRE(r.ok());
  Manifest saved = r->manifest();
  REQUIRE(!saved.files.empty());
  CHECK(Slurp(d / "global_step3/manifest.json") == SerializedByDom(saved, 1));
  std::vector<Manifest> cases = {saved, SmallModel("global_step1", 1, 0), Manifest{}};
  Manifest unsealed_files = saved;  // files without a metadata seal, datasets without pieces
  for (auto& f : unsealed_files.files) {
    f.metadata_xxh3.clear();
    f.data_extents.clear();
    for (auto& ds : f.datasets) ds.piece_bytes = 0, ds.piece_xxh3.clear();
  }
  cases.push_back(unsealed_files);
  Manifest marked = saved;  // a client string that looks like the writer's own placeholder
  marked.client_state["trap"] = "\x01params";
  cases.push_back(marked);
  for (size_t i = 0; i < cases.size(); ++i) {
    INFO("case " << i);
    for (int indent : {-1, 0, 1, 2}) {
      INFO("indent " << indent);
      CHECK(SerializeManifest(cases[i], indent) == SerializedByDom(cases[i], indent));
    }
    CHECK(ManifestJsonText(cases[i]) == ManifestToJson(cases[i]).dump());
  }
  // Invalid UTF-8 in a name is refused as nlohmann's dump refuses it.
  Manifest bad = saved;
  bad.params[1].name = "\xff";
  CHECK_THROWS(SerializeManifest(bad));
}

TEST_CASE("JsonText: nlohmann's layout, every control character escaped, never a throw", "[unit]") {
  using nlohmann::json;
  // Plain documents print exactly as nlohmann's dump() and dump(2) print them.
  const json plain =
      json::parse(R"({"a": [1, 2.5, -3, true, null, {}], "b": {"c": "d \"q\" \\ é 中"},
                                     "e": [], "f": "tab\there", "g": 1e300})");
  CHECK(JsonText(plain) == plain.dump());
  CHECK(JsonText(plain, 2) == plain.dump(2));
  CHECK(JsonText(plain, 0) == plain.dump(0));
  // C0, DEL and C1 (an ESC or a C1 CSI drives a terminal): \u00XX; U+00A0 and beyond as they are.
  const std::string odd =
      "\x1b[31m\x07\x7f\xc2\x9b"
      "31m\xc2\x85\xc2\x9f\xc2\xa0\xe2\x80\xa8";
  const json j = {{"note", odd}, {odd, 1}};
  for (int indent : {-1, 2}) {
    const std::string text = JsonText(j, indent);
    INFO(text);
    CHECK(text.find("\\u001b[31m\\u0007\\u007f\\u009b31m\\u0085\\u009f\xc2\xa0\xe2\x80\xa8") !=
          std::string::npos);
    CHECK(PrintableUtf8(text) == (indent < 0));  // the indented text holds newlines
    CHECK(json::parse(text) == j);               // the same strings back
  }
  // Bytes that are not UTF-8 (a path): each as \udcXX, and no throw where dump() throws.
  const json bad = {{"path", std::string("run\xff\xfe\xc2")}};
  CHECK_THROWS(bad.dump());
  CHECK(JsonText(bad) == R"({"path":"run\udcff\udcfe\udcc2"})");
}
