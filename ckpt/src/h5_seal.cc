// The metadata seal and the checks that keep untrusted HDF5 files inside their own bytes
// (h5.h, "Untrusted files"; docs/format.md, "Metadata seal").
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <string_view>
#include <system_error>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "ckpt/h5.h"
#include "ckpt/hash.h"
#include "ckpt/reader.h"
#include "zstd_filter.h"

extern char** environ;

namespace ckpt::h5 {

namespace {

constexpr size_t kPiece = 1u << 20;

// XXH3 of the bytes of [0, size) outside `extents` (sorted, disjoint, inside the file), read
// through `read`.
Result<std::string> HashOutside(const ReadAtFn& read, uint64_t size, const Extents& extents,
                                const std::string& label) {
  Xxh3Stream h;
  std::vector<uint8_t> buf;
  uint64_t pos = 0;
  auto hash_to = [&](uint64_t end) -> Status {
    while (pos < end) {
      const size_t n = static_cast<size_t>(std::min<uint64_t>(end - pos, kPiece));
      buf.resize(n);
      CKPT_RETURN_IF_ERROR(read(pos, n, buf.data()));
      h.Update(buf.data(), n);
      pos += n;
    }
    return Status::Ok();
  };
  for (const auto& [offset, bytes] : extents) {
    if (offset < pos || bytes > size || offset > size - bytes)
      return DataLoss(label + ": data_extents are not sorted, disjoint extents inside the file");
    CKPT_RETURN_IF_ERROR(hash_to(offset));
    pos = offset + bytes;
  }
  CKPT_RETURN_IF_ERROR(hash_to(size));
  return h.HexDigest();
}

Result<std::string> HashOutside(const RandomAccessFile& file, uint64_t size, const Extents& extents,
                                const std::string& label) {
  return HashOutside(
      [&](uint64_t offset, size_t n, void* out) { return file.Read(offset, n, out); }, size,
      extents, label);
}

struct ExtentWalk {
  Extents extents;
  std::string error;
};

herr_t CollectExtents(hid_t obj, const char* name, const H5O_info_t* info, void* data) {
  auto* walk = static_cast<ExtentWalk*>(data);
  if (info->type != H5O_TYPE_DATASET) return 0;
  Handle d = Dataset(H5Dopen2(obj, name, H5P_DEFAULT));
  Handle dcpl = Plist(d.valid() ? H5Dget_create_plist(d.get()) : H5I_INVALID_HID);
  if (!dcpl.valid()) {
    walk->error = "dataset /" + Shown(name) + ": " + ErrorText();
    return -1;
  }
  const H5D_layout_t layout = H5Pget_layout(dcpl.get());
  if (layout == H5D_CONTIGUOUS) {
    const haddr_t addr = H5Dget_offset(d.get());
    const hsize_t size = H5Dget_storage_size(d.get());
    if (addr != HADDR_UNDEF && size > 0) walk->extents.emplace_back(addr, size);
  } else if (layout == H5D_CHUNKED) {
    hsize_t n = 0;
    Handle space = Space(H5Dget_space(d.get()));  // HDF5 1.10 takes no H5S_ALL here
    if (H5Dget_num_chunks(d.get(), space.get(), &n) < 0) {
      walk->error = "dataset /" + Shown(name) + ": " + ErrorText();
      return -1;
    }
    for (hsize_t i = 0; i < n; ++i) {
      hsize_t offset[H5S_MAX_RANK] = {0};
      unsigned mask = 0;
      haddr_t addr = HADDR_UNDEF;
      hsize_t size = 0;
      if (H5Dget_chunk_info(d.get(), space.get(), i, offset, &mask, &addr, &size) < 0) {
        walk->error = "dataset /" + Shown(name) + ": " + ErrorText();
        return -1;
      }
      if (addr != HADDR_UNDEF && size > 0) walk->extents.emplace_back(addr, size);
    }
  }
  H5Eclear2(H5E_DEFAULT);
  return 0;
}

herr_t CheckLink(hid_t, const char* name, const H5L_info_t* info, void* data) {
  if (info->type == H5L_TYPE_HARD) return 0;
  auto* error = static_cast<std::string*>(data);
  const char* kind = info->type == H5L_TYPE_SOFT       ? "a soft link"
                     : info->type == H5L_TYPE_EXTERNAL ? "an external link"
                                                       : "a user-defined link";
  *error = "/" + Shown(name) + " is " + kind + "; a ckpt file holds hard links only";
  return 1;  // stop: refused
}

struct StorageWalk {
  std::string label;
  Status status;
};

herr_t CheckDatasetStorage(hid_t obj, const char* name, const H5O_info_t* info, void* data) {
  if (info->type != H5O_TYPE_DATASET) return 0;
  auto* walk = static_cast<StorageWalk*>(data);
  const Handle dapl = NoExternalLinks();
  Handle d = Dataset(H5Dopen2(obj, name, dapl.get()));
  const std::string where = walk->label + ": dataset /" + Shown(name);  // any name a file holds
  walk->status = d.valid() ? CheckStorage(d.get(), where) : DataLoss(where + ": " + ErrorText());
  return walk->status.ok() ? 0 : 1;
}

herr_t DenyExternalLink(const char*, const char*, const char*, const char*, unsigned*, hid_t,
                        void*) {
  return -1;
}

// ---- The probe (reader.h, SetHdf5Probe) ----------------------------------------------------

constexpr const char* kProbeVerb = "__h5-probe";
constexpr std::string_view kProbeDone = "walked\n";  // what the probe writes once it has

using FileId = std::tuple<dev_t, ino_t, off_t, int64_t>;  // device, inode, size, mtime (ns)

struct ProbeConfig {
  std::mutex mu;
  std::condition_variable resolved;  // a ProbeBatch resolved one of its files
  std::string program;
  double seconds = 300;
  std::set<FileId> walked;                // files the probe walked
  std::map<FileId, std::string> refused;  // files it hung on: the error after the label
  std::map<FileId, int> pending;          // files ProbeBatches have yet to resolve (how many)
};

ProbeConfig& Probe() {
  static ProbeConfig* config = new ProbeConfig;  // never destroyed: used until exit
  return *config;
}

// The probe program set and its time limit, read under the lock (empty: no probe).
std::pair<std::string, double> ProbeProgram() {
  ProbeConfig& config = Probe();
  std::lock_guard<std::mutex> lock(config.mu);
  return {config.program, config.seconds};
}

std::optional<FileId> IdOf(const std::string& path) {
  struct stat st {};
  if (stat(path.c_str(), &st) != 0) return std::nullopt;
  return FileId{st.st_dev, st.st_ino, st.st_size,
                static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec};
}

// The probe process's walk over one object's attributes: each opened, its type and space
// taken, and read (strings as the readers read them; numbers up to 1 MiB).
herr_t ProbeAttribute(hid_t loc, const char* name, const H5A_info_t*, void*) {
  Handle attr = Attr(H5Aopen(loc, name, H5P_DEFAULT));
  if (!attr.valid()) return 0;
  Handle type = Type(H5Aget_type(attr.get()));
  Handle space = Space(H5Aget_space(attr.get()));
  const H5T_class_t cls = type.valid() ? H5Tget_class(type.get()) : H5T_NO_CLASS;
  const hssize_t points = space.valid() ? H5Sget_simple_extent_npoints(space.get()) : -1;
  if (cls == H5T_STRING) {
    (void)ReadStringAttr(loc, name);
  } else if ((cls == H5T_INTEGER || cls == H5T_FLOAT) && points > 0) {
    const size_t elem = H5Tget_size(type.get());
    if (elem > 0 && elem <= 16 && static_cast<uint64_t>(points) <= (1u << 20) / elem) {
      std::vector<uint8_t> buf(static_cast<size_t>(points) * elem);
      H5Aread(attr.get(), type.get(), buf.data());
    }
  }
  H5Eclear2(H5E_DEFAULT);
  return 0;
}

// Whether a rank file's reader reads this dataset's data outside libhdf5 (RankFile's direct
// reads: one contiguous range, no filters, a type the format writes), so that a read through
// HDF5 in the probe walks nothing the reader asks libhdf5 to walk. (Such a dataset goes
// through libhdf5 only with a manifest that names another dtype, and then converts between two
// of the format's types; a universal checkpoint's reader reads every dataset through libhdf5.)
bool ReadOutsideLibhdf5(hid_t dset, hid_t type) {
  Handle dcpl = Plist(H5Dget_create_plist(dset));
  if (!dcpl.valid() || H5Pget_layout(dcpl.get()) != H5D_CONTIGUOUS ||
      H5Pget_nfilters(dcpl.get()) != 0)
    return false;
  for (DType t : {DType::kF32, DType::kF64, DType::kU16, DType::kI64, DType::kI32, DType::kU8})
    if (H5Tequal(type, FileType(t)) > 0) return true;
  return false;
}

// The probe process's walk over one object: its attributes; for a dataset, what the readers
// take from it (CheckStorage: layout, filters, space, type, chunk count; every chunk's place),
// and the data of a numeric dataset of at most 4 MiB read through HDF5, unless the file says
// it is a rank file (`data`: a bool) and its reader reads that dataset outside libhdf5
// (reading it here read every small rank file's data twice from a cold disk: 2026-12-07,
// 23:55). Stops where OpenSealed would refuse the file (it then opens no further object);
// anything else goes on to the next.
herr_t ProbeObject(hid_t obj, const char* name, const H5O_info_t* info, void* data) {
  const bool rank_file = *static_cast<const bool*>(data);
  const Handle dapl = NoExternalLinks();
  {
    Handle o(H5Oopen(obj, name, dapl.get()), H5Oclose);
    if (o.valid())
      H5Aiterate2(o.get(), H5_INDEX_NAME, H5_ITER_INC, nullptr, ProbeAttribute, nullptr);
  }
  if (info->type != H5O_TYPE_DATASET) return 0;
  Handle d = Dataset(H5Dopen2(obj, name, dapl.get()));
  if (!d.valid() || !CheckStorage(d.get(), name).ok()) return 1;  // OpenSealed stops here too
  ExtentWalk extents;
  if (CollectExtents(obj, name, info, &extents) < 0) {  // the objects after it are still opened
    H5Eclear2(H5E_DEFAULT);
    return 0;
  }
  (void)H5Dget_offset(d.get());
  Handle type = Type(H5Dget_type(d.get()));
  Handle space = Space(H5Dget_space(d.get()));
  const H5T_class_t cls = type.valid() ? H5Tget_class(type.get()) : H5T_NO_CLASS;
  const hssize_t points = space.valid() ? H5Sget_simple_extent_npoints(space.get()) : -1;
  const size_t elem = type.valid() ? H5Tget_size(type.get()) : 0;
  if ((cls == H5T_INTEGER || cls == H5T_FLOAT) && points > 0 && elem > 0 && elem <= 16 &&
      static_cast<uint64_t>(points) <= (4u << 20) / elem &&
      !(rank_file && ReadOutsideLibhdf5(d.get(), type.get()))) {
    std::vector<uint8_t> buf(static_cast<size_t>(points) * elem);
    // As the readers read: a zstd chunk decompresses to exactly a chunk's bytes or fails
    // (without it libhdf5 read past a short chunk here: fuzz_resealed, 2026-12-07). A chunk
    // size that cannot be had skips the read (the readers refuse the dataset) and the walk
    // goes on: the readers would still open the objects after it.
    if (const size_t chunk = ChunkBytes(d.get()); chunk > 0) {
      ExpectChunkBytes expect(chunk);
      H5Dread(d.get(), type.get(), H5S_ALL, H5S_ALL, H5P_DEFAULT, buf.data());
    }
  }
  H5Eclear2(H5E_DEFAULT);
  return 0;
}

// What `PROGRAM __h5-probe FILE` does: opens FILE as OpenSealed does and walks everything the
// readers may ask libhdf5 about; ServeHdf5Probe then says kProbeDone whether or not libhdf5
// reported an error (the reader reports that itself): only a crash or a hang is the probe's
// finding.
void ProbeWalk(const char* path) {
  Init();
  Handle file = File(H5Fopen(path, H5F_ACC_RDONLY, H5P_DEFAULT));
  if (!file.valid()) return;
  std::string refused;
  if (H5Lvisit(file.get(), H5_INDEX_NAME, H5_ITER_INC, CheckLink, &refused) < 0 || !refused.empty())
    return;
  // A rank file opened as a universal checkpoint's file (or the other way round) is refused
  // by its reader before any data is read.
  const Result<std::string> format = ReadStringAttr(file.get(), "format");
  bool rank_file = format.ok() && *format == kFormatName;
  H5Eclear2(H5E_DEFAULT);
  H5Ovisit2(file.get(), H5_INDEX_NAME, H5_ITER_INC, ProbeObject, &rank_file, H5O_INFO_BASIC);
}

// How `PROGRAM __h5-probe FILE...` ended.
struct ProbeRun {
  size_t walked = 0;        // files it said it walked, from the first, in order
  bool timed_out = false;   // still walking one file `seconds` after the last word (killed)
  std::string spawn_error;  // it could not be started (the reason)
  bool reaped = false;      // how it ended, when waitpid could tell (SIGCHLD not ignored)
  int status = 0;
};

// Runs the probe on `files`, in that order, one process for all of them; calls on_walked(i)
// as soon as the probe says it walked files[i]. Each file gets `seconds` from the word about
// the file before it (from the start for the first). `cancel`, when given, is where the
// caller may kill the probe (ProbeBatch's destructor): its pid while it runs, else -1.
ProbeRun RunProbe(const std::string& program, double seconds, const std::vector<std::string>& files,
                  const std::function<void(size_t)>& on_walked,
                  std::pair<std::mutex*, pid_t*> cancel = {nullptr, nullptr}) {
  ProbeRun run;
  // The probe says it walked each file by writing kProbeDone to its stdout, a pipe to us: its
  // end before it said so is a crash, however this process's SIGCHLD is set (ignored, a child
  // is reaped before waitpid can tell how it ended).
  int out[2];
  if (pipe2(out, O_CLOEXEC) != 0) {
    run.spawn_error = std::string("a pipe: ") + std::strerror(errno);
    return run;
  }
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_adddup2(&actions, out[1], STDOUT_FILENO);
  posix_spawn_file_actions_addopen(&actions, STDERR_FILENO, "/dev/null", O_WRONLY, 0);
  std::vector<std::string> args = {program, kProbeVerb};
  args.insert(args.end(), files.begin(), files.end());
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t pid = -1;
  int rc;
  {
    std::unique_lock<std::mutex> lock;
    if (cancel.first) lock = std::unique_lock<std::mutex>(*cancel.first);
    rc = posix_spawn(&pid, program.c_str(), &actions, nullptr, argv.data(), environ);
    if (rc == 0 && cancel.second) *cancel.second = pid;
  }
  posix_spawn_file_actions_destroy(&actions);
  close(out[1]);
  if (rc != 0) {
    close(out[0]);
    run.spawn_error = std::strerror(rc);
    return run;
  }
  auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  std::string said;  // what the probe wrote since its last whole word
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) {
      run.timed_out = true;
      break;
    }
    pollfd p{out[0], POLLIN, 0};
    const int ready = poll(&p, 1, static_cast<int>(std::min<int64_t>(left.count(), 60000)));
    if (ready < 0 && errno == EINTR) continue;
    if (ready <= 0) continue;  // the deadline is checked above
    char buf[256];
    const ssize_t n = read(out[0], buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;  // the probe ended
    said.append(buf, static_cast<size_t>(n));
    while (said.size() >= kProbeDone.size() && run.walked < files.size() &&
           said.compare(0, kProbeDone.size(), kProbeDone) == 0) {
      said.erase(0, kProbeDone.size());
      on_walked(run.walked++);
      deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
    }
    if (said.size() >= kProbeDone.size()) break;  // anything else: not a probe's word
  }
  close(out[0]);
  {
    std::unique_lock<std::mutex> lock;
    if (cancel.first) lock = std::unique_lock<std::mutex>(*cancel.first);
    if (run.timed_out) kill(pid, SIGKILL);
    if (cancel.second) *cancel.second = -1;
  }
  pid_t reaped;
  while ((reaped = waitpid(pid, &run.status, 0)) < 0 && errno == EINTR) {
  }
  run.reaped = reaped == pid;
  return run;
}

// What follows the label in the refusal of the file a probe was walking when it ended
// (run.walked < the files it was given).
std::string RefusalTail(const ProbeRun& run, const std::string& program, double seconds) {
  if (run.timed_out)
    return ": libhdf5 was still reading its HDF5 structure after " +
           std::to_string(static_cast<int64_t>(seconds)) +
           " s (in a probe process): a damaged or hostile file; not opened";
  if (run.reaped && WIFEXITED(run.status))  // not a crash: the probe itself is wrong
    return ": the HDF5 probe '" + Shown(program) + "' exited " +
           std::to_string(WEXITSTATUS(run.status)) +
           " without finishing its walk of the file (a ckpt executable of another version, or "
           "a damaged or hostile file); not opened";
  const std::string how = run.reaped && WIFSIGNALED(run.status)
                              ? std::string("crashed (") + strsignal(WTERMSIG(run.status)) + ")"
                              : std::string("ended before it finished");
  return ": libhdf5 " + how +
         " reading its HDF5 structure (in a probe process): a damaged or hostile file; not opened";
}

// A refusal that is the file's own (a crash or a hang), not the probe program's.
bool FileRefused(const ProbeRun& run) {
  return run.timed_out || !(run.reaped && WIFEXITED(run.status));
}

}  // namespace

