#include "engine_min/config.h"

#include <CLI/CLI.hpp>
#include <functional>
#include <optional>
#include <sstream>

#include "ckpt/writer.h"
#include "engine_min/exact_sum.h"

namespace engine_min {

std::string DefaultCorpusPath() { return std::string(ENGINE_MIN_SOURCE_DIR) + "/data/corpus.txt"; }

nlohmann::json EngineConfig::ToJson() const {
  nlohmann::json j = {{"model", model},
                      {"d_model", shape.d_model},
                      {"layers", shape.layers},
                      {"context", shape.context},
                      {"vocab", ModelShape::kVocab},
                      {"dropout", dropout},
                      {"zero", zero_stage},
                      {"steps", steps},
                      {"micro_batch", micro_batch},
                      {"grad_accum", grad_accum},
                      {"global_batch", global_batch},
                      {"dp_world_size", dp_world_size},
                      {"lr", lr},
                      {"min_lr", min_lr},
                      {"warmup", warmup},
                      {"lr_decay_steps", lr_decay_steps},
                      {"weight_decay", weight_decay},
                      {"grad_clip", grad_clip},
                      {"beta1", beta1},
                      {"beta2", beta2},
                      {"eps", eps},
                      {"seed", seed},
                      {"save_every", save_every},
                      {"keep_last", keep_last},
                      {"compress", compress},
                      {"corpus", corpus},
                      {"sample_min", sample_min},
                      {"sample_max", sample_max},
                      {"comm", comm}};
  // Only when on, so a default run's engine_config is what it always was.
  if (invariant) j["invariant"] = true;
  return j;
}

namespace {

// Binds each value option to a std::optional-like holder and records the given ones.
struct GivenOptions {
  std::vector<std::function<void(nlohmann::json&)>> collect;

