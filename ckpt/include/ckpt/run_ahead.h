// Overlapping a producer with a consumer: reads ahead of hashing (O_DIRECT reads), reads ahead
// of writes (export-fp32).
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <vector>

#include "ckpt/status.h"

namespace ckpt {

// Runs produce(i, slot) for i = 0 .. n-1 on `producers` helper threads, which claim the items
// in order, and consume(i, slot) for the same i in order on the calling thread; production runs
// at most `slots` items ahead: item i lives in slot i % slots (the caller owns the slots'
// storage) from the start of produce(i) to the end of consume(i). Several producers keep
// several requests in flight (a disk serves one stream of 8 MiB reads at about half the rate of
// two). The first error ends the run: a producer's error is returned once the items before it
// were consumed (no later item is claimed); a consumer's error stops the producers. When no
// thread can be started, or n is 1, the items are produced and consumed alternately on the
// calling thread. slots and producers below 1 count as 1.
//
// held > 0 (less than slots): item i keeps its slot until the end of consume(i + held), not of
// consume(i), so that consume may leave work on its slot running when it returns (export's
// write of a piece, on a helper thread while the next piece is consumed) provided that consume
// (i + held) waits for it; the caller waits for what is still running on the last items' slots
// after RunAhead returns, and before it on an error.
Status RunAhead(uint64_t n, int slots, const std::function<Status(uint64_t i, int slot)>& produce,
                const std::function<Status(uint64_t i, int slot)>& consume, int producers = 1,
                int held = 0);

// As RunAhead; produce also gets the index of the producer running it, 0 .. producers - 1 (0
// on the calling thread), for state kept per producer thread (a zstd context).
Status RunAheadOnProducers(uint64_t n, int slots,
                           const std::function<Status(uint64_t i, int slot, int producer)>& produce,
                           const std::function<Status(uint64_t i, int slot)>& consume,
                           int producers, int held = 0);

// Tasks on kept helper threads (the ones RunAhead's producers run on), waited for together.
// Start runs a task on an idle kept thread or, when none is idle, on a new one (which is kept
// after it for later tasks, up to a limit); Join waits until every task started returned; the
// destructor joins. Starting a thread, and a thread's first allocation (its malloc arena), take
// the process's address-space lock for writing: while buffers are first touched by O_DIRECT
// reads that lock waits behind their page faults (40-90 ms per thread measured on the
// development VM: docs/performance.md, 2026-12-03 16:30 and 20:00).
class Helpers {
 public:
  Helpers() = default;
  ~Helpers() { Join(); }
  Helpers(const Helpers&) = delete;
  Helpers& operator=(const Helpers&) = delete;

  // Runs `task` on a helper thread; false when no thread can be started (the task did not run:
  // the caller does its work itself).
  bool Start(std::function<void()> task);
  void Join();
  int started() const { return started_; }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  int running_ = 0;  // tasks started and not yet returned (under mu_)
  int started_ = 0;  // tasks started (the calling thread's count)
};

// Runs body(i) for every i in [0, n) on up to `threads` threads, the calling one among them,
// each taking the next i as it finishes one: a helper thread that cannot be started leaves
// its share to the others, so every i runs. A failed allocation inside body(i) becomes its
// status (ResourceExhausted). Returns each i's status.
std::vector<Status> ForEachOnThreads(size_t n, int threads,
                                     const std::function<Status(size_t i)>& body);

// Makes sure at least n (at most 16) kept helper threads are idle, each past its first
// allocation, before it returns: a transfer calls it before it touches its fresh buffers, so
// that the threads it then uses start none of the above while those buffers fault in.
void KeepHelpersReady(int n);

}  // namespace ckpt
