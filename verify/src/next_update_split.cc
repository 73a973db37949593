// `ckpt next-update` over several processes, one per GPU (or per CPU process with --procs):
//   1. the launching process splits the trainable elements, concatenated in table order, into
//      one contiguous range per worker (SplitElements), creates a scratch directory, writes the
//      job there (job.json: tag directory, gradient file, device, world size, outputs) and, for
//      CUDA, an NCCL unique id (the out-of-band channel), and starts the worker program
//      (next_update_worker DIR RANK, a main over RunNextUpdateWorker) once per worker;
//   2. each worker verifies its share of the optimizer-state datasets (dataset i when i mod
//      world = rank), reads only its elements of w, m, v (ReadParamRange), runs the pass on its
//      device (GPU `rank`), writes its results as raw fp32 files (one per output array, its
//      pieces in order) and its per-piece statistics, all-reduces its share of the overall
//      statistics with NCCL (CUDA), and publishes rank<r>.json last (write, then rename);
//   3. the launcher waits for every worker (a failed one ends the others), merges the
//      per-piece statistics per tensor in order, takes the overall statistics from the NCCL
//      all-reduce (CUDA) or merges the workers' shares in rank order (CPU), and streams the
//      result files in rank order into the digests and --out files, exactly as the
//      single-process loop does.
// Outputs and digests are therefore bitwise those of one process; max_abs and the counts are
// exact; sums of squares are added in another order (per piece, then per rank) and may differ
// in the last bits. Workers are processes, not threads or forks: each owns one GPU, and a
// process that has initialised CUDA (the launcher counts the GPUs) cannot fork a CUDA user.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <sstream>

#include "ckpt/manifest.h"
#include "next_update_split.h"
#include "temp_dir.h"
#include "verify/nccl_combine.h"
#include "verify/trainlog.h"

namespace ckpt::verify {

namespace {

// The five output arrays a worker writes, in PassOutputs order.
constexpr const char* kOutputKinds[5] = {"w_full", "exp_avg", "exp_avg_sq", "weights_only",
                                         "moments_dropped"};

std::string RankFile(const std::string& dir, int rank, const std::string& what) {
  return dir + "/rank" + std::to_string(rank) + "." + what;
}

nlohmann::json PathStatsJson(const PathStats& p) {
  return {{"max_abs", p.max_abs},
          {"sum_sq_diff", p.sum_sq_diff},
          {"n_differ", p.n_differ},
          {"sum_sq_update", p.sum_sq_update}};
}

// nlohmann writes doubles with round-trip precision, so statistics survive the file exactly.
nlohmann::json PassStatsJson(const PassStats& s) {
  return {{"n", s.n},
          {"sum_sq_full", s.sum_sq_full},
          {"sum_sq_update_full", s.sum_sq_update_full},
          {"weights_only", PathStatsJson(s.weights_only)},
          {"moments_dropped", PathStatsJson(s.moments_dropped)}};
}

PathStats PathStatsFromJson(const nlohmann::json& j) {
  PathStats p;
  p.max_abs = j.at("max_abs").get<double>();
  p.sum_sq_diff = j.at("sum_sq_diff").get<double>();
  p.n_differ = j.at("n_differ").get<uint64_t>();
  p.sum_sq_update = j.at("sum_sq_update").get<double>();
  return p;
}

PassStats PassStatsFromJson(const nlohmann::json& j) {
  PassStats s;
  s.n = j.at("n").get<uint64_t>();
  s.sum_sq_full = j.at("sum_sq_full").get<double>();
  s.sum_sq_update_full = j.at("sum_sq_update_full").get<double>();
  s.weights_only = PathStatsFromJson(j.at("weights_only"));
  s.moments_dropped = PathStatsFromJson(j.at("moments_dropped"));
  return s;
}

// Writes `text` to path through a temporary name, so a reader never sees half a file.
Status PublishText(const std::string& path, const std::string& text) {
  return WriteFileAtomic(Env::Default(), path, text);
}

// An append-only raw file of floats (Env::NewWritableFile); Close reports a failed write.
class RawWriter {
 public:
  Status Open(const std::string& path) {
    CKPT_ASSIGN_OR_RETURN(file_, Env::Default()->NewWritableFile(path));
    return Status::Ok();
  }
  Status Append(const float* data, size_t n) {
    return file_->Append(std::string_view(reinterpret_cast<const char*>(data), n * sizeof(float)));
  }
  Status Close() { return file_->Close(); }

