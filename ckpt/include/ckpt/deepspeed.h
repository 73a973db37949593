// Reading a DeepSpeed ZeRO checkpoint (stage 1, 2 or 3; fp32, fp16 or bf16 training) natively:
// the `.pt` files are opened as zip archives and their pickles read by the restricted unpickler
// (ckpt/torch_pickle.h), so nothing in them is executed and DeepSpeed need not be installed.
// docs/deepspeed.md describes the layout (with the DeepSpeed source lines it follows) and how
// it maps onto a ckpt manifest.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "ckpt/env.h"
#include "ckpt/manifest.h"
#include "ckpt/reader.h"
#include "ckpt/status.h"

namespace ckpt {

inline constexpr std::string_view kDeepSpeedKind = "deepspeed";

// The tag directory `path` names when it is a DeepSpeed checkpoint: `path` itself when it
// holds a *_model_states.pt or *_optim_states.pt file, else path/<tag>, else path/<the tag in
// path/latest>. Empty when `path` is not one (neither kind of file there). A directory with one
// kind and not the other is a damaged DeepSpeed checkpoint: DeepSpeedReader::Open names the
// missing file.
std::string DeepSpeedTagDir(const std::string& path, const std::string& tag = "",
                            Env* env = nullptr);

// What the files say beyond the manifest.
struct DeepSpeedInfo {
  std::string ds_version;
  std::string optimizer;     // "DeepSpeedZeroOptimizer", "BF16_Optimizer", "DeepSpeedZeroOptimizer_Stage3"
  std::string model_dtype;   // "fp32", "bf16", "fp16"
  std::vector<std::string> model_files;  // relative to the tag directory
  std::vector<std::string> optim_files;  // one per data-parallel rank, rank order
  std::vector<std::string> buffers;      // persistent buffers (exported like frozen tensors)
  std::vector<int64_t> group_partition;  // per optimizer group: per-rank partition elements
  nlohmann::json lr_scheduler;           // the scheduler's state_dict as JSON
  bool elastic = false;                  // base optimizer state saved without padding
};

// Not thread-safe (keeps libzip handles); movable. Open one per thread.
class DeepSpeedReader {
 public:
  // `path`: a DeepSpeed checkpoint root (opens `tag`, or what `latest` names) or a tag
  // directory. Parses every model-states and optimizer-states file and validates the layout
  // before returning: one optimizer file per rank with none missing, equal partition counts,
  // stage and group counts across ranks, partitions that hold every parameter of
  // param_shapes, storages that fit their views. Errors name the file: NotFound (no such
  // checkpoint), DataLoss (damaged or inconsistent files, refused pickles), Unimplemented
  // (tensor/pipeline-parallel or MoE checkpoints, NVMe-offloaded state).
  static Result<DeepSpeedReader> Open(const std::string& path, const std::string& tag = "",
                                      Env* env = nullptr);
  struct OpenOptions {
    // Each file's zip records read to their end and their CRC-32 checked (as Check does) by
    // the thread that opened the file, right after its open, while the other files are still
    // being opened: Check() then reports those results and reads nothing. A file whose open
    // failed is not read; an Open that fails reports only its own error, as without. Every
    // file the listing holds is read, also a model file the checkpoint's stage does not use.
    bool check_records = false;
    bool progress = false;  // with check_records: a bar on a TTY over the files' bytes
  };
  static Result<DeepSpeedReader> Open(const std::string& path, const std::string& tag, Env* env,
                                      const OpenOptions& options);
  DeepSpeedReader(DeepSpeedReader&&) noexcept;
  DeepSpeedReader& operator=(DeepSpeedReader&&) noexcept;
  ~DeepSpeedReader();

  // The checkpoint as a ckpt manifest (kind "deepspeed"): parameter table (trainable with
  // ranges into each rank's concatenated optimizer groups, frozen, buffers as frozen, tied
  // aliases), topology, counters, AdamW hyper-parameters and step, dtypes, client state and
  // ds_config (engine_config). `files` lists the .pt files (no checksums: DeepSpeed stores
  // none).
  const Manifest& manifest() const;
  const DeepSpeedInfo& info() const;
  const std::string& dir() const;  // the tag directory

  // fp32 elements [begin, end) of a trainable parameter's master / exp_avg / exp_avg_sq, read
  // lazily from the partitions that hold them. Aliases read their owner.
  Status ReadParamRange(std::string_view param, std::string_view state, int64_t begin,
                        int64_t end, float* out);
  // fp32 elements [offset, offset + count) of rank r's partition of `state` (its optimizer
  // groups one after the other: the space the parameters' ranges' shard_offset index). The
  // padding DeepSpeedZeroOptimizer strips from each group when it saves reads as zeros.
  // InvalidArgument for a range outside the partition (info().group_partition's sum).
  Status ReadPartition(int r, std::string_view state, int64_t offset, int64_t count, float* out);
  // Where element `offset` of rank r's partition of `state` lies in its optimizer file, when its
  // group's fp32 tensor is stored contiguous and uncompressed; nullopt otherwise (for a
  // moment the optimizer has not written yet, or for the stripped padding). For
  // StateSource::ReadShift.
  std::optional<uint64_t> PartitionFileOffset(int r, std::string_view state, int64_t offset);
  // A frozen parameter's (or buffer's) bytes in its stored dtype (manifest dtype and shape),
  // the CRC-32 of each storage record they come from checked (the record read whole).
  Result<std::vector<uint8_t>> ReadFrozenBytes(std::string_view param);
  // The same into the caller's memory (`bytes`: numel x the dtype's size, else InvalidArgument).
  Status ReadFrozenInto(std::string_view param, void* out, uint64_t bytes);
  // Where a frozen parameter's first byte lies in its model file, when one tensor stored
  // contiguous and uncompressed holds all of it; nullopt otherwise. For
  // StateSource::FrozenReadShift.
  std::optional<uint64_t> FrozenFileOffset(std::string_view param);

  // Stream verification (StateSource's stream_verify). From this call on, ReadParamRange and
  // ReadPartition keep a running CRC-32 of each fp32 storage record they read front to back:
  // a read that starts past the last one's end has the bytes between read and included, one
  // that starts before it leaves the record to VerifyStates. With `defer`, the CRC of a read's
  // bytes is left to HashReadBytes() (which another thread may call while this one reads on);
  // the caller keeps the bytes unchanged where they were read until a HashReadBytes() call that
  // began after the read returned.
  void StreamVerify(bool defer);
  void HashReadBytes();
  // From this call on, the first read from an optimizer-file record checks the whole record's
  // CRC-32 first (TorchFile::VerifyStorage; StateSource's verify_reads).
  void VerifyOnFirstRead();
  // Checks the CRC-32 of every optimizer-file record holding `states` (share `part` of `parts`,
  // by index in rank, state, group order): a stream's remaining tail is read and its CRC
  // compared; a record read out of order or not at all is read whole (TorchFile::VerifyStorage).
  // DataLoss naming the file and the record on a mismatch. Ends the streams.
  Status VerifyStates(const std::vector<std::string>& states, int part, int parts);
  // Reads every record of every file to its end, once, and checks its CRC-32 (the files in
  // parallel; with `progress`, a bar on a TTY), and reports what fails; structural problems
  // (the parameter table against the partitions, views against their storages) already
  // stopped Open, so nothing is read again through the table. Empty = healthy. After an Open
  // with check_records, reports what that read found and reads nothing.
  Result<std::vector<Problem>> Check(bool progress = false);
  uint64_t bytes_read() const;

 private:
  struct Impl;
  explicit DeepSpeedReader(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace ckpt
