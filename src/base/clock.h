// The steady clock in seconds: the time base of the engine's timestamps (a request's arrival,
// the end of each step: EngineMetricsSnapshot::last_step_time_s, StepSummary) that the server
// compares with the time now. Any thread.
#pragma once

#include <chrono>

namespace arbor {

inline double steady_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace arbor