Status ProbeStructure(const std::string& path, const std::string& label) {
  ProbeConfig& config = Probe();
  const auto [program, seconds] = ProbeProgram();
  if (program.empty()) return Status::Ok();  // no probe: not even a stat
  const std::optional<FileId> id = IdOf(path);
  if (id) {
    std::unique_lock<std::mutex> lock(config.mu);
    // A ProbeBatch walking it: its word (a file the batch cannot vouch for is probed here).
    config.resolved.wait(lock, [&] { return !config.pending.count(*id); });
    if (config.walked.count(*id)) return Status::Ok();
    if (auto it = config.refused.find(*id); it != config.refused.end())
      return DataLoss(label + it->second);
  }
  const ProbeRun run = RunProbe(program, seconds, {path}, [](size_t) {});
  if (!run.spawn_error.empty())
    return IOError(label + ": cannot start the HDF5 probe '" + Shown(program) + "' (" +
                   run.spawn_error + "); not opened");
  std::lock_guard<std::mutex> lock(config.mu);
  if (run.walked == 1) {
    if (id) config.walked.insert(*id);
    return Status::Ok();
  }
  const std::string tail = RefusalTail(run, program, seconds);
  if (id && run.timed_out) config.refused.emplace(*id, tail);  // not waited for twice
  return DataLoss(label + tail);
}

