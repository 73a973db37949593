// AsyncSaver: snapshot into staging memory on the caller's thread, SaveCheckpoint on a
// background thread.
//
// Ordering (why commits never reorder): there is one background thread and at most one job.
// Save() waits until the previous job has finished (busy_ false) before it touches the staging
// memory, which that job's datasets point into, and before it queues the next job. So the
// staging memory has one writer at a time (the caller while idle, the thread while busy), and
// the tags of one saver commit in the order of the Save() calls.
#include "ckpt/async_saver.h"

#include <chrono>
#include <cstring>
#include <exception>
#include <limits>
#include <utility>
#include <vector>

#include "ckpt/dtype.h"
#include "staging.h"

namespace ckpt {

struct AsyncSaver::Job {
  std::string root;
  Manifest meta;
  RankContents contents;  // data pointers into the staging memory
  Collective* collective = nullptr;
  SaveOptions options;
};

namespace {

using Clock = std::chrono::steady_clock;

double SecondsSince(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

Result<size_t> ByteSize(const DatasetSpec& d) {
  size_t n = DTypeSize(d.dtype);
  for (int64_t dim : d.shape) {
    if (dim < 0)
      return InvalidArgument("dataset '" + d.name + "' has a negative dimension");
    const auto u = static_cast<size_t>(dim);
    if (u != 0 && n > std::numeric_limits<size_t>::max() / u)
      return InvalidArgument("dataset '" + d.name + "': byte size overflows");
    n *= u;
  }
  if (d.fill)
    return InvalidArgument("dataset '" + d.name +
                           "': an asynchronous save snapshots `data`; a `fill` dataset is "
                           "written by SaveCheckpoint or SaveRanks");
  if (n > 0 && d.data == nullptr)
    return InvalidArgument("dataset '" + d.name + "' has no data");
  return n;
}

// Large datasets start on a page, small ones on a cache line.
size_t AlignUp(size_t offset, size_t bytes) {
  const size_t a = bytes >= internal::kStagingAlignment ? internal::kStagingAlignment : 64;
  return (offset + a - 1) / a * a;
}

}  // namespace

AsyncSaver::AsyncSaver()
    : host_(std::make_unique<internal::StagingBuffer>(internal::StagingBuffer::Kind::kHost)),
      pinned_(std::make_unique<internal::StagingBuffer>(internal::StagingBuffer::Kind::kPinned)) {
  internal::ProbeDevices();  // here rather than inside the first save's stall
}

AsyncSaver::~AsyncSaver() {
  {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return !busy_; });
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

Status AsyncSaver::TakeResultLocked() {
  if (!result_) return Status::Ok();
  Status s = std::move(*result_);
  result_.reset();
  return s;
}

Status AsyncSaver::Wait() {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return !busy_; });
  return TakeResultLocked();
}

std::optional<Status> AsyncSaver::Poll() {
  std::lock_guard<std::mutex> lock(mu_);
  if (busy_) return std::nullopt;
  return TakeResultLocked();
}

AsyncSaverStats AsyncSaver::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  AsyncSaverStats s = stats_;
  s.host_staging_bytes = host_->capacity();
  s.pinned_staging_bytes = pinned_->capacity();
  s.staging_allocations = host_->allocations() + pinned_->allocations();
  return s;
}

Status AsyncSaver::Save(const std::string& root, const Manifest& meta,
                        const RankContents& contents, Collective& collective,
                        const SaveOptions& options) {
  {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return !busy_; });
    Status previous = TakeResultLocked();
    if (!previous.ok()) return previous.WithContext("previous async save");
  }
  // Idle: the staging memory is ours until the job is handed over.
  const auto t0 = Clock::now();
  const size_t n = contents.datasets.size();
  std::vector<size_t> sizes(n), offsets(n);
  std::vector<bool> on_device(n);
  size_t host_bytes = 0, pinned_bytes = 0;
  for (size_t i = 0; i < n; ++i) {
    const DatasetSpec& d = contents.datasets[i];
    CKPT_ASSIGN_OR_RETURN(sizes[i], ByteSize(d), "async save " + root + "/" + meta.tag);
    on_device[i] = sizes[i] > 0 && internal::IsDeviceMemory(d.data);
    size_t& end = on_device[i] ? pinned_bytes : host_bytes;
    offsets[i] = AlignUp(end, sizes[i]);
    end = offsets[i] + sizes[i];
  }
  uint8_t* host = nullptr;
  uint8_t* pinned = nullptr;
  if (host_bytes > 0) {
    CKPT_ASSIGN_OR_RETURN(host, host_->Reserve(host_bytes));
  }
  if (pinned_bytes > 0) {
    CKPT_ASSIGN_OR_RETURN(pinned, pinned_->Reserve(pinned_bytes));
  }

  auto job = std::make_unique<Job>();
  job->contents.datasets.reserve(n);
  static const uint8_t kEmpty = 0;
  for (size_t i = 0; i < n; ++i) {
    DatasetSpec copy = contents.datasets[i];
    if (sizes[i] == 0) {
      copy.data = &kEmpty;
    } else if (on_device[i]) {
      uint8_t* dst = pinned + offsets[i];
      CKPT_RETURN_IF_ERROR(internal::CopyFromDevice(dst, copy.data, sizes[i]),
                           "dataset '" + copy.name + "'");
      copy.data = dst;
    } else {
      uint8_t* dst = host + offsets[i];
      std::memcpy(dst, copy.data, sizes[i]);
      copy.data = dst;
    }
    job->contents.datasets.push_back(std::move(copy));
  }
  job->root = root;
  job->meta = meta;
  job->collective = &collective;
  job->options = options;
  const double staged_seconds = SecondsSince(t0);

  {
    std::lock_guard<std::mutex> lock(mu_);
    job_ = std::move(job);
    busy_ = true;
    ++stats_.saves_started;
    stats_.last_staged_bytes = host_bytes + pinned_bytes;
    stats_.last_stage_seconds = staged_seconds;
    if (!thread_.joinable()) thread_ = std::thread(&AsyncSaver::Run, this);
  }
  cv_.notify_all();
  return Status::Ok();
}

void AsyncSaver::Run() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    cv_.wait(lock, [&] { return job_ != nullptr || stop_; });
    if (job_ == nullptr) return;  // stop_ and nothing queued
    std::unique_ptr<Job> job = std::move(job_);
    lock.unlock();
    const auto t0 = Clock::now();
    Status s;
    try {
      s = SaveCheckpoint(job->root, job->meta, job->contents, *job->collective, job->options);
    } catch (const std::exception& e) {
      // Nothing may escape a thread; the commit protocol has left `latest` untouched.
      s = Internal("async save " + job->root + "/" + job->meta.tag + ": " + e.what());
    }
    const double seconds = SecondsSince(t0);
    job.reset();
    lock.lock();
    result_ = std::move(s);
    stats_.last_persist_seconds = seconds;
    busy_ = false;
    cv_.notify_all();
  }
}

}  // namespace ckpt
