// The OS edge: every file-system call of a save, a load, a check and gc goes through Env, so a
// fault-injecting Env reaches each of them; errno maps to one code per condition; Result
// misuse dies in every build.
#include <fcntl.h>
#include <hdf5.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <catch2/catch.hpp>
#include <cerrno>
#include <condition_variable>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <mutex>
#include <random>
#include <set>
#include <thread>

#include "ckpt/aligned_buffer.h"
#include "ckpt/env.h"
#include "ckpt/hash.h"
#include "ckpt/reader.h"
#include "ckpt/root.h"
#include "ckpt/run_ahead.h"
#include "ckpt/shared_library.h"
#include "ckpt/synth.h"
#include "ckpt/unique_fd.h"
#include "ckpt_test_helpers.h"
#include "test_util.h"

using namespace ckpt;
using namespace ckpt::testing;
namespace fs = std::filesystem;

namespace {

// Records the name of every call that reaches it, then forwards (EnvWrapper). Thread-safe:
// rank threads save, and check --deep checks files, in parallel. Read `calls` only while no
// operation runs.
class RecordingEnv final : public EnvWrapper {
 public:
  RecordingEnv() : EnvWrapper(nullptr) {}
  std::set<std::string> calls;
  void Record(const char* name) {
    std::lock_guard<std::mutex> lock(mu_);
    calls.insert(name);
  }
  Result<std::unique_ptr<RandomAccessFile>> NewRandomAccessFile(const std::string& p) override {
    Record("NewRandomAccessFile");
    auto f = EnvWrapper::NewRandomAccessFile(p);
    if (!f.ok()) return f;
    return std::unique_ptr<RandomAccessFile>(new CountingFile(std::move(*f), &bytes_read));
  }
  Result<std::unique_ptr<RandomAccessFile>> NewCheckpointFile(const std::string& p) override {
    Record("NewCheckpointFile");
    auto f = EnvWrapper::NewCheckpointFile(p);
    if (!f.ok()) return f;
    return std::unique_ptr<RandomAccessFile>(new CountingFile(std::move(*f), &bytes_read));
  }
  std::atomic<uint64_t> bytes_read{0};  // through the files it opened for reading
  Result<std::unique_ptr<RandomWriteFile>> OpenRandomWriteFile(const std::string& p) override {
    Record("OpenRandomWriteFile");
    return EnvWrapper::OpenRandomWriteFile(p);
  }
  Result<std::unique_ptr<FileLock>> TryLockFile(const std::string& p) override {
    Record("TryLockFile");
    return EnvWrapper::TryLockFile(p);
  }
  Status CreateDirs(const std::string& p) override {
    Record("CreateDirs");
    return EnvWrapper::CreateDirs(p);
  }

 private:
  std::mutex mu_;
};

// Runs f in a child process; returns its stderr and whether it died of SIGABRT.
std::pair<std::string, bool> RunInChild(void (*f)()) {
  int pipefd[2];
  REQUIRE(::pipe(pipefd) == 0);
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    ::dup2(pipefd[1], 2);
    f();
    _exit(0);
  }
  ::close(pipefd[1]);
  std::string err;
  char buf[256];
  for (ssize_t n; (n = ::read(pipefd[0], buf, sizeof buf)) > 0;) err.append(buf, n);
  ::close(pipefd[0]);
  int status = 0;
  ::waitpid(pid, &status, 0);
  return {err, WIFSIGNALED(status) && WTERMSIG(status) == SIGABRT};
}

}  // namespace

TEST_CASE("save, load, check and gc reach the Env for locks, offset I/O, hashing, mkdir",
          "[io]") {
  ScratchDir d;
  RecordingEnv env;
  SaveOptions o;
  o.env = &env;
  o.file_checksum = true;
  const std::string root = d / "new/root";  // missing parents: CreateDirs
  REQUIRE(SaveWithThreads(root, SmallModel("global_step1", 2, 2), o).ok());
  CHECK(env.calls.count("CreateDirs"));
  CHECK(env.calls.count("TryLockFile"));
  CHECK(env.calls.count("OpenRandomWriteFile"));
  env.calls.clear();
  OpenOptions ro;
  ro.env = &env;
  auto r = CheckpointReader::Open(root, "", ro);
  REQUIRE(r.ok());
  REQUIRE(r->ReadDatasetBytes(0, r->manifest().files[0].datasets[0].name).ok());
  CHECK(env.calls.count("NewCheckpointFile"));  // the rank file: its seal, then offset reads
  env.calls.clear();
  env.bytes_read = 0;
  auto probs = CheckCheckpoint(root + "/global_step1", /*deep=*/true, &env);
  REQUIRE(probs.ok());
  CHECK(probs->empty());
  // One pass (issue 19): each file is read once through the Env, for its digest and every
  // dataset's, after its metadata (everything outside the data extents) is verified.
  CHECK(env.calls.count("NewCheckpointFile"));
  uint64_t file_bytes = 0, metadata_bytes = 0;
  for (const auto& f : r->manifest().files) {
    file_bytes += f.bytes;
    metadata_bytes += f.bytes;
    for (const auto& [offset, length] : f.data_extents) metadata_bytes -= length;
  }
  // The manifest is read through the Env too (O_NOFOLLOW, size-capped: issue 20).
  const uint64_t manifest_bytes = fs::file_size(root + "/global_step1/manifest.json");
  INFO("read " << env.bytes_read << " bytes; files " << file_bytes << ", metadata "
               << metadata_bytes << ", manifest " << manifest_bytes);
  CHECK(env.bytes_read >= file_bytes + manifest_bytes);
  CHECK(env.bytes_read <= file_bytes + metadata_bytes + manifest_bytes);
  CHECK_FALSE(env.calls.count("NewRandomAccessFile"));  // no file opened through a link
  env.calls.clear();
  REQUIRE(CollectGarbage(root, 0, &env).ok());
  CHECK(env.calls.count("TryLockFile"));
}

