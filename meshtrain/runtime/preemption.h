// Graceful preemption: SIGTERM (a scheduler reclaiming the machine, or meshrun stopping its
// workers) and SIGINT must not kill a worker mid-step. The handler only records the signal in a
// lock-free atomic (the one thing that is async-signal-safe to do); the training loop polls it
// once per step, agrees with the other ranks on a common last step, writes a checkpoint and
// returns normally, so the process exits 0 within the launcher's grace period.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "meshtrain/comm/process_group.h"
#include "meshtrain/util/fault_plan.h"

namespace meshtrain::runtime {

// Installs the handlers for its lifetime and restores the previous ones afterwards. Guards may
// overlap (several trainers in one process); the record is shared by all of them.
class PreemptionGuard {
 public:
  PreemptionGuard();
  ~PreemptionGuard();
  PreemptionGuard(const PreemptionGuard&) = delete;
  PreemptionGuard& operator=(const PreemptionGuard&) = delete;

  // The signal received since the guard was installed (SIGTERM or SIGINT), or 0.
  static int requested();
  // Clears the record (for tests that run several trainers in one process).
  static void reset();
};

// "preempted by SIGTERM at step N; checkpoint saved, rerun to resume". `unsaved`: why nothing
// was saved (default: checkpoints are off).
std::string preemption_message(int64_t step, bool saved, std::string_view unsaved = {});

// Test hook for restart tests, not a feature: when the fault plan's crash step
// (MESHTRAIN_TEST_CRASH_AT_STEP, fault_plan.h) is N and this is the first attempt, rank 1 (rank 0
// when alone) fails at the start of step N by throwing, as a crashed worker would exit non-zero.
void maybe_crash_for_test(int64_t step, int rank, int world, const FaultPlan& plan);

}  // namespace meshtrain::runtime
