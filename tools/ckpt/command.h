// The `ckpt` CLI is a set of self-registering subcommands: each cmd_*.cc file registers its
// own with CKPT_REGISTER_COMMAND, so components add commands without touching main.cc.
//
// Exit codes (a contract): 0 ok, 1 a check found a difference or corruption, 2 could not run
// (usage, missing or unreadable input).
#pragma once

#include <functional>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "ckpt/status.h"

namespace ckpt::cli {

// Called once with the subcommand's CLI::App to add options; returns the function that runs
// the command after parsing and returns its exit code.
using CommandSetup = std::function<std::function<int()>(CLI::App& sub)>;

struct CommandInfo {
  std::string name;
  std::string description;
  CommandSetup setup;
};

std::vector<CommandInfo>& CommandRegistry();
bool RegisterCommand(std::string name, std::string description, CommandSetup setup);

// Prints "ckpt <command>: error: <status message>" on stderr (and, with json, a
// {"error": {"code", "message"}} object on stdout); returns ExitCodeFor(status).
int ReportError(std::string_view command, const Status& status, bool json);
// Pretty-prints j on stdout followed by a newline.
void PrintJson(const nlohmann::json& j);

}  // namespace ckpt::cli

#define CKPT_REGISTER_COMMAND(ident, name, description, setup) \
  static const bool ckpt_cmd_registered_##ident =               \
      ::ckpt::cli::RegisterCommand(name, description, setup)