// check --deep (issue 19): the seals of all files (a few small reads each) are verified before
// any file's data pass begins, so that no seal read waits behind another file's large reads;
// the problems found are the same, in file order.
TEST_CASE("check --deep verifies every file's seal before any file's data is read", "[io]") {
  ScratchDir d;
  const std::string root = d / "root";
  const int world = 4;
  REQUIRE(SaveWithThreads(root, SmallModel("global_step1", world, 2), SaveOptions{}).ok());
  // Records, in one sequence for all files, each small Read and the first Scan of each file.
  struct Log {
    std::mutex mu;
    std::vector<std::pair<std::string, std::string>> events;  // {file, "read" or "scan"}
    void Add(const std::string& file, const char* what) {
      std::lock_guard<std::mutex> lock(mu);
      events.emplace_back(file, what);
    }
  } log;
  class LoggingFile final : public RandomAccessFile {
   public:
    LoggingFile(std::unique_ptr<RandomAccessFile> f, std::string name, Log* log)
        : f_(std::move(f)), name_(std::move(name)), log_(log) {}
    Status Read(uint64_t offset, size_t n, void* out) const override {
      if (!scanning_) log_->Add(name_, "read");
      return f_->Read(offset, n, out);
    }
    uint64_t size() const override { return f_->size(); }
    Status Scan(uint64_t offset, uint64_t n, const PartFn& consume) const override {
      log_->Add(name_, "scan");
      scanning_ = true;  // the default Scan reads through Read: not a seal read
      Status s = RandomAccessFile::Scan(offset, n, consume);
      scanning_ = false;
      return s;
    }

   private:
    std::unique_ptr<RandomAccessFile> f_;
    std::string name_;
    Log* log_;
    mutable std::atomic<bool> scanning_{false};
  };
  WrappedFileEnv env([&log](std::unique_ptr<RandomAccessFile> f, const std::string& path) {
    return std::make_unique<LoggingFile>(std::move(f), fs::path(path).filename().string(), &log);
  });
  const std::string tag = root + "/global_step1";
  for (int round = 0; round < 5; ++round) {
    log.events.clear();
    auto probs = CheckCheckpoint(tag, /*deep=*/true, &env);
    REQUIRE(probs.ok());
    CHECK(probs->empty());
    size_t first_scan = log.events.size();
    std::set<std::string> scanned, sealed_before_scan;
    for (size_t i = 0; i < log.events.size(); ++i) {
      const auto& [file, what] = log.events[i];
      if (what == "scan") {
        first_scan = std::min(first_scan, i);
        scanned.insert(file);
      } else if (first_scan == log.events.size() && file.rfind("rank_", 0) == 0) {
        sealed_before_scan.insert(file);
      }
    }
    CHECK(scanned.size() == static_cast<size_t>(world));  // the pass reached every file
    CHECK(sealed_before_scan.size() == static_cast<size_t>(world));
  }
  // A shallow check reads no data; a damaged seal is still found, in either mode.
  log.events.clear();
  auto shallow = CheckCheckpoint(tag, /*deep=*/false, &env);
  REQUIRE(shallow.ok());
  CHECK(shallow->empty());
  for (const auto& e : log.events) CHECK(e.second == "read");
  const std::string victim = tag + "/" + RankFileName(2);
  {
    std::fstream f(victim, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(100);  // inside the superblock and root group's header, outside every dataset
    char c = 0;
    f.read(&c, 1);
    f.seekp(100);
    c = static_cast<char>(c ^ 0x40);
    f.write(&c, 1);
  }
  for (bool deep : {true, false}) {
    auto probs = CheckCheckpoint(tag, deep, &env);
    REQUIRE(probs.ok());
    REQUIRE(probs->size() == 1);
    CHECK((*probs)[0].file == RankFileName(2));
    CHECK_THAT((*probs)[0].what, Catch::Contains("metadata checksum mismatch"));
  }
}

TEST_CASE("fault injection fails the lock, the offset writes and the offset reads", "[io]") {
  ScratchDir d;
  SECTION("the root lock") {
    FaultInjectionEnv env(Env::Default());
    env.FailAt(FaultInjectionEnv::Op::kLock, 1);
    SaveOptions o;
    o.env = &env;
    Status s = SaveWithThreads(d.str(), SmallModel("global_step1", 2, 2), o);
    REQUIRE_FALSE(s.ok());
    CHECK_THAT(s.message(), Catch::Contains("injected fault at lock"));
    CHECK_FALSE(fs::exists(d / "global_step1"));
  }
  SECTION("a rank file's offset write") {
    FaultInjectionEnv env(Env::Default());
    env.FailAt(FaultInjectionEnv::Op::kWrite, 3);  // rank file create, open for writing, then
    SaveOptions o;                                // the reservation or the first data write
    o.env = &env;
    Status s = SaveWithThreads(d.str(), SmallModel("global_step1", 1, 2), o);
    REQUIRE_FALSE(s.ok());
    CHECK_THAT(env.failed_step(), Catch::Contains("rank_00000.h5"));
    CHECK_FALSE(fs::exists(d / "global_step1"));
  }
  SECTION("a reader's offset read") {
    REQUIRE(SaveWithThreads(d.str(), SmallModel("global_step1", 1, 2)).ok());
    FaultInjectionEnv env(Env::Default());
    OpenOptions ro;
    ro.env = &env;
    auto r = CheckpointReader::Open(d.str(), "", ro);
    REQUIRE(r.ok());
    const int reads_before = env.Count(FaultInjectionEnv::Op::kRead);
    env.FailAt(FaultInjectionEnv::Op::kRead, reads_before + 2);  // the open, then the read
    auto bytes = r->ReadDatasetBytes(0, r->manifest().files[0].datasets[0].name);
    REQUIRE_FALSE(bytes.ok());
    CHECK_THAT(bytes.status().message(), Catch::Contains("injected fault at read"));
    // Reads never count as mutating steps.
    CHECK(env.Count(FaultInjectionEnv::Op::kAny) == 0);
  }
  SECTION("the hashing read") {
    REQUIRE(SaveWithThreads(d.str(), SmallModel("global_step1", 1, 2)).ok());
    FaultInjectionEnv env(Env::Default());
    env.FailAt(FaultInjectionEnv::Op::kRead, 1);
    auto h = Xxh3FileHex(d / "global_step1/rank_00000.h5", &env);
    REQUIRE_FALSE(h.ok());
    CHECK(env.failed_step() == "open " + (d / "global_step1/rank_00000.h5"));
  }
}

TEST_CASE("a held root lock is FailedPrecondition naming the holder's pid", "[io]") {
  ScratchDir d;
  auto first = RootLock::TryAcquire(d.str());
  REQUIRE(first.ok());
  auto second = RootLock::TryAcquire(d.str());
  REQUIRE_FALSE(second.ok());
  CHECK(second.status().code() == StatusCode::kFailedPrecondition);
  CHECK_THAT(second.status().message(),
             Catch::Contains("pid " + std::to_string(::getpid())));
}

TEST_CASE("one errno mapper: the same condition gets the same code", "[unit]") {
  CHECK(PosixError("open x", ENOENT).code() == StatusCode::kNotFound);
  CHECK(PosixError("write x", ENOSPC).code() == StatusCode::kResourceExhausted);
  CHECK(PosixError("write x", EDQUOT).code() == StatusCode::kResourceExhausted);
  CHECK(PosixError("open x", EACCES).code() == StatusCode::kPermissionDenied);
  CHECK(PosixError("mkdir x", EEXIST).code() == StatusCode::kAlreadyExists);
  CHECK(PosixError("read x", EIO).code() == StatusCode::kIOError);
  CHECK(PosixError("write x", ENOSPC).message() == std::string("write x: ") + std::strerror(ENOSPC));
  CHECK(ExitCodeFor(PosixError("write x", ENOSPC)) == 2);
  ScratchDir d;
  // Through the Env: a missing file read at offsets is NotFound, as a missing whole file is.
  CHECK(Env::Default()->NewRandomAccessFile(d / "nope").status().code() == StatusCode::kNotFound);
  CHECK(Env::Default()->ReadFileToString(d / "nope").status().code() == StatusCode::kNotFound);
}

TEST_CASE("AlignedBuffer: 4 KiB-aligned, the size asked for, movable", "[unit]") {
  for (const size_t n : {size_t{0}, size_t{1}, size_t{4095}, size_t{4096}, size_t{5 << 20}}) {
    INFO("bytes " << n);
    AlignedBuffer b(n);
    REQUIRE(b.data() != nullptr);
    CHECK(reinterpret_cast<uintptr_t>(b.data()) % AlignedBuffer::kAlign == 0);
    CHECK(b.size() == n);
    if (n > 0) {
      b.data()[n - 1] = 7;  // the whole size is writable (ASan checks the bounds)
      CHECK(b.as<uint8_t>()[n - 1] == 7);
    }
    AlignedBuffer moved = std::move(b);
    CHECK(moved.size() == n);
    CHECK(b.size() == 0);  // NOLINT(bugprone-use-after-move): the moved-from state is empty
    CHECK(reinterpret_cast<uintptr_t>(moved.data()) % AlignedBuffer::kAlign == 0);
  }
  CHECK(AlignedBuffer().data() == nullptr);
}

TEST_CASE("AllocateIoMemory: 2 MiB-aligned huge-page memory from 2 MiB up", "[unit]") {
  void* small = AllocateIoMemory(100000);
  REQUIRE(small != nullptr);
  CHECK(reinterpret_cast<uintptr_t>(small) % 4096 == 0);
  CHECK_FALSE(IsIoMemory(small, 1));  // small buffers are not huge-page memory
  FreeIoMemory(small);
  const size_t n = (4u << 20) + 1;
  void* big = AllocateIoMemory(n);
  REQUIRE(big != nullptr);
  CHECK(reinterpret_cast<uintptr_t>(big) % (2u << 20) == 0);
  static_cast<uint8_t*>(big)[n - 1] = 1;  // the whole size is writable
  // IsIoMemory: ranges inside the live allocation (rounded up to 2 MiB), and nothing else.
  const auto* b = static_cast<const uint8_t*>(big);
  CHECK(IsIoMemory(b, n));
  CHECK(IsIoMemory(b + 4096, (6u << 20) - 4096));  // up to the rounded end
  CHECK_FALSE(IsIoMemory(b + 4096, 6u << 20));      // one page past it
  CHECK_FALSE(IsIoMemory(b - 4096, 4096));
  std::vector<uint8_t> heap(n);
  CHECK_FALSE(IsIoMemory(heap.data(), heap.size()));
  // Where the kernel has transparent huge pages ("always" or "madvise"), the mapping that holds
  // the buffer is eligible for them (smaps: THPeligible), whether or not any were free.
  const std::string mode = HugePageMode();
  if (mode == "always" || mode == "madvise") {
    CHECK(HugePageEligible(big) == 1);
  } else {
    WARN("transparent huge pages are off here (" << mode << "): only the alignment is checked");
  }
  FreeIoMemory(big);
  CHECK_FALSE(IsIoMemory(b, 1));  // freed: no longer I/O memory
  FreeIoMemory(nullptr);
}

TEST_CASE("AdviseHugePages: the whole 2 MiB blocks of another allocator's memory", "[unit]") {
  // A vector's storage, reserved and not yet touched (LoadResharded's shards): malloc maps it
  // on its own from this size, 16 bytes past a page boundary, so its first and last 2 MiB are
  // partial blocks.
  const size_t n = (9u << 20) / sizeof(float);
  std::vector<float> v;
  v.reserve(n);
  const auto lo = reinterpret_cast<uintptr_t>(v.data());
  const uintptr_t first = (lo + (2u << 20) - 1) / (2u << 20) * (2u << 20);
  const uintptr_t last = (lo + n * sizeof(float)) / (2u << 20) * (2u << 20);  // a block's end
  REQUIRE(last > first);
  const std::string mode = HugePageMode();
  if (mode == "madvise") CHECK(HugePageEligible(v.data()) == 0);  // not asked for yet
  AdviseHugePages(v.data(), n * sizeof(float));
  v.resize(n);  // the first touch
  CHECK(v[n - 1] == 0.0f);
  if (mode == "always" || mode == "madvise") {
    CHECK(HugePageEligible(reinterpret_cast<void*>(first)) == 1);
    CHECK(HugePageEligible(reinterpret_cast<void*>(last - 1)) == 1);
    if (mode == "madvise" && first > lo) {  // the partial head is left as it was
      CHECK(HugePageEligible(v.data()) == 0);
    }
  } else {
    WARN("transparent huge pages are off here (" << mode << "): nothing to check");
  }
  // Below 2 MiB, or with no whole block inside, nothing is asked.
  AdviseHugePages(v.data(), 4096);
  AdviseHugePages(nullptr, 0);
}

TEST_CASE("UniqueFd is move-only and closes exactly once", "[unit]") {
  int fds[2];
  REQUIRE(::pipe(fds) == 0);
  UniqueFd a(fds[0]);
  UniqueFd b(std::move(a));
  CHECK_FALSE(a.valid());
  CHECK(b.get() == fds[0]);
  CHECK(b.Close("pipe").ok());
  CHECK_FALSE(b.valid());
  CHECK(b.Close("pipe").ok());  // idempotent
  CHECK(::fcntl(fds[0], F_GETFD) == -1);
  UniqueFd w(fds[1]);
}

TEST_CASE("CreateDirs creates missing parents and accepts an existing directory", "[io]") {
  ScratchDir d;
  REQUIRE(Env::Default()->CreateDirs(d / "a/b/c").ok());
  CHECK(fs::is_directory(d / "a/b/c"));
  CHECK(Env::Default()->CreateDirs(d / "a/b/c").ok());
  Spit(d / "file", "x");
  CHECK(Env::Default()->CreateDirs(d / "file").code() == StatusCode::kAlreadyExists);
}

TEST_CASE("Result misuse dies with the status printed, in every build", "[unit]") {
  auto [err1, aborted1] = RunInChild([] {
    Result<int> r = DataLoss("rank_00001.h5: checksum mismatch");
    (void)r.value();
  });
  CHECK(aborted1);
  CHECK_THAT(err1, Catch::Contains("DataLoss: rank_00001.h5: checksum mismatch"));
  auto [err2, aborted2] = RunInChild([] { Result<int> r = Status::Ok(); (void)r; });
  CHECK(aborted2);
  CHECK_THAT(err2, Catch::Contains("Result constructed from an ok Status"));
}

TEST_CASE("context is optional and added once", "[unit]") {
  auto inner = []() -> Status { return NotFound("x: no such file"); };
  auto no_context = [&]() -> Status {
    CKPT_RETURN_IF_ERROR(inner());
    return Status::Ok();
  };
  auto with_context = [&]() -> Result<int> {
    CKPT_ASSIGN_OR_RETURN(int v, Result<int>(inner()), "load");
    return v;
  };
  CHECK(no_context().message() == "x: no such file");
  CHECK(with_context().status().message() == "load: x: no such file");
  // A directory as context, and a message that names a file inside it: said once.
  const Status in_dir = DataLoss("ck/global_step7/a.pt: record 6: CRC error");
  CHECK(in_dir.WithContext("ck/global_step7").message() == in_dir.message());
  CHECK(in_dir.WithContext("ck/global_step").message() ==
        "ck/global_step: ck/global_step7/a.pt: record 6: CRC error");
  CHECK(in_dir.WithContext("export").message() == "export: " + in_dir.message());
}

namespace {

std::string PatternBytes(size_t n, uint64_t seed) {
  std::string s(n, '\0');
  uint64_t x = seed;
  for (size_t i = 0; i < n; ++i) {
    x = x * 6364136223846793005ULL + 1442695040888963407ULL;
    s[i] = static_cast<char>(x >> 56);
  }
  return s;
}

// Whether the page holding byte `at` of `path` is in the page cache (mincore of a mapping that
// touches nothing).
bool PageCached(const std::string& path, uint64_t at) {
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  REQUIRE(fd.valid());
  const uint64_t page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
  void* m =
      ::mmap(nullptr, page, PROT_READ, MAP_SHARED, fd.get(), static_cast<off_t>(at & ~(page - 1)));
  REQUIRE(m != MAP_FAILED);
  unsigned char v = 0;
  const int r = ::mincore(m, page, &v);
  ::munmap(m, page);
  REQUIRE(r == 0);
  return (v & 1) != 0;
}

// Writes `path`'s dirty pages: its pages stay cached, clean (a dirty page is not dropped).
UniqueFd WriteBack(const std::string& path) {
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  REQUIRE(fd.valid());
  REQUIRE(::fdatasync(fd.get()) == 0);
  return fd;
}

// Writes `path`'s dirty pages and drops its pages from the page cache.
void DropFromPageCache(const std::string& path) {
  const UniqueFd fd = WriteBack(path);
  REQUIRE(::posix_fadvise(fd.get(), 0, 0, POSIX_FADV_DONTNEED) == 0);
}

// Writes tensors[i] at at[i] with WriteThrough, one after another, checking that each call
// hands its whole range to `before` (in pieces of at most kWritePiece) before it returns;
// after(i) runs once tensor i's call returned. Every byte handed over, in order.
std::string WriteEachThrough(RandomWriteFile& file, const std::vector<uint64_t>& at,
                             const std::vector<std::string>& tensors,
                             const std::function<void(size_t)>& after = nullptr) {
  std::string seen;
  size_t want = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    REQUIRE(file.WriteThrough(at[i], tensors[i],
                              [&](const uint8_t* p, size_t n) {
                                CHECK(n <= RandomWriteFile::kWritePiece);
                                seen.append(reinterpret_cast<const char*>(p), n);
                              })
                .ok());
    want += tensors[i].size();
    CHECK(seen.size() == want);
    if (after) after(i);
  }
  return seen;
}

}  // namespace

