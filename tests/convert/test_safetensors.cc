// safetensors writer/reader: format details, round trips and malformed files.
#include <catch2/catch.hpp>
#include <cstring>
#include <filesystem>

#include <xxhash.h>

#include <map>
#include <nlohmann/json.hpp>
#include <tuple>

#include "ckpt/hash.h"
#include "safetensors/safetensors.h"
#include "test_util.h"

using namespace ckpt;
using namespace ckpt::safetensors;
using ckpt::testing::Slurp;
using ckpt::testing::Spit;

namespace {

// A file made of a raw header text and raw data bytes.
std::string RawFile(const std::string& header, const std::string& data) {
  std::string out(8, '\0');
  uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>(n >> (8 * i));
  return out + header + data;
}

int CountTempFiles(const std::string& dir) {
  int n = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir))
    if (e.path().filename().string().rfind(".tmp-", 0) == 0) ++n;
  return n;
}

}  // namespace

TEST_CASE("safetensors round trip keeps bytes, shapes, dtypes and metadata", "[unit][io]") {
  testing::ScratchDir dir("st");
  std::vector<float> a = {1.5f, -2.25f, 3.0f, 0.0f, 1e-30f, -0.0f};
  std::vector<uint16_t> b = {FloatToBf16(1.0f), FloatToBf16(-3.5f), FloatToBf16(0.1f)};
  std::vector<int64_t> c = {7, -9};
  const std::string path = dir / "x.safetensors";
  REQUIRE(WriteSafetensors(path,
                           {{{"w.a", DType::kF32, {2, 3}}, a.data()},
                            {{"scalar_empty", DType::kF32, {0}}, nullptr},
                            {{"w.b", DType::kBF16, {3}}, b.data()},
                            {{"ints", DType::kI64, {2, 1}}, c.data()}},
                           {{"format", "pt"}, {"tied.lm_head.weight", "embed.weight"}})
              .ok());
  CHECK(CountTempFiles(dir.str()) == 0);

  const std::string bytes = Slurp(path);
  uint64_t hlen = 0;
  for (int i = 7; i >= 0; --i) hlen = (hlen << 8) | static_cast<uint8_t>(bytes[i]);
  CHECK((8 + hlen) % 8 == 0);  // data section 8-byte aligned
  CHECK(bytes.size() == 8 + hlen + 6 * 4 + 3 * 2 + 2 * 8);

  auto h = ReadSafetensorsHeader(path);
  REQUIRE(h.ok());
  CHECK(h->metadata.at("format") == "pt");
  CHECK(h->metadata.at("tied.lm_head.weight") == "embed.weight");
  REQUIRE(h->tensors.size() == 4);
  const SafetensorsTensor* ta = h->Find("w.a");
  REQUIRE(ta != nullptr);
  CHECK(ta->shape == std::vector<int64_t>{2, 3});
  CHECK(ta->begin == 0);
  CHECK(ta->end == 24);
  auto ra = ReadSafetensorsTensor(path, *h, "w.a");
  REQUIRE(ra.ok());
  CHECK(std::memcmp(ra->data(), a.data(), 24) == 0);
  auto rb = ReadSafetensorsTensorF32(path, *h, "w.b");
  REQUIRE(rb.ok());
  CHECK((*rb)[0] == 1.0f);
  CHECK((*rb)[1] == -3.5f);
  CHECK((*rb)[2] == Bf16ToFloat(FloatToBf16(0.1f)));
  auto rc = ReadSafetensorsTensor(path, *h, "ints");
  REQUIRE(rc.ok());
  CHECK(std::memcmp(rc->data(), c.data(), 16) == 0);
  CHECK(ReadSafetensorsTensorF32(path, *h, "ints").status().code() == StatusCode::kInvalidArgument);
  CHECK(ReadSafetensorsTensor(path, *h, "nope").status().code() == StatusCode::kNotFound);
}

