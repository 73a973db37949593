// One read interface over every checkpoint ckpt reads: a ckpt checkpoint (a root or a tag
// directory, ckpt/reader.h), a universal directory (ckpt/universal.h) and a DeepSpeed ZeRO
// checkpoint (a root or a tag directory, ckpt/deepspeed.h). OpenStateSource decides what a path
// is; its callers (export-fp32, to-universal, reshard, next-update, inspect, check, diff) never
// branch on the kind of path they were given.
//
// What a source gives: the parameter table, topology, counters, optimizer settings and client
// state as a ckpt Manifest (manifest()), the AdamW hyper-parameters and step of the next update
// (OptimizerHyper), and fp32 range reads of each parameter's master weights and both moments
// (ReadParamRange), verified against the checksums the source records.
//
// Verification. A source opened with stream_verify hashes what it reads: reads of a dataset that
// arrive in increasing offset order (export and to-universal read parameters in table order,
// which is shard order for every partition scheme) are hashed as they pass, with the padding
// between them read and hashed too; FinishVerification() reads the remaining tail and compares
// each digest with the manifest, and streams every dataset that was read out of order or not at
// all. So each byte is read once and still checked. A source opened without it checks nothing
// until FinishVerification(), which then streams every dataset once (reshard's and
// next-update's up-front pass). Whole-dataset reads (ReadFrozenBytes, ReadRankExtra) are always
// checked. A DeepSpeed checkpoint records no checksums of its own: the CRC-32 of the zip
// records holding the states take the digests' place, in the same way (DeepSpeedReader).
//
// Not thread-safe (readers keep open handles); open one source per thread. The exception:
// HashReadBytes() (SourceOptions::defer_stream_hashes).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "ckpt/adamw.h"
#include "ckpt/env.h"
#include "ckpt/manifest.h"
#include "ckpt/reader.h"
#include "ckpt/status.h"

namespace ckpt {

struct DeepSpeedInfo;

enum class SourceKind { kSharded, kUniversal, kDeepSpeed };
// The manifest kind of each: "sharded", "universal", "deepspeed".
std::string_view SourceKindName(SourceKind kind);

// A blob or json dataset of one source rank (RNG state, data position, scheduler, ...).
struct RankExtra {
  std::string name;      // name in the rank file, e.g. "rng/dropout", "data_position"
  DatasetRecord record;  // as listed in the manifest (record.name is the source path)
};

struct SourceOptions {
  std::string tag;             // empty: what `latest` names (or the directory itself)
  Env* env = nullptr;          // nullptr: Env::Default()
  bool stream_verify = false;  // hash ordered reads as they pass (see above)
  // With stream_verify, a sharded or DeepSpeed source leaves the hashing of ordered reads to
  // HashReadBytes(), which another thread may call while this one reads on, so that the
  // reading thread's cycle is the read alone (export-fp32: the writing thread hashes a piece
  // while the next one is read; docs/performance.md, 2026-12-04 16:00). The caller keeps the
  // bytes of each such read unchanged where they were read until a HashReadBytes() call that
  // began after the read returned. Other sources hash as they read.
  bool defer_stream_hashes = false;
  // A sharded source whose reads reach rank r's file for the first time opens rank r + 1's on a
  // helper thread (CheckpointReader::OpenAhead), so that a reader going through the ranks in
  // order does not wait for each file's structure (export-fp32: 1-4 ms per rank file with no
  // request at the disk; docs/performance.md, 2026-12-04 15:10); rank 0's is opened that way
  // as soon as the source is open (2026-12-06 08:00).
  bool open_ahead = false;
  // A sharded source starts every rank file's HDF5 probe at open (with a probe set:
  // ckpt::SetHdf5Probe), one process per core (up to 8) walking several files (h5::ProbeBatch),
  // for a caller that reads every rank's file: a process start is most of a probe's cost, and
  // one per file took export-fp32 of a 64-rank checkpoint from 0.56-0.59 s to 0.69-0.83 on the
  // development VM (docs/reliability.md, "Hostile files"). A caller that reads a few ranks'
  // files (a rank's load) leaves it off: each file it opens is probed alone.
  bool probe_all = false;
  // Every ReadParamRange is verified before it returns: a dataset that records piece digests
  // (format 1.3) by the pieces the range touches, an older one (and a DeepSpeed zip record) by
  // one whole pass the first time it is read (what LoadResharded opens with). Ignored with
  // stream_verify.
  bool verify_reads = false;
  // false: open for the tables only (inspect), without first checking that every rank file
  // exists with its recorded size; data reads still fail on a damaged file.
  bool check_files = true;
};

class StateSource {
 public:
  virtual ~StateSource() = default;

