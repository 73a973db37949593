// The three sources behind ckpt::StateSource (ckpt/state_source.h) and the one place that
// decides what a path is.
#include "ckpt/state_source.h"

#include <algorithm>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <new>
#include <optional>
#include <set>

#include "ckpt/aligned_buffer.h"
#include "ckpt/deepspeed.h"
#include "ckpt/h5.h"
#include "ckpt/hash.h"
#include "ckpt/json.h"
#include "ckpt/reader.h"
#include "ckpt/root.h"
#include "ckpt/run_ahead.h"
#include "ckpt/shape.h"
#include "ckpt/universal.h"

namespace ckpt {
namespace {

constexpr int64_t kGapChunk = 1 << 20;  // elements per read of padding / tails

struct HashStream {
  Xxh3Stream hash;
  int64_t cursor = 0;
  bool broken = false;  // a read arrived out of order: verify by a full pass instead
};

Status CheckDigest(const std::string& label, const DatasetRecord& rec, const Xxh3Stream& h) {
  if (rec.xxh3.empty()) return Status::Ok();
  const std::string got = h.HexDigest();
  if (got != rec.xxh3)
    return DataLoss(label + ": dataset /" + rec.name + ": checksum mismatch (manifest " + rec.xxh3 +
                    ", data " + got + ")");
  return Status::Ok();
}

// The parameter whose values `name` reads (a tied alias: its owner), with the checks every
// source applies to a range request.
Result<const ParamEntry*> Resolve(const Manifest& m, const std::string& dir,
                                  std::string_view name, std::string_view state, int64_t begin,
                                  int64_t end) {
  const ParamEntry* p = m.FindParam(name);
  if (!p) return NotFound(dir + ": no parameter '" + std::string(name) + "'");
  if (!p->tied_to.empty()) {
    p = m.FindParam(p->tied_to);
    if (!p)
      return DataLoss(dir + ": parameter '" + std::string(name) + "' is tied to a missing one");
  }
  if (state != kMaster && state != kExpAvg && state != kExpAvgSq)
    return InvalidArgument("unknown state '" + std::string(state) + "'");
  if (p->frozen && state != kMaster)
    return InvalidArgument("frozen parameter '" + p->name + "' has no " + std::string(state));
  if (begin < 0 || end > p->numel || begin > end)
    return InvalidArgument("parameter '" + p->name + "': range [" + std::to_string(begin) + ", " +
                           std::to_string(end) + ") outside [0, " + std::to_string(p->numel) +
                           ")");
  return p;
}

// The source rank's range that holds all of a trainable parameter's elements [begin, end);
// nullptr when none does (they are spread over ranks, or the parameter is frozen).
const PartitionRange* HoldingRange(const ParamEntry& p, int64_t begin, int64_t end) {
  if (p.frozen) return nullptr;
  for (const auto& r : p.ranges)
    if (r.begin <= begin && end <= r.end) return &r;
  return nullptr;
}

// ReadShift for a source whose trainable parameters live in per-rank partitions: the rank range
// that holds all of [begin, end), then where its partition element lies in the rank's file
// (file_offset(rank, offset); nullopt: not known or not plain bytes), within a 4 KiB block.
// nullopt too where that place is not a float's alignment (a hostile archive's record at an odd
// offset): the caller reads floats there.
std::optional<uint64_t> PartitionShift(
    const StateSource& src, std::string_view param, std::string_view state, int64_t begin,
    int64_t end,
    const std::function<std::optional<uint64_t>(int rank, int64_t offset)>& file_offset) {
  auto p = Resolve(src.manifest(), src.dir(), param, state, begin, end);
  const PartitionRange* r = p.ok() ? HoldingRange(**p, begin, end) : nullptr;
  if (!r) return std::nullopt;
  const std::optional<uint64_t> at = file_offset(r->rank, r->shard_offset + (begin - r->begin));
  if (!at || *at % alignof(float) != 0) return std::nullopt;
  return *at % AlignedBuffer::kAlign;
}

// ReadParamSlices for a source whose trainable parameters live in per-rank partitions: runs of
// slices stored one after the other in one rank's partition are read by one call of
// read_run(rank, offset, count, out); any other slice (spread over ranks, frozen) by
// StateSource::ReadParamRange.
using ReadRunFn = std::function<Status(int rank, int64_t offset, int64_t count, float* out)>;
Status ReadRuns(StateSource& src, const std::vector<StateSource::ParamSlice>& slices,
                std::string_view state, float* out, const ReadRunFn& read_run) {
  struct Run {
    int rank = -1;
    int64_t offset = 0, count = 0;
    float* out = nullptr;
    size_t first = 0, last = 0;  // the slices it holds
  } run;
  auto flush = [&]() -> Status {
    if (run.count == 0) return Status::Ok();
    const std::string a(slices[run.first].param);
    Status s = read_run(run.rank, run.offset, run.count, run.out);
    run.count = 0;
    if (run.first == run.last) return s.WithContext("parameter '" + a + "'");
    return s.WithContext("parameters '" + a + "' to '" + std::string(slices[run.last].param) + "'");
  };
  for (size_t k = 0; k < slices.size(); ++k) {
    const auto& sl = slices[k];
    CKPT_ASSIGN_OR_RETURN(const ParamEntry* p,
                          Resolve(src.manifest(), src.dir(), sl.param, state, sl.begin, sl.end),
                          "");
    const int64_t n = sl.end - sl.begin;
    const PartitionRange* holder = HoldingRange(*p, sl.begin, sl.end);
    if (!holder) {
      CKPT_RETURN_IF_ERROR(flush(), "");
      CKPT_RETURN_IF_ERROR(src.ReadParamRange(sl.param, state, sl.begin, sl.end, out), "");
    } else {
      const int64_t offset = holder->shard_offset + (sl.begin - holder->begin);
      if (run.count > 0 && run.rank == holder->rank && run.offset + run.count == offset) {
        run.count += n;
        run.last = k;
      } else {
        CKPT_RETURN_IF_ERROR(flush(), "");
        run = {holder->rank, offset, n, out, k, k};
      }
    }
    out += n;
  }
  return flush();
}

// Elements [begin, end) of a frozen parameter's stored bytes as fp32.
Status FrozenToF32(const ParamEntry& p, const std::vector<uint8_t>& raw, int64_t begin,
                   int64_t end, float* out) {
  const size_t es = DTypeSize(p.dtype);
  if (raw.size() != static_cast<size_t>(p.numel) * es)
    return DataLoss("frozen parameter '" + p.name + "': stored size does not match its table entry");
  if (!FloatsToF32(p.dtype, raw.data() + static_cast<size_t>(begin) * es,
                   static_cast<size_t>(end - begin), out))
    return InvalidArgument("frozen parameter '" + p.name + "': dtype " +
                           std::string(DTypeName(p.dtype)) + " is not floating point");
  return Status::Ok();
}

// ---- sharded ------------------------------------------------------------------------------

class ShardedSource final : public StateSource {
 public:
  ShardedSource(CheckpointReader reader, bool verify, bool verify_reads, bool defer,
                bool open_ahead, bool probe_all)
      : reader_(std::move(reader)),
        verify_(verify),
        verify_reads_(verify_reads),
        defer_(verify && defer),
        open_ahead_(open_ahead) {
    if (probe_all) {
      std::vector<std::string> paths;
      for (const FileRecord& f : manifest().files) paths.push_back(dir() + "/" + f.path);
      probes_.emplace(paths);
    }
    // Rank 0's file is opened while the caller plans, before its first read: its seal and
    // HDF5's structure (and HDF5's own start, 1.6-2.4 ms in a process's first open) took 3.5-4 ms
    // of export-fp32's 11-12 ms before its first large request (docs/performance.md,
    // 2026-12-06 08:00).
    if (open_ahead_) OpenAheadOf(0);
  }

