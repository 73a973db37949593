// ckpt diff A B: tensor-by-tensor comparison of two checkpoints of any kind (ckpt/diff.h).
#include <cstdio>

#include "ckpt/diff.h"
#include "command.h"

namespace ckpt::cli {
namespace {

struct DiffArgs {
  std::string a, b;
  DiffOptions options;
  bool json = false;
};

std::function<int()> SetupDiff(CLI::App& sub) {
  auto a = std::make_shared<DiffArgs>();
  sub.add_option("A", a->a,
                 "first checkpoint: root at latest, tag directory, universal directory or "
                 "DeepSpeed checkpoint")
      ->required();
  sub.add_option("B", a->b, "second checkpoint (any of the same kinds)")->required();
  sub.add_option("--tag-a", a->options.tag_a, "tag inside A");
  sub.add_option("--tag-b", a->options.tag_b, "tag inside B");
  sub.add_option("--atol", a->options.atol, "absolute tolerance (default 0: bitwise)")
      ->check(CLI::NonNegativeNumber);
  sub.add_option("--rtol", a->options.rtol, "relative tolerance (default 0: bitwise)")
      ->check(CLI::NonNegativeNumber);
  sub.add_flag("--json", a->json, "machine-readable output");
  return [a] {
    a->options.progress = !a->json;
    auto r = DiffCheckpoints(a->a, a->b, a->options);
    if (!r.ok()) return ReportError("diff", r.status(), a->json);
    if (a->json)
      PrintJson(DiffReportToJson(*r));
    else
      std::fputs(DiffReportToText(*r, a->options.atol > 0 || a->options.rtol > 0).c_str(), stdout);
    return r->identical() ? 0 : 1;
  };
}

}  // namespace

CKPT_REGISTER_COMMAND(diff, "diff", "compare two checkpoints tensor by tensor (exit 1 if they differ)",
                      SetupDiff);

}  // namespace ckpt::cli
