// DeepSpeed checkpoints end to end (tests/deepspeed/check_deepspeed.py): every fixture of ZeRO
// 1/2/3 x world 1/2/3 x fp32/bf16 (+ BF16_Optimizer) against torch's recomputation through
// export-fp32, import-deepspeed, inspect, check, to-universal, reshard and next-update; hostile
// inputs refused. (docs/deepspeed.md's examples run in the docs suite, tests/docs.)
#include <algorithm>
#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <cstdlib>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "ckpt/aligned_buffer.h"
#include "ckpt/deepspeed.h"
#include "ckpt/dtype.h"
#include "ckpt/env.h"
#include "ckpt/h5.h"
#include "ckpt/manifest.h"
#include "ckpt/state_source.h"
#include "ckpt/universal.h"
#include "ckpt_test_helpers.h"
#include "convert/export.h"
#include "convert/universal.h"
#include "safetensors/safetensors.h"
#include "test_util.h"

namespace {

using ckpt::testing::Mapped;
using ckpt::testing::XorByteAt;

// Records the large reads of the files it opens; with `fail` set, every read fails.
class ReadWatchEnv final : public ckpt::testing::WrappedFileEnv {
 public:
  ReadWatchEnv()
      : WrappedFileEnv([this](std::unique_ptr<ckpt::RandomAccessFile> f, const std::string&) {
          return std::make_unique<File>(std::move(f), this);
        }) {}
  std::atomic<uint64_t> large_reads{0}, largest{0}, scanned{0};
  std::atomic<uint64_t> scans{0};       // Scan calls
  std::atomic<uint64_t> read_bytes{0};  // by Read, ReadLarge and Scan
  std::atomic<bool> fail{false};
  std::mutex mu;
  std::vector<std::pair<uint64_t, uint64_t>> hints;  // WillNeed ranges, in call order
  std::vector<uint64_t> hinted_reads;                // offsets of Reads inside a hinted range

 private:
  class File final : public ckpt::RandomAccessFile {
   public:
    File(std::unique_ptr<ckpt::RandomAccessFile> f, ReadWatchEnv* env)
        : f_(std::move(f)), env_(env) {}
    ckpt::Status Read(uint64_t offset, size_t n, void* out) const override {
      if (env_->fail) return ckpt::IOError("injected read failure");
      env_->read_bytes += n;
      {
        std::lock_guard<std::mutex> lock(env_->mu);
        for (const auto& [at, len] : env_->hints) {
          if (offset >= at && offset + n <= at + len) {
            env_->hinted_reads.push_back(offset);
            break;
          }
        }
      }
      return f_->Read(offset, n, out);
    }
    uint64_t size() const override { return f_->size(); }
    void WillNeed(uint64_t offset, uint64_t n) const override {
      {
        std::lock_guard<std::mutex> lock(env_->mu);
        env_->hints.emplace_back(offset, n);
      }
      f_->WillNeed(offset, n);
    }
    ckpt::Status ReadLarge(uint64_t offset, uint64_t n, void* out,
                           const PartFn& on_filled) const override {
      if (env_->fail) return ckpt::IOError("injected read failure");
      ++env_->large_reads;
      env_->read_bytes += n;
      for (uint64_t m = env_->largest.load(); n > m;)
        if (env_->largest.compare_exchange_weak(m, n)) break;
      return f_->ReadLarge(offset, n, out, on_filled);
    }
    ckpt::Status Scan(uint64_t offset, uint64_t n, const PartFn& consume) const override {
      if (env_->fail) return ckpt::IOError("injected read failure");
      ++env_->scans;
      env_->scanned += n;
      env_->read_bytes += n;
      return f_->Scan(offset, n, consume);
    }

   private:
    std::unique_ptr<ckpt::RandomAccessFile> f_;
    ReadWatchEnv* env_;
  };
};
// A DeepSpeed checkpoint at `root` written by the test generator with `args`; true on success.
bool MakeDeepSpeed(const std::string& root, const std::string& args) {
  return ckpt::testing::RunShell("/usr/bin/python3 " + std::string(CKPT_SOURCE_DIR) +
                                 "/tests/deepspeed/make_ds_checkpoint.py " + root + " " + args +
                                 " > /dev/null") == 0;
}

// Rewrites the .pt file at `path` with every record deflated (torch.save stores them as they
// are); true on success.
bool Deflate(const std::string& path) {
  return ckpt::testing::RunShell(
             "/usr/bin/python3 -c \"import sys, zipfile; p = sys.argv[1]; "
             "src = zipfile.ZipFile(p); items = [(i, src.read(i)) for i in src.infolist()]; "
             "src.close(); out = zipfile.ZipFile(p, 'w', zipfile.ZIP_DEFLATED); "
             "[out.writestr(i.filename, b) for i, b in items]; out.close()\" " +
             path) == 0;
}

// Where each record of the zip archive at `path` keeps its bytes, from Python's zipfile:
// (offset of its data, size, name), in the archive's order; `scratch` is a file to write.
std::vector<std::tuple<uint64_t, uint64_t, std::string>> RecordPlaces(const std::string& path,
                                                                      const std::string& scratch) {
  std::vector<std::tuple<uint64_t, uint64_t, std::string>> recs;
  REQUIRE(
      ckpt::testing::RunShell(
          "/usr/bin/python3 -c \"import struct, sys, zipfile; z = zipfile.ZipFile(sys.argv[1]); "
          "f = open(sys.argv[1], 'rb'); out = open(sys.argv[2], 'w')\n"
          "for i in z.infolist():\n"
          "    f.seek(i.header_offset); h = f.read(30); n, e = struct.unpack('<HH', h[26:30])\n"
          "    print(i.header_offset + 30 + n + e, i.file_size, i.filename, file=out)\" " +
          path + " " + scratch) == 0);
  std::ifstream in(scratch);
  uint64_t at = 0, size = 0;
  std::string name;
  while (in >> at >> size >> name) recs.emplace_back(at, size, name);
  return recs;
}

// Read during static initialisation: what the program had loaded at start.
const bool g_libzip_mapped_at_start = Mapped("libzip");

// The trainable 512 x 512 matrices of a DeepSpeed source made with --block-width 512, in table
// order, whole (one ZeRO partition holds them one after the other): a run export-fp32 reads as
// one piece. `total` gets their element count.
std::vector<ckpt::StateSource::ParamSlice> MatrixRun(ckpt::StateSource& src, int64_t* total) {
  std::vector<ckpt::StateSource::ParamSlice> slices;
  *total = 0;
  for (const auto& p : src.manifest().params) {
    if (p.frozen || !p.tied_to.empty() || p.numel < 512 * 512) continue;
    slices.push_back({p.name, 0, p.numel});
    *total += p.numel;
  }
  return slices;
}

// Each slice read on its own (ReadParamRange), one after the other.
std::vector<float> ReadEach(ckpt::StateSource& src,
                            const std::vector<ckpt::StateSource::ParamSlice>& slices) {
  std::vector<float> all;
  for (const auto& s : slices) {
    std::vector<float> one(static_cast<size_t>(s.end - s.begin));
    REQUIRE(src.ReadParamRange(s.param, ckpt::kMaster, s.begin, s.end, one.data()).ok());
    all.insert(all.end(), one.begin(), one.end());
  }
  return all;
}

}  // namespace