struct ProbeBatch::Share {
  std::vector<std::string> paths;
  std::vector<FileId> ids;
  pid_t running = -1;  // the probe walking them, under ProbeBatch::mu_
};

ProbeBatch::ProbeBatch(const std::vector<std::string>& paths, int processes) {
  ProbeConfig& config = Probe();
  const auto [program, seconds] = ProbeProgram();
  if (program.empty() || paths.size() < 2) return;  // one file: ProbeStructure as it comes
  if (processes <= 0)  // one a core, up to 8: each holds a ckpt executable's memory
    processes = static_cast<int>(std::min(8u, std::max(1u, std::thread::hardware_concurrency())));
  const size_t n = std::min(paths.size(), static_cast<size_t>(processes));
  shares_.resize(n);
  std::vector<std::optional<FileId>> ids;
  for (const std::string& path : paths) ids.push_back(IdOf(path));
  std::vector<FileId> registered;
  registered.reserve(paths.size());
  {
    // File i goes to share i % n: the shares walk the files in the order a caller's threads
    // reach them. Files already walked or unknown (no stat: their open fails anyway) are left
    // to ProbeStructure. Out of memory half way, the files registered are released again (a
    // ProbeStructure would otherwise wait for them forever).
    std::lock_guard<std::mutex> lock(config.mu);
    try {
      for (size_t i = 0, k = 0; i < paths.size(); ++i) {
        const std::optional<FileId>& id = ids[i];
        if (!id || config.walked.count(*id) || config.refused.count(*id)) continue;
        Share& share = shares_[k++ % n];
        share.paths.push_back(paths[i]);
        share.ids.push_back(*id);
        ++config.pending[*id];
        registered.push_back(*id);  // reserved: does not throw
      }
    } catch (...) {
      for (const FileId& id : registered)
        if (auto it = config.pending.find(id); --it->second == 0) config.pending.erase(it);
      throw;
    }
  }
  for (Share& share : shares_) {
    if (share.paths.empty()) continue;
    try {
      threads_.emplace_back(
          [this, &share, program = program, seconds = seconds] { Walk(share, program, seconds); });
    } catch (const std::system_error&) {
      Resolve(share, 0, share.paths.size(), nullptr);  // no thread: ProbeStructure probes them
    }
  }
}

