#include "ckpt/run_ahead.h"

#include <pthread.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdlib>
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
    return StartThread(std::move(task));
  }

  // Starts threads until n (at most kMaxIdle) are idle, each past its first allocation, and
  // returns once the threads it started are idle (or have ended: kMaxIdle were idle already),
  // or once no further thread can be started. Only its own threads count: a task of another
  // caller returning meanwhile does not end the wait.
  void Ready(int n) {
    std::unique_lock<std::mutex> lock(mu_);
    const int want = std::min(n, kMaxIdle) - idle_;
    int pending = 0;  // this call's threads not yet idle, under mu_
    for (int started = 0; started < want; ++started) {
      ++pending;
      lock.unlock();
      const bool ok = StartThread(&TouchArena, &pending);
      lock.lock();
      if (!ok) {
        --pending;
        break;
      }
    }
    ready_cv_.wait(lock, [&] { return pending == 0; });
  }

 private:
  static constexpr int kMaxIdle = 16;

  // A thread's first allocation attaches it to a malloc arena (a new one maps 64 MiB of
  // address space): done while the thread is started, not in the middle of a transfer.
  static void TouchArena() {
    void* volatile p = std::malloc(64);
    std::free(p);
  }

  // `pending` (Ready's count, under mu_): decremented once the thread is idle after `task`.
  bool StartThread(std::function<void()> task, int* pending = nullptr) {
    try {
      std::thread([this, t = std::move(task), pending]() mutable {
        Serve(std::move(t), pending);
      }).detach();
    } catch (const std::exception&) {  // a thread limit, no memory
      return false;
    }
    return true;
  }

  static Workers*& Instance() {
    static Workers* instance = nullptr;
    return instance;
  }

  void Serve(std::function<void()> task, int* pending) {
    while (true) {
      task();
      task = nullptr;
      std::unique_lock<std::mutex> lock(mu_);
      if (pending) {  // idle from here, or about to end: Ready's wait for it is over
        --*pending;
        pending = nullptr;
        ready_cv_.notify_all();
      }
      if (idle_ >= kMaxIdle) return;
      ++idle_;
      cv_.wait(lock, [&] { return !tasks_.empty(); });
      task = std::move(tasks_.back());
      tasks_.pop_back();
    }
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::condition_variable ready_cv_;
  int idle_ = 0;  // threads waiting for a task, less the tasks handed to them not yet taken
  std::vector<std::function<void()>> tasks_;
};

}  // namespace

bool Helpers::Start(std::function<void()> task) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    ++running_;
  }
  // The last thing a task does is leave this object behind: it notifies under the lock, so
  // Join cannot return (and the object go) before it lets go of the lock.
  const bool ok = Workers::Get().Run([this, t = std::move(task)] {
    t();
    std::lock_guard<std::mutex> lock(mu_);
    --running_;
    cv_.notify_all();
  });
  if (!ok) {
    std::lock_guard<std::mutex> lock(mu_);
    --running_;
    return false;
  }
  ++started_;
  return true;
}

void Helpers::Join() {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return running_ == 0; });
}

void KeepHelpersReady(int n) { Workers::Get().Ready(n); }

std::vector<Status> ForEachOnThreads(size_t n, int threads,
                                     const std::function<Status(size_t i)>& body) {
  std::vector<Status> results(n, Status::Ok());
  std::atomic<size_t> next{0};
  auto work = [&] {
    for (size_t i; (i = next++) < n;)
      results[i] = OutOfMemoryAsStatus("item " + std::to_string(i), [&] { return body(i); });
  };
  Helpers helpers;
  for (size_t t = 1; t < std::min<size_t>(n, static_cast<size_t>(std::max(threads, 1))); ++t)
    if (!helpers.Start(work)) break;
  work();
  helpers.Join();
  return results;
}

Status RunAhead(uint64_t n, int slots, const std::function<Status(uint64_t i, int slot)>& produce,
                const std::function<Status(uint64_t i, int slot)>& consume, int producers,
                int held) {
  return RunAheadOnProducers(
      n, slots, [&](uint64_t i, int slot, int) { return produce(i, slot); }, consume, producers,
      held);
}

Status RunAheadOnProducers(uint64_t n, int slots,
                           const std::function<Status(uint64_t i, int slot, int producer)>& produce,
                           const std::function<Status(uint64_t i, int slot)>& consume,
                           int producers, int held) {
  const uint64_t depth = static_cast<uint64_t>(std::max(slots, 1));
  // Items consumed but still holding their slot (their consumer's work may still run on it).
  const uint64_t behind = std::min<uint64_t>(static_cast<uint64_t>(std::max(held, 0)), depth - 1);
  std::mutex mu;
  std::condition_variable cv;
  uint64_t next = 0;      // the next item a producer claims
  uint64_t released = 0;  // items [0, released) are done; their slots are free
  bool stop = false;      // no further item is claimed (an error, or the consumer is done)
  // Per slot: the item it holds once produced (n: none yet) and how its production went.
  std::vector<uint64_t> done(depth, n);
  std::vector<Status> result(depth);

  auto producer = [&](int t) {
    while (true) {
      uint64_t i;
      {
        std::unique_lock<std::mutex> lock(mu);
        cv.wait(lock, [&] { return stop || next >= n || next < released + depth; });
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
  // A single item has nothing to overlap with: it runs on the calling thread (a one-request
  // read does not pay for starting a thread).
  const int wanted = n <= 1 ? 0 : static_cast<int>(std::min<uint64_t>(std::max(producers, 1), n));
  Helpers helpers;  // declared after the state its tasks use: joined before that goes
  for (int t = 0; t < wanted; ++t) {
    if (!helpers.Start([&, t] { producer(t); })) break;  // fewer producers
  }
  const int started = helpers.started();
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
    released = i + 1 >= behind ? i + 1 - behind : 0;
    done[i % depth] = n;
    if (!status.ok()) stop = true;
    cv.notify_all();
    if (!status.ok()) break;
  }
  {
    std::lock_guard<std::mutex> lock(mu);
    stop = true;
  }
  cv.notify_all();
  helpers.Join();
  return status;
}

}  // namespace ckpt