  SourceKind kind() const override { return SourceKind::kSharded; }
  const Manifest& manifest() const override { return reader_.manifest(); }
  const std::string& dir() const override { return reader_.dir(); }
  int source_ranks() const override { return manifest().topology.dp_world_size; }
  uint64_t bytes_read() const override { return reader_.bytes_read(); }

  Status ReadParamRange(std::string_view param, std::string_view state, int64_t begin,
                        int64_t end, float* out) override {
    CKPT_ASSIGN_OR_RETURN(const ParamEntry* p, Resolve(manifest(), dir(), param, state, begin, end),
                          "");
    if (p->frozen) {
      CKPT_ASSIGN_OR_RETURN(auto raw, ReadFrozenBytes(p->name), "");
      return FrozenToF32(*p, raw, begin, end, out);
    }
    for (const auto& r : p->ranges) {
      const int64_t lo = std::max(begin, r.begin), hi = std::min(end, r.end);
      if (lo >= hi) continue;
      CKPT_RETURN_IF_ERROR(Feed(r.rank, std::string(state), r.shard_offset + (lo - r.begin),
                                hi - lo, out + (lo - begin)),
                           "parameter '" + p->name + "'");
    }
    return Status::Ok();
  }

  Status ReadParamSlices(const std::vector<ParamSlice>& slices, std::string_view state,
                         float* out) override {
    return ReadRuns(*this, slices, state, out,
                    [&](int rank, int64_t offset, int64_t count, float* to) {
                      return Feed(rank, std::string(state), offset, count, to);
                    });
  }