ProbeBatch::~ProbeBatch() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
    for (Share& share : shares_)
      if (share.running > 0) kill(share.running, SIGKILL);
  }
  for (auto& t : threads_) t.join();
}

void ProbeBatch::Resolve(Share& share, size_t from, size_t to, const std::string* refusal,
                         bool walked) {
  ProbeConfig& config = Probe();
  std::lock_guard<std::mutex> lock(config.mu);
  for (size_t i = from; i < to; ++i) {
    const FileId& id = share.ids[i];
    if (walked) config.walked.insert(id);
    if (refusal) config.refused.emplace(id, *refusal);
    if (auto it = config.pending.find(id); it != config.pending.end() && --it->second == 0)
      config.pending.erase(it);
  }
  config.resolved.notify_all();
}

void ProbeBatch::Walk(Share& share, const std::string& program, double seconds) {
  const size_t n = share.paths.size();
  size_t k = 0;  // the files before k are resolved
  auto stopped = [&] {
    std::lock_guard<std::mutex> lock(mu_);
    return stop_;
  };
  // At most this many files a process: a command line stays far below the kernel's limits.
  constexpr size_t kFilesPerProcess = 256;
  while (k < n && !stopped()) {
    const auto from = share.paths.begin() + static_cast<ptrdiff_t>(k);
    const std::vector<std::string> next(
        from, from + static_cast<ptrdiff_t>(std::min(n - k, kFilesPerProcess)));
    const ProbeRun run = RunProbe(
        program, seconds, next, [&](size_t i) { Resolve(share, k + i, k + i + 1, nullptr, true); },
        {&mu_, &share.running});
    k += run.walked;
    if (run.walked == next.size()) continue;  // all of them: the next files, if any
    if (stopped()) break;
    // It ended before file k. A probe that could not start, or that exited on its own (not
    // a crash: a ckpt of another version walks one file only), leaves the rest to
    // ProbeStructure, one probe each.
    if (!run.spawn_error.empty() || !FileRefused(run)) break;
    if (run.timed_out) {
      // A hang is file k's (each file has its own `seconds`): refused, not waited for twice.
      const std::string tail = RefusalTail(run, program, seconds);
      Resolve(share, k, k + 1, &tail);
    } else {
      // After a crash file k is ProbeStructure's, probed alone as before batches: refused
      // for what libhdf5 does with it alone, not after other files, and in its own words.
      Resolve(share, k, k + 1, nullptr);
    }
    ++k;
  }
  Resolve(share, k, n, nullptr);  // what is left is ProbeStructure's to probe
}

