#include "support/subprocess.h"

#include <sys/wait.h>

#include <cstdlib>

#include "support/temp_dir.h"

namespace arbor::test {

CommandResult run_shell(const std::string& command) {
  TempDir dir("cmd");
  const std::string out = dir / "stdout", err = dir / "stderr";
  // A subshell, so the command's own redirections and `;` apply inside it.
  const std::string cmd = "( " + command + "\n) >'" + out + "' 2>'" + err + "'";
  const int status = std::system(cmd.c_str());
  CommandResult r;
  r.exit_code = status != -1 && WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  r.out = read_file(out);
  r.err = read_file(err);
  return r;
}

std::string arbor_bin() { return ARBOR_BIN; }

CommandResult run_arbor(const std::string& args) { return run_shell(arbor_bin() + " " + args); }

}  // namespace arbor::test
