// ThreadGroup: the Collective interface for N ranks that are threads of one process.
#include <condition_variable>
#include <mutex>

#include "ckpt/collective.h"

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

  void Barrier() {
    std::unique_lock<std::mutex> lock(mu);
    const uint64_t gen = generation;
    if (++arrived == world) {
      arrived = 0;
      ++generation;
      cv.notify_all();
    } else {
      cv.wait(lock, [&] { return generation != gen; });
    }
  }
};

class ThreadGroup::RankView final : public Collective {
 public:
  RankView(Shared* shared, int rank) : shared_(shared), rank_(rank) {}
  int rank() const override { return rank_; }
  int world_size() const override { return shared_->world; }
  Status Barrier() override {
    shared_->Barrier();
    return Status::Ok();
  }
  Result<std::vector<std::string>> Gather(std::string_view payload) override {
    {
      std::lock_guard<std::mutex> lock(shared_->mu);
      shared_->slots[static_cast<size_t>(rank_)] = std::string(payload);
    }
    shared_->Barrier();
    std::vector<std::string> out;
    if (rank_ == 0) {
      std::lock_guard<std::mutex> lock(shared_->mu);
      out = shared_->slots;
    }
    shared_->Barrier();  // slots may be reused only after rank 0 copied them
    return out;
  }
  Result<std::string> Broadcast(std::string_view payload) override {
    if (rank_ == 0) {
      std::lock_guard<std::mutex> lock(shared_->mu);
      shared_->broadcast = std::string(payload);
    }
    shared_->Barrier();
    std::string out;
    {
      std::lock_guard<std::mutex> lock(shared_->mu);
      out = shared_->broadcast;
    }
    shared_->Barrier();
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

}  // namespace ckpt