TEST_CASE("DeepSpeed fixtures: ckpt equals torch's recomputation; hostile files refused", "[io]") {
  ckpt::testing::ScratchDir dir("ds");
  const std::string cmd = "/usr/bin/python3 " + std::string(CKPT_SOURCE_DIR) +
                          "/tests/deepspeed/check_deepspeed.py " + ckpt::testing::BinDir() +
                          "/ckpt " + dir.path().string();
  REQUIRE(ckpt::testing::RunShell(cmd) == 0);
}

TEST_CASE("libzip is opened on first use, not loaded at start", "[io]") {
  // It needs libcrypto: loading both cost every ckpt command ~4 ms at start (issue 19).
  CHECK_FALSE(g_libzip_mapped_at_start);
  CHECK_FALSE(Mapped("libcrypto"));
  CHECK(ckpt::testing::RunShell("ldd " + ckpt::testing::BinDir() +
                                "/ckpt | grep -q -e libzip -e libcrypto") == 1);
  ckpt::testing::ScratchDir dir("dszip");
  REQUIRE(MakeDeepSpeed(dir / "ds", "--zero 2 --world 1 --dtype fp32"));
  auto r = ckpt::DeepSpeedReader::Open(dir / "ds");
  REQUIRE(r.ok());
  CHECK(r->info().optim_files.size() == 1);
  CHECK(Mapped("libzip"));
}

TEST_CASE("a name with a control character is never a DeepSpeed tag or file", "[io]") {
  // A root unpacked from an archive can hold any name. Until 2026-12-07 a `latest` naming a
  // directory with a terminal escape was followed (its path then in every message, raw), and
  // a file ending _model_states.pt with one refused the checkpoint, its name printed raw.
  ckpt::testing::ScratchDir dir("dsodd");
  const std::string ds = dir / "ds";
  REQUIRE(MakeDeepSpeed(ds, "--zero 2 --world 1 --dtype fp32"));
  const std::string odd = "global_step7\x1b]0;pwned\x07";
  std::filesystem::rename(dir / "ds/global_step7", std::filesystem::path(ds) / odd);
  {
    std::ofstream latest(ds + "/latest", std::ios::trunc);
    latest << odd;
  }
  CHECK(ckpt::DeepSpeedTagDir(ds, "").empty());
  auto r = ckpt::DeepSpeedReader::Open(ds);
  REQUIRE_FALSE(r.ok());
  INFO(r.status().ToString());
  CHECK(r.status().code() == ckpt::StatusCode::kDataLoss);
  CHECK(r.status().message().find("names 'global_step7\\x1b]0;pwned\\x07'") != std::string::npos);
  CHECK(r.status().message().find('\x1b') == std::string::npos);

  // The directory by its name (--tag, the user's own words) reads; a file in it whose name
  // holds an escape is passed over.
  std::filesystem::copy_file(std::filesystem::path(ds) / odd / "mp_rank_00_model_states.pt",
                             std::filesystem::path(ds) / odd / "\x1b[2J_model_states.pt");
  auto by_tag = ckpt::DeepSpeedReader::Open(ds, odd);
  INFO(by_tag.status().ToString());
  REQUIRE(by_tag.ok());
  CHECK_FALSE(by_tag->manifest().params.empty());
}

TEST_CASE("DeepSpeed files are read through the Env: storages with ReadLarge, links refused",
          "[io]") {
  // Parameters of 1024 x 1024 fp32 (4 MiB): each is one read of a flat partition's storage,
  // which goes to the Env's ReadLarge (past the page cache on a disk) rather than libzip's
  // own file reads.
  ckpt::testing::ScratchDir dir("dsenv");
  const std::string ds = dir / "ds";
  REQUIRE(MakeDeepSpeed(ds, "--zero 2 --world 1 --dtype fp32 --blocks 2 --block-width 1024"));
  auto plain = ckpt::DeepSpeedReader::Open(ds);
  REQUIRE(plain.ok());
  const ckpt::ParamEntry* big = nullptr;
  for (const auto& p : plain->manifest().params)
    if (!p.frozen && p.tied_to.empty() && p.numel >= (1 << 20)) big = &p;
  REQUIRE(big != nullptr);
  std::vector<float> want(static_cast<size_t>(big->numel)), got(want.size());
  REQUIRE(plain->ReadParamRange(big->name, ckpt::kMaster, 0, big->numel, want.data()).ok());

  ReadWatchEnv env;
  auto watched = ckpt::DeepSpeedReader::Open(ds, "", &env);
  REQUIRE(watched.ok());
  const uint64_t before = env.large_reads;
  REQUIRE(watched->ReadParamRange(big->name, ckpt::kMaster, 0, big->numel, got.data()).ok());
  CHECK(env.large_reads > before);
  CHECK(env.largest >= static_cast<uint64_t>(big->numel) * 4);
  CHECK(got == want);

  // A failed read is the Env's error (naming what failed), not a libzip message.
  env.fail = true;
  ckpt::Status s = watched->ReadParamRange(big->name, ckpt::kMaster, 0, big->numel, got.data());
  INFO(s.ToString());
  CHECK(s.code() == ckpt::StatusCode::kIOError);
  CHECK(s.message().find("injected read failure") != std::string::npos);
  CHECK(s.message().find(big->name) != std::string::npos);
  auto reopened = ckpt::DeepSpeedReader::Open(plain->dir(), "", &env);  // no `latest` read
  REQUIRE_FALSE(reopened.ok());
  INFO(reopened.status().ToString());
  CHECK(reopened.status().message().find("injected read failure") != std::string::npos);
  // Through the root, `latest` is the first read: its failure is what is reported (it was
  // "`latest` names a directory without a DeepSpeed model-states file").
  auto via_latest = ckpt::DeepSpeedReader::Open(ds, "", &env);
  REQUIRE_FALSE(via_latest.ok());
  INFO(via_latest.status().ToString());
  CHECK(via_latest.status().code() == ckpt::StatusCode::kIOError);
  CHECK(via_latest.status().message().find("injected read failure") != std::string::npos);
  env.fail = false;

  // A file inside the checkpoint that is a symbolic link (here to the real file) is refused:
  // nothing outside the checkpoint is read because a link points there.
  const std::filesystem::path tag = plain->dir();
  const std::string linked = dir / "linked";
  std::filesystem::create_directories(std::filesystem::path(linked) / tag.filename());
  for (const auto& e : std::filesystem::directory_iterator(tag))
    std::filesystem::create_symlink(
        e.path(), std::filesystem::path(linked) / tag.filename() / e.path().filename());
  auto refused = ckpt::DeepSpeedReader::Open(linked + "/" + tag.filename().string());
  REQUIRE_FALSE(refused.ok());
  CHECK(refused.status().code() == ckpt::StatusCode::kDataLoss);
  CHECK(refused.status().message().find("symbolic link") != std::string::npos);

  // A tag directory that is itself a link (`latest` or --tag naming it) is refused as ckpt's
  // own roots refuse one, unless links are allowed (until 2026-12-07 it was followed: every
  // file read from wherever the link pointed).
  const std::string root = dir / "linkedtag";
  std::filesystem::create_directories(root);
  std::filesystem::copy_file(std::filesystem::path(ds) / "latest",
                             std::filesystem::path(root) / "latest");
  std::filesystem::create_directory_symlink(tag, std::filesystem::path(root) / tag.filename());
  for (const std::string& t : {std::string(), tag.filename().string()}) {
    auto via_link = ckpt::DeepSpeedReader::Open(root, t);
    REQUIRE_FALSE(via_link.ok());
    INFO(via_link.status().ToString());
    CHECK(via_link.status().code() == ckpt::StatusCode::kDataLoss);
    CHECK(via_link.status().message().find("is a symbolic link") != std::string::npos);
  }
  ::setenv("CKPT_FOLLOW_SYMLINKS", "1", 1);
  auto allowed = ckpt::DeepSpeedReader::Open(root);
  ::unsetenv("CKPT_FOLLOW_SYMLINKS");
  INFO(allowed.status().ToString());
  CHECK(allowed.ok());
}

