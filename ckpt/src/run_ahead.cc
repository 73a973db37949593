#include "ckpt/run_ahead.h"

#include <pthread.h>

#include <algorithm>
#include <condition_variable>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace ckpt {
namespace {

// Threads kept for the next RunAhead. Starting a thread maps its stack (and, at its first
// allocation, a malloc arena) and ending one hands the stack's pages back: each takes the
// process's address-space lock for writing, which waits behind every page fault in progress.
// While an export's buffers are first touched (on the development VM fresh memory in 2 MiB
// pages faulted at 0.3 GiB/s once the host had taken it back), a new thread took 40-90 ms to
// start, and an export started its threads for every 8 MiB block (docs/performance.md,
// 2026-12-03 16:30). A task runs on an idle kept thread or, when none is idle, on a new one
// (so nested RunAheads never wait for a thread); at most kMaxIdle threads wait for work.
class Workers {
 public:
  // Never destroyed: idle threads wait on it until the process ends.
  static Workers& Get() {
    static const bool once = [] {
      Instance() = new Workers;
      // A child of fork() has none of the parent's threads: it starts with no idle ones.
      pthread_atfork(nullptr, nullptr, [] { Instance() = new Workers; });
      return true;
    }();
    (void)once;
    return *Instance();
  }

  // Runs `task` on a thread; false when no thread can be started (the task did not run).
  bool Run(std::function<void()> task) {
    std::unique_lock<std::mutex> lock(mu_);
    if (idle_ > 0) {
      --idle_;
      tasks_.push_back(std::move(task));
      cv_.notify_one();
      return true;
    }
    lock.unlock();
    try {
      std::thread([this, t = std::move(task)]() mutable { Serve(std::move(t)); }).detach();
    } catch (const std::exception&) {  // a thread limit, no memory
      return false;
    }
    return true;
  }

 private:
  static constexpr int kMaxIdle = 16;

  static Workers*& Instance() {
    static Workers* instance = nullptr;
    return instance;
  }

  void Serve(std::function<void()> task) {
    while (true) {
      task();
      task = nullptr;
      std::unique_lock<std::mutex> lock(mu_);
      if (idle_ >= kMaxIdle) return;
      ++idle_;
      cv_.wait(lock, [&] { return !tasks_.empty(); });
      task = std::move(tasks_.back());
      tasks_.pop_back();
    }
  }

  std::mutex mu_;
  std::condition_variable cv_;
  int idle_ = 0;  // threads waiting for a task, less the tasks handed to them not yet taken
  std::vector<std::function<void()>> tasks_;
};

}  // namespace

Status RunAhead(uint64_t n, int slots, const std::function<Status(uint64_t i, int slot)>& produce,
                const std::function<Status(uint64_t i, int slot)>& consume, int producers) {
  return RunAheadOnProducers(
      n, slots, [&](uint64_t i, int slot, int) { return produce(i, slot); }, consume, producers);
}

Status RunAheadOnProducers(
    uint64_t n, int slots, const std::function<Status(uint64_t i, int slot, int producer)>& produce,
    const std::function<Status(uint64_t i, int slot)>& consume, int producers) {
  const uint64_t depth = static_cast<uint64_t>(std::max(slots, 1));
  std::mutex mu;
  std::condition_variable cv;
  uint64_t next = 0;      // the next item a producer claims
  uint64_t consumed = 0;  // items [0, consumed) are done; their slots are free
  bool stop = false;      // no further item is claimed (an error, or the consumer is done)
  // Per slot: the item it holds once produced (n: none yet) and how its production went.
  std::vector<uint64_t> done(depth, n);
  std::vector<Status> result(depth);

  auto producer = [&](int t) {
    while (true) {
      uint64_t i;
      {
        std::unique_lock<std::mutex> lock(mu);
        cv.wait(lock, [&] { return stop || next >= n || next < consumed + depth; });
        if (stop || next >= n) return;
        i = next++;
      }
      Status s = produce(i, static_cast<int>(i % depth), t);
      std::lock_guard<std::mutex> lock(mu);
      if (!s.ok()) stop = true;  // the items claimed before i still finish
      result[i % depth] = std::move(s);
      done[i % depth] = i;
      cv.notify_all();
    }
  };
  int running = 0;  // producers started and not yet returned (under mu)
  // A single item has nothing to overlap with: it runs on the calling thread (a one-request
  // read does not pay for starting a thread).
  const int wanted = n <= 1 ? 0 : static_cast<int>(std::min<uint64_t>(std::max(producers, 1), n));
  int started = 0;
  for (int t = 0; t < wanted; ++t, ++started) {
    {
      std::lock_guard<std::mutex> lock(mu);
      ++running;
    }
    // The last thing a producer does is leave this function's state behind: it notifies under
    // the lock, so the wait below cannot end (and the state go) before it lets go of the lock.
    const bool ok = Workers::Get().Run([&, t] {
      producer(t);
      std::lock_guard<std::mutex> lock(mu);
      --running;
      cv.notify_all();
    });
    if (!ok) {  // fewer producers
      std::lock_guard<std::mutex> lock(mu);
      --running;
      break;
    }
  }
  if (started == 0) {
    for (uint64_t i = 0; i < n; ++i) {
      CKPT_RETURN_IF_ERROR(produce(i, static_cast<int>(i % depth), 0), "");
      CKPT_RETURN_IF_ERROR(consume(i, static_cast<int>(i % depth)), "");
    }
    return Status::Ok();
  }
  Status status = Status::Ok();
  for (uint64_t i = 0; i < n; ++i) {
    {
      std::unique_lock<std::mutex> lock(mu);
      cv.wait(lock, [&] { return done[i % depth] == i; });
      status = result[i % depth];
    }
    if (status.ok()) status = consume(i, static_cast<int>(i % depth));
    std::lock_guard<std::mutex> lock(mu);
    consumed = i + 1;
    done[i % depth] = n;
    if (!status.ok()) stop = true;
    cv.notify_all();
    if (!status.ok()) break;
  }
  std::unique_lock<std::mutex> lock(mu);
  stop = true;
  cv.notify_all();
  cv.wait(lock, [&] { return running == 0; });
  return status;
}

}  // namespace ckpt
