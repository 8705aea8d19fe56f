// The pipeline schedules, named once: the planner's memory and time models reason about them and
// the pipeline runs them (parallel/pipeline/schedule.h turns one into each rank's actions). It
// lives here, below both, so that there is one enum and one parser of parallel.schedule.
#pragma once

#include <string_view>

namespace meshtrain::plan {

enum class ScheduleKind {
  gpipe,        // all forwards, then all backwards: M micro-batches' activations alive
  one_f_one_b,  // PipeDream-flush: warm-up forwards, one forward one backward, cool-down
  interleaved,  // Megatron's 1F1B over V virtual stages per rank: the bubble shrinks by V
};

// "gpipe", "1f1b", "interleaved"; ValueError naming parallel.schedule otherwise.
ScheduleKind parse_schedule_kind(std::string_view name);
std::string_view schedule_kind_name(ScheduleKind kind);

}  // namespace meshtrain::plan
