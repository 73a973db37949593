// Format 1.3 piece checksums and load-time resharding (issue 15): slice reads verify exactly
// the pieces they touch; ckpt::LoadResharded loads any (world size, ZeRO stage) from any other,
// bitwise, reading only what each new rank owns (within the read bound) and naming damage.
// The CI matrix rotates the target stage; the hidden "[full]" case runs every pair.
#include <catch2/catch.hpp>

#include <hdf5.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <random>

#include "ckpt/env.h"
#include "ckpt/hash.h"
#include "ckpt/load_resharded.h"
#include "ckpt/reader.h"
#include "ckpt/synth.h"
#include "test_util.h"

using namespace ckpt;
using ckpt::testing::HugePageEligible;
using ckpt::testing::HugePageMode;
using ckpt::testing::ScratchDir;
using ckpt::testing::TestSeed;
using ckpt::testing::XorByteAt;

namespace {

constexpr uint64_t kPiece = 256;  // bytes: many pieces per dataset of the small model

std::string WriteRoot(const std::string& root, int ranks, int zero, uint64_t piece = kPiece,
                      const char* compression = "none") {
  SynthOptions o;
  o.ranks = ranks;
  o.zero_stage = zero;
  o.params = 3000;
  o.largest_tensor = 700;
  o.seed = 3;
  o.piece_bytes = piece;
  o.chunk_bytes = 1024;
  o.compression = Compression::Parse(compression).value();
  auto tags = WriteSynthetic(root, o);
  REQUIRE(tags.ok());
  return root + "/" + tags->front();
}

// The file offset of a contiguous dataset's first byte.
uint64_t DataOffset(const std::string& file, const std::string& dataset) {
  hid_t f = H5Fopen(file.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  REQUIRE(f >= 0);
  hid_t d = H5Dopen2(f, dataset.c_str(), H5P_DEFAULT);
  REQUIRE(d >= 0);
  const haddr_t addr = H5Dget_offset(d);
  H5Dclose(d);
  H5Fclose(f);
  REQUIRE(addr != HADDR_UNDEF);
  return static_cast<uint64_t>(addr);
}

// Drops the piece digests from every dataset record (what a 1.2 writer recorded).
void DropPieces(const std::string& tag_dir) {
  const std::string path = tag_dir + "/manifest.json";
  auto text = Env::Default()->ReadFileToString(path);
  REQUIRE(text.ok());
  auto m = ParseManifest(*text, path);
  REQUIRE(m.ok());
  for (auto& f : m->files)
    for (auto& d : f.datasets) {
      d.piece_bytes = 0;
      d.piece_xxh3.clear();
    }
  REQUIRE(WriteFileAtomic(Env::Default(), path, SerializeManifest(*m)).ok());
}

// Every trainable parameter's three states, assembled from a target's loaded shards.
using Full = std::map<std::pair<std::string, std::string>, std::vector<float>>;

Full Assemble(const ReshardTarget& t, const std::vector<ReshardedRank>& ranks) {
  Full out;
  for (const auto& p : t.params) {
    if (!p.trainable()) continue;
    for (const char* state : {"master", "exp_avg", "exp_avg_sq"}) {
      auto& v = out[{p.name, state}];
      v.assign(static_cast<size_t>(p.numel), -1.0f);
      for (const auto& r : p.ranges) {
        const ReshardedRank& rk = ranks[static_cast<size_t>(r.rank)];
        const auto& shard = std::string(state) == "master"    ? rk.master
                            : std::string(state) == "exp_avg" ? rk.exp_avg
                                                              : rk.exp_avg_sq;
        std::memcpy(v.data() + r.begin, shard.data() + r.shard_offset,
                    static_cast<size_t>(r.end - r.begin) * sizeof(float));
      }
    }
  }
  return out;
}

Full ReadSource(const std::string& tag_dir) {
  auto r = CheckpointReader::Open(tag_dir);
  REQUIRE(r.ok());
  Full out;
  for (const auto& p : r->manifest().params) {
    if (!p.trainable()) continue;
    for (const char* state : {"master", "exp_avg", "exp_avg_sq"}) {
      auto v = r->ReadParamFull(p.name, state);
      REQUIRE(v.ok());
      out[{p.name, state}] = *v;
    }
  }
  return out;
}

bool SameBits(const Full& a, const Full& b) {
  if (a.size() != b.size()) return false;
  for (const auto& [k, v] : a) {
    auto it = b.find(k);
    if (it == b.end() || it->second.size() != v.size() ||
        std::memcmp(it->second.data(), v.data(), v.size() * sizeof(float)) != 0)
      return false;
  }
  return true;
}

// Loads every rank of (world, stage) from `tag_dir` and checks the state against the source:
// bitwise values, zero padding, the read bound, small state and RNG as specified.
// `piece`: the source's piece size; `bounded`: whether the read bound applies (a compressed
// source reads whole chunks).
void CheckReshard(const std::string& tag_dir, const Full& want, int src_world, int world,
                  int stage, uint64_t piece = kPiece, bool bounded = true) {
  INFO("source " << tag_dir << " -> " << world << " ranks, ZeRO-" << stage);
  auto src = CheckpointReader::Open(tag_dir);
  REQUIRE(src.ok());
  auto target = PlanReshard(src->manifest(), world, stage);
  REQUIRE(target.ok());
  std::vector<ReshardedRank> ranks;
  for (int j = 0; j < world; ++j) {
    auto r = LoadResharded(tag_dir, *target, j);
    REQUIRE(r.ok());
    const ReadAccounting& a = r->accounting;
    INFO("rank " << j << ": read " << a.bytes_read << " for " << a.bytes_owned << " owned, "
                 << a.slices << " slices");
    CHECK(a.piece_bytes == piece);
    if (bounded)
      CHECK(static_cast<double>(a.bytes_read) <=
            1.05 * static_cast<double>(a.bytes_owned) + 2.0 * double(a.slices) * double(piece));
    CHECK(r->frozen.empty() == (j != 0));
    std::map<std::string, std::string> extras;
    for (const auto& [ex, bytes] : r->extras) extras[ex.name] = std::string(bytes.begin(), bytes.end());
    CHECK(extras.count("data_position") == 1);
    if (world == src_world) {
      CHECK(extras.count("rng/dropout") == 1);
      CHECK(extras["rng/dropout"] == src->ReadBlob(j, "rng/dropout").value());
    } else {
      CHECK(extras.count("rng/dropout") == 0);
      CHECK(extras["data_position"] == src->ReadBlob(0, "data_position").value());
    }
    ranks.push_back(std::move(*r));
  }
  CHECK(SameBits(Assemble(*target, ranks), want));
  // Padding is zero, never read.
  for (int j = 0; j < world; ++j) {
    std::vector<bool> used(ranks[static_cast<size_t>(j)].master.size(), false);
    for (const auto& p : target->params)
      for (const auto& r : p.ranges)
        if (r.rank == j)
          for (int64_t e = r.shard_offset; e < r.shard_offset + (r.end - r.begin); ++e)
            used[static_cast<size_t>(e)] = true;
    for (size_t e = 0; e < used.size(); ++e)
      if (!used[e]) REQUIRE(ranks[static_cast<size_t>(j)].master[e] == 0.0f);
  }
}

void RunMatrix(bool full) {
  int pairs = 0;
  for (int n = 1; n <= 4; ++n) {
    for (int z = 0; z <= 3; ++z) {
      ScratchDir dir("reshard-load");
      const std::string tag = WriteRoot(dir / "src", n, z);
      const Full want = ReadSource(tag);
      for (int m = 1; m <= 4; ++m) {
        for (int s = 0; s <= 3; ++s) {
          if (!full && s != (z + m) % 4) continue;  // CI: one stage per target world size
          CheckReshard(tag, want, n, m, s);
          ++pairs;
        }
      }
    }
  }
  CHECK(pairs == (full ? 256 : 64));
}

}  // namespace

TEST_CASE("the writer records per-piece digests in its single pass (format 1.3)", "[io]") {
  ScratchDir dir("pieces");
  const std::string tag = WriteRoot(dir / "root", 2, 1, 1000);  // rounded down to 1000
  auto r = CheckpointReader::Open(tag);
  REQUIRE(r.ok());
  CHECK(r->manifest().version_minor == 3);
  for (const auto& f : r->manifest().files) {
    for (const auto& d : f.datasets) {
      INFO(f.path << " /" << d.name);
      CHECK(d.piece_bytes == 1000);
      REQUIRE(d.piece_xxh3.size() == (d.bytes + 999) / 1000);
      auto bytes = r->ReadDatasetBytes(f.rank, d.name);
      REQUIRE(bytes.ok());
      for (size_t k = 0; k < d.piece_xxh3.size(); ++k) {
        const size_t begin = k * 1000, n = std::min<size_t>(1000, bytes->size() - begin);
        CHECK(d.piece_xxh3[k] == DigestHex(Xxh3(bytes->data() + begin, n)));
      }
    }
  }
  // Compressed datasets get the same digests of their logical bytes.
  const std::string ztag = WriteRoot(dir / "z", 2, 1, 1000, "zstd:1+shuffle");
  auto rz = CheckpointReader::Open(ztag);
  REQUIRE(rz.ok());
  CHECK(rz->manifest().FindDataset(1, "exp_avg")->piece_xxh3 ==
        r->manifest().FindDataset(1, "exp_avg")->piece_xxh3);
}

TEST_CASE("a flipped byte is caught by a slice read touching its piece, not by others", "[io]") {
  for (const char* compression : {"none", "zstd:1"}) {
    INFO(compression);
    ScratchDir dir("pieces-flip");
    const std::string tag = WriteRoot(dir / "root", 2, 2, kPiece, compression);
    auto clean = CheckpointReader::Open(tag);
    REQUIRE(clean.ok());
    const DatasetRecord* rec = clean->manifest().FindDataset(1, "master");
    REQUIRE(rec != nullptr);
    REQUIRE(rec->piece_count() >= 4);
    const int64_t per_piece = static_cast<int64_t>(kPiece / 4);
    std::vector<float> want(static_cast<size_t>(rec->shape[0]));
    REQUIRE(clean->ReadSlice(1, "master", 0, rec->shape[0], want.data()).ok());
    if (std::string(compression) == "none") {
      // Damage piece 2 of rank 1's master.
      REQUIRE(XorByteAt(tag + "/rank_00001.h5",
                        DataOffset(tag + "/rank_00001.h5", "master") + 2 * kPiece + 5, 0x40));
    } else {
      // A flipped byte inside a zstd frame may fail the chunk's decompression before any
      // piece is hashed: damage the recorded digest of piece 2 instead, which the same check
      // must catch.
      const std::string path = tag + "/manifest.json";
      auto m = ParseManifest(Env::Default()->ReadFileToString(path).value(), path);
      REQUIRE(m.ok());
      for (auto& d : m->files[1].datasets)
        if (d.name == "master") d.piece_xxh3[2] = "0123456789abcdef";
      REQUIRE(WriteFileAtomic(Env::Default(), path, SerializeManifest(*m)).ok());
    }
    auto r = CheckpointReader::Open(tag);
    REQUIRE(r.ok());
    std::vector<float> got(static_cast<size_t>(rec->shape[0]));
    // Pieces 0-1 and 3.. read fine and equal what was written; the reads took whole pieces.
    const uint64_t before = r->bytes_read();
    REQUIRE(r->ReadSlice(1, "master", 3, 2 * per_piece - 6, got.data()).ok());
    CHECK(r->bytes_read() - before == 2 * kPiece);
    CHECK(std::memcmp(got.data(), want.data() + 3, (2 * per_piece - 6) * 4) == 0);
    REQUIRE(r->ReadSlice(1, "master", 3 * per_piece, per_piece + 1, got.data()).ok());
    CHECK(std::memcmp(got.data(), want.data() + 3 * per_piece, (per_piece + 1) * 4) == 0);
    // Any read touching piece 2 fails, naming the file, the dataset and the piece.
    for (auto [off, cnt] : {std::pair<int64_t, int64_t>{2 * per_piece + 10, 1},
                            {per_piece, per_piece + 1},
                            {0, rec->shape[0]}}) {
      Status s = r->ReadSlice(1, "master", off, cnt, got.data());
      INFO(s.ToString());
      CHECK(s.code() == StatusCode::kDataLoss);
      CHECK(s.message().find("rank_00001.h5") != std::string::npos);
      CHECK(s.message().find("/master") != std::string::npos);
      CHECK(s.message().find("piece 2 of") != std::string::npos);
    }
    // The deep check names the piece too.
    auto problems = CheckCheckpoint(tag, /*deep=*/true);
    REQUIRE(problems.ok());
    bool named = false;
    for (const auto& p : *problems)
      named |= p.file == "rank_00001.h5" && p.dataset == "master" &&
               p.what.find("piece 2 of") != std::string::npos;
    CHECK(named);
  }
}

TEST_CASE("LoadResharded: bitwise state on every world size and stage (CI matrix)", "[io]") {
  RunMatrix(/*full=*/false);
}

TEST_CASE("LoadResharded: every source x target pair", "[.][full]") { RunMatrix(/*full=*/true); }

TEST_CASE("LoadResharded: random models, pieces and world sizes hold the synthetic values",
          "[io]") {
  // Larger tensors than the matrix's (up to 750 000 elements, 3 MiB a state, so that verified
  // slices read runs of whole pieces in one large read), random piece and chunk sizes, compressed
  // sources and any (world size, stage) pair; the values are checked against SynthValue itself at
  // random elements, and the whole state against the reader's gather.
  const uint64_t seed = TestSeed();
  INFO("seed " << seed << " (CKPT_TEST_SEED=" << seed << " replays it)");
  std::mt19937_64 rng(seed);
  int rounds = 0;
  uint64_t large_reads = 0;  // bytes LoadResharded read in runs of whole pieces (ReadLarge)
  for (int round = 0; round < 6; ++round) {
    SynthOptions o;
    o.ranks = 1 + static_cast<int>(rng() % 5);
    o.zero_stage = static_cast<int>(rng() % 4);
    o.params = 64 + static_cast<int64_t>(rng() % 1'500'000);
    o.largest_tensor = rng() % 2 == 0 ? 0 : 1 + static_cast<int64_t>(rng() % (o.params / 2));
    o.seed = rng();
    const uint64_t pieces[] = {8 + 8 * (rng() % 2000), 4096, 65536, 1u << 20};
    o.piece_bytes = pieces[rng() % 4];
    const uint64_t chunks[] = {4096, 1u << 20, 4u << 20};
    o.chunk_bytes = chunks[rng() % 3];
    const bool compressed = round > 0 && rng() % 3 == 0;  // round 0 reads runs of pieces
    o.compression = Compression::Parse(compressed ? "zstd:1+shuffle" : "none").value();
    const int world = 1 + static_cast<int>(rng() % 5), stage = static_cast<int>(rng() % 4);
    INFO("round " << round << ": " << o.params << " parameters (largest " << o.largest_tensor
                  << ") on " << o.ranks << " ranks, ZeRO-" << o.zero_stage << ", piece "
                  << o.piece_bytes << ", chunk " << o.chunk_bytes
                  << (compressed ? ", zstd" : "") << " -> " << world << " ranks, ZeRO-" << stage);
    ScratchDir dir("reshard-random");
    auto tags = WriteSynthetic(dir / "src", o);
    REQUIRE(tags.ok());
    const std::string tag = dir / ("src/" + tags->front());
    const Full want = ReadSource(tag);
    auto src = CheckpointReader::Open(tag);
    REQUIRE(src.ok());
    const Manifest& m = src->manifest();
    for (size_t pi = 0; pi < m.params.size(); ++pi) {
      const ParamEntry& p = m.params[pi];
      if (!p.trainable() || p.numel == 0) continue;
      for (const char* state : {"master", "exp_avg", "exp_avg_sq"}) {
        const std::vector<float>& v = want.at({p.name, state});
        for (int k = 0; k < 4; ++k) {
          const int64_t e = static_cast<int64_t>(rng() % static_cast<uint64_t>(p.numel));
          INFO(p.name << " " << state << " element " << e);
          CHECK(v[static_cast<size_t>(e)] ==
                SynthValue(o.seed, m.counters.global_step, pi, state, e));
        }
      }
    }
    const DirectReadStats before = GetDirectReadStats();
    CheckReshard(tag, want, o.ranks, world, stage, o.piece_bytes, !compressed);
    const DirectReadStats after = GetDirectReadStats();
    large_reads +=
        (after.direct_bytes + after.buffered_bytes) - (before.direct_bytes + before.buffered_bytes);
    ++rounds;
  }
  CHECK(rounds == 6);
  CHECK(large_reads > 0);
}

TEST_CASE("LoadResharded names damage in a piece a new rank reads, and only that rank", "[io]") {
  ScratchDir dir("reshard-flip");
  const std::string tag = WriteRoot(dir / "src", 4, 1);
  // Damage a piece in the middle of source rank 3's exp_avg: on 2 ranks with ZeRO-1, new rank
  // 1 owns the second half of the flat buffer (source ranks 2 and 3), new rank 0 never reads
  // from rank 3.
  auto clean = CheckpointReader::Open(tag);
  REQUIRE(clean.ok());
  const DatasetRecord* rec = clean->manifest().FindDataset(3, "exp_avg");
  REQUIRE(rec != nullptr);
  const uint64_t at = rec->bytes / 2;
  REQUIRE(
      XorByteAt(tag + "/rank_00003.h5", DataOffset(tag + "/rank_00003.h5", "exp_avg") + at, 0x40));
  auto target = PlanReshard(clean->manifest(), 2, 1);
  REQUIRE(target.ok());
  CHECK(LoadResharded(tag, *target, 0).ok());
  auto bad = LoadResharded(tag, *target, 1);
  REQUIRE(!bad.ok());
  INFO(bad.status().ToString());
  CHECK(bad.status().code() == StatusCode::kDataLoss);
  CHECK(bad.status().message().find("new rank 1 of 2") != std::string::npos);
  CHECK(bad.status().message().find("rank_00003.h5: dataset /exp_avg: checksum mismatch in piece " +
                                    std::to_string(at / kPiece) + " of") != std::string::npos);

  // A file without piece digests (before 1.3): a new rank verifies each dataset it reads from
  // whole, so the damage is found even by a rank whose own slices are intact.
  DropPieces(tag);
  for (int j = 0; j < 2; ++j) {
    auto r = LoadResharded(tag, *target, j);
    INFO("rank " << j << ": " << r.status().ToString());
    if (j == 1) {
      CHECK(r.status().code() == StatusCode::kDataLoss);
      CHECK(r.status().message().find("rank_00003.h5: dataset /exp_avg: checksum mismatch") !=
            std::string::npos);
    } else {
      CHECK(r.ok());
    }
  }
}

TEST_CASE("LoadResharded refuses another model shape or optimizer", "[io]") {
  ScratchDir dir("reshard-refuse");
  const std::string tag = WriteRoot(dir / "src", 2, 2);
  auto r = CheckpointReader::Open(tag);
  REQUIRE(r.ok());
  auto target = PlanReshard(r->manifest(), 3, 1);
  REQUIRE(target.ok());
  ReshardTarget other = *target;
  other.params[1].shape.back() += 1;
  other.params[1].numel = 1;
  for (auto d : other.params[1].shape) other.params[1].numel *= d;
  auto s = LoadResharded(tag, other, 0);
  CHECK(s.status().code() == StatusCode::kFailedPrecondition);
  CHECK(s.status().message().find("model shape differs") != std::string::npos);
  other = *target;
  other.params.pop_back();
  CHECK(LoadResharded(tag, other, 0).status().code() == StatusCode::kFailedPrecondition);
  LoadReshardOptions sgd;
  sgd.optimizer_type = "sgd";
  s = LoadResharded(tag, *target, 0, sgd);
  CHECK(s.status().code() == StatusCode::kFailedPrecondition);
  CHECK(s.status().message().find("optimizer differs") != std::string::npos);
  CHECK(LoadResharded(tag, *target, 3).status().code() == StatusCode::kInvalidArgument);
  CHECK(PlanReshard(r->manifest(), 0, 1).status().code() == StatusCode::kInvalidArgument);
  CHECK(PlanReshard(r->manifest(), 2, 4).status().code() == StatusCode::kInvalidArgument);
}

TEST_CASE("read accounting: 4 -> 3 and 4 -> 2 read about what each new rank owns", "[io]") {
  ScratchDir dir("reshard-acct");
  const std::string tag = WriteRoot(dir / "src", 4, 2);
  auto r = CheckpointReader::Open(tag);
  REQUIRE(r.ok());
  uint64_t total = 0;
  for (const auto& f : r->manifest().files)
    for (const char* s : {"master", "exp_avg", "exp_avg_sq"})
      if (const DatasetRecord* d = r->manifest().FindDataset(f.rank, s)) total += d->bytes;
  for (int m : {2, 3}) {
    auto target = PlanReshard(r->manifest(), m, 2);
    REQUIRE(target.ok());
    uint64_t read = 0;
    for (int j = 0; j < m; ++j) {
      auto l = LoadResharded(tag, *target, j);
      REQUIRE(l.ok());
      const ReadAccounting& a = l->accounting;
      INFO(m << " ranks, rank " << j << ": " << a.bytes_read << " read, " << a.bytes_owned
             << " owned, " << a.slices << " slices");
      CHECK(a.bytes_owned > 0);
      CHECK(a.bytes_read >= a.bytes_owned);
      CHECK(static_cast<double>(a.bytes_read) <=
            1.05 * static_cast<double>(a.bytes_owned) + 2.0 * double(a.slices) * double(kPiece));
      CHECK(a.bytes_read < total * 2 / static_cast<uint64_t>(m));
      read += a.bytes_read;
    }
    // Together the new ranks read each source byte about once.
    CHECK(static_cast<double>(read) <= 1.1 * static_cast<double>(total));
  }
}

TEST_CASE("LoadResharded's shards are memory that asked for huge pages before it was filled",
          "[io]") {
  // Fresh memory is paid for at its first touch; on the development VM a 1 GiB load-time
  // reshard spent most of its 2.2 s faulting in 4 KiB pages (docs/performance.md). Shards of
  // 8 MiB and more hold whole 2 MiB blocks.
  ScratchDir dir("reshard-huge");
  SynthOptions o;
  o.ranks = 2;
  o.zero_stage = 2;
  o.params = 3u << 20;
  o.largest_tensor = 1u << 20;
  o.seed = 5;
  auto tags = WriteSynthetic(dir / "src", o);
  REQUIRE(tags.ok());
  const std::string tag = dir / ("src/" + tags->front());
  auto r = CheckpointReader::Open(tag);
  REQUIRE(r.ok());
  auto target = PlanReshard(r->manifest(), 1, 2);
  REQUIRE(target.ok());
  auto l = LoadResharded(tag, *target, 0);
  REQUIRE(l.ok());
  const std::string mode = HugePageMode();
  for (const std::vector<float>* v : {&l->master, &l->exp_avg, &l->exp_avg_sq}) {
    REQUIRE(v->size() * sizeof(float) >= (8u << 20));
    const auto lo = reinterpret_cast<uintptr_t>(v->data());
    const uintptr_t block = (lo + (2u << 20) - 1) / (2u << 20) * (2u << 20);
    if (mode == "always" || mode == "madvise")
      CHECK(HugePageEligible(reinterpret_cast<void*>(block)) == 1);
  }
  if (mode != "always" && mode != "madvise")
    WARN("transparent huge pages are off here (" << mode << "): nothing to check");
  // And the state is the source's.
  auto want = r->ReadParamFull(target->params.front().name, "master");
  REQUIRE(want.ok());
  const auto& range = target->params.front().ranges.front();
  CHECK(std::memcmp(l->master.data() + range.shard_offset, want->data() + range.begin,
                    static_cast<size_t>(range.end - range.begin) * sizeof(float)) == 0);
}

namespace {

// Records the length of every ReadLarge call on the checkpoint files it opens.
class LargeReadLog : public EnvWrapper {
 public:
  LargeReadLog() : EnvWrapper(nullptr) {}
  Result<std::unique_ptr<RandomAccessFile>> NewCheckpointFile(const std::string& path) override {
    CKPT_ASSIGN_OR_RETURN(std::unique_ptr<RandomAccessFile> f, target()->NewCheckpointFile(path));
    return std::unique_ptr<RandomAccessFile>(new File(std::move(f), &lengths));
  }
  std::vector<uint64_t> lengths;

