// One-line diagnostics on stderr: "[meshtrain] 2024-01-01T12:00:00.123 INFO component: message".
// Kept deliberately tiny so that every layer can log without pulling in a framework; the level
// threshold comes from MESHTRAIN_LOG_LEVEL (debug, info, warn, error; default info).
#pragma once

#include <string_view>

#include "meshtrain/util/error.h"

namespace meshtrain {

enum class LogLevel { kDebug = 0, kInfo = 1, kWarn = 2, kError = 3 };

// Writes one line with a single write() so lines from threads and processes do not interleave.
void log(LogLevel level, std::string_view component, std::string_view msg);

bool log_enabled(LogLevel level);

}  // namespace meshtrain

#define MT_LOG_AT(level, component, ...)                                             \
  do {                                                                               \
    if (::meshtrain::log_enabled(level)) {                                           \
      ::meshtrain::log(level, component, ::meshtrain::detail::str_cat(__VA_ARGS__)); \
    }                                                                                \
  } while (0)

#define MT_LOG_DEBUG(component, ...) \
  MT_LOG_AT(::meshtrain::LogLevel::kDebug, component, __VA_ARGS__)
#define MT_LOG_INFO(component, ...) MT_LOG_AT(::meshtrain::LogLevel::kInfo, component, __VA_ARGS__)
#define MT_LOG_WARN(component, ...) MT_LOG_AT(::meshtrain::LogLevel::kWarn, component, __VA_ARGS__)
#define MT_LOG_ERROR(component, ...) \
  MT_LOG_AT(::meshtrain::LogLevel::kError, component, __VA_ARGS__)
