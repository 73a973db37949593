// engine_min: `train` and `grad` (docs/architecture.md, "engine_min command line").
//
// Error handling across ranks: settings, the checkpoint's manifest and the topology checks are
// the same on every rank, so their errors are reported by rank 0 and every rank exits 2 without
// touching the disk. A failure that can hit one rank alone in the middle of collective work
// (an unreadable shard, an I/O error) ends the whole job with MPI_Abort, since the other ranks
// would otherwise wait forever in their next collective. SaveCheckpoint returns the same status
// on every rank, so a failed save is again an ordinary exit 2 (with --async-save, at the next
// save or at the end of the run, where every rank waits for the save in flight).
#include <sys/prctl.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <chrono>
#include <cstdio>
#include <map>
#include <new>
#include <optional>

#include "ckpt/reader.h"
#include "ckpt/root.h"
#include "ckpt/writer.h"
#include "safetensors/safetensors.h"
#include "engine_min/comm.h"
#include "engine_min/config.h"
#include "engine_min/data.h"
#include "engine_min/engine.h"
#include "engine_min/nccl_comm.h"
#include "engine_min/run_log.h"

namespace engine_min {
namespace {

int rank_for_messages = 0;

int Fail(const ckpt::Status& s, bool every_rank = false) {
  if (every_rank || rank_for_messages == 0) {
    std::fprintf(stderr, "engine_min: error: %s\n", s.ToString().c_str());
    std::fflush(stderr);
  }
  const int code = ckpt::ExitCodeFor(s);
  return code == 0 ? 2 : code;
}

// A rank dies with the process that started it (mpirun, or the launcher's daemon): a rank
// left behind by a SIGKILLed mpirun would go on training and committing checkpoints alone.
void DieWithLauncher() {
  const pid_t parent = ::getppid();
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (::getppid() != parent) std::_Exit(137);  // the launcher died before prctl
}

[[noreturn]] void AbortJob(const ckpt::Status& s) {
  std::fprintf(stderr, "engine_min: rank %d: fatal: %s\n", rank_for_messages, s.ToString().c_str());
  std::fflush(stderr);
  const int code = ckpt::ExitCodeFor(s);
  MpiSession::Abort(code == 0 ? 2 : code);
}

ckpt::Status WriteGradients(const std::string& path, const Engine& engine,
                            const std::vector<std::vector<float>>& grads, double grad_norm,
                            const std::string& tag) {
  std::vector<ckpt::safetensors::SafetensorsTensorView> views;
  for (int id = 0; id < static_cast<int>(grads.size()); ++id) {
    ckpt::safetensors::SafetensorsTensorView v;
    v.spec.name = TrainableName(id);
    v.spec.dtype = ckpt::DType::kF32;
    v.spec.shape = TrainableShape(engine.config().shape, id);
    v.data = grads[id].data();
    views.push_back(std::move(v));
  }
  char norm[40];
  std::snprintf(norm, sizeof(norm), "%.17g", grad_norm);
  std::map<std::string, std::string> meta = {
      {"source", "engine_min grad"},
      {"tag", tag},
      {"global_step", std::to_string(engine.counters().global_step)},
      {"grad_norm_before_clip", norm},
      {"clipped", "true"}};
  return ckpt::safetensors::WriteSafetensors(path, views, meta).WithContext(path);
}

std::string RunLogPath(const CommandLine& cl) {
  return cl.trainlog.empty() ? cl.ckpt_dir + "/trainlog.jsonl" : cl.trainlog;
}

// A root is never rewound by accident: `train` without --resume into a root that holds
// committed tags or a run log, or a resume from a tag older than `latest` whose saves would
// move `latest` back, is refused (exit 2, before anything is written) unless --overwrite. A
// reset step counter (--reset-on-resume step) is itself the explicit request. Every rank sees
// the same files, so every rank reaches the same verdict.
ckpt::Status CheckNoRewind(const CommandLine& cl, const EngineConfig& config, int64_t start_step,
                           ckpt::Env* env) {
  if (cl.overwrite || cl.reset_on_resume.count("step")) return ckpt::Status::Ok();
  if (!env->Exists(cl.ckpt_dir)) return ckpt::Status::Ok();
  auto listing = ckpt::ListRoot(cl.ckpt_dir, env);
  if (!listing.ok()) return ckpt::Status::Ok();  // not a root yet; the save reports problems
  const ckpt::TagInfo* latest = nullptr;
  for (const ckpt::TagInfo& t : listing->tags) {
    if (t.latest) latest = &t;
  }
  if (!cl.resume) {
    const std::string log = RunLogPath(cl);
    auto log_size = env->FileSize(log);
    const bool has_log = log_size.ok() && *log_size > 0;
    if (listing->tags.empty() && !has_log) return ckpt::Status::Ok();
    std::string what = latest ? "committed checkpoints (latest " + latest->tag + ")"
                       : !listing->tags.empty() ? "committed checkpoints"
                                                : "a run log (" + log + ")";
    return ckpt::FailedPrecondition(
        cl.ckpt_dir + " already holds " + what +
        ": pass --resume to continue that run, or --overwrite to start a new one there (its "
        "tags, latest and run log are removed first)");
  }
  const bool saves = config.save_every > 0 || !cl.no_final_save;
  if (latest && saves && start_step < latest->global_step && config.steps > start_step) {
    return ckpt::FailedPrecondition(
        "resuming at global_step " + std::to_string(start_step) + " in " + cl.ckpt_dir +
        ", whose latest is " + latest->tag + ": the new saves would move latest back. Resume "
        "into another root, add --no-final-save --save-every 0, or pass --overwrite to allow it");
  }
  return ckpt::Status::Ok();
}

// --overwrite of a fresh run (rank 0, before the first step): the root's committed tags,
// `latest` and the run log go, under the root lock, so the new run does not mix with the old.
ckpt::Status ClearRootForNewRun(const CommandLine& cl, ckpt::Env* env) {
  if (!env->Exists(cl.ckpt_dir)) return ckpt::Status::Ok();
  CKPT_ASSIGN_OR_RETURN(ckpt::RootListing listing, ckpt::ListRoot(cl.ckpt_dir, env), "--overwrite");
  CKPT_ASSIGN_OR_RETURN(ckpt::RootLock lock, ckpt::RootLock::TryAcquire(cl.ckpt_dir, env),
                        "--overwrite");
  const std::string latest = cl.ckpt_dir + "/latest";
  if (env->Exists(latest)) CKPT_RETURN_IF_ERROR(env->RemoveFile(latest), "--overwrite");
  for (const ckpt::TagInfo& t : listing.tags) {
    CKPT_RETURN_IF_ERROR(env->RemoveDirRecursive(t.path), "--overwrite");
  }
  const std::string log = RunLogPath(cl);
  if (env->Exists(log)) CKPT_RETURN_IF_ERROR(env->RemoveFile(log), "--overwrite");
  return env->SyncDir(cl.ckpt_dir);
}

// Every rank opens the same tag: rank 0 resolves the path (`latest`, unless --resume-tag names
// a tag) and sends the tag's name to the others, which open it under their own --ckpt-dir
// (another node may mount it elsewhere). Each rank resolving `latest` on its own could resume
// different steps when a save commits into the root meanwhile (another job writing where this
// one resumes). When rank 0 cannot open it, every rank fails with its code.
ckpt::Result<ckpt::CheckpointReader> OpenAgreedCheckpoint(const CommandLine& cl, MpiComm& mpi) {
  if (mpi.world_size() == 1) return ckpt::CheckpointReader::Open(cl.ckpt_dir, cl.resume_tag);
  std::optional<ckpt::Result<ckpt::CheckpointReader>> mine;
  std::string tag;
  int32_t code = 0;
  if (mpi.rank() == 0) {
    mine.emplace(ckpt::CheckpointReader::Open(cl.ckpt_dir, cl.resume_tag));
    if (mine->ok()) {
      tag = (*mine)->tag();
    } else {
      code = static_cast<int32_t>(mine->status().code());
    }
  }
  uint64_t len = tag.size();
  CKPT_RETURN_IF_ERROR(mpi.Broadcast(&code, sizeof code, 0), "agree on the tag to resume");
  CKPT_RETURN_IF_ERROR(mpi.Broadcast(&len, sizeof len, 0), "agree on the tag to resume");
  if (len > 4096)
    return ckpt::Internal("rank 0 sent a tag name of " + std::to_string(len) + " bytes");
  tag.resize(len);
  if (len > 0)
    CKPT_RETURN_IF_ERROR(mpi.Broadcast(tag.data(), len, 0), "agree on the tag to resume");
  if (mpi.rank() == 0) return std::move(*mine);
  if (code != 0)
    return ckpt::Status(static_cast<ckpt::StatusCode>(code),
                        "rank 0 could not open " + cl.ckpt_dir + " (rank 0's error says why)");
  CKPT_ASSIGN_OR_RETURN(std::string dir, ckpt::ResolveAgreedTagDir(cl.ckpt_dir, tag), "");
  return ckpt::CheckpointReader::Open(dir);
}

// Resume: every rank opens the checkpoint read-only (the manifest is small) and checks its
// topology against this job's before anything else.
ckpt::Result<ckpt::CheckpointReader> OpenResumeCheckpoint(const CommandLine& cl, MpiComm& mpi) {
  auto reader = OpenAgreedCheckpoint(cl, mpi);
  if (!reader.ok()) return reader.status().WithContext("resume from " + cl.ckpt_dir);
  const nlohmann::json& base = reader->manifest().engine_config;
  if (!base.is_object() || !base.contains("global_batch")) {
    return ckpt::FailedPrecondition(reader->dir() +
                                    " has no engine_config from engine_min; it cannot be "
                                    "resumed here");
  }
  // Topology first: a checkpoint from another world size would otherwise fail on its batch
  // arithmetic with a less useful message.
  const int zero = cl.given.contains("zero") ? cl.given["zero"].get<int>()
                                             : reader->manifest().topology.zero_stage;
  CKPT_RETURN_IF_ERROR(
      CheckResumeTopology(reader->manifest(), reader->dir(), mpi.world_size(), zero));
  // Another world size resumes directly (Engine::Restore reshards at load time), but the
  // global batch is kept, so the new world size must divide it.
  const int64_t gb =
      base["global_batch"].is_number_integer() ? base["global_batch"].get<int64_t>() : 0;
  if (gb > 0 && gb % mpi.world_size() != 0) {
    std::string divisors;
    for (int64_t d = 1; d <= gb; ++d)
      if (gb % d == 0) divisors += (divisors.empty() ? "" : ", ") + std::to_string(d);
    return ckpt::FailedPrecondition(
        reader->dir() + " was saved with global batch " + std::to_string(gb) + " (" +
        std::to_string(reader->manifest().topology.dp_world_size) +
        " ranks); a resumed run keeps it, and " + std::to_string(mpi.world_size()) +
        " data-parallel ranks cannot split it: resume on a world size that divides it (" +
        divisors + ") (nothing on disk was changed)");
  }
  return reader;
}

// `grad`: rank 0 writes the next step's gradient of the resumed checkpoint.
int RunGrad(const CommandLine& cl, Engine& engine, MpiComm& mpi, const std::string& tag) {
  double norm = 0;
  auto grads = engine.NextGradient(&norm);
  if (!grads.ok()) AbortJob(grads.status());
  if (mpi.rank() == 0) {
    ckpt::Status s = WriteGradients(cl.grad_out, engine, *grads, norm, tag);
    if (!s.ok()) return Fail(s);
    std::printf("engine_min grad: %s step %lld: wrote %zu tensors to %s (norm %.9g)\n", tag.c_str(),
                static_cast<long long>(engine.counters().global_step), grads->size(),
                cl.grad_out.c_str(), norm);
  }
  return 0;
}

// Rank 0 before the first step: clears the root for --overwrite, creates it, opens the run log
// (every call through env) and prints the run's banner. A failure ends the job.
RunLog StartRunLog(const CommandLine& cl, const EngineConfig& config, const Engine& engine,
                   const MpiComm& mpi, ckpt::Env* env) {
  if (cl.overwrite && !cl.resume) {
    ckpt::Status s = ClearRootForNewRun(cl, env);
    if (!s.ok()) AbortJob(s);
  }
  if (ckpt::Status s = env->CreateDirs(cl.ckpt_dir); !s.ok()) AbortJob(s);
  auto log = RunLog::Open(RunLogPath(cl), env);
  if (!log.ok()) AbortJob(log.status());
  std::printf(
      "engine_min: %d ranks, ZeRO-%d, %s (d %d, layers %d, context %d, %lld "
      "trainable), global batch %lld = %lld x %lld x %d, from step %lld to %lld%s\n",
      mpi.world_size(), config.zero_stage, config.model.c_str(), config.shape.d_model,
      config.shape.layers, config.shape.context,
      static_cast<long long>(config.shape.TrainableNumel()),
      static_cast<long long>(config.global_batch), static_cast<long long>(config.micro_batch),
      static_cast<long long>(config.grad_accum), mpi.world_size(),
      static_cast<long long>(engine.counters().global_step), static_cast<long long>(config.steps),
      config.invariant ? ", invariant mode" : "");
  std::fflush(stdout);
  return std::move(*log);
}

// Time the training loop spends inside Save (the whole save, or the copy when async).
struct SaveStall {
  int saves = 0;
  double total = 0, max = 0;
};

// `train`: steps to config.steps, saving every save_every and at the end; rank 0 keeps the
// run log and prints each step.
int RunTrain(const CommandLine& cl, const EngineConfig& config, Engine& engine, MpiComm& mpi,
             const nlohmann::json& client_state, ckpt::Env* env) {
  std::optional<RunLog> trainlog;
  if (mpi.rank() == 0) trainlog.emplace(StartRunLog(cl, config, engine, mpi, env));
  engine.SetCollectiveTimeout(cl.collective_timeout);  // before EnableAsyncSave
  if (cl.async_save) {
    // The same MPI library on every rank: every rank enables it, or none does.
    ckpt::Status s = engine.EnableAsyncSave();
    if (!s.ok() && s.code() != ckpt::StatusCode::kFailedPrecondition) AbortJob(s);
    if (!s.ok() && mpi.rank() == 0) {
      std::fprintf(stderr, "engine_min: --async-save: %s; saving synchronously\n",
                   s.ToString().c_str());
    }
  }
  const KillInSave kill{cl.kill_rank, cl.kill_step, cl.kill_stalls};
  int64_t last_saved = cl.resume ? engine.counters().global_step : -1;
  const int64_t start_step = engine.counters().global_step;
  int64_t tokens = 0;
  SaveStall save_stall;
  const auto t0 = std::chrono::steady_clock::now();
  while (engine.counters().global_step < config.steps) {
    auto stats = engine.TrainStep(true);
    if (!stats.ok()) AbortJob(stats.status());
    tokens += stats->tokens;
    if (trainlog) {
      if (ckpt::Status s = trainlog->Append(TrainlogLine(*stats)); !s.ok()) AbortJob(s);
      std::printf("step %lld loss %.6f grad_norm %.4f lr %.3g tokens %lld\n",
                  static_cast<long long>(stats->step), stats->loss, stats->grad_norm, stats->lr,
                  static_cast<long long>(stats->tokens));
      std::fflush(stdout);
    }
    if (config.save_every > 0 && stats->step % config.save_every == 0) {
      const auto s0 = std::chrono::steady_clock::now();
      ckpt::Status s = engine.Save(cl.ckpt_dir, client_state, kill);
      if (!s.ok()) return Fail(s);
      const double stall =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - s0).count();
      save_stall.total += stall;
      save_stall.max = std::max(save_stall.max, stall);
      ++save_stall.saves;
      last_saved = stats->step;
    }
  }
  // The loop's saves are persisted inside the timed span, async or not.
  if (ckpt::Status s = engine.WaitForSave(); !s.ok()) return Fail(s);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (!cl.no_final_save && last_saved != engine.counters().global_step) {
    ckpt::Status s = engine.Save(cl.ckpt_dir, client_state, kill);
    if (!s.ok()) return Fail(s);
    s = engine.WaitForSave();
    if (!s.ok()) return Fail(s);
  }
  if (trainlog) {
    trainlog.reset();
    const int64_t steps = engine.counters().global_step - start_step;
    std::printf("engine_min: %lld steps, %lld tokens in %.2f s: %.1f tokens/s\n",
                static_cast<long long>(steps), static_cast<long long>(tokens), seconds,
                seconds > 0 ? static_cast<double>(tokens) / seconds : 0.0);
    if (save_stall.saves > 0) {
      std::printf("engine_min: %d saves (%s) in the loop: %.3f s inside Save, at most %.1f ms\n",
                  save_stall.saves, engine.async_save() ? "async" : "sync", save_stall.total,
                  save_stall.max * 1e3);
    }
  }
  return 0;
}

// Everything after MPI is up: parse, resume or start, then `grad` or `train`.
int RunCommand(MpiComm& mpi, int argc, char** argv) {
  auto cl_or = ParseCommandLine(argc, argv);
  if (!cl_or.ok()) return Fail(cl_or.status());
  CommandLine& cl = *cl_or;
  if (cl.help) {
    if (mpi.rank() == 0) std::fputs(cl.help_text.c_str(), stdout);
    return 0;
  }
  ckpt::Env* env = ckpt::Env::Default();

  std::optional<ckpt::CheckpointReader> reader;
  nlohmann::json base;
  if (cl.resume) {
    auto r = OpenResumeCheckpoint(cl, mpi);
    if (!r.ok()) return Fail(r.status());
    reader.emplace(std::move(*r));
    base = reader->manifest().engine_config;
  }
  auto config = ResolveConfig(cl.given, base, mpi.world_size());
  if (!config.ok()) return Fail(config.status());
  if (config->corpus.empty()) config->corpus = DefaultCorpusPath();
  auto corpus = Corpus::Load(config->corpus, config->sample_min, config->sample_max, env);
  if (!corpus.ok()) return Fail(corpus.status());

  std::unique_ptr<DataParallelComm> nccl;
  DataParallelComm* dp = &mpi;
  if (config->comm == "nccl") {
    auto c = CreateNcclCommOverMpi(mpi);
    if (!c.ok()) return Fail(c.status());
    nccl = std::move(*c);
    dp = nccl.get();
  }
  auto engine_or = Engine::Create(*config, *corpus, mpi, *dp);
  if (!engine_or.ok()) return Fail(engine_or.status());
  Engine& engine = **engine_or;

  if (reader) {
    ckpt::Status s = engine.Restore(*reader, cl.reset_on_resume);
    if (!s.ok()) {
      if (s.code() == ckpt::StatusCode::kFailedPrecondition) return Fail(s);
      AbortJob(s);
    }
    const ckpt::Topology& t = reader->manifest().topology;
    if (mpi.rank() == 0 &&
        (t.dp_world_size != mpi.world_size() || t.zero_stage != config->zero_stage)) {
      const ckpt::ReadAccounting& a = engine.last_load();
      std::printf("engine_min: %s resharded at load: saved by %d ranks with ZeRO-%d, loaded on "
                  "%d ranks with ZeRO-%d; rank 0 read %llu bytes of optimizer state for %llu "
                  "owned (%.3fx), every byte verified\n",
                  reader->tag().c_str(), t.dp_world_size, t.zero_stage, mpi.world_size(),
                  config->zero_stage, static_cast<unsigned long long>(a.bytes_read),
                  static_cast<unsigned long long>(a.bytes_owned), a.ratio());
      std::fflush(stdout);
    }
  } else {
    ckpt::Status s = engine.InitFresh();
    if (!s.ok()) AbortJob(s);
  }
  if (cl.command == "train") {
    ckpt::Status s = CheckNoRewind(cl, *config, engine.counters().global_step, env);
    if (!s.ok()) return Fail(s);
  }
  if (cl.command == "grad") return RunGrad(cl, engine, mpi, reader->tag());

  nlohmann::json client_state = nlohmann::json::object();
  if (reader) client_state = reader->manifest().client_state;
  for (auto& [k, v] : cl.client_state.items()) client_state[k] = v;
  reader.reset();
  return RunTrain(cl, *config, engine, mpi, client_state, env);
}

int Run(int argc, char** argv) {
  ckpt::ServeHdf5Probe(argc, argv);  // HDF5 files read are walked by a probe process first
  ckpt::DisableHdf5ExitCleanup();  // a failed save exits with its error, not HDF5's crash
  DieWithLauncher();
  ckpt::IgnoreFileSizeLimitSignal();  // past `ulimit -f`: EFBIG and a message, not SIGXFSZ
  auto session = MpiSession::Init(&argc, &argv);
  if (!session.ok()) return Fail(session.status(), true);
  // The communicator is destroyed before the session ends.
  auto world = MpiComm::Create(MPI_COMM_WORLD);
  if (!world.ok()) return Fail(world.status(), true);
  MpiComm& mpi = **world;
  rank_for_messages = mpi.rank();
  try {
    return RunCommand(mpi, argc, argv);
  } catch (const std::bad_alloc&) {
    // Out of memory on this rank (a resume's state, resharded or not; a save's buffers): the
    // other ranks would wait for it in their next collective, so the job aborts with the
    // reason. Nothing was committed: a save cut short leaves only its temporary directory.
    AbortJob(ckpt::ResourceExhausted(ckpt::OutOfMemoryText()));
  }
}

}  // namespace
}  // namespace engine_min

int main(int argc, char** argv) { return engine_min::Run(argc, argv); }
