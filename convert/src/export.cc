// ckpt export-fp32.
//
// Protocol:
//  1. Open the source (sharded or universal) and plan the output from the manifest alone:
//     which tensors (aliases recorded, not stored; frozen ones unless excluded), their output
//     dtype and size, and how they split into shards of at most max_shard_bytes.
//  2. Create the staging directory next to OUT (output_dir.h).
//  3. For each shard: write the safetensors header, then each tensor in pieces of
//     chunk_elements read from the owners' master hyperslabs (the moments are never opened),
//     converted to the output dtype and appended; publish the shard (temp name, fsync,
//     rename). The master datasets' XXH3 are checked while streaming.
//  4. Finish the verification (tails and padding of the master datasets).
//  5. Write model.safetensors.index.json for a sharded export (temp name, fsync, rename).
//  6. Rename the staging directory to OUT.
#include "convert/export.h"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>

#include "ckpt/aligned_buffer.h"
#include "ckpt/json.h"
#include "ckpt/progress.h"
#include "ckpt/root.h"
#include "ckpt/run_ahead.h"
#include "ckpt/state_source.h"
#include "safetensors/safetensors.h"
#include "convert/output_dir.h"

namespace ckpt::convert {
namespace {

bool IsFloat(DType t) {
  return t == DType::kF32 || t == DType::kF64 || t == DType::kBF16 || t == DType::kF16;
}

struct PlannedTensor {
  const ParamEntry* param;  // the values: the parameter itself, or a tied alias's owner
  DType out_dtype;
  uint64_t bytes;
  std::string name;  // the tensor's name (the alias's for a copied alias)
  uint64_t at = 0;   // where its bytes start in the output file
};

struct PlannedFile {
  std::string name;
  std::vector<PlannedTensor> tensors;
  uint64_t bytes = 0;
  std::vector<safetensors::SafetensorsTensorSpec> specs;
};

// fp32 values -> out dtype bytes, in `out` (resized to hold them).
void Encode(const float* in, int64_t n, DType dtype, std::vector<uint8_t>& out) {
  out.resize(static_cast<size_t>(n) * DTypeSize(dtype));
  F32ToFloats(dtype, in, static_cast<size_t>(n), out.data());
}

// A frozen parameter's stored bytes (`raw`) in the output dtype, into `out`: floating point
// goes through fp32 (exact for bf16/fp16/fp32 sources). 64 Ki elements at a time through a
// 256 KiB block. (Element by element, with two calls and a vector per element, a LoRA
// checkpoint's frozen bf16 base of 200 M elements took export-fp32 2.5 s: docs/performance.md,
// 2026-12-05 17:00.)
Status EncodeFrozen(const ParamEntry& p, const uint8_t* raw, DType out_dtype, uint8_t* out) {
  const size_t es = DTypeSize(p.dtype), os = DTypeSize(out_dtype);
  // To fp32 in fp32's alignment: straight into `out`, without the block and its copy (the
  // copy was 9 % of export-fp32's CPU time for a LoRA base of bf16 tensors).
  if (out_dtype == DType::kF32 && reinterpret_cast<uintptr_t>(out) % alignof(float) == 0) {
    if (!FloatsToF32(p.dtype, raw, static_cast<size_t>(p.numel), reinterpret_cast<float*>(out)))
      return Internal("integer frozen tensor '" + p.name + "' reached dtype conversion");
    return Status::Ok();
  }
  constexpr size_t kBlock = size_t{1} << 16;
  std::vector<float> block(std::min(kBlock, static_cast<size_t>(p.numel)));
  for (size_t i = 0; i < static_cast<size_t>(p.numel); i += kBlock) {
    const size_t n = std::min(kBlock, static_cast<size_t>(p.numel) - i);
    if (!FloatsToF32(p.dtype, raw + i * es, n, block.data()))
      return Internal("integer frozen tensor '" + p.name + "' reached dtype conversion");
    F32ToFloats(out_dtype, block.data(), n, out + i * os);
  }
  return Status::Ok();
}

// The end of the piece of `p` that starts at element b: at most `step` elements, and not past
// the end of the source rank's range that holds b when that leaves the piece, or the next
// one, 1 Mi elements (4 MiB) or more, so that one file holds the large piece
// (StateSource::ReadShift reads it in place; a piece of 8 MiB spanning two rank files went
// through the page cache in two 4 MiB reads, 11 ms where an in-place read takes 6:
// docs/performance.md, 2026-12-04 00:30). Where both parts are shorter the piece is not cut:
// a ZeRO-3 source of many ranks (every rank a slice of every tensor) would turn each piece
// into many small reads and writes.
int64_t PieceEnd(const ParamEntry& p, int64_t b, int64_t step) {
  constexpr int64_t kMinCut = int64_t{1} << 20;
  int64_t e = std::min(p.numel, b + step);
  for (const auto& r : p.ranges)
    if (r.begin <= b && b < r.end && r.end < e && (r.end - b >= kMinCut || e - r.end >= kMinCut))
      e = r.end;
  return e;
}

std::string ShardName(size_t k, size_t n) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "model-%05zu-of-%05zu.safetensors", k, n);
  return buf;
}

}  // namespace

