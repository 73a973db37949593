// ckpt: the command-line front end. Subcommands register themselves (command.h).
#include <algorithm>
#include <cstdio>
#include <iostream>

#include "ckpt/writer.h"
#include "command.h"

namespace ckpt::cli {

std::vector<CommandInfo>& CommandRegistry() {
  static std::vector<CommandInfo> registry;
  return registry;
}

bool RegisterCommand(std::string name, std::string description, CommandSetup setup) {
  CommandRegistry().push_back({std::move(name), std::move(description), std::move(setup)});
  return true;
}

int ReportError(std::string_view command, const Status& status, bool json) {
  std::cerr << "ckpt " << command << ": error: " << status.message() << "\n";
  if (json) {
    PrintJson({{"error",
                {{"code", std::string(StatusCodeName(status.code()))},
                 {"message", status.message()}}}});
  }
  return ExitCodeFor(status);
}

void PrintJson(const nlohmann::json& j) { std::cout << j.dump(2) << std::endl; }

}  // namespace ckpt::cli

int main(int argc, char** argv) {
  using namespace ckpt::cli;
  ckpt::DisableHdf5ExitCleanup();  // a failed save exits with its error, not HDF5's crash
  CLI::App app{"ckpt: atomic, verifiable checkpoints for sharded (ZeRO) training"};
  app.require_subcommand(1);
  app.set_version_flag("--version", std::string("ckpt 0.1.0"));
  auto& registry = CommandRegistry();
  std::sort(registry.begin(), registry.end(),
            [](const CommandInfo& a, const CommandInfo& b) { return a.name < b.name; });
  std::vector<std::pair<CLI::App*, std::function<int()>>> runners;
  for (auto& info : registry) {
    CLI::App* sub = app.add_subcommand(info.name, info.description);
    runners.emplace_back(sub, info.setup(*sub));
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    int rc = app.exit(e);
    // CLI11 returns 0 for --help/--version; every usage error is exit 2.
    return rc == 0 ? 0 : 2;
  }
  for (auto& [sub, run] : runners) {
    if (sub->parsed()) {
      try {
        return run();
      } catch (const std::exception& e) {
        std::cerr << "ckpt " << sub->get_name() << ": internal error: " << e.what() << "\n";
        return 2;
      }
    }
  }
  return 2;
}
