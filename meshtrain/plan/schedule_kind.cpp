#include "meshtrain/plan/schedule_kind.h"

#include "meshtrain/util/error.h"

namespace meshtrain::plan {

ScheduleKind parse_schedule_kind(std::string_view name) {
  if (name == "gpipe") return ScheduleKind::gpipe;
  if (name == "1f1b") return ScheduleKind::one_f_one_b;
  if (name == "interleaved") return ScheduleKind::interleaved;
  MT_THROW(ValueError, "parallel.schedule = \"", name,
           "\" is not a pipeline schedule; use gpipe, 1f1b or interleaved");
}

std::string_view schedule_kind_name(ScheduleKind kind) {
  switch (kind) {
    case ScheduleKind::gpipe:
      return "gpipe";
    case ScheduleKind::one_f_one_b:
      return "1f1b";
    case ScheduleKind::interleaved:
      return "interleaved";
  }
  return "?";
}

}  // namespace meshtrain::plan
