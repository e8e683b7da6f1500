// Subcommand registry for the single `arbor` executable.
//
// Each subcommand lives in its own src/cli/cmd_<name>.cc and registers itself at static
// initialisation time:
//
//   namespace {
//   void setup(CLI::App& app) {
//     auto* sub = app.add_subcommand("gguf-info", "Print a GGUF file's metadata and tensors");
//     auto opts = std::make_shared<Options>();
//     sub->add_option("file", opts->path, "GGUF file")->required();
//     sub->callback([opts] { arbor::cli::exit_on_error(run(*opts)); });
//   }
//   ARBOR_REGISTER_COMMAND(setup);
//   }  // namespace
//
// The cmd_*.cc files are compiled straight into the executable (not a library), so the
// registrations are never dropped by the linker.
#pragma once

#include <CLI/CLI.hpp>
#include <functional>
#include <vector>

#include "base/status.h"

namespace arbor::cli {

using CommandSetup = void (*)(CLI::App& app);

// Adds a setup function; returns true so it can initialise a static.
bool register_command(CommandSetup setup);
const std::vector<CommandSetup>& registered_commands();

// Prints "error: <message>" to stderr and ends the command with exit code 1 (or 2 for bad
// arguments) if `status` is an error; does nothing otherwise.
void exit_on_error(const Status& status);

}  // namespace arbor::cli

#define ARBOR_REGISTER_COMMAND(fn) \
  static const bool ARBOR_CONCAT_(arbor_command_registered_, __LINE__) = \
      ::arbor::cli::register_command(fn)
