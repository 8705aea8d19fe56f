// The shape of the trainer's log lines: by default a human line that starts with the time, the
// rank and the step; with train.log_format = "json", one JSON object per line (time, rank, step,
// msg and any structured fields) for log collectors.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

namespace meshtrain::obs {

enum class LogFormat { kText, kJson };

// "text" or "json"; anything else is a ValueError.
LogFormat parse_log_format(std::string_view name);

// step < 0 = not inside a step. `fields` (an object, may be null) is merged into a JSON line and
// ignored by a text line. No trailing newline.
std::string format_log_line(LogFormat format, int rank, int64_t step, std::string_view msg,
                            const nlohmann::json& fields = nullptr);

}  // namespace meshtrain::obs