Result<ExportReport> ExportFp32(const std::string& src_path, const std::string& out,
                                const ExportOptions& opts) {
  if (opts.dtype != DType::kF32 && opts.dtype != DType::kBF16 && opts.dtype != DType::kF16)
    return InvalidArgument("--dtype must be fp32, bf16 or fp16");
  if (opts.chunk_elements < 1) return InvalidArgument("chunk_elements must be >= 1");
  Env* env = opts.env ? opts.env : Env::Default();
  SourceOptions so;
  so.tag = opts.tag;
  so.env = env;
  so.stream_verify = true;
  // The writing thread hashes each piece (consume), so the reading thread only reads.
  so.defer_stream_hashes = true;
  so.open_ahead = true;
  so.probe_all = true;
  CKPT_ASSIGN_OR_RETURN(auto src, OpenStateSource(src_path, so), "");
  const Manifest& m = src->manifest();
  ExportReport report;
  report.source_dir = src->dir();
  report.out = out;
  report.tag = m.tag;
  report.global_step = m.counters.global_step;

  // 1. Plan.
  std::vector<PlannedTensor> tensors;
  report.tied_copied = opts.tied == TiedExport::kCopy;
  for (const auto& p : m.params) {
    const ParamEntry* values = &p;
    if (!p.tied_to.empty()) {
      const ParamEntry* owner = m.FindParam(p.tied_to);
      if (owner && owner->frozen && opts.exclude_frozen) {
        report.excluded.push_back(p.name);
        continue;
      }
      report.tied[p.name] = p.tied_to;
      if (opts.tied == TiedExport::kMetadata) continue;
      if (owner == nullptr) return DataLoss(p.name + ": tied to unknown parameter " + p.tied_to);
      values = owner;
    }
    if (p.frozen && opts.exclude_frozen) {
      report.excluded.push_back(p.name);
      continue;
    }
    const DType out_dtype =
        IsFloat(values->dtype) || !values->frozen ? opts.dtype : values->dtype;
    const uint64_t bytes = static_cast<uint64_t>(values->numel) * DTypeSize(out_dtype);
    tensors.push_back({values, out_dtype, bytes, p.name});
    report.total_size += bytes;
    report.largest_tensor_bytes =
        std::max<uint64_t>(report.largest_tensor_bytes, static_cast<uint64_t>(p.numel) * 4);
  }
  report.tensors = static_cast<int64_t>(tensors.size());
  // Hugging Face's rule: start a new shard when the next tensor would overflow this one; a
  // tensor larger than the limit gets a shard of its own.
  std::vector<PlannedFile> files(1);
  for (const auto& t : tensors) {
    if (opts.max_shard_bytes > 0 && !files.back().tensors.empty() &&
        files.back().bytes + t.bytes > opts.max_shard_bytes)
      files.emplace_back();
    files.back().tensors.push_back(t);
    files.back().bytes += t.bytes;
  }
  const bool sharded = files.size() > 1;
  for (size_t k = 0; k < files.size(); ++k)
    files[k].name = sharded ? ShardName(k + 1, files.size()) : "model.safetensors";

  nlohmann::json tied = nlohmann::json::object();
  for (const auto& [alias, owner] : report.tied) tied[alias] = owner;
  std::map<std::string, std::string> metadata = {
      {"format", "pt"},
      {"ckpt_tag", m.tag},
      {"ckpt_global_step", std::to_string(m.counters.global_step)},
      {"ckpt_dtype", std::string(DTypeName(opts.dtype))},
  };
  if (!report.tied.empty()) metadata["tied_weights"] = tied.dump();
  // Each tensor's place in its file (the header is the writer's own: BuildSafetensorsHeader).
  for (auto& f : files) {
    for (const auto& t : f.tensors) f.specs.push_back({t.name, t.out_dtype, t.param->shape});
    CKPT_ASSIGN_OR_RETURN(const std::string header,
                          safetensors::BuildSafetensorsHeader(f.specs, metadata), f.name);
    uint64_t at = 8 + header.size();
    for (auto& t : f.tensors) {
      t.at = at;
      at += t.bytes;
    }
  }

  // 2-3. Stage and write. The pieces (one per frozen tensor, chunk_elements per trainable
  // one) are read and converted on a helper thread, up to kAhead pieces ahead of the writes
  // (RunAhead), so the disk reads the next piece while this thread writes the last one.
  // A piece is elements [begin, end) of tensor `tensor` followed by the whole tensors after it
  // up to `last`: a run of small trainable tensors is read and written as one piece (one large
  // read where the source stores them one after the other, StateSource::ReadParamSlices; one
  // write), not as one small request each.
  struct Piece {
    size_t file, tensor;
    int64_t begin = 0, end = 0;  // element range of `tensor`; a frozen tensor is one piece
    size_t last = 0;             // the piece's last tensor (== tensor but for a run)
    int64_t count = 0;           // elements in all
  };
  constexpr size_t kNoTensor = SIZE_MAX;  // a file's only piece when it has no elements
  // A trainable tensor's piece: up to chunk_elements and at most 2 Mi - 1 Ki elements (8 MiB
  // of fp32 less one 4 KiB block, so that a slot with its block of room is four 2 MiB pages),
  // three slots (kAhead). The slots are the export's working memory, touched first by this
  // process: on the development VM fresh memory in 2 MiB pages cost 0.1-0.4 GiB/s once the host
  // had taken it back (free page reporting, a few seconds after it was freed). Slots of half
  // the largest tensor (2 x 44.7 MB for a 1 GiB checkpoint) exported it in 0.68 s 3 s after a
  // cache drop, two 16 MiB slots in 0.56-0.61 s (system 0.17-0.23: each piece was two 8 MiB
  // requests faulting in the slot on two threads), three 8 MiB slots in 0.42-0.45 s (system
  // 0.06: one request per piece, up to two pieces read ahead of the write), no slower with
  // memory at hand (docs/performance.md, 2026-12-03 14:00 and 20:00). A copy program that
  // reads and writes the same bytes through a 32 MiB ring: 0.33-0.44 s.
  constexpr int64_t kPieceElements = (int64_t{1} << 21) - 1024;
  const int64_t piece_elements =
      static_cast<int64_t>(std::min<uint64_t>(opts.chunk_elements, kPieceElements));
  // Runs of small tensors fill a piece too: a DeepSpeed ZeRO-2 partition of 1 MiB parameters
  // exported in 0.55 s instead of 0.68 with 8 MiB runs, 3 s after a cache drop (0.36 s either
  // way right after one; docs/performance.md, 2026-12-03 16:30). Runs of seven (a piece) took
  // 0.70 s through the bounce buffers, a run then straddling their 8 MiB reads, and 0.37-0.41 s
  // against 0.41-0.45 for runs of eight (2 MiB more per slot) once DeepSpeed sources had
  // ReadShift (2026-12-03 20:00).
  const int64_t run_elements = piece_elements;
  std::vector<Piece> pieces;
  for (size_t f = 0; f < files.size(); ++f) {
    const size_t first_piece = pieces.size();
    for (size_t t = 0; t < files[f].tensors.size(); ++t) {
      const ParamEntry& p = *files[f].tensors[t].param;
      if (p.frozen) {
        pieces.push_back({f, t, 0, p.numel, t, p.numel});
        continue;
      }
      // A whole tensor joins the piece before it when that piece ends where this file's
      // previous tensor (a trainable one) ends and there is room.
      if (pieces.size() > first_piece && t > 0) {
        Piece& prev = pieces.back();
        const ParamEntry& q = *files[f].tensors[prev.last].param;
        const int64_t prev_end = prev.last == prev.tensor ? prev.end : q.numel;
        if (prev.last == t - 1 && !q.frozen && prev_end == q.numel &&
            prev.count + p.numel <= run_elements) {
          prev.last = t;
          prev.count += p.numel;
          continue;
        }
      }
      for (int64_t b = 0; b < p.numel;) {
        const int64_t e = PieceEnd(p, b, piece_elements);
        pieces.push_back({f, t, b, e, t, e - b});
        b = e;
      }
    }
    if (pieces.size() == first_piece) pieces.push_back({f, kNoTensor});  // still written
  }
  constexpr int kAhead = 3;
  // RunAhead's producer, the threads the reads and the writes run on (direct_write.h).
  constexpr int kTransferThreads = 4;
  // A trainable fp32 piece is read to the place within a 4 KiB block that it takes in the
  // output file, so that its aligned middle is written from where it lies (O_DIRECT, no copy
  // into staging: direct_write.h); `values` has a block of room for that.
  constexpr uint64_t kBlock = 4096;
  constexpr uint64_t kFrozenInPlaceBytes = 8u << 20;
  struct Slot {
    AlignedBuffer values;        // a trainable piece as read (room for the longest piece)
    std::vector<uint8_t> bytes;  // the piece in the output dtype (unused for fp32 output)
    const uint8_t* data = nullptr;
    uint64_t size = 0;
    // A trainable fp32 piece read at values.data() + read_at goes to values.data() + place,
    // which `data` points to, on the writing thread (consume).
    uint64_t read_at = 0, place = 0;
    // A frozen tensor read at `stored` whose conversion to values.data() + place (`data`) is
    // still to do, on the writing thread as the move (nullptr: none).
    const PlannedTensor* encode = nullptr;
    const uint8_t* stored = nullptr;
  };
  std::vector<Slot> slots(kAhead);
  // A frozen tensor of less than 8 MiB of output whose stored and converted bytes fit a slot as
  // a trainable piece does (8 MiB) is a piece like the others: read and converted into its slot
  // on the helper thread while the one before it is written through the page cache. Read,
  // converted and written one after the other on one thread, a LoRA base of 200 bf16 tensors of
  // 2 MB took 395 ms to export to tmpfs, 302 ms this way (medians of 10; on the development
  // VM's disk both wait for its writes: docs/performance.md, 2026-12-05 20:30). A larger one is
  // read whole into `frozen_raw` below and written before the next is read, so that the memory
  // bound holds.
  constexpr uint64_t kSlotBytes = static_cast<uint64_t>(kPieceElements) * 4 + kBlock;
  // A frozen tensor's layout in its slot: converted at the place within a 4 KiB block that it
  // takes in the output file (so that its aligned middle is written from where it lies, as a
  // trainable piece's), stored in the first block after that at the place its record takes in
  // the source's file (read straight into it: StateSource::FrozenReadShift). A tensor that keeps
  // its dtype is stored at its output's place: it is written from there.
  // frozen_need is what the layout needs at most (the record's place is asked for only when
  // the tensor is read: learning where a record lies reads its local header).
  auto frozen_block_at = [&](const PlannedTensor& t) -> uint64_t {
    if (t.out_dtype == t.param->dtype) return 0;
    const uint64_t out_bytes = static_cast<uint64_t>(t.param->numel) * DTypeSize(t.out_dtype);
    return (t.at % kBlock + out_bytes + kBlock - 1) / kBlock * kBlock;
  };
  auto frozen_stored_at = [&](const PlannedTensor& t) -> uint64_t {
    if (t.out_dtype == t.param->dtype) return t.at % kBlock;
    return frozen_block_at(t) + src->FrozenReadShift(t.param->name).value_or(0);
  };
  auto frozen_need = [&](const PlannedTensor& t) {
    return frozen_block_at(t) + kBlock +
           static_cast<uint64_t>(t.param->numel) * DTypeSize(t.param->dtype);
  };
  auto frozen_in_slot = [&](const PlannedTensor& t) {
    return static_cast<uint64_t>(t.param->numel) * DTypeSize(t.out_dtype) < kFrozenInPlaceBytes &&
           frozen_need(t) <= kSlotBytes;
  };
  uint64_t slot_bytes = 0;
  for (const auto& pc : pieces) {
    if (pc.tensor == kNoTensor) continue;
    const PlannedTensor& t = files[pc.file].tensors[pc.tensor];
    if (!t.param->frozen) {
      slot_bytes = std::max(slot_bytes, static_cast<uint64_t>(pc.count) * 4 + kBlock);
    } else if (frozen_in_slot(t)) {
      slot_bytes = std::max(slot_bytes, frozen_need(t));
    }
  }
  // Those threads are started before the slots are touched (run_ahead.h).
  KeepHelpersReady(kTransferThreads);
  for (auto& slot : slots) slot.values = AlignedBuffer(static_cast<size_t>(slot_bytes));
  // A larger frozen tensor is read whole into `frozen_raw` and, unless it keeps its dtype,
  // converted into `frozen_out`, from 8 MiB with its bytes where the output's lie within a 4 KiB
  // block (written in place with O_DIRECT). Both are sized for the largest such tensor,
  // allocated on first use and kept: two fresh vectors per tensor (zero-filled, then freed) cost
  // export-fp32 of a LoRA checkpoint with a 400 MB frozen base 3 of its 4.2 s on the
  // development VM, where fresh memory is slower than the disk (docs/performance.md, 2026-12-05
  // 17:00).
  AlignedBuffer frozen_raw, frozen_out;
  uint64_t frozen_raw_bytes = 0, frozen_out_bytes = 0;
  for (const auto& pc : pieces) {
    if (pc.tensor == kNoTensor) continue;
    const PlannedTensor& t = files[pc.file].tensors[pc.tensor];
    if (!t.param->frozen || frozen_in_slot(t)) continue;
    const uint64_t n = static_cast<uint64_t>(t.param->numel);
    frozen_raw_bytes = std::max(frozen_raw_bytes, n * DTypeSize(t.param->dtype));
    if (t.out_dtype != t.param->dtype)
      frozen_out_bytes = std::max(frozen_out_bytes, n * DTypeSize(t.out_dtype));
  }
  CKPT_ASSIGN_OR_RETURN(StagedOutput staged, StagedOutput::Begin(out, env), "");
  Progress progress("export-fp32", report.total_size, opts.progress);
  std::optional<safetensors::SafetensorsWriter> writer;
  size_t open_file = files.size();  // the file `writer` writes
  auto finish_file = [&]() -> Status {
    CKPT_RETURN_IF_ERROR(writer->Finish(), "");
    ExportedFile done;
    done.name = files[open_file].name;
    for (const auto& t : files[open_file].tensors) done.tensors.push_back(t.name);
    done.bytes = writer->file_size();
    report.files.push_back(std::move(done));
    writer.reset();
    return Status::Ok();
  };
  auto produce = [&](uint64_t i, int k) -> Status {
    const Piece& pc = pieces[i];
    Slot& slot = slots[static_cast<size_t>(k)];
    slot.read_at = slot.place = 0;
    slot.encode = nullptr;
    if (pc.tensor == kNoTensor) {
      slot.size = 0;
      return Status::Ok();
    }
    const PlannedTensor& t = files[pc.file].tensors[pc.tensor];
    const ParamEntry& p = *t.param;
    if (p.frozen && frozen_in_slot(t)) {
      const uint64_t stored = static_cast<uint64_t>(p.numel) * DTypeSize(p.dtype);
      uint8_t* raw = slot.values.data() + frozen_stored_at(t);
      CKPT_RETURN_IF_ERROR(src->ReadFrozenInto(p.name, raw, stored));  // names it
      slot.data = raw;
      slot.size = stored;
      if (t.out_dtype == p.dtype) return Status::Ok();
      // Converted on the writing thread (consume): here it would keep the next read waiting,
      // and this thread's reads set the pace (a LoRA base of 512 bf16 tensors of 2 MB: read
      // 0.75 ms, converted 0.6 ms each, written 0.85 ms on a memory disk).
      slot.encode = &t;
      slot.stored = raw;
      slot.read_at = slot.place = t.at % kBlock;
      slot.data = slot.values.data() + slot.place;
      slot.size = static_cast<uint64_t>(p.numel) * DTypeSize(t.out_dtype);
      return Status::Ok();
    }
    if (p.frozen) {
      const uint64_t stored = static_cast<uint64_t>(p.numel) * DTypeSize(p.dtype);
      const bool keep = t.out_dtype == p.dtype;
      // Placed for an in-place O_DIRECT write only from 8 MiB: a frozen tensor is written on
      // this thread before the next is read, and a smaller one's O_DIRECT write waited for the
      // disk where the page cache takes it at once (200 tensors of 4 MiB exported in 1.24 s
      // that way, 0.93 s through the page cache: docs/performance.md 2026-12-05 17:00).
      const uint64_t out_bytes = static_cast<uint64_t>(p.numel) * DTypeSize(t.out_dtype);
      const uint64_t shift = out_bytes >= kFrozenInPlaceBytes ? t.at % kBlock : 0;
      if (frozen_raw.size() == 0) frozen_raw = AlignedBuffer(frozen_raw_bytes + kBlock);
      uint8_t* raw = frozen_raw.data() + (keep ? shift : 0);
      CKPT_RETURN_IF_ERROR(src->ReadFrozenInto(p.name, raw, stored));  // names it
      slot.data = raw;
      slot.size = stored;
      if (keep) return Status::Ok();
      if (frozen_out.size() == 0) frozen_out = AlignedBuffer(frozen_out_bytes + kBlock);
      uint8_t* converted = frozen_out.data() + shift;
      CKPT_RETURN_IF_ERROR(EncodeFrozen(p, raw, t.out_dtype, converted),
                           "parameter '" + t.name + "'");
      slot.data = converted;
      slot.size = out_bytes;
      return Status::Ok();
    }
    const uint64_t at = t.at + static_cast<uint64_t>(pc.begin) * 4;  // fp32 output only
    const uint64_t shift = t.out_dtype == DType::kF32 && at % 4 == 0 ? at % kBlock : 0;
    // Read at the source's place within a block where it has one, so the bytes come from the
    // disk straight into the slot, then moved within the slot to the output's place: one pass
    // over memory, where a read to the output's place goes through the reader's bounce buffers
    // (24 MiB more of fresh memory) and a copy out of them. The move is the writing thread's
    // (consume), so that this thread's next read starts once the piece is read and hashed.
    const uint64_t read_at = src->ReadShift(p.name, kMaster, pc.begin, pc.end).value_or(shift);
    float* values = reinterpret_cast<float*>(slot.values.data() + read_at);
    std::vector<StateSource::ParamSlice> slices = {{p.name, pc.begin, pc.end}};
    for (size_t k = pc.tensor + 1; k <= pc.last; ++k) {
      const ParamEntry& q = *files[pc.file].tensors[k].param;
      slices.push_back({q.name, 0, q.numel});
    }
    CKPT_RETURN_IF_ERROR(src->ReadParamSlices(slices, kMaster, values));
    if (t.out_dtype == DType::kF32) {
      slot.size = static_cast<uint64_t>(pc.count) * 4;
      slot.data = slot.values.data() + shift;
      slot.read_at = read_at;
      slot.place = shift;
    } else {
      Encode(values, pc.count, t.out_dtype, slot.bytes);
      slot.data = slot.bytes.data();
      slot.size = slot.bytes.size();
    }
    return Status::Ok();
  };
  // A piece's write runs on a helper thread while this thread takes the next piece (its
  // source's hash and its move), and the piece keeps its slot until the next piece's consume
  // has waited for that write (RunAhead's `held`): the disk reads the piece after next during
  // the write. Written on this thread, a piece's write left the reads 50 ms of a 130 ms data
  // phase to overlap and the disk 18 ms idle in 57 gaps, where a copy program overlaps them
  // fully (docs/performance.md, 2026-12-06 08:00).
  Status written = Status::Ok();  // the write's status, read after `behind` is joined
  Helpers behind;                 // declared after the slots and `writer`, so joined before they go
  auto wait_written = [&]() -> Status {
    behind.Join();
    Status s = std::move(written);
    written = Status::Ok();
    return s;
  };
  auto consume = [&](uint64_t i, int k) -> Status {
    const Piece& pc = pieces[i];
    if (pc.file != open_file) {
      CKPT_RETURN_IF_ERROR(wait_written(), "");
      if (writer) CKPT_RETURN_IF_ERROR(finish_file(), "");
      const std::string path = staged.staging() + "/" + files[pc.file].name;
      CKPT_ASSIGN_OR_RETURN(
          auto w, safetensors::SafetensorsWriter::Create(path, files[pc.file].specs, metadata, env),
          "");
      writer.emplace(std::move(w));
      open_file = pc.file;
    }
    Slot& slot = slots[static_cast<size_t>(k)];
    // The source's hash of this piece (and of any read after it) before its bytes move: on
    // the reading thread it left the disk idle for 0.4 ms of every 4 ms piece, the writer
    // waiting for it (docs/performance.md, 2026-12-04 15:10).
    src->HashReadBytes();
    if (slot.size == 0) return Status::Ok();
    if (slot.encode) {
      const PlannedTensor& t = *slot.encode;
      slot.encode = nullptr;
      CKPT_RETURN_IF_ERROR(
          EncodeFrozen(*t.param, slot.stored, t.out_dtype, slot.values.data() + slot.place),
          "parameter '" + t.name + "'");
    }
    if (slot.read_at != slot.place) {
      std::memmove(slot.values.data() + slot.place, slot.values.data() + slot.read_at, slot.size);
      slot.read_at = slot.place;
    }
    CKPT_RETURN_IF_ERROR(wait_written(), "");
    const auto write = [&writer, &written, &pc, &names = files[pc.file].tensors, data = slot.data,
                        size = slot.size] {
      written = OutOfMemoryAsStatus(names[pc.tensor].name, [&]() -> Status {
        if (pc.last == pc.tensor) {
          CKPT_RETURN_IF_ERROR(writer->Append(data, size),
                               "parameter '" + names[pc.tensor].name + "'");
        } else {
          CKPT_RETURN_IF_ERROR(
              writer->AppendTensors(data, size),
              "parameters '" + names[pc.tensor].name + "' to '" + names[pc.last].name + "'");
        }
        return Status::Ok();
      });
    };
    if (!behind.Start(write)) write();  // no thread: written here
    progress.Add(slot.size);
    return Status::Ok();
  };
  // A frozen tensor that does not go through a slot is read whole: it is read and written on
  // this thread with nothing read ahead, so its stored and converted copies are the only large
  // buffers (as documented).
  auto frozen = [&](size_t i) {
    if (pieces[i].tensor == kNoTensor) return false;
    const PlannedTensor& t = files[pieces[i].file].tensors[pieces[i].tensor];
    return t.param->frozen && !frozen_in_slot(t);
  };
  for (size_t i = 0; i < pieces.size();) {
    if (frozen(i)) {
      CKPT_RETURN_IF_ERROR(produce(i, 0), "");
      CKPT_RETURN_IF_ERROR(consume(i, 0), "");
      CKPT_RETURN_IF_ERROR(wait_written(), "");  // before its buffers are read into again
      ++i;
      continue;
    }
    size_t j = i;
    while (j < pieces.size() && !frozen(j)) ++j;
    Status run = RunAhead(
        j - i, kAhead, [&](uint64_t u, int k) { return produce(i + u, k); },
        [&](uint64_t u, int k) { return consume(i + u, k); }, /*producers=*/1, /*held=*/1);
    Status last = wait_written();
    CKPT_RETURN_IF_ERROR(run.ok() ? last : run, "");
    i = j;
  }
  if (writer) CKPT_RETURN_IF_ERROR(finish_file(), "");
  progress.Finish();

  // 4. Everything read has matched its checksum.
  CKPT_RETURN_IF_ERROR(src->FinishVerification({std::string(kMaster)}), src->dir());
  report.bytes_read = src->bytes_read();

  // 5. Index.
  if (sharded) {
    nlohmann::json index;
    index["metadata"] = {{"total_size", report.total_size}};
    if (!report.tied.empty()) index["metadata"]["tied_weights"] = tied;
    nlohmann::json map = nlohmann::json::object();
    for (const auto& f : report.files)
      for (const auto& t : f.tensors) map[t] = f.name;
    index["weight_map"] = map;
    CKPT_RETURN_IF_ERROR(WriteFileAtomic(env, staged.staging() + "/model.safetensors.index.json",
                                         index.dump(2) + "\n"),
                         "write index");
  }
  // 6. Publish.
  CKPT_RETURN_IF_ERROR(staged.Commit(), "");
  return report;
}

