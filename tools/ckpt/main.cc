// ckpt: the command-line front end. Subcommands register themselves (command.h).
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <new>
#include <string_view>
#include <vector>

#include "ckpt/json.h"
#include "ckpt/reader.h"
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
  std::cerr << "ckpt" << (command.empty() ? "" : " ") << command << ": error: " << status.message()
            << "\n";
  if (json) {
    PrintJson({{"error",
                {{"code", std::string(StatusCodeName(status.code()))},
                 {"message", status.message()}}}});
  }
  return ExitCodeFor(status);
}

namespace {

// Levenshtein distance, for "did you mean".
size_t EditDistance(std::string_view a, std::string_view b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diag = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diag = up;
    }
  }
  return row[b.size()];
}

// The registered command closest to a mistyped one, or "" when none is close.
std::string ClosestCommand(std::string_view typed) {
  std::string best;
  size_t best_d = std::max<size_t>(2, typed.size() / 3) + 1;
  for (const CommandInfo& c : CommandRegistry()) {
    const size_t d = EditDistance(typed, c.name);
    const bool prefix = typed.size() >= 3 && c.name.rfind(typed, 0) == 0;
    if (prefix || d < best_d) {
      best = c.name;
      best_d = prefix ? 0 : d;
    }
  }
  return best;
}

}  // namespace

void PrintJson(const nlohmann::json& j) { std::cout << JsonText(j, 2) << std::endl; }

}  // namespace ckpt::cli

int main(int argc, char** argv) {
  using namespace ckpt::cli;
  ckpt::ServeHdf5Probe(argc, argv);  // HDF5 files read are walked by a probe process first
  ckpt::DisableHdf5ExitCleanup();  // a failed save exits with its error, not HDF5's crash
  ckpt::IgnoreFileSizeLimitSignal();  // past `ulimit -f`: EFBIG and a message, not SIGXFSZ
  CLI::App app{"ckpt: atomic, verifiable checkpoints for sharded (ZeRO) training"};
  app.require_subcommand(1);
  app.set_version_flag("--version", std::string("ckpt 0.1.0"));
  bool follow_symlinks = false;
  app.add_flag("--follow-symlinks", follow_symlinks,
               "Read tag directories that are symbolic links (as CKPT_FOLLOW_SYMLINKS=1); "
               "files inside a tag are never followed through links");
  auto& registry = CommandRegistry();
  std::sort(registry.begin(), registry.end(),
            [](const CommandInfo& a, const CommandInfo& b) { return a.name < b.name; });
  std::vector<std::pair<CLI::App*, std::function<int()>>> runners;
  for (auto& info : registry) {
    CLI::App* sub = app.add_subcommand(info.name, info.description);
    runners.emplace_back(sub, info.setup(*sub));
  }
  // `ckpt help [COMMAND]`: the command's --help (before parsing: its required arguments are
  // not given).
  if (argc >= 2 && std::string_view(argv[1]) == "help") {
    if (argc == 2) {
      std::cout << app.help();
      return 0;
    }
    for (auto& [sub, run] : runners) {
      if (sub->get_name() == argv[2]) {
        std::cout << sub->help();
        return 0;
      }
    }
  }
  const bool json = std::any_of(argv + 1, argv + argc,
                                [](const char* a) { return std::string_view(a) == "--json"; });
  if (argc >= 2 && argv[1][0] != '-') {
    const std::string_view typed =
        argv[1] == std::string_view("help") && argc > 2 ? argv[2] : argv[1];
    const bool known = std::any_of(registry.begin(), registry.end(),
                                   [&](const CommandInfo& c) { return c.name == typed; });
    if (!known) {
      const std::string close = ClosestCommand(typed);
      const std::string hint = close.empty() ? "" : "; did you mean '" + close + "'?";
      return ReportError("",
                         ckpt::InvalidArgument("unknown command '" + std::string(typed) + "'" +
                                               hint + " (ckpt --help lists the commands)"),
                         json);
    }
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() != 0 && json) {
      // The --json contract holds for usage errors too: {"error": ...} on stdout.
      const CLI::App* failed = &app;
      for (auto& [sub, run] : runners) {
        if (sub->parsed()) failed = sub;
      }
      return ReportError(failed == &app ? "" : failed->get_name(),
                         ckpt::InvalidArgument(e.what()), true);
    }
    int rc = app.exit(e);
    // CLI11 returns 0 for --help/--version; every usage error is exit 2.
    return rc == 0 ? 0 : 2;
  }
  // Through the environment, so worker processes (next-update --workers) inherit it.
  if (follow_symlinks) ::setenv("CKPT_FOLLOW_SYMLINKS", "1", 1);
  for (auto& [sub, run] : runners) {
    if (sub->parsed()) {
      try {
        return run();
      } catch (const std::bad_alloc&) {
        // Unwinding removed any staging directory; nothing was committed.
        std::cerr << "ckpt " << sub->get_name() << ": error: " << ckpt::OutOfMemoryText()
                  << "; nothing was committed\n";
        return 2;
      } catch (const std::exception& e) {
        std::cerr << "ckpt " << sub->get_name() << ": internal error: " << e.what() << "\n";
        return 2;
      }
    }
  }
  return 2;
}