  virtual SourceKind kind() const = 0;
  // Parameter table (name, shape, dtype, frozen, tied_to; trainable entries of a sharded or
  // DeepSpeed source carry their ranges), topology, counters, optimizer, client_state,
  // engine_config. A DeepSpeed source's is built from its files (kind "deepspeed").
  virtual const Manifest& manifest() const = 0;
  virtual const std::string& dir() const = 0;  // the tag directory
  const std::string& tag() const { return manifest().tag; }
  // Data-parallel ranks of the topology that wrote the per-rank state.
  virtual int source_ranks() const = 0;
  // DeepSpeed's own description of its files; nullptr for the other kinds.
  virtual const DeepSpeedInfo* deepspeed() const { return nullptr; }

  // fp32 elements [begin, end) (row-major) of `param`'s `state` (kMaster, kExpAvg, kExpAvgSq).
  // A tied alias reads its owner; a frozen parameter has only kMaster, converted from its
  // stored dtype. InvalidArgument for an unknown state, a range outside the parameter or a
  // frozen parameter's moment, NotFound for an unknown parameter, DataLoss naming the file for
  // damaged data. Every error names the parameter (or the dataset holding it): callers add
  // their own context, not the parameter's name again.
  virtual Status ReadParamRange(std::string_view param, std::string_view state, int64_t begin,
                                int64_t end, float* out) = 0;
  // Elements [begin, end) of one parameter, for ReadParamSlices.
  struct ParamSlice {
    std::string_view param;
    int64_t begin, end;
  };
  // The slices' `state` elements one after the other into `out`, as ReadParamRange reads each;
  // a slice whose stored elements continue the previous one's in the same rank's partition is
  // read with it, so a run of small parameters (a model's norms and biases, the 1 MiB
  // parameters of a DeepSpeed partition) is one large read instead of one per parameter.
  // Errors name the parameters.
  virtual Status ReadParamSlices(const std::vector<ParamSlice>& slices, std::string_view state,
                                 float* out);
  // Where in a 4 KiB block the stored bytes of elements [begin, end) of a trainable
  // parameter's `state` start, when one file holds them all as plain fp32 bytes: a
  // ReadParamRange into memory at that place reads them from the disk straight into it
  // (O_DIRECT, RandomAccessFile::ReadLarge), where other memory gets them through a bounce
  // buffer and a copy (a DeepSpeed source: where the range starts in the optimizer file's
  // uncompressed zip record). nullopt when the range spans files, is stored otherwise
  // (compressed, a universal source) or cannot be placed (the read reports why).
  virtual std::optional<uint64_t> ReadShift(std::string_view param, std::string_view state,
                                            int64_t begin, int64_t end) {
    return std::nullopt;
  }
  // A frozen parameter's stored bytes (its dtype and shape), checksum-verified where the source
  // records checksums. Errors name the parameter or its dataset, as ReadParamRange's.
  virtual Result<std::vector<uint8_t>> ReadFrozenBytes(std::string_view param) = 0;
  // The same into the caller's memory (`bytes`: numel x the stored dtype's size; a dataset of
  // another size is DataLoss), so that a caller reading many frozen parameters reuses one buffer:
  // fresh memory for each cost export-fp32 of a LoRA checkpoint more than its reads
  // (docs/performance.md, 2026-12-05 17:00).
  virtual Status ReadFrozenInto(std::string_view param, void* out, uint64_t bytes) = 0;
  // Where in a 4 KiB block a frozen parameter's stored bytes start, when one record holds them
  // as they are (a DeepSpeed model file's uncompressed tensor): a ReadFrozenInto into memory at
  // that place reads them from the disk straight into it, as ReadShift's. nullopt otherwise.
  virtual std::optional<uint64_t> FrozenReadShift(std::string_view param) { return std::nullopt; }
  // Blob and json datasets of source rank r, and their bytes (checksum-verified).
  virtual std::vector<RankExtra> RankExtras(int r) const = 0;
  virtual Result<std::vector<uint8_t>> ReadRankExtra(int r, const RankExtra& extra) = 0;
  // Stored tensors no reader of parameter state uses (e.g. "compute"), for "not carried over".
  virtual std::vector<std::string> UnusedTensors() const = 0;
  // With SourceOptions::defer_stream_hashes: hashes, in read order, the bytes of the reads
  // returned so far whose hashing was left for later (nothing otherwise). The one call that may
  // run on another thread while this source reads; Verify makes it first.
  virtual void HashReadBytes() {}
  // Checks the XXH3 of every dataset holding `states` of trainable parameters (see above).
  Status FinishVerification(const std::vector<std::string>& states) {
    return Verify(states, 0, 1);
  }
  // One share of that work, for `parts` processes verifying one source together: the datasets
  // whose index (in manifest order) is `part` modulo `parts`.
  virtual Status Verify(const std::vector<std::string>& states, int part, int parts) = 0;
  // Data bytes read so far.
  virtual uint64_t bytes_read() const = 0;