// ---- CheckExport ---------------------------------------------------------------------------

namespace {

constexpr const char* kIndexFile = "model.safetensors.index.json";
constexpr const char* kSingleFile = "model.safetensors";

bool IsShardName(const std::string& name) {
  return name.rfind("model-", 0) == 0 && name.find("-of-") != std::string::npos &&
         name.size() > 12 && name.compare(name.size() - 12, 12, ".safetensors") == 0;
}

// The metadata every file of one export shares.
struct ExportIdentity {
  std::string file;
  std::map<std::string, std::string> values;
};

std::map<std::string, std::string> IdentityOf(const safetensors::SafetensorsHeader& h) {
  std::map<std::string, std::string> v;
  for (const char* key : {"ckpt_tag", "ckpt_global_step", "ckpt_dtype", "tied_weights"}) {
    auto it = h.metadata.find(key);
    // Escaped whole when not printable (compared between shards, then quoted).
    v[key] =
        it == h.metadata.end() ? std::string("(absent)") : Shown(it->second, it->second.size());
  }
  return v;
}

}  // namespace

bool IsSafetensorsExport(const std::string& path) {
  std::error_code ec;
  if (std::filesystem::is_regular_file(path, ec))
    return path.size() > 12 && path.compare(path.size() - 12, 12, ".safetensors") == 0;
  if (!std::filesystem::is_directory(path, ec)) return false;
  for (const auto& e : std::filesystem::directory_iterator(path, ec)) {
    const std::string name = e.path().filename().string();
    if (name == kSingleFile || name == kIndexFile || IsShardName(name)) return true;
  }
  return false;
}

