#include "ckpt/run_ahead.h"

#include <algorithm>
#include <condition_variable>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

namespace ckpt {

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
  std::vector<std::thread> threads;
  // A single item has nothing to overlap with: it runs on the calling thread (a one-request
  // read does not pay for starting a thread).
  const int wanted = n <= 1 ? 0 : static_cast<int>(std::min<uint64_t>(std::max(producers, 1), n));
  for (int t = 0; t < wanted; ++t) {
    try {
      threads.emplace_back(producer, t);
    } catch (const std::exception&) {  // a thread limit, no memory: fewer producers
      break;
    }
  }
  if (threads.empty()) {
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
  {
    std::lock_guard<std::mutex> lock(mu);
    stop = true;
    cv.notify_all();
  }
  for (auto& t : threads) t.join();
  return status;
}

}  // namespace ckpt