  std::optional<uint64_t> ReadShift(std::string_view param, std::string_view state, int64_t begin,
                                    int64_t end) override {
    return PartitionShift(*this, param, state, begin, end,
                          [&](int rank, int64_t offset) -> std::optional<uint64_t> {
                            auto at = reader_.SliceFileOffset(rank, state, offset);
                            Reaching(rank);
                            return at.ok() ? *at : std::nullopt;
                          });
  }

  Result<std::vector<uint8_t>> ReadFrozenBytes(std::string_view param) override {
    CKPT_ASSIGN_OR_RETURN(const auto where, Frozen(param), "");
    return reader_.ReadDatasetBytes(where.first, where.second->name);
  }
  Status ReadFrozenInto(std::string_view param, void* out, uint64_t bytes) override {
    CKPT_ASSIGN_OR_RETURN(const auto where, Frozen(param), "");
    if (bytes != where.second->bytes)
      return DataLoss(dir() + ": frozen parameter '" + std::string(param) + "': dataset of " +
                      std::to_string(where.second->bytes) + " bytes, the parameter table says " +
                      std::to_string(bytes));
    return reader_.ReadDataset(where.first, where.second->name, out, bytes);
  }
  // The rank file and dataset holding frozen parameter `param`.
  Result<std::pair<int, const DatasetRecord*>> Frozen(std::string_view param) const {
    const std::string name = std::string(kFrozenPrefix) + std::string(param);
    for (const auto& f : manifest().files) {
      for (const auto& d : f.datasets)
        if (d.name == name) return std::make_pair(f.rank, &d);
    }
    return DataLoss(dir() + ": frozen parameter '" + std::string(param) + "' is in no rank file");
  }

  std::vector<RankExtra> RankExtras(int r) const override {
    std::vector<RankExtra> out;
    const FileRecord* f = manifest().FileForRank(r);
    if (!f) return out;
    for (const auto& d : f->datasets)
      if (d.kind != "tensor") out.push_back({d.name, d});
    return out;
  }

  Result<std::vector<uint8_t>> ReadRankExtra(int r, const RankExtra& extra) override {
    return reader_.ReadDatasetBytes(r, extra.record.name);
  }

  std::vector<std::string> UnusedTensors() const override {
    std::vector<std::string> out;
    for (const auto& f : manifest().files) {
      for (const auto& d : f.datasets) {
        if (d.kind != "tensor" || d.name == kMaster || d.name == kExpAvg || d.name == kExpAvgSq ||
            d.name.rfind(kFrozenPrefix, 0) == 0)
          continue;
        out.push_back(f.path + ":/" + d.name);
      }
    }
    return out;
  }

  void HashReadBytes() override {
    if (!defer_) return;
    std::lock_guard<std::mutex> hashing(hash_mu_);
    HashPendingLocked();
  }

  Status Verify(const std::vector<std::string>& states, int part, int parts) override {
    HashReadBytes();
    int index = 0;
    for (const auto& f : manifest().files) {
      for (const auto& state : states) {
        const DatasetRecord* rec = manifest().FindDataset(f.rank, state);
        if (!rec) continue;
        if (index++ % parts != part) continue;
        auto it = streams_.find({f.rank, state});
        if (it == streams_.end() || it->second.broken) {
          CKPT_RETURN_IF_ERROR(reader_.VerifyDataset(f.rank, state), "verify");
          continue;
        }
        HashStream& s = it->second;
        CKPT_RETURN_IF_ERROR(HashUpTo(f.rank, state, s, Numel(rec->shape)), "verify");
        CKPT_RETURN_IF_ERROR(CheckDigest(dir() + "/" + f.path, *rec, s.hash), "");
      }
    }
    streams_.clear();
    return Status::Ok();
  }

