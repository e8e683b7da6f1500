// Helpers for tests that run the arbor executable (ARBOR_BIN) as a subprocess.
#pragma once

#include <sys/wait.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

namespace arbor::cli_test {

struct CommandResult {
  int exit_code = -1;
  std::string out;  // stdout
  std::string err;  // stderr
};

inline std::string read_all(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

// A fresh directory under the test temp dir, removed by the caller if it wants.
inline std::string make_temp_dir(const std::string& name) {
  const char* base = std::getenv("TMPDIR");
  std::string templ = std::string(base ? base : "/tmp") + "/arbor_" + name + "_XXXXXX";
  char* dir = mkdtemp(templ.data());
  return dir ? std::string(dir) : std::string();
}

// Runs `ARBOR_BIN args` through the shell; stdout and stderr go to files in `dir`.
inline CommandResult run_arbor(const std::string& args, const std::string& dir) {
  const std::string out = dir + "/stdout.txt", err = dir + "/stderr.txt";
  const std::string cmd = std::string(ARBOR_BIN) + " " + args + " >" + out + " 2>" + err;
  const int status = std::system(cmd.c_str());
  CommandResult r;
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  r.out = read_all(out);
  r.err = read_all(err);
  return r;
}

}  // namespace arbor::cli_test