TEST_CASE("large reads: O_DIRECT ahead of the caller, the same bytes as pread, in order", "[io]") {
  ScratchDir d;
  const std::string path = d / "big.bin";
  // Odd size and offsets: O_DIRECT's 4 KiB alignment is widened and trimmed by the reader.
  const std::string bytes = PatternBytes((21u << 20) + 12345, 7);
  Spit(path, bytes);
  auto file = Env::Default()->NewCheckpointFile(path);
  REQUIRE(file.ok());
  const uint64_t offset = 4097 + 3, n = (17u << 20) + 5;

  // Checks ReadLarge and Scan of [at, at + len): the parts are consecutive, cover the range
  // exactly once and carry the file's bytes.
  auto read_both = [&](uint64_t at, uint64_t len) {
    std::string out(len, '\0');
    uint64_t next = at;
    REQUIRE(
        (*file)->ReadLarge(at, len, out.data(), [&](uint64_t o, const uint8_t* p, size_t k) {
          CHECK(o == next);
          CHECK(p == reinterpret_cast<const uint8_t*>(out.data()) + (o - at));
          next += k;
          return Status::Ok();
        }).ok());
    CHECK(next == at + len);
    CHECK(out == bytes.substr(at, len));
    std::string scanned;
    REQUIRE((*file)->Scan(at, len, [&](uint64_t o, const uint8_t* p, size_t k) {
                     CHECK(o == at + scanned.size());
                     scanned.append(reinterpret_cast<const char*>(p), k);
                     return Status::Ok();
                   }).ok());
    CHECK(scanned == bytes.substr(at, len));
  };

  SECTION("CKPT_DIRECT_IO=on reads with O_DIRECT where the file system allows it") {
    DirectIoMode mode("on");
    const DirectReadStats before = GetDirectReadStats();
    read_both(offset, n);
    read_both(0, bytes.size());  // to the file's unaligned end
    const DirectReadStats after = GetDirectReadStats();
    if (after.refused == before.refused) {
      CHECK(after.direct_bytes - before.direct_bytes == 2 * (n + bytes.size()));
      CHECK(after.buffered_bytes == before.buffered_bytes);
    } else {
      WARN("O_DIRECT refused on " << d.str() << ": read through the page cache");
      CHECK(after.buffered_bytes - before.buffered_bytes == 2 * (n + bytes.size()));
    }
  }
  SECTION("memory at the data's place in a 4 KiB block is read into with no bounce buffer") {
    DirectIoMode mode("on");
    // 4 KiB-aligned storage; `at` and the destination share their offset within a block
    // (3, as `offset` above), so the middle of the range goes straight into it, the unaligned
    // head and tail in the same O_DIRECT requests as the first and last blocks.
    AlignedBuffer mem(n + 8192);
    for (const bool congruent : {true, false}) {
      INFO("destination congruent with the file offset: " << congruent);
      uint8_t* out = mem.data() + (offset % 4096) + (congruent ? 0 : 1);
      std::memset(out, 0, n);
      DropFromPageCache(path);
      const DirectReadStats before = GetDirectReadStats();
      uint64_t next = offset;
      REQUIRE((*file)->ReadLarge(offset, n, out, [&](uint64_t o, const uint8_t* p, size_t k) {
                 CHECK(o == next);
                 CHECK(p == out + (o - offset));
                 // The part holds the file's bytes when it is handed on.
                 CHECK(std::memcmp(p, bytes.data() + o, k) == 0);
                 next += k;
                 return Status::Ok();
               }).ok());
      CHECK(next == offset + n);
      CHECK(std::memcmp(out, bytes.data() + offset, n) == 0);
      const DirectReadStats after = GetDirectReadStats();
      if (after.refused != before.refused) {
        WARN("O_DIRECT refused on " << d.str());
        continue;
      }
      CHECK(after.direct_bytes - before.direct_bytes == n);
      const uint64_t middle = ((offset + n) & ~uint64_t{4095}) - ((offset + 4095) & ~uint64_t{4095});
      CHECK(after.direct_into_caller_bytes - before.direct_into_caller_bytes ==
            (congruent ? middle : 0));
      // Nothing went through the page cache: not the edges either (until 2026-12-05 they were
      // read by pread after the middle, each waiting for the disk on its own).
      CHECK_FALSE(PageCached(path, offset));
      CHECK_FALSE(PageCached(path, offset + n - 1));
    }
    // A range whose tail block ends past the file's end: the O_DIRECT request comes back short
    // there and still holds every byte asked for.
    {
      const uint64_t at = offset, len = bytes.size() - offset;
      AlignedBuffer whole(len + 8192);
      uint8_t* to = whole.data() + at % 4096;
      DropFromPageCache(path);
      REQUIRE((*file)->ReadLarge(at, len, to, nullptr).ok());
      CHECK(std::memcmp(to, bytes.data() + at, len) == 0);
    }
    // An error from on_filled ends the read with it, head first.
    uint8_t* out = mem.data() + (offset % 4096);
    int calls = 0;
    Status s = (*file)->ReadLarge(offset, n, out, [&](uint64_t, const uint8_t*, size_t) {
      return ++calls == 2 ? Internal("stop here") : Status::Ok();
    });
    CHECK(s.message() == "stop here");
    CHECK(calls == 2);
    // Past the end of the file: DataLoss naming it, as for every large read.
    s = (*file)->ReadLarge(((bytes.size() - n / 2) & ~uint64_t{4095}) + offset % 4096, n, out,
                           nullptr);
    CHECK(s.code() == StatusCode::kDataLoss);
    CHECK_THAT(s.message(), Catch::Contains(path));
  }
  SECTION("auto mode decides without reading: an uncached range stays out of the page cache") {
    // Until 2026-12-07 the decision was three one-byte RWF_NOWAIT reads, and the kernel reads
    // the page of such a read into the page cache when it is not there: a 4 KiB request beside
    // every large read. cachestat(2) counts the pages instead; where the kernel lacks it
    // (before Linux 6.5) the probe remains, and only the read's outcome is checked here.
    UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
    REQUIRE(fd.valid());
    struct {
      uint64_t off, len;
    } range{0, 4096};
    uint64_t counts[5] = {};
    const bool have_cachestat = ::syscall(451, fd.get(), &range, counts, 0) == 0;
    if (!have_cachestat) WARN("no cachestat(2) here (" << std::strerror(errno) << ")");
    DirectIoMode mode("auto");
    const uint64_t at = 4096 * 3, len = n & ~uint64_t{4095};  // whole pages: no edge reads
    AlignedBuffer mem(len);
    DropFromPageCache(path);
    const DirectReadStats before = GetDirectReadStats();
    REQUIRE((*file)->ReadLarge(at, len, mem.data(), nullptr).ok());
    const DirectReadStats after = GetDirectReadStats();
    CHECK(std::memcmp(mem.data(), bytes.data() + at, len) == 0);
    if (after.refused != before.refused) {
      WARN("O_DIRECT refused on " << d.str());
    } else {
      CHECK(after.direct_bytes - before.direct_bytes == len);
      CHECK(after.cached_ranges == before.cached_ranges);
      if (have_cachestat) {
        for (const uint64_t b : {at, at + len / 2, at + len - 1}) {
          INFO("byte " << b);
          CHECK_FALSE(PageCached(path, b));
        }
      }
    }
  }
  SECTION("off, or a cached range in auto mode, reads through the page cache") {
    for (const char* m : {"off", "auto"}) {
      DirectIoMode mode(m);
      // Just written and read: in the page cache, so auto reads it buffered too.
      std::string warm(bytes.size(), '\0');
      REQUIRE((*file)->Read(0, warm.size(), warm.data()).ok());
      const DirectReadStats before = GetDirectReadStats();
      read_both(offset, n);
      const DirectReadStats after = GetDirectReadStats();
      INFO("CKPT_DIRECT_IO=" << m);
      CHECK(after.direct_bytes == before.direct_bytes);
      CHECK(after.buffered_bytes - before.buffered_bytes == 2 * n);
      if (std::string(m) == "auto") CHECK(after.cached_ranges - before.cached_ranges == 2);
    }
  }
  SECTION("an error from the consumer ends the read; the end of the file is DataLoss") {
    for (const char* m : {"on", "off"}) {
      DirectIoMode mode(m);
      INFO("CKPT_DIRECT_IO=" << m);
      int calls = 0;
      Status s = (*file)->Scan(0, bytes.size(), [&](uint64_t, const uint8_t*, size_t) {
        return ++calls == 2 ? Internal("enough") : Status::Ok();
      });
      CHECK(s.code() == StatusCode::kInternal);
      CHECK(s.message() == "enough");
      CHECK(calls == 2);
      std::string out(n, '\0');
      s = (*file)->ReadLarge(bytes.size() - n / 2, n, out.data(), nullptr);
      CHECK(s.code() == StatusCode::kDataLoss);
      CHECK_THAT(s.message(), Catch::Contains(path));
    }
  }
}