 private:
  Status HashUpTo(int rank, const std::string& state, HashStream& s, int64_t target) {
    if (s.cursor >= target) return Status::Ok();
    // The reads before the gap are hashed first, and no other thread hashes meanwhile.
    std::unique_lock<std::mutex> hashing(hash_mu_, std::defer_lock);
    if (defer_) {
      hashing.lock();
      HashPendingLocked();
    }
    while (s.cursor < target) {
      const int64_t n = std::min(kGapChunk, target - s.cursor);
      gap_.resize(static_cast<size_t>(n));
      CKPT_RETURN_IF_ERROR(reader_.ReadSliceUnverified(rank, state, s.cursor, n, gap_.data()),
                           "");
      s.hash.Update(gap_.data(), static_cast<size_t>(n) * 4);
      s.cursor += n;
    }
    return Status::Ok();
  }

  // Under hash_mu_: the reads queued so far, in order.
  void HashPendingLocked() {
    std::deque<PendingHash> todo;
    {
      std::lock_guard<std::mutex> lock(queue_mu_);
      todo.swap(pending_);
    }
    for (const auto& p : todo) p.hash->Update(p.bytes, p.n);
  }

  // open_ahead_: the first read from rank r's file has rank r + 1's opened on a helper, one
  // file at a time (a wish made while the helper works replaces any earlier one still
  // waiting); a read that reaches a file being opened waits for it.
  void Reaching(int rank) {
    if (!open_ahead_ || rank == reached_) return;
    reached_ = rank;
    OpenAheadOf(rank + 1);
  }

  void OpenAheadOf(int next) {
    if (!manifest().FileForRank(next)) return;
    std::lock_guard<std::mutex> lock(ahead_mu_);
    ahead_wanted_ = next;
    if (ahead_running_) return;
    ahead_running_ = ahead_.Start([this] {
      for (;;) {
        int r;
        {
          std::lock_guard<std::mutex> lock(ahead_mu_);
          r = ahead_wanted_;
          ahead_wanted_ = -1;
          if (r < 0) {
            ahead_running_ = false;
            return;
          }
        }
        try {
          reader_.OpenAhead(r).IgnoreError();  // the file's first read reports a failure
        } catch (const std::bad_alloc&) {      // so does running out of memory
        }
      }
    });
  }

  Status Feed(int rank, const std::string& state, int64_t offset, int64_t count, float* out) {
    CKPT_RETURN_IF_ERROR(FeedRead(rank, state, offset, count, out), "");
    Reaching(rank);  // once this file is open and read from: the next one's open waits less
    return Status::Ok();
  }

  Status FeedRead(int rank, const std::string& state, int64_t offset, int64_t count, float* out) {
    if (!verify_) {
      // ReadSlice checks the pieces it touches; a dataset without them is verified whole once.
      const DatasetRecord* rec = manifest().FindDataset(rank, state);
      if (verify_reads_ && rec && !rec->has_pieces() && !verified_.count({rank, state})) {
        CKPT_RETURN_IF_ERROR(reader_.VerifyDataset(rank, state), "");
        verified_.insert({rank, state});
      }
      return reader_.ReadSlice(rank, state, offset, count, out);
    }
    HashStream& s = streams_[{rank, state}];
    if (!s.broken && offset < s.cursor) s.broken = true;
    if (!s.broken) CKPT_RETURN_IF_ERROR(HashUpTo(rank, state, s, offset), "");
    // In order: hashed here, checked against the dataset digest by Verify; out of order: the
    // pieces check it now (and Verify streams the dataset).
    if (s.broken)
      CKPT_RETURN_IF_ERROR(reader_.ReadSlice(rank, state, offset, count, out), "");
    else
      CKPT_RETURN_IF_ERROR(reader_.ReadSliceUnverified(rank, state, offset, count, out), "");
    if (!s.broken) {
      const size_t bytes = static_cast<size_t>(count) * 4;
      if (defer_) {
        std::lock_guard<std::mutex> lock(queue_mu_);
        pending_.push_back({&s.hash, out, bytes});
      } else {
        s.hash.Update(out, bytes);
      }
      s.cursor = offset + count;
    }
    return Status::Ok();
  }

