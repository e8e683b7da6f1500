// A child process this process started (a launched shard): spawn, poll, kill, reap. Every child
// is reaped (waitpid) by the object that owns it, so no zombie outlives it.
//
// Threading: one owner thread at a time.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "base/status.h"

namespace arbor::shard {

// How a child ended.
struct ChildExit {
  int code = 0;     // exit status when signal == 0
  int signal = 0;   // the terminating signal, or 0
  // "killed by signal 9 (SIGKILL)" or "exited with status 1".
  std::string describe() const;
};

// "SIGKILL" for 9, "signal 42" for an unnamed one.
std::string signal_name(int signal);

class ChildProcess {
 public:
  ChildProcess() = default;
  // fork + execv of argv[0] with argv. The child gets SIGKILL when the thread that spawned it
  // ends (PR_SET_PDEATHSIG), so a crashed parent leaves no shard behind. Errors: kIoError.
  static Result<ChildProcess> spawn(const std::vector<std::string>& argv);
  ChildProcess(ChildProcess&& other) noexcept;
  ChildProcess& operator=(ChildProcess&& other) noexcept;
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;
  // Kills and reaps a running child.
  ~ChildProcess();

  int pid() const { return pid_; }
  bool running() const { return pid_ > 0; }
  // Reaps the child if it has ended (never blocks); nullopt while it runs (or when none).
  std::optional<ChildExit> poll();
  // Waits up to timeout_s for the child to end and reaps it; nullopt if it still runs.
  std::optional<ChildExit> wait_for(double timeout_s);
  // SIGKILL (which also ends a stopped process) and reap; waits for it.
  ChildExit kill_and_reap();

 private:
  int pid_ = -1;
};

}  // namespace arbor::shard
