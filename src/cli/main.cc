// arbor: one executable, many subcommands (see cli/command.h for how they register).
#include <CLI/CLI.hpp>
#include <cstdio>
#include <string>

#include "base/log.h"
#include "cli/command.h"

int main(int argc, char** argv) {
  CLI::App app{"arbor — LLM inference and serving engine"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "arbor 0.1.0");
  std::string level = "info";
  app.add_option("--log-level", level,
                 "Log level: debug, info, warn, error; may follow the subcommand")
      ->envname("ARBOR_LOG_LEVEL")
      ->capture_default_str();
  // Options a subcommand does not know go to the main app, so `arbor serve -m M --log-level
  // debug` works as well as `arbor --log-level debug serve -m M` (subcommands inherit this).
  app.fallthrough();
  app.parse_complete_callback([&level] {
    auto parsed = arbor::parse_log_level(level);
    if (!parsed.ok()) throw CLI::ValidationError("--log-level", parsed.status().message());
    arbor::set_log_level(*parsed);
  });
  for (auto setup : arbor::cli::registered_commands()) setup(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  return 0;
}