  // A read whose hashing HashReadBytes() does (defer_).
  struct PendingHash {
    Xxh3Stream* hash;  // its stream's (a node of streams_: never moves)
    const void* bytes;
    size_t n;
  };

  CheckpointReader reader_;
  bool verify_;
  bool verify_reads_;
  bool defer_;
  std::mutex queue_mu_;              // guards pending_
  std::mutex hash_mu_;               // held while a thread hashes pending reads or a gap
  std::deque<PendingHash> pending_;  // in read order
  bool open_ahead_;
  int reached_ = -1;  // the rank file the last read reached
  std::mutex ahead_mu_;
  int ahead_wanted_ = -1;       // under ahead_mu_: the next rank file to open ahead
  bool ahead_running_ = false;  // under ahead_mu_: a helper opens files ahead
  std::set<std::pair<int, std::string>> verified_;  // verify_reads: datasets checked whole
  std::map<std::pair<int, std::string>, HashStream> streams_;
  std::vector<float> gap_;
  std::optional<h5::ProbeBatch> probes_;  // probe_all: every rank file's HDF5 probe, ahead
  Helpers ahead_;  // last: joined before the reader it opens files of goes
};

// ---- universal ----------------------------------------------------------------------------

class UniversalSource final : public StateSource {
 public:
  UniversalSource(UniversalReader reader, bool verify, bool verify_reads)
      : reader_(std::move(reader)), verify_(verify), verify_reads_(verify_reads) {}

  SourceKind kind() const override { return SourceKind::kUniversal; }
  const Manifest& manifest() const override { return reader_.manifest(); }
  const std::string& dir() const override { return reader_.dir(); }
  int source_ranks() const override { return reader_.source_ranks(); }
  uint64_t bytes_read() const override { return reader_.bytes_read(); }

  Status ReadParamRange(std::string_view param, std::string_view state, int64_t begin,
                        int64_t end, float* out) override {
    CKPT_ASSIGN_OR_RETURN(const ParamEntry* p, Resolve(manifest(), dir(), param, state, begin, end),
                          "");
    const std::string name = UniversalParamGroup(p->name) + "/" + std::string(state);
    if (!verify_ && verify_reads_ && !p->frozen && !verified_.count(name)) {
      CKPT_RETURN_IF_ERROR(reader_.VerifyDataset(name), "");
      verified_.insert(name);
    }
    if (!verify_ || p->frozen) return reader_.ReadParamRange(p->name, state, begin, end, out);
    HashStream& s = streams_[name];
    if (!s.broken && begin < s.cursor) s.broken = true;
    if (!s.broken) CKPT_RETURN_IF_ERROR(HashUpTo(*p, state, s, begin), "");
    CKPT_RETURN_IF_ERROR(reader_.ReadParamRange(p->name, state, begin, end, out), "");
    if (!s.broken) {
      s.hash.Update(out, static_cast<size_t>(end - begin) * 4);
      s.cursor = end;
    }
    return Status::Ok();
  }

  Result<std::vector<uint8_t>> ReadFrozenBytes(std::string_view param) override {
    CKPT_RETURN_IF_ERROR(IsFrozen(param), "");
    return reader_.ReadDatasetBytes(UniversalParamGroup(param) + "/" + std::string(kMaster));
  }
  Status ReadFrozenInto(std::string_view param, void* out, uint64_t bytes) override {
    CKPT_RETURN_IF_ERROR(IsFrozen(param), "");
    return reader_.ReadDatasetInto(UniversalParamGroup(param) + "/" + std::string(kMaster), out,
                                   bytes);
  }
  Status IsFrozen(std::string_view param) const {
    for (const auto& p : manifest().params)
      if (p.name == param && p.frozen && p.tied_to.empty()) return Status::Ok();
    return InvalidArgument("'" + std::string(param) + "' is not a stored frozen parameter");
  }

