// Running a command (usually the arbor executable) as a child process and capturing its output.
#pragma once

#include <string>

namespace arbor::test {

struct CommandResult {
  int exit_code = -1;  // the exit status; -1 when killed by a signal or not run at all
  std::string out;     // stdout
  std::string err;     // stderr
  // Both streams, stdout first (for searching messages and printing on failure).
  std::string output() const { return out + err; }
};

// Runs `command` with /bin/sh -c and waits for it; stdout and stderr are captured separately
// (through files in a temp folder). The command may use redirections of its own.
CommandResult run_shell(const std::string& command);

// The arbor executable of this build.
std::string arbor_bin();

// run_shell(arbor_bin() + " " + args); `args` is shell text (quote what needs quoting).
CommandResult run_arbor(const std::string& args);

}  // namespace arbor::test