TEST_CASE("streaming writer appends tensors in pieces and publishes only on Finish", "[unit][io]") {
  testing::ScratchDir dir("st");
  const std::string path = dir / "s.safetensors";
  std::vector<float> big(1000);
  for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<float>(i) * 0.5f;
  {
    auto w = SafetensorsWriter::Create(
        path, {{"big", DType::kF32, {10, 100}}, {"small", DType::kF32, {2}}}, {});
    REQUIRE(w.ok());
    CHECK(w->current()->name == "big");
    REQUIRE(w->Append(big.data(), 1000).ok());
    REQUIRE(w->Append(reinterpret_cast<char*>(big.data()) + 1000, 3000).ok());
    CHECK(w->current()->name == "small");
    // A piece may not straddle two tensors.
    CHECK(w->Append(big.data(), 12).code() == StatusCode::kInvalidArgument);
    // Finishing early refuses and publishes nothing.
    CHECK(w->Finish().code() == StatusCode::kFailedPrecondition);
    CHECK(!std::filesystem::exists(path));
    REQUIRE(w->Append(big.data(), 8).ok());
    CHECK(!w->current().has_value());
    CHECK(!std::filesystem::exists(path));
    REQUIRE(w->Finish().ok());
    CHECK(std::filesystem::file_size(path) == w->file_size());
  }
  auto h = ReadSafetensorsHeader(path);
  REQUIRE(h.ok());
  auto r = ReadSafetensorsTensorF32(path, *h, "big");
  REQUIRE(r.ok());
  CHECK(*r == big);
  auto s = ReadSafetensorsTensorF32(path, *h, "small");
  REQUIRE(s.ok());
  CHECK(*s == std::vector<float>{0.0f, 0.5f});
  CHECK(CountTempFiles(dir.str()) == 0);

  // Abandoned writer: its temporary file is removed, no final file appears.
  const std::string path2 = dir / "abandoned.safetensors";
  {
    auto w = SafetensorsWriter::Create(path2, {{"t", DType::kF32, {4}}}, {});
    REQUIRE(w.ok());
    REQUIRE(w->Append(big.data(), 8).ok());
    CHECK(CountTempFiles(dir.str()) == 1);
  }
  CHECK(!std::filesystem::exists(path2));
  CHECK(CountTempFiles(dir.str()) == 0);
}

