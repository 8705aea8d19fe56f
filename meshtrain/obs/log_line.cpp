// See log_line.h.
#include "meshtrain/obs/log_line.h"

#include <chrono>
#include <cstdio>
#include <ctime>

#include "meshtrain/util/error.h"

namespace meshtrain::obs {

namespace {

// Local time with milliseconds, ISO 8601, the same stamp the library's diagnostics use.
std::string now_stamp() {
  using namespace std::chrono;
  const auto now = system_clock::now();
  const std::time_t secs = system_clock::to_time_t(now);
  const auto millis = duration_cast<milliseconds>(now.time_since_epoch()).count() % 1000;
  std::tm tm{};
  localtime_r(&secs, &tm);
  char stamp[96];
  std::snprintf(stamp, sizeof(stamp), "%04d-%02d-%02dT%02d:%02d:%02d.%03d", tm.tm_year + 1900,
                tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec,
                static_cast<int>(millis));
  return stamp;
}

}  // namespace

LogFormat parse_log_format(std::string_view name) {
  if (name == "text") return LogFormat::kText;
  if (name == "json") return LogFormat::kJson;
  MT_THROW(ValueError, "log format must be text or json, got '", name, "'");
}

std::string format_log_line(LogFormat format, int rank, int64_t step, std::string_view msg,
                            const nlohmann::json& fields) {
  if (format == LogFormat::kJson) {
    // Ordered: time, rank, step and msg lead every line, whatever the fields.
    nlohmann::ordered_json j{{"time", now_stamp()}, {"rank", rank}};
    if (step >= 0) j["step"] = step;
    j["msg"] = std::string(msg);
    if (fields.is_object())
      for (const auto& [k, v] : fields.items())
        if (!j.contains(k)) j[k] = v;
    // Replace invalid UTF-8 (a sampled byte sequence) rather than fail the line.
    return j.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
  }
  std::string line = now_stamp() + " rank " + std::to_string(rank);
  if (step >= 0) line += " step " + std::to_string(step);
  line += " | ";
  line.append(msg);
  return line;
}

}  // namespace meshtrain::obs