namespace {

// What the headers of the checked files say, for the index check.
struct HeadersSeen {
  std::optional<ExportIdentity> first;             // the first readable file's identity
  std::map<std::string, std::string> tensor_file;  // tensor -> file
  uint64_t total_size = 0;                         // tensor bytes of all files
};

// An indexed export's files: the ones its index lists (or, without a readable index, the
// shards present), with the layout problems (unlisted shards, a single file beside the index)
// in c.problems; *index holds the index when it is readable.
void ListIndexedFiles(const std::vector<std::string>& shards, bool single, ExportCheck& c,
                      std::vector<std::string>& files, std::optional<nlohmann::json>& index) {
  auto text = Env::Default()->ReadFileToString(c.dir + "/" + kIndexFile);
  nlohmann::json j;
  if (text.ok()) {
    auto parsed = ParseJson(*text, kIndexFile);
    j = parsed.ok() ? std::move(*parsed) : nlohmann::json(nlohmann::json::value_t::discarded);
  }
  if (!text.ok()) {
    c.problems.push_back({kIndexFile, "", text.status().message()});
  } else if (j.is_discarded() || !j.is_object() || !j.contains("weight_map") ||
             !j["weight_map"].is_object()) {
    c.problems.push_back({kIndexFile, "", "not a safetensors index (JSON with weight_map)"});
  } else {
    index = std::move(j);
  }
  if (single) c.problems.push_back({kSingleFile, "", "present next to a sharded export's index"});
  std::set<std::string> listed;
  if (index) {
    for (const auto& [tensor, file] : (*index)["weight_map"].items()) {
      if (!file.is_string()) {
        c.problems.push_back({kIndexFile, Shown(tensor), "weight_map entry is not a file name"});
        continue;
      }
      listed.insert(file.get<std::string>());
    }
  }
  for (const auto& name : listed) {
    if (name.find('/') != std::string::npos || !IsShardName(name)) {
      c.problems.push_back(
          {kIndexFile, "", "weight_map names '" + Shown(name) + "', not a shard of this directory"});
      continue;
    }
    files.push_back(name);
  }
  for (const auto& name : shards)
    if (index && !listed.count(name))
      c.problems.push_back({name, "", "shard not listed in " + std::string(kIndexFile)});
  if (!index) files = shards;
}

// The files to check (relative to c.dir, which this sets) and the index when there is one.
Status ListExportFiles(const std::string& path, ExportCheck& c, std::vector<std::string>& files,
                       std::optional<nlohmann::json>& index) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::exists(path, ec)) return NotFound(path + ": no such file or directory");
  if (!fs::is_directory(path, ec)) {
    const fs::path p(path);
    c.dir = p.has_parent_path() ? p.parent_path().string() : ".";
    files.push_back(p.filename().string());
    return Status::Ok();
  }
  c.dir = TrimSlashes(path);
  std::vector<std::string> shards;
  bool single = false, has_index = false;
  for (const auto& e : fs::directory_iterator(path, ec)) {
    const std::string name = e.path().filename().string();
    if (name == kSingleFile)
      single = true;
    else if (name == kIndexFile)
      has_index = true;
    else if (IsShardName(name))
      shards.push_back(name);
  }
  if (ec) return IOError(path + ": list: " + ec.message());
  std::sort(shards.begin(), shards.end());
  if (!single && !has_index && shards.empty())
    return NotFound(path + ": no safetensors export here (model.safetensors or " +
                    std::string(kIndexFile) + ")");
  if (has_index) {
    ListIndexedFiles(shards, single, c, files, index);
  } else if (single) {
    files.push_back(kSingleFile);
    for (const auto& name : shards)
      c.problems.push_back({name, "", "shard next to a single-file export"});
  } else {
    c.problems.push_back(
        {kIndexFile, "",
         "missing: the directory holds shards (" + shards.front() + ", ...) but no index"});
    files = shards;
  }
  return Status::Ok();
}