  std::vector<RankExtra> RankExtras(int r) const override {
    std::vector<RankExtra> out;
    const std::string prefix = UniversalSourceGroup(r) + "/";
    const FileRecord* f = manifest().FileForRank(0);
    if (!f) return out;
    for (const auto& d : f->datasets)
      if (d.name.rfind(prefix, 0) == 0) out.push_back({d.name.substr(prefix.size()), d});
    return out;
  }

  Result<std::vector<uint8_t>> ReadRankExtra(int, const RankExtra& extra) override {
    return reader_.ReadDatasetBytes(extra.record.name);
  }

  std::vector<std::string> UnusedTensors() const override { return {}; }

  Status Verify(const std::vector<std::string>& states, int part, int parts) override {
    int index = 0;
    for (const auto& p : manifest().params) {
      if (!p.trainable()) continue;
      for (const auto& state : states) {
        if (index++ % parts != part) continue;
        const std::string name = UniversalParamGroup(p.name) + "/" + state;
        const DatasetRecord* rec = manifest().FindDataset(0, name);
        if (!rec) return DataLoss(dir() + ": manifest lists no dataset /" + name);
        auto it = streams_.find(name);
        if (it == streams_.end() || it->second.broken) {
          CKPT_RETURN_IF_ERROR(reader_.VerifyDataset(name), "verify");
          continue;
        }
        CKPT_RETURN_IF_ERROR(HashUpTo(p, state, it->second, p.numel), "verify");
        CKPT_RETURN_IF_ERROR(
            CheckDigest(dir() + "/" + std::string(kUniversalFile), *rec, it->second.hash), "");
      }
    }
    streams_.clear();
    return Status::Ok();
  }

 private:
  Status HashUpTo(const ParamEntry& p, std::string_view state, HashStream& s, int64_t target) {
    while (s.cursor < target) {
      const int64_t n = std::min(kGapChunk, target - s.cursor);
      gap_.resize(static_cast<size_t>(n));
      CKPT_RETURN_IF_ERROR(
          reader_.ReadParamRange(p.name, state, s.cursor, s.cursor + n, gap_.data()), "");
      s.hash.Update(gap_.data(), static_cast<size_t>(n) * 4);
      s.cursor += n;
    }
    return Status::Ok();
  }

  UniversalReader reader_;
  bool verify_;
  bool verify_reads_;
  std::set<std::string> verified_;  // verify_reads: datasets checked whole
  std::map<std::string, HashStream> streams_;
  std::vector<float> gap_;
};

// ---- DeepSpeed ------------------------------------------------------------------------------

// DeepSpeed stores no checksums of its own: what is checked is the zip records' CRC-32, which
// covers a whole record. With stream_verify, reads of a record front to back are CRC'd as they
// pass and Verify reads each one's tail and compares (DeepSpeedReader::StreamVerify); with
// verify_reads, a record is read whole and checked the first time a read reaches it; otherwise
// Verify reads every record of the states whole. Frozen tensors are checked as they are read.
class DeepSpeedSource final : public StateSource {
 public:
  DeepSpeedSource(DeepSpeedReader reader, bool verify, bool defer, bool verify_reads)
      : reader_(std::move(reader)) {
    if (!reader_.info().lr_scheduler.is_null()) scheduler_ = reader_.info().lr_scheduler.dump();
    if (verify)
      reader_.StreamVerify(defer);
    else if (verify_reads)
      reader_.VerifyOnFirstRead();
  }

  SourceKind kind() const override { return SourceKind::kDeepSpeed; }
  const Manifest& manifest() const override { return reader_.manifest(); }
  const std::string& dir() const override { return reader_.dir(); }
  int source_ranks() const override { return manifest().topology.dp_world_size; }
  const DeepSpeedInfo* deepspeed() const override { return &reader_.info(); }
  uint64_t bytes_read() const override { return reader_.bytes_read(); }

