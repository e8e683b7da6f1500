// A progress bar on stderr for long work (loading, converting, quantising, synthesising,
// benchmarking). Draws only when stderr is a terminal, at most ~10 times a second; otherwise
// (a script, a log file) it logs a line at info level every `log_every` (done/total, per cent,
// seconds) and one summary line at finish().
// Not thread-safe: update it from one thread.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

namespace arbor {

class ProgressBar {
 public:
  // `unit` names what is counted ("tensors", "MB", "tokens").
  ProgressBar(std::string label, uint64_t total, std::string unit = "",
              std::chrono::milliseconds log_every = std::chrono::seconds(30));
  ~ProgressBar();

  void set(uint64_t done);
  void add(uint64_t delta) { set(done_ + delta); }
  void finish();

 private:
  void draw(bool final);

  std::string label_;
  uint64_t total_;
  std::string unit_;
  uint64_t done_ = 0;
  bool tty_;
  std::chrono::milliseconds log_every_;
  bool finished_ = false;
  std::chrono::steady_clock::time_point start_;
  std::chrono::steady_clock::time_point last_draw_;
};

}  // namespace arbor