// One file: header (+ header digest), identity, tag, and with deep the data.
void CheckExportFile(const std::string& name, const CheckExportOptions& opts, ExportCheck& c,
                     HeadersSeen& seen) {
  const std::string file_path = c.dir + "/" + name;
  c.files.push_back(name);
  auto h = safetensors::ReadSafetensorsHeader(file_path);
  if (!h.ok()) {
    c.problems.push_back({name, "", h.status().message()});
    return;
  }
  if (!h->checksummed) c.checksummed = false;
  ExportIdentity id{name, IdentityOf(*h)};
  if (!opts.expected_tag.empty() && id.values["ckpt_tag"] != opts.expected_tag) {
    c.problems.push_back(
        {name, "",
         "export of tag '" + id.values["ckpt_tag"] + "', expected '" + opts.expected_tag + "'"});
    ++c.tag_mismatches;
  }
  if (!seen.first) {
    seen.first = id;
  } else {
    for (const auto& [key, value] : id.values)
      if (seen.first->values[key] != value)
        c.problems.push_back({name, "",
                              "__metadata__ '" + key + "' is '" + value + "' but " +
                                  seen.first->file + " has '" + seen.first->values[key] + "'"});
  }
  for (const auto& t : h->tensors) {
    seen.tensor_file[t.name] = name;
    seen.total_size += t.end - t.begin;
  }
  if (opts.deep) {
    auto bad = safetensors::VerifySafetensorsData(file_path, *h);
    if (!bad.ok()) {
      c.problems.push_back({name, "", bad.status().message()});
    } else {
      for (const auto& m : *bad) c.problems.push_back({name, m.tensor, m.what});
    }
  }
}