TEST_CASE("a DeepSpeed partition reads whole: stripped padding as zeros, a range outside refused",
          "[io]") {
  // DeepSpeedZeroOptimizer pads each group's partition and strips the padding when it saves:
  // the partition (the space shard_offset indexes) is longer than the saved tensor. Reading it
  // whole gave DataLoss ("a parameter needs element N", found by fuzz/fuzz_deepspeed.cc), and a
  // range past its end came back OK with the rest of the output never written.
  ckpt::testing::ScratchDir dir("dspad");
  const std::string ds = dir / "ds";
  REQUIRE(MakeDeepSpeed(ds, "--zero 2 --world 2 --dtype fp32 --hidden 8 --vocab 11"));
  auto r = ckpt::DeepSpeedReader::Open(ds);
  REQUIRE(r.ok());
  int64_t length = 0;
  for (int64_t g : r->info().group_partition) length += g;
  REQUIRE(r->manifest().partition.shard_numel.size() == 2);
  CHECK(r->manifest().partition.shard_numel[0] == length);
  int64_t padding = 0;
  for (int rank = 0; rank < 2; ++rank) {
    for (std::string_view state : {ckpt::kMaster, ckpt::kExpAvg, ckpt::kExpAvgSq}) {
      INFO("rank " << rank << " " << state);
      std::vector<float> whole(static_cast<size_t>(length), -1.0f);
      const ckpt::Status s = r->ReadPartition(rank, state, 0, length, whole.data());
      INFO(s.ToString());
      REQUIRE(s.ok());
      // Every parameter's elements where its range says; every other element is padding: 0.
      std::vector<bool> owned(whole.size(), false);
      for (const auto& p : r->manifest().params) {
        if (!p.trainable()) continue;
        std::vector<float> values(static_cast<size_t>(p.numel));
        REQUIRE(r->ReadParamRange(p.name, state, 0, p.numel, values.data()).ok());
        for (const auto& range : p.ranges) {
          if (range.rank != rank) continue;
          for (int64_t e = range.begin; e < range.end; ++e) {
            const size_t at = static_cast<size_t>(range.shard_offset + e - range.begin);
            CHECK(whole[at] == values[static_cast<size_t>(e)]);
            owned[at] = true;
          }
        }
      }
      for (size_t at = 0; at < whole.size(); ++at) {
        if (owned[at]) continue;
        CHECK(whole[at] == 0.0f);
        if (state == ckpt::kMaster) {
          ++padding;
          CHECK_FALSE(r->PartitionFileOffset(rank, state, static_cast<int64_t>(at)).has_value());
        }
      }
      for (auto [offset, count] : std::vector<std::pair<int64_t, int64_t>>{
               {0, length + 1}, {length, 1}, {-1, 2}, {3, -1}, {1, INT64_MAX}}) {
        const ckpt::Status out = r->ReadPartition(rank, state, offset, count, whole.data());
        INFO(out.ToString());
        CHECK(out.code() == ckpt::StatusCode::kInvalidArgument);
      }
    }
  }
  CHECK(padding > 0);  // the fixture has padding to read
}

TEST_CASE("ReadParamSlices reads a run of small DeepSpeed parameters with one request", "[io]") {
  // Blocks of 512 x 512 fp32 (1 MiB a matrix) in one ZeRO-2 partition: what export-fp32
  // reads as one piece. The run is one large read of the partition's storage, and its values
  // are each parameter's own.
  ckpt::testing::ScratchDir dir("dsrun");
  const std::string ds = dir / "ds";
  REQUIRE(MakeDeepSpeed(ds, "--zero 2 --world 1 --dtype fp32 --blocks 8 --block-width 512"));
  ReadWatchEnv env;
  ckpt::SourceOptions so;
  so.env = &env;
  auto src = ckpt::OpenStateSource(ds, so);
  REQUIRE(src.ok());
  int64_t total = 0;
  std::vector<ckpt::StateSource::ParamSlice> slices = MatrixRun(**src, &total);
  REQUIRE(slices.size() >= 8);
  // The first slice starts inside its parameter: a run need not start at a parameter's start.
  slices.front().begin = 100;
  total -= 100;
  std::vector<float> got(static_cast<size_t>(total));
  const uint64_t before = env.large_reads;
  env.largest = 0;
  REQUIRE((*src)->ReadParamSlices(slices, ckpt::kMaster, got.data()).ok());
  CHECK(env.large_reads - before <= 2);
  CHECK(env.largest >= static_cast<uint64_t>(total) * 4 / 2);
  CHECK(got == ReadEach(**src, slices));
  // A failure names the run's parameters.
  env.fail = true;
  ckpt::Status s = (*src)->ReadParamSlices(slices, ckpt::kMaster, got.data());
  env.fail = false;
  INFO(s.ToString());
  CHECK(s.code() == ckpt::StatusCode::kIOError);
  CHECK(s.message().find("parameters '" + std::string(slices.front().param) + "' to '") !=
        std::string::npos);
}

TEST_CASE("ReadShift places a DeepSpeed run where O_DIRECT reads it straight into the caller",
          "[io]") {
  // What export-fp32 does with each piece: ask where in a 4 KiB block the run's bytes start in
  // the optimizer file's zip record, read it to that place in 4 KiB-aligned memory.
  ckpt::testing::ScratchDir dir("dsshift");
  const std::string ds = dir / "ds";
  REQUIRE(MakeDeepSpeed(ds, "--zero 2 --world 1 --dtype fp32 --blocks 8 --block-width 512"));
  auto src = ckpt::OpenStateSource(ds);
  REQUIRE(src.ok());
  int64_t total = 0;
  std::vector<ckpt::StateSource::ParamSlice> slices = MatrixRun(**src, &total);
  REQUIRE(slices.size() >= 8);
  const std::vector<float> want = ReadEach(**src, slices);
  for (const int64_t begin : {int64_t{0}, int64_t{100}}) {
    INFO("the run starts at element " << begin << " of its first parameter");
    slices.front().begin = begin;
    const std::optional<uint64_t> shift =
        (*src)->ReadShift(slices.front().param, ckpt::kMaster, begin, slices.front().end);
    REQUIRE(shift.has_value());
    CHECK(*shift < ckpt::AlignedBuffer::kAlign);
    const size_t n = static_cast<size_t>(total - begin);
    ckpt::AlignedBuffer buf(n * 4 + ckpt::AlignedBuffer::kAlign);
    auto* at = reinterpret_cast<float*>(buf.data() + *shift);
    const ckpt::DirectReadStats before = ckpt::GetDirectReadStats();
    {
      ckpt::testing::DirectIoMode on("on");
      REQUIRE((*src)->ReadParamSlices(slices, ckpt::kMaster, at).ok());
    }
    const ckpt::DirectReadStats after = ckpt::GetDirectReadStats();
    CHECK(std::vector<float>(at, at + n) == std::vector<float>(want.begin() + begin, want.end()));
    if (after.refused == before.refused) {
      // All but the unaligned ends of the run came from the disk straight into `buf`: with
      // the place wrong, O_DIRECT reads go through bounce buffers (0 bytes here).
      CHECK(after.direct_into_caller_bytes - before.direct_into_caller_bytes + 8192 >= n * 4);
    } else {
      WARN("O_DIRECT refused on " << dir.str() << ": read through the page cache");
    }
  }
}