void ForgetProbedFiles() {
  ProbeConfig& config = Probe();
  std::lock_guard<std::mutex> lock(config.mu);
  config.walked.clear();
  config.refused.clear();
}

Result<Extents> DataExtents(hid_t file, const std::string& label) {
  ExtentWalk walk;
  if (H5Ovisit2(file, H5_INDEX_NAME, H5_ITER_INC, CollectExtents, &walk, H5O_INFO_BASIC) < 0)
    return IOError(label + ": " + (walk.error.empty() ? ErrorText() : walk.error));
  std::sort(walk.extents.begin(), walk.extents.end());
  Extents merged;
  for (const auto& [offset, size] : walk.extents) {
    if (!merged.empty() && offset <= merged.back().first + merged.back().second) {
      auto& last = merged.back();
      last.second = std::max(last.first + last.second, offset + size) - last.first;
    } else {
      merged.emplace_back(offset, size);
    }
  }
  return merged;
}

Result<std::string> MetadataDigest(const ReadAtFn& read, uint64_t bytes, const Extents& extents,
                                   const std::string& label) {
  return HashOutside(read, bytes, extents, label);
}

Status SealFile(Env* env, const std::string& path, uint64_t bytes, Extents* extents,
                std::string* xxh3) {
  Init();
  {
    Handle file = File(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT));
    if (!file.valid()) return IOError("seal " + path + ": " + ErrorText());
    CKPT_ASSIGN_OR_RETURN(*extents, DataExtents(file.get(), path), "seal");
    CKPT_RETURN_IF_ERROR(file.Close("close " + path), "seal");
  }
  CKPT_ASSIGN_OR_RETURN(std::unique_ptr<RandomAccessFile> file, env->NewRandomAccessFile(path),
                        "seal");
  CKPT_ASSIGN_OR_RETURN(*xxh3, HashOutside(*file, bytes, *extents, path), "seal");
  return Status::Ok();
}

