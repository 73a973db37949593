// FaultInjectionEnv: fails the N-th mutating step and simulates power loss
// (after leveldb's fault_injection_test).
#include <filesystem>
#include <map>
#include <mutex>
#include <optional>

#include "ckpt/env.h"

namespace ckpt {

namespace {
std::string DirOf(const std::string& path) {
  std::string d = std::filesystem::path(path).parent_path().string();
  return d.empty() ? "." : d;
}
}  // namespace

struct FaultInjectionEnv::Impl {
  Env* base;  // the wrapped Env (EnvWrapper::target())
  std::mutex mu;
  std::map<Op, int> counts;
  Op fail_op = Op::kAny;
  int fail_at = 0;
  std::string failed_step;
  // Files written since their last fsync (path -> created in this session).
  std::map<std::string, bool> unsynced;
  struct PendingRename {
    std::string from, to;
    std::optional<std::string> old_content;  // `to` replaced an existing file
  };
  std::vector<PendingRename> pending_renames;

  // Counts one step; returns an error if it is the one to fail.
  Status Step(Op op, const std::string& what) {
    std::lock_guard<std::mutex> lock(mu);
    int n_op = ++counts[op];
    int n_any = op == Op::kRead ? -1 : ++counts[Op::kAny];
    bool fail = fail_at > 0 && ((fail_op == Op::kAny && n_any == fail_at) ||
                                (fail_op == op && n_op == fail_at));
    if (!fail) return Status::Ok();
    failed_step = what;
    return IOError("injected fault at " + what);
  }
};

// What every fault-injecting file holds: the env's step counter, its path and the real file.
// `File` is the Env interface it implements.
template <typename File>
class FaultFile : public File {
 public:
  FaultFile(FaultInjectionEnv::Impl* impl, std::string path, std::unique_ptr<File> base)
      : impl_(impl), path_(std::move(path)), base_(std::move(base)) {}

 protected:
  using Op = FaultInjectionEnv::Op;
  Status Step(Op op, const std::string& what) const { return impl_->Step(op, what); }
  std::string At(uint64_t offset) const { return path_ + " at " + std::to_string(offset); }
  // fsync as a kSync step; once it succeeds the file's data survives a simulated power loss.
  Status SyncStep() {
    CKPT_RETURN_IF_ERROR(Step(Op::kSync, "fsync " + path_));
    CKPT_RETURN_IF_ERROR(base_->Sync());
    std::lock_guard<std::mutex> lock(impl_->mu);
    impl_->unsynced.erase(path_);
    return Status::Ok();
  }

  FaultInjectionEnv::Impl* impl_;
  std::string path_;
  std::unique_ptr<File> base_;
};

class FaultWritableFile final : public FaultFile<WritableFile> {
 public:
  using FaultFile::FaultFile;
  Status Append(std::string_view data) override {
    CKPT_RETURN_IF_ERROR(Step(Op::kWrite, "write " + path_));
    return base_->Append(data);
  }
  Status Sync() override { return SyncStep(); }
  Status Close() override { return base_->Close(); }
};

// Offset reads of a file opened through the fault env: each one is a kRead step.
class FaultRandomAccessFile final : public FaultFile<RandomAccessFile> {
 public:
  using FaultFile::FaultFile;
  Status Read(uint64_t offset, size_t n, void* out) const override {
    CKPT_RETURN_IF_ERROR(Step(Op::kRead, "read " + At(offset)));
    return base_->Read(offset, n, out);
  }
  uint64_t size() const override { return base_->size(); }
};

// Offset writes into a rank file: each write and the reservation are kWrite steps; the file
// stays unsynced until SyncFile(path) or Sync().
class FaultRandomWriteFile final : public FaultFile<RandomWriteFile> {
 public:
  using FaultFile::FaultFile;
  Status Write(uint64_t offset, std::string_view data) override {
    CKPT_RETURN_IF_ERROR(Step(Op::kWrite, "write " + At(offset)));
    return base_->Write(offset, data);
  }
  Status Read(uint64_t offset, size_t n, void* out) override {
    CKPT_RETURN_IF_ERROR(Step(Op::kRead, "read " + At(offset)));
    return base_->Read(offset, n, out);
  }
  Result<uint64_t> Size() override { return base_->Size(); }
  Status Reserve(uint64_t size) override {
    CKPT_RETURN_IF_ERROR(
        Step(Op::kWrite, "reserve " + std::to_string(size) + " bytes for " + path_));
    return base_->Reserve(size);
  }
  void StartWriteback(uint64_t offset, uint64_t n) override { base_->StartWriteback(offset, n); }
  Status Sync() override { return SyncStep(); }
  Status Close() override { return base_->Close(); }
};

FaultInjectionEnv::FaultInjectionEnv(Env* base)
    : EnvWrapper(base), impl_(std::make_unique<Impl>()) {
  impl_->base = target();
}
FaultInjectionEnv::~FaultInjectionEnv() = default;

void FaultInjectionEnv::FailAt(Op op, int n) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  impl_->fail_op = op;
  impl_->fail_at = n;
  impl_->failed_step.clear();
}
int FaultInjectionEnv::Count(Op op) const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  auto it = impl_->counts.find(op);
  return it == impl_->counts.end() ? 0 : it->second;
}
void FaultInjectionEnv::ResetCounts() {
  std::lock_guard<std::mutex> lock(impl_->mu);
  impl_->counts.clear();
}
std::string FaultInjectionEnv::failed_step() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->failed_step;
}