TEST_CASE("large reads: random ranges on several threads agree with the file", "[io]") {
  // Random ranges (a byte to 20 MiB, odd and aligned offsets, up to the file's unaligned end)
  // read by three threads at once through one RandomAccessFile (thread-safe), with ReadLarge into
  // memory at the data's place in a 4 KiB block (no bounce buffer), off it, or on the heap, with
  // Scan and with Read, while parts of the file are dropped from the page cache and read back in
  // (the probe then finds a range partly cached): every part in order, exactly once, with the
  // file's bytes.
  ScratchDir d;
  const std::string path = d / "reads.bin";
  const std::string bytes = PatternBytes((40u << 20) + 4321, 11);
  Spit(path, bytes);
  WriteBack(path);  // clean in the page cache, so the drops below take
  for (const char* mode_name : {"auto", "on", "off"}) {
    INFO("CKPT_DIRECT_IO=" << mode_name);
    DirectIoMode mode(mode_name);
    auto file = Env::Default()->NewCheckpointFile(path);
    REQUIRE(file.ok());
    const DirectReadStats before = GetDirectReadStats();
    std::atomic<uint64_t> into_place{0};
    std::mutex check_mu;  // Catch's assertions are not thread-safe
    auto reader = [&](uint64_t seed) {
      std::mt19937_64 rng(seed);
      auto uniform = [&](uint64_t lo, uint64_t hi) {
        return std::uniform_int_distribution<uint64_t>(lo, hi)(rng);
      };
      AlignedBuffer io((20u << 20) + 8192);
      std::string heap;
      std::vector<std::string> problems;
      for (int op = 0; op < 24; ++op) {
        uint64_t n = uniform(0, 2) == 0 ? uniform(1, 9000) : uniform(1, 20u << 20);
        uint64_t at = uniform(0, bytes.size() - 1);
        if (uniform(0, 2) == 0) at = at / 4096 * 4096;
        if (uniform(0, 3) == 0) at = bytes.size() - std::min<uint64_t>(n, bytes.size());
        n = std::min<uint64_t>(n, bytes.size() - at);
        const std::string_view want = std::string_view(bytes).substr(at, n);
        const std::string what =
            "op " + std::to_string(op) + " at " + std::to_string(at) + " of " + std::to_string(n);
        const uint64_t kind = uniform(0, 5);
        if (kind == 0) {  // drop a stretch from the page cache, read another in
          UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
          ::posix_fadvise(fd.get(), static_cast<off_t>(at), static_cast<off_t>(n),
                          POSIX_FADV_DONTNEED);
          std::string warm(std::min<uint64_t>(n, 1u << 20), '\0');
          ::pread(fd.get(), warm.data(), warm.size(), static_cast<off_t>(uniform(0, at)));
          continue;
        }
        uint8_t* out;
        if (kind <= 2) {  // ReadLarge: at the data's place, one byte off it, or the heap
          const uint64_t shift = kind == 1 ? 0 : 1;
          if (kind == 2 && uniform(0, 1)) {
            heap.assign(n, '\0');
            out = reinterpret_cast<uint8_t*>(heap.data());
          } else {
            out = io.data() + at % 4096 + shift;
          }
          uint64_t next = at;
          const Status s =
              (*file)->ReadLarge(at, n, out, [&](uint64_t o, const uint8_t* p, size_t k) {
                if (o != next || p != out + (o - at) ||
                    std::memcmp(p, want.data() + (o - at), k) != 0)
                  problems.push_back(what + ": part at " + std::to_string(o));
                next = o + k;
                return Status::Ok();
              });
          if (!s.ok() || next != at + n || std::memcmp(out, want.data(), n) != 0)
            problems.push_back(what + ": ReadLarge " + s.ToString());
          if (kind == 1) into_place += n;
        } else if (kind <= 4) {
          uint64_t next = at;
          const Status s = (*file)->Scan(at, n, [&](uint64_t o, const uint8_t* p, size_t k) {
            if (o != next || std::memcmp(p, want.data() + (o - at), k) != 0)
              problems.push_back(what + ": scanned part at " + std::to_string(o));
            next = o + k;
            return Status::Ok();
          });
          if (!s.ok() || next != at + n) problems.push_back(what + ": Scan " + s.ToString());
        } else {
          heap.assign(n, '\0');
          const Status s = (*file)->Read(at, n, heap.data());
          if (!s.ok() || heap != want) problems.push_back(what + ": Read " + s.ToString());
        }
      }
      std::lock_guard<std::mutex> lock(check_mu);
      for (const auto& p : problems) FAIL_CHECK(p);
    };
    std::vector<std::thread> threads;
    for (uint64_t t = 0; t < 3; ++t) threads.emplace_back(reader, 17 * t + 1);
    for (auto& t : threads) t.join();
    const DirectReadStats after = GetDirectReadStats();
    // What the runs reached: with "on", reads straight into the caller's memory; with "auto",
    // both ways, as the probe found each range.
    if (after.refused != before.refused) {
      WARN("O_DIRECT refused on " << d.str() << ": read through the page cache");
    } else if (std::string(mode_name) == "off") {
      CHECK(after.direct_bytes == before.direct_bytes);
    } else if (std::string(mode_name) == "on") {
      CHECK(into_place > 0);
      CHECK(after.direct_into_caller_bytes > before.direct_into_caller_bytes);
    } else {  // "auto": ranges found in the page cache read through it, the dropped ones not
      CHECK(after.cached_ranges > before.cached_ranges);
      CHECK(after.direct_bytes > before.direct_bytes);
    }
  }
}

TEST_CASE("RunAhead: in order, a bounded distance ahead, per-producer indices, first error",
          "[unit]") {
  for (const int producers : {1, 3}) {
    INFO("producers " << producers);
    constexpr uint64_t kN = 200;
    constexpr int kSlots = 4;
    std::mutex mu;
    std::vector<uint64_t> slot_item(kSlots, kN);  // the item each slot holds
    std::atomic<uint64_t> consumed{0};
    std::atomic<uint64_t> most_ahead{0};
    std::set<int> seen_producers;
    std::vector<uint64_t> order;
    Status s = RunAheadOnProducers(
        kN, kSlots,
        [&](uint64_t i, int slot, int producer) -> Status {
          const uint64_t ahead = i - consumed.load();
          uint64_t m = most_ahead.load();
          while (ahead > m && !most_ahead.compare_exchange_weak(m, ahead)) {
          }
          std::lock_guard<std::mutex> lock(mu);  // Catch's assertions are not thread-safe
          CHECK(slot == static_cast<int>(i % kSlots));
          seen_producers.insert(producer);
          slot_item[static_cast<size_t>(slot)] = i;
          return Status::Ok();
        },
        [&](uint64_t i, int slot) -> Status {
          std::lock_guard<std::mutex> lock(mu);
          CHECK(slot_item[static_cast<size_t>(slot)] == i);  // not yet overwritten
          order.push_back(i);
          consumed = i + 1;
          return Status::Ok();
        },
        producers);
    REQUIRE(s.ok());
    REQUIRE(order.size() == kN);
    for (uint64_t i = 0; i < kN; ++i) CHECK(order[i] == i);
    CHECK(most_ahead.load() < static_cast<uint64_t>(kSlots));
    for (int p : seen_producers) CHECK((p >= 0 && p < producers));

    // A producer's error comes back after the items before it; nothing after it is consumed.
    std::vector<uint64_t> got;
    s = RunAhead(
        kN, kSlots, [&](uint64_t i, int) { return i == 57 ? DataLoss("item 57") : Status::Ok(); },
        [&](uint64_t i, int) {
          got.push_back(i);
          return Status::Ok();
        },
        producers);
    CHECK(s.message() == "item 57");
    CHECK(got.size() == 57);
    // A consumer's error stops the producers within the slots ahead.
    std::atomic<uint64_t> produced{0};
    s = RunAhead(
        kN, kSlots,
        [&](uint64_t, int) {
          ++produced;
          return Status::Ok();
        },
        [&](uint64_t i, int) { return i == 10 ? Internal("enough") : Status::Ok(); }, producers);
    CHECK(s.message() == "enough");
    CHECK(produced.load() <= 11 + kSlots);
  }
  CHECK(RunAhead(0, 2, [](uint64_t, int) { return Internal("never"); },
                 [](uint64_t, int) { return Internal("never"); })
            .ok());
}

TEST_CASE(
    "RunAhead with held items: a consumed item's slot is produced into again only after "
    "the next consume",
    "[unit]") {
  // Export's shape: consume(i) leaves item i's work (its write) running and consume(i + 1)
  // waits for it, so slot i % kSlots must not be produced into before consume(i + 1) returned.
  for (const int producers : {1, 2}) {
    INFO("producers " << producers);
    constexpr uint64_t kN = 300;
    constexpr int kSlots = 3;
    std::mutex mu;
    std::vector<uint64_t> slot_item(kSlots, kN);
    std::vector<bool> in_use(kSlots, false);  // an item's work still runs on the slot
    uint64_t overwritten = 0, most_ahead = 0, consumed = 0;
    std::vector<uint64_t> order;
    Status s = RunAhead(
        kN, kSlots,
        [&](uint64_t i, int slot) -> Status {
          std::lock_guard<std::mutex> lock(mu);
          if (in_use[static_cast<size_t>(slot)]) ++overwritten;
          if (consumed > 0) most_ahead = std::max(most_ahead, i - consumed);  // once under way
          slot_item[static_cast<size_t>(slot)] = i;
          return Status::Ok();
        },
        [&](uint64_t i, int slot) -> Status {
          std::this_thread::yield();  // give a wrong producer the chance
          std::lock_guard<std::mutex> lock(mu);
          CHECK(slot_item[static_cast<size_t>(slot)] == i);
          // The item before this one is done now (its write waited for), this one goes on.
          if (i > 0) in_use[static_cast<size_t>((i - 1) % kSlots)] = false;
          in_use[static_cast<size_t>(slot)] = true;
          order.push_back(i);
          consumed = i + 1;
          return Status::Ok();
        },
        producers, /*held=*/1);
    REQUIRE(s.ok());
    REQUIRE(order.size() == kN);
    for (uint64_t i = 0; i < kN; ++i) CHECK(order[i] == i);
    CHECK(overwritten == 0);
    // With one slot held, production runs at most kSlots - 1 items past the last consumed
    // (without, kSlots).
    CHECK(most_ahead < static_cast<uint64_t>(kSlots - 1));
  }
  // held is at most slots - 1: a run with held >= slots still ends (one slot stays free).
  uint64_t n = 0;
  CHECK(RunAhead(
            10, 2, [](uint64_t, int) { return Status::Ok(); },
            [&](uint64_t, int) {
              ++n;
              return Status::Ok();
            },
            1, 5)
            .ok());
  CHECK(n == 10);
}