  Status ReadParamRange(std::string_view param, std::string_view state, int64_t begin,
                        int64_t end, float* out) override {
    CKPT_RETURN_IF_ERROR(Resolve(manifest(), dir(), param, state, begin, end).status(), "");
    return reader_.ReadParamRange(param, state, begin, end, out);
  }
  Status ReadParamSlices(const std::vector<ParamSlice>& slices, std::string_view state,
                         float* out) override {
    return ReadRuns(*this, slices, state, out,
                    [&](int rank, int64_t offset, int64_t count, float* to) {
                      return reader_.ReadPartition(rank, state, offset, count, to);
                    });
  }
  std::optional<uint64_t> ReadShift(std::string_view param, std::string_view state, int64_t begin,
                                    int64_t end) override {
    return PartitionShift(*this, param, state, begin, end, [&](int rank, int64_t offset) {
      return reader_.PartitionFileOffset(rank, state, offset);
    });
  }
  Result<std::vector<uint8_t>> ReadFrozenBytes(std::string_view param) override {
    return reader_.ReadFrozenBytes(param);
  }
  Status ReadFrozenInto(std::string_view param, void* out, uint64_t bytes) override {
    return reader_.ReadFrozenInto(param, out, bytes);
  }
  std::optional<uint64_t> FrozenReadShift(std::string_view param) override {
    const std::optional<uint64_t> at = reader_.FrozenFileOffset(param);
    if (!at) return std::nullopt;
    return *at % AlignedBuffer::kAlign;
  }
  // The scheduler's state_dict (global in DeepSpeed) as every rank's `scheduler` json.
  std::vector<RankExtra> RankExtras(int r) const override {
    if (scheduler_.empty() || r < 0 || r >= source_ranks()) return {};
    DatasetRecord rec;
    rec.name = std::string(kScheduler);
    rec.kind = "json";
    rec.dtype = DType::kU8;
    rec.shape = {static_cast<int64_t>(scheduler_.size())};
    rec.bytes = scheduler_.size();
    return {{std::string(kScheduler), rec}};
  }
  Result<std::vector<uint8_t>> ReadRankExtra(int, const RankExtra& extra) override {
    if (extra.name != kScheduler) return NotFound(dir() + ": no dataset " + extra.name);
    return std::vector<uint8_t>(scheduler_.begin(), scheduler_.end());
  }
  std::vector<std::string> UnusedTensors() const override {
    return {"module (the " + reader_.info().model_dtype +
            " model weights; the fp32 masters are read instead)"};
  }
  void HashReadBytes() override { reader_.HashReadBytes(); }
  Status Verify(const std::vector<std::string>& states, int part, int parts) override {
    return reader_.VerifyStates(states, part, parts);
  }

