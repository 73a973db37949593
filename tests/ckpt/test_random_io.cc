// Random rank files against a model: checkpoints of random datasets (dtypes, shapes from empty
// to several chunks, pieces and fill windows; random bytes or compressible ones), saved with
// random options (compression, chunk, piece and window sizes, direct writes auto or off; reads
// auto or on) from random sources (the heap at any byte, I/O memory, fill callbacks with and
// without a place), must read back through every read path (whole datasets, verified and unverified
// slices, into the heap at any byte or into memory at the data's place) exactly as the model holds
// them, without a byte written outside the caller's buffer; `check --deep` finds nothing, and h5py,
// reading the files from docs/format.md, sees the model's bytes. The test asserts the paths it
// reached.
#include <algorithm>
#include <atomic>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "ckpt/aligned_buffer.h"
#include "ckpt/env.h"
#include "ckpt/reader.h"
#include "ckpt/save_ranks.h"
#include "ckpt_test_helpers.h"
#include "test_util.h"

using namespace ckpt;
using namespace ckpt::testing;

namespace {

constexpr DType kDTypes[] = {DType::kF32, DType::kF64, DType::kBF16, DType::kF16,
                             DType::kI64, DType::kI32, DType::kU8,   DType::kU16};

// One extra dataset of a rank, with its model bytes and where the save takes them from.
struct ModelDataset {
  enum class Source { kHeap, kIoMemory, kFill, kFillPlaced };
  std::string name;
  std::string kind = "tensor";  // "tensor" | "blob" | "json"
  DType dtype = DType::kU8;
  std::vector<int64_t> shape;
  std::string bytes;  // the model: the dataset's logical bytes
  Source source = Source::kHeap;
  bool anchor = false;        // an anchor round's large tensor, read at its place
  std::vector<uint8_t> heap;  // the heap source: bytes at heap_at
  size_t heap_at = 0;
  AlignedBuffer io;  // the I/O-memory source
};

// Bytes a dataset of `n` elements of `t` might hold: random (incompressible), a few values
// (compressible), or smooth floats (what shuffle helps).
std::string ModelBytes(std::mt19937_64& rng, DType t, int64_t n) {
  const size_t es = DTypeSize(t);
  std::string b(static_cast<size_t>(n) * es, '\0');
  const int pattern = static_cast<int>(rng() % 3);
  if (pattern == 0) {
    for (auto& c : b) c = static_cast<char>(rng());
  } else if (pattern == 1 || t != DType::kF32) {
    const uint64_t salt = rng();
    for (size_t i = 0; i < b.size(); ++i) b[i] = static_cast<char>((salt + i / es * 7) % 5);
  } else {
    const float scale = static_cast<float>(rng() % 1000) * 0.01f + 0.01f;
    for (int64_t i = 0; i < n; ++i) {
      const float v = std::sin(static_cast<float>(i) * 0.001f) * scale;
      std::memcpy(&b[static_cast<size_t>(i) * 4], &v, 4);
    }
  }
  return b;
}

// A random element count: empty, tiny, small, or up to `max_bytes` (several 4 MiB chunks,
// pieces and 8 MiB windows at the top).
int64_t RandomNumel(std::mt19937_64& rng, size_t es, uint64_t max_bytes, bool large) {
  const int bucket = large ? 9 : static_cast<int>(rng() % 10);
  const int64_t cap = static_cast<int64_t>(max_bytes / es);
  int64_t n = 0;
  if (bucket == 0)
    n = 0;
  else if (bucket <= 2)
    n = 1 + static_cast<int64_t>(rng() % 16);
  else if (bucket <= 4)
    n = 17 + static_cast<int64_t>(rng() % 5000);
  else if (bucket <= 7)
    n = 5000 + static_cast<int64_t>(rng() % 400'000);
  else
    n = (2 << 20) / static_cast<int64_t>(es) +
        static_cast<int64_t>(rng() % static_cast<uint64_t>(std::max<int64_t>(cap, 1)));
  return std::min(n, cap);
}

std::vector<int64_t> RandomShape(std::mt19937_64& rng, int64_t n) {
  if (n > 0 && rng() % 4 == 0) {
    for (int64_t cols : {7, 64, 1000, 4096})
      if (n % cols == 0 && n / cols > 0) return {n / cols, cols};
  }
  return {n};
}

// memcmp of n bytes, where n may be 0 and either side then null (an empty vector's data()).
// A bool, so that Catch prints no megabytes of the operands when it fails.
bool SameBytes(const void* a, const void* b, size_t n) {
  return n == 0 || std::memcmp(a, b, n) == 0;
}

// A buffer with guard bytes on both sides: `out` at any byte, or at the place within a 4 KiB
// block that `place` names (in I/O memory), so that both of a read's paths are taken.
struct GuardedOut {
  static constexpr size_t kGuard = 64;
  static constexpr uint8_t kFill = 0xA5;
  AlignedBuffer buf;
  uint8_t* out = nullptr;
  size_t n = 0;
  size_t lead = 0;

  GuardedOut(size_t bytes, size_t at) : buf(bytes + 2 * 4096 + kGuard), n(bytes), lead(at) {
    std::memset(buf.data(), kFill, buf.size());
    out = buf.data() + at;
  }
  // Every byte outside [out, out + n) still holds the fill.
  bool Intact() const {
    for (size_t i = 0; i < lead; ++i)
      if (buf.data()[i] != kFill) return false;
    for (size_t i = lead + n; i < buf.size(); ++i)
      if (buf.data()[i] != kFill) return false;
    return true;
  }
};

// Where `out` starts within its buffer: at the data's place in a 4 KiB block (from 4096, so
// that a guard lies before it), or at any byte.
size_t OutPlace(std::mt19937_64& rng, std::optional<uint64_t> file_offset, bool at_place) {
  if (file_offset && (at_place || rng() % 2 == 0)) return 4096 + *file_offset % 4096;
  return GuardedOut::kGuard + rng() % 4096;
}

struct Reached {
  int rounds = 0, compressed = 0, fill_windows = 0, placed_windows = 0, empty = 0, two_d = 0;
  int io_sources = 0, slices = 0, slices_at_place = 0;
  uint64_t in_place_bytes = 0, direct_write_bytes = 0, direct_read_bytes = 0, into_caller_bytes = 0;
  uint64_t refused = 0;
};

}  // namespace

TEST_CASE("random rank files read back as the model holds them, through every read path", "[io]") {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  // The HDF5 plugin of a sanitizer build does not load into python (the sanitizer's runtime is
  // not its first library); the plain build runs the cross-check.
  const bool have_h5py = false;
#else
  const bool have_h5py = HaveH5pyCrosscheck();
  if (!have_h5py) WARN("h5py cross-check skipped: /usr/bin/python3 lacks h5py, numpy or zstandard");
#endif
  const uint64_t seed = TestSeed();
  INFO("seed " << seed << " (CKPT_TEST_SEED=" << seed << " replays it)");
  std::mt19937_64 rng(seed);
  Reached reached;
  constexpr int kRounds = 10;
  for (int round = 0; round < kRounds; ++round) {
    INFO("round " << round);
    ScratchDir dir;
    // Every fourth round an anchor: uncompressed, read with O_DIRECT even from the page cache
    // (CKPT_DIRECT_IO=on), rank 0's first two datasets large tensors from I/O memory and from
    // a placed fill, read at their place. So that every run reaches the paths below.
    const bool anchor = round % 4 == 0;
    const int world = 1 + static_cast<int>(rng() % 3);
    const Manifest m = SmallModel("global_step1", world, static_cast<int>(rng() % 4));
    SaveOptions o;
    const char* comps[] = {"none", "none", "zstd:1", "zstd:1+shuffle", "zstd:3"};
    const std::string comp = anchor ? "none" : comps[rng() % 5];
    o.compression = Compression::Parse(comp).value();
    const uint64_t chunk_choices[] = {4096, 65536, 1u << 20, 4u << 20, 12345};
    o.chunk_bytes = chunk_choices[rng() % 5];
    // Pieces of 8 bytes to 4 KiB are small enough to cut every chunk and window many times;
    // 777 777 is rounded down to a multiple of 8.
    const uint64_t piece_choices[] = {8 + 8 * (rng() % 512), 4096, 1u << 20, kDefaultPieceBytes,
                                      777'777};
    o.piece_bytes = piece_choices[rng() % 5];
    const uint64_t window_choices[] = {8, 65536, 1u << 20, kFillWindowBytes, 3'000'000};
    o.fill_window_bytes = window_choices[rng() % 5];
    if (o.fill_window_bytes == 8) o.fill_window_bytes = 8 + 8 * (rng() % 100'000);
    o.file_checksum = rng() % 4 != 0;
    o.compress_threads = 1 + static_cast<int>(rng() % 3);
    const char* io_mode = !anchor && rng() % 3 == 0 ? "off" : "auto";
    const char* read_mode = anchor || rng() % 2 == 0 ? "on" : "auto";
    INFO("world " << world << ", " << comp << ", chunk " << o.chunk_bytes << ", piece "
                  << o.piece_bytes << ", window " << o.fill_window_bytes << ", writes " << io_mode
                  << ", reads " << read_mode);
    const bool compressed = o.compression.kind != Compression::Kind::kNone;
    reached.compressed += compressed;

    // Each rank's extra datasets (the model), built before the save.
    std::vector<std::vector<ModelDataset>> model(static_cast<size_t>(world));
    for (int r = 0; r < world; ++r) {
      const int count = 1 + static_cast<int>(rng() % 6) + (anchor && r == 0);
      uint64_t budget = 24u << 20;
      for (int i = 0; i < count; ++i) {
        ModelDataset d;
        d.name = "extra/d" + std::to_string(i);
        d.anchor = anchor && r == 0 && i < 2;
        const int kind = d.anchor ? 9 : static_cast<int>(rng() % 10);
        if (kind == 0) {
          d.kind = "blob";
          d.bytes.resize(rng() % 3000);
          for (auto& c : d.bytes) c = static_cast<char>(rng());
        } else if (kind == 1) {
          d.kind = "json";
          d.bytes = "{\"round\": " + std::to_string(round) + ", \"i\": " + std::to_string(i) +
                    ", \"pad\": \"" + std::string(rng() % 200, 'x') + "\"}";
        } else {
          d.dtype = kDTypes[rng() % std::size(kDTypes)];
          const int64_t n =
              RandomNumel(rng, DTypeSize(d.dtype), std::min<uint64_t>(budget, 12u << 20), d.anchor);
          d.shape = d.anchor ? std::vector<int64_t>{n} : RandomShape(rng, n);
          d.bytes = ModelBytes(rng, d.dtype, n);
          budget -= d.bytes.size();
          reached.empty += n == 0;
          reached.two_d += d.shape.size() == 2;
          d.source = d.anchor ? (i == 0 ? ModelDataset::Source::kIoMemory
                                        : ModelDataset::Source::kFillPlaced)
                              : static_cast<ModelDataset::Source>(rng() % 4);
          if (d.source == ModelDataset::Source::kHeap) {
            d.heap_at = rng() % 64;
            d.heap.assign(d.bytes.size() + d.heap_at, 0);
            std::copy(d.bytes.begin(), d.bytes.end(), d.heap.begin() + d.heap_at);  // may be empty
          } else if (d.source == ModelDataset::Source::kIoMemory) {
            d.io = AlignedBuffer(std::max<size_t>(d.bytes.size(), 1));
            std::memcpy(d.io.data(), d.bytes.data(), d.bytes.size());
            reached.io_sources += IsIoMemory(d.io.data(), d.bytes.size());
          }
        }
        model[static_cast<size_t>(r)].push_back(std::move(d));
      }
    }

    // The save: every rank's SmallModel state and its extra datasets, each fill checked for
    // the order and size of its windows and for the place it asked.
    const DirectWriteStats w0 = GetDirectWriteStats();
    std::atomic<int> windows{0}, placed{0};
    Status save;
    {
      DirectIoMode mode(io_mode);
      save = SaveRanks(
          dir.str(), m, 1 + static_cast<int>(rng() % 2),
          [&](int r, const WriteRankFn& write) -> Status {
            RankBuffers buf;
            FillRank(m, r, buf);
            for (ModelDataset& d : model[static_cast<size_t>(r)]) {
              if (d.kind == "blob") {
                buf.contents.datasets.push_back(DatasetSpec::Blob(d.name, "test", d.bytes));
                continue;
              }
              if (d.kind == "json") {
                buf.contents.datasets.push_back(DatasetSpec::Json(d.name, d.bytes));
                continue;
              }
              using S = ModelDataset::Source;
              if (d.source == S::kHeap || d.source == S::kIoMemory) {
                const void* p = d.source == S::kHeap
                                    ? static_cast<const void*>(d.heap.data() + d.heap_at)
                                    : d.io.data();
                buf.contents.datasets.push_back(DatasetSpec::Tensor(d.name, d.dtype, d.shape, p));
                continue;
              }
              const size_t es = DTypeSize(d.dtype);
              auto next = std::make_shared<uint64_t>(0);
              DatasetSpec spec = DatasetSpec::Filled(
                  d.name, d.dtype, d.shape,
                  [&, next, es, bytes = &d.bytes, placed_fill = d.source == S::kFillPlaced](
                      uint64_t off, size_t n, void* out) {
                    if (off != *next || n == 0 || n > o.fill_window_bytes || n % es != 0 ||
                        off % es != 0)
                      return Internal("window [" + std::to_string(off) + ", +" + std::to_string(n) +
                                      ") out of order");
                    if (placed_fill && !compressed &&
                        reinterpret_cast<uintptr_t>(out) % 4096 != (off * 3 + 8) % 4096)
                      return Internal("window not where fill_place asked");
                    *next = off + n;
                    ++windows;
                    placed += placed_fill && !compressed;
                    std::memcpy(out, bytes->data() + off, n);
                    return Status::Ok();
                  });
              if (d.source == S::kFillPlaced)
                spec.fill_place = [](uint64_t off, size_t) -> std::optional<uint64_t> {
                  return (off * 3 + 8) % 4096;
                };
              buf.contents.datasets.push_back(std::move(spec));
            }
            return write(buf.contents);
          },
          o);
    }
    REQUIRE(save.ok());
    const DirectWriteStats w1 = GetDirectWriteStats();
    reached.in_place_bytes += w1.in_place_bytes - w0.in_place_bytes;
    reached.direct_write_bytes += w1.direct_bytes - w0.direct_bytes;
    reached.refused += w1.refused - w0.refused;
    reached.fill_windows += windows;
    reached.placed_windows += placed;

    // Every read path against the model.
    DirectIoMode mode(read_mode);
    const DirectReadStats r0 = GetDirectReadStats();
    OpenOptions oo;
    oo.verify_checksums = rng() % 4 != 0;
    auto reader = CheckpointReader::Open(dir.str(), "", oo);
    REQUIRE(reader.ok());
    REQUIRE(reader->CheckFiles().ok());
    for (int r = 0; r < world; ++r) {
      for (const ModelDataset& d : model[static_cast<size_t>(r)]) {
        INFO("rank " << r << " " << d.name << " " << d.kind << " " << DTypeName(d.dtype) << " "
                     << d.bytes.size() << " bytes, source " << static_cast<int>(d.source));
        if (d.kind == "blob") {
          auto b = reader->ReadBlob(r, d.name);
          REQUIRE(b.ok());
          const bool same = *b == d.bytes;
          CHECK(same);
          continue;
        }
        if (d.kind == "json") {
          auto j = reader->ReadJson(r, d.name);
          REQUIRE(j.ok());
          CHECK(*j == nlohmann::json::parse(d.bytes));
          continue;
        }
        const size_t n = d.bytes.size();
        const bool one_d = d.shape.size() == 1 && n > 0;
        std::optional<uint64_t> at;
        if (one_d) {
          auto place = reader->SliceFileOffset(r, d.name, 0);
          REQUIRE(place.ok());
          at = *place;
          if (!compressed) CHECK(at.has_value());  // plain contiguous bytes
        }
        {  // the whole dataset, at its place or at any byte
          GuardedOut out(n, OutPlace(rng, at, d.anchor));
          REQUIRE(reader->ReadDataset(r, d.name, out.out, n).ok());
          CHECK(SameBytes(out.out, d.bytes.data(), n));
          CHECK(out.Intact());
        }
        auto whole = reader->ReadDatasetBytes(r, d.name);
        REQUIRE(whole.ok());
        CHECK(whole->size() == n);
        CHECK(SameBytes(whole->data(), d.bytes.data(), std::min(n, whole->size())));
        REQUIRE(reader->VerifyDataset(r, d.name).ok());
        if (!one_d) continue;
        // Slices of 1-D tensors: verified and not, from one element to all of them.
        const int64_t numel = d.shape[0];
        const size_t es = DTypeSize(d.dtype);
        for (int k = 0; k < 4; ++k) {
          const int64_t off = static_cast<int64_t>(rng() % static_cast<uint64_t>(numel));
          const int64_t left = numel - off;
          const int64_t count =
              rng() % 3 == 0 ? left : 1 + static_cast<int64_t>(rng() % static_cast<uint64_t>(left));
          auto place = reader->SliceFileOffset(r, d.name, off);
          REQUIRE(place.ok());
          const size_t bytes = static_cast<size_t>(count) * es;
          GuardedOut out(bytes, OutPlace(rng, *place, false));
          reached.slices_at_place += place->has_value() && out.lead % 4096 == **place % 4096;
          const bool verified = rng() % 3 != 0;
          Status st = verified ? reader->ReadSlice(r, d.name, off, count, out.out)
                               : reader->ReadSliceUnverified(r, d.name, off, count, out.out);
          INFO("slice [" << off << ", +" << count << ")" << (verified ? "" : " unverified"));
          REQUIRE(st.ok());
          CHECK(SameBytes(out.out, d.bytes.data() + static_cast<size_t>(off) * es, bytes));
          CHECK(out.Intact());
          ++reached.slices;
        }
      }
    }
    const DirectReadStats r1 = GetDirectReadStats();
    reached.direct_read_bytes += r1.direct_bytes - r0.direct_bytes;
    reached.into_caller_bytes += r1.direct_into_caller_bytes - r0.direct_into_caller_bytes;
    reached.refused += r1.refused - r0.refused;
    // The SmallModel state too (so the extra datasets did not disturb it), and a deep check.
    for (int r = 0; r < world; ++r) {
      RankBuffers buf;
      FillRank(m, r, buf);
      for (int s = 0; s < 3; ++s) {
        const char* names[3] = {"master", "exp_avg", "exp_avg_sq"};
        auto b = reader->ReadDatasetBytes(r, names[s]);
        REQUIRE(b.ok());
        REQUIRE(b->size() == buf.state[s].size() * 4);
        CHECK(SameBytes(b->data(), buf.state[s].data(), b->size()));
      }
    }
    auto problems = CheckCheckpoint(dir / "global_step1", /*deep=*/true);
    REQUIRE(problems.ok());
    CHECK(problems->empty());
    if (!problems->empty()) FAIL_CHECK(problems->front().file + " " + problems->front().what);

    // h5py, from docs/format.md, sees the model's bytes.
    if (have_h5py) {
      const std::string expect = dir / "expect";
      std::filesystem::create_directories(expect);
      for (int r = 0; r < world; ++r) {
        RankBuffers buf;
        FillRank(m, r, buf);
        for (const auto& ds : buf.contents.datasets) {
          auto bytes = reader->ReadDatasetBytes(r, ds.name);
          REQUIRE(bytes.ok());
          WriteExpected(expect, r, ds.name, std::string(bytes->begin(), bytes->end()));
        }
        for (const ModelDataset& d : model[static_cast<size_t>(r)])
          WriteExpected(expect, r, d.name, d.bytes);
      }
      CHECK(RunH5pyCrosscheck(dir / "global_step1", expect) == 0);
    }
    ++reached.rounds;
  }

  // What the rounds reached: the anchor rounds reach each of these for any seed (the byte
  // counts where the file system allows O_DIRECT).
  INFO("compressed " << reached.compressed << ", fill windows " << reached.fill_windows
                     << " (placed " << reached.placed_windows << "), empty " << reached.empty
                     << ", 2-D " << reached.two_d << ", I/O-memory sources " << reached.io_sources
                     << ", slices " << reached.slices << " (at place " << reached.slices_at_place
                     << "), in place " << reached.in_place_bytes << ", direct writes "
                     << reached.direct_write_bytes << ", direct reads " << reached.direct_read_bytes
                     << " (into caller " << reached.into_caller_bytes << "), refused "
                     << reached.refused);
  CHECK(reached.rounds == kRounds);
  CHECK(reached.fill_windows > 0);
  CHECK(reached.placed_windows > 0);
  CHECK(reached.io_sources > 0);
  CHECK(reached.slices > 0);
  CHECK(reached.slices_at_place > 0);
  if (reached.refused == 0) {
    CHECK(reached.direct_write_bytes > 0);
    CHECK(reached.in_place_bytes > 0);
    CHECK(reached.direct_read_bytes > 0);
    CHECK(reached.into_caller_bytes > 0);
  }
}