TEST_CASE("RunAhead keeps its threads for the next runs; a child of fork() starts its own",
          "[unit]") {
  // The threads that ran the producers of 50 runs (two producers each, on other threads).
  std::mutex mu;
  std::set<long> tids;
  auto run = [&](int runs) {
    for (int r = 0; r < runs; ++r) {
      Status s = RunAhead(
          32, 4,
          [&](uint64_t, int) {
            std::lock_guard<std::mutex> lock(mu);
            tids.insert(static_cast<long>(syscall(SYS_gettid)));
            return Status::Ok();
          },
          [](uint64_t, int) { return Status::Ok(); }, 2);
      if (!s.ok()) return s;
    }
    return Status::Ok();
  };
  REQUIRE(run(50).ok());
  CHECK(!tids.count(static_cast<long>(syscall(SYS_gettid))));
  // A thread per producer per run would be up to 100; kept threads serve them all (a few more
  // start when a run begins before the last run's threads are back waiting).
  CHECK(tids.size() <= 20);

  // The parent's waiting threads do not exist in a child: its runs start threads of their own
  // (a child that handed them work would wait forever; killed after 20 s).
  const pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    tids.clear();
    const bool ok = run(3).ok() && !tids.empty();
    _exit(ok ? 0 : 1);
  }
  int status = 0;
  pid_t done = 0;
  for (int i = 0; i < 2000 && done == 0; ++i) {
    done = waitpid(pid, &status, WNOHANG);
    if (done == 0) usleep(10'000);
  }
  if (done == 0) {
    kill(pid, SIGKILL);
    waitpid(pid, &status, 0);
  }
  CHECK(done == pid);
  CHECK(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
}

TEST_CASE("ForEachOnThreads runs every item once, on several threads, each with its status",
          "[unit]") {
  for (const int threads : {1, 4, 64}) {
    INFO("threads " << threads);
    std::mutex mu;
    std::set<long> tids;
    std::vector<std::atomic<int>> runs(40);
    const std::vector<Status> st = ForEachOnThreads(runs.size(), threads, [&](size_t i) -> Status {
      ++runs[i];
      {
        std::lock_guard<std::mutex> lock(mu);
        tids.insert(static_cast<long>(syscall(SYS_gettid)));
      }
      usleep(1000);  // long enough for the helpers to take items too
      if (i == 7) return ckpt::DataLoss("item 7 failed");
      if (i == 9) throw std::bad_alloc();
      return Status::Ok();
    });
    REQUIRE(st.size() == runs.size());
    for (size_t i = 0; i < runs.size(); ++i) CHECK(runs[i] == 1);
    CHECK(st[7].code() == ckpt::StatusCode::kDataLoss);
    CHECK(st[9].code() == ckpt::StatusCode::kResourceExhausted);
    size_t ok = 0;
    for (const Status& s : st) ok += s.ok();
    CHECK(ok == runs.size() - 2);
    // One thread asked: all on the calling thread (which also takes whatever is left when no
    // helper starts). More: helpers take items too (they may take them all before the calling
    // thread starts on its share).
    if (threads == 1) CHECK(tids == std::set<long>{static_cast<long>(syscall(SYS_gettid))});
    if (threads > 1) CHECK(tids.size() > 1);
    CHECK(tids.size() <= std::min<size_t>(static_cast<size_t>(threads), runs.size()));
  }
  CHECK(ForEachOnThreads(0, 4, [](size_t) { return ckpt::Internal("never"); }).empty());
}

// The threads this process has now (its /proc/self/task entries). A walk of /proc/self/task
// goes on from its last entry's place in the thread list: when a thread before it ends
// meanwhile (threads of earlier tests still ending), the walk skips a live thread. Read until
// two walks in a row agree (a skipped thread counted as new failed one run of the test in 10).
static std::set<long> ThreadIds() {
  auto walk = [] {
    std::set<long> ids;
    for (const auto& e : std::filesystem::directory_iterator("/proc/self/task"))
      ids.insert(std::stol(e.path().filename().string()));
    return ids;
  };
  std::set<long> ids = walk();
  for (int i = 0; i < 1000; ++i) {
    std::set<long> again = walk();
    if (again == ids) break;
    ids = std::move(again);
  }
  return ids;
}

// How many of the threads this process has now are not among `before`: threads started since.
// (Threads of earlier tests may still be ending, so the count alone can go down meanwhile.)
static size_t NewThreads(const std::set<long>& before) {
  size_t n = 0;
  for (long id : ThreadIds()) n += before.count(id) == 0;
  return n;
}

TEST_CASE(
    "KeepHelpersReady starts the helper threads up front; Helpers and O_DIRECT writes run on them",
    "[io]") {
  KeepHelpersReady(4);
  const std::set<long> ready = ThreadIds();
  // Four tasks that each wait until all four run: four threads at once, all of them kept ones
  // (a new thread would show in /proc/self/task under an id not there before).
  std::mutex mu;
  std::condition_variable cv;
  int running = 0;
  size_t most = 0;
  std::set<long> tids;
  {
    Helpers helpers;
    for (int t = 0; t < 4; ++t) {
      REQUIRE(helpers.Start([&] {
        std::unique_lock<std::mutex> lock(mu);
        tids.insert(static_cast<long>(syscall(SYS_gettid)));
        most = std::max(most, NewThreads(ready));
        ++running;
        cv.notify_all();
        cv.wait(lock, [&] { return running == 4; });
      }));
    }
    CHECK(helpers.started() == 4);
    helpers.Join();
  }
  CHECK(running == 4);
  CHECK(tids.size() == 4);
  CHECK(!tids.count(static_cast<long>(syscall(SYS_gettid))));
  CHECK(most == 0);
  for (long tid : tids) CHECK(ready.count(tid) == 1);

  // DirectWriter's writes run on the kept threads too: while a 21 MiB range leaves with O_DIRECT
  // (helper threads writing 8 MiB blocks), the process has no thread it did not have before.
  // With a thread started per write, two new ones were seen between blocks.
  ScratchDir d;
  const std::string path = d / "out.bin";
  const std::string data = PatternBytes((21u << 20) + 777, 7);
  DirectIoMode on("on");
  for (int round = 0; round < 3; ++round) {
    Spit(path, std::string(data.size() + 4096, '\x5a'));
    auto file = Env::Default()->OpenRandomWriteFile(path);
    REQUIRE(file.ok());
    const DirectWriteStats before = GetDirectWriteStats();
    size_t seen = 0;
    REQUIRE(
        (*file)
            ->WriteThrough(4096, data,
                           [&](const uint8_t*, size_t) { seen = std::max(seen, NewThreads(ready)); })
            .ok());
    REQUIRE((*file)->Close().ok());  // staged blocks may still be going out until here
    const DirectWriteStats after = GetDirectWriteStats();
    if (after.refused != before.refused) {
      WARN("O_DIRECT refused on " << d.str() << ": no helper threads to count");
      break;
    }
    CHECK(after.direct_bytes - before.direct_bytes >= (16u << 20));
    CHECK(seen == 0);
  }
}

TEST_CASE("WriteThrough: O_DIRECT from staging for the aligned middle, pieces in order", "[io]") {
  ScratchDir d;
  const std::string path = d / "rank.bin";
  const size_t size = (26u << 20) + 999;
  const uint64_t offset = 3 * 4096 + 5;  // an unaligned head and tail around the middle
  const std::string data = PatternBytes((21u << 20) + 777, 5);
  const uint64_t lo = (offset + 4095) / 4096 * 4096, hi = (offset + data.size()) / 4096 * 4096;
  for (const char* mode_name : {"on", "auto", "off"}) {
    INFO("CKPT_DIRECT_IO=" << mode_name);
    DirectIoMode mode(mode_name);
    Spit(path, std::string(size, '\x5a'));
    auto file = Env::Default()->OpenRandomWriteFile(path);
    REQUIRE(file.ok());
    std::string seen;
    size_t largest = 0;
    const DirectWriteStats before = GetDirectWriteStats();
    REQUIRE((*file)->WriteThrough(offset, data, [&](const uint8_t* p, size_t n) {
                     seen.append(reinterpret_cast<const char*>(p), n);
                     largest = std::max(largest, n);
                   }).ok());
    REQUIRE((*file)->Sync().ok());  // staged blocks may still be going out until here
    const DirectWriteStats after = GetDirectWriteStats();
    REQUIRE((*file)->Close().ok());
    CHECK(seen == data);  // every byte handed over once, in order
    CHECK(largest <= RandomWriteFile::kWritePiece);
    std::string expect(size, '\x5a');
    expect.replace(offset, data.size(), data);
    CHECK(Slurp(path) == expect);
    const uint64_t direct = after.direct_bytes - before.direct_bytes;
    const uint64_t buffered = after.buffered_bytes - before.buffered_bytes;
    CHECK(direct + buffered == data.size());
    if (std::string(mode_name) == "off") {
      CHECK(direct == 0);  // CKPT_DIRECT_IO=off: the page cache
    } else if (after.refused == before.refused) {
      CHECK(direct == hi - lo);  // the whole middle, the head and tail by pwrite
    } else {
      WARN("O_DIRECT refused on " << d.str() << ": written through the page cache");
      CHECK(direct == 0);
    }
  }
}

TEST_CASE("WriteThrough: small staged ranges go on in the background, in order, errors kept",
          "[io]") {
  ScratchDir d;
  const std::string path = d / "rank.bin";
  // Twelve tensors of 1 MiB (below a staging block) and one of 3 MiB + 100 bytes, from the heap,
  // one after another in the file as a rank file's datasets are: 4 KiB-aligned, or back to back
  // from an odd offset as in universal.h5 (each range's edges then share a 4 KiB block with its
  // neighbours', written with pwrite while the neighbours' middles may still be going out).
  std::vector<std::string> tensors;
  for (int i = 0; i < 12; ++i) tensors.push_back(PatternBytes(1u << 20, 20 + i));
  tensors.push_back(PatternBytes((3u << 20) + 100, 40));
  std::vector<uint64_t> at;
  uint64_t size = 0;
  auto place = [&](bool packed) {
    at.clear();
    size = packed ? 4096 + 123 : 4096;
    for (const auto& t : tensors) {
      at.push_back(size);
      size = packed ? size + t.size() : (size + t.size() + 4095) / 4096 * 4096;
    }
  };
  for (const bool packed : {false, true})
    for (const char* mode_name : {"auto", "off"}) {
      INFO("CKPT_DIRECT_IO=" << mode_name << (packed ? ", back to back" : ", aligned"));
      place(packed);
      std::string expect(size, '\x11');
      for (size_t i = 0; i < tensors.size(); ++i)
        expect.replace(at[i], tensors[i].size(), tensors[i]);
      DirectIoMode mode(mode_name);
      Spit(path, std::string(size, '\x11'));
      auto file = Env::Default()->OpenRandomWriteFile(path);
      REQUIRE(file.ok());
      std::string want;
      for (const auto& t : tensors) want += t;
      const DirectWriteStats before = GetDirectWriteStats();
      // Each range is handed over whole, in order, before the call returns, and a read of what
      // was just written waits for it (the seal and file digest read back).
      const std::string seen = WriteEachThrough(**file, at, tensors, [&](size_t i) {
        std::string back(tensors[i].size(), '\0');
        REQUIRE((*file)->Read(at[i], back.size(), back.data()).ok());
        CHECK(back == tensors[i]);
      });
      REQUIRE((*file)->Close().ok());
      const DirectWriteStats after = GetDirectWriteStats();
      CHECK(seen == want);
      CHECK(Slurp(path) == expect);
      const uint64_t direct = after.direct_bytes - before.direct_bytes;
      if (std::string(mode_name) == "off") {
        CHECK(direct == 0);
      } else if (after.refused == before.refused) {
        uint64_t middles = 0;  // every range's whole 4 KiB blocks
        for (size_t i = 0; i < tensors.size(); ++i)
          middles += (at[i] + tensors[i].size()) / 4096 * 4096 - (at[i] + 4095) / 4096 * 4096;
        CHECK(direct == middles);
        if (!packed) CHECK(direct == 12 * (1u << 20) + (3u << 20));  // all but the last tail
      } else {
        WARN("O_DIRECT refused on " << d.str() << ": written through the page cache");
      }
    }

  // A block that fails while the caller goes on: its error comes back from a later call (here a
  // file size limit: writes past 2 MiB fail with EFBIG), never lost, and Close reports it too.
  place(false);
  struct rlimit old {};
  REQUIRE(getrlimit(RLIMIT_FSIZE, &old) == 0);
  void (*old_handler)(int) = std::signal(SIGXFSZ, SIG_IGN);
  Spit(path, "");
  auto file = Env::Default()->OpenRandomWriteFile(path);
  REQUIRE(file.ok());
  struct rlimit small = old;
  small.rlim_cur = 2u << 20;
  REQUIRE(setrlimit(RLIMIT_FSIZE, &small) == 0);
  Status first_error = Status::Ok();
  // Back to back, the ranges fill one staging block after another (the carry): the first
  // block past the limit fails once it is full and handed over, and a later call says so
  // (a later WriteThrough once the writer has failed, else Size, which waits for the writes).
  for (size_t i = 0; i < tensors.size() && first_error.ok(); ++i)
    first_error = (*file)->WriteThrough(at[i], tensors[i], nullptr);
  if (first_error.ok()) first_error = (*file)->Size().status();
  const Status closed = (*file)->Close();
  REQUIRE(setrlimit(RLIMIT_FSIZE, &old) == 0);
  std::signal(SIGXFSZ, old_handler);
  INFO(first_error.ToString() << " / " << closed.ToString());
  CHECK(!first_error.ok());
  CHECK(first_error.ToString().find(path) != std::string::npos);
  CHECK(first_error.ToString().find("File too large") != std::string::npos);
  CHECK(!closed.ok());
}

TEST_CASE("WriteThrough: ranges back to back leave in whole staging blocks", "[io]") {
  // universal.h5's layout: many 1 MiB datasets end to end from an odd offset, each sharing a
  // 4 KiB block with the next, then a gap (HDF5 metadata) and more. Staged, each range
  // continues the block the one before left open (the carry), so only the run's first head
  // and last tail go through the page cache, not two edges per range.
  ScratchDir d;
  const std::string path = d / "universal.bin";
  std::vector<std::string> tensors;
  for (int i = 0; i < 20; ++i) tensors.push_back(PatternBytes((1u << 20) + (i == 7 ? 12 : 0), i));
  const uint64_t gap_at = 11;  // a gap of 2 KiB before tensor 11 starts a second run
  std::vector<uint64_t> at;
  uint64_t size = 4096 + 424;
  for (size_t i = 0; i < tensors.size(); ++i) {
    if (i == gap_at) size += 2048;
    at.push_back(size);
    size += tensors[i].size();
  }
  std::string expect(size + 4096, '\x33');
  for (size_t i = 0; i < tensors.size(); ++i) expect.replace(at[i], tensors[i].size(), tensors[i]);
  DirectIoMode mode("auto");
  Spit(path, std::string(expect.size(), '\x33'));
  auto file = Env::Default()->OpenRandomWriteFile(path);
  REQUIRE(file.ok());
  std::string want;
  for (const auto& t : tensors) want += t;
  const DirectWriteStats before = GetDirectWriteStats();
  const std::string seen = WriteEachThrough(**file, at, tensors);
  // A read of the first run's last bytes gets them (the open block is written first).
  std::string back(4096, '\0');
  REQUIRE(
      (*file)->Read(at[gap_at - 1] + tensors[gap_at - 1].size() - 4096, 4096, back.data()).ok());
  CHECK(back == tensors[gap_at - 1].substr(tensors[gap_at - 1].size() - 4096));
  REQUIRE((*file)->Close().ok());
  const DirectWriteStats after = GetDirectWriteStats();
  CHECK(seen == want);
  CHECK(Slurp(path) == expect);
  if (after.refused != before.refused) {
    WARN("O_DIRECT refused on " << d.str() << ": written through the page cache");
    return;
  }
  // Two runs, [at[0], end of 10) and [at[11], end of 19): each run's whole 4 KiB blocks leave
  // with O_DIRECT (the second run's open block written when the read above flushed it).
  auto whole = [](uint64_t from, uint64_t to) {
    return to / 4096 * 4096 - (from + 4095) / 4096 * 4096;
  };
  const uint64_t run1 = whole(at[0], at[gap_at - 1] + tensors[gap_at - 1].size());
  const uint64_t run2 = whole(at[gap_at], at.back() + tensors.back().size());
  CHECK(after.direct_bytes - before.direct_bytes == run1 + run2);
  CHECK(after.buffered_bytes - before.buffered_bytes < 4 * 4096);
}

TEST_CASE("WriteThrough: data in I/O memory leaves with O_DIRECT from where it lies", "[io]") {
  ScratchDir d;
  const std::string path = d / "rank.bin";
  const size_t size = (30u << 20) + 999;
  const uint64_t offset = 5 * 4096 + 123;  // the data's place within its 4 KiB block
  const std::string pattern = PatternBytes((21u << 20) + 777, 9);
  AlignedBuffer io((24u << 20));
  uint8_t* at = io.data() + 123;  // the same place within a block as `offset`
  std::memcpy(at, pattern.data(), pattern.size());
  const std::string_view data(reinterpret_cast<const char*>(at), pattern.size());
  const uint64_t lo = (offset + 4095) / 4096 * 4096, hi = (offset + data.size()) / 4096 * 4096;
  struct Case {
    const char* mode;  // CKPT_DIRECT_IO
    std::string_view data;
    bool in_place;  // expected, where O_DIRECT is not refused
  };
  const std::string heap(pattern);
  const std::string_view shifted(reinterpret_cast<const char*>(io.data() + 1), pattern.size());
  std::memmove(io.data() + 1, pattern.data(), pattern.size());  // one byte off the file's place
  for (const Case& c : {Case{"auto", shifted, false}, Case{"auto", heap, false},
                        Case{"on", shifted, false}, Case{"off", data, false},
                        Case{"auto", data, true}, Case{"on", data, true}}) {
    if (c.data.data() == data.data()) std::memcpy(at, pattern.data(), pattern.size());
    const bool is_io = c.data.data() != heap.data();
    INFO("CKPT_DIRECT_IO=" << c.mode << (is_io ? " from I/O memory" : " from the heap")
                           << (c.data.data() == shifted.data() ? ", shifted" : ""));
    DirectIoMode mode(c.mode);
    Spit(path, std::string(size, '\x33'));
    auto file = Env::Default()->OpenRandomWriteFile(path);
    REQUIRE(file.ok());
    std::string seen;
    const DirectWriteStats before = GetDirectWriteStats();
    REQUIRE((*file)
                ->WriteThrough(offset, c.data,
                               [&](const uint8_t* p, size_t n) {
                                 seen.append(reinterpret_cast<const char*>(p), n);
                               })
                .ok());
    REQUIRE((*file)->Close().ok());  // staged blocks may still be going out until here
    const DirectWriteStats after = GetDirectWriteStats();
    CHECK(seen == pattern);  // every byte handed over once, in order
    std::string expect(size, '\x33');
    expect.replace(offset, pattern.size(), pattern);
    CHECK(Slurp(path) == expect);
    const uint64_t direct = after.direct_bytes - before.direct_bytes;
    const uint64_t in_place = after.in_place_bytes - before.in_place_bytes;
    if (after.refused != before.refused) {
      WARN("O_DIRECT refused on " << d.str() << ": written through the page cache");
      CHECK(direct == 0);
      continue;
    }
    CHECK(in_place == (c.in_place ? hi - lo : 0));
    // "auto" and "on" stage what cannot leave in place; "off" keeps the page cache.
    const bool direct_expected = std::string(c.mode) != "off";
    CHECK(direct == (direct_expected ? hi - lo : 0));
  }
}

namespace {

// Fills [p, p + n) with bytes from `rng`, eight at a time.
void RandomFill(std::mt19937_64& rng, uint8_t* p, size_t n) {
  for (size_t i = 0; i < n; i += 8) {
    const uint64_t x = rng();
    std::memcpy(p + i, &x, std::min<size_t>(8, n - i));
  }
}

// What a run of the model test below reached, summed over its runs.
struct ModelReach {
  uint64_t direct = 0, in_place = 0, back_to_back = 0, rewrites = 0, reads_of_pending = 0;
  bool refused = false;
  void Add(const DirectWriteStats& before, const DirectWriteStats& after) {
    direct += after.direct_bytes - before.direct_bytes;
    in_place += after.in_place_bytes - before.in_place_bytes;
    refused = refused || after.refused != before.refused;
  }
};

// Where the file at `path` first differs from `want` (its size when it is a prefix of the
// other, or longer), read in 1 MiB pieces; -1 when they are equal.
int64_t FirstDifference(const std::string& path, std::string_view want) {
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  REQUIRE(fd.valid());
  std::string buf(1u << 20, '\0');
  uint64_t at = 0;
  for (;;) {
    const ssize_t got = ::pread(fd.get(), buf.data(), buf.size(), static_cast<off_t>(at));
    REQUIRE(got >= 0);
    const std::string_view part = want.substr(std::min<uint64_t>(at, want.size()), got);
    if (std::memcmp(buf.data(), part.data(), part.size()) != 0)
      for (size_t i = 0; i < part.size(); ++i)
        if (buf[i] != part[i]) return static_cast<int64_t>(at + i);
    if (static_cast<size_t>(got) != part.size() || got == 0)
      return at + got == want.size() ? -1 : static_cast<int64_t>(at + part.size());
    at += static_cast<uint64_t>(got);
  }
}

// One writer's operands, in buffers kept from one call to the next (fresh memory costs its
// page faults). Lengths run from a byte to 18 MiB, around the sizes where DirectWriter changes
// course (kMinDeferred, a 1 MiB piece, an 8 MiB block); the bytes are random, and the call gets
// a copy of them: in I/O memory at the place the offset takes in a 4 KiB block (they then leave
// from where they lie) for about a third of the ranges that fit, else on the heap.
struct ModelWriter {
  ModelWriter(std::mt19937_64& r, AlignedBuffer& b) : rng(r), io(b) {}
  std::mt19937_64& rng;
  AlignedBuffer& io;
  std::string keep, lent, seen, back;

  uint64_t Uniform(uint64_t lo, uint64_t hi) {
    return std::uniform_int_distribution<uint64_t>(lo, hi)(rng);
  }
  uint64_t Length() {
    switch (Uniform(0, 3)) {
      case 0:
        return Uniform(1, 9000);
      case 1:
        return Uniform(400u << 10, 1600u << 10);
      case 2:
        return Uniform(1u << 20, 9u << 20);
      default:
        return Uniform(8u << 20, 18u << 20);
    }
  }
  // Writes n fresh bytes (kept in `keep`) at `at` through `write`, called with a piece checker
  // (each piece at most `piece` bytes), and scribbles over the call's copy the moment it
  // returns: the caller may reuse its bytes at once, so a write that still read them would put
  // 0xEE on file. Checks that every byte was handed over once, in order.
  template <typename WriteFn>
  void Write(uint64_t at, uint64_t n, size_t piece, WriteFn write) {
    keep.resize(n);
    RandomFill(rng, reinterpret_cast<uint8_t*>(keep.data()), n);
    const uint64_t place = at % 4096;
    std::string_view data;
    if (Uniform(0, 2) == 0 && place + n <= io.size()) {
      std::memcpy(io.data() + place, keep.data(), n);
      data = {reinterpret_cast<const char*>(io.data() + place), n};
    } else {
      lent = keep;
      data = lent;
    }
    seen.clear();
    const Status s = write(data, [&](const uint8_t* p, size_t k) {
      CHECK(k <= piece);
      seen.append(reinterpret_cast<const char*>(p), k);
    });
    std::memset(const_cast<char*>(data.data()), 0xEE, data.size());
    REQUIRE(s.ok());
    CHECK((seen == keep));
  }
};

}  // namespace

// A model of the file for the offset writer (PosixRandomWriteFile: DirectWriter's staging,
// in-place writes, deferred ranges and the carry) and the appending one (PosixWritableFile's
// large appends): random ranges at aligned and odd offsets, half of them starting where the
// last one ended (the carry's runs), reads of what may still be going out, Size, Sync and plain
// writes, each checked against a std::string holding what the file must hold. The caller's
// bytes are scribbled over as soon as a call returns; each mode asserts what it reached.
TEST_CASE("WriteThrough and large appends: random operations agree with a model of the file",
          "[io]") {
  ScratchDir d;
  constexpr uint64_t kFile = 32u << 20;
  AlignedBuffer io(20u << 20);
  for (const char* mode_name : {"auto", "off"}) {
    DirectIoMode mode(mode_name);
    ModelReach reach;
    for (uint64_t seed = 1; seed <= 3; ++seed) {
      INFO("CKPT_DIRECT_IO=" << mode_name << ", seed " << seed);
      std::mt19937_64 rng(seed);
      ModelWriter src{rng, io};

      // Offset writes into an existing file, which they may extend.
      const std::string path = d / ("offsets_" + std::to_string(seed) + ".bin");
      std::string model = PatternBytes(kFile, 100 + seed);
      model.reserve(kFile + (4u << 20));
      Spit(path, model);
      auto file = Env::Default()->OpenRandomWriteFile(path);
      REQUIRE(file.ok());
      DirectWriteStats before = GetDirectWriteStats();
      uint64_t last_at = 0, last_end = 0;  // the last WriteThrough's range (none yet: 0, 0)
      for (int op = 0; op < 60; ++op) {
        const uint64_t kind = src.Uniform(0, 10);
        INFO("operation " << op << ", kind " << kind);
        if (kind <= 6) {  // WriteThrough: after the last range, over it, or anywhere
          const bool follow = last_end > 0 && kind <= 2;
          const bool again = last_end > 0 && kind == 3;
          uint64_t at = follow ? last_end : again ? last_at : src.Uniform(0, kFile - 1);
          if (!follow && !again && src.Uniform(0, 1) == 0) at = at / 4096 * 4096;
          const uint64_t n = std::min(src.Length(), kFile + (4u << 20) - at);
          INFO("WriteThrough at " << at << " of " << n);
          src.Write(at, n, RandomWriteFile::kWritePiece, [&](std::string_view data, auto piece) {
            return (*file)->WriteThrough(at, data, piece);
          });
          if (model.size() < at + n) model.resize(at + n);
          model.replace(at, n, src.keep);
          reach.back_to_back += follow;
          reach.rewrites += again;
          last_at = at;
          last_end = at + n;
        } else if (kind == 7) {  // a plain write, often over what was just handed over
          const uint64_t n = src.Uniform(1, 9000);
          const uint64_t at =
              last_end > n && src.Uniform(0, 1) ? last_end - n : src.Uniform(0, kFile - n);
          std::string bytes(n, '\0');
          RandomFill(rng, reinterpret_cast<uint8_t*>(bytes.data()), n);
          REQUIRE((*file)->Write(at, bytes).ok());
          model.replace(at, n, bytes);
        } else if (kind <= 9) {  // a read, half the time of the last range's end
          const uint64_t n = src.Uniform(1, 3u << 20);
          uint64_t at = src.Uniform(0, model.size() - n);
          if (last_end > n && src.Uniform(0, 1)) {
            at = last_end - n;
            ++reach.reads_of_pending;
          }
          src.back.resize(n);
          REQUIRE((*file)->Read(at, n, src.back.data()).ok());
          CHECK((src.back == std::string_view(model).substr(at, n)));
        } else {  // Size, or Sync
          if (src.Uniform(0, 1)) {
            auto size = (*file)->Size();
            REQUIRE(size.ok());
            CHECK(*size == model.size());
          } else {
            REQUIRE((*file)->Sync().ok());
          }
        }
      }
      REQUIRE((*file)->Close().ok());
      reach.Add(before, GetDirectWriteStats());
      CHECK(FirstDifference(path, model) == -1);

      // Appends to a new file: plain and large ones, the latter from the heap or in place.
      const std::string out = d / ("appends_" + std::to_string(seed) + ".bin");
      auto appended = Env::Default()->NewWritableFile(out);
      REQUIRE(appended.ok());
      before = GetDirectWriteStats();
      std::string expect;
      expect.reserve(kFile + (20u << 20));
      for (int op = 0; op < 30; ++op) {
        const uint64_t kind = src.Uniform(0, 4);
        INFO("append " << op << ", kind " << kind);
        if (kind <= 2 && expect.size() < kFile) {
          const uint64_t n = src.Length();
          src.Write(expect.size(), n, WritableFile::kAppendPiece,
                    [&](std::string_view data, auto piece) {
                      return (*appended)->AppendThrough(data, piece);
                    });
          expect += src.keep;
        } else if (kind == 3) {
          std::string bytes(src.Uniform(1, 5000), '\0');
          RandomFill(rng, reinterpret_cast<uint8_t*>(bytes.data()), bytes.size());
          REQUIRE((*appended)->Append(bytes).ok());
          expect += bytes;
        } else {
          REQUIRE((*appended)->Sync().ok());
        }
      }
      REQUIRE((*appended)->Close().ok());
      reach.Add(before, GetDirectWriteStats());
      CHECK(FirstDifference(out, expect) == -1);
      fs::remove(path);
      fs::remove(out);
    }
    // What the runs reached: back-to-back ranges and reads of ranges just handed over in every
    // mode; with O_DIRECT, blocks staged and blocks written from where they lie.
    INFO("CKPT_DIRECT_IO=" << mode_name);
    CHECK(reach.back_to_back >= 10);
    CHECK(reach.rewrites >= 5);
    CHECK(reach.reads_of_pending >= 5);
    if (std::string(mode_name) == "off") {
      CHECK(reach.direct == 0);
    } else if (reach.refused) {
      WARN("O_DIRECT refused on " << d.str() << ": written through the page cache");
    } else {
      CHECK(reach.direct > reach.in_place);
      CHECK(reach.in_place > 0);
    }
  }
}

TEST_CASE("WriteThrough: a range written over while its blocks still go out keeps the later bytes",
          "[io]") {
  // Two writers take the handed-over blocks in any order, and an unaligned edge goes through
  // the page cache: a range written again at once (a staged range with an odd tail, then the
  // same range from I/O memory or staged again) must not have its new bytes overtaken by the
  // old ones still going out.
  ScratchDir d;
  const std::string path = d / "again.bin";
  constexpr uint64_t kRange = (2u << 20) + 100;
  constexpr int kRounds = 48;
  AlignedBuffer io(4u << 20);
  std::mt19937_64 rng(7);
  std::string expect(kRounds * (3u << 20), '\x55');
  Spit(path, expect);
  DirectIoMode mode("auto");
  auto file = Env::Default()->OpenRandomWriteFile(path);
  REQUIRE(file.ok());
  std::string old_bytes(kRange, '\0'), new_bytes(kRange, '\0');
  for (int round = 0; round < kRounds; ++round) {
    const uint64_t at = round * (3u << 20) + (round % 3) * 1000;
    RandomFill(rng, reinterpret_cast<uint8_t*>(old_bytes.data()), kRange);
    RandomFill(rng, reinterpret_cast<uint8_t*>(new_bytes.data()), kRange);
    REQUIRE((*file)->WriteThrough(at, old_bytes, nullptr).ok());
    std::string_view again = new_bytes;
    if (round % 2 == 0) {  // from I/O memory, at the offset's place in a 4 KiB block
      std::memcpy(io.data() + at % 4096, new_bytes.data(), kRange);
      again = {reinterpret_cast<const char*>(io.data() + at % 4096), kRange};
    }
    REQUIRE((*file)->WriteThrough(at, again, nullptr).ok());
    expect.replace(at, kRange, new_bytes);
  }
  REQUIRE((*file)->Close().ok());
  CHECK(FirstDifference(path, expect) == -1);
}

TEST_CASE("ckpt synth's state in I/O memory is saved from where it lies and reads back", "[io]") {
  ScratchDir d;
  SynthOptions o;
  o.ranks = 2;
  o.params = 6'000'000;  // about 12 MiB a state and rank
  const DirectWriteStats before = GetDirectWriteStats();
  auto tags = WriteSynthetic(d / "root", o);
  REQUIRE(tags.ok());
  const DirectWriteStats after = GetDirectWriteStats();
  if (after.refused == before.refused) {
    // The three states of both ranks (over 11 MiB each), less their unaligned heads and tails.
    CHECK(after.in_place_bytes - before.in_place_bytes >= 6 * (10u << 20));
  } else {
    WARN("O_DIRECT refused on " << d.str() << ": written through the page cache");
  }
  auto rd = CheckpointReader::Open(d / "root");
  REQUIRE(rd.ok());
  auto problems = CheckCheckpoint(rd->dir(), /*deep=*/true);
  REQUIRE(problems.ok());
  CHECK(problems->empty());
  const auto& params = rd->manifest().params;
  for (size_t i = 0; i < params.size(); ++i) {
    if (!params[i].trainable()) continue;
    auto got = rd->ReadParamFull(params[i].name);
    REQUIRE(got.ok());
    for (int64_t e : {int64_t{0}, params[i].numel / 2, params[i].numel - 1})
      CHECK((*got)[static_cast<size_t>(e)] == SynthValue(o.seed, 100, i, "master", e));
  }
}

TEST_CASE("a large output written in odd appends, synced midway, is byte for byte", "[io]") {
  ScratchDir d;
  const std::string bytes = PatternBytes((61u << 20) + 4321, 11);
  // Odd append sizes (a header, then pieces that straddle the 4 MiB write and writeback
  // boundaries, and pieces large enough to leave with O_DIRECT from staging between plain
  // writes), a Sync in the middle and more appends after it, as a writer may do.
  const std::vector<size_t> sizes = {9, 1234567, (8u << 20) - 5, 3, (5u << 20) + 77,
                                     (1u << 20), 4095, (17u << 20) + 1, 4097, (9u << 20) + 3};
  const std::string path = d / "out.bin";
  {
    const DirectWriteStats before = GetDirectWriteStats();
    auto w = Env::Default()->NewWritableFile(path);
    REQUIRE(w.ok());
    size_t at = 0, k = 0;
    while (at < bytes.size()) {
      const size_t n = std::min(sizes[k++ % sizes.size()], bytes.size() - at);
      REQUIRE((*w)->Append(std::string_view(bytes).substr(at, n)).ok());
      at += n;
      if (k == 5) REQUIRE((*w)->Sync().ok());
    }
    REQUIRE((*w)->Sync().ok());
    REQUIRE((*w)->Close().ok());
    REQUIRE((*w)->Close().ok());  // idempotent
    const DirectWriteStats after = GetDirectWriteStats();
    if (after.refused == before.refused && !std::getenv("CKPT_DIRECT_IO"))
      CHECK(after.direct_bytes - before.direct_bytes >= (16u + 8u) << 20);  // the large pieces
  }
  CHECK(Slurp(path) == bytes);
  const std::string log = d / "log.bin";
  for (int i = 0; i < 2; ++i) {
    auto w = Env::Default()->NewAppendableFile(log);
    REQUIRE(w.ok());
    REQUIRE((*w)->Append(std::string_view(bytes).substr(i * (bytes.size() / 2), bytes.size() / 2)).ok());
    REQUIRE((*w)->Close().ok());
  }
  CHECK(Slurp(log) == bytes.substr(0, 2 * (bytes.size() / 2)));
}

TEST_CASE(
    "AppendThrough hands every byte over in order, each piece before it is written (in "
    "place: while it is written)",
    "[io]") {
  ScratchDir d;
  const std::string header = PatternBytes(4321, 5);
  const std::string bytes = PatternBytes((21u << 20) + 4097, 6);
  // The bytes from I/O memory at their place within a 4 KiB block in the file (O_DIRECT from
  // where they lie), from ordinary memory (O_DIRECT from staging), and small (plain writes).
  AlignedBuffer io(bytes.size() + 2 * AlignedBuffer::kAlign);
  uint8_t* in_io = io.data() + header.size() % AlignedBuffer::kAlign;
  std::memcpy(in_io, bytes.data(), bytes.size());
  const std::string_view small = std::string_view(bytes).substr(0, (3u << 20) + 5);
  const std::vector<std::pair<std::string, std::string_view>> cases = {
      {"I/O memory", std::string_view(reinterpret_cast<const char*>(in_io), bytes.size())},
      {"ordinary memory", bytes},
      {"small", small}};
  for (const auto& c : cases) {
    const std::string& name = c.first;
    const std::string_view data = c.second;  // not a structured binding: lambdas capture it
    SECTION(name) {
      const std::string path = d / "out.bin";
      const DirectWriteStats before = GetDirectWriteStats();
      auto w = Env::Default()->NewWritableFile(path);
      REQUIRE(w.ok());
      REQUIRE((*w)->Append(header).ok());
      UniqueFd probe(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
      REQUIRE(probe.valid());
      std::string handed;
      size_t pieces = 0, largest = 0, written_ahead = 0;
      REQUIRE((*w)->AppendThrough(
                      data,
                      [&](const uint8_t* p, size_t n) {
                        // In order and contiguous: each piece starts where the last one ended.
                        CHECK(p == reinterpret_cast<const uint8_t*>(data.data()) + handed.size());
                        struct stat st {};
                        REQUIRE(::fstat(probe.get(), &st) == 0);
                        // Nothing at or past this piece is on file yet.
                        if (static_cast<uint64_t>(st.st_size) > header.size() + handed.size())
                          ++written_ahead;
                        handed.append(reinterpret_cast<const char*>(p), n);
                        ++pieces;
                        largest = std::max(largest, n);
                      })
                  .ok());
      REQUIRE((*w)->Close().ok());
      const DirectWriteStats after = GetDirectWriteStats();
      CHECK(handed == data);
      // A block written in place is handed over once its write is under way (its hash does
      // not hold the write back); a staged or plain one before it is written.
      if (name != "I/O memory") CHECK(written_ahead == 0);
      CHECK(largest <= WritableFile::kAppendPiece);
      CHECK(pieces >= data.size() / WritableFile::kAppendPiece);
      CHECK(Slurp(path) == header + std::string(data));
      // The large cases went past the page cache (the path that hashes on the way out), the
      // small one did not.
      if (after.refused == before.refused && !std::getenv("CKPT_DIRECT_IO")) {
        if (data.size() == small.size())
          CHECK(after.direct_bytes == before.direct_bytes);
        else
          CHECK(after.direct_bytes - before.direct_bytes >= (16u << 20));
        if (name == "I/O memory")
          CHECK(after.in_place_bytes - before.in_place_bytes >= (16u << 20));
      }
    }
  }
}

TEST_CASE("a load and a deep check read uncached data with O_DIRECT and still verify it", "[io]") {
  ScratchDir d;
  const std::string root = d / "root";
  Manifest m = SmallModel("direct", 2, 2);
  ParamEntry big;
  big.name = "big.weight";
  big.shape = {3, 1 << 21};  // 24 MiB a state, 12 MiB a rank
  big.numel = 3 << 21;
  m.params.insert(m.params.begin(), big);
  m.partition = BuildPartition(m.params, 2, 2).value();
  const DirectWriteStats written_before = GetDirectWriteStats();
  {
    DirectIoMode on("on");  // the save too: what the rest reads back is what O_DIRECT wrote
    REQUIRE(SaveWithThreads(root, m).ok());
  }
  const DirectWriteStats written = GetDirectWriteStats();
  if (written.refused == written_before.refused)
    CHECK(written.direct_bytes - written_before.direct_bytes >= 2 * 3 * (8u << 20));
  auto rd = CheckpointReader::Open(root);
  REQUIRE(rd.ok());
  const std::string tag_dir = rd->dir();
  const DatasetRecord* rec = rd->manifest().FindDataset(1, "master");
  REQUIRE(rec != nullptr);
  REQUIRE(rec->bytes >= (12u << 20));

  // The writer starts every large dataset on a 4 KiB boundary (HDF5's own view of the file).
  for (const FileRecord& f : rd->manifest().files) {
    hid_t h = H5Fopen((tag_dir + "/" + f.path).c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
    REQUIRE(h >= 0);
    for (const DatasetRecord& r : f.datasets) {
      if (r.bytes < (1u << 20)) continue;
      hid_t ds = H5Dopen2(h, r.name.c_str(), H5P_DEFAULT);
      REQUIRE(ds >= 0);
      const haddr_t at = H5Dget_offset(ds);
      INFO(f.path << " /" << r.name << " at " << at);
      CHECK(at % 4096 == 0);
      H5Dclose(ds);
    }
    H5Fclose(h);
  }

  DirectIoMode mode("on");
  const DirectReadStats before = GetDirectReadStats();
  std::vector<float> master(rec->bytes / 4);
  REQUIRE(rd->ReadDataset(1, "master", master.data(), rec->bytes).ok());
  // Into page-aligned memory: straight from the disk into it, still verified.
  AlignedBuffer aligned(rec->bytes);
  const uint64_t into_before = GetDirectReadStats().direct_into_caller_bytes;
  REQUIRE(rd->ReadDataset(1, "exp_avg", aligned.as<float>(), rec->bytes).ok());
  const uint64_t into = GetDirectReadStats().direct_into_caller_bytes - into_before;
  if (GetDirectReadStats().refused == before.refused)
    CHECK(into >= rec->bytes - 4096);
  RankBuffers expect;
  FillRank(m, 1, expect);
  CHECK(master == expect.state[0]);
  auto problems = CheckCheckpoint(tag_dir, /*deep=*/true);
  REQUIRE(problems.ok());
  CHECK(problems->empty());
  const DirectReadStats after = GetDirectReadStats();
  if (after.refused == before.refused) {
    // The dataset twice, and both files whole.
    CHECK(after.direct_bytes - before.direct_bytes >= 2 * rec->bytes + 2 * (12u << 20) * 3);
  } else {
    WARN("O_DIRECT refused on " << d.str());
  }

  // One flipped byte in rank 1's state (the values repeat across its three states, shifted:
  // the first copy in the file is damaged): found by the load and by the check.
  const std::string needle(reinterpret_cast<const char*>(master.data() + master.size() / 2), 32);
  const std::string rank1 = tag_dir + "/" + rd->manifest().files[1].path;
  REQUIRE(FlipByteAfter(rank1, needle, 5, 0x10) >= 1);
  auto fresh = CheckpointReader::Open(root);
  REQUIRE(fresh.ok());
  int damaged = 0;
  for (const char* state : {"master", "exp_avg", "exp_avg_sq"}) {
    Status s = fresh->ReadDataset(1, state, master.data(), rec->bytes);
    if (s.ok()) continue;
    ++damaged;
    CHECK(s.code() == StatusCode::kDataLoss);
    CHECK_THAT(s.message(), Catch::Contains(std::string("/") + state));
  }
  CHECK(damaged == 1);
  problems = CheckCheckpoint(tag_dir, /*deep=*/true);
  REQUIRE(problems.ok());
  REQUIRE(problems->size() >= 1);
  CHECK((*problems)[0].file == rd->manifest().files[1].path);
}

TEST_CASE("SharedLibrary opens the first candidate that loads and names what is missing",
          "[unit]") {
  auto none = SharedLibrary::Open({"libckpt-no-such.so.9", "/nonexistent/libx.so"}, "the test's");
  REQUIRE_FALSE(none.ok());
  CHECK(none.status().code() == StatusCode::kFailedPrecondition);
  CHECK(none.status().message().find("libckpt-no-such.so.9 or /nonexistent/libx.so") !=
        std::string::npos);
  CHECK(none.status().message().find("the test's") != std::string::npos);
  // libz: linked by ckpt's own dependencies, so present wherever the tests run.
  auto z = SharedLibrary::Open({"libckpt-no-such.so.9", "libz.so.1"}, "zlib");
  REQUIRE(z.ok());
  CHECK(z->path() == "libz.so.1");
  const char* (*version)() = nullptr;
  REQUIRE(z->Find("zlibVersion", &version).ok());
  CHECK(std::string(version()).size() > 0);
  int (*missing)() = nullptr;
  Status s = z->Find("ckpt_no_such_symbol", &missing);
  CHECK(s.code() == StatusCode::kFailedPrecondition);
  CHECK(s.message().find("ckpt_no_such_symbol") != std::string::npos);
  CHECK(missing == nullptr);
}