TEST_CASE("check CRCs every storage from where it lies, the files in parallel, and finds a flip",
          "[io]") {
  // ZeRO-2 over 2 ranks with 4 MiB parameters: each optimizer file holds MiBs of storage that
  // check reads with Scan (past the page cache) and CRCs itself, not through libzip.
  ckpt::testing::ScratchDir dir("dscrc");
  const std::string ds = dir / "ds";
  REQUIRE(MakeDeepSpeed(ds, "--zero 2 --world 2 --dtype fp32 --blocks 2 --block-width 1024"));
  ReadWatchEnv env;
  {
    auto r = ckpt::DeepSpeedReader::Open(ds, "", &env);
    REQUIRE(r.ok());
    auto problems = r->Check(/*progress=*/true);  // stderr is no TTY here: draws nothing
    REQUIRE(problems.ok());
    CHECK(problems->empty());
    uint64_t files = 0;
    for (const auto& e : std::filesystem::directory_iterator(r->dir()))
      if (e.path().extension() == ".pt") files += std::filesystem::file_size(e.path());
    // Nearly every byte of the files went through Scan: all but the archives' structure and
    // the records under 64 KiB (the pickles, the small tensors).
    CHECK(env.scanned > files * 9 / 10);
    CHECK(r->bytes_read() >= env.scanned);
  }
  // One bit of a master element in the middle of rank 1's partition, in place: still a valid
  // archive, still a valid float, but its record no longer matches the CRC-32.
  uint64_t at = 0;
  std::string optim;
  {
    auto r = ckpt::DeepSpeedReader::Open(ds);
    REQUIRE(r.ok());
    REQUIRE(r->info().optim_files.size() == 2);
    const std::optional<uint64_t> where = r->PartitionFileOffset(1, ckpt::kMaster, 300000);
    REQUIRE(where.has_value());
    at = *where;
    optim = r->dir() + "/" + r->info().optim_files[1];
  }
  REQUIRE(XorByteAt(optim, at, 0x10));
  auto r = ckpt::DeepSpeedReader::Open(ds, "", &env);
  REQUIRE(r.ok());  // the layout is intact: only the bytes changed
  auto problems = r->Check();
  REQUIRE(problems.ok());
  REQUIRE(problems->size() == 1);
  const ckpt::Problem& p = problems->front();
  INFO(p.what);
  CHECK(p.file == std::filesystem::path(optim).filename().string());
  CHECK(p.what.find("CRC error") != std::string::npos);
  CHECK(p.what.find(optim) != std::string::npos);
  CHECK(p.what.find("record ") != std::string::npos);
  // A failed read is reported as the read's error, naming the file.
  env.fail = true;
  auto failed = r->Check();
  env.fail = false;
  REQUIRE(failed.ok());
  REQUIRE_FALSE(failed->empty());
  CHECK(failed->front().what.find("injected read failure") != std::string::npos);
}

TEST_CASE("check reads every record once, neighbours in one range; a frozen base is not read again",
          "[io]") {
  // A LoRA-like fine-tune: 48 frozen 256 KiB weights in the model file beside one trainable
  // one. check used to Scan each record of 64 KiB or more on its own (one request each, in
  // name order), read the smaller ones through libzip, and then read every frozen parameter a
  // second time through the table.
  ckpt::testing::ScratchDir dir("dsonce");
  const std::string ds = dir / "ds";
  REQUIRE(MakeDeepSpeed(ds,
                        "--zero 2 --world 2 --dtype fp32 --blocks 1 --frozen-blocks 48 "
                        "--block-width 256"));
  ReadWatchEnv env;
  auto r = ckpt::DeepSpeedReader::Open(ds, "", &env);
  REQUIRE(r.ok());
  REQUIRE(r->info().model_files.size() == 1);
  const std::string model = r->dir() + "/" + r->info().model_files[0];
  uint64_t files = 0, pt = 0;
  for (const auto& e : std::filesystem::directory_iterator(r->dir()))
    if (e.path().extension() == ".pt") files += std::filesystem::file_size(e.path()), ++pt;
  REQUIRE(pt == 3);
  env.read_bytes = 0;
  env.scans = 0;
  env.scanned = 0;
  {
    auto problems = r->Check();
    REQUIRE(problems.ok());
    CHECK(problems->empty());
  }
  INFO("read " << env.read_bytes << " bytes of " << files << " in " << env.scans << " scans");
  CHECK(env.scanned > files * 9 / 10);          // nearly everything from where it lies
  CHECK(env.read_bytes < files + files / 100);  // and once: the frozen base is 12 MiB
  CHECK(env.scans <= 2 * pt);                   // one range per file, not one per record

  // Every frozen parameter's bytes into the caller's memory are ReadFrozenBytes' bytes.
  size_t frozen = 0;
  for (const auto& p : r->manifest().params) {
    if (!p.frozen || !p.tied_to.empty()) continue;
    auto whole = r->ReadFrozenBytes(p.name);
    REQUIRE(whole.ok());
    std::vector<uint8_t> into(whole->size(), 0xee);
    REQUIRE(r->ReadFrozenInto(p.name, into.data(), into.size()).ok());
    CHECK(into == *whole);
    CHECK(r->ReadFrozenInto(p.name, into.data(), into.size() + 1).code() ==
          ckpt::StatusCode::kInvalidArgument);
    ++frozen;
  }
  CHECK(frozen >= 48);

  // A flipped bit in a record with neighbours on both sides of its run is a CRC error naming
  // the model file and that record.
  std::vector<std::tuple<uint64_t, uint64_t, std::string>> recs =
      RecordPlaces(model, dir / "places.txt");
  std::sort(recs.begin(), recs.end());
  std::vector<size_t> big;  // the 256 KiB weights, in file order
  for (size_t i = 0; i < recs.size(); ++i)
    if (std::get<1>(recs[i]) == 256u * 256 * 4) big.push_back(i);
  REQUIRE(big.size() == 49);
  const auto& [at, size, name] = recs[big[big.size() / 2]];
  REQUIRE(XorByteAt(model, at + size / 3, 0x04));
  auto again = ckpt::DeepSpeedReader::Open(ds, "", &env);
  REQUIRE(again.ok());
  auto problems = again->Check();
  REQUIRE(problems.ok());
  REQUIRE(problems->size() == 1);
  const ckpt::Problem& p = problems->front();
  INFO(p.what);
  CHECK(p.file == std::filesystem::path(model).filename().string());
  CHECK(p.what.find("CRC error") != std::string::npos);
  CHECK(p.what.find(name) != std::string::npos);
}

