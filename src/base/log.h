// Levelled logging to stderr: "I 12:44:00.123 engine.cc:42] message".
//
//   ARBOR_LOG(kInfo) << "loaded " << n << " tensors";
//
// The level comes from set_log_level() (the CLI's --log-level) or the ARBOR_LOG_LEVEL
// environment variable (debug|info|warn|error); default info. Thread-safe: each message is
// written with a single write(2).
#pragma once

#include <sstream>
#include <string_view>

#include "base/status.h"

namespace arbor {

enum class LogLevel : int { kDebug = 0, kInfo = 1, kWarn = 2, kError = 3 };

void set_log_level(LogLevel level);
LogLevel log_level();
bool log_enabled(LogLevel level);
// Parses "debug", "info", "warn"/"warning", "error".
Result<LogLevel> parse_log_level(std::string_view name);

namespace internal {
class LogMessage {
 public:
  LogMessage(LogLevel level, const char* file, int line);
  ~LogMessage();
  std::ostream& stream() { return os_; }

 private:
  LogLevel level_;
  std::ostringstream os_;
};
}  // namespace internal

}  // namespace arbor

#define ARBOR_LOG(level)                                        \
  !::arbor::log_enabled(::arbor::LogLevel::level)               \
      ? (void)0                                                 \
      : ::arbor::internal::Voidify() &                          \
            ::arbor::internal::LogMessage(::arbor::LogLevel::level, __FILE__, __LINE__).stream()