Result<Handle> OpenVerified(const RandomAccessFile& file, const std::string& path,
                            const std::string& label, uint64_t bytes, const Extents& extents,
                            const std::string& metadata_xxh3, const std::string& file_xxh3) {
  CKPT_RETURN_IF_ERROR(VerifySeal(file, label, bytes, extents, metadata_xxh3, file_xxh3), "");
  return OpenSealed(path, label);
}

Status VerifySeal(const RandomAccessFile& file, const std::string& label, uint64_t bytes,
                  const Extents& extents, const std::string& metadata_xxh3,
                  const std::string& file_xxh3) {
  if (file.size() != bytes)
    return DataLoss(label + ": size " + std::to_string(file.size()) +
                    " bytes, manifest records " + std::to_string(bytes) +
                    " (truncated or replaced)");
  if (!metadata_xxh3.empty()) {
    CKPT_ASSIGN_OR_RETURN(std::string got, HashOutside(file, bytes, extents, label));
    if (got != metadata_xxh3)
      return DataLoss(label + ": HDF5 metadata checksum mismatch (manifest " + metadata_xxh3 +
                      ", file " + got + "): the file's structure is corrupt; not opened");
  } else if (!file_xxh3.empty()) {
    CKPT_ASSIGN_OR_RETURN(std::string got, HashOutside(file, bytes, {}, label));
    if (got != file_xxh3)
      return DataLoss(label + ": file checksum mismatch (manifest " + file_xxh3 + ", file " +
                      got + "); not opened");
  }
  return Status::Ok();
}