// Numbers every read of the files it opens in one sequence; the model file's small reads (its
// open) take 2 ms each, as a cold file's scattered reads do on a disk.
class OrderEnv final : public ckpt::testing::WrappedFileEnv {
 public:
  OrderEnv()
      : WrappedFileEnv([this](std::unique_ptr<ckpt::RandomAccessFile> f, const std::string& path) {
          return std::make_unique<File>(std::move(f), this, path);
        }) {}
  struct Seen {
    uint64_t pickle = 0;      // the sequence number of the read of its pickle (its open's last)
    uint64_t first_scan = 0;  // of its first Scan; 0: none
    uint64_t scanned = 0;
  };
  std::mutex mu;
  uint64_t seq = 0;
  std::map<std::string, Seen> files;          // by file name
  std::map<std::string, uint64_t> pickle_at;  // where each file's data.pkl bytes begin

 private:
  class File final : public ckpt::RandomAccessFile {
   public:
    File(std::unique_ptr<ckpt::RandomAccessFile> f, OrderEnv* env, const std::string& path)
        : f_(std::move(f)), env_(env), name_(std::filesystem::path(path).filename().string()) {}
    ckpt::Status Read(uint64_t offset, size_t n, void* out) const override {
      if (name_.find("model_states") != std::string::npos)
        std::this_thread::sleep_for(std::chrono::milliseconds(2));
      {
        std::lock_guard<std::mutex> lock(env_->mu);
        Seen& s = env_->files[name_];
        ++env_->seq;
        if (auto it = env_->pickle_at.find(name_);
            it != env_->pickle_at.end() && it->second == offset &&
            s.pickle == 0)  // check reads its first byte again later
          s.pickle = env_->seq;
      }
      return f_->Read(offset, n, out);
    }
    uint64_t size() const override { return f_->size(); }
    ckpt::Status Scan(uint64_t offset, uint64_t n, const PartFn& consume) const override {
      {
        std::lock_guard<std::mutex> lock(env_->mu);
        Seen& s = env_->files[name_];
        if (s.first_scan == 0) s.first_scan = ++env_->seq;
        s.scanned += n;
      }
      return f_->Scan(offset, n, consume);
    }

   private:
    std::unique_ptr<ckpt::RandomAccessFile> f_;
    OrderEnv* env_;
    std::string name_;
  };
};

TEST_CASE("ckpt check reads each DeepSpeed file as soon as it is open, every byte once", "[io]") {
  // A LoRA-like checkpoint: the model file holds a frozen base of 64 records, so its open (a
  // local header per record) is the longest. check read no file until every file was open and
  // the parameter table built; now each file's records are read by the thread that opened it.
  ckpt::testing::ScratchDir dir("dsopen");
  const std::string ds = dir / "ds";
  REQUIRE(MakeDeepSpeed(ds,
                        "--zero 2 --world 2 --dtype fp32 --blocks 1 --frozen-blocks 64 "
                        "--block-width 256"));
  uint64_t files = 0;
  std::string model, optim1;
  {
    auto r = ckpt::DeepSpeedReader::Open(ds);
    REQUIRE(r.ok());
    REQUIRE(r->info().optim_files.size() == 2);
    model = r->info().model_files.at(0);
    optim1 = r->info().optim_files[1];
    for (const auto& e : std::filesystem::directory_iterator(r->dir()))
      if (e.path().extension() == ".pt") files += std::filesystem::file_size(e.path());
  }
  OrderEnv env;
  // Where the model file's pickle lies: its read ends the file's open.
  for (const auto& [at, size, name] :
       RecordPlaces(std::filesystem::path(ds) / "global_step7" / model, dir / "places.txt"))
    if (name.size() >= 9 && name.compare(name.size() - 9, 9, "/data.pkl") == 0)
      env.pickle_at[model] = at;
  REQUIRE(env.pickle_at[model] > 0);
  auto c = ckpt::CheckSource(ds, "", /*deep=*/false, &env, /*progress=*/false);
  REQUIRE(c.ok());
  CHECK(c->kind == ckpt::SourceKind::kDeepSpeed);
  CHECK(c->problems.empty());
  REQUIRE(env.files.count(model));
  const OrderEnv::Seen& m = env.files[model];
  REQUIRE(m.pickle > 0);
  uint64_t scanned = 0;
  for (const auto& [name, seen] : env.files) {
    if (std::filesystem::path(name).extension() != ".pt") continue;  // `latest`
    INFO(name << ": first scan " << seen.first_scan << "; the model file's pickle read "
              << m.pickle);
    CHECK(seen.first_scan > 0);
    scanned += seen.scanned;
    // An optimizer file is being read while the model file is still being opened.
    if (name != model) CHECK(seen.first_scan < m.pickle);
  }
  CHECK(scanned > files * 9 / 10);  // nearly every byte from where it lies, once
  CHECK(scanned <= files);

  // What that read finds is what check reports: a flipped bit in rank 1's master, by name.
  uint64_t at = 0;
  {
    auto r = ckpt::DeepSpeedReader::Open(ds);
    REQUIRE(r.ok());
    const std::optional<uint64_t> place = r->PartitionFileOffset(1, ckpt::kMaster, 1000);
    REQUIRE(place.has_value());
    at = *place;
  }
  REQUIRE(XorByteAt(std::filesystem::path(c->dir) / optim1, at, 0x10));
  auto bad = ckpt::CheckSource(ds, "", false, nullptr, false);
  REQUIRE(bad.ok());
  REQUIRE(bad->problems.size() == 1);
  INFO(bad->problems[0].what);
  CHECK(bad->problems[0].file == optim1);
  CHECK(bad->problems[0].what.find("CRC error") != std::string::npos);
}