// The index against the headers: every tensor listed where it is stored, total_size and
// tied_weights as the shards record them.
void CheckIndexAgainstHeaders(const nlohmann::json& index, HeadersSeen& seen, ExportCheck& c) {
  const auto& map = index["weight_map"];
  std::set<std::string> unreadable;  // listed files whose header failed: reported already
  for (const auto& p : c.problems)
    if (p.dataset.empty()) unreadable.insert(p.file);
  for (const auto& [tensor, file] : map.items()) {
    if (!file.is_string()) continue;
    const std::string f = file.get<std::string>();
    auto it = seen.tensor_file.find(tensor);
    if (it == seen.tensor_file.end()) {
      if (!unreadable.count(f))
        c.problems.push_back(
            {kIndexFile, Shown(tensor), "listed in " + Shown(f) + ", which does not hold it"});
    } else if (it->second != f) {
      c.problems.push_back(
          {kIndexFile, Shown(tensor), "listed in " + Shown(f) + " but stored in " + it->second});
    }
  }
  for (const auto& [tensor, file] : seen.tensor_file)
    if (!map.contains(tensor))
      c.problems.push_back({file, tensor, "not listed in " + std::string(kIndexFile)});
  const auto& meta = index.value("metadata", nlohmann::json::object());
  if (!meta.is_object() || !meta.contains("total_size") ||
      !meta["total_size"].is_number_unsigned() ||
      meta["total_size"].get<uint64_t>() != seen.total_size) {
    c.problems.push_back(
        {kIndexFile, "",
         "metadata.total_size " +
             (meta.is_object() && meta.contains("total_size") ? JsonText(meta["total_size"])
                                                              : std::string("missing")) +
             " differs from the shards' " + std::to_string(seen.total_size) + " tensor bytes"});
  }
  if (seen.first) {
    const std::string shard_tied = seen.first->values["tied_weights"];
    const nlohmann::json index_tied =
        meta.is_object() && meta.contains("tied_weights") ? meta["tied_weights"] : nlohmann::json();
    nlohmann::json parsed_shard_tied;  // null when absent; discarded (equal to nothing) if bad
    if (shard_tied != "(absent)") {
      auto parsed = ParseJson(shard_tied, "tied_weights");  // depth-bounded: free text
      parsed_shard_tied =
          parsed.ok() ? std::move(*parsed) : nlohmann::json(nlohmann::json::value_t::discarded);
    }
    if (index_tied != parsed_shard_tied)
      c.problems.push_back({kIndexFile, "",
                            "metadata.tied_weights differs from the shards' "
                            "__metadata__ tied_weights"});
  }
}

}  // namespace

Result<ExportCheck> CheckExport(const std::string& path, const CheckExportOptions& opts) {
  ExportCheck c;
  std::vector<std::string> files;  // to check, relative to c.dir
  std::optional<nlohmann::json> index;
  CKPT_RETURN_IF_ERROR(ListExportFiles(path, c, files, index));
  HeadersSeen seen;
  for (const auto& name : files) CheckExportFile(name, opts, c, seen);
  if (index) CheckIndexAgainstHeaders(*index, seen, c);
  return c;
}

}  // namespace ckpt::convert