 private:
  DeepSpeedReader reader_;
  std::string scheduler_;
};

double JsonNumber(const nlohmann::json& j, const char* key, double fallback, bool* found) {
  if (j.is_object() && j.contains(key) && j[key].is_number()) {
    if (found) *found = true;
    return j[key].get<double>();
  }
  return fallback;
}

}  // namespace

Status StateSource::ReadParamSlices(const std::vector<ParamSlice>& slices, std::string_view state,
                                    float* out) {
  for (const auto& sl : slices) {
    CKPT_RETURN_IF_ERROR(ReadParamRange(sl.param, state, sl.begin, sl.end, out), "");
    out += sl.end - sl.begin;
  }
  return Status::Ok();
}

std::string_view SourceKindName(SourceKind kind) {
  switch (kind) {
    case SourceKind::kSharded:
      return "sharded";
    case SourceKind::kUniversal:
      return "universal";
    case SourceKind::kDeepSpeed:
      return kDeepSpeedKind;
  }
  return "sharded";
}

// engine_min records the optimizer's settings and its update count in manifest.optimizer and
// the rate of the next update in rank 0's `scheduler` dataset; other writers may only have
// manifest.optimizer.
Result<AdamWHyper> StateSource::OptimizerHyper(std::string* source) {
  const Manifest& m = manifest();
  const nlohmann::json& opt = m.optimizer;
  AdamWHyper h;
  if (opt.is_object() && opt.contains("type") && opt["type"].is_string()) {
    const std::string type = opt["type"].get<std::string>();
    if (type != "adamw" && type != "adam")
      return Unimplemented("optimizer type '" + Excerpt(type, 64) + "' in " + dir() +
                           ": only AdamW hyper-parameters are read");
  }
  // A DeepSpeed source whose optimizer groups differ records them all as an array
  // (docs/deepspeed.md); one set of hyper-parameters would be wrong for some parameters.
  // (ckpt.torch records only the number of groups there.)
  if (opt.is_object() && opt.contains("param_groups") && opt["param_groups"].is_array())
    return Unimplemented("optimizer groups with different hyper-parameters: one AdamW setting "
                         "cannot describe them");
  bool have_lr = false;
  h.lr = JsonNumber(opt, "lr", h.lr, &have_lr);
  if (opt.contains("betas") && opt["betas"].is_array() && opt["betas"].size() == 2 &&
      opt["betas"][0].is_number() && opt["betas"][1].is_number()) {
    h.beta1 = opt["betas"][0].get<double>();
    h.beta2 = opt["betas"][1].get<double>();
  }
  h.beta1 = JsonNumber(opt, "beta1", h.beta1, nullptr);
  h.beta2 = JsonNumber(opt, "beta2", h.beta2, nullptr);
  h.eps = JsonNumber(opt, "eps", h.eps, nullptr);
  h.weight_decay = JsonNumber(opt, "weight_decay", h.weight_decay, nullptr);
  std::string lr_from = have_lr ? "manifest optimizer.lr" : "default lr";
  bool have_step = false;
  h.step = static_cast<int64_t>(JsonNumber(opt, "step", -1, &have_step));
  std::string step_from = "manifest optimizer.step";
  if (!have_step || h.step < 0) {
    h.step = m.counters.global_step - m.counters.skipped_steps;
    step_from = "counters.global_step - skipped_steps";
  }
  for (const RankExtra& ex : RankExtras(0)) {
    if (ex.name != kScheduler) continue;
    CKPT_ASSIGN_OR_RETURN(std::vector<uint8_t> bytes, ReadRankExtra(0, ex),
                          "rank 0 scheduler state");
    auto parsed = ParseJson(
        std::string_view(reinterpret_cast<const char*>(bytes.data()), bytes.size()),
        dir() + ": rank 0 dataset /" + std::string(kScheduler));
    if (!parsed.ok()) return parsed.status();
    const nlohmann::json& sched = *parsed;
    for (const char* key : {"next_lr", "lr"}) {
      bool found = false;
      const double lr = JsonNumber(sched, key, 0, &found);
      if (found) {
        h.lr = lr;
        lr_from = std::string("scheduler.") + key;
        break;
      }
    }
    for (const char* key : {"optimizer_step", "step"}) {
      bool found = false;
      const double step = JsonNumber(sched, key, 0, &found);
      if (found && !have_step) {
        h.step = static_cast<int64_t>(step);
        step_from = std::string("scheduler.") + key;
        break;
      }
    }
  }
  if (!(h.lr >= 0) || !(h.beta1 >= 0 && h.beta1 < 1) || !(h.beta2 >= 0 && h.beta2 < 1) ||
      !(h.eps > 0) || h.step < 0)
    return DataLoss("optimizer hyper-parameters in " + dir() + " are out of range");
  if (source) *source = "lr: " + lr_from + "; step: " + step_from;
  return h;
}

Result<std::unique_ptr<StateSource>> OpenStateSource(const std::string& path,
                                                     const SourceOptions& options) {
  Env* env = options.env ? options.env : Env::Default();
  if (!DeepSpeedTagDir(path, options.tag, env).empty()) {
    CKPT_ASSIGN_OR_RETURN(DeepSpeedReader r, DeepSpeedReader::Open(path, options.tag, env), "");
    return std::unique_ptr<StateSource>(new DeepSpeedSource(
        std::move(r), options.stream_verify, options.stream_verify && options.defer_stream_hashes,
        options.verify_reads));
  }
  CKPT_ASSIGN_OR_RETURN(std::string dir, ResolveTagDir(path, options.tag, env), "");
  if (IsUniversal(dir, "", env)) {
    CKPT_ASSIGN_OR_RETURN(UniversalReader r, UniversalReader::Open(dir, env), "");
    return std::unique_ptr<StateSource>(
        new UniversalSource(std::move(r), options.stream_verify, options.verify_reads));
  }
  OpenOptions o;
  o.env = env;
  o.verify_checksums = true;
  CKPT_ASSIGN_OR_RETURN(CheckpointReader r, CheckpointReader::Open(dir, "", o), "");
  // A missing or truncated rank file is reported before any output is written.
  if (options.check_files) CKPT_RETURN_IF_ERROR(r.CheckFiles(), "");
  return std::unique_ptr<StateSource>(
      new ShardedSource(std::move(r), options.stream_verify, options.verify_reads,
                        options.defer_stream_hashes, options.open_ahead, options.probe_all));
}

}  // namespace ckpt