TEST_CASE("a DeepSpeed source CRCs the records it reads as they pass and refuses a flip", "[io]") {
  ckpt::testing::ScratchDir dir("dsstream");
  const std::string ds = dir / "ds";
  REQUIRE(MakeDeepSpeed(ds, "--zero 2 --world 2 --dtype fp32 --blocks 2 --block-width 1024"));
  ReadWatchEnv env;
  auto open = [&](bool stream, bool defer) {
    ckpt::SourceOptions so;
    so.env = &env;
    so.stream_verify = stream;
    so.defer_stream_hashes = defer;
    auto src = ckpt::OpenStateSource(ds, so);
    REQUIRE(src.ok());
    REQUIRE((*src)->kind() == ckpt::SourceKind::kDeepSpeed);
    return std::move(*src);
  };
  std::vector<std::pair<std::string, int64_t>> trainable;  // name, elements
  int64_t elements = 0;
  {
    auto src = open(false, false);
    for (const auto& p : src->manifest().params) {
      if (p.frozen || !p.tied_to.empty()) continue;
      trainable.emplace_back(p.name, p.numel);
      elements += p.numel;
    }
  }
  REQUIRE(elements > (int64_t{1} << 21));
  // Every master in table order (export-fp32's order: each rank's partition front to back),
  // then Verify, streaming; or in reverse order, each record then read whole by Verify.
  auto read_all = [&](ckpt::StateSource& src, bool reverse) {
    auto order = trainable;
    if (reverse) std::reverse(order.begin(), order.end());
    for (const auto& [name, numel] : order) {
      std::vector<float> v(static_cast<size_t>(numel));
      const ckpt::Status read = src.ReadParamRange(name, ckpt::kMaster, 0, numel, v.data());
      INFO(read.message());
      REQUIRE(read.ok());
      src.HashReadBytes();  // before `v` goes (SourceOptions::defer_stream_hashes)
    }
    return src.FinishVerification({std::string(ckpt::kMaster)});
  };
  for (bool defer : {false, true}) {
    INFO("defer " << defer);
    env.scanned = 0;
    auto src = open(true, defer);
    CHECK(read_all(*src, false).ok());
    // Each byte read once: the reads themselves, the few bytes between and after them, no
    // record read again whole.
    CHECK(env.scanned == 0);
    CHECK(src->bytes_read() < static_cast<uint64_t>(elements) * 4 * 11 / 10);
    auto reversed = open(true, defer);
    CHECK(read_all(*reversed, true).ok());
    CHECK(env.scanned > 0);
  }
  // One bit of a master element in the middle of rank 1's partition, and one of an exp_avg
  // element of rank 0's.
  std::string optim1, optim0;
  uint64_t master_at = 0, moment_at = 0;
  {
    auto r = ckpt::DeepSpeedReader::Open(ds);
    REQUIRE(r.ok());
    const std::optional<uint64_t> m = r->PartitionFileOffset(1, ckpt::kMaster, 300000);
    const std::optional<uint64_t> e = r->PartitionFileOffset(0, ckpt::kExpAvg, 1000);
    REQUIRE(m.has_value());
    REQUIRE(e.has_value());
    master_at = *m;
    moment_at = *e;
    optim1 = r->dir() + "/" + r->info().optim_files[1];
    optim0 = r->dir() + "/" + r->info().optim_files[0];
  }
  REQUIRE(XorByteAt(optim1, master_at, 0x10));
  for (bool reverse : {false, true}) {
    for (bool defer : {false, true}) {
      INFO("reverse " << reverse << ", defer " << defer);
      auto src = open(true, defer);
      const ckpt::Status s = read_all(*src, reverse);
      INFO(s.message());
      CHECK(s.code() == ckpt::StatusCode::kDataLoss);
      CHECK(s.message().find(optim1) != std::string::npos);
      CHECK(s.message().find("the bytes give") != std::string::npos);
    }
  }
  REQUIRE(XorByteAt(optim1, master_at, 0x10));  // mended
  REQUIRE(XorByteAt(optim0, moment_at, 0x10));
  {
    auto src = open(true, true);
    CHECK(read_all(*src, false).ok());  // the masters are intact
  }
  // verify_reads (LoadResharded): the first read from a record checks it whole.
  {
    ckpt::SourceOptions so;
    so.env = &env;
    so.verify_reads = true;
    auto src = ckpt::OpenStateSource(ds, so);
    REQUIRE(src.ok());
    std::vector<float> v(static_cast<size_t>(trainable.front().second));
    CHECK((*src)->ReadParamRange(trainable.front().first, ckpt::kMaster, 0, 1, v.data()).ok());
    CHECK((*src)->ReadParamRange(trainable.front().first, ckpt::kExpAvgSq, 0, 1, v.data()).ok());
    // Rank 0's exp_avg holds the flip; every parameter has a range on rank 0 or 1.
    bool refused = false;
    for (const auto& [name, numel] : trainable) {
      v.resize(static_cast<size_t>(numel));
      const ckpt::Status s = (*src)->ReadParamRange(name, ckpt::kExpAvg, 0, numel, v.data());
      if (s.ok()) continue;
      INFO(s.message());
      CHECK(s.message().find(optim0) != std::string::npos);
      CHECK(s.message().find("CRC error") != std::string::npos);
      refused = true;
      break;
    }
    CHECK(refused);
  }
  // A source opened without either reads every record of the states whole in Verify
  // (reshard's and next-update's pass before they use the state).
  auto src = open(false, false);
  CHECK(src->FinishVerification({std::string(ckpt::kMaster)}).ok());
  const ckpt::Status s = src->FinishVerification(
      {std::string(ckpt::kMaster), std::string(ckpt::kExpAvg), std::string(ckpt::kExpAvgSq)});
  INFO(s.message());
  CHECK(s.code() == ckpt::StatusCode::kDataLoss);
  CHECK(s.message().find(optim0) != std::string::npos);
  CHECK(s.message().find("CRC error") != std::string::npos);
}

TEST_CASE("opening a .pt file hints every record's local header before libzip reads them", "[io]") {
  // ZeRO-2 bf16 with 48 more small parameters: the model-states file holds one record per
  // parameter, whose local headers libzip reads one after the other (ZIP_CHECKCONS).
  ckpt::testing::ScratchDir dir("dshint");
  const std::string ds = dir / "ds";
  REQUIRE(MakeDeepSpeed(ds, "--zero 2 --world 1 --dtype bf16 --blocks 48 --block-width 64"));
  ReadWatchEnv env;
  auto r = ckpt::DeepSpeedReader::Open(ds, "", &env);
  REQUIRE(r.ok());
  size_t stored = 0;  // parameters with a storage record of their own in the model file
  for (const auto& p : r->manifest().params) stored += p.tied_to.empty();
  REQUIRE(stored >= 48);
  std::lock_guard<std::mutex> lock(env.mu);
  // A hint per record, and each local header read inside one.
  CHECK(env.hints.size() >= stored);
  CHECK(env.hinted_reads.size() >= stored);
  for (const auto& [at, len] : env.hints) CHECK((len > 0 && len <= 512));
}

