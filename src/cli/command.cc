#include "cli/command.h"

#include <cstdio>

namespace arbor::cli {

namespace {
std::vector<CommandSetup>& registry() {
  static std::vector<CommandSetup> commands;
  return commands;
}
}  // namespace

bool register_command(CommandSetup setup) {
  registry().push_back(setup);
  return true;
}

const std::vector<CommandSetup>& registered_commands() { return registry(); }

void exit_on_error(const Status& status) {
  if (status.ok()) return;
  std::fprintf(stderr, "error: %s\n", status.message().c_str());
  const int code = status.code() == StatusCode::kInvalidArgument ? 2 : 1;
  throw CLI::RuntimeError(code);
}

}  // namespace arbor::cli
