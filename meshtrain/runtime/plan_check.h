// The one place a run's illegal combinations are refused: cross-key rules the constraint table
// (one key at a time) cannot hold, strategies that cannot be combined yet, what the device cannot
// run, and the world size the parallel layout needs. Each refusal is one ValueError line naming
// the keys and a way out; the command line turns it into exit status 2. The engines behind it
// only assert invariants.
#pragma once

#include <optional>

#include "meshtrain/runtime/resolved_config.h"

namespace meshtrain::runtime {

// `world`: the job's ranks when known (the checks that need it are skipped otherwise).
void check_plan(const ResolvedConfig& config, std::optional<int> world);

}  // namespace meshtrain::runtime
