// Saving every rank of a checkpoint from one process, a few ranks at a time (`ckpt reshard`).
//
// SaveCheckpoint is collective: every rank's contents are in memory while the files are
// written. SaveRanks runs the same commit protocol (ckpt/src/writer.cc: steps 1 and 5-8 once,
// steps 2-3 for each rank in turn) on a small pool of threads, and asks for each rank's
// contents only when a thread is free to write them, so at most `threads` ranks' contents
// exist at once however many ranks the checkpoint has.
#pragma once

#include <functional>
#include <string>

#include "ckpt/manifest.h"
#include "ckpt/status.h"
#include "ckpt/writer.h"

namespace ckpt {

// Writes one rank's file from `contents` (steps 2-3: rank_<r>.h5 written, hashed and fsynced
// in the temporary directory). Called at most once per rank; the contents may be freed when it
// returns.
using WriteRankFn = std::function<Status(const RankContents& contents)>;

// Builds rank `rank`'s contents and passes them to `write` (once). Runs on one of SaveRanks'
// threads; different ranks may run concurrently.
using ProduceRankFn = std::function<Status(int rank, const WriteRankFn& write)>;

// Saves a checkpoint of meta.topology.dp_world_size ranks under `root` with the commit protocol
// of SaveCheckpoint (the same lock, temporary directory, manifest, atomic rename, `latest` and
// retention): ranks are handed out in order to min(threads, world) threads (threads < 1: 1),
// each calling produce(rank, write). Once a rank fails no further rank is started; nothing is
// committed and the temporary directory is removed. Returns the error of the lowest failing
// rank, or what SaveCheckpoint's rank 0 would return. options.compress_threads 0 means
// hardware concurrency / threads. A producer that does not call `write` fails its rank
// (Internal).
Status SaveRanks(const std::string& root, const Manifest& meta, int threads,
                 const ProduceRankFn& produce, const SaveOptions& options = {});

}  // namespace ckpt
