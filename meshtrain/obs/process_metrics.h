// Process-level gauges in the names every Prometheus dashboard already knows
// (process_resident_memory_bytes, process_virtual_memory_bytes, process_open_fds,
// process_start_time_seconds), read from /proc when a scrape or a step asks for them.
#pragma once

#include <cstdint>

#include "meshtrain/obs/metrics.h"

namespace meshtrain::obs {

// Resident set size of this process in bytes, from /proc/self/statm; 0 when unavailable.
int64_t process_rss_bytes();

// Refreshes the process_* gauges in `registry`.
void update_process_metrics(Registry& registry);

}  // namespace meshtrain::obs