TEST_CASE("a DeepSpeed source reads and checks a compressed record whole", "[io]") {
  // torch.save stores every record as it is; a file rewritten with deflated records still
  // reads, each such record checked whole by Verify rather than decompressed again from its
  // start for every gap.
  ckpt::testing::ScratchDir dir("dsdeflate");
  const std::string ds = dir / "ds";
  REQUIRE(MakeDeepSpeed(ds, "--zero 2 --world 2 --dtype fp32 --blocks 2 --block-width 256"));
  std::vector<std::pair<std::string, std::vector<float>>> want;
  std::string optim0;
  {
    auto src = ckpt::OpenStateSource(ds, {});
    REQUIRE(src.ok());
    for (const auto& p : (*src)->manifest().params) {
      if (p.frozen || !p.tied_to.empty()) continue;
      std::vector<float> v(static_cast<size_t>(p.numel));
      REQUIRE((*src)->ReadParamRange(p.name, ckpt::kMaster, 0, p.numel, v.data()).ok());
      want.emplace_back(p.name, std::move(v));
    }
    optim0 = (*src)->dir() + "/" + (*src)->deepspeed()->optim_files[0];
  }
  REQUIRE(Deflate(optim0));
  for (bool defer : {false, true}) {
    ckpt::SourceOptions so;
    so.stream_verify = true;
    so.defer_stream_hashes = defer;
    auto src = ckpt::OpenStateSource(ds, so);
    REQUIRE(src.ok());
    for (const auto& [name, values] : want) {
      std::vector<float> got(values.size());
      REQUIRE(
          (*src)
              ->ReadParamRange(name, ckpt::kMaster, 0, static_cast<int64_t>(got.size()), got.data())
              .ok());
      (*src)->HashReadBytes();
      CHECK(got == values);
    }
    const ckpt::Status s = (*src)->FinishVerification({std::string(ckpt::kMaster)});
    INFO(s.message());
    CHECK(s.ok());
    // Rank 0's masters (about half of them) were read again, whole, through libzip.
    uint64_t masters = 0;
    for (const auto& [name, values] : want) masters += values.size() * 4;
    CHECK((*src)->bytes_read() > masters * 5 / 4);
  }
}

TEST_CASE("to-universal reads each state once, in table order, while it writes", "[io]") {
  // universal.h5 is written as a rank file is (ckpt::WriteUniversalFile): the structure first,
  // then each dataset's bytes asked for (fill) in the order its region lies in the file, the
  // next window read while one is written. The regions must lie in the order the datasets
  // were created (table order, the order the optimizer files store the states): with 4 KiB
  // alignment, HDF5 put small datasets created later (the biases) into the gaps before large
  // ones, the source's reads came out of order, and two of the three flat records were read
  // a second time to verify them (1.12 GB read for a 0.92 GB checkpoint).
  ckpt::testing::ScratchDir dir("dsuniv");
  const std::string ds = dir / "ds";
  REQUIRE(MakeDeepSpeed(ds, "--zero 2 --world 2 --dtype bf16 --blocks 4 --block-width 512"));
  uint64_t optim_bytes = 0, frozen_bytes = 0;
  ckpt::Manifest m;
  {
    auto src = ckpt::OpenStateSource(ds, {});
    REQUIRE(src.ok());
    m = (*src)->manifest();
    for (const auto& f : (*src)->deepspeed()->optim_files)
      optim_bytes += std::filesystem::file_size((*src)->dir() + "/" + f);
  }
  int small = 0;
  for (const auto& p : m.params) {
    if (p.frozen && p.tied_to.empty()) frozen_bytes += p.numel * ckpt::DTypeSize(p.dtype);
    if (!p.frozen && p.numel * 4 < 4096) ++small;
  }
  REQUIRE(small >= 2);  // the case that went wrong: small states beside 1 MiB ones
  ckpt::convert::ToUniversalOptions opts;
  opts.progress = false;
  const ckpt::DirectReadStats before = ckpt::GetDirectReadStats();
  auto report = [&] {
    ckpt::testing::DirectIoMode on("on");
    return ckpt::convert::ConvertToUniversal(ds, dir / "u", opts);
  }();
  const ckpt::DirectReadStats after = ckpt::GetDirectReadStats();
  INFO((report.ok() ? std::string() : report.status().message()));
  REQUIRE(report.ok());
  // The 1 MiB states (three of each of four 512 x 512 weights) are read from the disk straight
  // into the writer's windows, each placed where its bytes lie in the optimizer file
  // (DatasetSpec::fill_place): all of them but those of a weight that the two ranks'
  // partitions split (read in two parts, one from each file).
  if (after.refused == before.refused) {
    CHECK(after.direct_into_caller_bytes - before.direct_into_caller_bytes >=
          3 * 3 * (1u << 20) - 3 * 3 * 2 * 4096);
  } else {
    WARN("O_DIRECT refused on " << dir.str() << ": read through the page cache");
  }
  INFO("read " << report->bytes_read << " bytes; the optimizer files hold " << optim_bytes
               << ", the frozen parameters " << frozen_bytes);
  CHECK(report->bytes_read <= optim_bytes + frozen_bytes);
  // Every dataset's region after the one created before it.
  auto u = ckpt::UniversalReader::Open(dir / "u");
  REQUIRE(u.ok());
  const auto& datasets = u->manifest().files.at(0).datasets;
  REQUIRE(datasets.size() > 10);
  ckpt::h5::Init();
  const std::string path = dir / "u/universal.h5";
  const hid_t f = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  REQUIRE(f >= 0);
  haddr_t last = 0;
  size_t in_order = 0;
  for (const auto& d : datasets) {
    if (d.bytes == 0) continue;
    const hid_t h = H5Dopen2(f, d.name.c_str(), H5P_DEFAULT);
    REQUIRE(h >= 0);
    const haddr_t at = H5Dget_offset(h);
    H5Dclose(h);
    INFO(d.name << " at " << at << ", the one before at " << last);
    CHECK(at > last);
    if (at > last) ++in_order;
    last = at;
  }
  H5Fclose(f);
  CHECK(in_order > 10);
  // And the content: the universal copy holds what the DeepSpeed checkpoint holds.
  auto src = ckpt::OpenStateSource(ds, {});
  REQUIRE(src.ok());
  for (const auto& p : m.params) {
    if (p.frozen || !p.tied_to.empty()) continue;
    for (std::string_view state : {ckpt::kMaster, ckpt::kExpAvg, ckpt::kExpAvgSq}) {
      std::vector<float> want(static_cast<size_t>(p.numel)), got(want.size());
      REQUIRE((*src)->ReadParamRange(p.name, state, 0, p.numel, want.data()).ok());
      REQUIRE(u->ReadParamRange(p.name, state, 0, p.numel, got.data()).ok());
      CHECK(got == want);
    }
  }
}

