// safetensors writer/reader: format details, round trips and malformed files.
#include <catch2/catch.hpp>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "convert/safetensors.h"
#include "test_util.h"

using namespace ckpt;
using namespace ckpt::convert;

namespace {

std::string Slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

void Spit(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

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

TEST_CASE("writer rejects bad tensor lists", "[unit]") {
  CHECK(BuildSafetensorsHeader({{"a", DType::kF32, {1}}, {"a", DType::kF32, {1}}}, {})
            .status()
            .code() == StatusCode::kInvalidArgument);
  CHECK(BuildSafetensorsHeader({{"__metadata__", DType::kF32, {1}}}, {}).status().code() ==
        StatusCode::kInvalidArgument);
  CHECK(BuildSafetensorsHeader({{"a", DType::kF32, {-1}}}, {}).status().code() ==
        StatusCode::kInvalidArgument);
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
  CHECK(ReadSafetensorsHeader(dir / "missing.safetensors").status().code() ==
        StatusCode::kNotFound);
}