  template <typename T>
  void Add(CLI::App& app, const std::string& flag, const std::string& key,
           const std::string& help) {
    auto holder = std::make_shared<T>();
    CLI::Option* opt = app.add_option(flag, *holder, help);
    collect.push_back([opt, holder, key](nlohmann::json& j) {
      if (opt->count() > 0) j[key] = *holder;
    });
  }
};

void AddTrainingOptions(CLI::App& app, GivenOptions& g) {
  g.Add<std::string>(app, "--model", "model", "model preset: tiny (~0.2M params) or small (~25M)");
  g.Add<int>(app, "--d-model", "d_model", "hidden width (overrides the preset)");
  g.Add<int>(app, "--layers", "layers", "number of blocks (overrides the preset)");
  g.Add<int>(app, "--context", "context", "bytes of context per prediction (overrides the preset)");
  g.Add<double>(app, "--dropout", "dropout", "dropout probability in every block (default 0.1)");
  g.Add<int>(app, "--zero", "zero", "ZeRO stage 0|1|2|3 (default 0)");
  g.Add<int64_t>(app, "--steps", "steps", "total optimizer steps of the run (default 100)");
  g.Add<int64_t>(app, "--micro-batch", "micro_batch", "samples per rank per micro-step");
  g.Add<int64_t>(app, "--grad-accum", "grad_accum", "micro-steps per optimizer step");
  g.Add<int64_t>(app, "--global-batch", "global_batch", "samples per optimizer step");
  g.Add<double>(app, "--lr", "lr", "peak learning rate (default 1e-3)");
  g.Add<double>(app, "--min-lr", "min_lr", "final learning rate of the cosine (default 1e-4)");
  g.Add<int64_t>(app, "--warmup", "warmup", "linear warmup steps (default 10)");
  g.Add<int64_t>(app, "--lr-decay-steps", "lr_decay_steps",
                 "step where the cosine reaches --min-lr (default: --steps)");
  g.Add<double>(app, "--weight-decay", "weight_decay", "AdamW weight decay (default 0.01)");
  g.Add<double>(app, "--grad-clip", "grad_clip", "global-norm clip, 0 disables (default 1.0)");
  g.Add<double>(app, "--beta1", "beta1", "AdamW beta1 (default 0.9)");
  g.Add<double>(app, "--beta2", "beta2", "AdamW beta2 (default 0.999)");
  g.Add<double>(app, "--eps", "eps", "AdamW epsilon (default 1e-8)");
  g.Add<uint64_t>(app, "--seed", "seed", "seed of initialization, dropout and shuffle");
  g.Add<int64_t>(app, "--save-every", "save_every", "save when global_step is a multiple of E");
  g.Add<int>(app, "--keep-last", "keep_last", "keep only the newest K checkpoints (0: all)");
  g.Add<std::string>(app, "--compress", "compress", "none | zstd[:level][+shuffle]");
  g.Add<std::string>(app, "--corpus", "corpus", "training text (default: the shipped corpus)");
  g.Add<int>(app, "--sample-min", "sample_min", "shortest sample in bytes (default 8)");
  g.Add<int>(app, "--sample-max", "sample_max", "longest sample in bytes (default 48)");
  g.Add<std::string>(app, "--comm", "comm", "data-parallel backend: mpi | nccl");
  auto invariant = std::make_shared<bool>(false);
  app.add_flag("--invariant", *invariant,
               "topology-invariant mode: bitwise the same run on any world size, ZeRO stage or "
               "accumulation split (kept on resume)");
  g.collect.push_back([invariant](nlohmann::json& j) {
    if (*invariant) j["invariant"] = true;
  });
}

}  // namespace

ckpt::Result<CommandLine> ParseCommandLine(int argc, char** argv) {
  CLI::App app{"engine_min: a small ZeRO 0-3 training engine that saves and resumes through ckpt"};
  app.require_subcommand(1);
  CommandLine cl;
  GivenOptions train_given, grad_given;
  std::vector<std::string> client_state, reset;
  std::string kill_spec;

  CLI::App* train = app.add_subcommand("train", "train the model (launch under mpirun -n N)");
  AddTrainingOptions(*train, train_given);
  train->add_option("--ckpt-dir", cl.ckpt_dir, "checkpoint root")->required();
  train->add_flag("--resume", cl.resume,
                  "resume from the checkpoint root (latest, or --resume-tag)");
  train->add_option("--resume-tag", cl.resume_tag, "tag to resume from (default: latest)");
  train->add_option("--trainlog", cl.trainlog, "run log (default: <ckpt-dir>/trainlog.jsonl)");
  train->add_flag("--no-final-save", cl.no_final_save, "do not save at the end of the run");
  train->add_flag("--async-save", cl.async_save,
                  "copy the state and write the checkpoint in the background while training "
                  "goes on (needs MPI_THREAD_MULTIPLE, else saves stay synchronous)");
  train->add_flag("--overwrite", cl.overwrite,
                  "without --resume: start a new run in a root that holds one (its tags, latest "
                  "and run log are removed first); with --resume: let saves move latest back");
  train
      ->add_option("--reset-on-resume", reset,
                   "after loading, reset these to fresh-start values: "
                   "moments,step,rng,data,scheduler")
      ->delimiter(',');
  train->add_option("--client-state", client_state, "key=value saved in the checkpoint");
  train->add_option("--test-kill-in-save", kill_spec,
                    "test only: RANK:STEP, that rank dies with SIGKILL inside that save");
  std::string stall_spec;
  train->add_option("--test-stall-in-save", stall_spec,
                    "test only: RANK:STEP, that rank hangs inside that save");
  train
      ->add_option("--collective-timeout", cl.collective_timeout,
                   "seconds a checkpoint collective waits for the other ranks before the save "
                   "fails and the job aborts (0: forever)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();

  CLI::App* grad = app.add_subcommand(
      "grad", "write the gradient of the next optimizer step of a checkpoint (changes nothing)");
  AddTrainingOptions(*grad, grad_given);
  grad->add_option("--ckpt-dir", cl.ckpt_dir, "checkpoint root")->required();
  grad->add_option("--resume-tag", cl.resume_tag, "tag (default: latest)");
  grad->add_option("--out", cl.grad_out, "output .safetensors")->required();

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    std::ostringstream out, err;
    const int code = app.exit(e, out, err);
    if (code == 0) {
      cl.help = true;
      cl.help_text = out.str();
      return cl;
    }
    return ckpt::InvalidArgument(err.str() + out.str());
  }

  GivenOptions& given = train->parsed() ? train_given : grad_given;
  cl.command = train->parsed() ? "train" : "grad";
  for (auto& f : given.collect) f(cl.given);
  if (cl.command == "grad") cl.resume = true;

  for (const std::string& r : reset) {
    static const std::set<std::string> kKnown = {"moments", "step", "rng", "data", "scheduler"};
    if (!kKnown.count(r)) {
      return ckpt::InvalidArgument("--reset-on-resume: unknown component '" + r +
                                   "' (expected moments, step, rng, data, scheduler)");
    }
    cl.reset_on_resume.insert(r);
  }
  if (!cl.reset_on_resume.empty() && !cl.resume) {
    return ckpt::InvalidArgument("--reset-on-resume needs --resume");
  }
  if (!cl.resume_tag.empty() && !cl.resume) {
    return ckpt::InvalidArgument("--resume-tag needs --resume");
  }
  for (const std::string& kv : client_state) {
    const size_t eq = kv.find('=');
    if (eq == std::string::npos || eq == 0) {
      return ckpt::InvalidArgument("--client-state expects key=value, got '" + kv + "'");
    }
    cl.client_state[kv.substr(0, eq)] = kv.substr(eq + 1);
  }
  if (!stall_spec.empty()) {
    if (!kill_spec.empty())
      return ckpt::InvalidArgument("--test-kill-in-save and --test-stall-in-save exclude each other");
    kill_spec = stall_spec;
    cl.kill_stalls = true;
  }
  if (!kill_spec.empty()) {
    const size_t colon = kill_spec.find(':');
    try {
      if (colon == std::string::npos) throw std::invalid_argument("no colon");
      cl.kill_rank = std::stoi(kill_spec.substr(0, colon));
      cl.kill_step = std::stoll(kill_spec.substr(colon + 1));
    } catch (const std::exception&) {
      return ckpt::InvalidArgument("--test-kill-in-save/--test-stall-in-save expect RANK:STEP, got '" + kill_spec +
                                   "'");
    }
  }
  return cl;
}

namespace {

template <typename T>
T Pick(const nlohmann::json& given, const nlohmann::json& base, const char* key, T fallback) {
  if (given.contains(key)) return given[key].get<T>();
  if (base.is_object() && base.contains(key)) return base[key].get<T>();
  return fallback;
}

}  // namespace

ckpt::Result<EngineConfig> ResolveConfig(const nlohmann::json& given, const nlohmann::json& base,
                                         int world) {
  EngineConfig c;
  try {
    c.model = Pick<std::string>(given, base, "model", "tiny");
    CKPT_ASSIGN_OR_RETURN(c.shape, ModelShape::Preset(c.model), "--model");
    // A preset chosen on this command line resets the shape; explicit dims override either.
    const nlohmann::json& shape_base = given.contains("model") ? nlohmann::json() : base;
    c.shape.d_model = Pick<int>(given, shape_base, "d_model", c.shape.d_model);
    c.shape.layers = Pick<int>(given, shape_base, "layers", c.shape.layers);
    c.shape.context = Pick<int>(given, shape_base, "context", c.shape.context);
    CKPT_RETURN_IF_ERROR(c.shape.Validate(), "model shape");

    c.dropout = Pick<double>(given, base, "dropout", c.dropout);
    c.zero_stage = Pick<int>(given, base, "zero", c.zero_stage);
    c.steps = Pick<int64_t>(given, base, "steps", c.steps);
    c.lr = Pick<double>(given, base, "lr", c.lr);
    c.min_lr = Pick<double>(given, base, "min_lr", c.min_lr);
    c.warmup = Pick<int64_t>(given, base, "warmup", c.warmup);
    c.lr_decay_steps = Pick<int64_t>(given, base, "lr_decay_steps", c.lr_decay_steps);
    c.weight_decay = Pick<double>(given, base, "weight_decay", c.weight_decay);
    c.grad_clip = Pick<double>(given, base, "grad_clip", c.grad_clip);
    c.beta1 = Pick<double>(given, base, "beta1", c.beta1);
    c.beta2 = Pick<double>(given, base, "beta2", c.beta2);
    c.eps = Pick<double>(given, base, "eps", c.eps);
    c.seed = Pick<uint64_t>(given, base, "seed", c.seed);
    c.save_every = Pick<int64_t>(given, base, "save_every", c.save_every);
    c.keep_last = Pick<int>(given, base, "keep_last", c.keep_last);
    c.compress = Pick<std::string>(given, base, "compress", c.compress);
    c.corpus = Pick<std::string>(given, base, "corpus", c.corpus);
    c.sample_min = Pick<int>(given, base, "sample_min", c.sample_min);
    c.sample_max = Pick<int>(given, base, "sample_max", c.sample_max);
    c.comm = Pick<std::string>(given, base, "comm", c.comm);
    c.invariant = Pick<bool>(given, base, "invariant", c.invariant);
  } catch (const nlohmann::json::exception& e) {
    return ckpt::InvalidArgument(std::string("engine_config has a value of the wrong type: ") +
                                 e.what());
  }
  c.dp_world_size = world;

  if (!(c.dropout >= 0.0 && c.dropout < 1.0))
    return ckpt::InvalidArgument("--dropout must be in [0, 1)");
  if (c.zero_stage < 0 || c.zero_stage > 3)
    return ckpt::InvalidArgument("--zero must be 0, 1, 2 or 3");
  if (c.steps < 0) return ckpt::InvalidArgument("--steps must be >= 0");
  if (!(c.lr > 0) || !(c.min_lr >= 0) || c.min_lr > c.lr) {
    return ckpt::InvalidArgument("learning rates must satisfy 0 <= --min-lr <= --lr, --lr > 0");
  }
  if (c.warmup < 0) return ckpt::InvalidArgument("--warmup must be >= 0");
  if (c.lr_decay_steps < 0) return ckpt::InvalidArgument("--lr-decay-steps must be >= 0");
  if (!(c.weight_decay >= 0)) return ckpt::InvalidArgument("--weight-decay must be >= 0");
  if (!(c.grad_clip >= 0)) return ckpt::InvalidArgument("--grad-clip must be >= 0");
  if (!(c.beta1 >= 0 && c.beta1 < 1 && c.beta2 >= 0 && c.beta2 < 1 && c.eps > 0)) {
    return ckpt::InvalidArgument("AdamW needs 0 <= beta < 1 and eps > 0");
  }
  if (c.save_every < 0) return ckpt::InvalidArgument("--save-every must be >= 0");
  if (c.keep_last < 0) return ckpt::InvalidArgument("--keep-last must be >= 0");
  if (c.comm != "mpi" && c.comm != "nccl")
    return ckpt::InvalidArgument("--comm must be mpi or nccl");
  {
    auto parsed = ckpt::Compression::Parse(c.compress);
    if (!parsed.ok()) return parsed.status().WithContext("--compress");
  }

  // Batch settings.
  const bool have_m = given.contains("micro_batch");
  const bool have_a = given.contains("grad_accum");
  const bool have_g = given.contains("global_batch");
  const bool resumed = base.is_object() && base.contains("global_batch");
  int64_t m = have_m ? given["micro_batch"].get<int64_t>() : 0;
  int64_t a = have_a ? given["grad_accum"].get<int64_t>() : 0;
  int64_t g = have_g ? given["global_batch"].get<int64_t>() : 0;
  if ((have_m && m < 1) || (have_a && a < 1) || (have_g && g < 1)) {
    return ckpt::InvalidArgument("--micro-batch, --grad-accum and --global-batch must be >= 1");
  }
  auto mismatch = [&](int64_t gb) {
    return ckpt::InvalidArgument("inconsistent batch settings: global batch " + std::to_string(gb) +
                                 " != micro-batch " + std::to_string(m) + " x grad-accum " +
                                 std::to_string(a) + " x " + std::to_string(world) +
                                 " data-parallel ranks = " + std::to_string(m * a * world));
  };
  if (resumed) {
    const int64_t saved_g = base["global_batch"].get<int64_t>();
    if (have_g && g != saved_g) {
      return ckpt::InvalidArgument("--global-batch " + std::to_string(g) +
                                   " differs from the checkpoint's global batch " +
                                   std::to_string(saved_g) +
                                   "; a resumed run keeps its global batch (change "
                                   "--micro-batch or --grad-accum instead)");
    }
    g = saved_g;
    if (!have_m && !have_a) {
      m = base.value("micro_batch", int64_t{1});
      if (g % (m * world) != 0) m = 1;
    }
  } else if (!have_g) {
    if (!have_m) m = c.micro_batch;
    if (!have_a) a = c.grad_accum;
    g = m * a * world;
  }
  if (m == 0 && a == 0) m = c.micro_batch;
  if (m == 0) {
    if (g % (a * world) != 0) {
      return ckpt::InvalidArgument("global batch " + std::to_string(g) +
                                   " is not divisible by grad-accum " + std::to_string(a) + " x " +
                                   std::to_string(world) + " data-parallel ranks");
    }
    m = g / (a * world);
  }
  if (a == 0) {
    if (g % (m * world) != 0) {
      return ckpt::InvalidArgument("global batch " + std::to_string(g) +
                                   " is not divisible by micro-batch " + std::to_string(m) + " x " +
                                   std::to_string(world) + " data-parallel ranks");
    }
    a = g / (m * world);
  }
  if (m * a * world != g) return mismatch(g);
  c.micro_batch = m;
  c.grad_accum = a;
  c.global_batch = g;
  if (c.invariant) {
    // The counters of the dropout generator and the fixed-point bounds (exact_sum.h).
    if (g > (int64_t{1} << kFixedMaxTermsLog2)) {
      return ckpt::InvalidArgument("--invariant supports global batches of up to 2^20 samples");
    }
    if (c.steps >= (int64_t{1} << 32)) {
      return ckpt::InvalidArgument("--invariant supports up to 2^32 - 1 steps");
    }
    if (static_cast<int64_t>(c.sample_max) * c.shape.d_model / 4 >= (int64_t{1} << 32)) {
      return ckpt::InvalidArgument("--invariant: --sample-max x --d-model must stay below 2^34");
    }
  }
  return c;
}

}  // namespace engine_min
