// ckpt next-update | verify-resume | verify: the resume verifier (verify/, docs/verify.md).
// Exit codes: 0 ok; 1 a check found a difference (resume diverged, replay does not match the
// original run, corruption); 2 could not run (usage, missing input, gradient file that does not
// match the checkpoint, engine_min failed).
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <iostream>

#include "ckpt/units.h"
#include "command.h"
#include "verify/ci.h"
#include "verify/next_update.h"
#include "verify/resume.h"
#include "verify/update_pass.h"

namespace ckpt::cli {
namespace {

using namespace ckpt::verify;

std::function<int()> SetupNextUpdate(CLI::App& sub) {
  struct Args {
    NextUpdateOptions o;
    std::string device = "auto";
    bool json = false;
    std::string bench_bytes;
    int bench_reps = 5;
  };
  auto a = std::make_shared<Args>();
  sub.add_option("ROOT", a->o.root, "checkpoint root or tag directory");
  sub.add_option("--tag", a->o.tag, "tag to load (default: latest)");
  sub.add_option("--grad", a->o.grad_file,
                 "next gradient: full-shape fp32 tensors named by trainable parameter "
                 "(default: engine_min grad at the saved data position)");
  sub.add_option("--device", a->device, "auto|cpu|cuda")
      ->check(CLI::IsMember({"auto", "cpu", "cuda"}));
  sub.add_option("--out", a->o.out_dir,
                 "write full_state/weights_only/moments_dropped.safetensors here");
  sub.add_option("--reference", a->o.reference, "original run log (default ROOT/trainlog.jsonl)");
  sub.add_option("--gpus", a->o.gpus,
                 "CUDA: split the pass over this many GPUs, one process each, statistics "
                 "combined with NCCL (default: every visible GPU)")
      ->check(CLI::Range(1, 1024));
  sub.add_option("--procs", a->o.procs, "CPU: split the pass over this many processes (default 1)")
      ->check(CLI::Range(1, 1024));
  sub.add_flag("--json", a->json, "machine-readable report");
  sub.add_option("--bench-bytes", a->bench_bytes,
                 "measure the pass against memcpy over this many input bytes, e.g. 256MiB "
                 "(no checkpoint)");
  sub.add_option("--bench-reps", a->bench_reps, "repetitions for --bench-bytes (best is kept)");
  return [a]() -> int {
    auto device = ParseDevice(a->device);
    if (!device.ok()) return ReportError("next-update", device.status(), a->json);
    a->o.device = *device;
    if (!a->bench_bytes.empty()) {
      auto bytes = ParseByteSize(a->bench_bytes);
      if (!bytes.ok()) return ReportError("next-update", bytes.status(), a->json);
      auto b = BenchUpdatePass(a->o.device, *bytes, a->bench_reps);
      if (!b.ok()) return ReportError("next-update", b.status(), a->json);
      const double pass_gbs = b->pass_bytes_moved / b->pass_seconds / 1e9;
      const double copy_gbs = 2.0 * b->memcpy_bytes / b->memcpy_seconds / 1e9;
      if (a->json) {
        PrintJson({{"device", std::string(DeviceName(b->device))},
                   {"elements", b->elements},
                   {"input_bytes", b->memcpy_bytes},
                   {"pass_bytes_moved", b->pass_bytes_moved},
                   {"pass_seconds", b->pass_seconds},
                   {"memcpy_seconds", b->memcpy_seconds},
                   {"pass_gb_per_s", pass_gbs},
                   {"memcpy_gb_per_s", copy_gbs},
                   {"ratio", b->ratio()},
                   {"outputs_written", b->outputs},
                   {"streaming_stores", b->streaming_stores},
                   {"stream_threshold_bytes", b->stream_threshold_bytes},
                   {"measures",
                    "UpdatePass::Run over one tensor writing all five output arrays (as with "
                    "--out) against memcpy of its w, m, v, g bytes"},
                   {"timing", b->device == Device::kCpu ? "thread CPU time, best of reps"
                                                        : "CUDA events, best of reps"}});
      } else {
        std::printf("next-update pass on %s, %llu elements (%.1f MiB of w, m, v, g)\n",
                    std::string(DeviceName(b->device)).c_str(),
                    static_cast<unsigned long long>(b->elements), b->memcpy_bytes / 1048576.0);
        std::printf("  pass   %.3f ms  (%.2f GB/s read+written)\n", b->pass_seconds * 1e3,
                    pass_gbs);
        std::printf("  memcpy %.3f ms  (%.2f GB/s read+written)\n", b->memcpy_seconds * 1e3,
                    copy_gbs);
        if (b->device == Device::kCpu) {
          std::printf("  outputs: %d arrays, %s stores (streaming above %.1f MiB of outputs)\n",
                      b->outputs, b->streaming_stores ? "streaming" : "plain",
                      b->stream_threshold_bytes / 1048576.0);
        }
        std::printf("  ratio memcpy/pass time: %.2fx (%s, best of %d)\n", b->ratio(),
                    b->device == Device::kCpu ? "thread CPU time" : "CUDA events",
                    std::max(a->bench_reps, 1));
      }
      return 0;
    }
    if (a->o.root.empty()) {
      return ReportError("next-update", InvalidArgument("a checkpoint ROOT is required"), a->json);
    }
    auto r = RunNextUpdate(a->o);
    if (!r.ok()) return ReportError("next-update", r.status(), a->json);
    if (a->json) {
      PrintJson(NextUpdateToJson(*r));
    } else {
      std::cout << NextUpdateToText(*r);
    }
    return r->matches_reference.has_value() && !*r->matches_reference ? 1 : 0;
  };
}

std::function<int()> SetupVerifyResume(CLI::App& sub) {
  struct Args {
    ResumeOptions o;
    std::string ablate = "none";
    bool json = false;
  };
  auto a = std::make_shared<Args>();
  sub.add_option("ROOT", a->o.root, "checkpoint root or tag directory")->required();
  sub.add_option("--steps", a->o.steps, "optimizer steps to run after the checkpoint")->required();
  sub.add_option("--tag", a->o.tag,
                 "tag to resume (default: the newest tag the run log continues for --steps "
                 "steps)");
  sub.add_option("--reference", a->o.reference, "original run log (default ROOT/trainlog.jsonl)");
  sub.add_option("--ablate", a->ablate,
                 "none|moments|step|rng|data|scheduler|all (or a comma list): also resume with "
                 "that component reset to its fresh-start value");
  sub.add_option("--scratch", a->o.scratch, "directory for the resumed runs (kept)");
  sub.add_option("--dp", a->o.dp,
                 "resume on M ranks: the checkpoint goes through to-universal + reshard --dp M "
                 "first (default: the checkpoint's own world size, no conversion)");
  sub.add_option("--launch", a->o.launch,
                 "relaunch your trainer instead of engine_min: a shell command template with "
                 "{world} {root} {tag} {until} [{trainlog}] [{extra}] (docs/verify.md)");
  sub.add_flag("--keep-scratch", a->o.keep_scratch, "keep the temporary scratch directory");
  sub.add_flag("--json", a->json, "machine-readable report");
  return [a]() -> int {
    auto ablate = ParseAblate(a->ablate);
    if (!ablate.ok()) return ReportError("verify-resume", ablate.status(), a->json);
    a->o.ablate = *ablate;
    auto r = RunVerifyResume(a->o);
    if (!r.ok()) return ReportError("verify-resume", r.status(), a->json);
    if (a->json) {
      PrintJson(ResumeToJson(*r));
    } else {
      std::cout << ResumeToText(*r);
    }
    return r->bitwise() ? 0 : 1;
  };
}

std::function<int()> SetupVerify(CLI::App& sub) {
  struct Args {
    CiOptions o;
    std::string device = "auto";
    std::string junit;
    bool json = false;
  };
  auto a = std::make_shared<Args>();
  sub.add_option("ROOT", a->o.root, "checkpoint root or tag directory")->required();
  sub.add_option("--tag", a->o.tag,
                 "tag to verify (default: the newest tag the run log continues past)");
  sub.add_option("--junit", a->junit, "also write a JUnit XML report here");
  sub.add_option("--grad", a->o.grad_file, "next-update gradient for non-engine checkpoints");
  sub.add_option("--reference", a->o.reference, "original run log (default ROOT/trainlog.jsonl)");
  sub.add_option("--launch", a->o.launch,
                 "resume parity through your trainer (the template of verify-resume --launch)");
  sub.add_option("--device", a->device, "auto|cpu|cuda")
      ->check(CLI::IsMember({"auto", "cpu", "cuda"}));
  sub.add_flag("--json", a->json, "machine-readable report");
  return [a]() -> int {
    auto device = ParseDevice(a->device);
    if (!device.ok()) return ReportError("verify", device.status(), a->json);
    a->o.device = *device;
    CiReport r = RunCiVerify(a->o);
    if (!a->junit.empty()) {
      std::ofstream f(a->junit);
      f << CiToJUnit(r);
      if (!f) return ReportError("verify", IOError("cannot write " + a->junit), a->json);
    }
    const int rc = r.ExitCode();
    if (a->json) {
      nlohmann::json cases = nlohmann::json::array();
      for (const CiCase& c : r.cases) {
        const char* outcome = c.outcome == CiCase::Outcome::kPassed    ? "passed"
                              : c.outcome == CiCase::Outcome::kFailed  ? "failed"
                              : c.outcome == CiCase::Outcome::kSkipped ? "skipped"
                                                                       : "error";
        cases.push_back({{"name", c.name},
                         {"outcome", outcome},
                         {"message", c.message},
                         {"seconds", c.seconds}});
      }
      nlohmann::json j = {
          {"checkpoint", r.target}, {"ok", rc == 0}, {"exit_code", rc}, {"cases", cases}};
      if (!r.tag_note.empty()) j["tag_note"] = r.tag_note;
      PrintJson(j);
    } else {
      std::cout << CiToText(r);
      for (const CiCase& c : r.cases) {
        if (c.outcome == CiCase::Outcome::kFailed && !c.details.empty())
          std::cout << "\n" << c.details;
      }
    }
    return rc;
  };
}

}  // namespace

CKPT_REGISTER_COMMAND(next_update, "next-update",
                      "replay the next AdamW update: full state vs weights-only vs moments dropped",
                      SetupNextUpdate);
CKPT_REGISTER_COMMAND(verify_resume, "verify-resume",
                      "resume engine_min from a checkpoint and compare it step by step with the "
                      "original run (with ablations)",
                      SetupVerifyResume);
CKPT_REGISTER_COMMAND(verify, "verify",
                      "CI check: deep integrity, one-step resume parity, next-update summary",
                      SetupVerify);

}  // namespace ckpt::cli