  // The AdamW hyper-parameters and step of the next update: manifest.optimizer (lr, betas or
  // beta1/beta2, eps, weight_decay, step), then rank 0's `scheduler` json (next_lr or lr;
  // optimizer_step or step when the optimizer records none); step defaults to global_step -
  // skipped_steps. `source` (optional) says where lr and step came from. Unimplemented for
  // another optimizer type or groups with different settings; DataLoss for values out of range.
  Result<AdamWHyper> OptimizerHyper(std::string* source = nullptr);
};

// Opens `path`: a DeepSpeed checkpoint (root or tag directory holding *_model_states.pt), a
// universal directory (or a root whose tag is one), or a ckpt checkpoint root or tag directory.
// Every file the source depends on is checked to exist with its recorded size before this
// returns (a damaged checkpoint is DataLoss before any output is written). Errors: NotFound
// (nothing there), DataLoss (damaged), Unimplemented (newer major version, unsupported
// DeepSpeed layout).
Result<std::unique_ptr<StateSource>> OpenStateSource(const std::string& path,
                                                     const SourceOptions& options = {});

// `ckpt inspect --json` of a source: InspectToJson(manifest, dir) plus, for DeepSpeed, a
// "deepspeed" object (ds_version, optimizer, model_dtype, model_files, optim_files, buffers,
// group_partition, lr_scheduler, checksums: false).
nlohmann::json InspectSourceToJson(const StateSource& source);
// The human-readable summary `ckpt inspect` prints.
std::string InspectSourceToText(const StateSource& source);

// What `ckpt check` found in a checkpoint of any kind.
struct SourceCheck {
  SourceKind kind = SourceKind::kSharded;
  std::string dir;  // the tag directory; empty when it could not be resolved
  bool deep = false;
  std::vector<Problem> problems;  // empty: healthy
};
// Checks the checkpoint at `path` (+ tag) the way its kind allows. sharded: manifest, every
// rank file's size, HDF5 structure, dtypes and shapes; with `deep`, every file and dataset
// checksum. universal: manifest, file size; with `deep`, the file and every dataset checksum.
// DeepSpeed: the layout, every zip record's CRC-32 and every tensor read through the parameter
// table (it records no checksums; `deep` adds nothing). A damaged checkpoint is a list of
// problems; an error status only when the check cannot run (NotFound: nothing there).
// `progress`: a bar on a TTY over the bytes a deep check reads.
Result<SourceCheck> CheckSource(const std::string& path, const std::string& tag, bool deep,
                                Env* env = nullptr, bool progress = false);
// `ckpt check --json`: {"ok", "dir" (null when unresolved), "deep", "problems": [{"file",
// "dataset", "what"}]}; a DeepSpeed check adds "kind": "deepspeed", "checksums": false and
// "note".
nlohmann::json SourceCheckToJson(const SourceCheck& check);
// The text `ckpt check` prints ("ok: DIR (...)" or "CORRUPT: N problem(s)" and one line each).
std::string SourceCheckToText(const SourceCheck& check);

}  // namespace ckpt
