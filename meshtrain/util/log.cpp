// See log.h. The threshold is read once; writes go straight to fd 2 so that a line survives a
// crash that follows it and is never split by another thread's output.
#include "meshtrain/util/log.h"

#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <string>

#include "meshtrain/util/env_registry.h"

namespace meshtrain {
namespace {

LogLevel threshold_from_env() {
  const auto v = env_value(Env::log_level);
  if (!v) return LogLevel::kInfo;
  const std::string& s = *v;
  if (s == "debug") return LogLevel::kDebug;
  if (s == "warn" || s == "warning") return LogLevel::kWarn;
  if (s == "error") return LogLevel::kError;
  // Logging cannot stop the program it serves: one line, and the default.
  if (s != "info") {
    std::string line = "meshtrain: warning: MESHTRAIN_LOG_LEVEL='";
    line += s;
    line += "' is not debug, info, warn or error; logging at info\n";
    [[maybe_unused]] ssize_t n = ::write(STDERR_FILENO, line.data(), line.size());
  }
  return LogLevel::kInfo;
}

const char* level_name(LogLevel level) {
  switch (level) {
    case LogLevel::kDebug:
      return "DEBUG";
    case LogLevel::kInfo:
      return "INFO";
    case LogLevel::kWarn:
      return "WARN";
    case LogLevel::kError:
      return "ERROR";
  }
  return "?";
}

}  // namespace

bool log_enabled(LogLevel level) {
  static const LogLevel threshold = threshold_from_env();
  return level >= threshold;
}

void log(LogLevel level, std::string_view component, std::string_view msg) {
  using namespace std::chrono;
  auto now = system_clock::now();
  std::time_t secs = system_clock::to_time_t(now);
  auto millis = duration_cast<milliseconds>(now.time_since_epoch()).count() % 1000;
  std::tm tm{};
  localtime_r(&secs, &tm);
  char stamp[96];
  std::snprintf(stamp, sizeof(stamp), "%04d-%02d-%02dT%02d:%02d:%02d.%03d", tm.tm_year + 1900,
                tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec,
                static_cast<int>(millis));
  std::string line;
  line.reserve(msg.size() + component.size() + 64);
  line.append("[meshtrain] ").append(stamp).append(" ").append(level_name(level)).append(" ");
  line.append(component).append(": ").append(msg).append("\n");
  const char* p = line.data();
  size_t left = line.size();
  while (left > 0) {
    ssize_t n = ::write(STDERR_FILENO, p, left);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;  // Nowhere left to report a failing stderr.
    p += n;
    left -= static_cast<size_t>(n);
  }
}

}  // namespace meshtrain