namespace {

uint64_t HeaderLength(const std::string& bytes) {
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<uint8_t>(bytes[i]);
  return n;
}

std::string Hex(uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

// Three tensors (one empty) written by the streaming writer, in pieces.
struct SmallFile {
  std::vector<float> a = std::vector<float>(300);
  std::vector<uint16_t> b = {1, 2, 3, 4, 5};
  std::string path;
};

SmallFile WriteSmall(const std::string& dir, const std::map<std::string, std::string>& meta) {
  SmallFile f;
  for (size_t i = 0; i < f.a.size(); ++i) f.a[i] = static_cast<float>(i) * 0.25f - 7.0f;
  f.path = dir + "/small.safetensors";
  auto w = SafetensorsWriter::Create(f.path,
                                     {{"layer.weight", DType::kF32, {30, 10}},
                                      {"empty", DType::kF32, {0, 4}},
                                      {"layer.bias", DType::kBF16, {5}}},
                                     meta);
  REQUIRE(w.ok());
  REQUIRE(w->Append(f.a.data(), 400).ok());
  REQUIRE(w->Append(reinterpret_cast<const char*>(f.a.data()) + 400, 800).ok());
  REQUIRE(w->Append(f.b.data(), 10).ok());
  REQUIRE(w->Finish().ok());
  return f;
}

}  // namespace

TEST_CASE("the writer records the XXH3 of every tensor and of the header", "[unit][io]") {
  testing::ScratchDir dir("st-digest");
  // A caller's value for a reserved key is replaced, never trusted.
  SmallFile f = WriteSmall(dir.str(), {{"format", "pt"}, {"ckpt_tensor_xxh3", "forged"}});
  const std::string bytes = Slurp(f.path);
  const uint64_t n = HeaderLength(bytes);
  const std::string text = bytes.substr(8, n);
  // Independently of ckpt/hash.h: libxxhash's XXH3_64bits on the source arrays.
  const std::string expect_list = Hex(XXH3_64bits(f.a.data(), 1200)) + " " +
                                  Hex(XXH3_64bits(nullptr, 0)) + " " +
                                  Hex(XXH3_64bits(f.b.data(), 10));
  auto j = nlohmann::json::parse(text);
  const auto& meta = j["__metadata__"];
  for (const auto& [k, v] : meta.items()) CHECK(v.is_string());  // what other readers require
  CHECK(meta["format"] == "pt");
  CHECK(meta["ckpt_tensor_xxh3"] == expect_list);
  // Header digest: the stored 8 + N bytes with its own 16 digits read as '0'.
  const std::string stored = meta["ckpt_header_xxh3"].get<std::string>();
  const std::string needle = "\"ckpt_header_xxh3\":\"" + stored + "\"";
  const size_t at = bytes.find(needle);
  REQUIRE(at != std::string::npos);
  CHECK(bytes.find(needle, at + 1) == std::string::npos);
  std::string zeroed = bytes.substr(0, 8 + n);
  zeroed.replace(at + needle.size() - 17, 16, std::string(16, '0'));
  CHECK(stored == Hex(XXH3_64bits(zeroed.data(), zeroed.size())));
  // The reader exposes and verifies them.
  auto h = ReadSafetensorsHeader(f.path);
  REQUIRE(h.ok());
  CHECK(h->checksummed);
  REQUIRE(h->tensors.size() == 3);
  CHECK(h->Find("layer.weight")->xxh3 == XXH3_64bits(f.a.data(), 1200));
  CHECK(h->Find("layer.bias")->xxh3 == XXH3_64bits(f.b.data(), 10));
  auto bad = VerifySafetensorsData(f.path, *h);
  REQUIRE(bad.ok());
  CHECK(bad->empty());
  // BuildSafetensorsHeader predicts the stored header's length exactly (estimate relies on it).
  auto built = BuildSafetensorsHeader({{"layer.weight", DType::kF32, {30, 10}},
                                       {"empty", DType::kF32, {0, 4}},
                                       {"layer.bias", DType::kBF16, {5}}},
                                      {{"format", "pt"}});
  REQUIRE(built.ok());
  CHECK(built->size() == n);
}

TEST_CASE("AppendTensors runs on across tensors: the same file as Append, each digest its own",
          "[unit][io]") {
  testing::ScratchDir dir("st_span");
  // The same three tensors (one empty) as WriteSmall, its bytes in one buffer.
  const SmallFile want = WriteSmall(dir.str(), {});
  std::string bytes(reinterpret_cast<const char*>(want.a.data()), want.a.size() * 4);
  bytes.append(reinterpret_cast<const char*>(want.b.data()), want.b.size() * 2);
  const std::vector<SafetensorsTensorSpec> specs = {{"layer.weight", DType::kF32, {30, 10}},
                                                    {"empty", DType::kF32, {0, 4}},
                                                    {"layer.bias", DType::kBF16, {5}}};
  const std::string path = dir / "span.safetensors";
  {
    auto w = SafetensorsWriter::Create(path, specs, {});
    REQUIRE(w.ok());
    // Part of the first tensor, then the rest of it, the empty one and the last in one call.
    REQUIRE(w->Append(bytes.data(), 400).ok());
    // More than the file holds is refused, naming the last tensor.
    Status over = w->AppendTensors(bytes.data() + 400, bytes.size() - 400 + 1);
    CHECK(over.code() == StatusCode::kInvalidArgument);
    CHECK(over.message().find("'layer.bias'") != std::string::npos);
    // Append alone may not run into the next tensor.
    CHECK(w->Append(bytes.data() + 400, bytes.size() - 400).code() == StatusCode::kInvalidArgument);
    REQUIRE(w->AppendTensors(bytes.data() + 400, bytes.size() - 400).ok());
    CHECK(!w->current().has_value());
    REQUIRE(w->Finish().ok());
  }
  // Byte for byte the file the per-tensor Appends wrote: the same data and the same digests.
  CHECK(testing::Slurp(path) == testing::Slurp(want.path));
  auto h = ReadSafetensorsHeader(path);
  REQUIRE(h.ok());
  CHECK(h->checksummed);
  auto bad = VerifySafetensorsData(path, *h);
  REQUIRE(bad.ok());
  CHECK(bad->empty());
}

TEST_CASE("a plain safetensors reader (Python + torch) loads a checksummed file", "[io]") {
  testing::ScratchDir dir("st-torch");
  SmallFile f = WriteSmall(dir.str(), {{"format", "pt"}});
  const std::string script = dir / "load.py";
  Spit(script, R"(import json, struct, sys, torch
data = open(sys.argv[1], "rb").read()
(n,) = struct.unpack("<Q", data[:8])
header = json.loads(data[8:8 + n])
meta = header.pop("__metadata__")
assert all(isinstance(v, str) for v in meta.values()), meta
dt = {"F32": torch.float32, "BF16": torch.bfloat16}
out = {}
for name, v in header.items():
    b, e = v["data_offsets"]
    t = torch.frombuffer(bytearray(data[8 + n + b:8 + n + e]), dtype=dt[v["dtype"]]) if e > b \
        else torch.empty(0, dtype=dt[v["dtype"]])
    out[name] = t.reshape(v["shape"])
w = out["layer.weight"]
assert w.shape == (30, 10) and out["empty"].shape == (0, 4) and out["layer.bias"].shape == (5,)
assert torch.equal(w.flatten(), torch.arange(300, dtype=torch.float32) * 0.25 - 7.0)
print("ok", len(meta["ckpt_tensor_xxh3"].split()), len(header))
)");
  const std::string out = dir / "out.txt";
  REQUIRE(testing::RunShell("/usr/bin/python3 " + script + " " + f.path + " >" + out + " 2>&1") == 0);
  CHECK(Slurp(out) == "ok 3 3\n");
}

// Every bit of the length and the header; one bit of every data byte (bit i % 8), to keep the
// case count (and the ASan run) small.
TEST_CASE("every single-bit flip of a checksummed file is caught", "[unit][io]") {
  testing::ScratchDir dir("st-flip");
  SmallFile f = WriteSmall(dir.str(), {{"format", "pt"}, {"ckpt_tag", "global_step100"}});
  const std::string good = Slurp(f.path);
  const std::string p = dir / "flipped.safetensors";
  const uint64_t data_start = 8 + HeaderLength(good);
  int header_refused = 0, data_caught = 0;
  for (size_t i = 0; i < good.size(); ++i) {
    for (int bit = 0; bit < 8; ++bit) {
      if (i >= data_start && bit != static_cast<int>(i % 8)) continue;
      std::string bad = good;
      bad[i] = static_cast<char>(bad[i] ^ (1 << bit));
      Spit(p, bad);
      INFO("flip bit " << bit << " of byte " << i);
      auto h = ReadSafetensorsHeader(p);
      if (!h.ok()) {
        CHECK(h.status().code() == StatusCode::kDataLoss);
        CHECK(h.status().message().find(p) != std::string::npos);
        ++header_refused;
        continue;
      }
      // The header survived only if the flip is in the data section.
      REQUIRE(i >= h->data_start);
      auto mism = VerifySafetensorsData(p, *h);
      REQUIRE(mism.ok());
      REQUIRE(mism->size() == 1);
      const std::string name = (*mism)[0].tensor;
      auto t = ReadSafetensorsTensor(p, *h, name);
      CHECK(t.status().code() == StatusCode::kDataLoss);
      CHECK(t.status().message().find(name) != std::string::npos);
      CHECK(t.status().message().find(p) != std::string::npos);
      ++data_caught;
    }
  }
  CHECK(header_refused == static_cast<int>(8 * data_start));
  CHECK(data_caught == static_cast<int>(good.size() - data_start));
}

TEST_CASE("header edits that keep the JSON valid are refused; files without the record load",
          "[unit][io]") {
  testing::ScratchDir dir("st-edit");
  SmallFile f = WriteSmall(dir.str(), {{"format", "pt"}});
  const std::string good = Slurp(f.path);
  const std::string p = dir / "edited.safetensors";
  auto edited = [&](const std::string& from, const std::string& to) {
    REQUIRE(from.size() == to.size());
    std::string b = good;
    const size_t at = b.find(from);
    REQUIRE(at != std::string::npos);
    b.replace(at, from.size(), to);
    Spit(p, b);
    return ReadSafetensorsHeader(p);
  };
  for (const auto& [from, to, why] : std::vector<std::tuple<std::string, std::string, std::string>>{
           {"layer.weight", "layer.weigjt", "header checksum mismatch"},  // renamed tensor
           {"[30,10]", "[10,30]", "header checksum mismatch"},          // reshaped
           {"\"pt\"", "\"tf\"", "header checksum mismatch"},            // metadata value
           {"ckpt_header_xxh3", "ckpt_headex_xxh3", "integrity record incomplete"},
           {"ckpt_tensor_xxh3", "ckpt_tensox_xxh3", "integrity record incomplete"}}) {
    auto h = edited(from, to);
    INFO(from << " -> " << to);
    REQUIRE(!h.ok());
    CHECK(h.status().code() == StatusCode::kDataLoss);
    CHECK(h.status().message().find(why) != std::string::npos);
  }
  // A tensor digest edited to another valid digest: the header digest covers the list.
  auto h0 = ReadSafetensorsHeader(f.path);
  REQUIRE(h0.ok());
  const std::string d0 = Hex(*h0->Find("layer.weight")->xxh3);
  auto h1 = edited(d0, Hex(*h0->Find("layer.weight")->xxh3 ^ 1));
  CHECK(h1.status().code() == StatusCode::kDataLoss);

  // A file from another tool (no record) loads unverified.
  const std::string foreign = dir / "foreign.safetensors";
  Spit(foreign, RawFile(R"({"__metadata__":{"format":"pt"},"a":{"dtype":"F32","shape":[2],)"
                        R"("data_offsets":[0,8]}})",
                        std::string(8, '\1')));
  auto hf = ReadSafetensorsHeader(foreign);
  REQUIRE(hf.ok());
  CHECK(!hf->checksummed);
  CHECK(!hf->Find("a")->xxh3.has_value());
  CHECK(ReadSafetensorsTensorF32(foreign, *hf, "a").ok());
  auto none = VerifySafetensorsData(foreign, *hf);
  REQUIRE(none.ok());
  CHECK(none->empty());
}

TEST_CASE("writer rejects bad tensor lists", "[unit]") {
  CHECK(BuildSafetensorsHeader({{"a", DType::kF32, {1}}, {"a", DType::kF32, {1}}}, {})
            .status()
            .code() == StatusCode::kInvalidArgument);
  CHECK(BuildSafetensorsHeader({{"__metadata__", DType::kF32, {1}}}, {}).status().code() ==
        StatusCode::kInvalidArgument);
  CHECK(BuildSafetensorsHeader({{"a", DType::kF32, {-1}}}, {}).status().code() ==
        StatusCode::kInvalidArgument);
  // A name the reader would refuse (a control character) is not written.
  const auto escape = BuildSafetensorsHeader({{"a\x1b[31m", DType::kF32, {1}}}, {});
  CHECK(escape.status().code() == StatusCode::kInvalidArgument);
  CHECK(escape.status().message().find('\x1b') == std::string::npos);
  CHECK(BuildSafetensorsHeader({{"a", DType::kF32, {1ll << 40, 1ll << 40}}}, {}).status().code() ==
        StatusCode::kInvalidArgument);
  auto h = BuildSafetensorsHeader({{"a", DType::kF32, {3}}}, {});
  REQUIRE(h.ok());
  CHECK(h->size() % 8 == 0);
}

TEST_CASE("reader rejects malformed files with DataLoss naming the file", "[unit][io]") {
  testing::ScratchDir dir("st");
  const std::string p = dir / "bad.safetensors";
  auto expect_dataloss = [&](const std::string& bytes, const std::string& what) {
    Spit(p, bytes);
    auto h = ReadSafetensorsHeader(p);
    INFO(what);
    REQUIRE(!h.ok());
    CHECK(h.status().code() == StatusCode::kDataLoss);
    CHECK(h.status().message().find(p) != std::string::npos);
  };
  const std::string ok_hdr = R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  Spit(p, RawFile(ok_hdr, std::string(8, '\0')));
  REQUIRE(ReadSafetensorsHeader(p).ok());

  expect_dataloss("abc", "too short");
  expect_dataloss(RawFile(ok_hdr, std::string(4, '\0')), "truncated data");
  expect_dataloss(RawFile(ok_hdr, std::string(12, '\0')), "trailing data");
  std::string huge(8, '\0');
  huge[4] = 1;  // 2^32 bytes of header
  expect_dataloss(huge + "{}", "header length cap");
  expect_dataloss(RawFile("{not json", ""), "bad json");
  expect_dataloss(
      RawFile(R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", std::string(8, '\0')),
      "dtype x shape mismatch");
  expect_dataloss(
      RawFile(R"({"a":{"dtype":"Q7","shape":[2],"data_offsets":[0,8]}})", std::string(8, '\0')),
      "unknown dtype");
  expect_dataloss(RawFile(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                          R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
                          std::string(12, '\0')),
                  "overlap");
  expect_dataloss(RawFile(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                          R"("b":{"dtype":"F32","shape":[1],"data_offsets":[12,16]}})",
                          std::string(16, '\0')),
                  "gap");
  expect_dataloss(
      RawFile(R"({"a":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", std::string(8, '\0')),
      "negative dim");
  expect_dataloss(RawFile(R"({"__metadata__":{"k":3}})", ""), "metadata not string");
  // A name holding a terminal escape (JSON carries any control character) or a C1 CSI is
  // refused, and the message shows it escaped, never raw.
  for (const char* name : {"a\\u001b[31mred", "a\\u009b31m", "a\\u0007"}) {
    const std::string hdr =
        std::string(R"({")") + name + R"(":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
    expect_dataloss(RawFile(hdr, std::string(8, '\0')), name);
    const std::string message = ReadSafetensorsHeader(p).status().message();
    CHECK_THAT(message, Catch::Contains("not printable"));
    for (char c : message) CHECK((static_cast<unsigned char>(c) >= 0x20 && c != 0x7f));
  }
  CHECK(ReadSafetensorsHeader(dir / "missing.safetensors").status().code() ==
        StatusCode::kNotFound);
}