Result<Handle> OpenSealed(const std::string& path, const std::string& label) {
  CKPT_RETURN_IF_ERROR(ProbeStructure(path, label), "");
  Init();
  hid_t fid = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  if (fid < 0) return DataLoss(label + ": cannot open as HDF5 (" + ErrorText() + ")");
  Handle h5file = File(fid);
  std::string refused;
  if (H5Lvisit(fid, H5_INDEX_NAME, H5_ITER_INC, CheckLink, &refused) < 0 || !refused.empty())
    return DataLoss(label + ": " + (refused.empty() ? ErrorText() : refused));
  // Every dataset's storage, whether or not this reader will read it.
  StorageWalk walk{label, Status::Ok()};
  if (H5Ovisit2(fid, H5_INDEX_NAME, H5_ITER_INC, CheckDatasetStorage, &walk, H5O_INFO_BASIC) <
          0 &&
      walk.status.ok())
    return DataLoss(label + ": " + ErrorText());
  CKPT_RETURN_IF_ERROR(walk.status, "");
  return h5file;
}

Status CheckStorage(hid_t dset, const std::string& where) {
  Handle dcpl = Plist(H5Dget_create_plist(dset));
  if (!dcpl.valid()) return DataLoss(where + ": " + ErrorText());
  const H5D_layout_t layout = H5Pget_layout(dcpl.get());
  if (layout != H5D_CONTIGUOUS && layout != H5D_CHUNKED) {
    const char* name = layout == H5D_VIRTUAL ? "virtual" : layout == H5D_COMPACT ? "compact"
                                                                                   : "unknown";
    return DataLoss(where + ": " + name + " layout, which the format does not define; refused");
  }
  const int external = H5Pget_external_count(dcpl.get());
  if (external != 0)
    return DataLoss(where + ": stored in " +
                    (external > 0 ? std::to_string(external) : std::string("unreadable")) +
                    " external file(s), outside the checkpoint; refused");
  const int nfilters = H5Pget_nfilters(dcpl.get());
  if (nfilters < 0) return DataLoss(where + ": unreadable filter pipeline");
  bool zstd = false;
  for (int i = 0; i < nfilters; ++i) {
    unsigned flags = 0;
    size_t nelmts = 0;
    const H5Z_filter_t id =
        H5Pget_filter2(dcpl.get(), static_cast<unsigned>(i), &flags, &nelmts, nullptr, 0,
                       nullptr, nullptr);
    if (id != H5Z_FILTER_SHUFFLE && id != kZstdFilterId)
      return DataLoss(where + ": filter " + std::to_string(id) +
                      ", which the format does not define; refused");
    zstd = zstd || id == kZstdFilterId;
  }
  // Shuffle alone is not a ckpt pipeline, and would hand HDF5 a chunk of whatever length the
  // file claims (zstd's output is held to the chunk's size: ExpectChunkBytes).
  if (nfilters > 0 && !zstd)
    return DataLoss(where + ": shuffle without zstd, which the format does not define; refused");
  // Every element stored: ckpt writes every chunk of a chunked dataset and allocates a
  // contiguous one whole. HDF5 reads an unwritten chunk or an unallocated dataset as the fill
  // value, so without this a file of a few KB, its checksums computed over zeros, could claim a
  // dataset of any size, and export would write all of it.
  Handle space = Space(H5Dget_space(dset));
  const hssize_t points = space.valid() ? H5Sget_simple_extent_npoints(space.get()) : -1;
  if (points < 0) return DataLoss(where + ": unreadable dataspace");
  if (points > 0 && layout == H5D_CONTIGUOUS) {
    Handle type = Type(H5Dget_type(dset));
    const size_t elem = type.valid() ? H5Tget_size(type.get()) : 0;
    const hsize_t stored = H5Dget_storage_size(dset);
    if (elem == 0 || stored / elem != static_cast<hsize_t>(points) || stored % elem != 0)
      return DataLoss(where + ": " + std::to_string(stored) + " bytes stored for " +
                      std::to_string(points) + " elements of " + std::to_string(elem) +
                      " bytes; a ckpt file stores every element");
  } else if (points > 0) {
    const int rank = H5Sget_simple_extent_ndims(space.get());
    hsize_t dims[H5S_MAX_RANK] = {0}, chunk[H5S_MAX_RANK] = {0};
    if (rank < 1 || rank > H5S_MAX_RANK ||
        H5Sget_simple_extent_dims(space.get(), dims, nullptr) != rank ||
        H5Pget_chunk(dcpl.get(), rank, chunk) != rank)
      return DataLoss(where + ": unreadable chunk layout");
    hsize_t expect = 1;
    for (int k = 0; k < rank; ++k) {
      if (chunk[k] == 0) return DataLoss(where + ": a chunk dimension of 0");
      expect *= (dims[k] + chunk[k] - 1) / chunk[k];  // at most the element count: no overflow
    }
    hsize_t stored = 0;
    if (H5Dget_num_chunks(dset, space.get(), &stored) < 0)
      return DataLoss(where + ": unreadable chunk index (" + ErrorText() + ")");
    if (stored != expect)
      return DataLoss(where + ": " + std::to_string(stored) + " of its " + std::to_string(expect) +
                      " chunks stored; a ckpt file stores every chunk");
  }
  H5Eclear2(H5E_DEFAULT);
  return Status::Ok();
}