 private:
  std::unique_ptr<WritableFile> file_;
};

// Reads the concatenation of the workers' files of one output kind, in rank order.
class RankConcatReader {
 public:
  RankConcatReader(std::string dir, std::string kind, int world)
      : dir_(std::move(dir)), kind_(std::move(kind)), world_(world) {}
  // Exactly `n` floats into out; DataLoss when the workers' files hold fewer.
  Status Read(float* out, size_t n) {
    while (n > 0) {
      if (!file_ || offset_ >= file_->size()) {
        if (next_rank_ >= world_) {
          return DataLoss("worker result files " + dir_ + "/rank*." + kind_ + " end early");
        }
        CKPT_ASSIGN_OR_RETURN(
            file_, Env::Default()->NewRandomAccessFile(RankFile(dir_, next_rank_++, kind_)));
        offset_ = 0;
        if (file_->size() % sizeof(float) != 0) {
          return DataLoss("worker result file " + kind_ + " has a partial element");
        }
        continue;
      }
      const size_t take = std::min<size_t>(n, (file_->size() - offset_) / sizeof(float));
      CKPT_RETURN_IF_ERROR(file_->Read(offset_, take * sizeof(float), out));
      offset_ += take * sizeof(float);
      out += take;
      n -= take;
    }
    return Status::Ok();
  }

