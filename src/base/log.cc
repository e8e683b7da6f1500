#include "base/log.h"

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <ctime>

namespace arbor {
namespace {

LogLevel initial_level() {
  const char* env = std::getenv("ARBOR_LOG_LEVEL");
  if (env != nullptr) {
    auto parsed = parse_log_level(env);
    if (parsed.ok()) return *parsed;
  }
  return LogLevel::kInfo;
}

std::atomic<int>& level_storage() {
  static std::atomic<int> level{static_cast<int>(initial_level())};
  return level;
}

char level_letter(LogLevel level) {
  switch (level) {
    case LogLevel::kDebug: return 'D';
    case LogLevel::kInfo: return 'I';
    case LogLevel::kWarn: return 'W';
    case LogLevel::kError: return 'E';
  }
  return '?';
}

}  // namespace

void set_log_level(LogLevel level) { level_storage().store(static_cast<int>(level)); }
LogLevel log_level() { return static_cast<LogLevel>(level_storage().load()); }
bool log_enabled(LogLevel level) {
  return static_cast<int>(level) >= level_storage().load(std::memory_order_relaxed);
}

Result<LogLevel> parse_log_level(std::string_view name) {
  if (name == "debug") return LogLevel::kDebug;
  if (name == "info") return LogLevel::kInfo;
  if (name == "warn" || name == "warning") return LogLevel::kWarn;
  if (name == "error") return LogLevel::kError;
  return invalid_argument("unknown log level '", name, "' (expected debug, info, warn or error)");
}

namespace internal {

LogMessage::LogMessage(LogLevel level, const char* file, int line) : level_(level) {
  const auto now = std::chrono::system_clock::now();
  const std::time_t t = std::chrono::system_clock::to_time_t(now);
  const auto ms =
      std::chrono::duration_cast<std::chrono::milliseconds>(now.time_since_epoch()).count() % 1000;
  std::tm tm{};
  localtime_r(&t, &tm);
  char stamp[32];
  std::snprintf(stamp, sizeof stamp, "%02d:%02d:%02d.%03d", tm.tm_hour, tm.tm_min, tm.tm_sec,
                static_cast<int>(ms));
  const char* base = std::strrchr(file, '/');
  os_ << level_letter(level) << ' ' << stamp << ' ' << (base ? base + 1 : file) << ':' << line
      << "] ";
}

LogMessage::~LogMessage() {
  os_ << '\n';
  const std::string msg = os_.str();
  ssize_t ignored = ::write(STDERR_FILENO, msg.data(), msg.size());
  (void)ignored;
}

}  // namespace internal
}  // namespace arbor
