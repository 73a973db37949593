// Compressed datasets read outside HDF5 (issue 19 item 5): chunk frames are read through the
// Env, consecutive frames in one request on a reading thread of their own, and decompressed on
// threads; the bytes equal what was saved and what HDF5's own filter pipeline returns, for
// every dtype and odd chunk tails; a damaged frame is DataLoss and a failed read IOError, both
// naming the file, the dataset and the chunk.
#include <hdf5.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <functional>
#include <memory>
#include <mutex>
#include <random>
#include <thread>
#include <utility>

#include "ckpt/env.h"
#include "ckpt/h5.h"
#include "ckpt/reader.h"
#include "ckpt/root.h"
#include "ckpt/writer.h"
#include "ckpt_test_helpers.h"
#include "test_util.h"

using namespace ckpt;
using ckpt::testing::CountingFile;
using ckpt::testing::SaveWithThreads;
using ckpt::testing::ScratchDir;
using ckpt::testing::SmallModel;
using ckpt::testing::WrappedFileEnv;
using ckpt::testing::XorByteAt;

namespace {

// Counts the bytes read through the files the library opens for checkpoint data.
class CountingEnv final : public WrappedFileEnv {
 public:
  CountingEnv()
      : WrappedFileEnv([this](std::unique_ptr<RandomAccessFile> f, const std::string&) {
          return std::make_unique<CountingFile>(std::move(f), &bytes_read);
        }) {}
  std::atomic<uint64_t> bytes_read{0};
};

struct Chunk {
  uint64_t addr = 0, size = 0;
};

// Chunk c's frame (rows_per_chunk rows per chunk) and the dataset read through HDF5's filters.
Chunk ChunkAt(const std::string& file, const std::string& name, hsize_t row) {
  hid_t f = H5Fopen(file.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  REQUIRE(f >= 0);
  hid_t d = H5Dopen2(f, name.c_str(), H5P_DEFAULT);
  REQUIRE(d >= 0);
  hsize_t offset[8] = {row};
  unsigned mask = 0;
  haddr_t addr = HADDR_UNDEF;
  hsize_t size = 0;
  REQUIRE(H5Dget_chunk_info_by_coord(d, offset, &mask, &addr, &size) >= 0);
  H5Dclose(d);
  H5Fclose(f);
  REQUIRE(addr != HADDR_UNDEF);
  return {static_cast<uint64_t>(addr), static_cast<uint64_t>(size)};
}

std::vector<uint8_t> ReadThroughHdf5(const std::string& file, const std::string& name,
                                     size_t bytes) {
  hid_t f = H5Fopen(file.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  REQUIRE(f >= 0);
  hid_t d = H5Dopen2(f, name.c_str(), H5P_DEFAULT);
  REQUIRE(d >= 0);
  hid_t type = H5Dget_type(d);
  std::vector<uint8_t> out(bytes);
  const herr_t rc = H5Dread(d, type, H5S_ALL, H5S_ALL, H5P_DEFAULT, out.data());
  H5Tclose(type);
  H5Dclose(d);
  H5Fclose(f);
  REQUIRE(rc >= 0);
  return out;
}

std::string SaveOne(const std::string& root, const std::string& compression,
                    const std::vector<DatasetSpec>& specs, uint64_t chunk_bytes,
                    uint64_t piece_bytes = 200) {
  Manifest m;
  m.tag = "z";
  m.topology.dp_world_size = 1;
  m.partition = BuildPartition(m.params, 1, 0).value();
  RankContents c;
  c.datasets = specs;
  for (auto s : {"master", "exp_avg", "exp_avg_sq"})
    c.datasets.push_back(DatasetSpec::Tensor(s, DType::kF32, {0}, nullptr));
  SaveOptions opts;
  opts.compression = Compression::Parse(compression).value();
  opts.chunk_bytes = chunk_bytes;
  opts.compress_threads = 3;
  opts.piece_bytes = piece_bytes;
  SingleCollective one;
  REQUIRE(SaveCheckpoint(root, m, c, one, opts).ok());
  return root + "/z";
}

}  // namespace

TEST_CASE("compressed datasets decompressed on threads equal the saved bytes and HDF5's", "[io]") {
  const std::string comp = GENERATE(as<std::string>{}, "zstd:1", "zstd:3+shuffle");
  INFO(comp);
  ScratchDir dir;
  std::mt19937 rng(7);
  std::vector<float> f32(10007);
  for (size_t i = 0; i < f32.size(); ++i)
    f32[i] = std::sin(static_cast<float>(i) * 0.01f) * static_cast<float>(rng() % 100);
  std::vector<double> f64(1999);
  for (size_t i = 0; i < f64.size(); ++i) f64[i] = 1.0 / (static_cast<double>(i) + 0.5);
  std::vector<uint16_t> u16(4001);
  for (auto& v : u16) v = static_cast<uint16_t>(rng() % 512 + 16000);
  std::vector<int64_t> i64(777);
  for (size_t i = 0; i < i64.size(); ++i) i64[i] = static_cast<int64_t>(i) * -123456789012ll;
  std::vector<uint8_t> u8(3001);
  for (auto& v : u8) v = static_cast<uint8_t>(rng() % 7);
  const std::vector<DatasetSpec> specs = {
      DatasetSpec::Tensor("t/f32", DType::kF32, {10007}, f32.data()),
      DatasetSpec::Tensor("t/f32_2d", DType::kF32, {1429, 7}, f32.data()),
      DatasetSpec::Tensor("t/f64", DType::kF64, {1999}, f64.data()),
      DatasetSpec::Tensor("t/bf16", DType::kBF16, {4001}, u16.data()),
      DatasetSpec::Tensor("t/fp16_3d", DType::kF16, {31, 11, 11}, u16.data()),
      DatasetSpec::Tensor("t/i64", DType::kI64, {777}, i64.data()),
      DatasetSpec::Tensor("t/u8", DType::kU8, {3001}, u8.data()),
  };
  // 1000-byte chunks: several per dataset, a partial last chunk in each.
  const std::string tag = SaveOne(dir.str(), comp, specs, 1000);
  CountingEnv env;
  OpenOptions oo;
  oo.env = &env;
  auto r = CheckpointReader::Open(tag, "", oo);
  REQUIRE(r.ok());
  REQUIRE(r->ReadDatasetBytes(0, "master").ok());  // opens the file: its seal check reads it
  uint64_t frames = 0;
  for (const auto& spec : specs) {
    INFO(spec.name);
    const DatasetRecord* rec = r->manifest().FindDataset(0, spec.name);
    REQUIRE(rec);
    const uint64_t before = env.bytes_read;
    auto got = r->ReadDatasetBytes(0, spec.name);
    REQUIRE(got.ok());
    REQUIRE(got->size() == rec->bytes);
    CHECK(std::memcmp(got->data(), spec.data, rec->bytes) == 0);
    CHECK(*got == ReadThroughHdf5(tag + "/rank_00000.h5", spec.name, rec->bytes));
    // Reached the target: the compressed frames were read through the Env, not by HDF5.
    const uint64_t read = env.bytes_read - before;
    CHECK(read > 0);
    CHECK(read < rec->bytes);  // compressed bytes, not logical ones
    frames += read;
    CHECK(r->VerifyDataset(0, spec.name).ok());
    if (rec->shape.size() != 1) continue;
    // Slices: inside one chunk, across chunk edges, unaligned to elements per chunk, the whole.
    const int64_t n = rec->shape[0];
    const size_t elem = DTypeSize(rec->dtype);
    std::vector<uint8_t> verified(rec->bytes);
    REQUIRE(r->ReadSlice(0, spec.name, 1, n - 1, verified.data()).ok());  // by its pieces
    CHECK(std::memcmp(verified.data(), static_cast<const uint8_t*>(spec.data) + elem,
                      rec->bytes - elem) == 0);
    std::vector<std::pair<int64_t, int64_t>> slices = {{0, n}, {n - 1, 1}, {0, 1}};
    for (int k = 0; k < 40; ++k) {
      const int64_t off = static_cast<int64_t>(rng() % static_cast<uint64_t>(n));
      slices.emplace_back(off, static_cast<int64_t>(rng() % static_cast<uint64_t>(n - off + 1)));
    }
    for (auto [off, cnt] : slices) {
      std::vector<uint8_t> part(static_cast<size_t>(cnt) * elem + 1, 0xee);
      REQUIRE(r->ReadSliceUnverified(0, spec.name, off, cnt, part.data()).ok());
      CHECK(std::memcmp(part.data(), static_cast<const uint8_t*>(spec.data) + off * elem,
                        static_cast<size_t>(cnt) * elem) == 0);
      CHECK(part.back() == 0xee);  // nothing written past the slice
    }
  }
  CHECK(frames > 0);
  auto probs = CheckCheckpoint(r->dir(), true);
  REQUIRE(probs.ok());
  CHECK(probs->empty());
}

TEST_CASE("a damaged compressed chunk is DataLoss naming the file, the dataset and the chunk",
          "[io]") {
  ScratchDir dir;
  std::vector<float> f32(4096);
  for (size_t i = 0; i < f32.size(); ++i) f32[i] = std::cos(static_cast<float>(i));
  const std::string tag =
      SaveOne(dir.str(), "zstd:1+shuffle",
              {DatasetSpec::Tensor("w", DType::kF32, {4096}, f32.data())}, 4096);
  const std::string file = tag + "/rank_00000.h5";
  // Chunk 2 (rows 2048..3071): its frame's magic number, then a byte in the middle of it.
  const Chunk chunk = ChunkAt(file, "w", 2048);
  REQUIRE(chunk.size > 16);
  for (uint64_t at : {chunk.addr + 1, chunk.addr + chunk.size / 2}) {
    INFO("flip at byte " << at << " of the frame at " << chunk.addr);
    ScratchDir work;
    std::filesystem::copy(dir.str(), work.str(), std::filesystem::copy_options::recursive);
    const std::string wtag = work.str() + "/z";
    REQUIRE(XorByteAt(wtag + "/rank_00000.h5", at, 0x5a));
    const bool magic = at == chunk.addr + 1;
    for (bool verify : {true, false}) {
      OpenOptions oo;
      oo.verify_checksums = verify;
      auto r = CheckpointReader::Open(wtag, "", oo);
      REQUIRE(r.ok());
      std::vector<float> out(4096);
      const Status whole = r->ReadDataset(0, "w", out.data(), out.size() * 4);
      const Status part = r->ReadSliceUnverified(0, "w", 2100, 10, out.data());
      const Status checked = r->VerifyDataset(0, "w");
      // A bad magic number fails every read of the chunk; a byte inside the frame fails the
      // decompression or the checksums (an unverified read may return the damaged bytes when
      // zstd accepts the frame: no crash is all it promises).
      std::vector<Status> must = {checked};
      if (verify || magic) must.push_back(whole);
      if (magic) must.push_back(part);
      for (const Status& s : must) {
        INFO(s.ToString());
        CHECK(s.code() == StatusCode::kDataLoss);
        CHECK(s.message().find("rank_00000.h5") != std::string::npos);
        CHECK(s.message().find("/w") != std::string::npos);
        if (magic) CHECK(s.message().find("chunk 2 of 4") != std::string::npos);
      }
    }
  }
}

// Records the most HDF5 files open at any read of checkpoint data through the Env.
class Hdf5WatchEnv final : public WrappedFileEnv {
 public:
  Hdf5WatchEnv()
      : WrappedFileEnv([this](std::unique_ptr<RandomAccessFile> f, const std::string&) {
          return std::make_unique<File>(std::move(f), this);
        }) {}
  std::atomic<int64_t> reads{0}, most_open{0};

 private:
  class File final : public RandomAccessFile {
   public:
    File(std::unique_ptr<RandomAccessFile> f, Hdf5WatchEnv* env) : f_(std::move(f)), env_(env) {}
    Status Read(uint64_t offset, size_t n, void* out) const override {
      const int64_t open = static_cast<int64_t>(H5Fget_obj_count(H5F_OBJ_ALL, H5F_OBJ_FILE));
      ++env_->reads;
      for (int64_t m = env_->most_open.load(); open > m;)
        if (env_->most_open.compare_exchange_weak(m, open)) break;
      return f_->Read(offset, n, out);
    }
    uint64_t size() const override { return f_->size(); }

   private:
    std::unique_ptr<RandomAccessFile> f_;
    Hdf5WatchEnv* env_;
  };
};

TEST_CASE("check --deep reads an uncompressed file's bytes with its HDF5 state freed", "[io]") {
  // CheckCheckpoint opens each rank file, places its datasets and closes its HDF5 handles
  // before the pass, so the next open reuses libhdf5's metadata cache (issue 19); a zstd
  // file's chunks are verified through HDF5's placement and keep it open.
  const std::string comp = GENERATE(as<std::string>{}, "none", "zstd:1");
  INFO(comp);
  ScratchDir dir;
  std::vector<float> f32(100003);
  for (size_t i = 0; i < f32.size(); ++i) f32[i] = static_cast<float>(i) * 0.25f - 7.0f;
  std::vector<float> empty;
  const std::vector<DatasetSpec> specs = {
      DatasetSpec::Tensor("t/f32", DType::kF32, {100003}, f32.data()),
      DatasetSpec::Tensor("t/f32_2d", DType::kF32, {3, 11}, f32.data()),
      DatasetSpec::Tensor("t/none", DType::kF32, {0, 5}, empty.data())};
  const std::string tag = SaveOne(dir.str(), comp, specs, 4096);
  REQUIRE(H5Fget_obj_count(H5F_OBJ_ALL, H5F_OBJ_FILE) == 0);
  Hdf5WatchEnv env;
  auto problems = CheckCheckpoint(tag, /*deep=*/true, &env);
  REQUIRE(problems.ok());
  CHECK(problems->empty());
  CHECK(env.reads > 0);  // the pass went through the Env
  CHECK(env.most_open == (comp == "none" ? 0 : 1));
  CHECK(H5Fget_obj_count(H5F_OBJ_ALL, H5F_OBJ_FILE) == 0);
  // A damaged byte in the data is still found with the handles closed.
  auto r = CheckpointReader::Open(tag);
  REQUIRE(r.ok());
  const FileRecord& rec = r->manifest().files.at(0);
  REQUIRE(!rec.data_extents.empty());
  REQUIRE(XorByteAt(tag + "/" + rec.path, rec.data_extents[0].first + 100, 0x5a));
  problems = CheckCheckpoint(tag, /*deep=*/true);
  REQUIRE(problems.ok());
  CHECK_FALSE(problems->empty());
}

TEST_CASE("the seal taken while saving is the seal of the closed file", "[io]") {
  // WriteRankFile takes a file's data extents during its structure phase, with the file still
  // open, and its metadata digest through the open file after the data (no second H5Fopen);
  // SealFile walks the closed file afresh. docs/format.md, "Metadata seal".
  const std::string comp = GENERATE(as<std::string>{}, "none", "zstd:3", "zstd:1+shuffle");
  INFO(comp);
  ScratchDir dir;
  SaveOptions o;
  o.compression = Compression::Parse(comp).value();
  o.chunk_bytes = 64;  // many chunks and partial edge chunks
  REQUIRE(SaveWithThreads(dir.str(), SmallModel("global_step12", 2, 3), o).ok());
  auto r = CheckpointReader::Open(dir.str());
  REQUIRE(r.ok());
  REQUIRE(r->manifest().files.size() == 2);
  for (const FileRecord& f : r->manifest().files) {
    INFO(f.path);
    h5::Extents extents;
    std::string xxh3;
    REQUIRE(h5::SealFile(Env::Default(), r->dir() + "/" + f.path, f.bytes, &extents, &xxh3).ok());
    CHECK(!extents.empty());  // adjacent regions are merged: few extents
    CHECK(f.data_extents == extents);
    CHECK(f.metadata_xxh3 == xxh3);
  }
  auto problems = CheckCheckpoint(r->dir(), /*deep=*/true);
  REQUIRE(problems.ok());
  CHECK(problems->empty());
}

// Records the large reads of checkpoint data (offset, bytes, thread) and fails those whose
// range holds byte `fail_at` with IOError.
class SpanWatchEnv final : public WrappedFileEnv {
 public:
  struct Call {
    uint64_t offset = 0, n = 0;
    std::thread::id thread;
  };
  SpanWatchEnv()
      : WrappedFileEnv([this](std::unique_ptr<RandomAccessFile> f, const std::string&) {
          return std::make_unique<File>(std::move(f), this);
        }) {}
  std::atomic<uint64_t> fail_at{UINT64_MAX};
  std::vector<Call> Take() {
    std::lock_guard<std::mutex> lock(mu_);
    return std::exchange(calls_, {});
  }

 private:
  class File final : public RandomAccessFile {
   public:
    File(std::unique_ptr<RandomAccessFile> f, SpanWatchEnv* env) : f_(std::move(f)), env_(env) {}
    Status Read(uint64_t offset, size_t n, void* out) const override {
      return f_->Read(offset, n, out);
    }
    uint64_t size() const override { return f_->size(); }
    Status ReadLarge(uint64_t offset, uint64_t n, void* out,
                     const PartFn& on_filled) const override {
      {
        std::lock_guard<std::mutex> lock(env_->mu_);
        env_->calls_.push_back({offset, n, std::this_thread::get_id()});
      }
      const uint64_t bad = env_->fail_at;
      if (bad >= offset && bad < offset + n) return IOError("injected read failure");
      return f_->ReadLarge(offset, n, out, on_filled);
    }

   private:
    std::unique_ptr<RandomAccessFile> f_;
    SpanWatchEnv* env_;
  };
  std::mutex mu_;
  std::vector<Call> calls_;
};

TEST_CASE("a compressed dataset's frames are read ahead in spans; unshuffled a block at a time",
          "[io]") {
  // 1 MiB chunks: 17 of fp32 (the last partial), 3 of fp64, 2 of bf16; the frames of a
  // dataset lie one after another, so the reading thread takes several in one request, and
  // the shuffled chunks are put back together 16 KiB at a time.
  const std::string comp = GENERATE(as<std::string>{}, "zstd:1+shuffle", "zstd:1");
  INFO(comp);
  ScratchDir dir;
  std::mt19937 rng(11);
  std::vector<float> f32((4u << 20) + 1001);
  for (size_t i = 0; i < f32.size(); ++i)
    f32[i] = std::sin(static_cast<float>(i) * 1e-3f) * static_cast<float>(rng() % 1000);
  std::vector<double> f64(300007);
  for (size_t i = 0; i < f64.size(); ++i) f64[i] = static_cast<double>(rng()) * 1e-7;
  std::vector<uint16_t> bf16(600011);
  for (auto& v : bf16) v = static_cast<uint16_t>(0x3f00 + rng() % 512);
  const std::vector<DatasetSpec> specs = {
      DatasetSpec::Tensor("w/f32", DType::kF32, {static_cast<int64_t>(f32.size())}, f32.data()),
      DatasetSpec::Tensor("w/f64", DType::kF64, {static_cast<int64_t>(f64.size())}, f64.data()),
      DatasetSpec::Tensor("w/bf16", DType::kBF16, {static_cast<int64_t>(bf16.size())},
                          bf16.data())};
  const std::string tag = SaveOne(dir.str(), comp, specs, 1u << 20, 1u << 20);
  const std::string file = tag + "/rank_00000.h5";
  SpanWatchEnv env;
  OpenOptions oo;
  oo.env = &env;
  auto r = CheckpointReader::Open(tag, "", oo);
  REQUIRE(r.ok());
  REQUIRE(r->ReadDatasetBytes(0, "master").ok());  // opens the file (its seal check reads it)
  const std::thread::id caller = std::this_thread::get_id();
  for (const auto& spec : specs) {
    INFO(spec.name);
    const DatasetRecord* rec = r->manifest().FindDataset(0, spec.name);
    REQUIRE(rec);
    const size_t elem = DTypeSize(rec->dtype);
    const int64_t rows = rec->shape[0], per = static_cast<int64_t>((1u << 20) / elem);
    const int64_t chunks = (rows + per - 1) / per;
    std::vector<Chunk> frames;
    for (int64_t c = 0; c < chunks; ++c)
      frames.push_back(ChunkAt(file, spec.name, static_cast<hsize_t>(c * per)));
    env.Take();
    std::vector<uint8_t> got(rec->bytes);
    REQUIRE(r->ReadDataset(0, spec.name, got.data(), got.size()).ok());
    CHECK(std::memcmp(got.data(), spec.data, rec->bytes) == 0);
    const std::vector<SpanWatchEnv::Call> calls = env.Take();
    // Reached the target: every frame came in exactly one request of the reading thread, and
    // consecutive frames shared one.
    if (chunks > 2) CHECK(calls.size() < static_cast<size_t>(chunks));
    CHECK(calls.size() <= static_cast<size_t>(chunks));
    for (const auto& call : calls) CHECK(call.thread != caller);
    for (const Chunk& f : frames) {
      int holders = 0;
      for (const auto& call : calls)
        holders += f.addr >= call.offset && f.addr + f.size <= call.offset + call.n;
      CHECK(holders == 1);
    }
    // A request of several frames is one O_DIRECT request of at most 8 MiB.
    for (const auto& call : calls) {
      int held = 0;
      for (const Chunk& f : frames)
        held += f.addr >= call.offset && f.addr + f.size <= call.offset + call.n;
      if (held > 1) CHECK(call.n <= (8u << 20));
    }
    CHECK(r->VerifyDataset(0, spec.name).ok());
    // Slices across chunk edges and inside one chunk, through the same pipeline.
    for (auto [off, cnt] : std::vector<std::pair<int64_t, int64_t>>{
             {per - 3, per + 7}, {1, rows - 2}, {rows - per / 2, per / 2}, {per + 5, 100}}) {
      if (off < 0 || off + cnt > rows) continue;
      std::vector<uint8_t> part(static_cast<size_t>(cnt) * elem + 1, 0xee);
      REQUIRE(r->ReadSliceUnverified(0, spec.name, off, cnt, part.data()).ok());
      CHECK(std::memcmp(part.data(), static_cast<const uint8_t*>(spec.data) + off * elem,
                        static_cast<size_t>(cnt) * elem) == 0);
      CHECK(part.back() == 0xee);
    }
    if (spec.name != "w/f32") continue;
    // A failed read of chunk 5's frame: IOError naming the file, the dataset and a chunk, from
    // a whole read, a verification and a slice over several chunks; then all is well again.
    env.fail_at = frames[5].addr + frames[5].size / 2;
    std::vector<Status> failed = {
        r->ReadDataset(0, spec.name, got.data(), got.size()), r->VerifyDataset(0, spec.name),
        r->ReadSliceUnverified(0, spec.name, 3 * per + 1, 4 * per, got.data())};
    for (const Status& s : failed) {
      INFO(s.ToString());
      CHECK(s.code() == StatusCode::kIOError);
      CHECK(s.message().find("injected read failure") != std::string::npos);
      CHECK(s.message().find("rank_00000.h5") != std::string::npos);
      CHECK(s.message().find("/w/f32: chunk ") != std::string::npos);
    }
    env.fail_at = UINT64_MAX;
    CHECK(r->VerifyDataset(0, spec.name).ok());
  }
}