 private:
  std::string dir_, kind_;
  int world_;
  int next_rank_ = 0;
  std::unique_ptr<RandomAccessFile> file_;  // the current rank's file
  uint64_t offset_ = 0;                     // read up to here
};

// The worker program: next_update_worker in the directory engine_min is looked for
// ($CKPT_BIN_DIR, or next to this program).
Result<std::string> WorkerProgram(const std::string& bin_dir) {
  const std::string exe = EngineBinDir(bin_dir) + "/" + kNextUpdateWorkerProgram;
  if (!Env::Default()->Exists(exe)) {
    return NotFound(std::string("a split next-update runs ") + kNextUpdateWorkerProgram +
                    " once per process; not found at " + exe + " (set CKPT_BIN_DIR)");
  }
  return exe;
}

// What every worker of one split run does; written by the launcher as DIR/job.json.
struct WorkerJob {
  std::string tag_dir;
  std::string grad_file;
  Device device = Device::kCpu;
  int world = 0;
  bool all_outputs = false;  // also keep paths (b) and (c)'s weights (--out)
};

nlohmann::json WorkerJobJson(const WorkerJob& j) {
  return {{"tag_dir", j.tag_dir},
          {"grad_file", j.grad_file},
          {"device", std::string(DeviceName(j.device))},
          {"world", j.world},
          {"all_outputs", j.all_outputs}};
}

Result<WorkerJob> ReadWorkerJob(const std::string& dir) {
  const std::string path = dir + "/job.json";
  auto text = Env::Default()->ReadFileToString(path);
  if (!text.ok()) {
    if (text.status().code() == StatusCode::kNotFound)
      return NotFound("no split next-update job at " + path);
    return text.status();
  }
  const nlohmann::json j = nlohmann::json::parse(*text, nullptr, false);
  WorkerJob job;
  try {
    job.tag_dir = j.at("tag_dir").get<std::string>();
    job.grad_file = j.at("grad_file").get<std::string>();
    CKPT_ASSIGN_OR_RETURN(job.device, ParseDevice(j.at("device").get<std::string>()), path);
    job.world = j.at("world").get<int>();
    job.all_outputs = j.at("all_outputs").get<bool>();
  } catch (const nlohmann::json::exception& e) {
    return InvalidArgument(path + ": not a split next-update job (" + e.what() + ")");
  }
  if (job.world < 1 || job.device == Device::kAuto) {
    return InvalidArgument(path + ": not a split next-update job");
  }
  return job;
}

}  // namespace

std::vector<std::vector<SplitPiece>> SplitElements(const std::vector<int64_t>& numels, int world) {
  std::vector<int64_t> starts(numels.size() + 1, 0);
  for (size_t t = 0; t < numels.size(); ++t) starts[t + 1] = starts[t] + numels[t];
  const int64_t total = starts.back();
  // Boundary r of the concatenation, snapped to kSplitAlign inside its tensor.
  std::vector<int64_t> bounds(static_cast<size_t>(world) + 1, total);
  bounds[0] = 0;
  for (int r = 1; r < world; ++r) {
    const int64_t target = static_cast<int64_t>(static_cast<__int128>(total) * r / world);
    size_t t = 0;
    while (t + 1 < numels.size() && starts[t + 1] <= target) ++t;
    const int64_t local = target - starts[t];
    const int64_t snapped = std::min(numels.empty() ? 0 : numels[t],
                                     (local + kSplitAlign / 2) / kSplitAlign * kSplitAlign);
    bounds[r] = std::max(bounds[r - 1], numels.empty() ? 0 : starts[t] + snapped);
  }
  std::vector<std::vector<SplitPiece>> pieces(static_cast<size_t>(world));
  for (int r = 0; r < world; ++r) {
    for (size_t t = 0; t < numels.size(); ++t) {
      const int64_t b = std::max(bounds[r], starts[t]), e = std::min(bounds[r + 1], starts[t + 1]);
      if (b < e) pieces[r].push_back({t, b - starts[t], e - starts[t]});
    }
  }
  return pieces;
}

Status RunNextUpdateWorker(const std::string& dir, int rank) {
  auto run = [&]() -> Status {
    CKPT_ASSIGN_OR_RETURN(const WorkerJob o, ReadWorkerJob(dir), "");
    const int world = o.world;
    if (rank < 0 || rank >= world) {
      return InvalidArgument("worker rank " + std::to_string(rank) + " of " +
                             std::to_string(world));
    }
    SourceOptions so;
    so.check_files = false;  // the launcher checked them
    CKPT_ASSIGN_OR_RETURN(std::unique_ptr<StateSource> source, OpenStateSource(o.tag_dir, so),
                          "open checkpoint " + o.tag_dir);
    const Manifest& m = source->manifest();
    CKPT_ASSIGN_OR_RETURN(AdamWHyper hyper, source->OptimizerHyper(), source->dir());
    CKPT_ASSIGN_OR_RETURN(safetensors::SafetensorsHeader gheader,
                          safetensors::ReadSafetensorsHeader(o.grad_file), "gradient file");
    // This worker's share of the checksum verification.
    CKPT_RETURN_IF_ERROR(source->Verify({std::string(kMaster), std::string(kExpAvg),
                                         std::string(kExpAvgSq)},
                                        rank, world),
                         "optimizer state of " + source->dir());
    std::unique_ptr<NcclStatsCombiner> combiner;
    if (o.device == Device::kCuda) {
      CKPT_RETURN_IF_ERROR(SelectCudaDevice(rank), "worker " + std::to_string(rank));
      CKPT_ASSIGN_OR_RETURN(const std::string id,
                            Env::Default()->ReadFileToString(dir + "/nccl_id"), "nccl id");
      CKPT_ASSIGN_OR_RETURN(combiner, NcclStatsCombiner::Create(id, rank, world, rank),
                            "worker " + std::to_string(rank));
    }
    CKPT_ASSIGN_OR_RETURN(std::unique_ptr<UpdatePass> pass, MakeUpdatePass(o.device),
                          "worker " + std::to_string(rank));

    std::vector<const ParamEntry*> params;
    std::vector<int64_t> numels;
    for (const ParamEntry& p : m.params) {
      if (!p.trainable()) continue;
      params.push_back(&p);
      numels.push_back(p.numel);
    }
    const std::vector<SplitPiece> mine = SplitElements(numels, world)[static_cast<size_t>(rank)];
    const int kinds = o.all_outputs ? 5 : 3;
    RawWriter files[5];
    for (int k = 0; k < kinds; ++k) {
      CKPT_RETURN_IF_ERROR(files[k].Open(RankFile(dir, rank, kOutputKinds[k])), "worker");
    }
    nlohmann::json pieces = nlohmann::json::array();
    PassStats overall;
    for (const SplitPiece& piece : mine) {
      const ParamEntry& p = *params[piece.tensor];
      const size_t n = static_cast<size_t>(piece.end - piece.begin);
      std::vector<float> w(n), mo(n), vo(n);
      CKPT_RETURN_IF_ERROR(
          source->ReadParamRange(p.name, kMaster, piece.begin, piece.end, w.data()));
      CKPT_RETURN_IF_ERROR(
          source->ReadParamRange(p.name, kExpAvg, piece.begin, piece.end, mo.data()));
      CKPT_RETURN_IF_ERROR(
          source->ReadParamRange(p.name, kExpAvgSq, piece.begin, piece.end, vo.data()));
      // The gradient tensor is read whole: a slice could not be checked against its digest.
      CKPT_ASSIGN_OR_RETURN(std::vector<float> g,
                            safetensors::ReadSafetensorsTensorF32(o.grad_file, gheader, p.name),
                            "gradient file");
      if (g.size() != static_cast<size_t>(p.numel)) {
        return DataLoss(p.name + ": element counts differ between the state and the gradient");
      }
      PassBuffer out[5];
      float* ptr[5] = {};
      for (int k = 0; k < kinds; ++k) {
        out[k] = PassBuffer(n);
        ptr[k] = out[k].data();
      }
      CKPT_ASSIGN_OR_RETURN(
          PassStats s,
          pass->Run(PassHyper{hyper}, {w.data(), mo.data(), vo.data(), g.data() + piece.begin, n},
                    {ptr[0], ptr[1], ptr[2], ptr[3], ptr[4]}),
          p.name);
      for (int k = 0; k < kinds; ++k) {
        CKPT_RETURN_IF_ERROR(files[k].Append(ptr[k], n), "worker");
      }
      overall.Merge(s);
      pieces.push_back({{"tensor", piece.tensor},
                        {"begin", piece.begin},
                        {"end", piece.end},
                        {"stats", PassStatsJson(s)}});
    }
    for (int k = 0; k < kinds; ++k) CKPT_RETURN_IF_ERROR(files[k].Close(), "worker");
    nlohmann::json result = {{"rank", rank},
                             {"device", std::string(DeviceName(pass->device()))},
                             {"pieces", std::move(pieces)},
                             {"overall_share", PassStatsJson(overall)}};
    if (combiner) {
      CKPT_RETURN_IF_ERROR(combiner->AllReduce(overall), "worker " + std::to_string(rank));
      result["overall_allreduced"] = PassStatsJson(overall);
    }
    return PublishText(RankFile(dir, rank, "json"), result.dump());
  };
  Status s = run();
  if (!s.ok()) {
    // The launcher re-raises this with the same code, so the exit status stays meaningful.
    (void)PublishText(
        RankFile(dir, rank, "error"),
        nlohmann::json{{"code", static_cast<int>(s.code())}, {"message", s.message()}}.dump());
  }
  return s;
}

int NextUpdateWorkerMain(int argc, char** argv) {
  int rank = -1;
  if (argc == 3) {
    char* end = nullptr;
    const long r = std::strtol(argv[2], &end, 10);
    if (end != argv[2] && *end == '\0' && r >= 0 && r < (1 << 20)) rank = static_cast<int>(r);
  }
  if (rank < 0) {
    std::fprintf(stderr,
                 "usage: %s DIR RANK\n(one worker of a split `ckpt next-update`; started by it, "
                 "not for direct use)\n",
                 argc > 0 ? argv[0] : kNextUpdateWorkerProgram);
    return 2;
  }
  const Status s = RunNextUpdateWorker(argv[1], rank);
  if (s.ok()) return 0;
  std::fprintf(stderr, "%s: %s\n", kNextUpdateWorkerProgram, s.ToString().c_str());
  return s.code() == StatusCode::kDataLoss ? 1 : 2;
}

Status RunSplitPass(const NextUpdateOptions& o, StateSource& source,
                    const std::string& grad_path, Device device, int workers, ResultSinks& sinks,
                    NextUpdateReport& r) {
  const Manifest& m = source.manifest();
  CKPT_ASSIGN_OR_RETURN(const TempDir scratch, TempDir::Create("ckpt-next-update-split"));
  const std::string& dir = scratch.path();

  if (device == Device::kCuda) {
    CKPT_ASSIGN_OR_RETURN(std::string id, NcclStatsCombiner::NewUniqueId(),
                          "--gpus " + std::to_string(workers) + " combines with NCCL");
    CKPT_RETURN_IF_ERROR(PublishText(dir + "/nccl_id", id), "nccl id");
  }

  // 1. Start the workers.
  CKPT_ASSIGN_OR_RETURN(const std::string exe, WorkerProgram(o.bin_dir), "next-update workers");
  const WorkerJob job{source.dir(), grad_path, device, workers, !o.out_dir.empty()};
  CKPT_RETURN_IF_ERROR(PublishText(dir + "/job.json", WorkerJobJson(job).dump()), "worker job");
  std::vector<pid_t> pids;
  auto stop_all = [&pids] {
    for (pid_t p : pids) {
      if (p > 0) kill(p, SIGTERM);
    }
    for (pid_t& p : pids) {
      if (p > 0) waitpid(p, nullptr, 0);
      p = 0;
    }
  };
  for (int rank = 0; rank < workers; ++rank) {
    const std::vector<std::string> argv = {exe, dir, std::to_string(rank)};
    auto pid = SpawnLogged(argv, RankFile(dir, rank, "log"), /*append=*/false);
    if (!pid.ok()) {
      stop_all();
      return Internal("cannot start worker " + std::to_string(rank) + ": " +
                      pid.status().message());
    }
    pids.push_back(*pid);
  }

  // 2. Wait; the first failure ends the others (an NCCL peer would wait for it forever). Only
  // our own children are waited for, so a calling program's other children are left alone.
  Status failure = Status::Ok();
  for (size_t left = pids.size(); left > 0;) {
    int status = 0, rank = -1;
    for (size_t i = 0; i < pids.size() && rank < 0; ++i) {
      if (pids[i] <= 0) continue;
      const pid_t got = waitpid(pids[i], &status, WNOHANG);
      if (got == pids[i]) rank = static_cast<int>(i);
      if (got < 0 && errno != EINTR) {
        failure = ErrnoError("waitpid worker " + std::to_string(i), errno);
        break;
      }
    }
    if (!failure.ok()) break;
    if (rank < 0) {
      usleep(2000);
      continue;
    }
    pids[rank] = 0;
    --left;
    if (WIFEXITED(status) && WEXITSTATUS(status) == 0) continue;
    auto error_text = Env::Default()->ReadFileToString(RankFile(dir, rank, "error"));
    nlohmann::json err =
        error_text.ok() ? nlohmann::json::parse(*error_text, nullptr, false) : nlohmann::json();
    if (err.is_object() && err.contains("code") && err.contains("message")) {
      failure = Status(static_cast<StatusCode>(err["code"].get<int>()),
                       "worker " + std::to_string(rank) + ": " + err["message"].get<std::string>());
    } else {
      failure = Internal("worker " + std::to_string(rank) + " of " + std::to_string(workers) +
                         " failed (" +
                         (WIFSIGNALED(status) ? "signal " + std::to_string(WTERMSIG(status))
                                              : "exit " + std::to_string(WEXITSTATUS(status))) +
                         "); its output:\n" + TailOfFile(RankFile(dir, rank, "log")));
    }
    break;
  }
  if (!failure.ok()) {
    stop_all();
    return failure;
  }

  // 3. Combine: per-tensor statistics from the pieces in order, the overall ones from NCCL
  // (CUDA) or from the workers' shares in rank order (CPU).
  std::vector<const ParamEntry*> params;
  for (const ParamEntry& p : m.params) {
    if (p.trainable()) params.push_back(&p);
  }
  std::vector<PassStats> per_tensor(params.size());
  PassStats overall;
  std::optional<PassStats> reduced;
  for (int rank = 0; rank < workers; ++rank) {
    auto text = Env::Default()->ReadFileToString(RankFile(dir, rank, "json"));
    nlohmann::json j = text.ok() ? nlohmann::json::parse(*text, nullptr, false) : nlohmann::json();
    if (!j.is_object()) return DataLoss("worker " + std::to_string(rank) + " left no result");
    try {
      for (const auto& piece : j.at("pieces")) {
        const size_t t = piece.at("tensor").get<size_t>();
        if (t >= params.size()) return DataLoss("worker result names tensor " + std::to_string(t));
        per_tensor[t].Merge(PassStatsFromJson(piece.at("stats")));
      }
      overall.Merge(PassStatsFromJson(j.at("overall_share")));
      if (j.contains("overall_allreduced") && !reduced) {
        reduced = PassStatsFromJson(j.at("overall_allreduced"));
      }
    } catch (const nlohmann::json::exception& e) {
      return DataLoss("worker " + std::to_string(rank) + " result: " + e.what());
    }
  }
  r.overall = reduced ? *reduced : overall;
  for (size_t t = 0; t < params.size(); ++t) {
    if (per_tensor[t].n != static_cast<uint64_t>(params[t]->numel)) {
      return Internal("workers covered " + std::to_string(per_tensor[t].n) + " of " +
                      std::to_string(params[t]->numel) + " elements of " + params[t]->name);
    }
    r.tensors.push_back({params[t]->name, params[t]->shape, per_tensor[t]});
  }

  // The result arrays, tensor by tensor in bounded pieces, into the digests and files.
  const int kinds = sinks.full ? 5 : 3;
  std::vector<RankConcatReader> readers;
  for (int k = 0; k < kinds; ++k) readers.emplace_back(dir, kOutputKinds[k], workers);
  Xxh3Stream* digests[3] = {&sinks.weights, &sinks.exp_avg, &sinks.exp_avg_sq};
  std::optional<safetensors::SafetensorsWriter>* writers[5] = {
      &sinks.full, nullptr, nullptr, &sinks.weights_only, &sinks.moments_dropped};
  constexpr size_t kChunk = size_t{2} << 20;  // floats (8 MiB)
  std::vector<float> buf;
  for (const ParamEntry* p : params) {
    for (int64_t done = 0; done < p->numel;) {
      const size_t n = static_cast<size_t>(std::min<int64_t>(kChunk, p->numel - done));
      buf.resize(n);
      for (int k = 0; k < kinds; ++k) {
        CKPT_RETURN_IF_ERROR(readers[k].Read(buf.data(), n), "combine worker results");
        if (k < 3) digests[k]->Update(buf.data(), n * sizeof(float));
        if (writers[k] && writers[k]->has_value()) {
          CKPT_RETURN_IF_ERROR((*writers[k])->Append(buf.data(), n * sizeof(float)),
                               std::string(kOutputKinds[k]) + " result file");
        }
      }
      done += static_cast<int64_t>(n);
    }
  }
  r.processes = workers;
  if (device == Device::kCuda) {
    for (int d = 0; d < workers; ++d) r.devices.push_back(d);
  }
  return Status::Ok();
}

}  // namespace ckpt::verify
