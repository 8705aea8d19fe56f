// Rolling back on a run of bad steps. A single non-finite loss or gradient norm only skips its
// update (the trainer counts it); a run of them means the state itself has gone bad (a loss
// spike that diverged, corrupted optimizer moments), and skipping forever would waste the job.
// After train.rollback_after consecutive bad steps the trainer reloads the newest checkpoint
// taken before the run began and trains on; train.max_rollbacks bounds how often, so that a
// fault that comes back every time ends the run with one clear line instead of looping.
//
// The decision needs no collective of its own: the loss it looks at is the mean over ranks and
// the gradient norm is taken after the all-reduce, so every rank sees the same bad steps.
#pragma once

#include <cstdint>

#include "meshtrain/util/fault_plan.h"

namespace meshtrain::runtime {

class RollbackPolicy {
 public:
  RollbackPolicy(int64_t rollback_after, int64_t max_rollbacks);

  // Records whether `step` was bad. True when it completes a run of rollback_after bad steps:
  // roll back to a checkpoint of a step before first_bad_step(), then call rolled_back().
  // Error naming the steps when max_rollbacks are used up.
  bool on_step(int64_t step, bool bad);
  void rolled_back();

  int64_t first_bad_step() const { return first_bad_; }
  int64_t bad_steps() const { return streak_; }
  int64_t rollbacks() const { return rollbacks_; }

 private:
  int64_t after_ = 0;
  int64_t max_ = 0;
  int64_t streak_ = 0;
  int64_t first_bad_ = -1;
  int64_t rollbacks_ = 0;
};

// Test hook for fault tests, not a feature: the fault plan's NaN steps (MESHTRAIN_TEST_NAN_STEPS
// "A-B", fault_plan.h) make the last rank's loss NaN at steps A..B, only before the first
// rollback (a transient fault); "A-B,always" every time (a fault that comes back). True when
// this step's loss is to be NaN.
bool inject_nan_for_test(int64_t step, int rank, int world, int64_t rollbacks,
                         const FaultPlan& plan);
// Test-only: the factor the last rank's reported loss is multiplied by at the fault plan's spike
// step (MESHTRAIN_TEST_SPIKE_STEP; 1000, a finite spike; 1 otherwise).
float inject_spike_for_test(int64_t step, int rank, int world, const FaultPlan& plan);

}  // namespace meshtrain::runtime
