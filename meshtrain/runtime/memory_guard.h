// The memory guard: before the model is built, the run's per-rank memory is estimated with the
// planner's memory model (the same code `meshtrain plan` ranks layouts with) and held against
// train.max_memory, or against what this host (or its cgroup) has free divided among the
// node's ranks. A run that would not fit stops with one line naming the estimate, the limit and
// the settings that would fit, instead of dying of an out-of-memory kill after an hour.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "meshtrain/plan/memory_model.h"
#include "meshtrain/runtime/resolved_config.h"

namespace meshtrain::runtime {

// The planner's description of the run's model ([model]).
plan::ModelShape model_shape(const TrainConfig& config);

// The planner's description of one rank of this run (world ranks, data-parallel over all).
plan::MemoryInput memory_input(const ResolvedConfig& config, int world);

struct MemoryLimit {
  uint64_t bytes = 0;
  std::string source;  // "train.max_memory", "cgroup memory.max 2.00 GiB / 4 local ranks", ...
};

// What one of `local_ranks` ranks on this host may use: the smallest of the cgroup's limit less
// what it already uses (v2 memory.max / memory.current, or v1 memory.limit_in_bytes /
// memory.usage_in_bytes) and the kernel's MemAvailable, shared evenly. nullopt when nothing can
// be read.
std::optional<MemoryLimit> host_memory_limit(int local_ranks);

// Throws ValueError with the one-line verdict when the estimate exceeds the limit
// (train.max_memory, or host_memory_limit for "auto"; "off" skips the check).
void check_memory(const ResolvedConfig& config, int world, int local_ranks);

}  // namespace meshtrain::runtime