TEST_CASE("export of a frozen base: tensors through the slots and whole, in every dtype", "[io]") {
  // export-fp32 reads a frozen tensor of less than 8 MiB of output whose stored and converted
  // bytes fit an 8 MiB slot like a trainable piece, on the helper thread while the one before is
  // written, and any other whole on its own (from 8 MiB of output placed for an in-place write).
  // Per checkpoint and output dtype, with the slot's 8 MiB against stored + converted:
  //   1024^2 bf16 (2 MiB):   fp32 4 MiB, bf16 kept, fp16 -> slot (fp32: converted into the
  //                          slot's front from its stored copy behind, in 64 Ki-element blocks);
  //   2048^2 bf16 (8 MiB):   fp32 16 MiB -> whole, in place; bf16 kept 8 MiB -> whole,
  //                          in place; fp16 8 MiB -> whole, in place;
  //   1280^2 fp32 (6.25 MiB): fp32 kept -> slot; bf16, fp16 3.1 MiB (+ 6.25 stored) -> whole.
  // Every exported tensor must be the source's bytes in the output dtype.
  ckpt::testing::ScratchDir dir("dsfrozen");
  const std::pair<const char*, const char*> sources[] = {
      {"b1024", "--dtype bf16 --frozen-blocks 2 --block-width 1024"},
      {"b2048", "--dtype bf16 --frozen-blocks 1 --block-width 2048"},
      {"f1280", "--dtype fp32 --frozen-blocks 1 --block-width 1280"},
  };
  size_t checked_frozen = 0;
  for (const auto& [name, args] : sources) {
    const std::string ds = dir / name;
    REQUIRE(MakeDeepSpeed(ds, std::string("--zero 2 --world 2 --blocks 1 ") + args));
    auto r = ckpt::DeepSpeedReader::Open(ds);
    REQUIRE(r.ok());
    auto src = ckpt::OpenStateSource(ds, {});
    REQUIRE(src.ok());
    for (ckpt::DType dtype : {ckpt::DType::kF32, ckpt::DType::kBF16, ckpt::DType::kF16}) {
      INFO(name << " exported as " << ckpt::DTypeName(dtype));
      ckpt::convert::ExportOptions opts;
      opts.dtype = dtype;
      const std::string out = dir / (std::string(name) + "_" + std::string(ckpt::DTypeName(dtype)));
      const ckpt::DirectReadStats read_before = ckpt::GetDirectReadStats();
      const ckpt::DirectWriteStats write_before = ckpt::GetDirectWriteStats();
      auto rep = [&] {
        ckpt::testing::DirectIoMode on("on");
        return ckpt::convert::ExportFp32(ds, out, opts);
      }();
      INFO((rep.ok() ? std::string() : rep.status().message()));
      REQUIRE(rep.ok());
      const ckpt::DirectReadStats read_after = ckpt::GetDirectReadStats();
      const ckpt::DirectWriteStats write_after = ckpt::GetDirectWriteStats();
      if (std::string_view(name) == "b1024" && dtype == ckpt::DType::kF32) {
        // The two 2 MiB bf16 tensors, converted in their slots: each read from the disk
        // straight into its slot (stored at its record's place within a 4 KiB block) and
        // written from there (converted at its output's place), all but the unaligned ends.
        if (read_after.refused == read_before.refused &&
            write_after.refused == write_before.refused) {
          CHECK(read_after.direct_into_caller_bytes - read_before.direct_into_caller_bytes +
                    2 * 8192 >=
                2 * (2u << 20));
          CHECK(write_after.in_place_bytes - write_before.in_place_bytes + 2 * 8192 >=
                2 * (4u << 20));
        } else {
          WARN("O_DIRECT refused on " << dir.str() << ": read and written through the page cache");
        }
      }
      const std::string path = out + "/model.safetensors";
      auto h = ckpt::safetensors::ReadSafetensorsHeader(path);
      REQUIRE(h.ok());
      const size_t os = ckpt::DTypeSize(dtype);
      for (const auto& p : r->manifest().params) {
        if (!p.tied_to.empty()) continue;
        INFO(p.name);
        const ckpt::safetensors::SafetensorsTensor* t = h->Find(p.name);
        REQUIRE(t != nullptr);
        auto got = ckpt::safetensors::ReadSafetensorsTensor(path, *h, p.name);
        REQUIRE(got.ok());
        std::vector<float> f32(static_cast<size_t>(p.numel));
        if (p.frozen) {
          auto raw = r->ReadFrozenBytes(p.name);
          REQUIRE(raw.ok());
          REQUIRE(ckpt::FloatsToF32(p.dtype, raw->data(), f32.size(), f32.data()));
          if (p.numel >= 1024 * 1024) ++checked_frozen;
        } else {
          REQUIRE((*src)->ReadParamRange(p.name, ckpt::kMaster, 0, p.numel, f32.data()).ok());
        }
        std::vector<uint8_t> want(f32.size() * os);
        REQUIRE(ckpt::F32ToFloats(dtype, f32.data(), f32.size(), want.data()));
        CHECK(t->dtype == dtype);
        REQUIRE(got->size() == want.size());
        // The first byte that differs, if any (not the vectors: megabytes to print).
        const auto diff = std::mismatch(got->begin(), got->end(), want.begin());
        CHECK(diff.first - got->begin() == static_cast<std::ptrdiff_t>(got->size()));
      }
    }
  }
  CHECK(checked_frozen == 3 * (2 + 1 + 1));  // every large frozen tensor in every dtype
}

TEST_CASE("compressed records read in pieces front to back are decompressed once", "[io]") {
  // Export reads a partition's masters piece after piece, to-universal the three states of
  // each piece side by side. A deflated record cannot seek: each piece read from the record's
  // start made such a read quadratic (to-universal of a 0.9 GB checkpoint: over 120 s).
  ckpt::testing::ScratchDir dir("dspieces");
  const std::string ds = dir / "ds";
  REQUIRE(MakeDeepSpeed(ds, "--zero 2 --world 1 --dtype fp32 --blocks 2 --block-width 256"));
  const std::string_view states[] = {ckpt::kMaster, ckpt::kExpAvg, ckpt::kExpAvgSq};
  // Every trainable parameter's states, in table order, each in `pieces` pieces (the three
  // states of a piece one after the other), by parameter and state.
  auto read_all = [&](ckpt::StateSource& src, int64_t pieces) {
    std::map<std::pair<std::string, std::string_view>, std::vector<float>> out;
    for (const auto& p : src.manifest().params) {
      if (p.frozen || !p.tied_to.empty()) continue;
      for (int64_t k = 0; k < pieces; ++k) {
        const int64_t b = p.numel * k / pieces, e = p.numel * (k + 1) / pieces;
        for (std::string_view state : states) {
          std::vector<float> v(static_cast<size_t>(e - b));
          REQUIRE(src.ReadParamRange(p.name, state, b, e, v.data()).ok());
          auto& all = out[{p.name, state}];
          all.insert(all.end(), v.begin(), v.end());
        }
      }
    }
    return out;
  };
  std::map<std::pair<std::string, std::string_view>, std::vector<float>> want;
  std::string optim;
  {
    auto src = ckpt::OpenStateSource(ds, {});
    REQUIRE(src.ok());
    want = read_all(**src, 1);
    optim = (*src)->dir() + "/" + (*src)->deepspeed()->optim_files[0];
  }
  REQUIRE(Deflate(optim));
  const uint64_t file_bytes = std::filesystem::file_size(optim);
  // The bytes read from the files to read every state whole, and in 8 or 16 pieces each.
  std::map<int64_t, uint64_t> read;
  for (int64_t pieces : {1, 8, 16}) {
    ReadWatchEnv env;
    ckpt::SourceOptions so;
    so.env = &env;
    auto src = ckpt::OpenStateSource(ds, so);
    REQUIRE(src.ok());
    const uint64_t before = env.read_bytes;
    CHECK(read_all(**src, pieces) == want);
    read[pieces] = env.read_bytes - before;
  }
  INFO("read whole " << read[1] << ", in 8 pieces " << read[8] << ", in 16 " << read[16]
                     << " bytes; the optimizer file has " << file_bytes);
  // Each record's compressed bytes once, however many pieces it is read in, the two parameter
  // groups' six records side by side (with four records kept open, two of them were read
  // again from their start). From each record's start for every piece, whole reads took 4.5
  // times the file, 8 pieces 32 times.
  for (int64_t pieces : {1, 8, 16}) {
    INFO(pieces << " piece(s)");
    CHECK(read[pieces] < file_bytes * 11 / 10);
  }
}