Status FaultInjectionEnv::DropUnsyncedData() {
  std::vector<Impl::PendingRename> renames;
  std::map<std::string, bool> unsynced;
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    renames.swap(impl_->pending_renames);
    unsynced.swap(impl_->unsynced);
  }
  Env* base = impl_->base;
  // Undo renames whose directory entry never reached the disk, newest first.
  for (auto it = renames.rbegin(); it != renames.rend(); ++it) {
    if (base->Exists(it->to)) CKPT_RETURN_IF_ERROR(base->RenameFile(it->to, it->from), "undo");
    if (it->old_content) {
      CKPT_ASSIGN_OR_RETURN(auto f, base->NewWritableFile(it->to), "restore");
      CKPT_RETURN_IF_ERROR(f->Append(*it->old_content), "restore");
      CKPT_RETURN_IF_ERROR(f->Close(), "restore");
    }
  }
  // Files never fsynced lose their data (they were created in this session: remove them).
  for (const auto& [path, created] : unsynced) {
    if (base->Exists(path)) CKPT_RETURN_IF_ERROR(base->RemoveFile(path), "drop unsynced");
  }
  return Status::Ok();
}

Result<std::unique_ptr<WritableFile>> FaultInjectionEnv::NewWritableFile(const std::string& path) {
  CKPT_RETURN_IF_ERROR(impl_->Step(Op::kWrite, "create " + path), "");
  CKPT_ASSIGN_OR_RETURN(auto base, impl_->base->NewWritableFile(path), "");
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    impl_->unsynced[path] = true;
  }
  return std::unique_ptr<WritableFile>(new FaultWritableFile(impl_.get(), path, std::move(base)));
}

Result<std::unique_ptr<WritableFile>> FaultInjectionEnv::NewAppendableFile(
    const std::string& path) {
  CKPT_RETURN_IF_ERROR(impl_->Step(Op::kWrite, "open for appending " + path));
  const bool created = !impl_->base->Exists(path);
  CKPT_ASSIGN_OR_RETURN(auto base, impl_->base->NewAppendableFile(path));
  if (created) {
    std::lock_guard<std::mutex> lock(impl_->mu);
    impl_->unsynced[path] = true;
  }
  return std::unique_ptr<WritableFile>(new FaultWritableFile(impl_.get(), path, std::move(base)));
}

Status FaultInjectionEnv::BeginExternalWrite(const std::string& path) {
  CKPT_RETURN_IF_ERROR(impl_->Step(Op::kWrite, "write " + path), "");
  std::lock_guard<std::mutex> lock(impl_->mu);
  impl_->unsynced[path] = true;
  return Status::Ok();
}

Status FaultInjectionEnv::SyncFile(const std::string& path) {
  CKPT_RETURN_IF_ERROR(impl_->Step(Op::kSync, "fsync " + path), "");
  CKPT_RETURN_IF_ERROR(impl_->base->SyncFile(path), "");
  std::lock_guard<std::mutex> lock(impl_->mu);
  impl_->unsynced.erase(path);
  return Status::Ok();
}

