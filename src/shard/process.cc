#include "shard/process.h"

#include <signal.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <thread>

namespace arbor::shard {

std::string signal_name(int signal) {
  const char* abbrev = sigabbrev_np(signal);
  return abbrev != nullptr ? str_cat("SIG", abbrev) : str_cat("signal ", signal);
}

std::string ChildExit::describe() const {
  if (signal != 0) return str_cat("killed by signal ", signal, " (", signal_name(signal), ")");
  return str_cat("exited with status ", code);
}

namespace {

ChildExit exit_of(int status) {
  ChildExit e;
  if (WIFSIGNALED(status)) e.signal = WTERMSIG(status);
  if (WIFEXITED(status)) e.code = WEXITSTATUS(status);
  return e;
}

}  // namespace

Result<ChildProcess> ChildProcess::spawn(const std::vector<std::string>& argv) {
  if (argv.empty()) return invalid_argument("spawn: empty command line");
  // Everything the child needs is prepared before fork: after it, only async-signal-safe calls.
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid < 0) return io_error("fork: ", std::strerror(errno));
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(127);  // the parent died before prctl
    // The parent's descriptors (its listening sockets, gRPC's) stay with the parent.
    if (syscall(SYS_close_range, 3U, ~0U, 0U) != 0) {
      for (int fd = 3; fd < 4096; ++fd) close(fd);
    }
    execv(args[0], args.data());
    _exit(127);
  }
  ChildProcess c;
  c.pid_ = pid;
  return c;
}

ChildProcess::ChildProcess(ChildProcess&& other) noexcept : pid_(other.pid_) { other.pid_ = -1; }

ChildProcess& ChildProcess::operator=(ChildProcess&& other) noexcept {
  if (this != &other) {
    if (running()) kill_and_reap();
    pid_ = other.pid_;
    other.pid_ = -1;
  }
  return *this;
}

ChildProcess::~ChildProcess() {
  if (running()) kill_and_reap();
}

std::optional<ChildExit> ChildProcess::poll() {
  if (!running()) return std::nullopt;
  int status = 0;
  const pid_t r = waitpid(pid_, &status, WNOHANG);
  if (r != pid_) return std::nullopt;
  pid_ = -1;
  return exit_of(status);
}

std::optional<ChildExit> ChildProcess::wait_for(double timeout_s) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  while (true) {
    if (std::optional<ChildExit> e = poll()) return e;
    if (!running() || std::chrono::steady_clock::now() >= until) return std::nullopt;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
}

ChildExit ChildProcess::kill_and_reap() {
  if (!running()) return ChildExit{};
  ::kill(pid_, SIGKILL);
  int status = 0;
  while (waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
  }
  pid_ = -1;
  return exit_of(status);
}

}  // namespace arbor::shard
