// The small collective interface the commit protocol needs. The format library knows nothing
// of MPI: engine_min implements this with MPI, `ckpt synth` with threads (ThreadGroup).
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "ckpt/status.h"

namespace ckpt {

// All calls are collective: every rank of the group calls them in the same order.
//
// Collectives and background saves: AsyncSaver (async_saver.h) calls the collective from its
// own thread while the rank's main thread goes on training. An implementation used there must
// (1) be callable from a thread other than the one that created it, and (2) not share its
// message matching with traffic the main thread sends meanwhile. Give the saver its own
// instance: with threads, a second ThreadGroup; with MPI, a communicator of its own
// (MPI_Comm_dup) in a process initialised with MPI_THREAD_MULTIPLE (engine_min's
// MpiCollective does both and falls back to synchronous saves when the MPI library provides a
// lower thread level). Every rank's saver then issues its collectives in the same order, since
// saves persist one at a time in call order.
class Collective {
 public:
  virtual ~Collective() = default;
  virtual int rank() const = 0;
  virtual int world_size() const = 0;
  virtual Status Barrier() = 0;
  // Rank 0 receives every rank's payload in rank order; other ranks receive an empty vector.
  virtual Result<std::vector<std::string>> Gather(std::string_view payload) = 0;
  // Every rank receives rank 0's payload (the argument is ignored elsewhere).
  virtual Result<std::string> Broadcast(std::string_view payload) = 0;
};

// A one-rank group (world size 1).
class SingleCollective final : public Collective {
 public:
  int rank() const override { return 0; }
  int world_size() const override { return 1; }
  Status Barrier() override { return Status::Ok(); }
  Result<std::vector<std::string>> Gather(std::string_view p) override {
    return std::vector<std::string>{std::string(p)};
  }
  Result<std::string> Broadcast(std::string_view p) override { return std::string(p); }
};

// N ranks as N threads of one process. ThreadGroup owns the shared state; ForRank(r) gives
// rank r's Collective (owned by the group, valid while it lives). Thread-safe across ranks.
class ThreadGroup {
 public:
  explicit ThreadGroup(int world_size);
  ~ThreadGroup();
  Collective& ForRank(int rank);
  // A rank that cannot take part any more (its thread failed outside the collective calls, e.g.
  // out of memory) aborts the group: every pending and later collective call of every rank
  // returns `status` (an error) instead of waiting for it forever. Thread-safe.
  void Abort(const Status& status);

 private:
  struct Shared;
  class RankView;
  std::unique_ptr<Shared> shared_;
  std::vector<std::unique_ptr<RankView>> views_;
};

}  // namespace ckpt