Status FaultInjectionEnv::SyncDir(const std::string& path) {
  CKPT_RETURN_IF_ERROR(impl_->Step(Op::kSyncDir, "fsync directory " + path), "");
  CKPT_RETURN_IF_ERROR(impl_->base->SyncDir(path), "");
  std::lock_guard<std::mutex> lock(impl_->mu);
  auto& pr = impl_->pending_renames;
  std::filesystem::path dir = std::filesystem::path(path).lexically_normal();
  std::erase_if(pr, [&](const Impl::PendingRename& r) {
    return std::filesystem::path(DirOf(r.to)).lexically_normal() == dir;
  });
  return Status::Ok();
}

Status FaultInjectionEnv::RenameFile(const std::string& from, const std::string& to) {
  CKPT_RETURN_IF_ERROR(impl_->Step(Op::kRename, "rename " + from + " -> " + to), "");
  std::optional<std::string> old;
  if (impl_->base->Exists(to) && !std::filesystem::is_directory(to)) {
    CKPT_ASSIGN_OR_RETURN(old, impl_->base->ReadFileToString(to), "");
  }
  CKPT_RETURN_IF_ERROR(impl_->base->RenameFile(from, to), "");
  std::lock_guard<std::mutex> lock(impl_->mu);
  impl_->pending_renames.push_back({from, to, std::move(old)});
  // A file renamed before its fsync stays unsynced under its new name.
  auto it = impl_->unsynced.find(from);
  if (it != impl_->unsynced.end()) {
    impl_->unsynced.erase(it);
    impl_->unsynced[to] = true;
  }
  return Status::Ok();
}

Status FaultInjectionEnv::CreateDir(const std::string& path) {
  CKPT_RETURN_IF_ERROR(impl_->Step(Op::kCreateDir, "mkdir " + path), "");
  return impl_->base->CreateDir(path);
}
Status FaultInjectionEnv::CreateDirs(const std::string& path) {
  CKPT_RETURN_IF_ERROR(impl_->Step(Op::kCreateDir, "mkdir -p " + path));
  return impl_->base->CreateDirs(path);
}
Result<std::string> FaultInjectionEnv::ReadFileToString(const std::string& path) {
  CKPT_RETURN_IF_ERROR(impl_->Step(Op::kRead, "read " + path));
  return impl_->base->ReadFileToString(path);
}
Result<std::unique_ptr<RandomAccessFile>> FaultInjectionEnv::NewRandomAccessFile(
    const std::string& path) {
  CKPT_RETURN_IF_ERROR(impl_->Step(Op::kRead, "open " + path));
  CKPT_ASSIGN_OR_RETURN(auto base, impl_->base->NewRandomAccessFile(path));
  return std::unique_ptr<RandomAccessFile>(
      new FaultRandomAccessFile(impl_.get(), path, std::move(base)));
}
Result<std::unique_ptr<RandomAccessFile>> FaultInjectionEnv::NewCheckpointFile(
    const std::string& path) {
  CKPT_RETURN_IF_ERROR(impl_->Step(Op::kRead, "open " + path));
  CKPT_ASSIGN_OR_RETURN(auto base, impl_->base->NewCheckpointFile(path));
  return std::unique_ptr<RandomAccessFile>(
      new FaultRandomAccessFile(impl_.get(), path, std::move(base)));
}
Result<std::unique_ptr<RandomWriteFile>> FaultInjectionEnv::OpenRandomWriteFile(
    const std::string& path) {
  CKPT_RETURN_IF_ERROR(impl_->Step(Op::kWrite, "open for writing " + path));
  CKPT_ASSIGN_OR_RETURN(auto base, impl_->base->OpenRandomWriteFile(path));
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    impl_->unsynced.emplace(path, false);
  }
  return std::unique_ptr<RandomWriteFile>(
      new FaultRandomWriteFile(impl_.get(), path, std::move(base)));
}
Result<std::unique_ptr<FileLock>> FaultInjectionEnv::TryLockFile(const std::string& path) {
  CKPT_RETURN_IF_ERROR(impl_->Step(Op::kLock, "lock " + path));
  return impl_->base->TryLockFile(path);
}

}  // namespace ckpt