 private:
  class File : public RandomAccessFile {
   public:
    File(std::unique_ptr<RandomAccessFile> f, std::vector<uint64_t>* log)
        : f_(std::move(f)), log_(log) {}
    Status Read(uint64_t offset, size_t n, void* out) const override {
      return f_->Read(offset, n, out);
    }
    uint64_t size() const override { return f_->size(); }
    Status ReadLarge(uint64_t offset, uint64_t n, void* out,
                     const PartFn& on_filled) const override {
      log_->push_back(n);
      return f_->ReadLarge(offset, n, out, on_filled);
    }
    Status Scan(uint64_t offset, uint64_t n, const PartFn& consume) const override {
      return f_->Scan(offset, n, consume);
    }

   private:
    std::unique_ptr<RandomAccessFile> f_;
    std::vector<uint64_t>* log_;
  };
};

}  // namespace

TEST_CASE("A verified slice reads its whole pieces in one large read, each piece checked", "[io]") {
  ScratchDir dir("slice-run");
  const std::string tag = WriteRoot(dir / "src", 1, 1);
  const std::string file = tag + "/rank_00000.h5";
  const int64_t offset = 10, count = 2000;    // bytes [40, 8040): pieces 0 and 31 in part
  const uint64_t k0 = 1, k1 = 8040 / kPiece;  // pieces 1..30 whole
  std::vector<float> want(count);
  {
    auto r = CheckpointReader::Open(tag);
    REQUIRE(r.ok());
    REQUIRE(r->ReadSliceUnverified(0, "exp_avg", offset, count, want.data()).ok());
  }
  auto read = [&](LargeReadLog* log, std::vector<float>* got) {
    OpenOptions o;
    o.env = log;
    auto r = CheckpointReader::Open(tag, "", o);
    REQUIRE(r.ok());
    got->assign(count, -1.0f);
    return r->ReadSlice(0, "exp_avg", offset, count, got->data());
  };
  {
    LargeReadLog log;
    std::vector<float> got;
    REQUIRE(read(&log, &got).ok());
    CHECK(std::memcmp(got.data(), want.data(), count * sizeof(float)) == 0);
    // One read for the run of whole pieces, one for each partly wanted piece at the ends.
    CHECK(std::count(log.lengths.begin(), log.lengths.end(), (k1 - k0) * kPiece) == 1);
    CHECK(std::count(log.lengths.begin(), log.lengths.end(), kPiece) == 2);
  }
  // Damage inside the run and at an edge: each named by its piece.
  const uint64_t base = DataOffset(file, "exp_avg");
  for (uint64_t piece : {uint64_t{17}, uint64_t{0}, uint64_t{31}}) {
    INFO("damage in piece " << piece);
    REQUIRE(XorByteAt(file, base + piece * kPiece + 100, 0x08));
    LargeReadLog log;
    std::vector<float> got;
    const Status s = read(&log, &got);
    REQUIRE(XorByteAt(file, base + piece * kPiece + 100, 0x08));  // undone for the next
    REQUIRE(!s.ok());
    CHECK(s.code() == StatusCode::kDataLoss);
    CHECK(s.message().find("rank_00000.h5: dataset /exp_avg: checksum mismatch in piece " +
                           std::to_string(piece) + " of") != std::string::npos);
  }
}
