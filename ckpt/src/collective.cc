// ThreadGroup: the Collective interface for N ranks that are threads of one process.
#include "ckpt/collective.h"
#include "ckpt/rank_threads.h"

#include <condition_variable>
#include <mutex>
#include <thread>

namespace ckpt {

struct ThreadGroup::Shared {
  explicit Shared(int n) : world(n), slots(static_cast<size_t>(n)) {}
  int world;
  std::mutex mu;
  std::condition_variable cv;
  int arrived = 0;
  uint64_t generation = 0;
  std::vector<std::string> slots;
  std::string broadcast;
  Status aborted;  // an error once a rank aborted the group

  Status Barrier() {
    std::unique_lock<std::mutex> lock(mu);
    if (!aborted.ok()) return aborted;
    const uint64_t gen = generation;
    if (++arrived == world) {
      arrived = 0;
      ++generation;
      cv.notify_all();
    } else {
      cv.wait(lock, [&] { return generation != gen || !aborted.ok(); });
      if (generation == gen) return aborted;
    }
    return Status::Ok();
  }
};

class ThreadGroup::RankView final : public Collective {
 public:
  RankView(Shared* shared, int rank) : shared_(shared), rank_(rank) {}
  int rank() const override { return rank_; }
  int world_size() const override { return shared_->world; }
  Status Barrier() override { return shared_->Barrier(); }
  Result<std::vector<std::string>> Gather(std::string_view payload) override {
    {
      std::lock_guard<std::mutex> lock(shared_->mu);
      shared_->slots[static_cast<size_t>(rank_)] = std::string(payload);
    }
    CKPT_RETURN_IF_ERROR(shared_->Barrier());
    std::vector<std::string> out;
    if (rank_ == 0) {
      std::lock_guard<std::mutex> lock(shared_->mu);
      out = shared_->slots;
    }
    CKPT_RETURN_IF_ERROR(shared_->Barrier());  // slots may be reused only after rank 0 copied them
    return out;
  }
  Result<std::string> Broadcast(std::string_view payload) override {
    if (rank_ == 0) {
      std::lock_guard<std::mutex> lock(shared_->mu);
      shared_->broadcast = std::string(payload);
    }
    CKPT_RETURN_IF_ERROR(shared_->Barrier());
    std::string out;
    {
      std::lock_guard<std::mutex> lock(shared_->mu);
      out = shared_->broadcast;
    }
    CKPT_RETURN_IF_ERROR(shared_->Barrier());
    return out;
  }

 private:
  Shared* shared_;
  int rank_;
};

ThreadGroup::ThreadGroup(int world_size) : shared_(std::make_unique<Shared>(world_size)) {
  for (int r = 0; r < world_size; ++r) views_.push_back(std::make_unique<RankView>(shared_.get(), r));
}
ThreadGroup::~ThreadGroup() = default;
Collective& ThreadGroup::ForRank(int rank) { return *views_.at(static_cast<size_t>(rank)); }

void ThreadGroup::Abort(const Status& status) {
  std::lock_guard<std::mutex> lock(shared_->mu);
  if (shared_->aborted.ok())
    shared_->aborted = status.ok() ? Internal("thread group aborted") : status;
  shared_->cv.notify_all();
}

std::vector<Status> RunOnThreads(int n, const std::function<Status(int)>& body,
                                 ThreadGroup* group) {
  std::vector<Status> results(static_cast<size_t>(n));
  std::vector<std::thread> threads;
  threads.reserve(static_cast<size_t>(n));
  auto run = [&](int i) {
    Status& result = results[static_cast<size_t>(i)];
    bool escaped = true;
    result = OutOfMemoryAsStatus("thread " + std::to_string(i), [&] {
      Status s = body(i);
      escaped = false;
      return s;
    });
    if (escaped && group) group->Abort(result);
  };
  if (n == 1) {  // one rank runs on the caller's thread: no thread to start (or to be refused)
    run(0);
    return results;
  }
  for (int i = 0; i < n; ++i) {
    try {
      threads.emplace_back(run, i);
    } catch (const std::exception& e) {  // std::system_error (EAGAIN) or std::bad_alloc
      const Status s = ResourceExhausted("start thread " + std::to_string(i) +
                                         ": out of memory or over the thread limit (" +
                                         e.what() + ")");
      for (int k = i; k < n; ++k) results[static_cast<size_t>(k)] = s;
      if (group) group->Abort(s);
      break;
    }
  }
  for (auto& t : threads) t.join();
  return results;
}

}  // namespace ckpt
