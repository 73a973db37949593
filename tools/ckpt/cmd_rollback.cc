// `ckpt rollback ROOT --to TAG`: the deliberate way to make an older tag the latest
// (docs/format.md, "Commit point"); ckpt/root.h RollbackLatest does the work.
#include <cstdio>
#include <memory>

#include "ckpt/root.h"
#include "command.h"

namespace ckpt::cli {

namespace {

struct RollbackArgs {
  std::string root;
  std::string to;
  bool json = false;
};

std::function<int()> SetupRollback(CLI::App& sub) {
  auto a = std::make_shared<RollbackArgs>();
  sub.add_option("ROOT", a->root, "checkpoint root")->required();
  sub.add_option("--to", a->to, "committed tag to make the latest")->required();
  sub.add_flag("--json", a->json, "machine-readable output");
  return [a] {
    auto report = RollbackLatest(a->root, a->to);
    if (!report.ok()) return ReportError("rollback", report.status(), a->json);
    if (a->json) {
      PrintJson({{"latest", report->tag}, {"moved_aside", report->moved}});
    } else {
      std::printf("latest -> %s (recorded in %s/rollback.log)\n", report->tag.c_str(),
                  a->root.c_str());
      for (const auto& m : report->moved) std::printf("moved aside %s\n", m.c_str());
    }
    return 0;
  };
}

}  // namespace

CKPT_REGISTER_COMMAND(rollback, "rollback",
                      "make an older committed tag the latest, moving newer tags aside "
                      "(recorded in ROOT/rollback.log)",
                      SetupRollback);

}  // namespace ckpt::cli