Handle NoExternalLinks(hid_t plist_class) {
  Handle p = Plist(H5Pcreate(plist_class));
  H5Pset_elink_cb(p.get(), DenyExternalLink, nullptr);
  return p;
}

}  // namespace ckpt::h5

namespace ckpt {

void SetHdf5Probe(std::string program, double seconds) {
  h5::ProbeConfig& config = h5::Probe();
  std::lock_guard<std::mutex> lock(config.mu);
  config.program = std::move(program);
  config.seconds = seconds;
}

void ServeHdf5Probe(int argc, char** argv) {
  if (argc >= 3 && std::strcmp(argv[1], h5::kProbeVerb) == 0) {
    // Each file in turn, the word after each (a ProbeBatch hands one process several).
    const std::string_view done = h5::kProbeDone;
    for (int i = 2; i < argc; ++i) {
      h5::ProbeWalk(argv[i]);
      if (write(STDOUT_FILENO, done.data(), done.size()) != static_cast<ssize_t>(done.size()))
        std::_Exit(1);
    }
    // _Exit: no exit handlers (HDF5's, LeakSanitizer's), whose findings are not the file's.
    std::_Exit(0);
  }
  // This executable, even once its file is replaced or deleted (a rebuild during a run): the
  // spawned child's /proc/self/exe is still ours when it calls execve.
  if (access("/proc/self/exe", X_OK) == 0) SetHdf5Probe("/proc/self/exe");
}

}  // namespace ckpt
