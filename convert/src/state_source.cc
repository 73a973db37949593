#include "state_source.h"

#include <algorithm>
#include <cstring>
#include <map>

#include "ckpt/deepspeed.h"
#include "ckpt/hash.h"
#include "ckpt/reader.h"
#include "ckpt/root.h"
#include "convert/universal.h"

namespace ckpt::convert {
namespace {

constexpr int64_t kGapChunk = 1 << 20;  // elements per read of padding / tails

int64_t Numel(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

// Converts `count` stored elements of `dtype` starting at element `first` of `raw` to fp32.
Status ConvertToF32(const std::vector<uint8_t>& raw, DType dtype, int64_t first, int64_t count,
                    float* out) {
  const size_t es = DTypeSize(dtype);
  const uint8_t* p = raw.data() + static_cast<size_t>(first) * es;
  for (int64_t i = 0; i < count; ++i, p += es) {
    switch (dtype) {
      case DType::kF32:
        std::memcpy(&out[i], p, 4);
        break;
      case DType::kF64: {
        double d;
        std::memcpy(&d, p, 8);
        out[i] = static_cast<float>(d);
        break;
      }
      case DType::kBF16:
      case DType::kF16: {
        uint16_t h;
        std::memcpy(&h, p, 2);
        out[i] = dtype == DType::kBF16 ? Bf16ToFloat(h) : Fp16ToFloat(h);
        break;
      }
      default:
        return InvalidArgument("dtype " + std::string(DTypeName(dtype)) + " is not floating point");
    }
  }
  return Status::Ok();
}

struct HashStream {
  Xxh3Stream hash;
  int64_t cursor = 0;
  bool broken = false;  // a read arrived out of order: verify by a full pass instead
};

const ParamEntry* Owner(const Manifest& m, const ParamEntry& p) {
  return p.tied_to.empty() ? &p : m.FindParam(p.tied_to);
}

Status CheckDigest(const std::string& label, const DatasetRecord& rec, const Xxh3Stream& h) {
  if (rec.xxh3.empty()) return Status::Ok();
  const std::string got = h.HexDigest();
  if (got != rec.xxh3)
    return DataLoss(label + ": dataset /" + rec.name + ": checksum mismatch (manifest " + rec.xxh3 +
                    ", data " + got + ")");
  return Status::Ok();
}

// ---- sharded ------------------------------------------------------------------------------

class ShardedSource final : public StateSource {
 public:
  ShardedSource(CheckpointReader reader, bool verify)
      : reader_(std::move(reader)), verify_(verify) {}

  const Manifest& manifest() const override { return reader_.manifest(); }
  const std::string& dir() const override { return reader_.dir(); }
  bool universal() const override { return false; }
  int source_ranks() const override { return manifest().topology.dp_world_size; }
  uint64_t bytes_read() const override { return reader_.bytes_read(); }

  Status ReadParamRange(const ParamEntry& p_in, std::string_view state, int64_t begin, int64_t end,
                        float* out) override {
    const ParamEntry* p = Owner(manifest(), p_in);
    if (!p) return DataLoss("parameter '" + p_in.name + "' is tied to a missing parameter");
    if (begin < 0 || end > p->numel || begin > end)
      return InvalidArgument("range [" + std::to_string(begin) + ", " + std::to_string(end) +
                             ") outside parameter '" + p->name + "'");
    if (p->frozen) {
      if (state != kMaster)
        return InvalidArgument("frozen parameter '" + p->name + "' has no " + std::string(state));
      CKPT_ASSIGN_OR_RETURN(auto raw, ReadFrozenBytes(*p), "");
      return ConvertToF32(raw, p->dtype, begin, end - begin, out);
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

  Result<std::vector<uint8_t>> ReadFrozenBytes(const ParamEntry& p) override {
    const std::string name = std::string(kFrozenPrefix) + p.name;
    for (const auto& f : manifest().files) {
      for (const auto& d : f.datasets)
        if (d.name == name) return reader_.ReadDatasetBytes(f.rank, name);
    }
    return DataLoss(dir() + ": frozen parameter '" + p.name + "' is in no rank file");
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

  Status FinishVerification(const std::vector<std::string>& states) override {
    for (const auto& f : manifest().files) {
      for (const auto& state : states) {
        const DatasetRecord* rec = manifest().FindDataset(f.rank, state);
        if (!rec) continue;
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
    while (s.cursor < target) {
      const int64_t n = std::min(kGapChunk, target - s.cursor);
      gap_.resize(static_cast<size_t>(n));
      CKPT_RETURN_IF_ERROR(reader_.ReadSlice(rank, state, s.cursor, n, gap_.data()), "");
      s.hash.Update(gap_.data(), static_cast<size_t>(n) * 4);
      s.cursor += n;
    }
    return Status::Ok();
  }

  Status Feed(int rank, const std::string& state, int64_t offset, int64_t count, float* out) {
    if (!verify_) return reader_.ReadSlice(rank, state, offset, count, out);
    HashStream& s = streams_[{rank, state}];
    if (!s.broken && offset < s.cursor) s.broken = true;
    if (!s.broken) CKPT_RETURN_IF_ERROR(HashUpTo(rank, state, s, offset), "");
    CKPT_RETURN_IF_ERROR(reader_.ReadSlice(rank, state, offset, count, out), "");
    if (!s.broken) {
      s.hash.Update(out, static_cast<size_t>(count) * 4);
      s.cursor = offset + count;
    }
    return Status::Ok();
  }

  CheckpointReader reader_;
  bool verify_;
  std::map<std::pair<int, std::string>, HashStream> streams_;
  std::vector<float> gap_;
};

// ---- universal ----------------------------------------------------------------------------

class UniversalSource final : public StateSource {
 public:
  UniversalSource(UniversalReader reader, bool verify)
      : reader_(std::move(reader)), verify_(verify) {}

  const Manifest& manifest() const override { return reader_.manifest(); }
  const std::string& dir() const override { return reader_.dir(); }
  bool universal() const override { return true; }
  int source_ranks() const override { return reader_.source_ranks(); }
  uint64_t bytes_read() const override { return reader_.bytes_read(); }

  Status ReadParamRange(const ParamEntry& p_in, std::string_view state, int64_t begin, int64_t end,
                        float* out) override {
    const ParamEntry* p = Owner(manifest(), p_in);
    if (!p) return DataLoss("parameter '" + p_in.name + "' is tied to a missing parameter");
    if (!verify_ || p->frozen) return reader_.ReadParamRange(p->name, state, begin, end, out);
    const std::string name = UniversalParamGroup(p->name) + "/" + std::string(state);
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

  Result<std::vector<uint8_t>> ReadFrozenBytes(const ParamEntry& p) override {
    return reader_.ReadDatasetBytes(UniversalParamGroup(p.name) + "/" + std::string(kMaster));
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

  Result<std::vector<uint8_t>> ReadRankExtra(int r, const RankExtra& extra) override {
    return reader_.ReadDatasetBytes(extra.record.name);
  }

  std::vector<std::string> UnusedTensors() const override { return {}; }

  Status FinishVerification(const std::vector<std::string>& states) override {
    for (const auto& p : manifest().params) {
      if (!p.trainable()) continue;
      for (const auto& state : states) {
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
  std::map<std::string, HashStream> streams_;
  std::vector<float> gap_;
};

// ---- DeepSpeed ------------------------------------------------------------------------------

// DeepSpeed stores no checksums: reads are as good as the zip records (FinishVerification has
// nothing to compare; `ckpt check` reads every record to its end so libzip checks each CRC-32).
class DeepSpeedSource final : public StateSource {
 public:
  explicit DeepSpeedSource(DeepSpeedReader reader) : reader_(std::move(reader)) {
    if (!reader_.info().lr_scheduler.is_null()) scheduler_ = reader_.info().lr_scheduler.dump();
  }

  const Manifest& manifest() const override { return reader_.manifest(); }
  const std::string& dir() const override { return reader_.dir(); }
  bool universal() const override { return false; }
  int source_ranks() const override { return manifest().topology.dp_world_size; }
  uint64_t bytes_read() const override { return reader_.bytes_read(); }

  Status ReadParamRange(const ParamEntry& p, std::string_view state, int64_t begin, int64_t end,
                        float* out) override {
    return reader_.ReadParamRange(p.name, state, begin, end, out);
  }
  Result<std::vector<uint8_t>> ReadFrozenBytes(const ParamEntry& p) override {
    return reader_.ReadFrozenBytes(p.name);
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
    if (extra.name != kScheduler) return NotFound("no dataset " + extra.name);
    return std::vector<uint8_t>(scheduler_.begin(), scheduler_.end());
  }
  std::vector<std::string> UnusedTensors() const override {
    return {"module (the " + reader_.info().model_dtype +
            " model weights; the fp32 masters are read instead)"};
  }
  Status FinishVerification(const std::vector<std::string>&) override { return Status::Ok(); }

 private:
  DeepSpeedReader reader_;
  std::string scheduler_;
};

}  // namespace

Result<std::unique_ptr<StateSource>> OpenStateSource(const std::string& path,
                                                     const std::string& tag, bool stream_verify,
                                                     Env* env) {
  if (!env) env = Env::Default();
  if (!DeepSpeedTagDir(path, tag, env).empty()) {
    CKPT_ASSIGN_OR_RETURN(DeepSpeedReader r, DeepSpeedReader::Open(path, tag, env), "");
    return std::unique_ptr<StateSource>(new DeepSpeedSource(std::move(r)));
  }
  CKPT_ASSIGN_OR_RETURN(std::string dir, ResolveTagDir(path, tag, env), "");
  if (IsUniversal(dir, "", env)) {
    CKPT_ASSIGN_OR_RETURN(UniversalReader r, UniversalReader::Open(dir, env), "");
    return std::unique_ptr<StateSource>(new UniversalSource(std::move(r), stream_verify));
  }
  OpenOptions o;
  o.env = env;
  o.verify_checksums = true;
  CKPT_ASSIGN_OR_RETURN(CheckpointReader r, CheckpointReader::Open(dir, "", o), "");
  // A missing or truncated rank file is reported before any output is written.
  CKPT_RETURN_IF_ERROR(r.CheckFiles(), "");
  return std::unique_ptr<StateSource>(new ShardedSource(std::move(r), stream_verify));
}

}  // namespace ckpt::convert
